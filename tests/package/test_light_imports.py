"""Commands that need neither numba nor a perf.data session to start do not
load them: importing their command module leaves numba, the session and
pyarrow unloaded (what ``hwtrace CMD --help`` and a small input pay for)."""

import subprocess
import sys

import pytest

LIGHT = ("main", "query", "trace", "probe", "ptwrite", "bts", "vm", "csdump", "ptdump", "ptxed")
HEAVY = ("numba", "hwtrace.session", "pyarrow")


@pytest.mark.parametrize("command", LIGHT)
def test_command_module_loads_nothing_heavy(command):
    code = (
        f"import sys, hwtrace.cli.{command}\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300)  # fmt: skip
    assert out.stdout.strip() == "[]"


def test_coresight_session_loads_no_perf_session():
    """``hwtrace csdump`` opens a CoreSight capture through the session
    layer: that does not load the perf.data session (decoder, perf.data
    reader, images)."""
    code = (
        "import sys, hwtrace.session.coresight\n"
        "print(sorted(m for m in ('hwtrace.session.perfsession', 'hwtrace.pt.decode')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300)  # fmt: skip
    assert out.stdout.strip() == "[]"
