"""Fixtures of the Django tests: the example project on a fresh database."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from .projects import BACKENDS, PG_URL, copy_project, sqlite_project


@pytest.fixture(params=BACKENDS)
def project(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Path, dict[str, str]]]:
    """A copy of the example project and the environment pointing it at a
    fresh database (a SQLite file, or a new PostgreSQL schema)."""
    if request.param == "sqlite":
        yield sqlite_project(tmp_path)
        return
    directory, env = copy_project(tmp_path)
    schema = f"jk_django_{secrets.token_hex(5)}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    env["EXAMPLE_DATABASE_URL"] = PG_URL
    env["EXAMPLE_SCHEMA"] = schema
    try:
        yield directory, env
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(params=BACKENDS)
def project_with_own_database(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Path, dict[str, str]]]:
    """A copy of the example project on a database of its own (a SQLite file,
    or a new PostgreSQL database), for ``manage.py test``: Django's test
    runner makes its test database beside it and drops it after.
    """
    if request.param == "sqlite":
        yield sqlite_project(tmp_path)
        return
    directory, env = copy_project(tmp_path)
    name = f"jk_djdev_{secrets.token_hex(5)}"
    parts = urlsplit(PG_URL)
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    env["EXAMPLE_DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{name}"))
    try:
        yield directory, env
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            for dropped in (name, f"test_{name}"):
                conn.execute(f'DROP DATABASE IF EXISTS "{dropped}" WITH (FORCE)')
