"""The software recorder: real processes single-stepped inside chosen
functions, written as Intel PT, decoded back exactly.

A small C program (built with gcc, cached per source hash like
``groundtruth``) is run or attached to; :func:`record_software` steps the
chosen functions; hwtrace's decoder must give back exactly the stepped
instructions, which must be the ``rip`` column of the stepped register log.
The program writes what it computed (e.g. how many calls it made) to a file,
an independent check on the path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from hwtrace.image import read_elf
from hwtrace.pt.decode import decode_trace
from hwtrace.record import RecordError, SoftwareRecording, record_software, step_process

PROGRAM = r"""
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <unistd.h>
#define NOINLINE __attribute__((noinline))

static FILE *out;
volatile long calls, hits;
const char *volatile msg = "via libc";

/* Calls into libc (which runs free) and is called back from libc. */
NOINLINE int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

NOINLINE long work(long n) {
    long v[32], s = 0;
    char buf[32];
    for (long i = 0; i < 32; i++)
        v[i] = (i * 7919) % 31;
    qsort(v, 32, sizeof v[0], cmp_long);
    for (long i = 0; i < n; i++) {
        snprintf(buf, sizeof buf, "%ld", v[i % 32] * i);
        s += (long)strlen(buf) + (i & 1 ? v[i % 32] : -1);
    }
    return s;
}

/* Recursion: deeper than the 64-entry return stack, and through libc. */
NOINLINE long fib(long n) {
    calls++;
    return n < 2 ? n : fib(n - 1) + fib(n - 2);
}

NOINLINE long deep(long n) {
    calls++;
    if (n == 0)
        return 1;
    long r = deep(n - 1);
    if (n % 25 == 0)
        r += (long)strlen(msg);
    return (r * 3 + n) % 1000003;
}

/* Signals: sent from inside the range (kill as a raw system call, so the
 * signal arrives while stepping) and from an interval timer. */
/* One locked instruction: a nested handler cannot split the increment. */
NOINLINE void on_signal(int sig) {
    __atomic_fetch_add(&hits, 1, __ATOMIC_RELAXED);
    calls += sig;
}

NOINLINE long spin(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) {
        s += i ^ (s >> 3);
        if (i % 1000 == 0) {
            long r;
            __asm__ volatile("syscall" : "=a"(r) : "a"(62L), "D"((long)getpid()), "S"(10L)
                             : "rcx", "r11", "memory");
        }
    }
    return s;
}

/* The same handler entered twice in a row: its first instruction runs, its
 * second faults (for SIGUSR1 it reads a page not mapped yet) and the SIGSEGV
 * run of the same handler starts at that first instruction again, then maps
 * the page so that the interrupted SIGUSR1 run goes on.  Two handler runs,
 * not a rep string instruction's iterations. */
#define PAGE_OF(sig) ((void *)((unsigned long)(sig) << 28))
NOINLINE void nested_body(int sig) {
    __atomic_fetch_add(&hits, 1, __ATOMIC_RELAXED);
    if (sig == SIGSEGV) {
        if (mmap(PAGE_OF(SIGUSR1), 4096, PROT_READ,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) != PAGE_OF(SIGUSR1))
            _exit(3);
    } else {
        munmap(PAGE_OF(SIGUSR1), 4096);
    }
}
void nested_entry(int sig);
__asm__(".text\n.globl nested_entry\n.type nested_entry, @function\nnested_entry:\n"
        "    imul $0x10000000, %rdi, %rax\n" /* this signal's page */
        "    mov (%rax), %rax\n"             /* faults for SIGUSR1 until mapped */
        "    jmp nested_body\n"
        ".size nested_entry, .-nested_entry\n");

/* SIGUSR1 as a raw system call, so that it arrives while stepping. */
NOINLINE void poke(void) {
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(62L), "D"((long)getpid()), "S"(10L)
                     : "rcx", "r11", "memory");
}

/* Exit inside the range: exit_group as a raw system call. */
NOINLINE void finish(long code) {
    fprintf(out, "exit %ld\n", code);
    fclose(out);
    for (long i = 0; i < code; i++)
        calls += i;
    __asm__ volatile("syscall" : : "a"(231L), "D"(code) : "rcx", "r11", "memory");
    for (;;) {}
}

NOINLINE long tick(long i) { return (i * 2654435761UL) >> 7; }

int main(int argc, char **argv) {
    const char *mode = argv[1];
    long n = atol(argv[2]);
    out = fopen(argv[3], "w");
    setvbuf(out, NULL, _IONBF, 0);
    if (!strcmp(mode, "work")) {
        fprintf(out, "%ld\n", work(n));
    } else if (!strcmp(mode, "fib")) {
        long r = fib(n);
        fprintf(out, "%ld %ld\n", r, calls);
    } else if (!strcmp(mode, "deep")) {
        long r = deep(n);
        fprintf(out, "%ld %ld\n", r, calls);
    } else if (!strcmp(mode, "signal")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigaction(SIGUSR1, &sa, NULL);
        sigaction(SIGALRM, &sa, NULL);
        struct itimerval it = {{0, 2000}, {0, 2000}};
        setitimer(ITIMER_REAL, &it, NULL);
        long r = spin(n);
        /* Stop the timer before reading hits: handlers after it would be
         * traced but not counted. */
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_REAL, &off, NULL);
        fprintf(out, "%ld %ld\n", r, hits);
    } else if (!strcmp(mode, "nested")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = nested_entry;
        sigaction(SIGUSR1, &sa, NULL);
        sigaction(SIGSEGV, &sa, NULL);
        if (mmap(PAGE_OF(SIGSEGV), 4096, PROT_READ,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) != PAGE_OF(SIGSEGV))
            return 2;
        raise(SIGUSR1); /* delivered in libc, outside the ranges */
        for (long i = 0; i < n; i++)
            poke(); /* delivered while stepping */
        fprintf(out, "%ld %ld\n", n, hits);
    } else if (!strcmp(mode, "exit")) {
        finish(n);
    } else if (!strcmp(mode, "forever")) {
        fprintf(out, "ready\n");
        for (long i = 0;; i++) {
            calls += tick(i);
            usleep(200);
        }
    }
    return 0;
}
"""

BUILDS = {"pie": ("-fPIE", "-pie"), "nopie": ("-fno-pie", "-no-pie")}


def _cc() -> str | None:
    return shutil.which(os.environ.get("CC") or "gcc")


def _ptrace_skip_reason() -> str | None:
    """Why this process cannot ptrace its children here, or None."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            if f.read().strip() == "3":
                return "ptrace is disabled (kernel.yama.ptrace_scope = 3)"
    except OSError:
        pass
    from hwtrace.record import _native as nat

    child = subprocess.Popen(["sleep", "10"])
    try:
        r = nat.ptrace(nat.PTRACE_ATTACH, child.pid, 0, 0)
        if r < 0:
            return f"ptrace is not permitted here ({os.strerror(-r)}; CAP_SYS_PTRACE or yama)"
        nat.ptrace(nat.PTRACE_DETACH, child.pid, 0, 0)  # may fail before the stop: fine
        return None
    finally:
        child.kill()
        child.wait()


def _skip_reason() -> str | None:
    if _cc() is None:
        return "no C compiler (gcc) on PATH"
    if os.uname().machine != "x86_64":
        return "the software recorder steps x86-64 processes"
    return _ptrace_skip_reason()


SKIP = _skip_reason()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=str(SKIP))


def build(kind: str = "pie") -> Path:
    cc = _cc()
    flags = ("-O1", "-g0", "-fno-omit-frame-pointer", *BUILDS[kind])
    h = hashlib.sha256("\0".join((str(cc), *flags, PROGRAM)).encode()).hexdigest()[:16]
    xdg = os.environ.get("XDG_CACHE_HOME")
    directory = (Path(xdg) / "hwtrace" if xdg else Path(tempfile.gettempdir())) / "hwtrace-record"
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"prog-{kind}-{h}"
    if target.is_file():
        return target
    src = directory / f".prog-{h}-{os.getpid()}.c"
    tmp = directory / f".prog-{kind}-{h}-{os.getpid()}.tmp"
    src.write_text(PROGRAM)
    try:
        cmd = [str(cc), *flags, "-o", str(tmp), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"
        os.replace(tmp, target)
    finally:
        src.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return target


def check_decodes(rec: SoftwareRecording) -> np.ndarray:
    """Decode the PT; it must give exactly the stepped instructions, which are
    the stepped registers' rip (each rep string instruction once)."""
    rip = rec.log.register("rip")
    assert np.array_equal(rip, rec.log.ips)
    repeats = np.zeros(rip.shape[0], np.bool_)
    repeats[1:] = rip[1:] == rip[:-1]
    # Only within a traced stretch: the same address first and last around an
    # untraced one ran twice (a nested signal handler's RET, then its outer
    # handler's, with the sigreturn between them).
    starts = [seg.start for seg in rec.log.segments if seg.start < rip.shape[0]]
    repeats[starts] = False
    # Nor is a handler's first row: its first instruction may have just run
    # in a run of the same handler that the signal interrupted.
    entries = [row for seg in rec.log.segments for row, _, _ in seg.interrupts]
    repeats[[row for row in entries if row < rip.shape[0]]] = False
    assert np.array_equal(rec.instructions, rip[~repeats])
    res = decode_trace(rec.data, rec.image(), rec.config)
    assert not res.gaps, [str(g) for g in res.gaps]
    got = res.instructions()
    assert got.shape == rec.instructions.shape, (got.shape, rec.instructions.shape)
    assert np.array_equal(got, rec.instructions)
    inside = np.zeros(got.shape[0], np.bool_)
    for r in rec.ranges:
        inside |= (got >= r.start) & (got < r.end)
    assert inside.all()
    return got


def entry_count(rec: SoftwareRecording, name: str) -> int:
    start = next(r.start for r in rec.ranges if r.name == name)
    return int((rec.instructions == start).sum())


@pytest.mark.parametrize("kind", list(BUILDS))
def test_function_calling_libc(kind, tmp_path):
    """libc runs free (tracing off and on again); qsort calls back into a
    traced function; a PIE and a non-PIE build."""
    exe = build(kind)
    out = tmp_path / "out"
    rec = record_software([str(exe), "work", "40", str(out)], functions=["work", "cmp_long"])
    assert os.WIFEXITED(rec.exit_status) and os.WEXITSTATUS(rec.exit_status) == 0
    assert out.read_text().strip()  # the program ran to its end
    check_decodes(rec)
    assert rec.stats["enable"] > 40  # back from snprintf and strlen each time
    assert entry_count(rec, "cmp_long") > 32  # qsort's callbacks
    assert entry_count(rec, "work") == 1
    elf = read_elf(exe)
    pie = elf.elf_type == "ET_DYN"
    assert pie == (kind == "pie")
    if pie:
        assert rec.ranges[0].start > 0x400000000  # relocated by the load bias
    # Sideband for perf.data.
    assert rec.pid > 0 and rec.tid == rec.pid and rec.comm == exe.name[:15]
    assert any(m.path == str(exe) and "x" in m.prot for m in rec.mmaps)
    assert any(m.build_id for m in rec.mmaps if m.path == str(exe))
    assert str(exe) in rec.filters
    assert "stepping" in rec.timing_note
    conv = rec.time_conversion
    ns = conv.to_ns(rec.instruction_times)
    assert (np.diff(ns.astype(np.int64)) >= 0).all()


def test_recursion(tmp_path):
    """fib and a recursion deeper than the return stack, partly through libc;
    the number of entries seen is the number of calls the program counted."""
    exe = build()
    out = tmp_path / "out"
    rec = record_software(
        [str(exe), "deep", "150", str(out)], functions=["deep"], psb_period=0, cyc=True
    )
    check_decodes(rec)
    _, calls = map(int, out.read_text().split())
    assert entry_count(rec, "deep") == calls == 151
    assert rec.stats["max_call_depth"] == 64 and rec.stats["call_overflow"] > 0
    assert rec.stats["enable"] == 1 + 150 // 25  # back from strlen
    rec = record_software(
        [str(exe), "fib", "12", str(out)], functions=["fib"], noretcomp=True, psb_period=256
    )
    check_decodes(rec)
    _, calls = map(int, out.read_text().split())
    assert entry_count(rec, "fib") == calls
    assert rec.stats["ret_compressed"] == 0 and rec.stats["psb"] > 10


@pytest.mark.parametrize("handler_traced", [False, True])
def test_signals_while_tracing(tmp_path, handler_traced):
    """Signals arriving while stepping are delivered: the handler outside the
    range switches tracing off and on; inside it, an interrupt (FUP + TIP)."""
    exe = build()
    out = tmp_path / "out"
    functions = ["spin", "on_signal"] if handler_traced else ["spin"]
    rec = record_software([str(exe), "signal", "5000", str(out)], functions=functions)
    assert os.WIFEXITED(rec.exit_status) and os.WEXITSTATUS(rec.exit_status) == 0
    _, hits = map(int, out.read_text().split())
    caught = [sig for _, sig, c in rec.log.signals if c]
    assert caught.count(signal.SIGUSR1) == 5  # one per 1000 iterations
    assert hits >= 5
    check_decodes(rec)
    if handler_traced:
        assert rec.stats["interrupt"] >= 5
        assert entry_count(rec, "on_signal") == hits  # every handler run is traced
    else:
        assert rec.stats["interrupt"] == 0
        assert rec.stats["enable"] >= 6


def test_nested_handler_at_its_own_first_instruction(tmp_path):
    """A handler whose second instruction faults: the SIGSEGV run of the same
    handler starts where the interrupted run just started, so the log has the
    handler's first instruction twice in a row, once at the start of a traced
    stretch (SIGUSR1 raised in libc) and once inside one (sent while
    stepping).  Both are handler runs (interrupts), not a rep string
    instruction's iterations, and both are in the trace."""
    exe = build()
    out = tmp_path / "out"
    functions = ["nested_entry", "nested_body", "poke"]
    rec = record_software([str(exe), "nested", "3", str(out)], functions=functions)
    assert os.WIFEXITED(rec.exit_status) and os.WEXITSTATUS(rec.exit_status) == 0
    n, hits = map(int, out.read_text().split())
    assert hits == 2 * (1 + n)  # each SIGUSR1 run and the SIGSEGV run inside it
    start = next(r.start for r in rec.ranges if r.name == "nested_entry")
    ips = rec.log.ips
    assert int(((ips[1:] == start) & (ips[:-1] == start)).sum()) == 1 + n
    caught = [sig for _, sig, c in rec.log.signals if c]
    assert caught.count(signal.SIGSEGV) == 1 + n and caught.count(signal.SIGUSR1) == n
    check_decodes(rec)
    assert entry_count(rec, "nested_entry") == hits
    assert rec.stats["interrupt"] == 2 * n + 1


def test_exit_inside_range(tmp_path):
    """The process ends with exit_group inside the traced function."""
    exe = build()
    out = tmp_path / "out"
    rec = record_software([str(exe), "exit", "7", str(out)], functions=["finish"])
    assert os.WIFEXITED(rec.exit_status) and os.WEXITSTATUS(rec.exit_status) == 7
    assert rec.log.segments[-1].end_reason == "exit"
    got = check_decodes(rec)
    code = rec.log.read_code(int(got[-1]), 2)
    assert code == b"\x0f\x05"  # the last instruction is the syscall


def test_attach_to_running_process(tmp_path):
    """Attach by pid to a process that is already running, record a bounded
    number of instructions, detach and leave it running."""
    exe = build()
    out = tmp_path / "out"
    proc = subprocess.Popen([str(exe), "forever", "0", str(out)])
    try:
        for _ in range(200):
            if out.exists() and out.read_text().strip() == "ready":
                break
            time.sleep(0.01)
        rec = record_software(proc.pid, functions=["tick"], max_instructions=300)
        assert rec.argv is None and rec.pid == proc.pid
        assert rec.log.stopped_because.startswith("the instruction limit")
        assert rec.instructions.shape[0] == 300
        got = check_decodes(rec)
        assert entry_count(rec, "tick") >= 300 // 20
        assert got.shape[0] == 300
        time.sleep(0.05)
        assert proc.poll() is None  # still running, untraced
        with open(f"/proc/{proc.pid}/status") as f:
            assert "TracerPid:\t0" in f.read()
    finally:
        proc.kill()
        proc.wait()


def test_monotonic_clock_and_basic_registers(tmp_path):
    exe = build()
    out = tmp_path / "out"
    rec = record_software(
        [str(exe), "work", "5", str(out)],
        functions=["work"],
        clock="monotonic",
        registers="basic",
        tsc=True,
        mtc_period=0,
        cyc=True,
    )
    assert rec.log.register_names == ("rip", "rsp", "eflags")
    assert rec.time_conversion.time_mult == 1 and rec.time_conversion.time_shift == 0
    check_decodes(rec)
    assert rec.stats["mtc"] > 0 and rec.stats["cyc"] > 0


def test_bad_input_is_a_clear_error(tmp_path):
    exe = build()
    with pytest.raises(RecordError, match="not found"):
        record_software([str(exe), "work", "1", str(tmp_path / "o")], functions=["no_such_fn"])
    with pytest.raises(RecordError, match="command not found"):
        record_software(["/no/such/program"], functions=["main"])
    with pytest.raises(RecordError, match="nothing to trace"):
        step_process(["true"])
    with pytest.raises(RecordError, match="no process"):
        record_software(2**22 + 12345, functions=["main"])
    with pytest.raises(RecordError, match="mtc_period"):
        record_software(["true"], functions=["main"], mtc_period=16)
    with pytest.raises(RecordError, match="never ran inside"):
        record_software([str(exe), "work", "1", str(tmp_path / "o")], functions=["fib"])
