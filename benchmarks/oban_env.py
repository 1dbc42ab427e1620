"""The second virtualenv the oban measurements run in.

Every release of ``oban`` (the Python Oban on PyPI) requires Python >= 3.12,
and jobkeeper's ``.venv`` may be older (3.11 here). So the suite keeps
``.venv-oban`` beside ``.venv``: made with a Python >= 3.12 found on this
machine, with ``benchmarks/requirements-oban.txt`` installed in it. The
harness never imports oban; it runs oban's CLI and
``benchmarks/apps/oban_adapter.py`` with that interpreter.

The interpreter is, in this order: ``$JOBKEEPER_BENCH_OBAN_PYTHON``;
``python3.12`` on ``PATH``; ``$PYENV_ROOT/versions/3.12.*/bin/python`` (and
``~/.pyenv``, ``/root/.pyenv``); then the same for 3.13 and 3.14. Each is
run to see that it works and is >= 3.12 (a pyenv shim may be on ``PATH``
and still fail). With none, oban is reported n/a with what was tried.

``.venv-oban/.bench-installed`` records the requirements it was installed
from; when they change it is installed again. ``python -m benchmarks.oban_env``
does the set-up alone and prints what it found.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import ROOT, NotAvailableError, log

VENV_ENV = "JOBKEEPER_BENCH_OBAN_VENV"
PYTHON_ENV = "JOBKEEPER_BENCH_OBAN_PYTHON"
REQUIREMENTS = ROOT / "benchmarks" / "requirements-oban.txt"
MINIMUM = (3, 12)
STAMP = ".bench-installed"


@dataclass(frozen=True)
class ObanEnv:
    venv: Path
    python: str
    python_version: str
    oban_version: str

    @property
    def oban_cli(self) -> str:
        return str(self.venv / "bin" / "oban")


def venv_path() -> Path:
    return Path(os.environ.get(VENV_ENV) or ROOT / ".venv-oban")


def child_env() -> dict[str, str]:
    """The environment of every process run with the venv's interpreter: the
    repository root on ``PYTHONPATH`` (for ``benchmarks.apps``) and nothing
    of the caller's ``PYTHONPATH`` or virtualenv.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _probe(python: str) -> str | None:
    """The interpreter's version if it runs and is new enough, else None."""
    try:
        out = subprocess.run(
            [
                python,
                "-c",
                "import sys; print(sys.version.split()[0]); "
                f"sys.exit(0 if sys.version_info >= {MINIMUM!r} else 3)",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _candidates() -> list[str]:
    found: list[str] = []
    override = os.environ.get(PYTHON_ENV)
    if override:
        found.append(override)
    roots = [os.environ.get("PYENV_ROOT"), str(Path.home() / ".pyenv"), "/root/.pyenv"]
    for minor in ("3.12", "3.13", "3.14"):
        on_path = shutil.which(f"python{minor}")
        if on_path:
            found.append(on_path)
        for root in filter(None, roots):
            found += sorted(glob.glob(f"{root}/versions/{minor}.*/bin/python"), reverse=True)
    unique: list[str] = []
    for path in found:
        if path not in unique:
            unique.append(path)
    return unique


def find_python() -> tuple[str, str]:
    """A working Python >= 3.12: ``(path, version)``."""
    tried = _candidates()
    for python in tried:
        version = _probe(python)
        if version:
            return python, version
    where = ", ".join(tried) if tried else "no candidate found"
    raise NotAvailableError(
        f"oban (PyPI) requires Python >= 3.12, and no working one was found to make "
        f"{venv_path().name} with (looked at ${PYTHON_ENV}, python3.12/3.13/3.14 on PATH and "
        f"pyenv's versions 3.12+: {where}; set ${PYTHON_ENV} to one)"
    )


def _stamp() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()


def _run_logged(argv: list[str], what: str, log_path: Path) -> None:
    with log_path.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        lines = log_path.read_text(errors="replace").strip().splitlines()
        tail = " | ".join(line.strip() for line in lines[-3:])
        raise NotAvailableError(f"{what} failed (exit {code}; {log_path}): {tail}")


def run_in_venv(argv: list[str], what: str, *, timeout: float) -> str:
    """Run ``argv`` (the venv's Python and its arguments) from the repository
    root with :func:`child_env`; its stdout.

    Raises:
        NotAvailableError: naming ``what``, the exit code and the last line
            the command printed.
    """
    out = subprocess.run(
        argv,
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if out.returncode != 0:
        text = (out.stderr or out.stdout).strip().splitlines()
        raise NotAvailableError(
            f"{what} exited with code {out.returncode}: {text[-1] if text else '(no output)'}"
        )
    return out.stdout


def _smoke(venv: Path) -> tuple[str, str]:
    """Import oban and the benchmark workers in the venv: ``(python, oban)`` versions."""
    python = str(venv / "bin" / "python")
    out = run_in_venv(
        [python, "-m", "benchmarks.apps.oban_adapter", "version"],
        f"importing oban in {venv}",
        timeout=120,
    )
    found = json.loads(out.strip().splitlines()[-1])
    return found["python"], found["oban"]


def ensure() -> ObanEnv:
    """The venv, made or brought up to date first if need be; raises
    :class:`NotAvailableError` saying why when it cannot be had.
    """
    venv = venv_path()
    python = venv / "bin" / "python"
    stamp = venv / STAMP
    current = stamp.exists() and stamp.read_text().strip() == _stamp()
    if not (python.exists() and _probe(str(python))):
        base, version = find_python()
        log(f"oban: creating {venv} with Python {version} ({base})")
        made = subprocess.run(
            [base, "-m", "venv", "--clear", str(venv)],
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            text = (made.stderr or made.stdout).strip().splitlines()
            raise NotAvailableError(
                f"{base} -m venv {venv} failed: {text[-1] if text else made.returncode}"
            )
        current = False
    if not current:
        log_path = venv / "bench-install.log"
        log(f"oban: installing {REQUIREMENTS.relative_to(ROOT)} into {venv} (log: {log_path})")
        log_path.write_text("")
        _run_logged(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "-r",
                str(REQUIREMENTS),
            ],
            f"pip install -r {REQUIREMENTS.name}",
            log_path,
        )
        stamp.write_text(_stamp() + "\n")
    python_version, oban_version = _smoke(venv)
    return ObanEnv(venv, str(python), python_version, oban_version)


def main() -> int:
    try:
        env = ensure()
    except NotAvailableError as exc:
        print(f"oban: n/a: {exc}")
        return 0  # not an error for `make bench`: oban's column says n/a
    print(f"oban {env.oban_version} on Python {env.python_version} in {env.venv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
