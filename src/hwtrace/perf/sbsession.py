"""A sideband session as Intel's libipt-sb runs one for ptdump and ptxed.

Several sideband decoders (one per ``--pevent:primary``/``--pevent:secondary``
file) are merged in time order.  ptdump prints the records whose time the
trace has reached (:meth:`Session.dump`); ptxed also applies them
(:meth:`Session.event`, called for every event of the instruction flow):

* MMAP/MMAP2 add a section to the process's image (one image per pid,
  each starting as a copy of the kernel image);
* COMM.EXEC starts a new image for the process; FORK gives the child a copy
  of its parent's image;
* ITRACE_START switches to the traced process at once; SWITCH (in) and
  SWITCH_CPU_WIDE switch later, when the flow is (likely) in the kernel, as
  told by ``--pevent:kernel-start``;
* LOST, truncated AUX and unusable mappings give warnings, printed as
  ``[file:offset sideband warning: ...]`` with ``--sb:warn``; errors always.

Only secondary decoders' records never switch the image.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from ..image import Image, ImageError
from ..image.sections import Section, map_file
from ..pt.errors import PtError, errstr
from . import records as R
from .pevent import (
    SB_LOST,
    SB_SECTION_LOST,
    SB_TRACE_LOST,
    SB_WARNINGS,
    FetchError,
    PeventConfig,
    PeventFile,
)


class Loc(enum.IntEnum):
    """Where the flow is, as far as the sideband decoder can tell."""

    UNKNOWN = 0
    LIKELY_USER = 1
    USER = 2
    LIKELY_KERNEL = 3
    KERNEL = 4


_KERNELISH = (Loc.UNKNOWN, Loc.LIKELY_KERNEL, Loc.KERNEL)


class Context:
    """A process: its pid and image.  ``cache`` is free for the user of the
    session (ptxed keeps decoded instructions there); it is cleared whenever
    the image changes."""

    def __init__(self, pid: int, image: Image) -> None:
        self.pid = pid
        self.image = image
        self.abi: str | None = None
        self.cache = None

    def changed(self) -> None:
        if self.cache is not None:
            self.cache.clear()


class _Decoder:
    def __init__(self, source: PeventFile, primary: bool) -> None:
        self.src = source
        self.primary = primary
        self.tsc = 0
        self.at_end = False  # no record pending (the file is used up)
        self.context: Context | None = None
        self.next_context: Context | None = None
        self.location = Loc.UNKNOWN


class Session:
    """Sideband decoders merged in time order.

    ``report(code, filename, offset)`` receives warnings (code > 0) and
    errors (code < 0, a negative PtError); ``on_switch(context)`` is called
    when the image switches; ``notes`` collects, for standard error,
    problems Intel's tools pass over silently (a truncated file).
    """

    def __init__(
        self,
        report: Callable[[int, str, int], None],
        on_switch: Callable[[Context], None] | None = None,
    ) -> None:
        self.report = report
        self.on_switch = on_switch
        self.kernel = Image("kernel")
        self.contexts: dict[int, Context] = {}
        self._allocated: list[_Decoder] = []
        self.decoders: list[_Decoder] = []
        self.retired: list[_Decoder] = []
        self.notes: list[str] = []
        # Lines a ``report`` callback may collect: dump() returns them in order.
        self.pending: list[str] = []

    # -- setup ---------------------------------------------------------------

    def add_pevent(self, filename: str, data: bytes, config: PeventConfig) -> None:
        self._allocated.append(_Decoder(PeventFile(filename, data, config), config.primary))

    def init_decoders(self) -> None:
        # Like libipt-sb: the last decoder named is fetched first, and a
        # decoder goes before others with the same time.
        for dec in reversed(self._allocated):
            if self._fetch(dec) > 0:
                self._insert(dec)
        self._allocated.clear()

    def _insert(self, dec: _Decoder) -> None:
        lst = self.decoders
        i = 0
        while i < len(lst) and dec.tsc > lst[i].tsc:
            i += 1
        lst.insert(i, dec)

    def _fetch(self, dec: _Decoder) -> int:
        """Read dec's next record: 1, or 0 when it is used up, -1 when broken."""
        src = dec.src
        try:
            ok = src.fetch()
        except FetchError as exc:
            self.report(-int(exc.code), src.filename, exc.offset)
            self.notes.append(f"{src.filename}: offset {exc.offset:#x}: {exc.detail}")
            dec.at_end = True
            return -1
        if not ok:
            if src.truncated:
                self.notes.append(
                    f"{src.filename}: offset {src.offset:#x}: sideband ends early: {src.truncated}"
                )
                src.truncated = None
            dec.at_end = True
            return 0
        dec.tsc = src.tsc
        return 1

    def next_tsc(self) -> int | None:
        return self.decoders[0].tsc if self.decoders else None

    # -- ptdump --------------------------------------------------------------

    def dump(self, tsc: int, flags: int) -> list[str]:
        """Print (return) the records due at ``tsc``."""
        lines = []
        while self.decoders and self.decoders[0].tsc <= tsc:
            dec = self.decoders.pop(0)
            text = dec.src.format(flags)
            if text is not None:
                lines.append(text)
            if self._fetch(dec) > 0:
                self._insert(dec)
            # reports made while reading the next record go after this one
            lines += self.pending
            self.pending.clear()
        return lines

    # -- ptxed ---------------------------------------------------------------

    def event(self, ev, flags: int, out: Callable[[str], None]) -> Context | None:
        """Give the session one event of the flow: records due by its time
        are printed (through ``out``) and applied.  Returns the context whose
        image to decode with from now on, or None to keep the current one."""
        image: list[Context | None] = [None]
        while self.decoders and ev.tsc >= self.decoders[0].tsc:
            dec = self.decoders.pop(0)
            text = dec.src.format(flags)
            if text is not None:
                out(text)
            self._apply_record(dec, image)
            got = self._fetch(dec)
            if got > 0:
                self._insert(dec)
            elif got == 0:
                self.retired.append(dec)
        for lst in (self.decoders, self.retired):
            for dec in list(lst):
                if not self._present(dec, ev, image):
                    lst.remove(dec)
        return image[0]

    def _present(self, dec: _Decoder, ev, image: list) -> bool:
        """Let a decoder look at an event (to place a postponed context
        switch); False when it has nothing left to do."""
        if not dec.at_end and (not dec.src.has_time or dec.tsc <= ev.tsc):
            self._apply_record(dec, image)
            return True
        old = dec.location
        dec.location = self._location(dec, ev)
        if dec.next_context is None:
            return not dec.at_end
        if old in _KERNELISH or dec.location in _KERNELISH:
            self._switch(dec, image)
        return True

    def _location(self, dec: _Decoder, ev) -> Loc:
        from ..pt.flowrows import Ev

        t = ev.type
        start = dec.src.config.kernel_start

        def of(ip: int) -> Loc:
            return Loc.USER if ip < start else Loc.KERNEL

        def after_suppressed(prev: Loc) -> Loc:
            if prev in (Loc.LIKELY_KERNEL, Loc.KERNEL):
                return Loc.LIKELY_USER
            if prev in (Loc.LIKELY_USER, Loc.USER):
                return Loc.LIKELY_KERNEL
            return Loc.UNKNOWN

        if t in (Ev.ENABLED, Ev.TIP, Ev.ASYNC_BRANCH):
            return of(ev.ip)
        if t == Ev.DISABLED:
            return of(ev.ip) if not ev.ip_suppressed else after_suppressed(dec.location)
        if t == Ev.ASYNC_DISABLED:
            return of(ev.ip) if not ev.ip_suppressed else after_suppressed(of(ev.at))
        if t == Ev.ASYNC_PAGING and not ev.ip_suppressed:
            return of(ev.ip)
        if t in (Ev.PAGING, Ev.ASYNC_PAGING):
            return Loc.LIKELY_KERNEL
        if t in _IP_EVENTS and not ev.ip_suppressed:
            return of(ev.ip)
        return Loc.UNKNOWN

    def _switch(self, dec: _Decoder, image: list) -> None:
        ctx = dec.next_context
        assert ctx is not None
        if self.on_switch is not None:
            self.on_switch(ctx)
        image[0] = ctx
        dec.next_context = None
        dec.context = ctx

    def _prepare_switch(self, dec: _Decoder, ctx: Context) -> None:
        if dec.next_context is ctx:
            return
        dec.next_context = None
        if dec.context is ctx:
            return
        dec.next_context = ctx

    def context(self, pid: int) -> Context:
        ctx = self.contexts.get(pid)
        if ctx is None:
            ctx = self.contexts[pid] = Context(pid, self.kernel.copy(f"pid-{pid:x}"))
        return ctx

    def _apply_record(self, dec: _Decoder, image: list) -> None:
        src = dec.src
        rec = src.record
        assert rec is not None
        t, b, sid = rec.type, rec.body, rec.sample_id
        primary = dec.primary
        code = 0
        if t == R.RecordType.ITRACE_START:
            if primary:
                self._prepare_switch(dec, self.context(b.pid))
                if dec.next_context is not None:
                    self._switch(dec, image)
        elif t == R.RecordType.FORK:
            if b.pid != b.ppid:
                if b.pid != b.tid:
                    code = -int(PtError.INTERNAL)
                else:
                    self.contexts.pop(b.pid, None)
                    parent = self.contexts.get(b.ppid)
                    child = self.context(b.pid)
                    if parent is not None:
                        child.image = parent.image.copy(child.image.name)
        elif t == R.RecordType.COMM:
            if rec.misc & R.MISC_COMM_EXEC:
                self.contexts.pop(b.pid, None)
                ctx = self.context(b.pid)
                if primary:
                    self._prepare_switch(dec, ctx)
        elif t == R.RecordType.SWITCH:
            if primary and not rec.misc & R.MISC_SWITCH_OUT:
                if sid is None or sid.pid is None:
                    code = -int(PtError.BAD_CONFIG)
                else:
                    self._prepare_switch(dec, self.context(sid.pid))
        elif t == R.RecordType.SWITCH_CPU_WIDE:
            if primary:
                if not rec.misc & R.MISC_SWITCH_OUT:
                    if sid is not None and sid.pid is not None:
                        self._prepare_switch(dec, self.context(sid.pid))
                else:
                    self._prepare_switch(dec, self.context(b.next_prev_pid))
        elif t in (R.RecordType.MMAP, R.RecordType.MMAP2):
            if rec.misc & R.MISC_CPUMODE_MASK != 1:  # kernel maps come from kcore
                code = self._map(src, b.pid, b.filename, b.pgoff, b.len, b.addr)
        elif t == R.RecordType.LOST:
            code = SB_LOST
        elif t == R.RecordType.AUX:
            if primary and b.truncated:
                code = SB_TRACE_LOST
        if code:
            self.report(code, src.filename, src.offset)

    def _map(self, src: PeventFile, pid: int, filename: str, offset: int, size: int,
             vaddr: int) -> int:  # fmt: skip
        ctx = self.context(pid)
        cfg = src.config
        if filename.startswith("["):
            if filename != "[vdso]":
                return SB_SECTION_LOST
            vdso = {"x64": cfg.vdso_x64, "x32": cfg.vdso_x32, "ia32": cfg.vdso_ia32}.get(
                ctx.abi or ""
            )
            if not vdso:
                return -int(PtError.BAD_CONFIG)
            filename = vdso
        elif filename == "//anon" or " (deleted)" in filename:
            return SB_SECTION_LOST
        elif cfg.sysroot:
            filename = cfg.sysroot + filename
        if ctx.abi is None:
            ctx.abi = _elf_abi(filename)
        try:
            whole = map_file(filename).shape[0]
        except (OSError, ImageError):  # (a file the sideband names, not here)
            return -int(PtError.BAD_FILE)
        if offset >= whole or not size:
            return -int(PtError.INVALID)
        size = min(size, whole - offset)
        try:
            ctx.image.add_section(Section.from_file(filename, offset, size, vaddr))
        except (ImageError, ValueError):
            return -int(PtError.INVALID)
        ctx.changed()
        return 0


def _elf_abi(path: str) -> str | None:
    """x64, x32 or ia32 for an ELF file; None when it cannot tell."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[6] != 1:
        return None
    if head[4] == 2:
        return "x64"
    if head[4] == 1:
        machine = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
        return {3: "ia32", 62: "x32"}.get(machine)
    return None


def _ip_events():
    from ..pt.flowrows import Ev

    return frozenset(
        {
            Ev.OVERFLOW, Ev.EXEC_MODE, Ev.TSX, Ev.EXSTOP, Ev.MWAIT, Ev.PTWRITE, Ev.TICK,
            Ev.IFLAGS, Ev.INTERRUPT, Ev.IRET, Ev.SMI, Ev.RSM, Ev.INIT, Ev.VMENTRY,
            Ev.VMEXIT, Ev.SHUTDOWN, Ev.UINTR, Ev.UIRET,
        }
    )  # fmt: skip


_IP_EVENTS = _ip_events()


def report_text(code: int, filename: str, offset: int, *, ptdump: bool) -> str:
    """libipt-sb's bracketed warning/error line."""
    if code < 0:
        what = errstr(-code)
        severity = "error"
    else:
        what = SB_WARNINGS.get(code, "bad errcode")
        severity = "error" if ptdump else "warning"
    return f"[{filename or '<unknown>'}:{offset:016x} sideband {severity}: {what}]"


__all__ = ["Context", "Loc", "Session", "report_text"]
