"""``current_job().fence`` keeps growing over a job's whole life: through
the dead letters and back, and through a retry of the dead job. Both went
back to 0 (a break-test read fences (1, 2), (1, 2), (1, 2) for one job id
dead-lettered, requeued, dead again and retried), so a holder stale from
before the requeue could hold the new holder's very claim.
"""

from __future__ import annotations

from jobkeeper import JobStatus, current_job
from jobkeeper.testing import drain
from support.db import job


def test_the_fence_a_task_sees_grows_across_dead_requeue_dead_and_retry(make_queue):
    jq = make_queue()
    seen: list[tuple[int, int]] = []

    @jq.task(max_attempts=2)
    def always_fails() -> None:
        running = current_job()
        seen.append((running.attempt, running.fence))
        raise ValueError("no")

    j = always_fails.enqueue()

    def run_until_dead() -> None:
        assert drain(jq, include_scheduled=True) == {"retryable": 1, "dead": 1}
        assert job(jq, j.id).status == JobStatus.DEAD

    run_until_dead()
    assert job(jq, j.id).fence == 2  # a dead letter shows its last claim's
    assert jq.requeue_dead([j.id]) == [j.id]
    requeued = job(jq, j.id)
    assert (requeued.status, requeued.attempt, requeued.fence) == (JobStatus.AVAILABLE, 0, 2)
    run_until_dead()
    assert job(jq, j.id).fence == 4
    retried = jq.retry(j.id)
    assert (retried.attempt, retried.fence) == (0, 4)
    run_until_dead()
    # Attempts start afresh each time, as documented; the fence never does.
    assert seen == [(1, 1), (2, 2), (1, 3), (2, 4), (1, 5), (2, 6)]
