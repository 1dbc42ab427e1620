"""Jobs in another Django database (``OPTIONS["DATABASE"] = "jobs"``): a
plain ``manage.py migrate`` (of ``default``) says that jobkeeper's tables
there are missing and how to make them, ``migrate --database jobs`` makes
them; and an error that finds them missing names the ``manage.py`` command,
not the ``jobkeeper`` CLI's.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from .projects import PG_URL, manage, shell

pytestmark = pytest.mark.slow

JOBS_SETTINGS = """
import os
from pathlib import Path
from mysite.settings import *  # noqa: F403

jobs = DATABASES["jobs"] = dict(DATABASES["default"])  # noqa: F405
if jobs["ENGINE"].endswith("sqlite3"):
    jobs["NAME"] = str(Path(jobs["NAME"]).with_name("jobs.db"))
    jobs["TEST"] = {"NAME": str(Path(jobs["NAME"]).with_name("test_jobs.db"))}
else:
    jobs["OPTIONS"] = {"options": f"-c search_path={os.environ['JOBS_SCHEMA']}"}
TASKS["default"]["OPTIONS"]["DATABASE"] = "jobs"  # noqa: F405
"""

ENQUEUE = """
import json
from shop.tasks import send_receipt
try:
    outcome = ["enqueued", send_receipt.enqueue(order_id=1).id]
except Exception as exc:
    outcome = [type(exc).__name__, str(exc)]
print(json.dumps(outcome))
"""


@pytest.fixture
def jobs_project(project: tuple[Path, dict[str, str]]):
    directory, env = project
    (directory / "mysite" / "settings_jobs.py").write_text(JOBS_SETTINGS)
    env = {**env, "DJANGO_SETTINGS_MODULE": "mysite.settings_jobs"}
    if env["EXAMPLE_DATABASE_URL"].startswith("sqlite"):
        yield directory, env
        return
    schema = f"jk_django_jobs_{secrets.token_hex(5)}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield directory, {**env, "JOBS_SCHEMA": schema}
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_jobs_in_another_database_are_migrated_with_its_migrate(
    jobs_project: tuple[Path, dict[str, str]],
) -> None:
    directory, env = jobs_project
    django_hint = (
        "run `python manage.py migrate --database jobs` (or `python manage.py jobkeeper_migrate`)"
    )

    said = manage(jobs_project, "migrate")
    assert (
        "jobkeeper: the jobs of TASKS['default'] live in database 'jobs', which this "
        "migrate (of 'default') did not touch" in said
    )
    assert django_hint in said

    # The first enqueue (and the worker) name manage.py's commands.
    outcome = shell(jobs_project, ENQUEUE)
    assert outcome[0] != "enqueued"
    assert django_hint in outcome[1] and "jobkeeper --database" not in outcome[1]
    worker = subprocess.run(
        [sys.executable, "manage.py", "jobkeeper_worker", "--burst"],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.returncode != 0
    # Its last word, the command's error; the worker's own log line before it
    # named the jobkeeper CLI's command.
    error = worker.stderr.strip().splitlines()[-1]
    assert error.startswith("CommandError: ")
    assert django_hint in error
    assert "jobkeeper --database" not in worker.stderr, worker.stderr

    manage(jobs_project, "migrate", "--database", "jobs", "--verbosity", "0")
    assert "jobkeeper" not in manage(jobs_project, "migrate")  # the tables are there now
    assert shell(jobs_project, ENQUEUE)[0] == "enqueued"


UNREACHABLE_SETTINGS = """
from mysite.settings import *  # noqa: F403

jobs = DATABASES["jobs"] = dict(DATABASES["default"])  # noqa: F405
jobs["HOST"], jobs["PORT"] = "127.0.0.1", "1"  # nothing listens there
TASKS["default"]["OPTIONS"]["DATABASE"] = "jobs"  # noqa: F405
"""


@pytest.mark.parametrize("project", ["postgres"], indirect=True)
def test_migrate_says_the_jobs_database_could_not_be_reached(
    project: tuple[Path, dict[str, str]],
) -> None:
    # It said the tables there were "missing or behind", which nobody knew.
    directory, env = project
    (directory / "mysite" / "settings_unreachable.py").write_text(UNREACHABLE_SETTINGS)
    said = manage(
        (directory, {**env, "DJANGO_SETTINGS_MODULE": "mysite.settings_unreachable"}), "migrate"
    )
    assert "jobkeeper's tables there could not be checked (PostgreSQL at" in said, said
    assert "port 1 failed" in said and "missing or behind:" in said, said
