import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFORMANCE = ROOT.parent / "shared" / "conformance" / "libipt"
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def conformance_dir() -> Path:
    if not (CONFORMANCE / "run.py").exists():
        pytest.skip(f"conformance suite not found at {CONFORMANCE}")
    return CONFORMANCE
