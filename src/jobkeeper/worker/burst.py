"""How a burst worker (``jobkeeper worker --burst``) gives up on a database
that does not come back or on claims that keep failing (internal): a
script must not wait forever on what no retry mends.
"""

from __future__ import annotations

import logging
import time

from jobkeeper.errors import DatabaseUnavailable

logger = logging.getLogger("jobkeeper.worker")

#: Claims in a row that a burst worker lets fail with an error that is not
#: an outage (a damaged SQLite file, a schema it cannot use) before it stops
#: with that error: a script must not wait forever on what no retry mends. A
#: worker that is not burst goes on retrying, logging each failure.
BURST_CLAIM_FAILURES = 3
#: Longest a burst worker waits out an outage that began after it started
#: (seconds); then it stops with the error, as it does when the database is
#: unreachable at its start. A script must not wait forever on a database
#: that was dropped; the jobs it held are rescued once the database is back.
BURST_OUTAGE_WAIT = 60.0


def stop_after_outage(since: float, error: DatabaseUnavailable | None) -> None:
    """A burst worker in an outage since ``since`` (monotonic seconds)
    stops once it has lasted ``BURST_OUTAGE_WAIT``: with ``error``, the
    claim's, or, when no claim was made (its heartbeat stale), one that
    says so.

    Raises:
        DatabaseUnavailable: the outage has lasted ``BURST_OUTAGE_WAIT``.
    """
    waited = time.monotonic() - since
    if waited < BURST_OUTAGE_WAIT:
        return
    logger.error("burst: the database has been unavailable for %.0fs; stopping", waited)
    if error is not None:
        raise error
    raise DatabaseUnavailable(
        f"the database has acknowledged no heartbeat for {waited:.0f}s "
        f"(a burst worker waits at most {BURST_OUTAGE_WAIT:g}s for it)"
    )
