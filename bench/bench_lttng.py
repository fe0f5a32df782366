"""LTTng's own ``--filter`` against hwtrace's compiled filter guarding the same
tracepoint: the LTTng comparison (§6.2, Fig. 13) of S. D. Sharma and
M. Dagenais, "Enhanced Userspace and In-Kernel Trace Filtering for Production
Systems", J. Computer Science and Technology, 2016 ("the paper" below; its
artifact is the authors' libebpf-benchmarks).  Fig. 13 gives two results,
called F3 and F4 here: F3, FALSE-biased, the total cost per event (eBPF JIT
3.1x, eBPF interpreter 1.8x faster than LTTng's filter); F4, TRUE-biased, the
overhead above recording every event unfiltered (LTTng 325 ns, eBPF JIT
154 ns per event).

The tracepoint is the artifact's ``retlif_tp:tpfilt`` (bench/lttng/retlif_tp.h:
nine ``ctf_string`` fields var0..var8 and ``ctf_integer(int64_t, lyf)``, the
ten arguments TP_ARGS allows), fired by a native loop (bench/lttng/
retlif_bench.c, gcc -O2, linked with -llttng-ust) with var0..var8 =
"str0".."str8" and lyf = 42 (TRUE-biased) or 43 (FALSE-biased).  The filter is
the paper's, the same text for LTTng and for hwtrace:

    (var0 == "str0") && ... && (var8 == "str8") && (lyf == 42)

FALSE-biased events match every string and fail the integer test last, so
both biases evaluate the whole chain (as the artifact's ``lyf == 43`` runs).

Modes (ns per event; one loop of NR iterations per run):

1. ``lttng-filter``  a session has the event enabled with ``--filter``:
   LTTng-UST runs its bytecode interpreter inside the probe on every hit;
2. ``guard:TIER``    the event is enabled with no filter and the loop calls
   ``if (filter(&event, NULL)) tracepoint(...)``, ``filter`` being hwtrace's
   compiled filter: ``ebpf-jit`` (the paper's eBPF JIT), ``llvm``, and the
   interpreters ``lttng`` (hwtrace's LTTng-style VM) and ``ebpf``, called
   through ``run(program, event, NULL)``; ``C`` is the paper's hand-written
   strcmp filter, for scale;
3. ``no-filter``     the event enabled with no filter and no guard: every
   event recorded (the reference the paper subtracts for F4);
4. ``disabled``      no session: the tracepoint's disabled branch (the
   floor); the guards run here too, which is the filter's own cost.

The library is loaded into this Python process with ctypes so that
hwtrace's machine code (compiled here) can be handed to it as a function
pointer; liblttng-ust registers the process with the session daemon when the
library loads, and the sessions are created, started and destroyed around it
(the daemon pushes each change to the registered process; the benchmark waits
until the tracepoint's enabled state follows).

Sessions are snapshot sessions: their channels are in overwrite
(flight-recorder) mode, 4 sub-buffers of 4 MiB per CPU, per-user buffers.
Every event is serialized into the ring buffer (never dropped) and the
consumer daemon writes nothing while a loop runs (only on ``lttng snapshot
record``), so neither disk I/O nor the consumer competes with the loop on the
2 vCPUs.  In discard mode a producer faster than the consumer drops events,
which is cheaper than recording them: the "all recorded" reference would then
depend on the disk.  A sub-buffer holds ~60k events, so switches are rare.

Before timing, each configuration is checked end to end (``lttng snapshot
record`` + babeltrace2): with ``--filter``, TRUE events are all recorded and
FALSE ones none; with no filter, the unguarded loop records both and every
guarded loop records exactly its TRUE events.  Every timed run also counts
the guard's verdicts (n or 0).

Timing: one CLOCK_MONOTONIC span around the loop, as the artifact, plus the
thread's CPU time over the same span.  This machine's 2 vCPUs are shared with
other work, so a run of ~100 ms is usually preempted; the loop never blocks
(overwrite mode, no I/O), so the thread's CPU time is its cost and the
tables use the median CPU ns/event (wall-clock medians and the share of
preempted runs are in the JSON and the first table).  Each configuration is
set up once per round; a round runs every mode of every configuration once,
both biases interleaved; the first round is a discarded warm-up; the order
of configurations rotates between rounds.

    python bench/bench_lttng.py [--quick] [--nr N] [--repeat R] [--cpu K]
                                [--no-install] [--json PATH]

As root with apt-get, missing LTTng packages are installed (``apt-get install
-y --no-install-recommends lttng-tools liblttng-ust-dev babeltrace2``).  A
session daemon is started if none runs (and stopped at the end); one already
running is used and left alone.  Writes bench/out/bench_lttng.json.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import hashlib
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SRC = HERE / "lttng"
OUT = HERE / "out"
BUILD = OUT / "lttng"
JSON_PATH = OUT / "bench_lttng.json"
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

from hwtrace.filter.compile import compile_filter  # noqa: E402
from hwtrace.filter.errors import FilterError  # noqa: E402
from hwtrace.filter.schema import Schema  # noqa: E402

N_STRINGS = 9  # the paper's LTTng comparison: 9 strings + 1 integer (TP_ARGS max 10)
EXPRESSION = " && ".join([*(f'(var{i} == "str{i}")' for i in range(N_STRINGS)), "(lyf == 42)"])
# The guards' event record: nine char * and an int64_t, as retlif_bench.c's struct.
SCHEMA = Schema.declare(
    "retlif_tp:tpfilt", [*((f"var{i}", "string") for i in range(N_STRINGS)), ("lyf", "s64")]
)
EVENT = "retlif_tp:tpfilt"
HWTRACE_TIERS = ("ebpf-jit", "llvm", "lttng", "ebpf")
GUARDS = (*HWTRACE_TIERS, "C")
BIASES = ("TRUE", "FALSE")
CFLAGS = ("-O2", "-shared", "-fPIC", "-Wall", "-Wextra")
LIBS = ("-llttng-ust", "-ldl")
APT_PACKAGES = ("lttng-tools", "liblttng-ust-dev", "babeltrace2")
SUBBUF_SIZE, NUM_SUBBUF = "4M", 4
VERIFY_EVENTS = 500  # events per bias in each end-to-end check
PREEMPTED = 0.02  # wall above CPU time by more than this: the run lost the CPU
DEFAULT_NR, DEFAULT_REPEAT = 1_000_000, 9
QUICK_NR, QUICK_REPEAT = 200_000, 5

# The modes timed under each configuration: ``filter``, a session with the
# event enabled with --filter; ``record``, enabled with no filter; ``off``, no
# session.
CONFIGS: dict[str, tuple[str, ...]] = {
    "filter": ("lttng-filter",),
    "record": ("no-filter", *(f"guard:{t}" for t in GUARDS)),
    "off": ("disabled", *(f"guard:{t}" for t in GUARDS)),
}

# The paper's numbers (ns/event).  F4: overhead above "no filter, all
# recorded", TRUE-biased; the artifact's raw data (lttng-10000000.dat, 10M
# events, means) behind Fig. 13 gives the totals.
PAPER_F4 = {"lttng": 325.0, "ebpf-jit": 154.0, "ratio": 2.1}
PAPER_RAW = {
    ("lttng-filter", "TRUE"): 828.0,
    ("lttng-filter", "FALSE"): 359.0,
    ("no-filter", "TRUE"): 493.0,
    ("guard:ebpf-jit", "TRUE"): 637.0,
    ("guard:ebpf", "TRUE"): 741.0,
    ("guard:ebpf-jit", "FALSE"): 113.0,
    ("guard:ebpf", "FALSE"): 202.0,
}
PAPER_F3 = {"lttng/ebpf-jit": 3.1, "lttng/ebpf": 1.8}


BenchError = common.BenchError


# -- the tools ----------------------------------------------------------------------------


run = common.run


def compiler() -> str | None:
    return shutil.which(os.environ.get("CC") or "gcc")


def lttng_missing() -> list[str]:
    """What this benchmark needs and the machine lacks (empty: all there).
    babeltrace2 is optional (without it the end-to-end checks are skipped)."""
    missing = [t for t in ("lttng", "lttng-sessiond") if shutil.which(t) is None]
    cc = compiler()
    if cc is None:
        return [*missing, "a C compiler (gcc)"]
    probe = "#include <lttng/tracepoint.h>\nint main(void) { return 0; }\n"
    proc = subprocess.run(
        [cc, "-x", "c", "-", "-o", os.devnull, *LIBS],
        input=probe,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        missing.append("lttng/tracepoint.h and -llttng-ust (liblttng-ust-dev)")
    return missing


def install_lttng(missing: list[str]) -> None:
    """apt-get install the LTTng packages (as root, where apt exists).  (No
    recommends: lttng-tools recommends lttng-modules-dkms, kernel module
    builds.)"""
    common.apt_install(APT_PACKAGES, ", ".join(missing))


def versions() -> dict[str, str]:
    """LTTng-tools (the CLI and daemon) and LTTng-UST (the headers built
    against) versions, and the Debian package versions where dpkg exists."""
    out = {"lttng": run(["lttng", "--version"]).stdout.strip()}
    cc = compiler()
    if cc is not None:
        proc = subprocess.run(
            [cc, "-E", "-dM", "-x", "c", "-"],
            input="#include <lttng/ust-version.h>\n",
            capture_output=True,
            text=True,
            check=False,
        )
        for line in proc.stdout.splitlines():
            if line.startswith("#define LTTNG_UST_VERSION "):
                out["lttng-ust"] = line.split(None, 2)[2].strip('"')
    if shutil.which("dpkg-query"):
        for pkg in ("lttng-tools", "liblttng-ust-dev", "babeltrace2"):
            proc = run(["dpkg-query", "-W", "-f", "${Version}", pkg], check=False)
            if proc.returncode == 0 and proc.stdout:
                out[f"deb:{pkg}"] = proc.stdout
    return out


# -- the native library ----------------------------------------------------------------------


@dataclass
class Library:
    """bench/lttng/retlif_bench.c loaded in this process (see its header)."""

    lib: ctypes.CDLL
    path: Path

    @classmethod
    def load(cls, path: Path) -> Library:
        lib = ctypes.CDLL(str(path))
        d, i64, u64 = ctypes.c_double, ctypes.c_int64, ctypes.c_uint64
        pd, pi = ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_int64)
        lib.run_plain.restype = d
        lib.run_plain.argtypes = [i64, ctypes.c_int, pd]
        lib.run_guarded.restype = d
        lib.run_guarded.argtypes = [u64, i64, ctypes.c_int, pi, pd]
        lib.run_guarded_interp.restype = d
        lib.run_guarded_interp.argtypes = [u64, u64, i64, ctypes.c_int, pi, pd]
        lib.sample_event.restype = ctypes.c_void_p
        lib.sample_event.argtypes = [ctypes.c_int]
        lib.event_size.restype = lib.lyf_offset.restype = i64
        return cls(lib, path)

    def enabled(self) -> bool:
        return bool(self.lib.tp_enabled())

    def wait_enabled(self, want: bool, what: str, timeout: float = 10.0) -> None:
        """The session daemon applies session changes to the process
        asynchronously: wait until the tracepoint's state follows."""
        deadline = time.monotonic() + timeout
        while self.enabled() != want:
            if time.monotonic() > deadline:
                state = "enabled" if want else "disabled"
                raise BenchError(
                    f"{what}: the tracepoint {EVENT} was not {state} within {timeout:g} s "
                    "(did this process register with the session daemon?)"
                )
            time.sleep(0.005)

    def symbol(self, name: str) -> int:
        return int(ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value or 0)


def build_library(build: Path = BUILD) -> Path:
    """Compile provider + loops into a shared library named by a hash of its
    sources (a concurrent run never loads a file being rewritten)."""
    cc = compiler()
    if cc is None:
        raise BenchError("no C compiler (gcc) on PATH")
    sources = (SRC / "retlif_bench.c", SRC / "retlif_tp.h")
    h = hashlib.sha256()
    for part in (*(p.read_bytes() for p in sources), " ".join(CFLAGS + LIBS).encode()):
        h.update(part + b"\0")
    key = h.hexdigest()[:16]
    build.mkdir(parents=True, exist_ok=True)
    path = build / f"libretlif-{key}.so"
    if not path.is_file():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        cmd = [cc, *CFLAGS, f"-I{SRC}", "-o", str(tmp), str(sources[0]), *LIBS]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BenchError(f"building {sources[0].name} failed:\n{' '.join(cmd)}\n{proc.stderr}")
        tmp.replace(path)
        for old in build.glob("libretlif-*.so"):
            if old != path:
                old.unlink(missing_ok=True)
    return path


# -- guards -----------------------------------------------------------------------------------


@dataclass
class Guard:
    """One filter as the loop calls it: ``fn(event, ctx)`` or
    ``run(program, event, ctx)``."""

    tier: str
    fn: int = 0
    run: int = 0
    program: int = 0
    memory_bytes: int = 0
    compile_s: float = 0.0
    keep: Any = field(default=None, repr=False)  # the CompiledFilter (keeps its code alive)


def compile_guards(lib: Library) -> dict[str, Guard]:
    """hwtrace's tiers for EXPRESSION, and the hand-written C; each one's
    verdicts on the library's own TRUE and FALSE events are checked here
    (so the Schema and the C struct agree) before any timing."""
    if lib.lib.event_size() != SCHEMA.size or lib.lib.lyf_offset() != 8 * N_STRINGS:
        raise BenchError(
            f"the C event struct ({lib.lib.event_size()} bytes) does not match the "
            f"Schema ({SCHEMA.size} bytes)"
        )
    guards = {"C": Guard("C", fn=lib.symbol("simple_filter"))}
    for tier in HWTRACE_TIERS:
        t0 = time.perf_counter()
        try:
            cf = compile_filter(EXPRESSION, SCHEMA, tier)  # type: ignore[arg-type]
        except FilterError as e:
            raise BenchError(f"compiling the filter for {tier}: {e}") from None
        elapsed = time.perf_counter() - t0
        if cf.tier != tier:
            raise BenchError(f"asked hwtrace for {tier}, got {cf.tier}: {cf.note}")
        if cf.address is not None:
            g = Guard(tier, fn=cf.address)
        else:
            assert cf.run_address is not None and cf.program_address is not None
            g = Guard(tier, run=cf.run_address, program=cf.program_address)
        g.memory_bytes, g.compile_s, g.keep = int(cf.memory_bytes), elapsed, cf
        guards[tier] = g
    for tier in guards:
        for bias in BIASES:
            got = timed(lib, f"guard:{tier}", bias, 1, guards)[2]
            if got != int(bias == "TRUE"):
                raise BenchError(f"{tier} gives {got} on the {bias}-biased event")
    return guards


def timed(
    lib: Library, mode: str, bias: str, n: int, guards: dict[str, Guard]
) -> tuple[float, float, int]:
    """One native loop of ``n`` iterations: ``(wall ns/event, CPU ns/event,
    guard verdicts that were true)`` (-1 for unguarded modes)."""
    cpu, fired = ctypes.c_double(0.0), ctypes.c_int64(-1)
    true_bias = int(bias == "TRUE")
    if not mode.startswith("guard:"):
        wall = lib.lib.run_plain(n, true_bias, ctypes.byref(cpu))
        return float(wall), float(cpu.value), -1
    g = guards[mode.removeprefix("guard:")]
    if g.fn:
        wall = lib.lib.run_guarded(g.fn, n, true_bias, ctypes.byref(fired), ctypes.byref(cpu))
    else:
        wall = lib.lib.run_guarded_interp(
            g.run, g.program, n, true_bias, ctypes.byref(fired), ctypes.byref(cpu)
        )
    return float(wall), float(cpu.value), int(fired.value)


# -- the session daemon and sessions --------------------------------------------------------------


lttng = common.lttng
sessiond_running = common.sessiond_running
session_daemon = common.session_daemon


def wait_registered(pid: int, timeout: float = 15.0) -> None:
    """Until the session daemon lists this process's retlif_tp:tpfilt."""
    deadline = time.monotonic() + timeout
    while True:
        out = lttng("list", "-u", check=False).stdout
        mine = False
        for block in out.split("PID: ")[1:]:
            if block.split(None, 1)[0] == str(pid) and EVENT in block:
                mine = True
        if mine:
            return
        if time.monotonic() > deadline:
            raise BenchError(
                f"this process (pid {pid}) did not register {EVENT} with the session daemon "
                f"within {timeout:g} s (`lttng list -u` does not show it)"
            )
        time.sleep(0.1)


class Session:
    """A snapshot session (overwrite channels) with the event enabled,
    with or without LTTng's filter."""

    def __init__(self, name: str, filter_expr: str | None, outdir: Path) -> None:
        self.name, self.filter, self.outdir = name, filter_expr, outdir
        self.live = False

    def start(self) -> None:
        lttng("create", self.name, "--snapshot", "--output", str(self.outdir / "default"))
        self.live = True
        lttng(
            "enable-channel", "-u", "-s", self.name, "--overwrite",
            "--subbuf-size", SUBBUF_SIZE, "--num-subbuf", str(NUM_SUBBUF), "chan",
        )  # fmt: skip
        extra = ("--filter", self.filter) if self.filter is not None else ()
        lttng("enable-event", "-u", "-s", self.name, "-c", "chan", EVENT, *extra)
        lttng("start", self.name)

    def destroy(self) -> None:
        if self.live:
            self.live = False
            lttng("destroy", self.name, check=False)

    def recorded(self) -> tuple[int, int]:
        """Events in the buffers now (lyf = 42, lyf = 43): a snapshot read
        back with babeltrace2."""
        where = self.outdir / "snapshot"
        lttng("snapshot", "record", "-s", self.name, str(where))
        text = run(["babeltrace2", str(where)], timeout=120).stdout
        return text.count("lyf = 42"), text.count("lyf = 43")


def verify(
    config: str, lib: Library, guards: dict[str, Guard], outdir: Path, tag: str
) -> list[dict[str, Any]]:
    """Fire VERIFY_EVENTS of each bias per mode, each mode in a fresh session
    of the configuration, and check what one snapshot of it holds (see the
    module docstring); raises on any difference.  (One snapshot per session:
    every snapshot switches sub-buffers, so in overwrite mode later
    snapshots lose the oldest data.)"""
    checks = []
    for mode in CONFIGS[config]:
        expr = EXPRESSION if config == "filter" else None
        session = Session(f"{tag}-check-{mode.replace(':', '-')}", expr, outdir / f"check-{mode}")
        try:
            session.start()
            lib.wait_enabled(True, f"{config} check session")
            for bias in BIASES:
                timed(lib, mode, bias, VERIFY_EVENTS, guards)
            got = session.recorded()
        finally:
            session.destroy()
            shutil.rmtree(session.outdir, ignore_errors=True)
        lib.wait_enabled(False, f"{config} check session destroyed")
        # LTTng's filter and every guard keep TRUE events only; no filter keeps both.
        want = (VERIFY_EVENTS, VERIFY_EVENTS if mode == "no-filter" else 0)
        checks.append(
            {"config": config, "mode": mode, "recorded_true_false": got, "expected": want}
        )
        if got != want:
            raise BenchError(
                f"{config}/{mode}: recorded {got[0]} TRUE and {got[1]} FALSE events of "
                f"{VERIFY_EVENTS} each; expected {want[0]} and {want[1]}"
            )
    return checks


# -- measurement --------------------------------------------------------------------------------


@dataclass
class Cell:
    config: str
    mode: str
    bias: str
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    bad_verdicts: list[int] = field(default_factory=list)

    def sample(self, lib: Library, n: int, guards: dict[str, Guard], keep: bool) -> None:
        wall, cpu, fired = timed(lib, self.mode, self.bias, n, guards)
        if self.mode.startswith("guard:") and fired != (n if self.bias == "TRUE" else 0):
            self.bad_verdicts.append(fired)
        if keep:
            self.wall.append(wall)
            self.cpu.append(cpu)

    @property
    def median(self) -> float:
        return statistics.median(self.cpu)

    @property
    def spread(self) -> float:
        return (max(self.cpu) - min(self.cpu)) / self.median / 2 if self.median > 0 else 0.0

    @property
    def preempted(self) -> int:
        return sum(w > c * (1 + PREEMPTED) for w, c in zip(self.wall, self.cpu, strict=True))

    def summary(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "mode": self.mode,
            "bias": self.bias,
            "median_cpu_ns": self.median,
            "median_wall_ns": statistics.median(self.wall),
            "half_spread": self.spread,
            "cpu_ns": self.cpu,
            "wall_ns": self.wall,
            "preempted_runs": self.preempted,
            "verdicts_ok": not self.bad_verdicts,
        }


def measure(
    lib: Library,
    guards: dict[str, Guard],
    nr: int,
    repeat: int,
    outdir: Path,
    check: bool,
) -> tuple[dict[tuple[str, str, str], Cell], list[dict[str, Any]]]:
    """``repeat`` rounds after one warm-up round (with the end-to-end
    checks when ``check``), the configurations in rotating order."""
    cells = {
        (c, m, b): Cell(c, m, b) for c, modes in CONFIGS.items() for m in modes for b in BIASES
    }
    checks: list[dict[str, Any]] = []
    names = list(CONFIGS)
    tag = f"hwtrace-bench-{os.getpid()}"
    for rnd in range(repeat + 1):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        label = "warm-up" if rnd == 0 else f"round {rnd}/{repeat}"
        print(f"  {label}: {', '.join(order)}", flush=True)
        for config in order:
            session = None
            if config != "off":
                expr = EXPRESSION if config == "filter" else None
                session = Session(f"{tag}-{config}-{rnd}", expr, outdir / f"{config}-{rnd}")
            if rnd == 0 and check and session is not None:
                checks += verify(config, lib, guards, outdir, tag)
            try:
                if session is not None:
                    session.start()
                lib.wait_enabled(config != "off", f"{config} session")
                if session is not None:
                    # Untimed: the first pass through a new session's ring
                    # buffer maps its pages.
                    timed(lib, CONFIGS[config][0], "TRUE", max(nr // 2, 1), guards)
                for mode in CONFIGS[config]:
                    for bias in BIASES:
                        cells[(config, mode, bias)].sample(lib, nr, guards, keep=rnd > 0)
            finally:
                if session is not None:
                    session.destroy()
                    shutil.rmtree(session.outdir, ignore_errors=True)
            lib.wait_enabled(False, f"{config} session destroyed")
    return cells, checks


# -- the numbers the paper reports -----------------------------------------------------------------


def paired(a: list[float], b: list[float]) -> float:
    """Median of per-round differences ``a[r] - b[r]``: load that drifts
    between rounds hits both alike and cancels."""
    return statistics.median(x - y for x, y in zip(a, b, strict=True))


def derive(samples: dict[tuple[str, str], list[float]]) -> dict[str, Any]:
    """F4 (TRUE: overhead above "no filter, all recorded"), F3 (FALSE: total
    ns/event), the filter's own cost (guards with the tracepoint disabled,
    minus the floor), and LTTng-filter / hwtrace ratios for every guard.
    ``samples`` maps (mode, bias) to ns/event per round; the guards with the
    tracepoint disabled are ``off:guard:TIER``.  Overheads are differences
    of medians (the paper's method, on means) and, ``*_paired``, medians of
    per-round differences."""
    med = {k: statistics.median(v) for k, v in samples.items()}
    ref_key = ("no-filter", "TRUE")
    ref = med[ref_key]
    floor = {b: med[("disabled", b)] for b in BIASES}
    lt = {b: med[("lttng-filter", b)] for b in BIASES}
    lt_over = lt["TRUE"] - ref
    lt_over_paired = paired(samples[("lttng-filter", "TRUE")], samples[ref_key])
    out: dict[str, Any] = {
        "reference_no_filter_true_ns": ref,
        "floor_disabled_ns": floor,
        "lttng_filter_true_ns": lt["TRUE"],
        "lttng_filter_false_ns": lt["FALSE"],
        "lttng_filter_overhead_true_ns": lt_over,
        "lttng_filter_overhead_true_ns_paired": lt_over_paired,
        "lttng_filter_over_floor_false_ns": lt["FALSE"] - floor["FALSE"],
        "tiers": {},
    }
    for tier in GUARDS:
        key = f"guard:{tier}"
        g = {b: med[(key, b)] for b in BIASES}
        alone = {b: med[(f"off:{key}", b)] - floor[b] for b in BIASES}
        over = g["TRUE"] - ref
        over_paired = paired(samples[(key, "TRUE")], samples[ref_key])
        out["tiers"][tier] = {
            "true_total_ns": g["TRUE"],
            "false_total_ns": g["FALSE"],
            "overhead_true_ns": over,  # the paper's F4 measure
            "overhead_true_ns_paired": over_paired,
            "filter_alone_ns": alone,  # guard with the tracepoint disabled, minus the floor
            "ratio_true_total": lt["TRUE"] / g["TRUE"],
            "ratio_false_total": lt["FALSE"] / g["FALSE"],  # the paper's F3 measure
            # F4's ratio means nothing when the guard's overhead is within noise of zero.
            "ratio_true_overhead": lt_over / over if over > 0 else None,
            "ratio_true_overhead_paired": lt_over_paired / over_paired if over_paired > 0 else None,
            # With recording, much of a cheap filter's work overlaps the probe's
            # (out-of-order execution past a predicted branch), so its measured
            # overhead can be ~0; charging it the larger of that and its cost
            # alone gives a ratio that cannot flatter it.
            "ratio_true_overhead_conservative": lt_over_paired / max(over_paired, alone["TRUE"])
            if max(over_paired, alone["TRUE"]) > 0
            else None,
            "ratio_false_over_floor": (lt["FALSE"] - floor["FALSE"])
            / max(g["FALSE"] - floor["FALSE"], 1e-9),
            "hwtrace_faster": g["TRUE"] < lt["TRUE"] and g["FALSE"] < lt["FALSE"],
        }
    return out


# -- reporting ----------------------------------------------------------------------------------


def table(title: str, headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    common.print_table(title, headers, rows, width=150, title_justify="left")


def fmt(cell: Cell) -> str:
    return f"{cell.median:.1f} ±{100 * cell.spread:.0f}%"


def fmt_ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}x"


MODE_TEXT = {
    "lttng-filter": "1  LTTng --filter (its interpreter, in the probe)",
    "no-filter": "3  LTTng, no filter (all recorded)",
    "disabled": "4  no session (tracepoint disabled)",
}


def mode_text(config: str, mode: str) -> str:
    if mode in MODE_TEXT:
        return MODE_TEXT[mode]
    tier = mode.removeprefix("guard:")
    what = "hand-written strcmp" if tier == "C" else f"hwtrace {tier}"
    if config == "off":
        return f"   {what} guard, tracepoint disabled"
    return f"2  {what} guard, LTTng no filter"


def report(
    cells: dict[tuple[str, str, str], Cell], derived: dict[str, Any], nr: int, repeat: int
) -> None:
    rows = []
    for (config, mode, bias), cell in cells.items():
        if bias != "TRUE":
            continue
        f = cells[(config, mode, "FALSE")]
        runs = len(cell.cpu) + len(f.cpu)
        pre = cell.preempted + f.preempted
        key = (mode, "TRUE")
        paper = PAPER_RAW.get(key)
        pf = PAPER_RAW.get((mode, "FALSE"))
        rows.append(
            (
                mode_text(config, mode),
                fmt(cell),
                fmt(f),
                f"{statistics.median(cell.wall):.1f} / {statistics.median(f.wall):.1f}",
                f"{pre}/{runs}",
                f"{paper:.0f}" if paper and config != "off" else "",
                f"{pf:.0f}" if pf and config != "off" else "",
            )
        )
    table(
        f"ns/event, {EVENT}, 9 strings + 1 integer: median thread-CPU ns of {repeat} runs of "
        f"{nr:,} events (±half spread)",
        ("mode", "TRUE", "FALSE", "wall T / F", "preempted", "paper T", "paper F"),
        rows,
    )
    jit = derived["tiers"]["ebpf-jit"]
    table(
        "The paper's anchors (ours / paper's)",
        ("", "LTTng filter", "hwtrace ebpf-jit", "LTTng / JIT"),
        [
            (
                "F4 TRUE: overhead over no-filter (ns)",
                f"{derived['lttng_filter_overhead_true_ns']:.1f} / {PAPER_F4['lttng']:.0f}",
                f"{jit['overhead_true_ns']:.1f} / {PAPER_F4['ebpf-jit']:.0f}",
                f"{fmt_ratio(jit['ratio_true_overhead'])} / {PAPER_F4['ratio']}x",
            ),
            (
                "F4, paired by round (ns)",
                f"{derived['lttng_filter_overhead_true_ns_paired']:.1f} / {PAPER_F4['lttng']:.0f}",
                f"{jit['overhead_true_ns_paired']:.1f} / {PAPER_F4['ebpf-jit']:.0f}",
                f"{fmt_ratio(jit['ratio_true_overhead_paired'])} / {PAPER_F4['ratio']}x",
            ),
            (
                "F4, JIT charged max(paired, filter alone) (ns)",
                f"{derived['lttng_filter_overhead_true_ns_paired']:.1f} / {PAPER_F4['lttng']:.0f}",
                f"{max(jit['overhead_true_ns_paired'], jit['filter_alone_ns']['TRUE']):.1f}"
                f" / {PAPER_F4['ebpf-jit']:.0f}",
                f"{fmt_ratio(jit['ratio_true_overhead_conservative'])} / {PAPER_F4['ratio']}x",
            ),
            (
                "F3 FALSE: ns/event",
                f"{cells[('filter', 'lttng-filter', 'FALSE')].median:.1f} / 359",
                f"{jit['false_total_ns']:.1f} / 113",
                f"{jit['ratio_false_total']:.1f}x / {PAPER_F3['lttng/ebpf-jit']}x",
            ),
        ],
    )
    rows = []
    for tier in GUARDS:
        d = derived["tiers"][tier]
        rows.append(
            (
                tier,
                f"{d['overhead_true_ns']:.1f} ({d['overhead_true_ns_paired']:.1f})",
                f"{d['filter_alone_ns']['TRUE']:.1f} / {d['filter_alone_ns']['FALSE']:.1f}",
                f"{d['ratio_true_total']:.2f}x",
                fmt_ratio(d["ratio_true_overhead"]),
                f"{d['ratio_false_total']:.2f}x",
                f"{d['ratio_false_over_floor']:.1f}x",
                "yes" if d["hwtrace_faster"] else "NO",
            )
        )
    table(
        "LTTng's filter / each guard (TRUE: totals and overheads over no-filter; FALSE: totals "
        "and above the disabled floor); filter alone = guard with the tracepoint disabled - floor",
        (
            "guard",
            "TRUE overhead ns (paired)",
            "alone T / F ns",
            "TRUE total",
            "TRUE overhead",
            "FALSE total",
            "FALSE - floor",
            "faster",
        ),
        [
            (
                "LTTng --filter",
                f"{derived['lttng_filter_overhead_true_ns']:.1f} "
                f"({derived['lttng_filter_overhead_true_ns_paired']:.1f})",
                f"- / {derived['lttng_filter_over_floor_false_ns']:.1f}",
                "1x",
                "1x",
                "1x",
                "1x",
                "",
            ),
            *rows,
        ],
    )


def source_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    changed = git("status", "--porcelain", "--", "src/hwtrace/filter", "bench/lttng")
    return {"commit": git("rev-parse", "HEAD"), "changes": changed.splitlines()}


cpu_model = common.cpu_model


# -- the run --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="NR 200k, 5 rounds (about 30 s)")
    ap.add_argument("--nr", type=int, default=None, help="events per run (default 1,000,000)")
    ap.add_argument("--repeat", type=int, default=None, help="timed rounds (default 9)")
    ap.add_argument("--cpu", type=int, default=-1, help="pin the loop to this CPU")
    ap.add_argument("--no-install", action="store_true", help="never apt-get install LTTng")
    ap.add_argument("--json", type=Path, default=JSON_PATH, help="where to write the numbers")
    args = ap.parse_args(argv)
    nr = args.nr if args.nr is not None else (QUICK_NR if args.quick else DEFAULT_NR)
    repeat = args.repeat if args.repeat is not None else (QUICK_REPEAT if args.quick else DEFAULT_REPEAT)  # fmt: skip
    if nr < 1 or repeat < 1:
        ap.error("--nr and --repeat must be positive")
    if sys.platform != "linux":
        ap.error("LTTng-UST runs on Linux only")
    if args.cpu >= 0:
        try:
            os.sched_setaffinity(0, {args.cpu})
        except OSError as e:
            ap.error(f"--cpu {args.cpu}: {e.strerror}")
    try:
        return run_benchmark(args, nr, repeat)
    except BenchError as e:
        print(f"bench_lttng: {e}", file=sys.stderr)
        return 1


def run_benchmark(args: argparse.Namespace, nr: int, repeat: int) -> int:
    t_start = time.perf_counter()
    missing = lttng_missing()
    installed = False
    if missing:
        if args.no_install:
            raise BenchError(f"missing {', '.join(missing)} (and --no-install)")
        install_lttng(missing)
        installed = True
        if still := lttng_missing():
            raise BenchError(f"still missing after installing: {', '.join(still)}")
    vers = versions()
    print(f"LTTng: {vers['lttng']}; LTTng-UST {vers.get('lttng-ust', '?')}")
    check = shutil.which("babeltrace2") is not None
    if not check:
        print("note: babeltrace2 not installed: the recorded-event checks are skipped")
    BUILD.mkdir(parents=True, exist_ok=True)
    # One benchmark at a time: a second would share (and maybe stop) the daemon.
    with open(BUILD / ".lock", "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        lib_path = build_library()
        state = source_state()
        outdir = Path(tempfile.mkdtemp(prefix="hwtrace-lttng-"))
        try:
            with session_daemon(BUILD / "sessiond.log") as daemon:
                started = "started" if daemon["started_by_benchmark"] else "already running"
                print(f"session daemon: {started}", flush=True)
                # Registration happens when liblttng-ust loads, so the daemon comes first.
                lib = Library.load(lib_path)
                wait_registered(os.getpid())
                print(f"compiling the filter for {', '.join(HWTRACE_TIERS)} ...", flush=True)
                guards = compile_guards(lib)
                rounds = f"{repeat} rounds + warm-up of {nr:,} events per run"
                print(f"timing {sum(map(len, CONFIGS.values())) * 2} cells, {rounds} ...")
                cells, checks = measure(lib, guards, nr, repeat, outdir, check)
        finally:
            shutil.rmtree(outdir, ignore_errors=True)
    bad = [f"{c.config}/{c.mode}/{c.bias}" for c in cells.values() if c.bad_verdicts]
    if bad:
        raise BenchError(f"wrong guard verdicts during timing: {', '.join(bad)}")

    samples: dict[tuple[str, str], list[float]] = {}
    for (config, mode, bias), cell in cells.items():
        key = f"off:{mode}" if config == "off" and mode.startswith("guard:") else mode
        samples[(key, bias)] = cell.cpu
    derived = derive(samples)
    print()
    report(cells, derived, nr, repeat)
    jit = derived["tiers"]["ebpf-jit"]
    verdict = "faster" if jit["hwtrace_faster"] else "NOT faster"
    print(
        f"hwtrace ebpf-jit is {verdict} than LTTng's filter: "
        f"{jit['ratio_true_total']:.2f}x (TRUE, totals), {jit['ratio_false_total']:.2f}x (FALSE)"
    )
    slower = [t for t in GUARDS if not derived["tiers"][t]["hwtrace_faster"]]
    if slower:
        print(f"slower than LTTng's filter in at least one bias: {', '.join(slower)}")
    elapsed = time.perf_counter() - t_start
    result = {
        "benchmark": "bench_lttng",
        "what": "ns/event of retlif_tp:tpfilt with LTTng's --filter vs hwtrace filters guarding it",
        "expression": EXPRESSION,
        "versions": vers,
        "installed_by_benchmark": installed,
        "session_daemon": daemon,
        "session": {
            "mode": "snapshot (overwrite channels), per-user buffers",
            "subbuf_size": SUBBUF_SIZE,
            "num_subbuf": NUM_SUBBUF,
        },
        "events_per_run": nr,
        "rounds": repeat,
        "statistic": "median thread-CPU ns/event (wall-clock medians alongside)",
        "machine": {
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": platform.python_version(),
        },
        "source": state,
        "library": str(lib_path.relative_to(REPO) if lib_path.is_relative_to(REPO) else lib_path),
        "checks": checks,
        "checks_skipped": not check,
        "guards": {
            t: {"memory_bytes": g.memory_bytes, "compile_s": g.compile_s}
            for t, g in guards.items()
        },
        "cells": [c.summary() for c in cells.values()],
        "derived": derived,
        "paper": {"F4": PAPER_F4, "F3": PAPER_F3, "raw_ns": {f"{m}/{b}": v for (m, b), v in PAPER_RAW.items()}},
        "elapsed_s": elapsed,
    }  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    shown = args.json.relative_to(REPO) if args.json.is_relative_to(REPO) else args.json
    print(f"wrote {shown} ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
