"""Pure data types shared by every layer: job states, jobs, workers.

This module performs no I/O and imports nothing else from jobkeeper, so the
backends, the worker and the public API can all depend on it without cycles
(the role River's ``rivertype`` package plays).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, overload


class JobStatus(enum.StrEnum):
    """Where a job is in its lifecycle.

    The words are River's (British "cancelled"), plus ``dead`` for jobs that
    live in ``jobkeeper_dead_letters``::

        scheduled --(scheduled_at reached)--> available --(claim)--> claimed
        claimed --(start mark)--> running
        claimed | running --> completed | retryable | dead | cancelled
        claimed | running --(hand-back, free return)--> available
        retryable --(backoff elapsed)--> available
    """

    #: Waiting for ``scheduled_at`` (enqueued with ``delay``/``run_at``).
    #: In: enqueue. Out: the worker's stager, once ``scheduled_at`` has passed.
    SCHEDULED = "scheduled"
    #: Ready to be claimed. In: enqueue, stager, retry, requeue, graceful release.
    #: Out: a worker's claim.
    AVAILABLE = "available"
    #: Held by exactly one worker (``worker_id``) that has not started it yet
    #: (prefetched). In: a worker's claim (which counts the attempt and bumps
    #: ``fence``). Out: the holder's start mark (to ``running``), its fenced
    #: outcome or unstarted hand-back, or the rescuer once the holder stops
    #: heartbeating: back to ``available`` without spending the attempt, up
    #: to a bound (see the rescuer), then as a lost ``running`` job.
    CLAIMED = "claimed"
    #: Started: held by exactly one worker (``worker_id``) whose task was
    #: called. In: the holder's start mark (fenced). Out: that worker's fenced
    #: completion/failure, or the rescuer once the holder stops heartbeating
    #: (the attempt is spent). A job whose outcome is written before its
    #: start mark goes from ``claimed`` to its outcome directly.
    RUNNING = "running"
    #: A failed attempt waiting out its backoff. In: failure, rescue. Out: stager.
    RETRYABLE = "retryable"
    #: Finished successfully; kept for ``retention`` seconds, then pruned.
    COMPLETED = "completed"
    #: Stopped on request (``JobQueue.cancel``); kept for ``retention`` seconds.
    CANCELLED = "cancelled"
    #: Out of attempts or discarded; the row lives in ``jobkeeper_dead_letters``.
    DEAD = "dead"


#: States a job never leaves on its own.
TERMINAL_STATUSES: frozenset[JobStatus] = frozenset(
    {JobStatus.COMPLETED, JobStatus.CANCELLED, JobStatus.DEAD}
)
#: States of a job that will still run (or is running).
PENDING_STATUSES: frozenset[JobStatus] = frozenset(
    {
        JobStatus.SCHEDULED,
        JobStatus.AVAILABLE,
        JobStatus.CLAIMED,
        JobStatus.RUNNING,
        JobStatus.RETRYABLE,
    }
)
#: States of a job a worker holds (``worker_id`` set).
HELD_STATUSES: frozenset[JobStatus] = frozenset({JobStatus.CLAIMED, JobStatus.RUNNING})

#: The largest job id (ids are 64-bit signed on every backend; 0 and below are never ids).
MAX_JOB_ID = 2**63 - 1


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    """One job as stored.

    Attributes:
        id: 64-bit id, assigned in increasing order at enqueue.
        task: the task's registered name.
        args: the keyword arguments (a JSON object). ``None`` only when a row
            written outside jobkeeper holds args that cannot be decoded; the
            worker then fails the attempt with ``args_error``.
        queue: the queue name.
        status: see :class:`JobStatus`.
        priority: lower runs first.
        attempt: attempts started so far (counted at claim time; a claim
            that ends without starting gives it back).
        max_attempts: the attempt at which a failure sends the job to the dead letters.
        scheduled_at: not to run before this (UTC).
        created_at: when it was enqueued (UTC).
        attempted_at: when the current/last attempt started (UTC), or ``None``.
        finished_at: when it completed, was cancelled or died (UTC), or when
            the last attempt failed; ``None`` while pending.
        worker_id: the holder while claimed or running, else ``None``.
        unique_key: deduplication key, or ``None``.
        errors: one ``{"attempt", "at", "error", "traceback"}`` dict per failed attempt.
        result: the task's JSON return value once completed.
        cancel_requested: ``True`` when ``cancel`` was asked while it was
            held; whatever its attempt does next (unless it succeeds), the
            job then ends ``cancelled``.
        fence: grows by one with every claim of the job and never goes
            back (a retry or a requeue from the dead letters keeps it, where
            ``attempt`` starts again): every write of a holder is fenced on
            it, so a stale holder (whose claim was handed back, rescued, even
            dead-lettered and requeued, and perhaps re-claimed at the same
            attempt) writes nothing. A dead letter's is its last claim's
            (for one moved before schema version 18, or by a worker of 17:
            the most of its ``attempt`` and its count of ``errors``), the
            fence a requeue gives back.
        unstarted_returns: how often a claim of the job was lost before it
            started and the attempt given back (bounded by the rescuer).
        run_alone: its last running attempt was rescued from a holder that
            went silent, so its next attempt runs alone on its worker (no
            other job beside it) and a crash then is pinned on it (the crash
            budget, ``max_crashes``). Cleared once a worker writes an outcome
            of an attempt of it.
        crashes: pinned crashes: attempts it ran alone whose worker died
            under it. At ``max_crashes`` the rescuer sends it to the dead
            letters, attempts left or not. Jobs that only shared a worker
            with a crashing job are never counted here. Dead letters keep
            the count (their ``dead_reason`` names it too).
        alone_fence: the ``fence`` of the claim whose attempt a worker
            started alone (``None``: none yet); internal to the crash budget.
        dead_reason: why it was dead-lettered (only for ``status == "dead"``).
        args_error: why ``args`` could not be decoded, else ``None``.
        trace_context: the enqueuer's OpenTelemetry trace context, as the
            JSON text of what its propagator injected (W3C ``traceparent``
            ...), when it enqueued with tracing on; else ``None``. Each
            execution span continues that trace (see :mod:`jobkeeper.tracing`).
    """

    id: int
    task: str
    args: dict[str, Any] | None
    queue: str
    status: JobStatus
    priority: int
    attempt: int
    max_attempts: int
    scheduled_at: datetime
    created_at: datetime
    attempted_at: datetime | None = None
    finished_at: datetime | None = None
    worker_id: str | None = None
    unique_key: str | None = None
    errors: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    result: Any = None
    cancel_requested: bool = False
    dead_reason: str | None = None
    args_error: str | None = None
    fence: int = 0
    unstarted_returns: int = 0
    #: Jobs with the same serial_key are never held at once (flow control).
    serial_key: str | None = None
    trace_context: str | None = None
    run_alone: bool = False
    crashes: int = 0
    alone_fence: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (timestamps as ISO 8601 UTC strings).

        This is the stable shape printed by the CLI's ``--json`` options.
        """
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, JobStatus):
                value = value.value
            out[field.name] = value
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class RunningJob(Job):
    """The job as :func:`jobkeeper.current_job` returns it inside a task.

    Attributes:
        idempotency_key: the same for every attempt of the job, on every
            worker, and different for every other job, in this and every
            other jobkeeper database: ``jk-<installation>-<id>-<created>``,
            where ``installation`` is a random value drawn once per database
            at migration (32 hex digits), ``id`` the job's id and ``created``
            its ``created_at`` in microseconds since the epoch (so a database
            restored from a backup, which hands out the same ids again, does
            not reuse the keys of jobs created after the backup). At most 80
            characters of ``[a-z0-9-]``: hand it to external APIs that
            deduplicate requests (Stripe's ``Idempotency-Key`` and the like).
    """

    idempotency_key: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One registered worker process (a row of ``jobkeeper_workers``)."""

    id: str
    hostname: str
    pid: int
    queues: list[str]
    started_at: datetime
    heartbeat_at: datetime
    #: Seconds of silence after which this worker's jobs may be rescued (its
    #: own setting); ``None`` for rows written by older versions.
    rescue_after: float | None = None
    #: The jobkeeper version the worker runs, with the schema version its
    #: code expects (``"0.1.0 (schema 17)"``, written at registration; a
    #: build from before the schema was added writes ``"0.1.0"`` alone);
    #: ``None`` for workers from before versions were recorded.
    version: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class NewJob:
    """A validated job ready to insert (internal: built by the API, written by a backend).

    ``args_json`` is the canonical JSON text of the args; ``delay`` is seconds
    from the database's ``now`` and ``run_at`` an absolute UTC time; at most
    one of the two is set.
    """

    task: str
    args_json: str
    queue: str
    priority: int
    max_attempts: int
    delay: float | None = None
    run_at: datetime | None = None
    unique_key: str | None = None
    serial_key: str | None = None
    #: The validated args themselves, so a bulk insert can build its Jobs
    #: without decoding ``args_json`` again.
    args: dict[str, Any] | None = None
    #: The enqueuer's trace context (JSON text of the propagator's carrier),
    #: or None when it traced nothing.
    trace_context: str | None = None


#: ``read(items, start, stop, heads, args_json, args)`` of a :class:`NewJobStream`.
StreamReader = Callable[[list[Any], int, int, list[NewJob], list[str], list[Any]], None]


class NewJobStream(Sequence[NewJob]):
    """The jobs of one ``enqueue_many``, validated as they are read (internal).

    ``read(items, start, stop, heads, args_json, args)`` validates
    ``items[start:stop]`` in order, appending each row to the three lists
    (the stream's columns), or raises the error that names the first item it
    refuses (the rows before it stay appended). Row ``i``'s NewJob is
    ``heads[i]`` when ``args_json[i] is heads[i].args_json``, else
    ``with_args(heads[i], args_json[i], args[i])``: the rows of a task given
    without options share one head, so reading a batch makes no NewJob per
    row. PostgreSQL's COPY path reads the columns (see :meth:`read`) inside
    its transaction while the server reserves the batch's ids, so the
    validation costs no time of its own; its transaction rolls back when an
    item is refused, so nothing is written either way. Any other reader
    validates every job first (``list(stream)``, which makes the NewJobs).
    Rows read once are kept: reading again (the COPY's rows, a retried
    transaction) validates nothing twice.

    Attributes:
        keyed: some item's options name ``unique_key`` or ``serial_key``
            (their paths resolve keys before writing: read it whole first).
        heads, args_json, args: the columns of the rows read so far.
    """

    __slots__ = ("_items", "_read", "_with_args", "args", "args_json", "heads", "keyed")

    def __init__(
        self,
        items: list[Any],
        read: StreamReader,
        with_args: Callable[[NewJob, str, Any], NewJob],
        *,
        keyed: bool,
    ) -> None:
        self._items = items
        self._read = read
        self._with_args = with_args
        self.heads: list[NewJob] = []
        self.args_json: list[str] = []
        self.args: list[Any] = []
        self.keyed = keyed

    def __len__(self) -> int:
        return len(self._items)

    def read(self, stop: int | None = None) -> None:
        """Validate the items not read yet, up to ``stop`` (default: all)."""
        stop = len(self._items) if stop is None else stop
        done = len(self.heads)
        if done < stop:
            self._read(self._items, done, stop, self.heads, self.args_json, self.args)

    def __iter__(self) -> Iterator[NewJob]:
        heads = self.heads
        for position in range(len(self._items)):
            if position == len(heads):
                self.read(position + 1)  # one at a time: each as it is read
            yield self._row(position)

    def _row(self, position: int) -> NewJob:
        head, args_json = self.heads[position], self.args_json[position]
        if args_json is head.args_json:
            return head
        return self._with_args(head, args_json, self.args[position])

    @overload
    def __getitem__(self, index: int) -> NewJob: ...
    @overload
    def __getitem__(self, index: slice) -> list[NewJob]: ...
    def __getitem__(self, index: int | slice) -> NewJob | list[NewJob]:
        if isinstance(index, slice):
            return list(self)[index]
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError(f"NewJobStream index {index} out of range")
        self.read(position + 1)  # validates up to it
        return self._row(position)


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    """What fences a held job: it belongs to ``worker_id`` at ``attempt``,
    by the claim numbered ``fence``. The attempt alone no longer names a
    claim (a claim may end without spending it); it is kept for the error
    entries.
    """

    job_id: int
    worker_id: str
    attempt: int
    fence: int


@dataclasses.dataclass(frozen=True, slots=True)
class Completion:
    """A successful attempt to record (internal)."""

    claim: Claim
    result_json: str | None
    #: The task called ``complete_in`` successfully in this attempt: a write
    #: the fence refuses may be refused because that commit ended the job.
    completed_in: bool = False


class FailureKind(enum.StrEnum):
    """What a failed (or handed back) attempt does to its job (internal).

    The values are the strings the outcome SQL compares (``job_fail_many``),
    so a plain string of the same value is accepted wherever a kind is.
    """

    #: Available again after ``retry_in`` seconds; the attempt is spent.
    RETRYABLE = "retryable"
    #: Moved to the dead letters (out of attempts, or discarded).
    DEAD = "dead"
    #: Stopped on request; kept for ``retention`` seconds.
    CANCELLED = "cancelled"
    #: Handed back by its worker: available again, the attempt not spent.
    RELEASED = "released"
    #: Rescued before it started: available again, the attempt not spent,
    #: ``unstarted_returns`` counted; only while the job is still claimed.
    RETURNED = "returned"
    #: ``Snooze``: scheduled ``retry_in`` seconds from now, the attempt given
    #: back, no ``errors`` entry.
    SNOOZED = "snoozed"


#: The kinds that make a job available again at once without spending its attempt.
HANDED_BACK: frozenset[FailureKind] = frozenset({FailureKind.RELEASED, FailureKind.RETURNED})


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt to record (internal).

    ``outcome`` is a :class:`FailureKind` (or its string value): ``"snoozed"``
    (``Snooze``) schedules the job ``retry_in`` seconds from now, gives the
    attempt back and adds no ``errors`` entry. Whatever the outcome, a job
    with a cancel request ends ``cancelled`` (the database decides, see the
    backends). ``retry_in`` is the delay in seconds for ``RETRYABLE`` and
    ``SNOOZED``. ``error_json``
    is the entry appended to ``errors``; None (releases only) appends none.
    ``suspect`` and ``crash`` are the rescuer's (the crash budget): see the
    fields.
    """

    claim: Claim
    # ``str`` too: a StrEnum's value compares and hashes as the kind, so
    # callers passing the plain strings keep working.
    outcome: FailureKind | str
    error_json: str | None
    retry_in: float = 0.0
    reason: str | None = None
    #: As :attr:`Completion.completed_in`.
    completed_in: bool = False
    #: The rescuer took it from a silent holder while it ran: its next
    #: attempt runs alone (``run_alone``).
    suspect: bool = False
    #: A crash pinned on the job (it ran alone): ``crashes`` grows by one.
    crash: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class RequeueConflict:
    """A dead letter whose ``unique_key`` stands in the way of its requeue
    (internal): held by the pending job ``holder``, or, when ``holder`` is
    None, shared with another dead letter being requeued.
    """

    dead_letter_id: int
    task: str
    unique_key: str
    holder: int | None


def requeue_clashes(
    conflicts: Iterable[RequeueConflict],
) -> list[tuple[RequeueConflict, int | None]]:
    """The dead letters a requeue of them all cannot move (internal), from
    ``conflicts`` in id order: each with the dead letter of the same key and
    a smaller id that would go back instead, or None when a pending job
    (``holder``) has the key. One by one, exactly these would be refused.
    """
    first: dict[tuple[str, str], int] = {}
    clashes: list[tuple[RequeueConflict, int | None]] = []
    for conflict in conflicts:
        key = (conflict.task, conflict.unique_key)
        if conflict.holder is not None:
            clashes.append((conflict, None))
        elif key in first:
            clashes.append((conflict, first[key]))
        first.setdefault(key, conflict.dead_letter_id)
    return clashes


@dataclasses.dataclass(frozen=True, slots=True)
class Staging:
    """What one pass of the stager did and learned (internal).

    ``staged`` is how many due scheduled/retryable jobs it made available.
    ``next_due_in`` is the seconds, by the database clock, until the next job
    of the asked-for queues comes due (0 when due jobs were left over), or
    ``None`` when none is scheduled: the producer's wait until it stages again.
    """

    staged: int
    next_due_in: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class QueueCounts:
    """Jobs per queue and status, as the dashboard and ``/metrics`` show them.

    Attributes:
        counts: ``{queue: {status: count}}``; statuses a queue has none of
            are absent.
        estimated: the statuses not counted at this moment: ``completed``
            and ``cancelled`` once more finished rows exist than the exact
            limit asked for, ``dead`` once more dead letters do (they come
            from a recount at most a minute old, see
            ``JobQueue.queue_counts``). Live statuses are always exact.
        lower_bound: those of ``estimated`` shown without a recount to go by
            (``recount=False``, or the recount failed and the last one
            expired): what the newest rows hold, a lower bound, and a queue
            with only older rows is left out.
    """

    counts: dict[str, dict[str, int]]
    estimated: frozenset[str] = frozenset()
    lower_bound: frozenset[str] = frozenset()
