"""Block decoder: the instruction flow of a trace segment, block by block.

A block is a run of instructions executed one after the other, ending where
the trace must be consulted (a conditional or indirect branch, a return, a
far transfer) or where an event binds.  The decoder walks the program's code
from the current IP, asks the event stream (:mod:`oracles.events`) for
branch outcomes and targets, and reports events when execution reaches the
place they bind to.  Semantics follow Intel's reference block decoder, so the
output agrees with Intel's ``ptxed`` instruction for instruction and event for
event, including its errata workarounds (BDM64, SKD022, SKL014).

Errors raise :class:`~oracles.events.DecodeFailure`; the block decoded so
far stays valid, and the caller resynchronises at the next PSB.

A test oracle: plain Python that the compiled decoder
(:mod:`hwtrace.pt._flowloop`) is held to instruction for instruction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hwtrace.isa.x86 import IClass, Insn, InsnCache, Special
from hwtrace.pt.config import PtConfig
from hwtrace.pt.errors import PtError
from hwtrace.pt.flowrows import Ev, Event
from hwtrace.pt.options import AddrFilter, BlockFlags
from oracles.events import DecodeFailure, EventDecoder

# Status flags of next()/event() (Intel's pts_*).
IP_SUPPRESSED, EVENT_PENDING, EOS = 1, 2, 4
_RETSTACK_SIZE = 64
_MAX_NINSN = 0xFFFF
_BDM64_MAX_STEPS = 0x100


@dataclass
class Block:
    ip: int = 0
    end_ip: int = 0
    ninsn: int = 0
    mode: int = 0
    iclass: IClass = IClass.UNKNOWN
    speculative: bool = False
    isid: int = 0
    insns: list[Insn] = field(default_factory=list)


def _next_ip(insn: Insn) -> int:
    """Where execution continues without trace; BAD_QUERY if trace is needed."""
    c = insn.iclass
    if c == IClass.OTHER or c == IClass.PTWRITE:
        return insn.next_ip
    if (c == IClass.JUMP or c == IClass.CALL) and insn.is_direct and insn.special != Special.JMPABS:
        return (insn.next_ip + insn.displacement) & 0xFFFFFFFFFFFFFFFF
    if c == IClass.UNKNOWN:
        raise DecodeFailure(PtError.BAD_INSN)
    raise DecodeFailure(PtError.BAD_QUERY)


# libipt's block cache (pt_block_decoder.c): the steps one fill may take
# (bcache_fill_steps) and the widths of an entry's ninsn and displacement.
_FILL_STEPS = 0x400
_BCE_NINSN_MAX = 0xFF
_BCE_DISP = (-(1 << 15), (1 << 15) - 1)


def _filter_check(addr_filter: AddrFilter, ip: int) -> int:
    """1 if tracing is enabled at ``ip``, 0 if not (libipt's
    pt_filter_addr_check; the decoder's is _flowloop's _filter_check)."""
    have_filter = False
    for cfg, a, b in addr_filter.ranges:
        if cfg == 1:
            have_filter = True
            if a <= ip <= b:
                return 1
        elif cfg == 2 and a <= ip <= b:
            return 0
    return 0 if have_filter else 1


class BlockCache:
    """libipt's per-section block cache, for where it ends blocks: while
    filling, a block ends after a near direct call, a near direct backward
    jump, 0x400 filled instructions, or an entry that would overflow next to
    a cached successor; crossing cached code ends none
    (``pt_blk_proceed_no_event_fill_cache``, ``pt_blk_proceed_no_event_cached``).
    Entries map (section, ip) to (instructions to the decision point
    inclusive, the decision point's address)."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, int], tuple[int, int]] = {}

    def trampoline(self, key: tuple[int, int], nip: int) -> None:
        lo, hi = _BCE_DISP
        self.entries[key] = (1, nip if lo <= nip - key[1] <= hi else key[1])

    def extend(self, key: tuple[int, int], nkey: tuple[int, int]) -> bool:
        """Enter ``key`` from its cached successor's entry; False where a
        trampoline had to do instead."""
        ninsn, dip = self.entries[nkey]
        lo, hi = _BCE_DISP
        if ninsn + 1 > _BCE_NINSN_MAX or not lo <= dip - key[1] <= hi:
            self.trampoline(key, nkey[1])
            return False
        self.entries[key] = (ninsn + 1, dip)
        return True


def _is_far(insn: Insn) -> bool:
    return insn.iclass in (IClass.FAR_CALL, IClass.FAR_RETURN, IClass.FAR_JUMP)


def _changes_cr3(insn: Insn) -> bool:
    return insn.special == Special.MOV_CR3


def _binds_to_pip(insn: Insn) -> bool:
    return insn.special in (Special.MOV_CR3, Special.VMLAUNCH, Special.VMRESUME) or _is_far(insn)


def _binds_to_vmcs(insn: Insn) -> bool:
    return insn.special in (Special.VMPTRLD, Special.VMLAUNCH, Special.VMRESUME) or _is_far(insn)


def _is_ptwrite(insn: Insn) -> bool:
    return insn.iclass == IClass.PTWRITE


def _is_iret(insn: Insn) -> bool:
    return insn.special == Special.IRET


def _is_vmentry(insn: Insn) -> bool:
    return insn.special in (Special.VMLAUNCH, Special.VMRESUME)


def _is_uiret(insn: Insn) -> bool:
    return insn.special == Special.UIRET


def _never(insn: Insn) -> bool:
    return False


# Events that bind to one kind of instruction and step past it.
_BOUND_PRED = {
    Ev.PTWRITE: _is_ptwrite,
    Ev.IRET: _is_iret,
    Ev.VMENTRY: _is_vmentry,
    Ev.UIRET: _is_uiret,
}


# Events that happen at an IP when tracing is enabled (or anywhere when not).
_ASYNC_AT_IP = frozenset(
    (
        Ev.IFLAGS, Ev.INTERRUPT, Ev.SMI, Ev.INIT, Ev.VMEXIT, Ev.SHUTDOWN, Ev.UINTR, Ev.SWINTR,
        Ev.SYSCALL,
    )
)  # fmt: skip


# PSB+ status updates that carry the IP.
_STATUS_WITH_IP = frozenset(
    (Ev.ENABLED, Ev.EXEC_MODE, Ev.IFLAGS, Ev.TSX, Ev.ASYNC_PAGING, Ev.ASYNC_VMCS)
)

# Events libipt's pt_blk_resync reports after their instruction, and those
# it resumes at (when their IP is known).
_AFTER_INSN = frozenset((Ev.PTWRITE, Ev.VMENTRY, Ev.UIRET))
_RESYNC_AT_IP = frozenset(
    (
        Ev.EXSTOP, Ev.MWAIT, Ev.TICK, Ev.IRET, Ev.SMI, Ev.RSM, Ev.INIT, Ev.VMEXIT,
        Ev.SHUTDOWN, Ev.UINTR, Ev.SWINTR, Ev.SYSCALL,
    )
)  # fmt: skip


def _is_branch(insn: Insn) -> bool:
    return insn.iclass not in (IClass.OTHER, IClass.PTWRITE, IClass.UNKNOWN)


class BlockDecoder:
    """Decodes one segment's flow; ``cache`` holds the address space's code."""

    def __init__(
        self,
        events: EventDecoder,
        cache: InsnCache,
        config: PtConfig,
        flags: BlockFlags | None = None,
        addr_filter: AddrFilter | None = None,
        section_of: Callable[[int], int] | None = None,
        bcache: BlockCache | None = None,
    ) -> None:
        self.evdec = events
        self.cache = cache
        self.config = config
        self.errata = config.errata
        self.flags = flags or BlockFlags()
        self.filter = addr_filter or AddrFilter()
        self.section_of = section_of or (lambda ip: 1)
        self.bcache = bcache  # replays libipt's block ends when given
        self.ip = 0
        self.mode = 0
        self.enabled = False
        self.speculative = False
        self.status: PtError | None = None
        self.event: Event = Event(Ev.IGNORE)
        self.tsc = 0
        self.has_tsc = False
        self.cbr = 0
        self.icnt = 0
        self.has_icnt = False
        self.process_insn = False
        self.insn: Insn | None = None
        self.bound = set()
        self.retstack: list[int] = []
        self.cr3 = None
        self.vmcs = None
        self._last: Insn | None = None

    # -- start -------------------------------------------------------------
    def start(self) -> int:
        """Synchronise on the segment's PSB+ and return the first status."""
        self.evdec.start()
        probe = self.evdec.snapshot()
        origin = self.evdec.pos
        while self.evdec.pos == origin:
            try:
                ev = self.evdec.next()
            except DecodeFailure as exc:
                if exc.code != PtError.EOS:
                    self.evdec.restore(probe)
                    raise
                break
            if not ev.status_update:
                break
            if ev.type == Ev.ENABLED:
                self.enabled = True
                self.ip = ev.ip
                break
        self.evdec.restore(probe)
        try:
            self.event = self.evdec.next()
            self.status = None
        except DecodeFailure as exc:
            self.status = exc.code
        return self._trailing(None)

    # -- events ------------------------------------------------------------
    def _fetch_event(self) -> None:
        ev = self.event
        self.tsc, self.has_tsc = ev.tsc, ev.has_tsc
        self._update_trig_anchor(ev)
        try:
            self.event = self.evdec.next()
        except DecodeFailure as exc:
            self.status = exc.code
            self.event = Event(Ev.IGNORE)

    def _update_trig_anchor(self, ev: Event) -> None:
        t = ev.type
        if t in (Ev.DISABLED, Ev.ASYNC_DISABLED):
            self.has_icnt, self.icnt = False, 0
        elif t == Ev.OVERFLOW:
            self.has_icnt, self.icnt = (not ev.ip_suppressed), 0
        elif t in (Ev.ENABLED, Ev.ASYNC_BRANCH, Ev.TIP, Ev.TNT):
            self.has_icnt, self.icnt = True, 0
        elif t in (
            Ev.EXEC_MODE, Ev.TSX, Ev.ASYNC_PAGING, Ev.ASYNC_VMCS, Ev.EXSTOP, Ev.PTWRITE,
            Ev.TICK, Ev.IFLAGS, Ev.INTERRUPT, Ev.IRET, Ev.SMI, Ev.RSM, Ev.INIT, Ev.VMENTRY,
            Ev.VMEXIT, Ev.SHUTDOWN, Ev.UINTR, Ev.UIRET, Ev.TRIG, Ev.SWINTR, Ev.SYSCALL,
        ):  # fmt: skip
            if not ev.ip_suppressed:
                self.has_icnt, self.icnt = True, 0

    def _status(self, flags: int) -> int:
        if not self.enabled:
            flags |= IP_SUPPRESSED
        if self.status == PtError.EOS:
            flags |= EOS
        return flags

    def _tick(self, ip: int) -> None:
        if self.flags.tick_events:
            ev = self.event
            if ev.tsc != self.tsc:
                ev.type = Ev.TICK
                ev.ip = ip
                return
        self._fetch_event()

    def _proceed_indirect(self) -> None:
        ev = self.event
        if self.status is None and ev.type == Ev.TIP:
            if ev.ip_suppressed:
                raise DecodeFailure(PtError.BAD_PACKET)
            ip = self.ip
            self.ip = ev.ip
            self._tick(ip)
            return
        if self.status is None and ev.type == Ev.TNT:
            # A deferred TIP may hide behind an in-progress TNT.
            probe = self.evdec.snapshot()
            try:
                nxt = self.evdec.next()
            except DecodeFailure:
                self.evdec.restore(probe)
                raise DecodeFailure(PtError.BAD_QUERY) from None
            if nxt.type != Ev.TIP:
                self.evdec.restore(probe)
                raise DecodeFailure(PtError.BAD_QUERY)
            self.ip = nxt.ip
            return
        raise DecodeFailure(PtError.BAD_QUERY)

    def _cond_branch(self) -> int:
        ev = self.event
        if self.status is not None or ev.type != Ev.TNT:
            raise DecodeFailure(PtError.BAD_QUERY)
        if not ev.size:
            raise DecodeFailure(PtError.INTERNAL)
        # From its first bit on the TNT's time is the query time, as libipt's
        # query decoder takes the time when it caches a TNT.
        ev.started = True
        ev.size -= 1
        return (ev.bits >> ev.size) & 1

    def _proceed_with_trace(self, insn: Insn) -> None:
        c = insn.iclass
        if c == IClass.COND_JUMP:
            ip = insn.next_ip
            if self._cond_branch():
                ip = (ip + insn.displacement) & 0xFFFFFFFFFFFFFFFF
            self.ip = ip
            return
        if c == IClass.RETURN:
            try:
                taken = self._cond_branch()
            except DecodeFailure as exc:
                if exc.code != PtError.BAD_QUERY:
                    raise
                self._proceed_indirect()
                return
            if not taken:
                raise DecodeFailure(PtError.BAD_RETCOMP)
            if not self.retstack:
                raise DecodeFailure(PtError.RETSTACK_EMPTY)
            self.ip = self.retstack.pop()
            return
        if c in (IClass.JUMP, IClass.CALL) and insn.is_direct and insn.special != Special.JMPABS:
            raise DecodeFailure(PtError.INTERNAL)
        if c in (IClass.OTHER, IClass.PTWRITE):
            raise DecodeFailure(PtError.INTERNAL)
        if c == IClass.UNKNOWN:
            raise DecodeFailure(PtError.BAD_INSN)
        self._proceed_indirect()

    # -- walking code --------------------------------------------------------
    def _one_insn(self, block: Block) -> Insn | None:
        """Add the instruction at the current IP to ``block`` (None: full)."""
        if block.ninsn + 1 > _MAX_NINSN:
            return None
        if block.insns and block.insns[-1].truncated:
            return None  # an instruction spanning sections ends its block
        got = self.cache.get(self.ip, self.mode)
        if isinstance(got, int):
            raise DecodeFailure(PtError(got))
        insn = got
        isid = self.section_of(insn.ip)
        if isid != block.isid:
            if block.ninsn:
                return None
            block.isid = isid
        if insn.iclass == IClass.CALL and not (insn.is_direct and insn.displacement == 0):
            if len(self.retstack) >= _RETSTACK_SIZE:
                del self.retstack[0]
            self.retstack.append(insn.next_ip)
        block.iclass = insn.iclass
        block.end_ip = insn.ip
        block.ninsn += 1
        block.insns.append(insn)
        if self.has_icnt:
            self.icnt += 1
        self._last = insn
        return insn

    def _ends_block(self, insn: Insn) -> bool:
        return (self.flags.end_on_call and insn.iclass == IClass.CALL) or (
            self.flags.end_on_jump and insn.iclass == IClass.JUMP
        )

    def _to_insn(self, block: Block, pred: Callable[[Insn], bool]) -> int:
        while True:
            insn = self._one_insn(block)
            if insn is None:
                return 0
            if pred(insn):
                return 1
            self.ip = _next_ip(insn)
            if self._ends_block(insn):
                return 0

    def _to_ip(self, block: Block, ip: int) -> int:
        while True:
            if self.ip == ip:
                return 1
            insn = self._one_insn(block)
            if insn is None:
                return 0
            self.ip = _next_ip(insn)
            if self._ends_block(insn):
                return 1 if self.ip == ip else 0

    def _to_insn_cached(self, block: Block) -> None:
        """``_to_insn(block, _never)`` ending the block where libipt's block
        cache ends it (see :class:`BlockCache`)."""
        bc = self.bcache
        frames: list[tuple[tuple[int, int], tuple[int, int]]] = []  # fills waiting for successors
        try:
            steps = 0
            while True:
                key = (self.section_of(self.ip), self.ip)
                if not steps:
                    entry = bc.entries.get(key)
                    if entry is not None:
                        for _ in range(entry[0]):  # to the decision point, inclusive
                            insn = self._one_insn(block)
                            if insn is None:
                                return
                            self.ip = _next_ip(insn)
                            if self._ends_block(insn):
                                return
                        continue
                    steps = _FILL_STEPS
                insn = self._one_insn(block)
                if insn is None:
                    return
                if _is_branch(insn) and not (
                    insn.iclass in (IClass.JUMP, IClass.CALL)
                    and insn.is_direct
                    and insn.special != Special.JMPABS
                ):
                    bc.entries[key] = (1, insn.ip)  # needs trace: ends the block
                    self.ip = _next_ip(insn)
                    return
                nip = _next_ip(insn)
                self.ip = nip
                if insn.iclass == IClass.CALL or (
                    insn.iclass == IClass.JUMP and insn.displacement < 0
                ):
                    bc.entries[key] = (1, insn.ip)  # a decode stop
                    return
                if self._ends_block(insn):
                    return
                nkey = (self.section_of(nip), nip)
                if nkey in bc.entries:
                    if not bc.extend(key, nkey):
                        return
                    steps = 0  # on through the cache
                    continue
                steps -= 1
                if not steps:
                    bc.trampoline(key, nip)
                    return
                frames.append((key, nkey))
        finally:
            for key, nkey in reversed(frames):
                if nkey in bc.entries:
                    bc.extend(key, nkey)

    def _skl014(self, block: Block) -> int:
        def pred(insn: Insn) -> bool:
            if insn.iclass in (IClass.JUMP, IClass.CALL):
                return insn.is_direct and insn.special != Special.JMPABS
            return insn.iclass == IClass.OTHER and _changes_cr3(insn)

        while True:
            status = self._to_insn(block, pred)
            if status <= 0:
                return status
            insn = self._last
            if _changes_cr3(insn):
                return status
            ip = _next_ip(insn)
            if _filter_check(self.filter, ip) <= 0:
                return 1
            self.ip = ip
            if self._ends_block(insn):
                return status

    def _to_disabled(self, block: Block, ev: Event) -> int:
        if ev.ip_suppressed:
            if self.filter.configured and "skl014" in self.errata:
                return self._skl014(block)
            return self._to_insn(block, _changes_cr3)
        return self._to_ip(block, ev.ip)

    def _set_disable_resume_ip(self, insn: Insn | None) -> None:
        if insn is not None and insn.iclass in (IClass.CALL, IClass.FAR_CALL):
            self.ip = insn.next_ip
        else:
            self.ip = 0

    def _to_bound_insn(self, block: Block, ev: Event, pred: Callable[[Insn], bool]) -> int:
        """PTWRITE, IRET, VM entry, UIRET events: reach the instruction and
        step past it."""
        if ev.ip_suppressed:
            return self._to_insn(block, pred)
        status = self._to_ip(block, ev.ip)
        if status <= 0:
            return status
        return 1 if self._one_insn(block) is not None else 0

    def _provide_trig_anchor(self, ev: Event) -> None:
        if ev.ip:
            return
        if not self.has_icnt:
            raise DecodeFailure(PtError.BAD_PACKET)
        if ev.icnt < self.icnt:
            raise DecodeFailure(PtError.BAD_PACKET)
        ev.icnt -= self.icnt
        ev.ip = self.ip

    def _to_trig(self, block: Block, ev: Event) -> int:
        if ev.ip_suppressed:
            return 1
        self._provide_trig_anchor(ev)
        if not self.enabled:
            if not ev.icnt:
                raise DecodeFailure(PtError.INTERNAL)
            return 1
        status = self._to_ip(block, ev.ip)
        if status <= 0:
            return status
        while ev.icnt:
            insn = self._one_insn(block)
            if insn is None:
                return 0
            self.ip = _next_ip(insn)
            ev.ip = self.ip
            ev.icnt -= 1
        return 1

    def _skd022(self, ev: Event) -> bool:
        got = self.cache.get(ev.at, self.mode)
        if isinstance(got, int):
            return False
        if got.special in (Special.VMLAUNCH, Special.VMRESUME):
            ev.type = Ev.DISABLED
            return True
        return False

    def _postpone(self, insn: Insn | None) -> int:
        if self.process_insn:
            raise DecodeFailure(PtError.INTERNAL)
        self.process_insn = True
        self.insn = insn
        return self._status(EVENT_PENDING)

    def _clear_postponed(self) -> None:
        self.process_insn = False
        self.bound.clear()

    def _proceed_postponed(self) -> None:
        if not self.process_insn:
            return
        if not self.enabled:
            self._clear_postponed()
            return
        try:
            self.ip = _next_ip(self.insn)
        except DecodeFailure as exc:
            if exc.code != PtError.BAD_QUERY:
                raise
            self._proceed_with_trace(self.insn)
        self._clear_postponed()

    def _proceed_event(self, block: Block) -> int:
        ev = self.event
        t = ev.type
        self._last = None
        if t == Ev.DISABLED:
            if not ev.status_update:
                try:
                    status = self._to_disabled(block, ev)
                except DecodeFailure as exc:
                    if exc.code != PtError.BAD_QUERY:
                        raise
                    self._set_disable_resume_ip(self._last)
                else:
                    if status <= 0:
                        return status
        elif t == Ev.ASYNC_DISABLED:
            if self._to_ip(block, ev.at) <= 0:
                return 0
            if "skd022" in self.errata and self._skd022(ev):
                return self._proceed_event(block)
        elif t == Ev.ASYNC_BRANCH:
            if self._to_ip(block, ev.at) <= 0:
                return 0
        elif t in (Ev.PAGING, Ev.VMCS):
            if self.enabled:
                pred = _binds_to_pip if t == Ev.PAGING else _binds_to_vmcs
                if self._to_insn(block, pred) <= 0:
                    return 0
                self.bound.add(t)
                return self._postpone(self._last)
        elif t in (Ev.PTWRITE, Ev.IRET, Ev.VMENTRY, Ev.UIRET):
            if self.enabled:
                pred = _BOUND_PRED[t]
                if self._to_bound_insn(block, ev, pred) <= 0:
                    return 0
                self.bound.add(t)
                return self._postpone(self._last)
        elif t in (Ev.EXSTOP, Ev.MWAIT):
            if self.enabled and not ev.ip_suppressed:
                if self._to_ip(block, ev.ip) <= 0:
                    return 0
        elif t in (
            Ev.ASYNC_PAGING, Ev.ASYNC_VMCS, Ev.EXEC_MODE, Ev.TSX, Ev.IFLAGS, Ev.INTERRUPT,
            Ev.SMI, Ev.INIT, Ev.VMEXIT, Ev.SHUTDOWN, Ev.UINTR, Ev.SWINTR, Ev.SYSCALL,
        ):  # fmt: skip
            if not ev.ip_suppressed:
                if self._to_ip(block, ev.ip) <= 0:
                    return 0
        elif t == Ev.TRIG:
            if self._to_trig(block, ev) <= 0:
                return 0
        elif t in (Ev.TIP, Ev.TNT):
            raise DecodeFailure(PtError.INTERNAL)
        return self._status(EVENT_PENDING)

    def _proceed_no_event(self, block: Block) -> None:
        self._last = None
        try:
            if self.bcache is None:
                self._to_insn(block, _never)
            else:
                self._to_insn_cached(block)
        except DecodeFailure as exc:
            if exc.code != PtError.BAD_QUERY:
                raise
            if self._last is None:
                raise DecodeFailure(PtError.BAD_INSN) from None
            self._proceed_with_trace(self._last)

    def _proceed(self, block: Block) -> int:
        if self.status is not None:
            if self.status != PtError.EOS:
                raise DecodeFailure(self.status)
            if not self.enabled:
                raise DecodeFailure(PtError.EOS)
            self._proceed_no_event(block)
            return EOS
        if self.event.type in (Ev.TNT, Ev.TIP):
            if not self.enabled:
                raise DecodeFailure(PtError.NO_ENABLE)
            self._proceed_no_event(block)
            return self._trailing(block)
        return self._proceed_event(block)

    def _bdm64(self, block: Block, ev: Event) -> bool:
        if not ev.aborted or not block.ninsn:
            return False
        got = self.cache.get(block.end_ip, block.mode)
        if isinstance(got, int) or not _is_branch(got):
            return False
        ip = self.ip
        for _ in range(_BDM64_MAX_STEPS):
            if ip == ev.ip:
                return True
            insn = self.cache.get(ip, self.mode)
            if isinstance(insn, int):
                break
            try:
                ip = _next_ip(insn)
            except DecodeFailure:
                break
        self.ip = ev.ip
        return True

    def _trailing(self, block: Block | None) -> int:
        """Events that bind to the current IP (after a block or an event)."""
        if self.status is not None:
            self._proceed_postponed()
            return self._status(0 if self.status == PtError.EOS else EVENT_PENDING)
        ev = self.event
        t = ev.type
        pending = self._status(EVENT_PENDING)
        if t == Ev.TNT:
            if not self.flags.tick_events or block is None or not ev.has_tsc or ev.tsc == self.tsc:
                if ev.size:
                    return self._finish()
                self._fetch_event()
                return self._trailing(block)
            if block.iclass not in (IClass.COND_JUMP, IClass.RETURN):
                return self._finish()
            return pending
        if t == Ev.TIP:
            return self._finish()
        if t in (
            Ev.TICK, Ev.ENABLED, Ev.OVERFLOW, Ev.STOP, Ev.PWRE, Ev.PWRX, Ev.CBR, Ev.MNT,
        ):  # fmt: skip
            self._proceed_postponed()
            return self._status(EVENT_PENDING)
        if t == Ev.DISABLED:
            if not self.process_insn:
                # libipt's pt_blk_proceed_trailing_event: a status update
                # (a PSB+ with tracing disabled) is an event of its own.
                if ev.status_update:
                    return self._status(EVENT_PENDING)
                return self._finish()
            if ev.ip_suppressed and _changes_cr3(self.insn):
                return pending
            try:
                self.ip = _next_ip(self.insn)
            except DecodeFailure as exc:
                if exc.code != PtError.BAD_QUERY:
                    raise
                self._set_disable_resume_ip(self.insn)
                return pending
            self._clear_postponed()
            if not ev.ip_suppressed and self.ip == ev.ip:
                return self._status(EVENT_PENDING)
            return self._finish()
        if t == Ev.ASYNC_DISABLED:
            self._proceed_postponed()
            if self.ip != ev.at:
                return self._finish()
            if "skd022" in self.errata and self._skd022(ev):
                return self._finish()
            return self._status(EVENT_PENDING)
        if t == Ev.ASYNC_BRANCH:
            self._proceed_postponed()
            if self.ip != ev.at:
                return self._finish()
            return self._status(EVENT_PENDING)
        if t in (Ev.PAGING, Ev.VMCS):
            if not self.enabled:
                return pending
            if not self.process_insn or t in self.bound:
                return self._finish()
            pred = _binds_to_pip if t == Ev.PAGING else _binds_to_vmcs
            if not pred(self.insn):
                return self._finish()
            self.bound.add(t)
            return pending
        if t in (Ev.PTWRITE, Ev.IRET, Ev.VMENTRY, Ev.UIRET):
            if not self.enabled:
                return pending
            if not self.process_insn or t in self.bound:
                return self._finish()
            pred = _BOUND_PRED[t]
            if not ev.ip_suppressed or not pred(self.insn):
                return self._finish()
            self.bound.add(t)
            return pending
        if t in (Ev.ASYNC_PAGING, Ev.ASYNC_VMCS):
            self._proceed_postponed()
            if not ev.ip_suppressed and self.ip != ev.ip:
                return self._finish()
            return self._status(EVENT_PENDING)
        if t == Ev.EXEC_MODE:
            self._proceed_postponed()
            if not self.enabled:
                return self._status(EVENT_PENDING)
            if not ev.ip_suppressed and self.ip != ev.ip:
                return self._finish()
            return self._status(EVENT_PENDING)
        if t == Ev.TSX:
            self._proceed_postponed()
            if not ev.ip_suppressed:
                if block is not None and "bdm64" in self.errata:
                    self._bdm64(block, ev)
                if self.ip != ev.ip:
                    return self._finish()
            return self._status(EVENT_PENDING)
        if t in (Ev.EXSTOP, Ev.MWAIT):
            self._proceed_postponed()
            if not ev.ip_suppressed and self.enabled and self.ip != ev.ip:
                return self._finish()
            return self._status(EVENT_PENDING)
        if t in _ASYNC_AT_IP:
            self._proceed_postponed()
            if self.enabled and not ev.ip_suppressed and self.ip != ev.ip:
                return self._finish()
            return self._status(EVENT_PENDING)
        if t in (Ev.RSM, Ev.SIPI):
            self._proceed_postponed()
            if not ev.ip_suppressed:
                raise DecodeFailure(PtError.INTERNAL)
            return self._status(EVENT_PENDING)
        if t == Ev.TRIG:
            self._proceed_postponed()
            if not self.enabled or ev.ip_suppressed:
                return self._status(EVENT_PENDING)
            self._provide_trig_anchor(ev)
            if ev.icnt:
                return self._finish()
            if ev.ip != self.ip:
                raise DecodeFailure(PtError.BAD_PACKET)
            return self._status(EVENT_PENDING)
        return self._finish()

    def _finish(self) -> int:
        self._proceed_postponed()
        return self._status(0)

    # -- public ------------------------------------------------------------
    def next_block(self, block: Block) -> int:
        """Fill ``block`` with the next block; returns status flags."""
        block.ip = self.ip
        block.mode = self.mode
        block.speculative = self.speculative
        return self._proceed(block)

    def time(self) -> int:
        """The time of the last packet consumed (0 before any): libipt's
        ``pt_blk_time``, which ptxed prints before each block."""
        ev = self.event
        if self.status is None and ev.type == Ev.TNT and ev.started:
            return ev.tsc if ev.has_tsc else 0
        return self.tsc if self.has_tsc else 0

    def next_event(self) -> tuple[int, Event]:
        """The pending event, applied; returns (status flags, event)."""
        if self.status is not None:
            raise DecodeFailure(self.status)
        ev = self.event
        t = ev.type
        if t == Ev.TNT:
            if not self.flags.tick_events or not ev.has_tsc or ev.tsc == self.tsc:
                raise DecodeFailure(PtError.BAD_QUERY)
            tick = Event(Ev.TICK)
            tick.has_tsc, tick.tsc, tick.ip = True, ev.tsc, self.ip
            self.has_tsc, self.tsc = True, ev.tsc
            if not ev.size:
                self._fetch_event()
            return self._trailing(None), tick
        if t == Ev.ENABLED:
            if ev.ip == self.ip:
                ev.resumed = True
            if ev.status_update:
                if not self.enabled:
                    raise DecodeFailure(PtError.BAD_STATUS_UPDATE)
            else:
                if ev.ip_suppressed:
                    raise DecodeFailure(PtError.NOIP)
                if self.enabled:
                    raise DecodeFailure(PtError.BAD_CONTEXT)
                self.ip = ev.ip
                self.enabled = True
        elif t in (Ev.ASYNC_DISABLED, Ev.DISABLED):
            if t == Ev.ASYNC_DISABLED and self.ip != ev.at:
                raise DecodeFailure(PtError.BAD_QUERY)
            if ev.status_update:
                if self.enabled:
                    raise DecodeFailure(PtError.BAD_STATUS_UPDATE)
            else:
                if not self.enabled:
                    raise DecodeFailure(PtError.BAD_CONTEXT)
                self.enabled = False
                self.icnt = 0
        elif t == Ev.ASYNC_BRANCH:
            if self.ip != ev.at:
                raise DecodeFailure(PtError.BAD_QUERY)
            if ev.status_update or not self.enabled:
                raise DecodeFailure(PtError.BAD_CONTEXT)
            self.ip = ev.ip
        elif t in (Ev.ASYNC_PAGING, Ev.PAGING):
            if t == Ev.ASYNC_PAGING and not ev.ip_suppressed and self.ip != ev.ip:
                raise DecodeFailure(PtError.BAD_QUERY)
            if self.cr3 != ev.cr3:
                self.cr3 = ev.cr3
        elif t in (Ev.ASYNC_VMCS, Ev.VMCS):
            if t == Ev.ASYNC_VMCS and not ev.ip_suppressed and self.ip != ev.ip:
                raise DecodeFailure(PtError.BAD_QUERY)
            self.vmcs = ev.base
        elif t == Ev.OVERFLOW:
            if ev.status_update:
                raise DecodeFailure(PtError.BAD_CONTEXT)
            if ev.ip_suppressed:
                self.enabled = False
                self.ip = 0
            else:
                self.enabled = True
                self.ip = ev.ip
            self.speculative = False
        elif t == Ev.EXEC_MODE:
            if self.enabled and not ev.ip_suppressed and self.ip != ev.ip:
                raise DecodeFailure(PtError.BAD_QUERY)
            mode = int(ev.mode)
            if ev.status_update and self.enabled and self.mode != 0 and self.mode != mode:
                raise DecodeFailure(PtError.BAD_STATUS_UPDATE)
            self.mode = mode
        elif t == Ev.TSX:
            if not ev.ip_suppressed and self.ip != ev.ip:
                raise DecodeFailure(PtError.BAD_QUERY)
            self.speculative = bool(ev.speculative)
        elif t == Ev.STOP:
            if ev.status_update or self.enabled:
                raise DecodeFailure(PtError.BAD_CONTEXT)
        elif t in (Ev.EXSTOP, Ev.MWAIT):
            if not ev.ip_suppressed and self.enabled and self.ip != ev.ip:
                raise DecodeFailure(PtError.BAD_QUERY)
        elif t == Ev.CBR:
            self.cbr = ev.ratio
        elif t == Ev.TIP:
            raise DecodeFailure(PtError.BAD_QUERY)
        elif t in _ASYNC_AT_IP or t == Ev.TRIG:
            if self.enabled and not ev.ip_suppressed and self.ip != ev.ip:
                raise DecodeFailure(PtError.BAD_QUERY)
        elif t in (Ev.RSM, Ev.SIPI):
            if not ev.ip_suppressed:
                raise DecodeFailure(PtError.INTERNAL)
        out = ev.copy()
        self._fetch_event()
        return self._trailing(None), out

    def resync(self) -> int:
        """Recover after an error without leaving the segment (libipt's
        pt_blk_resync): continue at the next event that tells where
        execution is.  Branch outcomes before it are dropped.  An event that
        tells no IP raises DecodeFailure(EVENT_IGNORED): the caller takes it
        with :meth:`next_event` and calls again.  Returns status flags."""
        self._clear_postponed()
        while True:
            if self.status is not None:
                raise DecodeFailure(self.status)
            ev = self.event
            t = ev.type
            if ev.status_update:
                if t == Ev.DISABLED:
                    self.enabled = False
                    return self.next_event()[0]
                if not ev.ip_suppressed and t in _STATUS_WITH_IP:
                    # A PSB+ tells where execution is; its status updates
                    # are applied (and checked) here, as nobody prints them.
                    self.ip, self.enabled = ev.ip, True
                    return self.next_event()[0]
                raise DecodeFailure(PtError.EVENT_IGNORED)
            # As libipt's pt_blk_resync: events that tell where execution is
            # end the search (reported, or, for those reported after their
            # instruction, pending on it); the others, and those whose IP
            # is suppressed, are passed over silently (paging and VMCS
            # applied).
            supp = ev.ip_suppressed
            if t == Ev.TIP:
                self.ip = ev.ip
                self._fetch_event()
                return self._trailing(None)
            if t == Ev.DISABLED:
                self.enabled, self.ip = False, 0
                self._fetch_event()
                return self._trailing(None)
            if t == Ev.ENABLED:
                self.enabled = False  # the event enables again
                return self._status(EVENT_PENDING)
            if t == Ev.ASYNC_DISABLED:
                self.ip = ev.at
                if not ("skd022" in self.errata and self._skd022(ev)):
                    return self._status(EVENT_PENDING)
            elif t == Ev.ASYNC_BRANCH:
                self.ip = ev.at
                return self._status(EVENT_PENDING)
            elif t in (Ev.ASYNC_PAGING, Ev.ASYNC_VMCS) and not supp:
                self.ip = ev.ip
                return self._status(EVENT_PENDING)
            elif t in (Ev.PAGING, Ev.ASYNC_PAGING):
                self.cr3 = ev.cr3
            elif t in (Ev.VMCS, Ev.ASYNC_VMCS):
                self.vmcs = ev.base
            elif t == Ev.OVERFLOW:
                return self._status(EVENT_PENDING)
            elif t in (Ev.EXEC_MODE, Ev.TSX, Ev.IFLAGS, Ev.INTERRUPT):
                if supp:
                    self.enabled = False
                else:
                    self.ip, self.enabled = ev.ip, True
                return self._status(EVENT_PENDING)
            elif t == Ev.PTWRITE and supp:
                raise DecodeFailure(PtError.EVENT_IGNORED)
            elif t in _AFTER_INSN and not supp:
                self.ip = ev.ip
                return self._status(0)
            elif t in _RESYNC_AT_IP and not supp:
                self.ip = ev.ip
                return self._status(EVENT_PENDING)
            self._fetch_event()

    def offset(self) -> int:
        return self.evdec.offset()
