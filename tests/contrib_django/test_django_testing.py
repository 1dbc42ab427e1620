"""The example project under Django's test runner (``manage.py test``), on
both backends: its jobs go to the test database, tests that may not use the
database are refused, parallel copies and mirrors get jobkeeper's tables, and
nothing of a run is left for the next.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from jobkeeper import JobQueue

from .projects import manage, manage_test, shell, sqlite_project

pytestmark = pytest.mark.slow

DEV_JOB = """
import json
from django.tasks import task_backends
from shop.tasks import send_receipt
result = send_receipt.enqueue(order_id=999)
print(json.dumps({"id": result.id}))
"""

GUARD_TEST = """
from django.test import SimpleTestCase
from shop.tests import count_orders


class NoDatabaseTests(SimpleTestCase):
    def test_a_test_without_databases_cannot_enqueue(self):
        # Django refuses the test its database; jobkeeper refuses it the same,
        # rather than writing to the development database.
        with self.assertRaisesRegex(Exception, "not allowed in SimpleTestCase"):
            count_orders.enqueue()
"""

HINT_TEST = """
from django.test import TestCase

try:
    from django.tasks import task_backends
except ImportError:  # Django < 6: the backport
    from django_tasks import task_backends


class HintTests(TestCase):
    def test_the_queue_on_the_test_database_names_manage_pys_migrate(self):
        # The queue moved to the test database keeps the hint it was made with.
        hint = task_backends["default"].queue.url.migrate_hint()
        self.assertIn("test", task_backends["default"].database_url)
        self.assertTrue(hint.startswith("run `python manage.py migrate"), hint)
"""

DEV_STATUS = """
import json
from django.tasks import task_backends
job = task_backends["default"].queue.get_job(%s)
print(json.dumps({"status": job.status.value}))
"""


def test_manage_py_test_runs_jobs_on_the_test_database(
    project_with_own_database: tuple[Path, dict[str, str]],
) -> None:
    project = project_with_own_database
    # Django's migrate makes jobkeeper's tables too (post_migrate): no
    # jobkeeper_migrate, here or on the test database.
    manage(project, "migrate", "--verbosity", "0")
    waiting = shell(project, DEV_JOB)["id"]

    # The tests import the tasks before the test database exists; their jobs,
    # and the jobs those jobs enqueue, still go to the test database, whose
    # drop at the end is not refused for jobkeeper's open connections.
    # --parallel 2: Django copies the test database for each process (a file
    # copy on SQLite, CREATE DATABASE ... TEMPLATE on PostgreSQL).
    directory, env = project
    (directory / "shop" / "test_guard.py").write_text(GUARD_TEST)
    (directory / "shop" / "test_hint.py").write_text(HINT_TEST)
    out = manage_test(directory, env, "shop", "--verbosity", "2", "--parallel", "2")
    assert "Ran 5 tests" in out and "OK" in out
    assert "Cloning test database" in out
    # Django's test database (and a SQLite one's WAL and wake channel) is gone.
    assert not [path.name for path in directory.parent.glob("test_shop*")]

    # The development database's job was left alone by the tests' drains.
    status = shell(project, DEV_STATUS % waiting)
    assert status["status"] == "available"


MIRROR_SETTINGS = """
from mysite.settings import *  # noqa: F403

# The jobs' own alias, a test mirror of default's database, and a backend of
# the project's own (a subclass): manage.py migrate and test still give the
# test database jobkeeper's tables.
DATABASES["jobs"] = {**DATABASES["default"], "TEST": {"MIRROR": "default"}}  # noqa: F405
TASKS["default"]["BACKEND"] = "shop.backends.ShopBackend"  # noqa: F405
TASKS["default"]["OPTIONS"]["DATABASE"] = "jobs"  # noqa: F405
"""

MIRROR_BACKEND = """
from jobkeeper.contrib.django.backend import JobkeeperBackend


class ShopBackend(JobkeeperBackend):
    pass
"""

MIRROR_TEST = """
from django.test import TransactionTestCase
from jobkeeper.testing import drain
from shop.tests import count_orders, task_backends


class MirrorTests(TransactionTestCase):
    databases = {"default", "jobs"}

    def test_jobs_run_on_the_mirrored_test_database(self):
        job = count_orders.enqueue()
        drain(task_backends["default"].queue)
        self.assertEqual(count_orders.get_result(job.id).status, "SUCCESSFUL")
"""


def test_a_mirror_alias_and_a_backend_subclass_get_the_tables(
    project_with_own_database: tuple[Path, dict[str, str]],
) -> None:
    directory, env = project_with_own_database
    (directory / "mysite" / "settings_mirror.py").write_text(MIRROR_SETTINGS)
    (directory / "shop" / "backends.py").write_text(MIRROR_BACKEND)
    (directory / "shop" / "test_mirror.py").write_text(MIRROR_TEST)
    env = {**env, "DJANGO_SETTINGS_MODULE": "mysite.settings_mirror"}
    out = manage_test(directory, env, "shop.test_mirror")
    assert "Ran 1 test" in out and "OK" in out


def _plant_foreign_wal(path: Path) -> None:
    """Put a WAL of another database beside ``path`` (what a parallel test
    process that exits without closing leaves for the next run)."""
    other = path.with_name(f"{path.name}.other")
    keep = sqlite3.connect(other)
    keep.execute("PRAGMA journal_mode=WAL")
    keep.execute("PRAGMA wal_autocheckpoint=0")
    keep.execute("CREATE TABLE poison (x)")
    keep.executemany("INSERT INTO poison VALUES (?)", [("x" * 500,)] * 200)
    keep.commit()
    for suffix in ("-wal", "-shm"):
        shutil.copy(f"{other}{suffix}", f"{path}{suffix}")
    keep.close()


def test_a_sqlite_test_run_ignores_the_wal_an_earlier_run_left(tmp_path: Path) -> None:
    # helper-79: a WAL left beside a test database or a parallel copy was
    # replayed into the new file: old jobs, or "database disk image is malformed".
    directory, env = sqlite_project(tmp_path)
    for name in ("test_shop.db", "test_shop_1.db", "test_shop_2.db"):
        _plant_foreign_wal(tmp_path / name)
    out = manage_test(directory, env, "shop", "--parallel", "2")
    assert "Ran 3 tests" in out and "OK" in out


URL_SETTINGS = """
import os
from mysite.settings import *  # noqa: F403

# The alias's own database, written another way (postgres://, no port).
TASKS["default"]["OPTIONS"]["DATABASE_URL"] = os.environ["EXAMPLE_JOBS_URL"]  # noqa: F405
"""


def test_a_database_url_naming_the_alias_follows_it_into_the_test_database(
    project_with_own_database: tuple[Path, dict[str, str]],
) -> None:
    # helper-80: a backend made on a thread after the test runner's swap
    # compared DATABASE_URL with the test database's URL, took it for another
    # database, and a follow-up job went to the real one.
    directory, env = project_with_own_database
    url = env["EXAMPLE_DATABASE_URL"]
    jobs_url = url.replace("postgresql://", "postgres://").replace(":5432/", "/")
    (directory / "mysite" / "settings_url.py").write_text(URL_SETTINGS)
    env = {**env, "DJANGO_SETTINGS_MODULE": "mysite.settings_url", "EXAMPLE_JOBS_URL": jobs_url}
    manage((directory, env), "migrate", "--verbosity", "0")
    out = manage_test(directory, env, "shop")
    assert "Ran 3 tests" in out and "OK" in out
    with JobQueue(url) as real:
        assert real.stats() == {}, "a test's job reached the real database"
