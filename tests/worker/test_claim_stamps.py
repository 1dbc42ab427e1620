"""A worker's record of when it claimed what (worker/claims.py) is kept per
claim: a job handed back while the worker was silent and claimed by it again
is two claims, and the old one must not pass for held.
"""

from __future__ import annotations

import dataclasses
import threading

from jobkeeper.events import EventBus
from jobkeeper.worker.claims import Claims


class _Heartbeat:
    """A heartbeat whose stale spells the test counts by hand."""

    def __init__(self) -> None:
        self.spells = 0

    def liveness(self) -> tuple[float, int]:
        return 0.0, self.spells


def test_an_old_claim_of_a_job_claimed_again_is_not_held(jq):
    # Seen in the PostgreSQL chaos soak (test_short_chaos_soak): a job
    # prefetched, then handed back as unstarted while its worker was cut
    # off, was claimed again by the same worker; keyed by job id, the new
    # claim's stamp let the old buffered execution start too, and the task
    # ran twice at once on one worker ("two live holders").
    job = jq.enqueue("t", {})
    (first,) = jq.backend.job_claim(worker_id="w:1:aaaa", queue="default", limit=1)
    assert first.id == job.id
    heartbeat = _Heartbeat()
    claims = Claims(
        backend=jq.backend,
        worker_id="w:1:aaaa",
        heartbeat=heartbeat,
        completer=None,
        fresh_for=1.0,
        stopping=threading.Event(),
        events=EventBus(),
    )
    claims.claimed([first], claims.stamp())
    assert claims.still_held(first)
    heartbeat.spells += 1  # silent long enough for a rescuer: the claim is not ours to trust
    assert not claims.still_held(first)
    again = dataclasses.replace(first, fence=first.fence + 1)  # handed back, claimed again
    claims.claimed([again], claims.stamp())
    assert claims.still_held(again)
    assert not claims.still_held(first)
    claims.forget(first)
    assert claims.still_held(again)
    claims.forget(again)
    assert not claims.still_held(again)
