"""Enqueues and Django's transactions, on both backends: an enqueue into an
``atomic()`` block an error has already doomed raises Django's own
``TransactionManagementError`` (as any query there does) instead of
returning a job the rollback then loses; and on SQLite an enqueue that needs
jobkeeper's own connection while this thread's Django transaction holds the
file's write lock fails at once, saying why, instead of waiting out
``busy_timeout`` (30 s).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .projects import manage, shell

pytestmark = pytest.mark.slow

DOOMED = """
import json, time
from django.db import IntegrityError, connection, transaction
from django.db.transaction import TransactionManagementError
from django.tasks import task_backends
from shop.models import Order
from shop.tasks import send_receipt

queue = task_backends["default"].queue
order = Order.objects.create(email="a@example.com")


def enqueue(how):
    if how == "task":
        return send_receipt.enqueue(order_id=order.pk).id
    if how == "connection":
        return queue.enqueue("raw", {}, queue="raw", connection=connection).id
    return queue.enqueue_many([("raw", {})], connection=connection)[0].id


def doom(by):
    if by == "atomic":
        try:
            with transaction.atomic(savepoint=False):
                raise ValueError("x")
        except ValueError:
            pass
    else:  # an IntegrityError from Model.save(), swallowed
        try:
            Order(pk=order.pk, email="dup@example.com").save(force_insert=True)
        except IntegrityError:
            pass


outcomes = {}
for by in ("atomic", "integrity"):
    for how in ("task", "connection", "many"):
        with transaction.atomic():
            doom(by)
            try:
                outcomes[f"{by}/{how}"] = ["enqueued", enqueue(how)]
            except TransactionManagementError as exc:
                outcomes[f"{by}/{how}"] = ["refused", str(exc)]
print(json.dumps({
    "outcomes": outcomes,
    "stats": {q: {s: n for s, n in c.items() if n} for q, c in queue.stats().items()},
}))
"""


def test_an_enqueue_into_a_doomed_transaction_raises_djangos_error(
    project: tuple[Path, dict[str, str]],
) -> None:
    manage(project, "migrate", "--verbosity", "0")
    out = shell(project, DOOMED)
    assert set(out["outcomes"]) == {
        f"{by}/{how}" for by in ("atomic", "integrity") for how in ("task", "connection", "many")
    }
    for where, (what, message) in out["outcomes"].items():
        assert what == "refused", (where, message)
        assert "You can't execute queries until the end of the 'atomic' block" in message
    assert out["stats"] == {}  # nothing written


OWN_CONNECTION = """
import json, time
from django.db import connection, transaction
from django.db.transaction import TransactionManagementError
from django.tasks import task_backends
from jobkeeper.contrib.django.backend import JobkeeperBackend
from shop.models import Order
from shop.tasks import send_receipt

queue = task_backends["default"].queue
apart = JobkeeperBackend(
    "apart", {"QUEUES": ["emails"], "OPTIONS": {"JOIN_TRANSACTION": False}}
)


def attempt(enqueue):
    started = time.monotonic()
    try:
        job_id = enqueue()
        outcome = ["enqueued", job_id]
    except TransactionManagementError as exc:
        outcome = ["refused", str(exc)]
    return outcome + [round(time.monotonic() - started, 1)]


out = {}
# set_autocommit(False) then a write: the enqueue needs its own connection.
transaction.set_autocommit(False)
Order.objects.create(email="a@example.com")
out["autocommit_off_written"] = attempt(lambda: send_receipt.enqueue(order_id=1).id)
transaction.rollback()
# set_autocommit(False) without a write: commits at once, survives a rollback.
out["autocommit_off_unwritten"] = attempt(lambda: send_receipt.enqueue(order_id=2).id)
transaction.rollback()
transaction.set_autocommit(True)
# JOIN_TRANSACTION=False inside an atomic() that has written, then one that has only read.
try:
    with transaction.atomic():
        Order.objects.create(email="b@example.com")
        out["apart_written"] = attempt(lambda: apart.enqueue(send_receipt, (), {"order_id": 3}).id)
        raise RuntimeError
except RuntimeError:
    pass
try:
    with transaction.atomic():
        Order.objects.count()
        out["apart_read"] = attempt(lambda: apart.enqueue(send_receipt, (), {"order_id": 4}).id)
        raise RuntimeError
except RuntimeError:
    pass
kept = sorted(job.args["kwargs"]["order_id"] for job in queue.list_jobs(queue="emails"))
print(json.dumps({"out": out, "kept": kept, "orders": Order.objects.count()}))
"""


def test_an_enqueue_apart_from_a_django_transaction(
    project: tuple[Path, dict[str, str]],
) -> None:
    _, env = project
    sqlite = env["EXAMPLE_DATABASE_URL"].startswith("sqlite")
    manage(project, "migrate", "--verbosity", "0")
    result = shell(project, OWN_CONNECTION)
    out = result["out"]
    # Without a write in Django's transaction, or on PostgreSQL: committed at
    # once, kept after the rollback.
    assert out["autocommit_off_unwritten"][0] == "enqueued"
    assert out["apart_read"][0] == "enqueued"
    if not sqlite:
        assert out["autocommit_off_written"][0] == "enqueued"
        assert out["apart_written"][0] == "enqueued"
        assert result["kept"] == [1, 2, 3, 4]
        return
    # SQLite: this thread's Django transaction holds the file's write lock.
    for name in ("autocommit_off_written", "apart_written"):
        what, message, seconds = out[name]
        assert what == "refused", (name, message)
        assert seconds < 5, (name, seconds)  # not busy_timeout's 30 s
        assert "this thread's Django connection 'default' has a transaction open" in message
        assert "JOIN_TRANSACTION" in message and "commit or roll back" in message
    assert result["kept"] == [2, 4]
    assert result["orders"] == 0
