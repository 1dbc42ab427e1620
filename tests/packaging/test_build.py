"""The package as users get it: ``python -m build`` makes a wheel and an sdist,
each installs into a fresh virtualenv with the base dependencies only (no
PostgreSQL driver), and ``jobkeeper demo`` runs from it; ``--version``."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

import jobkeeper
from jobkeeper.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"jobkeeper {jobkeeper.__version__}\n"
    assert jobkeeper.__version__ == importlib.metadata.version("jobkeeper")


def run(*args: str | Path, cwd: Path, timeout: float = 600) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBKEEPER_", "VIRTUAL_ENV"))}
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.mark.slow
def test_wheel_and_sdist_install_and_run_the_demo(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "--outdir", dist, ROOT, cwd=tmp_path)
    (wheel,) = dist.glob("jobkeeper-*.whl")
    (sdist,) = dist.glob("jobkeeper-*.tar.gz")
    # The licence ships in both, declared as an SPDX expression (PEP 639:
    # setuptools refuses the older table form after 2027-02-18).
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        assert "License-Expression: MIT" in archive.read(metadata).decode()
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    with tarfile.open(sdist) as archive:
        assert any(n.endswith("/LICENSE") for n in archive.getnames())
    for artifact in (wheel, sdist):
        home = tmp_path / f"venv-{artifact.suffix.lstrip('.')}"
        venv.EnvBuilder(with_pip=True).create(home)
        python = home / "bin" / "python"
        run(
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            artifact,
            cwd=tmp_path,
        )
        installed = run(python, "-m", "pip", "list", "--format=freeze", cwd=tmp_path).lower()
        # The SQLite default needs no PostgreSQL driver, web stack or Django.
        for extra in ("psycopg", "starlette", "django"):
            assert extra not in installed, installed
        assert run(home / "bin" / "jobkeeper", "--version", cwd=tmp_path).strip() == (
            f"jobkeeper {jobkeeper.__version__}"
        )
        # A PostgreSQL URL without the extra: one line saying what to install.
        refused = subprocess.run(
            [home / "bin" / "jobkeeper", "--database", "postgresql://u@127.0.0.1:1/db", "status"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 2, refused.stderr
        assert "pip install 'jobkeeper[postgres]'" in refused.stderr
        workdir = tmp_path / f"demo-{artifact.suffix.lstrip('.')}"
        workdir.mkdir()
        out = run(home / "bin" / "jobkeeper", "demo", cwd=workdir)
        assert "every job accounted for" in out, out
        assert "lost: 0" in out, out
