"""Single-step a real process inside chosen functions or address ranges.

The tracee runs at full speed outside the ranges.  ``int3`` breakpoints sit
at every range's start and at the resume points of the frames that left a
range (the return address of a call that went outside, the interrupted
instruction of a signal whose handler is outside); when one is hit, every
breakpoint is taken out again and the compiled loop of
:func:`hwtrace.record._native.step_loop` single-steps the tracee, logging
each instruction's address, the stepping clock and the registers, until an
instruction outside the ranges is next.  Then the breakpoints go back in and
the tracee runs free.  That is what an Intel PT address filter shows: tracing
on inside the ranges, off outside them.

Signals are passed through to the tracee.  A signal stop while stepping
means the logged instruction has not run yet; the signal is delivered with a
single step, after which the tracee is either in its handler (the
instruction did not run: an interrupt, logged as such when the handler is
inside the ranges, else a range exit with a resume point at the interrupted
instruction), or past the instruction (the signal was ignored), or gone.

The log is the state before each executed instruction, in order, with
:class:`Segment` rows saying where each stretch of tracing began and how it
ended.  Python handles only these transitions; the stepping itself never
runs in the interpreter.

Limits: one thread (an attached process with several threads is refused; a
launched process that starts a thread ends the recording there); a range is
noticed when entered at its start or at a resume point (not when jumped into
from outside elsewhere); ``int3`` executed by the tracee inside a range is
taken for a single-step trap.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..image import ImageError, read_elf
from . import _native as nat

__all__ = [
    "END_EXIT",
    "END_LEFT",
    "END_LIMIT",
    "END_SIGNAL",
    "END_STOPPED",
    "Mapping",
    "RecordError",
    "Segment",
    "StepLog",
    "TracedRange",
    "read_maps",
    "step_process",
]

# How a traced segment ended.
END_LEFT = "left"  # a branch, call or return went outside the ranges
END_SIGNAL = "signal"  # a signal handler outside the ranges interrupted it
END_EXIT = "exit"  # the process exited (or was killed) inside the ranges
END_LIMIT = "limit"  # the instruction limit was reached
END_STOPPED = "stopped"  # recording stopped (exec, a new thread)

REGISTERS_ALL = nat.REGISTER_NAMES
REGISTERS_BASIC = ("rip", "rsp", "eflags")

AT_ENTRY = 9
_PAGE = 0x1000


class RecordError(Exception):
    """The process could not be recorded (a clear message, no traceback needed)."""


@dataclass(frozen=True)
class Mapping:
    """One line of ``/proc/PID/maps``."""

    start: int
    end: int
    prot: str  # "r-xp"
    offset: int  # file offset (page offset * page size)
    inode: int
    path: str  # "" for anonymous memory, "[vdso]", "[stack]" ...

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def executable(self) -> bool:
        return "x" in self.prot


@dataclass(frozen=True)
class TracedRange:
    """``[start, end)``, named after the function it covers (or ``""``)."""

    start: int
    end: int
    name: str = ""


@dataclass(frozen=True)
class Segment:
    """Rows ``start .. end`` of the log were traced without a break.

    ``end_ip`` is where execution went after row ``end - 1`` (0 when the
    process exited there; for a signal handled outside the ranges, the
    interrupted instruction, where execution resumes), ``end_time`` when that was seen (stepping clock),
    ``end_reason`` one of the ``END_*`` strings and ``interrupts`` the
    signals delivered inside the segment to handlers inside the ranges:
    ``(row of the handler's first instruction, interrupted IP, signal)``.
    """

    start: int
    end: int
    end_ip: int
    end_time: int
    end_reason: str
    interrupts: tuple[tuple[int, int, int], ...] = ()


@dataclass
class StepLog:
    """What the stepper saw: one row per executed instruction inside the ranges."""

    ips: np.ndarray  # uint64
    times: np.ndarray  # uint64, stepping clock before the instruction ran
    registers: np.ndarray  # uint64 (rows, len(register_names))
    register_names: tuple[str, ...]
    segments: list[Segment]
    ranges: list[TracedRange]
    pid: int
    comm: str
    argv: tuple[str, ...] | None  # None when attached
    maps: list[Mapping]
    clock: str  # "tsc" or "monotonic"
    code: dict[int, bytes]  # range start -> the range's code (+16 bytes), read before tracing
    exit_status: int | None = None  # wait status when the process ended while recorded
    signals: list[tuple[int, int, bool]] = field(default_factory=list)  # (row, signal, caught)
    stopped_because: str = ""
    clock_pairs: list[tuple[int, int]] = field(default_factory=list)  # (stepping clock, ns)

    def register(self, name: str) -> np.ndarray:
        """One register's column, e.g. ``log.register("rsp")``."""
        try:
            return self.registers[:, self.register_names.index(name)]
        except ValueError:
            raise KeyError(f"register {name!r} was not logged") from None

    def read_code(self, address: int, size: int) -> bytes:
        """Code bytes of the ranges as they were before tracing (b"" elsewhere)."""
        for start, data in self.code.items():
            if start <= address < start + len(data):
                off = address - start
                return data[off : off + size]
        return b""


# -- /proc -------------------------------------------------------------------


def read_maps(pid: int) -> list[Mapping]:
    """The mappings of a process (``/proc/PID/maps``)."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = parts[0].split("-")
            out.append(
                Mapping(
                    start=int(lo, 16),
                    end=int(hi, 16),
                    prot=parts[1],
                    offset=int(parts[2], 16),
                    inode=int(parts[4]),
                    path=parts[5].strip() if len(parts) > 5 else "",
                )
            )
    return out


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _caught_signals(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigCgt:"):
                return int(line.split()[1], 16)
    return 0


def _auxv_entry(pid: int) -> int:
    with open(f"/proc/{pid}/auxv", "rb") as f:
        raw = f.read()
    data = np.frombuffer(raw[: len(raw) // 8 * 8], dtype=np.uint64)
    for k in range(0, data.shape[0] - 1, 2):
        if int(data[k]) == AT_ENTRY:
            return int(data[k + 1])
    raise RecordError(f"process {pid}: no AT_ENTRY in /proc/{pid}/auxv")


def _load_bias(maps: list[Mapping], path: str, min_vaddr: int) -> int | None:
    """Where the ELF file ``path`` is loaded: address minus link address."""
    first = [m for m in maps if m.path == path and m.offset == 0]
    if not first:
        return None
    return min(m.start for m in first) - (min_vaddr & ~(_PAGE - 1))


def resolve_functions(pid: int, maps: list[Mapping], functions: Sequence[str]) -> list[TracedRange]:
    """Address ranges of functions named ``name`` or ``module!name`` (module:
    a mapped file's base name, e.g. ``libc.so.6``), from the ELF symbols of the
    files mapped executable in the process, relocated by their load bias.  A
    plain name is looked up in the main executable first, then in the others.
    """
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    files = []
    for m in maps:
        if m.executable and m.path.startswith("/") and m.path not in files:
            files.append(m.path)
    files.sort(key=lambda p: p != exe)
    out: list[TracedRange] = []
    tables = {}
    for spec in functions:
        module, _, name = spec.rpartition("!")
        found = None
        for path in files:
            if module and os.path.basename(path) != module:
                continue
            if path not in tables:
                try:
                    elf = read_elf(path)
                except ImageError:
                    tables[path] = None
                    continue
                bias = _load_bias(maps, path, elf.min_vaddr)
                tables[path] = None if bias is None else (elf.symbols.functions, bias)
            entry = tables[path]
            if entry is None:
                continue
            table, bias = entry
            for start, size, sym, _ in table:
                if sym == name and size > 0:
                    found = TracedRange(start + bias, start + bias + size, spec)
                    break
            if found:
                break
        if found is None:
            where = f"in {module}" if module else "in the mapped files"
            raise RecordError(f"function {name!r} not found {where} of process {pid}")
        out.append(found)
    return out


# -- the tracee ----------------------------------------------------------------


def _describe_status(status: int) -> str:
    if os.WIFEXITED(status):
        return f"exited with status {os.WEXITSTATUS(status)}"
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"wait status {status:#x}"


class _Tracee:
    def __init__(self, pid: int, launched: bool) -> None:
        self.pid = pid
        self.launched = launched
        self.status = np.zeros(2, np.int32)
        self.regs = np.zeros(nat.N_REGS, np.uint64)
        self.siginfo = np.zeros(16, np.uint64)
        self.mem = os.open(f"/proc/{pid}/mem", os.O_RDWR)
        self.alive = True

    def close(self) -> None:
        if self.mem >= 0:
            os.close(self.mem)
            self.mem = -1

    def check(self, r: int, what: str) -> int:
        if r < 0:
            raise RecordError(f"process {self.pid}: {what} failed: {os.strerror(-r)}")
        return r

    def wait(self) -> int:
        while True:
            r = nat.wait4(self.pid, self.status, nat.WALL)
            if r != -errno.EINTR:
                break
        self.check(r, "waitpid")
        s = int(self.status[0])
        if os.WIFEXITED(s) or os.WIFSIGNALED(s):
            self.alive = False
        return s

    def getregs(self) -> np.ndarray:
        self.check(nat.ptrace(nat.PTRACE_GETREGS, self.pid, 0, self.regs.ctypes.data), "GETREGS")
        return self.regs

    def setregs(self) -> None:
        self.check(nat.ptrace(nat.PTRACE_SETREGS, self.pid, 0, self.regs.ctypes.data), "SETREGS")

    def cont(self, sig: int = 0) -> None:
        self.check(nat.ptrace(nat.PTRACE_CONT, self.pid, 0, sig), "PTRACE_CONT")

    def step(self, sig: int = 0) -> None:
        self.check(nat.ptrace(nat.PTRACE_SINGLESTEP, self.pid, 0, sig), "PTRACE_SINGLESTEP")

    def group_stop(self) -> bool:
        """Whether the current stop is a group-stop (no signal to deliver)."""
        r = nat.ptrace(nat.PTRACE_GETSIGINFO, self.pid, 0, self.siginfo.ctypes.data)
        return r == -errno.EINVAL

    def read(self, address: int, size: int) -> bytes:
        try:
            return os.pread(self.mem, size, address)
        except OSError:
            return b""

    def write(self, address: int, data: bytes) -> None:
        try:
            os.pwrite(self.mem, data, address)
        except OSError as exc:
            raise RecordError(
                f"process {self.pid}: cannot write a breakpoint at {address:#x}: {exc.strerror}"
            ) from None

    def read_u64(self, address: int) -> int | None:
        data = self.read(address, 8)
        return int.from_bytes(data, "little") if len(data) == 8 else None


def _launch(argv: Sequence[str]) -> _Tracee:
    """fork, PTRACE_TRACEME, exec: the child stops at its exec."""
    if not argv:
        raise RecordError("no command to run")
    exe = shutil.which(argv[0]) if "/" not in argv[0] else argv[0]
    if exe is None or not os.path.isfile(exe):
        raise RecordError(f"{argv[0]}: command not found")
    if not os.access(exe, os.X_OK):
        raise RecordError(f"{argv[0]}: not executable")
    nat.warm_up()
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    rfd, wfd = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(rfd)
            if libc.ptrace(nat.PTRACE_TRACEME, 0, None, None) != 0:
                os.write(wfd, f"PTRACE_TRACEME: {os.strerror(ctypes.get_errno())}".encode())
                os._exit(126)
            os.execv(exe, list(argv))
        except BaseException as exc:
            try:
                os.write(wfd, str(exc).encode()[:500])
            finally:
                os._exit(127)
    os.close(wfd)
    status = np.zeros(2, np.int32)
    while nat.wait4(pid, status, nat.WALL) == -errno.EINTR:
        pass
    s = int(status[0])
    why = os.read(rfd, 1000).decode(errors="replace")
    os.close(rfd)
    if not os.WIFSTOPPED(s):
        raise RecordError(
            f"{argv[0]}: could not start it under ptrace: {why or _describe_status(s)}"
        )
    tracee = _Tracee(pid, launched=True)
    opts = nat.PTRACE_O_EXITKILL | nat.PTRACE_O_TRACEEXEC | PTRACE_O_TRACECLONE
    tracee.check(nat.ptrace(nat.PTRACE_SETOPTIONS, pid, 0, opts), "PTRACE_SETOPTIONS")
    return tracee


PTRACE_O_TRACECLONE = 0x8
PTRACE_EVENT_CLONE = 3


def _attach(pid: int) -> _Tracee:
    if not os.path.isdir(f"/proc/{pid}"):
        raise RecordError(f"no process {pid}")
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError as exc:
        raise RecordError(f"process {pid}: {exc.strerror}") from None
    if len(threads) != 1:
        raise RecordError(
            f"process {pid} has {len(threads)} threads; the software recorder traces "
            "single-threaded processes"
        )
    nat.warm_up()
    r = nat.ptrace(nat.PTRACE_ATTACH, pid, 0, 0)
    if r < 0:
        hint = ""
        if r in (-errno.EPERM, -errno.EACCES):
            hint = (
                " (ptrace not permitted: see /proc/sys/kernel/yama/ptrace_scope or CAP_SYS_PTRACE)"
            )
        raise RecordError(f"cannot attach to process {pid}: {os.strerror(-r)}{hint}")
    tracee = _Tracee(pid, launched=False)
    # Wait for the SIGSTOP of the attach; other signals arriving first are kept.
    pending = []
    while True:
        s = tracee.wait()
        if not tracee.alive:
            raise RecordError(f"process {pid} {_describe_status(s)} while attaching")
        sig = os.WSTOPSIG(s)
        if sig == signal.SIGSTOP:
            break
        pending.append(sig)
        tracee.cont(0)
    for sig in pending:  # pragma: no cover - rare: re-raise what we swallowed
        os.kill(pid, sig)
    opts = nat.PTRACE_O_TRACEEXEC | PTRACE_O_TRACECLONE
    tracee.check(nat.ptrace(nat.PTRACE_SETOPTIONS, pid, 0, opts), "PTRACE_SETOPTIONS")
    return tracee


# -- the recorder ----------------------------------------------------------------


class _Recorder:
    def __init__(
        self,
        tracee: _Tracee,
        ranges: list[TracedRange],
        clock: str,
        register_names: tuple[str, ...],
        max_instructions: int | None,
    ) -> None:
        self.t = tracee
        self.ranges = ranges
        self.lo = np.array([r.start for r in ranges], np.uint64)
        self.hi = np.array([r.end for r in ranges], np.uint64)
        self.clock = nat.CLOCK_TSC if clock == "tsc" else nat.CLOCK_MONO
        self.names = register_names
        self.cols = np.array([nat.REGISTER_NAMES.index(n) for n in register_names], np.int64)
        self.limit = max_instructions if max_instructions is not None else (1 << 62)
        cap = 1 << 14
        self.ips = np.zeros(cap, np.uint64)
        self.times = np.zeros(cap, np.uint64)
        self.regs = np.zeros((cap, len(self.cols)), np.uint64)
        self.n = 0
        self.scratch = np.zeros(nat.N_REGS, np.uint64)
        self.state = np.zeros(4, np.int64)
        self.segments: list[Segment] = []
        self.seg_start = 0
        self.interrupts: list[tuple[int, int, int]] = []
        self.signals: list[tuple[int, int, bool]] = []
        self.pending: dict[int, list[int]] = {}  # resume point -> expected rsp values
        self.entries = sorted({r.start for r in ranges})
        self.armed: dict[int, bytes] = {}
        self.exit_status: int | None = None
        self.stopped_because = ""
        self.ts = np.zeros(2, np.int64)

    # -- breakpoints --

    def in_ranges(self, ip: int) -> bool:
        return any(r.start <= ip < r.end for r in self.ranges)

    def arm(self) -> None:
        points = set(self.entries) | set(self.pending)
        for a in points:
            orig = self.t.read(a, 1)
            if len(orig) != 1:
                raise RecordError(f"process {self.t.pid}: cannot read code at {a:#x}")
            self.armed[a] = orig
            self.t.write(a, b"\xcc")

    def disarm(self) -> None:
        if self.t.alive:
            for a, orig in self.armed.items():
                self.t.write(a, orig)
        self.armed.clear()

    def now(self) -> int:
        return int(nat.rdtsc()) if self.clock == nat.CLOCK_TSC else int(nat.monotonic_ns(self.ts))

    # -- segments --

    def close_segment(self, end_ip: int, end_time: int, reason: str) -> None:
        if self.n > self.seg_start:
            self.segments.append(
                Segment(self.seg_start, self.n, end_ip, end_time, reason, tuple(self.interrupts))
            )
        self.seg_start = self.n
        self.interrupts = []

    def grow(self) -> None:
        cap = self.ips.shape[0] * 2
        self.ips = np.resize(self.ips, cap)
        self.times = np.resize(self.times, cap)
        regs = np.zeros((cap, self.regs.shape[1]), np.uint64)
        regs[: self.n] = self.regs[: self.n]
        self.regs = regs

    # -- the two modes --

    def run(self) -> None:
        regs = self.t.getregs()
        stepping = self.in_ranges(int(regs[nat.R_RIP]))
        sig = 0
        while self.t.alive and not self.stopped_because:
            if stepping:
                sig = 0
                stepping = self.step()
            else:
                stepping, sig = self.run_free(sig)

    def run_free(self, sig: int) -> tuple[bool, int]:
        """Run at full speed until a breakpoint is hit; True when stepping starts."""
        self.arm()
        while True:
            self.t.cont(sig)
            sig = 0
            s = self.t.wait()
            if not self.t.alive:
                self.armed.clear()
                self.exit_status = s
                return False, 0
            stopsig = os.WSTOPSIG(s)
            event = (s >> 16) & 0xFF
            if event:
                self.disarm()
                if self.handle_event(event):
                    return False, 0
                self.arm()
                continue
            if stopsig == signal.SIGTRAP:
                regs = self.t.getregs()
                at = int(regs[nat.R_RIP]) - 1
                if at in self.armed:
                    self.disarm()
                    regs[nat.R_RIP] = at
                    self.t.setregs()
                    self.consume_resume_point(at, int(regs[nat.R_RSP]))
                    return True, 0
            if self.t.group_stop():
                continue
            sig = stopsig  # pass it through

    def consume_resume_point(self, at: int, rsp: int) -> None:
        """Forget the resume points of frames at or below the current one."""
        for a in list(self.pending):
            keep = [e for e in self.pending[a] if e > rsp or (e == rsp and a != at)]
            if keep:
                self.pending[a] = keep
            else:
                del self.pending[a]

    def handle_event(self, event: int) -> bool:
        """A ptrace event stop: True when recording ends."""
        if event == nat.PTRACE_EVENT_EXEC:
            self.stopped_because = "the process called exec"
            return True
        if event == PTRACE_EVENT_CLONE:
            msg = np.zeros(1, np.uint64)
            self.t.check(nat.ptrace(0x4201, self.t.pid, 0, msg.ctypes.data), "GETEVENTMSG")
            child = int(msg[0])
            st = np.zeros(2, np.int32)
            while nat.wait4(child, st, nat.WALL) == -errno.EINTR:
                pass
            nat.ptrace(nat.PTRACE_DETACH, child, 0, 0)
            self.stopped_because = "the process started a thread"
            return True
        return False

    def step(self) -> bool:
        """Step inside the ranges; True when stepping goes on."""
        n, why = nat.step_loop(
            self.t.pid, self.ips, self.times, self.regs, self.cols, self.n,
            min(self.limit, self.ips.shape[0]), self.lo, self.hi, self.clock,
            self.scratch, self.state,
        )  # fmt: skip
        self.n = int(n)
        if why == nat.STOP_FULL:
            if self.n >= self.limit:
                self.close_segment(int(self.scratch[nat.R_RIP]), int(self.state[1]), END_LIMIT)
                self.stopped_because = f"the instruction limit ({self.limit}) was reached"
                return False
            self.grow()
            return True
        if why == nat.STOP_LEFT:
            rip = int(self.scratch[nat.R_RIP])
            rsp = int(self.scratch[nat.R_RSP])
            self.note_call(rsp)
            self.close_segment(rip, int(self.state[1]), END_LEFT)
            return False
        if why == nat.STOP_EXIT:
            s = int(self.state[0])
            self.t.alive = False
            self.exit_status = s
            end_ip = 0  # the last instruction ended the process (exit_group)
            if os.WIFSIGNALED(s) and self.n > self.seg_start:
                self.n -= 1  # killed before the instruction completed
                end_ip = int(self.ips[self.n])
            self.close_segment(end_ip, self.now(), END_EXIT)
            return False
        if why == nat.STOP_SIGNAL:
            return self.deliver(int(self.state[0]))
        raise RecordError(
            f"process {self.t.pid}: ptrace failed: {os.strerror(-int(self.state[0]))}"
        )

    def note_call(self, rsp: int) -> None:
        """If the last stepped instruction was a call leaving the ranges, the
        frame resumes at its return address: a resume point."""
        if self.n <= self.seg_start:
            return
        last = self.n - 1
        prev_ip = int(self.ips[last])
        prev_rsp = int(self.regs[last, self.names.index("rsp")])
        if rsp != prev_rsp - 8:
            return
        ret = self.t.read_u64(rsp)
        if ret is None or not (prev_ip < ret <= prev_ip + 15) or not self.in_ranges(ret):
            return
        self.pending.setdefault(ret, []).append(prev_rsp)

    def deliver(self, s: int) -> bool:
        """A signal stop while stepping: the last logged instruction has not
        run.  Deliver the signal(s) with a single step and see where the
        tracee went; True when stepping goes on."""
        row = self.n - 1
        x = int(self.ips[row]) if row >= self.seg_start else int(self.t.getregs()[nat.R_RIP])
        x_rsp = int(self.t.getregs()[nat.R_RSP])
        caught_any = False
        while True:
            event = (s >> 16) & 0xFF
            sig = os.WSTOPSIG(s)
            if event:
                if self.handle_event(event):
                    self.close_segment(x, self.now(), END_STOPPED)
                    return False
                sig = 0
            elif self.t.group_stop():
                sig = 0
            else:
                caught = bool(_caught_signals(self.t.pid) >> (sig - 1) & 1)
                caught_any = caught_any or caught
                self.signals.append((row, sig, caught))
            self.t.step(sig)
            s = self.t.wait()
            if not self.t.alive:
                self.exit_status = s
                end_ip = 0
                if row >= self.seg_start and (caught_any or os.WIFSIGNALED(s)):
                    self.n -= 1  # killed by the signal: the instruction did not run
                    end_ip = x
                self.close_segment(end_ip, self.now(), END_EXIT)
                return False
            if os.WSTOPSIG(s) == signal.SIGTRAP and not (s >> 16) & 0xFF:
                break
        if not caught_any:
            return True  # the instruction ran; go on from where it went
        if row >= self.seg_start:
            self.n -= 1  # it did not run: the handler came first
        regs = self.t.getregs()
        handler = int(regs[nat.R_RIP])
        # The handler's sigreturn resumes the interrupted instruction.
        self.pending.setdefault(x, []).append(x_rsp)
        if self.in_ranges(handler):
            if self.n > self.seg_start:
                self.interrupts.append((self.n, x, self.signals[-1][1]))
            return True
        # As an asynchronous disable: FUP(interrupted IP) + TIP.PGD.
        self.close_segment(x, self.now(), END_SIGNAL)
        return False

    def finish(self) -> None:
        """Take the breakpoints out and let the process go."""
        self.disarm()
        if not self.t.alive:
            return
        if self.t.launched:
            # Run it to its end untraced (signals passed through).
            sig = 0
            while True:
                self.t.cont(sig)
                s = self.t.wait()
                if not self.t.alive:
                    self.exit_status = s
                    return
                sig = 0 if (s >> 16) & 0xFF or self.t.group_stop() else os.WSTOPSIG(s)
                if (s >> 16) & 0xFF == PTRACE_EVENT_CLONE:
                    self.handle_event(PTRACE_EVENT_CLONE)
        else:
            nat.ptrace(nat.PTRACE_DETACH, self.t.pid, 0, 0)


def _read_range_code(tracee: _Tracee, ranges: list[TracedRange]) -> dict[int, bytes]:
    code = {}
    for r in ranges:
        data = tracee.read(r.start, r.end - r.start + 16)
        if len(data) < r.end - r.start:
            raise RecordError(
                f"range {r.start:#x}-{r.end:#x} is not mapped in process {tracee.pid}"
            )
        code[r.start] = data
    return code


def _clock_pair(clock: str, ts: np.ndarray) -> tuple[int, int]:
    """(stepping clock, CLOCK_MONOTONIC ns) read together."""
    a = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    c = int(nat.rdtsc()) if clock == "tsc" else int(nat.monotonic_ns(ts))
    b = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    return c, (a + b) // 2


def step_process(
    target: Sequence[str] | int,
    *,
    functions: Sequence[str] = (),
    ranges: Sequence[tuple[int, int]] = (),
    clock: str = "tsc",
    registers: str = "all",
    max_instructions: int | None = None,
) -> StepLog:
    """Run ``target`` (an argv list to launch, or a pid to attach to) and
    single-step it inside ``functions`` (``name`` or ``module!name``) and
    ``ranges`` (``(start, end)`` addresses, end exclusive).

    ``clock``: ``"tsc"`` (``rdtsc``) or ``"monotonic"`` (CLOCK_MONOTONIC ns);
    ``registers``: ``"all"`` (the 27 of ``user_regs_struct``) or ``"basic"``
    (rip, rsp, eflags); ``max_instructions``: stop stepping after that many
    (the process then runs on untraced).  A launched process runs to its
    end; an attached one is detached when recording stops or it exits.
    """
    if clock not in ("tsc", "monotonic"):
        raise RecordError(f"unknown clock {clock!r} (tsc or monotonic)")
    if registers not in ("all", "basic"):
        raise RecordError(f"unknown register set {registers!r} (all or basic)")
    if not functions and not ranges:
        raise RecordError("nothing to trace: give functions or address ranges")
    for lo, hi in ranges:
        if not 0 <= lo < hi < 1 << 64:
            raise RecordError(f"bad address range {lo:#x}-{hi:#x}")
    if max_instructions is not None and max_instructions < 1:
        raise RecordError("max_instructions must be positive")
    names = REGISTERS_ALL if registers == "all" else REGISTERS_BASIC
    if isinstance(target, int):
        tracee = _attach(target)
        argv = None
    else:
        tracee = _launch(list(target))
        argv = tuple(target)
    try:
        if tracee.launched:
            # Run to the program's entry so its libraries are mapped.
            entry = _auxv_entry(tracee.pid)
            orig = tracee.read(entry, 1)
            tracee.write(entry, b"\xcc")
            tracee.cont(0)
            s = tracee.wait()
            if not tracee.alive or os.WSTOPSIG(s) != signal.SIGTRAP:
                raise RecordError(
                    f"{argv[0]}: did not reach its entry point: {_describe_status(s)}"
                )
            tracee.write(entry, orig)
            regs = tracee.getregs()
            regs[nat.R_RIP] = entry
            tracee.setregs()
        maps = read_maps(tracee.pid)
        comm = _comm(tracee.pid)
        traced = resolve_functions(tracee.pid, maps, functions) if functions else []
        traced += [TracedRange(lo, hi) for lo, hi in ranges]
        code = _read_range_code(tracee, traced)
        rec = _Recorder(tracee, traced, clock, names, max_instructions)
        pairs = [_clock_pair(clock, rec.ts)]
        try:
            rec.run()
        finally:
            rec.finish()
            if time.clock_gettime_ns(time.CLOCK_MONOTONIC) - pairs[0][1] < 50_000_000:
                time.sleep(0.05)  # a baseline long enough to calibrate the TSC
            pairs.append(_clock_pair(clock, rec.ts))
    except BaseException:
        if tracee.alive:
            if tracee.launched:
                os.kill(tracee.pid, signal.SIGKILL)
                tracee.wait()
            else:
                nat.ptrace(nat.PTRACE_DETACH, tracee.pid, 0, 0)
        raise
    finally:
        tracee.close()
    n = rec.n
    return StepLog(
        ips=rec.ips[:n].copy(),
        times=rec.times[:n].copy(),
        registers=rec.regs[:n].copy(),
        register_names=names,
        segments=rec.segments,
        ranges=traced,
        pid=tracee.pid,
        comm=comm,
        argv=argv,
        maps=maps,
        clock=clock,
        code=code,
        exit_status=rec.exit_status,
        signals=rec.signals,
        stopped_because=rec.stopped_because,
        clock_pairs=pairs,
    )
