"""One immediate rerun of a call the server refused before running it
(internal): the worker's own connections are checked before use, yet the
server can close an idle session just as a statement goes out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from jobkeeper.errors import DatabaseUnavailable

logger = logging.getLogger("jobkeeper.worker")

T = TypeVar("T")


def again_if_closed_idle(call: Callable[[], T]) -> T:
    """``call()``, run once more at once when the server closed its session
    for sitting idle as it went out (after the check before use): nothing
    of it ran (see :attr:`~jobkeeper.errors.DatabaseError.retry_asked`).
    """
    try:
        return call()
    except DatabaseUnavailable as exc:
        if not exc.retry_asked:
            raise
        logger.debug("%s; running it again at once", exc)
        return call()


def again_if_lost(call: Callable[[], T]) -> T:
    """``call()``, run once more at once when its session was lost for any
    reason, a cut by the stuck-call watchdog included. Only for calls that
    may run twice (deleting a row by its key): whether the first ran is
    unknown. The worker's deregister met a silent connection at a stop, was
    cut, and left its row for the pruner while new connections answered.
    """
    try:
        return call()
    except DatabaseUnavailable as exc:
        logger.debug("%s; running it again at once on a new connection", exc)
        return call()
