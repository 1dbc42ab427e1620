"""Parsing ``postgresql://`` URLs (internal): what libpq would refuse only
when connecting is refused here, when the URL is given.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from jobkeeper.database_url import DatabaseURL, may_hold_secrets, redact_secrets
from jobkeeper.errors import ConfigError

#: libpq options whose values libpq checks only when connecting (so a typo
#: looked like an unreachable server), checked here as libpq 15 would.
_LIBPQ_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": (
        "any", "read-write", "read-only", "primary", "standby", "prefer-standby"
    ),
}  # fmt: skip
_LIBPQ_INTEGERS = (
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)


#: The characters libpq's URL errors name as expected (``"]"``, ``":"``...).
_LIBPQ_SYNTAX = frozenset("[]:/=@?&")


def _shown_quotes(url: str, message: str) -> str:
    """The message libpq gave about ``url``, with each quoted piece as it may be
    shown: whole when the URL has a user but no password, or when the piece
    is one of the URL's syntax characters; else ``***`` (the piece may be,
    or hold, part of a password that a malformed URL keeps where
    redact_secrets cannot find it).
    """
    userinfo = url.partition("://")[2].partition("@")[0]
    no_password = (
        url.count("@") == 1
        and ":" not in userinfo
        and "%3a" not in userinfo.lower()  # u%3Apassword: all typed as the user
        and not may_hold_secrets(url.replace("@", ""))
    )
    if no_password:
        return message

    def piece(quoted: re.Match[str]) -> str:
        return quoted[0] if quoted[1] in _LIBPQ_SYNTAX and len(quoted[1]) == 1 else '"***"'

    return re.sub(r'"([^"]*)"', piece, message)


def _check_libpq_values(params: dict[str, Any]) -> None:
    for name, choices in _LIBPQ_CHOICES.items():
        value = params.get(name)
        if value is not None and value not in choices:
            raise ConfigError(
                f"invalid PostgreSQL URL: {name}={value!r}; use one of {', '.join(choices)}"
            )
    for name in _LIBPQ_INTEGERS:
        value = params.get(name)
        if value is not None and not re.fullmatch(r"\s*[+-]?\d+\s*", str(value)):
            raise ConfigError(f"invalid PostgreSQL URL: {name}={value!r} is not an integer")


def _check_userinfo(url: str, params: dict[str, Any]) -> None:
    """Refuse an unencoded ``@``, ``/``, ``?``, ``#`` or space in the user or
    password: libpq splits at the first ``@`` and would take the rest of the
    password for the host, or reads ``?`` and ``#`` into the password while
    every other parser stops there, and the password would be printed.
    """
    password = str(params.get("password") or "")
    odd = sorted({c for c in password if c in "/?#" or c.isspace()})
    if odd and password in url:  # as typed, not percent-encoded
        raise ConfigError(
            "invalid PostgreSQL URL: the password holds "
            + ", ".join(repr(c) for c in odd)
            + " unencoded; percent-encode it (e.g. '?' as %3F, '/' as %2F, '#' as %23)"
        )
    # libpq splits "u:p@rt/x@host" at the first @: the rest of the password
    # becomes the host, port or database name, printed in every connection
    # error and where redact_secrets cannot tell it from a host.
    before_query = url.partition("://")[2].partition("?")[0].partition("#")[0]
    if before_query.count("@") > 1 or "@" in str(params.get("host") or ""):
        raise ConfigError(
            "invalid PostgreSQL URL: it holds more than one '@' before its query string; an '@'"
            " in the user, password or database name must be percent-encoded as %40"
        )


def parse_url(url: str) -> DatabaseURL:
    """``postgresql://user@host:port/db`` (also ``postgres://``), or any
    libpq connection URL.

    Raises:
        ConfigError: libpq cannot parse it, or a port or option value it
            would refuse only when connecting.
    """
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(url)
    except ImportError as exc:  # psycopg is the `postgres` extra
        raise ConfigError(
            "PostgreSQL needs psycopg 3, which is not installed: pip install 'jobkeeper[postgres]'"
        ) from exc
    except psycopg.Error as exc:
        # libpq's message may quote the whole URL, or the piece it could
        # not read, which may be (part of) the password.
        message = redact_secrets(str(exc).strip())
        if may_hold_secrets(url):
            message = _shown_quotes(url, message)
        raise ConfigError(f"invalid PostgreSQL URL: {message}") from None
    _check_userinfo(url, params)
    try:
        urlsplit(url)
    except ValueError as exc:
        # libpq accepts e.g. "postgresql://[/]" and fails only at connect
        # time, where even the error message could not be built.
        raise ConfigError(f"invalid PostgreSQL URL: {exc}") from None
    # libpq's parser accepts any port text; it only fails at connect time
    # (after the pool's retries), so check it here.
    port = params.get("port")
    if port is not None and not all(
        p.strip().isascii() and p.strip().isdigit() and 0 < int(p) < 65536
        for p in str(port).split(",")
        if p.strip()
    ):
        if "@" in str(params.get("dbname") or ""):
            # "u:pw/rest@host": libpq took pw for the port and rest@host... for the database
            raise ConfigError(
                "invalid PostgreSQL URL: the port is not a port number (a '/' in a password"
                " must be percent-encoded as %2F)"
            )
        raise ConfigError(f"invalid PostgreSQL URL: port {port!r} is not a port number")
    _check_libpq_values(params)
    return DatabaseURL("postgresql", url)
