"""Which failed connects no wait fixes: PostgreSQL's and PgBouncer's words,
as libpq and psycopg report them (libpq keeps no SQLSTATE for a connect).
Texts taken from PostgreSQL 15, PgBouncer 1.x and psycopg 3.3.
"""

from __future__ import annotations

import psycopg
import pytest

from jobkeeper import DatabaseRefused, DatabaseUnavailable
from jobkeeper.backends import resolve_database_url
from jobkeeper.backends.postgres.connections import translated
from jobkeeper.backends.postgres.refusals import refusal

AT = 'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
SOCKET = 'connection to server on socket "/run/postgresql/.s.PGSQL.5432" failed: '


def _error(text: str) -> psycopg.OperationalError:
    return psycopg.OperationalError(text)


@pytest.mark.parametrize(
    ("text", "remedy"),
    [
        (AT + 'FATAL:  database "shop" does not exist', "create it"),  # 3D000
        (AT + 'FATAL:  role "shop" does not exist', "create the role"),  # 28000
        (AT + 'FATAL:  password authentication failed for user "shop"', "password"),  # 28P01
        (AT + 'FATAL:  Ident authentication failed for user "shop"', "password"),
        (
            AT + 'FATAL:  no pg_hba.conf entry for host "10.0.0.5", user "shop", '
            'database "shop", no encryption',
            "pg_hba.conf",
        ),
        (AT + 'FATAL:  role "shop" is not permitted to log in', "LOGIN"),
        (AT + 'FATAL:  permission denied for database "shop"', "GRANT CONNECT"),
        (AT + "fe_sendauth: no password supplied", "give the password"),
        (SOCKET + 'FATAL:  database "shop" does not exist', "create it"),
        # PgBouncer
        (AT + "FATAL:  unsupported startup parameter: options", "ALTER ROLE"),
        (AT + "FATAL:  no such database: shop", "[databases]"),
        (AT + "FATAL:  bouncer config error", "[databases]"),
        (AT + "FATAL:  no such user: shop", "auth_file"),
    ],
)
def test_refused_for_good(text, remedy):
    said = refusal(_error(text))
    assert said is not None and remedy in said
    error = translated(_error(text), resolve_database_url("postgresql://u@h/shop"))
    assert isinstance(error, DatabaseRefused)
    # Code that waits out outages (a running worker) still catches it.
    assert isinstance(error, DatabaseUnavailable)
    assert str(error).startswith("PostgreSQL at postgresql://u@h/shop refused the connection: ")


@pytest.mark.parametrize(
    "text",
    [
        AT + "Connection refused\n\tIs the server running on that host and accepting TCP/IP "
        "connections?",
        AT + "FATAL:  the database system is starting up",  # 57P03
        AT + "FATAL:  the database system is shutting down",
        AT + "FATAL:  the database system is in recovery mode",
        AT + "FATAL:  sorry, too many clients already",  # 53300
        AT + 'FATAL:  database "shop" is not currently accepting connections',
        AT + "timeout expired",
        "failed to resolve host 'db': [Errno -2] Name or service not known",  # not up yet
        AT + "FATAL:  pgbouncer cannot connect to server",
        AT + "FATAL:  server login has been failing, try again later (server_login_retry)",
        AT + "FATAL:  la base de données « shop » n'existe pas",  # translated: not known
        "terminating connection due to administrator command",  # a running session's end
        "server closed the connection unexpectedly",
    ],
)
def test_passes_with_time(text):
    assert refusal(_error(text)) is None
    error = translated(_error(text), resolve_database_url("postgresql://u@h/shop"))
    assert type(error) is DatabaseUnavailable


def test_a_multi_host_url_is_refused_only_when_every_host_refuses():
    # psycopg tries each host and lists every failure.
    listed = (
        AT + 'FATAL:  database "shop" does not exist\n'
        "Multiple connection attempts failed. All failures were:\n"
        "- host: 'a', port: '5432', hostaddr: '10.0.0.1': " + AT + "{first}\n"
        "- host: 'b', port: '5432', hostaddr: '10.0.0.2': "
        + AT
        + 'FATAL:  database "shop" does not exist'
    )
    down = listed.format(first="Connection refused")
    assert refusal(_error(down)) is None  # host a may be the right one, starting
    both = listed.format(first='FATAL:  role "shop" does not exist')
    said = refusal(_error(both))
    assert said is not None
    assert said.count('database "shop" does not exist') == 1
    assert 'role "shop" does not exist' in said


def test_not_a_driver_error():
    assert refusal(ValueError('database "shop" does not exist')) is None


@pytest.mark.parametrize(
    ("error", "retry_asked", "unreachable"),
    [
        (psycopg.errors.SerializationFailure("could not serialize access"), True, None),
        (psycopg.errors.DeadlockDetected("deadlock detected"), True, None),
        # The server answered each of these: no outage.
        (psycopg.errors.DiskFull("could not extend file"), False, False),
        (
            psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
            False,
            False,
        ),
        (psycopg.OperationalError("connection refused"), False, True),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else None,
)
def test_what_a_translated_error_says_of_itself(error, retry_asked, unreachable):
    # What the worker's loops log hangs on these: a lost race is a warning
    # naming its step, and "database reachable again" follows an outage only.
    translated_error = translated(error, resolve_database_url("postgresql://u@h/shop"))
    assert translated_error.retry_asked is retry_asked
    if unreachable is None:
        assert not isinstance(translated_error, DatabaseUnavailable)
    else:
        assert isinstance(translated_error, DatabaseUnavailable)
        assert translated_error.unreachable is unreachable
    if isinstance(error, psycopg.errors.DiskFull):
        assert "is unavailable" not in str(translated_error)
