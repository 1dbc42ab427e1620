"""Registering periodic jobs: the three forms, and every refusal (a
ConfigError naming the input, raised at registration, nothing stored).
"""

from __future__ import annotations

import os

import pytest

from jobkeeper import ConfigError, JobQueue, Schedule
from jobkeeper.periodic import Periodic


@pytest.fixture
def app(tmp_path) -> JobQueue:
    # Registration touches no database: the file is never created.
    return JobQueue(f"sqlite:///{tmp_path / 'unused.db'}")


def test_decorator_above_task_uses_the_task_and_its_defaults(app):
    @app.periodic("0 3 * * *", timezone="Europe/Berlin", args={"kind": "daily"}, name="nightly")
    @app.task(queue="reports", priority=5, max_attempts=3)
    def report(kind: str) -> None: ...

    assert report.name == "report"  # the decorator hands the Task back
    periodic = app.periodics["nightly"]
    assert periodic.schedule == Schedule("0 3 * * *", timezone="Europe/Berlin")
    assert (periodic.task, periodic.args, periodic.args_json) == (
        "report",
        {"kind": "daily"},
        '{"kind":"daily"}',
    )
    assert (periodic.queue, periodic.priority, periodic.max_attempts) == ("reports", 5, 3)
    assert periodic.catch_up == 60.0
    assert not os.path.exists(app.url.path)


def test_call_forms_and_option_overrides(app):
    @app.task
    def cleanup() -> None: ...

    cron = app.periodic("*/15 * * * *", task="cleanup", queue="low", priority=-1, catch_up=0)
    interval = app.periodic(every=30, task="poll_feeds", max_attempts=2)  # registered elsewhere
    assert isinstance(cron, Periodic) and isinstance(interval, Periodic)
    assert (cron.name, cron.queue, cron.priority, cron.catch_up) == ("cleanup", "low", -1, 0.0)
    assert (interval.name, interval.task, interval.schedule.every) == (
        "poll_feeds",
        "poll_feeds",
        30,
    )
    # An unregistered task gets the enqueue defaults.
    assert (interval.queue, interval.priority, interval.max_attempts) == ("default", 0, 2)
    assert sorted(app.periodics) == ["cleanup", "poll_feeds"]


def test_thirty_periodics_register(app):
    for i in range(30):
        app.periodic(every=1 + i, task=f"t{i}")
    assert len(app.periodics) == 30


@pytest.mark.parametrize(
    ("call", "needles"),
    [
        (lambda a: a.periodic("61 * * * *", task="t"), ["'t'", "61 * * * *"]),
        (lambda a: a.periodic("* * *", task="t"), ["'t'", "five fields"]),
        (lambda a: a.periodic("@fortnightly", task="t"), ["@fortnightly"]),
        (lambda a: a.periodic("0 3 * * *", timezone="Mars/Olympus", task="t"), ["Mars/Olympus"]),
        (lambda a: a.periodic(every=0, task="t"), ["every", "0"]),
        (lambda a: a.periodic(every=1.5, task="t"), ["every", "1.5"]),
        (lambda a: a.periodic(every=30, timezone="Europe/Berlin", task="t"), ["Europe/Berlin"]),
        (lambda a: a.periodic("* * * * *", every=30, task="t"), ["not both"]),
        (lambda a: a.periodic(task="t"), ["either"]),
        (lambda a: a.periodic("* * * * *", task="t", catch_up=-1), ["catch_up", "-1"]),
        (lambda a: a.periodic("* * * * *", task="t", catch_up=float("nan")), ["catch_up"]),
        (lambda a: a.periodic("* * * * *", task="t", queue="bad queue"), ["queue", "bad queue"]),
        (lambda a: a.periodic("* * * * *", task="t", priority=2**40), ["priority"]),
        (lambda a: a.periodic("* * * * *", task="t", max_attempts=0), ["max_attempts"]),
        (lambda a: a.periodic("* * * * *", task="bad name"), ["bad name"]),
        (lambda a: a.periodic("* * * * *", task="t", name=""), ["periodic name"]),
        (lambda a: a.periodic("* * * * *", task="t", args={"x": float("nan")}), ["args.x", "NaN"]),
        (lambda a: a.periodic("* * * * *", task="t", args=["x"]), ["args", "JSON object"]),
        (lambda a: a.periodic("* * * * *", task="t", args={"s": "\x00"}), ["args.s", "NUL"]),
        (lambda a: a.periodic("* * * * *", task="t", retries=3), ["retries", "valid options"]),
        (lambda a: a.periodic("* * * * *", task=42), ["task", "42"]),
    ],
)
def test_refusals_name_the_input(app, call, needles):
    with pytest.raises(ConfigError) as info:
        call(app)
    for needle in needles:
        assert needle in str(info.value), str(info.value)
    assert len(app.periodics) == 0


def test_args_are_checked_against_the_task(app):
    @app.task
    def report(kind: str) -> None: ...

    with pytest.raises(ConfigError, match=r"'report'.*missing a required argument: 'kind'"):
        app.periodic("* * * * *", task=report)
    with pytest.raises(ConfigError, match="unexpected keyword argument 'colour'"):
        app.periodic("* * * * *", task="report", args={"kind": "a", "colour": 1})
    with pytest.raises(ConfigError, match=r"args.*exceeds max_payload_bytes"):
        JobQueue(app.url.url, max_payload_bytes=10).periodic(
            "* * * * *", task="t", args={"x": "y" * 20}
        )


def test_a_second_periodic_with_the_same_name_is_refused(app):
    @app.periodic("0 * * * *")
    @app.task
    def sync() -> None: ...

    with pytest.raises(ConfigError, match="periodic named 'sync' is already registered"):
        app.periodic("30 * * * *", task="sync")
    # A name tells them apart.
    app.periodic("30 * * * *", task="sync", name="sync-half-past")
    assert sorted(app.periodics) == ["sync", "sync-half-past"]


def test_decorator_on_a_plain_function_says_where_it_goes(app):
    with pytest.raises(ConfigError, match=r"put it above @jq.task\(\)"):

        @app.periodic("0 * * * *")
        def plain() -> None: ...


def test_the_call_form_used_as_a_decorator_says_task_is_for_the_call_form(app):
    """Break-test: ``@jq.periodic(every=2, task="tick")`` above a function
    raised "TypeError: 'Periodic' object is not callable"."""
    with pytest.raises(ConfigError) as err:

        @app.periodic(every=2, task="tick")
        def tick() -> None: ...

    message = str(err.value)
    assert "task='tick') is the call form" in message
    assert "not a decorator (it was used on " in message and "tick)" in message
    assert "drop task= and put @jq.periodic(...) above @jq.task()" in message


def test_using_shares_the_periodics(app, tmp_path):
    app.periodic(every=5, task="t")
    other = app.using(f"sqlite:///{tmp_path / 'other.db'}")
    assert list(other.periodics) == ["t"]


def test_a_worker_refuses_a_periodic_of_an_unknown_task(tmp_path):
    """Found by a break-test: ``task="clenaup"`` was accepted, and the worker
    enqueued an "unknown task" job every tick without a word at start. A
    JobQueue that registers tasks refuses the name when a worker is made (not
    when the periodic is declared: its task may be registered further down),
    as enqueue refuses it; an external task is declared as for enqueue."""
    jq = JobQueue(f"sqlite:///{tmp_path / 'unknown.db'}")

    @jq.task
    def cleanup() -> None:
        return None

    jq.periodic(every=60, task="clenaup")
    with pytest.raises(ConfigError, match=r"periodic 'clenaup': unknown task 'clenaup'.*cleanup"):
        jq.worker()
    with pytest.raises(ConfigError, match="unknown task"):
        jq.run_worker(burst=True)

    later = JobQueue(f"sqlite:///{tmp_path / 'later.db'}", external_tasks=["report"])
    later.periodic(every=60, task="report")  # another service runs it
    later.periodic(every=60, task="tidy")  # registered below: fine

    @later.task
    def tidy() -> None:
        return None

    assert later.worker() is not None
    # A queue without tasks (a producer) checks nothing, as its enqueues.
    bare = JobQueue(f"sqlite:///{tmp_path / 'bare.db'}")
    bare.periodic(every=60, task="anything")
    assert bare.worker() is not None


def test_a_periodic_declared_above_its_task_is_checked_against_it_when_a_worker_is_made(tmp_path):
    """Found by a break-test: ``jq.periodic(task="report", args=...)`` above
    ``@jq.task def report`` skipped the args check (the task was unknown
    then), so every tick failed its job to dead, and the jobs went to the
    default queue instead of the task's."""
    typo = JobQueue(f"sqlite:///{tmp_path / 'typo.db'}")
    typo.periodic(every=60, task="report", args={"kindd": "daily"})

    @typo.task
    def report(kind: str) -> None: ...

    with pytest.raises(ConfigError, match=r"periodic 'report':.*kindd"):
        typo.worker()

    jq = JobQueue(f"sqlite:///{tmp_path / 'above.db'}")
    jq.periodic(every=60, task="report", args={"kind": "daily"}, name="right")
    jq.periodic(every=60, task="report", args={"kind": "x"}, name="elsewhere", queue="other")

    @jq.task(name="report", queue="reports", priority=5, max_attempts=3)
    def report_too(kind: str) -> None: ...

    assert jq.worker() is not None
    right, elsewhere = jq.periodics["right"], jq.periodics["elsewhere"]
    assert (right.queue, right.priority, right.max_attempts) == ("reports", 5, 3)
    assert (elsewhere.queue, elsewhere.priority) == ("other", 5)


def test_an_unknown_periodic_task_names_the_setting_that_declares_it_external(tmp_path):
    # periodic() has no external=True (enqueue does): the error says so.
    jq = JobQueue(f"sqlite:///{tmp_path / 'ext.db'}")

    @jq.task
    def cleanup() -> None: ...

    jq.periodic(every=60, task="mailer")
    with pytest.raises(ConfigError) as info:
        jq.worker()
    assert "external_tasks=[...]" in str(info.value)
    assert "external=True" not in str(info.value)
