"""The database URL: the parsed form the backends read, the URL to use when
none is given, and the redaction of the secrets it may hold (for logs and
errors).

Leaf module: imports only ``errors``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from urllib.parse import unquote

from jobkeeper.errors import ConfigError

#: Environment variable consulted when no URL is passed.
DATABASE_URL_ENV = "JOBKEEPER_DATABASE_URL"
#: The embedded default: a file in the current directory.
DEFAULT_DATABASE_URL = "sqlite:///jobkeeper.db"


@dataclasses.dataclass(frozen=True, slots=True)
class DatabaseURL:
    """A parsed database URL.

    Attributes:
        scheme: ``"sqlite"`` or ``"postgresql"``.
        url: the URL as given (for PostgreSQL, what psycopg connects with).
        path: SQLite only: the database file path.
        options: query-string options (``?key=value``).
        migrate_command: what :meth:`migrate_hint` says to run instead of
            the ``jobkeeper`` CLI's command, for a queue whose tables are
            migrated another way (a Django project's ``manage.py``).
    """

    scheme: str
    url: str
    path: str = ""
    options: dict[str, str] = dataclasses.field(default_factory=dict)
    migrate_command: str | None = dataclasses.field(default=None, compare=False)

    def redacted(self) -> str:
        """The URL with any password replaced by ``***`` (for logs and
        errors); see :func:`redact_secrets`.
        """
        return redact_secrets(self.url)

    def migrate_hint(self) -> str:
        """What an error that asks for a migration says to run: the command
        with ``--database`` naming this database, as a bare
        ``jobkeeper migrate`` migrates the default one, which an app's
        database or ``--database`` often is not. A SQLite file is named by
        its absolute path, so the command works from any directory; a
        password shows as ``***``.
        """
        if self.migrate_command is not None:
            return self.migrate_command
        if self.scheme == "sqlite" and self.path and self.path != ":memory:":
            where = "sqlite:///" + os.path.abspath(self.path)
        else:
            where = self.redacted()
        return f"run `jobkeeper --database {shlex.quote(where)} migrate` (or JobQueue.migrate())"

    def __repr__(self) -> str:
        return f"DatabaseURL({self.scheme!r}, {self.redacted()!r})"


#: ``scheme://user:`` then the password, up to the last ``@`` before the
#: path (a password may hold an unencoded ``@``; libpq then misreads it).
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*:)[^\s/?#]*@")
#: ``user:password@`` without the ``://`` before it (a mistyped URL).
_BARE_PASSWORD = re.compile(r"([^\s:/?#@'\"]+:)[^\s/?#@'\"]*@")
#: A URL query parameter: its name (which libpq percent-decodes) and value,
#: taken up to the next ``&`` or space (libpq keeps quotes, ``#`` and tabs).
_URL_PARAMETER = re.compile(r"([?&])([^=&#\s'\"]+)=([^& \n]*)")
#: A ``key=value`` connection string's secret, bare or quoted.
_KEYWORD_SECRET = re.compile(
    r"((?:^|[\s'])(?:ssl)?(?:password|oauth_client_secret)\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']\S*)",
    re.IGNORECASE,
)
#: libpq's parameters that hold secrets.
SECRET_PARAMETERS = frozenset({"password", "sslpassword", "oauth_client_secret"})


def redact_secrets(text: str) -> str:
    """``text`` (a database URL, a ``key=value`` connection string, or a
    message quoting one) with every password replaced by ``***``: the one
    between ``user:`` and ``@``, and ``SECRET_PARAMETERS`` given as a URL
    query parameter (under any percent-encoding of the name, which libpq
    decodes) or as a keyword. Never raises.
    """

    def parameter(match: re.Match[str]) -> str:
        if unquote(match.group(2)).lower() in SECRET_PARAMETERS:
            return f"{match.group(1)}{match.group(2)}=***"
        return match.group(0)

    text = _URL_PASSWORD.sub(r"\1***@", text)
    text = _BARE_PASSWORD.sub(r"\1***@", text)
    text = _URL_PARAMETER.sub(parameter, text)
    return _KEYWORD_SECRET.sub(r"\1***", text)


def may_hold_secrets(url: str) -> bool:
    """Whether ``url`` may hold a password where :func:`redact_secrets`
    cannot find it for certain (for messages quoting pieces of it).
    """
    lowered = unquote(url).lower()
    return "@" in url or any(name in lowered for name in SECRET_PARAMETERS)


def requested_database_url(url: str | None) -> str:
    """The URL to use: ``url``, else ``$JOBKEEPER_DATABASE_URL``, else the
    SQLite default; stripped. Each backend parses its own kind
    (``jobkeeper.backends.resolve_database_url``).

    Raises:
        ConfigError: the URL is not a string.
    """
    if url is None:
        url = os.environ.get(DATABASE_URL_ENV) or DEFAULT_DATABASE_URL
    if not isinstance(url, str):
        raise ConfigError(f"database URL must be a string, got {type(url).__name__}")
    return url.strip()
