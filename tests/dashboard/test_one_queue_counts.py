"""pause, resume and configure_queue count the queue they changed, and
only it (both backends). They counted every queue's live jobs for the one
line they return: 0.3-1.0 s at 600,000 available jobs on PostgreSQL.
"""

from __future__ import annotations

from jobkeeper import JobQueue

from .seed import finish, seed
from .test_recount import bury


def listed(jq: JobQueue, name: str):
    return {q.name: q for q in jq.queues()}[name]


def test_pause_resume_and_configure_return_the_queue_as_queues_lists_it(jq):
    seed(jq)  # default, emails, reports: every status but claimed among them
    jq.enqueue("send_email", {"to": "x@example.com"}, queue="emails")
    assert len(jq.backend.job_claim(worker_id="w2", queue="emails", limit=1)) == 1
    finish(jq, "emails", 3)
    bury(jq, "emails", 2)
    assert {s for q in jq.queues() for s, n in q.counts.items() if n} == {
        "scheduled", "available", "claimed", "running", "retryable",
        "completed", "cancelled", "dead",
    }  # fmt: skip
    for name in ("default", "emails", "reports", "empty"):
        assert jq.pause(name) == listed(jq, name)
        assert jq.configure_queue(name, concurrency=4) == listed(jq, name)
        assert jq.configure_queue(name) == listed(jq, name)  # nothing changed
        assert jq.resume(name) == listed(jq, name)
    info = listed(jq, "emails")
    assert info.counts["available"] == 3 and info.counts["claimed"] == 1
    assert info.counts["completed"] == 3 and info.counts["dead"] == 2
    assert info.estimated == info.lower_bound == ()


def test_above_the_cap_one_queue_counts_as_queue_counts_without_a_recount(jq):
    # The meaning of QueueCounts.estimated and lower_bound holds for one
    # queue: judged on the samples of every queue, the queue's rows in them.
    finish(jq, "old", 8, ago=3600)
    finish(jq, "q", 5)
    bury(jq, "old", 9)
    bury(jq, "q", 3)
    jq.enqueue("t", {}, queue="q")
    for exact_below in (6, 10, 11, 20):
        every = jq.queue_counts(exact_below=exact_below, recount=False)
        for name in ("q", "old", "none"):
            one = jq.backend.queue_counts_of(queue=name, exact_below=exact_below)
            assert one.counts == {k: v for k, v in every.counts.items() if k == name}
            assert (one.estimated, one.lower_bound) == (every.estimated, every.lower_bound)
    capped = jq.backend.queue_counts_of(queue="q", exact_below=6)
    assert capped.estimated == {"completed", "cancelled", "dead"}
    assert capped.counts["q"]["available"] == 1  # live: exact


def test_pause_counts_only_the_paused_queue(jq, monkeypatch):
    # The old pause read queue_counts_live, whose available arm walks every
    # queue's entries of the claim index; every count now names the queue.
    seed(jq)
    jq.enqueue_many([("t", {"i": i}, {"queue": "backlog"}) for i in range(50)])
    issued: list[tuple[str, dict]] = []
    real_fetch = jq.backend._fetch

    def fetch(name, params=None, **kwargs):
        issued.append((name, dict(params or {})))
        return real_fetch(name, params, **kwargs)

    monkeypatch.setattr(jq.backend, "_fetch", fetch)
    info = jq.pause("emails")
    assert info.counts["available"] == 3
    counts = [(name, params) for name, params in issued if name.startswith("queue_counts")]
    assert [(name, params.get("queue")) for name, params in counts] == [
        ("queue_counts_of_queue", "emails")
    ]
