"""The oban adapter of the benchmark (see :mod:`benchmarks.libs`): the Python
Oban runs in a virtualenv of its own, driven through its CLI and
``benchmarks/apps/oban_adapter.py``.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.harness import ROOT, NotAvailableError
from benchmarks.libs import CONCURRENCY, Block, CallTimes, Library, Probe
from benchmarks.oban_env import ObanEnv, child_env, ensure, run_in_venv


class Oban(Library):
    """The Python Oban (PyPI ``oban``). Every release requires Python >= 3.12,
    so it runs in a virtualenv of its own (``.venv-oban``, made by
    :func:`benchmarks.oban_env.ensure` with a Python >= 3.12 found on the
    machine) and this harness, whatever its Python, never imports it: schema
    and worker go through oban's CLI (``oban install``, ``oban start``), the
    enqueues through ``benchmarks/apps/oban_adapter.py`` run by that venv's
    interpreter, which times its own calls and prints JSON.
    """

    name = "oban"

    def __init__(self) -> None:
        self.env: ObanEnv | None = None
        self.unavailable = "oban was not set up (benchmarks.oban_env.ensure)"
        self.worker_settings = ""

    def setup(self) -> None:
        try:
            self.env = ensure()
        except NotAvailableError as exc:
            self.unavailable = str(exc)
            return
        except Exception as exc:
            self.unavailable = f"setting up .venv-oban failed: {type(exc).__name__}: {exc}"
            return
        self.unavailable = None
        self.version = self.env.oban_version
        self.worker_settings = (
            f"oban start --queues default:{CONCURRENCY} (oban's CLI) on Python "
            f"{self.env.python_version} in {self.env.venv.name}, defaults otherwise: "
            "psycopg pool 1-10, uvloop, LISTEN/NOTIFY wake-ups, 5 ms fetch debounce, stager "
            "1 s, leadership on, a JSON log line per job start and stop; async workers"
        )

    def _env(self) -> ObanEnv:
        if self.env is None:
            raise NotAvailableError(self.unavailable or "oban is not set up")
        return self.env

    def _adapter(self, *args: str, timeout: float = 1800) -> dict[str, Any]:
        """Run one adapter command with the venv's Python; its JSON answer."""
        argv = [self._env().python, "-m", "benchmarks.apps.oban_adapter", *args]
        out = run_in_venv(argv, f"oban adapter {args[0]}", timeout=timeout)
        return dict(json.loads(out.strip().splitlines()[-1]))

    def prepare(self, url: str) -> None:
        run_in_venv([self._env().oban_cli, "install", "--dsn", url], "oban install", timeout=300)

    @contextlib.contextmanager
    def single_enqueuer(self, url: str) -> Iterator[Block]:
        """The calls are timed in the adapter (``blocks``): the pipe's hops
        are in no figure."""
        with self._served("blocks", url) as ask:

            def block(k: int) -> CallTimes:
                answer = json.loads(ask(str(k)))
                return CallTimes(float(answer["seconds"]), [float(d) for d in answer["durations"]])

            yield block

    @contextlib.contextmanager
    def bulk_enqueuer(self, url: str, batch: int) -> Iterator[Block]:
        with self._served("blocks", url, str(batch)) as ask:
            yield lambda k: CallTimes(float(json.loads(ask(str(k)))["seconds"]), [])

    def fill(self, url: str, n: int) -> None:
        self._adapter("fill", url, str(n))

    def worker_command(self, url: str) -> tuple[list[str], dict[str, str]]:
        argv = [
            self._env().oban_cli,
            "start",
            "--dsn",
            url,
            "--queues",
            f"default:{CONCURRENCY}",
            "--cron-modules",
            "benchmarks.apps.oban_app",
        ]
        return argv, {"PYTHONPATH": child_env()["PYTHONPATH"]}

    def probe(self, url: str) -> Probe:
        # oban keeps finished jobs (state completed; pruned after a day).
        return Probe(
            url,
            "SELECT count(*) FROM oban_jobs "
            "WHERE state IN ('available', 'scheduled', 'executing', 'retryable')",
            "SELECT count(*) FROM oban_jobs WHERE state = 'completed'",
        )

    @contextlib.contextmanager
    def _served(self, command: str, url: str, *more: str) -> Iterator[Callable[[str], str]]:
        """A long-lived adapter process (``stamper`` or ``blocks``), once it
        has said ``ready``; yields ``ask(line)``: writes ``line`` to it and
        returns its one-line answer. End of input ends it.
        """
        argv = [self._env().python, "-m", "benchmarks.apps.oban_adapter", command, url, *more]
        with tempfile.TemporaryFile() as errors:
            proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=child_env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                bufsize=1,
            )
            assert proc.stdin is not None and proc.stdout is not None
            stdin, stdout = proc.stdin, proc.stdout

            def fail(what: str) -> NotAvailableError:
                proc.poll()
                errors.seek(0)
                lines = errors.read().decode(errors="replace").strip().splitlines()
                return NotAvailableError(
                    f"oban adapter {command} {what} (exit {proc.returncode}): "
                    f"{lines[-1] if lines else '(no output)'}"
                )

            def ask(line: str) -> str:
                stdin.write(f"{line}\n")
                stdin.flush()
                answer = stdout.readline()
                if not answer:
                    raise fail(f"gave no answer to {line!r}")
                return answer

            try:
                if stdout.readline().strip() != "ready":
                    raise fail("did not start")
                yield ask
            finally:
                with contextlib.suppress(OSError):
                    stdin.close()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    @contextlib.contextmanager
    def stamper(self, url: str) -> Iterator[Callable[[int, float], float | None]]:
        """Enqueues through a long-lived adapter process over pipes: each call
        writes ``<i> <t>`` and returns once it has read ``ok <returned>``
        (sent once the insert committed). The adapter stamps the job with its
        own ``time.time()`` just before its enqueue call, and the call returns
        the adapter's time just after it, so the pipe's hops are left out.
        """
        with self._served("stamper", url) as ask:

            def enqueue(i: int, t: float) -> float:
                answer = ask(f"{i} {t!r}").split()
                if len(answer) != 2 or answer[0] != "ok":
                    raise NotAvailableError(f"oban adapter stamper failed to enqueue job {i}")
                return float(answer[1])

            yield enqueue
