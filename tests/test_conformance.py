"""Intel's own ptdump test suite, run against `hwtrace ptdump`."""

import subprocess
import sys
from pathlib import Path

HWTRACE = Path(sys.executable).with_name("hwtrace")


def run_suite(conformance_dir, tool, suite):
    r = subprocess.run(
        [sys.executable, str(conformance_dir / "run.py"), tool, "--suite", suite,
         "--cmd", f"{HWTRACE} {tool}", "--diff"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    return r.stdout.strip().splitlines()[-1], r.stdout


def test_ptdump_core_suite(conformance_dir):
    last, out = run_suite(conformance_dir, "ptdump", "core")
    assert last == "230 passed, 0 failed", out[-5000:]
