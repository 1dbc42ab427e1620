"""connection= with SQLAlchemy: a Connection or a Session (psycopg 3 driver on
PostgreSQL, pysqlite on SQLite) -- the job commits or rolls back with the
caller's transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from jobkeeper import JobQueue


@pytest.fixture
def engine(jq: JobQueue) -> Iterator[Engine]:
    url = jq.url.url.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE notes (body TEXT)"))
    yield engine
    engine.dispose()


def count(jq: JobQueue) -> int:
    return sum(n for counts in jq.stats().values() for n in counts.values())


def notes(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return [row[0] for row in conn.execute(text("SELECT body FROM notes ORDER BY body"))]


def test_connection_commit_and_rollback(jq: JobQueue, engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("INSERT INTO notes VALUES ('rolled back')"))
        jq.enqueue("note", {"n": 1}, connection=conn)
        conn.rollback()
    with engine.connect() as conn:
        # Nothing begun yet: the enqueue begins the transaction that the
        # commit ends (else the commit has nothing to do, and the pool's reset
        # rolls the job back).
        jq.enqueue("note", {"n": 2}, connection=conn)
        conn.commit()
    with engine.connect() as conn:
        conn.execute(text("INSERT INTO notes VALUES ('kept')"))
        jq.enqueue("note", {"n": 3}, connection=conn)
        conn.commit()
    assert [job.args for job in jq.list_jobs(task="note")] == [{"n": 3}, {"n": 2}]
    assert notes(engine) == ["kept"]

    with pytest.raises(RuntimeError), engine.begin() as conn:
        jq.enqueue_many([("note", {"n": 4}), ("note", {"n": 5})], connection=conn)
        raise RuntimeError("abort")
    assert count(jq) == 2


def test_session_commit_and_rollback(jq: JobQueue, engine: Engine) -> None:
    with Session(engine) as session:
        session.execute(text("INSERT INTO notes VALUES ('rolled back')"))
        jq.enqueue("note", {"n": 1}, connection=session)
        session.rollback()
        jq.enqueue("note", {"n": 2}, connection=session)
        session.execute(text("INSERT INTO notes VALUES ('kept')"))
        session.commit()
    assert [job.args for job in jq.list_jobs(task="note")] == [{"n": 2}]
    assert notes(engine) == ["kept"]


def test_other_objects_are_refused(jq: JobQueue, engine: Engine) -> None:
    with pytest.raises(TypeError, match="connection="):
        jq.enqueue("note", {}, connection=engine)
    assert count(jq) == 0


# -- async: AsyncConnection and AsyncSession (psycopg 3 driver) ------------------------


def test_async_connection_and_session_commit_and_rollback(pg_url: str) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    jq = JobQueue(pg_url)
    jq.migrate()
    engine = create_async_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))

    async def scenario() -> None:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE notes (body TEXT)"))
        async with engine.connect() as conn:
            await conn.execute(text("INSERT INTO notes VALUES ('rolled back')"))
            await jq.enqueue_async("note", {"n": 1}, connection=conn)
            await conn.rollback()
        async with engine.connect() as conn:
            # Nothing begun yet: the enqueue begins what the commit ends.
            await jq.enqueue_async("note", {"n": 2}, connection=conn)
            await conn.commit()
        async with AsyncSession(engine) as session:
            await session.execute(text("INSERT INTO notes VALUES ('session rolled back')"))
            await jq.enqueue_many_async(
                [("note", {"n": 3}), ("note", {"n": 4})], connection=session
            )
            await session.rollback()
            await jq.enqueue_async("note", {"n": 5}, connection=session)
            await session.execute(text("INSERT INTO notes VALUES ('kept')"))
            await session.commit()
        async with engine.connect() as conn:
            rows = await conn.execute(text("SELECT body FROM notes"))
            assert [row[0] for row in rows] == ["kept"]
        await jq.aclose()
        await engine.dispose()

    try:
        asyncio.run(scenario())
        assert [job.args for job in jq.list_jobs(task="note")] == [{"n": 5}, {"n": 2}]
    finally:
        jq.close()


def test_an_async_sqlite_engine_is_refused_clearly(sqlite_url: str) -> None:
    # aiosqlite runs its sqlite3 connection on a thread of its own: jobkeeper
    # cannot write on it, and says so rather than writing outside the
    # caller's transaction.
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    jq = JobQueue(sqlite_url)
    jq.migrate()
    engine = create_async_engine(sqlite_url.replace("sqlite://", "sqlite+aiosqlite://", 1))

    async def scenario() -> None:
        async with AsyncSession(engine) as session:
            with pytest.raises(TypeError, match="aiosqlite"):
                await jq.enqueue_async("note", {"n": 1}, connection=session)
        await jq.aclose()
        await engine.dispose()

    try:
        asyncio.run(scenario())
        assert count(jq) == 0
    finally:
        jq.close()
