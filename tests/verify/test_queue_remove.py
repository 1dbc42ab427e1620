"""``Backend.queue_remove``, verify's clean-up: everything stored under one
queue goes, in one transaction; nothing of any other queue is touched.
"""

from __future__ import annotations

from jobkeeper import JobQueue


def test_queue_remove_deletes_one_queue_and_nothing_else(jq: JobQueue):
    for queue in ("mine", "theirs"):
        jq.enqueue("t.a", {}, queue=queue, external=True)
        jq.enqueue("t.b", {}, queue=queue, delay=3600, external=True)
        jq.configure_queue(queue, concurrency=3)
        jq.periodic("0 * * * *", task="t.a", queue=queue, name=f"hourly-{queue}")
    jq.backend.periodic_upsert(periodics=list(jq.periodics.values()))

    assert jq.backend.queue_remove(queue="mine") == 2

    assert "mine" not in jq.stats()
    theirs = {status: n for status, n in jq.stats()["theirs"].items() if n}
    assert theirs == {"available": 1, "scheduled": 1}
    assert [q.name for q in jq.queues() if q.concurrency] == ["theirs"]
    assert [p.name for p in jq.periodic_list()] == ["hourly-theirs"]
    assert jq.backend.queue_remove(queue="mine") == 0
