"""hwtrace killed (SIGKILL) at every point of its work in a live process,
and threads that block SIGTRAP: the target must keep running correctly."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess

import pytest
from test_probe_live import HWTRACE, SOURCE, Target, _wait_for_patch

from hwtrace.image.process import code_slack, read_maps
from hwtrace.probes import TRAP, UPROBE, ProbeError, ProbeSession
from hwtrace.probes import codegen as cg
from hwtrace.probes import ptrace as pt

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("gcc") is None,
    reason="needs root (ptrace of any process, /proc/PID/mem writes) and gcc",
)


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    out = tmp_path_factory.mktemp("probe") / "workload"
    subprocess.run(["gcc", "-O2", "-g", "-o", str(out), str(SOURCE), "-lpthread"], check=True)
    return out


libc = ctypes.CDLL(None, use_errno=True)
SYS_TGKILL = 234


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
    ``point``, a SIGUSR1 sent to the borrowed thread (the main one) at the
    point before; returns its wait status."""
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        code = 3
        try:
            at = pt.kill_points() + point
            pt.kill_at(at)
            send_at = at - (point > 1)  # one point before: it goes through a call

            def signal_there(n: int) -> None:
                if n == send_at:
                    libc.syscall(SYS_TGKILL, pid, pid, signal.SIGUSR1)  # to main itself

            pt.point_hook = signal_there
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
            target = Target(workload, threads=1)  # main borrowed, a worker on the sites
            try:
                expected = expected or target.run(300)
                target.send("spin")  # every thread runs through the sites meanwhile
                assert target.proc.stdout.readline().strip() == "spinning"
                status = _killed_at(target.pid, point)
                assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
                    point, status)  # fmt: skip
                _check(target, checker)
                assert target.run(300) == expected, point
                # The borrowed thread (main) has its own signal mask back,
                # and got the signal sent while it was borrowed.
                assert _blocked(target.pid, target.pid) == 0, point
                target.send("signals")
                assert target.proc.stdout.readline().split() == ["signals", "1"], point
            finally:
                assert target.close() == 0, point
    finally:
        checker.close()


def _blocked(pid: int, tid: int) -> int:
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        return next(int(line.split()[1], 16) for line in f if line.startswith("SigBlk:"))


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


def test_threads_blocking_sigtrap_get_no_int3(workload):
    """An int3 in a thread that blocks SIGTRAP kills the process (the
    kernel forces the default action): where a thread does, a tracepoint
    is a kernel uprobe, or refused."""
    target = Target(workload, 2, "blocktrap")
    try:
        untraced = target.run(1000)
        with ProbeSession(target.pid) as s:
            with pytest.raises(ProbeError, match=r"thread \d+ of process \d+ blocks SIGTRAP"):
                s.add("work", kind=TRAP)
            with pytest.raises(ProbeError, match=r"blocks SIGTRAP.*not record events"):
                s.add("work", record=True)
            if not os.path.exists("/sys/kernel/tracing/uprobe_events"):
                pytest.skip("no tracefs uprobe_events here for the safe kind")
            tp = s.add("work")
            assert tp.kind == UPROBE and "blocks SIGTRAP" in tp.note
            assert target.run(1000) == untraced
            assert s.hits(tp) == 2000
            forced = s.add("shorties", kind=UPROBE)  # asked for: no look needed
            assert forced.kind == UPROBE
            assert target.run(1000) == untraced
            assert (s.hits(tp), s.hits(forced)) == (4000, 2000)
    finally:
        assert target.close() == 0


def test_cli_refuses_a_trap_in_a_blocking_process(workload):
    target = Target(workload, 2, "blocktrap")
    try:
        r = subprocess.run([*HWTRACE, "probe", "-p", str(target.pid), "--trap", "work"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        assert r.returncode == 1, r.stderr
        assert r.stderr.count("\n") == 1 and "blocks SIGTRAP" in r.stderr, r.stderr
        assert target.run(10)[1] == 20
    finally:
        assert target.close() == 0


def test_cli_reports_a_target_that_died(workload):
    target = Target(workload)
    try:
        code = target.code()
        p = subprocess.Popen([*HWTRACE, "probe", "-p", str(target.pid), "work"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            _wait_for_patch(target, code)
            os.kill(target.pid, signal.SIGSEGV)  # not reaped until hwtrace is done
            _, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 1, err
        assert f"process {target.pid} was killed by SIGSEGV" in err, err
        assert "not permitted" not in err and "Traceback" not in err, err
    finally:
        target.close()


def test_resume_block_goes_in_unused_padding_and_out_again(workload):
    """The gadgets go after the vDSO's image; where that padding is taken
    (another tool's), after an executable segment of a file: in either
    place, the bytes are what they were once the session is closed."""
    target = Target(workload, threads=1)
    fd = os.open(f"/proc/{target.pid}/mem", os.O_RDWR)
    try:
        untraced = target.run(300)
        vdso = next(m for m in read_maps(target.pid) if m.path == "[vdso]")
        at = code_slack(target.pid, fd, cg.RESUME_SIZE)
        assert vdso.start < at and at + cg.RESUME_SIZE <= vdso.end
        os.pwrite(fd, b"\x01", at)  # taken
        code = target.code()
        fallback = code_slack(target.pid, fd, cg.RESUME_SIZE)
        m = next(m for m in read_maps(target.pid) if m.start <= fallback < m.end)
        assert m.path.startswith("/") and m.executable
        with ProbeSession(target.pid) as s:
            s.add("work")
            assert os.pread(fd, cg.RESUME_CONTEXT, fallback) == cg.resume_block(fallback)
            assert target.run(300) == untraced
        assert target.code() == code
        assert os.pread(fd, 1, at) == b"\x01"
    finally:
        os.close(fd)
        assert target.close() == 0
