"""The example Django project (examples/django_project) on both backends:
Django's ``@task`` + ``.enqueue()`` store jobkeeper jobs, an enqueue inside
``transaction.atomic()`` commits or rolls back with it, and a real
``manage.py jobkeeper_worker`` process runs them; results come back through
Django's ``get_result``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from jobkeeper import JobQueue

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "django_project"
PG_URL = os.environ.get("JOBKEEPER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
BACKENDS = [
    name.strip()
    for name in os.environ.get("JOBKEEPER_TEST_BACKENDS", "sqlite,postgres").split(",")
    if name.strip()
]

pytestmark = pytest.mark.slow


def copy_project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the example project, and an environment free of ours."""
    directory = tmp_path / "django_project"
    shutil.copytree(EXAMPLE, directory, ignore=shutil.ignore_patterns("db.sqlite3", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBKEEPER_", "DJANGO_"))}
    return directory, env


def sqlite_project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """:func:`copy_project` on a SQLite file of its own."""
    directory, env = copy_project(tmp_path)
    env["EXAMPLE_DATABASE_URL"] = f"sqlite:///{tmp_path / 'shop.db'}"
    return directory, env


@pytest.fixture(params=BACKENDS)
def project(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Path, dict[str, str]]]:
    """A copy of the example project and the environment pointing it at a
    fresh database (a SQLite file, or a new PostgreSQL schema)."""
    if request.param == "sqlite":
        yield sqlite_project(tmp_path)
        return
    directory, env = copy_project(tmp_path)
    schema = f"jk_django_{secrets.token_hex(5)}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    env["EXAMPLE_DATABASE_URL"] = PG_URL
    env["EXAMPLE_SCHEMA"] = schema
    try:
        yield directory, env
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def manage(project: tuple[Path, dict[str, str]], *args: str, timeout: float = 120) -> str:
    directory, env = project
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"manage.py {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


ENQUEUE = """
import json
from django.test import Client
from django.tasks import task_backends
from shop.models import Order
from shop.tasks import attempts_so_far, charge

client = Client(raise_request_exception=False)
placed = client.post("/orders/", {"email": "a@example.com"}, content_type="application/json")
failed = client.post(
    "/orders/", {"email": "b@example.com", "fail": True}, content_type="application/json"
)
waiting = client.get(f"/tasks/{placed.json()['task']}/").json()
unknown = [client.get(f"/tasks/{result_id}/").status_code for result_id in ("99999999", "abc")]

# Plain jobkeeper code with Django's own connection proxy: joins atomic().
from django.db import connection, transaction
queue = task_backends["default"].queue
try:
    with transaction.atomic():
        queue.enqueue("rolled_back", {}, queue="raw", connection=connection)
        raise RuntimeError
except RuntimeError:
    pass
with transaction.atomic():
    queue.enqueue("committed", {}, queue="raw", connection=connection)
print(json.dumps({
    "placed": placed.json(),
    "failed_status": failed.status_code,
    "unknown_statuses": unknown,
    "orders": Order.objects.count(),
    "waiting": waiting,
    "context": attempts_so_far.enqueue().id,
    "charge": charge.enqueue(amount=5).id,
    "stats": {
        queue: {status: n for status, n in counts.items() if n}
        for queue, counts in task_backends["default"].queue.stats().items()
    },
}))
"""

RESULTS = """
import json
from django.test import Client
from shop.models import Order
from shop.tasks import attempts_so_far, charge, send_receipt

ids = json.loads(%r)
receipt = send_receipt.get_result(ids["placed"]["task"])
context = attempts_so_far.get_result(ids["context"])
charged = charge.get_result(ids["charge"])
print(json.dumps({
    "receipt": [receipt.status, receipt.return_value, receipt.args, receipt.kwargs],
    "view": Client().get(f"/tasks/{receipt.id}/").json(),
    "receipt_sent": Order.objects.get(pk=ids["placed"]["order"]).receipt_sent,
    "context": [context.status, context.return_value],
    "charge": [charged.status, charged.attempts,
               [e.exception_class_path for e in charged.errors],
               "declined: 5" in charged.errors[-1].traceback],
}))
"""


def shell(project: tuple[Path, dict[str, str]], code: str) -> dict:
    # The backport names its module django_tasks; Django >= 6 has django.tasks.
    try:
        import django.tasks  # noqa: F401
    except ImportError:
        code = code.replace("from django.tasks import", "from django_tasks import")
    out = manage(project, "shell", "-c", code)
    return json.loads(out.strip().splitlines()[-1])


def test_django_tasks_run_on_jobkeeper(project: tuple[Path, dict[str, str]]) -> None:
    manage(project, "migrate", "--verbosity", "0")
    assert "schema at version" in manage(project, "jobkeeper_migrate")

    enqueued = shell(project, ENQUEUE)
    # The failed request rolled back its order and its job together.
    assert enqueued["failed_status"] == 500
    assert enqueued["unknown_statuses"] == [404, 404]
    assert enqueued["orders"] == 1
    assert enqueued["stats"] == {
        "emails": {"available": 1},
        "default": {"available": 2},
        "raw": {"available": 1},
    }
    assert enqueued["waiting"] == {"status": "READY"}

    # A real worker process drains the queues and exits.
    manage(project, "jobkeeper_worker", "--burst", "--concurrency", "2")

    results = shell(project, RESULTS % json.dumps(enqueued))
    assert results["receipt"] == [
        "SUCCESSFUL",
        "receipt sent to a@example.com",
        [],
        {"order_id": enqueued["placed"]["order"]},
    ]
    assert results["view"] == {
        "status": "SUCCESSFUL",
        "return_value": "receipt sent to a@example.com",
    }
    assert results["receipt_sent"] is True
    assert results["context"] == ["SUCCESSFUL", 1]
    # MAX_ATTEMPTS=2 in the example's settings: retried once, then failed.
    assert results["charge"] == ["FAILED", 2, ["shop.tasks.PaymentDeclined"] * 2, True]


def test_worker_command_refuses_another_backend(project: tuple[Path, dict[str, str]]) -> None:
    directory, env = project
    env = {**env, "DJANGO_SETTINGS_MODULE": "mysite.settings"}
    result = subprocess.run(
        [sys.executable, "manage.py", "jobkeeper_worker", "--backend", "missing"],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "missing" in result.stderr


@pytest.fixture(params=BACKENDS)
def project_with_own_database(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Path, dict[str, str]]]:
    """A copy of the example project on a database of its own (a SQLite file,
    or a new PostgreSQL database), for ``manage.py test``: Django's test
    runner makes its test database beside it and drops it after.
    """
    if request.param == "sqlite":
        yield sqlite_project(tmp_path)
        return
    directory, env = copy_project(tmp_path)
    name = f"jk_djdev_{secrets.token_hex(5)}"
    parts = urlsplit(PG_URL)
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    env["EXAMPLE_DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{name}"))
    try:
        yield directory, env
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            for dropped in (name, f"test_{name}"):
                conn.execute(f'DROP DATABASE IF EXISTS "{dropped}" WITH (FORCE)')


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

DEV_STATUS = """
import json
from django.tasks import task_backends
job = task_backends["default"].queue.get_job(%s)
print(json.dumps({"status": job.status.value}))
"""


def manage_test(directory: Path, env: dict[str, str], *args: str) -> str:
    """``manage.py test`` with ``args``, which must pass; its report (stderr)."""
    result = subprocess.run(
        [sys.executable, "manage.py", "test", *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return result.stderr


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
    out = manage_test(directory, env, "shop", "--verbosity", "2", "--parallel", "2")
    assert "Ran 4 tests" in out and "OK" in out
    assert "Cloning test database" in out
    # Django's test database (and a SQLite one's WAL and wake channel) is gone.
    assert not [path.name for path in directory.parent.glob("test_shop*")]

    # The development database's job was left alone by the tests' drains.
    status = shell(project, DEV_STATUS % waiting)
    assert status["status"] == "available"


SETTINGS_CHECKS = """
import json
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from jobkeeper.contrib.django.backend import JobkeeperBackend, _task_error
from shop.tasks import charge

settings.DATABASES["memory"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
settings.DATABASES["other"] = {"ENGINE": "django.db.backends.dummy", "NAME": "x"}
cases = {
    "good": {},
    "attempts_text": {"MAX_ATTEMPTS": "abc"},
    "attempts_zero": {"MAX_ATTEMPTS": 0},
    "unknown_option": {"MAX_ATTEMPT": 3},
    "settings_unknown": {"SETTINGS": {"bogus": 1}},
    "settings_list": {"SETTINGS": ["x"]},
    "settings_value": {"SETTINGS": {"retention": -5}},
    "database": {"DATABASE": "nope"},
    "join": {"JOIN_TRANSACTION": "no"},
    "url": {"DATABASE_URL": "mysql://x/y"},
    "other_engine_with_url": {"DATABASE": "other", "DATABASE_URL": %r},
    "in_memory": {"DATABASE": "memory"},
}
made, refused = {}, {}
for name, options in cases.items():
    try:
        made[name] = JobkeeperBackend("bad", {"OPTIONS": options})
    except ImproperlyConfigured as exc:
        refused[name] = str(exc)
try:
    made["in_memory"].queue
    memory = None
except ImproperlyConfigured as exc:
    memory = str(exc)
settings.DATABASES["copy"] = {
    "ENGINE": "django.db.backends.sqlite3", "NAME": "file:memorydb_copy_1?mode=memory&cache=shared"
}
try:
    JobkeeperBackend("bad", {"OPTIONS": {"DATABASE": "copy"}}).queue
    spawned = None
except ImproperlyConfigured as exc:
    spawned = str(exc)
try:
    JobkeeperBackend("bad", {"QUEUES": "default"})
    letters = None
except ImproperlyConfigured as exc:
    letters = str(exc)
lost = _task_error({"error": "worker lost: w1 sent no heartbeat for 60s", "traceback": None})
job = charge.enqueue(amount=(1, (2, 3)))
print(json.dumps({
    "made": sorted(made),
    "refused": refused,
    "memory": memory,
    "spawned": spawned,
    "letters": letters,
    "other_joins": made["other_engine_with_url"].join_transaction,
    "lost_class": lost.exception_class.__name__,
    "tuple_args": made["good"].queue.get_job(int(job.id)).args,
}))
"""


def test_bad_settings_are_named_and_odd_values_still_work(tmp_path: Path) -> None:
    # The settings are checked the same on both backends: SQLite is enough.
    project = sqlite_project(tmp_path)
    directory, _ = project
    manage(project, "migrate", "--verbosity", "0")
    jobs_url = f"sqlite:///{directory.parent / 'other_jobs.db'}"
    out = shell(project, SETTINGS_CHECKS % jobs_url)
    assert out["made"] == ["good", "in_memory", "other_engine_with_url"]
    where = "TASKS['bad']['OPTIONS']"
    assert out["refused"] == {
        "attempts_text": f"{where}['MAX_ATTEMPTS'] must be an int between 1 and 1000000, got 'abc'",
        "attempts_zero": f"{where}['MAX_ATTEMPTS'] must be an int between 1 and 1000000, got 0",
        "unknown_option": f"{where} has an unknown option 'MAX_ATTEMPT' (did you mean "
        "'MAX_ATTEMPTS'?); valid options: DATABASE, DATABASE_URL, JOIN_TRANSACTION, "
        "MAX_ATTEMPTS, MIGRATE, SETTINGS",
        "settings_unknown": out["refused"]["settings_unknown"],
        "settings_list": f"{where}['SETTINGS'] must be a dict of JobQueue keyword arguments, "
        "got ['x']",
        "settings_value": out["refused"]["settings_value"],
        "database": f"{where}['DATABASE'] must be an alias of DATABASES ('default', 'memory', "
        "'other'), got 'nope'",
        "join": f"{where}['JOIN_TRANSACTION'] must be True or False, got 'no'",
        "url": out["refused"]["url"],
    }
    assert out["refused"]["settings_unknown"].startswith(
        f"{where}['SETTINGS'] has 'bogus', which is not a JobQueue keyword argument"
    )
    assert out["refused"]["settings_value"].startswith(f"{where}: retention")
    assert out["refused"]["url"].startswith(f"{where}: ") and "mysql" in out["refused"]["url"]
    assert "in-memory SQLite database (':memory:')" in out["memory"]
    # A parallel test process's in-memory copy (spawn, forkserver) says so.
    assert (
        "for a parallel test process" in out["spawned"] and "without --parallel" in out["spawned"]
    )
    assert out["letters"] == "TASKS['bad']['QUEUES'] must be a list of queue names, got 'default'"
    # Another engine is fine with a URL of jobkeeper's own; no transaction to join.
    assert out["other_joins"] is False
    # A rescued attempt's entry names no exception: jobkeeper's base error.
    assert out["lost_class"] == "JobkeeperError"
    # Tuples are lists, as Django's own backends store them.
    assert out["tuple_args"] == {"args": [], "kwargs": {"amount": [1, [2, 3]]}}


ANY_QUEUE_SETTINGS = """
from mysite.settings import *  # noqa: F403
TASKS["default"]["QUEUES"] = []  # noqa: F405
"""


def test_worker_command_refuses_what_it_cannot_run(project: tuple[Path, dict[str, str]]) -> None:
    directory, env = project
    (directory / "mysite" / "settings_any_queue.py").write_text(ANY_QUEUE_SETTINGS)
    (directory / "mysite" / "settings_bad_queue.py").write_text(
        ANY_QUEUE_SETTINGS.replace("= []", '= ["default", "emails", "a b"]')
    )
    runs = {
        "no queues": (
            ["jobkeeper_worker"],
            {"DJANGO_SETTINGS_MODULE": "mysite.settings_any_queue"},
        ),
        "bad queue": (["jobkeeper_worker", "--queue", "bad queue!"], {}),
        "bad queue setting": (
            ["jobkeeper_worker"],
            {"DJANGO_SETTINGS_MODULE": "mysite.settings_bad_queue"},
        ),
        "concurrency": (["jobkeeper_worker", "--concurrency", "0"], {}),
        "backend": (["jobkeeper_migrate", "--backend", "nope"], {}),
    }
    errors = {}
    for name, (args, extra) in runs.items():
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=directory,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode != 0, name
        assert "Traceback" not in result.stderr, result.stderr
        errors[name] = result.stderr.strip()
    assert "TASKS['default']['QUEUES'] is empty" in errors["no queues"]
    assert "--queue" in errors["no queues"]
    assert errors["bad queue"].startswith("CommandError: --queue: ")
    assert "'bad queue!'" in errors["bad queue"]
    assert errors["bad queue setting"].startswith("CommandError: TASKS['default']['QUEUES']: ")
    assert errors["concurrency"] == "CommandError: --concurrency must be at least 1, got 0"
    assert errors["backend"].startswith("CommandError: --backend nope: ")


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
