"""FlowJIT's code capture inside the target: no ptrace stop per fault.

:class:`~hwtrace.record.jitcapture.CodeCapture` handles every fault in
hwtrace, through ptrace: two context switches and several system calls
per page revision.  :class:`InProcessCapture` puts the fault handling
into the target instead, as generated machine code
(:mod:`hwtrace.record._agentcode`), and keeps the kernel's view in eBPF:

* tracepoint programs on ``syscalls:sys_enter_*``/``sys_exit_*`` of
  ``mmap``, ``mprotect``, ``pkey_mprotect``, ``munmap`` and
  ``rt_sigaction`` note, for the target's threads, the calls that make
  pages executable (or change their protection, or set a ``SIGSEGV``
  action), and when such a call succeeds send the thread a real-time
  signal (``bpf_send_signal_thread``), delivered before its next
  instruction; the agent's own calls (made holding its lock, whose word is
  the thread id) are not noted;
* the signal's handler in the target arms the pages (no ``PROT_EXEC``),
  and the ``SIGSEGV`` handler snapshots a page at its first execution into
  a ring shared with hwtrace (a memfd), keeps it W^X, and passes any other
  fault to the program's own handler.

hwtrace drains the ring.  Nothing stops the program; if hwtrace dies, the
kernel programs go with it and the handlers go on keeping the program
running (the ring just fills).  An attached process gets its pages'
protections and its ``SIGSEGV`` action back when capture ends; the
agent's memory (about 5 MiB) stays mapped, since a thread may still be in
its code.

Needs root (eBPF tracepoint programs, ``bpf_send_signal_thread``); the
ptrace agent works without.  Signals ``SIGRTMAX-3`` to ``SIGRTMAX`` are
the agent's; a program that already handles one of them is refused.
Limits as for the ptrace agent: children are not followed, ``mremap`` of
tracked pages and writes through another mapping are not seen; another
thread may run a page made executable in the instant before the signal
arms it.
"""

from __future__ import annotations

import mmap
import os
import select
import signal
import subprocess
from collections.abc import Sequence

import numpy as np

from ..filter.ebpf import isa
from ..filter.ebpf.gen import _Gen
from ..filter.ebpf.isa import R0, R1, R2, R3, R6, R7, R10
from ..filter.sources import tracefs_schema
from ..image.process import read_maps, syscall_instruction
from ..kernel import bpf
from ..kernel.tracepoint import tracefs_root
from ..ktrace.follow import emit_delete, emit_lookup, emit_tracked, emit_update, field_offset
from ..ktrace.programs import TracepointPrograms
from ..probes.codegen import SA_ONSTACK, SA_RESTART, SA_RESTORER, SA_SIGINFO, sigaction_bytes
from ..probes.ptrace import PtraceError, SeizedThread, launch_stopped
from ..probes.rings import clock_pair
from . import _agentcode as ac
from .jitcapture import CaptureResult, _Capture
from .stepper import CodeChange, RecordError

__all__ = ["InProcessCapture", "in_process_available"]

SIGRTMAX = 64
SIG_SIGACTION, SIG_UNTRACK, SIG_TRACK_MPROTECT, SIG_TRACK_MMAP = range(SIGRTMAX - 3, SIGRTMAX + 1)
SYS_MMAP, SYS_MPROTECT, SYS_OPEN, SYS_CLOSE, SYS_RT_SIGACTION = 9, 10, 2, 3, 13
MAP_SHARED, MAP_PRIVATE, MAP_ANONYMOUS, MAP_FIXED, MAP_FIXED_NOREPLACE = 1, 2, 0x20, 0x10, 0x100000
PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
FN_PROBE_READ_USER, FN_SEND_SIGNAL_THREAD = 112, 117
SIGSEGV = 11
ALL_SIGNALS = (1 << 64) - 1
META_DTYPE = np.dtype(
    [("seq", "<u8"), ("page", "<u8"), ("tsc", "<u8"), ("tid", "<u4"), ("pid", "<u4"),
     ("cpu", "<u4"), ("pad", "<u4"), ("ip", "<u8"), ("spare", "<u8", (2,))]
)  # fmt: skip
assert META_DTYPE.itemsize == 64


def in_process_available() -> str | None:
    """None when the in-process agent can run here, else why not."""
    if os.geteuid() != 0:
        return "the in-process agent needs root (eBPF tracepoint programs)"
    try:
        root = tracefs_root()
    except Exception as e:
        return f"no tracefs: {e}"
    if not (root / "events" / "syscalls" / "sys_enter_mprotect").exists():
        return "no syscalls tracepoints in tracefs"
    return None


# -- the kernel side -----------------------------------------------------------------


def enter_program(kind: str, offsets: dict[str, int], targets: int, pending: int,
                  anonymous_only: bool) -> np.ndarray:  # fmt: skip
    """``syscalls:sys_enter_<kind>``: note the signal to send when the call
    of a target's thread (not the agent's, under its lock) succeeds."""
    g = _Gen()
    out, decide = g.label("out"), g.label("decide")
    g.emit(isa.mov(R6, R1))
    emit_tracked(g, targets, out)  # tid at R10-12, tgid at R10-4; R0: its entry
    # The agent's own calls: the lock word holds this thread's id.
    g.emit(isa.ldx(isa.DW, R3, R0, 0), isa.mov(R1, R10), isa.alu64(isa.ADD, R1, -16, reg=False))
    g.emit(isa.mov_imm(R2, 4), isa.call(FN_PROBE_READ_USER))
    g.jump(decide, isa.JNE, R0, 0)
    g.emit(isa.ldx(isa.W, R1, R10, -16), isa.ldx(isa.W, R2, R10, -12))
    g.jump(out, isa.JEQ, R1, R2, reg=True)
    g.place(decide)
    if kind == "mmap":
        track, fixed = g.label("track"), g.label("fixed")
        g.emit(isa.ldx(isa.DW, R1, R6, offsets["prot"]), isa.ldx(isa.DW, R2, R6, offsets["flags"]))
        g.emit(isa.alu64(isa.AND, R1, PROT_EXEC, reg=False))
        g.jump(fixed, isa.JEQ, R1, 0)
        if anonymous_only:
            g.emit(isa.mov(R1, R2), isa.alu64(isa.AND, R1, MAP_ANONYMOUS, reg=False))
            g.jump(out, isa.JEQ, R1, 0)
        g.jump(track)
        g.place(fixed)
        g.emit(isa.alu64(isa.AND, R2, MAP_FIXED | MAP_FIXED_NOREPLACE, reg=False))
        g.jump(out, isa.JEQ, R2, 0)
        g.emit(isa.mov_imm(R7, SIG_UNTRACK))
        done = g.label("done")
        g.jump(done)
        g.place(track)
        g.emit(isa.mov_imm(R7, SIG_TRACK_MMAP))
        g.place(done)
    elif kind in ("mprotect", "pkey_mprotect"):
        other = g.label("other")
        done = g.label("done")
        g.emit(
            isa.ldx(isa.DW, R1, R6, offsets["prot"]), isa.alu64(isa.AND, R1, PROT_EXEC, reg=False)
        )
        g.jump(other, isa.JEQ, R1, 0)
        g.emit(isa.mov_imm(R7, SIG_TRACK_MPROTECT))
        g.jump(done)
        g.place(other)
        g.emit(isa.mov_imm(R7, SIG_UNTRACK))
        g.place(done)
    elif kind == "munmap":
        g.emit(isa.mov_imm(R7, SIG_UNTRACK))
    elif kind == "rt_sigaction":
        g.emit(isa.ldx(isa.W, R1, R6, offsets["sig"]))
        g.jump(out, isa.JNE, R1, SIGSEGV)
        g.emit(isa.mov_imm(R7, SIG_SIGACTION))
    else:
        raise ValueError(kind)
    g.emit(isa.stx(isa.W, R10, R7, -20))
    emit_update(g, pending, -12, -20)
    g.place(out)
    g.emit(isa.mov_imm(R0, 1), isa.exit_())  # 1: perf's own events here still get theirs
    return isa.program(g.finish())


def exit_program(ret_offset: int, pending: int) -> np.ndarray:
    """``syscalls:sys_exit_*``: send the noted signal if the call succeeded."""
    g = _Gen()
    out = g.label("out")
    g.emit(isa.mov(R6, R1))
    g.emit(isa.call(bpf.FN_GET_CURRENT_PID_TGID), isa.stx(isa.W, R10, R0, -12))
    emit_lookup(g, pending, -12)
    g.jump(out, isa.JEQ, R0, 0)
    g.emit(isa.ldx(isa.W, R7, R0, 0))
    emit_delete(g, pending, -12)
    g.emit(isa.ldx(isa.DW, R1, R6, ret_offset))
    g.jump(out, isa.JSLT, R1, 0)
    g.emit(isa.mov(R1, R7), isa.call(FN_SEND_SIGNAL_THREAD))
    g.place(out)
    g.emit(isa.mov_imm(R0, 1), isa.exit_())  # 1: perf's own events here still get theirs
    return isa.program(g.finish())


def exec_program(targets: int) -> np.ndarray:
    """``sched:sched_process_exec``: a target that execs another program
    loses the agent (its handlers are gone), so no more signals."""
    g = _Gen()
    out = g.label("out")
    emit_tracked(g, targets, out)  # tid at R10-12, tgid at R10-4; R0: its entry
    emit_delete(g, targets, -4)
    g.place(out)
    g.emit(isa.mov_imm(R0, 1), isa.exit_())  # 1: perf's own events here still get theirs
    return isa.program(g.finish())


_SYSCALLS = {
    "mmap": ("prot", "flags"),
    "mprotect": ("prot",),
    "pkey_mprotect": ("prot",),
    "munmap": (),
    "rt_sigaction": ("sig",),
}


class _KernelSide:
    """The maps and programs, attached until :meth:`close`."""

    def __init__(self, anonymous_only: bool) -> None:
        root = tracefs_root()
        self.targets = bpf.Map(bpf.MAP_HASH, 4, 8, 64, name="hwtrace_jit_pids")
        self.pending = bpf.Map(bpf.MAP_HASH, 4, 4, 1 << 14, name="hwtrace_jit_sys")
        self.tracepoints = TracepointPrograms()
        try:
            ret = field_offset(tracefs_schema("syscalls", "sys_exit_mmap", str(root)), "ret")
            leave = bpf.Program(bpf.PROG_TRACEPOINT, exit_program(ret, self.pending.fd),
                                name="hwtrace_jit_exit")  # fmt: skip
            for kind, fields in _SYSCALLS.items():
                schema = tracefs_schema("syscalls", f"sys_enter_{kind}", str(root))
                offsets = {f: field_offset(schema, f) for f in fields}
                code = enter_program(kind, offsets, self.targets.fd, self.pending.fd,
                                     anonymous_only)  # fmt: skip
                self.tracepoints.load(code, f"hwtrace_jit_{kind[:6]}", "syscalls",
                                      f"sys_enter_{kind}")  # fmt: skip
                self.tracepoints.add(leave, "syscalls", f"sys_exit_{kind}")
            self.tracepoints.load(exec_program(self.targets.fd), "hwtrace_jit_exec", "sched",
                                  "sched_process_exec")  # fmt: skip
            self.tracepoints.attach()
        except BaseException:
            self.close()
            raise

    def add(self, pid: int, lock_address: int) -> None:
        self.targets.update(pid.to_bytes(4, "little"), lock_address.to_bytes(8, "little"))

    def remove(self, pid: int) -> None:
        try:
            self.targets.delete(pid.to_bytes(4, "little"))
        except bpf.BpfError:
            pass  # gone already (the process exec'd)

    def close(self) -> None:
        self.tracepoints.close()
        for m in (getattr(self, "targets", None), getattr(self, "pending", None)):
            if m is not None:
                m.close()


# -- the agent -------------------------------------------------------------------------


class InProcessCapture(_Capture):
    """Capture the code revisions of ``target`` (argv to launch, or a pid)
    with handlers in the process itself (see the module doc); the same
    interface as :class:`~hwtrace.record.jitcapture.CodeCapture`."""

    poll_seconds = 0.001

    def _open(self, target: Sequence[str] | int, anonymous_only: bool, hold: bool) -> None:
        why = in_process_available()
        if why:
            raise RecordError(why)
        self.proc: subprocess.Popen | None = None
        self.kernel: _KernelSide | None = None
        self.mem = -1
        self._last: dict[int, bytes] = {}
        self._running = False
        self._installed = False
        self.ring_fd = os.memfd_create("hwtrace-jit-ring", 0)
        os.ftruncate(self.ring_fd, ac.RING_SIZE)
        self.ring = mmap.mmap(self.ring_fd, ac.RING_SIZE, mmap.MAP_SHARED,
                              mmap.PROT_READ | mmap.PROT_WRITE)  # fmt: skip
        raw = np.frombuffer(self.ring, np.uint8)
        self._words = raw[: ac.PAGE].view("<u8")
        self._meta = raw[ac.META : ac.DATA].view(META_DTYPE)
        self._data = raw[ac.DATA :].reshape(ac.NSLOTS, ac.PAGE)
        self._tail = 0
        try:
            if self.attached:
                self.pid = int(target)
                if not os.path.exists(f"/proc/{self.pid}"):
                    raise RecordError(f"no process with pid {self.pid}")
            else:
                try:
                    self.proc = launch_stopped(list(target))
                except PtraceError as e:
                    raise RecordError(str(e)) from None
                self.pid = self.proc.pid
            self.mem = os.open(f"/proc/{self.pid}/mem", os.O_RDWR)
            self.kernel = _KernelSide(anonymous_only)
            try:
                with SeizedThread(self.pid) as t:
                    self._install(t)
            except PtraceError as e:
                raise RecordError(f"process {self.pid}: {e}") from None
        except BaseException:
            self.close()
            raise
        if not hold:
            self._start()

    # -- installing ---------------------------------------------------------------------

    def _write(self, address: int, data: bytes) -> None:
        if os.pwrite(self.mem, data, address) != len(data):
            raise RecordError(f"process {self.pid}: short write at {address:#x}")

    def _read(self, address: int, size: int) -> bytes:
        return os.pread(self.mem, size, address)

    def _sys(self, t: SeizedThread, nr: int, *args: int, what: str) -> int:
        r = t.syscall(self.gadget, nr, *args)
        if r < 0:
            raise RecordError(f"process {self.pid}: {what}: {os.strerror(-r)}")
        return r

    def _install(self, t: SeizedThread) -> None:
        gadget = syscall_instruction(self.pid, self.mem)
        if gadget is None:
            raise RecordError(f"process {self.pid}: no syscall instruction found in its code")
        self.gadget = gadget
        base = self._sys(t, SYS_MMAP, 0, ac.REGION_SIZE, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, (1 << 64) - 1, 0, what="mapping the agent")  # fmt: skip
        self.layout = lay = ac.Layout(base)
        self._write(base, ac.agent_code(base))
        self._sys(t, SYS_MPROTECT, base, ac.PAGE, PROT_READ | PROT_EXEC, what="mprotect")
        path = f"/proc/{os.getpid()}/fd/{self.ring_fd}".encode() + b"\0"
        self._write(lay.scratch, path)
        fd = self._sys(t, SYS_OPEN, lay.scratch, os.O_RDWR, 0, what="opening the agent's ring")
        ring = t.syscall(
            gadget, SYS_MMAP, 0, ac.RING_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0
        )
        t.syscall(gadget, SYS_CLOSE, fd)
        if ring < 0:
            raise RecordError(f"process {self.pid}: mapping the agent's ring: {os.strerror(-ring)}")
        flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART | SA_RESTORER
        restorer = base + ac.RESTORER
        words = [
            (lay.enabled, 1),
            (lay.min_page, (1 << 64) - 1),
            (lay.max_page, 0),
            (lay.ring_addr, ring),
        ]
        for at, value in words:
            self._write(at, value.to_bytes(8, "little"))
        ours = sigaction_bytes(base + ac.SEGV, flags, restorer, ALL_SIGNALS)
        self._write(lay.our_action, ours)
        self._write(lay.dfl_action, sigaction_bytes(0, SA_RESTORER, restorer))
        handlers = {
            SIG_TRACK_MMAP: ac.TRACK_MMAP, SIG_TRACK_MPROTECT: ac.TRACK_MPROTECT,
            SIG_UNTRACK: ac.UNTRACK, SIG_SIGACTION: ac.SIGACTION,
        }  # fmt: skip
        for sig, at in handlers.items():
            self._write(lay.tmp_action, sigaction_bytes(base + at, flags, restorer, ALL_SIGNALS))
            self._sys(t, SYS_RT_SIGACTION, sig, lay.tmp_action, lay.scratch, 8, what="sigaction")
            if int.from_bytes(self._read(lay.scratch, 8), "little") not in (0, 1):
                self._write(lay.tmp_action, self._read(lay.scratch, 32))
                t.syscall(gadget, SYS_RT_SIGACTION, sig, lay.tmp_action, 0, 8)
                raise RecordError(f"process {self.pid} handles signal {sig} itself: the "
                                  "in-process agent needs it; use the ptrace agent")  # fmt: skip
        self._sys(t, SYS_RT_SIGACTION, SIGSEGV, lay.our_action, lay.prog_action, 8,
                  what="installing the SIGSEGV handler")  # fmt: skip
        self._installed = True
        if self.attached:
            self._arm_existing(t, base)

    def _arm_existing(self, t: SeizedThread, base: int) -> None:
        """Executable anonymous memory there already: tracked and armed."""
        lay = self.layout
        table = bytearray(self._read(lay.table, 16 * ac.TABLE_SLOTS))
        entries = np.frombuffer(table, "<u8").reshape(-1, 2)
        lo, hi = (1 << 64) - 1, 0
        ranges = []
        for m in read_maps(self.pid):
            if not m.executable or m.path or m.start == base:
                continue
            want = (PROT_READ if m.prot[0] == "r" else 0) | (PROT_WRITE if m.prot[1] == "w" else 0)
            want |= PROT_EXEC
            for page in range(m.start, m.end, ac.PAGE):
                if not _insert(entries, page, want):
                    break
                lo, hi = min(lo, page), max(hi, page)
            else:
                ranges.append((m.start, m.end, want))
        if not ranges:
            return
        self._write(lay.table, bytes(table))
        self._write(lay.min_page, lo.to_bytes(8, "little"))
        self._write(lay.max_page, hi.to_bytes(8, "little"))
        for start, end, want in ranges:
            t.syscall(
                self.gadget, SYS_MPROTECT, start, end - start, (want & ~PROT_EXEC) | PROT_READ
            )

    # -- running ---------------------------------------------------------------------------

    def _start(self) -> None:
        assert self.kernel is not None
        self.clock_pairs.append(clock_pair())
        self.kernel.add(self.pid, self.layout.lock_word)
        self._running = True
        if self.proc is not None:
            os.kill(self.pid, signal.SIGCONT)

    def run(self) -> CaptureResult:
        """Capture until the process exits, ``max_revisions`` are captured
        or :meth:`stop` is called; an attached process is then given its
        pages' protections and its ``SIGSEGV`` action back."""
        if not self._running:
            self._start()
        pidfd = os.pidfd_open(self.pid)
        try:
            while True:
                self._drain()
                if self._stopping or self._enough():
                    break
                ready, _, _ = select.select([pidfd], [], [], self.poll_seconds)
                if ready:
                    self._drain()
                    break
        except KeyboardInterrupt:
            self._finish(interrupted=True)
            raise
        finally:
            os.close(pidfd)
        self._finish(interrupted=False)
        return self.result()

    def _drain(self) -> None:
        """Take the committed snapshots: a batch of slots at a time, up to
        the first not committed yet."""
        head = int(self._words[ac.HEAD // 8])
        while self._tail < head:
            idx = np.arange(self._tail, min(head, self._tail + ac.NSLOTS), dtype=np.uint64)
            slots = idx % ac.NSLOTS
            meta = self._meta[slots]
            ok = np.flatnonzero(meta["seq"] != idx + 1)
            if ok.shape[0]:
                idx, slots, meta = idx[: ok[0]], slots[: ok[0]], meta[: ok[0]]
            if not idx.shape[0]:
                break
            data = self._data[slots].copy()
            self._tail += idx.shape[0]
            self._words[ac.TAIL // 8] = self._tail
            self._keep(meta, data)
        if self._words[ac.STALLED // 8]:
            self._words[ac.STALLED // 8] = 0

    def _keep(self, meta: np.ndarray, data: np.ndarray) -> None:
        mine = meta["pid"] == self.pid  # not a forked child's
        for k in np.flatnonzero(mine):
            if self._enough():
                return
            page, raw = int(meta["page"][k]), data[k].tobytes()
            if self._last.get(page) == raw:
                continue  # the same bytes again
            self._last[page] = raw
            m = meta[k]
            self.revisions.append(CodeChange(int(m["tsc"]), page, raw, int(m["tid"]),
                                             int(m["cpu"]), int(m["ip"])))  # fmt: skip

    def _finish(self, interrupted: bool) -> None:
        self.clock_pairs.append(clock_pair())
        if self.kernel is not None:
            self.kernel.remove(self.pid)
        alive = os.path.exists(f"/proc/{self.pid}") and not self._reaped()
        if alive and self.attached and self._installed:
            self._let_go()
        elif alive and interrupted and self.proc is not None:
            self.proc.kill()
        if self.proc is not None and (not alive or interrupted):
            self.exit_status = _status(self.proc.wait())
        self._stats = self._counters()
        self._running = False

    def _reaped(self) -> bool:
        if self.proc is None:
            return False
        status = self.proc.poll()
        if status is None:
            return False
        self.exit_status = _status(status)
        return True

    def _counters(self) -> dict[str, int]:
        stats = {"revisions": len(self.revisions), "lost": int(self._words[ac.LOST // 8])}
        for k, name in enumerate(ac.COUNTERS):
            stats[name] = int(self._words[ac.COUNTS // 8 + k])
        return stats

    def _let_go(self) -> None:
        """Capture off in the process: faults give pages what the program
        asked for; tracked pages get it now; its SIGSEGV action back; the
        agent's signals ignored from now on."""
        lay = self.layout
        try:
            self._write(lay.enabled, bytes(8))
            with SeizedThread(self.pid) as t:
                table = np.frombuffer(self._read(lay.table, 16 * ac.TABLE_SLOTS), "<u8").reshape(
                    -1, 2
                )
                live = np.flatnonzero((table[:, 0] != 0) & (table[:, 1] != 0))
                for k in live:
                    page, want = int(table[k, 0]) << 12, int(table[k, 1])
                    t.syscall(self.gadget, SYS_MPROTECT, page, ac.PAGE, want)
                    self._write(lay.table + 16 * int(k) + 8, bytes(8))
                t.syscall(self.gadget, SYS_RT_SIGACTION, SIGSEGV, lay.prog_action, 0, 8)
                self._write(lay.tmp_action, sigaction_bytes(1, SA_RESTORER, lay.base + ac.RESTORER))
                for sig in (SIG_TRACK_MMAP, SIG_TRACK_MPROTECT, SIG_UNTRACK, SIG_SIGACTION):
                    t.syscall(self.gadget, SYS_RT_SIGACTION, sig, lay.tmp_action, 0, 8)
        except (PtraceError, OSError):
            pass  # the process went meanwhile

    def result(self) -> CaptureResult:
        stats = getattr(self, "_stats", None) or self._counters()
        stats = dict(stats, revisions=len(self.revisions))
        return CaptureResult(self.pid, list(self.revisions), stats, self.exit_status,
                             tuple(self.clock_pairs))  # fmt: skip

    def close(self) -> None:
        if self._running:
            self._finish(interrupted=True)
        elif self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # never run: the launched program does not start at all
            self.proc.wait()
        elif self.attached and self._installed and self.kernel is not None:
            self._let_go()
        if self.kernel is not None:
            self.kernel.close()
            self.kernel = None
        if self.mem >= 0:
            os.close(self.mem)
            self.mem = -1
        if self.ring_fd >= 0:
            self._words = self._meta = self._data = None  # type: ignore[assignment]
            try:
                self.ring.close()
            except BufferError:
                pass
            os.close(self.ring_fd)
            self.ring_fd = -1


def _status(returncode: int) -> int:
    """Popen's return code as a wait status (``os.WIFSIGNALED`` ...)."""
    return -returncode if returncode < 0 else returncode << 8


def _insert(entries: np.ndarray, page: int, want: int) -> bool:
    """Put ``page`` into the table as the agent's probe would."""
    key = page >> 12
    slot = ac.page_key_slot(page)
    for _ in range(ac.MAX_PROBES):
        k = int(entries[slot, 0])
        if k == key or k == 0:
            entries[slot] = (key, want)
            return True
        slot = (slot + 1) & (ac.TABLE_SLOTS - 1)
    return False
