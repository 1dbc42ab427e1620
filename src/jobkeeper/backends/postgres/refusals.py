"""Which failed connects waiting does not fix (internal).

A connect the server (or a pooler in front of it) refuses because of the
URL or its own set-up -- the database or the role does not exist, the
password is wrong, ``pg_hba.conf`` has no entry for us, PgBouncer does not
know the database or will not pass a startup parameter -- fails the same way
until someone changes the URL or the server. A worker started with such a
URL waited for it for ever, logging "database unavailable at start" every
10 s. Everything else a connect can meet passes with time and stays an
outage: a refused or timed-out TCP connect, a host name that does not
resolve yet (a container not up), "the database system is starting up"
(57P03) or "is shutting down", too many clients, a database not accepting
connections, PgBouncer unable to reach its server.

libpq keeps no SQLSTATE for a failed connect (psycopg's ``sqlstate`` is
None), only the text, so the server's messages are matched. They are
English unless the server's ``lc_messages`` says otherwise; a translated
message is not recognised and is taken as an outage, as before.
"""

from __future__ import annotations

import re

import psycopg

#: One failed attempt in libpq's (or psycopg's multi-host) connect error:
#: ``connection to server at "h", port p failed: FATAL:  <reason>``.
_ATTEMPT = re.compile(
    r"connection to server (?:at|on socket) .*? failed: (?:FATAL:\s+)?(?P<reason>.+)$",
    re.MULTILINE,
)

_PASSWORD_AT = "in the URL, PGPASSWORD or ~/.pgpass"

#: (the reason, as the server or the pooler words it; what to do about it).
#: SQLSTATEs for the reader: the server sends them, libpq drops them.
_NO_WAIT_FIXES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), remedy)
    for pattern, remedy in (
        # 3D000 invalid_catalog_name
        (r'^database ".*" does not exist', "create it, or fix the database name in the URL"),
        # 28000 invalid_authorization_specification
        (r'^role ".*" does not exist', "create the role, or fix the user name in the URL"),
        (r'^role ".*" is not permitted to log in', "give the role LOGIN, or use another one"),
        (r"^no pg_hba\.conf entry for", "allow this host, user and database in pg_hba.conf"),
        # 28P01 invalid_password, and the other methods' (ident, peer, ...) 28000
        (r"^\S+ authentication failed for user", f"fix the user or password ({_PASSWORD_AT})"),
        (r"^fe_sendauth: no password supplied", f"give the password ({_PASSWORD_AT})"),
        # 42501 insufficient_privilege
        (r"^permission denied for database", "GRANT CONNECT ON DATABASE to the URL's user"),
        # PgBouncer (08P01): a parameter it does not pass on (the URL's options).
        (
            r"^unsupported startup parameter",
            "a pooler does not pass it on: take it out of the URL (to choose a schema "
            "through PgBouncer, ALTER ROLE ... SET search_path), or connect to the server",
        ),
        # PgBouncer: a database or user its configuration does not list.
        (
            r"^(no such database: |bouncer config error)",
            "add the database to PgBouncer's [databases], or fix the database name in the URL",
        ),
        (r"^no such user: ", "add the user to PgBouncer's auth_file, or fix the URL"),
    )
)


def refusal(exc: BaseException) -> str | None:
    """Why the server refused ``exc``'s connect and what to do, when no
    wait fixes it: every attempt (one per host of a multi-host URL) failed
    for such a reason; None otherwise (a host that refused TCP may be the
    right one, starting).
    """
    if not isinstance(exc, psycopg.OperationalError):
        return None
    reasons = [match["reason"].strip() for match in _ATTEMPT.finditer(str(exc))]
    said: list[str] = []
    for reason in reasons:
        remedy = next((fix for pattern, fix in _NO_WAIT_FIXES if pattern.search(reason)), None)
        if remedy is None:
            return None
        if (text := f"{reason} -- {remedy}") not in said:
            said.append(text)
    return "; ".join(said) or None
