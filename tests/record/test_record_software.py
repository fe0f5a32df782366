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
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.image import Image, Section, read_elf
from hwtrace.pt.decode import decode_trace
from hwtrace.pt.flowrows import Ev
from hwtrace.record import (
    RecordError,
    SoftwareRecording,
    encode_log,
    record_software,
    step_process,
)
from hwtrace.record.stepper import END_LEFT, END_SIGNAL, Segment, StepLog, TracedRange

PROGRAM = r"""
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#define NOINLINE __attribute__((noinline))

static FILE *out;
volatile long calls, hits, alarms, resend;
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

/* Signals sent from inside the range (kill as a raw system call, so the
 * signal arrives while stepping, at a known instruction). */
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

/* rep string instructions interrupted partway.  A REP MOVSB or STOSB that
 * reaches a PROT_NONE page faults in that iteration; the SIGSEGV handler
 * makes the page accessible and returns, and the instruction goes on from
 * the iteration that faulted. */
NOINLINE void rep_copy(void *d, const void *s, long n) {
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}
NOINLINE void rep_fill(void *d, long n) {
    __asm__ volatile("rep stosb" : "+D"(d), "+c"(n) : "a"(0x5a) : "memory");
}
#define PAGE 4096
static char *pages; /* six pages */
static char pattern[3 * PAGE];
/* SIGALRM to this process as a raw system call. */
static inline __attribute__((always_inline)) void alarm_self(void) {
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(62L), "D"((long)getpid()), "S"(14L)
                     : "rcx", "r11", "memory");
}
NOINLINE void on_fault(int sig, siginfo_t *si, void *ctx) {
    (void)sig, (void)ctx;
    __atomic_fetch_add(&hits, 1, __ATOMIC_RELAXED);
    char *page = (char *)((unsigned long)si->si_addr & ~(PAGE - 1UL));
    if (page < pages || page >= pages + 6 * PAGE || mprotect(page, PAGE, PROT_READ | PROT_WRITE))
        _exit(4);
    if (resend >= 0) {
        /* SIGALRM is blocked while this handler runs: it lands when the
         * interrupted instruction resumes, before it runs on. */
        resend = 2;
        alarm_self();
    }
}
/* Sends SIGALRM again `resend` times; blocked while it runs, each lands as
 * the interrupted instruction resumes once more. */
NOINLINE void on_alarm(int sig) {
    (void)sig;
    alarms++;
    if (resend > 0) {
        resend--;
        alarm_self();
    }
}
/* Handlers returning through a restorer of the program's own (rt_sigreturn),
 * which can be traced: a signal blocked while a handler ran becomes
 * deliverable in its rt_sigreturn, and lands while the interrupted
 * instruction, back in the ranges, is stepped. */
void restorer(void);
__asm__(".text\n.globl restorer\n.type restorer, @function\nrestorer:\n"
        "    mov $15, %eax\n"
        "    syscall\n"
        ".size restorer, .-restorer\n");
static void handle(int sig, void *handler, unsigned long flags, unsigned long mask) {
    struct { void *handler; unsigned long flags; void (*restorer)(void); unsigned long mask; }
        ka = {handler, flags | 0x04000000UL /* SA_RESTORER */, restorer, mask};
    register long size __asm__("r10") = 8;
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(13L), "D"((long)sig), "S"(&ka), "d"(0L), "r"(size)
                     : "rcx", "r11", "memory");
    if (r)
        _exit(5);
}
/* One round, five faults: a copy faulting at its 101st iteration and, once
 * resumed, again 4096 iterations later; a fill faulting at its 51st; a copy
 * faulting at its first iteration on its source and, once resumed, at its
 * first iteration again on its destination.  Returns whether the bytes are
 * right. */
static int rep_round(void) {
    char *p0 = pages, *p1 = pages + PAGE, *p3 = pages + 3 * PAGE;
    char *p4 = pages + 4 * PAGE, *p5 = pages + 5 * PAGE;
    memset(pages, 0, 6 * PAGE);
    for (int i = 1; i < 6; i++)
        mprotect(pages + i * PAGE, PAGE, PROT_NONE);
    rep_copy(p1 - 100, pattern, 100 + PAGE + 100);
    rep_fill(p3 - 50, 100);
    rep_copy(p5, p4, 64);
    int ok = !memcmp(p1 - 100, pattern, 100 + PAGE + 100) && p0[PAGE - 101] == 0;
    for (int i = 0; i < 100; i++)
        ok = ok && p3[i - 50] == 0x5a;
    for (int i = 0; i < 64; i++)
        ok = ok && p5[i] == 0;
    return ok && p3[50] == 0;
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
        long r = spin(n);
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
    } else if (!strcmp(mode, "repfault")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, NULL);
        resend = -1; /* no SIGALRM from on_fault */
        pages = mmap(NULL, 6 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        for (int i = 0; i < 3 * PAGE; i++)
            pattern[i] = (char)(i * 7 + 1);
        int ok = 1;
        for (long i = 0; i < n; i++)
            ok = rep_round() && ok;
        fprintf(out, "%d %ld\n", ok, hits);
    } else if (!strcmp(mode, "repsignal")) {
        /* A copy over three pages, the last two PROT_NONE: it faults at its
         * iterations 101 and 101 + PAGE.  Each fault's handler sends a
         * SIGALRM, and that signal's handler two more, each blocked until
         * the handler's rt_sigreturn: three asynchronous signals land where
         * the copy resumes, each before it runs on. */
        handle(SIGSEGV, (void *)on_fault, SA_SIGINFO, 1UL << (SIGALRM - 1));
        handle(SIGALRM, (void *)on_alarm, 0, 0);
        pages = mmap(NULL, 6 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        for (int i = 0; i < 3 * PAGE; i++)
            pattern[i] = (char)(i * 13 + 5);
        mprotect(pages + PAGE, 2 * PAGE, PROT_NONE);
        rep_copy(pages + PAGE - 100, pattern, 100 + PAGE + 100);
        int ok = !memcmp(pages + PAGE - 100, pattern, 100 + PAGE + 100);
        fprintf(out, "%d %ld %ld\n", ok, hits, alarms);
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


def _cxx() -> str | None:
    return shutil.which(os.environ.get("CXX") or "g++")


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
# Tests that record a real process; the synthetic-log ones run anywhere.
needs_process = pytest.mark.skipif(SKIP is not None, reason=str(SKIP))


def compile_program(source: str, name: str, flags: tuple[str, ...], *, language: str = "c") -> Path:
    """``source`` built with gcc (g++ for ``language="c++"``) and ``flags``,
    cached by its hash (in $XDG_CACHE_HOME/hwtrace or the temporary
    directory)."""
    if language not in ("c", "c++"):
        raise ValueError(f"language {language!r}: 'c' or 'c++'")
    cc = _cc() if language == "c" else _cxx()
    suffix = ".c" if language == "c" else ".cpp"
    h = hashlib.sha256("\0".join((str(cc), *flags, source)).encode()).hexdigest()[:16]
    xdg = os.environ.get("XDG_CACHE_HOME")
    directory = (Path(xdg) / "hwtrace" if xdg else Path(tempfile.gettempdir())) / "hwtrace-record"
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}-{h}"
    if target.is_file():
        return target
    src = directory / f".{name}-{h}-{os.getpid()}{suffix}"
    tmp = directory / f".{name}-{h}-{os.getpid()}.tmp"
    src.write_text(source)
    try:
        cmd = [str(cc), *flags, "-o", str(tmp), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"
        os.replace(tmp, target)
    finally:
        src.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return target


def build(kind: str = "pie") -> Path:
    flags = ("-O1", "-g0", "-fno-omit-frame-pointer", *BUILDS[kind])
    return compile_program(PROGRAM, f"prog-{kind}", flags)


# Unconditional REP string instructions (MOVS, STOS, LODS, INS, OUTS), 64-bit
# address size: done after the iteration that starts with rcx <= 1.
_REP_OPCODES = {0xA4, 0xA5, 0xAA, 0xAB, 0xAC, 0xAD, 0x6C, 0x6D, 0x6E, 0x6F}


def _is_rep(code: bytes) -> bool:
    k = 0
    while k < len(code) and code[k] in (0xF3, 0x66, 0x2E, 0x3E, 0x26, 0x36, 0x64, 0x65):
        k += 1
    rep = 0xF3 in code[:k]
    if k < len(code) and 0x40 <= code[k] <= 0x4F:
        k += 1  # REX
    return rep and k < len(code) and code[k] in _REP_OPCODES


def expected_instructions(log) -> np.ndarray:
    """What the trace of a stepped log must describe, from the registers.

    A rep string instruction is stepped once per iteration; it is one
    instruction, listed where its last run of iterations starts, and only
    if it completed there (the run's last row starts with rcx <= 1).  Its
    iterations before a signal handler ran, or before tracing stopped, are
    no instruction: as in Intel PT, the interrupt's FUP is the REP's own IP
    and the instruction completes after the handler.  A run never spans a
    traced stretch's start (the same address first and last around an
    untraced stretch ran twice: a nested handler's RET, then its outer
    handler's) nor a handler's first row (its first instruction may have
    just run in a run of the same handler that the signal interrupted).
    """
    rip = log.register("rip")
    assert np.array_equal(rip, log.ips)
    n = rip.shape[0]
    breaks = np.zeros(n, np.bool_)
    breaks[0:1] = True
    breaks[1:] = rip[1:] != rip[:-1]
    breaks[[seg.start for seg in log.segments if seg.start < n]] = True
    breaks[[row for seg in log.segments for row, _, _ in seg.interrupts if row < n]] = True
    rep_ips = [ip for ip in np.unique(rip) if _is_rep(log.read_code(int(ip), 15))]
    is_rep = np.isin(rip, np.array(rep_ips, np.uint64))
    # Only a rep string instruction runs again at its own address.
    assert breaks[~is_rep].all()
    starts = np.flatnonzero(breaks)
    last = np.append(starts[1:], n) - 1  # each run's last row
    run = np.cumsum(breaks) - 1
    done = np.ones(n, np.bool_)
    if rep_ips:
        done = log.register("rcx")[last[run]] <= 1
    keep = breaks & (~is_rep | done)
    return rip[keep]


def check_decodes(rec: SoftwareRecording) -> np.ndarray:
    """Decode the PT; it must give exactly the stepped instructions
    (:func:`expected_instructions`)."""
    assert np.array_equal(rec.instructions, expected_instructions(rec.log))
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


@needs_process
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


@needs_process
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


@needs_process
@pytest.mark.parametrize("handler_traced", [False, True])
def test_signals_while_tracing(tmp_path, handler_traced):
    """Signals arriving while stepping (each sent from inside the range, so it
    lands at a known instruction) are delivered: the handler outside the
    range switches tracing off and on; inside it, an interrupt (FUP + TIP)."""
    exe = build()
    out = tmp_path / "out"
    functions = ["spin", "on_signal"] if handler_traced else ["spin"]
    rec = record_software([str(exe), "signal", "5000", str(out)], functions=functions)
    assert os.WIFEXITED(rec.exit_status) and os.WEXITSTATUS(rec.exit_status) == 0
    _, hits = map(int, out.read_text().split())
    caught = [sig for _, sig, c in rec.log.signals if c]
    assert caught == [signal.SIGUSR1] * 5  # one per 1000 iterations
    assert hits == 5
    check_decodes(rec)
    if handler_traced:
        assert rec.stats["interrupt"] == 5
        assert entry_count(rec, "on_signal") == hits  # every handler run is traced
    else:
        assert rec.stats["interrupt"] == 0
        # The first entry, then back from getpid (for the kill) and from the
        # handler, five times each.
        assert rec.stats["enable"] == 1 + 5 + 5


@needs_process
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


@needs_process
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


@needs_process
def test_attach_to_running_process(tmp_path):
    """Attach by pid to a process that is already running, record a bounded
    number of instructions, detach and leave it running."""
    exe = build()
    out = tmp_path / "out"
    proc = subprocess.Popen([str(exe), "forever", "0", str(out)])
    try:
        # It is ready when it says so (no deadline: it gets there however
        # slowly it is scheduled; pytest's own timeout guards a hang).
        while not (out.exists() and out.read_text().strip() == "ready"):
            assert proc.poll() is None, "the program ended before it was ready"
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


@needs_process
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
        ctc_ratio=511,  # an MTC wrap every 130 us: steps take less
        cyc=True,
    )
    assert rec.log.register_names == ("rip", "rsp", "eflags")
    assert rec.time_conversion.time_mult == 1 and rec.time_conversion.time_shift == 0
    check_decodes(rec)
    assert rec.stats["mtc"] > 0 and rec.stats["cyc"] > 0


@needs_process
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


def test_an_output_that_cannot_be_written_is_refused_first(tmp_path, capsys):
    """-o in a directory that does not exist (or a directory itself) is
    said before any program is launched, not a traceback after it ran."""
    from hwtrace.cli.main import main

    marker = tmp_path / "ran"
    command = ["--", "/bin/sh", "-c", f"touch {marker}"]
    for output, message in ((tmp_path / "no" / "x.data", f"no directory {tmp_path / 'no'}"),
                            (tmp_path, "a directory, not a file")):  # fmt: skip
        with pytest.raises(SystemExit) as exit_:
            main(["record", "-o", str(output), *command])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not marker.exists()


# -- rep string instructions interrupted partway ---------------------------------


def _rep_ips(rec: SoftwareRecording) -> dict[str, int]:
    """The REP string instruction of each traced function that has one."""
    out = {}
    for r in rec.ranges:
        code = rec.log.read_code(r.start, r.end - r.start)
        at = [k for k in range(len(code) - 1) if code[k] == 0xF3 and _is_rep(code[k : k + 15])]
        if at:
            (k,) = at
            out[r.name] = r.start + k
    return out


def _async_events(rec: SoftwareRecording, got: np.ndarray) -> list[tuple[Ev, int]]:
    res = decode_trace(rec.data, rec.image(), rec.config)
    assert np.array_equal(res.instructions(), got)
    kinds = (Ev.ASYNC_BRANCH, Ev.ASYNC_DISABLED)
    return [(ev.type, ev.at) for _, ev in res.events if ev.type in kinds]


def check_libipt(rec: SoftwareRecording, exe: Path) -> None:
    """Intel's decoder (libipt, instruction and block decoders) reads the
    recording as hwtrace's does, when it is installed."""
    import libipt_oracle as oracle

    if oracle.skip_reason is not None:
        return
    path = exe.parent / f".rec-{os.getpid()}.pt"
    path.write_bytes(rec.data)
    try:
        base = min(m.start for m in rec.mmaps if m.path == str(exe))
        c = rec.config
        timing = {"mtc_freq": c.mtc_freq, "nom_freq": c.nom_freq,
                  "cpuid_0x15_eax": c.cpuid_0x15_eax, "cpuid_0x15_ebx": c.cpuid_0x15_ebx}  # fmt: skip
        flow, errors = oracle.insn_dump(path, elf=[(exe, base)], timing=timing)
        assert not errors, errors
        assert np.array_equal(np.array(flow, np.uint64), rec.instructions)
        blocks, errors = oracle.insn_dump(path, elf=[(exe, base)], timing=timing, block=True)
        assert not errors, errors
        assert sum(b[2] for b in blocks) == rec.instructions.shape[0]
    finally:
        path.unlink(missing_ok=True)


@needs_process
@pytest.mark.parametrize("handler_traced", [False, True])
def test_rep_interrupted_by_a_fault(tmp_path, handler_traced):
    """REP MOVSB and REP STOSB fault partway on PROT_NONE pages; the SIGSEGV
    handler makes the page accessible and returns, and the instruction goes
    on.  Per round: a copy faulting at its 101st iteration and, resumed,
    again 4096 later; a fill faulting at its 51st; a copy faulting at its
    first iteration and, resumed, at its first again.  Each REP is one
    instruction, listed once, after its last handler; the iterations before
    a fault are not an instruction; the interrupt (handler in the range) or
    the asynchronous disable (handler outside) is at the REP's own IP."""
    exe = build()
    out = tmp_path / "out"
    rounds = 2
    functions = ["rep_copy", "rep_fill"] + (["on_fault"] if handler_traced else [])
    rec = record_software([str(exe), "repfault", str(rounds), str(out)], functions=functions)
    assert os.WIFEXITED(rec.exit_status) and os.WEXITSTATUS(rec.exit_status) == 0
    ok, hits = map(int, out.read_text().split())
    assert ok == 1 and hits == 5 * rounds  # the bytes are right; five faults a round
    caught = [sig for _, sig, c in rec.log.signals if c]
    assert caught == [signal.SIGSEGV] * hits
    got = check_decodes(rec)
    reps = _rep_ips(rec)
    movs, stos = reps["rep_copy"], reps["rep_fill"]
    # Every iteration was stepped, the faulting ones once (after the handler).
    ips = rec.log.ips
    assert int((ips == movs).sum()) == rounds * (100 + 4096 + 100 + 64)
    assert int((ips == stos).sum()) == rounds * 100
    # Each REP once, and what follows it is its function's RET: it completed.
    at_rep = np.flatnonzero((got == movs) | (got == stos))
    assert int((got == movs).sum()) == 2 * rounds and int((got == stos).sum()) == rounds
    assert np.array_equal(got[at_rep + 1], got[at_rep] + 2)
    events = _async_events(rec, got)
    # The faults at an instruction boundary inside the trace: the copy's at
    # iteration 101, the fill's, the copy's at its first iteration.  The
    # others hit a REP resumed by tracing switching on (a handler's sigreturn
    # from outside the ranges) before it completed: the enable then lands
    # on the handler or stays off until the REP runs on, as no instruction
    # completed in between.
    kind = Ev.ASYNC_BRANCH if handler_traced else Ev.ASYNC_DISABLED
    assert events.count((kind, movs)) == 2 * rounds and events.count((kind, stos)) == rounds
    if handler_traced:
        assert rec.stats["interrupt"] == 3 * rounds
        entries = np.flatnonzero(got == next(r.start for r in rec.ranges if r.name == "on_fault"))
        assert entries.shape[0] == hits  # every handler run is traced
        assert not np.isin(got[entries - 1], [movs, stos]).any()
    else:
        assert rec.stats["async_disable"] == 3 * rounds and rec.stats["interrupt"] == 0
    check_libipt(rec, exe)


@needs_process
@pytest.mark.parametrize("handler_traced", [False, True])
def test_rep_interrupted_by_signals(tmp_path, handler_traced):
    """A REP MOVSB of 4296 bytes, stepped one iteration at a time, faults at
    two PROT_NONE pages; each fault's handler sends a SIGALRM and that
    signal's handler two more, each blocked until the handler returns (its
    rt_sigreturn in the traced ``restorer``).  So, at known points, eight
    signals land between the REP's iterations while it is stepped: two
    faults, then three asynchronous signals right where it resumes, before
    it runs on.  It is still one instruction, listed once, after its last
    handler."""
    exe = build()
    out = tmp_path / "out"
    functions = ["rep_copy", "restorer"] + (["on_alarm"] if handler_traced else [])
    rec = record_software([str(exe), "repsignal", "0", str(out)], functions=functions)
    assert os.WIFEXITED(rec.exit_status) and os.WEXITSTATUS(rec.exit_status) == 0
    ok, faults, alarms = map(int, out.read_text().split())
    assert ok == 1 and faults == 2 and alarms == 6
    caught = [sig for _, sig, c in rec.log.signals if c]
    assert caught == [signal.SIGSEGV, signal.SIGALRM, signal.SIGALRM, signal.SIGALRM] * 2
    got = check_decodes(rec)
    movs = _rep_ips(rec)["rep_copy"]
    assert int((rec.log.ips == movs).sum()) == 4296  # every iteration, once
    # Every signal landed while the REP was stepped, at its IP: an interrupt
    # where the handler is traced, else tracing stopped there.
    interrupted = [src for seg in rec.log.segments for _, src, _ in seg.interrupts]
    stopped = [seg.end_ip for seg in rec.log.segments if seg.end_reason == END_SIGNAL]
    if handler_traced:
        assert interrupted == [movs] * 6 and stopped == [movs] * 2
        assert entry_count(rec, "on_alarm") == alarms
    else:
        assert interrupted == [] and stopped == [movs] * 8
    assert int((got == movs).sum()) == 1
    (k,) = np.flatnonzero(got == movs)
    assert got[k + 1] == movs + 2
    # In the trace: the first fault stops tracing at the REP's IP (the MOV
    # before it completed); later ones follow the REP's resumption by a
    # far transfer (rt_sigreturn), which already ended tracing there; each
    # traced handler run is an interrupt at the REP's IP.
    events = _async_events(rec, got)
    assert events == [(Ev.ASYNC_DISABLED, movs)] + [(Ev.ASYNC_BRANCH, movs)] * (
        6 if handler_traced else 0
    )
    check_libipt(rec, exe)


@needs_process
def test_instruction_limit_inside_a_rep(tmp_path):
    """Recording stops (the instruction limit) between a REP's iterations:
    the REP has not completed; tracing ends at its IP."""
    exe = build()
    out = tmp_path / "out"
    rec = record_software(
        [str(exe), "repfault", "1", str(out)], functions=["rep_copy"], max_instructions=40
    )
    assert rec.log.ips.shape[0] == 40
    movs = _rep_ips(rec)["rep_copy"]
    got = check_decodes(rec)
    assert got.shape[0] == 1 and got[0] == movs - 3  # only the MOV before it
    assert _async_events(rec, got) == [(Ev.ASYNC_DISABLED, movs)]


# A synthetic model of the stepper around an interrupted REP STOSB: no
# process, so every interleaving of signals with iterations can be tried.
_MAIN, _HANDLER, _RESTORER, _CALLER = 0x401000, 0x402000, 0x7F0000001000, 0x400500
_MAIN_CODE = bytes.fromhex("90f3aa90c3")  # nop; rep stosb; nop; ret
_HANDLER_CODE = bytes.fromhex("90c3")  # nop; ret (to the restorer, outside)


def _model_log(iterations: int, signals: list[int], handler_traced: bool) -> StepLog:
    """The log the stepper writes for ``nop; rep stosb; nop; ret`` with
    ``iterations`` iterations and a signal before each iteration index in
    ``signals`` (sorted; repeated: another signal right after the REP
    resumed).  As the stepper does: the interrupted row is not logged; a
    handler in the ranges is an interrupt unless nothing was logged yet in
    the stretch, and returns through a restorer outside them; a handler
    outside them closes the stretch at the REP; the REP resumes at a resume
    point, a new stretch."""
    rows: list[tuple[int, int]] = []  # (rip, rcx)
    segments: list[Segment] = []
    seg = {"start": 0, "interrupts": []}

    def close(end_ip: int, reason: str) -> None:
        if len(rows) > seg["start"]:
            t = len(rows)
            segments.append(
                Segment(seg["start"], t, end_ip, 2 * t, reason, tuple(seg["interrupts"]))
            )
        seg["start"], seg["interrupts"] = len(rows), []

    rep = _MAIN + 1
    rows.append((_MAIN, iterations))
    pending = list(signals)
    for i in range(iterations):
        while pending and pending[0] == i:
            pending.pop(0)
            if handler_traced:
                if len(rows) > seg["start"]:
                    seg["interrupts"].append((len(rows), rep, signal.SIGALRM))
                rows += [(_HANDLER, iterations - i), (_HANDLER + 1, iterations - i)]
                close(_RESTORER, END_LEFT)
            else:
                close(rep, END_SIGNAL)
        rows.append((rep, iterations - i))
    rows += [(_MAIN + 3, 0), (_MAIN + 4, 0)]
    close(_CALLER, END_LEFT)
    n = len(rows)
    regs = np.array(rows, np.uint64).reshape(n, 2)
    ranges = [TracedRange(_MAIN, _MAIN + len(_MAIN_CODE), "main")]
    code = {_MAIN: _MAIN_CODE}
    if handler_traced:
        ranges.append(TracedRange(_HANDLER, _HANDLER + 2, "handler"))
        code[_HANDLER] = _HANDLER_CODE
    return StepLog(
        ips=regs[:, 0].copy(),
        times=np.arange(0, 2 * n, 2, dtype=np.uint64),
        registers=regs,
        register_names=("rip", "rcx"),
        segments=segments,
        ranges=ranges,
        pid=1,
        comm="model",
        argv=None,
        maps=[],
        clock="tsc",
        code=code,
    )


@settings(max_examples=60, deadline=None)
@given(
    iterations=st.integers(1, 12),
    data=st.data(),
    handler_traced=st.booleans(),
)
def test_interrupted_rep_model(iterations, data, handler_traced):
    """Any interleaving of signals and REP iterations encodes; the trace
    decodes to the main code with the REP once, after the last handler run,
    and one handler run per signal when the handler is traced."""
    signals = sorted(data.draw(st.lists(st.integers(0, iterations - 1), max_size=4)))
    log = _model_log(iterations, signals, handler_traced)
    enc, insns, times = encode_log(log, psb_period=0, mtc_period=None)
    handler = [_HANDLER, _HANDLER + 1] if handler_traced else []
    want = [_MAIN] + handler * len(signals) + [_MAIN + 1, _MAIN + 3, _MAIN + 4]
    assert insns.tolist() == want
    assert np.array_equal(insns, expected_instructions(log))
    assert (np.diff(times.astype(np.int64)) > 0).all()
    image = Image("model")
    image.add_section(Section.from_bytes(_MAIN_CODE, _MAIN))
    image.add_section(Section.from_bytes(_HANDLER_CODE, _HANDLER))
    res = decode_trace(enc.data, image, enc.config)
    assert not res.gaps, [str(g) for g in res.gaps]
    assert res.instructions().tolist() == want
    # The first signal is always an asynchronous event at the REP's IP (the
    # NOP before it completed in the trace); the others are too unless no
    # instruction completed since tracing switched on.
    kinds = {
        (ev.type, ev.at) for _, ev in res.events if ev.type in (Ev.ASYNC_BRANCH, Ev.ASYNC_DISABLED)
    }
    if signals:
        kind = Ev.ASYNC_BRANCH if handler_traced else Ev.ASYNC_DISABLED
        assert kinds == {(kind, _MAIN + 1)}
    else:
        assert not kinds
