"""Leadership: one lease holder at a time, judged by the database clock; an
expired lease passes to the next worker that asks; resigning frees it at once.
"""

from __future__ import annotations

import time

from jobkeeper.maintenance.leader import Leader
from support.db import sql


def test_one_holder_until_the_lease_expires(jq):
    backend = jq.backend
    assert backend.leader_try_acquire(name="maintenance", worker_id="a", ttl=0.5)
    assert not backend.leader_try_acquire(name="maintenance", worker_id="b", ttl=0.5)
    # The holder extends its own lease.
    assert backend.leader_try_acquire(name="maintenance", worker_id="a", ttl=0.5)
    assert backend.leader_get(name="maintenance") == "a"
    # Expire it by the database's own clock (no waiting on wall time).
    hour = "interval '1 hour'" if jq.url.scheme == "postgresql" else "3600"
    sql(jq, f"UPDATE jobkeeper_leader SET expires_at = expires_at - {hour}")
    assert backend.leader_get(name="maintenance") is None
    assert backend.leader_try_acquire(name="maintenance", worker_id="b", ttl=0.5)
    assert not backend.leader_try_acquire(name="maintenance", worker_id="a", ttl=0.5)
    assert backend.leader_get(name="maintenance") == "b"


def test_leases_are_independent_by_name(jq):
    assert jq.backend.leader_try_acquire(name="maintenance", worker_id="a", ttl=5)
    assert jq.backend.leader_try_acquire(name="other", worker_id="b", ttl=5)


def test_resign_frees_the_lease_only_for_its_holder(jq):
    backend = jq.backend
    assert backend.leader_try_acquire(name="maintenance", worker_id="a", ttl=60)
    backend.leader_resign(name="maintenance", worker_id="b")
    assert backend.leader_get(name="maintenance") == "a"
    backend.leader_resign(name="maintenance", worker_id="a")
    assert backend.leader_try_acquire(name="maintenance", worker_id="b", ttl=60)


def test_leader_service_trusts_its_lease_only_for_its_ttl(jq):
    first = Leader(jq.backend, "a", ttl=0.6)
    second = Leader(jq.backend, "b", ttl=0.6)
    first.run_once()
    second.run_once()
    assert first.is_leader and not second.is_leader
    # A leader that stops extending (paused, cut off) stops believing in its
    # lease within ttl by its own clock, before anyone else can take it.
    time.sleep(0.7)
    assert not first.is_leader
    second.run_once()
    assert second.is_leader
    first.run_once()
    assert not first.is_leader
    second.stop()
    assert jq.backend.leader_get(name="maintenance") is None
