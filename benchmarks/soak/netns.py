"""Worker "hosts" in network namespaces of their own, and partitions of them.

Each :class:`Host` is a network namespace joined to this machine by a veth
pair on a private /30 (host side ``.1``, namespace side ``.2``); a process
started with :meth:`Host.wrap` sees only that link, so PostgreSQL is reached
at :attr:`Host.gateway` (the server must listen there, see
:class:`benchmarks.soak.pg.PrivatePostgres`). :meth:`Host.cut` drops its
traffic with iptables inside the namespace: both ways, only outgoing or only
incoming; :meth:`Host.heal` lets it through again. Nothing is changed outside
the namespaces but the host ends of the veth pairs, which the kernel removes
with their namespace.

Names are ``jkp<pid>n<index>`` (namespace) and ``jkp<pid>n<index>h`` (host
veth): unique per run, parallel runs never clash, and a run killed before
its clean-up is recognised by its pid being gone (:func:`remove_leftovers`).
The /30 blocks come from 10.213.0.0/16, picked under a lock file among those
no interface uses yet. Needs root, ``ip`` (iproute2) and ``iptables``
(Debian's packages): :func:`ensure_tools` installs the missing ones as root.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

PREFIX = "jkp"
POOL = ipaddress.ip_network("10.213.0.0/16")
LOCK = Path("/run/lock/jobkeeper-netns.lock")
#: The directions a host can be cut off in.
CUTS = ("both", "out", "in")
_NAME = re.compile(rf"^{PREFIX}(\d+)n(\d+)$")


class NamespaceError(RuntimeError):
    """A namespace could not be made (not root, no ``ip``/``iptables``, a
    kernel without network namespaces).
    """


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except FileNotFoundError as exc:
        raise NamespaceError(f"{args[0]} is not installed") from exc
    if check and done.returncode != 0:
        raise NamespaceError(f"{' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def ensure_tools() -> None:
    """Install Debian's ``iproute2`` and ``iptables`` when missing (as root,
    as the Makefile does for pgbouncer).

    Raises:
        NamespaceError: one is missing and cannot be installed here.
    """
    missing = [
        pkg for tool, pkg in (("ip", "iproute2"), ("iptables", "iptables")) if not _has(tool)
    ]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise NamespaceError(
            f"missing {', '.join(missing)}: apt-get install -y {' '.join(missing)}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", *missing]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        if subprocess.run(install, env=env, capture_output=True).returncode != 0:
            raise NamespaceError(f"could not install {', '.join(missing)}")


def _has(tool: str) -> bool:
    return shutil.which(tool) is not None or Path("/usr/sbin", tool).exists()


def available() -> str | None:
    """None if namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    try:
        ensure_tools()
        probe = f"{PREFIX}{os.getpid()}probe"
        _run("ip", "netns", "add", probe)
        _run("ip", "netns", "del", probe)
    except NamespaceError as exc:
        return str(exc)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_leftovers() -> list[str]:
    """Delete the namespaces (and host veths) of runs whose process is gone
    (a killed run never cleaned up); returns their names.
    """
    removed = []
    for name in _namespaces():
        match = _NAME.match(name)
        if match and not _pid_alive(int(match.group(1))):
            _destroy(name)
            removed.append(name)
    links = _run("ip", "-o", "link", "show", check=False).stdout
    for veth in re.findall(rf"^\d+: ({PREFIX}(\d+)n\d+h)[@:]", links, flags=re.M):
        if not _pid_alive(int(veth[1])):
            _run("ip", "link", "del", veth[0], check=False)
            removed.append(veth[0])
    return removed


def _destroy(name: str) -> None:
    _run("ip", "link", "del", f"{name}h", check=False)
    _run("ip", "netns", "del", name, check=False)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _free_block() -> ipaddress.IPv4Network:
    out = _run("ip", "-4", "-o", "addr", "show", check=False).stdout
    used = {
        ipaddress.ip_interface(addr).network
        for addr in re.findall(r"inet (\S+)", out)
        if ipaddress.ip_interface(addr).ip in POOL
    }
    for block in POOL.subnets(new_prefix=30):
        if not any(block.overlaps(u) for u in used):
            return block  # type: ignore[return-value]
    raise NamespaceError(f"no free /30 left in {POOL}")


class Host:
    """One network namespace with a veth pair to this machine.

    Args:
        index: its number in this run (names are unique per run and index).

    Raises:
        NamespaceError: it could not be made (what was made is removed).
    """

    def __init__(self, index: int) -> None:
        self.name = f"{PREFIX}{os.getpid()}n{index}"
        self.veth_host = f"{self.name}h"
        self.veth_ns = "eth0"
        self.cut_kind: str | None = None
        _destroy(self.name)  # idempotent: a leftover of ours with this name
        with _locked():
            block = _free_block()
            hosts = list(block.hosts())
            self.gateway = str(hosts[0])  # the host side: PostgreSQL listens here
            self.address = str(hosts[1])
            self.subnet = str(block)
            try:
                _run("ip", "netns", "add", self.name)
                _run("ip", "link", "add", self.veth_host, "type", "veth", "peer", "name", "jkpeer")
                _run("ip", "link", "set", "jkpeer", "netns", self.name)
                _run("ip", "addr", "add", f"{self.gateway}/30", "dev", self.veth_host)
                _run("ip", "link", "set", self.veth_host, "up")
            except NamespaceError:
                _destroy(self.name)
                raise
        try:
            self.ip("link", "set", "jkpeer", "name", self.veth_ns)
            self.ip("addr", "add", f"{self.address}/30", "dev", self.veth_ns)
            self.ip("link", "set", self.veth_ns, "up")
            self.ip("link", "set", "lo", "up")
        except NamespaceError:
            _destroy(self.name)
            raise

    def ip(self, *args: str) -> None:
        """``ip -n NAME ...``."""
        _run("ip", "-n", self.name, *args)

    def _iptables(self, *args: str) -> None:
        _run("ip", "netns", "exec", self.name, "iptables", "-w", *args)

    def wrap(self, command: list[str]) -> list[str]:
        """``command`` run inside this namespace."""
        return ["ip", "netns", "exec", self.name, *command]

    def cut(self, kind: str = "both") -> None:
        """Drop this host's traffic: ``both`` ways, only ``out`` (what it
        sends), or only ``in`` (what it receives). Silent drops, as a
        partition is: no reset, no unreachable error.
        """
        if kind not in CUTS:
            raise ValueError(f"cut kind {kind!r}: one of {CUTS}")
        self.heal()
        if kind in ("both", "out"):
            self._iptables("-A", "OUTPUT", "-o", self.veth_ns, "-j", "DROP")
        if kind in ("both", "in"):
            self._iptables("-A", "INPUT", "-i", self.veth_ns, "-j", "DROP")
        self.cut_kind = kind

    def heal(self) -> None:
        """Let all traffic through again."""
        self._iptables("-F", "INPUT")
        self._iptables("-F", "OUTPUT")
        self.cut_kind = None

    def destroy(self) -> None:
        """Remove the namespace and its veth pair (idempotent)."""
        _destroy(self.name)


class Hosts:
    """``count`` hosts, removed together (a context manager).

    Raises:
        NamespaceError: see :class:`Host`.
    """

    def __init__(self, count: int) -> None:
        remove_leftovers()
        self.hosts: list[Host] = []
        try:
            for index in range(count):
                self.hosts.append(Host(index))
        except BaseException:
            self.destroy()
            raise

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def __len__(self) -> int:
        return len(self.hosts)

    @property
    def gateways(self) -> list[str]:
        return [host.gateway for host in self.hosts]

    @property
    def subnets(self) -> list[str]:
        return [host.subnet for host in self.hosts]

    def destroy(self) -> None:
        for host in self.hosts:
            host.destroy()
