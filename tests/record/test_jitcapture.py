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
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int (*fn_t)(void);

static unsigned char *barrier;
static volatile int barrier_hits;

static void on_segv(int sig, siginfo_t *info, void *uc) { /* a GC-style write barrier */
    if ((unsigned char *)info->si_addr != barrier) _exit(6);
    barrier_hits++;
    mprotect(barrier, 4096, PROT_READ | PROT_WRITE);
}

static void emit(unsigned char *p, int v) { /* mov eax, v; ret */
    p[0] = 0xb8;
    memcpy(p + 1, &v, 4);
    p[5] = 0xc3;
}

int main(int argc, char **argv) {
    int n = atoi(argv[1]), mode = atoi(argv[2]);
    if (mode == 4) { /* its own SIGSEGV handler, set after start, and faults it handles */
        struct sigaction sa = {0}, old;
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO;
        if (sigaction(SIGSEGV, &sa, &old) || old.sa_handler != SIG_DFL) return 5;
        if (sigaction(SIGSEGV, NULL, &old) || old.sa_sigaction != on_segv) return 7;
        barrier = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        mode = 0;
        for (int k = 0; k < 3; k++) {
            barrier[0] = 1;  /* faults: the handler opens the page */
            mprotect(barrier, 4096, PROT_READ);
        }
        if (barrier_hits != 3) return 8;
    }
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


def _agents():
    from hwtrace.record.jitagent import in_process_available

    why = in_process_available()
    return [
        "ptrace",
        pytest.param("in-process", marks=pytest.mark.skipif(why is not None, reason=str(why))),
    ]


AGENTS = _agents()


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


@pytest.mark.parametrize("agent", AGENTS)
def test_pages_made_executable_by_mprotect(program, agent):
    from hwtrace.record.jitcapture import capture_code

    r = capture_code([program, "25", "0"], agent)
    assert r.exit_status == 0
    _check(r.revisions, range(25))
    assert r.stats["exec_faults"] == 25 and r.stats["write_faults"] == 0
    store = r.code_revisions()
    assert len(store) == 25 and all(rev.source == "capture" for rev in store.revisions)


@pytest.mark.parametrize("agent", AGENTS)
def test_a_page_kept_writable_and_executable_is_caught_at_each_rewrite(program, agent):
    """W^X: once executed, the page loses its write right; the next write
    faults and takes its execute right, so the next execution is caught
    although the program never calls mprotect."""
    from hwtrace.record.jitcapture import capture_code

    r = capture_code([program, "150", "1"], agent)  # more than the agent's ring holds at once
    assert r.exit_status == 0
    _check(r.revisions, range(150))
    assert r.stats["exec_faults"] == 150 and r.stats["write_faults"] == 149


@pytest.mark.parametrize("agent", AGENTS)
def test_attached_then_let_go(program, agent):
    """Attached to a running JIT: its page armed, revisions captured until
    enough, then the page's protection given back; the program goes on
    and finishes right."""
    from hwtrace.record.jitcapture import capture_code

    proc = subprocess.Popen([program, "3000", "2"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        r = capture_code(proc.pid, agent, max_revisions=12)
        assert len(r.revisions) == 12 and r.exit_status is None
        first = int.from_bytes(r.revisions[0].data[1:5], "little")
        _check(r.revisions, range(first, first + 12))
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("agent", AGENTS)
def test_the_programs_own_handler_gets_its_faults(program, agent):
    """A program that sets its own SIGSEGV handler after it started reads
    back its own previous action (not the agent's), gets the faults that
    are its own (a write barrier: three writes to a read-only page it then
    opens), and its JIT pages are still captured."""
    from hwtrace.record.jitcapture import capture_code

    r = capture_code([program, "6", "4"], agent)
    assert r.exit_status == 0
    _check(r.revisions, range(6))
    if agent == "in-process":
        assert r.stats["sigactions"] == 1 and r.stats["chained"] == 3


@pytest.mark.parametrize("agent", AGENTS)
def test_the_programs_own_faults_are_delivered(program, agent):
    """A write to a page the program made read-only and executable is its
    own fault: delivered, the process dies of it and capture ends there."""
    from hwtrace.record.jitcapture import capture_code

    r = capture_code([program, "5", "3"], agent)
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


@pytest.mark.parametrize("agent", AGENTS)
def test_perf_and_the_agent_record_together(program, agent, tmp_path):
    """``hwtrace record --jit``'s orchestration with a perf event this
    machine has (a tracepoint, not Intel PT): perf opens its events
    disabled, is enabled before the program's first instruction, and the
    revisions land in its perf.data as TEXT_POKE records, in time order
    among perf's own records: each page's snapshot after the program made
    it and before the program unmapped it."""
    import re

    from hwtrace.perf.data import PerfData
    from hwtrace.perf.intelpt import sideband_of
    from hwtrace.record.jitrecord import record_perf_with_capture

    why = _perf_tracepoints()
    if why:
        pytest.skip(why)
    out = tmp_path / "jit.data"
    argv = ["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-e", "syscalls:sys_enter_munmap",
            "-o", str(out)]  # fmt: skip
    status, r = record_perf_with_capture(argv, [program, "20", "0"], out, agent=agent)
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
    pokes = [k for k, e in enumerate(events) if e[0] == "poke"]
    unmaps = [k for k, e in enumerate(events) if e[0] == "munmap"]
    assert len(pokes) == len(unmaps) == 20
    # Each snapshot after the program unmapped the page's previous
    # incarnation and before it unmapped the next (the agent's TSC and
    # perf's clock agree to well under the microseconds between them).
    assert all(unmaps[i - 1] < pokes[i] < unmaps[i + 1] for i in range(1, 19))
    store = sideband_of(PerfData(str(out))).code_revisions(r.pid, None)
    # (perf also keeps the kernel's BPF programs, the agent's among them)
    user = [(v.address, v.data) for v in store.revisions if v.address < 1 << 63]
    assert user == [(c.address, c.data) for c in r.revisions]


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


@pytest.mark.parametrize("agent", [a for a in AGENTS if a != "ptrace"])
def test_a_full_ring_waits_for_hwtrace(program, agent):
    """hwtrace drains rarely (every 0.3 s) while the program rewrites its
    page 3,000 times, three times what the agent's ring holds: the
    program waits for room, and no revision is lost."""
    from hwtrace.record._agentcode import NSLOTS
    from hwtrace.record.jitagent import InProcessCapture

    cap = InProcessCapture([program, str(3 * NSLOTS), "1"])
    cap.poll_seconds = 0.3
    try:
        r = cap.run()
    finally:
        cap.close()
    assert r.exit_status == 0 and r.stats["lost"] == 0
    _check(r.revisions, range(3 * NSLOTS))


NODE_PROGRAM = (
    "function f(n){let s=0;for(let i=0;i<n;i++)s+=i*i;return s};"
    "let t=0;for(let k=0;k<2000;k++)t+=f(10000);console.log(t)"
)


@pytest.mark.parametrize("agent", AGENTS)
def test_node_jit_code_captured_equals_its_jitdump(agent, tmp_path):
    """Node 20's V8 under the agent, with ``--perf-prof`` (and
    ``--interpreted-frames-native-stack``, as perf documents): V8 writes
    every piece of code it makes to a jitdump file; every one that lies on
    a page the agent captured has the same bytes there (about 250 here),
    among them the tiers V8 compiled ``f`` to (interpreter entry ~,
    Sparkplug ^, TurboFan *)."""
    import re
    import shutil

    from hwtrace.image.jitdump import read_jitdump
    from hwtrace.record.jitcapture import capture_code

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout
    if int(version.strip().lstrip("v").split(".")[0]) < 20:
        pytest.skip(f"node {version.strip()}: jitdump from --perf-prof wants node 20+")
    cwd = os.getcwd()
    os.chdir(tmp_path)  # V8 writes jit-PID.dump where it runs
    try:
        r = capture_code(
            [node, "--perf-prof", "--interpreted-frames-native-stack", "-e", NODE_PROGRAM], agent
        )  # as perf documents for node
    finally:
        os.chdir(cwd)
    assert r.exit_status == 0 and r.revisions
    codes = read_jitdump(str(tmp_path / f"jit-{r.pid}.dump"), pid=r.pid).codes
    same, differ = [], []
    for c in codes:
        pages = [v for v in r.revisions
                 if v.address <= c.address and c.address + len(c.code) <= v.address + 4096]  # fmt: skip
        if pages:
            at = c.address - pages[-1].address
            ok = any(v.data[at : at + len(c.code)] == c.code for v in pages)
            (same if ok else differ).append(c.name)
    tiers = {n[3] for n in same if re.match(r"JS:\W?f ", n)}
    assert not differ and len(same) >= 100
    assert {"~", "^", "*"} <= tiers
