"""Hostile input through the CLI's ``enqueue``, on both backends.

``jobkeeper enqueue TASK --args JSON [--queue Q] [--delay S] [--priority P]
[--unique-key K]`` either exits 0 having stored exactly the parsed ``--args``,
or exits 2 with one ``error: ...`` line on stderr and nothing written. Never
exit 1, never a traceback.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from jobkeeper.cli.main import main

from .strategies import FUZZ, any_text, hostile_values, json_values, name_text, row_count, same_json

pytestmark = pytest.mark.slow

SPECIAL_ARGS = [
    "",
    " ",
    "{}",
    " {} ",
    "null",
    "[]",
    '"text"',
    "1",
    '{"x": NaN}',
    '{"x": Infinity}',
    '{"x": -Infinity}',
    '{"a": [1, {"b": NaN}]}',
    '{"x": 1e999}',
    '{"x": -1e999}',
    '{"x": ' + "1" * 5000 + "}",
    '{"a": 1, "a": 2}',
    '{"\\u0000": 1}',
    '{"s": "a\\u0000b"}',
    '{"s": "\\ud800"}',
    '{"s": "h\\u00e9llo \\u2713 \\ud83d\\ude00 \\u2028"}',
    '{"x": 1',
    '{"x": 1}}',
    "{'x': 1}",
    '{"x": 1} trailing',
    "[" * 5000 + "]" * 5000,
    '{"a": ' * 2000 + "1" + "}" * 2000,
    '{"q": "\'; DROP TABLE jobkeeper_jobs; --"}',
    "@\x00",  # found by this test in a clean-clone run: open() raised ValueError
    "@a\x00b",
    "@\ud800",
    "@",
]


def mutate(text: str, position: int, insert: str, cut: int) -> str:
    position %= len(text) + 1
    return text[:position] + insert + text[position + cut :]


def loose_dumps(value: object) -> str:
    """JSON text of anything: NaN as ``NaN``, non-JSON objects as their repr
    (a string), ints too long for ``str()`` as a 5,000-digit literal.
    """
    try:
        return json.dumps({"v": value}, allow_nan=True, default=repr)
    except ValueError:
        return '{"v": ' + "9" * 5000 + "}"


json_text = st.builds(json.dumps, json_values) | st.builds(loose_dumps, hostile_values)
args_text = (
    st.sampled_from(SPECIAL_ARGS)
    | json_text
    | st.builds(mutate, json_text, st.integers(0, 60), any_text, st.integers(0, 3))
    | any_text
)


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    else:  # pragma: no cover - main always exits
        code = 0
    out, err = capsys.readouterr()
    return code, out, err


def check_refusal(code: int, err: str) -> None:
    assert code == 2, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err


@FUZZ
@given(text=args_text)
@example(text='{"x": ' + "1" * 5000 + "}")  # longer than Python's int-to-str limit
@example(text="[" * 5000 + "]" * 5000)
@example(text='{"x": NaN}')
@example(text="@\x00")
@example(text="@\ud800")
def test_cli_args_are_stored_exactly_or_refused(jq, capsys, text):
    before = row_count(jq)
    code, out, err = run_cli(
        capsys, ["--database", jq.url.url, "enqueue", "fuzz.cli", "--args", text]
    )
    if code != 0:
        check_refusal(code, err)
        assert row_count(jq) == before
        return
    assert row_count(jq) == before + 1
    stored = jq.get_job(int(out.strip()))
    assert stored is not None
    assert same_json(stored.args, json.loads(text))


option_text = any_text | st.from_regex(
    r"-?[0-9]{1,12}(\.[0-9]*)?(e[+-]?[0-9]{1,4})?", fullmatch=True
)


@FUZZ
@given(
    task=name_text,
    queue=st.none() | name_text,
    delay=st.none() | option_text | st.sampled_from(["nan", "inf", "-1", "1e400", "0"]),
    priority=st.none() | option_text | st.sampled_from(["2147483648", "-0", "1.5"]),
    unique_key=st.none() | any_text,
)
def test_cli_options_are_used_or_refused(jq, capsys, task, queue, delay, priority, unique_key):
    argv = ["--database", jq.url.url, "enqueue", "--args", '{"k": 1}']
    for flag, value in (
        ("--queue", queue),
        ("--delay", delay),
        ("--priority", priority),
        ("--unique-key", unique_key),
    ):
        if value is not None:
            argv.append(f"{flag}={value}")
    argv += ["--", task]
    before = row_count(jq)
    code, out, err = run_cli(capsys, argv)
    if code != 0:
        check_refusal(code, err)
        assert row_count(jq) == before
        return
    stored = jq.get_job(int(out.strip()))
    assert stored is not None
    assert (stored.task, stored.args) == (task, {"k": 1})
    if unique_key is not None:
        assert stored.unique_key == unique_key
    if row_count(jq) == before:
        # The key matched a pending job of an earlier example: that job is
        # returned as it was stored (unique_key dedupe), not this one's options.
        assert unique_key is not None
        return
    assert row_count(jq) == before + 1
    if queue is not None:
        assert stored.queue == queue
