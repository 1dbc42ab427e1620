"""Job logs, the first subscriber of the event seam: every outcome reaches
the ``jobkeeper`` logger at its level, with the job's facts on the record;
the start line; the JSON lines of ``jobkeeper worker --log-format json``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from jobkeeper import JobQueue, JobStatus, Retry
from jobkeeper.joblog import JsonFormatter
from support.waiting import wait_for, wait_status

from .helpers import running


def _job_records(caplog, job_id: int) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name == "jobkeeper" and getattr(r, "job_id", None) == job_id
    ]


def test_failures_and_dead_letters_are_warnings_with_the_jobs_facts(jq, caplog):
    caplog.set_level(logging.DEBUG, logger="jobkeeper")

    @jq.task(max_attempts=2)
    def breaks() -> None:
        raise ValueError("broken on purpose")

    @jq.task
    def works() -> int:
        return 1

    bad, good = breaks.enqueue(), works.enqueue()
    with running(jq.worker(concurrency=1)):
        wait_status(jq, [bad.id], {JobStatus.DEAD})
        wait_status(jq, [good.id], {JobStatus.COMPLETED})
        wait_for(lambda: any(getattr(r, "event", "") == "dead_lettered" for r in caplog.records))
        wait_for(
            lambda: any(getattr(r, "event", "") == "acked" for r in _job_records(caplog, good.id))
        )
    warnings = [r for r in _job_records(caplog, bad.id) if r.levelno == logging.WARNING]
    assert [(r.event, r.attempt) for r in warnings] == [  # type: ignore[attr-defined]
        ("finished", 1),
        ("finished", 2),
        ("dead_lettered", 2),
    ]
    for record in warnings:
        assert (record.task, record.queue) == ("breaks", "default")  # type: ignore[attr-defined]
        assert f"job {bad.id}" in record.getMessage()
    assert warnings[0].error == "ValueError: broken on purpose"  # type: ignore[attr-defined]
    assert "broken on purpose" in warnings[0].getMessage()
    assert "max_attempts=2 exhausted" in warnings[2].getMessage()
    # A success: its start and end at DEBUG only, the end with its duration.
    good_records = _job_records(caplog, good.id)
    assert {r.levelno for r in good_records} == {logging.DEBUG}
    finished = [r for r in good_records if r.event == "finished"]  # type: ignore[attr-defined]
    assert finished and finished[0].duration is not None  # type: ignore[attr-defined]
    assert any(r.event == "started" for r in good_records)  # type: ignore[attr-defined]


def test_a_retry_the_task_asked_for_is_info_not_a_failure(jq, caplog):
    # helper-67: a task raising Retry (the quickstart's file not there yet)
    # was logged as "failed (it will be retried)" at WARNING on each attempt.
    caplog.set_level(logging.DEBUG, logger="jobkeeper")

    @jq.task(max_attempts=2)
    def waits() -> None:
        raise Retry(delay=0, reason="not uploaded yet")

    job = waits.enqueue()
    with running(jq.worker(concurrency=1)):
        wait_status(jq, [job.id], {JobStatus.DEAD})
        wait_for(lambda: any(getattr(r, "event", "") == "dead_lettered" for r in caplog.records))
    finished = [r for r in _job_records(caplog, job.id) if r.event == "finished"]  # type: ignore[attr-defined]
    assert [(r.levelno, r.attempt) for r in finished] == [  # type: ignore[attr-defined]
        (logging.INFO, 1),
        (logging.WARNING, 2),  # no attempt left: a failure like any other
    ]
    # helper-84: "as its task asked in 0.000s" read as the delay, which no
    # line named: the delay is said, the run time is "ran".
    assert "will be retried in 0s, as its task asked (ran " in finished[0].getMessage()
    assert "not uploaded yet" in finished[0].getMessage()
    assert "failed (no retry left)" in finished[1].getMessage()


def test_each_event_is_logged_once_with_two_workers_on_one_queue(jq, caplog):
    caplog.set_level(logging.DEBUG, logger="jobkeeper")

    @jq.task
    def works() -> None:
        pass

    j = works.enqueue()
    with running(jq.worker(concurrency=1)), running(jq.worker(concurrency=1)):
        wait_status(jq, [j.id], {JobStatus.COMPLETED})
        wait_for(
            lambda: any(getattr(r, "event", "") == "acked" for r in _job_records(caplog, j.id))
        )
    events = [r.event for r in _job_records(caplog, j.id)]  # type: ignore[attr-defined]
    assert events == ["claimed", "started", "finished", "acked"]


def test_the_start_line_names_the_database_queues_and_settings(pg_url, caplog):
    caplog.set_level(logging.INFO, logger="jobkeeper.worker")
    url = pg_url.replace("postgresql://postgres@", "postgresql://postgres:s3cret@", 1)
    assert "s3cret" in url
    with JobQueue(url, poll_interval=0.05) as jq:
        jq.migrate()

        @jq.task(queue="mail")
        def send() -> None:
            pass

        handle = jq.worker(queues=["mail", "mial"], burst=True)
        handle.run()
    (start,) = [r.getMessage() for r in caplog.records if " started on " in r.getMessage()]
    assert "s3cret" not in caplog.text
    assert "postgres:***@" in start
    assert "queues=mail,mial" in start and "concurrency=10" in start
    assert "rescue_after=" in start and "poll_interval=0.05" in start
    unused = [
        r for r in caplog.records if r.levelno == logging.WARNING and "'mial'" in r.getMessage()
    ]
    assert len(unused) == 1 and "none of the app's tasks uses it" in unused[0].getMessage()
    assert not any(
        "'mail'" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
    )


def test_json_formatter_writes_one_object_a_line_with_the_job_fields():
    record = logging.LogRecord(
        "jobkeeper", logging.WARNING, __file__, 1, "%s", ("job 7 failed",), None
    )
    for name, value in {
        "job_id": 7,
        "task": "t",
        "queue": "q",
        "attempt": 2,
        "duration": 0.5,
        "error": "E: x\ny",
    }.items():
        setattr(record, name, value)
    line = JsonFormatter().format(record)
    assert "\n" not in line
    data = json.loads(line)
    assert data["level"] == "WARNING" and data["logger"] == "jobkeeper"
    assert data["message"] == "job 7 failed" and data["time"].endswith("+00:00")
    assert (data["job_id"], data["task"], data["queue"], data["attempt"]) == (7, "t", "q", 2)
    assert (data["duration"], data["error"]) == (0.5, "E: x\ny")


APP = """
from jobkeeper import JobQueue
jq = JobQueue()

@jq.task(max_attempts=1)
def explode() -> None:
    raise RuntimeError("kaboom")
"""


def test_cli_worker_log_format_json(db_url, tmp_path):
    (tmp_path / "jsonapp.py").write_text(APP)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "JOBKEEPER_DATABASE_URL": db_url}
    base = [sys.executable, "-m", "jobkeeper"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args], capture_output=True, text=True, timeout=120, env=env)

    assert run("migrate").returncode == 0
    assert run("enqueue", "explode", "--app", "jsonapp:jq").returncode == 0
    done = run("worker", "--app", "jsonapp:jq", "--burst", "--log-format", "json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert lines, done.stderr
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    failed = [line for line in lines if line.get("error") == "RuntimeError: kaboom"]
    assert failed and failed[0]["level"] == "WARNING" and failed[0]["task"] == "explode"
    assert failed[0]["queue"] == "default" and failed[0]["attempt"] == 1
    assert isinstance(failed[0]["job_id"], int) and failed[0]["duration"] >= 0
    assert (failed[0]["event"], failed[0]["outcome"]) == ("finished", "dead")
    # The worker the line came from, as its start line names it.
    (started,) = [line["message"] for line in lines if " started on " in line["message"]]
    assert started.startswith(f"worker {failed[0]['worker_id']} started on ")


def test_successes_build_no_event_for_the_log_unless_debug_is_on(caplog):
    # A busy worker's events are mostly successes, logged at DEBUG: with
    # DEBUG off the log asks for none, and the executor builds none.
    from jobkeeper import joblog
    from jobkeeper.events import EventBus, EventKind, JobEvent, OutcomeKind

    heard: list[JobEvent] = []
    for level, want_completed in ((logging.INFO, False), (logging.DEBUG, True)):
        caplog.set_level(level, logger="jobkeeper")
        bus = EventBus()
        uninstall = joblog.install(bus)
        try:
            assert bus.wants(EventKind.FINISHED)
            assert bus.wants_finished(OutcomeKind.RETRIED)
            assert bus.wants_finished(OutcomeKind.COMPLETED) is want_completed
        finally:
            uninstall()
        assert not bus.wants_finished(OutcomeKind.RETRIED)

    bus = EventBus()
    bus.subscribe(heard.append, [EventKind.FINISHED], outcomes=[OutcomeKind.DEAD])
    for outcome in (OutcomeKind.COMPLETED, OutcomeKind.DEAD):
        bus.emit(JobEvent(EventKind.FINISHED, 1, "t", "q", 1, None, at=0.0, outcome=outcome))
    assert [e.outcome for e in heard] == [OutcomeKind.DEAD]


def test_a_jobs_error_cannot_forge_a_log_line_or_reach_the_terminal(jq, caplog):
    # helper-77: an exception message with a newline wrote a second,
    # made-up log line in the text format, and an ESC recoloured the terminal.
    forged = (
        "oops\n2026-12-06 03:00:00,000 INFO jobkeeper: job 1 (inj) completed \x1b[31mRED\x85"
        "\u202egnp.exe\u2028\u200f\ufeff café 中文"
    )

    @jq.task(max_attempts=1)
    def inj() -> None:
        raise ValueError(forged)

    job = inj.enqueue()
    with caplog.at_level(logging.WARNING, logger="jobkeeper"), running(jq.worker()):
        wait_status(jq, [job.id], {JobStatus.DEAD})
    # Its failure and its move to the dead letters, each on one line.
    records = [r for r in caplog.records if f"job {job.id} (inj" in r.getMessage()]
    assert len(records) == 2
    for record in records:
        line = record.getMessage()
        for raw in ("\n", "\x1b", "\x85", "\u202e", "\u2028", "\u200f", "\ufeff"):
            assert raw not in line
        assert "café 中文" in line  # text that is only text stays as it is
        assert "oops\\n2026-12-06" in line and "\\x1b[31mRED\\x85\\u202egnp.exe\\u2028" in line
        # The JSON format's field keeps the text as it was, written as JSON
        # escapes (helper-79: C1 and U+202E went through ensure_ascii=False raw).
        assert record.error.endswith(forged)  # type: ignore[attr-defined]
        json_line = JsonFormatter().format(record)
        for raw in ("\n", "\x1b", "\x85", "\u202e", "\u2028"):
            assert raw not in json_line
        assert json.loads(json_line)["error"].endswith(forged)


@pytest.mark.parametrize(
    ("retry", "said"),
    [(Retry(delay=30), "will be retried in 30s,"), (Retry(), "will be retried with the task's")],
)
def test_a_retry_line_names_its_delay_and_the_run_time_apart(caplog, retry, said):
    # helper-84: "will be retried, as its task asked in 0.000s" read 0.000s
    # as the delay; the 30 s was on no line.
    from jobkeeper.events import EventKind, JobEvent, OutcomeKind
    from jobkeeper.joblog import log_event

    caplog.set_level(logging.INFO, logger="jobkeeper")
    event = JobEvent(
        kind=EventKind.FINISHED,
        job_id=7,
        task="resize",
        queue="images",
        attempt=1,
        worker_id="w",
        at=0.0,
        outcome=OutcomeKind.RETRIED,
        duration=0.0004,
        error="Retry: retry requested",
        exception=retry,
    )
    log_event(event)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "jobkeeper"]
    assert said in line and "as its task asked (ran 0.000s): Retry: retry requested" in line


def test_a_broken_log_stream_neither_stops_the_worker_nor_strands_its_job(jq, monkeypatch):
    # helper-81: a task closed sys.stderr; the next failure's log line raised
    # out of the logging call, the runner thread died before handing the
    # outcome on, and the job stayed running under a live heartbeat.
    import io

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    stream.close()
    logger = logging.getLogger("jobkeeper")
    logger.addHandler(handler)
    # Python's default, whatever another test left.
    monkeypatch.setattr(logging, "raiseExceptions", True)

    @jq.task(max_attempts=3)
    def breaks() -> None:
        raise RuntimeError("fails with its log stream closed")

    try:
        job = breaks.enqueue()
        with running(jq.worker(concurrency=1)):
            wait_status(jq, [job.id], {JobStatus.RETRYABLE, JobStatus.DEAD})
            assert not logging.raiseExceptions  # while a worker runs
    finally:
        logger.removeHandler(handler)
    assert logging.raiseExceptions  # as it was, once none runs
    failed = jq.get_job(job.id)
    assert failed is not None and "fails with its log stream closed" in failed.errors[0]["error"]


def test_a_log_handler_that_raises_from_emit_fails_neither_start_nor_stop(jq):
    # helper-85: a handler raising from emit (against logging's protocol)
    # failed the worker's start line, or made run_worker raise on its stop
    # line after a clean stop.
    class Raising(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            raise OSError("log server gone")

    handler = Raising()
    logger = logging.getLogger("jobkeeper.worker")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)

    @jq.task()
    def ok() -> int:
        return 1

    try:
        job = ok.enqueue()
        stats = jq.run_worker(concurrency=1, burst=True)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert stats == 0
    assert jq.get_job(job.id).status is JobStatus.COMPLETED
