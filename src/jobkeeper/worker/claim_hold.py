"""When the producer must not claim now (internal): the one rule behind both
reasons a worker stops claiming while it keeps running what it holds.

- **Heartbeat stale.** Our heartbeat has not been acknowledged for half of
  ``rescue_after``: anything claimed now could be rescued from under us.
- **Writes stalled.** The completer has failed to write outcomes or start
  marks for ``WRITES_STALLED_AFTER`` seconds (a database that still answers
  reads and small updates, but whose inserts and page-extending writes fail:
  a full disk). Jobs claimed now would run with nowhere to record how they
  ended: piled up in memory, run again when this worker dies, and an attempt
  that ran and failed returned as "had not started". Claims resume once the
  backlog is written.

Running jobs keep running and heartbeats go on either way; nothing is
dropped. Each pause is logged once (warning) with its reason, and its end
once (info).

The check runs once per claim pass: a read of the heartbeat's liveness (as
before) and of one attribute of the completer, ``failing_since``, which is
None while writes succeed; no lock, no I/O.

Also here: :func:`stop_rescued`, what a worker does with attempts whose
claim was rescued while it was silent.
"""

from __future__ import annotations

import contextlib
import logging
import time

from jobkeeper.models import Job
from jobkeeper.worker.claims import Claims
from jobkeeper.worker.completer import Completer
from jobkeeper.worker.executor import Executor

logger = logging.getLogger("jobkeeper.worker")

#: Seconds the completer's writes may keep failing before claims pause: its
#: retries (0.05 s, doubling) get four tries at a passing error (a dropped
#: connection, a lock timeout) before that, so a blip does not pause claims.
WRITES_STALLED_AFTER = 1.0


class ClaimHold:
    """Whether the producer may claim now, with the pause and its end logged
    once each.

    Args:
        claims: the heartbeat's freshness.
        completer: its ``failing_since`` (monotonic seconds, or None).
        stalled_after: seconds of failing writes that pause claims (None:
            ``WRITES_STALLED_AFTER``).
    """

    def __init__(
        self, claims: Claims, completer: Completer, stalled_after: float | None = None
    ) -> None:
        self._claims = claims
        self._completer = completer
        self._stalled_after = WRITES_STALLED_AFTER if stalled_after is None else stalled_after
        #: Why claims are paused now ("heartbeat", "writes"), or None.
        self.reason: str | None = None

    @property
    def paused(self) -> bool:
        """Whether the last :meth:`holding` paused claims."""
        return self.reason is not None

    def holding(self) -> bool:
        """Whether not to claim now (called once per claim pass)."""
        if not self._claims.fresh():
            self._pause(
                "heartbeat",
                "no heartbeat acknowledged for %.1fs; not claiming until one is",
                self._claims.beat_age(),
            )
            return True
        since = self._completer.failing_since
        if since is not None:
            failing_for = time.monotonic() - since
            if failing_for >= self._stalled_after:
                self._pause(
                    "writes",
                    "%d outcomes or start marks could not be written for %.1fs; not claiming "
                    "until they are (running jobs go on)",
                    self._completer.pending,
                    failing_for,
                )
                return True
        if self.reason is not None:
            was, self.reason = self.reason, None
            with contextlib.suppress(Exception):  # see joblog._never_raises
                if was == "writes":
                    logger.info("outcomes written again; claiming again")
                else:
                    logger.info("heartbeat acknowledged again; claiming again")
        return False

    def _pause(self, reason: str, message: str, *args: object) -> None:
        if self.reason != reason:
            self.reason = reason
            with contextlib.suppress(Exception):  # see joblog._never_raises
                logger.warning(message, *args)


def stop_rescued(executor: Executor, claims: Claims, held: list[Job], spells: int) -> None:
    """After a stale spell (the heartbeat's thread, holds read as of a
    fresh beat): attempts whose claim is no longer ours were rescued
    while we were silent and may be running elsewhere; ask them to stop
    rather than run beside their retry. Their writes are fenced off
    anyway; this ends the overlap as soon as we can know of it.

    Only attempts claimed before the spell ended (``spells``, the count
    as of the beat that ended it) are judged: one claimed or confirmed
    since cannot have been rescued during it, and the read may predate
    its claim's commit (break-test 15 saw four such attempts stopped a
    few milliseconds in, and run again).
    """
    holds = {(job.id, job.fence) for job in held}
    for job in executor.running_jobs():
        if claims.held_since(job, spells):
            continue
        if (job.id, job.fence) not in holds and executor.claim_lost(
            job.id, job.fence, "claim lost while this worker was silent: stopped"
        ):
            logger.warning(
                "job %s (%s): its claim was rescued while this worker was silent; "
                "asked its code to stop (its outcome will not be written)",
                job.id,
                job.task,
            )
