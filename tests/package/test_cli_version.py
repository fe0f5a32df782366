"""`hwtrace --version`: the version of the installed distribution."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import hwtrace

ROOT = Path(__file__).resolve().parents[2]


def _pyproject_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_version_prints_the_package_version():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([sys.executable, "-m", "hwtrace.cli.main", "--version"],
                          capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"hwtrace {hwtrace.version()}\n"
    assert done.stdout == f"hwtrace {_pyproject_version()}\n"


def test_source_version_matches_pyproject():
    # The fallback for a tree that was never installed must say the same.
    assert hwtrace.__version__ == _pyproject_version()


def test_version_falls_back_without_metadata(monkeypatch):
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    monkeypatch.setattr(hwtrace, "__version__", "9.8.7")
    assert hwtrace.version() == "9.8.7"
