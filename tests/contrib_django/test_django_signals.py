"""Django's ``task_started`` and ``task_finished`` signals, sent once per
attempt by a jobkeeper worker running Django tasks, as Django's own backends
send them; and what a ``TaskResult`` says of the workers and attempts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .projects import manage, shell

pytestmark = pytest.mark.slow

SIGNALS = """
import json
from django.tasks import signals, task_backends
from jobkeeper.testing import drain
from shop.models import Order
from shop.tasks import attempts_so_far, charge, send_receipt

seen = []


def receiver(signal_name):
    def receive(sender, task_result, **kwargs):
        value = task_result.return_value if task_result.status == "SUCCESSFUL" else None
        seen.append({
            "signal": signal_name,
            "sender": sender.__name__,
            "task": task_result.task.name,
            "id": task_result.id,
            "status": task_result.status,
            "attempts": task_result.attempts,
            "workers": len(task_result.worker_ids),
            "errors": [e.exception_class_path for e in task_result.errors],
            "finished": task_result.finished_at is not None,
            "started": task_result.started_at is not None,
            "value": value,
        })
    return receive


started, finished = receiver("started"), receiver("finished")
signals.task_started.connect(started)
signals.task_finished.connect(finished)
order = Order.objects.create(email="a@example.com")
ids = {
    "send_receipt": send_receipt.enqueue(order_id=order.pk).id,
    "charge": charge.enqueue(amount=5).id,
    "attempts_so_far": attempts_so_far.enqueue().id,
}
drain(task_backends["default"].queue, include_scheduled=True)
done = {name: charge.get_backend().get_result(result_id) for name, result_id in ids.items()}
print(json.dumps({
    "ids": ids,
    "seen": seen,
    "done": {
        name: [r.status, r.attempts, r.worker_ids, r.started_at == r.last_attempted_at]
        for name, r in done.items()
    },
}))
"""


def test_each_attempt_sends_task_started_and_task_finished(
    project: tuple[Path, dict[str, str]],
) -> None:
    manage(project, "migrate", "--verbosity", "0")
    out = shell(project, SIGNALS)
    by_task: dict[str, list[tuple]] = {}
    for sent in out["seen"]:
        assert sent["sender"] == "JobkeeperBackend"
        assert sent["id"] == out["ids"][sent["task"]]
        assert sent["started"]
        assert sent["workers"] == 1  # the worker holding it
        by_task.setdefault(sent["task"], []).append(
            (
                sent["signal"],
                sent["status"],
                sent["attempts"],
                sent["errors"],
                sent["finished"],
                sent["value"],
            )
        )
    declined = "shop.tasks.PaymentDeclined"
    assert by_task == {
        "send_receipt": [
            ("started", "RUNNING", 1, [], False, None),
            ("finished", "SUCCESSFUL", 1, [], True, "receipt sent to a@example.com"),
        ],
        "attempts_so_far": [
            ("started", "RUNNING", 1, [], False, None),
            ("finished", "SUCCESSFUL", 1, [], True, 1),
        ],
        # MAX_ATTEMPTS=2 in the example: retried once (READY again), then failed.
        "charge": [
            ("started", "RUNNING", 1, [], False, None),
            ("finished", "READY", 1, [declined], False, None),
            ("started", "RUNNING", 2, [declined], False, None),
            ("finished", "FAILED", 2, [declined, declined], True, None),
        ],
    }
    # Once done no worker holds the job: worker_ids is empty, attempts the
    # attempts made; started_at is the last attempt's start.
    assert out["done"] == {
        "send_receipt": ["SUCCESSFUL", 1, [], True],
        "attempts_so_far": ["SUCCESSFUL", 1, [], True],
        "charge": ["FAILED", 2, [], True],
    }


EXC_INFO = """
import json, logging, sys, traceback
from django.tasks import signals, task_backends
from jobkeeper.testing import drain
from shop.tasks import charge
from shop.unstorable import returns_a_set


def exc_name(kind):
    return None if kind is None else f"{kind.__module__}.{kind.__qualname__}"


seen = []


def finished(sender, task_result, **kwargs):
    kind, exc, tb = sys.exc_info()
    seen.append({
        "task": task_result.task.name,
        "status": task_result.status,
        "exc": exc_name(kind),
        "message": str(exc) if exc is not None else None,
        "frame": traceback.extract_tb(tb)[-1].name if tb is not None else None,
        "as_recorded": bool(task_result.errors)
        and task_result.errors[-1].exception_class_path == exc_name(kind),
    })


class Records(logging.Handler):
    records = []

    def emit(self, record):
        if "state=FAILED" in record.getMessage():
            shown = record.exc_info[0] if record.exc_info else None
            self.records.append([record.levelname, exc_name(shown)])


for name in ("django.tasks", "django_tasks"):
    logging.getLogger(name).addHandler(Records())
signals.task_finished.connect(finished)
charge.enqueue(amount=5)
returns_a_set.enqueue()
drain(task_backends["default"].queue, include_scheduled=True)
print(json.dumps({"seen": seen, "logged": Records.records}))
"""

UNSTORABLE = """
try:  # Django >= 6.0
    from django.tasks import task
except ImportError:  # the django-tasks backport
    from django_tasks import task


@task()
def returns_a_set():
    return {1, 2}
"""


def test_a_failed_task_finished_is_sent_inside_an_except_block(
    project: tuple[Path, dict[str, str]],
) -> None:
    # Break-test: task_finished for a FAILED result was sent outside any
    # except block, so Django's own receiver (which reads sys.exc_info(),
    # "Signal is sent inside exception handlers") logged state=FAILED with
    # no traceback on Django 6, and the backport's logger.exception printed
    # "NoneType: None" after each.
    (project[0] / "shop" / "unstorable.py").write_text(UNSTORABLE)
    manage(project, "migrate", "--verbosity", "0")
    out = shell(project, EXC_INFO)
    declined = "shop.tasks.PaymentDeclined"
    base = "jobkeeper.errors.JobkeeperError"
    # In order per task (the drain's rounds interleave the two).
    assert sorted(out["seen"], key=lambda sent: sent["task"]) == [
        # The retried attempt (READY) is not a failure: no exception lent.
        {
            "task": "charge",
            "status": "READY",
            "exc": None,
            "message": None,
            "frame": None,
            "as_recorded": False,
        },
        # The last attempt: the task's own exception, its traceback down to
        # the task's frame, the class its TaskError records.
        {
            "task": "charge",
            "status": "FAILED",
            "exc": declined,
            "message": "declined: 5",
            "frame": "charge",
            "as_recorded": True,
        },
        # Failed without an exception of the task's (its result could not
        # be stored): jobkeeper's base error with the attempt's error text.
        {
            "task": "returns_a_set",
            "status": "FAILED",
            "exc": base,
            "message": "result not storable: result: {1, 2} is a set, not a JSON value "
            "(use dict, list, str, int, float, bool or None)",
            "frame": "_send_failed",
            "as_recorded": True,
        },
    ]
    # What Django's own receiver logs (Django 6: django.tasks; the backport:
    # django_tasks): an ERROR carrying the exception, never NoneType.
    assert sorted(out["logged"]) == [["ERROR", base], ["ERROR", declined]]
