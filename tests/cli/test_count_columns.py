"""``status`` and ``queues list`` never cut a count short on a narrow
terminal: a count folds onto a second line, as every column of ``jobs
list`` does, and keeps all its digits.

Found by a break-test: 123,456 available jobs showed as "1234…" at 80
columns beside a long queue name (Rich's default overflow is an ellipsis).
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table

from jobkeeper import JobStatus
from jobkeeper.cli.render import queues_table, status_table
from jobkeeper.queues import QueueInfo

LONG_NAME = "a_rather_long_queue_name_for_the_nightly_reports.export"
COUNTS = {"available": 123456, "claimed": 7, "running": 12, "scheduled": 98765, "retryable": 4321}


def cells(table: Table, width: int) -> list[str]:
    """The text of each cell of a one-row table rendered ``width`` columns
    wide, its folded lines joined.
    """
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(table)
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    body = lines[next(i for i, line in enumerate(lines) if line.startswith("┡")) + 1 : -1]
    assert all(len(line) <= width for line in lines)
    columns = [line.split("│")[1:-1] for line in body]
    return ["".join(part.strip() for part in column) for column in zip(*columns, strict=True)]


@pytest.mark.parametrize("width", [60, 80, 120])
def test_queues_list_keeps_every_digit(width: int) -> None:
    queue = QueueInfo(LONG_NAME, False, 10, "100/s", 5000, dict(COUNTS))
    shown = cells(queues_table([queue]), width)
    assert shown[0] == LONG_NAME
    assert shown[-5:] == [str(n) for n in COUNTS.values()]


@pytest.mark.parametrize("width", [60, 80, 120])
def test_status_keeps_every_digit(width: int) -> None:
    per_status = {"available": 123456, "completed": 9876543, "dead": 12}
    shown = cells(status_table({LONG_NAME: per_status}), width)
    assert shown[0] == LONG_NAME
    assert shown[1:] == [str(per_status.get(status.value, 0)) for status in JobStatus]
