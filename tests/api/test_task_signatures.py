"""Which function signatures a task may have: jobs pass their args as a JSON
object, by keyword, so a parameter that can only be passed by position is
refused at registration, where ``@jq.task() def f(a, /, b=2)`` registered
and no job could ever run it.
"""

from __future__ import annotations

import pytest

from jobkeeper import ConfigError, JobQueue, PayloadError
from jobkeeper.testing import drain


def test_a_required_positional_only_parameter_is_refused_at_registration(
    jq: JobQueue,
) -> None:
    def charge(order_id: int, /, amount: int = 2) -> None: ...

    with pytest.raises(ConfigError) as refused:
        jq.task()(charge)
    message = str(refused.value)
    assert message.startswith("task 'charge': parameter 'order_id' of ")
    assert "charge" in message.partition("of ")[2]
    assert "positional-only (before '/')" in message
    assert "make it a keyword parameter" in message
    assert "charge" not in jq.tasks

    async def later(a: int, b: int, /) -> None: ...

    with pytest.raises(ConfigError, match=r"^task 'renamed': parameter 'a' of .*later"):
        jq.task(name="renamed")(later)
    assert jq.stats() == {}


def test_a_positional_only_parameter_with_a_default_takes_its_default(
    jq: JobQueue,
) -> None:
    # Never passed (jobs pass keywords), so always its default: allowed.
    @jq.task()
    def scaled(factor: int = 10, /, value: int = 1) -> int:
        return factor * value

    with pytest.raises(PayloadError, match="factor"):
        scaled.enqueue(factor=3, value=2)  # type: ignore[call-arg]
    job = scaled.enqueue(value=4)
    assert drain(jq) == {"completed": 1}
    assert jq.get_job(job.id).result == 40  # type: ignore[union-attr]


def test_var_positional_parameters_do_not_stop_a_task_from_running(
    jq: JobQueue,
) -> None:
    # *args is always empty for a job; the parameters before it are ordinary
    # ones, passed by keyword.
    @jq.task()
    def first(a: int, *rest: int) -> list[int]:
        return [a, *rest]

    @jq.task()
    def only_rest(*rest: int) -> int:
        return len(rest)

    jobs = [first.enqueue(a=1), only_rest.enqueue()]
    assert drain(jq) == {"completed": 2}
    assert [jq.get_job(job.id).result for job in jobs] == [[1], 0]  # type: ignore[union-attr]
