"""The worker processes ``jobkeeper verify`` starts, and the faults it
injects into them: SIGKILL and restart, SIGSTOP past ``rescue_after`` and
SIGCONT, a graceful stop (SIGTERM) and restart.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from jobkeeper.verify.history import Life

#: The faults, in the order they are injected (round robin).
FAULTS = ("kill", "stop", "restart")


class Fleet:
    """Worker subprocesses in numbered slots.

    Args:
        url: the database URL.
        queue: the run's queue.
        count: worker processes.
        concurrency: ``--concurrency`` of each.
        env: extra environment (the ``JKVERIFY_*`` settings).
        log_dir: where each process's stderr goes.
        stop_for: seconds a SIGSTOP lasts.
    """

    def __init__(
        self,
        url: str,
        queue: str,
        count: int,
        concurrency: int,
        env: dict[str, str],
        log_dir: Path,
        stop_for: float,
    ) -> None:
        self.url = url
        self.queue = queue
        self.count = count
        self.concurrency = concurrency
        self.env = {**os.environ, **env, "JOBKEEPER_DATABASE_URL": url}
        self.log_dir = log_dir
        self.stop_for = stop_for
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.current: dict[int, Life] = {}
        self.lives: list[Life] = []
        self.faults: Counter[str] = Counter()
        self.unexpected: list[str] = []
        self._paused: dict[int, float] = {}  # slot -> SIGCONT due (monotonic)
        self._lock = threading.RLock()
        self._next = 0
        self._starts = 0

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "jobkeeper",
            # No --database: the URL (and its password) would show in `ps`;
            # the workers read JOBKEEPER_DATABASE_URL from their environment.
            "worker",
            "--app",
            "jobkeeper.verify.app:jq",
            "--queue",
            self.queue,
            "--concurrency",
            str(self.concurrency),
        ]

    def start(self, slot: int) -> None:
        with self._lock:
            self._starts += 1
            log = self.log_dir / f"worker-{slot}-{self._starts}.log"
            with log.open("wb") as stderr:
                proc = subprocess.Popen(
                    self.command(),
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    # Its own process group: a Ctrl-C in the terminal reaches
                    # the driver alone, which stops the workers itself.
                    start_new_session=True,
                )
            self.procs[slot] = proc
            life = Life(proc.pid, time.time())
            self.lives.append(life)
            self.current[slot] = life

    def start_all(self) -> None:
        for slot in range(self.count):
            self.start(slot)

    def logs(self) -> list[Path]:
        return sorted(self.log_dir.glob("worker-*.log"))

    def _reap(self, slot: int, *, killed: bool) -> None:
        proc = self.procs.pop(slot)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        life = self.current.pop(slot)
        life.ended = time.time()
        life.killed = killed

    def kill(self, slot: int) -> None:
        """SIGKILL the slot's process (paused or not), reap it, start another."""
        with self._lock:
            self._resume(slot)
            with contextlib.suppress(ProcessLookupError):
                self.procs[slot].send_signal(signal.SIGKILL)
            self._reap(slot, killed=True)
            self.start(slot)

    def restart(self, slot: int) -> None:
        """Stop the slot's process gracefully (SIGTERM: it finishes or hands
        back its jobs), then start another.
        """
        with self._lock:
            self.procs[slot].send_signal(signal.SIGTERM)
            self._reap(slot, killed=False)
            self.start(slot)

    def pause(self, slot: int) -> None:
        """SIGSTOP the slot's process; :meth:`tick` sends SIGCONT after ``stop_for``."""
        with self._lock:
            self.procs[slot].send_signal(signal.SIGSTOP)
            self.current[slot].pauses.append((time.time(), time.time()))
            self._paused[slot] = time.monotonic() + self.stop_for

    def _resume(self, slot: int) -> None:
        if self._paused.pop(slot, None) is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.procs[slot].send_signal(signal.SIGCONT)
        life = self.current[slot]
        stopped, _ = life.pauses[-1]
        life.pauses[-1] = (stopped, time.time())

    def tick(self) -> None:
        """Send the SIGCONTs due, and restart processes that exited on their own."""
        with self._lock:
            for slot, due in list(self._paused.items()):
                if time.monotonic() >= due:
                    self._resume(slot)
            for slot, proc in list(self.procs.items()):
                code = proc.poll()
                if code is not None:
                    self.unexpected.append(f"worker {proc.pid} exited with {code}")
                    self._reap(slot, killed=False)
                    self.start(slot)

    def inject(self) -> str:
        """The next fault of ``FAULTS`` on a running, unpaused worker; at most
        one worker is paused at a time, so the others keep the jobs moving.
        """
        with self._lock:
            kind = FAULTS[self._next % len(FAULTS)]
            self._next += 1
            running = [slot for slot in sorted(self.procs) if slot not in self._paused]
            if kind == "stop" and (self._paused or len(running) < 2):
                kind = "kill"
            slot = running[self.faults.total() % len(running)]
            {"kill": self.kill, "stop": self.pause, "restart": self.restart}[kind](slot)
            self.faults[kind] += 1
            return kind

    def pids(self) -> set[int]:
        """The pids of the processes running now."""
        with self._lock:
            return {proc.pid for proc in self.procs.values()}

    def paused(self) -> bool:
        with self._lock:
            return bool(self._paused)

    def stop_all(self, timeout: float = 30.0) -> dict[int, int | None]:
        """Resume the paused, SIGTERM everyone, wait up to ``timeout``, SIGKILL
        the rest. Returns pid -> exit code. Safe to call twice.
        """
        with self._lock:
            for slot in list(self._paused):
                self._resume(slot)
            for proc in self.procs.values():
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            codes: dict[int, int | None] = {}
            for slot, proc in list(self.procs.items()):
                try:
                    proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
                codes[proc.pid] = proc.returncode
                self._reap(slot, killed=False)
            return codes
