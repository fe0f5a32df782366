"""The package layers (pyproject.toml's ``[tool.importlinter]`` contract):
the real tree keeps them, and the contract does catch an import that goes
up a layer, across siblings, or from a top-level package no layer lists.

Each case runs ``lint-imports`` (as ``make lint`` does) on a copy of the
package with one import added."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is in the dev extra")

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "pyproject.toml"


def _lint_imports(src: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with the project's contract on the package under ``src``."""
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(src), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-c", code, str(CONFIG), "--no-cache", "--no-logo"],
        capture_output=True, text=True, env=env, cwd=src, timeout=120,
    )  # fmt: skip


@pytest.fixture
def package_copy(tmp_path) -> Path:
    """A copy of src/hwtrace (sources only) under ``tmp_path``."""
    shutil.copytree(ROOT / "src/hwtrace", tmp_path / "hwtrace",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.nbi", "*.nbc"))  # fmt: skip
    return tmp_path


def test_the_tree_keeps_the_layers():
    done = _lint_imports(ROOT / "src")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 kept, 0 broken" in done.stdout


def test_the_copy_keeps_them_too(package_copy):
    """What the failing cases below change is the one added import."""
    done = _lint_imports(package_copy)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # a decoder reaching up to the command line
        ("pt/packets.py", "from ..cli import main as _upward",
         "hwtrace.pt is not allowed to import hwtrace.cli"),
        # the compiled-loop library reaching up to the decoders
        ("aot.py", "from .pt import ptdump as _upward",
         "hwtrace.aot is not allowed to import hwtrace.pt"),
        # siblings on one layer: the probes and the recorder
        ("probes/rings.py", "from ..record import _native as _sideways",
         "hwtrace.probes is not allowed to import hwtrace.record"),
        # the system-call wrappers reaching up to the filter compilers
        ("kernel/bpf.py", "from ..filter import ebpf as _upward",
         "hwtrace.kernel is not allowed to import hwtrace.filter"),
    ],
)  # fmt: skip
def test_an_added_import_breaks_the_contract(package_copy, module, line, broken):
    path = package_copy / "hwtrace" / module
    path.write_text(path.read_text() + f"\n{line}  # added by tests/package/test_layers.py\n")
    done = _lint_imports(package_copy)
    assert done.returncode != 0
    assert "0 kept, 1 broken" in done.stdout, done.stdout + done.stderr
    assert broken in done.stdout
    importer = "hwtrace." + module.removesuffix(".py").replace("/", ".")
    assert f"{importer} -> " in done.stdout  # the route names the import


def test_a_package_no_layer_lists_breaks_the_contract(package_copy):
    (package_copy / "hwtrace" / "unplaced.py").write_text('"""In no layer."""\n')
    done = _lint_imports(package_copy)
    assert done.returncode != 0
    assert "not listed as layers" in done.stdout and "hwtrace.unplaced" in done.stdout
