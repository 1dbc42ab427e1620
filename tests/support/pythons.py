"""Other Pythons than the one running the tests, with jobkeeper installed:
for bugs that only one interpreter shows (a 3.13 finalization, a 3.12.x
sqlite3 warning).

An interpreter is looked for as pyenv installs them
(``~/.pyenv/versions/3.13.*/bin/python``) or on PATH (``python3.13``);
without one the test skips, saying which it needs. Its venv
(``.venv-python<version>`` at the repository's root, like ``make
test-django6``'s) is made once with ``pip install -e '.[postgres]'`` and
made again when pyproject.toml changes.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def find_python(series: str, *, patches: range | None = None) -> Path | None:
    """The newest interpreter of ``series`` ("3.13") found, or None;
    ``patches``: only these patch releases (3.12.0-3.12.3: ``range(0, 4)``).
    """
    found: list[tuple[int, Path]] = []
    for path in (Path.home() / ".pyenv" / "versions").glob(f"{series}.*/bin/python"):
        patch = path.parent.parent.name.removeprefix(f"{series}.")
        if patch.isdigit() and (patches is None or int(patch) in patches):
            found.append((int(patch), path))
    if found:
        return max(found)[1]
    on_path = shutil.which(f"python{series}")
    if on_path is None:
        return None
    if patches is not None:
        version = subprocess.run(
            [on_path, "-c", "import sys; print(sys.version_info[2])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if int(version) not in patches:
            return None
    return Path(on_path)


def python_with_jobkeeper(series: str, *, patches: range | None = None) -> Path:
    """The python of a venv of ``series`` with this tree's jobkeeper (and
    its postgres extra) installed; skips the test when no such Python exists.
    """
    base = find_python(series, patches=patches)
    if base is None:
        wanted = series if patches is None else f"{series}.{patches.start}-{patches.stop - 1}"
        where = f"pyenv's ~/.pyenv/versions or python{series} on PATH"
        pytest.skip(f"no Python {wanted} here ({where})")
    version = subprocess.run(
        [str(base), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    venv = ROOT / f".venv-python{version}"
    stamp = venv / "jobkeeper-installed"
    wanted_stamp = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    # xdist workers may want it at once: one builds, the others wait.
    with open(ROOT / f".venv-python{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists() or stamp.read_text() != wanted_stamp:
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([str(base), "-m", "venv", str(venv)], check=True)
            subprocess.run(
                [
                    str(venv / "bin" / "python"),
                    *("-m", "pip", "install", "--quiet", "--disable-pip-version-check"),
                    *("-e", f"{ROOT}[postgres]"),
                ],
                check=True,
                timeout=600,
            )
            stamp.write_text(wanted_stamp)
    return venv / "bin" / "python"
