"""Issue 15, item 6: the CLI conveniences, on both backends.

``jobs list --task/--worker/--after`` and its worker column; ``retry`` and
``cancel`` by filter with a count and a confirmation; ``--args @file`` and
``--args -``; ``enqueue --app`` with a misspelled task name (``--external``)
or keyword.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from backends.helpers import claim, kill, total_rows
from jobkeeper import JobQueue, JobStatus
from jobkeeper.models import Failure
from jobkeeper.outcomes import claim_of
from support.waiting import DEADLINE, wait_for


def ids(listed: list[dict]) -> list[int]:
    return [job["id"] for job in listed]


# -- jobs list ---------------------------------------------------------------------------


def test_jobs_list_filters_by_task_and_worker_and_pages_after_an_id(cli, queue):
    mails = [queue.enqueue("mail", {"n": i}, queue="q") for i in range(5)]
    other = queue.enqueue("resize", {}, queue="q")
    held = claim(queue, "q", limit=2, worker_id="w-7")  # the two oldest mails
    assert {job.id for job in held} == {mails[0].id, mails[1].id}

    assert ids(cli.json("jobs", "list", "--task", "mail")) == [j.id for j in reversed(mails)]
    assert ids(cli.json("jobs", "list", "--task", "resize")) == [other.id]
    assert ids(cli.json("jobs", "list", "--worker", "w-7")) == [mails[1].id, mails[0].id]
    assert cli.json("jobs", "list", "--worker", "w-nobody") == []

    # Keyset paging: each page continues below the last id of the one before.
    first = ids(cli.json("jobs", "list", "--task", "mail", "--limit", "2"))
    second = ids(
        cli.json("jobs", "list", "--task", "mail", "--limit", "2", "--after", str(first[-1]))
    )
    third = ids(
        cli.json("jobs", "list", "--task", "mail", "--limit", "2", "--after", str(second[-1]))
    )
    assert first + second + third == [j.id for j in reversed(mails)]

    # The table has a worker column. A full page with more after it says how
    # to get the next; the last page, full or not, offers none (helper-84).
    code, out, err = cli("jobs", "list", "--worker", "w-7", "--limit", "2")
    assert code == 0, err
    assert "┃ worker ┃" in out and out.count("w-7") == 2
    assert "--after" not in err
    code, out, err = cli("jobs", "list", "--task", "mail", "--limit", "2")
    assert code == 0 and f"more follow: add --after {mails[3].id} for the next page" in err
    code, out, err = cli(
        "jobs", "list", "--task", "mail", "--limit", "1", "--after", str(mails[1].id)
    )
    assert code == 0 and "--after" not in err and out.count("mail") == 1


def test_jobs_list_worker_filter_leaves_out_dead_letters(cli, queue):
    kill(queue, queue.enqueue("t", {}))
    assert len(cli.json("jobs", "list")) == 1
    assert cli.json("jobs", "list", "--worker", "w") == []


# -- retry / cancel by filter -------------------------------------------------------------


def test_retry_by_filter_counts_asks_and_retries(cli, queue):
    dead = [kill(queue, queue.enqueue("mail", {"n": i}, queue="q")) for i in range(3)]
    other = kill(queue, queue.enqueue("resize", {}, queue="q"))
    pending = queue.enqueue("mail", {}, queue="q")

    # "no" at the prompt: nothing changes.
    code, out, _ = cli("retry", "--task", "mail", input="n\n")
    assert "retry 3 jobs (status dead/retryable/cancelled, task mail)?" in out
    assert code == 130
    assert all(queue.get_job(j.id).status == JobStatus.DEAD for j in dead)

    out = cli.ok("retry", "--task", "mail", input="y\n")
    assert "retried 3 jobs" in out
    assert all(queue.get_job(j.id).status == JobStatus.AVAILABLE for j in dead)
    assert queue.get_job(other.id).status == JobStatus.DEAD
    assert queue.get_job(pending.id).status == JobStatus.AVAILABLE

    # --yes skips the question; nothing left to match says so.
    assert "retried 1 job" in cli.ok("retry", "--status", "dead", "--queue", "q", "--yes")
    assert queue.get_job(other.id).status == JobStatus.AVAILABLE
    assert "no jobs match" in cli.ok("retry", "--queue", "q", "--yes")


def test_cancel_by_filter_cancels_pending_and_asks_workers_of_held_jobs(cli, queue):
    jobs = [queue.enqueue("mail", {"n": i}, queue="q") for i in range(3)]
    elsewhere = queue.enqueue("mail", {}, queue="other")
    (held,) = claim(queue, "q", limit=1, worker_id="w-1")
    out = cli.ok("cancel", "--queue", "q", "--yes")
    assert "cancelled 2 jobs; asked the workers of 1 job to stop them" in out
    for job in jobs:
        after = queue.get_job(job.id)
        if job.id == held.id:
            assert after.status == JobStatus.CLAIMED and after.cancel_requested
        else:
            assert after.status == JobStatus.CANCELLED
    assert queue.get_job(elsewhere.id).status == JobStatus.AVAILABLE


def test_retry_by_filter_is_never_refused_by_max_pending(cli, queue):
    # Operator actions are never refused by a queue's backpressure.
    dead = [kill(queue, queue.enqueue("mail", {}, queue="q")) for _ in range(3)]
    queue.configure_queue("q", max_pending=1)
    queue.enqueue("mail", {}, queue="q")  # the queue is now full
    assert "retried 3 jobs" in cli.ok("retry", "--queue", "q", "--status", "dead", "--yes")
    assert all(queue.get_job(j.id).status == JobStatus.AVAILABLE for j in dead)


def test_retry_by_filter_moves_dead_letters_in_batches(cli, queue, monkeypatch):
    # Break-test: a filtered retry made two round trips per dead letter
    # (about 100 jobs/s: 17 minutes for 100k); they now move a batch a
    # statement. A unique_key in the way refuses its batch, whose other
    # jobs then go in one more statement.
    monkeypatch.setattr("jobkeeper.cli.actions.BATCH", 2)
    dead = [kill(queue, queue.enqueue("mail", {"n": i}, queue="q")) for i in range(4)]
    keyed = kill(queue, queue.enqueue("mail", {}, queue="q", unique_key="k"))
    holder = queue.enqueue("mail", {}, queue="q", unique_key="k")
    out = cli.ok("retry", "--queue", "q", "--status", "dead", "--yes")
    assert "retried 4 jobs; skipped 1 that changed state meanwhile" in out, out
    assert all(queue.get_job(j.id).status == JobStatus.AVAILABLE for j in dead)
    assert queue.get_job(keyed.id).status == JobStatus.DEAD
    assert queue.get_job(holder.id).status == JobStatus.AVAILABLE


def bury(jq: JobQueue, keys: list[str | None]) -> list[int]:
    """Dead letters of task ``mail`` in queue ``q``, one per key (None: no key)."""
    jobs = jq.enqueue_many(
        [
            ("mail", {"n": n}, {"queue": "q", "max_attempts": 1, "unique_key": key})
            for n, key in enumerate(keys)
        ]
    )
    assert len(jobs) == len(keys)
    claimed = jq.backend.job_claim(worker_id="w-1", queue="q", limit=len(keys))
    failures = [Failure(claim_of(job), "dead", '{"error": "boom"}') for job in claimed]
    assert jq.backend.job_fail_many(failures=failures) == {job.id for job in jobs}
    return [job.id for job in jobs]


def count_calls(monkeypatch, *names: str) -> dict[str, int]:
    calls = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(JobQueue, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(JobQueue, name, counted)
    return calls


def test_a_batch_of_dead_letters_skips_only_those_whose_key_clashes(cli, queue, monkeypatch):
    # Break-test: one clash sent its whole batch of 1,000 one by one (two
    # round trips a job). Now the clashing ones are left out and the rest
    # move in one more statement.
    plain = bury(queue, [None] * 25)
    held = bury(queue, ["k1", "k2"])
    free = bury(queue, ["k3", "twin"])
    (twin,) = bury(queue, ["twin"])  # a dead letter of the same key as one above
    holders = [queue.enqueue("mail", {}, queue="q", unique_key=key).id for key in ("k1", "k2")]
    calls = count_calls(monkeypatch, "requeue_dead", "retry")
    out = cli.ok("retry", "--queue", "q", "--status", "dead", "--yes")
    assert "retried 27 jobs; skipped 3 that changed state meanwhile" in out, out
    assert calls == {"requeue_dead": 2, "retry": 0}
    for job_id in plain + free + holders:
        assert queue.get_job(job_id).status == JobStatus.AVAILABLE
    for job_id in (*held, twin):
        assert queue.get_job(job_id).status == JobStatus.DEAD


def test_a_batch_refused_again_and_again_goes_one_by_one(cli, queue, monkeypatch):
    # Each statement finds a key taken since the clashes were looked up (a
    # concurrent enqueue): after DEAD_TRIES statements, one by one.
    from jobkeeper.cli.actions import DEAD_TRIES

    keys = [f"k{n}" for n in range(DEAD_TRIES + 3)]
    dead = bury(queue, keys)
    queue.enqueue("mail", {}, queue="q", unique_key="k0")
    calls = count_calls(monkeypatch, "retry")
    real = JobQueue.requeue_dead
    taken = iter(keys[1:])

    def requeue_after_an_enqueue(self, job_ids=None):
        calls["requeue_dead"] = calls.get("requeue_dead", 0) + 1
        if calls["requeue_dead"] > 1:
            self.enqueue("mail", {}, queue="q", unique_key=next(taken))
        return real(self, job_ids)

    monkeypatch.setattr(JobQueue, "requeue_dead", requeue_after_an_enqueue)
    out = cli.ok("retry", "--queue", "q", "--status", "dead", "--yes")
    assert f"retried 3 jobs; skipped {DEAD_TRIES} that changed state" in out, out
    assert calls == {"requeue_dead": DEAD_TRIES, "retry": 3}
    statuses = [queue.get_job(job_id).status for job_id in dead]
    assert statuses == [JobStatus.DEAD] * DEAD_TRIES + [JobStatus.AVAILABLE] * 3


def test_requeue_all_names_a_few_ids_not_every_one(cli, queue):
    dead = [kill(queue, queue.enqueue("mail", {"n": i}, queue="q")) for i in range(23)]
    out = cli.ok("dead", "requeue", "--all", "--yes").strip()
    assert out.startswith("requeued 23 jobs: ") and out.endswith(" and 3 more"), out
    assert len(out.split(": ")[1].split(" and ")[0].split()) == 20
    assert all(queue.get_job(j.id).status == JobStatus.AVAILABLE for j in dead)


def test_an_interrupted_filter_says_how_far_it_got(cli, queue, monkeypatch):
    # Break-test: Ctrl-C printed only "error: aborted", not what was done.
    jobs = [queue.enqueue("mail", {"n": i}, queue="q") for i in range(3)]
    calls = []
    cancel_many = type(queue.backend).job_cancel_many

    def cancel_then_interrupt(self, *, job_ids):
        calls.append(job_ids)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return cancel_many(self, job_ids=job_ids)

    monkeypatch.setattr("jobkeeper.cli.actions.BATCH", 1)
    monkeypatch.setattr(type(queue.backend), "job_cancel_many", cancel_then_interrupt)
    code, out, _ = cli("cancel", "--queue", "q", "--yes")
    assert code == 130
    said = "interrupted after 1 of 3 jobs: cancelled 1 job (and perhaps up to 1 more: the step"
    assert said in out, out
    assert "the same command selects what is left" in out, out
    statuses = sorted(queue.get_job(j.id).status.value for j in jobs)
    assert statuses == ["available", "available", "cancelled"]


def test_a_filtered_cancel_goes_a_batch_at_a_time_and_counts_held_jobs_apart(
    cli, queue, monkeypatch
):
    # One by one, 50,000 cancels took 35 s (break-test 106): two round trips
    # a job. Batches of BATCH (2 here), pending jobs cancelled, held ones
    # flagged for their workers, finished ones skipped.
    jobs = [queue.enqueue("mail", {"n": i}, queue="q") for i in range(5)]
    held = queue.backend.job_claim(worker_id="holder:1:aaaa", queue="q", limit=1)
    assert len(held) == 1
    statements: list[list[int]] = []
    cancel_many = type(queue.backend).job_cancel_many

    def counted(self, *, job_ids):
        statements.append(list(job_ids))
        return cancel_many(self, job_ids=job_ids)

    def no_one_by_one(self, job_id):
        raise AssertionError("cancelled one by one")

    monkeypatch.setattr("jobkeeper.cli.actions.BATCH", 2)
    monkeypatch.setattr(type(queue.backend), "job_cancel_many", counted)
    monkeypatch.setattr(JobQueue, "cancel", no_one_by_one)
    code, out, err = cli("cancel", "--queue", "q", "--yes")
    assert code == 0, err
    assert "cancelled 4 jobs; asked the workers of 1 job to stop them" in out, out
    assert sorted(len(batch) for batch in statements) == [1, 2, 2]
    after = {j.id: queue.get_job(j.id) for j in jobs}
    assert sum(job.status == JobStatus.CANCELLED for job in after.values()) == 4
    (flagged,) = [job for job in after.values() if job.status != JobStatus.CANCELLED]
    assert flagged.id == held[0].id and flagged.cancel_requested


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["retry"], "give a job id, or select jobs"),
        (["retry", "1", "--queue", "q"], "not both"),
        (["cancel"], "give a job id, or select jobs"),
        (["retry", "--status", "running"], "use one of dead, retryable, cancelled, completed"),
        (["cancel", "--status", "dead"], "use one of scheduled"),
    ],
)
def test_retry_and_cancel_refuse_unclear_selections(cli, queue, args, needle):
    queue.enqueue("t", {})
    code, _, err = cli(*args)
    assert code == 2, err
    assert err.startswith("error: ") and needle in err and len(err.strip().splitlines()) == 1
    assert queue.get_job(1).status == JobStatus.AVAILABLE


# -- --args from a file or stdin ----------------------------------------------------------


def test_args_from_a_file_and_from_stdin(cli, queue, tmp_path):
    (tmp_path / "args.json").write_text('{"to": "ann@example.com", "n": 2}', encoding="utf-8")
    job_id = int(cli.ok("enqueue", "mail", "--args", f"@{tmp_path / 'args.json'}"))
    assert queue.get_job(job_id).args == {"to": "ann@example.com", "n": 2}
    job_id = int(cli.ok("enqueue", "mail", "--args", "-", input='{"from": "stdin"}\n'))
    assert queue.get_job(job_id).args == {"from": "stdin"}


@pytest.mark.parametrize(
    ("value", "stdin", "needle"),
    [
        ("@/no/such/file.json", None, "cannot read '/no/such/file.json'"),
        ("@", None, "give a file name after @"),
        ("-", "[1, 2]", "must be a JSON object"),
        ("-", "{nope", "not valid JSON"),
    ],
)
def test_bad_args_from_a_file_or_stdin_exit_2(cli, queue, value, stdin, needle):
    code, _, err = cli("enqueue", "mail", "--args", value, input=stdin)
    assert code == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert total_rows(queue) == 0


def test_args_from_an_endless_file_or_stdin_are_read_only_up_to_the_limit(cli, queue, tmp_path):
    # Found by a break-test: --args @/dev/zero read until 5 GB of memory.
    # The text is read up to 4x max_payload_bytes (1 MiB here), never whole.
    code, _, err = cli("enqueue", "mail", "--args", "@/dev/zero")
    assert code == 2 and "holds more than 4194304 bytes" in err, err
    assert "max_payload_bytes=1048576" in err
    big = '{"pad": "' + "x" * (4 << 20) + '"}'
    code, _, err = cli("enqueue", "mail", "--args", "-", input=big)
    assert code == 2 and "stdin holds more than 4194304 bytes" in err, err
    indented = tmp_path / "indented.json"  # 3 MiB of spaces, tiny args
    indented.write_text("{" + " " * (3 << 20) + '"a": 1}', encoding="utf-8")
    job_id = int(cli.ok("enqueue", "mail", "--args", f"@{indented}"))
    assert queue.get_job(job_id).args == {"a": 1}
    assert total_rows(queue) == 1


# -- misspelled task names and keywords with --app ---------------------------------------

APP = """
from jobkeeper import JobQueue

jq = JobQueue()


@jq.task(queue="hooks")
def send_webhook(url: str, retries: int = 3) -> None: ...


@jq.task
def resize(path: str) -> None: ...
"""


@pytest.fixture
def app(tmp_path, monkeypatch) -> str:
    (tmp_path / "hookapp.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "hookapp:jq"


def test_enqueue_suggests_the_close_task_name_and_external_enqueues_anyway(cli, queue, app):
    code, out, err = cli("enqueue", "send_webhok", "--app", app)
    assert code == 2 and out == ""
    assert "no task 'send_webhok' (did you mean 'send_webhook'?)" in err
    assert "--external" in err and len(err.strip().splitlines()) == 1
    assert total_rows(queue) == 0
    job_id = int(cli.ok("enqueue", "billing_sync", "--app", app, "--external"))
    assert queue.get_job(job_id).task == "billing_sync"


def test_enqueue_names_a_misspelled_keyword(cli, queue, app):
    code, _, err = cli("enqueue", "send_webhook", "--app", app, "--args", '{"ulr": "https://x"}')
    assert code == 2
    assert "unexpected keyword argument 'ulr' (did you mean 'url'?)" in err
    assert "missing 'url'" in err and len(err.strip().splitlines()) == 1
    assert total_rows(queue) == 0


# -- Ctrl-C -------------------------------------------------------------------------------


def test_the_first_ctrl_c_says_a_second_forces_the_stop(db_url, tmp_path):
    (tmp_path / "idleapp.py").write_text(
        "from jobkeeper import JobQueue\n\njq = JobQueue()\n\n\n@jq.task\ndef t() -> None: ...\n"
    )
    with JobQueue(db_url) as jq:
        jq.migrate()
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jobkeeper",
                "--database",
                db_url,
                "worker",
                "--app",
                "idleapp:jq",
            ],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(jq.workers, what="the worker to register")
            worker.send_signal(signal.SIGINT)
            _, err = worker.communicate(timeout=DEADLINE)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.communicate()
    assert worker.returncode == 0, err
    assert "SIGINT: stopping" in err
    assert "Ctrl-C again forces the stop" in err


def test_a_filter_with_no_answer_on_stdin_asks_for_yes(cli, queue):
    job = kill(queue, queue.enqueue("mail", {}, queue="q"))
    code, _, err = cli("retry", "--task", "mail", input="")
    assert code == 2
    assert err.count("\n") == 1 and "no answer on stdin" in err and "--yes" in err
    assert queue.get_job(job.id).status == JobStatus.DEAD


@pytest.mark.parametrize(
    ("command", "question"),
    [
        (("dead", "purge", "--all"), "delete every dead letter for good?"),
        (
            ("dead", "purge", "--older-than", "0"),
            "delete the dead letters that died more than 0 s ago for good?",
        ),
        (("dead", "requeue", "--all"), "requeue every dead letter?"),
    ],
)
def test_dead_letters_in_bulk_ask_first(cli, queue, command, question):
    # helper-67: `dead purge --all` deleted for good without asking, where
    # `retry --status dead` asks.
    job = kill(queue, queue.enqueue("mail", {}, queue="q"))
    code, _, err = cli(*command, input="")
    assert code == 2 and err.count("\n") == 1
    assert question in err and "no answer on stdin: pass --yes" in err
    code, out, _ = cli(*command, input="n\n")
    assert code == 130 and question in out
    assert queue.get_job(job.id).status == JobStatus.DEAD
    code, out, _ = cli(*command, input="y\n")
    assert code == 0 and ("deleted 1 dead letter" in out or f"requeued 1 job: {job.id}" in out)
    assert queue.get_job(job.id) is None or queue.get_job(job.id).status == JobStatus.AVAILABLE


def test_dead_letters_by_id_do_not_ask(cli, queue):
    job = kill(queue, queue.enqueue("mail", {}, queue="q"))
    assert f"requeued 1 job: {job.id}" in cli.ok("dead", "requeue", str(job.id), input="")
