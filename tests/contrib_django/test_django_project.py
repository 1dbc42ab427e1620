"""The example Django project (examples/django_project) on both backends:
Django's ``@task`` + ``.enqueue()`` store jobkeeper jobs, an enqueue inside
``transaction.atomic()`` commits or rolls back with it, and a real
``manage.py jobkeeper_worker`` process runs them; results come back through
Django's ``get_result``. Also the backend's settings and the commands' refusals.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .projects import manage, shell, sqlite_project

pytestmark = pytest.mark.slow

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


SETTINGS_CHECKS = """
import json
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from jobkeeper.contrib.django.backend import JobkeeperBackend
from jobkeeper.contrib.django.results import task_error as _task_error
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
