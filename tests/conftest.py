import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFORMANCE = ROOT.parent / "shared" / "conformance" / "libipt"
sys.path.insert(0, str(Path(__file__).resolve().parent))
# Commands run by the tests never build the native kernel library on their
# own (tests/test_kernels.py builds one where it checks it).
os.environ.setdefault("HWTRACE_KERNELS_AUTOBUILD", "0")


@pytest.fixture(scope="session")
def conformance_dir() -> Path:
    if not (CONFORMANCE / "run.py").exists():
        pytest.skip(f"conformance suite not found at {CONFORMANCE}")
    return CONFORMANCE


def _drop_stale_numba_caches() -> None:
    """numba's cache notices edits to a compiled function's own file only,
    not to the files of functions it calls (e.g. filter/native.py's helpers
    inlined into an interpreter): after any source change, start clean."""
    import hashlib

    src = ROOT / "src" / "hwtrace"
    digest = hashlib.sha256()
    for f in sorted(src.rglob("*.py")):
        digest.update(str(f.relative_to(src)).encode())
        digest.update(f.read_bytes())
    stamp = ROOT / ".pytest_cache" / "numba-source-hash"
    if stamp.exists() and stamp.read_text() == digest.hexdigest():
        return
    for pattern in ("*.nbi", "*.nbc"):
        for f in src.rglob(pattern):
            f.unlink(missing_ok=True)
    stamp.parent.mkdir(exist_ok=True)
    stamp.write_text(digest.hexdigest())


_drop_stale_numba_caches()
