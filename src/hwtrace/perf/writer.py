"""Writing perf.data (file mode) that Linux perf reads, Intel PT included.

A :class:`PerfDataWriter` lays the file out as ``perf record`` does: the
header, the events' ID arrays and attrs, the data section (records appended
as they are added), then the feature sections.  The header is rewritten on
:meth:`~PerfDataWriter.close`.

Intel PT: :meth:`~PerfDataWriter.set_intel_pt` adds the ``intel_pt`` event
(its PMU type recorded in AUXTRACE_INFO and PMU_MAPPINGS, as perf needs to
tie the trace to the event) and writes AUXTRACE_INFO (PT settings, TSC
conversion) and TIME_CONV; :meth:`~PerfDataWriter.add_auxtrace` appends
trace data as AUXTRACE records (indexed in the AUXTRACE feature).  Sideband
(MMAP/MMAP2, COMM, FORK/EXIT, ITRACE_START, AUX, SWITCH…) goes in with
:meth:`~PerfDataWriter.add_record`, bodies from :mod:`hwtrace.perf.records`.
perf decodes PT in software, so ``perf script --itrace`` works on machines
without PT.  Example::

    w = PerfDataWriter("perf.data")
    w.set_intel_pt()                      # per-thread, no timestamps
    w.add_record(Comm(pid, pid, "prog"))
    w.add_record(Mmap(pid, pid, 0x401000, size, 0x1000, "/path/prog"), misc=2)
    w.add_auxtrace(pt_bytes, tid=pid)
    w.close()
"""

from __future__ import annotations

import os
import platform
import stat
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

from .attr import PerfEventAttr
from .features import EventDesc, Feature, pack_feature
from .records import Body, RecordType, SampleId, SampleType, pack_record
from .user import (
    AUXTRACE_INTEL_BTS,
    IntelPtInfo,
    TimeConv,
    pack_auxtrace,
    pack_auxtrace_info,
    pack_auxtrace_info_raw,
    pack_id_index,
    pack_simple,
    pack_thread_map,
    pack_time_conv,
)
from .zstd import ZstdCompressor

__all__ = ["CLOCK_MONOTONIC", "INTEL_PT_CONFIG_BITS", "PerfDataWriter", "write_feature_sections"]

CLOCK_MONOTONIC = 1  # a perf_event_attr clockid (linux/time.h)

MAGIC = b"PERFILE2"
HEADER_SIZE = 104

# intel_pt PMU format (/sys/bus/event_source/devices/intel_pt/format): config bits.
INTEL_PT_CONFIG_BITS = {
    "pt": 1 << 0, "cyc": 1 << 1, "pwr_evt": 1 << 4, "fup_on_ptw": 1 << 5, "mtc": 1 << 9,
    "tsc": 1 << 10, "noretcomp": 1 << 11, "ptw": 1 << 12, "branch": 1 << 13,
    "mtc_period": 0xF << 14, "cyc_thresh": 0xF << 19, "psb_period": 0xF << 24,
}  # fmt: skip


# A COMPRESSED record's data decompresses into a buffer of the ring
# buffer's size (mmap_len, perf record's default here).
_MMAP_LEN = 528384
_RAW_PER_RECORD = 60000


def host_env() -> dict[str, object]:
    """This machine's CPU and memory as :class:`PerfDataWriter`'s ``env``
    (what ``perf report --header`` shows)."""
    env: dict[str, object] = {}
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if not sep:
                    break  # the first CPU's block ends here
                info.setdefault(key.strip(), value.strip())
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    env["total_mem"] = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    if "model name" in info:
        env["cpudesc"] = info["model name"]
    keys = ("vendor_id", "cpu family", "model", "stepping")
    if all(k in info for k in keys):
        env["cpuid"] = ",".join(info[k] for k in keys)  # as perf's x86 get_cpuid
    return env


def write_feature_sections(f: BinaryIO, data_end: int, sections: Sequence[bytes]) -> None:
    """Write, at ``data_end`` (the end of the data section), the feature
    table (offset and size of each section, in feature order) and the
    sections after it, as perf lays a file out."""
    pos = data_end + 16 * len(sections)
    table = b""
    for sec in sections:
        table += struct.pack("<QQ", pos, len(sec))
        pos += len(sec)
    f.write(table)
    for sec in sections:
        f.write(sec)


def _drop_in_background(path: Path) -> None:
    """Unlink a previous regular file at ``path`` and let another thread
    close it: truncating a recording of hundreds of MB frees its pages
    there and then (0.15 s for 550 MB here), before anything is written."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size < 1 << 24:
            return
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.unlink(path)
    except OSError:
        os.close(fd)
        return
    threading.Thread(target=os.close, args=(fd,), name="hwtrace-drop", daemon=True).start()


class PerfDataWriter:
    """Write a file-mode perf.data.

    Add events with :meth:`add_attr` (or :meth:`set_intel_pt`) before the
    first record; then records in file order; then :meth:`close` (also on
    leaving a ``with`` block).  ``env`` overrides the environment features
    (``hostname``, ``osrelease``, ``version``, ``arch``, ``cpudesc``,
    ``cpuid``, ``nrcpus``, ``total_mem``, ``cmdline``); :meth:`set_feature`
    adds any other feature section.  ``attr_size`` is the size attrs are
    written with: 128 (perf 6.1's; it refuses larger ones), 136 for config3.
    """

    def __init__(
        self, path: str | os.PathLike, *, attr_size: int = 128, compress: int = 0, **env: Any
    ) -> None:
        self.path = Path(path)
        self.attr_size = attr_size
        # perf record -z: the kernel's records (sideband, samples) as one
        # zstd stream (of level ``compress``; 0: none) in COMPRESSED
        # records, flushed before every record of another kind; AUXTRACE
        # and perf's own records as they are.
        self._level = compress
        self._zstd = ZstdCompressor(compress) if compress else None
        self._pending = bytearray()
        self._raw_in = self._compressed_in = 0
        _drop_in_background(self.path)
        self._f = open(self.path, "wb")
        self._f.write(bytes(HEADER_SIZE))
        self.attrs: list[tuple[PerfEventAttr, list[int], str]] = []
        self._data_offset: int | None = None
        self._auxtrace_index: list[tuple[int, int]] = []
        self._aux_offsets: dict[int, int] = {}
        self._pt_attr: int | None = None
        self._next_id = 1
        self.closed = False
        uname = platform.uname()
        ncpu = os.cpu_count() or 1
        self.features: dict[int, Any] = {
            Feature.HOSTNAME: env.get("hostname", uname.node),
            Feature.OSRELEASE: env.get("osrelease", uname.release),
            Feature.VERSION: env.get("version", "6.1.0"),
            Feature.ARCH: env.get("arch", "x86_64"),
            Feature.NRCPUS: env.get("nrcpus", {"nr_cpus_avail": ncpu, "nr_cpus_online": ncpu}),
            Feature.CPUDESC: env.get("cpudesc", "hwtrace"),
            Feature.CPUID: env.get("cpuid", "GenuineIntel,6,142,10"),
            Feature.CMDLINE: env.get("cmdline", ["hwtrace"]),
        }
        if "total_mem" in env:
            self.features[Feature.TOTAL_MEM] = env["total_mem"]
        self.pmu_mappings: dict[str, int] = {"software": 1, "tracepoint": 2, "breakpoint": 5}

    # -- events ----------------------------------------------------------------

    def add_attr(
        self, attr: PerfEventAttr, ids: Sequence[int] | None = None, name: str = ""
    ) -> int:
        """Add an event; ``ids`` its sample IDs (default: one fresh ID).
        Returns the event's index, which :meth:`add_record` takes."""
        if self._data_offset is not None:
            raise ValueError("events must be added before the first record")
        if ids is None:
            ids = [self._next_id]
        self._next_id = max([self._next_id - 1, *ids]) + 1
        self.attrs.append((attr, list(ids), name))
        return len(self.attrs) - 1

    def set_intel_pt(
        self,
        *,
        pmu_type: int = 8,
        config: int | None = None,
        sample_type: int = SampleType.IP | SampleType.TID | SampleType.IDENTIFIER,
        exclude_kernel: bool = True,
        time_shift: int = 0,
        time_mult: int = 0,
        time_zero: int = 0,
        cap_user_time_zero: bool = False,
        tsc_ctc_ratio: tuple[int, int] = (0, 0),
        max_non_turbo_ratio: int = 0,
        per_cpu_mmaps: bool = False,
        have_sched_switch: int = 0,
        snapshot_mode: bool = False,
        filter: str = "",
        context_switch: bool = False,
    ) -> int:
        """Add the ``intel_pt`` event and write AUXTRACE_INFO and TIME_CONV.

        ``config`` is the intel_pt attr.config (:data:`INTEL_PT_CONFIG_BITS`;
        default pt|branch, plus tsc when ``cap_user_time_zero``).  perf decodes
        with timestamps only when ``sample_type`` has TIME, ``config`` the tsc
        bit and ``cap_user_time_zero`` is set (then ``time_*`` convert TSC to
        perf time as the kernel's perf_event_mmap_page says); otherwise it
        decodes "timeless", per AUX buffer.  ``per_cpu_mmaps``: the trace is
        per CPU (AUXTRACE cpu set, ITRACE_START/SWITCH say which thread ran),
        else per thread.  Returns the event's index."""
        if self._pt_attr is not None:
            raise ValueError("the intel_pt event is already set")
        bits = INTEL_PT_CONFIG_BITS
        if config is None:
            config = bits["pt"] | bits["branch"] | (bits["tsc"] if cap_user_time_zero else 0)
        attr = PerfEventAttr(
            type=pmu_type, config=config, sample_period=1, sample_type=int(sample_type),
            sample_id_all=1, exclude_kernel=int(exclude_kernel), exclude_hv=1,
            mmap=1, comm=1, task=1, mmap2=0, comm_exec=1,
            context_switch=int(context_switch), disabled=1, enable_on_exec=1,
            aux_watermark=0,
        )  # fmt: skip
        if per_cpu_mmaps:
            attr.sample_type |= SampleType.CPU
        self.pmu_mappings["intel_pt"] = pmu_type
        self._pt_attr = self.add_attr(attr, name="intel_pt//u" if exclude_kernel else "intel_pt//")
        self.intel_pt = IntelPtInfo(
            pmu_type=pmu_type, time_shift=time_shift, time_mult=time_mult, time_zero=time_zero,
            cap_user_time_zero=int(cap_user_time_zero), tsc_bit=bits["tsc"],
            noretcomp_bit=bits["noretcomp"], have_sched_switch=have_sched_switch,
            snapshot_mode=int(snapshot_mode), per_cpu_mmaps=int(per_cpu_mmaps),
            mtc_bit=bits["mtc"], mtc_freq_bits=bits["mtc_period"],
            tsc_ctc_ratio_n=tsc_ctc_ratio[0], tsc_ctc_ratio_d=tsc_ctc_ratio[1],
            cyc_bit=bits["cyc"], max_non_turbo_ratio=max_non_turbo_ratio, filter=filter,
        )  # fmt: skip
        self._pt_records = [
            pack_auxtrace_info(self.intel_pt),
            pack_time_conv(
                TimeConv(time_shift, time_mult, time_zero, 0, 0, int(cap_user_time_zero), 0)
            ),
        ]
        return self._pt_attr

    def set_intel_bts(
        self,
        *,
        pmu_type: int = 9,
        sample_type: int = SampleType.IP | SampleType.TID | SampleType.TIME | SampleType.IDENTIFIER,
        time_shift: int = 0,
        time_mult: int = 1,
        time_zero: int = 0,
        cap_user_time_zero: bool = True,
        snapshot_mode: bool = False,
        exclude_kernel: bool = True,
    ) -> int:
        """Add the ``intel_bts`` event and write its AUXTRACE_INFO (type 2,
        perf's tools/perf/util/intel-bts.h private words: PMU type, TSC
        conversion, snapshot mode) and TIME_CONV.  Returns the event's
        index; its AUX data (:meth:`add_auxtrace`) is 24-byte BTS records."""
        if getattr(self, "_pt_records", None):
            raise ValueError("an AUX tracer is already set")
        attr = PerfEventAttr(
            type=pmu_type, config=0, sample_period=1, sample_type=int(sample_type),
            sample_id_all=1, exclude_kernel=int(exclude_kernel), exclude_hv=1,
            mmap=1, comm=1, task=1, comm_exec=1, disabled=1, enable_on_exec=1,
        )  # fmt: skip
        self.pmu_mappings["intel_bts"] = pmu_type
        index = self.add_attr(attr, name="intel_bts//u" if exclude_kernel else "intel_bts//")
        priv = (
            pmu_type,
            time_shift,
            time_mult,
            time_zero,
            int(cap_user_time_zero),
            int(snapshot_mode),
        )
        self._pt_records = [
            pack_auxtrace_info_raw(AUXTRACE_INTEL_BTS, priv),
            pack_time_conv(
                TimeConv(time_shift, time_mult, time_zero, 0, 0, int(cap_user_time_zero), 0)
            ),
        ]
        return index

    def set_cs_etm(
        self,
        cpus: Sequence[Any],
        *,
        pmu_type: int = 10,
        snapshot: bool = False,
        version: int = 1,
        config: int | None = None,
        sample_type: int = SampleType.IP
        | SampleType.TID
        | SampleType.TIME
        | SampleType.CPU
        | SampleType.IDENTIFIER,
        exclude_kernel: bool = True,
    ) -> int:
        """Add the ``cs_etm`` event (ARM CoreSight ETM) and write its
        AUXTRACE_INFO (type 3) as perf's arch/arm/util/cs-etm.c does: the
        global header (``version``, ``pmu_type`` << 32 | number of CPUs,
        ``snapshot``) and a block per CPU.

        ``cpus``: per CPU an :class:`~hwtrace.hwevents.etm4.Etm4Config`, a
        mapping of register names to values (``TRCCONFIGR``...; ETE with
        ``TRCDEVARCH``, ETMv3 with ``ETMCR``; ``CPU`` sets the CPU number),
        or a :class:`~hwtrace.perf.cs_etm.CsEtmCpu`; the CPU number is the
        position unless given.  ``config``: the event's attr.config
        (``ETM_OPT_*`` bits; default from the first CPU's TRCCONFIGR:
        timestamps, cycle counts, context IDs, return stack).  perf 6.1
        reads header versions 0 and 1.

        Trace goes in with :meth:`add_auxtrace` (``cpu`` and ``idx`` of the
        CPU's AUX buffer) and, as the kernel writes them, an AUX record per
        new piece (``add_record(Aux(aux_offset, size, flags), attr=...,
        sample_id=SampleId(cpu=...))``; flag 0x100 marks unformatted TRBE
        trace).  Returns the event's index."""
        if getattr(self, "_pt_records", None):
            raise ValueError("an AUX tracer is already set")
        from .cs_etm import AUXTRACE_CS_ETM, cpu_block, cs_etm_priv, etm_config_bits

        blocks = [cpu_block(k, item) for k, item in enumerate(cpus)]
        if not blocks:
            raise ValueError("cs_etm needs at least one CPU")
        if config is None:
            first = blocks[0]
            config = etm_config_bits(first.config) if first.config is not None else 0
        if not config & (1 << 28):
            sample_type &= ~SampleType.TIME
        attr = PerfEventAttr(
            type=pmu_type, config=config, sample_period=1, sample_type=int(sample_type),
            sample_id_all=1, exclude_kernel=int(exclude_kernel), exclude_hv=1,
            mmap=1, comm=1, task=1, comm_exec=1, disabled=1, enable_on_exec=1,
        )  # fmt: skip
        self.pmu_mappings["cs_etm"] = pmu_type
        index = self.add_attr(attr, name="cs_etm//u" if exclude_kernel else "cs_etm//")
        priv = cs_etm_priv(blocks, pmu_type=pmu_type, snapshot=snapshot, version=version)
        self._pt_records = [pack_auxtrace_info_raw(AUXTRACE_CS_ETM, priv)]
        return index

    def set_feature(self, feature: int, value: Any) -> None:
        """Set a feature section (a value :func:`~.features.pack_feature` packs, or bytes)."""
        self.features[feature] = value

    def set_monotonic_clock(self) -> None:
        """Say that sample times are CLOCK_MONOTONIC nanoseconds, as
        ``perf record --clockid monotonic`` does: CLOCKID (the clock's
        resolution) and CLOCK_DATA (a reading of it with the time of day),
        so that ``perf script`` shows the time of day too (``-F +tod``).
        The events' attrs say it with ``use_clockid`` and
        :data:`CLOCK_MONOTONIC`."""
        res = max(1, round(time.clock_getres(time.CLOCK_MONOTONIC) * 1e9))
        self.set_feature(Feature.CLOCKID, res)
        tod, mono = time.time_ns(), time.monotonic_ns()
        self.set_feature(
            Feature.CLOCK_DATA, {"clockid": CLOCK_MONOTONIC, "tod_ns": tod, "clockid_ns": mono}
        )

    # -- data ------------------------------------------------------------------

    def _start_data(self) -> None:
        if self._data_offset is not None:
            return
        if not self.attrs:
            raise ValueError("add an event (add_attr or set_intel_pt) before records")
        f = self._f
        id_sections = []
        for _attr, ids, _name in self.attrs:
            id_sections.append((f.tell(), 8 * len(ids)))
            f.write(struct.pack(f"<{len(ids)}Q", *ids))
        self._attrs_offset = f.tell()
        for (attr, _ids, _name), (ioff, isz) in zip(self.attrs, id_sections, strict=True):
            f.write(attr.pack(self.attr_size) + struct.pack("<QQ", ioff, isz))
        self._attr_size = self.attr_size + 16
        self._data_offset = f.tell()
        for rec in getattr(self, "_pt_records", []):
            f.write(rec)

    def set_time_conversion(self, time_shift: int, time_mult: int, time_zero: int) -> None:
        """Set the intel_pt event's TSC conversion (AUXTRACE_INFO and
        TIME_CONV), also after records were written: a recording that
        streams its trace knows the TSC's rate only when it ends."""
        if self._pt_attr is None:
            raise ValueError("set the intel_pt event first")
        pt = replace(self.intel_pt, time_shift=time_shift, time_mult=time_mult, time_zero=time_zero)
        self.intel_pt = pt
        old = self._pt_records
        self._pt_records = [
            pack_auxtrace_info(pt),
            pack_time_conv(TimeConv(time_shift, time_mult, time_zero, 0, 0,
                                    pt.cap_user_time_zero, 0)),
        ]  # fmt: skip
        if self._data_offset is None:
            return
        # Written already: the same sizes, in place.
        assert [len(r) for r in old] == [len(r) for r in self._pt_records]
        f = self._f
        end = f.tell()
        f.seek(self._data_offset)
        for rec in self._pt_records:
            f.write(rec)
        f.seek(end)

    def tell(self) -> int:
        """The file offset the next record will have."""
        self._start_data()
        return self._f.tell()

    def add_bytes(self, data: bytes) -> int:
        """Append ready-made record bytes; returns their offset."""
        self._flush_compressed()
        at = self.tell()
        self._f.write(data)
        return at

    def _flush_compressed(self) -> None:
        """The kernel records held back, as COMPRESSED records (bodies of
        at most a record's size, the stream continuing from one to the
        next, as perf's zstd_compress_stream_to_records writes them)."""
        if not self._pending:
            return
        assert self._zstd is not None
        raw = bytes(self._pending)
        self._pending.clear()
        self._start_data()
        # (each body flushed on its own: it decompresses to no more than
        # perf's buffer for one, mmap_len, and fits a record's u16 size)
        for k in range(0, len(raw), _RAW_PER_RECORD):
            body = self._zstd.flushed(raw[k : k + _RAW_PER_RECORD])
            self._compressed_in += len(body)
            self._f.write(struct.pack("<IHH", int(RecordType.COMPRESSED), 0, 8 + len(body)))
            self._f.write(body)

    def add_record(
        self,
        body: Body | bytes,
        *,
        attr: int = 0,
        sample_id: SampleId | None = None,
        misc: int = 0,
        type: int | None = None,
    ) -> int:
        """Append a kernel record (a :mod:`~hwtrace.perf.records` body, or raw
        body bytes with ``type``) as event ``attr`` wrote it: with that event's
        sample_id trailer when it has ``sample_id_all`` (``sample_id`` fields;
        ``id``/``identifier`` default to the event's first ID).  Returns the
        record's offset."""
        a, ids, _ = self.attrs[attr]
        st = a.sample_type
        sid = sample_id or SampleId()
        if ids and sid.id is None and st & SampleType.ID:
            sid = replace(sid, id=ids[0])
        if ids and sid.identifier is None and st & SampleType.IDENTIFIER:
            sid = replace(sid, identifier=ids[0])
        if isinstance(body, bytes | bytearray):
            data = pack_record(bytes(body), misc=misc, type=type)
        else:
            data = pack_record(
                body, st, misc=misc, sample_id=sid, sample_id_all=bool(a.sample_id_all)
            )
        if self._zstd is not None and data[0] < 64 and data[1:4] == b"\0\0\0":
            self._pending += data  # (no file offset of its own: -1)
            self._raw_in += len(data)
            return -1
        return self.add_bytes(data)

    def add_auxtrace(
        self,
        data: bytes | memoryview,
        *,
        cpu: int = -1,
        tid: int = -1,
        idx: int = 0,
        offset: int | None = None,
        reference: int = 0,
    ) -> int:
        """Append ``data`` (trace bytes) as an AUXTRACE record of AUX buffer
        ``idx``.  ``offset`` is the data's position in that buffer's stream
        (default: right after the previous AUXTRACE of ``idx``).  The payload
        is padded with zeros (PT PAD packets) to 8 bytes, as perf does.
        Returns the record's offset."""
        view = memoryview(data).cast("B")  # any buffer (a mapped spool file): no copy
        pad = -len(view) % 8
        size = len(view) + pad
        off = self._aux_offsets.get(idx, 0) if offset is None else offset
        self._aux_offsets[idx] = off + size
        at = self.add_bytes(pack_auxtrace(size, off, reference, idx, tid, cpu))
        self._f.write(view)
        self._f.write(bytes(pad))
        self._auxtrace_index.append((at, 48))  # perf indexes header.size
        return at

    def finished_round(self) -> int:
        """Append FINISHED_ROUND (perf's flush point for ordered events)."""
        return self.add_bytes(pack_simple(RecordType.FINISHED_ROUND))

    def finished_init(self) -> int:
        """Append FINISHED_INIT (end of the synthesized start-up records)."""
        return self.add_bytes(pack_simple(RecordType.FINISHED_INIT))

    def add_thread_map(self, entries: list[tuple[int, str]]) -> int:
        return self.add_bytes(pack_thread_map(entries))

    def add_id_index(self, entries: list[tuple[int, int, int, int]]) -> int:
        """ID_INDEX: (id, idx, cpu, tid) per sample ID."""
        return self.add_bytes(pack_id_index(entries))

    # -- close -----------------------------------------------------------------

    def close(self) -> None:
        """Write the feature sections and the final header; close the file."""
        if self.closed:
            return
        self._flush_compressed()
        self._start_data()
        f = self._f
        assert self._data_offset is not None
        data_end = f.tell()
        feats = dict(self.features)
        if self._zstd is not None:
            feats[Feature.COMPRESSED] = {
                "version": 0, "type": 1, "level": self._level,
                "ratio": self._raw_in // max(self._compressed_in, 1), "mmap_len": _MMAP_LEN,
            }  # fmt: skip
        feats[Feature.EVENT_DESC] = [
            EventDesc(replace(a, size=self.attr_size), n, ids) for a, ids, n in self.attrs
        ]
        feats[Feature.PMU_MAPPINGS] = self.pmu_mappings
        if self._auxtrace_index:
            feats[Feature.AUXTRACE] = self._auxtrace_index
        order = sorted(int(k) for k in feats)
        contents = [pack_feature(k, feats[k]) for k in order]
        write_feature_sections(f, data_end, contents)
        words = [0, 0, 0, 0]
        for k in order:
            words[k // 64] |= 1 << (k % 64)
        header = MAGIC + struct.pack(
            "<QQQQQQQQ4Q",
            HEADER_SIZE,
            self._attr_size,
            self._attrs_offset,
            self._attr_size * len(self.attrs),
            self._data_offset,
            data_end - self._data_offset,
            0,
            0,
            *words,
        )
        f.seek(0)
        f.write(header)
        f.close()
        self.closed = True

    def __enter__(self) -> PerfDataWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
