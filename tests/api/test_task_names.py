"""Issue 15, item 6: a misspelled task name or keyword is refused by name
before anything is written, on both backends; a task another service runs
is enqueued when the call (``external=True``) or the queue
(``JobQueue(external_tasks=...)``) says so.
"""

from __future__ import annotations

import asyncio

import pytest

from backends.helpers import total_rows
from jobkeeper import ConfigError, JobQueue, PayloadError


@pytest.fixture
def app(make_queue) -> JobQueue:
    jq = make_queue()

    @jq.task(queue="hooks")
    def send_webhook(url: str, retries: int = 3) -> None: ...

    @jq.task
    def resize(path: str) -> None: ...

    return jq


def test_an_unknown_task_name_is_refused_with_the_close_match(app):
    with pytest.raises(ConfigError) as info:
        app.enqueue("send_webhok", {"url": "https://x"})
    message = str(info.value)
    assert "unknown task 'send_webhok' (did you mean 'send_webhook'?)" in message
    assert "external=True" in message
    with pytest.raises(ConfigError, match=r"jobs\[1\]: unknown task 'rezise'"):
        app.enqueue_many([("resize", {"path": "a"}), ("rezise", {"path": "b"})])
    assert total_rows(app) == 0


def test_enqueue_async_refuses_it_too(app):
    async def main() -> None:
        try:
            with pytest.raises(ConfigError, match="unknown task 'send_webhok'"):
                await app.enqueue_async("send_webhok", {"url": "https://x"})
        finally:
            await app.aclose()

    asyncio.run(main())
    assert total_rows(app) == 0


def test_external_enqueues_a_task_another_service_runs(app):
    job = app.enqueue("billing_sync", {"account": 7}, external=True)
    assert (job.task, job.queue) == ("billing_sync", "default")
    (other,) = app.enqueue_many([("billing_sync", {}, {"external": True, "queue": "b"})])
    assert other.queue == "b"
    with pytest.raises(ConfigError, match="external must be True or False"):
        app.enqueue_many([("billing_sync", {}, {"external": "yes"})])


def test_a_queue_can_declare_its_external_tasks(make_queue):
    jq = make_queue(external_tasks=["billing_sync"])

    @jq.task
    def local() -> None: ...

    assert jq.enqueue("billing_sync", {}).task == "billing_sync"
    with pytest.raises(ConfigError, match="unknown task 'billing_snyc'"):
        jq.enqueue("billing_snyc", {})
    anything = make_queue(external_tasks=True)
    anything.task(local.fn)
    assert anything.enqueue("whatever", {}).task == "whatever"
    with pytest.raises(ConfigError, match="external_tasks must be a list"):
        make_queue(external_tasks="billing_sync")


def test_a_queue_without_tasks_enqueues_any_name(jq):
    assert jq.enqueue("send_webhok", {}).task == "send_webhok"


def test_a_misspelled_keyword_is_named(app):
    with pytest.raises(PayloadError) as info:
        app.enqueue("send_webhook", {"ulr": "https://x"})
    message = str(info.value)
    assert "unexpected keyword argument 'ulr' (did you mean 'url'?)" in message
    assert "missing 'url'" in message
    with pytest.raises(
        PayloadError, match=r"unexpected keyword argument 'retires' \(did you mean 'retries'\?\)"
    ):
        app.enqueue("send_webhook", {"url": "https://x", "retires": 2})
    with pytest.raises(PayloadError, match=r"unexpected keyword argument 'colour'$"):
        app.enqueue("resize", {"path": "a", "colour": 1})
    assert total_rows(app) == 0


def test_a_bad_option_names_the_public_method(app):
    # Break-test: Python's error named the mixin behind JobQueue
    # ("EnqueueMixin.enqueue() got an unexpected keyword argument").
    with pytest.raises(TypeError, match=r"^JobQueue\.enqueue\(\) got an unexpected keyword"):
        app.enqueue("resize", {"path": "a"}, dealy=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^JobQueue\.enqueue_many\(\)"):
        app.enqueue_many([], dealy=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^JobQueue\.get_job\(\)"):
        app.get_job(1, bogus=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^JobQueue\.wait_async\(\)"):
        asyncio.run(app.wait_async(1, bogus=1))  # type: ignore[call-arg]
    assert total_rows(app) == 0
