"""One seized thread of a live process, borrowed to act inside it.

Only one thread of the target is ever stopped, and only while hwtrace works
on the process: it is seized (``PTRACE_SEIZE``), interrupted
(``PTRACE_INTERRUPT``), made to run a system call or a store of ours by
pointing its ``rip`` at a ``syscall`` (or ``mov [rdi],rsi; syscall``) and
resuming it to that system call's exit (``PTRACE_SYSCALL``), and then given
back its registers and detached.  The other threads keep running
throughout.

hwtrace may die at any moment (SIGKILL): the kernel then detaches the
thread, which goes on with whatever registers it has (no
``PTRACE_O_EXITKILL``).  Every state it is left in must be one it can run
on from.  Single-stepping is not used for that reason: a thread whose
tracer dies after a step keeps the trap flag and dies of the next
instruction's SIGTRAP; a ``PTRACE_SYSCALL`` stop is cleared when the
tracer goes.  And the code after the ``syscall`` of hwtrace's gadget (see
:func:`~.codegen.resume_block`) puts back the registers the thread had,
from :meth:`SeizedThread.continuation`, and jumps to where it was.

The borrowed thread may have been interrupted inside a system call.  As GDB
does for inferior calls, ``orig_rax`` is set to -1 while our code runs, so
that the kernel does not apply its restart logic to our call, and the saved
registers (``rax`` = ``-ERESTART*``, ``orig_rax`` = the call) are put back
before the thread goes on, so that the kernel restarts the interrupted call
(the continuation restarts it the same way: ``rip`` back over the
``syscall``, ``rax`` the call again).  Signals that arrive for the thread
meanwhile stay pending (all are blocked while hwtrace's calls run, the
thread's mask put back by :meth:`SeizedThread.release` or the resume
block) and are delivered, as they were sent, once it goes on.

``HWTRACE_PROBE_KILL_AT=N`` (a testing aid) makes hwtrace SIGKILL itself at
the N-th point of its injected calls, two per call: the thread's registers
set for the call (what a stop at its entry also leaves), and the call done.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

from ..image.process import program_entry
from ..kernel.ptrace import (
    PTRACE_CONT,
    PTRACE_DETACH,
    PTRACE_GETREGS,
    PTRACE_GETSIGMASK,
    PTRACE_INTERRUPT,
    PTRACE_O_TRACESYSGOOD,
    PTRACE_SEIZE,
    PTRACE_SETREGS,
    PTRACE_SETSIGMASK,
    PTRACE_SYSCALL,
    PTRACE_TRACEME,
    SYSCALL_STOP,
    WALL,
    Registers,
    tgkill,
)
from ..kernel.ptrace import ptrace as _call

__all__ = [
    "ProcessGone",
    "PtraceError",
    "Registers",
    "SeizedThread",
    "end_of",
    "launch_stopped",
    "process_alive",
    "threads_blocking",
    "threads_of",
]

PTRACE_EVENT_STOP = 128
# The kernel's restart codes (include/linux/errno.h), and the call that
# resumes a ERESTART_RESTARTBLOCK one.
ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND, ERESTART_RESTARTBLOCK = 512, 513, 514, 516
_RESTARTS = (ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND, ERESTART_RESTARTBLOCK)
SYS_GETPID, SYS_RESTART_SYSCALL = 39, 219
_FAULTS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE)


class PtraceError(Exception):
    """A ptrace operation failed; the message says which and why."""


class ProcessGone(PtraceError):
    """The target (or the borrowed thread) exited while hwtrace worked on it."""


def threads_of(pid: int) -> list[int]:
    """The thread ids of a process (``/proc/PID/task``); [] when it is gone."""
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie, waiting
    for its parent to reap it, has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def end_of(pid: int) -> str:
    """How process ``pid`` ended, as far as can be told: "was killed by
    SIGTRAP", "exited with status 3", or "exited" once it has been reaped
    (the exit code of ``/proc/PID/stat`` is read while it is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        status = int(fields[49])  # field 52, exit_code: a wait status
    except (OSError, IndexError, ValueError):
        return "exited"
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.WEXITSTATUS(status)}"


def threads_blocking(pid: int, sig: int) -> list[int]:
    """The threads of process ``pid`` that block signal ``sig``."""
    return [t for t in threads_of(pid) if _status_masks(pid, t).get("SigBlk", 0) >> (sig - 1) & 1]


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


_kill_at = int(os.environ.get("HWTRACE_PROBE_KILL_AT", "0") or 0)
_points = 0
point_hook: Callable[[int], None] | None = None  # called with each point's number


def _kill_point() -> None:
    """One more point of an injected call: hwtrace SIGKILLs itself at the
    N-th when ``HWTRACE_PROBE_KILL_AT=N`` (so that tests can check that
    the target survives hwtrace's death at every one)."""
    global _points
    _points += 1
    if point_hook is not None:
        point_hook(_points)
    if _points == _kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


def kill_points() -> int:
    """The points of injected calls passed so far in this process."""
    return _points


def kill_at(point: int) -> None:
    """SIGKILL this process at the given point (as counted by
    :func:`kill_points`; 0: never), as ``HWTRACE_PROBE_KILL_AT`` does."""
    global _kill_at
    _kill_at = point


@dataclass
class _Stop:
    status: int

    @property
    def exited(self) -> bool:
        return os.WIFEXITED(self.status) or os.WIFSIGNALED(self.status)

    @property
    def signal(self) -> int:
        return os.WSTOPSIG(self.status) if os.WIFSTOPPED(self.status) else 0

    @property
    def event(self) -> int:
        return self.status >> 16


class SeizedThread:
    """A thread of ``pid`` seized and stopped until :meth:`release`.

    ``tid`` None picks the process's first live thread.  Raises
    :class:`PtraceError` with the reason when the thread cannot be seized
    (no such process, not permitted, already traced by a debugger).
    """

    def __init__(self, pid: int, tid: int | None = None) -> None:
        self.pid = pid
        candidates = [tid] if tid is not None else threads_of(pid)
        if not candidates:
            raise ProcessGone(f"no process with pid {pid}")
        last = ""
        self.tid = 0
        for t in candidates:
            r = _call(PTRACE_SEIZE, t, 0, PTRACE_O_TRACESYSGOOD)
            if r == 0:
                self.tid = t
                break
            last = _seize_failure(pid, t, -r)
            if -r in (errno.EPERM, errno.EACCES):
                break
        if not self.tid:
            raise (PtraceError if process_alive(pid) else ProcessGone)(last)
        self.held_signals: list[int] = []
        self._stopped = False
        self._saved: Registers | None = None
        self._masked = False
        self._stop()
        self._saved = self.get_registers()
        self.signal_mask = self._get_mask()

    # -- stopping and going ----------------------------------------------------

    def _wait(self) -> _Stop:
        while True:
            try:
                _, status = os.waitpid(self.tid, WALL)
            except ChildProcessError as e:
                raise ProcessGone(f"process {self.pid}: thread {self.tid} is gone") from e
            except InterruptedError:
                continue
            stop = _Stop(status)
            if stop.exited:
                raise ProcessGone(f"process {self.pid} exited while hwtrace worked on it")
            if stop.event == 6:  # PTRACE_EVENT_EXIT (when another tracer asked for it)
                raise ProcessGone(f"process {self.pid}: thread {self.tid} is exiting")
            return stop

    def _stop(self) -> None:
        self._interrupt()
        for _ in range(8):
            if not _signal_pending(self.pid, self.tid):
                break
            # The interrupt stop comes before a signal already pending (the
            # kernel's get_signal takes job control traps first): let the
            # signal reach its handler in the thread's own context, not ours
            # (held, it would be lost if hwtrace died), and interrupt again.
            _call(PTRACE_CONT, self.tid, 0, 0)
            stop = self._wait()
            if stop.event:
                continue  # stopped again (a group stop): look again
            _call(PTRACE_CONT, self.tid, 0, stop.signal)
            self._interrupt()
        self._stopped = True

    def _interrupt(self) -> None:
        r = _call(PTRACE_INTERRUPT, self.tid)
        if r < 0:
            raise PtraceError(f"process {self.pid}: cannot interrupt thread {self.tid}: "
                              f"{os.strerror(-r)}")  # fmt: skip
        while True:
            stop = self._wait()
            if stop.event == PTRACE_EVENT_STOP:
                return
            # A signal arrived first: deliver it now (it may be a trap of an
            # int3 that must reach its handler before the thread goes on),
            # then keep waiting for the interrupt.
            _call(PTRACE_CONT, self.tid, 0, stop.signal if not stop.event else 0)

    def _get_mask(self) -> int:
        mask = ctypes.c_uint64()
        r = _call(PTRACE_GETSIGMASK, self.tid, 8, ctypes.addressof(mask))
        if r < 0:
            raise PtraceError(f"thread {self.tid}: PTRACE_GETSIGMASK: {os.strerror(-r)}")
        return mask.value

    def _set_mask(self, value: int) -> None:
        mask = ctypes.c_uint64(value)
        r = _call(PTRACE_SETSIGMASK, self.tid, 8, ctypes.addressof(mask))
        if r < 0:
            raise PtraceError(f"thread {self.tid}: PTRACE_SETSIGMASK: {os.strerror(-r)}")

    def get_registers(self) -> Registers:
        regs = Registers()
        r = _call(PTRACE_GETREGS, self.tid, 0, ctypes.addressof(regs))
        if r < 0:
            raise PtraceError(f"thread {self.tid}: PTRACE_GETREGS: {os.strerror(-r)}")
        return regs

    def set_registers(self, regs: Registers) -> None:
        r = _call(PTRACE_SETREGS, self.tid, 0, ctypes.addressof(regs))
        if r < 0:
            raise PtraceError(f"thread {self.tid}: PTRACE_SETREGS: {os.strerror(-r)}")

    @property
    def saved_registers(self) -> Registers:
        """The thread's registers as they were when it was seized."""
        assert self._saved is not None
        return self._saved

    def continuation(self) -> Registers:
        """The registers the thread goes on from if hwtrace lets it go in
        the middle of its calls: the saved ones, with a system call it was
        interrupted in set up to run again, as the kernel would have done
        (arch/x86/kernel/signal.c, no handler to run)."""
        regs = self.saved_registers.copy()
        nr, rax = _signed(regs.orig_rax), _signed(regs.rax)
        if nr >= 0 and -rax in _RESTARTS:
            regs.rax = SYS_RESTART_SYSCALL if -rax == ERESTART_RESTARTBLOCK else nr
            regs.rip -= 2  # back over the syscall instruction (2 bytes, as int 0x80)
        regs.orig_rax = (1 << 64) - 1
        return regs

    def run_call(self, rip: int, **values: int) -> Registers:
        """Run from ``rip`` with the given registers set (the rest as saved)
        to the exit of the next system call, and return the registers
        there: ``rip`` is a ``syscall`` instruction, or a store just before
        one."""
        regs = self.saved_registers.copy()
        regs.orig_rax = (1 << 64) - 1  # no system call restart for what we run
        regs.rip = rip
        for name, value in values.items():
            setattr(regs, name, value & ((1 << 64) - 1))
        if not self._masked:
            # Every signal blocked while our calls run: one sent meanwhile
            # stays pending in the kernel, not taken by hwtrace (where it
            # would be lost if hwtrace died), and is delivered as it was
            # sent once the mask is back (release, or the resume block).
            self._set_mask((1 << 64) - 1)
            self._masked = True
        for _ in range(16):
            self.set_registers(regs)
            _kill_point()  # about to run our call
            after = self._to_syscall_exit(rip)
            if -_signed(after.rax) not in _RESTARTS:
                _kill_point()  # our call done
                return after
            # Interrupted (a stop of the whole process, say): run it again.
        raise PtraceError(f"thread {self.tid}: the system call run at {rip:#x} never completes")

    def _to_syscall_exit(self, rip: int) -> Registers:
        entered = False
        for _ in range(256):
            r = _call(PTRACE_SYSCALL, self.tid, 0, 0)
            if r < 0:
                raise PtraceError(f"thread {self.tid}: PTRACE_SYSCALL: {os.strerror(-r)}")
            stop = self._wait()
            if stop.signal == SYSCALL_STOP:
                if entered:
                    return self.get_registers()
                entered = True
                continue
            if stop.event:
                continue  # a group stop meanwhile: our call goes first
            if stop.signal in _FAULTS and self.get_registers().rip == rip:
                # Our instruction faulted (its page gone?): the signal is ours,
                # not the program's; it is dropped.
                raise PtraceError(f"thread {self.tid}: the instruction at {rip:#x} run for "
                                  f"hwtrace raised {signal.Signals(stop.signal).name}")  # fmt: skip
            if stop.signal:
                # Not blocked (a fault of the program's, say): hold it, go on.
                self.held_signals.append(stop.signal)
        raise PtraceError(f"thread {self.tid}: the code at {rip:#x} does not reach a system call")

    def syscall(self, gadget: int, nr: int, *args: int) -> int:
        """Make the thread run system call ``nr`` with ``args`` through the
        ``syscall`` instruction at ``gadget``; returns the (signed) result."""
        names = ("rdi", "rsi", "rdx", "r10", "r8", "r9")
        after = self.run_call(gadget, rax=nr, **dict(zip(names, args, strict=False)))
        return _signed(after.rax)

    def store(self, gadget: int, address: int, value: int) -> None:
        """One 8-byte store by the thread itself (``mov [rdi],rsi; syscall``
        at ``gadget``, the system call a harmless ``getpid``): atomic for
        other threads, unlike a write through ``/proc/PID/mem``, which the
        kernel may copy byte by byte."""
        self.run_call(gadget, rdi=address, rsi=value, rax=SYS_GETPID)

    def release(self) -> None:
        """Give the thread back its registers and let it go (detached), with
        the signals that arrived meanwhile."""
        if not self._stopped:
            return
        self._stopped = False
        try:
            try:
                # The mask first: killed before the registers go back, the
                # thread would run the resume block, which sets it too.
                if self._masked:
                    self._set_mask(self.signal_mask)
                if self._saved is not None:
                    self.set_registers(self._saved)
            except PtraceError:
                pass  # gone; detach all the same
            pending = list(self.held_signals)
            first = pending.pop(0) if pending else 0
            _call(PTRACE_DETACH, self.tid, 0, first)
            for sig in pending:
                _tgkill(self.pid, self.tid, sig)
        except ProcessLookupError:
            pass

    def __enter__(self) -> SeizedThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _tgkill(pid: int, tid: int, sig: int) -> None:
    tgkill(pid, tid, sig)


def _seize_failure(pid: int, tid: int, err: int) -> str:
    if os.path.exists(f"/proc/{pid}") and not process_alive(pid):
        return f"process {pid} {end_of(pid)}"  # a zombie: not "not permitted"
    if err == errno.ESRCH:
        if not os.path.exists(f"/proc/{pid}"):
            return f"no process with pid {pid}"
        return f"process {pid}: thread {tid} is gone"
    if err == errno.EPERM:
        tracer = _tracer_of(pid, tid)
        if tracer:
            return (
                f"process {pid} is already being traced by process {tracer} "
                "(a debugger?); detach it first"
            )
        return f"process {pid}: not permitted to trace it (ptrace: {os.strerror(err)})"
    return f"process {pid}: cannot seize thread {tid}: {os.strerror(err)}"


def _status_masks(pid: int, tid: int) -> dict[str, int]:
    """The signal masks of a thread's ``/proc/PID/task/TID/status``
    (``SigPnd``, ``ShdPnd``, ``SigBlk``, ``SigIgn``, ``SigCgt``); {} when
    it is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith(("SigPnd:", "ShdPnd:", "SigBlk:", "SigIgn:", "SigCgt:")):
                    name, value = line.split()
                    out[name[:-1]] = int(value, 16)
    except OSError:
        pass
    return out


def _signal_pending(pid: int, tid: int) -> bool:
    """A signal sent to the thread itself is pending and not blocked."""
    m = _status_masks(pid, tid)
    return bool(m.get("SigPnd", 0) & ~m.get("SigBlk", 0))


def _tracer_of(pid: int, tid: int) -> int:
    try:
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _traceme() -> None:  # runs in the child between fork and exec
    _call(PTRACE_TRACEME, 0)


def launch_stopped(argv: list[str], **popen: object):
    """Start ``argv`` and stop it at its entry point, its libraries loaded,
    not traced any more (``SIGSTOP``ped): tracepoints go in before any of
    its own code runs; ``SIGCONT`` starts it.  Returns the ``Popen``."""
    import shutil
    import subprocess

    if not argv:
        raise PtraceError("no command to run")
    exe = argv[0] if "/" in argv[0] else shutil.which(argv[0])
    if exe is None or not os.path.isfile(exe):
        raise PtraceError(f"{argv[0]}: command not found")
    proc = subprocess.Popen([exe, *argv[1:]], preexec_fn=_traceme, **popen)
    pid = proc.pid
    _, status = os.waitpid(pid, WALL)  # stopped at the exec
    if not os.WIFSTOPPED(status):
        raise PtraceError(f"{argv[0]}: did not start ({status:#x})")
    entry = program_entry(pid) or 0
    fd = os.open(f"/proc/{pid}/mem", os.O_RDWR)
    try:
        original = os.pread(fd, 1, entry)
        os.pwrite(fd, b"\xcc", entry)
        _call(PTRACE_CONT, pid, 0, 0)
        while True:
            _, status = os.waitpid(pid, WALL)
            if not os.WIFSTOPPED(status):
                raise PtraceError(f"{argv[0]}: exited before its entry point")
            if os.WSTOPSIG(status) == signal.SIGTRAP:
                break
            _call(PTRACE_CONT, pid, 0, os.WSTOPSIG(status))
        os.pwrite(fd, original, entry)
        regs = Registers()
        _call(PTRACE_GETREGS, pid, 0, ctypes.addressof(regs))
        regs.rip = entry
        _call(PTRACE_SETREGS, pid, 0, ctypes.addressof(regs))
        _call(PTRACE_DETACH, pid, 0, signal.SIGSTOP)
    finally:
        os.close(fd)
    return proc
