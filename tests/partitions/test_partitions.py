"""Partitions, not only crashes (PostgreSQL: SQLite has no network).

Three worker processes run as "hosts" in network namespaces of their own
(:mod:`benchmarks.soak.netns`: a veth pair each, a private /30), reaching a
private PostgreSQL server over their veth. One host is cut off while it holds
jobs, both ways, only outgoing or only incoming (iptables DROP inside its
namespace: silent, as a partition is), for well over ``rescue_after``, then
healed. From the recorded history (the soak's checker and execution logs):

- the cut-off worker's jobs are rescued, and only its jobs, and the other
  workers complete them;
- it starts no job once it cannot prove it holds its claims (its heartbeat
  older than ``rescue_after / 2``) until the heal;
- after the heal its late acks are refused (fenced: "claim lost") and it
  carries on, starting and completing new jobs;
- nothing is lost, and no two live executions of a job overlapped unless the
  first holder had been silent past ``rescue_after``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from benchmarks.soak import instrument, netns
from benchmarks.soak.faults import Workers
from benchmarks.soak.history import (
    Event,
    Expected,
    History,
    check,
    deaths_by_pid,
    read_exec_logs,
    rescues_of,
)
from benchmarks.soak.pg import PrivatePostgres

from jobkeeper import JobQueue
from support.settings import FAST, soak_env
from support.waiting import wait_for

pytestmark = pytest.mark.slow

#: Six beats per rescue window; a holder stops starting jobs after 0.75 s
#: without an acknowledged beat.
SETTINGS: dict[str, Any] = {
    **FAST,
    "heartbeat_interval": 0.25,
    "rescue_after": 1.5,
    "max_backoff": 0.1,
    "shutdown_grace": 10.0,
}
RESCUE_AFTER = SETTINGS["rescue_after"]
FRESH_FOR = RESCUE_AFTER / 2
#: A start already past its last check when the beat went stale may log a
#: moment later on a loaded machine.
START_SLACK = 1.0
CUT_FOR = 2.5 * RESCUE_AFTER
LONG_MS = 6000  # the victim's running jobs: running when the cut comes, ending during it
WORKERS = 3
VICTIM = 0


@pytest.fixture(scope="module")
def lab() -> Iterator[tuple[netns.Hosts, PrivatePostgres]]:
    """Three hosts and a private PostgreSQL listening on their gateways."""
    why_not = netns.available()
    assert why_not is None, f"network namespaces unavailable: {why_not}"
    with netns.Hosts(WORKERS) as hosts:
        pg = PrivatePostgres(listen=hosts.gateways, trusted=hosts.subnets)
        try:
            pg.init()
            yield hosts, pg
        finally:
            pg.cleanup()


def _starts(log_dir: Path, worker: str | None = None) -> list[Event]:
    events, _ = read_exec_logs(log_dir)
    return [e for e in events if e.kind == "S" and (worker is None or e.worker == worker)]


def _worker_of(log_dir: Path, pid: int) -> str | None:
    for event in _starts(log_dir):
        if event.worker.split(":")[-2] == str(pid):
            return event.worker
    return None


@pytest.mark.parametrize("cut", netns.CUTS)
def test_a_cut_off_host_loses_its_jobs_and_is_fenced_after_the_heal(lab, cut, tmp_path):
    hosts, pg = lab
    database = f"part_{cut}"
    with psycopg.connect(pg.url_at("127.0.0.1", "postgres"), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {database}")
        conn.execute(f"CREATE DATABASE {database}")
    url = pg.url_at("127.0.0.1", database)
    jq = JobQueue(url, **SETTINGS)
    jq.migrate()
    instrument.install(url)
    log_dir = tmp_path / "exec"
    log_dir.mkdir()
    env = {**soak_env(SETTINGS), "SOAK_LOG_DIR": str(log_dir)}
    # A fixed prefetch: the victim holds claimed jobs waiting for a slot
    # when it is cut off, and slots free up during the cut.
    workers = Workers(
        url, WORKERS, 3, ["default"], env, tmp_path, hosts=hosts, extra_args=["--prefetch", "3"]
    )
    enqueued: dict[int, Expected] = {}
    tokens = iter(range(1, 10**6))

    def enqueue(count: int, ms: float) -> None:
        batch = [("soak.work", {"n": next(tokens), "ms": ms}, {}) for _ in range(count)]
        for job, (_, args, _) in zip(jq.enqueue_many(batch), batch, strict=True):
            enqueued[job.id] = Expected(args["n"], "ok")

    host = hosts[VICTIM]
    try:
        # The victim first, alone: it claims its fill (3 slots + a prefetch
        # of 3), so it runs the long jobs and holds the short ones ready.
        workers.start(VICTIM)
        enqueue(3, LONG_MS)
        enqueue(3, 100)
        victim_pid = workers.pids()[VICTIM]
        victim = wait_for(lambda: _worker_of(log_dir, victim_pid), what="the victim's first start")

        def holds() -> dict[str, set[int]]:
            jobs = [jq.get_job(job_id) for job_id in enqueued]
            held: dict[str, set[int]] = {"claimed": set(), "running": set()}
            for job in jobs:
                if job is not None and job.worker_id == victim and job.status.value in held:
                    held[job.status.value].add(job.id)
            return held

        wait_for(
            lambda: (h := holds())["claimed"] and h["running"],
            what="the victim to hold running and claimed jobs",
            every=0.05,
        )
        others = [slot for slot in range(WORKERS) if slot != VICTIM]
        for slot in others:
            workers.start(slot)
        enqueue(30, 100)
        wait_for(
            lambda: len({e.worker for e in _starts(log_dir)}) == WORKERS,
            what="every worker to start a job",
        )
        # Cut while it holds jobs: running, and claimed ahead (not started).
        holding = holds()
        assert holding["claimed"] and holding["running"], holding
        host.cut(cut)
        cut_at = time.time()
        held = holding["claimed"] | holding["running"]
        running = {e.job for e in _starts(log_dir, victim)}

        def rescued() -> bool:
            return all(
                (job := jq.get_job(job_id)) is not None and job.worker_id != victim
                for job_id in held
            )

        wait_for(rescued, timeout=30, what=f"the rescue of {sorted(held)}", every=0.1)
        # The victim's tasks that were running end during the cut: their
        # outcomes wait for the network.
        wait_for(
            lambda: {e.job for e in read_exec_logs(log_dir)[0] if e.kind == "E"} >= running,
            timeout=30,
            what="the victim's running tasks to end",
            every=0.1,
        )
        # The cut lasts CUT_FOR in all (a fault's length, not a wait for a result).
        time.sleep(max(0.0, cut_at + CUT_FOR - time.time()))
        host.heal()
        healed_at = time.time()
        assert workers.alive() == WORKERS, "a worker exited during the cut"

        # It carries on: new work, and the victim starts some of it.
        def victim_started_again() -> bool:
            if not any(e.t > healed_at for e in _starts(log_dir, victim)):
                enqueue(6, 50)
                return False
            return True

        wait_for(victim_started_again, timeout=40, what="the victim to start jobs again", every=1)
        # Its late acks were refused.
        victim_log = next(tmp_path.glob(f"worker-{VICTIM}-*.log"))
        wait_for(
            lambda: "claim lost before its outcome was written" in victim_log.read_text(),
            timeout=30,
            what="a fenced late ack in the victim's log",
            every=0.1,
        )
        wait_for(
            lambda: all(
                (job := jq.get_job(job_id)) is not None and job.status.value == "completed"
                for job_id in enqueued
            ),
            timeout=60,
            what="every job completed",
            every=0.2,
        )
    finally:
        host.heal()
        codes = workers.stop_all(timeout=30)
        jq.close()
    logs = "\n".join(p.read_text(errors="replace") for p in workers.logs())
    assert all(code == 0 for code in codes.values()), (codes, logs)

    rows, heartbeats, acks = instrument.read_state(url)
    events, bad_lines = read_exec_logs(log_dir)
    first_seen: dict[str, float] = {}
    for event in events:
        first_seen[event.worker] = min(first_seen.get(event.worker, event.t), event.t)
    history = History(
        rescue_after=RESCUE_AFTER,
        enqueued=enqueued,
        ambiguous={},
        rows=rows,
        events=events,
        heartbeats=heartbeats,
        acks=acks,
        deaths=deaths_by_pid(first_seen, [(p, 0.0, None) for p in workers.pids().values()]),
        bad_log_lines=bad_lines,
    )
    report = check(history)
    assert report.ok, "\n".join(str(v) for v in report.violations)
    assert report.stats["lost"] == 0
    assert report.stats["duplicates"] == 0

    # Only the victim's jobs were rescued, all of those it held at the cut,
    # after it had been silent past rescue_after; others completed them.
    rescues = [r for row in rows for r in rescues_of(row)]
    rescued_ids = {r.job for r in rescues} | {
        a.job for a in acks if a.new_status == "available" and a.worker == victim
    }
    assert {r.worker for r in rescues} <= {victim}, rescues
    assert held <= rescued_ids, (held, rescues)
    assert all(r.at >= cut_at + RESCUE_AFTER - 0.5 for r in rescues), (cut_at, rescues)
    by_id = {row.id: row for row in rows}
    assert any(by_id[j].result["worker"] != victim for j in held), [by_id[j] for j in held]

    # No start by the victim from the moment it could no longer prove its
    # claims until the heal; starts again after it.
    victim_starts = [e.t for e in events if e.kind == "S" and e.worker == victim]
    blind = [t for t in victim_starts if cut_at + FRESH_FOR + START_SLACK < t < healed_at]
    assert not blind, (cut_at, healed_at, blind)
    # ... though slots freed in that spell, with jobs it had claimed waiting.
    ends = [e.t for e in events if e.kind == "E" and e.worker == victim]
    assert any(cut_at + FRESH_FOR + START_SLACK < t < healed_at for t in ends), (cut_at, ends)
    started_in_cut = {
        e.job for e in events if e.kind == "S" and e.worker == victim and cut_at < e.t < healed_at
    }
    assert not started_in_cut & holding["claimed"], (holding, started_in_cut)
    assert any(t > healed_at for t in victim_starts)
    # Its late acks were refused: nothing it ran for a rescued attempt was
    # recorded as the outcome (the checker's completions check), and it said so.
    assert "claim lost before its outcome was written" in logs
    assert "Traceback" not in logs
