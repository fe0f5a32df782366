"""The perf tool's own records (types 64 and up) in perf.data: parse and pack.

Layouts are perf's (tools/lib/perf/include/perf/event.h, tools/perf/util/
intel-pt.h).  Each parser takes the whole file buffer, the record's offset
and size, and returns a frozen dataclass; a malformed record raises
:class:`~hwtrace.perf.records.RecordError` naming its offset.  Kernel record
bodies are :mod:`hwtrace.perf.records`' business.

AUXTRACE is special: ``header.size`` covers only the 48-byte record, its
``size`` bytes of trace data follow it in the file (8-byte aligned).
HEADER_TRACING_DATA likewise is followed by its tracing data.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from ..pt.timing import tsc_to_ns
from .attr import AttrError, PerfEventAttr
from .features import BuildId, pack_build_id, parse_build_ids
from .records import RecordError, RecordType

__all__ = [
    "AUXTRACE_INTEL_PT",
    "Auxtrace",
    "AuxtraceError",
    "AuxtraceInfo",
    "CpuMap",
    "EventUpdate",
    "HeaderAttr",
    "HeaderFeature",
    "IdIndex",
    "IntelPtInfo",
    "ThreadMap",
    "TimeConv",
    "pack_auxtrace",
    "pack_auxtrace_info",
    "pack_header_attr",
    "pack_id_index",
    "pack_simple",
    "pack_thread_map",
    "pack_time_conv",
    "parse_user_record",
]

AUXTRACE_INTEL_PT = 1  # enum auxtrace_type: UNKNOWN, INTEL_PT, INTEL_BTS, CS_ETM, ARM_SPE, ...
AUXTRACE_INTEL_BTS = 2
AUXTRACE_HEADER_SIZE = 48


def _hdr(rtype: int, size: int, misc: int = 0) -> bytes:
    return struct.pack("<IHH", rtype, misc, size)


@dataclass(frozen=True)
class IntelPtInfo:
    """Intel PT's private AUXTRACE_INFO fields (``INTEL_PT_*`` of intel-pt.h).

    The ``*_bit`` fields are masks of ``attr.config`` bits of the intel_pt PMU
    (e.g. tsc_bit 1<<10); ``mtc_freq_bits`` the mask of the MTC period field.
    Fields an older perf did not write are None.
    """

    pmu_type: int
    time_shift: int = 0
    time_mult: int = 0
    time_zero: int = 0
    cap_user_time_zero: int = 0
    tsc_bit: int = 1 << 10
    noretcomp_bit: int = 1 << 11
    have_sched_switch: int = 0
    snapshot_mode: int = 0
    per_cpu_mmaps: int = 0
    mtc_bit: int | None = 1 << 9
    mtc_freq_bits: int | None = 0xF << 14
    tsc_ctc_ratio_n: int | None = 0
    tsc_ctc_ratio_d: int | None = 0
    cyc_bit: int | None = 1 << 1
    max_non_turbo_ratio: int | None = 0
    filter: str | None = ""

    FIELDS = (
        "pmu_type", "time_shift", "time_mult", "time_zero", "cap_user_time_zero", "tsc_bit",
        "noretcomp_bit", "have_sched_switch", "snapshot_mode", "per_cpu_mmaps", "mtc_bit",
        "mtc_freq_bits", "tsc_ctc_ratio_n", "tsc_ctc_ratio_d", "cyc_bit",
        "max_non_turbo_ratio",
    )  # fmt: skip

    @classmethod
    def from_priv(cls, priv: tuple[int, ...], tail: bytes) -> IntelPtInfo:
        vals: dict[str, object] = dict(zip(cls.FIELDS, priv, strict=False))
        for name in cls.FIELDS[len(priv) :]:
            vals[name] = None
        filt: str | None = None
        if len(priv) > 16:  # INTEL_PT_FILTER_STR_LEN
            n = priv[16]
            filt = tail[:n].split(b"\0", 1)[0].decode("utf-8", "replace")
        vals["filter"] = filt
        return cls(**vals)  # type: ignore[arg-type]

    def priv(self) -> bytes:
        vals = [getattr(self, n) or 0 for n in self.FIELDS]
        filt = (self.filter or "").encode()
        flen = len(filt) + 1 if filt else 0
        out = struct.pack(f"<{len(vals) + 1}Q", *vals, flen)
        if flen:
            padded = (flen + 7) // 8 * 8
            out += filt + bytes(padded - len(filt))
        return out

    def tsc_to_perf_time(self, tsc: int) -> int:
        """perf's ``tsc_to_perf_time`` with this file's conversion."""
        return int(tsc_to_ns(tsc, self.time_shift, self.time_mult, self.time_zero))


@dataclass(frozen=True)
class AuxtraceInfo:
    """AUXTRACE_INFO: the AUX tracer's type and its private u64s; ``intel_pt``
    is set for Intel PT (type 1)."""

    type: int
    priv: tuple[int, ...]
    intel_pt: IntelPtInfo | None = None


@dataclass(frozen=True)
class Auxtrace:
    """AUXTRACE: ``size`` bytes of trace from AUX buffer ``idx`` (``offset`` in
    the buffer's stream) for ``cpu``/``tid`` (-1 when per-thread/per-cpu).
    ``data_offset`` is where the payload starts in the file; ``data`` a
    zero-copy view of it."""

    size: int
    offset: int
    reference: int
    idx: int
    tid: int
    cpu: int
    data_offset: int
    data: memoryview = field(repr=False, compare=False)


@dataclass(frozen=True)
class AuxtraceError:
    type: int
    code: int
    cpu: int
    pid: int
    tid: int
    fmt: int
    ip: int
    msg: str
    time: int | None = None
    machine_pid: int | None = None
    vcpu: int | None = None


@dataclass(frozen=True)
class TimeConv:
    """TIME_CONV: the kernel's TSC to perf-time conversion (perf_event_mmap_page)."""

    time_shift: int
    time_mult: int
    time_zero: int
    time_cycles: int | None = None
    time_mask: int | None = None
    cap_user_time_zero: int | None = None
    cap_user_time_short: int | None = None


@dataclass(frozen=True)
class ThreadMap:
    entries: tuple[tuple[int, str], ...]  # (pid, comm)


@dataclass(frozen=True)
class CpuMap:
    cpus: tuple[int, ...]
    any_cpu: bool = False


@dataclass(frozen=True)
class IdIndex:
    """ID_INDEX: (id, idx, cpu, tid) per sample ID; ``samples`` (machine_pid,
    vcpu) per entry when the record carries them."""

    entries: tuple[tuple[int, int, int, int], ...]
    samples: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class EventUpdate:
    """EVENT_UPDATE: ``kind`` 0 unit, 1 scale, 2 name, 3 cpus; ``value`` str,
    float or a tuple of cpus."""

    kind: int
    id: int
    value: object


@dataclass(frozen=True)
class HeaderAttr:
    attr: PerfEventAttr
    ids: tuple[int, ...]


@dataclass(frozen=True)
class HeaderFeature:
    feature: int
    data: bytes = field(repr=False)


def _cpu_map_data(buf, pos: int, end: int, offset: int) -> CpuMap:
    """perf_record_cpu_map_data at ``pos`` (6.1 packed layout)."""
    if end - pos < 4:
        raise RecordError(offset, "CPU map too short")
    kind, nr = struct.unpack_from("<HH", buf, pos)
    if kind == 0:  # PERF_CPU_MAP__CPUS: u16 nr, u16 cpu[nr]
        if pos + 4 + 2 * nr > end:
            raise RecordError(offset, f"CPU map of {nr} cpus does not fit")
        cpus = struct.unpack_from(f"<{nr}H", buf, pos + 4)
        return CpuMap(tuple(-1 if c == 0xFFFF else c for c in cpus))
    if kind == 1:  # PERF_CPU_MAP__MASK: u16 nr, u16 long_size, masks
        if end - pos < 6:
            raise RecordError(offset, "CPU mask too short")
        long_size = struct.unpack_from("<H", buf, pos + 4)[0]
        if long_size == 4:
            start, fmt = pos + 6, "I"
        elif long_size == 8:
            start, fmt = pos + 10, "Q"
        else:
            raise RecordError(offset, f"CPU mask with long_size {long_size}")
        if start + nr * long_size > end:
            raise RecordError(offset, f"CPU mask of {nr} words does not fit")
        words = struct.unpack_from(f"<{nr}{fmt}", buf, start)
        bits = 8 * long_size
        return CpuMap(
            tuple(w * bits + i for w, v in enumerate(words) for i in range(bits) if v >> i & 1)
        )
    if kind == 2:  # PERF_CPU_MAP__RANGE_CPUS: u8 any_cpu, u8 pad, u16 start, u16 end
        if end - pos < 8:
            raise RecordError(offset, "CPU range too short")
        any_cpu, _, lo, hi = struct.unpack_from("<BBHH", buf, pos + 2)
        return CpuMap((-1,) * bool(any_cpu) + tuple(range(lo, hi + 1)), bool(any_cpu))
    raise RecordError(offset, f"CPU map of unknown kind {kind}")


def parse_user_record(buf, offset: int, rtype: int, size: int) -> object:
    """Parse the perf-tool record of type ``rtype`` at ``offset``.

    Returns one of this module's dataclasses, a list of BuildId for
    HEADER_BUILD_ID, None for the header-only FINISHED_ROUND/FINISHED_INIT,
    or the raw body bytes for types without a parser here (STAT*, COMPRESSED,
    HEADER_TRACING_DATA, HEADER_EVENT_TYPE).
    """
    end = offset + size
    p = offset + 8
    n = size - 8
    if end > len(buf) or n < 0:
        raise RecordError(offset, f"{size}-byte record goes beyond the end of the data")

    def need(k: int, what: str) -> None:
        if n < k:
            raise RecordError(offset, f"{what} of {size} bytes is too short (needs {k + 8})")

    try:
        if rtype == RecordType.AUXTRACE_INFO:
            need(8, "AUXTRACE_INFO")
            kind = struct.unpack_from("<I", buf, p)[0]
            k = (n - 8) // 8
            priv = struct.unpack_from(f"<{k}Q", buf, p + 8)
            pt = None
            if kind == AUXTRACE_INTEL_PT:
                need(8 + 8 * 9, "Intel PT AUXTRACE_INFO")
                tail = bytes(buf[p + 8 + 17 * 8 : end]) if k > 16 else b""
                pt = IntelPtInfo.from_priv(priv[:16] + priv[16:17], tail)
            return AuxtraceInfo(kind, priv, pt)
        if rtype == RecordType.AUXTRACE:
            need(40, "AUXTRACE")
            sz, off, ref, idx, tid, cpu = struct.unpack_from("<QQQIiiI", buf, p)[:6]
            start = offset + size
            if start + sz > len(buf):
                if sz >= 1 << 62:
                    raise RecordError(
                        offset, f"AUXTRACE payload of {sz} bytes goes beyond the data"
                    )
                sz = len(buf) - start  # (a file cut short: the trace it holds)
            view = (
                memoryview(buf)[start : start + sz]
                if not isinstance(buf, np.ndarray)
                else memoryview(buf[start : start + sz])
            )
            return Auxtrace(sz, off, ref, idx, tid, cpu, start, view)
        if rtype == RecordType.AUXTRACE_ERROR:
            need(96, "AUXTRACE_ERROR")
            t, code, cpu, pid, tid, fmt, ip = struct.unpack_from("<IIiiiIQ", buf, p)
            msg = bytes(buf[p + 32 : p + 96]).split(b"\0", 1)[0].decode("utf-8", "replace")
            extra: list[int | None] = [None, None, None]
            if fmt >= 1 and n >= 104:
                extra[0] = struct.unpack_from("<Q", buf, p + 96)[0]
            if fmt >= 2 and n >= 112:
                extra[1], extra[2] = struct.unpack_from("<iI", buf, p + 104)
            return AuxtraceError(t, code, cpu, pid, tid, fmt, ip, msg, *extra)
        if rtype == RecordType.TIME_CONV:
            need(24, "TIME_CONV")
            shift, mult, zero = struct.unpack_from("<QQQ", buf, p)
            if n >= 48:
                cyc, mask, z, s = struct.unpack_from("<QQBB", buf, p + 24)
                return TimeConv(shift, mult, zero, cyc, mask, z, s)
            return TimeConv(shift, mult, zero)
        if rtype == RecordType.THREAD_MAP:
            need(8, "THREAD_MAP")
            nr = struct.unpack_from("<Q", buf, p)[0]
            need(8 + 24 * nr, "THREAD_MAP")
            ents = []
            for i in range(nr):
                pid = struct.unpack_from("<q", buf, p + 8 + 24 * i)[0]
                comm = bytes(buf[p + 16 + 24 * i : p + 32 + 24 * i]).split(b"\0", 1)[0]
                ents.append((pid, comm.decode("utf-8", "replace")))
            return ThreadMap(tuple(ents))
        if rtype == RecordType.CPU_MAP:
            return _cpu_map_data(buf, p, end, offset)
        if rtype == RecordType.ID_INDEX:
            need(8, "ID_INDEX")
            nr = struct.unpack_from("<Q", buf, p)[0]
            need(8 + 32 * nr, "ID_INDEX")
            v = struct.unpack_from(f"<{4 * nr}Q", buf, p + 8)
            ents = tuple(tuple(v[4 * i : 4 * i + 4]) for i in range(nr))
            samples: tuple = ()
            if n >= 8 + 48 * nr and nr:
                s = struct.unpack_from(f"<{2 * nr}Q", buf, p + 8 + 32 * nr)
                samples = tuple(tuple(s[2 * i : 2 * i + 2]) for i in range(nr))
            return IdIndex(ents, samples)  # type: ignore[arg-type]
        if rtype == RecordType.EVENT_UPDATE:
            need(16, "EVENT_UPDATE")
            kind, eid = struct.unpack_from("<QQ", buf, p)
            q = p + 16
            value: object
            if kind in (0, 2):
                value = bytes(buf[q:end]).split(b"\0", 1)[0].decode("utf-8", "replace")
            elif kind == 1:
                need(24, "EVENT_UPDATE scale")
                value = struct.unpack_from("<d", buf, q)[0]
            elif kind == 3:
                value = _cpu_map_data(buf, q, end, offset).cpus
            else:
                value = bytes(buf[q:end])
            return EventUpdate(kind, eid, value)
        if rtype == RecordType.HEADER_ATTR:
            need(64, "HEADER_ATTR")
            asz = struct.unpack_from("<I", buf, p + 4)[0] or 64
            if asz > n:
                raise RecordError(offset, f"HEADER_ATTR with an attr of {asz} bytes in {size}")
            attr = PerfEventAttr.parse(buf, p, asz)
            k = (n - asz) // 8
            return HeaderAttr(attr, struct.unpack_from(f"<{k}Q", buf, p + asz))
        if rtype == RecordType.HEADER_FEATURE:
            need(8, "HEADER_FEATURE")
            return HeaderFeature(struct.unpack_from("<Q", buf, p)[0], bytes(buf[p + 8 : end]))
        if rtype == RecordType.HEADER_BUILD_ID:
            return parse_build_ids(bytes(buf[offset:end]))
        if rtype in (RecordType.FINISHED_ROUND, RecordType.FINISHED_INIT):
            return None
    except (struct.error, AttrError, ValueError) as e:
        raise RecordError(offset, f"malformed {RecordType(rtype).name}: {e}") from None
    return bytes(buf[p:end])


# -- packing -------------------------------------------------------------------


def pack_simple(rtype: int) -> bytes:
    """A header-only record (FINISHED_ROUND, FINISHED_INIT)."""
    return _hdr(rtype, 8)


def pack_auxtrace_info_raw(kind: int, priv: tuple[int, ...]) -> bytes:
    """AUXTRACE_INFO of any AUX tracer: its type and private words."""
    body = struct.pack("<II", kind, 0) + struct.pack(f"<{len(priv)}Q", *priv)
    return _hdr(RecordType.AUXTRACE_INFO, 8 + len(body)) + body


def pack_auxtrace_info(info: IntelPtInfo) -> bytes:
    body = struct.pack("<II", AUXTRACE_INTEL_PT, 0) + info.priv()
    return _hdr(RecordType.AUXTRACE_INFO, 8 + len(body)) + body


def pack_auxtrace(size: int, offset: int, reference: int, idx: int, tid: int, cpu: int) -> bytes:
    """The 48-byte AUXTRACE record; the caller writes ``size`` payload bytes after it."""
    return _hdr(RecordType.AUXTRACE, AUXTRACE_HEADER_SIZE) + struct.pack(
        "<QQQIiiI", size, offset, reference, idx, tid, cpu, 0
    )


def pack_time_conv(tc: TimeConv) -> bytes:
    body = struct.pack("<QQQ", tc.time_shift, tc.time_mult, tc.time_zero)
    body += struct.pack(
        "<QQBB6x",
        tc.time_cycles or 0,
        tc.time_mask or 0,
        tc.cap_user_time_zero or 0,
        tc.cap_user_time_short or 0,
    )
    return _hdr(RecordType.TIME_CONV, 8 + len(body)) + body


def pack_thread_map(entries: list[tuple[int, str]]) -> bytes:
    body = struct.pack("<Q", len(entries))
    for pid, comm in entries:
        body += struct.pack("<q16s", pid, comm.encode()[:15])
    return _hdr(RecordType.THREAD_MAP, 8 + len(body)) + body


def pack_id_index(entries: list[tuple[int, int, int, int]]) -> bytes:
    body = struct.pack("<Q", len(entries))
    for e in entries:
        body += struct.pack("<QQqq", *e)
    return _hdr(RecordType.ID_INDEX, 8 + len(body)) + body


def pack_header_attr(attr: PerfEventAttr, ids: list[int]) -> bytes:
    body = attr.pack() + struct.pack(f"<{len(ids)}Q", *ids)
    return _hdr(RecordType.HEADER_ATTR, 8 + len(body)) + body


def pack_header_build_id(entry: BuildId) -> bytes:
    return pack_build_id(entry, RecordType.HEADER_BUILD_ID)
