"""The one owner of this worker's claims: is the holder fresh, has each hold
been confirmed since its claim, may a claimed job start, and the start mark.

A claim is safe to act on while no rescuer can have taken it: while our
heartbeat is fresh (younger than half of ``rescue_after``) and has been
without a break since the claim. A stale spell (a paused process, a database
outage, even one the heartbeat has recovered from) may have let a rescuer
take it; a job claimed before such a spell starts only once the database has
confirmed, as of a fresh heartbeat, that we still hold it.

Each claim is stamped with the heartbeat's count of stale spells at the time
of the claim. The heartbeat hands out its age and that count together
(:meth:`~jobkeeper.maintenance.heartbeat.Heartbeat.liveness`) and the stamps
live under this object's lock, so no check depends on the order in which
threads read shared attributes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from jobkeeper.backends.base import Backend
from jobkeeper.errors import DatabaseError
from jobkeeper.events import EventBus, EventKind, JobEvent
from jobkeeper.maintenance.heartbeat import Heartbeat
from jobkeeper.models import Job
from jobkeeper.outcomes import claim_of
from jobkeeper.worker.completer import Completer

logger = logging.getLogger("jobkeeper.worker")


class Claims:
    """Claims held by one worker and the checks before each start.

    Args:
        backend: for confirming a hold and for urgent start marks, called
            from any runner thread one at a time (a dedicated backend: never
            the API pool, which tasks may hold whole).
        worker_id: this worker's id.
        heartbeat: this worker's heartbeat.
        completer: where start marks are batched.
        fresh_for: seconds; a heartbeat younger than this means no rescuer
            can have taken our claims (half of ``rescue_after``).
        stopping: set when the worker stops (a waiting start gives up).
        events: where STARTED is emitted.
    """

    def __init__(
        self,
        *,
        backend: Backend,
        worker_id: str,
        heartbeat: Heartbeat,
        completer: Completer,
        fresh_for: float,
        stopping: threading.Event,
        events: EventBus,
    ) -> None:
        self._backend = backend
        self._worker_id = worker_id
        self._heartbeat = heartbeat
        self._completer = completer
        self._fresh_for = fresh_for
        self._stopping = stopping
        self._events = events
        self._lock = threading.Lock()
        # Runner threads take turns on the backend's one connection.
        self._db_lock = threading.Lock()
        # (job id, fence) -> the heartbeat's stale-spell count when it was
        # claimed (or its hold last confirmed). By claim, not by job: a job
        # handed back while we were silent and claimed by us again must not
        # lend its new claim's stamp to the old one still in our buffer.
        self._stamps: dict[tuple[int, int], int] = {}
        # Attempts whose start mark may_start wrote: (job id, fence).
        self._marked: set[tuple[int, int]] = set()

    def fresh(self) -> bool:
        """Whether our heartbeat is fresh: claims made now cannot be rescued
        before the next beat is due.
        """
        age, _ = self._heartbeat.liveness()
        return age <= self._fresh_for

    def beat_age(self) -> float:
        """Seconds since our last acknowledged heartbeat."""
        age, _ = self._heartbeat.liveness()
        return age

    def stamp(self) -> int:
        """The mark to give jobs claimed from now on (take it before the
        claim's query, so that a spell during the query counts against them).
        """
        _, spells = self._heartbeat.liveness()
        return spells

    def claimed(self, jobs: Iterable[Job], stamp: int) -> None:
        """Record ``jobs`` as claimed under ``stamp`` (see :meth:`stamp`)."""
        with self._lock:
            for job in jobs:
                self._stamps[job.id, job.fence] = stamp

    def forget(self, job: Job) -> None:
        """The claim's attempt has an outcome: it is no longer ours to check."""
        # One dict operation needs no lock (the GIL makes it atomic); the
        # lock orders writes that read and write together.
        claim = (job.id, job.fence)
        self._stamps.pop(claim, None)
        if self._marked:  # a marked attempt settled before its call
            with self._lock:
                self._marked.discard(claim)

    def still_held(self, job: Job) -> bool:
        """Whether our heartbeat is fresh and has been since the job was
        claimed (or its hold last confirmed): then no rescuer can have taken
        it. Never blocks; the executor asks again just before calling the task.
        """
        age, spells = self._heartbeat.liveness()
        return age <= self._fresh_for and spells == self._stamps.get((job.id, job.fence))

    def held_since(self, job: Job, spells: int) -> bool:
        """Whether ``job``'s claim was made (or its hold confirmed) when the
        heartbeat had counted ``spells`` stale spells or more.
        """
        stamp = self._stamps.get((job.id, job.fence))
        return stamp is not None and stamp >= spells

    def may_start(self, job: Job) -> bool:
        """Whether a claimed job may start (the executor asks, from a runner
        thread; this may block).

        Yes at once when :meth:`still_held`. Otherwise wait for a fresh
        heartbeat, then ask the database whether we still hold the job: the
        claim may have been rescued and the job be running elsewhere, or be
        done. False: the claim is lost, or the worker is stopping.

        A ``run_alone`` job, and one whose earlier claim was lost before its
        start was recorded (``unstarted_returns``), starts only once its
        start mark is written (see :meth:`_mark_first`): a crash of its
        attempt must spend it.
        """
        if _marked_first(job):
            return self._mark_first(job)
        if self.still_held(job):
            return True
        while not self._stopping.is_set():
            try:
                confirmed = self._held_now()
            except DatabaseError:
                self._stopping.wait(0.1)
                continue
            if confirmed is None:
                self._stopping.wait(0.05)
                continue
            held, spells = confirmed
            if any(h.id == job.id and h.fence == job.fence for h in held):
                # Confirmed as of a fresh heartbeat: the last check before
                # the call (still_held) now counts from here.
                with self._lock:
                    self._stamps[job.id, job.fence] = spells
                return True
            return False
        return False

    def _mark_first(self, job: Job) -> bool:
        """Write the start mark before the task may be called, waiting out a
        database outage; False: the claim is lost (the fenced write matched
        nothing), or the worker is stopping.

        A lone job's mark (``job_start_alone``) pins a crash of the attempt
        on it: unwritten, the crash would be only a lost attempt, and a
        poison job could take down more workers than ``max_crashes`` allows.
        A job already returned unstarted gets its mark (``job_start_many``)
        first so that a crash as it starts spends the attempt (see the
        rescuer). Either write is also the proof that we still hold the
        claim, and it comes before the executor's last check (a write that
        takes long leaves the heartbeat stale, and that check then hands the
        job back): written after that check, a mark held up past
        ``rescue_after`` (a partition) matched nothing and the task was
        called anyway, beside the claim's next holder.
        """
        while not self._stopping.is_set():
            try:
                with self._db_lock:
                    age, spells = self._heartbeat.liveness()
                    written = self._write_mark(job) if age <= self._fresh_for else None
            except DatabaseError as exc:
                logger.warning("job %s: start mark not written yet (%s)", job.id, exc)
                self._stopping.wait(0.1)
                continue
            if written is None:
                self._stopping.wait(0.05)
                continue
            if not written:
                return False
            with self._lock:
                self._stamps[job.id, job.fence] = spells
                self._marked.add((job.id, job.fence))
            return True
        return False

    def _write_mark(self, job: Job) -> bool:
        claim = claim_of(job)
        if job.run_alone:
            return self._backend.job_start_alone(claim=claim)
        return job.id in self._backend.job_start_many(claims=[claim])

    def _held_now(self) -> tuple[list[Job], int] | None:
        """The jobs the database says we hold, and the heartbeat's stale-spell
        count as of that read; None while our heartbeat is not fresh.

        Liveness is read once this thread has its turn on the connection:
        time spent waiting for the turn must not pass for fresh.

        Raises:
            DatabaseError: the read failed.
        """
        with self._db_lock:
            age, spells = self._heartbeat.liveness()
            if age > self._fresh_for:
                return None
            return self._backend.job_confirm_holds(worker_id=self._worker_id), spells

    def started(self, job: Job) -> None:
        """The task of a claimed job is being called: record its start mark
        (claimed -> running), batched with the outcomes, and emit STARTED.

        The mark of a ``run_alone`` job, or of one whose earlier claim was
        lost before its start was recorded (it may kill its worker as it
        starts), was written by :meth:`may_start`, one round trip before the
        call, only for those jobs.
        """
        if self._events.wants(EventKind.STARTED):
            self._events.emit(JobEvent.of(EventKind.STARTED, job))
        if _marked_first(job):
            claim = (job.id, job.fence)
            with self._lock:
                if claim in self._marked:
                    self._marked.discard(claim)
                    return
        self._completer.add_start(claim_of(job))


def _marked_first(job: Job) -> bool:
    """Whether ``job``'s start mark is written by ``may_start``, before the
    call, rather than batched: a lone job, or one already returned unstarted.
    """
    return job.run_alone or job.unstarted_returns > 0
