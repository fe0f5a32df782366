"""The end of a command: its process skips the interpreter's traversal of
everything still alive (``gc.freeze``), a caller of ``main`` does not."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

from hwtrace.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
PACKETS = bytes.fromhex("028202820282028202820282028202820223")  # PSB, PSBEND


def test_main_called_in_process_freezes_nothing(tmp_path, capsys):
    trace = tmp_path / "psb.pt"
    trace.write_bytes(PACKETS)
    before = gc.get_freeze_count()
    assert main(["ptdump", str(trace)]) == 0
    assert "psbend" in capsys.readouterr().out
    assert gc.get_freeze_count() == before


def test_command_process_freezes_what_is_alive_at_its_end(tmp_path):
    trace = tmp_path / "psb.pt"
    trace.write_bytes(PACKETS)
    # The hwtrace script's way in (main() with the command line's argv); what
    # is frozen is counted after main returns.
    code = (
        "import gc, sys\n"
        "from hwtrace.cli.main import main\n"
        "sys.argv = ['hwtrace', 'ptdump', sys.argv[1]]\n"
        "status = main()\n"
        "sys.stderr.write(f'frozen {gc.get_freeze_count()}\\n')\n"
        "sys.exit(status)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([sys.executable, "-c", code, str(trace)], capture_output=True,
                          text=True, env=env, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "psbend" in done.stdout
    frozen = int(done.stderr.rsplit("frozen ", 1)[1])
    assert frozen > 1000  # the modules' objects, at least
