"""The worker's start-up: its registration, waiting out an outage, and the
check of the schema version against its code's.
"""

from __future__ import annotations

import logging
import threading
import time

from jobkeeper.backends.base import Backend
from jobkeeper.backends.migrate import (
    MisplacedSchemaError,
    MissingSchemaError,
    UnrecordedSchemaError,
)
from jobkeeper.errors import DatabaseError, DatabaseRefused, DatabaseUnavailable
from jobkeeper.models import WorkerInfo
from jobkeeper.version import __version__

logger = logging.getLogger("jobkeeper.worker")

#: Longest wait, in seconds, between attempts to reach the database at start.
STARTUP_RETRY_MAX = 10.0

#: (database, schema version) pairs this process warned of as ahead of its code.
_WARNED_AHEAD: set[tuple[str, int]] = set()


def check_schema(backend: Backend, *, where: str, worker_id: str) -> None:
    """Refuse a schema older than this code's; warn of a newer one.

    A worker of an older release beside a newer schema is how a rolling
    deploy runs (each schema version's changelog entry says what such a
    worker does), but only ``doctor`` said so: the warning names the worker
    to upgrade, once per process and database (``testing.drain`` starts a
    worker a round). Version 0 is left to the registration, which fails with
    its own "run `jobkeeper migrate`" when the tables are missing. A role
    that may not read ``jobkeeper_schema`` ran before this check existed,
    and still does, unchecked.

    Args:
        backend: the worker's backend, on the database ``where`` names.
        where: the database's URL, redacted, for the messages.
        worker_id: the worker's id, for the warning.

    Raises:
        DatabaseError: the schema is behind this code's version, or the search
            path finds jobkeeper's tables only beyond its first schema
            (MisplacedSchemaError), or names no schema that exists
            (MissingSchemaError).
        DatabaseUnavailable: the database cannot be reached.
    """
    try:
        have = backend.schema_version()
    except (DatabaseUnavailable, MisplacedSchemaError, MissingSchemaError):
        raise
    except UnrecordedSchemaError as exc:
        logger.warning("%s -- this worker runs, unchecked", exc)
        return
    except DatabaseError as exc:
        logger.warning("could not read the schema version (%s); not checked", exc)
        return
    want = backend.schema_expected()
    if 0 < have < want:
        raise DatabaseError(
            f"the schema of {where} is at version {have}, behind this jobkeeper's {want} "
            f"-- {backend.url.migrate_hint()} first"
        )
    _warn_if_ahead(have, want, where=where, worker_id=worker_id)


def register_when_reachable(
    backend: Backend,
    info: WorkerInfo,
    *,
    where: str,
    burst: bool,
    stopping: threading.Event,
) -> bool:
    """Check the schema and register the worker ``info``, waiting out an
    unreachable database (not in ``burst`` mode) but not a refusal no wait
    fixes. Returns False if ``stopping`` was set before it could.

    Raises:
        DatabaseRefused: a refusal waiting does not fix.
        DatabaseUnavailable: in ``burst`` mode, the database is unreachable.
        DatabaseError: see :func:`check_schema`.
    """
    delay = 0.5
    while True:
        try:
            check_schema(backend, where=where, worker_id=info.id)
            backend.worker_register(worker=info)
        except DatabaseUnavailable as exc:
            if burst or isinstance(exc, DatabaseRefused):
                raise
            logger.warning("database unavailable at start (%s); retrying in %.1fs", exc, delay)
            if stopping.wait(delay):
                return False
            delay = min(delay * 2, STARTUP_RETRY_MAX)
            continue
        return True


def _warn_if_ahead(have: int, want: int, *, where: str, worker_id: str) -> None:
    if have > want and (where, have) not in _WARNED_AHEAD:
        _WARNED_AHEAD.add((where, have))
        logger.warning(
            "worker %s runs jobkeeper %s, whose schema version is %d, on %s at version %d: "
            "upgrade it (until then it works as the changelog says of each later version)",
            worker_id,
            __version__,
            want,
            where,
            have,
        )


def require_migrated(backend: Backend, *, where: str) -> None:
    """Refuse a schema that is missing or behind this code's, for the
    processes that read the database without registering a worker (the
    dashboard, ``verify``): each wrote the same two checks in its own words.

    Args:
        backend: a backend on the database ``where`` names.
        where: the database's URL, redacted, for the messages.

    Raises:
        DatabaseError: not migrated, behind this code's version, or a lost
            schema record.
        DatabaseUnavailable: the database cannot be reached.
    """
    have, want = backend.schema_version(), backend.schema_expected()
    if have == 0:
        raise DatabaseError(f"{where} is not migrated: {backend.url.migrate_hint()}")
    if have < want:
        raise DatabaseError(
            f"{where} is at schema version {have}, behind this jobkeeper's {want}: "
            f"{backend.url.migrate_hint()}"
        )


#: Seconds the watch's read of the schema version waits for a lock on
#: ``jobkeeper_schema`` before it gives up until its next read.
LOCK_WAIT = 1.0


class SchemaWatch:
    """Reads the schema version again every ``every`` seconds of a running
    worker, for the warning :func:`check_schema` gives at start: a worker
    left running through a rolling deploy's ``migrate`` said nothing, so
    only ``doctor`` (or the dashboard's worker versions) found it.

    Called by the rescuer thread after each pass, on its connection, never
    by the heartbeat's: a restore's TRUNCATE of ``jobkeeper_schema`` held the
    read, so the beats stopped, and a live worker's job was rescued and ran
    twice (break-test 72). The read gives up after ``LOCK_WAIT`` seconds on
    such a lock, so a rescue pass is held no longer. It never raises: an
    unreadable version was said at start, and an outage is the rescuer's to
    report.

    Args:
        where: the database's URL, redacted, for the warning.
        worker_id: the worker's id, for the warning.
        every: seconds between reads.
    """

    def __init__(self, *, where: str, worker_id: str, every: float = 60.0) -> None:
        self.where = where
        self.worker_id = worker_id
        self.every = every
        self._read_at = time.monotonic()

    def __call__(self, backend: Backend) -> None:
        now = time.monotonic()
        if now - self._read_at < self.every:
            return
        self._read_at = now
        try:
            have = backend.schema_version(lock_wait=LOCK_WAIT)
        except DatabaseError as exc:
            logger.debug("schema version not read again: %s", exc)
            return
        _warn_if_ahead(have, backend.schema_expected(), where=self.where, worker_id=self.worker_id)
