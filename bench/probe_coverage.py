"""Coverage of hwtrace's jump tracepoints: at how many instructions of real
programs and libraries a jump (not the int3 fallback) can be placed.

The study of Harper-Cyr's "Fast & Flexible Tracepoints in x86" (Table 4.4):
a tracepoint is inserted and removed at every instruction of a file, one at
a time, in a live process, and the sites where a jump was placed are
counted.  Harper-Cyr (2018) reports 99.7% (a random program), 99.0% (nano) and
93.4% (firefox) for its jumps, and ~2% for GDB's fast tracepoints, which
need an instruction of at least 5 bytes at the site (here: "GDB-style", the
share of instructions of >= 5 bytes).

Sites.  Every instruction of every function of the file: the functions are
the sized ``STT_FUNC``/``STT_GNU_IFUNC`` symbols of ``.symtab`` and
``.dynsym`` together with the FDEs of ``.eh_frame`` (Debian strips
``.symtab``, and nano and gdb export no functions at all, while their
unwind tables still cover ~99% of ``.text``), read with pyelftools.  Each
such range is decoded by linear sweep with iced-x86 from its start; bytes
outside every range (alignment padding between functions) are skipped, and
a sweep stops at the first undecodable instruction (counted).  A site's
window "fits" when the instructions covering the jump's 5 bytes end inside
that range: the session itself only knows function ends from symbols, so
for functions without one it may let a jump run into the next function
(whose first byte then reads int3, which the embedded traps make safe);
"jump within fn" counts the jumps that also fit.

Targets.  Each file is mapped by an idle process started here: nano and gdb
on a pseudo-terminal, bash and python reading commands from a pipe, libc
in ``cat`` reading a pipe.  Targets die with this process (their own
session, ``PR_SET_PDEATHSIG``), and are killed on exit, ^C or an error.

Live mode, at every site: ``ProbeSession.add`` at the address; the bytes
at the site (read through /proc/PID/mem) must be ``tp.patched`` followed by
the untouched original bytes, a jump must lead to ``tp.trampoline`` with
int3 at every covered instruction start in it; ``remove``; the original
bytes must be back; the target must still be alive.  ``reclaim()`` runs
every ``--reclaim-every`` sites.  Each site is meant to be tried alone, as
in Harper-Cyr's: with 3 or 4 covered instruction starts a jump has only 256
or 1 possible trampoline addresses, the same ones for neighbouring sites,
so when ``add`` found none free while removed tracepoints still held
theirs, those are reclaimed and the site is tried once more (the JSON
counts these).  A thread blocked in a system call that a tracepoint
displaced is restarted into the trampoline's copy of the ``syscall`` and
stays parked there, and ``reclaim`` frees nothing while any thread is in a
retired trampoline, so the target is poked (a newline, or ^L for nano)
until it leaves.  Every session call runs under a watchdog (30 s: the
target is killed, the call counted as hung, and a new target started).
At the end, with every tracepoint removed and again after ``close()``,
every executable mapping of the target must hold the bytes it held
before the session, and after ``close()`` /proc/PID/maps must be what it
was.

Plan-only mode (``--plan-only``) does what ``add`` decides, without
ptrace: ``resolve`` and ``check_boundary``, ``choose_window`` at each site
(a jump may run up to the end of the mapping, as ``ProbeSession._place``
now allows), ``trampoline_size``, a chunk for the trampoline placed by
``TrampolineSpace.new_chunk`` in the free gaps of the live target's maps
(each site alone, as if no chunk were mapped), and ``lay_out``.

    python bench/probe_coverage.py [--files nano,bash,libc,gdb] [--sample N]
                                   [--plan-only] [--seed S] [--json PATH]

Needs root (or ptrace rights over its own children) for the live mode;
installs nano and gdb with apt-get when missing (as root, unless
``--no-install``).  Writes bench/out/probe_coverage.json (with
``--plan-only``: probe_coverage-plan.json), after each file.  Exits 1 when
a check failed (a "bug" in the tables).
"""

from __future__ import annotations

import argparse
import bisect
import ctypes
import fcntl
import hashlib
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from array import array
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import iced_x86
from elftools.dwarf.callframe import FDE
from elftools.elf.elffile import ELFFile

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out"
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(HERE))

import common  # noqa: E402

from hwtrace.image.process import ProcessModules, read_maps  # noqa: E402
from hwtrace.probes import (  # noqa: E402
    JUMP,
    TRAP,
    ProbeError,
    ProbeSession,
    SiteError,
    Tracepoint,
)
from hwtrace.probes.alloc import CHUNK_CODE, TrampolineSpace, constraint, free_gaps  # noqa: E402
from hwtrace.probes.locate import check_boundary, resolve  # noqa: E402
from hwtrace.probes.plan import choose_window, data_reach, lay_out, trampoline_size  # noqa: E402
from hwtrace.probes.relocate import RelocationError, Window, decode_window  # noqa: E402

DEFAULT_FILES = ("nano", "bash", "libc", "gdb")
RECLAIM_EVERY = 256  # far below the redirect table's 4096 slots (~3 per jump tracepoint)
PROGRESS_EVERY = 20.0  # seconds between progress lines
EXAMPLES = 3  # example sites kept per trap reason and error
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: used in the child


BenchError = common.BenchError  # a failure reported in one line (no traceback)


class Hang(Exception):
    """An operation of the session did not return in time."""


class Watchdog:
    """Bounds each session operation: a ptrace loop that never ends (the
    thread stepped at a faulting address, say) would stall the study, so
    after ``seconds`` the target is killed, which ends any wait on it, and
    :class:`Hang` is raised.  ``fired`` stays set for the caller to see, as
    the unwinding may replace the Hang by an error about the dead target."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.fired = ""
        self.target: Target | None = None
        self.what = ""

    def _fire(self, _signum: int, _frame: object) -> None:
        self.fired = self.what
        if self.target is not None:
            self.target.kill_now()
        raise Hang(f"{self.what} did not return within {self.seconds:g} s")

    @contextmanager
    def bound(self, target: Target, what: str) -> Iterator[None]:
        self.target, self.what, self.fired = target, what, ""
        old = signal.signal(signal.SIGALRM, self._fire)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


WATCHDOG = Watchdog(30.0)


# -- the files and their idle processes ---------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A file to cover and the idle process that maps it."""

    name: str
    file: str  # path, or a base name to find in the target's maps (a library)
    argv: tuple[str, ...]
    tty: bool  # run on a pseudo-terminal (a full-screen program)
    poke: bytes  # input that wakes it up and lets it go back to sleep
    package: str = ""  # the Debian package that brings it

    def available(self) -> str | None:
        """Why it cannot run here, or None."""
        exe = shutil.which(self.argv[0])
        if exe is None:
            return f"{self.argv[0]} is not installed"
        if self.file.startswith("/") and not os.path.exists(self.file):
            return f"{self.file} does not exist"
        return None


def catalog() -> dict[str, Spec]:
    py = f"python{sys.version_info.major}.{sys.version_info.minor}"
    nano = ("nano", "-R", "--ignorercfiles")  # -R: restricted, it writes no file
    pyloop = (py, "-S", "-c", "import sys\nfor _ in sys.stdin: pass")
    specs = (
        # ^L only redraws nano's screen.
        Spec("nano", "/usr/bin/nano", nano, True, b"\x0c", "nano"),
        # Reading commands from a pipe: a newline is an empty command.
        Spec("bash", "/usr/bin/bash", ("bash", "--norc", "--noprofile"), False, b"\n"),
        Spec("libc", "libc.so.6", ("cat",), False, b"\n"),
        Spec("gdb", "/usr/bin/gdb", ("gdb", "-q", "-nx"), True, b"\n", "gdb"),
        Spec("python", f"/usr/bin/{py}", pyloop, False, b"\n"),
    )
    return {s.name: s for s in specs}


def _child_setup(tty: bool) -> None:
    """In the target, between fork and exec: die with the benchmark, and take
    the pseudo-terminal (stdin) as controlling terminal."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if tty:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Target:
    """A running idle process of ``spec``; ``kill()`` ends it and its children."""

    def __init__(self, spec: Spec, workdir: str) -> None:
        self.spec = spec
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": workdir,
            "TERM": "xterm",
            "LANG": "C.UTF-8",
        }
        self.master = -1
        if spec.tty:
            self.master, slave = os.openpty()
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
            try:
                self.proc = subprocess.Popen(
                    list(spec.argv), stdin=slave, stdout=slave, stderr=slave, env=env,
                    cwd=workdir, start_new_session=True, preexec_fn=lambda: _child_setup(True),
                )  # fmt: skip
            finally:
                os.close(slave)
            os.set_blocking(self.master, False)
            self.input = self.master
        else:
            self.proc = subprocess.Popen(
                list(spec.argv), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, env=env, cwd=workdir, start_new_session=True,
                preexec_fn=lambda: _child_setup(False),
            )  # fmt: skip
            assert self.proc.stdin is not None
            self.input = self.proc.stdin.fileno()
        self.pid = self.proc.pid
        self.pokes = 0

    def drain(self) -> None:
        """Read what a terminal program wrote, so that it never blocks on output."""
        if self.master < 0:
            return
        while True:
            try:
                if not os.read(self.master, 65536):
                    return
            except (BlockingIOError, OSError):
                return

    def alive(self) -> bool:
        return self.proc.poll() is None  # only between operations: never while seized

    def wait_idle(self, path_or_name: str, timeout: float = 30.0) -> str:
        """Wait until the process maps the file and every thread sleeps;
        returns the mapped path."""
        deadline = time.monotonic() + timeout
        quiet = 0
        path = ""
        while time.monotonic() < deadline:
            self.drain()
            if not self.alive():
                raise BenchError(f"{self.spec.name}: {' '.join(self.spec.argv)} exited "
                                 f"({self.proc.returncode}) while starting")  # fmt: skip
            path = path or mapped_path(self.pid, path_or_name)
            quiet = quiet + 1 if path and all_sleeping(self.pid) else 0
            if quiet >= 4:
                return path
            time.sleep(0.05)
        raise BenchError(f"{self.spec.name}: not idle after {timeout:g} s")

    def poke(self) -> None:
        try:
            os.write(self.input, self.spec.poke)
        except OSError:
            return
        self.pokes += 1
        time.sleep(0.02)
        self.drain()

    def kill_now(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)  # its own group: bash's or gdb's children too
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        self.kill_now()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self.master >= 0:
            os.close(self.master)
            self.master = -1
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass


def mapped_path(pid: int, path_or_name: str) -> str:
    """The path under which the process maps the file executable, or ""."""
    want = os.path.realpath(path_or_name) if path_or_name.startswith("/") else ""
    for m in read_maps(pid):
        if not m.executable or not m.path.startswith("/"):
            continue
        if m.path == want or os.path.realpath(m.path) == want:
            return m.path
        if not want and os.path.basename(m.path) == path_or_name:
            return m.path
    return ""


def all_sleeping(pid: int) -> bool:
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
            if state not in ("S", "D"):
                return False
    except OSError:
        return False
    return True


# -- the instructions of a file ------------------------------------------------------------------


@dataclass
class Code:
    """The instruction sites of an ELF file (link addresses)."""

    path: str
    min_vaddr: int
    sites: array  # instruction addresses, ascending
    lengths: bytearray  # their lengths
    fits: bytearray  # 1: a 5-byte jump's window ends inside the site's function
    fn_start: array  # the start of the function (range) the site was found in
    ranges_symbols: int = 0
    ranges_fde: int = 0
    ranges: int = 0
    bytes_swept: int = 0
    undecodable: int = 0  # ranges whose sweep stopped early at a byte it could not decode
    text_size: int = 0

    def __len__(self) -> int:
        return len(self.sites)


def _symbol_ranges(elf: ELFFile) -> set[tuple[int, int]]:
    out = set()
    for section in elf.iter_sections():
        if section["sh_type"] not in ("SHT_SYMTAB", "SHT_DYNSYM"):
            continue
        for sym in section.iter_symbols():
            kind = sym["st_info"]["type"]
            # pyelftools names STT_GNU_IFUNC (10) "STT_LOOS".
            if kind not in ("STT_FUNC", "STT_GNU_IFUNC", "STT_LOOS"):
                continue
            if sym["st_size"] > 0 and sym["st_shndx"] != "SHN_UNDEF":
                out.add((sym["st_value"], sym["st_value"] + sym["st_size"]))
    return out


def _fde_ranges(elf: ELFFile) -> set[tuple[int, int]]:
    if elf.get_section_by_name(".eh_frame") is None:
        return set()
    out = set()
    for entry in elf.get_dwarf_info(follow_links=False).EH_CFI_entries():
        if isinstance(entry, FDE):
            lo = entry.header["initial_location"]
            out.add((lo, lo + entry.header["address_range"]))
    return out


def enumerate_code(path: str) -> Code:
    """Every instruction of every function of ``path`` (see the module doc)."""
    data = Path(path).read_bytes()
    with open(path, "rb") as f:
        elf = ELFFile(f)
        loads = [s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
        execs = [(s["p_vaddr"], s["p_vaddr"] + s["p_filesz"], s["p_offset"])
                 for s in loads if s["p_flags"] & 1]  # fmt: skip
        min_vaddr = min(s["p_vaddr"] for s in loads)
        syms, fdes = _symbol_ranges(elf), _fde_ranges(elf)
        text = elf.get_section_by_name(".text")
        text_size = text["sh_size"] if text is not None else 0

    def file_offset(lo: int, hi: int) -> int | None:
        for vlo, vhi, off in execs:
            if vlo <= lo and hi <= vhi:
                return lo - vlo + off
        return None

    # Ranges that start together are one function (a symbol and its FDE): the longest wins.
    longest: dict[int, int] = {}
    for lo, hi in syms | fdes:
        if hi > lo and file_offset(lo, hi) is not None:
            longest[lo] = max(longest.get(lo, 0), hi)
    found: dict[int, tuple[int, int, int]] = {}  # address -> (length, fits, function start)
    instr = iced_x86.Instruction()
    undecodable = swept = 0
    for lo in sorted(longest):
        hi = longest[lo]
        off = file_offset(lo, hi)
        assert off is not None
        chunk = data[off : off + (hi - lo)]
        swept += hi - lo
        decoder = iced_x86.Decoder(64, chunk, ip=lo)
        addrs: list[int] = []
        lens: list[int] = []
        while decoder.can_decode:
            decoder.decode_out(instr)
            if instr.code == iced_x86.Code.INVALID:
                undecodable += 1
                break
            addrs.append(instr.ip)
            lens.append(instr.len)
        n = len(addrs)
        for i in range(n):
            a = addrs[i]
            if a in found:
                continue
            # The window: instructions from here until 5 bytes are covered.
            j, end = i, a
            while j < n and end - a < 5:
                end += lens[j]
                j += 1
            found[a] = (lens[i], 1 if end - a >= 5 and end <= hi else 0, lo)
    order = sorted(found)
    return Code(
        path=path,
        min_vaddr=min_vaddr,
        sites=array("Q", order),
        lengths=bytearray(found[a][0] for a in order),
        fits=bytearray(found[a][1] for a in order),
        fn_start=array("Q", (found[a][2] for a in order)),
        ranges_symbols=len(syms),
        ranges_fde=len(fdes),
        ranges=len(longest),
        bytes_swept=swept,
        undecodable=undecodable,
        text_size=text_size,
    )


# -- memory of the target ------------------------------------------------------------------------


def read_mem(pid: int, start: int, size: int) -> bytes:
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        return os.pread(fd, size, start)
    finally:
        os.close(fd)


def code_snapshot(pid: int) -> dict[tuple[int, int, str], bytes]:
    """The bytes of every executable mapping (the vsyscall page cannot be read)."""
    out = {}
    for m in read_maps(pid):
        if m.executable and m.path != "[vsyscall]":
            try:
                out[(m.start, m.end, m.path)] = read_mem(pid, m.start, m.length)
            except OSError:
                pass
    return out


def maps_lines(pid: int) -> list[str]:
    with open(f"/proc/{pid}/maps") as f:
        return [" ".join(line.split()) for line in f]


def compare_code(before: dict, after: dict) -> list[str]:
    """What differs between two code snapshots, one line per mapping."""
    out = []
    for key, old in before.items():
        new = after.get(key)
        start, _, path = key
        if new is None:
            out.append(f"{path or 'anonymous'} at {start:#x}: no longer mapped")
        elif new != old:
            diff = [i for i in range(min(len(old), len(new))) if old[i] != new[i]]
            out.append(f"{path} at {start:#x}: {len(diff)} bytes differ, first at "
                       f"{start + diff[0]:#x}" if diff else f"{path}: length changed")  # fmt: skip
    out += [f"{k[2] or 'anonymous'} at {k[0]:#x}: new executable mapping"
            for k in after if k not in before]  # fmt: skip
    return out


def compare_maps(before: list[str], after: list[str]) -> dict[str, list[str]]:
    gone = [line for line in before if line not in after]
    new = [line for line in after if line not in before]
    return {"removed": gone, "added": new}


# -- grouping messages ---------------------------------------------------------------------------

_PREFIXES = {"lock", "rep", "repe", "repne", "bnd", "notrack", "xacquire", "xrelease", "data16"}


def group(msg: str) -> str:
    """A message without what differs from site to site: addresses, the
    instruction's operands (its mnemonic stays), sizes."""

    def mnemonic(m: re.Match[str]) -> str:
        words = m[1].split()
        keep = words[:2] if len(words) > 1 and words[0] in _PREFIXES else words[:1]
        return "'" + " ".join(keep) + "'"

    msg = re.sub(r"'((?:[0-9a-f]{2} ?)+)'", "'<bytes>'", msg)
    msg = re.sub(r"'([a-z][^']*)'", mnemonic, msg)
    msg = re.sub(r"0x[0-9a-fA-F]+", "ADDR", msg)
    msg = re.sub(r"\b\d+ bytes", "N bytes", msg)
    return re.sub(r"(process|pid|thread) \d+", r"\1 N", msg)


_FORMATTER = iced_x86.Formatter(iced_x86.FormatterSyntax.INTEL)


def insn_text(code: bytes, address: int) -> str:
    instr = iced_x86.Decoder(64, code, ip=address).decode()
    return _FORMATTER.format(instr) if instr.code != iced_x86.Code.INVALID else code[:8].hex(" ")


# -- one file ------------------------------------------------------------------------------------


@dataclass
class Tally:
    """The counts of one file."""

    sites: int = 0
    jump: int = 0
    trap: int = 0
    error: int = 0
    jump_fits: int = 0  # jumps whose window ends inside the enumerated function
    gdb_style: int = 0  # sites whose instruction has >= 5 bytes
    fits: int = 0  # sites whose 5-byte window ends inside the function
    notes: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    bugs: Counter = field(default_factory=Counter)
    # Traps for want of a trampoline address: by the displacement bytes the
    # covered instruction starts fix (and, planning, whether a trampoline
    # at the one page offset those bytes allow would cross the page end).
    unplaceable: Counter = field(default_factory=Counter)
    retried: int = 0  # sites tried again after reclaim() (see live_site)
    jump_after_reclaim: int = 0
    examples: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    add_ns: array = field(default_factory=lambda: array("q"))
    remove_ns: array = field(default_factory=lambda: array("q"))
    add_ns_by_kind: dict[str, array] = field(
        default_factory=lambda: {JUMP: array("q"), TRAP: array("q")}
    )
    # Other kinds of tracepoint (the kernel uprobe the session falls back to
    # where not even a trap can be relocated), with their reasons.
    other: Counter = field(default_factory=Counter)
    other_notes: Counter = field(default_factory=Counter)

    def example(self, key: str, **what: str) -> None:
        kept = self.examples.setdefault(key, [])
        if len(kept) < EXAMPLES:
            kept.append(what)

    def count_site(self, code: Code, i: int) -> None:
        self.sites += 1
        self.gdb_style += code.lengths[i] >= 5
        self.fits += code.fits[i]

    def as_dict(self) -> dict[str, Any]:
        n = self.sites or 1
        return {
            "sites": self.sites,
            "jump": self.jump,
            "trap": self.trap,
            "error": self.error,
            "jump_share": self.jump / n,
            "jump_within_function": self.jump_fits,
            "jump_within_function_share": self.jump_fits / n,
            "gdb_style": self.gdb_style,
            "gdb_style_share": self.gdb_style / n,
            "window_fits_function": self.fits,
            "trap_reasons": dict(self.notes.most_common()),
            "other_kinds": dict(self.other.most_common()),
            "other_reasons": dict(self.other_notes.most_common()),
            "unplaceable_jumps": dict(self.unplaceable.most_common()),
            "retried_after_reclaim": self.retried,
            "jump_after_reclaim": self.jump_after_reclaim,
            "errors": dict(self.errors.most_common()),
            "bugs": dict(self.bugs.most_common()),
            "examples": self.examples,
            "add_us": stats(self.add_ns),
            "remove_us": stats(self.remove_ns),
            "add_us_by_kind": {k: stats(v) for k, v in self.add_ns_by_kind.items()},
        }


def stats(ns: array) -> dict[str, float] | None:
    if not ns:
        return None
    us = [x / 1000 for x in ns]
    qs = statistics.quantiles(us, n=100) if len(us) > 1 else [us[0]] * 99
    return {
        "n": len(us),
        "mean": statistics.fmean(us),
        "median": statistics.median(us),
        "p90": qs[89],
        "p99": qs[98],
        "max": max(us),
    }


def choose_sites(code: Code, sample: int | None, seed: int) -> list[int]:
    """Indices of the sites to try: all, or ``sample`` at random, in address order."""
    n = len(code)
    if sample is None or sample >= n:
        return list(range(n))
    return sorted(random.Random(seed).sample(range(n), sample))


class Instance:
    """A target process for one file, its code as it was, and the file's bias."""

    def __init__(self, spec: Spec, code: Code, workdir: str) -> None:
        self.target = Target(spec, workdir)
        try:
            self.path = self.target.wait_idle(spec.file)
            maps = read_maps(self.target.pid)
            self.maps_before = maps_lines(self.target.pid)
            self.code_before = code_snapshot(self.target.pid)
            first = [m.start for m in maps if m.path == self.path and m.offset == 0]
            self.bias = min(first) - (code.min_vaddr & ~0xFFF)
            self.text = sorted((s, e, b) for (s, e, p), b in self.code_before.items()
                               if p == self.path)  # fmt: skip
            self.starts = [t[0] for t in self.text]
        except BaseException:
            self.target.kill()
            raise

    def original(self, address: int, size: int) -> bytes | None:
        """The bytes the file's code held at ``address`` before anything was done."""
        k = bisect.bisect_right(self.starts, address) - 1
        if k < 0:
            return None
        start, end, data = self.text[k]
        if address >= end:
            return None
        return data[address - start : address - start + size]


def run_file(spec: Spec, code: Code, picks: list[int], args: argparse.Namespace,
             workdir: str) -> dict[str, Any]:  # fmt: skip
    tally = Tally()
    inst = Instance(spec, code, workdir)
    restarts: list[dict[str, Any]] = []
    verification: dict[str, Any] = {}
    t0 = time.monotonic()
    last = t0
    try:
        session = None if args.plan_only else ProbeSession(inst.target.pid)
        modules = ProcessModules(inst.target.pid) if args.plan_only else None
        gaps = free_gaps(read_maps(inst.target.pid)) if args.plan_only else []
        done = 0
        for i in picks:
            tally.count_site(code, i)
            a = code.sites[i] + inst.bias
            if args.plan_only:
                assert modules is not None
                plan_site(inst, modules, gaps, a, code, i, tally)
            else:
                assert session is not None
                outcome = live_site(inst, session, a, code, i, tally)
                if outcome == "restart":
                    restarts.append({"site": f"{code.sites[i]:#x}", "pid": inst.target.pid})
                    inst.target.kill()
                    abandon(session)
                    inst = Instance(spec, code, workdir)
                    session = ProbeSession(inst.target.pid)
                elif (done + 1) % args.reclaim_every == 0 and not reclaim(inst, session, tally):
                    restarts.append({"site": f"{code.sites[i]:#x}", "pid": inst.target.pid})
                    inst.target.kill()
                    abandon(session)
                    inst = Instance(spec, code, workdir)
                    session = ProbeSession(inst.target.pid)
            done += 1
            now = time.monotonic()
            if now - last >= PROGRESS_EVERY:
                last = now
                rate = done / (now - t0)
                left = (len(picks) - done) / rate if rate else 0
                print(f"  {spec.name}: {done:,}/{len(picks):,} sites, "
                      f"{100 * tally.jump / max(tally.sites, 1):.2f}% jump, {rate:,.0f} sites/s, "
                      f"~{left / 60:.1f} min left", flush=True)  # fmt: skip
        if session is not None:
            verification = finish(inst, session, tally)
        elapsed = time.monotonic() - t0
    finally:
        inst.target.kill()
    out = tally.as_dict()
    out.update(
        name=spec.name,
        file=inst.path,
        target=" ".join(spec.argv),
        enumerated=len(code),
        elapsed_s=elapsed,
        pokes=inst.target.pokes,
        restarts=restarts,
        verification=verification,
    )
    return out


def abandon(s: ProbeSession) -> None:
    """Let go of a session whose target was killed (its /proc/PID/mem fd)."""
    try:
        s.close(wait=0)
    except Exception:  # the target is gone: nothing left to undo
        pass


def live_site(inst: Instance, s: ProbeSession, a: int, code: Code, i: int, tally: Tally) -> str:
    """Insert, check, remove, check at ``a``; "restart" when the target or the
    session cannot go on.

    A site is tried as if alone, as in Harper-Cyr's: when no trampoline address
    was free only because trampolines of removed tracepoints are still
    waiting for ``reclaim()`` (with 3-4 covered starts a jump has 1 or 256
    possible trampoline addresses, and those of neighbouring sites overlap),
    they are reclaimed and the site is tried once more (counted)."""
    orig = inst.original(a, 24)  # a window is at most 4 + 15 bytes
    if orig is None:
        tally.error += 1
        tally.errors["site outside the file's executable mapping"] += 1
        return "ok"
    link = f"{code.sites[i]:#x}"
    pending = bool(s.retired)
    outcome, tp = attempt(inst, s, a, orig, link, tally)
    if outcome == "placed" and tp is not None and pending and "no trampoline address" in tp.note:
        if not reclaim(inst, s, tally):
            return "restart"
        tally.retried += 1
        outcome, tp = attempt(inst, s, a, orig, link, tally)
        if tp is not None and tp.kind == JUMP:
            tally.jump_after_reclaim += 1
    if outcome != "placed" or tp is None:
        return outcome
    if tp.kind == JUMP:
        tally.jump += 1
        tally.jump_fits += code.fits[i]
    elif tp.kind == TRAP:
        tally.trap += 1
        key = group(tp.note) if tp.note else "(no note)"
        tally.notes[key] += 1
        tally.example(key, site=link, insn=insn_text(orig, a), where=tp.site.function,
                      note=tp.note)  # fmt: skip
        if "no trampoline address" in tp.note:
            tally.unplaceable[fixed_bytes(covered_starts(orig, a))] += 1
    else:
        tally.other[tp.kind] += 1
        key = f"{tp.kind}: {group(tp.note)}"
        tally.other_notes[key] += 1
        tally.example(key, site=link, insn=insn_text(orig, a), where=tp.site.function,
                      note=tp.note)  # fmt: skip
    return "ok"


def attempt(
    inst: Instance, s: ProbeSession, a: int, orig: bytes, link: str, tally: Tally
) -> tuple[str, Tracepoint | None]:
    """One add, check, remove, check: ("placed", the tracepoint), ("ok",
    None) after a ProbeError (counted), or ("restart", None)."""
    pid = inst.target.pid

    def bug(kind: str, detail: str) -> None:
        tally.bugs[kind] += 1
        tally.example(f"bug: {kind}", site=link, insn=insn_text(orig, a), detail=detail)

    t0 = time.perf_counter_ns()
    try:
        with WATCHDOG.bound(inst.target, "add"):
            tp = s.add(f"{a:#x}")
    except ProbeError as e:
        if WATCHDOG.fired:
            bug("add hung", f"{type(e).__name__}: {e}")
            return "restart", None
        tally.add_ns.append(time.perf_counter_ns() - t0)
        tally.error += 1
        key = group(str(e))
        tally.errors[key] += 1
        tally.example(key, site=link, insn=insn_text(orig, a), message=str(e))
        if not inst.target.alive():
            bug("target died", f"after a failed add: {e}")
            return "restart", None
        now = read_mem(pid, a, len(orig))
        if now != orig:
            bug("bytes changed by a failed add", f"{orig.hex()} -> {now.hex()}")
            return "restart", None
        return "ok", None
    except Exception as e:  # anything but ProbeError is a bug of the session
        bug("add hung" if WATCHDOG.fired else "exception from add", f"{type(e).__name__}: {e}")
        return "restart", None
    t1 = time.perf_counter_ns()
    tally.add_ns.append(t1 - t0)
    tally.add_ns_by_kind.setdefault(tp.kind, array("q")).append(t1 - t0)
    now = read_mem(pid, a, len(orig))
    n = len(tp.patched)
    problems = []
    if tp.kind not in (JUMP, TRAP):
        # A kernel uprobe: the kernel put int3 at the site, nothing else.
        if now[:1] != b"\xcc" or now[1:] != orig[1:]:
            problems.append(f"{tp.kind}: site reads {now[:8].hex()}, was {orig[:8].hex()}")
    else:
        if tp.original != orig[: len(tp.original)]:
            problems.append(f"tp.original {tp.original.hex()} is not the code {orig[:n].hex()}")
        if now[:n] != tp.patched:
            problems.append(f"site reads {now[:n].hex()}, tp.patched is {tp.patched.hex()}")
        if now[n:] != orig[n:]:
            problems.append(f"bytes after the patch changed: {orig[n:].hex()} -> {now[n:].hex()}")
    if tp.kind == JUMP:
        rel = int.from_bytes(now[1:5], "little", signed=True)
        if now[0] != 0xE9 or a + 5 + rel != tp.trampoline:
            problems.append(f"not a jmp to the trampoline {tp.trampoline:#x}: {now[:5].hex()}")
        covered = [p for p in tp.starts if 1 <= p <= 4 and now[p] != 0xCC]
        if covered:
            problems.append(f"covered instruction starts {covered} do not read int3")
    elif tp.kind == TRAP and tp.patched != b"\xcc":
        problems.append(f"a trap tracepoint patches {tp.patched.hex()}")
    for p in problems:
        bug("patch check failed", p)
    t2 = time.perf_counter_ns()
    try:
        with WATCHDOG.bound(inst.target, "remove"):
            s.remove(tp)
    except Exception as e:
        kind = "remove failed" if isinstance(e, ProbeError) else "exception from remove"
        bug("remove hung" if WATCHDOG.fired else kind, f"{type(e).__name__}: {e}")
        return "restart", None
    tally.remove_ns.append(time.perf_counter_ns() - t2)
    if not inst.target.alive():
        bug("target died", f"{tp.kind} tracepoint added and removed")
        return "restart", None
    now = read_mem(pid, a, len(orig))
    if now != orig:
        bug("bytes not restored by remove", f"{orig.hex()} -> {now.hex()}")
        return "restart", None
    return "placed", tp


def reclaim(inst: Instance, s: ProbeSession, tally: Tally) -> bool:
    """Free the retired trampolines; poke the target while one of its threads
    is parked in one (blocked in a displaced system call).  False when the
    target cannot go on."""
    for _ in range(20):
        try:
            with WATCHDOG.bound(inst.target, "reclaim"):
                if not s.retired or s.reclaim():
                    return True
        except Exception as e:
            what = "reclaim hung" if WATCHDOG.fired else f"{type(e).__name__} from reclaim"
            tally.bugs[what] += 1
            tally.example(f"bug: {what}", detail=str(e))
            return False
        inst.target.poke()
    tally.bugs["reclaim freed nothing after 20 pokes"] += 1
    return True


def finish(inst: Instance, s: ProbeSession, tally: Tally) -> dict[str, Any]:
    """Close the session and compare the target with what it was."""
    pid = inst.target.pid
    reclaim(inst, s, tally)
    out: dict[str, Any] = {"chunks_mapped_before_close": len(s.space.chunks)}
    if not inst.target.alive():
        tally.bugs["target died"] += 1
        return {**out, "alive": False}
    # Every tracepoint is removed: the code is the original already.
    code_diff = compare_code(inst.code_before, code_snapshot(pid))
    ours = {(k[0], k[1]) for k in code_snapshot(pid)} - {(k[0], k[1]) for k in inst.code_before}
    out["code_identical_before_close"] = not [d for d in code_diff if "new executable" not in d]
    if not out["code_identical_before_close"]:
        tally.bugs["code differs with every tracepoint removed"] += 1
    out["executable_mappings_of_hwtrace_before_close"] = len(ours)
    runtime = s.runtime
    try:
        with WATCHDOG.bound(inst.target, "close"):
            s.close(wait=10.0, on_wait=inst.target.poke)
    except Exception as e:
        what = "close() hung" if WATCHDOG.fired else f"{type(e).__name__} from close()"
        tally.bugs[what] += 1
        tally.example(f"bug: {what}", detail=f"{type(e).__name__}: {e}")
        out["close_error"] = f"{what}: {e}"
    time.sleep(0.05)
    alive = inst.target.alive()
    out.update(alive=alive, runtime_unmapped=bool(runtime) and s.runtime == 0)
    if not alive:
        if "close_error" not in out:  # else the watchdog killed it
            tally.bugs["target died in close()"] += 1
        return out
    code_diff = compare_code(inst.code_before, code_snapshot(pid))
    maps_diff = compare_maps(inst.maps_before, maps_lines(pid))
    out.update(code_identical=not code_diff, code_diff=code_diff,
               maps_identical=not (maps_diff["added"] or maps_diff["removed"]),
               maps_diff=maps_diff)  # fmt: skip
    if code_diff:
        tally.bugs["code differs after close"] += 1
    if maps_diff["added"] or maps_diff["removed"]:
        tally.bugs["maps differ after close"] += 1
    return out


def plan_site(inst: Instance, modules: ProcessModules, gaps: list[tuple[int, int]], a: int,
              code: Code, i: int, tally: Tally) -> None:  # fmt: skip
    """What ``add`` would decide at ``a``, with a fresh chunk in the target's gaps."""
    link = f"{code.sites[i]:#x}"
    t0 = time.perf_counter_ns()
    try:
        # As ProbeSession.resolve, _place and _allocate do, with no chunk mapped yet.
        site = resolve(modules, f"{a:#x}")
        if site.start and site.address != site.start:
            check_boundary(site, inst.original(site.start, a - site.start + 16) or b"")
        # A jump may run past its function, up to the end of the mapping (the
        # session's rule since the commit after 9148d24; "jump within fn"
        # counts the jumps that stay inside).
        mapping = modules.module_at(a)
        end = mapping.end if mapping is not None else a + 32
        data = inst.original(a, min(32, end - a)) or b""
        window, kind, note = choose_window(data, a, end)
        space = TrampolineSpace()
        spot = None
        if kind == JUMP:
            size, reach = trampoline_size(window), data_reach(window)
            spot = space.new_chunk(a, tuple(window.starts), size, gaps, reach)
            if spot is None:
                note = f"{a:#x}: no trampoline address within reach meets the constraint"
                tally.unplaceable[unplaceable_why(window, size)] += 1
                window, kind = decode_window(data, a, 1), TRAP
        if spot is None:
            spot = space.new_chunk(a, (), trampoline_size(window), gaps, data_reach(window))
        if spot is None:
            raise ProbeError(f"{a:#x}: no room for a trampoline within ±2 GiB")
        layout = lay_out(window, kind, spot[0])
        if len(layout.code) > trampoline_size(window):
            tally.bugs["relocated code larger than planned"] += 1
    except (ProbeError, SiteError, RelocationError) as e:
        tally.add_ns.append(time.perf_counter_ns() - t0)
        tally.error += 1
        key = group(str(e))
        tally.errors[key] += 1
        tally.example(key, site=link, insn=insn_text(inst.original(a, 16) or b"", a),
                      message=str(e))  # fmt: skip
        return
    except Exception as e:  # anything else is a bug of the planning layer
        tally.bugs[f"{type(e).__name__} from planning"] += 1
        tally.example(f"bug: {type(e).__name__}", site=link, detail=str(e))
        return
    dt = time.perf_counter_ns() - t0
    tally.add_ns.append(dt)
    tally.add_ns_by_kind[kind].append(dt)
    if kind == JUMP:
        tally.jump += 1
        tally.jump_fits += code.fits[i]
    else:
        tally.trap += 1
        key = group(note) if note else "(no note)"
        tally.notes[key] += 1
        tally.example(key, site=link, insn=insn_text(inst.original(a, 16) or b"", a),
                      where=site.function, note=note)  # fmt: skip


def covered_starts(code: bytes, address: int) -> tuple[int, ...]:
    """Offsets of the instruction starts a 5-byte jump at ``address`` covers."""
    out, off = [], 0
    for ins in iced_x86.Decoder(64, code, ip=address):
        if off >= 5 or ins.code == iced_x86.Code.INVALID:
            break
        out.append(off)
        off += ins.len
    return tuple(out)


def fixed_bytes(starts: tuple[int, ...]) -> str:
    fixed = [p for p in starts if 1 <= p <= 4]
    return "int3 at " + ",".join(f"+{p}" for p in fixed) if fixed else "no fixed byte"


def unplaceable_why(window: Window, size: int) -> str:
    """Why no trampoline address was found for a jump: with instruction
    starts at +1 and +2 the low 16 bits of rel32 are fixed, hence the
    trampoline's offset in its page, and a chunk has one page of code."""
    starts = tuple(window.starts)
    mask, pat = constraint(starts)
    what = fixed_bytes(starts)
    if mask & 0xFFF == 0xFFF:
        offset = (window.address + 5 + pat) & 0xFFF
        if offset + size > CHUNK_CODE:
            return f"{what}: the trampoline would cross its page's end"
    return f"{what}: no free gap in reach"


# -- report --------------------------------------------------------------------------------------


def pct(x: float) -> str:
    return f"{100 * x:.3f}%"  # 99.998% is not 100%


def report(results: list[dict[str, Any]], plan_only: bool) -> None:
    what = "planned (no patching)" if plan_only else "live: add, check, remove, check"
    timing = ("plan µs mean/med", "") if plan_only else ("add µs mean/med", "remove µs mean/med")
    headers = ("file", "sites", "jump", "trap", "other", "error", "jump %", "jump within fn %",
               "GDB-style (>=5 B) %", *timing, "bugs", "s")  # fmt: skip
    rows = []
    for r in results:
        a, d = r["add_us"], r["remove_us"]
        time_col = f"{a['mean']:.0f} / {a['median']:.0f}" if a else "-"
        rows.append((
            r["name"], f"{r['sites']:,}", f"{r['jump']:,}", f"{r['trap']:,}",
            ", ".join(f"{n:,} {k}" for k, n in r["other_kinds"].items()) or "0", f"{r['error']:,}",
            pct(r["jump_share"]), pct(r["jump_within_function_share"]),
            pct(r["gdb_style_share"]), time_col,
            "" if plan_only else (f"{d['mean']:.0f} / {d['median']:.0f}" if d else "-"),
            str(sum(r["bugs"].values())), f"{r['elapsed_s']:.0f}",
        ))  # fmt: skip
    common.print_table(
        f"Jump tracepoint coverage, every instruction of each function ({what})",
        headers,
        rows,
        width=170,
        title_justify="left",
    )
    rows = []
    for r in results:
        for kind, counts in (("trap", r["trap_reasons"]), ("other", r["other_reasons"]),
                             ("error", r["errors"]), ("BUG", r["bugs"])):  # fmt: skip
            for reason, n in counts.items():
                ex = r["examples"].get(reason) or r["examples"].get(f"bug: {reason}") or [{}]
                e = ex[0]
                example = f"{e.get('site', '')} {e.get('insn', '')}".strip() or e.get("detail", "")
                rows.append((r["name"], kind, reason[:110], f"{n:,}", example[:60]))
    if rows:
        common.print_table("Why not a jump (grouped; example at its link address)",
                           ("file", "outcome", "reason", "sites", "example"), rows, width=220,
                           title_justify="left")  # fmt: skip
    if not plan_only:
        for r in results:
            v = r["verification"]
            if not v:
                continue
            print(f"{r['name']}: every tracepoint removed: code identical "
                  f"{v.get('code_identical_before_close')}; after close(): target alive "
                  f"{v.get('alive')}, code identical {v.get('code_identical')}, maps identical "
                  f"{v.get('maps_identical')}, runtime unmapped {v.get('runtime_unmapped')}; "
                  f"{r['pokes']} pokes, {len(r['restarts'])} restarts")  # fmt: skip
            if v.get("close_error"):
                print(f"    {v['close_error']}")
            for line in v.get("code_diff", [])[:5]:
                print(f"    code: {line}")
            for k in ("added", "removed"):
                for line in v.get("maps_diff", {}).get(k, [])[:5]:
                    print(f"    maps {k}: {line}")


def machine() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def probes_source() -> dict[str, str]:
    """The commit and a digest of src/hwtrace/probes as run (it may hold
    changes not committed yet)."""
    h = hashlib.sha256()
    for p in sorted((REPO / "src" / "hwtrace" / "probes").glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                       text=True, check=False)  # fmt: skip
    return {"commit": r.stdout.strip(), "probes_sha256": h.hexdigest()[:16]}


cpu_model = common.cpu_model


# -- the run -------------------------------------------------------------------------------------


def apt_install(package: str) -> None:
    print(f"installing {package} (apt-get)", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if r.returncode != 0:
            raise BenchError(f"{' '.join(cmd)}: {r.stderr.strip().splitlines()[-1:]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--files", default=",".join(DEFAULT_FILES),
                    help=f"comma-separated, of {', '.join(catalog())}")  # fmt: skip
    ap.add_argument("--sample", type=int, help="sites per file, at random (default: all)")
    ap.add_argument("--seed", type=int, default=1, help="of the sample")
    ap.add_argument("--plan-only", action="store_true", help="plan every site, patch nothing")
    ap.add_argument("--reclaim-every", type=int, default=RECLAIM_EVERY, metavar="N")
    ap.add_argument("--no-install", action="store_true", help="never apt-get install")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    specs = catalog()
    names = [n.strip() for n in args.files.split(",") if n.strip()]
    if unknown := [n for n in names if n not in specs]:
        ap.error(f"unknown file(s) {unknown}; known: {', '.join(specs)}")
    if (args.sample is not None and args.sample < 1) or args.reclaim_every < 1:
        ap.error("--sample and --reclaim-every must be positive")
    if args.json is None:
        args.json = OUT / ("probe_coverage-plan.json" if args.plan_only else "probe_coverage.json")
    return common.bench_main(
        "probe_coverage",
        lambda: run(args, [specs[n] for n in names]),
        interrupted="targets killed",
    )


def run(args: argparse.Namespace, specs: list[Spec]) -> int:
    t_start = time.monotonic()
    source = probes_source()  # as imported: the tree may change while this runs
    results: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="probe_coverage-") as workdir:
        for spec in specs:
            why = spec.available()
            if why and spec.package and not args.no_install and os.geteuid() == 0:
                apt_install(spec.package)
                why = spec.available()
            if why:
                print(f"{spec.name}: skipped: {why}", flush=True)
                skipped[spec.name] = why
                continue
            # The file as the target maps it (a library is found in its maps).
            probe = Target(spec, workdir)
            try:
                path = probe.wait_idle(spec.file)
            finally:
                probe.kill()
            t0 = time.monotonic()
            code = enumerate_code(path)
            t_enum = time.monotonic() - t0
            picks = choose_sites(code, args.sample, args.seed)
            print(f"{spec.name}: {path}: {len(code):,} instructions in {code.ranges:,} "
                  f"functions ({code.ranges_symbols:,} symbols, {code.ranges_fde:,} FDEs; "
                  f"{code.bytes_swept:,} of {code.text_size:,} .text bytes), enumerated in "
                  f"{t_enum:.1f} s; trying {len(picks):,} sites in `{' '.join(spec.argv)}`",
                  flush=True)  # fmt: skip
            r = run_file(spec, code, picks, args, workdir)
            r["enumeration"] = {
                "functions": code.ranges,
                "symbol_ranges": code.ranges_symbols,
                "fde_ranges": code.ranges_fde,
                "bytes_swept": code.bytes_swept,
                "text_size": code.text_size,
                "sweeps_stopped_undecodable": code.undecodable,
                "seconds": t_enum,
            }
            results.append(r)
            write_json(args, source, results, skipped, t_start, complete=False)
            print(f"  {spec.name}: {pct(r['jump_share'])} jump, {r['trap']:,} trap, "
                  f"{r['error']:,} error, {sum(r['bugs'].values())} bugs, "
                  f"{r['elapsed_s']:.0f} s", flush=True)  # fmt: skip
    print()
    if results:
        report(results, args.plan_only)
    write_json(args, source, results, skipped, t_start, complete=True)
    bugs = sum(sum(r["bugs"].values()) for r in results)
    return 1 if bugs else 0


def write_json(args: argparse.Namespace, source: dict[str, str], results: list[dict[str, Any]],
               skipped: dict[str, str], t_start: float, *, complete: bool) -> None:  # fmt: skip
    """The results so far (after each file, so that a long run cut short
    keeps what it measured)."""
    elapsed = time.monotonic() - t_start
    doc = {
        "complete": complete,
        "benchmark": "probe_coverage",
        "mode": "plan-only" if args.plan_only else "live",
        "what": "share of instruction sites where hwtrace.probes places a jump tracepoint",
        "sites": "every instruction of every function (.symtab/.dynsym sized function symbols "
        "and .eh_frame FDEs), linear sweep with iced-x86",
        "config": {"sample": args.sample, "seed": args.seed, "reclaim_every": args.reclaim_every},
        "machine": machine(),
        "probes_source": source,
        # dyntrace, GDB fast tracepoints, sites (Harper-Cyr, Table 4.4).
        "thesis_table_4_4": {
            "random": [310, 73, 311],
            "nano": [37698, 742, 38092],
            "firefox": [13076, 187, 14004],
        },
        "files": results,
        "skipped": skipped,
        "elapsed_s": elapsed,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    if complete:
        shown = args.json.relative_to(REPO) if args.json.is_relative_to(REPO) else args.json
        print(f"wrote {shown} ({elapsed:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
