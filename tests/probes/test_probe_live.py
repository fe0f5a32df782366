"""Dynamic tracepoints in live processes: exact counts, events, byte-for-byte
restoration, live patching under load, and the ways it can go wrong."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from hwtrace.image.process import read_maps
from hwtrace.probes import JUMP, TRAP, UPROBE, ProbeError, ProbeSession

HERE = Path(__file__).parents[1]  # tests/
SOURCE = HERE / "data" / "probe_workload.c"
HWTRACE = [sys.executable, "-m", "hwtrace.cli.main"]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("gcc") is None,
    reason="needs root (ptrace of any process, /proc/PID/mem writes) and gcc",
)


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("probe") / "workload"
    subprocess.run(["gcc", "-O2", "-g", "-o", str(out), str(SOURCE), "-lpthread"], check=True)
    return out


class Target:
    """The workload running, driven through its standard input."""

    def __init__(self, exe: Path, threads: int = 2, *options: str) -> None:
        self.proc = subprocess.Popen(
            [str(exe), str(threads), *options],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        line = self.proc.stdout.readline()
        assert line.startswith("ready"), line
        self.pid = self.proc.pid
        self.threads = threads

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def result(self) -> tuple[int, int]:
        words = self.proc.stdout.readline().split()
        assert words and words[0] == "done", words
        return int(words[1]), int(words[2])

    def run(self, n: int) -> tuple[int, int]:
        self.send(f"run {n}")
        return self.result()

    def code(self) -> dict[int, bytes]:
        fd = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY)
        try:
            return {
                m.start: os.pread(fd, m.length, m.start)
                for m in read_maps(self.pid)
                if m.executable and m.path.startswith("/")
            }
        finally:
            os.close(fd)

    def maps(self) -> list[tuple[int, int, str]]:
        return [(m.start, m.end, m.prot) for m in read_maps(self.pid)]

    def close(self) -> int:
        if self.proc.poll() is None:
            try:
                self.send("quit")
            except BrokenPipeError:
                pass
        try:
            return self.proc.wait(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.fixture
def target(workload):
    t = Target(workload)
    yield t
    t.close()


@pytest.fixture(scope="module")
def untraced(workload) -> dict[int, tuple[int, int]]:
    t = Target(workload)
    try:
        return {n: t.run(n) for n in (1000, 20000)}
    finally:
        t.close()


def test_counts_are_exact_and_code_is_restored(target, untraced):
    code, maps = target.code(), target.maps()
    with ProbeSession(target.pid) as s:
        tps = {name: s.add(name) for name in ("work", "shorties", "loop_into_window",
                                              "red_zone+0x0a", "work+0x7")}  # fmt: skip
        assert all(tp.kind == JUMP for tp in tps.values()), [
            (tp.spec, tp.note) for tp in tps.values()
        ]
        assert tps["shorties"].starts == (0, 1, 4)  # push, mov, inc: two embedded traps
        assert target.run(1000) == untraced[1000]
        calls = 1000 * target.threads
        assert s.hits(tps["work"]) == calls
        assert s.hits(tps["shorties"]) == calls
        # The loop's back edge lands inside the window: those arrivals trap
        # and are redirected, and are not hits (they are past the site).
        assert s.hits(tps["loop_into_window"]) == calls
        assert s.trap_counts()[0] >= sum((i + 1000003 * k) % 7 for i in range(1000) for k in (0, 1))
        assert s.hits(tps["red_zone+0x0a"]) == calls
        work_hits = s.hits(tps["work+0x7"])
        assert work_hits == calls
        s.remove(tps["work"])
        assert target.run(1000) == untraced[1000]
        assert s.hits(tps["work+0x7"]) == 2 * calls
    assert target.code() == code
    assert target.maps() == maps
    assert target.run(1000) == untraced[1000]


def test_locations_by_line_address_and_module(target):
    lines = SOURCE.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "r * 6364136223846793005ULL" in text)
    with ProbeSession(target.pid) as s:
        work = s.resolve("work")
        by_line = s.resolve(f"probe_workload.c:{line}")
        assert by_line.function.startswith("work+") and work.address < by_line.address
        assert s.resolve(f"{by_line.address:#x}").function == by_line.function
        assert s.resolve("workload!work").address == work.address
        assert s.resolve("libc.so.6!malloc").path.endswith("libc.so.6")
        getpid = s.resolve("libc.so.6!getpid")  # an alias of __getpid
        assert getpid.address == s.resolve("libc.so.6!__getpid").address
        with pytest.raises(ProbeError, match="no code for line 1 of"):
            s.resolve("probe_workload.c:1")
        with pytest.raises(ProbeError, match="not in executable memory"):
            s.resolve("0x10")
        # An offset is hexadecimal after 0x, else decimal (no octal, no
        # Python error): ten bytes in, an instruction's start or not.
        try:
            assert s.resolve("work+010").address == work.address + 10
        except ProbeError as e:
            assert "(work+0xa) is inside the instruction" in str(e)


def test_trap_tracepoints_count_exactly(target, untraced):
    code = target.code()
    with ProbeSession(target.pid) as s:
        tp = s.add("work", kind=TRAP)
        assert tp.kind == TRAP and tp.patched == b"\xcc"
        assert target.run(1000) == untraced[1000]
        assert s.hits(tp) == 1000 * target.threads
        s.disable(tp)
        assert target.run(1000) == untraced[1000]
        assert s.hits(tp) == 1000 * target.threads
        s.enable(tp)
        assert target.run(1000) == untraced[1000]
        assert s.hits(tp) == 2000 * target.threads
    assert target.code() == code


def test_live_redirects_win_over_removed_ones(target, untraced):
    """A removed tracepoint's redirects stay until reclaimed, for threads
    still in its old code; a live tracepoint's trap at the same address
    must still be its own."""
    with ProbeSession(target.pid) as s:
        s.remove(s.add("work", kind=TRAP))  # not reclaimed: its entry stays
        again = s.add("work", kind=TRAP)
        assert target.run(1000) == untraced[1000]
        assert s.hits(again) == 1000 * target.threads
        # A jump whose window covers the loop's back edge target, removed;
        # then a trap there: every iteration of the loop must count.
        jump = s.add("loop_into_window")
        assert jump.kind == JUMP and 2 in jump.starts
        s.remove(jump)
        trap = s.add("loop_into_window+0x2", kind=TRAP)
        assert target.run(1000) == untraced[1000]
        loops = sum((i + 1000003 * k) % 7 + 1 for k in range(target.threads) for i in range(1000))
        assert s.hits(trap) == loops


def test_kernel_uprobe_fallback_counts_this_process_only(target, workload, untraced):
    if not Path("/sys/kernel/tracing/uprobe_events").exists():
        pytest.skip("no tracefs uprobe_events here")
    other = Target(workload)  # maps the same file: its hits must not count
    try:
        with ProbeSession(target.pid) as s:
            tp = s.add("transaction")  # xbegin cannot run out of line
            assert tp.kind == UPROBE and "xbegin" in tp.note
            forced = s.add("red_zone", kind=UPROBE)
            assert forced.kind == UPROBE
            assert other.run(1000) == untraced[1000]
            assert target.run(1000) == untraced[1000]
            assert s.hits(forced) == 2000 and s.hits(tp) == 0
            s.disable(forced)
            assert target.run(1000) == untraced[1000]
            s.enable(forced)
            assert target.run(1000) == untraced[1000]
            assert s.hits(forced) == 4000
            with pytest.raises(ProbeError, match="not record events"):
                s.add("work", kind=UPROBE, record=True)
        events = Path("/sys/kernel/tracing/uprobe_events").read_text()
        assert f"hwtrace_probe/p{target.pid}_" not in events
    finally:
        other.close()


def test_entry_exit_tracepoints_follow_recursion_and_longjmp(target, untraced):
    code = target.code()
    with ProbeSession(target.pid) as s:
        tps = {name: s.add(name, returns=True) for name in ("depth", "thrower", "jumper")}
        assert target.run(1000) == untraced[1000]
        # depth(i % 5) for i < 1000 in each of two threads: 1 + (i % 5) calls each.
        calls = 2 * sum(1 + i % 5 for i in range(1000))
        assert s.hits(tps["depth"]) == s.returns(tps["depth"]) == calls
        thrown = sum(1 for k in (0, 1) for i in range(1000) if (i + 1000003 * k) % 3 == 0)
        assert s.hits(tps["thrower"]) == 2000
        assert s.returns(tps["thrower"]) == 2000 - thrown  # longjmp: never returned
        assert s.hits(tps["jumper"]) == s.returns(tps["jumper"]) == 2000
        with pytest.raises(ProbeError, match="first instruction"):
            s.add("work+0x7", returns=True)
    assert target.code() == code
    assert target.run(1000) == untraced[1000]


def test_entry_exit_events_carry_return_values(target, untraced):
    with ProbeSession(target.pid) as s:
        s.add("depth", returns=True, record=True, regs=("rdi",))
        assert target.run(100) == target.run(100)
        ev = s.drain()
        assert s.lost == 0
        entries, exits = ev[ev["kind"] == 0], ev[ev["kind"] == 1]
        assert len(entries) == len(exits) == 2 * 2 * sum(1 + i % 5 for i in range(100))

        # Per thread, each return's value is depth(n) of its call, innermost first.
        def depth(n):
            return 1 if n == 0 else depth(n - 1) * 3 + n

        for tid in np.unique(ev["tid"]).tolist():
            mine = ev[ev["tid"] == tid]
            stack = []
            for kind, regs in zip(mine["kind"].tolist(), mine["regs"].tolist(), strict=True):
                if kind == 0:
                    stack.append(regs[0])
                else:
                    assert regs[0] == depth(stack.pop())
            assert not stack


def test_events_carry_arguments_threads_and_time(target, untraced):
    with ProbeSession(target.pid) as s:
        tp = s.add("shorties", record=True, regs=("rdi", "rsp", "rip"))
        t0 = time.monotonic_ns()
        assert target.run(1000) == untraced[1000]
        t1 = time.monotonic_ns()
        ev = s.drain()
        assert s.lost == 0
        assert len(ev) == s.hits(tp) == 2000
        tids = sorted(int(t) for t in os.listdir(f"/proc/{target.pid}/task"))
        assert set(np.unique(ev["tid"]).tolist()) <= set(tids[1:])  # the worker threads
        for tid in np.unique(ev["tid"]).tolist():
            args = ev["regs"][ev["tid"] == tid][:, 0]
            base = int(args[0])
            assert base in (0, 1000003)
            assert np.array_equal(args, np.arange(base, base + 1000, dtype=np.uint64))
        assert (ev["regs"][:, 2] == tp.address).all()
        ns = s.rings.clock.to_ns(ev["tsc"])
        assert t0 <= ns.min() and ns.max() <= t1 + 1_000_000
        assert (np.diff(ev["tsc"].astype(np.int64)) >= 0).all()


def test_live_insertion_under_load_keeps_results(target, workload):
    """Tracepoints go in and out while every thread runs through them; each
    thread's result must be what an untraced run of as many calls gives."""
    code, maps = target.code(), target.maps()
    sites = ["work", "shorties", "shorties+0x1", "shorties+0x4", "loop_into_window",
             "loop_into_window+0x2", "red_zone+0x5", "red_zone+0xe", "work+0x7"]  # fmt: skip
    with ProbeSession(target.pid) as s:
        target.send("spin")
        assert target.proc.stdout.readline().strip() == "spinning"
        for cycle in range(200):
            tp = s.add(sites[cycle % len(sites)], kind=TRAP if cycle % 5 == 4 else None)
            s.remove(tp)
            if cycle % 20 == 19:
                s.reclaim()
        target.send("stop")
        total, calls = target.result()
        per_thread = [target.proc.stdout.readline().split() for _ in range(target.threads)]
    assert target.code() == code
    assert target.maps() == maps
    check = Target(workload, threads=1)
    try:
        for _, k, n, checksum in per_thread:
            check.send(f"sum {k} {n}")
            assert check.proc.stdout.readline().split() == ["sum", checksum]
    finally:
        check.close()
    assert calls == sum(int(w[2]) for w in per_thread)
    assert total == sum(int(w[3]) for w in per_thread) % (1 << 64)


def test_forks_during_insertion_run_correctly(target):
    """Children forked while tracepoints go in and out inherit whatever
    state the code was in, with hwtrace's handler and trampolines: each must
    compute what an untraced process computes."""
    expected = None
    with ProbeSession(target.pid) as s:
        for cycle in range(6):
            target.send("fork 200000")  # the child runs while tracepoints change
            for spec in ("work", "shorties", "loop_into_window", "depth"):
                s.remove(s.add(spec, returns=spec == "depth" and cycle % 2 == 0))
            words = target.proc.stdout.readline().split()
            assert words[0] == "child" and words[2] == "0", words  # exit status 0
            expected = expected or words[1]
            assert words[1] == expected
    check = Target(target.proc.args[0] and Path(target.proc.args[0]), threads=1)
    try:
        check.send("sum 0 200000")
        assert check.proc.stdout.readline().split() == ["sum", expected]
    finally:
        check.close()


def test_not_permitted_is_one_clear_message(target, tmp_path):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    home = Path(tempfile.mkdtemp(prefix="hwtrace-nobody-"))  # pytest's tmp is root's alone
    home.chmod(0o777)
    r = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *HWTRACE, "probe",
         "-p", str(target.pid), "work"],
        capture_output=True, text=True, timeout=120, cwd=home,
        env={**os.environ, "HOME": str(home), "NUMBA_CACHE_DIR": str(home)},
    )  # fmt: skip
    shutil.rmtree(home, ignore_errors=True)
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1 and "not permitted" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_bad_input_is_one_clear_message(target, workload, tmp_path):
    with pytest.raises(ProbeError, match="no process with pid"):
        ProbeSession(999_999_999)
    with ProbeSession(target.pid) as s:
        with pytest.raises(ProbeError, match="no function 'nosuch'"):
            s.add("nosuch")
        with pytest.raises(ProbeError, match="no such module is mapped"):
            s.add("libnothing.so!work")
        with pytest.raises(ProbeError, match="past the end of work"):
            s.add("work+0x10000")
        tp = s.add("work")
        with pytest.raises(ProbeError, match="inside the instruction at"):
            s.add("work+0x2")
        s.add("shorties")
        with pytest.raises(ProbeError, match="too close to tracepoint"):
            s.add("shorties+0x4")
        s.remove(tp)
        # Another debugger's breakpoint at the site.
        site = s.resolve("red_zone").address
        original = s.read(site, 1)
        s.write(site, b"\xcc")
        try:
            with pytest.raises(ProbeError, match="int3"):
                s.add("red_zone")
        finally:
            s.write(site, original)
    # Already traced by another tracer.
    strace = shutil.which("strace") or shutil.which("gdb")
    if strace and os.path.basename(strace) == "strace":
        tracer = subprocess.Popen([strace, "-p", str(target.pid), "-o", "/dev/null"])
        try:
            time.sleep(0.5)
            with pytest.raises(ProbeError, match="already being traced"):
                ProbeSession(target.pid).add("work")
        finally:
            tracer.terminate()
            tracer.wait()
    # A process gone between attaching and inserting.
    t = Target(workload)
    s = ProbeSession(t.pid)
    t.proc.kill()
    t.proc.wait()
    with pytest.raises(ProbeError):
        s.add("work")
    s.close()


def test_cli_records_json_lines_and_exits_with_the_command(workload, tmp_path, untraced):
    out = tmp_path / "ev.jsonl"
    summary = tmp_path / "summary.json"
    r = subprocess.run(
        [*HWTRACE, "probe", "work", "shorties", "-o", str(out), "--json", str(summary),
         "--", str(workload), "2"],
        input="run 1000\nquit\n", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"done {untraced[1000][0]} 2000" in r.stdout
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 4000
    assert {e["name"] for e in lines} == {"work", "shorties"}
    report = json.loads(summary.read_text())
    assert [t["hits"] for t in report["tracepoints"]] == [2000, 2000]
    assert report["events"] == 4000 and report["lost"] == 0


def test_cli_control_commands(target, untraced):
    code = target.code()
    commands = "list\nadd red_zone\nadd depth --returns\nadd work+0x2\nlist\n" \
        "disable 1\nlist\nremove 3\nenable 1\nlist\nnonsense\nquit\n"  # fmt: skip
    r = subprocess.run([*HWTRACE, "probe", "-p", str(target.pid), "--control", "work"],
                       input=commands, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "tracepoint 3: depth at" in r.stderr and "with its returns" in r.stderr
    assert "is inside the instruction at" in r.stderr  # one clear message, the session goes on
    assert "tracepoint 3 removed" in r.stderr and "unknown command: nonsense" in r.stderr
    assert "(disabled)" in r.stdout
    assert target.code() == code
    assert target.run(1000) == untraced[1000]


def test_cli_returns_in_json_lines(workload, tmp_path):
    out = tmp_path / "ret.jsonl"
    r = subprocess.run(
        [*HWTRACE, "probe", "depth", "-r", "-o", str(out), "--", str(workload), "1"],
        input="run 100\nquit\n", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in out.read_text().splitlines()]
    hits = [e for e in events if e["kind"] == "hit"]
    returns = [e for e in events if e["kind"] == "return"]
    assert len(hits) == len(returns) == sum(1 + i % 5 for i in range(100))
    assert "rdi" in hits[0] and "rax" in returns[0] and "rdi" not in returns[0]
    assert {e["rax"] for e in returns} == {1, 4, 14, 45, 139}  # depth(0) .. depth(4)


def test_cli_ctf_reads_in_babeltrace2(workload, tmp_path):
    bt = shutil.which("babeltrace2")
    if bt is None:
        pytest.skip("babeltrace2 is not installed")
    out = tmp_path / "ctf"
    r = subprocess.run(
        [*HWTRACE, "probe", "work", "-o", str(out), "--regs", "rdi", "--", str(workload), "1"],
        input="run 100\nquit\n", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    text = subprocess.run([bt, str(out)], capture_output=True, text=True, check=True).stdout
    events = [line for line in text.splitlines() if "hwtrace_probe:work" in line]
    assert len(events) == 100
    assert "rdi = 0x63" in events[-1]


def test_interrupt_and_kill_leave_the_target_running(target, untraced):
    code = target.code()
    p = subprocess.Popen([*HWTRACE, "probe", "-p", str(target.pid), "work", "shorties"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    _wait_for_patch(target, code)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert target.code() == code  # ^C took every tracepoint out
    assert target.run(1000) == untraced[1000]
    # SIGKILL: nothing is undone, but the target keeps running correctly.
    p = subprocess.Popen([*HWTRACE, "probe", "-p", str(target.pid), "work", "shorties",
                          "loop_into_window"], stderr=subprocess.DEVNULL)  # fmt: skip
    _wait_for_patch(target, code)
    target.send("run 20000")
    time.sleep(0.2)
    p.kill()
    p.wait()
    assert target.result() == untraced[20000]
    assert target.run(1000) == untraced[1000]


def _wait_for_patch(target: Target, code: dict[int, bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while target.code() == code:
        assert time.monotonic() < deadline, "the tracepoints never went in"
        time.sleep(0.05)
