"""connection= with SQLAlchemy: a Connection or a Session (psycopg 3 driver on
PostgreSQL, pysqlite on SQLite) -- the job commits or rolls back with the
caller's transaction."""

from __future__ import annotations

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
