"""The bulk path that validates items while it copies them in (PostgreSQL's
COPY, issue 18): a refused item, wherever it sits, writes nothing; awkward
text survives COPY's text format; ``max_pending`` holds though it is checked
after the rows are in (four threads of such batches: tests/flow/test_settings.py).
Run on both backends: SQLite validates the whole batch first, and must give
the same answers.
"""

from __future__ import annotations

import asyncio
import collections
import enum

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobkeeper import ConfigError, JobQueue, JobStatus, PayloadError, QueueFull
from jobkeeper.models import NewJob, NewJobStream
from support.db import count, is_pg, sql
from support.settings import FAST

BATCH = 300  # several of the COPY path's chunks (COPY_CHUNK_ROWS)


def pending(jq: JobQueue, queue: str) -> int:
    return count(jq, where=f"queue = '{queue}' AND status IN ('available', 'scheduled')")


@pytest.mark.parametrize("position", [0, 127, 128, 250, BATCH - 1])
def test_a_refused_item_anywhere_in_a_bulk_batch_writes_nothing(jq, position):
    jq.enqueue("t", {"before": True})
    items = [("t", {"i": i}) for i in range(BATCH)]
    items[position] = ("t", {"x": float("nan")})
    with pytest.raises(PayloadError, match=rf"^jobs\[{position}\]: args\.x: nan"):
        jq.enqueue_many(items)
    assert count(jq) == 1
    # The connection that carried the refused COPY is fine, and ids stay right.
    jobs = jq.enqueue_many([("t", {"i": i}) for i in range(BATCH)])
    assert count(jq) == 1 + BATCH
    for job in jobs[::37]:
        stored = jq.get_job(job.id)
        assert stored is not None and stored.to_dict() == job.to_dict()


def test_a_refused_option_late_in_a_bulk_batch_names_the_item(jq):
    items: list[tuple] = [("t", {"i": i}, {"priority": 1}) for i in range(BATCH)]
    items[BATCH - 2] = ("t", {}, {"priority": "high"})
    with pytest.raises(ConfigError, match=rf"^jobs\[{BATCH - 2}\]: priority"):
        jq.enqueue_many(items)
    items[BATCH - 2] = "not a tuple"  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match=rf"^jobs\[{BATCH - 2}\]: each item"):
        jq.enqueue_many(items)
    assert count(jq) == 0


def test_a_bulk_batch_from_a_generator_is_read_once(jq):
    jobs = jq.enqueue_many(("t", {"i": i}) for i in range(BATCH))
    assert [job.args for job in jobs] == [{"i": i} for i in range(BATCH)]
    assert count(jq) == BATCH


def test_a_refused_item_in_the_callers_transaction_keeps_the_callers_work(jq):
    sql(jq, "CREATE TABLE app_orders (n integer)")
    items = [("t", {"i": i}) for i in range(BATCH)]
    items[200] = ("t", {"s": "a\x00b"})
    if is_pg(jq):
        import psycopg

        conn = psycopg.connect(jq.url.url)
    else:
        import sqlite3

        conn = sqlite3.connect(jq.url.path, timeout=30)  # type: ignore[assignment]
    try:
        conn.execute("INSERT INTO app_orders VALUES (1)")
        kept = jq.enqueue("t", {"kept": True}, connection=conn)
        with pytest.raises(PayloadError, match=r"^jobs\[200\]: args\.s: .*NUL"):
            jq.enqueue_many(items, connection=conn)
        conn.commit()
    finally:
        conn.close()
    assert count(jq, "app_orders") == 1
    assert jq.get_job(kept.id) is not None
    assert count(jq) == 1


def test_async_bulk_refuses_a_late_item_writing_nothing(jq):
    items = [("t", {"i": i}) for i in range(BATCH)]
    items[280] = ("t", {"t": (1, 2)})

    async def main() -> None:
        try:
            with pytest.raises(PayloadError, match=r"^jobs\[280\]: args\.t: .*tuple"):
                await jq.enqueue_many_async(items)
            items[280] = ("t", {"i": 280})
            jobs = await jq.enqueue_many_async(items)
            assert [job.args for job in jobs] == [{"i": i} for i in range(BATCH)]
        finally:
            await jq.aclose()

    asyncio.run(main())
    assert count(jq) == BATCH


# COPY's text format escapes backslash, tab, newline and carriage return;
# JSON escapes control characters itself. Every other character passes as is.
_AWKWARD = st.lists(
    st.sampled_from(["\\", "\t", "\n", "\r", "\n\\.\n", '"', "\x01", "é", "\u2028", "😀", "a"]),
    max_size=12,
).map("".join)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(values=st.lists(_AWKWARD, min_size=1, max_size=5))
def test_awkward_text_round_trips_through_the_bulk_path(jq, values):
    items = [("t", {"v": values, "k": values[0], "i": i}) for i in range(70)]
    jobs = jq.enqueue_many(items)
    for job, (_, args) in zip(jobs[::23], items[::23], strict=False):
        assert job.args == args
        stored = jq.get_job(job.id)
        assert stored is not None and stored.args == args


def test_max_pending_holds_for_bulk_batches_checked_after_the_copy(jq):
    jq.configure_queue("q", max_pending=200)
    jq.enqueue_many([("t", {}, {"queue": "q"})] * 100)
    with pytest.raises(QueueFull) as caught:
        jq.enqueue_many([("t", {}, {"queue": "q"})] * 101 + [("t", {}, {"queue": "other"})] * 70)
    assert (caught.value.queue, caught.value.limit, caught.value.count) == ("q", 200, 100)
    assert pending(jq, "q") == 100 and pending(jq, "other") == 0
    jq.enqueue_many([("t", {}, {"queue": "q"})] * 100)
    assert pending(jq, "q") == 200


@pytest.mark.parametrize("name", ["a\ud800b", "a\x00b"], ids=["surrogate", "nul"])
def test_a_bad_queue_name_late_in_a_bulk_batch_is_named_and_nothing_is_written(jq, name):
    # A change that read the batch's queues before validation (to lock them
    # with the id reservation) sent this name to the server first: a bare
    # UnicodeEncodeError, or DataRejected, instead of the item's ConfigError.
    items = [("t", {"x": k}) for k in range(99)] + [("t", {"x": 0}, {"queue": name})]
    with pytest.raises(ConfigError, match=r"jobs\[99\]: queue name"):
        jq.enqueue_many(items)

    async def enqueue() -> None:
        try:
            await jq.enqueue_many_async(items)
        finally:
            await jq.aclose()

    with pytest.raises(ConfigError, match=r"jobs\[99\]: queue name"):
        asyncio.run(enqueue())
    assert count(jq) == 0


def test_a_limit_set_while_a_bulk_batch_is_read_holds_for_it(pg_url):
    """PostgreSQL's COPY path counts a queue's pending jobs once its rows are
    in, under the lock of the queue's row: a max_pending committed while the
    batch is being read and copied applies to it. (A change that looked the
    limited queues up with the id reservation, before the COPY, let 60,000
    jobs past a limit of 100 committed during the COPY.) SQLite reads a
    batch whole inside its write transaction, before any row goes in.
    """
    jq, other = JobQueue(pg_url, **FAST), JobQueue(pg_url, **FAST)

    @jq.task(queue="late")
    def t() -> None:
        pass

    jq.migrate()
    other.configure_queue("late", max_pending=None)
    stream = jq._new_jobs([("t", {})] * 200)
    assert isinstance(stream, NewJobStream)
    read = stream._read

    def read_and_limit(items: list[object], start: int, stop: int, *columns: list[object]) -> None:
        if start <= 80 < stop:
            read(items, start, 80, *columns)
            # The first rows are in the server's hands by now.
            other.configure_queue("late", max_pending=100)
            start = 80
        read(items, start, stop, *columns)

    stream._read = read_and_limit
    try:
        with pytest.raises(QueueFull) as caught:
            jq.backend.job_insert_many(jobs=stream)
        assert (caught.value.queue, caught.value.limit, caught.value.count) == ("late", 100, 0)
        assert pending(jq, "late") == 0
    finally:
        jq.close()
        other.close()


def test_a_stream_validates_each_item_once_however_often_it_is_read():
    seen: list[int] = []

    def read(
        items: list[int],
        start: int,
        stop: int,
        heads: list[NewJob],
        args_json: list[str],
        args: list[object],
    ) -> None:
        for index in range(start, stop):
            seen.append(index)
            if items[index] < 0:
                raise PayloadError(f"jobs[{index}]: negative")
            new = NewJob(task="t", args_json="{}", queue="default", priority=0, max_attempts=1)
            heads.append(new)
            args_json.append(new.args_json)
            args.append(new.args)

    def with_args(head: NewJob, args_json: str, args: object) -> NewJob:
        raise AssertionError("no row shares a head here")

    stream = NewJobStream([1, 2, 3, -1], read, with_args, keyed=False)
    assert len(stream) == 4
    reader = iter(stream)
    next(reader)
    next(reader)
    with pytest.raises(PayloadError, match=r"jobs\[3\]"):
        list(stream)
    assert seen == [0, 1, 2, 3]
    assert stream[1].task == "t" and seen == [0, 1, 2, 3]  # read before: kept
    with pytest.raises(PayloadError):
        stream[-1]  # refused: asked again
    assert seen == [0, 1, 2, 3, 3]
    with pytest.raises(IndexError):
        stream[4]


class Names(str, enum.Enum):  # noqa: UP042 - not StrEnum: this one formats as "Names.EMAILS"
    EMAILS = "emails"
    SEND = "send"


class Numbers(enum.IntEnum):
    HIGH = 1
    FEW = 3


@pytest.mark.parametrize("size", [10, 70])
def test_enum_options_are_stored_as_their_values(jq, size):
    """A str Enum member formats as "Names.EMAILS" in an f-string (Python
    3.11): the COPY path once stored that as the queue name, where no
    worker of "emails" would ever look."""
    options = {"queue": Names.EMAILS, "priority": Numbers.HIGH, "max_attempts": Numbers.FEW}
    jobs = jq.enqueue_many([(Names.SEND, {"i": i}, options) for i in range(size)])
    for job in (jobs[0], jobs[-1]):
        assert (job.queue, job.task, job.priority, job.max_attempts) == ("emails", "send", 1, 3)
        assert type(job.queue) is str and type(job.priority) is int
        stored = jq.get_job(job.id)
        assert stored is not None and stored.to_dict() == job.to_dict()
    single = jq.enqueue(Names.SEND, {}, queue=Names.EMAILS, unique_key=Names.EMAILS)
    assert (single.queue, single.unique_key) == ("emails", "emails")


Item = collections.namedtuple("Item", "task args options")


@pytest.mark.parametrize("size", [10, 70])
def test_namedtuple_items_keep_their_keys_and_delays(jq, size):
    """Items that are tuple subclasses are items: their unique_key, serial_key
    and delay count, whatever path the batch takes."""
    keyed = [Item("t", {"i": i}, {"unique_key": "u", "serial_key": "s"}) for i in range(size)]
    jobs = jq.enqueue_many(keyed)
    assert len({job.id for job in jobs}) == 1
    stored = jq.get_job(jobs[0].id)
    assert stored is not None and (stored.unique_key, stored.serial_key) == ("u", "s")
    delayed = jq.enqueue_many([Item("t", {"i": i}, {"delay": 60}) for i in range(size)])
    assert {jq.get_job(job.id).status for job in delayed} == {JobStatus.SCHEDULED}


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "transaction"])
def test_a_bulk_batch_on_a_callers_client_side_cursor_connection(pg_url, autocommit):
    """Django's PostgreSQL connection makes client-side cursors, which refuse
    binary results: a batch on the COPY path (64 jobs and more) failed there
    once its reserved ids were read in binary (helper-62).
    """
    import psycopg

    with (
        JobQueue(pg_url) as jq,
        psycopg.connect(pg_url, autocommit=autocommit, cursor_factory=psycopg.ClientCursor) as conn,
    ):
        jq.migrate()
        jobs = jq.enqueue_many([("t", {"i": i}) for i in range(BATCH)], connection=conn)
        if not autocommit:
            conn.commit()
        ids = [job.id for job in jobs]
        assert ids == sorted(ids) and len(set(ids)) == BATCH
        stored = sql(pg_url, "SELECT id, args->>'i' FROM jobkeeper_jobs ORDER BY id")
        assert [(row[0], int(row[1])) for row in stored] == [(j.id, j.args["i"]) for j in jobs]


def test_an_async_bulk_batch_on_a_callers_client_side_cursor_connection(pg_url):
    import psycopg

    async def enqueue() -> list[int]:
        async with await psycopg.AsyncConnection.connect(
            pg_url, autocommit=True, cursor_factory=psycopg.AsyncClientCursor
        ) as conn:
            jobs = await jq.enqueue_many_async(
                [("t", {"i": i}) for i in range(BATCH)], connection=conn
            )
            return [job.id for job in jobs]

    with JobQueue(pg_url) as jq:
        jq.migrate()
        ids = asyncio.run(enqueue())
        assert ids == sorted(ids) and len(ids) == BATCH
        assert [row[0] for row in sql(pg_url, "SELECT id FROM jobkeeper_jobs ORDER BY id")] == ids


def test_the_copy_path_validates_its_items_while_the_ids_are_reserved(pg_url):
    """PostgreSQL's COPY writes a batch's first 1,000 rows only once it has
    them all (its multi-insert buffer), so items validated between the
    chunks overlapped nothing of the server's work; they are validated while
    the server reserves the ids instead, and a refused one still raises
    before any row is sent. (SQLite validates a batch whole first.)
    """
    from jobkeeper.backends.postgres.plans import Execute, insert_plan

    jq = JobQueue(pg_url, external_tasks=True)
    try:
        items = [("t", {"i": i}) for i in range(BATCH)]
        items[BATCH - 1] = ("t", {"x": float("nan")})
        stream = jq._new_jobs(items)
        assert isinstance(stream, NewJobStream)
        reserve = next(insert_plan(stream, "jobkeeper_test", in_transaction=True))
        assert isinstance(reserve, Execute) and reserve.query == "job_insert_many_reserve_ids"
        assert reserve.meanwhile is not None
        with pytest.raises(PayloadError, match=rf"^jobs\[{BATCH - 1}\]: args\.x: nan"):
            reserve.meanwhile()
        good = jq._new_jobs([("t", {"i": i}) for i in range(BATCH)])
        assert isinstance(good, NewJobStream)
        reserve = next(insert_plan(good, "jobkeeper_test", in_transaction=True))
        assert isinstance(reserve, Execute) and reserve.meanwhile is not None
        reserve.meanwhile()
        assert len(good.heads) == BATCH  # all validated, kept for the COPY
    finally:
        jq.close()
