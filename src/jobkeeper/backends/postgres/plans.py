"""PostgreSQL producer statements as sans-IO plans (internal).

A plan is a generator that yields the statements to run, one at a time,
and receives each one's rows; it returns its result. It does no I/O, so
one plan serves the sync backend and the async producer API (``run_plan``
and ``run_plan_async`` in ``plan_runner``): the logic of an enqueue
(unique-key resolution, COPY for large batches, the NOTIFYs announcing the
jobs) is written once. The idea is psycopg's own: its
sync code is generated from the async source (``tools/async_to_sync.py``)
and its connection logic is written as generators driven by sync and async
waiters (``psycopg/generators.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from jobkeeper.backends.flow import check_pending
from jobkeeper.backends.postgres.flow import FlowNeeded
from jobkeeper.backends.rows import (
    aware_utc,
    insert_params,
    job_from_new,
    job_from_row,
    jobs_from_rows,
    match_inserted,
)
from jobkeeper.errors import DatabaseError
from jobkeeper.models import Job, JobStatus, NewJob, NewJobStream

#: Batches at least this large (and without unique keys) are written with COPY.
COPY_MIN_JOBS = 64
#: Rows per chunk the COPY path hands psycopg: in a batch past PostgreSQL's
#: 1,000-row COPY buffer, the server writes the first rows while later ones
#: are still being formatted.
COPY_CHUNK_ROWS = 128
#: Rounds of insert-then-look-up before unique-key conflicts are given up on.
UNIQUE_ROUNDS = 5

Row = dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Execute:
    """Run the named query (``queries.sql``) with ``params``; reply: its rows,
    as dicts by column name, or as tuples when ``tuples`` (a statement whose
    columns the plan reads by position: no names to decode per call).
    ``binary``: results in PostgreSQL's binary format (an array of a
    thousand ids decodes in a third of the time its text takes).
    """

    query: str
    params: dict[str, Any]
    tuples: bool = False
    binary: bool = False
    #: Run while the server runs the statement, where the connection allows
    #: it (else after): client work that needs nothing of its reply.
    meanwhile: Callable[[], None] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Copy:
    """``COPY ... FROM STDIN`` with the named query, writing ``rows``; reply: []."""

    query: str
    rows: list[tuple[Any, ...]]


@dataclasses.dataclass(frozen=True, slots=True)
class CopyText:
    """``COPY ... FROM STDIN`` in text format, writing ``chunks`` (whole
    lines) as they come; then, with the data sent, ``meanwhile()`` runs
    while the server inserts the rows, before the COPY is ended. Reply: [].
    """

    query: str
    chunks: Iterable[str]
    meanwhile: Callable[[], None]


Step = Execute | Copy | CopyText
#: A plan receives each step's rows: ``Row`` dicts, or tuples (``Execute.tuples``).
Plan = Generator[Step, list[Any], Any]


#: Advisory lock keys the unique keys of a batch share, per schema (see
#: unique_lock_bucket; the keys are made in job_insert_many_lock_keys).
UNIQUE_LOCK_BUCKETS = 1024


def unique_lock_bucket(task: str, unique_key: str) -> int:
    """The bucket (0 to ``UNIQUE_LOCK_BUCKETS`` - 1) of a (task, unique_key),
    by a stable hash (Python's ``hash`` differs between processes). A lock
    per key filled PostgreSQL's shared lock table (``max_locks_per_transaction``
    x ``max_connections``, 6,400 by default): a batch of 20,000 keys failed
    with "out of shared memory", and so did other sessions' statements
    meanwhile. Keys sharing a bucket only make two batches wait for each
    other; uniqueness itself is the index's. The advisory lock key adds the
    schema (in SQL: locks are per database, and installations in separate
    schemas of one database must not wait for each other), and keeps the
    buckets' order.
    """
    digest = hashlib.blake2b(f"{task}\0{unique_key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % UNIQUE_LOCK_BUCKETS


def is_single_statement(jobs: Sequence[NewJob]) -> bool:
    """Whether the insert of ``jobs`` is one statement, atomic on its own
    (no unique keys or serial keys, no COPY, no delayed job's NOTIFY): it
    then needs no BEGIN/COMMIT round trips around it. Such a statement
    refuses a queue with ``max_pending`` itself (:class:`FlowNeeded`: run
    the plan again in a transaction, with the check).
    """
    if len(jobs) >= COPY_MIN_JOBS:
        return False
    # A loop, not all() over generators: this runs on every single enqueue.
    for job in jobs:
        if (
            job.delay is not None
            or job.run_at is not None
            or job.unique_key is not None
            or job.serial_key is not None
        ):
            return False
    return True


def insert_plan(jobs: Sequence[NewJob], channel: str, *, in_transaction: bool) -> Plan:
    """Store ``jobs`` (one transaction, or the caller's); returns the Jobs in
    input order (a pending duplicate for a taken ``unique_key``). ``channel``:
    where the insert announces its available jobs' queues and its delayed
    jobs' due times (NOTIFY, delivered at the commit).
    ``in_transaction``: the plan runs in a transaction, so it checks serial
    keys and ``max_pending``; outside one, a statement that meets a limited
    queue inserts nothing and :class:`FlowNeeded` is raised. A
    :class:`NewJobStream` must be :func:`copyable` (it is read once, as the
    rows are copied).

    Raises:
        QueueFull: the batch would take a queue past its ``max_pending``.
        FlowNeeded: see ``in_transaction``.
        PayloadError, ConfigError: an item of a NewJobStream was refused.
    """
    if copyable(jobs):
        assert in_transaction, "the COPY path checks max_pending in its transaction"
        stored, delayed = yield from _insert_copy(jobs, channel)
        yield from _notify_due(channel, delayed)
        return stored
    else:
        limits: dict[str, int] = {}
        if in_transaction:
            limits = yield from _lock_limited(jobs)
        if not any(job.unique_key is not None for job in jobs):
            yield from _count_limited(limits, jobs)
            stored = yield from _insert(jobs, channel, checked=in_transaction)
        else:
            # A job that resolves to its pending duplicate adds nothing, so a
            # batch with unique keys is counted after its rows are in (as on
            # SQLite), with only the rows it added: the retry of an enqueue
            # that did commit gets its job back from a queue at max_pending.
            # The queues stay locked first, as every enqueue locks them: a
            # caller's transaction mixing keyed and unkeyed enqueues must not
            # take the queue's row and a key in opposite orders (a deadlock).
            added: set[int] = set()
            stored = yield from _insert(jobs, channel, checked=in_transaction, added=added)
            new_rows = [new for new, job in zip(jobs, stored, strict=True) if job.id in added]
            yield from _count_limited(limits, new_rows, inserted=True)
    yield from _notify_due(channel, stored)
    return stored


def read_for_insert(jobs: Sequence[NewJob]) -> Sequence[NewJob]:
    """``jobs`` as the insert plan reads them: a :class:`NewJobStream` stays
    one only for the COPY path; any other path gets it validated whole,
    before a connection is taken.
    """
    if isinstance(jobs, NewJobStream) and not copyable(jobs):
        return list(jobs)
    return jobs


def copyable(jobs: Sequence[NewJob]) -> bool:
    """Whether ``jobs`` go in with COPY: a large batch without unique or
    serial keys (a stream's keys are judged by its items' options).
    """
    if len(jobs) < COPY_MIN_JOBS:
        return False
    if isinstance(jobs, NewJobStream):
        return not jobs.keyed
    return all(job.unique_key is None and job.serial_key is None for job in jobs)


def _lock_limited(
    jobs: Sequence[NewJob],
    *,
    channel: str | None = None,
    woken: Sequence[str] = (),
    queues: set[str] | None = None,
) -> Plan:
    """Mark queues that get serial-keyed jobs and lock the rows of the
    batch's queues with ``max_pending``; returns their limits. Enqueues into
    a limited queue serialise on its row, so two cannot both pass the count
    (:func:`_count_limited`, in a later statement, whose snapshot is taken
    with the locks held). The statement also announces the ``woken`` queues
    on ``channel`` (the COPY path's available jobs: no statement of their own
    could). ``queues``: the queues of ``jobs``, when the caller has them
    (the COPY path's, gathered as its rows were written; it has no serial
    keys, so nothing is marked).
    """
    if queues is None:
        serial = sorted({j.queue for j in jobs if j.serial_key is not None})
        if serial:
            yield Execute("job_insert_many_mark_serial", {"queues": serial})
        queues = {j.queue for j in jobs}
    locked = yield Execute(
        "job_insert_many_lock_pending",
        {"queues": sorted(queues), "channel": channel, "woken": list(woken)},
    )
    return {row["name"]: int(row["max_pending"]) for row in locked}


def _count_limited(
    limits: dict[str, int], jobs: Sequence[NewJob], *, inserted: bool = False
) -> Plan:
    """Refuse the batch with :class:`QueueFull` if ``jobs`` take a limited
    queue (``limits``, locked) past its ``max_pending``: before their rows go
    in, or, ``inserted``, after (the count then holds them, and any batch that
    waited on the lock is counted too). Only the queues of ``jobs`` count.
    """
    if not limits:  # the usual case: no set of a bulk batch's queues to build
        return
    queues = {j.queue for j in jobs}
    limits = {queue: limit for queue, limit in limits.items() if queue in queues}
    if not limits:
        return
    counted = yield Execute("job_insert_many_count_pending", {"queues": sorted(limits)})
    check_pending(limits, {row["queue"]: int(row["n"]) for row in counted}, jobs, inserted=inserted)


def get_plan(job_id: int) -> Plan:
    """The job, live or dead, or None."""
    rows = yield Execute("job_get", {"id": job_id})
    if rows:
        return _jobs(rows)[0]
    dead = yield Execute("job_get_dead_letter", {"id": job_id})
    return _jobs(dead, dead=True)[0] if dead else None


def _jobs(rows: list[Row], *, dead: bool = False) -> list[Job]:
    return [job_from_row(row, aware_utc, dead=dead, json_decoded=True) for row in rows]


def _notify_due(channel: str, jobs: list[Job]) -> Plan:
    """Tell listening workers when the scheduled jobs among ``jobs`` come
    due (one NOTIFY per queue, in the insert's transaction), so that they
    stage them then rather than at their next poll.
    """
    due: dict[str, datetime] = {}
    scheduled = JobStatus.SCHEDULED  # looked up once: an enum member costs a class lookup
    for job in jobs:
        if job.status is scheduled:
            due[job.queue] = min(due.get(job.queue, job.scheduled_at), job.scheduled_at)
    if due:
        yield Execute(
            "notify_due", {"channel": channel, "queues": list(due), "due_ats": list(due.values())}
        )


def _insert(
    jobs: Sequence[NewJob], channel: str, *, checked: bool, added: set[int] | None = None
) -> Plan:
    """The jobs' rows (no COPY); ``added`` gets the ids of the rows
    inserted (not a pending duplicate's).
    """
    if len(jobs) == 1 and jobs[0].unique_key is None:
        return [(yield from _insert_one(jobs[0], channel, checked=checked))]
    keys = {(j.task, j.unique_key) for j in jobs if j.unique_key is not None}
    if len(keys) > 1:
        # Rows go in input order (ids ascend with it), so two batches
        # holding the same keys in different orders would each wait in
        # the unique index for a key the other took first: a deadlock.
        # The locks are taken in one order for all batches instead; also
        # when all of a batch's keys share one lock.
        buckets = sorted({unique_lock_bucket(task, key) for task, key in keys})
        yield Execute("job_insert_many_lock_keys", {"buckets": buckets})
    out: list[Job | None] = [None] * len(jobs)
    pending = list(range(len(jobs)))
    # A duplicate can finish between the skipped insert and the lookup;
    # then the key is free again and the next round inserts it.
    for _ in range(UNIQUE_ROUNDS):
        batch = [jobs[i] for i in pending]
        rows = yield Execute(
            "job_insert_many",
            {
                "queues": [j.queue for j in batch],
                "tasks": [j.task for j in batch],
                "args": [j.args_json for j in batch],
                "priorities": [j.priority for j in batch],
                "max_attempts": [j.max_attempts for j in batch],
                "delays": [j.delay for j in batch],
                "run_ats": [j.run_at for j in batch],
                "unique_keys": [j.unique_key for j in batch],
                "serial_keys": [j.serial_key for j in batch],
                "trace_contexts": [j.trace_context for j in batch],
                "checked": checked,
                "channel": channel,
            },
        )
        inserted = _jobs(rows)
        if not inserted and not checked:
            raise FlowNeeded
        if added is not None:
            added.update(job.id for job in inserted)
        existing: dict[tuple[str, str], Job] = {}
        if len(inserted) < len(batch):
            keyed = [j for j in batch if j.unique_key is not None]
            found = yield Execute(
                "job_insert_many_pending",
                {"tasks": [j.task for j in keyed], "unique_keys": [j.unique_key for j in keyed]},
            )
            for job in _jobs(found):
                assert job.unique_key is not None
                existing[(job.task, job.unique_key)] = job
        matched, unresolved = match_inserted(batch, inserted, existing)
        for position, matched_job in zip(pending, matched, strict=True):
            out[position] = matched_job
        pending = [pending[i] for i in unresolved]
        if not pending:
            return [job for job in out if job is not None]
    raise DatabaseError(f"could not resolve unique_key conflicts after {UNIQUE_ROUNDS} rounds")


def _insert_one(new: NewJob, channel: str, *, checked: bool) -> Plan:
    """One job without a unique key: one statement, and no row to decode
    (the args go back as the caller gave them, like the COPY path's). The
    usual single enqueue (a job to run now, outside a transaction) does not
    come here: the backends run ``job_insert_many_now`` directly (see
    ``inserts.py``).
    """
    params = insert_params(new, new.run_at)
    params["checked"] = checked
    params["channel"] = channel
    rows = yield Execute("job_insert_many_one", params, tuples=True)
    if not rows:
        raise FlowNeeded
    job_id, status, scheduled_at, created_at, _ = rows[0]
    return job_from_new(
        new, job_id, created_at.astimezone(UTC), (JobStatus(status), scheduled_at.astimezone(UTC))
    )


def _insert_copy(jobs: Sequence[NewJob], channel: str) -> Plan:
    """Bulk insert with COPY (no unique keys to resolve): a fixed number of
    round trips whatever the count. The ids are reserved first (a stream is
    validated meanwhile), so each row is written in one pass; the Jobs are
    built while the server inserts the rows. ``max_pending`` is checked
    after the rows are in, by the statement that announces the available
    jobs' queues. Returns the Jobs, and those of them that were delayed
    (only these can be scheduled).
    """
    # The items are validated while the server reserves the ids: COPY
    # buffers 1,000 rows before it writes any, so validating them between
    # the chunks overlapped nothing of a batch of 1,000 (see the commit that
    # moved it here). A refused item still writes nothing.
    rows = yield Execute(
        "job_insert_many_reserve_ids",
        {"count": len(jobs)},
        binary=True,
        # A list was validated whole before the transaction: nothing to
        # overlap, and no pipeline to enter for it.
        meanwhile=jobs.read if isinstance(jobs, NewJobStream) else None,
    )
    reserved_now, ids, serial_queues = rows[0].values()
    # The rows as columns (see NewJobStream): a head per row, whose
    # args_json and args are the row's own only where no other row shares it.
    if isinstance(jobs, NewJobStream):
        jobs.read()  # done while the ids were reserved: a no-op
        heads, args_jsons, args_column = jobs.heads, jobs.args_json, jobs.args
    else:
        heads = list(jobs)
        args_jsons = [new.args_json for new in heads]
        args_column = [new.args for new in heads]
    # The jobs of serial queues are flagged (serial_unkeyed; none has a key
    # here): COPY's text for true, or for NULL. Without serial queues the
    # COPY leaves the column out (the usual case: nothing more to write).
    flags = {queue: "t" for queue in serial_queues}
    ids.sort()  # ascending in input order: FIFO among equal priorities
    now = reserved_now.astimezone(UTC)
    built: list[Job] = []
    delayed: list[int] = []  # positions of the jobs that wait: the second COPY's
    # The batch's queues, and those its jobs to run now wake, gathered as the
    # rows are written: a pass over a thousand Jobs afterwards cost more.
    queues: set[str] = set()
    woken: set[str] = set()

    def immediate_lines() -> Iterator[str]:
        lines: list[str] = []
        append = lines.append
        last: NewJob | None = None
        immediate = False
        before = after = ""
        for position, (head, args_json, job_id) in enumerate(
            zip(heads, args_jsons, ids, strict=True)
        ):
            if head is not last:
                # What the row's head gives its line, worked out once for
                # the rows that share it (a task's rows given no options).
                last = head
                if head.unique_key is not None or head.serial_key is not None:
                    # A stream is copied only when no item's options name a
                    # key; a key here means that check missed one: never drop it.
                    raise DatabaseError(
                        "internal error: a keyed job reached the COPY path; nothing was written"
                    )
                immediate = head.delay is None and head.run_at is None
                queues.add(head.queue)
                if immediate:
                    # One row in COPY's text format, written out here rather
                    # than by psycopg's write_row (whose formatting of any
                    # value cost a third of the row's time). Queue and task
                    # names are validated to letters, digits and
                    # ``_ . : - /``: nothing to escape.
                    woken.add(head.queue)
                    trace = head.trace_context
                    before = f"\t{head.queue}\t{head.task}\t"
                    after = (
                        f"\t{head.priority}\t{head.max_attempts}\t"
                        f"{_COPY_NULL if trace is None else _copy_text(trace)}"
                        + (f"\t{flags.get(head.queue, _COPY_NULL)}\n" if flags else "\n")
                    )
            if not immediate:
                delayed.append(position)
                continue
            if "\\" in args_json:
                # JSON text holds no raw tab, newline or return (both
                # encoders escape control characters): only backslashes.
                args_json = args_json.translate(_COPY_ESCAPES)
            append(f"{job_id}{before}{args_json}{after}")
            if len(lines) == COPY_CHUNK_ROWS:
                yield "".join(lines)
                lines = []
                append = lines.append
        if lines:
            yield "".join(lines)

    def build() -> None:
        built.extend(jobs_from_rows(heads, args_jsons, args_column, ids, now))

    copy = "job_insert_many_copy_serial" if flags else "job_insert_many_copy"
    yield CopyText(copy, immediate_lines(), build)
    waiting = [built[i] for i in delayed]
    if waiting:
        yield Copy(
            "job_insert_many_copy_scheduled",
            [
                (job.id, job.queue, job.task, args_jsons[i], job.status.value,
                 job.priority, job.max_attempts, job.scheduled_at, now, job.trace_context,
                 True if job.queue in flags else None)
                for i, job in ((i, built[i]) for i in delayed)
            ],
        )  # fmt: skip
        woken.update(job.queue for job in waiting if job.status is JobStatus.AVAILABLE)
    limits = yield from _lock_limited(heads, channel=channel, woken=sorted(woken), queues=queues)
    yield from _count_limited(limits, heads, inserted=True)
    return built, waiting


#: COPY's text format escapes these; JSON text holds no raw control
#: characters, so for args only the backslash ever occurs.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_COPY_NULL = "\\N"


def _copy_text(value: str | None) -> str:
    if value is None:
        return _COPY_NULL
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_COPY_ESCAPES)
    return value
