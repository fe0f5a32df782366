"""A traced command is held before exec until tracing is on, and never runs
untraced: killed when the session ends without releasing it."""

from __future__ import annotations

import os
import signal
import sys
import time

from hwtrace.ktrace.workload import HeldCommand, alive


def _exe(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/exe")


def test_held_until_released(tmp_path) -> None:
    marker = tmp_path / "ran"
    cmd = HeldCommand(["sh", "-c", f"echo x > {marker}"])
    time.sleep(0.2)
    assert alive(cmd.pid) and cmd.poll() is None
    assert _exe(cmd.pid) == os.path.realpath(sys.executable)  # still the fork, not sh
    assert not marker.exists()
    cmd.release()
    assert cmd.wait() == 0
    assert marker.read_text() == "x\n"
    assert not alive(cmd.pid)


def test_never_released_is_killed(tmp_path) -> None:
    marker = tmp_path / "ran"
    cmd = HeldCommand(["sh", "-c", f"echo x > {marker}"])
    cmd.close()
    assert cmd.wait() == -signal.SIGKILL
    assert not marker.exists()


def test_a_command_that_cannot_run(capfd) -> None:
    cmd = HeldCommand(["/nonexistent/tool"], prog="hwtrace trace")
    cmd.release()
    assert cmd.wait() == 127
    assert (
        "hwtrace trace: cannot run /nonexistent/tool: No such file or directory"
        in capfd.readouterr().err
    )


def test_passed_descriptor_is_inherited_only_by_the_command() -> None:
    r, w = os.pipe()
    try:
        cmd = HeldCommand([sys.executable, "-c", f"import os; os.write({w}, b'hi\\n')"], pass_fd=w)
        assert not os.get_inheritable(w)
        cmd.release()
        assert cmd.wait() == 0
        assert os.read(r, 16) == b"hi\n"
    finally:
        os.close(r)
        os.close(w)
