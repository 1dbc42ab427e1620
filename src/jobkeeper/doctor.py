"""``jobkeeper doctor``: checks of a database a queue runs on, each one line
with what to do about it.

Reads through the API only (:meth:`JobQueue.health`, :meth:`JobQueue.workers`
and the queue's settings); the backends gather the facts, this module judges
them. A ``fail`` means jobs will not run (or not safely) until it is fixed;
a ``warn`` means something degrades or will soon.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from jobkeeper.api import JobQueue
from jobkeeper.config import MIN_RESCUE_BEATS, RECOMMENDED_RESCUE_BEATS, holder_window
from jobkeeper.errors import (
    ConfigError,
    DatabaseRefused,
    DatabaseUnavailable,
    JobkeeperError,
    query_excerpt,
)
from jobkeeper.version import split_worker_version

Level = Literal["ok", "warn", "fail"]

#: Seconds a transaction may hold back the xmin horizon before a warn
#: (DESIGN: over 60 s is at least a warn), and before a fail.
XMIN_WARN_AFTER = 60.0
XMIN_FAIL_AFTER = 3600.0
#: Dead tuples over live + dead above which the jobs table is bloating.
DEAD_TUPLE_WARN = 0.2
#: Tables smaller than this are not judged on their dead-tuple ratio or plan.
SMALL_TABLE_ROWS = 10_000
#: NOTIFY queue fractions that warn / fail (PostgreSQL stops NOTIFY when full).
NOTIFY_WARN, NOTIFY_FAIL = 0.5, 0.9
#: A WAL file this large means checkpoints cannot keep up (a long reader).
WAL_WARN_BYTES = 256 << 20
#: Said after a check of settings made without the app's JobQueue.
DEFAULTS_JUDGED = (
    " (jobkeeper's defaults: pass --app package.module:jq to check your app's settings)"
)


@dataclasses.dataclass(frozen=True)
class Check:
    """One check's verdict: ``name``, ``level`` and a one-line ``message``
    that says what to do when it is not ``ok``.
    """

    name: str
    level: Level
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"check": self.name, "level": self.level, "message": self.message}


def run_checks(
    jq: JobQueue, *, xmin_warn_after: float = XMIN_WARN_AFTER, app_settings: bool = True
) -> list[Check]:
    """Every check that applies to ``jq``'s database, in a fixed order.

    Never raises for the database's state: an unreachable database is a
    ``fail`` of the first check (and the others are skipped).

    Args:
        jq: the queue whose database and settings are checked.
        xmin_warn_after: seconds an open transaction may hold back vacuum
            before it is a warning.
        app_settings: ``jq`` is the application's own queue (False: one
            made with jobkeeper's defaults, which the checks of settings
            say, since the workers may run with others).
    """
    try:
        facts = jq.health()
    except DatabaseRefused as exc:  # reached, and refused: said as a worker's start says it
        return [Check("database", "fail", f"cannot use {jq.url.redacted()}: {exc}")]
    except DatabaseUnavailable as exc:
        return [Check("database", "fail", f"cannot reach {jq.url.redacted()}: {exc}")]
    except JobkeeperError as exc:  # reached, but not usable as it is (a file that is no database)
        return [Check("database", "fail", f"cannot use {jq.url.redacted()}: {exc}")]
    if "missing" in facts:
        directory = facts["missing"]["directory"]
        also = f"; its directory {directory} does not exist" if directory else ""
        also += _removed_holders_said(facts)
        return [
            Check(
                "database",
                "fail",
                f"{facts['backend']} at {jq.url.redacted()}: the file does not exist "
                f"({jq.url.migrate_hint()} to create it){also}",
            )
        ]
    checks = [Check("database", "ok", f"{facts['backend']} at {jq.url.redacted()} answers")]
    # Without the app, only the defaults can be judged: say so, or a
    # worker's own rescue_after of 2 s would pass as checked.
    whose = "" if app_settings else DEFAULTS_JUDGED
    checks.append(_schema(facts, jq.url.migrate_hint()))
    if facts["schema_version"] == 0:
        return checks
    write_error = facts.get("write_error")
    checks.append(_writes(write_error))
    checks.append(_claim_plan(facts, jq.url.migrate_hint()))
    if facts["backend"] == "postgresql":
        checks += _postgres(facts, xmin_warn_after)
    else:
        checks += _sqlite(facts, whose)
        if facts.get("removed_file_holders") is not None:
            checks.append(_removed_file(facts))
    checks.append(_workers(jq, facts["schema_version"], writes_fail=write_error is not None))
    checks.append(_settings(jq, whose))
    if jq.periodics:
        checks.append(_periodics(jq))
    return checks


def _periodics(jq: JobQueue) -> Check:
    """What a worker of this app would refuse at start about its periodics."""
    try:
        jq.check_periodics()
    except ConfigError as exc:
        return Check("periodics", "fail", f"{exc} (a worker of this app refuses to start)")
    count = len(jq.periodics)
    return Check("periodics", "ok", f"{count} registered, each with a known task and args")


def _schema(facts: dict[str, Any], migrate_hint: str) -> Check:
    have, want = facts["schema_version"], facts["schema_expected"]
    if have == 0:
        return Check("schema", "fail", f"not migrated: {migrate_hint}")
    if have < want:
        return Check(
            "schema", "fail", f"version {have} is behind the code's {want}: {migrate_hint}"
        )
    if have > want:
        return Check(
            "schema",
            "warn",
            f"version {have} is ahead of this jobkeeper's {want}: upgrade jobkeeper here",
        )
    return Check("schema", "ok", f"version {have}, as the code expects")


def _writes(error: str | None) -> Check:
    """The write probe: a write that needs new space, rolled back. Reads,
    and updates that fit in pages that exist (claims, heartbeats), can pass
    while it fails: enqueues and outcome writes fail with it.
    """
    if error is None:
        return Check("writes", "ok", "a write (rolled back) succeeds")
    return Check(
        "writes",
        "fail",
        f"a write (rolled back) fails: {error}; enqueues and the workers' outcomes fail "
        "with it (a full disk: free space; a read-only database or file: make it writable)",
    )


def _claim_plan(facts: dict[str, Any], migrate_hint: str) -> Check:
    if facts.get("claim_uses_index"):
        return Check("claim plan", "ok", "the claim walks jobkeeper_jobs_claim_idx")
    live = (facts.get("table") or {}).get("live") or 0
    if facts["backend"] == "postgresql" and live < SMALL_TABLE_ROWS:
        return Check(
            "claim plan", "ok", f"small table ({live} rows): a scan is as cheap as the index"
        )
    return Check(
        "claim plan",
        "fail",
        "the claim does not use jobkeeper_jobs_claim_idx: run ANALYZE jobkeeper_jobs "
        f"and check the index exists ({migrate_hint})",
    )


def _encoding(encoding: str | None) -> Check:
    if encoding is None or encoding == "UTF8":
        return Check("encoding", "ok", encoding or "unknown")
    if encoding == "SQL_ASCII":
        return Check(
            "encoding",
            "warn",
            "the database's encoding is SQL_ASCII: the server neither checks nor converts "
            "text, so jobkeeper's UTF-8 is stored as bytes no one validates; a database made "
            "with ENCODING 'UTF8' checks what it stores",
        )
    return Check(
        "encoding",
        "warn",
        f"the database's encoding is {encoding}, not UTF8: args, results and errors with a "
        f"character {encoding} lacks are refused (DataRejected); a database made with "
        "ENCODING 'UTF8' holds them all",
    )


def _indexes(rows: list[dict[str, Any]]) -> Check:
    """Indexes of the jobs table that cost every enqueue and serve no query:
    invalid ones, and ones a schema version replaced.
    """
    if not rows:
        return Check("indexes", "ok", "none invalid, none left to drop")
    names = ", ".join(row["name"] + ("" if row["valid"] else " (invalid)") for row in rows)
    return Check(
        "indexes",
        "warn",
        f"{names} on jobkeeper_jobs: written by every enqueue, read by no claim; "
        "jobkeeper migrate drops the ones a schema version replaced (an invalid index of "
        "your own: DROP INDEX CONCURRENTLY or REINDEX INDEX CONCURRENTLY it)",
    )


def _xmin_holder(holder: dict[str, Any]) -> str:
    """One holder of the xmin horizon, and how to end it."""
    if holder.get("gid") is not None:
        # A prepared transaction has no session to end: only its own
        # COMMIT PREPARED or ROLLBACK PREPARED releases it.
        return (
            f"prepared transaction {holder['gid']!r} ({holder['open_for']:.0f} s): end it "
            f"(COMMIT PREPARED or ROLLBACK PREPARED {_sql_text(holder['gid'])}), or fix the "
            "transaction manager that left it"
        )
    query = query_excerpt(holder["query"], 60)
    return (
        f"pid {holder['pid']} ({holder['state']}, {holder['open_for']:.0f} s, {query!r}): "
        f"end it (SELECT pg_terminate_backend({holder['pid']})) or fix what leaves it open"
    )


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _postgres(facts: dict[str, Any], xmin_warn_after: float) -> list[Check]:
    checks = []
    table = facts.get("table") or {}
    live, dead = int(table.get("live") or 0), int(table.get("dead") or 0)
    ratio = dead / (live + dead) if live + dead else 0.0
    vacuumed = table.get("vacuumed_ago")
    when = "never vacuumed" if vacuumed is None else f"last vacuumed {vacuumed / 60:.0f} min ago"
    if ratio > DEAD_TUPLE_WARN and live + dead >= SMALL_TABLE_ROWS:
        checks.append(
            Check(
                "dead tuples",
                "warn",
                f"{ratio:.0%} of jobkeeper_jobs rows are dead ({dead:,}; {when}): look for "
                "long transactions below, or run VACUUM jobkeeper_jobs",
            )
        )
    else:
        checks.append(Check("dead tuples", "ok", f"{ratio:.0%} dead ({dead:,} rows; {when})"))
    if not table.get("autovacuum", True):
        checks.append(
            Check(
                "autovacuum",
                "warn",
                "autovacuum is off on this server (autovacuum = off): jobkeeper's pruner "
                "vacuums jobkeeper_jobs itself, but turn autovacuum on for the rest of the "
                "database",
            )
        )
    elif not table.get("table_autovacuum", True):
        checks.append(
            Check(
                "autovacuum",
                "warn",
                "autovacuum is off for jobkeeper_jobs (its autovacuum_enabled = false): "
                "jobkeeper's pruner vacuums it only when the whole server's autovacuum is off; "
                "turn it back on with ALTER TABLE jobkeeper_jobs RESET (autovacuum_enabled)",
            )
        )
    else:
        checks.append(Check("autovacuum", "ok", "on"))
    checks.append(_encoding(facts.get("encoding")))
    checks.append(_indexes(facts.get("indexes") or []))
    holders = [h for h in facts.get("xmin_holders", []) if (h["open_for"] or 0) > xmin_warn_after]
    if holders:
        oldest = holders[0]
        level: Level = "fail" if oldest["open_for"] > XMIN_FAIL_AFTER else "warn"
        checks.append(
            Check(
                "xmin horizon",
                level,
                f"{len(holders)} transaction(s) open over {xmin_warn_after:g} s hold back "
                f"vacuum; oldest: {_xmin_holder(oldest)}",
            )
        )
    else:
        checks.append(
            Check("xmin horizon", "ok", f"no transaction open over {xmin_warn_after:g} s")
        )
    usage = float(facts.get("notify_usage") or 0.0)
    if usage >= NOTIFY_WARN:
        checks.append(
            Check(
                "notify queue",
                "fail" if usage >= NOTIFY_FAIL else "warn",
                f"{usage:.0%} of the NOTIFY queue is used: a LISTEN session is stuck in a "
                "transaction; find it in pg_stat_activity and end it",
            )
        )
    else:
        checks.append(Check("notify queue", "ok", f"{usage:.1%} used"))
    return checks


def _sqlite(facts: dict[str, Any], whose: str) -> list[Check]:
    checks = []
    mode = facts.get("journal_mode", "")
    if mode.lower() == "wal":
        checks.append(Check("journal mode", "ok", "wal"))
    else:
        checks.append(
            Check(
                "journal mode",
                "warn",
                f"{mode}: readers block writers; keep the database on a local disk, "
                "where jobkeeper switches it to WAL",
            )
        )
    wal = int(facts.get("wal_bytes") or 0)
    if wal > WAL_WARN_BYTES:
        checks.append(
            Check(
                "wal size",
                "warn",
                f"the WAL file is {wal / (1 << 20):.0f} MiB: a long-lived reader blocks "
                "checkpoints; close it, then PRAGMA wal_checkpoint(TRUNCATE)",
            )
        )
    else:
        checks.append(Check("wal size", "ok", f"{wal / (1 << 20):.1f} MiB"))
    busy = int(facts.get("busy_timeout_ms") or 0)
    if busy < 1000:
        checks.append(
            Check(
                "busy timeout",
                "warn",
                f"{busy} ms: writes fail at once under contention; set busy_timeout >= 5 s" + whose,
            )
        )
    else:
        checks.append(Check("busy timeout", "ok", f"{busy / 1000:g} s{whose}"))
    return checks


def _removed_holders_said(facts: dict[str, Any]) -> str:
    """The processes still holding a removed or replaced copy of the SQLite
    file, as a clause, or "" (none, or nobody could tell).
    """
    pids = facts.get("removed_file_holders") or []
    if not pids:
        return ""
    return (
        f"; process(es) {', '.join(map(str, pids[:10]))} still have a removed or replaced copy of "
        "this file open: jobs written there are in no file at this path (jobkeeper's own "
        "processes refuse to write to it, and its workers stop; restart the others)"
    )


def _removed_file(facts: dict[str, Any]) -> Check:
    said = _removed_holders_said(facts)
    if not said:
        return Check("removed file", "ok", "no other process has a removed copy of the file open")
    return Check("removed file", "warn", said[2:])


def _workers(jq: JobQueue, schema: int, *, writes_fail: bool = False) -> Check:
    workers = jq.workers()
    if not workers:
        return Check("workers", "ok", "none registered")
    now = jq.backend.db_now()
    stale = [
        w
        for w in workers
        if (now - w.heartbeat_at).total_seconds()
        > holder_window(w.rescue_after, jq.settings.rescue_after)
    ]
    if stale:
        names = ", ".join(w.id for w in stale[:3])
        if writes_fail:
            # Their heartbeats are writes too: the database, not their
            # hosts, is the likelier cause (see the writes check).
            return Check(
                "workers",
                "warn",
                f"{len(stale)} of {len(workers)} worker(s) silent past their rescue window "
                f"({names}): this database takes no writes (see writes above), which stops "
                "heartbeats too; fix that first",
            )
        # Every live worker runs a rescuer; with none alive, nobody rescues.
        if len(stale) < len(workers):
            rescue = "the live workers rescue their jobs"
        else:
            rescue = "their jobs will be rescued when a worker runs (none is alive now)"
        return Check(
            "workers",
            "warn",
            f"{len(stale)} of {len(workers)} worker(s) silent past their rescue window "
            f"({names}): {rescue}; check those hosts",
        )
    # A rolling deploy left half done: workers whose code expects an older
    # schema (their version says which, see worker_version). Those of builds
    # that recorded no schema version cannot be told apart here.
    behind = [w for w in workers if (split_worker_version(w.version)[1] or schema) < schema]
    if behind:
        names = ", ".join(f"{w.id} ({w.version})" for w in behind[:3])
        return Check(
            "workers",
            "warn",
            f"{len(behind)} of {len(workers)} worker(s) run code of an older schema version "
            f"than the database's {schema} ({names}): upgrade them",
        )
    return Check("workers", "ok", f"{len(workers)} alive")


def _settings(jq: JobQueue, whose: str) -> Check:
    settings = jq.settings
    beats = settings.rescue_after / settings.heartbeat_interval
    # JobQueue refuses fewer than MIN_RESCUE_BEATS; between that and the
    # recommendation the setting works, with a thin margin: a recommendation.
    if beats < RECOMMENDED_RESCUE_BEATS * (1 - 1e-9):
        margin = settings.rescue_after - settings.heartbeat_interval
        return Check(
            "settings",
            "warn",
            f"rescue_after={settings.rescue_after:g} s is {beats:.1f} heartbeats "
            f"(heartbeat_interval={settings.heartbeat_interval:g} s): allowed (the least is "
            f"{MIN_RESCUE_BEATS} x), but a heartbeat more than {margin:g} s late gets a live "
            f"worker's jobs rescued and run twice; {RECOMMENDED_RESCUE_BEATS} x heartbeat_interval "
            f"or more is recommended{whose}",
        )
    return Check(
        "settings",
        "ok",
        f"heartbeat every {settings.heartbeat_interval:g} s, rescue after "
        f"{settings.rescue_after:g} s{whose}",
    )


def exit_code(checks: list[Check]) -> int:
    """1 when any check failed, else 0."""
    return 1 if any(check.level == "fail" for check in checks) else 0
