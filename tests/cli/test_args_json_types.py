"""``--args`` that is JSON but not an object names the type as JSON does.

Found by a break-test: ``--args null`` said "got NoneType" (and ``[1]``
"got list", ``"x"`` "got str"): Python's names for what the user wrote as JSON.
"""

from __future__ import annotations

from backends.helpers import total_rows
from cli.helpers import assert_one_line_error
from jobkeeper import JobQueue
from support.cli import Cli

NOT_OBJECTS = {
    "null": "null",
    "[1, 2]": "array",
    '"x"': "string",
    "1": "number",
    "-2.5e3": "number",
    "true": "boolean",
    "false": "boolean",
}


def test_a_non_object_is_named_by_its_json_type(cli: Cli, queue: JobQueue) -> None:
    for text, name in NOT_OBJECTS.items():
        code, out, err = cli("enqueue", "t", "--args", text)
        assert code == 2 and out == "", err
        assert_one_line_error(err, f"--args must be a JSON object, got {name}: {text}")
    assert total_rows(queue) == 0
