"""Helpers of the backend tests: claiming as a fake worker, building fenced
completions and failures. Raw SQL is in ``support.db``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from jobkeeper import Job, JobQueue
from jobkeeper.models import Claim, Completion, Failure, WorkerInfo
from jobkeeper.outcomes import error_entry
from support.db import count, sql

WORKER = "test-worker-1"


def total_rows(jq: JobQueue) -> int:
    return count(jq) + count(jq, "jobkeeper_dead_letters")


def register(jq: JobQueue, worker_id: str = WORKER, queues: Sequence[str] = ("default",)) -> None:
    now = datetime.now(UTC)
    jq.backend.worker_register(worker=WorkerInfo(worker_id, "test-host", 1, list(queues), now, now))


def claim(
    jq: JobQueue, queue: str = "default", limit: int = 100, worker_id: str = WORKER
) -> list[Job]:
    register(jq, worker_id, [queue])
    return jq.backend.job_claim(worker_id=worker_id, queue=queue, limit=limit)


def claim_of(job: Job) -> Claim:
    assert job.worker_id is not None
    return Claim(job.id, job.worker_id, job.attempt, job.fence)


def complete(
    jq: JobQueue, job: Job, result: str | None = None, claim_: Claim | None = None
) -> set[int]:
    return jq.backend.job_complete_many(
        completions=[Completion(claim_ or claim_of(job), result)], delete=False
    )


def fail(
    jq: JobQueue,
    job: Job,
    outcome: str = "retryable",
    *,
    retry_in: float = 0.0,
    claim_: Claim | None = None,
    error: str = "boom",
) -> set[int]:
    entry = error_entry(job, error, None)
    failure = Failure(claim_ or claim_of(job), outcome, entry, retry_in=retry_in, reason=error)
    return jq.backend.job_fail_many(failures=[failure])


def kill(jq: JobQueue, job: Job) -> Job:
    """Claim ``job`` (must be the only available one) and dead-letter it."""
    (running,) = [j for j in claim(jq, job.queue) if j.id == job.id]
    assert fail(jq, running, "dead") == {job.id}
    dead = jq.get_job(job.id)
    assert dead is not None
    return dead


def with_pg_options(url: str, extra: str) -> str:
    """``url`` with ``extra`` appended to its libpq ``options`` parameter."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query["options"] = f"{query.get('options', '')} {extra}".strip()
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


def current_schema(jq: JobQueue) -> str:
    return str(sql(jq, "SELECT current_schema()")[0][0])
