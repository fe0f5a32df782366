"""The event layer: packets in, events out.

Intel PT packets do not map one to one onto what happened.  A FUP means an
asynchronous branch when a TIP follows, an overflow's resume address after an
OVF, the address of a PTWRITE, EXSTOP, MWAIT or Event Trace packet before it;
a MODE.Exec binds to the next TIP; packets in a PSB+ header describe the state
rather than a change.  This layer applies those binding rules and turns the
packet stream into a stream of events (branch outcomes and indirect targets
are events too), each with its IP and time.  Instruction-flow decoders
consume this stream while they walk the code.

The rules are those of Intel's reference decoder (libipt's event decoder), so
that the flow decoders above it agree with Intel's ``ptxed`` event for event;
errata workarounds (BDM70, SKD010, APL11, APL12) are applied here too.

One :class:`EventDecoder` decodes one trace segment: from a PSB to the end of
the stream or the first error, which ends the segment (the caller resyncs at
the next PSB).

A test oracle: plain Python, one rule at a time, that the compiled decoder
(:mod:`hwtrace.pt._flowloop`) is held to event for event.
"""

from __future__ import annotations

import numpy as np

from hwtrace.pt.config import PtConfig
from hwtrace.pt.errors import PtError
from hwtrace.pt.flowrows import Ev, Event, ExecMode
from hwtrace.pt.kinds import Kind
from hwtrace.pt.options import EventOptions
from hwtrace.pt.packets import PacketTable
from hwtrace.pt.timing import estimate_time


def exec_mode_of(bits: int) -> ExecMode:
    """The execution mode of a MODE.Exec payload (bit 0 CS.L, bit 1 CS.D)."""
    csl, csd = bits & 1, bits & 2
    if csl:
        return ExecMode.UNKNOWN if csd else ExecMode.BITS64
    return ExecMode.BITS32 if csd else ExecMode.BITS16


# Event-queue bindings: the packet an event waits for.
B_PSBEND, B_TIP, B_FUP, B_FUP_BOUND, B_EXSTOP, B_CFE = 1, 2, 4, 8, 16, 32
_QUEUE_MAX = 8  # libipt's queue has 8 slots and keeps one free


class EventQueue:
    """Events waiting for the packet they bind to, in arrival order."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: list[tuple[int, Event]] = []

    def enqueue(self, binding: int, ev: Event | None = None) -> Event:
        if len(self.entries) >= _QUEUE_MAX - 2:
            raise DecodeFailure(PtError.NOMEM)
        ev = ev if ev is not None else Event()
        self.entries.append((binding, ev))
        return ev

    def dequeue(self, mask: int) -> Event | None:
        for i, (binding, ev) in enumerate(self.entries):
            if binding & mask:
                del self.entries[i]
                return ev
        return None

    def find(self, mask: int, type: Ev) -> Event | None:
        for binding, ev in self.entries:
            if binding & mask and ev.type == type:
                return ev
        return None

    def peek(self, mask: int) -> Event | None:
        for binding, ev in self.entries:
            if binding & mask:
                return ev
        return None

    def pending(self, mask: int) -> bool:
        return any(binding & mask for binding, _ in self.entries)

    def remove(self, ev: Event) -> None:
        for i, (_, queued) in enumerate(self.entries):
            if queued is ev:
                del self.entries[i]
                return


class DecodeFailure(Exception):
    """An error that ends the current segment (a libipt error code)."""

    def __init__(self, code: PtError) -> None:
        super().__init__(code)
        self.code = PtError(code)


_TIMING = (Kind.TSC, Kind.CBR, Kind.TMA, Kind.MTC, Kind.CYC)
_IP_KINDS = (Kind.TIP, Kind.TIP_PGE, Kind.TIP_PGD, Kind.FUP)
_IPC_MASK = {1: 0xFFFF, 2: 0xFFFFFFFF, 4: 0xFFFFFFFFFFFF, 6: 0xFFFFFFFFFFFFFFFF}


class _Column:
    """A read-only view of a numpy column that yields Python ints."""

    __slots__ = ("_item", "_n")

    def __init__(self, array: np.ndarray) -> None:
        self._item = array.item
        self._n = array.shape[0]

    def __getitem__(self, i: int) -> int:
        return self._item(i)

    def __len__(self) -> int:
        return self._n


class EventDecoder:
    """Produces the events of one segment, one at a time (:meth:`next`).

    ``table`` must start with a PSB.  Packet positions are indices into it;
    the decoder's current packet is the next one it will process.
    """

    def __init__(
        self,
        table: PacketTable,
        config: PtConfig,
        options: EventOptions | None = None,
        end_error: PtError = PtError.EOS,
    ) -> None:
        self.config = config
        self.options = options or EventOptions()
        self.errata = config.errata
        self.table = table
        # Python ints on access: the compiled fast path works on the arrays
        # themselves and this decoder only looks at the packets around it.
        self.kind = _Column(table.kind)
        self.a = _Column(table.a)
        self.b = _Column(table.b)
        self.c = _Column(table.c)
        self.offsets = _Column(table.offset)
        self.sizes = _Column(table.size)
        self.n = len(self.kind)
        self.end_error = end_error  # what the packet decoder says after the last packet
        times = estimate_time(table, config, keep_tcal_on_ovf=self.options.keep_tcal_on_ovf)
        self.times = times
        self.tsc = _Column(times.tsc)
        self.have_tsc = _Column(times.have_tsc)
        # State.
        self.pos = 0  # index of the current packet
        self.status: PtError | None = None
        self.enabled = False
        self.bound = False
        self.mode_exec_valid = False
        self.iflag = self.csd = self.csl = 0
        self.last_ip = 0
        self.have_ip = False
        self.ip_suppressed = False
        self.queue = EventQueue()
        self.time_at = -1  # packet index whose time events take

    # -- packet positions -------------------------------------------------
    def offset(self) -> int:
        """File offset of the current packet (Intel's pt_evt_get_offset)."""
        if self.pos < self.n:
            return self.offsets[self.pos]
        if self.n:
            return self.offsets[-1] + self.sizes[-1]
        return 0

    def next_position(self) -> int:
        """File offset just after the current packet, where a resync searches."""
        if self.pos < self.n:
            return self.offsets[self.pos] + self.sizes[self.pos]
        return self.offset()

    # -- helpers ----------------------------------------------------------
    def _time(self, ev: Event, index: int | None = None) -> None:
        i = self.pos if index is None else index
        if 0 <= i < self.n and self.have_tsc[i]:
            ev.has_tsc = True
            ev.tsc = self.tsc[i]

    def _update_ip(self, i: int) -> None:
        ipc = self.b[i]
        if ipc == 0:
            self.ip_suppressed = True
            return
        payload = self.a[i]
        if ipc == 3:
            ip = payload | 0xFFFF000000000000 if payload & (1 << 47) else payload
        elif ipc in _IPC_MASK:
            m = _IPC_MASK[ipc]
            ip = (self.last_ip & ~m & 0xFFFFFFFFFFFFFFFF) | (payload & m)
        else:
            raise DecodeFailure(PtError.BAD_PACKET)
        self.last_ip = ip
        self.have_ip = True
        self.ip_suppressed = False

    def _event_ip(self, ev: Event) -> None:
        if not self.have_ip or self.ip_suppressed:
            ev.ip_suppressed = True
        else:
            ev.ip = self.last_ip

    def _query_ip(self) -> int:
        if not self.have_ip:
            raise DecodeFailure(PtError.NOIP)
        if self.ip_suppressed:
            raise DecodeFailure(PtError.IP_SUPPRESSED)
        return self.last_ip

    def _reset(self) -> None:
        self.enabled = False
        self.bound = False
        self.mode_exec_valid = False
        self.have_ip = False
        self.ip_suppressed = False
        self.last_ip = 0
        self.queue = EventQueue()

    def _fetch(self) -> None:
        """Advance to the next packet, skipping PAD."""
        self.pos += 1
        while self.pos < self.n and self.kind[self.pos] == Kind.PAD:
            self.pos += 1

    def _packet_error(self) -> PtError:
        return self.end_error

    _STATE = (
        "pos", "status", "enabled", "bound", "mode_exec_valid", "iflag", "csd", "csl",
        "last_ip", "have_ip", "ip_suppressed",
    )  # fmt: skip

    def snapshot(self) -> tuple:
        """The decoder's state, for look-ahead that may have to be undone."""
        queue = [(b, ev.copy()) for b, ev in self.queue.entries]
        return tuple(getattr(self, name) for name in self._STATE) + (queue,)

    def restore(self, state: tuple) -> None:
        for name, value in zip(self._STATE, state[:-1], strict=True):
            setattr(self, name, value)
        self.queue = EventQueue()
        self.queue.entries = [(b, ev.copy()) for b, ev in state[-1]]

    # -- public -----------------------------------------------------------
    def start(self) -> None:
        """Process the initial PSB+ (raises DecodeFailure on error)."""
        while self.pos < self.n and self.kind[self.pos] == Kind.PAD:
            self.pos += 1
        if self.pos >= self.n:
            raise DecodeFailure(self._packet_error())
        if self.kind[self.pos] != Kind.PSB:
            raise DecodeFailure(PtError.NOSYNC)
        self._decode_psb()

    def next(self) -> Event:
        """The next event; raises DecodeFailure at the end or on error."""
        if self.status is not None:
            raise DecodeFailure(self.status)
        try:
            while True:
                ev = self._decode_packet()
                if ev is not None:
                    return ev
                self.bound = False
                self._fetch()
        except DecodeFailure as exc:
            self.status = exc.code
            raise

    # -- packet handlers: return an event or None (need the next packet) ---
    def _decode_packet(self) -> Event | None:
        if self.pos >= self.n:
            raise DecodeFailure(self._packet_error())
        k = self.kind[self.pos]
        i = self.pos
        if k == Kind.TNT8 or k == Kind.TNT64:
            if not self.enabled:
                raise DecodeFailure(PtError.BAD_CONTEXT)
            ev = Event(Ev.TNT)
            ev.bits = self.a[i]
            ev.size = self.b[i]
            self._time(ev)
            self._fetch()
            return ev
        if k in _TIMING:
            if k == Kind.CBR:
                ev = Event(Ev.CBR)
                ev.ratio = self.a[i]
                self._time(ev)
                self._fetch()
                return ev
            return None
        if k == Kind.PAD or k == Kind.INVALID:
            return None
        if k == Kind.FUP:
            return self._decode_fup(i)
        if k == Kind.TIP:
            return self._decode_tip(i)
        if k == Kind.TIP_PGE:
            return self._decode_tip_pge(i)
        if k == Kind.TIP_PGD:
            return self._decode_tip_pgd(i)
        if k == Kind.MODE_EXEC:
            return self._decode_mode_exec(i)
        if k == Kind.MODE_TSX:
            return self._decode_mode_tsx(i)
        if k == Kind.PIP:
            return self._decode_pip(i)
        if k == Kind.VMCS:
            return self._decode_vmcs(i)
        if k == Kind.PSB:
            self._decode_psb()
            return self._decode_packet()
        if k == Kind.PSBEND:
            return self._decode_psbend()
        if k == Kind.OVF:
            return self._decode_ovf()
        if k == Kind.STOP:
            return self._standalone(Ev.STOP)
        if k == Kind.MNT:
            ev = self._standalone(Ev.MNT)
            ev.payload = self.a[i]
            return ev
        if k == Kind.EXSTOP:
            return self._decode_exstop(i)
        if k == Kind.MWAIT:
            ev = self.queue.enqueue(B_EXSTOP)
            ev.type = Ev.MWAIT
            ev.hints, ev.ext = self.a[i], self.b[i]
            return None
        if k == Kind.PWRE:
            # The C-state is entered after execution stops: the event waits
            # for the EXSTOP (and its FUP) and comes out at the PWRX or OVF.
            ev = self.queue.enqueue(B_EXSTOP)
            ev.type = Ev.PWRE
            ev.state, ev.sub_state, ev.hw = self.a[i], self.b[i], self.c[i]
            return None
        if k == Kind.PWRX:
            ev = self.queue.find(B_EXSTOP, Ev.PWRE)
            if ev is not None:
                self.queue.remove(ev)
                self._time(ev)
                return ev  # the PWRX itself comes on a later call
            ev = Event(Ev.PWRX)
            ev.last, ev.deepest = self.a[i], self.b[i]
            wake = self.c[i]
            ev.interrupt, ev.store, ev.autonomous = wake & 1, (wake >> 1) & 1, (wake >> 2) & 1
            return self._deliver(ev)
        if k == Kind.PTW:
            return self._decode_ptw(i)
        if k == Kind.CFE:
            return self._decode_cfe(i)
        if k == Kind.EVD:
            return self._decode_evd(i)
        if k == Kind.TRIG:
            return self._decode_trig(i)
        # BBP/BIP/BEP and unknown packets carry nothing for the flow.
        return None

    def _deliver(self, ev: Event) -> Event:
        """A standalone event: time now, then move past the packet."""
        self._time(ev)
        self._fetch()
        return ev

    def _standalone(self, type: Ev, suppressed: bool = False) -> Event:
        ev = Event(type)
        ev.ip_suppressed = suppressed
        return self._deliver(ev)

    # PSB+ ------------------------------------------------------------------
    def _decode_psb(self) -> None:
        if self.queue.entries:
            raise DecodeFailure(PtError.BAD_CONTEXT)
        self.have_ip = False
        self.ip_suppressed = False
        self.last_ip = 0
        self.enabled = False
        status = self.queue.enqueue(B_PSBEND)
        status.status_update = True
        while True:
            self._fetch()
            if self.pos >= self.n:
                raise DecodeFailure(self._packet_error())
            i = self.pos
            k = self.kind[i]
            if k == Kind.FUP:
                enabled = self.b[i] != 0
                if "bdm70" in self.errata and self._bdm70_applies():
                    enabled = False
                self.enabled = enabled
                if enabled:
                    self._update_ip(i)
            elif k == Kind.MODE_EXEC:
                bits = self.a[i]
                iflag, csd, csl = (bits >> 2) & 1, (bits >> 1) & 1, bits & 1
                if self.mode_exec_valid:
                    if self.options.iflags and self.iflag != iflag:
                        raise DecodeFailure(PtError.BAD_STATUS_UPDATE)
                    if self.csd != csd or self.csl != csl:
                        raise DecodeFailure(PtError.BAD_STATUS_UPDATE)
                else:
                    self.mode_exec_valid = True
                    self.iflag, self.csd, self.csl = iflag, csd, csl
                ev = self._header_event(Ev.EXEC_MODE)
                ev.mode = exec_mode_of(bits)
                if self.options.iflags:
                    ev = self._header_event(Ev.IFLAGS)
                    ev.iflag = iflag
            elif k == Kind.MODE_TSX:
                ev = self._header_event(Ev.TSX)
                ev.speculative, ev.aborted = self.a[i] & 1, (self.a[i] >> 1) & 1
            elif k == Kind.PIP:
                ev = self._header_event(Ev.ASYNC_PAGING)
                ev.cr3, ev.non_root = self.a[i], self.b[i]
            elif k == Kind.VMCS:
                ev = self._header_event(Ev.ASYNC_VMCS)
                ev.base = self.a[i]
            elif k == Kind.MNT:
                ev = self._header_event(Ev.MNT, status=False)
                ev.payload = self.a[i]
            elif k == Kind.CBR:
                ev = self._header_event(Ev.CBR)
                ev.ratio = self.a[i]
            elif k in _TIMING or k == Kind.PAD:
                pass
            elif k == Kind.PSBEND:
                if self.enabled:
                    status.type = Ev.ENABLED
                else:
                    status.type = Ev.DISABLED
                    status.ip_suppressed = True
                return
            elif k == Kind.OVF:
                if self.enabled:
                    status.type = Ev.ENABLED
                else:
                    self.queue.entries.remove((B_PSBEND, status))
                return
            else:
                raise DecodeFailure(PtError.BAD_CONTEXT)

    def _header_event(self, type: Ev, status: bool = True) -> Event:
        """A PSB+ event: it waits for PSBEND and reports state, not a change."""
        ev = self.queue.enqueue(B_PSBEND)
        ev.status_update = status
        ev.type = type
        return ev

    def _bdm70_applies(self) -> bool:
        skip = (
            Kind.PAD, Kind.TSC, Kind.CBR, Kind.PSBEND, Kind.PIP, Kind.MODE_EXEC,
            Kind.MODE_TSX, Kind.VMCS, Kind.TMA, Kind.MTC, Kind.CYC, Kind.MNT,
        )  # fmt: skip
        for j in range(self.pos + 1, self.n):
            k = self.kind[j]
            if k == Kind.TIP_PGE:
                return True
            if k not in skip:
                return False
        return False

    def _decode_psbend(self) -> Event | None:
        ev = self.queue.dequeue(B_PSBEND)
        if ev is None:
            return None
        if ev.type in (Ev.ENABLED, Ev.EXEC_MODE, Ev.IFLAGS, Ev.TSX, Ev.ASYNC_PAGING, Ev.ASYNC_VMCS):
            self._event_ip(ev)
        elif ev.type not in (Ev.DISABLED, Ev.CBR, Ev.MNT):
            raise DecodeFailure(PtError.BAD_CONTEXT)
        self._time(ev)
        return ev

    # FUP / TIP family ---------------------------------------------------------
    def _decode_fup(self, i: int) -> Event | None:
        self._update_ip(i)  # idempotent: the same FUP may bind several events
        if self.queue.pending(B_FUP_BOUND):
            self.bound = True
        ev = self.queue.dequeue(B_FUP | B_FUP_BOUND)
        if ev is None:
            if self.bound:
                return None
            frm = self._query_ip()
            ev = self.queue.enqueue(B_TIP)
            ev.type = Ev.ASYNC_BRANCH
            ev.at = frm
            return None
        t = ev.type
        if t == Ev.OVERFLOW:
            self._event_ip(ev)
            self.enabled = True
        elif t == Ev.IGNORE:
            return self._decode_fup(i)
        elif t in (Ev.RSM, Ev.SIPI):
            self._time(ev)
            if not ev.ip_suppressed:
                raise DecodeFailure(PtError.INTERNAL)
        elif t in (
            Ev.TSX, Ev.EXSTOP, Ev.MWAIT, Ev.PTWRITE, Ev.EXEC_MODE, Ev.IFLAGS, Ev.INTERRUPT,
            Ev.IRET, Ev.SMI, Ev.INIT, Ev.VMENTRY, Ev.VMEXIT, Ev.SHUTDOWN, Ev.UINTR, Ev.UIRET,
            Ev.TRIG, Ev.SWINTR, Ev.SYSCALL,
        ):  # fmt: skip
            self._time(ev)
            self._event_ip(ev)
        else:
            raise DecodeFailure(PtError.BAD_CONTEXT)
        return ev

    def _decode_tip(self, i: int) -> Event | None:
        if not self.enabled:
            raise DecodeFailure(PtError.BAD_CONTEXT)
        if not self.bound:
            self._update_ip(i)
            self.bound = True
            asyn = self.queue.find(B_TIP, Ev.ASYNC_BRANCH)
            if asyn is not None:
                first = self.queue.dequeue(B_TIP)
                if first is not asyn:
                    # The asynchronous branch goes first; keep the rest in order.
                    idx = next(j for j, (_, e) in enumerate(self.queue.entries) if e is asyn)
                    self.queue.entries[idx] = (B_TIP, first)
                ev = asyn
                self._event_ip(ev)
                self._time(ev)
                return ev
            ev = Event(Ev.TIP)
            self._event_ip(ev)
            self._time(ev)
            return ev
        while True:
            ev = self.queue.dequeue(B_TIP)
            if ev is None:
                return None
            if ev.type == Ev.IGNORE:
                continue
            if ev.type in (Ev.EXEC_MODE, Ev.ASYNC_PAGING, Ev.ASYNC_VMCS, Ev.IFLAGS):
                self._event_ip(ev)
            else:
                raise DecodeFailure(
                    PtError.INTERNAL if ev.type == Ev.ASYNC_BRANCH else PtError.BAD_CONTEXT
                )
            self._time(ev)
            return ev

    def _decode_tip_pge(self, i: int) -> Event | None:
        if not self.bound:
            self._update_ip(i)
            ev = Event(Ev.ENABLED)
            self._event_ip(ev)
            self.enabled = True
            self.bound = True
            self._time(ev)
            return ev
        while True:
            ev = self.queue.dequeue(B_TIP)
            if ev is None:
                return None
            if ev.type == Ev.IGNORE:
                continue
            if ev.type in (Ev.EXEC_MODE, Ev.IFLAGS):
                self._event_ip(ev)
            else:
                raise DecodeFailure(PtError.BAD_CONTEXT)
            self._time(ev)
            return ev

    def _decode_tip_pgd(self, i: int) -> Event | None:
        if not self.bound:
            self._update_ip(i)
        ev = self.queue.dequeue(B_TIP)
        if ev is None:
            if self.bound:
                return None
            ev = Event(Ev.DISABLED)
            self._event_ip(ev)
            self._time(ev)
            self.enabled = False
            self._fetch()
            return ev
        if ev.type == Ev.ASYNC_BRANCH:
            ev.type = Ev.ASYNC_DISABLED
            self._event_ip(ev)
            self.enabled = False
            self.bound = True
        elif ev.type in (Ev.ASYNC_PAGING, Ev.ASYNC_VMCS, Ev.EXEC_MODE, Ev.IFLAGS, Ev.IGNORE):
            if ev.type in (Ev.ASYNC_PAGING, Ev.ASYNC_VMCS) and not self.bound:
                raise DecodeFailure(PtError.INTERNAL)
            if ev.type == Ev.IGNORE:
                return self._decode_tip_pgd(i)
            ev.ip_suppressed = True
        else:
            raise DecodeFailure(PtError.BAD_CONTEXT)
        self._time(ev)
        return ev

    # MODE, PIP, VMCS ---------------------------------------------------------
    def _decode_mode_exec(self, i: int) -> Event | None:
        bits = self.a[i]
        iflag, csd, csl = (bits >> 2) & 1, (bits >> 1) & 1, bits & 1
        n = 0
        if not self.mode_exec_valid or self.csl != csl or self.csd != csd:
            ev = self.queue.enqueue(B_TIP | B_FUP_BOUND)
            ev.type = Ev.EXEC_MODE
            ev.mode = exec_mode_of(bits)
            self.csl, self.csd = csl, csd
            n += 1
        if self.options.iflags and (not self.mode_exec_valid or self.iflag != iflag):
            ev = self.queue.enqueue(B_TIP | B_FUP_BOUND)
            ev.type = Ev.IFLAGS
            ev.iflag = iflag
            self.iflag = iflag
            n += 1
        if not n:
            self.queue.enqueue(B_TIP | B_FUP_BOUND).type = Ev.IGNORE
        self.mode_exec_valid = True
        return None

    def _decode_mode_tsx(self, i: int) -> Event | None:
        intx, abrt = self.a[i] & 1, (self.a[i] >> 1) & 1
        if self.enabled:
            ev = self.queue.enqueue(B_FUP if abrt else B_FUP_BOUND)
            ev.type = Ev.TSX
            ev.speculative, ev.aborted = intx, abrt
            return None
        ev = Event(Ev.TSX)
        ev.speculative, ev.aborted = intx, abrt
        ev.ip_suppressed = True
        return self._deliver(ev)

    def _decode_pip(self, i: int) -> Event | None:
        if self.queue.find(B_TIP, Ev.ASYNC_BRANCH) is not None:
            ev = self.queue.enqueue(B_TIP)
            ev.type = Ev.ASYNC_PAGING
            ev.cr3, ev.non_root = self.a[i], self.b[i]
            return None
        ev = Event(Ev.PAGING)
        ev.cr3, ev.non_root = self.a[i], self.b[i]
        return self._deliver(ev)

    def _decode_vmcs(self, i: int) -> Event | None:
        paging = self.queue.find(B_TIP, Ev.ASYNC_PAGING)
        if paging is not None:
            # VMCS goes before a PIP of the same asynchronous branch.
            copy = paging.copy()
            self.queue.enqueue(B_TIP, copy)
            paging.type = Ev.ASYNC_VMCS
            paging.base = self.a[i]
            return None
        if self.queue.find(B_TIP, Ev.ASYNC_BRANCH) is not None:
            ev = self.queue.enqueue(B_TIP)
            ev.type = Ev.ASYNC_VMCS
            ev.base = self.a[i]
            return None
        ev = Event(Ev.VMCS)
        ev.base = self.a[i]
        return self._deliver(ev)

    # Power, PTWRITE ------------------------------------------------------------
    def _decode_exstop(self, i: int) -> Event | None:
        has_ip = self.c[i] != 0
        mwait = self.queue.find(B_EXSTOP, Ev.MWAIT)
        if mwait is not None:
            self.queue.remove(mwait)
            if not has_ip:
                mwait.ip_suppressed = True
                self._time(mwait)
                return mwait  # the EXSTOP itself comes on the next call
            self.queue.enqueue(B_FUP_BOUND, mwait)
        if has_ip:
            self.queue.enqueue(B_FUP_BOUND).type = Ev.EXSTOP
            return None
        return self._standalone(Ev.EXSTOP, suppressed=True)

    def _decode_ptw(self, i: int) -> Event | None:
        plc = self.b[i]
        if plc > 1:
            raise DecodeFailure(PtError.BAD_PACKET)
        if self.c[i]:
            ev = self.queue.enqueue(B_FUP_BOUND)
        else:
            ev = Event()
            ev.ip_suppressed = True
        ev.type = Ev.PTWRITE
        ev.size = 4 << plc
        ev.payload = self.a[i]
        if self.c[i]:
            return None
        return self._deliver(ev)

    # OVF ------------------------------------------------------------------------
    def _decode_ovf(self) -> Event | None:
        ev = self._decode_psbend()
        if ev is not None:
            return ev
        # Power events still waiting for their EXSTOP or FUP happened before
        # the overflow: report them first, in order, without an IP.
        for _, ev in self.queue.entries:
            if ev.type in (Ev.MWAIT, Ev.EXSTOP, Ev.PWRE):
                self.queue.remove(ev)
                ev.ip_suppressed = True
                self._time(ev)
                return ev
        ovf = self.pos
        self._reset()
        fup = self._find_ovf_fup()
        if fup is None or fup < 0:
            if "skd010" in self.errata:
                ev = self._handle_skd010(ovf)
                if ev is not None:
                    return ev
            if "apl11" in self.errata and fup == -int(PtError.BAD_CONTEXT):
                ev = self._handle_apl11(ovf)
                if ev is not None:
                    return ev
            if fup is not None and fup < 0 and fup != -int(PtError.EOS):
                raise DecodeFailure(PtError(-fup))
            return self._standalone(Ev.OVERFLOW, suppressed=True)
        if "apl12" in self.errata:
            ev = self._handle_apl12(ovf, fup)
            if ev is not None:
                return ev
        ev = self.queue.enqueue(B_FUP_BOUND)
        ev.type = Ev.OVERFLOW
        self._time(ev)
        return None

    def _find_ovf_fup(self) -> int | None:
        """Index of the FUP an OVF binds to; None when tracing resumed
        disabled; a negative error code when the stream contradicts."""
        for j in range(self.pos + 1, self.n):
            k = self.kind[j]
            if k == Kind.FUP:
                return j
            if k in _TIMING or k in (Kind.PAD, Kind.MNT, Kind.INVALID):
                continue
            if k in (Kind.PSBEND, Kind.TIP, Kind.TIP_PGD, Kind.TNT8, Kind.TNT64):
                return -int(PtError.BAD_CONTEXT)
            return None
        return -int(PtError.EOS)

    def _overflow_at(self, ovf: int, resume: int, ip_index: int | None) -> Event:
        """Resume after ``resume`` (a packet index) with an overflow event."""
        ev = Event(Ev.OVERFLOW)
        self._time(ev, ovf)
        if ip_index is not None:
            self._update_ip(ip_index)
            self.enabled = True
            self._event_ip(ev)
        else:
            ev.ip_suppressed = True
        self.pos = resume
        return ev

    def _handle_skd010(self, ovf: int) -> Event | None:
        tsx = None
        for j in range(ovf + 1, self.n):
            k = self.kind[j]
            if k == Kind.TIP_PGE:
                return None
            if k == Kind.TIP_PGD:
                ev = self._overflow_at(ovf, j, None)
                self._fetch()
                return ev
            if k in (Kind.TNT8, Kind.TNT64, Kind.OVF, Kind.STOP, Kind.MWAIT, Kind.INVALID):
                return None
            if k == Kind.MODE_TSX:
                if tsx is not None:
                    return None
                tsx = self.a[j]
            elif k == Kind.FUP:
                if tsx is not None:
                    ev = self.queue.enqueue(B_FUP_BOUND)
                    ev.type = Ev.TSX
                    ev.speculative, ev.aborted = tsx & 1, (tsx >> 1) & 1
                return self._overflow_at(ovf, j, j)
            elif k == Kind.TIP:
                ev = self._overflow_at(ovf, j, j)
                self._fetch()
                return ev
            elif k == Kind.PSB:
                for m in range(j + 1, self.n):
                    km = self.kind[m]
                    if km == Kind.FUP:
                        return self._overflow_at(ovf, j, m)
                    if km in (Kind.PSBEND, Kind.OVF):
                        return None
                    if km not in _TIMING and km not in (
                        Kind.MODE_EXEC, Kind.MODE_TSX, Kind.PIP, Kind.VMCS, Kind.MNT,
                        Kind.PAD, Kind.INVALID,
                    ):  # fmt: skip
                        raise DecodeFailure(PtError.BAD_CONTEXT)
                return None
            elif k == Kind.PSBEND:
                raise DecodeFailure(PtError.BAD_CONTEXT)
            elif k == Kind.EXSTOP and self.c[j]:
                return None
            elif k == Kind.PTW and self.c[j]:
                return None
        return None

    def _handle_apl11(self, ovf: int) -> Event | None:
        for j in range(ovf + 1, self.n):
            k = self.kind[j]
            if k == Kind.TIP_PGD:
                ev = self._overflow_at(ovf, j, None)
                self._fetch()
                return ev
            if k in _TIMING or k in (Kind.PAD, Kind.MNT):
                continue
            return None
        return None

    def _handle_apl12(self, ovf: int, fup: int) -> Event | None:
        for j in range(fup + 1, self.n):
            k = self.kind[j]
            if k in (Kind.TNT8, Kind.TNT64, Kind.TIP, Kind.TIP_PGD, Kind.PSBEND, Kind.OVF):
                return None
            if k == Kind.PSB:
                has_fup = False
                for m in range(j + 1, self.n):
                    km = self.kind[m]
                    if km == Kind.FUP:
                        has_fup = True
                        break
                    if km in (Kind.PSBEND, Kind.OVF):
                        break
                if has_fup:
                    return None
                return self._ovf_at_offset(ovf, fup)
            if k in (Kind.STOP, Kind.TIP_PGE):
                return self._ovf_at_offset(ovf, fup)
            if k == Kind.INVALID:
                return None
        return None

    def _ovf_at_offset(self, ovf: int, fup: int) -> Event:
        ev = self._overflow_at(ovf, fup, None)
        self._fetch()
        return ev

    # Event trace ----------------------------------------------------------------
    def _decode_cfe(self, i: int) -> Event | None:
        t, vector, has_ip = self.a[i], self.b[i], self.c[i] != 0
        ev = self.queue.dequeue(B_CFE)
        simple = {2: Ev.IRET, 7: Ev.VMENTRY, 10: Ev.SHUTDOWN, 13: Ev.UIRET}
        with_fup = {3: Ev.SMI, 6: Ev.INIT, 12: Ev.UINTR, 14: Ev.SWINTR, 15: Ev.SYSCALL}
        if t in (1, 8, 9):  # interrupt, vmexit, vmexit_intr
            want = Ev.INTERRUPT if t == 1 else Ev.VMEXIT
            if ev is None:
                ev = Event(want)
            if ev.type != want:
                raise DecodeFailure(PtError.BAD_CONTEXT)
            if t == 1:
                ev.vector = vector
            elif t == 9:
                ev.has_vector = 1
                ev.vector = vector
            return self._bind_cfe(ev, has_ip, self.enabled)
        if ev is not None:
            raise DecodeFailure(PtError.BAD_CONTEXT)
        if t in simple:
            ev = Event(simple[t])
            return self._bind_cfe(ev, has_ip, False)
        if t in with_fup:
            ev = Event(with_fup[t])
            if t in (12, 14):
                ev.vector = vector
            return self._bind_cfe(ev, has_ip, self.enabled)
        if t in (4, 5):  # rsm, sipi
            if has_ip:
                raise DecodeFailure(PtError.BAD_PACKET)
            ev = Event(Ev.RSM if t == 4 else Ev.SIPI)
            ev.ip_suppressed = True
            if t == 5:
                ev.vector = vector
            if self.enabled:
                self.queue.enqueue(B_FUP, ev)
                return None
            return self._deliver(ev)
        if has_ip:
            self.queue.enqueue(B_FUP_BOUND).type = Ev.IGNORE
        return None

    def _bind_cfe(self, ev: Event, has_ip: bool, to_fup: bool) -> Event | None:
        if has_ip:
            self.queue.enqueue(B_FUP_BOUND, ev)
            return None
        if to_fup:
            self.queue.enqueue(B_FUP, ev)
            return None
        ev.ip_suppressed = True
        return self._deliver(ev)

    def _decode_evd(self, i: int) -> Event | None:
        t, payload = self.b[i], self.a[i]
        ev = self.queue.peek(B_CFE)
        if t == 0:  # cr2
            if ev is not None:
                raise DecodeFailure(PtError.BAD_CONTEXT)
            ev = self.queue.enqueue(B_CFE)
            ev.type = Ev.INTERRUPT
            ev.has_cr2 = 1
            ev.cr2 = payload
        elif t in (1, 2):  # vmxq, vmxr
            if ev is None:
                ev = self.queue.enqueue(B_CFE)
                ev.type = Ev.VMEXIT
            if ev.type != Ev.VMEXIT:
                raise DecodeFailure(PtError.BAD_CONTEXT)
            if t == 1:
                if ev.has_vmxq:
                    raise DecodeFailure(PtError.BAD_CONTEXT)
                ev.has_vmxq, ev.vmxq = 1, payload
            else:
                if ev.has_vmxr:
                    raise DecodeFailure(PtError.BAD_CONTEXT)
                ev.has_vmxr, ev.vmxr = 1, payload
        return None

    def _decode_trig(self, i: int) -> Event | None:
        trbv, icnt, flags = self.a[i], self.b[i], self.c[i]
        has_ip, icntv, mult = flags & 1, (flags >> 1) & 1, (flags >> 2) & 1
        if has_ip:
            if not icntv or icnt:
                raise DecodeFailure(PtError.BAD_PACKET)
            ev = self.queue.enqueue(B_FUP_BOUND)
            ev.type = Ev.TRIG
            ev.trbv, ev.mult = trbv, mult
            return None
        ev = Event(Ev.TRIG)
        ev.trbv, ev.mult = trbv, mult
        if icntv:
            if icnt and not self.enabled:
                raise DecodeFailure(PtError.BAD_PACKET)
            ev.icnt = icnt
        else:
            ev.ip_suppressed = True
        return self._deliver(ev)


__all__ = ["DecodeFailure", "EventDecoder", "exec_mode_of"]
