"""A database with jobs in every state, for the dashboard's tests (and its
screenshots): written through the API and the backend's own operations, as
a worker would, without running one.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from datetime import UTC, datetime

from jobkeeper import JobQueue
from jobkeeper.models import Completion, Failure, WorkerInfo
from jobkeeper.outcomes import claim_of

TRACEBACK = """Traceback (most recent call last):
  File "/srv/app/jobs.py", line 42, in send_invoice
    response = client.post(url, json=payload, timeout=10)
  File "/srv/app/http.py", line 17, in post
    raise ConnectionError(f"{url}: connection refused")
ConnectionError: https://billing.internal/api/invoices: connection refused
"""


@dataclass
class Seeded:
    available: list[int]
    scheduled: int
    running: int
    completed: list[int]
    retryable: int
    dead: int
    cancelled: int
    worker_id: str


REPORT_TRACEBACK = """Traceback (most recent call last):
  File "/srv/app/reports.py", line 88, in render_report
    template = TEMPLATES[options["template"]]
KeyError: 'template'
"""


def _error(attempt: int, message: str, traceback: str = TRACEBACK) -> str:
    return json.dumps({"attempt": attempt, "error": message, "traceback": traceback})


def seed(jq: JobQueue, *, completed: int = 12) -> Seeded:
    """Jobs of queues ``default``, ``emails`` and ``reports`` in every status,
    and one live worker serving ``default`` and ``emails``.
    """
    backend = jq.backend
    worker = WorkerInfo(
        id=f"{socket.gethostname()}-4242-a1b2",
        hostname=socket.gethostname(),
        pid=4242,
        queues=["default", "emails"],
        started_at=datetime.now(UTC),
        heartbeat_at=datetime.now(UTC),
        rescue_after=60.0,
    )
    backend.worker_register(worker=worker)
    done = jq.enqueue_many(
        [("send_invoice", {"invoice": 1000 + i, "customer": f"c-{i}"}) for i in range(completed)]
    )
    claimed = backend.job_claim(worker_id=worker.id, queue="default", limit=completed)
    backend.job_complete_many(
        completions=[
            Completion(claim_of(j), json.dumps({"sent": True, "pages": 2})) for j in claimed
        ],
        delete=False,
    )
    failing = jq.enqueue("send_invoice", {"invoice": 77, "customer": "acme"}, max_attempts=3)
    dying = jq.enqueue("render_report", {"report": "q3", "format": "pdf"}, queue="reports",
                       max_attempts=1)  # fmt: skip
    (claim,) = backend.job_claim(worker_id=worker.id, queue="default", limit=1)
    backend.job_fail_many(
        failures=[Failure(claim_of(claim), "retryable", _error(1, "ConnectionError: "
                 "https://billing.internal/api/invoices: connection refused"), retry_in=600)]
    )  # fmt: skip
    (claim,) = backend.job_claim(worker_id=worker.id, queue="reports", limit=1)
    backend.job_fail_many(
        failures=[Failure(claim_of(claim), "dead",
                 _error(1, "KeyError: 'template'", REPORT_TRACEBACK),
                 reason="max_attempts exhausted")]
    )  # fmt: skip
    running = jq.enqueue("send_email", {"to": "ops@example.com"}, queue="emails")
    (started,) = backend.job_claim(worker_id=worker.id, queue="emails", limit=1)
    backend.job_start_many(claims=[claim_of(started)])
    cancelled = jq.enqueue("send_email", {"to": "old@example.com"}, queue="emails", delay=3600)
    jq.cancel(cancelled.id)
    scheduled = jq.enqueue("render_report", {"report": "q4"}, queue="reports", delay=1800)
    available = [
        jq.enqueue("send_email", {"to": f"user{i}@example.com"}, queue="emails").id
        for i in range(3)
    ]
    return Seeded(
        available=available,
        scheduled=scheduled.id,
        running=running.id,
        completed=[j.id for j in done],
        retryable=failing.id,
        dead=dying.id,
        cancelled=cancelled.id,
        worker_id=worker.id,
    )


def finish(jq: JobQueue, queue: str, n: int, *, ago: float = 0.0) -> None:
    """Complete ``n`` new jobs of ``queue``, their finished_at ``ago`` seconds back."""
    jobs = jq.enqueue_many([("t", {"i": i}, {"queue": queue}) for i in range(n)])
    claimed = jq.backend.job_claim(worker_id="w1", queue=queue, limit=n)
    assert len(claimed) == n
    jq.backend.job_complete_many(
        completions=[Completion(claim_of(j), None) for j in claimed], delete=False
    )
    if ago:
        ids = [job.id for job in jobs]
        run_sql(
            jq,
            "UPDATE jobkeeper_jobs SET finished_at = finished_at - make_interval(secs => %s)"
            " WHERE id BETWEEN %s AND %s",
            "UPDATE jobkeeper_jobs SET finished_at = finished_at - ? WHERE id BETWEEN ? AND ?",
            (ago, min(ids), max(ids)),
        )


def run_sql(jq: JobQueue, postgres: str, sqlite: str, params: tuple[object, ...]) -> None:
    """Run the statement of ``jq``'s backend."""
    if jq.backend.name == "postgresql":
        jq.backend._fetch_raw(postgres, params)
    else:
        jq.backend._conn().execute(sqlite, params)


def delete_finished(jq: JobQueue, queue: str, n: int) -> None:
    """Delete ``n`` finished jobs of ``queue``, as retention pruning does."""
    query = (
        "DELETE FROM jobkeeper_jobs WHERE id IN (SELECT id FROM jobkeeper_jobs"
        " WHERE queue = {0} AND status = 'completed' LIMIT {0})"
    )
    run_sql(jq, query.format("%s"), query.format("?"), (queue, n))
