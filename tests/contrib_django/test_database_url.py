"""The jobkeeper URL built from a Django PostgreSQL ``DATABASES`` entry."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest

from jobkeeper import JobQueue
from jobkeeper.contrib.django.database import postgres_url, same_database

PG_URL = os.environ.get("JOBKEEPER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
#: Where Debian's PostgreSQL puts its socket (the test server's own).
SOCKET_DIR = "/var/run/postgresql"


@pytest.mark.parametrize(
    ("config", "url"),
    [
        (
            {"NAME": "shop", "USER": "app", "PASSWORD": "p@ss/w", "HOST": "db", "PORT": 5433},
            "postgresql://app:p%40ss%2Fw@db:5433/shop",
        ),
        ({"NAME": "shop", "HOST": "", "PORT": ""}, "postgresql:///shop"),
        (
            {"NAME": "shop", "HOST": "::1", "PORT": "5432"},
            "postgresql:///shop?host=%3A%3A1&port=5432",
        ),
        # Several hosts, an IPv6 address with a zone: whole, in the query
        # (helper-55 saw 'h1,h2:5432,5433' read as host 'h1,h2,5433').
        (
            {"NAME": "shop", "HOST": "h1,h2", "PORT": "5432,5433"},
            "postgresql:///shop?host=h1%2Ch2&port=5432%2C5433",
        ),
        ({"NAME": "shop", "HOST": "fe80::1%eth0"}, "postgresql:///shop?host=fe80%3A%3A1%25eth0"),
        # Every libpq option Django passes on, none of Django's own; a
        # service file may name the database.
        (
            {
                "NAME": "shop",
                "HOST": "db",
                "OPTIONS": {
                    "sslmode": "verify-full",
                    "sslrootcert": "/etc/ca.pem",
                    "target_session_attrs": "read-write",
                    "isolation_level": 3,
                    "pool": True,
                },
            },
            "postgresql://db/shop?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem"
            "&target_session_attrs=read-write",
        ),
        ({"NAME": "", "OPTIONS": {"service": "mysvc"}}, "postgresql:///?service=mysvc"),
        # A socket directory: in the host part it was read as the database
        # name ('database "tmp:5499/test" does not exist'; helper-54).
        (
            {"NAME": "shop", "USER": "app", "HOST": "/var/run/postgresql", "PORT": "5499"},
            "postgresql://app@/shop?host=%2Fvar%2Frun%2Fpostgresql&port=5499",
        ),
        (
            {"NAME": "shop", "HOST": "/cloudsql/p:r:i", "OPTIONS": {"sslmode": "disable"}},
            "postgresql:///shop?host=%2Fcloudsql%2Fp%3Ar%3Ai&sslmode=disable",
        ),
    ],
)
def test_a_django_database_entry_becomes_the_url_libpq_reads(config, url):
    assert postgres_url(config) == url


def test_a_socket_host_reaches_the_server():
    parts = urlsplit(PG_URL)
    config = {
        "NAME": parts.path.lstrip("/"),
        "USER": parts.username or "",
        "HOST": SOCKET_DIR,
        "PORT": str(parts.port or 5432),
    }
    jq = JobQueue(postgres_url(config))
    try:
        assert jq.backend._fetch_raw("SELECT 1") == [(1,)]
    finally:
        jq.close()


def test_several_hosts_reach_the_server_past_a_dead_one():
    # libpq tries the hosts in turn: port 1 refuses, the test server answers.
    parts = urlsplit(PG_URL)
    config = {
        "NAME": parts.path.lstrip("/"),
        "USER": parts.username or "",
        "HOST": f"{parts.hostname},{parts.hostname}",
        "PORT": f"1,{parts.port or 5432}",
    }
    jq = JobQueue(postgres_url(config))
    try:
        assert jq.backend._fetch_raw("SELECT 1") == [(1,)]
    finally:
        jq.close()


@pytest.mark.parametrize(
    ("url", "other", "same"),
    [
        ("postgres://u@127.0.0.1/shop", "postgresql://u@127.0.0.1:5432/shop", True),
        ("postgresql://u:secret@db/shop?sslmode=require", "postgresql://u@db:5432/shop", True),
        ("postgresql:///shop?host=/tmp", "postgresql:///shop?host=%2Ftmp&port=5432", True),
        ("postgresql://u@db/shop", "postgresql://u@db/other", False),
        ("postgresql://u@db:6432/shop", "postgresql://u@db/shop", False),
        ("postgresql://a@db/shop", "postgresql://b@db/shop", False),
        ("sqlite:///x.db", "sqlite:///./x.db", True),
        ("sqlite:///x.db", "sqlite:///y.db", False),
        ("postgresql://u@db/shop", None, False),
    ],
)
def test_a_database_url_is_compared_by_what_it_names(url, other, same):
    # helper-79: DATABASE_URL written as postgres:// without the port was
    # taken for another database, so tests' jobs went to the real one.
    assert same_database(url, other) is same
