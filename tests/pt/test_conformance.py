"""Intel's own ptdump and ptxed test suites, run against `hwtrace`.

Every case runs in this process, through the command's entry point
(``hwtrace.cli.main.main``) with its standard output captured at the file
descriptor, so a suite costs its decoding, not hundreds of interpreter
start-ups; a case that leaks state into the next one shows up here too.
A handful of cases also run through the installed ``hwtrace`` command with
the suite's own runner (``run.py``), as a user would run them.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CONFORMANCE, run_captured

HWTRACE = Path(sys.executable).with_name("hwtrace")

# Cases that do not pass yet, as "tool/case".  A case passing that is listed
# here, or a case failing that is not, fails the test.
KNOWN_FAILING: set[str] = set()

# Expected suite sizes: a manifest that lost cases must not pass quietly.
SUITE_SIZES = {("ptdump", "core"): 230, ("ptxed", "core"): 191, ("ptdump", "pevent"): 12,
               ("ptxed", "pevent"): 10}  # fmt: skip

# Run through the real command as well (one process per case).
THROUGH_CLI = {
    "ptdump": ["bdm64-tnt-cond-xabort", "pevent-fork", "ptdump-exec-mode"],
    "ptxed": ["bdm64-tnt-cond-xabort", "skd010-tip", "pevent-fork"],
}


def _load_runner():
    spec = importlib.util.spec_from_file_location("libipt_conformance_run", CONFORMANCE / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cases() -> list:
    if not (CONFORMANCE / "manifest.json").exists():
        return []
    manifest = json.loads((CONFORMANCE / "manifest.json").read_text())
    return [
        pytest.param(tool, case, id=f"{tool}-{case['suite']}-{case['name']}")
        for tool in ("ptdump", "ptxed")
        for case in manifest["cases"]
        if tool in case
    ]


CASES = _cases()


@pytest.fixture(scope="module")
def runner(conformance_dir):
    return _load_runner()


@pytest.mark.skipif(not CASES, reason=f"conformance suite not found at {CONFORMANCE}")
@pytest.mark.parametrize("tool,case", CASES)
def test_case(runner, conformance_dir, tool, case, monkeypatch):
    cases_dir = conformance_dir / "cases"
    expected = runner.normalize((cases_dir / case[tool]["expected"]).read_bytes())
    # The tools only read their inputs, named relative to the cases folder.
    monkeypatch.chdir(cases_dir)
    name = f"{tool}/{case['name']}"
    for argv in runner.command_lines(case, tool, [tool]):
        got = runner.normalize(run_captured(argv))
        if got != expected:
            if name in KNOWN_FAILING:
                pytest.xfail("known failing")
            import difflib

            diff = "\n".join(list(difflib.unified_diff(expected, got, lineterm=""))[:60])
            pytest.fail(f"{' '.join(argv)}\n{diff}")
    assert name not in KNOWN_FAILING, "now passing: remove it from KNOWN_FAILING"


@pytest.mark.skipif(not CASES, reason=f"conformance suite not found at {CONFORMANCE}")
def test_suite_sizes():
    sizes: dict[tuple[str, str], int] = {}
    for param in CASES:
        tool, case = param.values
        key = (tool, case["suite"])
        sizes[key] = sizes.get(key, 0) + 1
    assert sizes == SUITE_SIZES


@pytest.mark.parametrize("tool", ["ptdump", "ptxed"])
def test_through_the_command(conformance_dir, tool):
    for name in THROUGH_CLI[tool]:
        proc = subprocess.run(
            [sys.executable, str(conformance_dir / "run.py"), tool, "--cmd", f"{HWTRACE} {tool}",
             "-k", name, "--diff", "--timeout", "600"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        last = proc.stdout.strip().splitlines()[-1]
        passed = int(last.split()[0]) if last.endswith(" 0 failed") else 0
        assert proc.returncode == 0 and passed > 0, proc.stdout[-4000:]
