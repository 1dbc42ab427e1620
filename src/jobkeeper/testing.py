"""Helpers for testing code that uses jobkeeper (they need no pytest), and
the fixtures of its pytest plugin (:mod:`jobkeeper.pytest_plugin`).

Installed with jobkeeper, the plugin is loaded by pytest on its own (entry
point ``pytest11``) and gives two fixtures:

- ``jobkeeper_database_url``: a fresh, empty database per test -- a SQLite
  file in the test's ``tmp_path``, or, when pointed at a PostgreSQL server
  (``--jobkeeper-database URL`` or ``$JOBKEEPER_TEST_DATABASE_URL``), a new
  schema on it, dropped after the test.
- ``jobkeeper_queue``: a migrated :class:`~jobkeeper.JobQueue` on that
  database. With the ini option ``jobkeeper_app = "myapp.jobs:jq"`` it is
  the application's own queue, pointed at the test database for the test
  (so its tasks, and the jobs they enqueue, use it) and pointed back after.
  While it is active, any other queue of the process not on the test
  database refuses to use its own (``ConfigError`` naming the ini option),
  and the test fails: without the option, the application's tasks would
  write their jobs into its real database.

and functions to call from tests:

- :func:`drain` runs the due jobs of a queue in the calling process until
  none is left, on the real worker (claims, retries, dead letters, the
  database as in production); ``include_scheduled=True`` runs delayed and
  retrying jobs too, at once -- Oban's ``drain_queue(with_scheduled: true)``.
- :func:`assert_enqueued` checks which jobs are waiting to run.
- :func:`run_task` calls a task's function directly, with a job context so
  that :func:`jobkeeper.current_job` works; :func:`job_context` sets one up
  for any code.

Nothing here replaces the database with a fake: tests see the SQL that
production runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import inspect
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from jobkeeper.api import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, JobQueue
from jobkeeper.context import set_current_job, unbind
from jobkeeper.models import Job, JobStatus
from jobkeeper.payload import encode_args
from jobkeeper.periodic import PeriodicRegistry
from jobkeeper.tasks import Task

#: Environment variable naming a PostgreSQL server for ``jobkeeper_queue``.
DATABASE_ENV = "JOBKEEPER_TEST_DATABASE_URL"

#: Seconds: a drain runs the jobs due this soon after its start (by the
#: database's clock; its worker stages as if the clock stood there, so a job
#: that fails during the drain waits out even a backoff of a millisecond).
#: It is also how often the draining worker looks for due work while a job
#: runs (one cheap query each time): small, but not zero.
DRAIN_HORIZON = 0.001

#: Statuses of jobs that wait to run (what :func:`assert_enqueued` looks at).
WAITING = (JobStatus.SCHEDULED, JobStatus.AVAILABLE, JobStatus.RETRYABLE)


class DrainError(AssertionError):
    """:func:`drain` could not finish: jobs kept coming back for more rounds
    than allowed, or some outcomes could not be written.
    """


def drain(
    jq: JobQueue,
    *,
    queues: Sequence[str] | None = None,
    include_scheduled: bool = False,
    max_rounds: int = 100,
) -> dict[str, int]:
    """Run the jobs of ``jq`` that are due, in this process, until none is left.

    A real worker (``jq.worker(..., burst=True)``) runs them one at a time,
    lowest priority first, and returns when nothing is available: every job
    takes the path it takes in production (retries, ``Discard``, dead
    letters, follow-up jobs that tasks enqueue, which run in the same drain
    if they are due). No periodic ticks are enqueued while draining. The
    worker's threads have all ended when ``drain`` returns.

    Queue settings hold: the jobs of a paused queue are left alone, and a
    rate-limited queue runs as many as its window allows now.

    Without ``include_scheduled``, a job delayed into the future, or a failed
    one waiting out its backoff, is left waiting (unless it is due within
    ``DRAIN_HORIZON`` seconds of the drain's start, by the database's clock):
    a job that fails during the drain does not run again in it, however
    short its backoff. With it, such jobs are
    made available at once (by the worker's own staging step, told that
    their time has come; in every queue of the database, not only
    ``queues``) and run, round after round,
    until none is left: a failing job runs all of its attempts and ends in
    the dead letters. This is Oban's ``drain_queue(with_scheduled: true)``.

    Args:
        jq: the queue (its tasks are the ones run).
        queues: queue names (default: every queue of the registered tasks and
            every queue that has jobs).
        include_scheduled: run delayed and retrying jobs too, at once.
        max_rounds: with ``include_scheduled``, most rounds of making jobs due
            (a task that always snoozes or reschedules itself never finishes).

    Returns:
        How many attempts left their job in each status (``completed``,
        ``retryable``, ``dead``, ``cancelled``, ...), e.g. ``{"completed": 2}``.

    Raises:
        DrainError: jobs still came due after ``max_rounds`` rounds, or the
            worker could not write some outcomes.
    """
    names = list(queues) if queues else _all_queues(jq)
    runner = _drain_queue(jq)
    staged_until = jq.backend.db_now() + timedelta(seconds=DRAIN_HORIZON)
    totals: Counter[str] = Counter()
    try:
        rounds = 0
        while True:
            moved = _stage_everything(jq, names) if include_scheduled else 0
            if rounds and not moved:
                break
            if rounds >= max_rounds:
                raise DrainError(
                    f"drain: jobs still came due after {max_rounds} rounds "
                    "(a task that always retries, snoozes or re-enqueues itself?)"
                )
            worker = runner.worker(names, concurrency=1, burst=True, prefetch=0)
            # Staged as if the clock stood at the drain's start: a job retried
            # during the drain waits out its backoff, however short full
            # jitter made it, instead of running again in the same drain.
            worker.producer.staged_until = staged_until
            stats = worker.run()
            totals.update(stats.by_outcome)
            if stats.exit_code:
                raise DrainError("drain: the worker could not write some outcomes")
            rounds += 1
            if not include_scheduled:
                break
    finally:
        runner.close()
    return dict(totals)


#: The stager's clock for ``include_scheduled``: every delay is over by then.
_FAR_FUTURE = datetime(3000, 1, 1, tzinfo=UTC)


def _stage_everything(jq: JobQueue, queues: Sequence[str]) -> int:
    """Make every scheduled and retrying job available now, with the worker's
    own staging operation run as if its clock read ``_FAR_FUTURE``; returns how
    many moved. The stager moves the jobs of every queue, not only ``queues``
    (which only say whose next due time it reports).
    """
    moved = 0
    while staged := jq.backend.job_stage_due(queues=queues, now=_FAR_FUTURE).staged:
        moved += staged
    return moved


def _all_queues(jq: JobQueue) -> list[str]:
    return sorted(set(jq.default_queues()) | set(jq.stats()))


def _drain_queue(jq: JobQueue) -> JobQueue:
    """A queue on ``jq``'s database sharing its tasks and event listeners,
    whose worker stops as soon as nothing is due and runs no periodics.
    """
    runner = jq.using(jq.url.url)
    runner.settings = dataclasses.replace(jq.settings, poll_interval=DRAIN_HORIZON)
    runner.periodics = PeriodicRegistry(
        jq.tasks,
        max_payload_bytes=lambda: jq.settings.max_payload_bytes,
        defaults=(DEFAULT_QUEUE, 0, DEFAULT_MAX_ATTEMPTS),
    )
    return runner


def assert_enqueued(
    task: str | Task[Any, Any],
    args: dict[str, Any] | None = None,
    *,
    count: int | None = None,
    queue: str | None = None,
    jq: JobQueue | None = None,
) -> list[Job]:
    """Assert that jobs of ``task`` wait to run (scheduled, available or
    retryable), and return them, oldest first.

    Args:
        task: a Task, or a task name (then ``jq`` is required).
        args: match only jobs whose args contain these items (a subset: other
            keys may differ), as Oban's ``assert_enqueued`` does; values are
            compared as JSON values (``True`` does not match a stored ``1``).
        count: exactly this many must match (default: at least one).
        queue: match only jobs of this queue.
        jq: the queue to look in (default: the one the Task is registered on).

    Returns:
        The matching jobs.

    Raises:
        AssertionError: the match fails; the message lists what is enqueued.
        TypeError: a task name without ``jq``.
    """
    name = task.name if isinstance(task, Task) else task
    owner: object = jq
    if owner is None and isinstance(task, Task):
        owner = task._owner
    if not isinstance(owner, JobQueue):
        raise TypeError("assert_enqueued: pass jq= with a task name")
    waiting = [
        job
        for status in WAITING
        for job in owner.list_jobs(status=status, queue=queue, task=name, limit=10_000)
    ]
    waiting.sort(key=lambda job: job.id)
    wanted = args or {}
    matching = [
        job
        for job in waiting
        if all(
            _same_json((job.args or {}).get(key, _MISSING), value) for key, value in wanted.items()
        )
    ]
    if (count is None and not matching) or (count is not None and len(matching) != count):
        expected = "at least one" if count is None else str(count)
        found = "; ".join(f"#{job.id} {job.status} args={job.args}" for job in waiting) or "none"
        raise AssertionError(
            f"expected {expected} enqueued {name!r} job(s)"
            + (f" with args containing {wanted}" if wanted else "")
            + (f" in queue {queue!r}" if queue else "")
            + f", found {len(matching)}; enqueued {name!r} jobs: {found}"
        )
    return matching


def refute_enqueued(
    task: str | Task[Any, Any],
    args: dict[str, Any] | None = None,
    *,
    queue: str | None = None,
    jq: JobQueue | None = None,
) -> None:
    """Assert that no job of ``task`` (with ``args`` as a subset) waits to run.

    Raises:
        AssertionError: some do; the message lists them.
    """
    assert_enqueued(task, args, count=0, queue=queue, jq=jq)


_MISSING = object()


def _same_json(stored: Any, wanted: Any) -> bool:
    """Whether ``stored`` (decoded args) equals ``wanted`` as JSON values:
    ``true`` is not ``1`` (Python's ``True == 1`` matched a job stored with
    ``1`` against ``True``); numbers compare by value (``1 == 1.0``).
    """
    if isinstance(stored, bool) or isinstance(wanted, bool):
        return type(stored) is type(wanted) and stored == wanted
    if isinstance(stored, dict) and isinstance(wanted, dict):
        return stored.keys() == wanted.keys() and all(
            _same_json(stored[key], wanted[key]) for key in stored
        )
    if isinstance(stored, list) and isinstance(wanted, list | tuple):
        return len(stored) == len(wanted) and all(
            _same_json(a, b) for a, b in zip(stored, wanted, strict=True)
        )
    if isinstance(stored, dict | list) or isinstance(wanted, dict | list | tuple):
        return False
    return bool(stored == wanted)


@contextlib.contextmanager
def job_context(
    task: str | Task[Any, Any] = "test",
    args: dict[str, Any] | None = None,
    **fields: Any,
) -> Iterator[Job]:
    """Make :func:`jobkeeper.current_job` return a job while the block runs.

    The job is not stored anywhere: its ``id`` is 0 unless given.

    Args:
        task: the task (or its name) the job belongs to.
        args: the job's args.
        **fields: any other :class:`~jobkeeper.Job` field (``attempt=3``,
            ``max_attempts=3``, ``id=42``, ...).

    Yields:
        The job.
    """
    now = datetime.now(UTC)
    values: dict[str, Any] = {
        "id": 0,
        "task": task.name if isinstance(task, Task) else task,
        "args": dict(args or {}),
        "queue": task.queue if isinstance(task, Task) else DEFAULT_QUEUE,
        "status": JobStatus.RUNNING,
        "priority": task.priority if isinstance(task, Task) else 0,
        "attempt": 1,
        "max_attempts": task.max_attempts if isinstance(task, Task) else DEFAULT_MAX_ATTEMPTS,
        "scheduled_at": now,
        "created_at": now,
        "attempted_at": now,
        "worker_id": "jobkeeper.testing",
        "fence": 1,
    }
    values.update(fields)
    job = Job(**values)
    token = set_current_job(job)
    try:
        yield job
    finally:
        unbind(token)


def run_task(task: Task[Any, Any], /, **args: Any) -> Any:
    """Call ``task``'s function with ``args`` inside a job context, in this
    thread, and return what it returns (an ``async def`` task is run with
    ``asyncio.run``, on a thread of its own if this thread runs an event
    loop). Exceptions (``Retry``, ``Discard``, errors) propagate.

    The args are checked as ``enqueue`` checks them (the task's parameters,
    JSON-native values) and passed as a worker passes them, through JSON.
    ``run_task`` itself writes nothing to a database; what the task does is
    done for real (a job it enqueues is stored in its queue's database, where
    :func:`assert_enqueued` finds it).

    Args:
        task: a task registered with ``@jq.task``.
        **args: its keyword arguments.

    Returns:
        The function's return value.

    Raises:
        PayloadError: ``args`` would be refused by ``enqueue``.
    """
    task.check_args(args)
    decoded = json.loads(encode_args(args, max_bytes=1 << 28))
    with job_context(task, decoded):
        result = task.fn(**decoded)
        if inspect.isawaitable(result):
            result = _run_coroutine(_awaited(result))
    return result


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _run_coroutine(coroutine: Any) -> Any:
    """Run ``coroutine`` to its end: with ``asyncio.run`` here, or, when this
    thread already runs an event loop (an async test, a library driving one),
    on a new loop in a thread of its own, with this thread's context (so
    ``current_job()`` works there too).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    context = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jobkeeper-run-task") as pool:
        return pool.submit(context.run, asyncio.run, coroutine).result()


__all__ = [
    "DrainError",
    "assert_enqueued",
    "drain",
    "job_context",
    "refute_enqueued",
    "run_task",
]
