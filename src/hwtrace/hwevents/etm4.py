"""ARM ETMv4 and ETE instruction-trace packets: encoder, compiled decoder,
OpenCSD-style dump, and events at registered addresses.

Format (ARM Embedded Trace Macrocell Architecture Specification ETMv4,
IHI0064, and the ARM Embedded Trace Extension (ETE) specification; byte
values as OpenCSD's ETMv4/ETE packet processor reads them).  A trace unit
writes a byte stream of packets, each a header byte and a payload:

- ``00``×11 ``80``: A-sync, the alignment synchronisation.  ``00 03`` is a
  discard, ``00 05`` an overflow.
- ``01``: trace info.  Control bytes (bit 7 continues) say which sections
  follow: bit 0 INFO (bit 0 cycle counting on; ETE bit 6 in a transaction),
  bit 1 KEY, bit 2 SPEC (speculation depth), bit 3 CYCT (the cycle count
  threshold), ETE bit 4 the commit window; each section is a continuation
  field (7 bits a byte, bit 7 = more).  It resets the address history and
  makes the next timestamp a full value.
- ``02``/``03``: timestamp, a continuation field of up to 9 bytes giving the
  low bits that changed (7 per byte), with a cycle count (up to 3 bytes)
  when the header's bit 0 is set.
- ``04`` trace on; ``06`` exception (type in byte 1 bits 5:1, byte 2 when
  byte 1's bit 7 is set; ETE types 0 and 0x18 are PE reset and transaction
  failure, always 3 bytes); ``07`` exception return (ETMv4 only).
- ETE: ``09`` instrumentation (ITE, FEAT_ITE, ETE 1.3): an EL byte and an
  8-byte little-endian payload, ARM's counterpart of Intel's PTWRITE;
  ``0A``/``0B`` transaction start/commit; ``88`` timestamp marker (also
  ETMv4.6); ``B0``-``B9`` source addresses.
- ``0C``-``1F``: cycle counts, format 2 (``0C``/``0D`` + a byte: count low
  4 bits, commit in the high 4), format 1 (``0E``/``0F``: commit field then
  count field; ``0F`` has no count) and format 3 (``1x``: count in bits 1:0,
  commit in bits 3:2).  Counts add the trace info's threshold.
- ``2D`` commit, ``2E``/``2F`` cancel format 1, ``30``-``33`` mispredict,
  ``34``-``37`` cancel format 2, ``38``-``3F`` cancel format 3.
- ``70`` ignore (ETMv4.3+), ``71``-``7F`` event (the 4-bit event mask).
- ``80`` context unchanged, ``81`` + info byte (EL in bits 1:0, SF bit 4,
  NS bit 5, VMID follows bit 6, context ID follows bit 7) + VMID bytes
  (TRCIDR2.VMIDSIZE) + context ID bytes (TRCIDR2.CIDSIZE), little endian.
- ``82``/``83`` (32-bit IS0/IS1) and ``85``/``86`` (64-bit) address with
  context: a long address then the context info byte and its IDs.
- ``90``-``92`` exact match: the address is entry 0-2 of the 3-entry
  address history (pushed again, as OpenCSD has it).  ``95``/``96`` short address: bits 8:2 (IS0) or 7:1
  (IS1) in the first byte, bit 7 set adds 8 more bits; the rest from the
  history's newest entry.  ``9A``/``9B`` long 32-bit, ``9D``/``9E`` long
  64-bit (IS0 bytes 0-1 carry 7 bits each from bit 2, IS1 byte 0 carries
  bits 7:1).  Every address packet (and an exact match) pushes its address
  on the history.
- Atoms (E executed, N not; oldest first): format 1 ``F6``/``F7``, format 2
  ``D8``-``DB``, format 3 ``F8``-``FF``, format 4 ``DC``-``DF`` (EEEN NNNN
  ENEN NENE patterns), format 5 ``D5``-``D7``/``F5``, format 6
  ``C0``-``D4``/``E0``-``F4`` (3 + bits 4:0 E atoms, then E or N by bit 5).

- ``A0``-``AF`` Q packets, when TRCIDR0.QSUPP allows them: an instruction
  count (a continuation field) after an address (``A0``-``A2`` exact match,
  ``A5``/``A6`` short, ``AA``/``AB`` long 32-bit) or none (``AC``);
  ``AF`` carries neither; the other forms are reserved.

Conditional and data-synchronisation packets, and ETE's ``07``, are for
configurations this module does not describe, so their headers are
reserved for the configuration (OpenCSD's ``I_RESERVED_CFG``, naming the
packet); a packet cut by the end of the trace is ``I_INCOMPLETE_EOT``
naming the packet it began.

The configuration comes from the trace unit's registers as an OpenCSD
snapshot carries them (:class:`Etm4Config`).  :func:`encode_etm4` writes
packets the way a trace unit compresses them (exact-match and short
address forms from the history, timestamps as the changed low bits);
:func:`decode_etm4` reads a stream in numba into columns and records damage
as ``(offset, message)``, resynchronising at the next A-sync;
:func:`etm4_dump_lines` prints packets as OpenCSD's ``trc_pkt_lister``
does; :func:`trace_on_events` turns each trace-on at a registered address
into an event (the ETM used as a one-point tracer: program it to start
tracing at ``&foo``, and each trace-on there is an event with its time).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from ..aot import njit

# The loops Python calls (the others are built into them: hwtrace.aot).
AOT_ENTRIES = ("_run", "_event_rows", "_event_bound")

__all__ = [
    "Etm4Config",
    "Etm4Error",
    "Etm4Events",
    "Etm4Kind",
    "Etm4Packet",
    "Etm4Packets",
    "decode_etm4",
    "encode_etm4",
    "etm4_dump_lines",
    "etm4_windows",
    "event_packets",
    "trace_on_events",
]


class Etm4Error(ValueError):
    """Bad ETMv4/ETE input or encoder request, with the byte offset (or the
    packet index, for the encoder) where it is."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(f"offset {offset}: {message}")
        self.offset = offset
        self.message = message


class Etm4Kind(IntEnum):
    """Packet kinds.  ``ADDR``, ``SRC_ADDR``, ``ADDR_CTXT`` and ``ATOMS`` are
    encoder requests (the encoder picks the form); the decoder reports the
    form it read.  Kinds from ``NOT_SYNC`` on are damage."""

    ASYNC = 1
    TRACE_INFO = 2
    TIMESTAMP = 3
    TRACE_ON = 4
    EXCEPT = 5
    EXCEPT_RTN = 6
    PE_RESET = 7
    TRANS_FAIL = 8
    TRANS_ST = 9
    TRANS_COMMIT = 10
    ITE = 11
    CCNT_F1 = 12
    CCNT_F2 = 13
    CCNT_F3 = 14
    COMMIT = 15
    CANCEL_F1 = 16
    CANCEL_F1_MISPRED = 17
    MISPREDICT = 18
    CANCEL_F2 = 19
    CANCEL_F3 = 20
    IGNORE = 21
    EVENT = 22
    CTXT = 23
    TS_MARKER = 24
    DISCARD = 25
    OVERFLOW = 26
    Q = 27
    ADDR_CTXT_L_32IS0 = 30
    ADDR_CTXT_L_32IS1 = 31
    ADDR_CTXT_L_64IS0 = 32
    ADDR_CTXT_L_64IS1 = 33
    ADDR_MATCH = 34
    ADDR_S_IS0 = 35
    ADDR_S_IS1 = 36
    ADDR_L_32IS0 = 37
    ADDR_L_32IS1 = 38
    ADDR_L_64IS0 = 39
    ADDR_L_64IS1 = 40
    SRC_ADDR_MATCH = 41
    SRC_ADDR_S_IS0 = 42
    SRC_ADDR_S_IS1 = 43
    SRC_ADDR_L_32IS0 = 44
    SRC_ADDR_L_32IS1 = 45
    SRC_ADDR_L_64IS0 = 46
    SRC_ADDR_L_64IS1 = 47
    ATOM_F1 = 50
    ATOM_F2 = 51
    ATOM_F3 = 52
    ATOM_F4 = 53
    ATOM_F5 = 54
    ATOM_F6 = 55
    # encoder requests
    ADDR = 60
    SRC_ADDR = 61
    ADDR_CTXT = 62
    ATOMS = 63
    # damage
    NOT_SYNC = 100
    RESERVED = 101
    BAD_SEQUENCE = 102
    INCOMPLETE_EOT = 103


K = Etm4Kind
# The kinds trace_on_events' loop reads (plain ints in native code).
_K_TRACE_ON, _K_TRACE_INFO, _K_TIMESTAMP, _K_ITE = (
    int(K.TRACE_ON),
    int(K.TRACE_INFO),
    int(K.TIMESTAMP),
    int(K.ITE),
)
_K_ADDR_FIRST, _K_ADDR_LAST = int(K.ADDR_CTXT_L_32IS0), int(K.ADDR_L_64IS1)
ADDRESS_KINDS = frozenset(range(K.ADDR_CTXT_L_32IS0, K.SRC_ADDR_L_64IS1 + 1))
ATOM_KINDS = frozenset(range(K.ATOM_F1, K.ATOM_F6 + 1))
ERROR_KINDS = frozenset({K.NOT_SYNC, K.RESERVED, K.BAD_SEQUENCE, K.INCOMPLETE_EOT})

# ------------------------------------------------------------------ config

#: register offsets in the trace unit's programmers' model
REG_OFFSETS = {
    "TRCCONFIGR": 0x010,
    "TRCTRACEIDR": 0x040,
    "TRCIDR8": 0x180,
    "TRCIDR9": 0x184,
    "TRCIDR10": 0x188,
    "TRCIDR11": 0x18C,
    "TRCIDR12": 0x190,
    "TRCIDR13": 0x194,
    "TRCIDR0": 0x1E0,
    "TRCIDR1": 0x1E4,
    "TRCIDR2": 0x1E8,
    "TRCAUTHSTATUS": 0xFB8,
    "TRCDEVARCH": 0xFBC,
}


@dataclass
class Etm4Config:
    """What the packets depend on, from the trace unit's registers."""

    ete: bool = False
    arch_major: int = 4  # TRCIDR1.TRCARCHMAJ (ETE: 5)
    arch_minor: int = 2  # TRCIDR1.TRCARCHMIN (ETE: TRCDEVARCH.REVISION)
    trace_id: int = 0x10  # TRCTRACEIDR
    ia_64: bool = True  # TRCIDR2.IASIZE
    cid_size: int = 32  # context ID bits (TRCIDR2.CIDSIZE: 0 or 32)
    vmid_size: int = 8  # VMID bits (TRCIDR2.VMIDSIZE: 0, 8, 16, 32)
    cc_size: int = 12  # cycle counter bits (TRCIDR2.CCSIZE + 12)
    ts_size: int = 64  # timestamp bits (TRCIDR0.TSSIZE: 0, 48, 64)
    cycle_counting: bool = False  # TRCCONFIGR.CCI
    timestamps: bool = True  # TRCCONFIGR.TS
    context_id_tracing: bool = True  # TRCCONFIGR.CID
    vmid_tracing: bool = True  # TRCCONFIGR.VMID
    return_stack: bool = False  # TRCCONFIGR.RS
    commit_opt1: bool = False  # TRCIDR0.COMMOPT (with TRCIDR0.TRCCCI)
    max_spec_depth: int = 0  # TRCIDR8.MAXSPEC
    q_elements: bool = False  # TRCIDR0.QSUPP != 0: Q packets
    auth_status: int = 0xCC  # TRCAUTHSTATUS
    core: str = ""  # core name for a snapshot ("" picks one for the version)

    @property
    def full_version(self) -> int:
        return (self.arch_major << 4) | self.arch_minor

    @property
    def ite(self) -> bool:
        """Instrumentation packets (ETE 1.3, FEAT_ITE)."""
        return self.ete and self.arch_minor >= 3

    @classmethod
    def from_regs(cls, regs: Mapping[str, int]) -> Etm4Config:
        """From register values by name (``TRCIDR0``...; ETE when
        ``TRCDEVARCH`` names the ETE architecture or TRCIDR1 says 5)."""
        r = {k.upper(): int(v) for k, v in regs.items()}
        for need in ("TRCCONFIGR", "TRCTRACEIDR", "TRCIDR0", "TRCIDR2"):
            if need not in r:
                raise Etm4Error(0, f"register {need} is missing")
        idr0, idr2, cfg = r["TRCIDR0"], r["TRCIDR2"], r["TRCCONFIGR"]
        idr1 = r.get("TRCIDR1", 0x4100F403)
        devarch = r.get("TRCDEVARCH", 0)
        ete = ((devarch >> 0) & 0xFFFF) == 0x5A13 or ((idr1 >> 8) & 0xF) >= 5
        major = 5 if ete else (idr1 >> 8) & 0xF
        minor = ((devarch >> 16) & 0xF) if ete and devarch else (idr1 >> 4) & 0xF
        vmidf = (idr2 >> 10) & 0x1F
        vmid = 8 if vmidf == 1 else 16 if vmidf == 2 else 32 if vmidf == 4 else 0
        if minor == 0 and not ete and vmid > 8:
            vmid = 0
        tsf = (idr0 >> 24) & 0x1F
        return cls(
            ete=ete,
            arch_major=major,
            arch_minor=minor,
            trace_id=r["TRCTRACEIDR"] & 0x7F,
            ia_64=(idr2 & 0x1F) == 8,
            cid_size=32 if ((idr2 >> 5) & 0x1F) == 4 else 0,
            vmid_size=vmid,
            cc_size=((idr2 >> 25) & 0xF) + 12,
            ts_size=48 if tsf == 6 else 64 if tsf == 8 else 0,
            cycle_counting=bool(cfg & (1 << 4)),
            timestamps=bool(cfg & (1 << 11)),
            context_id_tracing=bool(cfg & (1 << 6)),
            vmid_tracing=bool(cfg & (1 << 7)),
            return_stack=bool(cfg & (1 << 12)),
            commit_opt1=bool(idr0 & (1 << 29)) and bool(idr0 & (1 << 7)),
            max_spec_depth=r.get("TRCIDR8", 0),
            q_elements=((idr0 >> 15) & 3) != 0,
            auth_status=r.get("TRCAUTHSTATUS", 0xCC),
        )

    def to_regs(self) -> tuple[dict[str, int], dict[str, int]]:
        """Register values and offsets for a snapshot's device ini."""
        tsf = {48: 6, 64: 8}.get(self.ts_size, 0)
        # TRCIDR0: InstP0 0, TRCBB, TRCCCI, RETSTACK, 4 events, TSSIZE, COMMOPT
        idr0 = (1 << 5) | (1 << 7) | (1 << 9) | (3 << 10) | (tsf << 24)
        if self.commit_opt1:
            idr0 |= 1 << 29
        if self.q_elements:
            idr0 |= 3 << 15  # QSUPP: Q elements with and without counts
        idr1 = 0x4100F000 | (self.arch_major << 8) | (self.arch_minor << 4)
        vmidf = {0: 0, 8: 1, 16: 2, 32: 4}[self.vmid_size]
        idr2 = (
            (8 if self.ia_64 else 4)
            | ((4 if self.cid_size else 0) << 5)
            | (vmidf << 10)
            | ((self.cc_size - 12) << 25)
        )
        cfg = 1  # TRCCONFIGR bit 0 is RES1
        cfg |= (1 << 4) if self.cycle_counting else 0
        cfg |= (1 << 6) if self.context_id_tracing else 0
        cfg |= (1 << 7) if self.vmid_tracing else 0
        cfg |= (1 << 11) if self.timestamps else 0
        cfg |= (1 << 12) if self.return_stack else 0
        regs = {
            "TRCCONFIGR": cfg,
            "TRCTRACEIDR": self.trace_id,
            "TRCIDR0": idr0,
            "TRCIDR1": idr1,
            "TRCIDR2": idr2,
            "TRCIDR8": self.max_spec_depth,
            "TRCIDR9": 0,
            "TRCIDR10": 0,
            "TRCIDR11": 0,
            "TRCIDR12": 0,
            "TRCIDR13": 0,
            "TRCAUTHSTATUS": self.auth_status,
        }
        if self.ete:
            regs["TRCDEVARCH"] = 0x47705A13 | (self.arch_minor << 16)
        return regs, {k: REG_OFFSETS[k] for k in regs}

    @property
    def device_type(self) -> str:
        return "ETE" if self.ete else "ETM4"

    @property
    def core_name(self) -> str:
        return self.core or ("ARMv9-A" if self.ete else "Cortex-A57")

    def _array(self) -> np.ndarray:
        return np.array(
            [
                int(self.ete),
                self.full_version,
                self.cid_size // 8,
                self.vmid_size // 8,
                self.cc_size,
                int(self.commit_opt1),
                self.max_spec_depth,
                int(self.ite),
                int(self.q_elements),
                1,  # resynchronise at the next A-sync after damage
            ],
            dtype=np.int64,
        )


# ------------------------------------------------------------------ packets


@dataclass
class Etm4Packet:
    """One packet.  Fields by kind:

    - addresses: ``address``, ``isa`` (0 = IS0, 1 = IS1); an exact match's
      ``info`` is the history index; address with context and ``CTXT`` use
      ``el``, ``sf``, ``ns``, ``context`` and ``vmid`` (None: not sent).
    - ``TRACE_INFO``: ``info`` = INFO section, ``cc`` = cycle count
      threshold (with INFO bit 0); ``TIMESTAMP``: ``ts`` (the full value)
      and ``cc`` (-1: none).
    - atoms: ``atoms`` (bit i = atom i, 1 = E, oldest first) and ``natoms``.
    - ``EXCEPT``: ``info`` = type, ``payload`` = address interpretation.
    - ``CCNT_F*``: ``cc`` (with the threshold), ``info`` = commit count;
      ``COMMIT``/``CANCEL*``: ``info`` = the count.
    - ``EVENT``: ``event`` (the 4-bit mask); ``ITE``: ``el``, ``payload``.
    - ``Q``: ``payload`` = the form (the header's low nibble), ``info`` =
      the instruction count, ``address``/``isa`` for the address forms.
    """

    kind: Etm4Kind
    address: int = 0
    isa: int = 0
    atoms: int = 0
    natoms: int = 0
    cc: int = -1
    ts: int = 0
    context: int | None = None
    vmid: int | None = None
    el: int = 0
    sf: bool = True
    ns: bool = True
    event: int = 0
    info: int = 0
    payload: int = 0


_F4 = (0xE, 0x0, 0xA, 0x5)
_F5 = {5: 0x1E, 1: 0x00, 2: 0x0A, 3: 0x15}


def _cont(v: int, limit: int = 5) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v and len(out) < limit - 1:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _mask(bits: int) -> int:
    return (1 << bits) - 1


class _Encoder:
    def __init__(self, config: Etm4Config) -> None:
        self.c = config
        self.out = bytearray()
        self.hist: list[tuple[int, int]] = [(0, 0)] * 3
        self.ts = 0
        self.ts_full = True
        self.threshold = 0
        self.sf_known = False

    def push(self, addr: int, isa: int) -> None:
        self.hist = [(addr, isa), self.hist[0], self.hist[1]]

    def long_addr(self, addr: int, isa: int, is64: bool) -> bytes:
        if isa == 0:
            b = [(addr >> 2) & 0x7F, (addr >> 9) & 0x7F]
        else:
            b = [(addr >> 1) & 0x7F, (addr >> 8) & 0xFF]
        b += [(addr >> s) & 0xFF for s in range(16, 64 if is64 else 32, 8)]
        return bytes(b)

    def ctx_bytes(self, p: Etm4Packet) -> bytes:
        c = self.c
        info = (p.el & 3) | (0x10 if p.sf else 0) | (0x20 if p.ns else 0)
        tail = b""
        if p.vmid is not None and c.vmid_size:
            info |= 0x40
            tail += (p.vmid & _mask(c.vmid_size)).to_bytes(c.vmid_size // 8, "little")
        if p.context is not None and c.cid_size:
            info |= 0x80
            tail += (p.context & _mask(c.cid_size)).to_bytes(c.cid_size // 8, "little")
        self.sf_known = bool(p.sf)
        return bytes([info]) + tail

    def addr_form(self, addr: int, isa: int, src: bool) -> int:
        for i, (a, s) in enumerate(self.hist):
            if a == addr and s == isa:
                return (K.SRC_ADDR_MATCH if src else K.ADDR_MATCH, i)  # type: ignore[return-value]
        prev = self.hist[0][0]
        lo = 9 if isa == 0 else 8
        if addr >> lo == prev >> lo or addr >> (lo + 8) == prev >> (lo + 8):
            kind = (K.SRC_ADDR_S_IS0 if src else K.ADDR_S_IS0) + isa
        elif addr >> 32 == prev >> 32 and (prev >> 32 == 0 or self.sf_known):
            kind = (K.SRC_ADDR_L_32IS0 if src else K.ADDR_L_32IS0) + isa
        else:
            kind = (K.SRC_ADDR_L_64IS0 if src else K.ADDR_L_64IS0) + isa
        return (kind, 0)  # type: ignore[return-value]

    def address(self, kind: int, addr: int, isa: int, idx: int) -> None:
        out = self.out
        src = kind >= K.SRC_ADDR_MATCH
        base = kind - (K.SRC_ADDR_MATCH - K.ADDR_MATCH) if src else kind
        if base == K.ADDR_MATCH:
            if not 0 <= idx <= 2 or self.hist[idx] != (addr, isa):
                raise ValueError(f"exact match {idx}: {addr:#x} is not in the history")
            out.append((0xB0 if src else 0x90) + idx)
            self.push(addr, isa)
            return
        if base in (K.ADDR_S_IS0, K.ADDR_S_IS1):
            isa = base - K.ADDR_S_IS0
            prev = self.hist[0][0]
            lo = 9 if isa == 0 else 8
            shift = 2 if isa == 0 else 1
            if addr >> lo == prev >> lo:
                body = bytes([(addr >> shift) & 0x7F])
            elif addr >> (lo + 8) == prev >> (lo + 8):
                body = bytes([((addr >> shift) & 0x7F) | 0x80, (addr >> (shift + 7)) & 0xFF])
            else:
                raise ValueError(f"short address {addr:#x} is too far from {prev:#x}")
            out.append((0xB4 if src else 0x95) + isa)
            out += body
        elif base in (K.ADDR_L_32IS0, K.ADDR_L_32IS1):
            isa = base - K.ADDR_L_32IS0
            out.append((0xB6 if src else 0x9A) + isa)
            out += self.long_addr(addr, isa, False)
            upper = self.hist[0][0] >> 32 if self.sf_known else 0
            addr = (upper << 32) | (addr & 0xFFFFFFFF)
        else:
            isa = base - K.ADDR_L_64IS0
            out.append((0xB8 if src else 0x9D) + isa)
            out += self.long_addr(addr, isa, True)
        if addr & (3 if isa == 0 else 1):
            raise ValueError(f"address {addr:#x} is not aligned for IS{isa}")
        self.push(addr, isa)

    def put(self, p: Etm4Packet) -> None:
        c, out, k = self.c, self.out, int(p.kind)
        if k == K.ASYNC:
            out += bytes(11) + b"\x80"
        elif k == K.DISCARD:
            out += b"\x00\x03"
        elif k == K.OVERFLOW:
            out += b"\x00\x05"
        elif k == K.TRACE_INFO:
            info = p.info & 0x7F if c.ete else p.info & 0x3F
            ctrl = 0x1 if info else 0
            secs = _cont(info) if info else b""
            thr = p.cc if (info & 1) and p.cc >= 0 else -1
            if thr >= 0:
                ctrl |= 0x8
                secs += _cont(thr)
            out += bytes([0x01, ctrl]) + secs
            self.hist = [(0, 0)] * 3
            self.ts_full = True
            self.threshold = max(thr, 0)
        elif k == K.TIMESTAMP:
            ts = p.ts & _mask(64)
            if self.ts_full:
                n = max(1, (ts.bit_length() + 6) // 7)
            else:
                n = 1
                while n < 9 and ts >> (7 * n) != self.ts >> (7 * n):
                    n += 1
            if n >= 9:
                body = bytes([((ts >> (7 * i)) & 0x7F) | 0x80 for i in range(8)]) + bytes(
                    [(ts >> 56) & 0xFF]
                )
            else:
                body = bytes(
                    [((ts >> (7 * i)) & 0x7F) | (0x80 if i < n - 1 else 0) for i in range(n)]
                )
            if p.cc >= 0:
                out.append(0x03)
                out += body + _cont(p.cc & _mask(c.cc_size), 3)
            else:
                out.append(0x02)
                out += body
            self.ts = ts
            self.ts_full = False
        elif k == K.TRACE_ON:
            out.append(0x04)
        elif k in (K.EXCEPT, K.PE_RESET, K.TRANS_FAIL):
            etype = 0 if k == K.PE_RESET else 0x18 if k == K.TRANS_FAIL else p.info
            interp = 0 if k != K.EXCEPT else p.payload & 3
            b1 = ((etype & 0x1F) << 1) | (interp & 1) | ((interp & 2) << 5)
            if etype >> 5 or (c.ete and etype in (0, 0x18)):
                out += bytes([0x06, b1 | 0x80, (etype >> 5) & 0x1F])
            else:
                out += bytes([0x06, b1])
            if c.ete and etype in (0, 0x18):
                self.push(0, 0)
        elif k == K.EXCEPT_RTN:
            out.append(0x07)
        elif k == K.TRANS_ST:
            out.append(0x0A)
        elif k == K.TRANS_COMMIT:
            out.append(0x0B)
        elif k == K.TS_MARKER:
            out.append(0x88)
        elif k == K.IGNORE:
            out.append(0x70)
        elif k == K.ITE:
            out += bytes([0x09, p.el & 0xFF]) + (p.payload & _mask(64)).to_bytes(8, "little")
        elif k == K.EVENT:
            if not 1 <= p.event <= 15:
                raise ValueError(f"event mask {p.event} is not 1..15")
            out.append(0x70 | p.event)
        elif k == K.CTXT:
            if p.context is None and p.vmid is None and p.el == -1:
                out.append(0x80)
            else:
                out.append(0x81)
                out += self.ctx_bytes(p)
        elif k in (K.CCNT_F1, K.CCNT_F2, K.CCNT_F3):
            cnt = p.cc - self.threshold
            commit = p.info
            if k == K.CCNT_F3:
                if not 0 <= cnt <= 3 or not 1 <= commit <= 4:
                    raise ValueError("cycle count format 3 needs count-threshold 0..3, commit 1..4")
                out.append(0x10 | ((commit - 1) << 2) | cnt)
            elif k == K.CCNT_F2:
                if not 0 <= cnt <= 15 or not 1 <= commit <= 16:
                    raise ValueError(
                        "cycle count format 2 needs count-threshold 0..15, commit 1..16"
                    )
                out += bytes([0x0C, ((commit - 1) << 4) | cnt])
            else:
                out.append(0x0E if p.cc >= 0 else 0x0F)
                if not c.commit_opt1:
                    out += _cont(commit)
                if p.cc >= 0:
                    if not 0 <= cnt < 1 << 21:
                        raise ValueError("cycle count format 1 needs count-threshold 0..2^21-1")
                    out += _cont(cnt, 3)
        elif k == K.COMMIT:
            out.append(0x2D)
            out += _cont(p.info)
        elif k in (K.CANCEL_F1, K.CANCEL_F1_MISPRED):
            out.append(0x2E if k == K.CANCEL_F1 else 0x2F)
            out += _cont(p.info)
        elif k in (K.MISPREDICT, K.CANCEL_F2):
            code = {0: 0, 1: 1, 2: 2}.get(p.natoms, 0)
            if p.natoms == 1:
                code = 1 if p.atoms & 1 else 3
            elif p.natoms == 2:
                if p.atoms & 3 != 3:
                    raise ValueError("mispredict/cancel carries E, EE or N")
                code = 2
            if k == K.CANCEL_F2 and code == 0:
                raise ValueError("cancel format 2 carries E, EE or N")
            out.append((0x30 if k == K.MISPREDICT else 0x34) | code)
        elif k == K.CANCEL_F3:
            if not 2 <= p.info <= 5:
                raise ValueError("cancel format 3 cancels 2..5")
            out.append(0x38 | ((p.info - 2) << 1) | (1 if p.natoms else 0))
        elif k == K.Q:
            self.q(p)
        elif k in ATOM_KINDS:
            out.append(self.atom_byte(k, p.atoms, p.natoms))
        elif k == K.ATOMS:
            self.atom_run(p.atoms, p.natoms)
        elif k in (K.ADDR, K.SRC_ADDR):
            form, idx = self.addr_form(p.address, p.isa, k == K.SRC_ADDR)
            self.address(form, p.address, p.isa, idx)
        elif k == K.ADDR_CTXT or k in range(K.ADDR_CTXT_L_32IS0, K.ADDR_CTXT_L_64IS1 + 1):
            if k == K.ADDR_CTXT:
                upper = self.hist[0][0] >> 32 if self.sf_known else 0
                short = p.address >> 32 == upper or not c.ia_64
                k = (K.ADDR_CTXT_L_32IS0 if short else K.ADDR_CTXT_L_64IS0) + p.isa
            is64 = k >= K.ADDR_CTXT_L_64IS0
            isa = (k - K.ADDR_CTXT_L_32IS0) & 1
            hdr = (0x85 if is64 else 0x82) + isa
            addr = p.address
            out.append(hdr)
            out += self.long_addr(addr, isa, is64)
            if not is64:
                upper = self.hist[0][0] >> 32 if self.sf_known else 0
                addr = (upper << 32) | (addr & 0xFFFFFFFF)
            out += self.ctx_bytes(p)
            self.push(addr, isa)
        elif k in ADDRESS_KINDS:
            self.address(k, p.address, p.isa, p.info)
        else:
            raise ValueError(f"cannot encode a {p.kind!r} packet")

    def q(self, p: Etm4Packet) -> None:
        """A Q packet of form ``p.payload`` (the header's low nibble: 0-2
        exact match, 5/6 short address IS0/IS1, 0xA/0xB long 32-bit address
        IS0/IS1, 0xC count only, 0xF nothing) with count ``p.info``."""
        qt = p.payload
        if not self.c.q_elements:
            raise ValueError("Q packets need a trace unit with Q elements (TRCIDR0.QSUPP)")
        if qt not in (0, 1, 2, 5, 6, 0xA, 0xB, 0xC, 0xF):
            raise ValueError(f"Q packet form {qt:#x} is reserved")
        out = self.out
        out.append(0xA0 | qt)
        if qt <= 2:
            addr, isa = self.hist[qt]
            if (p.address, p.isa) != (addr, isa):
                raise ValueError(f"Q exact match {qt}: {p.address:#x} is not in the history")
            self.push(addr, isa)
        elif qt in (5, 6):
            isa, shift = (0, 2) if qt == 5 else (1, 1)
            prev = self.hist[0][0]
            if p.address >> (7 + shift) == prev >> (7 + shift):
                out.append((p.address >> shift) & 0x7F)
            elif p.address >> (15 + shift) == prev >> (15 + shift):
                out += bytes(
                    [((p.address >> shift) & 0x7F) | 0x80, (p.address >> (7 + shift)) & 0xFF]
                )
            else:
                raise ValueError(f"Q short address {p.address:#x} is too far from {prev:#x}")
            self.push(p.address, isa)
        elif qt in (0xA, 0xB):
            isa = qt - 0xA
            out += self.long_addr(p.address, isa, False)
            upper = self.hist[0][0] >> 32 if self.sf_known else 0
            self.push((upper << 32) | (p.address & 0xFFFFFFFF), isa)
        if qt != 0xF:
            if p.info < 0:
                raise ValueError(f"Q packet form {qt:#x} carries a count")
            out += _cont(p.info)

    def atom_byte(self, k: int, bits: int, n: int) -> int:
        bits &= _mask(max(n, 0))
        if k == K.ATOM_F1 and n == 1:
            return 0xF6 | bits
        if k == K.ATOM_F2 and n == 2:
            return 0xD8 | bits
        if k == K.ATOM_F3 and n == 3:
            return 0xF8 | bits
        if k == K.ATOM_F4 and n == 4 and bits in _F4:
            return 0xDC | _F4.index(bits)
        if k == K.ATOM_F5 and n == 5 and bits in _F5.values():
            idx = next(i for i, v in _F5.items() if v == bits)
            return 0xD5 + idx - 1 if idx < 4 else 0xF5
        if k == K.ATOM_F6 and 4 <= n <= 24:
            es = n - 1
            if bits & _mask(es) == _mask(es):
                last_n = not (bits >> es) & 1
                return (0xE0 if last_n else 0xC0) | (es - 3)
        raise ValueError(f"atoms {bits:#x}/{n} do not fit {Etm4Kind(k).name}")

    def atom_run(self, bits: int, n: int) -> None:
        i = 0
        while i < n:
            run = 0
            while i + run < n and (bits >> (i + run)) & 1:
                run += 1
            if run >= 3:
                es = min(run, 23)
                if i + es < n and es == run:
                    self.out.append(self.atom_byte(K.ATOM_F6, _mask(es), es + 1))
                    i += es + 1
                    continue
                if es >= 4:
                    self.out.append(self.atom_byte(K.ATOM_F6, _mask(es), es))
                    i += es
                    continue
            m = min(3, n - i)
            chunk = (bits >> i) & _mask(m)
            self.out.append(self.atom_byte((K.ATOM_F1, K.ATOM_F2, K.ATOM_F3)[m - 1], chunk, m))
            i += m


def encode_etm4(packets: Iterable[Etm4Packet], config: Etm4Config) -> bytes:
    """The bytes a trace unit with ``config`` writes for ``packets``.

    ``ADDR``/``SRC_ADDR`` pick the exact-match, short or long form from the
    address history as the hardware does; ``ADDR_CTXT`` picks the 32- or
    64-bit form; ``ATOMS`` splits any E/N sequence into atom packets;
    timestamps send only the low bits that changed.  A request that the
    format cannot carry raises :class:`Etm4Error` with the packet index."""
    enc = _Encoder(config)
    for i, p in enumerate(packets):
        try:
            enc.put(p)
        except ValueError as e:
            raise Etm4Error(i, str(e)) from None
    return bytes(enc.out)


# ------------------------------------------------------------------ decoder

# error codes -> messages
_MESSAGES = (
    "",
    "data before the first A-sync skipped",
    "reserved packet header",
    "bad extension packet",
    "bad A-sync sequence",
    "incomplete packet at end of trace",
    "reserved header for this configuration",
    "no A-sync found",
)
E_UNSYNC, E_RESERVED, E_EXT, E_ASYNC, E_EOT, E_CFG, E_NOSYNC = 1, 2, 3, 4, 5, 6, 7

# state vector layout
S_SYNC, S_A0, S_A1, S_A2, S_I0, S_I1, S_I2, S_TS, S_TSV = 0, 1, 2, 3, 4, 5, 6, 7, 8
S_CTXV, S_SF, S_NS, S_EL, S_CID, S_VMID, S_THR = 9, 10, 11, 12, 13, 14, 15
# the address bits each history entry's packet carried (OpenCSD prints a Q
# packet's exact-match address with them)
S_B0, S_B1, S_B2, S_NSTATE = 16, 17, 18, 19

_MASK32 = np.int64(0xFFFFFFFF)

# Q packet forms by the header's low nibble (ETMv4 IHI0064 "Q packet";
# OpenCSD's iPktQ): 1 exact match (entry = the nibble), 2/3 short address
# IS0/IS1, 4 long 32-bit address, 5 count only, 6 neither count nor address;
# 0: reserved
_Q_FORM = np.array([1, 1, 1, 0, 0, 2, 3, 0, 0, 0, 4, 4, 5, 0, 0, 6], dtype=np.int64)


@njit(cache=True, _nrt=False)
def _cont_field(buf, p, end, limit):
    """(value, bytes) of a continuation field at p, or (0, -1) if cut."""
    v = np.int64(0)
    i = 0
    while i < limit:
        if p + i >= end:
            return v, -1
        b = np.int64(buf[p + i])
        v |= (b & 0x7F) << (7 * i)
        i += 1
        if b & 0x80 == 0:
            break
    return v, i


@njit(cache=True, _nrt=False)
def _field_at(buf, q, end, limit):
    """(value, position after it, cut) of a continuation field at q."""
    v, k = _cont_field(buf, q, end, limit)
    if k < 0:
        return v, q, True
    return v, q + k, False


@njit(cache=True, _nrt=False)
def _push(st, addr, isa, bits):
    st[S_A2] = st[S_A1]
    st[S_I2] = st[S_I1]
    st[S_B2] = st[S_B1]
    st[S_A1] = st[S_A0]
    st[S_I1] = st[S_I0]
    st[S_B1] = st[S_B0]
    st[S_A0] = addr
    st[S_I0] = isa
    st[S_B0] = bits


@njit(cache=True, inline="always", _nrt=False)
def _le_field(buf, p, nbytes):
    """The little-endian value of the ``nbytes`` bytes at p."""
    v = np.int64(0)
    for i in range(nbytes):
        v |= np.int64(buf[p + i]) << (8 * i)
    return v


@njit(cache=True, _nrt=False)
def _long_addr(buf, p, isa, nbytes):
    if isa == 0:
        v = (np.int64(buf[p]) & 0x7F) << 2
        v |= (np.int64(buf[p + 1]) & 0x7F) << 9
    else:
        v = (np.int64(buf[p]) & 0x7F) << 1
        v |= np.int64(buf[p + 1]) << 8
    return v | (_le_field(buf, p + 2, nbytes - 2) << 16)


@njit(cache=True, _nrt=False)
def _find_async(buf, p, end):
    """Offset of the next A-sync (11 zero bytes then 0x80) at or after p, or -1."""
    zeros = 0
    i = p
    while i < end:
        b = buf[i]
        if b == 0:
            zeros += 1
        elif b == 0x80 and zeros >= 11:
            return i - 11
        else:
            zeros = 0
        i += 1
    return -1


@njit(cache=True, _nrt=False)
def _error_row(pos, code, kind, size, e_off, e_code, ne, o_off, o_kind, o_size, n):
    """Error ``code`` at ``pos``, and the packet row (``kind``, ``size``
    bytes) that stands for what it spoils: the error and packet counts
    after them."""
    e_off[ne] = pos
    e_code[ne] = code
    o_off[n] = pos
    o_kind[n] = kind
    o_size[n] = size
    return ne + 1, n + 1


@njit(cache=True, _nrt=False)
def _run(
    buf, pos, end, cfg, st,
    o_off, o_kind, o_size, o_addr, o_isa, o_atoms, o_natoms, o_cc, o_ts,
    o_ctx, o_vmid, o_el, o_flags, o_event, o_info, o_payload,
    n, e_off, e_code, ne,
):  # fmt: skip
    ete = cfg[0] != 0
    ver = cfg[1]
    cid_bytes = cfg[2]
    vmid_bytes = cfg[3]
    cc_mask = (np.int64(1) << cfg[4]) - 1
    commit_opt1 = cfg[5] != 0
    max_spec = cfg[6]
    ite = cfg[7] != 0
    q_elem = cfg[8] != 0
    resync = cfg[9] != 0
    cap = o_off.shape[0]
    ecap = e_off.shape[0]
    while pos < end and n < cap and ne < ecap - 2:
        if st[S_SYNC] == 0:
            a = _find_async(buf, pos, end)
            if a < 0:  # a NOT_SYNC packet (kind 100) up to the end
                ne, n = _error_row(
                    pos, E_NOSYNC, 100, end - pos, e_off, e_code, ne, o_off, o_kind, o_size, n
                )
                pos = end
                break
            if a > pos:
                ne, n = _error_row(
                    pos, E_UNSYNC, 100, a - pos, e_off, e_code, ne, o_off, o_kind, o_size, n
                )
                pos = a
                continue
            st[S_SYNC] = 1
        h = np.int64(buf[pos])
        kind = 0
        size = 1
        addr = st[S_A0]
        isa = st[S_I0]
        atoms = 0
        natoms = 0
        cc = np.int64(-1)
        flags = 0
        event = 0
        info = np.int64(0)
        payload = np.int64(0)
        err = 0
        cut = False
        avail = end - pos
        # Atoms first: most of a trace's packets, and no other header is
        # 0xC0 or above.
        if h >= 0xC0:
            if h >= 0xF8:
                kind, atoms, natoms = 52, h & 7, 3
            elif h >= 0xF6:
                kind, atoms, natoms = 50, h & 1, 1
            elif h == 0xF5 or (h >= 0xD5 and h <= 0xD7):
                kind = 54
                natoms = 5
                pi = ((h & 0x20) >> 3) | (h & 3)
                if pi == 5:
                    atoms = 0x1E
                elif pi == 1:
                    atoms = 0
                elif pi == 2:
                    atoms = 0x0A
                else:
                    atoms = 0x15
            elif h >= 0xD8 and h <= 0xDB:
                kind, atoms, natoms = 51, h & 3, 2
            elif h >= 0xDC and h <= 0xDF:
                kind, natoms = 53, 4
                j = h & 3
                atoms = 0xE if j == 0 else (0 if j == 1 else (0xA if j == 2 else 0x5))
            else:
                kind = 55
                es = (h & 0x1F) + 3
                atoms = (1 << es) - 1
                if h & 0x20 == 0:
                    atoms |= 1 << es
                natoms = es + 1
        elif h == 0x00:
            if avail < 2:
                cut = True
            else:
                b1 = buf[pos + 1]
                if b1 == 0x03:
                    kind = 25
                    size = 2
                elif b1 == 0x05:
                    kind = 26
                    size = 2
                elif b1 == 0x00:
                    z = pos + 1
                    while z < end and buf[z] == 0 and z - pos < 12:
                        z += 1
                    if z >= end:
                        cut = True
                    elif z - pos == 11 and buf[z] == 0x80:
                        kind = 1
                        size = 12
                    else:
                        err = E_ASYNC
                        # the byte that broke the sequence belongs to it
                        # (OpenCSD's iPktASync), 12 zeros are one
                        size = z - pos if z - pos >= 12 else z - pos + 1
                else:
                    err = E_EXT
                    size = 2
        elif h == 0x01:
            # control bytes
            q = pos + 1
            ctrl0 = -1
            while True:
                if q >= end:
                    cut = True
                    break
                b = buf[q]
                if ctrl0 < 0:
                    ctrl0 = b
                q += 1
                if b & 0x80 == 0:
                    break
            if not cut:
                thr = np.int64(0)
                for sec in range(5):
                    if ctrl0 & (1 << sec):
                        v, k = _cont_field(buf, q, end, 5)
                        if k < 0:
                            cut = True
                            break
                        q += k
                        if sec == 0:
                            info = v
                        elif sec == 3:
                            thr = v
                if not cut:
                    kind = 2
                    size = q - pos
                    st[S_THR] = thr if info & 1 else 0
                    if info & 1:
                        cc = thr
                    for j in range(3):  # the address history starts empty
                        st[S_A0 + j] = 0
                        st[S_I0 + j] = 0
                        st[S_B0 + j] = 0
                    st[S_TSV] = 0
                    addr = 0
                    isa = 0
        elif h == 0x02 or h == 0x03:
            q = pos + 1
            v = np.int64(0)
            nb = 0
            while True:
                if q >= end:
                    cut = True
                    break
                b = np.int64(buf[q])
                q += 1
                if nb == 8:
                    v |= b << 56
                    nb += 1
                    break
                v |= (b & 0x7F) << (7 * nb)
                nb += 1
                if b & 0x80 == 0:
                    break
            if not cut and h == 0x03:
                c, k = _cont_field(buf, q, end, 3)
                if k < 0:
                    cut = True
                else:
                    q += k
                    cc = c & cc_mask
            if not cut:
                kind = 3
                size = q - pos
                bits = nb * 7 if nb < 9 else 64
                if st[S_TSV] == 0 or bits >= 64:
                    st[S_TS] = v
                else:
                    m = (np.int64(1) << bits) - 1
                    st[S_TS] = (st[S_TS] & ~m) | (v & m)
                st[S_TSV] = 1
        elif h == 0x04:
            kind = 4
        elif h == 0x06:
            if avail < 2:
                cut = True
            else:
                b1 = np.int64(buf[pos + 1])
                etype = (b1 >> 1) & 0x1F
                three = (b1 & 0x80) != 0 or (ete and (etype == 0 or etype == 0x18))
                if three and avail < 3:
                    cut = True
                else:
                    size = 3 if three else 2
                    if b1 & 0x80:
                        etype |= (np.int64(buf[pos + 2]) & 0x1F) << 5
                    info = etype
                    payload = ((b1 & 0x40) >> 5) | (b1 & 1)
                    kind = 5
                    if ete and (etype == 0 or etype == 0x18):
                        kind = 7 if etype == 0 else 8
                        _push(st, 0, 0, 64)
                        addr = 0
                        isa = 0
        elif h == 0x07 and not ete:
            kind = 6
        elif h == 0x09 and ite:
            if avail < 10:
                cut = True
            else:
                kind = 11
                size = 10
                info = np.int64(buf[pos + 1])
                payload = _le_field(buf, pos + 2, 8)
        elif (h == 0x0A or h == 0x0B) and ete:
            kind = 9 if h == 0x0A else 10
        elif h >= 0x0C and h <= 0x0F:
            if h <= 0x0D:
                if avail < 2:
                    cut = True
                else:
                    kind = 13
                    size = 2
                    b1 = np.int64(buf[pos + 1])
                    off = (max_spec - 15) if b1 & 1 else 1
                    info = ((b1 >> 4) & 0xF) + off
                    cc = st[S_THR] + (b1 & 0xF)
            else:
                q = pos + 1
                if not commit_opt1:
                    info, q, cut = _field_at(buf, q, end, 5)
                if not cut and h == 0x0E:
                    v, k = _cont_field(buf, q, end, 3)
                    if k < 0:
                        cut = True
                    else:
                        q += k
                        cc = v + st[S_THR]
                elif not cut:
                    cc = 0
                if not cut:
                    kind = 12
                    size = q - pos
        elif h >= 0x10 and h <= 0x1F:
            kind = 14
            info = ((h >> 2) & 3) + 1
            cc = st[S_THR] + (h & 3)
        elif h == 0x2D or h == 0x2E or h == 0x2F:
            v, k = _cont_field(buf, pos + 1, end, 5)
            if k < 0:
                cut = True
            else:
                kind = 15 if h == 0x2D else (16 if h == 0x2E else 17)
                size = 1 + k
                info = v
        elif h >= 0x30 and h <= 0x37:
            kind = 18 if h <= 0x33 else 19
            c2 = h & 3
            if c2 == 1:
                atoms, natoms = 1, 1
            elif c2 == 2:
                atoms, natoms = 3, 2
            elif c2 == 3:
                atoms, natoms = 0, 1
            if kind == 19:
                info = 1
        elif h >= 0x38 and h <= 0x3F:
            kind = 20
            if h & 1:
                atoms, natoms = 1, 1
            info = ((h >> 1) & 3) + 2
        elif h == 0x70 and (ete or ver >= 0x43):
            kind = 21
        elif h >= 0x71 and h <= 0x7F:
            kind = 22
            event = h & 0xF
            info = event
        elif h == 0x80:
            kind = 23
        elif h == 0x81 or h == 0x82 or h == 0x83 or h == 0x85 or h == 0x86:
            q = pos + 1
            alen = 0
            if h == 0x82 or h == 0x83:
                alen = 4
            elif h == 0x85 or h == 0x86:
                alen = 8
            if avail < 1 + alen + 1:
                cut = True
            else:
                q += alen
                ib = np.int64(buf[q])
                need = 1 + alen + 1
                nv = vmid_bytes if ib & 0x40 else 0
                nc = cid_bytes if ib & 0x80 else 0
                need += nv + nc
                if avail < need:
                    cut = True
                else:
                    size = need
                    q += 1
                    isa = np.int64(1) if (h == 0x83 or h == 0x86) else np.int64(0)
                    if h != 0x81:
                        v = _long_addr(buf, pos + 1, isa, alen)
                        if alen == 4 and st[S_CTXV] != 0 and st[S_SF] != 0:
                            v = (st[S_A0] & ~_MASK32) | v
                        addr = v
                    st[S_CTXV] = 1
                    st[S_EL] = ib & 3
                    st[S_SF] = (ib >> 4) & 1
                    st[S_NS] = (ib >> 5) & 1
                    flags = 4
                    if nv:
                        st[S_VMID] = _le_field(buf, q, nv)
                        q += nv
                        flags |= 16
                    if nc:
                        st[S_CID] = _le_field(buf, q, nc)
                        flags |= 8
                    if h == 0x81:
                        kind = 23
                        isa = st[S_I0]
                    else:
                        kind = (30 if alen == 4 else 32) + isa
                        _push(st, addr, isa, 8 * alen)
        elif h == 0x88 and (ete or ver >= 0x46):
            kind = 24
        elif (h >= 0x90 and h <= 0x92) or (ete and h >= 0xB0 and h <= 0xB2):
            idx = h & 3
            kind = 34 if h < 0xB0 else 41
            info = idx
            addr = st[S_A0 + idx]
            isa = st[S_I0 + idx]
            _push(st, addr, isa, st[S_B0 + idx])  # pushed again, as any address
        elif h == 0x95 or h == 0x96 or (ete and (h == 0xB4 or h == 0xB5)):
            isa = np.int64(1) if (h == 0x96 or h == 0xB5) else np.int64(0)
            shift = 2 if isa == 0 else 1
            if avail < 2:
                cut = True
            else:
                b0 = np.int64(buf[pos + 1])
                v = (b0 & 0x7F) << shift
                bits = 7 + shift
                size = 2
                if b0 & 0x80:
                    if avail < 3:
                        cut = True
                    else:
                        v |= np.int64(buf[pos + 2]) << (7 + shift)
                        bits += 8
                        size = 3
                if not cut:
                    m = (np.int64(1) << bits) - 1
                    addr = (st[S_A0] & ~m) | v
                    kind = (35 if h < 0xB0 else 42) + isa
                    flags = bits  # the number of bits the packet carried
                    _push(st, addr, isa, bits)
        elif (
            h == 0x9A or h == 0x9B or h == 0x9D or h == 0x9E
            or (ete and h >= 0xB6 and h <= 0xB9)
        ):  # fmt: skip
            if h < 0xB0:
                is64 = h >= 0x9D
                isa = np.int64(h - 0x9D) if is64 else np.int64(h - 0x9A)
            else:
                is64 = h >= 0xB8
                isa = np.int64(h - 0xB8) if is64 else np.int64(h - 0xB6)
            alen = 8 if is64 else 4
            if avail < 1 + alen:
                cut = True
            else:
                size = 1 + alen
                v = _long_addr(buf, pos + 1, isa, alen)
                if not is64 and st[S_CTXV] != 0 and st[S_SF] != 0:
                    v = (st[S_A0] & ~_MASK32) | v
                addr = v
                base = 37 if h < 0xB0 else 44
                kind = base + isa + (2 if is64 else 0)
                _push(st, addr, isa, 8 * alen)
        elif h >= 0xA0 and h <= 0xAF and q_elem and _Q_FORM[h & 0xF] != 0:
            # Q: an instruction count, with an address in some forms
            qt = h & 0xF
            form = _Q_FORM[qt]
            q = pos + 1
            if form == 2 or form == 3:  # short (IS0 0x5, IS1 0x6)
                isa = np.int64(0) if qt == 5 else np.int64(1)
                shift = 2 if isa == 0 else 1
                if q >= end:
                    cut = True
                else:
                    b0 = np.int64(buf[q])
                    v = (b0 & 0x7F) << shift
                    bits = 7 + shift
                    q += 1
                    if b0 & 0x80:
                        if q >= end:
                            cut = True
                        else:
                            v |= np.int64(buf[q]) << (7 + shift)
                            bits += 8
                            q += 1
                    if not cut:
                        m = (np.int64(1) << bits) - 1
                        addr = (st[S_A0] & ~m) | v
                        natoms = bits  # the address bits the packet carried
                        _push(st, addr, isa, bits)
            elif form == 4:  # long 32-bit (IS0 0xA, IS1 0xB)
                isa = np.int64(0) if qt == 0xA else np.int64(1)
                if q + 4 > end:
                    cut = True
                else:
                    v = _long_addr(buf, q, isa, 4)
                    if st[S_CTXV] != 0 and st[S_SF] != 0:
                        v = (st[S_A0] & ~_MASK32) | v
                    addr = v
                    q += 4
                    natoms = 32
                    _push(st, addr, isa, 32)
            elif form == 1:  # exact match, entry 0-2
                addr = st[S_A0 + qt]
                isa = st[S_I0 + qt]
                natoms = st[S_B0 + qt] if st[S_B0 + qt] < 64 else 0
                _push(st, addr, isa, st[S_B0 + qt])
            if not cut and qt != 0xF:
                info, q, cut = _field_at(buf, q, end, 5)
            if not cut:
                kind = 27
                size = q - pos
                payload = qt
        elif (
            (h >= 0x20 and h <= 0x2C) or (h >= 0x40 and h <= 0x46) or (h >= 0x48 and h <= 0x4A)
            or (h >= 0x4C and h <= 0x5F) or (h >= 0x68 and h <= 0x6F) or (h == 0x07 and ete)
        ):  # fmt: skip
            # data, conditional and (ETE) exception-return headers: packets
            # of a configuration this unit does not have (OpenCSD's
            # I_RESERVED_CFG)
            err = E_CFG
        else:
            err = E_RESERVED
        if cut:
            o_info[n] = h
            o_event[n] = E_EOT
            # an A-sync already had its second zero byte (not an extension)
            o_payload[n] = 1 if h == 0 and avail >= 2 and buf[pos + 1] == 0 else 0
            ne, n = _error_row(
                pos, E_EOT, 103, end - pos, e_off, e_code, ne, o_off, o_kind, o_size, n
            )
            pos = end
            break
        if err != 0:
            o_info[n] = h
            o_event[n] = err
            kind = 102 if (err == E_EXT or err == E_ASYNC) else 101
            ne, n = _error_row(pos, err, kind, size, e_off, e_code, ne, o_off, o_kind, o_size, n)
            pos += size
            if resync:
                st[S_SYNC] = 0
            continue
        o_off[n] = pos
        o_kind[n] = kind
        o_size[n] = size
        o_addr[n] = addr
        o_isa[n] = isa
        o_atoms[n] = atoms
        o_natoms[n] = natoms
        o_cc[n] = cc
        o_ts[n] = st[S_TS]
        o_ctx[n] = st[S_CID]
        o_vmid[n] = st[S_VMID]
        o_el[n] = st[S_EL]
        o_flags[n] = flags | (st[S_SF] << 5) | (st[S_NS] << 6)
        o_event[n] = event
        o_info[n] = info
        o_payload[n] = payload
        n += 1
        pos += size
    return pos, n, ne


_COLUMNS = (
    ("offset", np.int64),
    ("kind", np.uint8),
    ("size", np.int32),
    ("address", np.int64),
    ("isa", np.uint8),
    ("atoms", np.uint32),
    ("natoms", np.uint8),
    ("cc", np.int64),
    ("ts", np.int64),
    ("context", np.uint32),
    ("vmid", np.uint32),
    ("el", np.uint8),
    ("flags", np.uint8),
    ("event", np.uint8),
    ("info", np.int64),
    ("payload", np.int64),
)


@dataclass
class Etm4Packets:
    """Decoded packets as columns (one row a packet, damage rows included).

    ``address`` and ``isa``: the current address after the packet (the
    packet's own for address packets); ``atoms``/``natoms``: the E/N bits
    (bit i = atom i, oldest first); ``cc``: the packet's cycle count, -1 if
    none; ``ts``, ``context``, ``vmid``, ``el``: the current timestamp and
    context after the packet; ``flags``: bit 2 context in this packet, bit 3
    with a context ID, bit 4 with a VMID, bit 5 SF (AArch64), bit 6 NS, and
    for short addresses bits 0-4 the bits the packet carried; ``event``: an
    event packet's mask; ``info`` and ``payload``: as :class:`Etm4Packet`
    (for damage rows ``info`` is the header byte and ``event`` the error
    code); ``errors``: ``(offset,
    message)``."""

    offset: np.ndarray
    kind: np.ndarray
    size: np.ndarray
    address: np.ndarray
    isa: np.ndarray
    atoms: np.ndarray
    natoms: np.ndarray
    cc: np.ndarray
    ts: np.ndarray
    context: np.ndarray
    vmid: np.ndarray
    el: np.ndarray
    flags: np.ndarray
    event: np.ndarray
    info: np.ndarray
    payload: np.ndarray
    errors: list[tuple[int, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.offset.shape[0])

    def packet(self, i: int) -> Etm4Packet:
        """Row ``i`` as an :class:`Etm4Packet`."""
        k = Etm4Kind(int(self.kind[i]))
        fl = int(self.flags[i])
        ctx = k == K.CTXT or K.ADDR_CTXT_L_32IS0 <= k <= K.ADDR_CTXT_L_64IS1
        return Etm4Packet(
            kind=k,
            address=int(self.address[i]) & _mask(64),
            isa=int(self.isa[i]),
            atoms=int(self.atoms[i]),
            natoms=int(self.natoms[i]),
            cc=int(self.cc[i]),
            ts=int(self.ts[i]) & _mask(64),
            context=int(self.context[i]) if ctx and fl & 8 else None,
            vmid=int(self.vmid[i]) if ctx and fl & 16 else None,
            el=int(self.el[i]) if k != K.ITE else int(self.info[i]),
            sf=bool(fl & 32),
            ns=bool(fl & 64),
            event=int(self.event[i]),
            info=int(self.info[i]),
            payload=int(self.payload[i]) & _mask(64),
        )


class _Etm4Run:
    """One ETMv4/ETE stream being decoded: :func:`_run`'s state between
    calls (the position, the decoder's registers, the damage met so far),
    so that rows can be taken a window at a time."""

    def __init__(self, data: bytes | bytearray | memoryview | np.ndarray, config: Etm4Config,
                 resync: bool) -> None:  # fmt: skip
        buf = np.frombuffer(bytes(data), np.uint8) if not isinstance(data, np.ndarray) else data
        self.buf = np.ascontiguousarray(buf, dtype=np.uint8)
        self.end = int(self.buf.shape[0])
        self.cfg = config._array()
        self.cfg[9] = int(resync)
        self.st = np.zeros(S_NSTATE, dtype=np.int64)
        self.pos = 0
        self.e_off = np.zeros(1024, dtype=np.int64)
        self.e_code = np.zeros(1024, dtype=np.int64)
        self.errors: list[tuple[int, str]] = []

    @property
    def done(self) -> bool:
        return self.pos >= self.end

    def fill(self, cols: list[np.ndarray], n: int) -> int:
        """Decode into ``cols`` from row ``n`` until they are full or the
        stream ends; the rows they then hold."""
        while not self.done and n < cols[0].shape[0]:
            self.pos, n, ne = _run(self.buf, self.pos, self.end, self.cfg, self.st, *cols, n,
                                   self.e_off, self.e_code, 0)  # fmt: skip
            self.errors += [(int(o), _MESSAGES[int(c)])
                            for o, c in zip(self.e_off[:ne], self.e_code[:ne], strict=True)]  # fmt: skip
        return n

    def take(self) -> list[tuple[int, str]]:
        """The damage met since the last call."""
        errors, self.errors = self.errors, []
        return errors


def _packets(cols: list[np.ndarray], n: int, errors: list[tuple[int, str]]) -> Etm4Packets:
    out = {name: c[:n] for (name, _), c in zip(_COLUMNS, cols, strict=True)}
    for name in ("address", "ts", "payload"):
        out[name] = out[name].view(np.uint64)
    return Etm4Packets(**out, errors=errors)


def decode_etm4(
    data: bytes | bytearray | memoryview | np.ndarray,
    config: Etm4Config,
    *,
    resync: bool = True,
) -> Etm4Packets:
    """Decode an ETMv4/ETE byte stream (one trace source, no frame
    formatting).  Never raises on damaged data: each problem is a row of a
    damage kind and an ``errors`` entry, and decoding resumes at the next
    A-sync (with ``resync=False``, at the next byte, still synchronised, as
    OpenCSD's packet processor does, so a listing follows OpenCSD's through
    damage)."""
    run = _Etm4Run(data, config, resync)
    # A row per byte: the most packets there can be (atoms are one byte
    # each; an atom-dense trace has more than one packet per two bytes).
    # Zeroed columns are fresh pages touched only where rows go; growing
    # them would copy every row decoded so far.
    cols = [np.zeros(max(1024, run.end + 16), dtype=dt) for _, dt in _COLUMNS]
    n = 0
    while True:
        n = run.fill(cols, n)
        if run.done:
            break
        # as many more rows as the packets so far say the rest holds
        grow = max(1024, int(n * (run.end - run.pos) / max(run.pos, 1) * 1.05) + 16)
        cols = [np.concatenate([c, np.zeros(grow, dtype=c.dtype)]) for c in cols]
    return _packets(cols, n, run.take())


def etm4_windows(
    data: bytes | bytearray | memoryview | np.ndarray,
    config: Etm4Config,
    *,
    resync: bool = True,
    rows: int = 1 << 16,
) -> Iterator[Etm4Packets]:
    """:func:`decode_etm4`'s packets, at most ``rows`` at a time (the
    decoder carries on from one window to the next; each window's
    ``errors`` are the damage in it): a stream of any length is decoded
    in the memory of one window."""
    run = _Etm4Run(data, config, resync)
    while not run.done:
        # (zeros: a damage row sets only some of its columns)
        cols = [np.zeros(rows, dtype=dt) for _, dt in _COLUMNS]
        n = run.fill(cols, 0)
        yield _packets(cols, n, run.take())


# ------------------------------------------------------------------ dump

_NAMES = {
    K.ASYNC: ("I_ASYNC", "Alignment Synchronisation."),
    K.TRACE_INFO: ("I_TRACE_INFO", "Trace Info."),
    K.TIMESTAMP: ("I_TIMESTAMP", "Timestamp."),
    K.TRACE_ON: ("I_TRACE_ON", "Trace On."),
    K.EXCEPT: ("I_EXCEPT", "Exception."),
    K.EXCEPT_RTN: ("I_EXCEPT_RTN", "Exception Return."),
    K.PE_RESET: ("I_PE_RESET", "PE Reset."),
    K.TRANS_FAIL: ("I_TRANS_FAIL", "Transaction Fail."),
    K.TRANS_ST: ("I_TRANS_ST", "Transaction Start."),
    K.TRANS_COMMIT: ("I_TRANS_COMMIT", "Transaction Commit."),
    K.ITE: ("I_ITE", "Instrumentation."),
    K.CCNT_F1: ("I_CCNT_F1", "Cycle Count format 1."),
    K.CCNT_F2: ("I_CCNT_F2", "Cycle Count format 2."),
    K.CCNT_F3: ("I_CCNT_F3", "Cycle Count format 3."),
    K.COMMIT: ("I_COMMIT", "Commit"),
    K.CANCEL_F1: ("I_CANCEL_F1", "Cancel Format 1."),
    K.CANCEL_F1_MISPRED: ("I_CANCEL_F1_MISPRED", "Cancel Format 1 + Mispredict."),
    K.MISPREDICT: ("I_MISPREDICT", "Mispredict."),
    K.CANCEL_F2: ("I_CANCEL_F2", "Cancel Format 2."),
    K.CANCEL_F3: ("I_CANCEL_F3", "Cancel Format 3."),
    K.IGNORE: ("I_IGNORE", "Ignore."),
    K.EVENT: ("I_EVENT", "Trace Event."),
    K.CTXT: ("I_CTXT", "Context Packet."),
    K.TS_MARKER: ("I_TS_MARKER", "Timestamp Marker"),
    K.DISCARD: ("I_DISCARD", "Discard."),
    K.OVERFLOW: ("I_OVERFLOW", "Overflow."),
    K.Q: ("I_Q", "Q Packet."),
    K.ADDR_CTXT_L_32IS0: ("I_ADDR_CTXT_L_32IS0", "Address & Context, Long, 32 bit, IS0."),
    K.ADDR_CTXT_L_32IS1: ("I_ADDR_CTXT_L_32IS1", "Address & Context, Long, 32 bit, IS0."),
    K.ADDR_CTXT_L_64IS0: ("I_ADDR_CTXT_L_64IS0", "Address & Context, Long, 64 bit, IS0."),
    K.ADDR_CTXT_L_64IS1: ("I_ADDR_CTXT_L_64IS1", "Address & Context, Long, 64 bit, IS1."),
    K.ADDR_MATCH: ("I_ADDR_MATCH", "Exact Address Match."),
    K.ADDR_S_IS0: ("I_ADDR_S_IS0", "Address, Short, IS0."),
    K.ADDR_S_IS1: ("I_ADDR_S_IS1", "Address, Short, IS1."),
    K.ADDR_L_32IS0: ("I_ADDR_L_32IS0", "Address, Long, 32 bit, IS0."),
    K.ADDR_L_32IS1: ("I_ADDR_L_32IS1", "Address, Long, 32 bit, IS1."),
    K.ADDR_L_64IS0: ("I_ADDR_L_64IS0", "Address, Long, 64 bit, IS0."),
    K.ADDR_L_64IS1: ("I_ADDR_L_64IS1", "Address, Long, 64 bit, IS1."),
    K.SRC_ADDR_MATCH: ("I_SRC_ADDR_MATCH", "Exact Source Address Match."),
    K.SRC_ADDR_S_IS0: ("I_SRC_ADDR_S_IS0", "Source Address, Short, IS0."),
    K.SRC_ADDR_S_IS1: ("I_SRC_ADDR_S_IS1", "Source Address, Short, IS1."),
    K.SRC_ADDR_L_32IS0: ("I_SCR_ADDR_L_32IS0", "Source Address, Long, 32 bit, IS0."),
    K.SRC_ADDR_L_32IS1: ("I_SRC_ADDR_L_32IS1", "Source Address, Long, 32 bit, IS1."),
    K.SRC_ADDR_L_64IS0: ("I_SRC_ADDR_L_64IS0", "Source Address, Long, 64 bit, IS0."),
    K.SRC_ADDR_L_64IS1: ("I_SRC_ADDR_L_64IS1", "Source Address, Long, 64 bit, IS1."),
    K.ATOM_F1: ("I_ATOM_F1", "Atom format 1."),
    K.ATOM_F2: ("I_ATOM_F2", "Atom format 2."),
    K.ATOM_F3: ("I_ATOM_F3", "Atom format 3."),
    K.ATOM_F4: ("I_ATOM_F4", "Atom format 4."),
    K.ATOM_F5: ("I_ATOM_F5", "Atom format 5."),
    K.ATOM_F6: ("I_ATOM_F6", "Atom format 6."),
    K.NOT_SYNC: ("I_NOT_SYNC", "I Stream not synchronised"),
    K.RESERVED: ("I_RESERVED", "Reserved Packet Header"),
    # a header reserved for this configuration; OpenCSD names the packet
    # in brackets
    -E_CFG: ("I_RESERVED_CFG", "Reserved header for current configuration."),
    K.BAD_SEQUENCE: ("I_BAD_SEQUENCE", "Invalid Sequence in packet."),
    K.INCOMPLETE_EOT: ("I_INCOMPLETE_EOT", "Incomplete packet at end of trace."),
}

_EXCEPTIONS = (
    "PE Reset", "Debug Halt", "Call", "Trap", "System Error", "Reserved", "Inst Debug",
    "Data Debug", "Reserved", "Reserved", "Alignment", "Inst Fault", "Data Fault",
    "Reserved", "IRQ", "FIQ",
)  # fmt: skip


def _header_name(h: int, async_started: bool = False) -> str:
    """OpenCSD's name of the packet a header byte starts (what an
    incomplete or configuration-reserved packet was)."""
    if h == 0x00:
        return "I_ASYNC" if async_started else "I_EXTENSION"
    for lo, hi, name in _HEADER_NAMES:
        if lo <= h <= hi:
            return name
    return "I_RESERVED"


# (first header, last header, name), as OpenCSD's header table names them
_HEADER_NAMES = (
    (0x01, 0x01, "I_TRACE_INFO"), (0x02, 0x03, "I_TIMESTAMP"), (0x04, 0x04, "I_TRACE_ON"),
    (0x05, 0x05, "I_FUNC_RET"), (0x06, 0x06, "I_EXCEPT"), (0x07, 0x07, "I_EXCEPT_RTN"),
    (0x09, 0x09, "I_ITE"), (0x0C, 0x0D, "I_CCNT_F2"), (0x0E, 0x0F, "I_CCNT_F1"),
    (0x10, 0x1F, "I_CCNT_F3"), (0x20, 0x27, "I_NUM_DS_MKR"), (0x28, 0x2C, "I_UNNUM_DS_MKR"),
    (0x2D, 0x2D, "I_COMMIT"), (0x2E, 0x2E, "I_CANCEL_F1"), (0x2F, 0x2F, "I_CANCEL_F1_MISPRED"),
    (0x40, 0x42, "I_COND_I_F2"), (0x43, 0x43, "I_COND_FLUSH"), (0x44, 0x46, "I_COND_RES_F4"),
    (0x48, 0x4A, "I_COND_RES_F2"), (0x4C, 0x4E, "I_COND_RES_F2"), (0x50, 0x5F, "I_COND_RES_F3"),
    (0x68, 0x6B, "I_COND_RES_F1"), (0x6C, 0x6C, "I_COND_I_F1"), (0x6D, 0x6D, "I_COND_I_F3"),
    (0x6E, 0x6F, "I_COND_RES_F1"), (0x80, 0x81, "I_CTXT"), (0x82, 0x82, "I_ADDR_CTXT_L_32IS0"),
    (0x83, 0x83, "I_ADDR_CTXT_L_32IS1"), (0x85, 0x85, "I_ADDR_CTXT_L_64IS0"),
    (0x86, 0x86, "I_ADDR_CTXT_L_64IS1"), (0x95, 0x95, "I_ADDR_S_IS0"),
    (0x96, 0x96, "I_ADDR_S_IS1"), (0x9A, 0x9A, "I_ADDR_L_32IS0"), (0x9B, 0x9B, "I_ADDR_L_32IS1"),
    (0x9D, 0x9D, "I_ADDR_L_64IS0"), (0x9E, 0x9E, "I_ADDR_L_64IS1"), (0xA0, 0xAF, "I_Q"),
    (0xB4, 0xB4, "I_SRC_ADDR_S_IS0"), (0xB5, 0xB5, "I_SRC_ADDR_S_IS1"),
    (0xB6, 0xB6, "I_SCR_ADDR_L_32IS0"), (0xB7, 0xB7, "I_SRC_ADDR_L_32IS1"),
    (0xB8, 0xB8, "I_SRC_ADDR_L_64IS0"), (0xB9, 0xB9, "I_SRC_ADDR_L_64IS1"),
)  # fmt: skip


def packet_name(kind: int) -> str:
    """OpenCSD's name of a packet kind (``I_ATOM_F1``...)."""
    return _NAMES.get(Etm4Kind(kind), ("I_UNKNOWN", ""))[0]


def etm4_dump_lines(
    data: bytes, packets: Etm4Packets, trace_id: int = 0, *, ete: bool = False
) -> Iterator[str]:
    """Lines as OpenCSD's ``trc_pkt_lister`` prints packets:
    ``Idx:N; ID:T;\\tNAME : description...`` (``ete`` adds the trace info's
    TSTATE field).  The text is written by a compiled loop
    (:func:`hwtrace.hwevents.etm4text.etm4_listing`)."""
    from .etm4text import etm4_listing

    text, _ = etm4_listing(packets, trace_id, ete=ete)
    yield from bytes(text).decode().split("\n")[:-1]


# ------------------------------------------------------------------ events


@dataclass
class Etm4Events:
    """Events as columns: ``name`` (the registered name, or ``"ITE"``),
    ``address`` (the trace-on address; for ITE the current address),
    ``ts`` (the first timestamp after the event, before tracing restarts;
    -1 if none), ``cc`` (that timestamp's cycle count, -1 if none),
    ``context``, ``vmid``, ``el``, ``offset`` (the byte offset of the
    address packet, or of the ITE packet) and ``payload`` (ITE)."""

    name: list[str]
    address: np.ndarray
    ts: np.ndarray
    cc: np.ndarray
    context: np.ndarray
    vmid: np.ndarray
    el: np.ndarray
    offset: np.ndarray
    payload: np.ndarray

    def __len__(self) -> int:
        return len(self.name)


def _next_row(rows: np.ndarray, at: np.ndarray, none: int) -> np.ndarray:
    """For each of ``at``, the first of the ascending ``rows`` after it
    (``none``: no row is)."""
    if rows.shape[0] == 0:
        return np.full(np.shape(at), none, np.int64)
    j = np.searchsorted(rows, at, side="right")
    return np.where(j < rows.shape[0], rows[np.minimum(j, rows.shape[0] - 1)], none)


def event_packets(
    data: bytes | bytearray | memoryview | np.ndarray,
    config: Etm4Config,
    *,
    resync: bool = True,
    rows: int = 1 << 16,
    on_damage: Callable[[list[tuple[int, str]]], None] | None = None,
) -> Etm4Packets:
    """The packets :func:`trace_on_events` reads (starts of tracing,
    addresses, timestamps, ITE), decoded a window at a time: its events of
    them are those of the whole decode, in the memory of a window and of
    these rows.  ``on_damage`` is given each window's damage."""
    parts = []
    for pk in etm4_windows(data, config, resync=resync, rows=rows):
        if on_damage is not None:
            on_damage(pk.errors)
        kind = pk.kind
        keep = np.flatnonzero(
            (kind == K.TRACE_ON) | (kind == K.TRACE_INFO) | (kind == K.TIMESTAMP)
            | (kind == K.ITE) | ((kind >= K.ADDR_CTXT_L_32IS0) & (kind <= K.ADDR_L_64IS1))
        )  # fmt: skip
        parts.append({name: getattr(pk, name)[keep] for name, _ in _COLUMNS})
    cols = [np.concatenate([p[name] for p in parts]) if parts else np.zeros(0, dt)
            for name, dt in _COLUMNS]  # fmt: skip
    return _packets(cols, cols[0].shape[0], [])


@njit(cache=True, _nrt=False)
def _event_bound(kind):
    """The most events :func:`_event_rows` can find: one a start of
    tracing and one an ITE packet."""
    n = 0
    for i in range(kind.shape[0]):
        k = kind[i]
        n += (k == _K_TRACE_ON) | (k == _K_TRACE_INFO) | (k == _K_ITE)
    return n


@njit(cache=True, _nrt=False)
def _event_rows(kind, address, context, vmid, el, info, offset, payload, ts, cc, reg, out):
    """One pass of :func:`trace_on_events` over the packets, which writes
    each event's columns as it meets it (``out``: which name, 0 for ITE,
    else 1 + its address's index in ``reg``; address, context, VMID, EL,
    offset and payload; the timestamp and cycle count it takes, -1 for
    none before the next start), reading the packet columns in order, not
    gathering from them after.  Returns the events (-1 when ``out`` is too
    small)."""
    o_which, o_addr, o_ctx, o_vmid, o_el, o_off, o_pay, o_ts, o_cc = out
    cap = o_which.shape[0]
    m = 0
    armed = False  # a start whose first address packet is still to come
    waiting = 0  # the events from here on wait for a timestamp
    for i in range(kind.shape[0]):
        k = kind[i]
        if k == _K_TRACE_ON or k == _K_TRACE_INFO:
            armed = True
            waiting = m  # (a new start: no timestamp for those)
        elif k == _K_TIMESTAMP:
            for j in range(waiting, m):
                o_ts[j] = np.int64(ts[i])
                o_cc[j] = cc[i]
            waiting = m
        elif k == _K_ITE or (armed and _K_ADDR_FIRST <= k <= _K_ADDR_LAST):
            which = 0
            if k != _K_ITE:
                armed = False
                a = address[i]
                lo, hi = 0, reg.shape[0]
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if reg[mid] < a:
                        lo = mid + 1
                    else:
                        hi = mid
                if lo == reg.shape[0] or reg[lo] != a:
                    continue  # not a registered address
                which = lo + 1
            if m >= cap:
                return -1
            o_which[m] = which
            o_addr[m] = address[i]
            o_ctx[m] = context[i]
            o_vmid[m] = vmid[i]
            o_el[m] = info[i] if which == 0 else np.int64(el[i])
            o_off[m] = offset[i]
            o_pay[m] = payload[i] if which == 0 else np.uint64(0)
            o_ts[m] = -1
            o_cc[m] = -1
            m += 1
    return m


def trace_on_events(packets: Etm4Packets, addresses: Mapping[int, str]) -> Etm4Events:
    """Each start of tracing (a trace on, or a trace info after sync) whose
    first address packet is at a registered address becomes an event named
    by ``addresses``; ETE instrumentation (ITE) packets become ``"ITE"``
    events with their payload.  An event's time is that of the first
    timestamp after it, before the next start."""
    reg = np.array(sorted(addresses), dtype=np.uint64)
    kind = np.ascontiguousarray(packets.kind)
    cap = int(_event_bound(kind))
    out = tuple(np.empty(cap, dt) for dt in (np.int64, np.uint64, np.uint32, np.uint32, np.int64,
                                             np.int64, np.uint64, np.int64, np.int64))  # fmt: skip
    cols = [kind, *(np.ascontiguousarray(c) for c in (
        packets.address, packets.context, packets.vmid, packets.el, packets.info,
        packets.offset, packets.payload, packets.ts, packets.cc))]  # fmt: skip
    m = _event_rows(*cols, reg, out)
    which, address, context, vmid, el, offset, payload, ts, cc = (c[:m] for c in out)
    table = np.array(["ITE"] + [addresses[int(a)] for a in reg], dtype=object)
    return Etm4Events(
        name=table[which].tolist(),
        address=address,
        ts=ts,
        cc=cc,
        context=context,
        vmid=vmid,
        el=el,
        offset=offset,
        payload=payload,
    )
