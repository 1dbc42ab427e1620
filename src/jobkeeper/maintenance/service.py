"""The lifecycle every background service shares (after River's startstop).

``start()`` runs ``run_once()`` on a daemon thread every ``interval`` seconds;
``stop()`` is synchronous and idempotent; tests call ``run_once()`` directly.
A database error never kills the loop: it is logged (once per run of
failures, as a warning without traceback) and the next pass comes sooner,
with backoff; the first pass that succeeds after says "database reachable
again" when the failures were an outage, "calls succeed again" otherwise.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from jobkeeper.errors import DatabaseError, DatabaseUnavailable

logger = logging.getLogger("jobkeeper.maintenance")


class IntervalService:
    """Base class: subclasses implement :meth:`run_once`.

    Args:
        name: thread name and log prefix.
        interval: seconds between passes.
        only_when: asked before each pass; a pass is skipped while it says
            False (a service that must run once per fleet passes the
            leader's ``is_leader``).
    """

    def __init__(
        self, name: str, interval: float, only_when: Callable[[], bool] | None = None
    ) -> None:
        self.name = name
        self.interval = interval
        self._only_when = only_when
        #: Passes of the loop completed (see :meth:`wait_passes`).
        self.loop_passes = 0
        self._passed = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        #: Whether the failures since the last good pass include an outage.
        self._unreachable = False

    def run_once(self) -> None:
        """One pass of the service's work."""
        raise NotImplementedError

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        retry = min(self.interval, 0.1)
        rerun = False  # whether this pass is a closed idle session's rerun
        while not self._stop.is_set():
            started = time.monotonic()
            ran = False
            try:
                if self._only_when is None or self._only_when():
                    self.run_once()
                    ran = True
            except DatabaseError as exc:
                if isinstance(exc, DatabaseUnavailable) and exc.retry_asked and not rerun:
                    # The server closed the session for sitting idle as the
                    # statement went out, after the check before use: nothing
                    # of it ran, and a new session runs it at once.
                    logger.debug("%s: %s; running it again at once", self.name, exc)
                    rerun = True
                    continue
                unreachable = isinstance(exc, DatabaseUnavailable) and exc.unreachable
                if not self._failing or (unreachable and not self._unreachable):
                    # Once per run of failures, and again if it turns into
                    # an outage. A serialization failure or deadlock is a
                    # lost race: a warning, as any passing error, with no
                    # traceback.
                    logger.warning("%s: %s; retrying", self.name, exc)
                self._failing = True
                self._unreachable = self._unreachable or unreachable
                self._stop.wait(retry)
                retry = min(retry * 2, self.interval)
                continue
            except Exception:
                logger.exception("%s: unexpected error; retrying", self.name)
                self._stop.wait(self.interval)
                continue
            # Only a pass that ran says the database answered: a skipped one
            # (not the leader) said nothing while the server was still down.
            if ran and self._failing:
                # "Reachable" only after an outage: not after a statement
                # timeout, a full disk or a serialization failure, whose
                # server answered all along.
                if self._unreachable:
                    logger.info("%s: database reachable again", self.name)
                else:
                    logger.info("%s: calls succeed again", self.name)
                self._failing = self._unreachable = False
            with self._passed:
                self.loop_passes += 1
                self._passed.notify_all()
            retry, rerun = min(self.interval, 0.1), False
            # Fixed rate: a slow pass (e.g. a heartbeat starved of the GIL by
            # CPU-bound tasks) must not stretch the period to interval + pass
            # time (pgqueuer#430: beats slower than the rescue window).
            self._stop.wait(max(self.interval - (time.monotonic() - started), 0.0))

    def wait_passes(self, count: int, timeout: float) -> bool:
        """Block until :attr:`loop_passes` reaches ``count`` or ``timeout`` seconds
        pass; returns whether it did. For tests: wait on the service's own
        signal instead of sleeping (River's ``testsignal``).
        """
        with self._passed:
            return self._passed.wait_for(lambda: self.loop_passes >= count, timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop and wait up to ``timeout`` seconds for the thread. Idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
