"""docs/quickstart.md's first task, run as its reader would: the module taken
from the page, a job for a file that exists and one for a file that does not
(helper-67: the page called a ``ready`` it never defined, so every attempt
failed with a NameError).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from jobkeeper.models import JobStatus

DOC = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"


@pytest.fixture
def quickstart_jq(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch):
    (module,) = [
        block
        for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
        if "@jq.task" in block
    ]
    package = tmp_path / "quickstart_app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text(module)
    monkeypatch.setenv("JOBKEEPER_DATABASE_URL", db_url)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from quickstart_app import jobs

    jobs.jq.migrate()
    yield jobs
    jobs.jq.close()
    sys.modules.pop("quickstart_app.jobs", None)
    sys.modules.pop("quickstart_app", None)


def test_the_first_task_runs(quickstart_jq, tmp_path: Path) -> None:
    (tmp_path / "a.png").touch()
    done = quickstart_jq.resize.enqueue(path="a.png", width=100)
    waiting = quickstart_jq.resize.enqueue(path="missing.png", width=50)
    quickstart_jq.jq.run_worker(queues=["images"], burst=True)
    jq = quickstart_jq.jq
    finished = jq.get_job(done.id)
    assert finished.status == JobStatus.COMPLETED, finished.errors
    assert finished.result == {"path": "a.png", "width": 100}
    retried = jq.get_job(waiting.id)
    assert retried.status == JobStatus.RETRYABLE
    assert [e["error"] for e in retried.errors] == ["Retry: retry requested"]


def test_the_first_task_without_its_file_is_a_dead_letter_after_five_attempts(
    quickstart_jq,
) -> None:
    # Found by a break-test: the page said it was retried until the file
    # came; each Retry spends an attempt, so the fifth ends it.
    from jobkeeper.testing import drain

    job = quickstart_jq.resize.enqueue(path="missing.png", width=50)
    assert drain(quickstart_jq.jq, include_scheduled=True) == {"retryable": 4, "dead": 1}
    dead = quickstart_jq.jq.get_job(job.id)
    assert dead.status == JobStatus.DEAD and dead.attempt == 5
