"""Capturing code as it changes in a live process (FlowJIT's capture, from
user space).

Sharma's FlowJIT (thesis, ch. 7) captures every revision of a process's
run-time code with a kernel patch: pages a process makes executable lose
their execute right, the first execution faults, the fault handler copies
the page with a timestamp and gives the right back.  :class:`CodeCapture`
does the same with ptrace, on an unmodified kernel:

* every thread runs under ``PTRACE_SYSCALL``; a compiled loop
  (:func:`hwtrace.record._native.capture_wait`) lets every system call
  through but ``mmap``/``mprotect``/``pkey_mprotect`` asking for
  ``PROT_EXEC`` (anonymous mappings; any ``mprotect``, so patched file
  text is caught too) and calls that touch tracked pages;
* such a call is made without ``PROT_EXEC`` (the page is *armed*), and its
  pages are tracked with the protection the program asked for;
* executing an armed page faults (``SIGSEGV``, ``SEGV_ACCERR``): the page is
  copied from ``/proc/PID/mem``, kept as a revision (page, bytes, TSC, thread,
  CPU, IP) when its bytes changed, and made executable but not writable
  (W^X), in the faulting thread by a ``mprotect`` it is made to run; the
  fault is not delivered and the instruction runs again;
* writing such a page faults in turn: it is made writable and not
  executable again (armed), so the next execution is caught, although the
  program never calls ``mprotect`` (JITs that keep pages writable and
  executable).

The TSC is read when the fault is handled, before the faulting instruction
runs again: a revision is valid from its first execution, which comes after
its time.  Other faults are delivered as they were.  Attached processes get
their pages' protections back when capture ends; launched ones run to their
end (they die with hwtrace).

Limits: one process (children are not followed); ``mremap`` of tracked
pages and writes through other mappings of the same memory (a second
mapping of a memfd) are not seen.
"""

from __future__ import annotations

import errno
import os
import signal
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..image.process import read_maps, syscall_instruction
from ..image.revisions import CodeRevisions
from ..probes.rings import clock_pair
from . import _native as nat
from .stepper import CodeChange, RecordError, _attach, _launch, _wait

__all__ = ["AGENTS", "CaptureResult", "CodeCapture", "capture_code", "code_capture"]

PAGE = 0x1000
PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
MAP_ANONYMOUS = 0x20
ARMED = nat.PAGE_ARMED  # a tracked page not executable (yet); else executable, not writable
_OPTIONS = nat.PTRACE_O_TRACESYSGOOD | nat.PTRACE_O_TRACECLONE | nat.PTRACE_O_TRACEEXEC
_EVENT_CLONE, _EVENT_EXEC = 3, 4


@dataclass
class CaptureResult:
    """What a capture saw: the code revisions in time order (``time`` is
    the TSC), the counts of what it did, the process's exit status (None:
    still running, when attached)."""

    pid: int
    revisions: list[CodeChange]
    stats: dict[str, int]
    exit_status: int | None
    # (TSC, CLOCK_MONOTONIC ns) read when the capture began and ended.
    clock_pairs: tuple[tuple[int, int], ...] = ()

    def tsc_to_monotonic(self, tsc: int) -> int:
        """CLOCK_MONOTONIC ns of a TSC value, from the clock pairs."""
        (c0, n0), (c1, n1) = self.clock_pairs[0], self.clock_pairs[-1]
        return n0 + round((tsc - c0) * (n1 - n0) / max(c1 - c0, 1))

    def code_revisions(self) -> CodeRevisions:
        """The revisions as a store for the decoder (source ``capture``)."""
        store = CodeRevisions()
        for c in self.revisions:
            store.add(c.address, c.data, c.time, "capture", tid=c.tid, cpu=c.cpu, tsc=c.time,
                      ip=c.ip)  # fmt: skip
        return store


class _Capture(ABC):
    """What the capture agents share (:class:`CodeCapture`,
    :class:`~hwtrace.record.jitagent.InProcessCapture`): how one is made
    (``target``, argv to launch or a pid to attach to, and the options),
    the revisions it keeps and when it ends."""

    def __init__(
        self,
        target: Sequence[str] | int,
        *,
        anonymous_only: bool = True,
        max_revisions: int | None = None,
        hold: bool = False,
    ) -> None:
        self.max_revisions = max_revisions
        self.attached = isinstance(target, int)
        self.revisions: list[CodeChange] = []
        self.clock_pairs: list[tuple[int, int]] = []
        self.exit_status: int | None = None
        self._stopping = False
        self._open(target, anonymous_only, hold)

    @abstractmethod
    def _open(self, target: Sequence[str] | int, anonymous_only: bool, hold: bool) -> None:
        """Take hold of the process and prepare the capture (started now
        unless ``hold``)."""

    def _enough(self) -> bool:
        """Are ``max_revisions`` captured?"""
        return self.max_revisions is not None and len(self.revisions) >= self.max_revisions

    def stop(self) -> None:
        """End the capture at its next look at the process (from a signal
        handler)."""
        self._stopping = True


class CodeCapture(_Capture):
    """Capture the code revisions of ``target`` (argv to launch, or a pid
    to attach to); :meth:`run` until it exits (or :meth:`stop`).
    ``anonymous_only``: arm executable ``mmap``s of anonymous memory only
    (``mprotect`` arms any pages).  ``hold``: the process stays stopped
    (a launched one at its exec) until :meth:`run`, so a recorder can be
    attached first."""

    def _open(self, target: Sequence[str] | int, anonymous_only: bool, hold: bool) -> None:
        nat.warm_up()
        self.anonymous_only = anonymous_only
        self.status = np.zeros(2, np.int32)
        if self.attached:
            tids = _attach(int(target), self.status, _OPTIONS)
            self.pid = tids[0]
        else:
            self.pid = _launch(list(target), self.status, _OPTIONS)
            tids = [self.pid]
        self.mem = os.open(f"/proc/{self.pid}/mem", os.O_RDWR)
        self.tids = np.array(tids, np.int64)
        self.watch = np.zeros(len(tids), np.int64)
        self.pending: dict[int, tuple] = {}
        # Tracked pages, sorted, with their state, the protection the
        # program asked for, and a hash of their last capture.
        self.page_keys = np.zeros(0, np.uint64)
        self.state = np.zeros(0, np.int64)
        self.want = np.zeros(0, np.int64)
        self.last = np.zeros(0, np.uint64)
        self.ring = np.zeros((64, PAGE), np.uint8)
        self.meta = np.zeros((64, 5), np.int64)
        self.ctx = np.zeros(8, np.int64)
        self.info = np.zeros(12, np.int64)
        self.out = np.zeros(8, np.int64)
        self.work = nat.capture_work()
        self.regs = np.zeros(nat.N_REGS, np.uint64)
        self.saved = np.zeros(nat.N_REGS, np.uint64)
        self.siginfo = np.zeros(16, np.uint64)
        self.stats = dict.fromkeys(("syscalls", "armed_pages"), 0)
        self._new: set[int] = set()
        self.gadget = self._find_gadget()
        self.ctx[:3] = (self.pid, self.mem, self.gadget)
        if self.attached:
            self._arm_existing(int(tids[0]))
        self._held = hold
        if not hold:
            self._start()

    def _start(self) -> None:
        self.clock_pairs.append(clock_pair())
        for tid in self.tids:
            self._resume(int(tid), 0)

    # -- ptrace helpers ----------------------------------------------------------------

    def _resume(self, tid: int, sig: int) -> None:
        nat.ptrace(nat.PTRACE_SYSCALL, tid, 0, sig)

    def _getregs(self, tid: int, into: np.ndarray) -> bool:
        return nat.ptrace(nat.PTRACE_GETREGS, tid, 0, into.ctypes.data) == 0

    def _find_gadget(self) -> int:
        """A ``syscall`` instruction in the process (its vDSO's, else any
        executable mapping's) to make a stopped thread run one call."""
        found = syscall_instruction(self.pid, self.mem)
        if found is None:
            raise RecordError(f"process {self.pid}: no syscall instruction found to act through")
        return found

    def _protect(self, tid: int, address: int, size: int, prot: int) -> bool:
        """Make stopped thread ``tid`` run ``mprotect(address, size, prot)``."""
        result = nat.inject_mprotect(
            tid, self.gadget, address, size, prot, self.saved, self.regs, self.status
        )
        return result == 0

    # -- tracking ----------------------------------------------------------------------

    def _pages(self) -> dict[int, tuple[int, int, int]]:
        return {
            int(p): (int(st), int(w), int(h))
            for p, st, w, h in zip(self.page_keys, self.state, self.want, self.last, strict=True)
        }

    def _set_pages(self, pages: dict[int, tuple[int, int, int]]) -> None:
        keys = sorted(pages)
        self.page_keys = np.array(keys, np.uint64)
        self.state = np.array([pages[k][0] for k in keys], np.int64)
        self.want = np.array([pages[k][1] for k in keys], np.int64)
        self.last = np.array([pages[k][2] for k in keys], np.uint64)

    def _track(self, start: int, size: int, want: int) -> None:
        pages = self._pages()
        for page in range(start & ~(PAGE - 1), start + size, PAGE):
            # Armed again; its last capture stays (unchanged bytes are no
            # new revision).
            pages[page] = (ARMED, want, pages[page][2] if page in pages else 0)
            self.stats["armed_pages"] += 1
        self._set_pages(pages)

    def _forget(self, start: int, size: int) -> None:
        pages = self._pages()
        for page in range(start & ~(PAGE - 1), start + size, PAGE):
            pages.pop(page, None)
        self._set_pages(pages)

    def _arm_existing(self, tid: int) -> None:
        """Attached: arm the anonymous executable mappings there already."""
        for m in read_maps(self.pid):
            if "x" not in m.prot or (m.path and not m.path.startswith("[anon")):
                continue
            want = PROT_EXEC | (PROT_READ if "r" in m.prot else 0)
            want |= PROT_WRITE if "w" in m.prot else 0
            if self._protect(tid, m.start, m.length, want & ~PROT_EXEC):
                self._track(m.start, m.length, want)

    def _entry(self, slot: int, tid: int) -> None:
        """A thread at the entry of a call that may change code pages."""
        nr, a0, a1, a2, a3 = (int(x) for x in self.info[3:8])
        self.stats["syscalls"] += 1
        size = (a1 + PAGE - 1) & ~(PAGE - 1)
        if nr == nat.SYS_MUNMAP:
            self.pending[tid] = ("forget", a0, size)
        elif a2 & PROT_EXEC and (
            nr != nat.SYS_MMAP or not self.anonymous_only or a3 & MAP_ANONYMOUS
        ):
            # Asked to be executable: made without PROT_EXEC, tracked on success.
            self._getregs(tid, self.regs)
            self.regs[nat.REGISTER_NAMES.index("rdx")] = a2 & ~PROT_EXEC
            nat.ptrace(nat.PTRACE_SETREGS, tid, 0, self.regs.ctypes.data)
            self.pending[tid] = ("track", nr, a0, size, a2)
        else:
            self.pending[tid] = ("forget", a0, size)  # no longer executable, or remapped
        self.watch[slot] = 1

    def _exit(self, slot: int, tid: int) -> None:
        self.watch[slot] = 0
        rval = int(self.info[3])
        what = self.pending.pop(tid, None)
        if what is None or -4096 < rval < 0:
            return
        if what[0] == "forget":
            self._forget(what[1], what[2])
        else:
            _, nr, a0, size, prot = what
            start = rval if nr == nat.SYS_MMAP else a0
            self._track(start, size, prot)

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> CaptureResult:
        """Capture until the process exits, ``max_revisions`` are captured
        or :meth:`stop` is called (from a signal handler); an attached
        process is then let go with its pages' protections back."""
        if self._held:
            self._held = False
            self._start()
        try:
            self._loop()
        except KeyboardInterrupt:
            # ^C: an attached process goes on as it was; a launched one dies
            # with hwtrace (PTRACE_O_EXITKILL).
            if self.attached and len(self.tids):
                self._let_go(-1, 0)
            raise
        self.clock_pairs.append(clock_pair())
        (c0, n0), (c1, n1) = self.clock_pairs[0], self.clock_pairs[-1]
        self._ns_per_tick = (n1 - n0) / max(c1 - c0, 1)
        return self.result()

    def _loop(self) -> None:
        while len(self.tids):
            room = self.ring.shape[0]
            if self.max_revisions is not None:
                room = max(1, min(room, self.max_revisions - len(self.revisions)))
            why = nat.capture_wait(
                self.tids, self.watch, self.page_keys, self.state, self.want, self.last,
                self.ring[:room], self.meta[:room], self.ctx, self.info, self.out, self.work,
            )  # fmt: skip
            self._drain()
            slot, st, tid = int(self.out[0]), int(self.out[1]), int(self.out[3])
            if (self._stopping or self._enough()) and why != nat.CAP_NOCHILD:
                current = slot >= 0 and why in (nat.CAP_SYSCALL, nat.CAP_EVENT)
                self._let_go(tid if current else -1, st if why == nat.CAP_EVENT else 0)
                break
            if why == nat.CAP_FULL:
                continue  # drained: every thread is running
            if why == nat.CAP_SYSCALL:
                if int(self.info[0]) & 0xFF == 1:
                    self._entry(slot, tid)
                else:
                    self._exit(slot, tid)
                self._resume(tid, 0)
            elif why == nat.CAP_EVENT:
                self._event(slot, tid, st)
            elif why == nat.CAP_NOCHILD:
                break
            elif why == nat.CAP_ERROR:
                if st != -errno.ESRCH:
                    raise RecordError(f"capturing code: ptrace failed: {os.strerror(-st)}")

    def _let_go(self, tid: int, status: int) -> None:
        """Stop every thread, give the tracked pages the protections the
        program asked for, detach (an attached process goes on; a launched
        one too, until it exits)."""
        held: dict[int, int] = {}
        if tid >= 0 and os.WIFSTOPPED(status) and not status >> 16:
            sig = os.WSTOPSIG(status)
            if sig not in (signal.SIGTRAP, signal.SIGSTOP):
                held[tid] = sig  # the program's own signal, delivered at the end
        faulted: set[int] = set()
        tids = [int(t) for t in self.tids]
        for t in tids:
            nat.tgkill(self.pid, t, signal.SIGSTOP)
        if tid >= 0:
            nat.ptrace(nat.PTRACE_CONT, tid, 0, 0)
        stopped = [t for t in tids if self._until_sigstop(t, held, faulted)]
        # Threads held at a fault on a tracked page run it again once the
        # protections are back: their SIGSTOP comes after.
        # Any stopped thread can run the mprotect calls (one held at a
        # fault too, as the capture loop's own do).
        at = next((t for t in stopped if t not in faulted), stopped[0] if stopped else None)
        if at is not None:
            # Calls made without PROT_EXEC whose end was not seen: done by
            # now, they get what they asked for too (an mmap's address is
            # not known: a limit).
            for what in self.pending.values():
                if what[0] == "track" and what[1] != nat.SYS_MMAP:
                    self._track(what[2], what[3], what[4])
            for start, size, want in self._ranges():
                self._protect(at, start, size, want)
        for t in faulted:
            nat.ptrace(nat.PTRACE_CONT, t, 0, 0)
            if not self._until_sigstop(t, held, set()):
                stopped.remove(t)
        for t in stopped:
            nat.ptrace(nat.PTRACE_DETACH, t, 0, held.get(t, 0))
        self.tids = np.zeros(0, np.int64)

    def _until_sigstop(self, tid: int, held: dict[int, int], faulted: set[int]) -> bool:
        """Run ``tid`` (without system call stops) to our SIGSTOP; False when
        it is gone.  A fault on a tracked page stops it too (``faulted``)."""
        while True:
            st = _wait(tid, self.status)
            if st < 0 or not os.WIFSTOPPED(st):
                return False
            sig = os.WSTOPSIG(st)
            if st >> 16 or sig & 0x7F == signal.SIGTRAP:
                nat.ptrace(nat.PTRACE_CONT, tid, 0, 0)  # an event, a system call stop
                continue
            if sig == signal.SIGSTOP:
                return True
            if sig == signal.SIGSEGV and self._is_tracked_fault(tid):
                faulted.add(tid)
                return True
            held[tid] = sig
            nat.ptrace(nat.PTRACE_CONT, tid, 0, 0)

    def _is_tracked_fault(self, tid: int) -> bool:
        nat.ptrace(nat.PTRACE_GETSIGINFO, tid, 0, self.siginfo.ctypes.data)
        page = int(self.siginfo[2]) & ~(PAGE - 1)
        i = int(np.searchsorted(self.page_keys, np.uint64(page)))
        return i < len(self.page_keys) and int(self.page_keys[i]) == page

    def _ranges(self) -> list[tuple[int, int, int]]:
        """The tracked pages as (start, size, wanted protection), merged."""
        out: list[list[int]] = []
        for page, want in zip(self.page_keys.tolist(), self.want.tolist(), strict=True):
            if out and out[-1][0] + out[-1][1] == page and out[-1][2] == want:
                out[-1][1] += PAGE
            else:
                out.append([page, PAGE, want])
        return [(a, b, c) for a, b, c in out]

    def _drain(self) -> None:
        """Take the captured pages out of the ring."""
        n = int(self.ctx[3])
        for k in range(n):
            t, page, tid, ip, cpu = (int(x) for x in self.meta[k])
            self.revisions.append(CodeChange(t, page, self.ring[k].tobytes(), tid, cpu, ip))
        self.ctx[3] = 0

    def _event(self, slot: int, tid: int, st: int) -> None:
        if os.WIFEXITED(st) or os.WIFSIGNALED(st):
            if tid == self.pid:
                self.exit_status = st
            self._drop(tid)
            return
        if not os.WIFSTOPPED(st):
            return
        sig = os.WSTOPSIG(st)
        event = st >> 16
        if slot < 0:
            # A new thread's first stop, before its creator's clone event.
            self._add(tid, stopped=True)
            self._resume(tid, 0)
            return
        if sig == signal.SIGTRAP and event == _EVENT_CLONE:
            child = np.zeros(1, np.uint64)
            nat.ptrace(nat.PTRACE_GETEVENTMSG, tid, 0, child.ctypes.data)
            self._add(int(child[0]), stopped=False)
            self._resume(tid, 0)
        elif sig == signal.SIGTRAP and event == _EVENT_EXEC:
            # A new address space: nothing tracked in it yet.
            self._set_pages({})
            self.gadget = self._find_gadget()
            self._resume(tid, 0)
        elif sig == signal.SIGTRAP and event:
            self._resume(tid, 0)
        elif sig == signal.SIGSTOP and event == 0 and tid in self._new:
            self._new.discard(tid)
            self._resume(tid, 0)
        else:
            self._resume(tid, sig)  # the program's own signal

    def _add(self, tid: int, stopped: bool) -> None:
        """A new thread; ``stopped``: its first stop (SIGSTOP) was seen."""
        if tid in self.tids.tolist():
            return
        self.tids = np.append(self.tids, tid)
        self.watch = np.append(self.watch, 0)
        if not stopped:
            self._new.add(tid)  # its SIGSTOP is still to come

    def _drop(self, tid: int) -> None:
        keep = self.tids != tid
        self.tids = self.tids[keep]
        self.watch = self.watch[keep]
        self.pending.pop(tid, None)

    def result(self) -> CaptureResult:
        stats = dict(self.stats)
        stats["exec_faults"], stats["write_faults"] = int(self.ctx[4]), int(self.ctx[5])
        stats["revisions"] = len(self.revisions)
        # Time spent handling faults in hwtrace (TSC ticks, and ns).
        stats["fault_ticks"] = int(self.ctx[6])
        stats["fault_ns"] = int(self.ctx[6] * getattr(self, "_ns_per_tick", 0.0))
        return CaptureResult(
            self.pid, list(self.revisions), stats, self.exit_status, tuple(self.clock_pairs)
        )

    def close(self) -> None:
        if getattr(self, "_held", False):
            self._held = False
            if self.attached:  # never run: let go with the protections back
                self._start()
                self._let_go(-1, 0)
            else:  # never run: the launched program does not start at all
                try:
                    os.kill(self.pid, signal.SIGKILL)
                    _wait(self.pid, self.status)
                except (ProcessLookupError, ChildProcessError):
                    pass
        if self.mem >= 0:
            os.close(self.mem)
            self.mem = -1


AGENTS = ("auto", "in-process", "ptrace")


def code_capture(target: Sequence[str] | int, agent: str = "auto", **options):
    """A capture of ``target``'s code revisions by ``agent``: ``in-process``
    (:class:`~hwtrace.record.jitagent.InProcessCapture`: handlers in the
    process, eBPF in the kernel; root), ``ptrace`` (:class:`CodeCapture`)
    or ``auto`` (in-process where it can run)."""
    from .jitagent import InProcessCapture, in_process_available  # jitagent imports this module

    if agent not in AGENTS:
        raise ValueError(f"agent {agent!r}: one of {', '.join(AGENTS)}")
    if agent == "in-process" or (agent == "auto" and in_process_available() is None):
        return InProcessCapture(target, **options)
    return CodeCapture(target, **options)


def capture_code(target: Sequence[str] | int, agent: str = "auto", **options) -> CaptureResult:
    """Run ``target`` (argv) or attach to a pid and capture its code
    revisions until it exits (see :func:`code_capture`)."""
    cap = code_capture(target, agent, **options)
    try:
        return cap.run()
    finally:
        cap.close()
