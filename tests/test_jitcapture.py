"""The code capture agent (``hwtrace.record.jitcapture``): FlowJIT's page
snapshots at first execution, done with ptrace on live processes.

Small C programs compile functions (``mov eax, i; ret``) at run time, in
the two ways JITs do: a fresh page made executable with ``mprotect``, or
one page kept writable and executable and rewritten.  Every version must
be captured once, with its bytes, in order, and the program must run as
it would alone (its exit status checks every call's result).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from test_record_software import SKIP, compile_program

pytestmark = pytest.mark.skipif(SKIP is not None, reason=str(SKIP))

PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int (*fn_t)(void);

static void emit(unsigned char *p, int v) { /* mov eax, v; ret */
    p[0] = 0xb8;
    memcpy(p + 1, &v, 4);
    p[5] = 0xc3;
}

int main(int argc, char **argv) {
    int n = atoi(argv[1]), mode = atoi(argv[2]);
    unsigned char *rwx = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mode == 2) {
        printf("ready\n");
        fflush(stdout);
    }
    for (int i = 0; n < 0 || i < n; i++) {
        unsigned char *p = rwx;
        if (mode == 0) { /* a fresh page each time, made executable */
            p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            emit(p, i);
            mprotect(p, 4096, PROT_READ | PROT_EXEC);
        } else {
            emit(p, i);
        }
        if (((fn_t)p)() != i)
            return 1;
        if (mode == 0)
            munmap(p, 4096);
        if (mode == 2) {
            usleep(500);
            if (i > 20000)
                return 3;
        }
        if (mode == 3) { /* a write the program never allowed: its own crash */
            mprotect(p, 4096, PROT_READ | PROT_EXEC);
            p[0] = 0x90;
        }
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def program() -> str:
    return str(compile_program(PROGRAM, "jitcapture", ("-O1", "-g0")))


def _check(revisions, values):
    assert [c.data[:6] for c in revisions] == [
        b"\xb8" + v.to_bytes(4, "little", signed=True) + b"\xc3" for v in values
    ]
    assert all(c.address % 4096 == 0 and c.ip == c.address for c in revisions)
    times = [c.time for c in revisions]
    assert times == sorted(times)


def test_pages_made_executable_by_mprotect(program):
    from hwtrace.record.jitcapture import capture_code

    r = capture_code([program, "25", "0"])
    assert r.exit_status == 0
    _check(r.revisions, range(25))
    assert r.stats["exec_faults"] == 25 and r.stats["write_faults"] == 0
    store = r.code_revisions()
    assert len(store) == 25 and all(rev.source == "capture" for rev in store.revisions)


def test_a_page_kept_writable_and_executable_is_caught_at_each_rewrite(program):
    """W^X: once executed, the page loses its write right; the next write
    faults and takes its execute right, so the next execution is caught
    although the program never calls mprotect."""
    from hwtrace.record.jitcapture import capture_code

    r = capture_code([program, "150", "1"])  # more than the agent's ring holds at once
    assert r.exit_status == 0
    _check(r.revisions, range(150))
    assert r.stats["exec_faults"] == 150 and r.stats["write_faults"] == 149


def test_attached_then_let_go(program):
    """Attached to a running JIT: its page armed, revisions captured until
    enough, then the page's protection given back; the program goes on
    and finishes right."""
    from hwtrace.record.jitcapture import capture_code

    proc = subprocess.Popen([program, "3000", "2"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        r = capture_code(proc.pid, max_revisions=12)
        assert len(r.revisions) == 12 and r.exit_status is None
        first = int.from_bytes(r.revisions[0].data[1:5], "little")
        _check(r.revisions, range(first, first + 12))
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_programs_own_faults_are_delivered(program):
    """A write to a page the program made read-only and executable is its
    own fault: delivered, the process dies of it and capture ends there."""
    from hwtrace.record.jitcapture import capture_code

    r = capture_code([program, "5", "3"])
    assert r.exit_status is not None and os.WIFSIGNALED(r.exit_status)
    assert os.WTERMSIG(r.exit_status) == signal.SIGSEGV
    _check(r.revisions, [0])
    assert r.stats["exec_faults"] == 1 and r.stats["write_faults"] == 0


def test_bad_targets_are_one_message(tmp_path):
    from hwtrace.record.jitcapture import capture_code
    from hwtrace.record.stepper import RecordError

    with pytest.raises(RecordError, match="command not found"):
        capture_code(["/nonexistent/jit"])
    with pytest.raises(RecordError, match="no process"):
        capture_code(999_999_999)


def _perf_tracepoints() -> str | None:
    import shutil

    if shutil.which("perf") is None:
        return "perf is not installed"
    if not os.path.exists("/sys/kernel/tracing/events/syscalls/sys_enter_munmap"):
        return "no syscalls:sys_enter_munmap tracepoint (tracefs)"
    return None


def test_perf_and_the_agent_record_together(program, tmp_path):
    """``hwtrace record --jit``'s orchestration with a perf event this
    machine has (a tracepoint, not Intel PT): perf opens its events
    disabled, is enabled before the program's first instruction, and the
    revisions land in its perf.data as TEXT_POKE records, in time order
    among perf's own records: each page's snapshot after the program made
    it and before the program unmapped it."""
    import re

    from hwtrace.perf.data import PerfData
    from hwtrace.perf.trace import sideband_of
    from hwtrace.record.jitrecord import record_perf_with_capture

    why = _perf_tracepoints()
    if why:
        pytest.skip(why)
    out = tmp_path / "jit.data"
    argv = ["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-e", "syscalls:sys_enter_munmap",
            "-o", str(out)]  # fmt: skip
    status, r = record_perf_with_capture(argv, [program, "20", "0"], out)
    assert status == 0 and r.exit_status == 0
    _check(r.revisions, range(20))
    script = subprocess.run(["perf", "script", "-i", str(out), "--show-text-poke-events"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert "out of order" not in script.stderr
    events = []
    for line in script.stdout.splitlines():
        if m := re.search(r"PERF_RECORD_TEXT_POKE ([0-9a-f]+)\s+old len 0 new len 4096", line):
            events.append(("poke", int(m[1], 16)))
        elif m := re.search(r"sys_enter_munmap: addr: 0x([0-9a-f]+), len: 0x0+1000$", line):
            events.append(("munmap", int(m[1], 16)))
    pages = [c.address for c in r.revisions]
    events = [e for e in events if e[1] in pages]
    assert events == [(kind, p) for p in pages for kind in ("poke", "munmap")]
    store = sideband_of(PerfData(str(out))).code_revisions(r.pid, None)
    assert [(v.address, v.data) for v in store.revisions] == [
        (c.address, c.data) for c in r.revisions
    ]


def test_record_jit_without_intel_pt_is_one_message(program, tmp_path):
    from hwtrace.record.perf_pt import have_intel_pt

    if have_intel_pt():
        pytest.skip("this machine has Intel PT")
    out = subprocess.run(
        [sys.executable, "-m", "hwtrace.cli.main", "record", "--jit", "--backend", "perf",
         "-o", str(tmp_path / "x.data"), "--", program, "3", "0"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("hwtrace record: no Intel PT")
