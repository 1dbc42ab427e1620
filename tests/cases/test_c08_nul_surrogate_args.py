"""C-08: a NUL character in args, rejected by jsonb with an opaque error
(awa#85, osbuild-composer#4779).

NUL and lone surrogates get the same clear validation error on both
backends, naming the field, at every way in (the API alone and in a batch of
ten, the string options, the CLI, even bytes that are not UTF-8 in argv), and
nothing is inserted. Valid Unicode (BMP, astral, line separators) reaches
the task byte for byte.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest

from backends.helpers import total_rows
from cli.helpers import assert_one_line_error
from jobkeeper import JobQueue, JobStatus, PayloadError
from support.cli import Cli

UNSTORABLE = [
    ({"s": "a\x00b"}, "args.s", "string 'a\\x00b' contains a NUL character (\\x00) at index 1"),
    ({"a\x00": 1}, "args", "object key 'a\\x00' contains a NUL character (\\x00) at index 1"),
    ({"s": "\ud800"}, "args.s", "string '\\ud800' contains a lone surrogate (\\ud800) at index 0"),
    ({"\udfff": 1}, "args", "object key '\\udfff' contains a lone surrogate (\\udfff) at index 0"),
    (
        {"l": ["ok", {"k": "x\x00"}]},
        "args.l[1].k",
        "string 'x\\x00' contains a NUL character (\\x00) at index 1",
    ),
]


@pytest.mark.parametrize(("args", "path", "says"), UNSTORABLE)
def test_c08_nul_and_lone_surrogates_get_one_clear_error_alone_and_in_a_batch(jq, args, path, says):
    @jq.task(name="t")
    def anything(**kwargs: Any) -> None: ...

    expected = f"{path}: {says}; it cannot be stored as JSON text"
    alone = {
        "enqueue": lambda: jq.enqueue("t", args),
        "task.enqueue": lambda: anything.enqueue(**args),
        "enqueue_async": lambda: asyncio.run(jq.enqueue_async("t", args)),
    }
    for way, call in alone.items():
        with pytest.raises(PayloadError) as info:
            call()
        assert str(info.value) == expected, way
    batch = [("t", {"i": i, "s": "fine"}) for i in range(10)]
    batch[3] = ("t", args)
    with pytest.raises(PayloadError) as info:
        jq.enqueue_many(batch)
    assert str(info.value) == f"jobs[3]: {expected}"
    with pytest.raises(PayloadError) as info:
        asyncio.run(jq.enqueue_many_async(batch))
    assert str(info.value) == f"jobs[3]: {expected}"
    assert total_rows(jq) == 0


@pytest.mark.parametrize("option", ["unique_key", "serial_key"])
@pytest.mark.parametrize("bad", ["a\x00b", "a\ud800b", "\udfff"])
def test_c08_string_options_refuse_nul_and_lone_surrogates_naming_the_option(jq, option, bad):
    with pytest.raises(PayloadError, match=rf"^{option}\b.*(NUL|lone surrogate)"):
        jq.enqueue("t", {}, **{option: bad})
    batch = [("t", {"i": i}) for i in range(10)]
    batch[9] = ("t", {}, {option: bad})
    with pytest.raises(PayloadError, match=rf"^jobs\[9\]: {option}\b.*(NUL|lone surrogate)"):
        jq.enqueue_many(batch)
    assert total_rows(jq) == 0


@pytest.fixture
def cli(db_url: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    runner = Cli(db_url, capsys)
    runner.ok("migrate")
    return runner


CLI_UNSTORABLE = [
    ('{"s": "a\\u0000b"}', "args.s", "NUL"),
    ('{"a\\u0000": 1}', "args", "NUL"),
    ('{"s": "\\ud800"}', "args.s", "lone surrogate"),
    ('{"l": [{"k": "\\udc00x"}]}', "args.l[0].k", "lone surrogate"),
]


@pytest.mark.parametrize(("text", "path", "kind"), CLI_UNSTORABLE)
def test_c08_cli_exits_2_naming_the_field(cli, text, path, kind):
    code, out, err = cli("enqueue", "t", "--args", text)
    assert code == 2, err
    assert_one_line_error(err, f"{path}: ", kind)
    assert out == ""
    with JobQueue(cli.url) as jq:
        assert total_rows(jq) == 0


def test_c08_cli_argv_bytes_that_are_not_utf8_exit_2(cli):
    """Python reads undecodable argv bytes as lone surrogates (surrogateescape)."""
    base = [sys.executable.encode(), b"-m", b"jobkeeper", b"--database", cli.url.encode()]
    for extra, needle in [
        ([b"--args", b'{"s": "caf\xe9"}'], b"args.s: "),
        ([b"--args", b'{"k\xff": 1}'], b"args: object key"),
        ([b"--unique-key", b"k\xff"], b"unique_key"),
    ]:
        done = subprocess.run(
            [*base, b"enqueue", b"t", *extra], capture_output=True, timeout=60, check=False
        )
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and b"lone surrogate" in lines[0], lines
    with JobQueue(cli.url) as jq:
        assert total_rows(jq) == 0


# -- valid Unicode round-trips byte for byte to the task -------------------------------------

VALID_UNICODE = {
    "s": "héllo ✓ 😀 \u2028",
    "bmp": "中文 العربية Ελληνικά",
    "astral": "𝄞 🏳️‍🌈 \U0010fffd",
    "separators": "\u2028\u2029\u0085",
    "controls": "\x01\x1f\x7f",
    "escapes": 'quote " backslash \\ slash / newline \n tab \t',
    "ключ 🔑": ["значение", {"深い": "値"}],
}


def utf8_strings(value: Any) -> list[bytes]:
    """Every key and string of ``value`` as UTF-8, in a canonical order."""
    if isinstance(value, str):
        return [value.encode("utf-8")]
    if isinstance(value, list):
        return [b for item in value for b in utf8_strings(item)]
    if isinstance(value, dict):
        return [b for key in sorted(value) for b in [key.encode(), *utf8_strings(value[key])]]
    return []


def test_c08_valid_unicode_reaches_the_task_byte_for_byte(make_queue, capsys):
    jq = make_queue()
    received: dict[int, dict[str, Any]] = {}

    @jq.task
    def echo(**kwargs: Any) -> dict[str, Any]:
        from jobkeeper import current_job

        received[current_job().id] = kwargs
        return kwargs

    alone = echo.enqueue(**VALID_UNICODE)
    batch = jq.enqueue_many([("echo", VALID_UNICODE), ("echo", {"s": "\u2028"})])
    cli = Cli(jq.url.url, capsys)
    # Through the CLI: raw UTF-8 text, and \u escapes (astral characters as pairs).
    from_cli = int(
        cli.ok("enqueue", "echo", "--args", json.dumps(VALID_UNICODE, ensure_ascii=False))
    )
    escaped = int(cli.ok("enqueue", "echo", "--args", json.dumps(VALID_UNICODE)))
    stats = jq.worker(burst=True).run()
    assert stats.exit_code == 0
    for job_id in (alone.id, batch[0].id, from_cli, escaped):
        got = received[job_id]
        assert got == VALID_UNICODE
        assert utf8_strings(got) == utf8_strings(VALID_UNICODE)
        done = jq.get_job(job_id)
        assert done is not None and done.status == JobStatus.COMPLETED
        assert utf8_strings(done.result) == utf8_strings(VALID_UNICODE)
    assert received[batch[1].id] == {"s": "\u2028"}
