"""The soak's last probe: an ``enqueue`` against a stopped PostgreSQL must
fail with ``DatabaseUnavailable`` and write nothing.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.soak.config import SoakConfig
from benchmarks.soak.pg import PrivatePostgres
from jobkeeper import DatabaseUnavailable, JobQueue


def probe_down(
    pg: PrivatePostgres, config: SoakConfig, settings: dict[str, float]
) -> dict[str, Any]:
    """Stop PostgreSQL, enqueue, expect DatabaseUnavailable; start it again."""
    from jobkeeper.backends.postgres import sources as pg_sources

    token = 10**12
    saved = pg_sources.POOL_TIMEOUT
    if config.probe_pool_timeout is not None:
        pg_sources.POOL_TIMEOUT = config.probe_pool_timeout
    pg.stop("fast")
    probe_jq = JobQueue(pg.url, **settings)
    started = time.monotonic()
    try:
        probe_jq.enqueue("soak.work", {"n": token, "ms": 1})
        outcome: dict[str, Any] = {"ok": False, "detail": "enqueue returned with the database down"}
    except DatabaseUnavailable as exc:
        outcome = {"ok": True, "message": str(exc)}
    except Exception as exc:
        outcome = {"ok": False, "detail": f"raised {type(exc).__name__}: {exc}"}
    finally:
        pg_sources.POOL_TIMEOUT = saved
        probe_jq.close()
    outcome["seconds"] = time.monotonic() - started
    outcome["token"] = token
    pg.start()
    return outcome
