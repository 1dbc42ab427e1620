"""Where a Django task backend's jobs live (internal): the jobkeeper URL of a
Django database, and the queues made from one, which follow the database when
Django's test runner swaps it for the test database.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from jobkeeper import JobQueue


def database_url(alias: str) -> str:
    """The jobkeeper URL of Django's database ``alias`` (SQLite or PostgreSQL),
    as it is configured now: during a test run, the test database's.

    Raises:
        ImproperlyConfigured: no such alias, another database engine, or an
            in-memory SQLite database (Django's default test database), which
            a worker's own connections cannot share.
    """
    config = settings.DATABASES.get(alias)
    if config is None:
        raise ImproperlyConfigured(
            f"DATABASES has no {alias!r} entry (TASKS' OPTIONS['DATABASE'] names it)"
        )
    engine = str(config.get("ENGINE", ""))
    if engine.endswith("sqlite3"):
        name = str(config.get("NAME") or "")
        if is_in_memory(name):
            if name.startswith(f"file:memorydb_{alias}_"):
                # A parallel test process's copy: under the spawn and
                # forkserver start methods Django copies the file into memory.
                raise ImproperlyConfigured(
                    f"DATABASES[{alias!r}] is Django's in-memory copy of the test database "
                    f"for a parallel test process ({name!r}), made when processes start by "
                    "spawn or forkserver, which jobkeeper's workers cannot share: run these "
                    "tests without --parallel, or with the fork start method"
                )
            raise ImproperlyConfigured(
                f"DATABASES[{alias!r}] is an in-memory SQLite database ({name!r}), which "
                "jobkeeper's workers cannot share: give it a file (for Django's test "
                f"database: DATABASES[{alias!r}]['TEST'] = {{'NAME': 'test.sqlite3'}})"
            )
        return f"sqlite:///{Path(name).resolve()}"
    if "postgresql" in engine:
        return postgres_url(config)
    raise ImproperlyConfigured(
        f"DATABASES[{alias!r}] uses {engine}: jobkeeper supports sqlite3 and postgresql; "
        "set OPTIONS['DATABASE_URL'] in TASKS instead"
    )


def is_in_memory(name: str) -> bool:
    """Whether a SQLite ``NAME`` is an in-memory database: ``:memory:``, or
    the ``file:...?mode=memory`` URI Django's test runner uses by default.
    """
    return name in ("", ":memory:") or (name.startswith("file:") and "mode=memory" in name)


#: Each Django alias's URL as the settings gave it when the app was ready,
#: before any test runner renamed a database (see :func:`configured_url`).
_CONFIGURED: dict[str, str | None] = {}


def remember_configured_urls() -> None:
    """Note each alias's URL now (``AppConfig.ready``: the settings as
    written, before a test runner swaps in its test databases).
    """
    for alias in settings.DATABASES:
        try:
            _CONFIGURED[alias] = database_url(alias)
        except (ImproperlyConfigured, ImportError):  # another engine; no psycopg
            _CONFIGURED[alias] = None


def url_or_none(alias: str) -> str | None:
    """:func:`database_url` of ``alias`` now, or None where it raises."""
    try:
        return database_url(alias)
    except ImproperlyConfigured:
        return None


def configured_url(alias: str) -> str | None:
    """The URL of ``alias`` as configured (not the test database's): what an
    ``OPTIONS["DATABASE_URL"]`` is compared with to tell whether it names the
    alias's own database. None: not a database jobkeeper can use.
    """
    return _CONFIGURED[alias] if alias in _CONFIGURED else url_or_none(alias)


def same_database(url: str, other: str | None) -> bool:
    """Whether two jobkeeper URLs name the same database, however written:
    ``postgres://`` or ``postgresql://``, the default port left out or not
    (PostgreSQL: host, port, database, user and ``options``, each as libpq
    reads it, a query parameter first; SQLite: the resolved file). Hosts are
    compared as written: ``localhost`` is not ``127.0.0.1``.
    """
    if other is None:
        return False

    def key(text: str) -> tuple[str, ...]:
        parts = urlsplit(text.strip())
        scheme = "postgresql" if parts.scheme == "postgres" else parts.scheme
        if scheme == "sqlite":
            return (scheme, str(Path(unquote(text.strip()[len("sqlite:///") :])).resolve()))
        # As libpq reads it: a query parameter wins over the same part
        # before the "?"; options (a search_path) make it another place.
        query = dict(parse_qsl(parts.query))
        return (
            scheme,
            (query.get("host") or parts.hostname or "").lower(),
            str(query.get("port") or parts.port or 5432),
            query.get("dbname") or unquote(parts.path.lstrip("/")),
            query.get("user") or unquote(parts.username or ""),
            query.get("options", ""),
        )

    try:
        return key(url) == key(other)
    except ValueError:  # a port that is not a number: not comparable
        return url == other


@functools.cache
def _libpq_keywords() -> frozenset[str]:
    from psycopg import pq  # the postgres extra: only a PostgreSQL entry needs it

    return frozenset(default.keyword.decode() for default in pq.Conninfo.get_defaults())


def postgres_url(config: Mapping[str, Any]) -> str:
    """The ``postgresql://`` URL of a Django PostgreSQL ``DATABASES`` entry:
    what Django's own connection gets.

    ``OPTIONS`` keys that libpq knows (``sslrootcert``, ``service``,
    ``target_session_attrs``...) go in the query; Django's own
    (``isolation_level``, ``pool``...) do not. A ``HOST`` that is not a plain
    name or IPv4 address (a Unix socket's directory such as
    ``/var/run/postgresql``, several hosts ``h1,h2``, an IPv6 address) goes
    in the query too, with ``PORT``, as libpq reads it there whole.
    """
    keywords = _libpq_keywords()
    user = quote(config.get("USER") or "", safe="")
    password = quote(str(config.get("PASSWORD") or ""), safe="")
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = str(config.get("HOST") or "")
    port = str(config.get("PORT") or "")
    query = {
        key: str(value)
        for key, value in (config.get("OPTIONS") or {}).items()
        if key in keywords and key not in ("host", "port", "user", "password", "dbname")
    }
    if any(mark in host for mark in "/,:%") or "," in port:
        where = {"host": host} if host else {}
        query = {**where, **({"port": port} if port else {}), **query}
        host = port = ""
    netloc = f"{credentials}{host}{f':{port}' if port else ''}"
    suffix = f"?{urlencode(query, quote_via=quote)}" if query else ""
    return f"postgresql://{netloc}/{quote(config.get('NAME') or '', safe='')}{suffix}"


@dataclasses.dataclass(slots=True)
class _Kept:
    queue: JobQueue
    #: The Django alias whose database it follows (None: an explicit URL).
    follows: str | None
    #: The URL it was last pointed at.
    url: str
    #: The alias's ``NAME`` that URL was made from: what the test runner
    #: changes (its test database, a parallel copy, a mirror's target).
    name: Any = None


class FollowedQueues:
    """The JobQueues of Django task backends, one per backend alias and
    configuration (Django makes a backend object per thread; they share it,
    and its PostgreSQL pool).

    A queue whose jobs live in a Django database follows it: Django's test
    runner renames the database to the test database's, and the queue moves
    there on its next use (``JobQueue.use_database``). Before Django creates,
    clones or drops a database, :meth:`close_followers` closes their
    connections, as Django closes its own, so that PostgreSQL lets it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, ...], _Kept] = {}

    def get(self, key: tuple[str, ...]) -> JobQueue | None:
        kept = self._kept.get(key)
        return kept.queue if kept is not None else None

    def add(self, key: tuple[str, ...], queue: JobQueue, follows: str | None) -> JobQueue:
        """Keep ``queue``, on its URL, under ``key`` unless one is kept there
        already; returns the one kept.
        """
        name = _name_of(follows)
        with self._lock:
            kept = self._kept.setdefault(key, _Kept(queue, follows, queue.url.url, name))
        return kept.queue

    def follow(self, key: tuple[str, ...]) -> JobQueue:
        """The queue kept under ``key``, first moved to its Django database's
        URL if that changed.

        Raises:
            ImproperlyConfigured: see :func:`database_url`.
        """
        kept = self._kept[key]
        if kept.follows is None:
            return kept.queue
        # Every enqueue passes here: the URL is made again (a path resolved,
        # libpq's options sorted out) only when the test runner renamed the
        # database, the one change it makes to an entry.
        name = _name_of(kept.follows)
        if name == kept.name:
            return kept.queue
        url = database_url(kept.follows)
        with self._lock:
            if kept.url != url:
                command = kept.queue.url.migrate_command
                kept.queue.use_database(url)
                kept.queue.url = dataclasses.replace(kept.queue.url, migrate_command=command)
                kept.url = url
            kept.name = name
        return kept.queue

    def close_followers(self) -> None:
        """Close the connections of every queue that follows a Django database
        (they reconnect when used again).
        """
        with self._lock:
            followers = [kept.queue for kept in self._kept.values() if kept.follows]
        for queue in followers:
            queue.close()


#: The queues of every JobkeeperBackend of this process.
QUEUES = FollowedQueues()


def _name_of(alias: str | None) -> Any:
    """The ``NAME`` of Django database ``alias`` now (None: no alias)."""
    return None if alias is None else (settings.DATABASES.get(alias) or {}).get("NAME")
