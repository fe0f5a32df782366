"""Tracepoint events written as perf.data: what Linux perf makes of them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hwtrace.probes import ProbeSession
from hwtrace.probes.output import PerfData, ProbeInfo, open_output

HWTRACE = [sys.executable, "-m", "hwtrace.cli.main"]
PERF = shutil.which("perf")

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("gcc") is None,
        reason="needs root (ptrace of any process, /proc/PID/mem writes) and gcc",
    ),
    pytest.mark.skipif(PERF is None, reason="perf is not installed: nothing to read perf.data"),
]

# "N" on stdin: call func(100 + i, 7 * i) and other(i) for i < N, print "done SUM".
PROGRAM = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) uint64_t func(uint64_t a, uint64_t b) {
    __asm__ volatile("" ::: "memory");
    return a * 3 + b;
}

__attribute__((noinline)) uint64_t other(uint64_t a) {
    __asm__ volatile("" ::: "memory");
    return a ^ 0x5a5a;
}

int main(void) {
    char line[64];
    uint64_t sum = 0;
    printf("ready\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        long n = atol(line);
        if (n <= 0) break;
        for (long i = 0; i < n; i++) sum += func(100 + i, 7 * i) + other(i);
        printf("done %lu\n", (unsigned long)sum);
        fflush(stdout);
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def prog(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("perfdata")
    (d / "prog.c").write_text(PROGRAM)
    subprocess.run(["gcc", "-O2", "-o", str(d / "prog"), str(d / "prog.c")], check=True)
    return d / "prog"


class Target:
    def __init__(self, exe: Path) -> None:
        self.proc = subprocess.Popen(
            [str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout.readline() == "ready\n"
        self.pid = self.proc.pid

    def run(self, n: int) -> None:
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().startswith("done")

    def close(self) -> None:
        try:
            self.proc.stdin.write("0\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.fixture
def target(prog):
    t = Target(prog)
    yield t
    t.close()


LINE = re.compile(
    r"^\s*(?P<comm>\S+)\s+(?P<tid>\d+)\s+(?P<time>[\d.]+):\s+(?P<event>\S+):"
    r"\s+(?P<ip>[0-9a-f]+)\s+(?P<sym>\S+)\s+ABI:2(?P<regs>.*)$"
)


def perf_script(path: Path) -> list[dict]:
    r = subprocess.run(
        [PERF, "script", "-i", str(path), "-F", "comm,tid,time,event,ip,sym,uregs"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = []
    for line in r.stdout.splitlines():
        m = LINE.match(line)
        assert m, line
        e = m.groupdict()
        e["regs"] = {k: int(v, 16) for k, v in re.findall(r"(\w+):0x([0-9a-f]+)", e["regs"])}
        out.append(e)
    return out


def test_perf_script_lists_the_events(target, tmp_path):
    path = tmp_path / "x.data"
    n = 200
    with ProbeSession(target.pid) as s:
        tp = s.add("func", record=True, regs=("rdi", "rsi"))
        out = open_output(str(path), [ProbeInfo(tp.id, "func", ("rdi", "rsi"))], target.pid)
        assert isinstance(out, PerfData)
        t0 = time.monotonic_ns()
        target.run(n)
        t1 = time.monotonic_ns()
        out.write(s.drain(), s.rings.clock, s.lost)
        out.close()
        assert s.lost == 0 and out.count == n
    events = perf_script(path)
    assert len(events) == n
    assert {e["comm"] for e in events} == {"prog"}
    assert {int(e["tid"]) for e in events} == {target.pid}
    assert {e["event"] for e in events} == {"hwtrace_probe:func"}
    assert {e["sym"] for e in events} == {"func"}
    assert {int(e["ip"], 16) for e in events} == {tp.address}
    assert [e["regs"]["DI"] for e in events] == [100 + i for i in range(n)]
    assert [e["regs"]["SI"] for e in events] == [7 * i for i in range(n)]
    us = [round(float(e["time"]) * 1e6) for e in events]  # perf prints microseconds
    assert us == sorted(us) and t0 // 1000 <= us[0] and us[-1] <= t1 // 1000 + 1
    report = subprocess.run([PERF, "report", "-i", str(path), "--stdio"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert re.search(r"100\.00%\s+prog\s+prog\s+\[\.\] func", report.stdout), report.stdout


def test_returns_and_tracepoints_placed_later(target, tmp_path):
    """A tracepoint placed after the output was opened gets its event in the
    data; an entry/exit one's returns carry the return value (rax)."""
    path = tmp_path / "x.data"
    with ProbeSession(target.pid) as s:
        tp = s.add("func", record=True, regs=("rdi",))
        out = open_output(str(path), [ProbeInfo(tp.id, "func", ("rdi",))], target.pid)
        target.run(3)
        out.write(s.drain(), s.rings.clock, s.lost)
        late = s.add("other", record=True, regs=("rdi",), returns=True)
        out.probes[late.id] = ProbeInfo(late.id, "other", ("rdi",))  # as the CLI does
        target.run(5)
        out.write(s.drain(), s.rings.clock, s.lost)
        out.close()
    events = perf_script(path)
    names = [e["event"] for e in events]
    assert names.count("hwtrace_probe:func") == 8
    calls = [e for e in events if e["event"] == "hwtrace_probe:other"]
    returns = [e for e in events if e["event"] == "hwtrace_probe:other__return"]
    assert [e["regs"]["DI"] for e in calls] == list(range(5))
    assert [e["regs"]["AX"] for e in returns] == [i ^ 0x5A5A for i in range(5)]
    assert {e["sym"] for e in calls + returns} == {"other"}


def test_cli_writes_perf_data(prog, tmp_path):
    path = tmp_path / "probe.data"
    r = subprocess.run(
        [*HWTRACE, "probe", "func", "-o", str(path), "--", str(prog)],
        input="50\n0\n", capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "50 events written" in r.stderr
    events = perf_script(path)
    assert len(events) == 50
    assert {(e["comm"], e["event"], e["sym"]) for e in events} == {
        ("prog", "hwtrace_probe:func", "func")
    }
    assert [(e["regs"]["DI"], e["regs"]["SI"]) for e in events] == [
        (100 + i, 7 * i) for i in range(50)
    ]
