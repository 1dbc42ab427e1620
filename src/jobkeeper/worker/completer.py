"""Writes outcomes (acks) and start marks in batches, fenced on
``(id, worker_id, attempt, fence)``.

Outcomes are buffered and flushed in one statement per kind, at most
``flush_interval`` seconds after the first one arrives or as soon as
``max_batch`` are waiting. A buffered ack is never dropped: on a database
error it is retried with backoff until it is written or the worker stops.
If the worker dies with acks unwritten, those jobs are rescued and run again
(at-least-once). A write that the fence refuses means the claim was lost
(rescued after a heartbeat gap); it is logged, never forced.

Start marks (claimed -> running) ride in the same flushes, written before the
batch's outcomes in one more statement. They wait apart from the outcomes,
keyed by claim: an outcome that arrives first takes its claim's mark out (the
outcome makes the job final anyway), so jobs faster than a flush cost no
extra write, and a flush of outcomes alone sorts nothing out. A start mark lost with its worker
leaves the job claimed: the rescuer then returns it without spending the
attempt, a bounded number of times (see the rescuer).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

from jobkeeper.backends.base import Backend
from jobkeeper.errors import DatabaseError, DataRejected
from jobkeeper.events import EventBus, EventKind, JobEvent
from jobkeeper.models import Claim, Completion, Failure, Job
from jobkeeper.outcomes import outcome_error, outcome_kind, unstorable_result
from jobkeeper.payload import dumps
from jobkeeper.worker.reruns import again_if_closed_idle

logger = logging.getLogger("jobkeeper.worker")

Outcome = Completion | Failure
#: The events the completer emits once a batch is written.
_ACK_EVENTS = frozenset({EventKind.ACKED, EventKind.CLAIM_LOST, EventKind.DEAD_LETTERED})


class Completer:
    """Background writer of outcomes.

    Args:
        backend: a dedicated backend (its own connection).
        delete_completed: ``retention == 0``: delete completed jobs at once.
        flush_interval: longest wait before a flush, in seconds.
        max_batch: most outcomes per flush.
        on_written: called with each flushed batch's outcomes (tests, metrics).
        events: where ACKED, CLAIM_LOST and DEAD_LETTERED are emitted once a
            batch is written.
        on_urgent_written: called (on the writer thread) after a batch
            holding an urgent outcome is written.
        on_written_again: called (on the writer thread) once a backlog left
            by failed writes is written (see :attr:`failing_since`).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        delete_completed: bool,
        flush_interval: float = 0.01,
        max_batch: int = 500,
        on_written: Callable[[list[Outcome], set[int]], None] | None = None,
        events: EventBus | None = None,
        on_urgent_written: Callable[[], None] | None = None,
        on_written_again: Callable[[], None] | None = None,
    ) -> None:
        self._backend = backend
        self._delete = delete_completed
        self._flush_interval = flush_interval
        self._max_batch = max_batch
        self._on_written = on_written
        self._events = events if events is not None else EventBus()
        self._on_urgent_written = on_urgent_written
        self._on_written_again = on_written_again
        #: When (time.monotonic()) the writes began to fail, or None while
        #: nothing that failed to be written is left: set at the first
        #: failed flush, cleared once a flush that took all there was to
        #: write succeeds. A plain attribute, read without the lock once per
        #: claim pass (see :mod:`jobkeeper.worker.claim_hold`).
        self.failing_since: float | None = None
        # An urgent outcome waits in the buffer: no lingering.
        self._urgent = False
        self._urgent_in_flight = False
        # (job id, fence) -> (task, queue) of an unwritten outcome, kept only
        # while someone listens: events name them, and the outcome does not.
        self._jobs: dict[tuple[int, int], tuple[str, str]] = {}
        self._buffer: list[Outcome] = []
        # Unwritten start marks by (job id, fence), in arrival order.
        self._starts: dict[tuple[int, int], Claim] = {}
        # A plain lock under the condition: add() and add_start() run once a
        # job each and take it directly, without Condition's frames.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._stopping = False
        self._warm_asked = False
        self._abandoned = False
        self._in_flight = 0
        self._in_flight_ids: list[int] = []
        self._thread = threading.Thread(target=self._run, name="jobkeeper-completer", daemon=True)
        self._thread.start()

    def add(self, outcome: Outcome, job: Job | None = None, *, urgent: bool = False) -> None:
        """Queue an outcome for writing (thread-safe, never blocks on I/O).
        ``job``: the outcome's job, for its events. ``urgent``: flush without
        lingering (see the module's docstring).
        """
        claim = outcome.claim
        with self._lock:
            if job is not None and self._acks_wanted():
                self._jobs[claim.job_id, claim.fence] = (job.task, job.queue)
            if self._starts:
                self._starts.pop((claim.job_id, claim.fence), None)
            self._buffer.append(outcome)
            # Wake the writer only to start a linger, to end one early or to
            # flush a full batch; waking it on every add costs a context
            # switch per job.
            if urgent and not self._urgent:
                self._urgent = True
                self._cond.notify_all()
            elif len(self._buffer) + len(self._starts) == 1 or len(self._buffer) >= self._max_batch:
                self._cond.notify_all()

    def add_start(self, claim: Claim) -> None:
        """Queue the start mark of ``claim`` (claimed -> running) for writing
        (thread-safe, never blocks on I/O); the claim's outcome, if it comes
        first, takes it out unwritten.
        """
        with self._lock:
            self._starts[claim.job_id, claim.fence] = claim
            if len(self._buffer) + len(self._starts) == 1:
                self._cond.notify_all()

    @property
    def pending(self) -> int:
        """Outcomes not yet written."""
        with self._cond:
            return len(self._buffer) + len(self._starts) + self._in_flight

    @property
    def urgent_pending(self) -> bool:
        """Whether an urgent outcome is unwritten: ``on_urgent_written`` is
        still to come.
        """
        return self._urgent or self._urgent_in_flight

    def pending_ids(self) -> set[int]:
        """Ids of jobs whose outcome or start mark is not yet written."""
        with self._cond:
            return (
                {o.claim.job_id for o in self._buffer}
                | {job_id for job_id, _ in self._starts}
                | set(self._in_flight_ids)
            )

    def warm(self) -> None:
        """Open the writer's connection now, on its thread, rather than in
        its first flush (which it delayed by about 15 ms on a local
        PostgreSQL). Called once the worker runs; a worker that is only
        built opens nothing.
        """
        with self._cond:
            self._warm_asked = True
            self._cond.notify_all()

    def _run(self) -> None:
        retry_pause = 0.05
        failing = False
        while True:
            with self._cond:
                while (
                    not self._buffer
                    and not self._starts
                    and not self._stopping
                    and not self._warm_asked
                ):
                    self._cond.wait()
                warm = self._warm_asked and not (self._buffer or self._starts or self._stopping)
                self._warm_asked = False
                if not warm and not self._buffer and not self._starts and self._stopping:
                    return
            if warm:
                # Any round trip opens the connection. Whatever fails here,
                # the first flush tries again and says why; the writer
                # thread must not die of it.
                with contextlib.suppress(Exception):
                    self._backend.db_now()
                continue
            with self._cond:
                # Linger briefly so concurrent acks share one statement.
                flush_at = time.monotonic() + self._flush_interval
                while (
                    len(self._buffer) < self._max_batch and not self._stopping and not self._urgent
                ):
                    remaining = flush_at - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                # The flag is not tracked per entry: a batch taken while it
                # is up counts as urgent, and what is left keeps it up.
                urgent = self._urgent
                batch = self._take_batch()
                starts, self._starts = list(self._starts.values()), {}
                took_all = not self._buffer
                self._urgent = urgent and bool(self._buffer)
                self._urgent_in_flight = urgent
                self._in_flight = len(batch) + len(starts)
                self._in_flight_ids = [o.claim.job_id for o in batch]
                self._in_flight_ids += [claim.job_id for claim in starts]
            unwritten: list[Outcome] = []
            unmarked: list[Claim] = []
            try:
                unmarked, unwritten = self._write(batch, starts)
            except Exception:  # the writer thread must never die (outcomes would sit forever)
                logger.exception("unexpected error writing %d outcomes; retrying", len(batch))
                unmarked, unwritten = starts, batch
            if not unwritten and not unmarked and urgent and self._on_urgent_written is not None:
                with self._lock:
                    self._urgent_in_flight = False
                self._on_urgent_written()
            written_again = False
            with self._cond:
                self._urgent_in_flight = False
                self._in_flight = 0
                self._in_flight_ids = []
                if not unwritten and not unmarked:
                    self._cond.notify_all()
                    if failing:
                        logger.info("outcomes are being written again")
                    failing, retry_pause = False, 0.05
                    # The backlog is written once a flush that took all
                    # there was succeeds (what came in meanwhile is new).
                    written_again = took_all and self.failing_since is not None
                    if written_again:
                        self.failing_since = None
                else:
                    # Keep them, in order, and try again after a pause: every
                    # error here is one that passes (the database is down,
                    # read-only, out of disk...); errors about the data were
                    # settled in _write.
                    self._buffer[:0] = unwritten
                    self._restore_starts(unmarked)
                    self._urgent = self._urgent or urgent
                    if self._abandoned:
                        return
                    failing = True
                    if self.failing_since is None:
                        self.failing_since = time.monotonic()
                    self._cond.wait(retry_pause)
            if failing:
                retry_pause = min(retry_pause * 2, 5.0)
            elif written_again and self._on_written_again is not None:
                self._on_written_again()

    def _take_batch(self) -> list[Outcome]:
        """Remove and return up to ``max_batch`` outcomes (lock held), at most
        one per job: the backends report what they wrote by job id, and a
        worker may claim a job again before the outcome of its earlier, lost
        claim is flushed (a stale hand-back the fence refuses). A later
        outcome of a job already in the batch waits for the next one.
        """
        batch = self._buffer[: self._max_batch]
        ids = {o.claim.job_id for o in batch}
        if len(ids) == len(batch):
            del self._buffer[: self._max_batch]
            return batch
        batch, rest = [], []
        ids.clear()
        for outcome in self._buffer:
            if len(batch) < self._max_batch and outcome.claim.job_id not in ids:
                ids.add(outcome.claim.job_id)
                batch.append(outcome)
            else:
                rest.append(outcome)
        self._buffer = rest
        return batch

    def _restore_starts(self, unmarked: list[Claim]) -> None:
        """Put start marks that were not written back, ahead of newer ones,
        unless their outcome has arrived since (lock held).
        """
        if not unmarked:
            return
        ended = {(o.claim.job_id, o.claim.fence) for o in self._buffer}
        restored = {
            (claim.job_id, claim.fence): claim
            for claim in unmarked
            if (claim.job_id, claim.fence) not in ended
        }
        restored.update(self._starts)
        self._starts = restored

    def _write(
        self, batch: list[Outcome], starts: list[Claim]
    ) -> tuple[list[Claim], list[Outcome]]:
        """Write start marks, then a batch of outcomes; return the marks and
        the outcomes to try again later (nothing written for them). Each kind
        goes in one statement.
        """
        if starts:
            try:
                # Refused marks (the claim was lost, or its outcome was
                # written first) change nothing and need no report.
                again_if_closed_idle(lambda: self._backend.job_start_many(claims=starts))
            except DatabaseError as exc:
                logger.warning("could not write %d start marks (%s); retrying", len(starts), exc)
                return starts, batch
        completions = [o for o in batch if isinstance(o, Completion)]
        failures = [o for o in batch if isinstance(o, Failure)]
        written: set[int] = set()
        if completions:
            try:
                written |= self._complete(completions, failures)
            except DatabaseError as exc:
                logger.warning("could not write %d outcomes (%s); retrying", len(batch), exc)
                return [], list(batch)
        if failures:
            try:
                written |= self._fail(failures)
            except DatabaseError as exc:
                logger.warning("could not write %d failures (%s); retrying", len(failures), exc)
                self._report(completions, written)
                return [], list(failures)
        outcomes = self._completed_in(batch, written)
        self._report(outcomes, written)
        return [], []

    def _completed_in(self, outcomes: list[Outcome], written: set[int]) -> list[Outcome]:
        """The outcomes as they ended: a refused outcome of an attempt whose
        task called ``complete_in`` was refused because that transaction
        committed (the job is completed at this claim's fence) or because
        the claim was lost after a rollback; the database says which.
        Confirmed ones become the completion they were, added to ``written``.
        """
        doubtful = [o.claim for o in outcomes if o.completed_in and o.claim.job_id not in written]
        if not doubtful:
            return outcomes
        try:
            done = self._backend.job_completed_in(claims=doubtful, delete=self._delete)
        except DatabaseError as exc:
            logger.warning("could not check %d complete_in outcomes (%s)", len(doubtful), exc)
            return outcomes
        ended: list[Outcome] = []
        for outcome in outcomes:
            if outcome.claim.job_id in done and outcome.claim.job_id not in written:
                if isinstance(outcome, Failure):
                    logger.info(
                        "job %s attempt %s: completed by complete_in; what the task did "
                        "after it is not recorded (%s)",
                        outcome.claim.job_id,
                        outcome.claim.attempt,
                        outcome_error(outcome) or outcome.outcome,
                    )
                outcome = Completion(outcome.claim, None, completed_in=True)
                written.add(outcome.claim.job_id)
            ended.append(outcome)
        return ended

    def _report(self, outcomes: list[Completion] | list[Outcome], written: set[int]) -> None:
        for outcome in outcomes:
            if outcome.claim.job_id not in written:
                logger.warning(
                    "job %s attempt %s: claim lost before its outcome was written "
                    "(rescued after a heartbeat gap?); outcome dropped",
                    outcome.claim.job_id,
                    outcome.claim.attempt,
                )
        if self._acks_wanted() or self._jobs:
            self._emit(outcomes, written)
        if self._on_written is not None and outcomes:
            self._on_written(list(outcomes), written)

    def _acks_wanted(self) -> bool:
        return self._events.wants_any(_ACK_EVENTS)

    def _emit(self, outcomes: list[Completion] | list[Outcome], written: set[int]) -> None:
        """ACKED (with the outcome written) or CLAIM_LOST per outcome, and
        DEAD_LETTERED per move to the dead letters written; each built only
        while someone listens to its kind.
        """
        with self._lock:  # once a batch, not once a job
            names = [self._jobs.pop((o.claim.job_id, o.claim.fence), None) for o in outcomes]
        events = self._events
        acked = events.wants(EventKind.ACKED)
        lost = events.wants(EventKind.CLAIM_LOST)
        dead = events.wants(EventKind.DEAD_LETTERED)
        for outcome, named in zip(outcomes, names, strict=True):
            if named is None:
                continue
            claim = outcome.claim
            task, queue = named
            facts = (claim.job_id, task, queue, claim.attempt, claim.worker_id)
            if claim.job_id not in written:
                if lost:
                    events.emit(JobEvent(EventKind.CLAIM_LOST, *facts, at=time.time()))
                continue
            if acked:
                events.emit(
                    JobEvent(
                        EventKind.ACKED,
                        *facts,
                        at=time.time(),
                        outcome=outcome_kind(outcome),
                        error=outcome_error(outcome),
                    )
                )
            if dead and isinstance(outcome, Failure) and outcome.outcome == "dead":
                events.emit(
                    JobEvent(EventKind.DEAD_LETTERED, *facts, at=time.time(), error=outcome.reason)
                )

    def _complete(self, completions: list[Completion], failures: list[Failure]) -> set[int]:
        """Write completions. A result the database refuses (and only that)
        sends its job to the dead letters, as one the encoder refuses does
        (:func:`~jobkeeper.outcomes.unstorable_result`): the failure is
        appended to ``failures``.
        """
        try:
            return again_if_closed_idle(
                lambda: self._backend.job_complete_many(
                    completions=completions, delete=self._delete
                )
            )
        except DataRejected:
            pass  # one bad row must not sink the batch: find it
        written: set[int] = set()
        for completion in completions:
            try:
                written |= self._backend.job_complete_many(
                    completions=[completion], delete=self._delete
                )
            except DataRejected as exc:
                failures.append(unstorable_result(completion.claim, exc))
        return written

    def _fail(self, failures: list[Failure]) -> set[int]:
        try:
            return again_if_closed_idle(lambda: self._backend.job_fail_many(failures=failures))
        except DataRejected as exc:
            logger.error("could not record %d failures (%s); trying one by one", len(failures), exc)
        written: set[int] = set()
        for failure in failures:
            try:
                written |= self._backend.job_fail_many(failures=[failure])
            except DataRejected as exc:
                # Last resort, so the job never stays running under a live
                # worker: a minimal entry and a plain delay the database takes.
                logger.error("job %s: failure not recordable (%s)", failure.claim.job_id, exc)
                minimal = dumps(
                    {
                        "attempt": failure.claim.attempt,
                        "at": None,
                        "error": "failure could not be recorded",
                        "traceback": None,
                    }
                )
                outcome = "retryable" if failure.outcome == "released" else failure.outcome
                # The reason repeats the error's text: in ASCII escapes, as
                # any database encoding holds them (a LATIN1 one refused an
                # emoji in it, and the job was never written).
                reason = failure.reason
                if reason is not None:
                    reason = reason.encode("ascii", "backslashreplace").decode("ascii")
                written |= self._backend.job_fail_many(
                    failures=[
                        Failure(failure.claim, outcome, minimal, retry_in=60.0, reason=reason)
                    ]
                )
        return written

    def stop(self, timeout: float, *, then: str = "those jobs will be rescued and re-run") -> bool:
        """Flush what is buffered (retrying for up to ``timeout`` seconds) and
        stop. Returns True when everything was written; else logs what
        becomes of the jobs whose outcomes were not (``then``).
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive() or self.pending:
            with self._cond:
                self._abandoned = True
                self._cond.notify_all()
            logger.error("%d outcomes still unwritten at shutdown; %s", self.pending, then)
            return False
        return True
