"""Rescue of orphaned jobs and the fences that keep it safe, in-process: a
stale rescue never moves a finished or re-claimed job, a dead worker's jobs run
again, and a busy pool starves neither heartbeats nor acknowledgements.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from datetime import UTC, datetime, timedelta

from jobkeeper import JobStatus, current_job
from jobkeeper.maintenance.rescuer import Rescuer
from jobkeeper.models import Claim, Completion, WorkerInfo
from jobkeeper.outcomes import claim_of, failed_attempt
from jobkeeper.worker.executor import UNSTARTED
from jobkeeper.worker.stats import make_worker_id
from support.db import count, is_pg, job, sql
from support.heartbeats import heartbeat_log, install_heartbeat_log
from support.waiting import DEADLINE, wait_for, wait_status

from .helpers import age_heartbeat, holder_info, running, running_count


def _claim_one(jq, worker_id: str):
    """Claim one job and record its start: a running job, as a holder that
    started it leaves it (rescuing it spends the attempt).
    """
    claimed = jq.backend.job_claim(worker_id=worker_id, queue="default", limit=1)
    assert len(claimed) == 1
    assert jq.backend.job_start_many(claims=[claim_of(claimed[0])]) == {claimed[0].id}
    return jq.get_job(claimed[0].id)


def test_stale_rescue_after_completion_changes_nothing(jq):
    holder = "holder:1:aaaa"
    jq.backend.worker_register(worker=holder_info(holder))
    j = jq.enqueue("some_task", {"n": 1})
    running_job = _claim_one(jq, holder)
    # The holder goes silent: it is a rescue candidate once rescue_after passes.
    jq.backend.worker_deregister(worker_id=holder)
    candidates = jq.backend.job_rescue_candidates(rescue_after=jq.settings.rescue_after, limit=10)
    assert [c.id for c in candidates] == [j.id]
    # ...but before the rescuer writes, the holder's completion lands.
    claim = Claim(j.id, holder, running_job.attempt, running_job.fence)
    assert jq.backend.job_complete_many(
        completions=[Completion(claim, '{"by": "holder"}')], delete=False
    ) == {j.id}
    failures = [
        failed_attempt(c, jq.settings, error=f"worker lost: {c.worker_id}") for c in candidates
    ]
    written = jq.backend.job_fail_many(failures=failures, stale_after=jq.settings.rescue_after)
    assert written == set()
    done = job(jq, j.id)
    assert done.status == JobStatus.COMPLETED
    assert done.result == {"by": "holder"}
    assert done.errors == []
    assert done.attempt == 1
    # A dead-letter rescue write (last attempt) is fenced the same way.
    dead_failures = [
        failed_attempt(c, jq.settings, error="lost", discard_reason="x") for c in candidates
    ]
    assert jq.backend.job_fail_many(failures=dead_failures, stale_after=1.0) == set()
    assert job(jq, j.id).status == JobStatus.COMPLETED
    assert jq.list_jobs(status="dead") == []


def test_stale_rescue_after_reclaim_does_not_clobber_the_new_attempt(jq):
    first, second = "first:1:aaaa", "second:2:bbbb"
    j = jq.enqueue("some_task", {})
    _claim_one(jq, first)  # no worker row: immediately a candidate
    stale = jq.backend.job_rescue_candidates(rescue_after=1.0, limit=10)
    assert [c.id for c in stale] == [j.id]
    # Another rescuer got there first; the job was re-claimed by a live worker.
    assert jq.backend.job_fail_many(
        failures=[failed_attempt(c, jq.settings, error="lost", retry_in=0) for c in stale],
        stale_after=1.0,
    ) == {j.id}
    jq.backend.job_stage_due()
    jq.backend.worker_register(worker=holder_info(second))
    reclaimed = _claim_one(jq, second)
    assert reclaimed.attempt == 2
    # The first rescuer's stale write now affects nothing.
    late = [failed_attempt(c, jq.settings, error="lost again") for c in stale]
    assert jq.backend.job_fail_many(failures=late, stale_after=1.0) == set()
    now = job(jq, j.id)
    assert now.status == JobStatus.RUNNING and now.worker_id == second and now.attempt == 2
    assert len(now.errors) == 1
    # Nor can the first holder complete it any more.
    claim = Claim(j.id, first, 1, 1)
    assert jq.backend.job_complete_many(completions=[Completion(claim, "1")], delete=False) == set()
    assert (
        jq.backend.job_fail_many(failures=[failed_attempt(stale[0], jq.settings, error="x")])
        == set()
    )


class _PausingBackend:
    """Wraps a backend: runs ``between`` after the rescuer's select."""

    def __init__(self, inner, between) -> None:
        self._inner = inner
        self._between = between

    def job_rescue_candidates(self, **kwargs):
        found = self._inner.job_rescue_candidates(**kwargs)
        self._between(found)
        return found

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_real_rescuer_paused_between_select_and_update(jq):
    holder = "holder:1:cccc"
    jobs = jq.enqueue_many([("some_task", {"i": i}) for i in range(5)])
    claimed = jq.backend.job_claim(worker_id=holder, queue="default", limit=5)
    assert len(claimed) == 5
    jq.backend.job_start_many(claims=[claim_of(c) for c in claimed])
    done_id = claimed[0].id

    def complete_first(found) -> None:
        assert done_id in {f.id for f in found}
        claim = Claim(done_id, holder, 1, 1)
        jq.backend.job_complete_many(completions=[Completion(claim, '"done"')], delete=False)

    rescuer = Rescuer(_PausingBackend(jq.backend, complete_first), jq.settings, 0.1)
    rescuer.run_once()
    assert rescuer.rescued == 4
    done = job(jq, done_id)
    assert done.status == JobStatus.COMPLETED and done.result == "done" and done.errors == []
    for j in jobs[1:]:
        rescued = job(jq, j.id)
        assert rescued.status in (JobStatus.RETRYABLE, JobStatus.AVAILABLE)
        assert rescued.attempt == 1
        assert "worker lost" in rescued.errors[0]["error"]
    # Later passes leave the completed job alone too.
    Rescuer(jq.backend, jq.settings, 0.1).run_once()
    assert job(jq, done_id).status == JobStatus.COMPLETED


def test_rescuer_spares_a_holder_that_heartbeats_again(jq):
    holder = "holder:1:dddd"
    jq.backend.worker_register(worker=holder_info(holder))
    j = jq.enqueue("some_task", {})
    _claim_one(jq, holder)
    seen: list[int] = []

    def heartbeat_meanwhile(found) -> None:
        seen.extend(f.id for f in found)
        jq.backend.worker_heartbeat(worker=holder_info(holder))

    # Make the holder look silent to the select, then let it beat again.
    if is_pg(jq):
        sql(jq, "UPDATE jobkeeper_workers SET heartbeat_at = now() - interval '1 hour'")
    else:
        sql(jq, "UPDATE jobkeeper_workers SET heartbeat_at = heartbeat_at - 3600")
    rescuer = Rescuer(_PausingBackend(jq.backend, heartbeat_meanwhile), jq.settings, 0.1)
    rescuer.run_once()
    assert seen == [j.id]
    assert rescuer.rescued == 0
    now = job(jq, j.id)
    assert now.status == JobStatus.RUNNING and now.worker_id == holder and now.errors == []


def test_job_of_a_deleted_worker_row_is_rescued_and_runs_again(make_queue):
    jq = make_queue()
    ran: list[int] = []

    @jq.task
    def work() -> int:
        attempt = job(jq, ran_for[0]).attempt
        ran.append(attempt)
        return attempt

    ghost = "ghost:1:eeee"
    jq.backend.worker_register(worker=holder_info(ghost))
    j = work.enqueue()
    ran_for = [j.id]
    _claim_one(jq, ghost)
    # Dead-worker pruning ran first: the worker row is gone, its job still
    # says running. Rescue must not depend on the row.
    jq.backend.worker_deregister(worker_id=ghost)
    assert jq.workers() == []
    with running(jq.worker()) as handle:
        done = wait_status(jq, [j.id], {JobStatus.COMPLETED})[0]
        rescuer = handle.worker.rescuer
    assert rescuer.rescued == 1
    assert ran == [2]
    assert done.attempt == 2
    assert len(done.errors) == 1
    assert "worker lost" in done.errors[0]["error"] and ghost in done.errors[0]["error"]
    assert done.errors[0]["attempt"] == 1


def test_worker_ids_carry_a_random_part(make_queue):
    jq = make_queue()
    a, b = jq.worker(), jq.worker()
    try:
        assert a.info.id != b.info.id
        assert a.info.pid == b.info.pid and a.info.hostname == b.info.hostname
    finally:
        for w in (a, b):
            w.completer.stop(timeout=5)
    ids = {make_worker_id() for _ in range(100)}
    assert len(ids) == 100


def test_restarted_worker_with_same_host_and_pid_does_not_keep_dead_jobs_alive(make_queue):
    # A "restarted" worker in the same process (same host and pid) registers
    # and heartbeats under a new id; the dead run's job is still rescued.
    jq = make_queue()

    @jq.task
    async def work() -> str:
        return "ran again"

    j = work.enqueue()
    dead_run = jq.worker()
    dead_id = dead_run.info.id
    dead_run.completer.stop(timeout=5)
    jq.backend.worker_register(worker=dead_run.info)
    _claim_one(jq, dead_id)  # the dead run held the job, then died (no more beats)
    with running(jq.worker()) as handle:
        assert handle.worker.info.id != dead_id
        done = wait_status(jq, [j.id], {JobStatus.COMPLETED})[0]
    assert done.attempt == 2 and done.result == "ran again"
    assert dead_id in done.errors[0]["error"]


def test_busy_pool_does_not_starve_heartbeats_or_acks(make_queue):
    # Concurrency 10 with slow tasks that themselves enqueue through the
    # queue's pool: heartbeats keep flowing, no job is rescued or re-run.
    jq = make_queue(heartbeat_interval=0.1, rescue_after=1.0)
    runs: dict[int, int] = {}
    lock = threading.Lock()

    @jq.task
    def child(parent: int) -> int:
        return parent

    @jq.task
    def parent(n: int) -> int:
        with lock:
            runs[n] = runs.get(n, 0) + 1
        end = time.monotonic() + 1.5  # longer than rescue_after
        while time.monotonic() < end:
            child.enqueue(parent=n)
            time.sleep(0.05)
        return n

    @jq.task
    async def aparent(n: int) -> int:
        with lock:
            runs[n] = runs.get(n, 0) + 1
        for _ in range(15):
            await asyncio.to_thread(child.enqueue, parent=n)
            await asyncio.sleep(0.1)
        return n

    jobs = jq.enqueue_many([("parent" if n % 2 else "aparent", {"n": n}) for n in range(20)])
    install_heartbeat_log(jq)
    with running(jq.worker(concurrency=10)) as handle:
        done = wait_status(jq, [j.id for j in jobs], {JobStatus.COMPLETED}, timeout=60)
        rescuer = handle.worker.rescuer
        worker_id = handle.worker.info.id
    assert rescuer.rescued == 0
    assert runs == {n: 1 for n in range(20)}
    for d in done:
        assert d.attempt == 1 and d.errors == []
    # Heartbeats (database clock, every one logged by a trigger) never paused
    # for anything near rescue_after.
    beats = heartbeat_log(jq).get(worker_id, [])
    assert len(beats) > 10
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    assert max(gaps) < jq.settings.rescue_after / 2, max(gaps)
    # Every task's own enqueues went through (async parents make exactly 15).
    children = sql(jq, "SELECT count(*) FROM jobkeeper_jobs WHERE task = 'child'")[0][0]
    assert children >= 10 * 15 + 10
    assert running_count(jq) == 0


def test_paused_heartbeat_loses_the_claim_and_the_late_ack_is_refused(make_queue):
    # In-process zombie: worker A stops heartbeating (test hook) mid-job; its
    # job is rescued and run again, and A's late result is fenced off.
    # (A keeps claiming meanwhile, and whatever it claims is rescued too, as
    # its heartbeat is stale: so later attempts may be A's or B's.)
    jq = make_queue()
    release = threading.Event()

    @jq.task
    def who() -> str:
        me = current_job()
        if me.attempt == 1:
            release.wait(30)
        return f"{me.worker_id}|{me.attempt}"

    j = who.enqueue()
    a = jq.worker(concurrency=1)
    with running(a) as handle_a:
        wait_status(jq, [j.id], {JobStatus.RUNNING})
        a.heartbeat.paused = True
        with running(jq.worker(concurrency=1)):
            done = wait_status(jq, [j.id], {JobStatus.COMPLETED})[0]
            lost_before = a.stats.lost_claims
            release.set()  # A's first attempt now returns; its ack must be refused
            wait_for(lambda: a.stats.lost_claims > lost_before, what="A's refused ack")
    final = job(jq, j.id)
    assert final == done, "a completed job changed after its completion"
    worker_id, attempt = final.result.split("|")
    assert int(attempt) == final.attempt >= 2
    assert len(final.errors) == final.attempt - 1
    assert a.info.id in final.errors[0]["error"] and final.errors[0]["attempt"] == 1
    assert all("worker lost" in e["error"] for e in final.errors)
    # A's only written completion, if any, is the final one.
    assert (handle_a.stats.completed == 1) == (worker_id == a.info.id)


def _install_audit(jq) -> None:
    """Log every status change and delete of a job row in ``test_audit``."""
    if is_pg(jq):
        sql(
            jq,
            """
            CREATE TABLE test_audit (id bigint, old_status text, new_status text,
                                     old_errors int, new_errors int);
            CREATE FUNCTION test_audit_job() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF TG_OP = 'DELETE' THEN
                    INSERT INTO test_audit VALUES (OLD.id, OLD.status, 'deleted',
                                                   jsonb_array_length(OLD.errors), NULL);
                    RETURN OLD;
                END IF;
                INSERT INTO test_audit VALUES (NEW.id, OLD.status, NEW.status,
                    jsonb_array_length(OLD.errors), jsonb_array_length(NEW.errors));
                RETURN NEW;
            END $$;
            CREATE TRIGGER test_audit_job AFTER UPDATE OR DELETE ON jobkeeper_jobs
                FOR EACH ROW EXECUTE FUNCTION test_audit_job();
            """,
        )
        return
    sql(
        jq,
        "CREATE TABLE test_audit (id INTEGER, old_status TEXT, new_status TEXT, "
        "old_errors INTEGER, new_errors INTEGER)",
    )
    sql(
        jq,
        "CREATE TRIGGER test_audit_update AFTER UPDATE ON jobkeeper_jobs BEGIN "
        "INSERT INTO test_audit VALUES (NEW.id, OLD.status, NEW.status, "
        "json_array_length(OLD.errors), json_array_length(NEW.errors)); END",
    )
    sql(
        jq,
        "CREATE TRIGGER test_audit_delete AFTER DELETE ON jobkeeper_jobs BEGIN "
        "INSERT INTO test_audit VALUES (OLD.id, OLD.status, 'deleted', "
        "json_array_length(OLD.errors), NULL); END",
    )


def test_rescues_racing_completions_never_move_a_completed_job(make_queue):
    # Rescues racing completions: 4 workers whose heartbeats are suspended (test
    # hook) once jobs run, for longer than rescue_after, so their running jobs
    # become rescue candidates just as many of them complete. Heartbeats then
    # resume: a worker whose heartbeat is stale stops claiming, so without
    # that nothing would finish. Every transition is audited by a trigger.
    jq = make_queue(retention=3600)

    @jq.task(max_attempts=3)
    async def nap(ms: int) -> int:
        await asyncio.sleep(ms / 1000)
        return ms

    _install_audit(jq)
    # Some jobs outlast rescue_after (1 s), so rescues race their completions.
    sleeps = [100 + (i * 37) % 1400 for i in range(200)]
    ids = [j.id for j in jq.enqueue_many([("nap", {"ms": ms}) for ms in sleeps])]
    workers = [jq.worker(concurrency=10) for _ in range(4)]
    with running(workers[0]), running(workers[1]), running(workers[2]), running(workers[3]):
        wait_for(lambda: count(jq, where="status = 'running'") > 0, what="jobs to run")
        for w in workers:
            w.heartbeat.paused = True
        wait_for(lambda: sum(w.rescuer.rescued for w in workers) > 0, timeout=10, what="a rescue")
        # Two more rescue passes on every worker: more rescues race more completions.
        for w in workers:
            assert w.rescuer.wait_passes(w.rescuer.loop_passes + 2, timeout=DEADLINE)
        for w in workers:
            w.heartbeat.paused = False
        final = wait_status(jq, ids, {JobStatus.COMPLETED, JobStatus.DEAD}, timeout=90)
    rescued = sum(w.rescuer.rescued for w in workers)
    audit = sql(jq, "SELECT id, old_status, new_status, old_errors, new_errors FROM test_audit")
    assert rescued > 0, "the race was not exercised"
    assert [row for row in audit if row[1] == "completed"] == []
    completed = {j.id for j in final if j.status == JobStatus.COMPLETED}
    assert completed and len(completed) < len(ids) + 1
    for j in final:
        # A job a worker refused to start (its heartbeat was stale: the claim
        # may be lost) is handed back with its attempt not spent and the
        # hand-back noted; every other entry is one failed attempt.
        failures = [e for e in j.errors if e["error"] != UNSTARTED]
        if j.status == JobStatus.COMPLETED:
            assert len(failures) == j.attempt - 1, j.errors
            assert j.result == sleeps[ids.index(j.id)]
        else:
            assert j.attempt == 3 and len(failures) == 3, j.errors
    # The dead letters never held a job that completed.
    dead = {int(r[0]) for r in sql(jq, "SELECT id FROM jobkeeper_dead_letters")}
    assert not dead & completed
    assert running_count(jq) == 0


# -- each holder is judged by its own rescue_after ------------------------------------


def _silent_holder_of_a_job(jq, holder: str, window: float | None, silent_for: float) -> int:
    """Register ``holder`` (declaring ``window``), let it claim a new job and
    age its heartbeat by ``silent_for`` seconds; returns the job's id.
    """
    now = datetime.now(UTC)
    jq.backend.worker_register(worker=WorkerInfo(holder, "h", 1, ["default"], now, now, window))
    j = jq.enqueue("some_task", {})
    _claim_one(jq, holder)
    age_heartbeat(jq, holder, silent_for)
    return j.id


def test_a_rescuer_with_a_shorter_window_leaves_a_live_holders_jobs_alone(jq):
    # Workers with different settings share one database. The rescuer judged
    # every holder by its own rescue_after, so a holder that promised beats
    # within 30 s lost its jobs to a rescuer configured with 1 s after one
    # slow beat: two live holders. Now each holder is judged by the window
    # it declared when it registered.
    holder = "patient:1:aaaa"
    now = datetime.now(UTC)
    jq.backend.worker_register(worker=WorkerInfo(holder, "h", 1, ["default"], now, now, 30.0))
    j = jq.enqueue("some_task", {})
    held = _claim_one(jq, holder)
    age_heartbeat(jq, holder, 5)  # silent for 5 s: alive by its own 30 s
    assert jq.backend.job_rescue_candidates(rescue_after=1.0, limit=10) == []
    lost = failed_attempt(held, jq.settings, error="worker lost")
    assert jq.backend.job_fail_many(failures=[lost], stale_after=1.0) == set()
    assert jq.backend.worker_prune_stale(older_than=1.0) == 0
    assert job(jq, j.id).status == JobStatus.RUNNING
    assert [w.rescue_after for w in jq.workers()] == [30.0]

    age_heartbeat(jq, holder, 40)  # past its own window: rescued
    (candidate,) = jq.backend.job_rescue_candidates(rescue_after=1.0, limit=10)
    assert candidate.id == j.id
    # The row stays while the worker may still be alive (2 x its window)...
    assert jq.backend.worker_prune_stale(older_than=1.0) == 0
    assert jq.backend.job_fail_many(failures=[lost], stale_after=1.0) == {j.id}
    assert job(jq, j.id).status == JobStatus.RETRYABLE
    age_heartbeat(jq, holder, 70)
    assert jq.backend.worker_prune_stale(older_than=1.0) == 1  # ...and then goes


def test_a_holder_that_declared_no_window_is_judged_by_the_rescuers(jq):
    # Rows of workers from before the column existed hold NULL.
    job_id = _silent_holder_of_a_job(jq, "old:1:aaaa", None, 5)
    assert [c.id for c in jq.backend.job_rescue_candidates(rescue_after=1.0, limit=10)] == [job_id]
    assert jq.backend.job_rescue_candidates(rescue_after=10.0, limit=10) == []
    assert [w.rescue_after for w in jq.workers()] == [None]


def test_after_an_outage_each_holder_gets_its_own_window_again(jq):
    # After an outage every holder's last beat is old: a holder is judged only
    # once the database has been back for its own window (2 s here; the
    # rescuer's is 1 s). A live, patient worker (300 s) beside it delays
    # nothing (it did, when the rescuer waited for the longest window).
    holder = "quick:1:bbbb"
    now = datetime.now(UTC)
    jq.backend.worker_register(worker=WorkerInfo("patient:1:cccc", "h", 1, ["x"], now, now, 300.0))
    job_id = _silent_holder_of_a_job(jq, holder, 2.0, 5)
    rescuer = Rescuer(jq.backend, jq.settings, 0.1)
    rescuer._unreachable = True  # as after a DatabaseUnavailable in a pass
    back = time.monotonic()
    rescuer.run_once()
    assert rescuer.rescued == 0
    # The windows are measured on the rescuer's own clock from its return:
    # the time has to pass.
    time.sleep(max(0.0, back + 1.2 - time.monotonic()))
    rescuer.run_once()  # past the rescuer's own 1 s, not past the holder's 2 s
    assert rescuer.rescued == 0
    assert job(jq, job_id).status == JobStatus.RUNNING
    time.sleep(max(0.0, back + 2.1 - time.monotonic()))
    rescuer.run_once()
    assert rescuer.rescued == 1
    (error,) = job(jq, job_id).errors
    assert f"worker lost: {holder} sent no heartbeat for more than 2s" in error["error"]


def test_workers_that_declared_no_window_get_at_least_the_default(jq):
    # Rows of workers from before schema version 2 (NULL): during a rolling
    # upgrade such a worker is live with its own, unknown setting. A rescuer
    # configured with 1 s took its jobs within seconds; it now assumes at
    # least the default 60 s.
    holder = "old:1:dddd"
    job_id = _silent_holder_of_a_job(jq, holder, None, 5)
    rescuer = Rescuer(jq.backend, jq.settings, 0.1)
    rescuer.run_once()
    assert rescuer.rescued == 0 and rescuer.passes == 1
    age_heartbeat(jq, holder, 61)
    rescuer.run_once()
    assert rescuer.rescued == 1
    assert "no heartbeat for more than 60s" in job(jq, job_id).errors[0]["error"]


def test_workers_with_different_rescue_after_share_a_database(make_queue):
    # End to end: a worker whose heartbeats come every 2 s (rescue_after 30 s)
    # runs a 3 s job beside a worker whose rescuer uses 1 s and runs every
    # 0.25 s. The old rule rescued the job from under its live holder.
    patient = make_queue(heartbeat_interval=2.0, rescue_after=30.0)
    eager = make_queue()  # FAST: rescue_after 1 s
    runs: list[int] = []

    @patient.task(queue="long")
    def slow(n: int) -> int:
        runs.append(n)
        time.sleep(3)
        return n

    j = patient.enqueue("slow", {"n": 1})
    holder = patient.worker(queues=["long"], concurrency=1)
    other = eager.worker(queues=["default"], concurrency=1)
    with running(holder), running(other):
        wait_for(lambda: runs, what="the slow job to start")
        (done,) = wait_status(patient, [j.id], {JobStatus.COMPLETED, JobStatus.RETRYABLE})
        assert other.rescuer.passes >= 3, "the other worker's rescuer never ran"
    assert done.status == JobStatus.COMPLETED
    assert done.errors == [] and done.attempt == 1
    assert runs == [1]
    assert other.rescuer.rescued == 0


def test_a_job_lost_unstarted_again_and_again_still_reaches_the_dead_letters(jq):
    # A crash spends an attempt, in the end even an unstarted one: each holder
    # dies before the job's start mark is written (it was still in the
    # completer's buffer). The first losses
    # give the attempt back; after MAX_UNSTARTED_RETURNS of them, lost claims
    # spend attempts like lost running ones, so the job reaches the dead
    # letters after a bounded number of crashes.
    from jobkeeper.maintenance.rescuer import MAX_UNSTARTED_RETURNS

    j = jq.enqueue("some_task", {}, max_attempts=2)
    rescuer = Rescuer(jq.backend, jq.settings, 0.1)
    crashes = 0
    while job(jq, j.id).status != JobStatus.DEAD:
        assert crashes < 10, job(jq, j.id)
        wait_for(
            lambda: (
                jq.backend.job_stage_due().staged >= 0
                and job(jq, j.id).status == JobStatus.AVAILABLE
            ),
            what="the job to be due again",
        )
        holder = f"crash:{crashes}:dead"  # no worker row: silent from the start
        (claimed,) = jq.backend.job_claim(worker_id=holder, queue="default", limit=1)
        assert claimed.status == JobStatus.CLAIMED
        crashes += 1
        rescuer.run_once()
    assert crashes == MAX_UNSTARTED_RETURNS + 2
    dead = job(jq, j.id)
    assert dead.attempt == 2
    # The free returns spent nothing and left no errors entry (one per
    # failed attempt); the lost claims after them spent both attempts.
    assert [e["attempt"] for e in dead.errors] == [1, 2]
    assert all("worker lost" in e["error"] and "start" in e["error"] for e in dead.errors)


def test_a_claimed_job_of_a_lost_holder_goes_back_without_spending_its_attempt(jq):
    jobs = jq.enqueue_many([("some_task", {"i": i}, {"max_attempts": 1}) for i in range(3)])
    held = jq.backend.job_claim(worker_id="lost:1:aaaa", queue="default", limit=3)
    jq.backend.job_start_many(claims=[claim_of(held[0])])  # only the first had started
    Rescuer(jq.backend, jq.settings, 0.1).run_once()
    started, *prefetched = (job(jq, j.id) for j in jobs)
    assert started.status == JobStatus.DEAD  # its one attempt was spent
    for p in prefetched:
        assert (p.status, p.attempt, p.unstarted_returns, p.worker_id) == (
            JobStatus.AVAILABLE, 0, 1, None
        )  # fmt: skip
        assert p.errors == []  # nothing failed: errors holds failed attempts only


class _SteppedClock:
    """Wraps a backend: its database clock reads ``step`` seconds ahead, as
    after the server's clock stepped forward.
    """

    def __init__(self, inner) -> None:
        self._inner = inner
        self.step = 0.0

    def db_now(self):
        return self._inner.db_now() + timedelta(seconds=self.step)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_a_step_of_the_database_clock_rescues_no_live_holder(jq):
    # Break-test 104: the server's clock stepped +60 s five times (libfaketime)
    # while every worker ran: live holders looked silent until their next
    # beat, a rescuer pass fell in between, the same job ran on two workers
    # at once and was charged a crash. Here the step is what the rescuer's
    # database clock and the holder's heartbeat age both show.
    holder = "stepped:1:aaaa"
    job_id = _silent_holder_of_a_job(jq, holder, 2.0, 0)
    backend = _SteppedClock(jq.backend)
    rescuer = Rescuer(backend, jq.settings, 0.1)
    rescuer.run_once()  # the first reading of the clock
    backend.step = 60.0
    age_heartbeat(jq, holder, 60)
    rescuer.run_once()
    assert rescuer.rescued == 0
    stepped_at = time.monotonic()
    # Until the holder's whole window (2 s) has passed on the rescuer's own
    # clock, its silence proves nothing; it beats again meanwhile.
    now = datetime.now(UTC)
    beat = WorkerInfo(holder, "h", 1, ["default"], now, now, 2.0)
    jq.backend.worker_heartbeat(worker=beat)
    rescuer.run_once()
    assert rescuer.rescued == 0
    assert job(jq, job_id).status == JobStatus.RUNNING
    # A holder that really went silent is still rescued, a window later.
    age_heartbeat(jq, holder, 60)
    time.sleep(max(0.0, stepped_at + 2.1 - time.monotonic()))
    rescuer.run_once()
    assert rescuer.rescued == 1


def test_the_database_clock_in_step_with_ours_delays_no_rescue(jq):
    holder = "steady:1:aaaa"
    job_id = _silent_holder_of_a_job(jq, holder, 2.0, 0)
    rescuer = Rescuer(jq.backend, jq.settings, 0.1)
    rescuer.run_once()
    age_heartbeat(jq, holder, 60)
    rescuer.run_once()
    assert rescuer.rescued == 1
    assert job(jq, job_id).status in (JobStatus.RETRYABLE, JobStatus.AVAILABLE)


def test_a_worker_started_just_after_a_clock_step_takes_no_live_holders_job(jq):
    # Break-test 108: the server's clock stepped +100 s, and a worker started
    # at once took four jobs from two live workers in its first pass: a
    # rescuer's first reading of the clock has nothing to compare with. The
    # worker's rescuer settles first: no holder is judged until it has run
    # for the holder's window (2 s here).
    holder = "live:1:aaaa"
    job_id = _silent_holder_of_a_job(jq, holder, 2.0, 100)  # as the step shows it
    started = time.monotonic()
    rescuer = Rescuer(jq.backend, jq.settings, 0.1, settle_first=True)
    rescuer.run_once()
    assert rescuer.rescued == 0
    assert job(jq, job_id).status == JobStatus.RUNNING
    # Really silent: rescued once this rescuer has run for the window.
    time.sleep(max(0.0, started + 2.1 - time.monotonic()))
    rescuer.run_once()
    assert rescuer.rescued == 1
