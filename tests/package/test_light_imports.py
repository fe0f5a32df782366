"""Commands that need neither numba nor a perf.data session to start do not
load them: importing their command module leaves numba, the session and
pyarrow unloaded (what ``hwtrace CMD --help`` and a small input pay for)."""

import json
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


def test_query_loads_neither_numpy_nor_the_decoder(tmp_path):
    """``hwtrace query`` reads a decode directory with DuckDB alone."""
    from hwtrace.export.query import FORMAT

    (tmp_path / "_meta.json").write_text(json.dumps({"format": FORMAT}))
    code = (
        "import sys\n"
        "from hwtrace.cli.main import main\n"
        f"rc = main(['query', {str(tmp_path)!r}, 'select 40 + 2'])\n"
        "print(sorted(m for m in ('numpy', 'hwtrace.pt.decode', 'hwtrace.perf.data')"
        " if m in sys.modules), rc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300)  # fmt: skip
    assert "42" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "[] 0"
