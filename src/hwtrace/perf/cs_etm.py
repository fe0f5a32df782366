"""ARM CoreSight ETM trace in perf.data (``perf record -e cs_etm//``).

Layout as Linux perf writes and reads it (tools/perf/util/cs-etm.h,
cs-etm.c, cs-etm-base.c, arch/arm/util/cs-etm.c):

* AUXTRACE_INFO of type ``PERF_AUXTRACE_CS_ETM`` (3).  Its private u64s
  start with a global header: ``CS_HEADER_VERSION`` (0, 1; 2 since Linux
  6.3), ``CS_PMU_TYPE_CPUS`` (the cs_etm PMU type << 32 | the number of
  CPU blocks) and ``CS_ETM_SNAPSHOT``.  Then one block per CPU: a magic
  (ETMv3/PTM ``0x3030303030303030``, ETMv4 ``0x4040404040404040``, ETE
  ``0x5050505050505050``), the CPU number, from version 1 on the number of
  trace parameters that follow (so a reader can skip parameters it does
  not know), then the trace unit's registers: ETMv3 ``ETMCR, ETMTRACEIDR,
  ETMCCER, ETMIDR``; ETMv4 ``TRCCONFIGR, TRCTRACEIDR, TRCIDR0, TRCIDR1,
  TRCIDR2, TRCIDR8, TRCAUTHSTATUS`` (newer perf adds ``TS_SOURCE``); ETE
  the same plus ``TRCDEVARCH`` before ``TS_SOURCE``.  Version 0 blocks
  have no parameter count and the fixed ETMv3/ETMv4 register lists.  The
  record must end with the last block.  Version 2 keeps legacy trace IDs
  in TRCTRACEIDR, bit 31 set when the ID is not used; the real ID of a
  CPU's ETM is then in an AUX_OUTPUT_HW_ID record (bits 7:0 of hw_id).
* AUXTRACE records carry the AUX buffers' bytes, per CPU (``cpu`` set) or
  per thread, ``idx`` naming the AUX buffer.  AUX records (sample_id with
  CPU/TID) say which part of an AUX buffer is new; perf decodes each such
  fragment of an AUXTRACE separately, resetting its decoder in between.
  An AUX record's flag ``PERF_AUX_FLAG_CORESIGHT_FORMAT_RAW`` (0x100)
  marks unformatted trace (a TRBE sink: the CPU's ETE bytes alone);
  otherwise the bytes are CoreSight formatter frames (ETR/ETF memory mode:
  16-byte frames, several trace IDs; ARM CoreSight Architecture
  Specification, "Trace Formatter"), split with
  :func:`hwtrace.hwevents.csframes.deformat`.  Without AUX records perf
  takes each AUXTRACE record whole, formatted.
* The cs_etm event's ``attr.type`` is the PMU type of the header; its
  ``config`` holds the ``ETM_OPT_*`` bits (include/linux/coresight-pmu.h):
  cycle accurate 12, context ID 14, context ID 2 (VMID) 15, timestamps 28,
  return stack 29.  perf decodes "timeless" without the timestamp bit.

:func:`cs_etm_info` parses the header (:class:`CsEtmInfo`: per CPU the
kind, registers by name, an :class:`~hwtrace.hwevents.etm4.Etm4Config`, the
trace ID); :func:`cs_etm_buffers` gives perf's decode units with each trace
ID's deformatted bytes; :func:`cs_etm_streams` joins them per AUX queue and
trace ID.  Packets are decoded by :mod:`hwtrace.hwevents.etm4`
(ETMv4/ETE, as OpenCSD does, which perf links for this).  A malformed
header raises :class:`CsEtmError` (a
:class:`~hwtrace.perf.data.PerfDataError`) naming the file offset; damaged
frames are listed per buffer as ``(file offset, message)``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..columns import Ramps
from ..hwevents.csframes import block_maps, deformat
from ..hwevents.etm4 import Etm4Config, Etm4Error
from .data import PerfData, PerfDataError
from .records import AUX_FLAG_OVERWRITE, RecordType

__all__ = [
    "AUXTRACE_CS_ETM",
    "AUX_FLAG_CORESIGHT_FORMAT_RAW",
    "ETM_OPT",
    "MAGIC",
    "REGISTERS",
    "CsEtmBuffer",
    "CsEtmCpu",
    "CsEtmError",
    "CsEtmInfo",
    "CsEtmStream",
    "cpu_block",
    "cs_etm_buffers",
    "cs_etm_info",
    "cs_etm_priv",
    "cs_etm_streams",
    "etm_config_bits",
]

AUXTRACE_CS_ETM = 3
AUX_FLAG_CORESIGHT_FORMAT_RAW = 0x100
TRACE_ID_UNUSED = 1 << 31  # version 2: TRCTRACEIDR holds no trace ID

#: per-CPU block magic by kind
MAGIC = {"ETMv3": 0x3030303030303030, "ETMv4": 0x4040404040404040, "ETE": 0x5050505050505050}
_KIND_OF = {v: k for k, v in MAGIC.items()}

#: the trace parameters of a CPU block, in order, by kind
REGISTERS = {
    "ETMv3": ("ETMCR", "ETMTRACEIDR", "ETMCCER", "ETMIDR"),
    "ETMv4": ("TRCCONFIGR", "TRCTRACEIDR", "TRCIDR0", "TRCIDR1", "TRCIDR2", "TRCIDR8",
              "TRCAUTHSTATUS", "TS_SOURCE"),
    "ETE": ("TRCCONFIGR", "TRCTRACEIDR", "TRCIDR0", "TRCIDR1", "TRCIDR2", "TRCIDR8",
            "TRCAUTHSTATUS", "TRCDEVARCH", "TS_SOURCE"),
}  # fmt: skip
#: parameters of a version 0 block (and the fewest a block may have)
_MIN_PARAMS = {"ETMv3": 4, "ETMv4": 7, "ETE": 8}
_TRACE_ID_REG = {"ETMv3": "ETMTRACEIDR", "ETMv4": "TRCTRACEIDR", "ETE": "TRCTRACEIDR"}

#: cs_etm PMU attr.config bits (ETM_OPT_* of include/linux/coresight-pmu.h)
ETM_OPT = {"cycacc": 12, "ctxtid": 14, "ctxtid2": 15, "timestamp": 28, "retstack": 29}

_HEADER_WORDS = 3


class CsEtmError(PerfDataError):
    """A perf.data whose CoreSight ETM header cannot be read: ``path``,
    ``offset`` (file offset) and ``message``."""


@dataclass(frozen=True)
class CsEtmCpu:
    """One CPU block of the AUXTRACE_INFO: ``kind`` (``"ETMv3"``,
    ``"ETMv4"``, ``"ETE"``), the registers by name (those the block has;
    ``TS_SOURCE`` only from perf versions that write it), ``extra``:
    parameters after the known ones (a newer perf's), ``offset``: the file
    offset of the block's magic."""

    cpu: int
    kind: str
    regs: dict[str, int]
    extra: tuple[int, ...] = ()
    offset: int = 0
    #: version 2: the trace ID from AUX_OUTPUT_HW_ID (None: none seen)
    hw_trace_id: int | None = None

    @property
    def trace_id(self) -> int:
        """The trace ID of this CPU's trace unit (the hardware ID record's
        when the header says TRCTRACEIDR holds none)."""
        raw = self.regs.get(_TRACE_ID_REG[self.kind], 0)
        if self.hw_trace_id is not None and (raw & TRACE_ID_UNUSED or raw & 0x7F == 0):
            return self.hw_trace_id
        return raw & 0x7F

    @property
    def config(self) -> Etm4Config | None:
        """The decoder configuration (ETMv4 and ETE; None for ETMv3)."""
        if self.kind == "ETMv3":
            return None
        regs = dict(self.regs)
        regs["TRCTRACEIDR"] = self.trace_id
        return Etm4Config.from_regs(regs)

    @property
    def protocol(self) -> str:
        return {"ETMv3": "etm3", "ETMv4": "etm4", "ETE": "ete"}[self.kind]


@dataclass(frozen=True)
class CsEtmInfo:
    """The CoreSight AUXTRACE_INFO: header version, cs_etm PMU type,
    snapshot mode, the CPU blocks, and the record's file offset."""

    version: int
    pmu_type: int
    snapshot: bool
    cpus: list[CsEtmCpu]
    offset: int = 0

    def by_trace_id(self) -> dict[int, CsEtmCpu]:
        return {c.trace_id: c for c in self.cpus}

    def by_cpu(self) -> dict[int, CsEtmCpu]:
        return {c.cpu: c for c in self.cpus}


def etm_config_bits(config: Etm4Config) -> int:
    """The cs_etm ``attr.config`` perf records for a trace unit set up as
    ``config`` (the inverse of perf's ETM_OPT -> TRCCONFIGR mapping)."""
    bits = 0
    for on, name in (
        (config.cycle_counting, "cycacc"),
        (config.context_id_tracing, "ctxtid"),
        (config.vmid_tracing, "ctxtid2"),
        (config.timestamps, "timestamp"),
        (config.return_stack, "retstack"),
    ):
        if on:
            bits |= 1 << ETM_OPT[name]
    return bits


def cs_etm_priv(
    cpus: list[CsEtmCpu], *, pmu_type: int, snapshot: bool = False, version: int = 1
) -> tuple[int, ...]:
    """The AUXTRACE_INFO private words for these CPU blocks (what
    :func:`cs_etm_info` reads back).  Version 0 has no ETE blocks."""
    if version not in (0, 1, 2):
        raise ValueError(f"CoreSight header version {version} (0, 1 or 2)")
    words = [version, (pmu_type << 32) | len(cpus), int(bool(snapshot))]
    for c in cpus:
        names = REGISTERS[c.kind]
        if version == 0:
            if c.kind == "ETE":
                raise ValueError("an ETE block needs header version 1 or later")
            names = names[: _MIN_PARAMS[c.kind]]
            words += [MAGIC[c.kind], c.cpu]
        else:
            # the known registers up to the last one given, then any extras
            last = max([_MIN_PARAMS[c.kind] - 1] + [names.index(r) for r in c.regs if r in names])
            if not c.extra:  # extra parameters come after every known one
                names = names[: last + 1]
            words += [MAGIC[c.kind], c.cpu, len(names) + len(c.extra)]
        unknown = set(c.regs) - set(REGISTERS[c.kind])
        if unknown:
            raise ValueError(f"CPU {c.cpu}: {sorted(unknown)} are not {c.kind} parameters")
        words += [int(c.regs.get(n, 0)) for n in names]
        if version:
            words += list(c.extra)
    return tuple(words)


def _hw_ids(data: PerfData) -> dict[int, int]:
    """Version 2: CPU -> trace ID from the AUX_OUTPUT_HW_ID records."""
    out: dict[int, int] = {}
    rows = data.where(RecordType.AUX_OUTPUT_HW_ID)
    for i in rows.tolist():
        off = int(data.records["offset"][i])
        if int(data.records["size"][i]) < 16:
            continue
        hw_id = struct.unpack_from("<Q", data.buf, off + 8)[0]
        cpu = int(data.records["cpu"][i])
        if cpu >= 0:
            out[cpu] = hw_id & 0xFF
    return out


def cs_etm_info(data: PerfData) -> CsEtmInfo:
    """Parse the CoreSight ETM AUXTRACE_INFO of ``data``.  Raises
    :class:`CsEtmError` with the file offset for a missing or malformed
    one (the checks perf makes: version, magics, parameter counts, the
    record ending with the last block, distinct trace IDs)."""
    rows = data.where(RecordType.AUXTRACE_INFO)
    if rows.shape[0] == 0:
        raise CsEtmError(data.path, 0, "no AUXTRACE_INFO record: not an AUX trace perf.data")
    i = int(rows[0])
    rec = int(data.records["offset"][i])
    size = int(data.records["size"][i])

    def err(off: int, msg: str) -> CsEtmError:
        return CsEtmError(data.path, off, f"CoreSight AUXTRACE_INFO: {msg}")

    buf = data.buf
    if size < 16 or rec + size > buf.shape[0]:
        raise err(rec, f"record of {size} bytes is too short or beyond the file")
    kind = struct.unpack_from("<I", buf, rec + 8)[0]
    if kind != AUXTRACE_CS_ETM:
        raise CsEtmError(data.path, rec + 8, f"AUXTRACE_INFO type {kind} is not CoreSight ETM (3)")
    base = rec + 16
    n = (size - 16) // 8
    if (size - 16) % 8:
        raise err(rec, f"private data of {size - 16} bytes is not whole 64-bit words")
    if n < _HEADER_WORDS:
        raise err(base, f"{n} private words, the header needs {_HEADER_WORDS}")
    w = np.frombuffer(bytes(buf[base : base + 8 * n]), "<u8").astype(object).tolist()
    version, pmu_cpus, snap = w[0], w[1], w[2]
    if version > 2:
        raise err(base, f"header version {version} is newer than this reader knows (0-2)")
    ncpu = pmu_cpus & 0xFFFFFFFF
    if ncpu == 0:
        raise err(base + 8, "no CPU blocks (CS_PMU_TYPE_CPUS says 0 CPUs)")
    hw = _hw_ids(data) if version >= 2 else {}
    cpus: list[CsEtmCpu] = []
    k = _HEADER_WORDS
    for c in range(ncpu):
        at = base + 8 * k
        if k + 2 > n:
            raise err(at, f"CPU block {c} of {ncpu} is missing (the record ends)")
        magic = w[k]
        what = _KIND_OF.get(magic)
        if what is None:
            raise err(at, f"CPU block {c}: unknown magic {magic:#x} (not ETMv3, ETMv4 or ETE)")
        names = REGISTERS[what]
        if version == 0:
            if what == "ETE":
                raise err(at, f"CPU block {c}: ETE needs header version 1 or later")
            nparams, first = _MIN_PARAMS[what], k + 2
        else:
            if k + 3 > n:
                raise err(at, f"CPU block {c}: the record ends before its parameter count")
            nparams, first = w[k + 2], k + 3
            if nparams < _MIN_PARAMS[what]:
                raise err(at + 16, f"CPU block {c}: {nparams} {what} parameters, "
                          f"fewer than the {_MIN_PARAMS[what]} perf writes")  # fmt: skip
        if first + nparams > n:
            raise err(at, f"CPU block {c}: {nparams} parameters go beyond the record "
                      f"({n - first} words left)")  # fmt: skip
        vals = w[first : first + nparams]
        regs = dict(zip(names, vals, strict=False))
        extra = tuple(vals[len(names) :])
        cpu = CsEtmCpu(int(w[k + 1]), what, regs, extra, at, hw.get(int(w[k + 1])))
        if what != "ETMv3":
            try:
                cpu.config  # noqa: B018 - the registers must make a decoder configuration
            except Etm4Error as e:
                raise err(at, f"CPU block {c}: {e.message}") from None
        cpus.append(cpu)
        k = first + nparams
    if k != n:
        raise err(base + 8 * k, f"{8 * (n - k)} bytes after the last of {ncpu} CPU blocks")
    seen: dict[int, CsEtmCpu] = {}
    for cpu in cpus:
        raw = cpu.regs.get(_TRACE_ID_REG[cpu.kind], 0)
        if version >= 2 and raw & TRACE_ID_UNUSED and cpu.hw_trace_id is None:
            continue  # the ID comes with the trace
        if cpu.trace_id in seen:
            raise err(cpu.offset, f"CPUs {seen[cpu.trace_id].cpu} and {cpu.cpu} have the same "
                      f"trace ID {cpu.trace_id:#x}")  # fmt: skip
        seen[cpu.trace_id] = cpu
    return CsEtmInfo(int(version), int(pmu_cpus >> 32), bool(snap), cpus, rec)


@dataclass
class CsEtmBuffer:
    """One unit of trace perf decodes on its own (a fragment of an
    AUXTRACE record an AUX record names, or a whole AUXTRACE record): AUX
    buffer ``idx``, ``cpu``/``tid`` (-1 when not set), ``aux_offset`` (its
    position in the AUX buffer's stream: perf's and OpenCSD's ``Idx`` base),
    ``file_offset`` and ``size`` of its bytes, ``record`` (the AUXTRACE
    record's file offset), ``formatted``; per trace ID its bytes
    (``streams``), the file offset of each (``offsets``) and the index
    OpenCSD lists a packet starting there at (``indices``), both as
    :class:`~hwtrace.columns.Ramps`; ``errors``: damaged frames as
    ``(file offset, message)``."""

    idx: int
    cpu: int
    tid: int
    aux_offset: int
    file_offset: int
    size: int
    record: int
    formatted: bool
    streams: dict[int, bytes] = field(default_factory=dict)
    offsets: dict[int, Ramps] = field(default_factory=dict)
    indices: dict[int, Ramps] = field(default_factory=dict)
    errors: list[tuple[int, str]] = field(default_factory=list)

    def raw(self, data: PerfData) -> np.ndarray:
        """The buffer's bytes (a view of the file)."""
        return data.buf[self.file_offset : self.file_offset + self.size]


def _fragments(data: PerfData) -> list[tuple[int, int, int, int, int, int, int, bool]]:
    """(record offset, idx, cpu, tid, aux offset, file offset, size,
    formatted) per decode unit, as perf queues them."""
    aux = data.auxtrace_columns()
    r = data.records
    recs = [
        (int(r["offset"][row]), int(i), int(c), int(t), int(o), int(d), int(s))
        for row, i, c, t, o, d, s in zip(
            aux["row"], aux["idx"], aux["cpu"], aux["tid"], aux["offset"],
            aux["data_offset"], aux["size"], strict=True,
        )
    ]  # fmt: skip
    out: list[tuple[int, int, int, int, int, int, int, bool]] = []
    aux_rows = data.where(RecordType.AUX)
    for row in aux_rows.tolist():
        off, rsize = int(r["offset"][row]), int(r["size"][row])
        if rsize < 32:
            data.errors.append(PerfDataError(data.path, off, "AUX record too short"))
            continue
        a_off, a_size, flags = struct.unpack_from("<QQQ", data.buf, off + 8)
        if a_size == 0:
            continue
        s_cpu, s_tid = int(r["cpu"][row]), int(r["tid"][row])
        for rec, idx, cpu, tid, o, d, s in recs:
            # perf's match: the AUXTRACE's CPU is the sample's, and with no
            # CPU (per-thread buffers) the thread is too
            if (cpu == -1 and tid != s_tid) or cpu != s_cpu:
                continue
            size, start = a_size, a_off
            if flags & AUX_FLAG_OVERWRITE:
                size = min(a_size, s)
                start = a_off - size
            if start >= o and start + size <= o + s:
                fmt = not flags & AUX_FLAG_CORESIGHT_FORMAT_RAW
                out.append((rec, idx, cpu, tid, start, d + start - o, size, fmt))
                break
        else:
            data.errors.append(
                PerfDataError(data.path, off, f"AUX record for {a_size:#x} bytes at AUX offset "
                              f"{a_off:#x} (cpu {s_cpu}, tid {s_tid}) has no AUXTRACE data")
            )  # fmt: skip
    if not out:
        return [(rec, i, c, t, o, d, s, True) for rec, i, c, t, o, d, s in recs]
    # perf dumps, for each AUXTRACE record in file order, the fragments of it
    out.sort(key=lambda f: (f[0], f[1], f[4]))
    return out


def cs_etm_buffers(data: PerfData, info: CsEtmInfo | None = None) -> list[CsEtmBuffer]:
    """The trace of ``data`` as perf decodes it: one :class:`CsEtmBuffer`
    per fragment, in perf's dump order, each split into the CPU blocks'
    trace IDs (unformatted buffers: the whole buffer is the trace of the
    buffer's CPU's trace ID).  Damaged frames and data of IDs no CPU block
    has are listed in the buffer's ``errors``, never raised."""
    info = info or cs_etm_info(data)
    by_cpu = info.by_cpu()
    # as OpenCSD in perf, keep the IDs of the CPU blocks (others are damage)
    known = [c.trace_id for c in info.cpus if 0 < c.trace_id < 0x70]
    out = []
    for rec, idx, cpu, tid, aux_off, start, size, formatted in _fragments(data):
        b = CsEtmBuffer(idx, cpu, tid, aux_off, start, size, rec, formatted)
        raw = b.raw(data)
        if formatted:
            d = deformat(raw, mode="memory", ids=known or None, as_ramps=True)
            b.streams = d.streams
            b.offsets = {t: o + start for t, o in d.offsets.items()}
            b.errors = [(o + start, m) for o, m in d.errors]
            b.indices = {t: v + aux_off for t, v in block_maps(raw, "memory")[0].items()}
        else:
            owner = by_cpu.get(cpu) or (info.cpus[0] if len(info.cpus) == 1 else None)
            if owner is None:
                b.errors.append((rec, f"unformatted trace of CPU {cpu}, which has no CPU block"))
            else:
                one = np.zeros(1 if size else 0, np.int64)
                b.streams = {owner.trace_id: bytes(raw)}
                b.offsets = {owner.trace_id: Ramps(one, one + start, size)}
                b.indices = {owner.trace_id: Ramps(one, one + aux_off, size)}
        out.append(b)
    return out


@dataclass
class CsEtmStream:
    """One trace ID's bytes of one AUX queue, its buffers joined in stream
    order: ``idx``, ``cpu``, ``tid`` of the queue, ``trace_id``, ``data``,
    ``offsets`` (file offset per byte) and ``starts`` (where each buffer
    begins in ``data``: perf restarts its decoder there)."""

    idx: int
    cpu: int
    tid: int
    trace_id: int
    data: bytes
    offsets: np.ndarray
    starts: np.ndarray


def cs_etm_streams(data: PerfData, info: CsEtmInfo | None = None) -> list[CsEtmStream]:
    """Per AUX queue and trace ID, the deformatted trace bytes, sorted by
    (idx, cpu, tid, trace ID)."""
    groups: dict[tuple[int, int, int, int], list[tuple[int, bytes, np.ndarray]]] = {}
    for b in cs_etm_buffers(data, info):
        for t, s in b.streams.items():
            groups.setdefault((b.idx, b.cpu, b.tid, t), []).append((b.aux_offset, s, b.offsets[t]))
    out = []
    for (idx, cpu, tid, t), parts in sorted(groups.items()):
        parts.sort(key=lambda p: p[0])
        lens = np.array([len(p[1]) for p in parts], np.int64)
        out.append(
            CsEtmStream(
                idx, cpu, tid, t,
                b"".join(p[1] for p in parts),
                np.concatenate([np.asarray(p[2]) for p in parts]) if parts else np.zeros(0, np.int64),
                np.cumsum(lens) - lens,
            )
        )  # fmt: skip
    return out


def cpu_block(cpu: int, item: Etm4Config | Mapping[str, int] | CsEtmCpu) -> CsEtmCpu:
    """A CPU block from an :class:`Etm4Config` (its registers), registers
    by name (ETE when ``TRCDEVARCH`` is given, ETMv3 when ``ETMCR`` is), or
    a :class:`CsEtmCpu` (kept, its CPU number too)."""
    if isinstance(item, CsEtmCpu):
        return item
    if isinstance(item, Etm4Config):
        regs, _ = item.to_regs()
        kind = "ETE" if item.ete else "ETMv4"
    else:
        regs = {k.upper(): int(v) for k, v in item.items()}
        kind = "ETE" if "TRCDEVARCH" in regs else "ETMv3" if "ETMCR" in regs else "ETMv4"
        cpu = int(regs.pop("CPU", cpu))
    names = REGISTERS[kind]
    return CsEtmCpu(cpu, kind, {k: v for k, v in regs.items() if k in names})
