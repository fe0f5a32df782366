"""Filter evaluation cost per tier: the filter experiment (§6.2, Figs. 11-13) of
S. D. Sharma and M. Dagenais, "Enhanced Userspace and In-Kernel Trace
Filtering for Production Systems", J. Computer Science and Technology, 2016
("the paper" below; its artifact is the authors' libebpf-benchmarks).

The workload is the artifact's ``retlif`` benchmark: events of

    struct { char *var0; ... char *var{N-1}; int64_t lyf; }

and the filter ``(var0 == "str0") && ... && (var{N-1} == "str{N-1}") &&
(lyf == 42)``: N string-equality predicates and one integer predicate.

* **TRUE-biased**: every predicate matches (``lyf`` is 42), the whole chain
  runs, the verdict is true.
* **FALSE-biased**, as the artifact ran it: every string predicate matches
  and the last, integer one fails, so the whole chain still runs and only the
  verdict differs.  (The artifact's LTTng runs filtered ``lyf == 43`` on
  events carrying 42; here the events carry 43 against ``lyf == 42``, the
  same evaluation.)
* **Depth of evaluation** (N = 50): the string predicate X fails (its value
  differs from the literal in the last byte), so evaluation stops after
  P_X, for X = 1, N/4, N/2, 3N/4, N.

Tiers, each compiled by :func:`hwtrace.filter.compile.compile_filter`:

    C          the paper's SIMPLE: hand-written C, libc strcmp per field, then
               lyf == 42; gcc -O2 (generated per N into bench/out/filter/)
    lttng      LTTng-style bytecode in hwtrace's native LTTng VM
    ebpf       eBPF in hwtrace's native interpreter
    jit-call   eBPF through hwtrace's x86-64 template JIT, every string
               predicate a call of the str_eq helper (the paper's JIT called
               bpf_strcmp): ``jit_compile(linked, inline=False)``
    ebpf-jit   the same JIT as compile_filter gives it: string helpers on
               static fields inlined into byte compares after verification
    llvm       the typed AST lowered to LLVM IR, -O3 (strings compared inline)

Timing is native: ``bench/filter_harness.c`` (gcc -O2, a shared library
under bench/out/filter/ loaded with ctypes) calls each tier n times through
a function pointer read from a volatile (C, JIT and LLVM as ``f(event,
ctx)``, the interpreters as ``run(program, event, ctx)``), with one
CLOCK_MONOTONIC span around the loop; n is calibrated so a run lasts
``--run-ms`` (default 2 ms: short enough to fit between preemptions on 2
shared vCPUs).  The loop also reads the thread's CPU clock: a run whose
wall time exceeds its CPU time by more than 2% lost the CPU and is done
again.  Each measurement is one discarded warm-up plus ``--repeat`` runs
(default 21), the tiers interleaved within each repetition so that load
from other processes hits them alike; tables show the median and ±half
the interquartile range (relative to the median); ratios are of medians.  Every
run also counts the verdicts, which must be n (TRUE) or 0 (FALSE, DoE) for
every tier.  Default run: 10-60 s depending on load; ``--quick``: a few seconds.

    python bench/bench_filter.py [--quick] [--repeat N] [--run-ms MS]
                                 [--predicates 5,10,...] [--doe-n N] [--cpu K]

Writes every number (samples included) to bench/out/bench_filter.json.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out"
BUILD = OUT / "filter"
HARNESS = HERE / "filter_harness.c"
JSON_PATH = OUT / "bench_filter.json"
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

from hwtrace.filter.compile import CompiledFilter, compile_filter  # noqa: E402
from hwtrace.filter.packing import EventRecord  # noqa: E402
from hwtrace.filter.schema import DEFAULT_CONTEXT, Schema  # noqa: E402

TIERS = ("C", "lttng", "ebpf", "jit-call", "ebpf-jit", "llvm")
# compile_filter's tiers; "jit-call" is the same JIT without helper inlining
# (every string predicate a helper call, as the paper's JIT called bpf_strcmp).
HWTRACE_TIERS = ("lttng", "ebpf", "ebpf-jit", "llvm")
PREDICATES = (5, 9, 10, 20, 30, 40, 50)  # 9: the paper's LTTng comparison (Fig. 13)
QUICK_PREDICATES = (5, 10, 50)
DOE_N = 50
DOE_FRACTIONS = (("1", 0.0), ("N/4", 0.25), ("N/2", 0.5), ("3N/4", 0.75), ("N", 1.0))
CFLAGS = ("-O2", "-shared", "-fPIC", "-Wall", "-Wextra")
KIB = 1024
# A run whose wall time exceeds the thread's CPU time by more than this
# fraction was preempted (2 vCPUs shared with other work): it is redone.
PREEMPTED = 0.02
MAX_TRIES = 25

# hwtrace's targets (ratios of median ns/event) and the paper's figures:
# key -> (ratio, op, limit, paper, column header).
TARGETS = {
    "jit_vs_interp": (
        "ebpf / ebpf-jit",
        ">=",
        3.0,
        "paper 3.1-3.3x (Figs. 11, 12)",
        "interp/jit (≥3)",
    ),
    "jit_vs_c": ("ebpf-jit / C", "<=", 1.4, "paper 1.4x at N=50 (Fig. 11)", "jit/C (≤1.4)"),
    "llvm_vs_c": ("llvm / C", "<=", 1.2, "optimising tier", "llvm/C (≤1.2)"),
    "interp_vs_c": ("ebpf / C", None, None, "paper 4.3x at N=50 (Fig. 11)", "interp/C"),
    "lttng_vs_interp": (
        "lttng / ebpf",
        None,
        None,
        "paper 1.8x, FALSE, 9 preds (Fig. 13)",
        "lttng/interp",
    ),
    "jitcall_vs_interp": (
        "ebpf / jit-call",
        None,
        None,
        "paper's JIT, helper calls: 3.1-3.3x",
        "interp/jit-call",
    ),
    "jitcall_vs_c": ("jit-call / C", None, None, "paper's JIT, helper calls: 1.4x", "jit-call/C"),
}
MEMORY_LIMIT = 32 * KIB  # a 50-predicate filter within 32 KiB (paper §6.2.1: ~32 KB)


# -- the workload -------------------------------------------------------------------------


def schema_for(n: int) -> Schema:
    members: list[tuple[str, Any]] = [(f"var{i}", "string") for i in range(n)]
    return Schema.declare(f"retlif_{n}", [*members, ("lyf", "s64")])


def expression_for(n: int) -> str:
    return " && ".join([*(f'(var{i} == "str{i}")' for i in range(n)), "(lyf == 42)"])


def event_values(n: int, *, lyf: int = 42, fail_at: int | None = None) -> dict[str, Any]:
    """Values of one event; ``fail_at`` (1-based) makes that string predicate
    false by changing the value's last byte (same length: strcmp does the
    whole comparison before it fails)."""
    values: dict[str, Any] = {f"var{i}": f"str{i}" for i in range(n)}
    if fail_at is not None:
        s = values[f"var{fail_at - 1}"]
        values[f"var{fail_at - 1}"] = s[:-1] + "#"
    values["lyf"] = lyf
    return values


def doe_points(n: int) -> list[tuple[str, int]]:
    return [(label, max(1, int(n * f))) for label, f in DOE_FRACTIONS]


def simple_c(predicates: list[int]) -> str:
    """The paper's SIMPLE filter for each N, as one would write it by hand."""
    parts = [
        "/* Generated by bench/bench_filter.py: the paper's hard-coded filter. */",
        "#include <stdint.h>",
        "#include <string.h>",
        "",
    ]
    for n in predicates:
        fields = "".join(f"    const char *var{i};\n" for i in range(n))
        tests = "".join(
            f'    if (strcmp(e->var{i}, "str{i}") != 0)\n        return 0;\n' for i in range(n)
        )
        parts.append(
            f"struct retlif_{n} {{\n{fields}    int64_t lyf;\n}};\n\n"
            f"int64_t simple_{n}(const void *event, const void *context) {{\n"
            f"    const struct retlif_{n} *e = event;\n    (void)context;\n"
            f"{tests}    return e->lyf == 42;\n}}\n"
        )
    return "\n".join(parts)


# -- the native harness ---------------------------------------------------------------------


@dataclass
class Harness:
    lib: ctypes.CDLL
    path: Path
    compiler: str

    def time_fn(self, fn: int, event: int, context: int, n: int) -> tuple[float, int, float]:
        """``(wall ns per call, nonzero verdicts, thread CPU ns per call)``."""
        hits, cpu = ctypes.c_int64(-1), ctypes.c_double(0.0)
        ns = self.lib.time_fn(fn, event, context, n, ctypes.byref(hits), ctypes.byref(cpu))
        return float(ns), int(hits.value), float(cpu.value)

    def time_interp(
        self, run: int, program: int, event: int, context: int, n: int
    ) -> tuple[float, int, float]:
        hits, cpu = ctypes.c_int64(-1), ctypes.c_double(0.0)
        ns = self.lib.time_interp(
            run, program, event, context, n, ctypes.byref(hits), ctypes.byref(cpu)
        )
        return float(ns), int(hits.value), float(cpu.value)

    def symbol(self, name: str) -> int:
        return int(ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value or 0)

    def symbol_size(self, name: str) -> int:
        """Bytes of a function's machine code (from the library's symbol table)."""
        from elftools.elf.elffile import ELFFile

        with open(self.path, "rb") as f:
            symtab = ELFFile(f).get_section_by_name(".symtab") or ELFFile(f).get_section_by_name(
                ".dynsym"
            )
            for sym in symtab.iter_symbols():
                if sym.name == name:
                    return int(sym["st_size"])
        return 0


def build_harness(predicates: list[int], build: Path = BUILD) -> Harness:
    """Compile the harness and the SIMPLE filters into one shared library
    (named by a hash of its sources, so concurrent runs never load a file
    being rewritten)."""
    compiler = shutil.which(os.environ.get("CC") or "gcc")
    if compiler is None:
        raise SystemExit("bench_filter: no C compiler (gcc) on PATH to build the harness")
    build.mkdir(parents=True, exist_ok=True)
    source = simple_c(predicates)
    h = hashlib.sha256()
    for part in (HARNESS.read_bytes(), source.encode(), " ".join(CFLAGS).encode()):
        h.update(part + b"\0")
    key = h.hexdigest()[:16]
    lib_path = build / f"libfilterbench-{key}.so"
    if not lib_path.is_file():
        c_path = build / f"simple-{key}.c"
        c_path.write_text(source)
        tmp = lib_path.with_suffix(f".tmp{os.getpid()}")
        cmd = [compiler, *CFLAGS, "-o", str(tmp), str(HARNESS), str(c_path)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(
                f"bench_filter: building the harness failed:\n{' '.join(cmd)}\n{proc.stderr}"
            )
        tmp.replace(lib_path)
        # Builds for older sources are never loaded again.
        for old in (*build.glob("libfilterbench-*.so"), *build.glob("simple-*.c")):
            if key not in old.name:
                old.unlink(missing_ok=True)
    lib = ctypes.CDLL(str(lib_path))
    lib.time_fn.restype = ctypes.c_double
    lib.time_fn.argtypes = [
        ctypes.c_uint64,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.POINTER(ctypes.c_int64),
        ctypes.POINTER(ctypes.c_double),
    ]
    lib.time_interp.restype = ctypes.c_double
    lib.time_interp.argtypes = [
        ctypes.c_uint64,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.POINTER(ctypes.c_int64),
        ctypes.POINTER(ctypes.c_double),
    ]
    return Harness(lib, lib_path, compiler)


# -- one timed cell -----------------------------------------------------------------------------


@dataclass
class Callee:
    """One tier's filter for one N, as the harness calls it."""

    tier: str
    n: int
    fn: int = 0  # int64 f(event, ctx)
    run: int = 0  # int64 run(program, event, ctx)
    program: int = 0
    compiled: CompiledFilter | None = None
    compile_s: float = 0.0
    code: Any = None  # keeps jit-call's machine code alive

    def time(
        self, harness: Harness, event: int, context: int, count: int
    ) -> tuple[float, int, float]:
        if self.fn:
            return harness.time_fn(self.fn, event, context, count)
        return harness.time_interp(self.run, self.program, event, context, count)


@dataclass
class Cell:
    """One (case, tier) measurement: its iteration count and samples."""

    callee: Callee
    event: int
    expected: bool
    count: int = 0
    samples: list[float] = field(default_factory=list)
    bad_verdicts: list[int] = field(default_factory=list)
    retries: int = 0  # runs done again because the thread was preempted
    disturbed: int = 0  # samples kept although every try was preempted

    def run(self, harness: Harness, context: int) -> float:
        """One timed run (wall ns per call).  A run during which the thread
        lost the CPU (wall time above its CPU time by more than
        PREEMPTED) is done again, up to MAX_TRIES times; then the least
        disturbed one is kept and counted in ``disturbed``."""
        best: tuple[float, float] | None = None
        for _ in range(MAX_TRIES):
            ns, hits, cpu = self.callee.time(harness, self.event, context, self.count)
            if hits != (self.count if self.expected else 0):
                self.bad_verdicts.append(hits)
            excess = ns / cpu if cpu > 0 else float("inf")
            if excess <= 1 + PREEMPTED:
                return ns
            self.retries += 1
            if best is None or excess < best[1]:
                best = (ns, excess)
        assert best is not None
        self.disturbed += 1
        return best[0]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """Interquartile range over the median (0 for fewer than 2 samples);
        less at the mercy of one disturbed run than max - min."""
        if len(self.samples) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return (q3 - q1) / self.median

    def summary(self) -> dict[str, Any]:
        return {
            "tier": self.callee.tier,
            "n": self.callee.n,
            "iterations": self.count,
            "median_ns": self.median,
            "iqr_over_median": self.spread,
            "min_ns": min(self.samples),
            "max_ns": max(self.samples),
            "samples_ns": self.samples,
            "expected_verdict": self.expected,
            "verdicts_ok": not self.bad_verdicts,
            "preempted_runs_redone": self.retries,
            "samples_kept_preempted": self.disturbed,
        }


def calibrate(cell: Cell, harness: Harness, context: int, run_ms: float) -> None:
    """Iterations so one run lasts about ``run_ms``: grow a probe until it
    takes 0.2 ms, then scale by the fastest of three probes (a probe is too
    short for the preemption check: reading the CPU clock is a system call)."""
    count = 16
    while True:
        ns = cell.callee.time(harness, cell.event, context, count)[0]
        if ns * count >= 2e5 or count >= 1 << 30:
            break
        count *= 4
    ns = min(cell.callee.time(harness, cell.event, context, count)[0] for _ in range(3))
    cell.count = max(16, int(run_ms * 1e6 / max(ns, 0.05)))


def measure(cells: list[Cell], harness: Harness, context: int, repeat: int, run_ms: float) -> None:
    """Calibrate, warm up once, then ``repeat`` rounds over all cells (tiers
    interleaved, so a burst of outside load does not land on one tier)."""
    for cell in cells:
        calibrate(cell, harness, context, run_ms)
    for cell in cells:
        cell.run(harness, context)  # warm-up, discarded
    for _ in range(repeat):
        for cell in cells:
            cell.samples.append(cell.run(harness, context))


# -- compiling every tier ---------------------------------------------------------------------------


def compile_tiers(n: int, harness: Harness) -> dict[str, Callee]:
    """Every tier of :data:`TIERS` for N predicates, with compile times."""
    schema, expr = schema_for(n), expression_for(n)
    callees = {"C": Callee("C", n, fn=harness.symbol(f"simple_{n}"))}
    for tier in HWTRACE_TIERS:
        t0 = time.perf_counter()
        cf = compile_filter(expr, schema, tier)  # type: ignore[arg-type]
        elapsed = time.perf_counter() - t0
        if cf.tier != tier:
            raise SystemExit(f"bench_filter: N={n}: asked for {tier}, got {cf.tier}: {cf.note}")
        if cf.address is not None:
            callee = Callee(tier, n, fn=cf.address, compiled=cf, compile_s=elapsed)
        else:
            assert cf.run_address is not None and cf.program_address is not None
            callee = Callee(
                tier,
                n,
                run=cf.run_address,
                program=cf.program_address,
                compiled=cf,
                compile_s=elapsed,
            )
        callees[tier] = callee
    # The paper's JIT: the same verified program, every str_eq a helper call.
    from hwtrace.filter.ebpf.jit import jit_compile

    linked = callees["ebpf"].compiled.impl  # type: ignore[union-attr]
    t0 = time.perf_counter()
    code = jit_compile(linked, inline=False)
    callees["jit-call"] = Callee("jit-call", n, fn=code.address, compile_s=time.perf_counter() - t0)
    callees["jit-call"].code = code
    return callees


def tier_memory(callees: dict[str, Callee], harness: Harness) -> dict[str, dict[str, Any]]:
    """Bytes each tier's compiled filter occupies (``memory_bytes``), with the
    JIT's code, mapping and linked program apart; for C, its function's size."""
    n = callees["C"].n
    out: dict[str, dict[str, Any]] = {
        "C": {"memory_bytes": harness.symbol_size(f"simple_{n}"), "what": "gcc -O2 machine code"}
    }
    for tier in HWTRACE_TIERS:
        cf = callees[tier].compiled
        assert cf is not None
        entry: dict[str, Any] = {
            "memory_bytes": int(cf.memory_bytes),
            "compile_s": callees[tier].compile_s,
        }
        impl = cf.impl
        if tier == "ebpf-jit":
            entry["code_bytes"] = int(impl.code_size)
            entry["mapping_bytes"] = int(impl.memory_bytes)
            entry["program_bytes"] = int(impl.program.memory_bytes)
            entry["ebpf_insns"] = int(impl.program.count)
            entry["what"] = (
                f"code {impl.code_size:,} B in a {impl.memory_bytes:,} B mapping + "
                f"linked program {impl.program.memory_bytes:,} B"
            )
        elif tier == "ebpf":
            entry["ebpf_insns"] = int(impl.count)
            entry["what"] = f"linked program, {impl.count} instruction slots"
        elif tier == "lttng":
            entry["what"] = "bytecode + tables"
        else:
            entry["what"] = "machine code + data"
        out[tier] = entry
    code = callees["jit-call"].code
    out["jit-call"] = {
        "memory_bytes": int(code.memory_bytes) + int(code.program.memory_bytes),
        "compile_s": callees["jit-call"].compile_s,
        "code_bytes": int(code.code_size),
        "what": f"code {code.code_size:,} B in a {code.memory_bytes:,} B mapping + the same "
        "linked program",
    }
    return out


def source_state() -> dict[str, Any]:
    """The commit measured and the filter sources that differ from it (the
    checkout is shared: tiers change under a benchmark between commits)."""

    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    changed = git("status", "--porcelain", "--", "src/hwtrace/filter")
    return {"commit": git("rev-parse", "HEAD"), "filter_changes": changed.splitlines()}


# -- the paper's numbers -------------------------------------------------------------------

# Artifact raw data behind Fig. 12 (ns/event: hard-coded C, JIT, interpreter),
# libebpf-benchmarks/sample-results/ebpf-pure-performance.dat.
PAPER_PURE = {
    5: (20.8, 43.4, 125.3),
    10: (45.8, 75.5, 237.6),
    20: (83.5, 142.1, 462.5),
    30: (136.5, 225.8, 677.6),
    40: (228.7, 305.8, 1018.4),
}
# Fig. 13 / lttng-10000000.dat, FALSE-biased, 9 strings + 1 integer (ns/event;
# the eBPF loops also ran a disabled tracepoint call and a printf): the result
# bench_lttng.py calls F3.
PAPER_F3 = {"lttng": 359.0, "ebpf-jit": 113.0, "ebpf": 202.0}


# -- reporting ---------------------------------------------------------------------------


def fmt_ns(cell: Cell) -> str:
    return f"{cell.median:.1f} ±{100 * cell.spread / 2:.0f}%"


def ratio(cells: dict[str, Cell], a: str, b: str) -> float:
    return cells[a].median / cells[b].median


def met(value: float, op: str | None, limit: float | None) -> bool | None:
    if op is None or limit is None:
        return None
    return value >= limit if op == ">=" else value <= limit


def ratios_for(cells: dict[str, Cell]) -> dict[str, float]:
    return {key: ratio(cells, *TARGETS[key][0].split(" / ")) for key in TARGETS}


def table_rows(rows: list[tuple[str, dict[str, Cell]]]) -> list[tuple[str, ...]]:
    out = []
    for label, cells in rows:
        r = ratios_for(cells)
        marks = {
            k: "" if met(r[k], TARGETS[k][1], TARGETS[k][2]) is not False else " ✗" for k in TARGETS
        }
        out.append(
            (
                label,
                *(fmt_ns(cells[t]) for t in TIERS),
                *(f"{r[k]:.2f}x{marks[k]}" for k in TARGETS),
            )
        )
    return out


HEADERS = (*(f"{t} ns" for t in TIERS), *(target[4] for target in TARGETS.values()))


def print_table(title: str, headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    common.print_table(title, headers, rows, width=200)


def per_predicate(by_n: dict[int, dict[str, Cell]]) -> dict[str, tuple[float, float]]:
    """Least-squares ``(ns per predicate, fixed ns)`` of each tier over N."""
    ns = sorted(by_n)
    fits: dict[str, tuple[float, float]] = {}
    for tier in TIERS:
        ys = [by_n[n][tier].median for n in ns]
        if len(ns) < 2:
            fits[tier] = (ys[0] / ns[0], 0.0)
            continue
        mean_x, mean_y = statistics.fmean(ns), statistics.fmean(ys)
        sxx = sum((x - mean_x) ** 2 for x in ns)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(ns, ys, strict=True)) / sxx
        fits[tier] = (slope, mean_y - slope * mean_x)
    return fits


def paper_rows(true_cells: dict[int, dict[str, Cell]]) -> list[tuple[str, ...]]:
    rows = []
    for n, (hc, jit, interp) in PAPER_PURE.items():
        cells = true_cells.get(n)
        if cells is None:
            continue
        c, j, i = (cells[t].median for t in ("C", "jit-call", "ebpf"))
        rows.append(
            (
                str(n),
                f"{i / j:.2f}x / {interp / jit:.2f}x",
                f"{j / c:.2f}x / {jit / hc:.2f}x",
                f"{i / c:.2f}x / {interp / hc:.2f}x",
                f"{c:.0f} {j:.0f} {i:.0f} / {hc:.0f} {jit:.0f} {interp:.0f}",
            )
        )
    return rows


def summary(cells: dict[str, Cell]) -> dict[str, Any]:
    return {"cells": {t: c.summary() for t, c in cells.items()}, "ratios": ratios_for(cells)}


# -- the run -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="N = 5, 10, 50; 5 runs of 1 ms per cell (about 20 s)"
    )
    ap.add_argument("--repeat", type=int, default=None, help="timed runs per cell (default 21)")
    ap.add_argument(
        "--run-ms",
        type=float,
        default=None,
        help="target length of one timed run in ms (default 2)",
    )
    ap.add_argument(
        "--predicates", default=None, help="comma-separated N (default 5,9,10,20,30,40,50)"
    )
    ap.add_argument("--doe-n", type=int, default=DOE_N, help="N of the depth sweep (default 50)")
    ap.add_argument("--cpu", type=int, default=-1, help="pin to this CPU (default: no pinning)")
    ap.add_argument("--json", type=Path, default=JSON_PATH, help="where to write the numbers")
    args = ap.parse_args(argv)
    repeat = args.repeat if args.repeat is not None else (5 if args.quick else 21)
    run_ms = args.run_ms if args.run_ms is not None else (1.0 if args.quick else 2.0)
    if args.predicates:
        try:
            predicates = sorted({int(x) for x in args.predicates.split(",") if x.strip()})
        except ValueError:
            ap.error(f"--predicates: not a list of integers: {args.predicates!r}")
    else:
        predicates = list(QUICK_PREDICATES if args.quick else PREDICATES)
    if repeat < 1 or run_ms <= 0 or not predicates or min(predicates) < 1 or args.doe_n < 1:
        ap.error("--repeat, --run-ms, --predicates and --doe-n must be positive")
    if args.cpu >= 0:
        try:
            os.sched_setaffinity(0, {args.cpu})
        except (OSError, AttributeError) as e:
            ap.error(f"--cpu {args.cpu}: {getattr(e, 'strerror', e)}")

    t_start = time.perf_counter()
    state = source_state()
    if state["filter_changes"]:
        print(f"note: measuring uncommitted filter sources: {', '.join(state['filter_changes'])}")
    all_n = sorted({*predicates, args.doe_n})
    harness = build_harness(all_n)
    shown = harness.path.relative_to(REPO) if harness.path.is_relative_to(REPO) else harness.path
    print(f"harness: {shown} (gcc {' '.join(CFLAGS)})")
    context_record = EventRecord(DEFAULT_CONTEXT, {"pid": os.getpid()})
    context = context_record.address

    print(
        f"compiling N = {', '.join(map(str, all_n))} for {', '.join(HWTRACE_TIERS)} ...", flush=True
    )
    callees = {n: compile_tiers(n, harness) for n in all_n}
    keep: list[EventRecord] = []

    def event(n: int, **kw: Any) -> int:
        rec = EventRecord(schema_for(n), event_values(n, **kw))
        keep.append(rec)
        return rec.address

    # Every tier gives the expected verdict (one call through the harness)
    # before any timing.
    for n in all_n:
        for kw, want in (({}, True), ({"lyf": 43}, False), ({"fail_at": 1}, False)):
            ev = event(n, **kw)
            for tier, callee in callees[n].items():
                if callee.time(harness, ev, context, 1)[1] != int(want):
                    raise SystemExit(
                        f"bench_filter: {tier} gives the wrong verdict for N={n} "
                        f"{kw or 'TRUE'}: expected {want}"
                    )

    nop_cell = Cell(Callee("nop", 0, fn=harness.symbol("filter_nop")), event(1), True)
    bias_cells: dict[str, dict[int, dict[str, Cell]]] = {"TRUE": {}, "FALSE": {}}
    for n in predicates:
        for bias, kw in (("TRUE", {}), ("FALSE", {"lyf": 43})):
            ev = event(n, **kw)
            bias_cells[bias][n] = {t: Cell(callees[n][t], ev, bias == "TRUE") for t in TIERS}
    doe_cells: dict[str, dict[str, Cell]] = {}
    for label, x in doe_points(args.doe_n):
        ev = event(args.doe_n, fail_at=x)
        doe_cells[f"{label} (X={x})"] = {t: Cell(callees[args.doe_n][t], ev, False) for t in TIERS}

    every = [nop_cell]
    for by_n in bias_cells.values():
        for cells in by_n.values():
            every += cells.values()
    for cells in doe_cells.values():
        every += cells.values()
    est = len(every) * (repeat + 1) * run_ms / 1e3
    print(
        f"timing {len(every)} cells x ({repeat} runs + warm-up) of ~{run_ms:g} ms "
        f"(~{est:.0f} s without preemption) ...",
        flush=True,
    )
    measure(every, harness, context, repeat, run_ms)

    # -- tables
    print()
    print_table(
        "Loop + indirect call alone (filter_nop; the paper's CLEAN has no filter either)",
        ("", "ns/call"),
        [("nop", fmt_ns(nop_cell))],
    )
    for bias, by_n in bias_cells.items():
        what = (
            "every predicate true"
            if bias == "TRUE"
            else "all N strings match, lyf == 42 fails last"
        )
        print_table(
            f"{bias}-biased: ns/event, median ±IQR/2 of {repeat} runs ({what})",
            ("N", *HEADERS),
            table_rows([(str(n), cells) for n, cells in by_n.items()]),
        )
    print_table(
        f"Depth of evaluation, N = {args.doe_n}: string predicate X fails, verdict false",
        ("fails at", *HEADERS),
        table_rows(list(doe_cells.items())),
    )
    fits = per_predicate(bias_cells["TRUE"])
    print_table(
        "Cost per predicate (least-squares fit over N, TRUE-biased); paper: ~5 C, 7.5 JIT, "
        "25 interp",
        ("", *(t for t in TIERS)),
        [
            ("ns / predicate", *(f"{fits[t][0]:.2f}" for t in TIERS)),
            ("fixed ns", *(f"{fits[t][1]:.1f}" for t in TIERS)),
        ],
    )
    rows = paper_rows(bias_cells["TRUE"])
    if rows:
        print_table(
            "Against the paper's raw data (TRUE-biased; ours / paper's; JIT = jit-call, whose "
            "string predicates call a helper as the paper's did)",
            ("N", "interp/JIT", "JIT/C", "interp/C", "C, JIT, interp ns"),
            rows,
        )
    f3 = bias_cells["FALSE"].get(9)
    if f3 is not None:
        lt, jt, jc, it = (f3[t].median for t in ("lttng", "ebpf-jit", "jit-call", "ebpf"))
        pl, pj, pi = PAPER_F3["lttng"], PAPER_F3["ebpf-jit"], PAPER_F3["ebpf"]
        print_table(
            "Fig. 13 shape: FALSE-biased, 9 strings + 1 integer (ours / paper's)",
            ("", "lttng/ebpf-jit", "lttng/jit-call", "lttng/interp"),
            [
                (
                    "ratio",
                    f"{lt / jt:.2f}x / {pl / pj:.2f}x",
                    f"{lt / jc:.2f}x / {pl / pj:.2f}x",
                    f"{lt / it:.2f}x / {pl / pi:.2f}x",
                )
            ],
        )
    memory = {n: tier_memory(callees[n], harness) for n in all_n}
    top = max(all_n)
    mem_rows = []
    for tier in TIERS:
        m = memory[top][tier]
        over = "" if m["memory_bytes"] <= MEMORY_LIMIT else " ✗"
        compile_ms = f"{m['compile_s'] * 1e3:.0f}" if "compile_s" in m else "-"
        mem_rows.append((tier, f"{m['memory_bytes']:,}{over}", compile_ms, m["what"]))
    print_table(
        f"Memory of the compiled {top}-predicate filter (limit {MEMORY_LIMIT // KIB} KiB)",
        ("tier", "bytes", "compile ms", "what"),
        mem_rows,
    )

    # -- verdicts and targets
    status = 0
    bad = [c for c in every if c.bad_verdicts]
    for c in bad:
        status = 1
        print(
            f"WRONG VERDICT COUNT: {c.callee.tier} N={c.callee.n}: {c.bad_verdicts} "
            f"of {c.count} calls (expected {'all' if c.expected else 'none'})"
        )
    if not bad:
        print(f"verdicts: every tier gave the expected verdict in every run of {len(every)} cells")
    redone = sum(c.retries for c in every)
    disturbed = sum(c.disturbed for c in every)
    print(
        f"preemption: {redone} runs redone (the thread lost the CPU), {disturbed} samples kept "
        f"after {MAX_TRIES} disturbed tries"
    )

    ref_n = 50 if 50 in bias_cells["TRUE"] else max(predicates)
    headline = ratios_for(bias_cells["TRUE"][ref_n])
    print(f"\nheadline (TRUE-biased, N={ref_n}) against the targets:")
    for key, (what, op, limit, paper, _) in TARGETS.items():
        ok = met(headline[key], op, limit)
        verdict = "" if ok is None else f"target {op} {limit:g}: {'met' if ok else 'NOT MET'}"
        print(f"  {what:<16} {headline[key]:6.2f}x   {verdict:<22} ({paper})")
    for tier in TIERS[1:]:
        b = memory[top][tier]["memory_bytes"]
        print(
            f"  memory, {tier:<9} {b:7,} B  target <= {MEMORY_LIMIT:,}: "
            f"{'met' if b <= MEMORY_LIMIT else 'NOT MET'}"
        )

    result = {
        "benchmark": "filter (paper §6.2): N string predicates + lyf == 42, AND-chained",
        "false_bias_model": "all N strings match, the integer predicate (lyf == 42) fails last "
        "(events carry lyf = 43), as the artifact's LTTng runs (filter lyf == 43 on events "
        "with 42)",
        "doe_model": f"string predicate X fails (its last byte differs), N = {args.doe_n}",
        "source": state,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "pinned_cpu": args.cpu,
            "loadavg": os.getloadavg(),
            "compiler": subprocess.run(
                [harness.compiler, "--version"], capture_output=True, text=True
            ).stdout.splitlines()[0],
        },
        "settings": {
            "repeat": repeat,
            "run_ms": run_ms,
            "predicates": predicates,
            "doe_n": args.doe_n,
            "cflags": list(CFLAGS),
            "preempted_threshold": PREEMPTED,
            "max_tries": MAX_TRIES,
        },
        "nop": nop_cell.summary(),
        "bias": {
            bias: {str(n): summary(cells) for n, cells in by_n.items()}
            for bias, by_n in bias_cells.items()
        },
        "doe": {label: summary(cells) for label, cells in doe_cells.items()},
        "per_predicate": {t: {"ns_per_predicate": a, "fixed_ns": b} for t, (a, b) in fits.items()},
        "memory": {"limit_bytes": MEMORY_LIMIT, "by_n": {str(n): m for n, m in memory.items()}},
        "targets": {
            k: {
                "ratio": what,
                "op": op,
                "limit": lim,
                "paper": paper,
                "n": ref_n,
                "value": headline[k],
                "met": met(headline[k], op, lim),
            }
            for k, (what, op, lim, paper, _) in TARGETS.items()
        },
        "paper": {"pure_ns": {str(n): v for n, v in PAPER_PURE.items()}, "f3_false_ns": PAPER_F3},
        "verdicts_ok": not bad,
        "preempted_runs_redone": redone,
        "seconds": time.perf_counter() - t_start,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    where = args.json.relative_to(REPO) if args.json.is_relative_to(REPO) else args.json
    print(f"\nwrote {where} ({result['seconds']:.0f} s in all)")
    return status


if __name__ == "__main__":
    sys.exit(main())
