"""Flow control on SQLite: queue settings, the limited claim, and the
enqueue-side checks (internal; mixed into ``SqliteBackend``).

Claims and inserts run inside ``BEGIN IMMEDIATE``: the database's one write
lock is held from the settings read to the commit, so the counts a limit is
checked against cannot change under it, in this process or another.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from jobkeeper.backends.flow import check_pending, configure_params, settings_from_row
from jobkeeper.errors import QueueFull
from jobkeeper.models import NewJob
from jobkeeper.queues import QueueSettings

#: (id, priority, scheduled_at) past every job: no bound on a walk.
_QUEUE_END = (2**63 - 1, 2**63 - 1, float("inf"))
#: Most held keys a serial claim leaves out of its walks of the queue's
#: head (as PostgreSQL's jobkeeper_claim_limited, migration 0015, whose test
#: per job is linear in them).
HELD_KEYS_MAX = 64


def _up_to(row: tuple[Any, ...]) -> dict[str, Any]:
    """A walk's bound from an (id, priority, scheduled_at) row."""
    return {"id": row[0], "priority": row[1], "scheduled_at": row[2]}


def _rows(cursor: sqlite3.Cursor) -> list[dict[str, Any]]:
    if cursor.description is None:
        return []
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


class SqliteFlow:
    """Flow-control operations of the Backend Protocol on SQLite."""

    _queries: Mapping[str, str]

    def _fetch(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _write(
        self, *, create: bool = False
    ) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _claim_settings(self, conn: sqlite3.Connection, queue: str) -> QueueSettings | None:
        """The queue's settings when they limit claims, else None (the fast path)."""
        rows = _rows(conn.execute(self._queries["job_claim_settings"], {"name": queue}))
        if not rows:
            return None
        settings = settings_from_row(rows[0])
        return settings if settings.limits_claims else None

    def _claim_picked(
        self, conn: sqlite3.Connection, pick: str, params: dict[str, Any], worker_id: str
    ) -> list[dict[str, Any]]:
        """Claim for ``worker_id`` the jobs the query ``pick`` chooses (their
        ids), in the caller's write transaction; their rows as claimed.
        """
        ids = [row[0] for row in conn.execute(self._queries[pick], params)]
        return self._claim_ids(conn, ids, worker_id)

    def _claim_ids(
        self, conn: sqlite3.Connection, ids: list[int], worker_id: str
    ) -> list[dict[str, Any]]:
        """Claim the jobs ``ids`` for ``worker_id``, in the caller's write
        transaction; their rows as claimed.
        """
        if len(ids) == 1:
            one = {"id": ids[0], "worker_id": worker_id}
            conn.execute(self._queries["job_claim_one"], one)
            return _rows(conn.execute(self._queries["job_claim_one_row"], one))
        if not ids:
            return []
        many = {"ids": json.dumps(ids), "worker_id": worker_id}
        conn.execute(self._queries["job_claim"], many)
        return _rows(conn.execute(self._queries["job_claim_rows"], many))

    def _claim_limited(
        self,
        conn: sqlite3.Connection,
        settings: QueueSettings,
        *,
        worker_id: str,
        limit: int,
    ) -> list[dict[str, Any]]:
        """The claim of a queue with settings, in the caller's write transaction."""
        queries, queue = self._queries, settings.name
        if settings.paused:
            return []
        allowed = limit
        if settings.concurrency is not None:
            held = conn.execute(queries["job_claim_held"], {"queue": queue}).fetchone()[0]
            allowed = min(allowed, settings.concurrency - int(held))
        if settings.rate_limit is not None:
            conn.execute(
                queries["job_claim_starts_prune"], {"queue": queue, "period": settings.rate_period}
            )
            started = conn.execute(queries["job_claim_starts_count"], {"queue": queue}).fetchone()[
                0
            ]
            allowed = min(allowed, settings.rate_limit - int(started))
        if allowed <= 0:
            return []
        if settings.serial:
            rows = self._claim_ids(conn, self._serial_pick(conn, queue, allowed), worker_id)
        else:
            rows = self._claim_picked(
                conn, "job_claim_pick", {"queue": queue, "limit": allowed}, worker_id
            )
        if settings.rate_limit is not None and rows:
            conn.execute(queries["job_claim_starts_record"], {"queue": queue, "jobs": len(rows)})
        return rows

    def _serial_pick(self, conn: sqlite3.Connection, queue: str, allowed: int) -> list[int]:
        """The ids a claim of up to ``allowed`` jobs takes from the serial
        queue ``queue``, in claim order (the write lock is held).

        Two ways to find a key's first job, each cheap where the other is
        not: the queue's head in claim order suits many shallow keys, whose
        first jobs come early; a walk over the keys (one probe each) suits a
        few deep ones, whose takeable jobs lie behind thousands of jobs of
        held keys. Each round tries a head of ``budget`` jobs, then up to an
        eighth as many keys, and the next round eight times as many of each,
        so a claim costs a constant times the cheaper of the two (the rounds
        of PostgreSQL's ``jobkeeper_claim_limited``, migration 0014, which
        tries a thirty-second as many keys: a key costs it about 30 head
        jobs, and SQLite's one or two, about 1.5 us a key against 1 us a
        head job with its probe); the first round walks the second's keys
        (migration 0016). When both find too little a second time, the
        held keys among the head's (at most ``HELD_KEYS_MAX``) are left out of
        the walks and the same head is walked again (migration 0015's rule): a
        few deep held keys at the head no longer push the walks over their
        thousands of jobs.
        """
        queries = self._queries
        first_budget = allowed * 2 + 256
        budget = first_budget
        held: list[str] = []
        room = HELD_KEYS_MAX
        failed_key_budget = 0
        while True:
            left_out = json.dumps(held)
            bounds = {"queue": queue, "budget": budget, "held": left_out}
            end = conn.execute(queries["job_claim_serial_head_end"], bounds).fetchone()
            head = {"queue": queue, "limit": allowed, "held": left_out, **_up_to(end or _QUEUE_END)}
            ids = [row[0] for row in conn.execute(queries["job_claim_serial_head"], head)]
            if len(ids) >= allowed or end is None:
                return ids
            # The first round walks the second round's keys (an eighth of
            # its head) and the second walks none, as on PostgreSQL
            # (migration 0016): few keys answer at once, many cost no more
            # walking than before. No walk is repeated with a budget that
            # already found too many.
            key_budget = budget if budget == first_budget else budget // 8
            if key_budget > failed_key_budget:
                picked = self._serial_pick_by_keys(conn, queue, allowed, key_budget)
                if picked is not None:
                    return picked
                failed_key_budget = key_budget
            if budget > first_budget and room > 0:
                # The head is mostly jobs of deep held keys: leave those keys
                # out of the walks and walk the same head again. Not in the
                # first round, and not past HELD_KEYS_MAX keys, as on
                # PostgreSQL (migration 0015 says why).
                asked = {**bounds, "room": room + 1}
                found = [
                    row[0] for row in conn.execute(queries["job_claim_serial_head_held"], asked)
                ]
                if len(found) > room:
                    room = 0
                elif found:
                    held += found
                    room -= len(found)
                    continue
            budget *= 8

    def _serial_pick_by_keys(
        self, conn: sqlite3.Connection, queue: str, allowed: int, key_budget: int
    ) -> list[int] | None:
        """The ids :meth:`_serial_pick` takes, found by walking the queue's
        keys (each key's first job) and its unkeyed jobs; None when the queue
        has more than ``key_budget`` keys, and the walk cannot tell.
        """
        queries = self._queries
        keys = [
            row[0]
            for row in conn.execute(
                queries["job_claim_serial_keys"], {"queue": queue, "budget": key_budget + 1}
            )
        ]
        if len(keys) > key_budget:
            return None
        by_keys = {"queue": queue, "keys": json.dumps(keys), "limit": allowed}
        keyed = conn.execute(queries["job_claim_serial_firsts"], by_keys).fetchall()
        # Full of keyed jobs: an unkeyed one after the last cannot be among
        # the first.
        last = keyed[-1] if len(keyed) >= allowed else _QUEUE_END
        up_to = {"queue": queue, "limit": allowed, **_up_to(last)}
        unkeyed = conn.execute(queries["job_claim_serial_unkeyed"], up_to).fetchall()
        picked = sorted(keyed + unkeyed, key=lambda row: (row[1], row[2], row[0]))
        return [row[0] for row in picked[:allowed]]

    def _flow_check(self, conn: sqlite3.Connection, jobs: Sequence[NewJob]) -> None:
        """Inside the insert's transaction, after the rows went in: mark
        queues that got serial-keyed jobs, and refuse the batch with
        :class:`QueueFull` (the caller rolls back) if it took a queue past
        ``max_pending``.
        """
        for queue in sorted({job.queue for job in jobs if job.serial_key is not None}):
            marked = conn.execute(self._queries["job_insert_many_mark_serial"], {"name": queue})
            if marked.rowcount > 0:
                conn.execute(self._queries["job_insert_many_flag_unkeyed"], {"name": queue})
        queues = json.dumps(sorted({job.queue for job in jobs}))
        limits = {
            name: int(limit)
            for name, limit in conn.execute(
                self._queries["job_insert_many_pending_limits"], {"queues": queues}
            )
        }
        if not limits:
            return
        counts = {
            name: int(n)
            for name, n in conn.execute(
                self._queries["job_insert_many_count_pending"],
                {"queues": json.dumps(sorted(limits))},
            )
        }
        check_pending(limits, counts, jobs, inserted=True)

    def _pending_full(self, conn: sqlite3.Connection, queue: str) -> QueueFull | None:
        """Whether one more job would take ``queue`` past ``max_pending``."""
        found = conn.execute(
            self._queries["job_insert_many_pending_limits"], {"queues": json.dumps([queue])}
        ).fetchone()
        if found is None:
            return None
        limit = int(found[1])
        row = conn.execute(
            self._queries["job_insert_many_count_pending"], {"queues": json.dumps([queue])}
        ).fetchone()
        count = 0 if row is None else int(row[1])
        return QueueFull(queue, limit, count) if count + 1 > limit else None

    def queue_settings_list(self, *, names: Sequence[str] | None = None) -> list[QueueSettings]:
        rows = self._fetch(
            "queue_settings_list", {"names": None if names is None else json.dumps(list(names))}
        )
        return [settings_from_row(row) for row in rows]

    def queue_configure(self, *, name: str, changes: Mapping[str, Any]) -> QueueSettings:
        with self._write() as conn:
            params = configure_params(name, changes)
            (row,) = _rows(conn.execute(self._queries["queue_configure"], params))
            conn.execute(self._queries["queue_configure_delete_if_empty"], {"name": name})
            conn.execute(self._queries["queue_configure_starts_forget"], {"name": name})
        return settings_from_row(row)
