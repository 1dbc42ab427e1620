"""Settings, database URLs, names and enqueue options: rescue_after spans at
least three heartbeats, and run_at must be aware.
"""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from jobkeeper import ConfigError, JobQueue, PayloadError
from jobkeeper.backends import resolve_database_url
from jobkeeper.config import (
    MAX_DELAY,
    NAME_MAX_LENGTH,
    Settings,
    check_max_attempts,
    check_name,
    check_priority,
    check_schedule,
    check_seconds,
    check_timeout,
    check_unique_key,
)
from jobkeeper.database_url import DATABASE_URL_ENV, DEFAULT_DATABASE_URL, DatabaseURL

# -- database URL ------------------------------------------------------------------------------


def test_url_argument_wins_over_environment(monkeypatch):
    monkeypatch.setenv(DATABASE_URL_ENV, "sqlite:///from-env.db")
    assert resolve_database_url("sqlite:///from-arg.db").path == "from-arg.db"


def test_environment_wins_over_default(monkeypatch):
    monkeypatch.setenv(DATABASE_URL_ENV, "postgresql://someone@db.example:5433/jobs")
    url = resolve_database_url(None)
    assert url.scheme == "postgresql"
    assert url.url == "postgresql://someone@db.example:5433/jobs"


@pytest.mark.parametrize("env", [None, ""])
def test_default_is_sqlite_file_in_cwd(monkeypatch, env):
    if env is None:
        monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    else:
        monkeypatch.setenv(DATABASE_URL_ENV, env)
    url = resolve_database_url(None)
    assert url.url == DEFAULT_DATABASE_URL == "sqlite:///jobkeeper.db"
    assert (url.scheme, url.path) == ("sqlite", "jobkeeper.db")


def test_jobqueue_uses_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(DATABASE_URL_ENV, f"sqlite:///{tmp_path}/env.db")
    assert JobQueue().url.path == f"{tmp_path}/env.db"


def test_invalid_environment_url_is_a_config_error(monkeypatch):
    monkeypatch.setenv(DATABASE_URL_ENV, "redis://localhost")
    with pytest.raises(ConfigError, match="unknown scheme 'redis'"):
        JobQueue()


@pytest.mark.parametrize(
    ("url", "scheme", "path"),
    [
        ("sqlite:///jobs.db", "sqlite", "jobs.db"),
        ("sqlite:///data/jobs.db", "sqlite", "data/jobs.db"),
        ("sqlite:////var/lib/jobs.db", "sqlite", "/var/lib/jobs.db"),
        ("  sqlite:///jobs.db  ", "sqlite", "jobs.db"),
        ("postgresql://u@localhost:5432/db", "postgresql", ""),
        ("postgres://u:secret@localhost/db", "postgresql", ""),
        ("postgresql://u@localhost/db?options=-csearch_path%3Dx", "postgresql", ""),
        ("postgresql://u@h1:5432,h2:5433/db", "postgresql", ""),
        ("postgresql://u@[::1]:5432/db", "postgresql", ""),
        ("postgresql:///db?host=/var/run/postgresql", "postgresql", ""),
    ],
)
def test_valid_urls(url, scheme, path):
    parsed = resolve_database_url(url)
    assert (parsed.scheme, parsed.path) == (scheme, path)


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("redis://localhost:6379/0", "unknown scheme 'redis'"),
        ("sqlite://", "invalid SQLite URL"),
        ("sqlite:///", "invalid SQLite URL"),
        ("sqlite://host/jobs.db", "invalid SQLite URL"),
        ("sqlite:///:memory:", "needs a database file"),
        ("sqlite:///file::memory:?cache=shared", "needs a database file"),
        ("garbage", "invalid database URL 'garbage'"),
        ("", "invalid database URL"),
        ("/path/to/jobs.db", "invalid database URL"),
        ("mysql://user@localhost/db", "mysql:// is not supported yet"),
        ("mariadb://user@localhost/db", "mariadb:// is not supported yet"),
        ("postgresql://u@h/db?nonsense_option=1", "invalid PostgreSQL URL"),
        ("postgresql://u@h:notaport/db", "port 'notaport' is not a port number"),
        ("postgresql://u@h/db?port=abc", "port 'abc'"),
        ("postgresql://u@h:99999/db", "port '99999'"),
        ("postgresql://u@h1:5432,h2:x/db", "port '5432,x'"),
        # libpq checks these only when connecting: they looked like an
        # unreachable server (DatabaseUnavailable, exit 1, after retries).
        ("postgresql://u@h/db?sslmode=bogus", "sslmode='bogus'; use one of disable, allow"),
        ("postgresql://u@h/db?sslmode=REQUIRE", "sslmode='REQUIRE'"),
        ("postgresql://u@h/db?target_session_attrs=rw", "target_session_attrs='rw'"),
        ("postgresql://u@h/db?connect_timeout=abc", "connect_timeout='abc' is not an integer"),
        ("postgresql://u@h/db?keepalives_idle=1.5", "keepalives_idle='1.5' is not an integer"),
    ],
)
def test_invalid_urls_raise_config_error_with_clear_text(url, needle):
    with pytest.raises(ConfigError) as info:
        resolve_database_url(url)
    message = str(info.value)
    assert needle in message
    assert "\n" not in message


@pytest.mark.parametrize("url", [42, b"sqlite:///x.db", ["sqlite:///x.db"]])
def test_url_must_be_a_string(url):
    with pytest.raises(ConfigError, match="must be a string"):
        resolve_database_url(url)


def test_invalid_url_in_jobqueue_connects_to_nothing():
    with pytest.raises(ConfigError):
        JobQueue("sqlite:///:memory:")


def test_redacted_url_hides_the_password():
    url = resolve_database_url("postgresql://user:hunter2@db.example/jobs")
    assert "hunter2" not in url.redacted()
    assert "***" in url.redacted()
    assert "hunter2" not in repr(JobQueue("postgresql://user:hunter2@db.example/jobs"))


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql://db.example/jobs?password=hunter2&sslmode=require",
            "postgresql://db.example/jobs?password=***&sslmode=require",
        ),
        (
            "postgresql://u:pw1@db.example/jobs?sslmode=require&password=hunter2",
            "postgresql://u:***@db.example/jobs?sslmode=require&password=***",
        ),
        (
            "postgresql://db.example/jobs?sslpassword=hunter2",
            "postgresql://db.example/jobs?sslpassword=***",
        ),
        ("postgresql://db.example/jobs?sslmode=require", None),
    ],
)
def test_redacted_url_hides_a_password_given_as_a_query_parameter(url, shown):
    # Found by a break-test: ?password= (which libpq takes) was logged as is.
    resolved = resolve_database_url(url)
    assert resolved.redacted() == (url if shown is None else shown)
    assert "hunter2" not in repr(JobQueue(url))


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres@127.0.0.1:5999/db?pass%77ord=hunter2",
        "postgresql://db.example/jobs?%70assword=hunter2&sslpass%77ord=hunter2",
    ],
)
def test_redacted_url_hides_a_password_parameter_under_any_encoding_of_its_name(url):
    # Found by a break-test: libpq percent-decodes parameter names, so
    # ?pass%77ord= is a password, and it was shown whole.
    resolved = resolve_database_url(url)
    assert "hunter2" not in resolved.redacted() and "=***" in resolved.redacted()
    assert "hunter2" not in repr(resolved) and "hunter2" not in repr(JobQueue(url))


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("postgresql+psycopg://u:hunter2@127.0.0.1/db", "unknown scheme"),
        ("host=127.0.0.1 user=u password=hunter2 dbname=db", "expected sqlite"),
        ("postgresql://u:hunter2@[::1:5432/db", '"]" in IPv6 host address in URI: "***"'),
        ("postgresql://u:hunter2@[::1]]/db", 'unexpected character "]" at position 29'),
        # libpq splits at the first @ and took "2@127.0.0.1" for the host.
        ("postgresql://u:hunter@2@127.0.0.1/db", "must be percent-encoded as %40"),
        # ...and the rest became the host or the database name, shown in
        # every connection error (break-test 16).
        ("postgresql://u:hun@ter2/x@127.0.0.1/db", "must be percent-encoded as %40"),
        ("postgresql://u:hun@127.0.0.1/ter2@x", "must be percent-encoded as %40"),
        ("postgresql://u:hun@h1,ter2/x@127.0.0.1/db", "must be percent-encoded as %40"),
        ("postgresql://u:hun@[::1]/ter2@x", "must be percent-encoded as %40"),
        # libpq reads this as user "u:hunter2", but it may be a password typed encoded.
        ("postgresql://u%3Ahunter2@[::1:5432/db", '"]" in IPv6 host address in URI: "***"'),
        # Without a password the URL is quoted whole (break-test 15: any '@'
        # hid every quoted piece, even the "]" libpq was looking for).
        (
            "postgresql://u@[::1:5432/db",
            '"]" in IPv6 host address in URI: "postgresql://u@[::1:5432/db"',
        ),
    ],
)
def test_a_refused_url_is_quoted_without_its_password(url, said):
    # Found by a break-test: these errors quoted the URL whole.
    with pytest.raises(ConfigError) as info:
        JobQueue(url)
    assert said in str(info.value) and "hunter" not in str(info.value), str(info.value)
    assert "ter2" not in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:hunter?2@127.0.0.1:1/db",  # libpq reads ?, # and / into the password
        "postgresql://u:hunter#2@127.0.0.1:1/db",
        "postgresql://u:hunter/2@127.0.0.1:1/db",
        "postgresql://u:hunter\n2@127.0.0.1:1/db",
        "postgresql://u:hunter 2@127.0.0.1:1/db",  # libpq's messages quote the piece
        "postgresql://u:hunter%zz2@127.0.0.1:1/db",
        "postgresql://h:1/db?password=hunter%zz2",
        "postgresql://h:1/db?password=hunter&2",
        "postgresql://h:1/db?password=hunter#2",
        "host='x'password=hunter2",
        "sqlite://u:hunter2@h/x.db",
        "postgresql:/u:hunter2@127.0.0.1:1/db",
        "u:hunter2@h/db",
    ],
)
def test_no_refused_url_shows_its_password(url):
    # Found by a second break-test: each of these showed all or half of it.
    with pytest.raises(ConfigError) as info:
        JobQueue(url)
    assert "hunter" not in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://h:1/db?password='hunter2'",
        "postgresql://h:1/db?password=hunter'2",
        "postgresql://127.0.0.1:1/db?oauth_client_secret=hunter2",
        "postgresql://u:hunter%3F2@127.0.0.1:1/db",  # percent-encoded: fine
    ],
)
def test_an_accepted_url_never_shows_its_password(url):
    jq = JobQueue(url)
    assert "hunter" not in repr(jq) and "hunter" not in repr(jq.url)


# -- Settings --------------------------------------------------------------------------------


def test_defaults_match_the_design():
    s = Settings()
    assert (s.heartbeat_interval, s.rescue_after, s.poll_interval) == (5.0, 60.0, 1.0)
    assert (s.retention, s.max_payload_bytes, s.shutdown_grace) == (86_400.0, 1 << 20, 30.0)
    jq = JobQueue("sqlite:///x.db")
    assert jq.settings == s


@pytest.mark.parametrize(
    ("heartbeat", "rescue"),
    [(5.0, 4.0), (5.0, 14.999), (0.1, 0.29), (1.0, 1.0), (10.0, 29.0)],
)
def test_rescue_after_below_three_heartbeats_is_rejected(heartbeat, rescue):
    with pytest.raises(ConfigError) as info:
        Settings(heartbeat_interval=heartbeat, rescue_after=rescue)
    assert "rescue_after" in str(info.value)
    assert "heartbeat_interval" in str(info.value)
    with pytest.raises(ConfigError):
        JobQueue("sqlite:///x.db", heartbeat_interval=heartbeat, rescue_after=rescue)


def test_rescue_after_four_with_default_heartbeat_is_rejected():
    with pytest.raises(ConfigError, match="at least 3 x heartbeat_interval"):
        JobQueue("sqlite:///x.db", rescue_after=4)


@pytest.mark.parametrize(
    "name", ["rescue_after", "retention", "shutdown_grace", "poll_interval", "busy_timeout"]
)
def test_durations_longer_than_a_century_are_refused(name):
    # now() - 1e12 s is before anything PostgreSQL stores: one worker with
    # rescue_after=1e12 made every rescuer's query fail, for every worker.
    with pytest.raises(ConfigError, match=f"^{name}=1000000000000.0 is longer than 3155760000"):
        JobQueue("sqlite:///x.db", **{name: 1e12})
    century = 100 * 365.25 * 86_400
    assert getattr(Settings(**{name: century}), name) == century


@pytest.mark.parametrize(("heartbeat", "rescue"), [(5.0, 15.0), (1.0, 4.0), (0.1, 1.0)])
def test_rescue_after_of_three_heartbeats_or_more_is_accepted(heartbeat, rescue):
    assert Settings(heartbeat_interval=heartbeat, rescue_after=rescue).rescue_after == rescue


@pytest.mark.parametrize(
    "name",
    [
        "heartbeat_interval",
        "rescue_after",
        "poll_interval",
        "retention",
        "shutdown_grace",
        "max_backoff",
        "busy_timeout",
    ],
)
@pytest.mark.parametrize("value", [-1.0, -1e-9, math.nan, math.inf, -math.inf, "5", None, True])
def test_bad_durations_are_rejected(name, value):
    with pytest.raises(ConfigError) as info:
        Settings(**{name: value})
    assert name in str(info.value)


@pytest.mark.parametrize("name", ["heartbeat_interval", "rescue_after", "poll_interval"])
def test_intervals_must_be_positive(name):
    with pytest.raises(ConfigError, match=f"{name} must be a finite number of seconds > 0"):
        Settings(**{name: 0})


@pytest.mark.parametrize("name", ["retention", "shutdown_grace", "max_backoff", "busy_timeout"])
def test_zero_is_allowed_where_it_means_something(name):
    assert getattr(Settings(**{name: 0}), name) == 0


@pytest.mark.parametrize("value", [0, -1, 1.5, "1024", True, (256 << 20) + 1])
def test_max_payload_bytes_validated(value):
    with pytest.raises(ConfigError, match="max_payload_bytes"):
        Settings(max_payload_bytes=value)


@pytest.mark.parametrize("value", [1, 1.0, 0.5, -2, math.nan, math.inf, "2", True])
def test_backoff_base_must_be_finite_and_above_one(value):
    with pytest.raises(ConfigError, match="backoff_base"):
        Settings(backoff_base=value)


def test_unknown_setting_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="heartbeat_intervall"):
        JobQueue("sqlite:///x.db", heartbeat_intervall=5)  # type: ignore[call-arg]


def test_check_seconds_returns_float():
    assert check_seconds("x", 3) == 3.0
    assert isinstance(check_seconds("x", 3), float)
    with pytest.raises(ConfigError, match="x must be a finite number of seconds > 0, got 0"):
        check_seconds("x", 0, allow_zero=False)


def test_task_timeout():
    assert check_timeout(None) is None
    assert check_timeout(1.5) == 1.5
    for bad in (0, -1, math.nan, math.inf):
        with pytest.raises(ConfigError, match="timeout"):
            check_timeout(bad)


# -- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "a",
        "default",
        "emails.high",
        "app:task",
        "myapp/tasks.resize-image_v2",
        "_private",
        "9lives",
        "x" * NAME_MAX_LENGTH,
    ],
)
@pytest.mark.parametrize("kind", ["queue", "task"])
def test_valid_names(kind, name):
    assert check_name(kind, name) == name


def test_name_limit_is_200_characters():
    assert NAME_MAX_LENGTH == 200
    assert check_name("queue", "q" * 200) == "q" * 200
    with pytest.raises(ConfigError, match="1-200 characters") as info:
        check_name("queue", "q" * 201)
    # The length is the reason given, and the value shown is marked as cut.
    assert "too long: 201 characters, at most 200" in str(info.value)
    assert "'" + "q" * 60 + "'..." in str(info.value)


@pytest.mark.parametrize(
    "name",
    [
        "",
        " default",
        "has space",
        "tab\there",
        "new\nline",
        "nul\x00",
        "-leading-dash",
        ".dot",
        "/slash",
        "café",
        "emoji😀",
        "semi;colon",
        "quote'",
        'dq"',
        "x" * 201,
    ],
)
@pytest.mark.parametrize("kind", ["queue", "task"])
def test_invalid_names_are_rejected_naming_the_kind(kind, name):
    with pytest.raises(ConfigError) as info:
        check_name(kind, name)
    message = str(info.value)
    assert message.startswith(f"{kind} name ")
    assert "\n" not in message or "\n" in name


@pytest.mark.parametrize("name", [None, 1, b"q", ["q"]])
def test_names_must_be_strings(name):
    with pytest.raises(ConfigError, match="queue name must be a string"):
        check_name("queue", name)


def test_long_invalid_name_is_not_echoed_in_full():
    with pytest.raises(ConfigError) as info:
        check_name("task", "y" * 10_000)
    assert len(str(info.value)) < 400


def test_task_decorator_validates_names():
    jq = JobQueue("sqlite:///x.db")
    with pytest.raises(ConfigError, match="task name"):
        jq.task(name="bad name")(lambda: None)
    with pytest.raises(ConfigError, match="queue name"):
        jq.task(name="ok", queue="bad queue")(lambda: None)

    @jq.task(name="t" * 200, queue="q" * 200)
    def fine() -> None: ...

    assert fine.name == "t" * 200
    with pytest.raises(ConfigError, match="already registered"):
        jq.task(name="t" * 200)(lambda: None)


# -- priority, max_attempts, unique_key ------------------------------------------------------------


@pytest.mark.parametrize("value", [-(2**31), -5, 0, 7, 2**31 - 1])
def test_priority_in_range(value):
    assert check_priority(value) == value


@pytest.mark.parametrize("value", [-(2**31) - 1, 2**31, 10**20, 1.0, "1", None, True])
def test_priority_out_of_range(value):
    with pytest.raises(ConfigError, match="priority must be an int between"):
        check_priority(value)


@pytest.mark.parametrize("value", [1, 20, 1_000_000])
def test_max_attempts_in_range(value):
    assert check_max_attempts(value) == value


@pytest.mark.parametrize("value", [0, -1, 1_000_001, 2.0, "3", None, False])
def test_max_attempts_out_of_range(value):
    with pytest.raises(ConfigError, match="max_attempts must be an int between 1 and 1000000"):
        check_max_attempts(value)


def test_unique_key_checks():
    assert check_unique_key(None) is None
    assert check_unique_key("a.png") == "a.png"
    assert check_unique_key("k" * 500) == "k" * 500
    with pytest.raises(ConfigError, match="non-empty"):
        check_unique_key("")
    with pytest.raises(ConfigError, match="non-empty"):
        check_unique_key(5)
    with pytest.raises(ConfigError, match="limit is 500"):
        check_unique_key("k" * 501)
    with pytest.raises(PayloadError, match="NUL"):
        check_unique_key("a\x00b")
    with pytest.raises(PayloadError, match="surrogate"):
        check_unique_key("a\udc00b")


# -- schedule: delay and run_at, which must be aware ---------------------------------------


def test_naive_run_at_is_rejected_asking_for_an_aware_datetime():
    naive = datetime.now() + timedelta(minutes=10)
    with pytest.raises(ConfigError) as info:
        check_schedule(None, naive)
    message = str(info.value)
    assert "naive" in message
    assert "aware" in message


def test_naive_run_at_is_rejected_by_enqueue_before_connecting(tmp_path):
    jq = JobQueue(f"sqlite:///{tmp_path}/never-created/jobs.db")
    with pytest.raises(ConfigError, match="naive"):
        jq.enqueue("t", {}, run_at=datetime(2030, 1, 1))
    assert not (tmp_path / "never-created").exists()


@pytest.mark.parametrize(
    "zone",
    [ZoneInfo("Asia/Tokyo"), ZoneInfo("America/Los_Angeles"), timezone(timedelta(hours=14))],
)
def test_aware_run_at_is_converted_to_utc(zone):
    local = datetime(2030, 6, 1, 9, 30, tzinfo=zone)
    delay, run_at = check_schedule(None, local)
    assert delay is None
    assert run_at is not None
    assert run_at.utcoffset() == timedelta(0)
    assert run_at == local  # same instant
    assert run_at.replace(tzinfo=None) == (local - local.utcoffset()).replace(tzinfo=None)


def test_past_run_at_is_accepted_as_is():
    past = datetime(2001, 1, 1, tzinfo=UTC)
    assert check_schedule(None, past) == (None, past)


def test_run_at_must_be_a_datetime():
    with pytest.raises(ConfigError, match="run_at must be a datetime"):
        check_schedule(None, "2030-01-01T00:00:00Z")
    with pytest.raises(ConfigError, match="run_at must be a datetime"):
        check_schedule(None, 1_900_000_000)


def test_delay_and_run_at_are_exclusive():
    with pytest.raises(ConfigError, match="either delay or run_at"):
        check_schedule(5, datetime.now(UTC))


@pytest.mark.parametrize("delay", [-1, -0.001, math.nan, math.inf, -math.inf])
def test_negative_or_non_finite_delay_is_rejected(delay):
    with pytest.raises(ConfigError, match="delay must be a finite number of seconds >= 0"):
        check_schedule(delay, None)


@pytest.mark.parametrize("delay", ["5", True, object(), [1]])
def test_delay_must_be_a_number(delay):
    with pytest.raises(ConfigError, match="delay must be a number of seconds"):
        check_schedule(delay, None)


def test_delay_over_the_limit_is_rejected():
    with pytest.raises(ConfigError, match="more than the limit"):
        check_schedule(MAX_DELAY * 2, None)


def test_delay_values():
    assert check_schedule(None, None) == (None, None)
    assert check_schedule(0, None) == (None, None)  # zero delay: available now
    assert check_schedule(60, None) == (60.0, None)
    assert check_schedule(0.25, None) == (0.25, None)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"delay": -1}, "delay"),
        ({"delay": math.nan}, "delay"),
        ({"run_at": datetime(2030, 1, 1)}, "naive"),
        ({"priority": 2**31}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"queue": "bad queue"}, "queue name"),
        ({"unique_key": ""}, "unique_key"),
    ],
)
def test_enqueue_options_are_validated_before_connecting(tmp_path, options, needle):
    jq = JobQueue(f"sqlite:///{tmp_path}/missing-dir/jobs.db")
    with pytest.raises(ConfigError, match=needle):
        jq.enqueue("task", {"a": 1}, **options)
    with pytest.raises(ConfigError, match=rf"^jobs\[1\]: .*{needle}"):
        jq.enqueue_many([("task", {}), ("task", {}, options)])
    assert jq._backend is None


def test_unknown_enqueue_option_in_batch_is_named(tmp_path):
    jq = JobQueue(f"sqlite:///{tmp_path}/jobs.db")
    with pytest.raises(ConfigError, match=r"^jobs\[0\]: unknown enqueue option 'dealy'"):
        jq.enqueue_many([("task", {}, {"dealy": 5})])
    with pytest.raises(ConfigError, match=r"^jobs\[0\]: pass connection="):
        jq.enqueue_many([("task", {}, {"connection": object()})])
    with pytest.raises(ConfigError, match=r"^jobs\[2\]: each item must be"):
        jq.enqueue_many([("task", {}), ("task", {}), ["task", {}]])  # type: ignore[list-item]
    # Said what is wrong with a tuple (break-test: "..., got tuple").
    with pytest.raises(ConfigError, match=r"^jobs\[1\]: .* tuple, got a tuple of 4 items$"):
        jq.enqueue_many([("task", {}), ("task", {}, {}, {})])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match=r"^jobs\[0\]: .* tuple, got a tuple of 1 item$"):
        jq.enqueue_many([("task",)])  # type: ignore[list-item]
    # Not a batch at all: said so, not a TypeError or "jobs[0]: ... got str"
    # for a dict's first key (break-test).
    for not_a_batch in (None, 5, {"task": {}}, "task", b"task"):
        with pytest.raises(ConfigError, match=r"^jobs must be a list .*, got "):
            jq.enqueue_many(not_a_batch)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"^jobs must be a list .*, got "):
            asyncio.run(jq.enqueue_many_async(not_a_batch))  # type: ignore[arg-type]
    assert jq._backend is None  # nothing was opened, let alone written


def test_task_options_reject_unknown_keywords(tmp_path):
    jq = JobQueue(f"sqlite:///{tmp_path}/jobs.db")

    @jq.task
    def resize(path: str) -> None: ...

    with pytest.raises(TypeError, match="dealy"):
        resize.options(dealy=5)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="unknown enqueue option 'dealy'"):
        resize.options(delay=5).options(dealy=5)


def test_registered_task_args_must_bind(tmp_path):
    jq = JobQueue(f"sqlite:///{tmp_path}/missing/jobs.db")

    @jq.task
    def resize(path: str, width: int = 100) -> None: ...

    with pytest.raises(PayloadError, match="args do not match task 'resize'"):
        jq.enqueue("resize", {"width": 5})
    with pytest.raises(PayloadError, match="args do not match task 'resize'"):
        resize.enqueue(path="a", height=3)  # type: ignore[call-arg]
    with pytest.raises(PayloadError, match="by keyword"):
        resize.enqueue("a.png")
    assert jq._backend is None


@pytest.mark.parametrize(
    "run_at",
    [
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),
        datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-14))),
    ],
)
def test_run_at_out_of_range_in_utc_is_a_config_error(run_at):
    with pytest.raises(ConfigError, match="out of range"):
        check_schedule(None, run_at)


def test_redacted_url_that_cannot_be_split_still_hides_the_password():
    # Built directly: resolve_database_url refuses such a URL, but redacted()
    # words error messages and must never raise itself.
    url = DatabaseURL("postgresql", "postgresql://me:hunter2@[/]/db")
    assert url.redacted() == "postgresql://me:***@[/]/db"


@pytest.mark.parametrize(
    "query",
    [
        "sslmode=require&connect_timeout=5",
        "sslmode=verify-full&channel_binding=require&gssencmode=disable",
        "target_session_attrs=prefer-standby&keepalives=1&keepalives_idle=30",
        "connect_timeout=%2010%20",
    ],
)
def test_valid_libpq_options_are_accepted(query):
    assert resolve_database_url(f"postgresql://u@h/db?{query}").scheme == "postgresql"


class _Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


@pytest.mark.parametrize("option", ["unique_key", "priority", "max_attempts", "delay", "queue"])
def test_a_refused_option_whose_repr_raises_is_still_a_config_error(tmp_path, option):
    # Found by a break-test: t.options(unique_key=obj) with a failing __repr__
    # raised the RuntimeError of that repr instead of naming the option.
    jq = JobQueue(f"sqlite:///{tmp_path / 'unused.db'}")
    with pytest.raises(ConfigError, match=rf"{option}.*_Unprintable whose repr\(\) raised"):
        jq.enqueue("t", {}, **{option: _Unprintable()})


def test_a_refused_value_is_quoted_up_to_200_characters():
    with pytest.raises(ConfigError) as info:
        check_priority(10**500)
    assert len(str(info.value)) < 300 and str(info.value).endswith("…")


def test_numbers_past_float_range_are_config_errors(tmp_path):
    jq = JobQueue(f"sqlite:///{tmp_path / 'unused.db'}")
    with pytest.raises(ConfigError, match="delay"):
        jq.enqueue("t", {}, delay=10**400)
    with pytest.raises(ConfigError, match="retention"):
        JobQueue(f"sqlite:///{tmp_path / 'unused.db'}", retention=10**400)
    # Found while fixing the CLI's seconds (a882d00): these raised OverflowError.
    for read in (jq.periodic_list, jq.periodic_prune):
        with pytest.raises(ConfigError, match="stale_after is out of range"):
            read(stale_after=10**400)
