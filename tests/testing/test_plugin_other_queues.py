"""The ``jobkeeper_queue`` fixture and the application's own queue: while the
fixture is active, a JobQueue that is not on the test's database never uses
its own (break-test: without ``jobkeeper_app``, the docs' example wrote a
real ``receipt`` job into ``$JOBKEEPER_DATABASE_URL``'s database, and
``assert_enqueued`` passed against it). Each case is a user's project run by
pytest in a subprocess, its "real" database migrated beforehand, on SQLite
and on PostgreSQL.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobkeeper import JobQueue
from support.db import PG_URL, fresh_pg_schema

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "postgres"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, str, list]]:
    """The docs' worked example in ``tmp_path``, with ``jobkeeper_app``
    commented out of its pytest.ini: ``(root, real database URL, pytest
    options)``. The real database (what ``$JOBKEEPER_DATABASE_URL`` names)
    is migrated; the tests' databases are SQLite files, or schemas on the
    PostgreSQL server.
    """
    text = DOC.read_text()
    app, tests = re.findall(r"```python\n(.*?)```", text, re.S)[:2]
    (ini,) = re.findall(r"```ini\n(.*?)```", text, re.S)
    assert "jobkeeper_app = myapp.jobs:jq" in ini
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "jobs.py").write_text(app)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_jobs.py").write_text(tests)
    (tmp_path / "pytest.ini").write_text(ini.replace("jobkeeper_app", "# jobkeeper_app"))
    if request.param == "sqlite":
        real = f"sqlite:///{tmp_path / 'real.db'}"
        with JobQueue(real) as jq:
            jq.migrate()
        yield tmp_path, real, []
        return
    with fresh_pg_schema() as real:
        with JobQueue(real) as jq:
            jq.migrate()
        yield tmp_path, real, ["--jobkeeper-database", PG_URL]


def run_pytest(root: Path, real: str, options: list[str], *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBKEEPER", "PYTEST"))}
    env["JOBKEEPER_DATABASE_URL"] = real
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options, *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.stdout + result.stderr


def jobs_in(url: str) -> dict:
    with JobQueue(url) as jq:
        return jq.stats()


def test_without_jobkeeper_app_the_apps_queue_is_refused(
    project: tuple[Path, str, list],
) -> None:
    root, real, options = project
    out = run_pytest(root, real, options, "tests/test_jobs.py")
    # Each fails at its first enqueue through the app's queue: the two
    # tests' charge.enqueue, and run_task's charge enqueueing its receipt.
    # Before, two failed at drain ({} == {'completed': 2}) and the third
    # passed, leaving a real receipt job behind.
    assert "3 failed" in out, out
    assert out.count("Set the ini option jobkeeper_app") >= 3, out
    where = "real.db" if real.startswith("sqlite") else "search_path"
    assert re.search(rf"a JobQueue on \S*{where}", out), out
    assert "nothing was written there" in out
    assert jobs_in(real) == {}, "a job reached the real database"


def test_a_refusal_the_code_caught_still_fails_the_test(
    project: tuple[Path, str, list],
) -> None:
    root, real, options = project
    (root / "tests" / "test_caught.py").write_text(
        textwrap.dedent(
            """
            from jobkeeper import JobkeeperError
            from jobkeeper.testing import drain

            from myapp.jobs import charge


            def test_swallowed(jobkeeper_queue):
                try:
                    charge.enqueue(order_id=1, amount=5)
                except JobkeeperError:
                    pass  # the code under test logs and goes on


            def test_in_a_task(jobkeeper_queue):
                @jobkeeper_queue.task()
                def checkout() -> None:
                    charge.enqueue(order_id=2, amount=5)  # the app's queue

                checkout.enqueue()
                assert drain(jobkeeper_queue) == {"retryable": 1}


            def test_own_queue_only(jobkeeper_queue, jobkeeper_database_url):
                from jobkeeper import JobQueue

                @jobkeeper_queue.task()
                def fine() -> int:
                    return 1

                fine.enqueue()
                assert drain(jobkeeper_queue) == {"completed": 1}
                with JobQueue(jobkeeper_database_url) as same:  # the test database
                    assert same.stats() == {}
            """
        )
    )
    out = run_pytest(root, real, options, "tests/test_caught.py")
    # Both pass their own asserts, then fail at the fixture's teardown.
    assert "2 passed, 2 errors" in out, out
    assert "ERROR at teardown of test_swallowed" in out
    assert "ERROR at teardown of test_in_a_task" in out
    assert jobs_in(real) == {}


def test_with_jobkeeper_app_another_queue_is_refused_by_name(
    project: tuple[Path, str, list],
) -> None:
    root, real, options = project
    (root / "pytest.ini").write_text(
        (root / "pytest.ini").read_text().replace("# jobkeeper_app", "jobkeeper_app")
    )
    (root / "myapp" / "reports.py").write_text(
        textwrap.dedent(
            """
            from jobkeeper import JobQueue

            reports = JobQueue()  # a second queue of the app, not the ini option's

            @reports.task()
            def monthly() -> None: ...
            """
        )
    )
    (root / "tests" / "test_reports.py").write_text(
        textwrap.dedent(
            """
            import pytest
            from jobkeeper import ConfigError
            from jobkeeper.testing import drain

            from myapp.jobs import charge
            from myapp.reports import monthly


            def test_reports(jobkeeper_queue):
                charge.enqueue(order_id=7, amount=100)  # the ini option's queue: fine
                with pytest.raises(ConfigError) as caught:
                    monthly.enqueue()
                assert "jobkeeper_app = myapp.jobs:jq" in str(caught.value)
                assert drain(jobkeeper_queue) == {"completed": 2}
            """
        )
    )
    out = run_pytest(root, real, options)
    # The docs' three tests pass as documented; the caught refusal still
    # fails test_reports at its teardown.
    assert "4 passed, 1 error" in out, out
    assert "ERROR at teardown of test_reports" in out
    assert "Only the queue of the ini option jobkeeper_app = myapp.jobs:jq" in out
    assert jobs_in(real) == {}
