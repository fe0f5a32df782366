import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFORMANCE = ROOT.parent / "shared" / "conformance" / "libipt"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import numba_caches  # noqa: E402 (found through the path just set)

# Commands run by the tests never build the native kernel library on their
# own (tests/test_kernels.py builds one where it checks it).
os.environ.setdefault("HWTRACE_KERNELS_AUTOBUILD", "0")


@pytest.fixture(scope="session")
def conformance_dir() -> Path:
    if not (CONFORMANCE / "run.py").exists():
        pytest.skip(f"conformance suite not found at {CONFORMANCE}")
    return CONFORMANCE


def copy_of_built_kernels(directory: Path) -> Path:
    """``directory`` with a copy of the kernel library `make` built, when
    it is up to date, so that a test's ``kernels.build(directory)`` adds
    only what it lacks instead of compiling every kernel again."""
    import json
    import shutil

    from hwtrace import kernels

    directory.mkdir(parents=True, exist_ok=True)
    installed = kernels._manifest_path()
    try:
        names = kernels._libraries(json.loads(installed.read_text()))
        for name in [installed.name, *names]:
            shutil.copy(installed.parent / name, directory)
    except (OSError, ValueError, KeyError):
        pass  # none yet: built whole
    return directory


numba_caches.drop_stale()
