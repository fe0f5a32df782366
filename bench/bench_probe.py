"""Per-hit cost of a probe at the entry of a ~1 µs function, for each way of
putting one there: the peers of hwtrace's jump-patched dynamic tracepoints
(``hwtrace.probes``).

The traced program is bench/probe_target.c (``gcc -O2``): ``work()``, about
1 µs of modular exponentiation, called N times per repetition, R repetitions,
from T threads; each run prints the mean ns per call (CLOCK_MONOTONIC) and
the checksum of all results.  Every kind below runs the same program with the
same arguments, so ns/hit = (ns/call traced) - (ns/call of the baseline), one
hit per call, and every run must print the baseline's checksum.

Kinds (each run waits, ``-w stdin``, until its probe is in the live process):

* ``baseline``             nothing attached;
* ``uprobe (tracefs)``     ``p:hwtrace_bench/work PATH:OFFSET`` written to
  uprobe_events and enabled in a tracefs instance of its own, so every hit
  writes an event into that instance's ring buffer (Documentation/trace/
  uprobetracer.rst: the classic setup; the instance only keeps the global
  buffer untouched).  Hits are read back from uprobe_profile;
* ``uprobe + BPF (bpftrace)``  ``bpftrace -p PID`` with
  ``uprobe:PATH:work { @c = count(); }``: the same kernel uprobe running a
  JIT-compiled BPF program instead of writing a trace event; @c must equal
  the calls.  bpftrace is Debian's package (installed here if missing, as
  root with apt-get), chosen over ``perf probe -x`` + ``perf record``,
  whose per-hit cost would include perf's sample records and its reader;
* ``LTTng-UST enabled``    the ``-DWITH_LTTNG`` build, whose ``work()``
  starts with the static tracepoint hwtrace_bench:work_entry (bench/
  probe_target_tp.h, the call's three arguments), enabled in a snapshot
  session (overwrite channels, 4 x 4 MiB sub-buffers per CPU, per-user
  buffers, as bench/bench_lttng.py: no disk I/O and no dropped event while
  a run is timed) created in a temporary directory and destroyed after;
* ``LTTng-UST disabled``   the same build with no session: the cost of a
  static tracepoint left in the code (a load and a branch);
* ``hwtrace jump (counter)``, ``hwtrace jump (event)``, ``hwtrace int3
  trap``: hooks for ``hwtrace.probes`` (see "hwtrace's probes" below);
  reported as not available until that package provides them.

Before a run is released the benchmark checks that the probe is really in
the process: the first byte of ``work`` read through /proc/PID/mem is int3
for the uprobes.  After it, the probe's hit count must equal the program's
calls (uprobes, bpftrace), LTTng's tracepoint must have been enabled (or
not) when timing began, and the checksum must be the baseline's.  Once,
untimed, a short run in an LTTng session is read back (``lttng snapshot
record`` + babeltrace2, when installed): one event per call.

Kinds run in ``--rounds`` rounds, their order rotating between rounds, so
slow drift of a shared machine spreads over all of them; a kind's samples
are all its repetitions of all rounds.  ``±`` is the standard error of the
difference of two means, sqrt(sd_k^2/n_k + sd_b^2/n_b).

Insertion: with the baseline program alive (waiting, so its text is
mapped), ``--cycles`` times: write the definition to uprobe_events, then
"1" to the event's enable file (that is when the kernel writes int3 into
every process mapping the file, uprobe_register()), then remove it again;
timed with perf_counter_ns around the system calls (Python adds ~1 µs).
On the kernel this was written on (6.18) enabling takes ~8 ms and
disabling + removing ~60 ms, the same with no process mapping the file:
the time goes to waits inside the kernel, not to writing the int3.

    python bench/bench_probe.py [-n N] [-r R] [-t T] [--rounds K] [--cycles C]
                                [--no-install] [--json PATH]

Needs root, tracefs at /sys/kernel/tracing and uprobes.  Writes
bench/out/bench_probe.json.  Defaults take about a minute.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import math
import os
import platform
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out"
BUILD = OUT / "probe"
JSON_PATH = OUT / "bench_probe.json"
SOURCE = HERE / "probe_target.c"
TP_HEADER = HERE / "probe_target_tp.h"
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(HERE))

import common  # noqa: E402

SYMBOL = "work"
CFLAGS = ("-O2", "-g", "-Wall", "-Wextra", "-pthread")
LIBS = ("-lm",)
LTTNG_LIBS = ("-llttng-ust", "-ldl")
TRACEFS = Path("/sys/kernel/tracing")
GROUP = "hwtrace_bench"  # the uprobe's event group, and the tracefs instance
LTTNG_EVENT = "hwtrace_bench:work_entry"
SUBBUF_SIZE, NUM_SUBBUF = "4M", 4
# bench_lttng.py's lock: both may start and stop the session daemon.
LTTNG_LOCK = OUT / "lttng" / ".lock"
INT3 = 0xCC
PREEMPTED = 0.02  # wall above CPU time by more than this: the repetition lost the CPU
DEFAULT_N, DEFAULT_REPS, DEFAULT_ROUNDS, DEFAULT_WARM = 100_000, 10, 5, 20_000
# A cycle takes ~65 ms here (RCU grace periods when the event is disabled and removed).
DEFAULT_CYCLES = 100

# A probe's cleanup: removes it and returns the hits it counted (None: it
# does not count).
Cleanup = Callable[[], "int | None"]
Attach = Callable[[int, str], Cleanup]


BenchError = common.BenchError


class NotAvailable(Exception):
    """A kind this machine (or this checkout) cannot run; the table says why."""


# -- tools ----------------------------------------------------------------------------------------


run = common.run


def compiler() -> str:
    cc = shutil.which(os.environ.get("CC") or "gcc")
    if cc is None:
        raise BenchError("no C compiler (gcc) on PATH")
    return cc


def apt_install(packages: tuple[str, ...]) -> str | None:
    """apt-get install ``packages`` (as root, where apt exists): None, or why not."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "not root with apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    print(f"installing: {' '.join(cmd)}", flush=True)
    if subprocess.run(cmd, env=env, capture_output=True, check=False).returncode == 0:
        return None
    subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=False)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    return None if proc.returncode == 0 else f"{' '.join(cmd)} failed: {proc.stderr[-200:]}"


def build(with_lttng: bool) -> Path:
    """probe_target (or its -DWITH_LTTNG build) in bench/out/probe, named by a
    hash of its sources, flags and compiler (a concurrent run never executes
    a file being rewritten)."""
    cc = compiler()
    flags = [*CFLAGS, *(("-DWITH_LTTNG", f"-I{HERE}") if with_lttng else ())]
    libs = [*LIBS, *(LTTNG_LIBS if with_lttng else ())]
    version = run([cc, "--version"]).stdout.splitlines()[0]
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), TP_HEADER.read_bytes(), " ".join(flags + libs).encode()):
        h.update(part + b"\0")
    h.update(version.encode())
    name = "probe_target-lttng" if with_lttng else "probe_target"
    BUILD.mkdir(parents=True, exist_ok=True)
    path = BUILD / f"{name}-{h.hexdigest()[:16]}"
    if not path.is_file():
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        cmd = [cc, *flags, "-o", str(tmp), str(SOURCE), *libs]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BenchError(f"building {name} failed:\n{' '.join(cmd)}\n{proc.stderr}")
        tmp.replace(path)
        for old in BUILD.glob(f"{name}-*"):
            if old != path and old.name.count("-") == path.name.count("-"):
                old.unlink(missing_ok=True)
    return path


def file_offset(path: Path, symbol: str) -> int:
    """The file offset of ``symbol``'s first byte: what a uprobe is defined by."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        elf = ELFFile(f)
        symtab = elf.get_section_by_name(".symtab")
        found = symtab.get_symbol_by_name(symbol) if symtab is not None else None
        if not found:
            raise BenchError(f"{path}: no symbol {symbol}")
        vaddr = found[0]["st_value"]
        for seg in elf.iter_segments():
            start, size = seg["p_vaddr"], seg["p_filesz"]
            if seg["p_type"] == "PT_LOAD" and start <= vaddr < start + size:
                return vaddr - start + seg["p_offset"]
    raise BenchError(f"{path}: {symbol} is in no loaded segment")


def code_byte(pid: int, path: str, offset: int) -> int:
    """The byte at file offset ``offset`` of ``path`` as process ``pid`` sees
    it now (an inserted probe shows here: int3, a jump)."""
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or parts[5] != path or "x" not in parts[1]:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        map_off = int(parts[2], 16)
        if map_off <= offset < map_off + (hi - lo):
            with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
                mem.seek(lo + offset - map_off)
                return mem.read(1)[0]
    raise BenchError(f"pid {pid} does not map {path}:{offset:#x} executable")


class Lines:
    """A process's stdout, line by line, read by a thread (waits with timeouts)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines, self.queue = proc, [], queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.queue.put(line.rstrip("\n"))
        self.queue.put(None)

    def wait_for(self, pattern: str, timeout: float, what: str) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.queue.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                raise BenchError(f"{what}: no {pattern!r} within {timeout:g} s") from None
            if line is None:
                raise BenchError(f"{what}: exited before printing {pattern!r}")
            self.lines.append(line)
            if m := re.match(pattern, line):
                return m

    def rest(self, timeout: float) -> list[str]:
        self.thread.join(timeout)
        while not self.queue.empty():
            line = self.queue.get()
            if line is not None:
                self.lines.append(line)
        return self.lines


def stop(proc: subprocess.Popen, sig: int = signal.SIGKILL, timeout: float = 10) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- tracefs uprobes ------------------------------------------------------------------------------


def tracefs_write(name: str | Path, text: str) -> None:
    """One write(2) to a tracefs file; uprobe_events is opened O_APPEND, never
    O_TRUNC (truncating it deletes every uprobe on the machine)."""
    path = TRACEFS / name
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, text.encode())
    except OSError as e:
        raise BenchError(f"writing {text.strip()!r} to {path}: {e.strerror}") from None
    finally:
        os.close(fd)


def set_enable(enable: Path, value: bytes) -> None:
    """open + write + close of an event's enable file (a tool's whole step)."""
    fd = os.open(enable, os.O_WRONLY)
    try:
        os.write(fd, value)
    finally:
        os.close(fd)


def uprobe_names() -> tuple[str, Path, Path]:
    """(definition name, instance, the event's enable file in the instance)."""
    instance = TRACEFS / "instances" / GROUP
    return f"{GROUP}/{SYMBOL}", instance, instance / "events" / GROUP / SYMBOL / "enable"


def tracefs_sweep() -> None:
    """Remove this benchmark's uprobe and instance if present (also what a
    run killed by SIGKILL left behind)."""
    name, instance, enable = uprobe_names()
    if enable.exists():
        try:
            enable.write_text("0")
        except OSError:
            pass
    if instance.exists():
        common.close_fds_under(instance)
        try:
            instance.rmdir()
        except OSError:
            pass
    try:
        defined = (TRACEFS / "uprobe_events").read_text()
    except OSError:
        return
    if any(line.split()[0].endswith(f":{name}") for line in defined.splitlines() if line):
        try:
            tracefs_write("uprobe_events", f"-:{name}\n")
        except BenchError:
            pass


def uprobe_available() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if not (TRACEFS / "uprobe_events").exists():
        return f"no {TRACEFS}/uprobe_events (tracefs not mounted, or no CONFIG_UPROBE_EVENTS)"
    return None


def uprobe_hits(path: str) -> int:
    """The event's hit count from uprobe_profile ("file event hits")."""
    for line in (TRACEFS / "uprobe_profile").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == path and parts[1] == SYMBOL:
            return int(parts[2])
    raise BenchError(f"uprobe_profile has no line for {path} {SYMBOL}")


def attach_uprobe(pid: int, symbol: str) -> Cleanup:
    """A tracefs uprobe on ``symbol`` of the process's executable, enabled in
    the benchmark's instance (every hit writes a trace event)."""
    path = os.readlink(f"/proc/{pid}/exe")
    if any(c.isspace() for c in path):
        raise NotAvailable(f"uprobe_events cannot name a path with spaces: {path}")
    offset = file_offset(Path(path), symbol)
    name, instance, enable = uprobe_names()
    tracefs_sweep()
    tracefs_write("uprobe_events", f"p:{name} {path}:{offset:#x}\n")
    try:
        instance.mkdir()
        enable.write_text("1")
        if code_byte(pid, path, offset) != INT3:
            raise BenchError(f"uprobe enabled but no int3 at {symbol} in pid {pid}")
    except BaseException:
        tracefs_sweep()
        raise

    def cleanup() -> int:
        try:
            return uprobe_hits(path)
        finally:
            tracefs_sweep()

    return cleanup


# -- uprobe + BPF (bpftrace) ----------------------------------------------------------------------


def bpftrace_available(install: bool) -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("bpftrace") is None:
        if not install:
            return "bpftrace not installed (and --no-install)"
        if why := apt_install(("bpftrace",)):
            return f"bpftrace not installable: {why}"
    return None


def attach_bpftrace(pid: int, symbol: str) -> Cleanup:
    """``bpftrace -p PID``: a uprobe on ``symbol`` running a BPF program that
    counts hits in a map; bpftrace prints the map when the process exits."""
    path = os.readlink(f"/proc/{pid}/exe")
    program = (
        'BEGIN { printf("attached\\n"); } '
        f"uprobe:{path}:{symbol} {{ @c = count(); }}"
    )  # fmt: skip
    proc = subprocess.Popen(
        ["bpftrace", "-p", str(pid), "-e", program],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a Ctrl-C here is handled by the cleanup
    )
    lines = Lines(proc)
    try:
        # bpftrace fires BEGIN after attaching every probe; the int3 check
        # below makes sure of it.
        lines.wait_for(r"attached$", 60, "bpftrace")
        if code_byte(pid, path, file_offset(Path(path), symbol)) != INT3:
            raise BenchError(f"bpftrace attached but no int3 at {symbol} in pid {pid}")
    except BaseException as e:
        stop(proc, signal.SIGINT)
        err = proc.stderr.read() if proc.stderr else ""
        if isinstance(e, BenchError):
            raise BenchError(f"{e}: {err.strip()[-300:]}") from None
        raise

    def cleanup() -> int:
        # It exits by itself once the traced process is gone (-p).
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            stop(proc, signal.SIGINT)
        out = lines.rest(5)
        for line in out:
            if m := re.match(r"@c: (\d+)$", line):
                return int(m.group(1))
        err = proc.stderr.read() if proc.stderr else ""
        raise BenchError(f"bpftrace printed no @c: {' / '.join(out[-3:])} {err.strip()[-300:]}")

    return cleanup


# -- hwtrace's probes: hooks for src/hwtrace/probes/ ------------------------------------------------
#
# HOOKS TO FILL IN when hwtrace.probes exists.  Each takes the pid of the
# target (waiting, -w stdin, before its timed loop) and the symbol to probe,
# inserts the probe into that live process, and returns a cleanup callable
# that removes it and returns the hits it counted (or None if the probe does
# not count).  The run is released only after the hook returns, so it must
# return once the probe is live.  Raise NotAvailable(reason) to have the
# kind reported as not available.  file_offset() and code_byte() above give
# the symbol's file offset and let a hook check its patch in the process.


def _hwtrace_probes() -> Any:
    try:
        import hwtrace.probes as probes  # type: ignore[import-not-found]
    except ImportError as e:
        raise NotAvailable(f"hwtrace.probes cannot be imported ({e})") from None
    return probes


def _attach_hwtrace(pid: int, symbol: str, *, kind: str | None, record: bool) -> Cleanup:
    probes = _hwtrace_probes()
    try:
        session = probes.ProbeSession(pid)
        tp = session.add(symbol, kind=kind, record=record, regs=("rdi", "rsi", "rdx"))
    except probes.ProbeError as e:
        raise NotAvailable(str(e)) from None
    if kind is None and tp.kind != probes.JUMP:
        session.close()
        raise NotAvailable(f"no jump fits at {symbol}: {tp.note}")
    events = [0]
    stop_draining = threading.Event()

    def drain() -> None:  # as LTTng's consumer daemon does, beside the run
        while not stop_draining.wait(0.01):
            events[0] += len(session.drain())

    drainer = threading.Thread(target=drain, daemon=True) if record else None
    if drainer:
        drainer.start()

    def cleanup() -> int:
        if drainer:
            stop_draining.set()
            drainer.join()
            events[0] += len(session.drain(final=True))
        hits = session.hits(tp)
        if record and events[0] + session.lost != hits:
            raise BenchError(f"{events[0]} events + {session.lost} lost for {hits} hits")
        session.close()
        return hits

    return cleanup


def attach_hwtrace_jump_counter(pid: int, symbol: str) -> Cleanup:
    """hwtrace's jump tracepoint at ``symbol`` counting hits (the floor of a
    jump tracepoint)."""
    return _attach_hwtrace(pid, symbol, kind=None, record=False)


def attach_hwtrace_jump_event(pid: int, symbol: str) -> Cleanup:
    """hwtrace's jump tracepoint at ``symbol`` recording an event with the
    call's arguments into the shared per-CPU buffers, drained beside the run
    (the peer of the uprobe's trace event and of LTTng-UST's tracepoint)."""
    return _attach_hwtrace(pid, symbol, kind=None, record=True)


def attach_hwtrace_int3(pid: int, symbol: str) -> Cleanup:
    """hwtrace's int3 trap tracepoint at ``symbol``: the trap goes to the
    SIGTRAP handler hwtrace put in the process, which sends the thread to
    the trampoline (the fallback where no jump fits)."""
    return _attach_hwtrace(pid, symbol, kind="trap", record=False)


def measure_hwtrace_insertion(binary: Path, target_args: list[str], cycles: int) -> dict[str, Any]:
    """Insert/remove cycles of hwtrace jump tracepoints at the same symbol
    in the live target (every cycle places, patches, unpatches; trampolines
    reclaimed every 50 cycles), in µs."""
    probes = _hwtrace_probes()
    proc, _, pid = launch(binary, target_args)
    insert_ns: list[int] = []
    remove_ns: list[int] = []
    clock = time.perf_counter_ns
    try:
        session = probes.ProbeSession(pid)
        first = session.add(SYMBOL)  # maps the runtime: not part of a tracepoint's cost
        session.remove(first)
        for i in range(cycles):
            t0 = clock()
            tp = session.add(SYMBOL)
            t1 = clock()
            session.remove(tp)
            t2 = clock()
            insert_ns.append(t1 - t0)
            remove_ns.append(t2 - t1)
            if i % 50 == 49:
                session.reclaim()
        session.close()
    except probes.ProbeError as e:
        raise BenchError(f"hwtrace insert/remove cycle: {e}") from None
    finally:
        stop(proc)
    return {
        "cycles": cycles,
        "insert_us": stats([n / 1e3 for n in insert_ns]),
        "remove_us": stats([n / 1e3 for n in remove_ns]),
    }


# -- LTTng ------------------------------------------------------------------------------------------


lttng = common.lttng


def lttng_available(install: bool) -> str | None:
    def missing() -> bool:
        return any(shutil.which(t) is None for t in ("lttng", "lttng-sessiond"))

    if missing():
        if not install:
            return "lttng-tools not installed (and --no-install)"
        if why := apt_install(("lttng-tools", "liblttng-ust-dev")):
            return f"LTTng not installable: {why}"
    return None


session_daemon = common.session_daemon


@contextmanager
def lttng_session(name: str) -> Iterator[Path]:
    """A snapshot session with hwtrace_bench:work_entry enabled and started,
    its output in a temporary directory (yielded); destroyed (and the
    directory removed) on the way out."""
    outdir = Path(tempfile.mkdtemp(prefix="hwtrace-probe-lttng-"))
    created = False
    try:
        lttng("create", name, "--snapshot", "--output", str(outdir / "snapshot"))
        created = True
        lttng(
            "enable-channel", "-u", "-s", name, "--overwrite",
            "--subbuf-size", SUBBUF_SIZE, "--num-subbuf", str(NUM_SUBBUF), "chan",
        )  # fmt: skip
        lttng("enable-event", "-u", "-s", name, "-c", "chan", LTTNG_EVENT)
        lttng("start", name)
        yield outdir
    finally:
        if created:
            lttng("destroy", name, check=False)
        shutil.rmtree(outdir, ignore_errors=True)


def verify_lttng(binary: Path) -> dict[str, Any]:
    """Once, untimed: a short run of the -DWITH_LTTNG build in a session,
    read back with ``lttng snapshot record`` + babeltrace2, must hold one
    event per call, with the call's arguments."""
    calls = 1000
    name = f"hwtrace-probe-{os.getpid()}-check"
    with lttng_session(name) as outdir:
        proc = subprocess.run(
            [str(binary), "-n", str(calls), "-r", "1", "-W", "0"],
            capture_output=True,
            text=True,
            env={**os.environ, "LTTNG_UST_REGISTER_TIMEOUT": "10000"},
            timeout=60,
            check=False,
        )
        if proc.returncode != 0 or "lttng_enabled: 1" not in proc.stdout:
            raise BenchError(f"LTTng check run: exit {proc.returncode}: {proc.stdout[-200:]}")
        lttng("snapshot", "record", "-s", name, str(outdir / "check"))
        text = run(["babeltrace2", str(outdir / "check")], timeout=120).stdout
    events = [line for line in text.splitlines() if LTTNG_EVENT in line]
    if len(events) != calls or not all("mod = " in e for e in events):
        raise BenchError(f"LTTng check: {len(events)} {LTTNG_EVENT} events recorded, {calls} calls")
    return {"calls": calls, "recorded": len(events), "sample": events[0].split("{", 1)[-1]}


# -- kinds and runs ---------------------------------------------------------------------------------


@dataclass
class Kind:
    name: str
    binary: str  # "plain" or "lttng"
    attach: Attach | None = None
    session: bool = False  # an LTTng session with the tracepoint enabled around the run
    unavailable: str | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)

    def wall(self) -> list[float]:
        return [x for r in self.runs for x in r["ns_per_call_reps"]]

    def cpu(self) -> list[float]:
        return [x for r in self.runs for x in r["cpu_ns_per_call_reps"]]


def make_kinds() -> list[Kind]:
    return [
        Kind("baseline", "plain"),
        Kind("uprobe (tracefs)", "plain", attach_uprobe),
        Kind("uprobe + BPF (bpftrace)", "plain", attach_bpftrace),
        Kind("LTTng-UST enabled", "lttng", session=True),
        Kind("LTTng-UST disabled", "lttng"),
        Kind("hwtrace jump (counter)", "plain", attach_hwtrace_jump_counter),
        Kind("hwtrace jump (event)", "plain", attach_hwtrace_jump_event),
        Kind("hwtrace int3 trap", "plain", attach_hwtrace_int3),
    ]


def launch(binary: Path, target_args: list[str]) -> tuple[subprocess.Popen, Lines, int]:
    """Start the target waiting for its go line; (process, its output, pid)."""
    env = dict(os.environ)
    # liblttng-ust's constructor waits this long (ms) for the session daemon
    # to push the enabled events before main() runs (lttng-ust(3)).
    env["LTTNG_UST_REGISTER_TIMEOUT"] = "10000"
    proc = subprocess.Popen(
        [str(binary), *target_args, "-w", "stdin"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    lines = Lines(proc)
    try:
        pid = int(lines.wait_for(r"ready (\d+)$", 30, binary.name).group(1))
    except BaseException:
        stop(proc)
        raise
    return proc, lines, pid


def parse_output(lines: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for line in lines:
        key, sep, value = line.partition(": ")
        if not sep:
            continue
        if key.endswith("_reps"):
            out[key] = [float(x) for x in value.split()]
        elif key in ("calls", "lttng_enabled"):
            out[key] = int(value)
        elif key == "checksum":
            out[key] = value.strip()
    for key in ("ns_per_call_reps", "cpu_ns_per_call_reps", "calls", "checksum"):
        if key not in out:
            raise BenchError(f"the target printed no {key}: {' / '.join(lines[-4:])}")
    return out


def run_kind(kind: Kind, binary: Path, target_args: list[str], timeout: float) -> dict[str, Any]:
    """One run of the target with ``kind``'s probe; raises NotAvailable."""
    proc, lines, pid = launch(binary, target_args)
    cleanup: Cleanup | None = None
    try:
        if kind.attach is not None:
            cleanup = kind.attach(pid, SYMBOL)
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.close()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BenchError(f"{kind.name}: the target ran over {timeout:g} s") from None
        if proc.returncode != 0:
            err = proc.stderr.read() if proc.stderr else ""
            raise BenchError(f"{kind.name}: the target exited {proc.returncode}: {err.strip()}")
        result = parse_output(lines.rest(10))
        if cleanup is not None:
            done, cleanup = cleanup, None
            result["hits"] = done()
        return result
    finally:
        stop(proc)
        if cleanup is not None:
            try:
                cleanup()
            except (BenchError, OSError):
                pass  # already failing: the first error is the one reported


def check_run(kind: Kind, result: dict[str, Any], checksum: str | None) -> None:
    hits = result.get("hits")
    if hits is not None and hits != result["calls"]:
        raise BenchError(f"{kind.name}: {hits} hits for {result['calls']} calls of {SYMBOL}")
    if kind.binary == "lttng" and result.get("lttng_enabled") != int(kind.session):
        state = "enabled" if kind.session else "disabled"
        raise BenchError(f"{kind.name}: {LTTNG_EVENT} was not {state} when timing began")
    if checksum is not None and result["checksum"] != checksum:
        raise BenchError(f"{kind.name}: checksum {result['checksum']}, baseline {checksum}")


def measure(
    kinds: list[Kind],
    binaries: dict[str, Path],
    target_args: list[str],
    rounds: int,
    timeout: float,
) -> None:
    checksum: str | None = None
    for rnd in range(rounds):
        live = [k for k in kinds if k.unavailable is None]
        shift = rnd % len(live)
        # The baseline first in round 0: its checksum is the reference.
        order = live if rnd == 0 else live[shift:] + live[:shift]
        print(f"  round {rnd + 1}/{rounds}", flush=True)
        for kind in order:
            if kind.unavailable is not None:
                continue
            t0 = time.perf_counter()
            try:
                if kind.session:
                    with lttng_session(f"hwtrace-probe-{os.getpid()}-{rnd}"):
                        result = run_kind(kind, binaries[kind.binary], target_args, timeout)
                else:
                    result = run_kind(kind, binaries[kind.binary], target_args, timeout)
            except NotAvailable as e:
                kind.unavailable = str(e)
                print(f"    {kind.name}: not available: {e}", flush=True)
                continue
            if checksum is None:
                checksum = result["checksum"]
            check_run(kind, result, checksum)
            result["round"] = rnd
            result["seconds"] = time.perf_counter() - t0
            kind.runs.append(result)
            reps = result["ns_per_call_reps"]
            print(
                f"    {kind.name:<26} {statistics.fmean(reps):9.1f} ns/call"
                f"  ({result['seconds']:.1f} s)",
                flush=True,
            )


# -- uprobe insertion time --------------------------------------------------------------------------


def measure_insertion(binary: Path, target_args: list[str], cycles: int) -> dict[str, Any]:
    """Insert/remove cycles of the tracefs uprobe with the target alive (see
    the module docstring), in µs."""
    proc, _, pid = launch(binary, target_args)
    path = os.readlink(f"/proc/{pid}/exe")
    offset = file_offset(Path(path), SYMBOL)
    original = code_byte(pid, path, offset)
    name, instance, enable = uprobe_names()
    definition = f"p:{name} {path}:{offset:#x}\n".encode()
    removal = f"-:{name}\n".encode()
    define_ns: list[int] = []
    enable_ns: list[int] = []
    remove_ns: list[int] = []
    tracefs_sweep()
    events = os.open(TRACEFS / "uprobe_events", os.O_WRONLY | os.O_APPEND)
    try:
        instance.mkdir()
        clock = time.perf_counter_ns
        for i in range(cycles):
            t0 = clock()
            os.write(events, definition)
            t1 = clock()
            set_enable(enable, b"1")
            t2 = clock()
            if i == 0 and code_byte(pid, path, offset) != INT3:
                raise BenchError(f"uprobe enabled but no int3 at {SYMBOL} in pid {pid}")
            t2b = clock()
            set_enable(enable, b"0")
            os.write(events, removal)
            t3 = clock()
            if i == 0 and code_byte(pid, path, offset) != original:
                raise BenchError(f"uprobe removed but {SYMBOL} in pid {pid} not restored")
            define_ns.append(t1 - t0)
            enable_ns.append(t2 - t1)
            remove_ns.append(t3 - t2b)
    except OSError as e:
        raise BenchError(f"uprobe insert/remove cycle: {e}") from None
    finally:
        os.close(events)
        tracefs_sweep()
        stop(proc)
    insert = [(d + e) / 1e3 for d, e in zip(define_ns, enable_ns, strict=True)]
    return {
        "cycles": cycles,
        "insert_us": stats(insert),
        "define_us": stats([d / 1e3 for d in define_ns]),
        "enable_us": stats([e / 1e3 for e in enable_ns]),
        "remove_us": stats([r / 1e3 for r in remove_ns]),
        "with_process_mapping_the_file": True,
    }


# -- results ------------------------------------------------------------------------------------------


def stats(xs: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(xs),
        "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "median": statistics.median(xs),
        "min": min(xs),
        "n": len(xs),
    }


def checked_text(kind: Kind) -> str:
    """What was checked on every run of ``kind`` besides the checksum."""
    if kind.runs and all(r.get("hits") is not None for r in kind.runs):
        return "hits = calls"
    if kind.binary == "lttng":
        return "enabled at start" if kind.session else "disabled at start"
    return ""


def summarize(kinds: list[Kind]) -> dict[str, dict[str, Any]]:
    """Per kind: ns/call, and ns/hit (minus the baseline) ± the standard
    error of the difference; ratios to the uprobe and to LTTng-UST enabled."""
    base = next(k for k in kinds if k.name == "baseline")
    b = stats(base.wall())
    out: dict[str, dict[str, Any]] = {}
    for k in kinds:
        if k.unavailable is not None or not k.runs:
            out[k.name] = {"available": False, "why": k.unavailable}
            continue
        s, c = stats(k.wall()), stats(k.cpu())
        preempted = sum(
            w > x * (1 + PREEMPTED) for w, x in zip(k.wall(), k.cpu(), strict=True)
        )  # fmt: skip
        entry: dict[str, Any] = {
            "available": True,
            "ns_per_call": s,
            "cpu_ns_per_call": c,
            "preempted_reps": preempted,
            "runs": len(k.runs),
            "checked": checked_text(k),
        }
        if k is not base:
            entry["ns_per_hit"] = s["mean"] - b["mean"]
            entry["ns_per_hit_err"] = math.sqrt(s["sd"] ** 2 / s["n"] + b["sd"] ** 2 / b["n"])
            entry["cpu_ns_per_hit"] = c["mean"] - stats(base.cpu())["mean"]
        out[k.name] = entry
    for ref, key in (("uprobe (tracefs)", "x_uprobe"), ("LTTng-UST enabled", "x_lttng")):
        r = out.get(ref, {}).get("ns_per_hit")
        for entry in out.values():
            if "ns_per_hit" in entry and r:
                entry[key] = entry["ns_per_hit"] / r
    return out


def report(summary: dict[str, dict[str, Any]], insertion: dict[str, Any] | None) -> None:
    rows = []
    for name, e in summary.items():
        if not e["available"]:
            rows.append((name, "", "not available", "", "", e.get("why") or ""))
            continue
        s = e["ns_per_call"]
        hit = f"{e['ns_per_hit']:.1f} ± {e['ns_per_hit_err']:.1f}" if "ns_per_hit" in e else "-"
        rows.append(
            (
                name,
                f"{s['mean']:.1f} ± {s['sd']:.1f}",
                hit,
                f"{e['x_uprobe']:.2f}x" if "x_uprobe" in e else "",
                f"{e['x_lttng']:.2f}x" if "x_lttng" in e else "",
                e["checked"],
            )
        )
    common.print_table(
        "Per-hit cost of a probe at the entry of work() (~1 µs): mean ns (± sd per call, "
        "± standard error per hit)",
        ("kind", "ns/call", "ns/hit", "/ uprobe", "/ LTTng-UST", "checked"),
        rows,
        width=150,
        title_justify="left",
    )
    if insertion is not None:
        i, d, en, r = (insertion[k] for k in ("insert_us", "define_us", "enable_us", "remove_us"))
        print(
            f"uprobe insertion (write to uprobe_events + enable), {insertion['cycles']} cycles, "
            f"one process mapping the file: {i['mean']:.1f} ± {i['sd']:.1f} µs "
            f"(median {i['median']:.1f}; define {d['mean']:.1f} + enable {en['mean']:.1f}); "
            f"removal {r['mean']:.1f} ± {r['sd']:.1f} µs"
        )
        h = insertion.get("hwtrace")
        if h:
            hi, hr = h["insert_us"], h["remove_us"]
            print(
                f"hwtrace jump tracepoint insertion from outside the process (ptrace, "
                f"/proc/PID/mem, membarrier), {h['cycles']} cycles: {hi['mean']:.1f} ± "
                f"{hi['sd']:.1f} µs (median {hi['median']:.1f}), {i['mean'] / hi['mean']:.1f}x "
                f"faster than the uprobe; removal {hr['mean']:.1f} ± {hr['sd']:.1f} µs"
            )


def versions() -> dict[str, str]:
    out = {"kernel": platform.release()}
    for tool, args in (("bpftrace", ["--version"]), ("lttng", ["--version"])):
        if shutil.which(tool):
            out[tool] = run([tool, *args], check=False).stdout.strip()
    return out


cpu_model = common.cpu_model


# -- the run ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("-n", "--calls", type=int, default=DEFAULT_N, help="calls per repetition")
    ap.add_argument("-r", "--reps", type=int, default=DEFAULT_REPS, help="repetitions per run")
    ap.add_argument("-t", "--threads", type=int, default=1, help="threads calling work()")
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="runs of every kind")
    ap.add_argument("--warm", type=int, default=DEFAULT_WARM, help="untimed calls per thread")
    ap.add_argument("--cycles", type=int, default=DEFAULT_CYCLES, help="uprobe insert/remove")
    ap.add_argument("--no-install", action="store_true", help="never apt-get install")
    ap.add_argument("--json", type=Path, default=JSON_PATH)
    args = ap.parse_args(argv)
    if min(args.calls, args.reps, args.threads, args.rounds) < 1 or args.warm < 0:
        ap.error("-n, -r, -t and --rounds must be positive, --warm not negative")
    if sys.platform != "linux":
        ap.error("uprobes and LTTng-UST run on Linux only")

    def sweep() -> None:
        if os.geteuid() == 0 and (TRACEFS / "uprobe_events").exists():
            tracefs_sweep()

    return common.bench_main(
        "bench_probe",
        lambda: run_benchmark(args),
        interrupted="probes and sessions removed",
        cleanup=sweep,
    )


def run_benchmark(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    install = not args.no_install
    if why := uprobe_available():
        raise BenchError(why)
    kinds = make_kinds()
    by_name = {k.name: k for k in kinds}
    bpf_why = bpftrace_available(install)
    by_name["uprobe + BPF (bpftrace)"].unavailable = bpf_why
    lttng_why = lttng_available(install)
    binaries = {"plain": build(with_lttng=False)}
    if lttng_why is None:
        try:
            binaries["lttng"] = build(with_lttng=True)
        except BenchError as e:
            lttng_why = f"the -DWITH_LTTNG build failed: {str(e).splitlines()[-1]}"
    for k in kinds:
        if k.binary == "lttng":
            k.unavailable = lttng_why
    target_args = [
        *("-n", str(args.calls), "-r", str(args.reps)),
        *("-t", str(args.threads), "-W", str(args.warm)),
    ]
    # A run's time, generously: 20 µs a call (a slow probe on a loaded machine).
    calls = args.threads * (args.warm + args.calls * args.reps)
    timeout = 60 + calls * 20e-6 / min(args.threads, os.cpu_count() or 1)
    print(
        f"target: {binaries['plain'].relative_to(REPO)}; {args.rounds} rounds of "
        f"{args.reps} x {args.calls:,} calls, {args.threads} thread(s)",
        flush=True,
    )
    LTTNG_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LTTNG_LOCK, "w") as lockf:
        # One LTTng benchmark at a time: another would share (and maybe stop) the daemon.
        fcntl.flock(lockf, fcntl.LOCK_EX)
        daemon: dict[str, Any] = {}
        lttng_check: dict[str, Any] | None = None
        with maybe_session_daemon(lttng_why is None, BUILD / "sessiond.log") as daemon_info:
            daemon = daemon_info
            if lttng_why is None:
                started = "started" if daemon["started_by_benchmark"] else "already running"
                print(f"LTTng session daemon: {started}", flush=True)
                if shutil.which("babeltrace2"):
                    lttng_check = verify_lttng(binaries["lttng"])
                    print(f"LTTng check: {lttng_check['recorded']} events recorded", flush=True)
                else:
                    print("note: babeltrace2 not installed: the LTTng recording check is skipped")
            measure(kinds, binaries, target_args, args.rounds, timeout)
    insertion = None
    if args.cycles > 0:
        print(f"  uprobe insertion: {args.cycles} insert/remove cycles", flush=True)
        insertion = measure_insertion(binaries["plain"], target_args, args.cycles)
        print(f"  hwtrace insertion: {10 * args.cycles} insert/remove cycles", flush=True)
        try:
            insertion["hwtrace"] = measure_hwtrace_insertion(
                binaries["plain"], target_args, 10 * args.cycles
            )
        except NotAvailable as e:
            print(f"    not available: {e}")
    summary = summarize(kinds)
    print()
    report(summary, insertion)
    elapsed = time.perf_counter() - t_start
    result = {
        "benchmark": "bench_probe",
        "what": "per-hit ns of a probe at the entry of a ~1 µs function, minus the baseline",
        "config": {
            "calls_per_rep": args.calls,
            "reps": args.reps,
            "threads": args.threads,
            "rounds": args.rounds,
            "warm": args.warm,
        },
        "statistic": "mean CLOCK_MONOTONIC ns/call over all repetitions of all rounds; "
        "ns_per_hit_err = standard error of the difference to the baseline",
        "machine": {
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "versions": versions(),
        "session_daemon": daemon,
        "lttng_recording_check": lttng_check,
        "binaries": {k: str(v.relative_to(REPO)) for k, v in binaries.items()},
        "kinds": summary,
        "runs": {k.name: k.runs for k in kinds},
        "uprobe_insertion": insertion,
        "elapsed_s": elapsed,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    shown = args.json.relative_to(REPO) if args.json.is_relative_to(REPO) else args.json
    print(f"wrote {shown} ({elapsed:.0f} s)")
    return 0


@contextmanager
def maybe_session_daemon(wanted: bool, log: Path) -> Iterator[dict[str, Any]]:
    """The LTTng session daemon when LTTng is available, else nothing."""
    if not wanted:
        yield {}
        return
    with session_daemon(log) as info:
        yield info


if __name__ == "__main__":
    sys.exit(main())
