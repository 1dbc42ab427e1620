"""What the producer logs when a step of its pass fails (internal).

A step is what the pass was doing: ``"claim"``, ``"staging due jobs"``,
``"reconciling held jobs"``, ``"reading queue settings"``, ``"handing back
ready jobs"``. The words follow what is known of the error: an outage is
"database unavailable"; a server that answered (a statement timeout, a full
disk) names the step; a lost race (a serialization failure or deadlock, as
under ``default_transaction_isolation = 'serializable'``) is a warning with
no traceback, since nothing was written and the step runs again.
"""

from __future__ import annotations

import logging

from jobkeeper.errors import DatabaseError, DatabaseUnavailable

logger = logging.getLogger("jobkeeper.worker")


def log_unavailable(step: str, exc: DatabaseUnavailable, pause: float) -> None:
    """Log ``exc`` from ``step``, retried after ``pause`` seconds."""
    what = "database unavailable" if exc.unreachable else f"{step} failed"
    logger.warning("%s (%s); retrying in %.2fs", what, exc, pause)


def log_failed(step: str, exc: DatabaseError) -> None:
    """Log ``exc`` (no :class:`DatabaseUnavailable`) from ``step``, retried
    after the poll interval: called from an ``except`` block, whose
    traceback goes with an unexpected error.
    """
    if exc.retry_asked:
        logger.warning("%s lost a race with another transaction (%s); retrying", step, exc)
    else:
        logger.exception("%s failed; retrying", step)
