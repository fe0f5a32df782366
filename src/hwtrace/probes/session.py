"""Tracepoints in a live process: placing, patching, counting, removing.

A :class:`ProbeSession` owns the tracepoints hwtrace put into one process.
Each operation borrows one thread of the target (see :mod:`.ptrace`) for the
system calls it needs (``mmap``, ``rt_sigaction``, ``membarrier``) and
writes code through ``/proc/PID/mem``; the other threads keep running.  The
borrowed thread runs them through the resume block (:func:`.codegen.resume_block`),
put in padding of the process's code that nothing uses (after its vDSO's
image) and taken out again on :meth:`ProbeSession.close`: were hwtrace
killed at any point, the thread would go back to where it was.

A *jump* tracepoint replaces the instruction(s) at the site by
``jmp rel32`` to a trampoline that counts the hit and runs the displaced
instructions; every displaced instruction boundary inside the jump reads
``0xCC`` (see :mod:`.alloc`), and the runtime's SIGTRAP handler sends a
thread that arrives there to that instruction's relocated copy.  Where no
trampoline address meets the constraint, a *trap* tracepoint (``int3`` at
the site, the handler redirecting to the same kind of trampoline) is used.

Patching needs only single-byte atomic writes, with every core of the
process serialized (``membarrier`` ``SYNC_CORE``) between phases, after the
Linux kernel's ``text_poke_bp``:

1. ``0xCC`` at the site and at every covered instruction start; sync.
2. the other displacement bytes (nothing can execute them now); sync.
3. ``0xE9`` at the site; sync.

Removal runs the same phases backwards.  Redirect entries and trampolines
are kept until no thread can still be inside them (:meth:`ProbeSession.reclaim`).
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..image.process import ProcessModules, code_slack, read_maps
from . import codegen as cg
from .alloc import CHUNK_CODE, CHUNK_SIZE, TrampolineSpace, free_gaps
from .locate import Site, SiteError, check_boundary, resolve
from .plan import JUMP, TRAP, Layout, choose_window, data_reach, lay_out, trampoline_size
from .ptrace import (
    ProcessGone,
    PtraceError,
    SeizedThread,
    process_alive,
    threads_blocking,
    threads_of,
)
from .relocate import RelocationError, Window, decode_window
from .rings import EVENT_DTYPE, NREGS, CounterPages, Rings
from .uprobe import Uprobe, UprobeError

__all__ = ["JUMP", "TRAP", "UPROBE", "ProbeError", "ProbeSession", "Tracepoint"]

UPROBE = "uprobe"

SYS_OPEN, SYS_CLOSE, SYS_MMAP, SYS_MPROTECT, SYS_MUNMAP = 2, 3, 9, 10, 11
SYS_RT_SIGACTION, SYS_MEMBARRIER = 13, 324
PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
MAP_SHARED, MAP_PRIVATE, MAP_ANONYMOUS, MAP_FIXED_NOREPLACE = 0x01, 0x02, 0x20, 0x100000
MEMBARRIER_CMD_QUERY = 0
MEMBARRIER_SYNC_CORE = 1 << 5  # MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE
MEMBARRIER_REGISTER_SYNC_CORE = 1 << 6
PAGE = 0x1000


class ProbeError(Exception):
    """A tracepoint could not be placed or removed; the message says why."""


@dataclass
class Tracepoint:
    """One tracepoint: where it is, what kind it got, and its state."""

    id: int
    spec: str  # as the user gave it
    site: Site
    kind: str  # JUMP or TRAP
    trampoline: int
    size: int
    counter: int  # address of its hit counter in the target
    original: bytes  # the bytes the patch replaces
    patched: bytes
    starts: tuple[int, ...]  # offsets of the covered instruction starts
    redirects: list[tuple[int, int]] = field(default_factory=list)
    enabled: bool = False
    note: str = ""  # why it is not a jump tracepoint
    returns: bool = False  # an entry/exit tracepoint
    uprobe: Uprobe | None = None  # the kernel uprobe of a UPROBE tracepoint
    earlier_hits: int = 0  # a UPROBE tracepoint's hits before it was last disabled
    length: int = 0  # bytes whose instructions were relocated

    @property
    def address(self) -> int:
        return self.site.address


@dataclass
class _Retired:
    trampoline: int
    size: int
    redirects: list[tuple[int, int]]


class ProbeSession:
    """The tracepoints hwtrace holds in process ``pid``.

    ``add`` places and enables a tracepoint; ``disable``/``enable`` take the
    patch out and put it back; ``remove`` restores the original bytes;
    ``close`` removes everything, waits until no thread can be in hwtrace's
    code and unmaps it, and puts back the SIGTRAP action it found.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        if not os.path.exists(f"/proc/{pid}"):
            raise ProbeError(f"no process with pid {pid}")
        try:
            self.mem = os.open(f"/proc/{pid}/mem", os.O_RDWR)
        except PermissionError as e:
            raise ProbeError(f"process {pid}: not permitted to write its memory ({e})") from e
        except FileNotFoundError as e:
            raise ProbeError(f"no process with pid {pid}") from e
        self.space = TrampolineSpace()
        self.runtime = 0
        self.tracepoints: dict[int, Tracepoint] = {}
        self.retired: list[_Retired] = []
        self._next_id = 1
        self._sizes: dict[int, int] = {}  # trampoline address -> bytes reserved
        self._slots: list[tuple[int, int]] = []  # redirect table slots, (from, to); 0 = free
        self._modules: ProcessModules | None = None
        self._thread: SeizedThread | None = None
        self._block = 0  # the resume block's address, and the bytes it covers
        self._block_original = b""
        self.rings: Rings | None = None
        self.counters: CounterPages | None = None
        self._counters_fd = -1
        self._rings_at = 0
        self._threads_at = 0  # the entry/exit tracepoints' return stacks
        self.tid_offset = -1
        self._closed = False

    # -- memory ------------------------------------------------------------------

    def read(self, address: int, size: int) -> bytes:
        try:
            return os.pread(self.mem, size, address)
        except OSError as e:
            raise ProbeError(f"process {self.pid}: cannot read {size} bytes at {address:#x}: "
                             f"{e.strerror}") from e  # fmt: skip

    def write(self, address: int, data: bytes) -> None:
        try:
            n = os.pwrite(self.mem, data, address)
        except OSError as e:
            raise ProbeError(f"process {self.pid}: cannot write at {address:#x}: "
                             f"{e.strerror}") from e  # fmt: skip
        if n != len(data):
            raise ProbeError(f"process {self.pid}: short write at {address:#x}")

    def read_original(self, address: int, size: int) -> bytes:
        """Memory as it was before hwtrace's patches."""
        data = bytearray(self.read(address, size))
        for tp in self.tracepoints.values():
            lo, hi = max(address, tp.address), min(address + size, tp.address + len(tp.original))
            if lo < hi:
                data[lo - address : hi - address] = tp.original[lo - tp.address : hi - tp.address]
        return bytes(data)

    def read_u64(self, address: int) -> int:
        return int.from_bytes(self.read(address, 8), "little")

    # -- the borrowed thread -----------------------------------------------------

    @contextmanager
    def _borrowed(self) -> Iterator[SeizedThread]:
        """A thread of the process, seized for the block.  ``^C``, SIGTERM
        and SIGHUP wait until it is given back: interrupted half way, the
        thread would stay stopped, or run on with hwtrace's registers."""
        if self._thread is not None:
            yield self._thread
            return
        with _signals_held():
            try:
                thread = SeizedThread(self.pid)
            except ProcessGone as e:
                raise ProbeError(str(e)) from e
            except PtraceError as e:
                raise ProbeError(str(e)) from e
            self._thread = thread
            try:
                self._arm(thread)
                yield thread
            except ProcessGone as e:
                raise ProbeError(str(e)) from e
            finally:
                self._thread = None
                thread.release()

    def _arm(self, t: SeizedThread) -> None:
        """Put the resume block in (once) and the borrowed thread's context
        in it, before the thread runs anything of ours."""
        if not self._block:
            at = code_slack(self.pid, self.mem, cg.RESUME_SIZE)
            if at is None:
                raise ProbeError(f"process {self.pid}: no unused padding in its code for "
                                 f"hwtrace's {cg.RESUME_SIZE} bytes of call gadgets")  # fmt: skip
            self._block_original = self.read(at, cg.RESUME_SIZE)
            self.write(at, cg.resume_block(at))
            self._block = at
        self.write(
            self._block + cg.RESUME_CONTEXT, cg.resume_context(t.continuation(), t.signal_mask)
        )

    def _disarm(self) -> None:
        """Take the resume block out (no thread is borrowed)."""
        if self._block:
            self.write(self._block, self._block_original)
            self._block = 0

    def _syscall(self, t: SeizedThread, nr: int, *args: int) -> int:
        return t.syscall(self._block + cg.RESUME_SYSCALL, nr, *args)

    def _store(self, t: SeizedThread, address: int, value: int) -> None:
        t.store(self._block + cg.RESUME_STORE, address, value)

    def _sync_cores(self, t: SeizedThread) -> None:
        r = self._syscall(t, SYS_MEMBARRIER, MEMBARRIER_SYNC_CORE, 0, 0)
        if r < 0:
            raise ProbeError(f"process {self.pid}: membarrier(SYNC_CORE): {os.strerror(-r)}")

    # -- the runtime ---------------------------------------------------------------

    def _map_anonymous(self, t: SeizedThread, size: int, what: str) -> int:
        """Private read-write memory of ``size`` bytes in the process."""
        r = self._syscall(t, SYS_MMAP, 0, size, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, (1 << 64) - 1, 0)  # fmt: skip
        if r < 0:
            raise ProbeError(f"process {self.pid}: cannot map {what}: {os.strerror(-r)}")
        return r

    def _ensure_runtime(self, t: SeizedThread) -> None:
        if self.runtime:
            return
        base = self._map_anonymous(t, cg.RUNTIME_SIZE, "hwtrace's runtime")
        self.write(base, cg.runtime_code(base))
        r = self._syscall(t, SYS_MPROTECT, base, PAGE, PROT_READ | PROT_EXEC)
        if r < 0:
            raise ProbeError(f"process {self.pid}: mprotect: {os.strerror(-r)}")
        self.runtime = base
        q = self._syscall(t, SYS_MEMBARRIER, MEMBARRIER_CMD_QUERY, 0, 0)
        if q < 0 or not q & MEMBARRIER_SYNC_CORE:
            raise ProbeError("this kernel has no membarrier SYNC_CORE, needed to patch code safely")
        r = self._syscall(t, SYS_MEMBARRIER, MEMBARRIER_REGISTER_SYNC_CORE, 0, 0)
        if r < 0:
            raise ProbeError(f"process {self.pid}: membarrier register: {os.strerror(-r)}")
        self.counters = CounterPages(CHUNK_SIZE - CHUNK_CODE)
        path = self.counters.path.encode() + b"\0"
        self.write(base + cg.SCRATCH, path)
        fd = self._syscall(t, SYS_OPEN, base + cg.SCRATCH, os.O_RDWR | os.O_CLOEXEC, 0)
        if fd < 0:
            raise ProbeError(f"process {self.pid}: cannot open hwtrace's counters "
                             f"({self.counters.path}): {os.strerror(-fd)}")  # fmt: skip
        self._counters_fd = fd
        ours, default = cg.runtime_actions(base)
        self.write(base + cg.NEW_ACTION, ours)
        self.write(base + cg.DFL_ACTION, default)
        r = self._syscall(t, SYS_RT_SIGACTION, cg.SIGTRAP, base + cg.NEW_ACTION,
                          base + cg.OLD_ACTION, 8)  # fmt: skip
        if r < 0:
            raise ProbeError(f"process {self.pid}: cannot install the SIGTRAP handler: "
                             f"{os.strerror(-r)}")  # fmt: skip

    def _set_redirect(self, t: SeizedThread, src: int, dst: int) -> None:
        """Add ``src -> dst`` to the redirect table: ``to`` first, then ``from``
        by one store of the thread, then the high-water mark."""
        slot = next((i for i, s in enumerate(self._slots) if s[0] == 0), len(self._slots))
        if slot >= cg.TABLE_CAPACITY:
            raise ProbeError("the redirect table is full")
        entry = self.runtime + cg.TABLE + 16 * slot
        self.write(entry + 8, dst.to_bytes(8, "little"))
        self._store(t, entry, src)
        if slot == len(self._slots):
            self._slots.append((src, dst))
            self._store(t, self.runtime + cg.COUNT, len(self._slots))
        else:
            self._slots[slot] = (src, dst)

    def _retire_redirect(self, t: SeizedThread, src: int, dst: int) -> None:
        """Mark ``src -> dst`` retired: the trap handler then takes it only
        when no live entry matches (a new tracepoint at the same place)."""
        for i, (s, d) in enumerate(self._slots):
            if s == src and d == dst:
                entry = self.runtime + cg.TABLE + 16 * i + 8
                self._store(t, entry, dst | cg.RETIRED)
                self._slots[i] = (src, dst | cg.RETIRED)
                return

    def _clear_redirect(self, t: SeizedThread, src: int, dst: int) -> None:
        """Take the retired ``src -> dst`` out (a newer tracepoint at the same
        place may have its own entry for ``src``, which stays)."""
        for i, (s, d) in enumerate(self._slots):
            if s == src and d == dst | cg.RETIRED:
                self._store(t, self.runtime + cg.TABLE + 16 * i, 0)
                self._slots[i] = (0, 0)
                return

    def trap_counts(self) -> tuple[int, int]:
        """Traps the runtime redirected, and traps it passed on."""
        if not self.runtime:
            return 0, 0
        return self.read_u64(self.runtime + cg.REDIRECTED), self.read_u64(self.runtime + cg.PASSED)

    # -- placing ------------------------------------------------------------------

    @property
    def modules(self) -> ProcessModules:
        if self._modules is None:
            try:
                self._modules = ProcessModules(self.pid)
            except OSError as e:
                raise ProbeError(f"process {self.pid} is gone ({e.strerror})") from e
        return self._modules

    def resolve(self, spec: str) -> Site:
        """Where ``spec`` (``func``, ``func+off``, ``module!func``, an address,
        ``file:line``) is in the process."""
        try:
            site = resolve(self.modules, spec)
            if site.start and site.address != site.start:
                code = self.read_original(site.start, site.address - site.start + 16)
                check_boundary(site, code)
            return site
        except SiteError as e:
            raise ProbeError(str(e)) from e

    def _check_free(self, address: int, length: int) -> None:
        for tp in self.tracepoints.values():
            lo, hi = tp.address, tp.address + tp.length
            if address < hi and lo < address + length:
                raise ProbeError(
                    f"{address:#x}: too close to tracepoint {tp.id} at {tp.address:#x} "
                    f"({tp.spec}); their patched bytes would overlap"
                )

    def add(
        self,
        spec: str,
        *,
        kind: str | None = None,
        record: bool = False,
        regs: tuple[str, ...] = cg.ARGUMENTS[:4],
        returns: bool = False,
    ) -> Tracepoint:
        """Place and enable a tracepoint at ``spec``; ``kind`` forces
        :data:`TRAP` or :data:`UPROBE` (None: a jump where one fits, else a
        trap, else a kernel uprobe).  A hit
        counts; with ``record`` it also writes an event with the registers
        ``regs`` (up to four; default the first four arguments) into the
        shared buffers that :meth:`drain` reads.  ``returns`` (at a
        function's entry) also catches each return: counted apart
        (:meth:`returns`), and recorded with the return value (``rax``)."""
        self._check_open()
        bad = [r for r in regs if r not in cg.REGISTERS and r != "rip"]
        if bad or len(regs) > NREGS:
            raise ProbeError(f"registers to record: at most {NREGS} of "
                             f"{', '.join(cg.REGISTERS)}, rip (not {', '.join(bad) or regs})")  # fmt: skip
        site = self.resolve(spec)
        if returns and not site.entry:
            raise ProbeError(f"{spec}: an entry/exit tracepoint goes at a function's first "
                             f"instruction, not at {site.function or hex(site.address)}")  # fmt: skip
        if kind != UPROBE:
            blocking = self._trap_blockers()
            if blocking:
                # The kernel forces the default action (death) on an int3 in
                # such a thread (force_sig_info): no trap, no jump (its
                # embedded traps, the int3 of patching); a kernel uprobe
                # handles its int3 before any signal.
                why = _blocks_sigtrap(self.pid, blocking[0])
                if kind == TRAP:
                    raise ProbeError(f"{why}; a kernel uprobe (--uprobe) can count hits there")
                return self._place_uprobe(spec, site, record or returns, why)
        with self._borrowed() as t:
            self._ensure_runtime(t)
            if returns:
                self._ensure_thread_table(t)
            event = None
            if record:
                self._ensure_rings(t)
                assert self.rings is not None
                g = self.rings.geometry
                event = cg.EventSpec(self._next_id, self._rings_at, g.slots_offset,
                                     g.buffer_shift, g.buffers, g.slots, self.tid_offset,
                                     tuple(regs), rdpid=cg.cpu_has_rdpid())  # fmt: skip
            tp = self._place(t, spec, site, kind, event, self._threads_at if returns else 0)
            self._patch(t, tp)
        return tp

    def _trap_blockers(self) -> list[int]:
        """The threads that block SIGTRAP.  One in hwtrace's own trap handler
        blocks it too, until the handler returns (the kernel adds the signal
        to the mask while its handler runs): such a thread is stopped and
        looked at, its mask read again while it cannot move."""
        out = []
        suspects = threads_blocking(self.pid, signal.SIGTRAP)
        for _ in range(3):
            if not suspects:
                return []
            # A thread just created blocks every signal until glibc sets its
            # mask: a block that goes away within milliseconds is no block.
            time.sleep(0.005)
            suspects = [t for t in threads_blocking(self.pid, signal.SIGTRAP) if t in suspects]
        for tid in suspects:
            if self.runtime:
                try:
                    with SeizedThread(self.pid, tid) as th:
                        rip = th.saved_registers.rip
                        still = tid in threads_blocking(self.pid, signal.SIGTRAP)
                except PtraceError:
                    continue  # gone meanwhile
                if not still or self.runtime <= rip < self.runtime + cg.PAGE:
                    continue
            out.append(tid)
        return out

    def _ensure_thread_table(self, t: SeizedThread) -> None:
        if not self._threads_at:
            self._threads_at = self._map_anonymous(t, cg.THREAD_TABLE_SIZE, "the return stacks")

    def returns(self, tp: Tracepoint) -> int:
        """Returns caught by an entry/exit tracepoint."""
        chunk = self.space.chunk_of(tp.trampoline)
        offset = tp.counter + cg.EXIT_COUNTER - chunk.base - CHUNK_CODE
        return self.counters.read(chunk.page, offset)

    # -- events ---------------------------------------------------------------------

    def _ensure_rings(self, t: SeizedThread) -> None:
        if self.rings is not None:
            return
        rings = Rings()
        try:
            path = rings.path.encode() + b"\0"
            self.write(self.runtime + cg.SCRATCH, path)
            fd = self._syscall(t, SYS_OPEN, self.runtime + cg.SCRATCH, os.O_RDWR, 0)
            if fd < 0:
                raise ProbeError(f"process {self.pid}: cannot open the event buffers "
                                 f"({rings.path}): {os.strerror(-fd)}")  # fmt: skip
            size = rings.geometry.size
            at = self._syscall(t, SYS_MMAP, 0, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
            self._syscall(t, SYS_CLOSE, fd)
            if at < 0:
                raise ProbeError(f"process {self.pid}: cannot map the event buffers: "
                                 f"{os.strerror(-at)}")  # fmt: skip
        except BaseException:
            rings.close()
            raise
        self.rings, self._rings_at = rings, at
        self.tid_offset = _tid_offset(self, t)

    def drain(self, final: bool = False) -> np.ndarray:
        """Events written since the last drain (:data:`~.rings.EVENT_DTYPE`,
        in time order); ``lost`` counts the ones overwritten before."""
        if self.rings is None:
            return np.zeros(0, EVENT_DTYPE)
        return self.rings.drain(final)

    @property
    def lost(self) -> int:
        return self.rings.lost if self.rings is not None else 0

    def _place(
        self,
        t: SeizedThread,
        spec: str,
        site: Site,
        kind: str | None,
        event: cg.EventSpec | None = None,
        returns: int = 0,
    ) -> Tracepoint:
        a = site.address
        recording = event is not None or bool(returns)
        if kind == UPROBE:
            return self._place_uprobe(spec, site, recording, "a kernel uprobe as asked")
        # A jump may cover the first bytes after its function: whatever
        # starts there is an embedded trap like any covered instruction (the
        # code that jumps there takes the trap path).  Not past the code.
        mapping = self.modules.module_at(a)
        end = mapping.end if mapping is not None else a + 32
        code = self.read_original(a, min(32, end - a))
        try:
            window, chosen, note = choose_window(code, a, end, kind)
        except RelocationError as e:
            if code[:1] == b"\xcc":  # someone else's breakpoint: a uprobe would not fit either
                raise ProbeError(str(e)) from e
            return self._place_uprobe(spec, site, recording, str(e))
        self._check_free(a, window.length)
        if chosen == JUMP and site.limit and site.limit < a + 5:
            note = (
                f"the jump covers {site.limit:#x}, after the end of "
                f"{site.function.split('+')[0]}: code that goes there takes the trap path"
            )
        layout = None
        if chosen == JUMP:
            layout = self._allocate(t, window, JUMP, event, returns)
            if layout is None:
                note = f"{a:#x}: no trampoline address within reach meets the constraint"
                window, chosen = decode_window(code, a, 1), TRAP
        if layout is None:
            layout = self._allocate(t, window, TRAP, event, returns)
            if layout is None:
                reason = f"{a:#x}: no room for a trampoline within ±2 GiB"
                return self._place_uprobe(spec, site, recording, reason)
        self.write(layout.trampoline, layout.code)
        tp = Tracepoint(
            id=self._next_id,
            spec=spec,
            site=site,
            kind=layout.kind,
            trampoline=layout.trampoline,
            size=self._sizes[layout.trampoline],
            counter=layout.counter,
            original=layout.original,
            patched=layout.patched,
            starts=layout.starts,
            redirects=list(layout.redirects),
            note=note,
            length=layout.window.length,
            returns=bool(returns),
        )
        self._next_id += 1
        for src, dst in tp.redirects:
            self._set_redirect(t, src, dst)
        self.tracepoints[tp.id] = tp
        return tp

    def _place_uprobe(self, spec: str, site: Site, recording: bool, reason: str) -> Tracepoint:
        """The last resort: a kernel uprobe at the site (counted only, so
        refused when the tracepoint was to record events or returns)."""
        if recording:
            raise ProbeError(f"{reason}; a kernel uprobe could count hits there, "
                             "but not record events or returns")  # fmt: skip
        mapping = self.modules.module_at(site.address)
        if mapping is None or not mapping.path.startswith("/"):
            raise ProbeError(f"{reason}; and no file is mapped there for a kernel uprobe")
        offset = site.address - mapping.start + mapping.offset
        try:
            probe = Uprobe(self.pid, mapping.path, offset, self._next_id)
        except UprobeError as e:
            raise ProbeError(f"{reason}; a kernel uprobe failed too: {e}") from e
        tp = Tracepoint(self._next_id, spec, site, UPROBE, 0, 0, 0, b"", b"", (0,),
                        note=reason, uprobe=probe)  # fmt: skip
        tp.enabled = True
        self._next_id += 1
        self.tracepoints[tp.id] = tp
        return tp

    def _allocate(
        self,
        t: SeizedThread,
        window: Window,
        kind: str,
        event: cg.EventSpec | None = None,
        returns: int = 0,
    ) -> Layout | None:
        """Reserve a trampoline for ``window`` and lay the tracepoint out, or
        None when no address within reach fits."""
        site = window.address
        starts = tuple(window.starts) if kind == JUMP else ()
        try:
            size = trampoline_size(window, event, bool(returns))
        except RelocationError as e:
            raise ProbeError(str(e)) from e
        reach = data_reach(window)
        where = self.space.in_chunks(site, starts, size, reach)
        if where is None:
            where = self._new_chunk(t, site, starts, size, reach)
            if where is None:
                return None
        tramp, chunk = where
        try:
            layout = lay_out(window, kind, tramp, event, returns)
        except RelocationError as e:
            raise ProbeError(str(e)) from e
        if len(layout.code) > size:
            raise ProbeError(f"{site:#x}: relocated code larger than planned")
        chunk.take(tramp, size)
        self._sizes[tramp] = size
        return layout

    def _new_chunk(self, t: SeizedThread, site: int, starts: tuple[int, ...], size: int, reach):
        for _ in range(4):
            gaps = free_gaps(read_maps(self.pid))
            spot = self.space.new_chunk(site, starts, size, gaps, reach)
            if spot is None:
                return None
            tramp, base = spot
            # Code: private anonymous memory, written through /proc/PID/mem
            # and never writable in the process.  Data (the hit counters):
            # a page of memory shared with hwtrace, so the counts outlive
            # the process.
            r = self._syscall(t, SYS_MMAP, base, CHUNK_CODE, PROT_READ | PROT_EXEC,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                              (1 << 64) - 1, 0)  # fmt: skip
            if r == -errno.EEXIST:
                continue  # the process mapped something there meanwhile
            if r < 0:
                raise ProbeError(f"process {self.pid}: mmap for a trampoline: {os.strerror(-r)}")
            if r != base:  # a kernel without MAP_FIXED_NOREPLACE treats it as a hint
                self._syscall(t, SYS_MUNMAP, r, CHUNK_CODE)
                continue
            page = self.counters.take()
            r = self._syscall(t, SYS_MMAP, base + CHUNK_CODE, CHUNK_SIZE - CHUNK_CODE,
                              PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE,
                              self._counters_fd, page * self.counters.unit)  # fmt: skip
            if r != base + CHUNK_CODE:
                self.counters.give(page)
                self._syscall(t, SYS_MUNMAP, base, CHUNK_CODE)
                if r >= 0:
                    self._syscall(t, SYS_MUNMAP, r, CHUNK_SIZE - CHUNK_CODE)
                if r == -errno.EEXIST or r >= 0:
                    continue
                raise ProbeError(f"process {self.pid}: mmap for counters: {os.strerror(-r)}")
            self.counters.clear(page)
            return tramp, self.space.add_chunk(base, page)
        return None

    # -- patching -------------------------------------------------------------------

    def _patch(self, t: SeizedThread, tp: Tracepoint) -> None:
        if tp.kind == UPROBE:
            return  # in place from the start; enabling again is a new uprobe (enable)
        a = tp.address
        if tp.kind == TRAP:
            self.write(a, b"\xcc")
            self._sync_cores(t)
        else:
            fixed = [p for p in tp.starts if p < 5]
            for p in fixed:
                self.write(a + p, b"\xcc")
            self._sync_cores(t)
            rest = [p for p in range(1, 5) if p not in fixed]
            for p in rest:
                self.write(a + p, tp.patched[p : p + 1])
            if rest:
                self._sync_cores(t)
            self.write(a, b"\xe9")
            self._sync_cores(t)
        tp.enabled = True

    def _unpatch(self, t: SeizedThread, tp: Tracepoint) -> None:
        if tp.kind == UPROBE:
            return
        a = tp.address
        if tp.kind == TRAP:
            self.write(a, tp.original[:1])
            self._sync_cores(t)
        else:
            self.write(a, b"\xcc")
            self._sync_cores(t)
            fixed = [p for p in tp.starts if p < 5]
            rest = [p for p in range(1, 5) if p not in fixed]
            for p in rest:
                self.write(a + p, tp.original[p : p + 1])
            if rest:
                self._sync_cores(t)
            for p in fixed[1:]:
                self.write(a + p, tp.original[p : p + 1])
            self.write(a, tp.original[:1])
            self._sync_cores(t)
        tp.enabled = False

    def enable(self, tp: Tracepoint) -> None:
        self._check_open()
        if tp.enabled:
            return
        if tp.kind == UPROBE:
            assert tp.uprobe is not None
            try:
                tp.uprobe = Uprobe(self.pid, tp.uprobe.path, tp.uprobe.offset, tp.id)
            except UprobeError as e:
                raise ProbeError(str(e)) from e
            tp.enabled = True
            return
        blocking = self._trap_blockers()
        if blocking:
            raise ProbeError(f"{_blocks_sigtrap(self.pid, blocking[0])}; tracepoint {tp.id} "
                             f"({tp.kind}) cannot go in again")  # fmt: skip
        with self._borrowed() as t:
            self._patch(t, tp)

    def disable(self, tp: Tracepoint) -> None:
        self._check_open()
        if not tp.enabled:
            return
        if tp.kind == UPROBE:
            assert tp.uprobe is not None
            tp.earlier_hits += tp.uprobe.hits()
            tp.uprobe.remove()
            tp.enabled = False
            return
        with self._borrowed() as t:
            self._unpatch(t, tp)

    def remove(self, tp: Tracepoint) -> int:
        """Restore the original bytes; returns the tracepoint's hit count.
        Its trampoline is freed by a later :meth:`reclaim`."""
        self._check_open()
        hits = self.hits(tp)
        if tp.kind == UPROBE:
            assert tp.uprobe is not None
            tp.uprobe.remove()
            del self.tracepoints[tp.id]
            return hits
        with self._borrowed() as t:
            if tp.enabled:
                self._unpatch(t, tp)
            for src, dst in tp.redirects:
                self._retire_redirect(t, src, dst)
        del self.tracepoints[tp.id]
        self.retired.append(_Retired(tp.trampoline, tp.size, tp.redirects))
        return hits

    def hits(self, tp: Tracepoint) -> int:
        """The tracepoint's hit count (readable after the process is gone)."""
        if tp.kind == UPROBE:
            assert tp.uprobe is not None
            return tp.earlier_hits + (tp.uprobe.hits() if tp.enabled else 0)
        chunk = self.space.chunk_of(tp.trampoline)
        return self.counters.read(chunk.page, tp.counter - chunk.base - CHUNK_CODE)

    # -- reclaiming -----------------------------------------------------------------

    def _looks(self, t: SeizedThread) -> list[tuple[int, bool, np.ndarray]] | None:
        """Where each thread is: ``(rip, trap pending, the words on top of its
        stack)``, each thread stopped in turn, briefly; None when one could
        not be looked at.  The last entry has rip 0 and the pending returns
        of hooked frames as its words."""
        out = []
        for tid in threads_of(self.pid):
            if tid == t.tid:
                regs, state = t.saved_registers, None
            else:
                try:
                    state = SeizedThread(self.pid, tid)
                except ProcessGone:
                    continue
                except PtraceError:
                    return None
                regs = state.saved_registers
            try:
                pending = _trap_pending(self.pid, tid)
                out.append((regs.rip, pending, self._stack_words(regs.rsp)))
            finally:
                if state is not None:
                    state.release()
        out.append((0, False, self._pending_exits()))
        return out

    def _busy(
        self, lo: int, hi: int, sources: set[int], looks: list[tuple[int, bool, np.ndarray]]
    ) -> bool:
        """Whether a thread may still get into ``[lo, hi)``: its ``rip`` there
        or in the runtime's handler, a trap pending at one of ``sources`` (its
        rip is just past the int3), a code address of ours in the top of its
        stack (a signal frame, a hooked return), or a return still to come
        through an exit stub there."""
        lo_rt, hi_rt = self.runtime, self.runtime + cg.PAGE
        for rip, pending, stack in looks:
            if lo <= rip < hi or (rip and lo_rt <= rip < hi_rt):
                return True
            if pending and (rip - 1 in sources or not sources):
                return True
            if ((stack >= lo) & (stack < hi)).any():
                return True
            if ((stack >= lo_rt) & (stack < hi_rt)).any():
                return True
        if hi <= lo:  # anywhere: a hooked frame returning into any chunk
            return any(self.space.holds(int(w)) for w in looks[-1][2])
        return False

    def _pending_exits(self) -> np.ndarray:
        """Where hooked functions will return to: for every frame an
        entry/exit tracepoint hooked and that has not returned, the return
        address in its stack slot (an exit stub, unless the frame is gone)."""
        if not self._threads_at:
            return np.zeros(0, np.int64)
        table = np.frombuffer(self.read(self._threads_at, cg.THREAD_TABLE_SIZE), "<u8")
        slots = table.reshape(cg.THREAD_SLOTS, cg.THREAD_SLOT_BYTES // 8)
        out = []
        for row in slots[(slots[:, 0] != 0) & (slots[:, 1] != 0)]:
            for i in range(min(int(row[1]), cg.RETURN_DEPTH)):  # a few frames per thread
                try:
                    out.append(self.read_u64(int(row[3 + 2 * i])))
                except ProbeError:
                    continue  # a stale entry: its stack is gone
        return np.array(out, np.int64)

    def _stack_words(self, rsp: int, size: int = 0x4000) -> np.ndarray:
        try:
            data = os.pread(self.mem, size, rsp)
        except OSError:
            return np.zeros(0, np.uint64)
        return np.frombuffer(data[: len(data) // 8 * 8], "<u8").astype(np.int64)

    def reclaim(self) -> int:
        """Free the trampolines of removed tracepoints that no thread can be
        in any more (each thread is stopped in turn, briefly, to look);
        returns how many were freed.  One still in use (a thread blocked in
        a system call it displaced, say) does not hold the others back."""
        if not self.retired:
            return 0
        with self._borrowed() as t:
            looks = self._looks(t)
            if looks is None:
                return 0
            keep, freed = [], 0
            for r in self.retired:
                sources = {src for src, _ in r.redirects}
                if self._busy(r.trampoline, r.trampoline + r.size, sources, looks):
                    keep.append(r)
                    continue
                for src, dst in r.redirects:
                    self._clear_redirect(t, src, dst)
                chunk = self.space.chunk_of(r.trampoline)
                chunk.give(r.trampoline, r.size)
                del self._sizes[r.trampoline]
                if chunk.empty:
                    self._syscall(t, SYS_MUNMAP, chunk.base, CHUNK_SIZE)
                    del self.space.chunks[chunk.base]
                    self.counters.give(chunk.page)
                freed += 1
            self.retired = keep
        return freed

    # -- closing --------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ProbeError("the probe session is closed")

    def close(self, *, wait: float = 5.0, on_wait: Callable[[], None] | None = None) -> None:
        """Remove every tracepoint, reclaim, and take hwtrace's runtime out
        of the process when nothing can use it any more (the handler stays,
        harmless, if that does not happen within ``wait`` seconds)."""
        if self._closed:
            return
        try:
            if not process_alive(self.pid):
                return
            for tp in list(self.tracepoints.values()):
                self.remove(tp)
            deadline = time.monotonic() + wait
            while self.retired and time.monotonic() < deadline:
                if not self.reclaim():
                    if on_wait:
                        on_wait()
                    time.sleep(0.01)
            if self.runtime and not self.retired:
                with self._borrowed() as t:
                    looks = self._looks(t)
                    if looks is not None and not self._busy(0, 0, set(), looks):
                        self._syscall(t, SYS_RT_SIGACTION, cg.SIGTRAP,
                                      self.runtime + cg.OLD_ACTION, 0, 8)  # fmt: skip
                        self._syscall(t, SYS_MEMBARRIER, MEMBARRIER_SYNC_CORE, 0, 0)
                        self._syscall(t, SYS_CLOSE, self._counters_fd)
                        if self._threads_at:  # no hooked frame is left: all reclaimed
                            self._syscall(t, SYS_MUNMAP, self._threads_at, cg.THREAD_TABLE_SIZE)
                            self._threads_at = 0
                        if self.rings is not None:
                            self._syscall(t, SYS_MUNMAP, self._rings_at, self.rings.geometry.size)
                            self._rings_at = 0
                        self._syscall(t, SYS_MUNMAP, self.runtime, cg.RUNTIME_SIZE)
                        self.runtime = 0
            self._disarm()
        except ProbeError:
            if process_alive(self.pid):
                raise
        finally:
            self._closed = True
            os.close(self.mem)
            if self.rings is not None:
                self.rings.close()
            if self.counters is not None:
                self.counters.close()

    def __enter__(self) -> ProbeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_HELD = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


@contextmanager
def _signals_held() -> Iterator[None]:
    """Block the signals that end hwtrace for the block (in this thread;
    they are delivered when it ends)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _blocks_sigtrap(pid: int, tid: int) -> str:
    return f"thread {tid} of process {pid} blocks SIGTRAP: an int3 of hwtrace's would kill it"


def _trap_pending(pid: int, tid: int) -> bool:
    """A SIGTRAP pending for the thread (``SigPnd``/``ShdPnd``, bit 5)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & (1 << 4):
                    return True
    except OSError:
        pass
    return False


def _tid_offset(session: ProbeSession, t: SeizedThread) -> int:
    """Where the thread id is, from the thread pointer (``fs:``): glibc's
    ``struct pthread`` keeps it at a fixed offset (``tid``), found here by
    looking for the borrowed thread's id near its thread pointer; -1 when
    it is not there (no glibc threads), and events then carry tid 0."""
    fs = t.saved_registers.fs_base
    if not fs:
        return -1
    try:
        block = session.read(fs, 0x1000)
    except ProbeError:
        return -1
    want = t.tid.to_bytes(4, "little")
    for off in range(0, len(block) - 4, 4):
        if block[off : off + 4] == want:
            return off
    return -1
