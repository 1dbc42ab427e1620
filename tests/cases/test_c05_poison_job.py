"""C-05 (delayed_job#415, hindsight#2675, sidekiq#4069): a poison job that
kills its worker crash-loops forever because its attempts are never counted.

jobkeeper counts the attempt when the job is claimed (``attempt`` grows in
the claim's own write), so a crash cannot leave it uncounted: the rescuer
finds the dead holder's job and records the lost attempt in ``errors``
("worker lost: ... sent no heartbeat ..."), with the retry backoff, or moves
it to the dead letters once ``max_attempts`` are spent.

One crash may come back free. A claimed job whose start mark (claimed ->
running, batched with the acks) was not yet written when its worker died is
indistinguishable from a prefetched one that never ran, and those must not
pay for a neighbour's crash (with max_attempts=1 they would be dead-lettered
unrun). So such a job goes back without spending the attempt, and its
``unstarted_returns`` is counted; every later claim of it writes the start
mark *before* the task is called, so from then on each crash spends an
attempt. The loop is bounded all the same: at most max_attempts + 1 crashes
(max_attempts + 3 if even the early start marks fail: after 3 free returns a
lost claim spends the attempt, tests/worker/test_rescue.py). This test
asserts that bound, one "worker lost" entry per spent attempt, the backoff
between rescues, the dead letter after 3 attempts, and workers that then
stop dying.
"""

from __future__ import annotations

import signal

import pytest

from e2e.helpers import processes, read_records
from jobkeeper import JobStatus
from support.audit import install_job_audit, job_audit
from support.settings import FAST
from support.waiting import wait_for

pytestmark = pytest.mark.slow

MAX_ATTEMPTS = 3
#: A visible retry backoff: uniform(0, min(2 ** attempt, 0.5)) seconds.
SETTINGS = {**FAST, "max_backoff": 0.5}


def test_c05_poison_job_spends_an_attempt_per_crash_and_ends_dead(make_queue, tmp_path):
    jq = make_queue(**SETTINGS)
    url = jq.url.url
    install_job_audit(url)
    record = tmp_path / "runs.log"
    poison = jq.enqueue("suicide", {"record": str(record)}, max_attempts=MAX_ATTEMPTS)
    deaths = 0
    with processes(tmp_path) as procs:
        workers = [procs.worker(url, SETTINGS, concurrency=2) for _ in range(2)]

        def supervise() -> bool:
            # The supervisor: restart any worker that died (each death is a crash).
            nonlocal deaths
            for index, proc in enumerate(workers):
                if proc.poll() is not None:
                    assert proc.returncode == -signal.SIGKILL, procs.log(proc)
                    deaths += 1
                    workers[index] = procs.worker(url, SETTINGS, concurrency=2)
            return jq.get_job(poison.id).status == JobStatus.DEAD

        wait_for(supervise, timeout=120, what="the poison job to reach the dead letters")
        # The workers stop dying: both stay up and run ordinary jobs, through
        # more than the five rescue cycles the case waits for.
        ok = [jq.enqueue("sleep", {"seconds": 0.01}).id for _ in range(4)]
        wait_for(
            lambda: supervise() and all(jq.get_job(i).status == JobStatus.COMPLETED for i in ok),
            what="ordinary jobs to complete",
        )
        calm_until = jq.backend.db_now().timestamp() + 5 * SETTINGS["rescue_after"]
        wait_for(
            lambda: supervise() and jq.backend.db_now().timestamp() > calm_until,
            timeout=60,
            what="five rescue windows to pass",
            every=0.1,
        )
        assert all(proc.poll() is None for proc in workers)
    dead = jq.get_job(poison.id)
    assert dead.status == JobStatus.DEAD
    assert dead.attempt == MAX_ATTEMPTS
    # One error entry per spent attempt, each naming the lost worker.
    assert [e["attempt"] for e in dead.errors] == [1, 2, 3]
    for entry in dead.errors:
        assert "worker lost" in entry["error"] and "no heartbeat" in entry["error"], entry
    # Every crash was an execution; at most one of them came back free.
    starts = [r[1] for r in read_records(record)]
    assert len(starts) == deaths
    free = deaths - MAX_ATTEMPTS
    assert free in (0, 1), (deaths, starts)
    assert starts == [1] * free + [1, 2, 3]
    # The rescues, in the order they were written: a free return goes back
    # available at once; a spent attempt goes retryable with a backoff
    # (scheduled_at after the rescue), the last one to the dead letters.
    history = job_audit(url)[poison.id]
    rescues = [c for c in history if c.old_status in ("claimed", "running") and c.worker_id is None]
    rescues += [c for c in history if c.new_status == "deleted"]
    rescues.sort(key=lambda c: c.seq)
    kinds = [c.new_status for c in rescues]
    assert kinds == ["available"] * free + ["retryable", "retryable", "deleted"], history
    for change in rescues:
        if change.new_status == "retryable":
            assert change.scheduled_at > change.at, change
    # Nothing ran before its backoff was over.
    for retry, claim in zip(
        [c for c in rescues if c.new_status == "retryable"],
        [c for c in history if c.new_status == "claimed" and c.attempt > 1],
        strict=True,
    ):
        assert claim.at >= retry.scheduled_at, (retry, claim)
