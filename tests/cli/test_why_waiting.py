"""Issue 15, item 7: ``jobkeeper jobs show`` says why a job has not run, on
both backends: not due yet, its queue paused or at its concurrency or rate
limit, its serial key held by job N, claimed by worker W, no live worker
serving its queue, workers too old to obey queue settings.
"""

from __future__ import annotations

from datetime import UTC, datetime

from backends.helpers import claim, claim_of, complete
from jobkeeper import JobQueue
from jobkeeper.models import WorkerInfo
from support.cli import Cli
from support.db import is_pg, sql


def serve(jq: JobQueue, queue: str, worker_id: str = "w-live") -> None:
    """Register a live worker (of this version) serving ``queue``."""
    now = datetime.now(UTC)
    info = WorkerInfo(worker_id, "host", 1, [queue], now, now, rescue_after=60.0)
    jq.backend.worker_register(worker=info)


def why(cli: Cli, job_id: int) -> dict[str, str]:
    """``{code: message}`` of ``jobs show --json``'s ``waiting``."""
    return {r["code"]: r["message"] for r in cli.json("jobs", "show", str(job_id))["waiting"]}


def test_a_job_not_due_yet_says_until_when(cli, queue):
    serve(queue, "q")
    job = queue.enqueue("t", {}, queue="q", delay=3600)
    reasons = why(cli, job.id)
    assert list(reasons) == ["not_due"]
    assert "is not due until" in reasons["not_due"] and "(in 3" in reasons["not_due"]


def test_a_paused_queue(cli, queue):
    serve(queue, "q")
    job = queue.enqueue("t", {}, queue="q")
    queue.pause("q")
    reasons = why(cli, job.id)
    assert list(reasons) == ["paused"]
    assert "jobkeeper queues resume q" in reasons["paused"]
    # The table says it too.
    out = cli.ok("jobs", "show", str(job.id))
    assert "waiting" in out and "queue 'q' is paused" in out


def test_a_queue_at_its_concurrency_limit(cli, queue):
    queue.configure_queue("q", concurrency=1)
    first = queue.enqueue("t", {}, queue="q")
    second = queue.enqueue("t", {}, queue="q")
    assert [j.id for j in claim(queue, "q", worker_id="w-live")] == [first.id]
    serve(queue, "q")
    reasons = why(cli, second.id)
    assert list(reasons) == ["concurrency"]
    assert "1 of 1 jobs held" in reasons["concurrency"]
    # The held job itself is claimed by its worker.
    held = why(cli, first.id)
    assert list(held) == ["claimed"] and "worker w-live" in held["claimed"]


def test_a_queue_at_its_rate_limit(cli, queue):
    queue.configure_queue("q", rate_limit="1/h")
    first = queue.enqueue("t", {}, queue="q")
    second = queue.enqueue("t", {}, queue="q")
    (held,) = claim(queue, "q", worker_id="w-live")
    assert held.id == first.id
    complete(queue, held)
    serve(queue, "q")
    reasons = why(cli, second.id)
    assert list(reasons) == ["rate_limit"]
    assert "1/h" in reasons["rate_limit"] and "1 started" in reasons["rate_limit"]


def test_a_serial_key_held_by_another_job(cli, queue):
    first = queue.enqueue("t", {}, queue="q", serial_key="user:42")
    second = queue.enqueue("t", {}, queue="q", serial_key="user:42")
    assert [j.id for j in claim(queue, "q", worker_id="w-live")] == [first.id]
    serve(queue, "q")
    reasons = why(cli, second.id)
    assert list(reasons) == ["serial_key"]
    assert f"'user:42' is held by job {first.id}" in reasons["serial_key"]


def test_no_live_worker_serves_the_queue(cli, queue):
    job = queue.enqueue("t", {}, queue="q")
    serve(queue, "other")
    reasons = why(cli, job.id)
    assert list(reasons) == ["no_worker"]
    assert "no live worker serves queue 'q'" in reasons["no_worker"]
    # A registered worker that went silent does not count.
    serve(queue, "q", worker_id="w-gone")
    shift = "interval '600 seconds'" if is_pg(queue) else "600"
    sql(
        queue,
        f"UPDATE jobkeeper_workers SET heartbeat_at = heartbeat_at - {shift} WHERE id = ?",
        ["w-gone"],
    )
    reasons = why(cli, job.id)
    assert "(1 registered but silent)" in reasons["no_worker"]


def test_a_running_jobs_silent_holder_is_named(cli, queue):
    job = queue.enqueue("t", {}, queue="q")
    claim(queue, "q", worker_id="w-gone")
    shift = "interval '600 seconds'" if is_pg(queue) else "600"
    sql(
        queue,
        f"UPDATE jobkeeper_workers SET heartbeat_at = heartbeat_at - {shift} WHERE id = ?",
        ["w-gone"],
    )
    reasons = why(cli, job.id)
    assert list(reasons) == ["claimed", "holder_silent"]
    assert "worker w-gone has sent no heartbeat" in reasons["holder_silent"]


def test_workers_too_old_for_queue_settings(cli, queue):
    job = queue.enqueue("t", {}, queue="q")
    queue.configure_queue("q", max_pending=100)
    serve(queue, "q", worker_id="w-old")
    # As a worker from before versions were recorded left its row.
    sql(queue, "UPDATE jobkeeper_workers SET version = NULL WHERE id = ?", ["w-old"])
    reasons = why(cli, job.id)
    assert list(reasons) == ["old_workers"]
    assert "w-old" in reasons["old_workers"]


def test_a_due_job_with_a_live_worker_waits_its_turn(cli, queue):
    serve(queue, "q")
    jobs = [queue.enqueue("t", {}, queue="q") for _ in range(3)]
    reasons = why(cli, jobs[-1].id)
    assert list(reasons) == ["backlog"]
    assert "2 other available" in reasons["backlog"]


def test_every_worker_given_over_to_a_lone_attempt_is_named(cli, queue):
    # A crash suspect's lone attempt keeps its worker from claiming anything
    # else; "it starts once a worker has a free slot" was said while every
    # slot sat idle. Both stages count: waiting for the worker's other jobs
    # to end (claimed) and running alone.
    serve(queue, "q", worker_id="w-1")
    serve(queue, "q", worker_id="w-2")
    suspects = [queue.enqueue("t", {}, queue="q") for _ in range(2)]
    waiting = queue.enqueue("t", {}, queue="q")
    ids = [job.id for job in suspects]
    sql(queue, f"UPDATE jobkeeper_jobs SET run_alone = true WHERE id IN ({ids[0]}, {ids[1]})")
    (first,) = claim(queue, "q", limit=1, worker_id="w-1")
    assert queue.backend.job_start_alone(claim=claim_of(first))
    reasons = why(cli, waiting.id)
    assert list(reasons) == ["backlog"]  # w-2 claims as usual
    (second,) = claim(queue, "q", limit=1, worker_id="w-2")
    reasons = why(cli, waiting.id)
    assert list(reasons) == ["lone_attempt"]
    message = reasons["lone_attempt"]
    assert "every live worker serving queue 'q'" in message
    assert f"job {first.id} runs alone on worker w-1" in message
    assert f"job {second.id} waits to run alone on worker w-2" in message
    # The table says it too.
    assert "given over to a lone attempt" in cli.ok("jobs", "show", str(waiting.id))
    # Once a lone attempt ends its worker claims again.
    complete(queue, first)
    assert list(why(cli, waiting.id)) == ["backlog"]


def test_a_finished_job_has_no_reasons(cli, queue):
    job = queue.enqueue("t", {}, queue="q")
    (held,) = claim(queue, "q")
    complete(queue, held)
    assert cli.json("jobs", "show", str(job.id))["waiting"] == []
    assert "waiting" not in cli.ok("jobs", "show", str(job.id))
