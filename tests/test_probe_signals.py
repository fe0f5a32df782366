"""hwtrace killed (SIGKILL) at every point of its work in a live process,
and threads that block SIGTRAP: the target must keep running correctly."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from test_probe_live import SOURCE, Target

from hwtrace.probes import TRAP, ProbeSession
from hwtrace.probes import ptrace as pt

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or subprocess.run(["which", "gcc"], capture_output=True).returncode,
    reason="needs root (ptrace of any process, /proc/PID/mem writes) and gcc",
)


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    out = tmp_path_factory.mktemp("probe") / "workload"
    subprocess.run(["gcc", "-O2", "-g", "-o", str(out), str(SOURCE), "-lpthread"], check=True)
    return out


def _session(pid: int) -> None:
    """What hwtrace does in a session: place jumps and a trap (the runtime,
    trampolines, redirects, patches), remove one, reclaim, close."""
    s = ProbeSession(pid)
    s.add("work")
    shorties = s.add("shorties")
    s.add("loop_into_window", kind=TRAP)
    s.remove(shorties)
    s.reclaim()
    s.close()


def _killed_at(pid: int, point: int) -> int:
    """Run :func:`_session` in a child process that SIGKILLs itself at
    ``point`` (0: never); returns its wait status."""
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        code = 3
        try:
            pt._kill_at = pt._points + point if point else 0
            _session(pid)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    return status


def _check(target: Target, checker: Target) -> None:
    """Stop the spin; each thread's checksum must be what an untraced run
    of as many calls gives."""
    target.send("stop")
    total, calls = target.result()
    per_thread = [target.proc.stdout.readline().split() for _ in range(target.threads)]
    for _, k, n, checksum in per_thread:
        checker.send(f"sum {k} {n}")
        assert checker.proc.stdout.readline().split() == ["sum", checksum]
    assert calls == sum(int(w[2]) for w in per_thread)
    assert total == sum(int(w[3]) for w in per_thread) % (1 << 64)


def test_killed_at_every_point_the_target_runs_on(workload):
    checker = Target(workload, threads=1)  # untraced: the checksums to expect
    try:
        points = _points_of_a_session(workload)
        assert points > 20
        expected = None
        for point in range(1, points + 1):
            target = Target(workload)
            try:
                expected = expected or target.run(300)
                target.send("spin")  # every thread runs through the sites meanwhile
                assert target.proc.stdout.readline().strip() == "spinning"
                status = _killed_at(target.pid, point)
                assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
                    point, status)  # fmt: skip
                _check(target, checker)
                assert target.run(300) == expected, point
            finally:
                assert target.close() == 0, point
    finally:
        checker.close()


def _points_of_a_session(workload) -> int:
    """The kill points of a whole session (it completes, the target runs)."""
    target = Target(workload)
    try:
        before = pt.kill_points()
        untraced = target.run(300)
        _session(target.pid)
        assert target.run(300) == untraced
        return pt.kill_points() - before
    finally:
        target.close()
