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
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "django_project"
PG_URL = os.environ.get("JOBKEEPER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
BACKENDS = [
    name.strip()
    for name in os.environ.get("JOBKEEPER_TEST_BACKENDS", "sqlite,postgres").split(",")
    if name.strip()
]

pytestmark = pytest.mark.slow


@pytest.fixture(params=BACKENDS)
def project(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Path, dict[str, str]]]:
    """A copy of the example project and the environment pointing it at a
    fresh database (a SQLite file, or a new PostgreSQL schema)."""
    directory = tmp_path / "django_project"
    shutil.copytree(EXAMPLE, directory, ignore=shutil.ignore_patterns("db.sqlite3", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBKEEPER_", "DJANGO_"))}
    if request.param == "sqlite":
        env["EXAMPLE_DATABASE_URL"] = f"sqlite:///{tmp_path / 'shop.db'}"
        yield directory, env
        return
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
