"""A private PostgreSQL server for the soak, so that restarting (or SIGKILLing)
it never disturbs anyone else's server.

``initdb`` into a temporary directory owned by the ``postgres`` user (when run
as root; as another user, by that user), started with ``pg_ctl`` on a free
loopback port, removed by :meth:`PrivatePostgres.cleanup`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psycopg

from benchmarks.harness import pid_exists

PG_BIN = Path(os.environ.get("SOAK_PG_BIN", "/usr/lib/postgresql/15/bin"))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may hold spaces and parentheses.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    """Whether this pid is a live process (not a zombie)."""
    if not pid_exists(pid):
        return False
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


class PrivatePostgres:
    """One throw-away PostgreSQL cluster.

    Args:
        bindir: PostgreSQL's binaries (initdb, pg_ctl).
        database: the database created for the soak.
        listen: addresses to listen on besides 127.0.0.1 (the host sides of
            :mod:`benchmarks.soak.netns` veth pairs; they must exist when
            the server starts).
        trusted: networks (``10.213.0.0/30``) whose clients are trusted,
            as 127.0.0.1 is.
    """

    def __init__(
        self,
        bindir: Path = PG_BIN,
        database: str = "soak",
        listen: Sequence[str] = (),
        trusted: Sequence[str] = (),
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.bindir = bindir
        self.settings = dict(settings or {})
        self.database = database
        self.listen = list(listen)
        self.trusted = list(trusted)
        self.root = Path(tempfile.mkdtemp(prefix="jobkeeper-soak-pg-"))
        self.data = self.root / "data"
        self.logfile = self.root / "server.log"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0

    @property
    def url(self) -> str:
        return self.url_at("127.0.0.1")

    def url_at(self, host: str, database: str | None = None) -> str:
        """The URL of the soak's database (or ``database``) reached at ``host``."""
        return f"postgresql://postgres@{host}:{self.port}/{database or self.database}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", "postgres", "--"] if self._as_postgres else []
        return subprocess.run(
            [*prefix, *args], check=check, capture_output=True, text=True, timeout=120
        )

    def init(self) -> None:
        """initdb, configure, start, create the database."""
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"\nport = {self.port}\n"
                f"listen_addresses = '{','.join(['127.0.0.1', *self.listen])}'\n"
                f"unix_socket_directories = '{self.root}'\n"
                "max_connections = 300\n"
                "shared_buffers = 128MB\n"
                # A SIGKILLed server loses nothing the kernel already has:
                # fsync only protects against a machine crash, which the soak
                # does not simulate. Commits still wait for the WAL write.
                "fsync = off\n"
                "synchronous_commit = on\n"
                "full_page_writes = off\n"
                "log_min_messages = warning\n"
                "log_line_prefix = '%m [%p] %d '\n"
            )
            conf.writelines(f"{name} = {value}\n" for name, value in self.settings.items())
        with (self.data / "pg_hba.conf").open("a") as hba:
            for network in self.trusted:
                hba.write(f"host all all {network} trust\n")
        self.start()
        with psycopg.connect(self.url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')

    def start(self, timeout: float = 60) -> None:
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.logfile),
            "-w",
            "-t",
            str(int(timeout)),
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m fast|immediate`` (immediate = crash, recovery at start)."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-m", mode, "stop")

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def signal_all(self, signum: int) -> None:
        """``signum`` to the postmaster and every backend (SIGSTOP freezes
        the whole server, SIGCONT wakes it).
        """
        pid = self.postmaster_pid()
        assert pid is not None, "the server is not running"
        os.kill(pid, signum)
        for child in _children(pid):
            # A backend whose client went away ends between the listing and
            # the signal (a CI run: the SIGCONT of a cleanup met one gone).
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    def kill9(self, timeout: float = 20) -> None:
        """SIGKILL the postmaster, then wait for its backends to notice and exit
        (they would otherwise keep the old shared memory and block a restart).
        """
        pid = self.postmaster_pid()
        if pid is None or not _alive(pid):
            return
        children = _children(pid)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while any(_alive(p) for p in [pid, *children]) and time.monotonic() < deadline:
            time.sleep(0.05)
        for child in children:
            if _alive(child):
                # Our own server's leftover backend: SIGKILL it by pid too.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
        while any(_alive(p) for p in children) and time.monotonic() < deadline + 5:
            time.sleep(0.05)
        # The start-up check is kill(pid, 0), which a zombie still passes
        # until its parent reaps it: wait for that, else drop the stale lock.
        while pid_exists(pid) and time.monotonic() < deadline + 10:
            time.sleep(0.05)
        if pid_exists(pid) and not _alive(pid):
            (self.data / "postmaster.pid").unlink(missing_ok=True)

    def running(self) -> bool:
        pid = self.postmaster_pid()
        return pid is not None and _alive(pid)

    def cleanup(self) -> None:
        """Stop the server (immediately) and remove its directory."""
        if self.running():
            with contextlib.suppress(subprocess.SubprocessError):
                self.stop("immediate")
            if self.running():
                self.kill9()
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
