"""The event seam: what happens to jobs in a worker, emitted in one place.

Workers emit a :class:`JobEvent` at each step of a job's life in that worker
(claimed, started, finished, acknowledged, handed back) and rescuers emit
rescues and dead letters; logs, metrics and tracing subscribe with
:meth:`jobkeeper.JobQueue.on_event`. The idea is Oban's ``:telemetry``
events (``oban-bg/oban:lib/oban/telemetry.ex``): one stream of facts that
any number of listeners read, so nothing in the worker knows metrics exist.

Emitting costs one attribute test when nobody listens: emitters check
:attr:`EventBus.listening` before they build an event.

Leaf module: imports only ``models``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from jobkeeper.models import Job

logger = logging.getLogger("jobkeeper.events")


class EventKind(enum.StrEnum):
    """The kinds of :class:`JobEvent`, in the order a job meets them."""

    #: A worker claimed the job (it holds it; it has not started).
    CLAIMED = "claimed"
    #: The task is about to be called (the attempt starts). Emitted on the
    #: thread (sync task) or in the asyncio task (async task) that calls it,
    #: so a listener may make context current for the task's code.
    STARTED = "started"
    #: The attempt ended in the worker; ``outcome`` says how (not yet written).
    #: For an attempt that started, emitted where its STARTED was.
    FINISHED = "finished"
    #: The worker wrote the outcome; ``outcome`` says which.
    ACKED = "acked"
    #: The outcome was refused: the worker no longer held the job (its claim
    #: was rescued while it was silent). Nothing was written.
    CLAIM_LOST = "claim_lost"
    #: A rescuer took the job from a holder that went silent.
    RESCUED = "rescued"
    #: The job moved to the dead letters (``error`` holds the reason).
    DEAD_LETTERED = "dead_lettered"


class OutcomeKind(enum.StrEnum):
    """How an attempt ended (the ``outcome`` of FINISHED and ACKED events,
    and the label of ``jobkeeper_jobs_processed_total``).
    """

    COMPLETED = "completed"
    #: Failed; it will run again after a backoff.
    RETRIED = "retried"
    #: Moved to the dead letters (attempts used up, or discarded).
    DEAD = "dead"
    CANCELLED = "cancelled"
    #: Put back to run later without spending the attempt.
    SNOOZED = "snoozed"
    #: Handed back unstarted (or at shutdown): available again, attempt not spent.
    RELEASED = "released"


@dataclasses.dataclass(frozen=True, slots=True)
class JobEvent:
    """One fact about one job.

    Attributes:
        kind: what happened.
        job_id: the job.
        task: its task name.
        queue: its queue.
        attempt: the attempt this event belongs to.
        worker_id: the worker that emitted it (for RESCUED: the lost holder).
        at: when, as ``time.time()`` seconds on the emitting host.
        outcome: for FINISHED and ACKED, how the attempt ended.
        duration: for FINISHED, seconds the attempt ran.
        error: the error text of a failed attempt, or the dead-letter reason.
        job: the job as the worker holds it (CLAIMED, STARTED, FINISHED), else None.
        exception: for FINISHED, what the task's code raised (``Retry``,
            ``Snooze``, ``Discard`` included), else None.
    """

    kind: EventKind
    job_id: int
    task: str
    queue: str
    attempt: int
    worker_id: str | None
    at: float
    outcome: OutcomeKind | None = None
    duration: float | None = None
    error: str | None = None
    job: Job | None = None
    exception: BaseException | None = None

    @classmethod
    def of(
        cls,
        kind: EventKind,
        job: Job,
        *,
        worker_id: str | None = None,
        outcome: OutcomeKind | None = None,
        duration: float | None = None,
        error: str | None = None,
        keep_job: bool = True,
        exception: BaseException | None = None,
    ) -> JobEvent:
        """An event about ``job`` stamped now."""
        return cls(
            kind=kind,
            job_id=job.id,
            task=job.task,
            queue=job.queue,
            attempt=job.attempt,
            worker_id=worker_id if worker_id is not None else job.worker_id,
            at=time.time(),
            outcome=outcome,
            duration=duration,
            error=error,
            job=job if keep_job else None,
            exception=exception,
        )


class _Entry(NamedTuple):
    listener: Callable[[JobEvent], None]
    kinds: frozenset[EventKind]
    #: Of FINISHED events, the outcomes wanted (empty unless FINISHED is).
    outcomes: frozenset[OutcomeKind]


#: A listener: called with each event, on the thread that emitted it. It
#: must be quick and must not block (it runs on the worker's own threads).
Listener = Callable[[JobEvent], None]


class EventBus:
    """Listeners of one :class:`~jobkeeper.JobQueue`'s events.

    Thread-safe. A listener that raises is logged and skipped; it never
    breaks the worker that emitted the event.
    """

    def __init__(self) -> None:
        self._listeners: tuple[_Entry, ...] = ()
        self._wanted: frozenset[EventKind] = frozenset()
        self._wanted_outcomes: frozenset[OutcomeKind] = frozenset()
        self._lock = threading.Lock()

    @property
    def listening(self) -> bool:
        """Whether anyone listens to anything."""
        return bool(self._listeners)

    def wants(self, kind: EventKind) -> bool:
        """Whether anyone listens to ``kind`` (emitters test this before
        they build an event: one set lookup when nobody does).
        """
        return kind in self._wanted

    def wants_any(self, kinds: frozenset[EventKind]) -> bool:
        """Whether anyone listens to any of ``kinds`` (one set operation)."""
        return not self._wanted.isdisjoint(kinds)

    def wants_finished(self, outcome: OutcomeKind) -> bool:
        """Whether anyone listens to FINISHED events with ``outcome`` (the
        log, with DEBUG off, wants failures but not the completions that are
        most events of a busy worker).
        """
        return outcome in self._wanted_outcomes

    def subscribe(
        self,
        listener: Listener,
        kinds: Iterable[EventKind] | None = None,
        *,
        outcomes: Iterable[OutcomeKind] | None = None,
    ) -> Callable[[], None]:
        """Add ``listener`` for ``kinds`` (default: every kind); returns a
        function that removes it again.

        Args:
            listener: called with each event (see :data:`Listener`).
            kinds: the event kinds it wants; ``None``: every kind.
            outcomes: of FINISHED events, only these outcomes; ``None``:
                every outcome.

        Raises:
            TypeError: ``listener`` is not callable.
            ValueError: an unknown kind or outcome.
        """
        if not callable(listener):
            raise TypeError(f"an event listener must be callable, got {listener!r}")
        wanted = frozenset(EventKind) if kinds is None else frozenset(EventKind(k) for k in kinds)
        finished: frozenset[OutcomeKind] = frozenset()
        if EventKind.FINISHED in wanted:
            finished = (
                frozenset(OutcomeKind)
                if outcomes is None
                else frozenset(OutcomeKind(o) for o in outcomes)
            )
        entry = _Entry(listener, wanted, finished)
        with self._lock:
            self._listeners = (*self._listeners, entry)
            self._recount()

        def unsubscribe() -> None:
            with self._lock:
                self._listeners = tuple(x for x in self._listeners if x is not entry)
                self._recount()

        return unsubscribe

    def _recount(self) -> None:
        """What anyone wants (lock held)."""
        self._wanted = frozenset().union(*(e.kinds for e in self._listeners))
        self._wanted_outcomes = frozenset().union(*(e.outcomes for e in self._listeners))

    def emit(self, event: JobEvent) -> None:
        """Call every listener of the event's kind (and, for FINISHED, of
        its outcome) with ``event``.
        """
        for listener, kinds, outcomes in self._listeners:  # a tuple: safe to (un)subscribe
            if event.kind not in kinds:
                continue
            if (
                event.kind is EventKind.FINISHED
                and event.outcome is not None
                and event.outcome not in outcomes
            ):
                continue
            try:
                listener(event)
            except Exception:
                # The log listener itself may be what failed (a task closed
                # sys.stderr): its report must not raise into the worker.
                with contextlib.suppress(Exception):
                    logger.exception("event listener %r failed on %s", listener, event.kind.value)
