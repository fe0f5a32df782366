"""Kernel-side filtering and the shared map: hwtrace's eBPF tracepoint filters
against ftrace's event filters, and reading/updating shared values by mmap
against the ``bpf()`` system call.  Three tables, one run:

1. **Filter cost per event.**  The same predicates as ftrace's event filter
   (written to the event's ``filter`` file in a tracefs instance of this
   benchmark's own, ``instances/hwtrace_bench_kfilter``; ftrace's filter
   applies to that instance only) and as a hwtrace kernel filter
   (``KernelTrace(..., emit="none")``: the program only counts; the
   true-biased case also with ``emit="passed"``, every event written to the
   BPF ring buffer, as ftrace writes a passing event into its buffer).
   A small C program (compiled here with gcc, pinned to one CPU) times
   ``N`` ``syscall(SYS_getppid)`` calls with ``CLOCK_MONOTONIC`` and prints
   ns/call; for ``sched:sched_switch`` it ping-pongs a byte between two
   processes on that CPU through pipes (two context switches per round
   trip).  Each configuration (nothing attached, ftrace, eBPF) runs once
   per round, ``--rounds`` rounds in rotating order; the figure is the
   median.  ns/event = (ns/iteration - baseline) / events per iteration.
   ftrace has no per-run statistic; for eBPF the program's own time per run
   comes from ``BPF_ENABLE_STATS`` (``run_time_ns / run_cnt``, in a
   separate run after the rounds, because turning the statistics on costs
   two clock reads per run).  Checked on every run: the ftrace filter reads
   back as written and the instance's buffer on the pinned CPU holds no
   event (false filters) or at least one per call (true filters); the eBPF
   program saw at least one event per call and passed none (or all).

   ftrace cannot index arrays (``args[0] == 1`` is a parse error) and its
   ``==`` on strings is literal: a glob is ``~``.  The string case compares
   the task's comm on every system call (ftrace's ``comm`` pseudo-field,
   hwtrace's ``$ctx.procname``, ``bpf_get_current_comm``), and
   ``prev_comm``, a ``char[16]`` field, on every context switch.

2. **Reading 1,000 shared values** (Sharma and Dagenais, "Enhanced
   Userspace and In-Kernel Trace Filtering for Production Systems", JCST
   2016, Table 2: eBPF-shm 2,247 ns, eBPF-syscall 218,203 ns, 99x).  A
   ``BPF_MAP_TYPE_ARRAY`` of 1,000 u32 with ``BPF_F_MMAPABLE``
   (``hwtrace.kernel.bpf.Map``), filled here through its mmap and checked
   with ``BPF_MAP_LOOKUP_ELEM``, is handed to a C program (an inherited
   descriptor): per repetition it times 1,000 volatile loads from the mmap
   (entry k at u32 index 2k: values are 8-byte aligned), 1,000
   ``bpf(BPF_MAP_LOOKUP_ELEM)`` calls (libbpf's attribute size), and 1,000
   loads of a malloc'd array of the same layout; mean ± sd per 1,000, as
   the paper reports.  Every repetition's sum must be the expected one.

3. **A threshold update**: a store into the mmap against a
   ``BPF_MAP_UPDATE_ELEM`` of the same element of that array, and a store
   into the ``LatencyTracker``'s shared map (``coop``: the default
   threshold of any call, ``thresholds[0, ANY]``) against updating it with
   ``bpf()``, where the map's single value (the whole shared layout) must
   be written at once.  The last value written each way is read back the
   other way (by hwtrace's own mapping and by lookup).

Also printed: each generated program's JIT image (``jited_prog_len``) and
xlated size, and the CPU model.  The eBPF programs run for every event on
the whole machine: keep it quiet (the 1-minute load is recorded).

    python bench/bench_kernel_filter.py [-n N] [--pingpong N] [--rounds K]
                                        [--cpu C] [--json PATH]

Needs root (bpf(), tracefs at /sys/kernel/tracing) and gcc.  Writes
bench/out/bench_kernel_filter.json.  Defaults take about 40 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out"
JSON_PATH = OUT / "bench_kernel_filter.json"
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(HERE))

import common  # noqa: E402

from hwtrace.kernel import bpf  # noqa: E402

BenchError = common.BenchError
TRACEFS = Path("/sys/kernel/tracing")
# Not bench_probe's "hwtrace_bench": that benchmark sweeps its own instance.
INSTANCE = TRACEFS / "instances" / "hwtrace_bench_kfilter"
DEFAULT_N, DEFAULT_PINGPONG, DEFAULT_ROUNDS = 2_000_000, 100_000, 3
DEFAULT_ENTRIES, DEFAULT_REPS = 1000, 20_000
PAPER = {"shm_ns": 2247, "syscall_ns": 218_203, "ratio": 99}  # JCST 2016, Table 2
RECORD_BYTES = 128  # a passed sys_enter in the BPF ring buffer: 8 + 56 + 64
CFLAGS = ("-O2", "-Wall", "-Wextra")

# Both C programs' clock and CPU pinning.
C_TIMING = r"""
static double ns(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s)) { perror("sched_setaffinity"); exit(2); }
}
"""

LOOP_C = (
    r"""
/* The workload: MODE syscall: N x syscall(SYS_getppid); MODE pingpong: N
   round trips of one byte between this process and a child through two
   pipes, both pinned to CPU (two context switches per round trip). */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>

"""
    + C_TIMING
    + r"""
static long switches(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_nvcsw + u.ru_nivcsw;
}

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: %s syscall|pingpong N WARM CPU\n", argv[0]); return 2; }
    long n = atol(argv[2]), warm = atol(argv[3]);
    pin(atoi(argv[4]));
    if (!strcmp(argv[1], "syscall")) {
        for (long i = 0; i < warm; i++) syscall(SYS_getppid);
        double c0 = ns(CLOCK_THREAD_CPUTIME_ID), t0 = ns(CLOCK_MONOTONIC);
        for (long i = 0; i < n; i++) syscall(SYS_getppid);
        double t1 = ns(CLOCK_MONOTONIC), c1 = ns(CLOCK_THREAD_CPUTIME_ID);
        printf("ns_per_iter %.4f\ncpu_ns_per_iter %.4f\n", (t1 - t0) / n, (c1 - c0) / n);
        return 0;
    }
    int a[2], b[2];
    char x = 0;
    if (pipe(a) || pipe(b)) { perror("pipe"); return 2; }
    pid_t child = fork();
    if (child < 0) { perror("fork"); return 2; }
    if (child == 0) {
        close(a[1]); close(b[0]);
        while (read(a[0], &x, 1) == 1)
            if (write(b[1], &x, 1) != 1) _exit(3);
        _exit(0);
    }
    close(a[0]); close(b[1]);
    for (long i = 0; i < warm; i++)
        if (write(a[1], &x, 1) != 1 || read(b[0], &x, 1) != 1) { perror("pingpong"); return 2; }
    long s0 = switches();
    double t0 = ns(CLOCK_MONOTONIC);
    for (long i = 0; i < n; i++)
        if (write(a[1], &x, 1) != 1 || read(b[0], &x, 1) != 1) { perror("pingpong"); return 2; }
    double t1 = ns(CLOCK_MONOTONIC);
    long s1 = switches();
    close(a[1]);
    int status;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status)) { fprintf(stderr, "child failed\n"); return 2; }
    printf("ns_per_iter %.4f\nswitches_per_iter %.4f\n", (t1 - t0) / n, (double)(s1 - s0) / n);
    return 0;
}
"""
)

MAPS_C = (
    r"""
/* Reads and updates of a BPF_F_MMAPABLE array handed in as descriptor FD:
   per repetition, ENTRIES loads through the mmap, ENTRIES
   bpf(BPF_MAP_LOOKUP_ELEM), ENTRIES loads of a malloc'd copy; then stores
   against BPF_MAP_UPDATE_ELEM of one element; optionally the same for one
   64-bit word of a map with a single large value (COOPFD). */
#define _GNU_SOURCE
#include <linux/bpf.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/syscall.h>

/* libbpf's size: the attribute up to the commands' flags. */
#define ATTR_SIZE (offsetof(union bpf_attr, flags) + sizeof(((union bpf_attr *)0)->flags))

"""
    + C_TIMING
    + r"""
static inline double now(void) { return ns(CLOCK_MONOTONIC); }

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* "stat NAME N MEAN SD MEDIAN MIN", each sample divided by PER. */
static void report(const char *name, double *v, long n, double per) {
    double m = 0, q = 0;
    for (long i = 0; i < n; i++) { v[i] /= per; m += v[i]; }
    m /= n;
    for (long i = 0; i < n; i++) q += (v[i] - m) * (v[i] - m);
    qsort(v, n, sizeof *v, cmp);
    printf("stat %s %ld %.4f %.4f %.4f %.4f\n", name, n, m, n > 1 ? __builtin_sqrt(q / (n - 1)) : 0.0,
           n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v[0]);
}

static long bpf_call(int cmd, union bpf_attr *a) { return syscall(__NR_bpf, cmd, a, ATTR_SIZE); }

static uint32_t expected(uint32_t k) { return k * 2654435761u + 12345u; }

int main(int argc, char **argv) {
    if (argc != 8 && argc != 12) {
        fprintf(stderr, "usage: %s FD ENTRIES REPS SYSREPS UPDREPS UPDSYSREPS CPU "
                        "[COOPFD COOPBYTES WORD COOPREPS]\n", argv[0]);
        return 2;
    }
    int fd = atoi(argv[1]);
    long n = atol(argv[2]), reps = atol(argv[3]), sreps = atol(argv[4]);
    long ureps = atol(argv[5]), usreps = atol(argv[6]);
    pin(atoi(argv[7]));
    long len = (n * 8 + 4095) / 4096 * 4096;
    volatile uint32_t *shm = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (shm == MAP_FAILED) { perror("mmap of the map"); return 2; }
    volatile uint32_t *plain = aligned_alloc(4096, len);
    uint64_t want = 0;
    for (long k = 0; k < n; k++) {
        plain[2 * k] = shm[2 * k];
        want += expected(k);
    }
    double *t_shm = malloc(reps * sizeof(double)), *t_plain = malloc(reps * sizeof(double));
    double *t_sys = malloc(sreps * sizeof(double)), *t_timer = malloc(reps * sizeof(double));
    union bpf_attr a;
    uint32_t key, val;
    memset(&a, 0, sizeof a);
    a.map_fd = fd;
    a.key = (uint64_t)(uintptr_t)&key;
    a.value = (uint64_t)(uintptr_t)&val;
    long bad = 0;
    for (long r = 0; r < reps; r++) {
        double t0 = now(), t1 = now();
        t_timer[r] = t1 - t0;
        uint64_t s = 0;
        t0 = now();
        for (long k = 0; k < n; k++) s += shm[2 * k];
        t1 = now();
        t_shm[r] = t1 - t0;
        bad += s != want;
        s = 0;
        t0 = now();
        for (long k = 0; k < n; k++) s += plain[2 * k];
        t1 = now();
        t_plain[r] = t1 - t0;
        bad += s != want;
        if (r < sreps) {
            s = 0;
            t0 = now();
            for (key = 0; key < (uint32_t)n; key++) {
                if (bpf_call(BPF_MAP_LOOKUP_ELEM, &a)) { perror("BPF_MAP_LOOKUP_ELEM"); return 2; }
                s += val;
            }
            t1 = now();
            t_sys[r] = t1 - t0;
            bad += s != want;
        }
    }
    printf("bad_sums %ld\n", bad);
    report("timer", t_timer, reps, 1);
    report("read_shm", t_shm, reps, 1);
    report("read_plain", t_plain, reps, 1);
    report("read_syscall", t_sys, sreps, 1);

    /* Updates of one element: 1,000 per repetition. */
    const long U = 1000;
    uint32_t k_upd = (uint32_t)(n / 2);
    double *t_st = malloc(ureps * sizeof(double)), *t_up = malloc(usreps * sizeof(double));
    uint32_t v = 1;
    for (long r = 0; r < ureps; r++) {
        double t0 = now();
        for (long j = 0; j < U; j++) __atomic_store_n(&shm[2 * k_upd], v++, __ATOMIC_RELEASE);
        t_st[r] = now() - t0;
    }
    key = k_upd;
    for (long r = 0; r < usreps; r++) {
        double t0 = now();
        for (long j = 0; j < U; j++) {
            val = v++;
            if (bpf_call(BPF_MAP_UPDATE_ELEM, &a)) { perror("BPF_MAP_UPDATE_ELEM"); return 2; }
        }
        t_up[r] = now() - t0;
    }
    /* The last update by bpf() is seen through the mmap; a store, by lookup. */
    if (shm[2 * k_upd] != val) { fprintf(stderr, "update not seen through the mmap\n"); return 3; }
    shm[2 * k_upd] = 0xC0FFEE;
    printf("final %u %u\n", k_upd, 0xC0FFEEu);
    report("update_store", t_st, ureps, U);
    report("update_syscall", t_up, usreps, U);
    if (argc == 8) return 0;

    /* One 64-bit word of a map whose only value is COOPBYTES long. */
    int cfd = atoi(argv[8]);
    long bytes = atol(argv[9]), word = atol(argv[10]), creps = atol(argv[11]);
    long clen = (bytes + 4095) / 4096 * 4096;
    volatile int64_t *coop = mmap(NULL, clen, PROT_READ | PROT_WRITE, MAP_SHARED, cfd, 0);
    if (coop == MAP_FAILED) { perror("mmap of the shared map"); return 2; }
    double *c_st = malloc(creps * sizeof(double)), *c_up = malloc(creps * sizeof(double));
    int64_t w = 1000;
    for (long r = 0; r < creps; r++) {
        double t0 = now();
        for (long j = 0; j < U; j++) __atomic_store_n(&coop[word], w++, __ATOMIC_RELEASE);
        c_st[r] = now() - t0;
    }
    int64_t *value = malloc(bytes);
    memcpy(value, (const void *)coop, bytes);
    uint32_t zero = 0;
    union bpf_attr c;
    memset(&c, 0, sizeof c);
    c.map_fd = cfd;
    c.key = (uint64_t)(uintptr_t)&zero;
    c.value = (uint64_t)(uintptr_t)value;
    for (long r = 0; r < creps; r++) {
        double t0 = now();
        value[word] = w++;
        if (bpf_call(BPF_MAP_UPDATE_ELEM, &c)) { perror("BPF_MAP_UPDATE_ELEM (shared)"); return 2; }
        c_up[r] = now() - t0;
    }
    if (coop[word] != w - 1) { fprintf(stderr, "shared update not seen through the mmap\n"); return 3; }
    coop[word] = 123456789;
    printf("coop_final %ld %ld\n", word, 123456789L);
    report("coop_store", c_st, creps, U);
    report("coop_syscall", c_up, creps, 1);
    return 0;
}
"""
)


# -- building ---------------------------------------------------------------------------------------


def build(tmp: Path, name: str, source: str) -> Path:
    cc = shutil.which(os.environ.get("CC") or "gcc")
    if cc is None:
        raise BenchError("no C compiler (gcc) on PATH")
    src = tmp / f"{name}.c"
    src.write_text(source)
    exe = tmp / name
    cmd = [cc, *CFLAGS, "-o", str(exe), str(src), "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BenchError(f"building {name} failed:\n{proc.stderr}")
    return exe


def parse_pairs(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(" ")
        out[key] = rest
    return out


# -- ftrace -----------------------------------------------------------------------------------------


def tracefs_write(path: Path, text: str) -> None:
    """One write(2); a refused filter raises BenchError with ftrace's message."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, text.encode())
    except OSError as e:
        why = ""
        if path.name == "filter":
            try:
                why = " / ".join(path.read_text().strip().splitlines()[-2:])
            except OSError:
                pass
        raise BenchError(f"writing {text!r} to {path}: {e.strerror} {why}".rstrip()) from None
    finally:
        os.close(fd)


def instance_sweep() -> str | None:
    """Disable every event of this benchmark's instance and remove it (also
    what a run killed by SIGKILL left); None, or why it is still there."""
    if not INSTANCE.exists():
        return None
    common.close_fds_under(INSTANCE)
    try:
        tracefs_write(INSTANCE / "events" / "enable", "0")
    except (BenchError, OSError):
        pass
    for event in ("raw_syscalls/sys_enter", "sched/sched_switch"):
        try:
            tracefs_write(INSTANCE / "events" / event / "filter", "0")
        except (BenchError, OSError):
            pass
    for _ in range(50):
        try:
            INSTANCE.rmdir()
            return None
        except FileNotFoundError:
            return None
        except OSError as e:  # EBUSY while a reader finishes
            why = f"rmdir {INSTANCE}: {e.strerror}"
            time.sleep(0.1)
    return why


def others_tracing() -> list[str]:
    """What else traces the events measured here (it would add to every
    configuration, the baselines too): tracefs instances with them enabled,
    BPF programs loaded."""
    found = []
    roots = [TRACEFS, *sorted(p for p in (TRACEFS / "instances").iterdir() if p != INSTANCE)]
    for root in roots:
        for event in ("raw_syscalls/sys_enter", "sched/sched_switch"):
            try:
                state = (root / "events" / event / "enable").read_text().strip()
            except OSError:
                continue
            if state != "0":
                where = "top level" if root == TRACEFS else f"instance {root.name}"
                found.append(f"{event} enabled ({where})")
    try:
        progs = bpf.prog_ids()
    except bpf.BpfError:
        progs = []
    if progs:
        found.append(f"{len(progs)} other BPF program(s) loaded")
    return found


def cpu_entries(cpu: int) -> int:
    """Events the instance's buffer took on ``cpu`` (kept + overwritten)."""
    stats = parse_pairs((INSTANCE / "per_cpu" / f"cpu{cpu}" / "stats").read_text())
    return int(stats["entries:"]) + int(stats["overrun:"])


# -- cases and configurations -----------------------------------------------------------------------


@dataclass
class Case:
    key: str
    label: str
    event: str  # system:event
    hwtrace: str  # hwtrace's filter expression
    ftrace: str  # the same predicates in ftrace's filter syntax
    workload: str  # "syscall" or "pingpong"
    passes: bool  # every event passes
    events_per_iter: int = 1


CASES = [
    Case("int1", "1 int compare, false", "raw_syscalls:sys_enter",
         "id == 9999", "id == 9999", "syscall", False),
    Case("int2", "2 ANDed, false at 1st, common_pid", "raw_syscalls:sys_enter",
         "id == 9999 && common_pid == 1", "id == 9999 && common_pid == 1", "syscall", False),
    Case("and4", "4 ANDed int compares, true", "raw_syscalls:sys_enter",
         "id != 9999 && id != 9998 && id >= 0 && id < 100000",
         "id != 9999 && id != 9998 && id >= 0 && id < 100000", "syscall", True),
    Case("comm", "string glob on the task's comm, false", "raw_syscalls:sys_enter",
         '$ctx.procname == "nosuch*"', 'comm ~ "nosuch*"', "syscall", False),
    Case("switch", "string glob on char[16] prev_comm, false", "sched:sched_switch",
         'prev_comm == "nosuch*"', 'prev_comm ~ "nosuch*"', "pingpong", False, 2),
]  # fmt: skip


@dataclass
class Config:
    name: str
    workload: str
    case: Case | None = None
    kind: str = "baseline"  # baseline, ftrace, ebpf, ebpf-passed
    trace: Any = None  # the KernelTrace (eBPF kinds)
    runs: list[dict[str, float]] = field(default_factory=list)
    stats_run: dict[str, float] | None = None

    @property
    def emit(self) -> str:
        return "passed" if self.kind == "ebpf-passed" else "none"


def make_configs(cases: list[Case]) -> list[Config]:
    out = [Config("baseline (syscall)", "syscall"), Config("baseline (pingpong)", "pingpong")]
    for c in cases:
        out.append(Config(f"{c.key} ftrace", c.workload, c, "ftrace"))
        out.append(Config(f"{c.key} eBPF", c.workload, c, "ebpf"))
        if c.passes:
            out.append(Config(f"{c.key} eBPF passed", c.workload, c, "ebpf-passed"))
    return out


def ring_size(events: int) -> int:
    """A ring buffer holding every passed event of a run (and the machine's
    own), a power of two of at most 1 GiB."""
    need = int(events * RECORD_BYTES * 1.5) + (1 << 22)
    return min(1 << max(need - 1, 1).bit_length(), 1 << 30)


def load_programs(configs: list[Config], n: int) -> None:
    from hwtrace.ktrace.trace import KernelTrace

    for cfg in configs:
        if cfg.kind.startswith("ebpf"):
            assert cfg.case is not None
            size = ring_size(n) if cfg.kind == "ebpf-passed" else 1 << 16
            cfg.trace = KernelTrace(
                [cfg.case.event], cfg.case.hwtrace, emit=cfg.emit, ringbuf_size=size
            )


def skip_ring(trace: Any) -> None:
    """Forget what a run wrote to the ring buffer without copying it out
    (the consumer position := the producer position)."""
    ring = trace.ring
    ring._cons[0] = ring._prod[0]


# -- one run ----------------------------------------------------------------------------------------


def run_loop(exe: Path, cfg: Config, iters: int, cpu: int) -> dict[str, float]:
    warm = max(iters // 20, 1000)
    proc = common.run([str(exe), cfg.workload, str(iters), str(warm), str(cpu)], timeout=300)
    result = {k: float(v) for k, v in parse_pairs(proc.stdout).items() if v}
    if "ns_per_iter" not in result:
        raise BenchError(f"{exe.name} printed no ns_per_iter: {proc.stdout!r}")
    if cfg.workload == "pingpong" and result.get("switches_per_iter", 0) < 0.9:
        raise BenchError(f"{cfg.name}: {result.get('switches_per_iter')} switches per round trip")
    return result


def run_config(exe: Path, cfg: Config, iters: int, cpu: int, *, stats: bool = False) -> dict:
    """One run of ``cfg``'s workload with its filter in place, checked."""
    if cfg.kind == "baseline":
        return run_loop(exe, cfg, iters, cpu)
    case = cfg.case
    assert case is not None
    system, event = case.event.split(":")
    events_min = iters * case.events_per_iter
    if cfg.kind == "ftrace":
        ev = INSTANCE / "events" / system / event
        tracefs_write(INSTANCE / "trace", "")  # empty the instance's buffer
        tracefs_write(ev / "filter", case.ftrace)
        got = (ev / "filter").read_text().strip()
        if got != case.ftrace:
            raise BenchError(f"{cfg.name}: the filter reads back {got!r}")
        before = cpu_entries(cpu)
        tracefs_write(ev / "enable", "1")
        try:
            result = run_loop(exe, cfg, iters, cpu)
        finally:
            tracefs_write(ev / "enable", "0")
        taken = cpu_entries(cpu) - before
        tracefs_write(ev / "filter", "0")
        tracefs_write(INSTANCE / "trace", "")
        if case.passes and taken < events_min:
            raise BenchError(f"{cfg.name}: {taken} events recorded on CPU {cpu}, {events_min} run")
        if not case.passes and taken:
            raise BenchError(f"{cfg.name}: {taken} events passed a filter nothing passes")
        result["recorded_on_cpu"] = taken
        return result
    trace = cfg.trace
    c0 = trace.counts()
    prog = trace.events[0].loaded
    s0 = prog.stats()
    trace.start()
    try:
        result = run_loop(exe, cfg, iters, cpu)
    finally:
        trace.stop()
    s1 = prog.stats()
    c1 = trace.counts()
    if cfg.kind == "ebpf-passed":
        skip_ring(trace)
    seen, passed, lost = (c1[k] - c0[k] for k in ("seen", "passed", "lost"))
    if seen < events_min:
        raise BenchError(f"{cfg.name}: the program saw {seen} events, {events_min} run")
    if (case.passes and passed != seen) or (not case.passes and passed):
        raise BenchError(f"{cfg.name}: {passed} of {seen} events passed")
    result.update(seen=seen, passed=passed, lost=lost)
    if lost:
        print(f"    note: {cfg.name}: {lost:,} events lost (ring buffer full)", flush=True)
    if stats:
        runs = s1.run_cnt - s0.run_cnt
        result.update(run_cnt=runs, run_time_ns=s1.run_time_ns - s0.run_time_ns)
        result["ns_per_run"] = result["run_time_ns"] / runs if runs else float("nan")
    return result


def measure_filters(exe: Path, configs: list[Config], args: argparse.Namespace) -> None:
    for rnd in range(args.rounds):
        shift = rnd * 3 % len(configs)
        order = configs[shift:] + configs[:shift]
        print(f"  round {rnd + 1}/{args.rounds}", flush=True)
        for cfg in order:
            iters = args.calls if cfg.workload == "syscall" else args.pingpong
            r = run_config(exe, cfg, iters, args.cpu)
            cfg.runs.append(r)
            print(f"    {cfg.name:<26} {r['ns_per_iter']:9.1f} ns/iteration", flush=True)
    print("  BPF_ENABLE_STATS runs", flush=True)
    with bpf.enable_stats():
        for cfg in configs:
            if cfg.kind.startswith("ebpf"):
                iters = args.calls if cfg.workload == "syscall" else args.pingpong
                cfg.stats_run = run_config(exe, cfg, iters, args.cpu, stats=True)
                print(
                    f"    {cfg.name:<26} {cfg.stats_run['ns_per_run']:9.1f} ns/run "
                    f"({cfg.stats_run['run_cnt']:,} runs)",
                    flush=True,
                )


def median(cfg: Config) -> float:
    return statistics.median(r["ns_per_iter"] for r in cfg.runs)


def spread(cfg: Config) -> float:
    xs = [r["ns_per_iter"] for r in cfg.runs]
    return max(xs) - min(xs)


def summarize_filters(configs: list[Config]) -> dict[str, Any]:
    base = {c.workload: c for c in configs if c.kind == "baseline"}
    out: dict[str, Any] = {
        "baselines": {
            w: {"ns_per_iter_median": median(c), "spread": spread(c), "runs": c.runs}
            for w, c in base.items()
        }
    }
    cases: dict[str, Any] = {}
    for cfg in configs:
        if cfg.case is None:
            continue
        case = cfg.case
        b = median(base[cfg.workload])
        entry: dict[str, Any] = {
            "filter": case.ftrace if cfg.kind == "ftrace" else case.hwtrace,
            "ns_per_iter_median": median(cfg),
            "spread": spread(cfg),
            "ns_per_event": (median(cfg) - b) / case.events_per_iter,
            "runs": cfg.runs,
        }
        if cfg.trace is not None:
            info = cfg.trace.program_info()[0]
            entry.update(jited_prog_len=info["jited_prog_len"],
                         xlated_prog_len=info["xlated_prog_len"],
                         insns=int(cfg.trace.events[0].program.insns.shape[0]))  # fmt: skip
            entry["stats_run"] = cfg.stats_run
        bucket = cases.setdefault(case.key, {"label": case.label, "event": case.event,
                                             "events_per_iter": case.events_per_iter,
                                             "passes": case.passes})  # fmt: skip
        bucket[cfg.kind] = entry
    for bucket in cases.values():
        f = bucket["ftrace"]["ns_per_event"]
        for kind in ("ebpf", "ebpf-passed"):
            if kind in bucket and bucket[kind]["ns_per_event"] > 0:
                bucket[kind]["ftrace_over_ebpf"] = f / bucket[kind]["ns_per_event"]
    out["cases"] = cases
    return out


def report_filters(summary: dict[str, Any], args: argparse.Namespace, cpu: str) -> None:
    rows = []
    for name, b in summary["baselines"].items():
        what = "syscall(SYS_getppid)" if name == "syscall" else "pipe round trip, 2 switches"
        rows.append((f"baseline: {what}", "nothing attached", "",
                     f"{b['ns_per_iter_median']:.1f} ± {b['spread'] / 2:.1f}",
                     "", "", "", "", ""))  # fmt: skip
    labels = {
        "ftrace": "ftrace filter",
        "ebpf": "eBPF, count only",
        "ebpf-passed": "eBPF, passed → ring",
    }
    for key, bucket in summary["cases"].items():
        for kind in ("ftrace", "ebpf", "ebpf-passed"):
            if kind not in bucket:
                continue
            e = bucket[kind]
            ratio = f"{e['ftrace_over_ebpf']:.2f}x" if "ftrace_over_ebpf" in e else ""
            st = e.get("stats_run") or {}
            rows.append((
                f"{key}: {bucket['label']}" if kind == "ftrace" else "",
                labels[kind],
                e["filter"],
                f"{e['ns_per_iter_median']:.1f} ± {e['spread'] / 2:.1f}",
                f"{e['ns_per_event']:.1f}",
                ratio,
                f"{st['ns_per_run']:.1f}" if "ns_per_run" in st else "",
                f"{st['ns_per_iter']:.1f}" if "ns_per_iter" in st else "",
                f"{e['jited_prog_len']} / {e['xlated_prog_len']}" if "jited_prog_len" in e else "",
            ))  # fmt: skip
    common.print_table(
        f"Kernel filter cost per event: median of {args.rounds} runs (± half the range), "
        f"{args.calls:,} system calls or {args.pingpong:,} round trips per run, CPU {args.cpu}; "
        f"{cpu}",
        ("case", "mechanism", "filter", "ns/iteration", "ns/event over baseline",
         "ftrace / eBPF", "prog ns/run (stats)", "ns/iter (stats on)", "JIT / xlated B"),
        rows,
        width=200,
        title_justify="left",
    )  # fmt: skip


# -- shared map reads and updates -------------------------------------------------------------------


def measure_maps(exe: Path, args: argparse.Namespace) -> dict[str, Any]:
    from hwtrace.ktrace.syscall_latency import ANY, LatencyTracker

    n = args.entries
    result: dict[str, Any] = {"entries": n}
    with bpf.Map(bpf.MAP_ARRAY, 4, 4, n, flags=bpf.F_MMAPABLE, name="hwt_bench_arr") as m:
        mm = m.mmap()
        try:
            view = np.frombuffer(mm, np.uint32, 2 * n)[::2]
            keys = np.arange(n, dtype=np.uint64)
            view[:] = ((keys * 2654435761 + 12345) & 0xFFFFFFFF).astype(np.uint32)
            for k in (0, n // 2, n - 1):  # what the mmap wrote is what bpf() reads
                got = int.from_bytes(m.lookup(k.to_bytes(4, "little")) or b"", "little")
                if got != int(view[k]):
                    raise BenchError(f"lookup of {k} gives {got}, the mmap holds {int(view[k])}")
            del view
        finally:
            mm.close()
        with LatencyTracker() as tracker:
            word = tracker.layout.thresholds + ANY  # row 0 (the defaults), any call
            value_size = tracker.coop_map.value_size
            cmd = [str(exe), str(m.fd), str(n), str(args.reps), str(max(args.reps // 40, 10)),
                   str(max(args.reps // 20, 10)), str(max(args.reps // 400, 5)), str(args.cpu),
                   str(tracker.coop_fd), str(value_size), str(word), "200"]  # fmt: skip
            print(f"  {' '.join(Path(c).name for c in cmd)}", flush=True)
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                                      pass_fds=(m.fd, tracker.coop_fd))  # fmt: skip
            except subprocess.TimeoutExpired:
                raise BenchError("the map benchmark did not finish within 300 s") from None
            if proc.returncode != 0:
                raise BenchError(f"the map benchmark failed ({proc.returncode}): {proc.stderr}")
            coop_seen = int(tracker.coop.thresholds[0, ANY])
            raw = tracker.coop_map.lookup(b"\0\0\0\0") or b""
            coop_lookup = int(np.frombuffer(raw, np.int64)[word])
        final_k = final_v = None
        for line in proc.stdout.splitlines():
            parts = line.split()
            if parts[0] == "stat":
                name = parts[1]
                cnt, mean, sd, med, mn = int(parts[2]), *map(float, parts[3:])
                result[name] = {"n": cnt, "mean": mean, "sd": sd, "median": med, "min": mn}
            elif parts[0] == "bad_sums":
                result["bad_sums"] = int(parts[1])
            elif parts[0] == "final":
                final_k, final_v = int(parts[1]), int(parts[2])
            elif parts[0] == "coop_final":
                coop_word, coop_v = int(parts[1]), int(parts[2])
                if coop_word != word or coop_seen != coop_v or coop_lookup != coop_v:
                    raise BenchError(
                        f"the store of {coop_v} into the shared map reads back {coop_seen} "
                        f"(hwtrace's mapping) and {coop_lookup} (lookup)"
                    )
        if result.get("bad_sums"):
            raise BenchError(f"{result['bad_sums']} repetitions summed the wrong values")
        if final_k is None or "coop_syscall" not in result:
            raise BenchError(f"the map benchmark's output is incomplete: {proc.stdout!r}")
        got = int.from_bytes(m.lookup(final_k.to_bytes(4, "little")) or b"", "little")
        if got != final_v:
            raise BenchError(f"stored {final_v} through the mmap, lookup gives {got}")
    result["coop"] = {"value_size": value_size, "word": word, "column": ANY}
    result["checked"] = "sums of every repetition; last update visible the other way"
    return result


def report_maps(r: dict[str, Any], cpu: str) -> None:
    n = r["entries"]
    shm = r["read_shm"]["mean"]
    rows = []
    for name, label in (("read_plain", "plain loads (malloc'd array, same layout)"),
                        ("read_shm", "eBPF-shm: loads from the BPF_F_MMAPABLE mmap"),
                        ("read_syscall", "eBPF-syscall: bpf(BPF_MAP_LOOKUP_ELEM)")):  # fmt: skip
        s = r[name]
        rows.append((label, f"{s['n']:,}", f"{s['mean']:,.0f} ± {s['sd']:,.0f}",
                     f"{s['median']:,.0f}", f"{s['min']:,.0f}", f"{s['mean'] / n:.2f}",
                     f"{s['mean'] / shm:,.1f}x"))  # fmt: skip
    rows.append(("paper, Table 2: eBPF-shm", "", f"{PAPER['shm_ns']:,}", "", "",
                 f"{PAPER['shm_ns'] / 1000:.2f}", "1.0x"))  # fmt: skip
    rows.append(("paper, Table 2: eBPF-syscall", "", f"{PAPER['syscall_ns']:,}", "", "",
                 f"{PAPER['syscall_ns'] / 1000:.2f}", f"{PAPER['ratio']}x"))  # fmt: skip
    common.print_table(
        f"Reading {n:,} shared u32 values: ns per {n:,} reads (mean ± sd over repetitions); {cpu}",
        ("how", "repetitions", f"ns / {n:,}", "median", "min", "ns / read", "/ eBPF-shm"),
        rows,
        width=150,
        title_justify="left",
    )
    t = r["timer"]
    ratio = r["read_syscall"]["mean"] / shm
    print(
        f"syscall / shm = {ratio:,.0f}x (goal: at least 100x; paper 99x).  Each figure includes "
        f"one clock_gettime pair: {t['mean']:.1f} ns (median {t['median']:.1f})."
    )
    st = r["update_store"]["mean"]
    rows = [
        ("store into the array's mmap (release store)", f"{r['update_store']['n']:,} x 1,000",
         f"{st:.2f} ± {r['update_store']['sd']:.2f}", "1x"),
        ("bpf(BPF_MAP_UPDATE_ELEM), same element (u32)", f"{r['update_syscall']['n']:,} x 1,000",
         f"{r['update_syscall']['mean']:.1f} ± {r['update_syscall']['sd']:.1f}",
         f"{r['update_syscall']['mean'] / st:,.0f}x"),
        ("store into LatencyTracker coop: thresholds[0, ANY]", f"{r['coop_store']['n']:,} x 1,000",
         f"{r['coop_store']['mean']:.2f} ± {r['coop_store']['sd']:.2f}", "1x"),
        (f"bpf(BPF_MAP_UPDATE_ELEM) of coop ({r['coop']['value_size']:,} B value)",
         f"{r['coop_syscall']['n']:,} x 1",
         f"{r['coop_syscall']['mean']:,.0f} ± {r['coop_syscall']['sd']:,.0f}",
         f"{r['coop_syscall']['mean'] / r['coop_store']['mean']:,.0f}x"),
    ]  # fmt: skip
    common.print_table(
        "A threshold update: ns per update (mean ± sd over repetitions)",
        ("how", "repetitions", "ns / update", "/ store"),
        rows,
        width=150,
        title_justify="left",
    )


# -- the run ----------------------------------------------------------------------------------------


def preflight(args: argparse.Namespace) -> None:
    if os.geteuid() != 0:
        raise BenchError("needs root (bpf(), tracefs)")
    if not (TRACEFS / "instances").is_dir():
        raise BenchError(f"no {TRACEFS}/instances (tracefs not mounted?)")
    if args.cpu not in os.sched_getaffinity(0):
        raise BenchError(f"CPU {args.cpu} is not available to this process")


def run_benchmark(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    preflight(args)
    cpu = common.cpu_model()
    load = os.getloadavg()[0]
    print(f"{cpu}, {os.cpu_count()} CPUs, kernel {platform.release()}; 1-min load {load:.2f}")
    if load > 0.5:
        print("note: the machine is not quiet; the eBPF programs run for every event on it")
    configs: list[Config] = []
    busy: list[str] = []
    with tempfile.TemporaryDirectory(prefix="hwtrace-kfilter-") as tmp:
        loop = build(Path(tmp), "kernel_loop", LOOP_C)
        maps = build(Path(tmp), "kernel_maps", MAPS_C)
        try:
            maps_result = None
            if not args.no_maps:
                print("shared map reads and updates", flush=True)
                maps_result = measure_maps(maps, args)
            filters = None
            if not args.no_filters:
                print("filter cost per event", flush=True)
                if why := instance_sweep():
                    raise BenchError(f"a previous run's instance is still there: {why}")
                if busy := others_tracing():
                    print(f"note: not quiet: {'; '.join(busy)}", flush=True)
                INSTANCE.mkdir()
                configs = make_configs(CASES)
                load_programs(configs, args.calls)
                measure_filters(loop, configs, args)
                filters = summarize_filters(configs)
        finally:
            for cfg in configs:
                if cfg.trace is not None:
                    cfg.trace.close()
            if why := instance_sweep():
                print(f"warning: {why}", file=sys.stderr)
    print()
    if filters is not None:
        report_filters(filters, args, cpu)
    if maps_result is not None:
        report_maps(maps_result, cpu)
    elapsed = time.perf_counter() - t_start
    result = {
        "benchmark": "bench_kernel_filter",
        "config": {
            "calls": args.calls,
            "pingpong": args.pingpong,
            "rounds": args.rounds,
            "cpu": args.cpu,
            "entries": args.entries,
            "reps": args.reps,
        },
        "machine": {
            "cpu": cpu,
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "load_1min": load,
            "python": platform.python_version(),
        },
        "others_tracing": busy,
        "filters": filters,
        "maps": maps_result,
        "paper_table2": PAPER,
        "elapsed_s": elapsed,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    path = args.json.resolve()
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    print(f"wrote {shown} ({elapsed:.0f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("-n", "--calls", type=int, default=DEFAULT_N, help="system calls per run")
    ap.add_argument("--pingpong", type=int, default=DEFAULT_PINGPONG, help="round trips per run")
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="runs of each configuration")
    ap.add_argument("--cpu", type=int, default=(os.cpu_count() or 1) - 1, help="CPU to pin to")
    ap.add_argument("--entries", type=int, default=DEFAULT_ENTRIES, help="shared values read")
    ap.add_argument("--reps", type=int, default=DEFAULT_REPS, help="repetitions of the shm reads")
    ap.add_argument("--no-filters", action="store_true", help="skip the filter table")
    ap.add_argument("--no-maps", action="store_true", help="skip the shared map tables")
    ap.add_argument("--json", type=Path, default=JSON_PATH)
    args = ap.parse_args(argv)
    if min(args.calls, args.pingpong, args.rounds, args.entries, args.reps) < 1:
        ap.error("-n, --pingpong, --rounds, --entries and --reps must be positive")
    if sys.platform != "linux":
        ap.error("Linux only")
    return common.bench_main(
        "bench_kernel_filter",
        lambda: run_benchmark(args),
        interrupted="programs closed, instance removed",
        cleanup=instance_sweep if os.geteuid() == 0 else None,
    )


if __name__ == "__main__":
    sys.exit(main())
