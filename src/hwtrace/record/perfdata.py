"""A software recording written as perf.data, the layout ``perf record -e
intel_pt//u --per-thread --switch-events`` writes: the intel_pt event with
AUXTRACE_INFO and TIME_CONV; per process image COMM (with the exec flag
after an exec) and MMAP2 sideband, and a TEXT_POKE (user code) for each code
revision it ran (:meth:`SoftwareRecording.code_revisions`); FORK and EXIT per thread and process;
per thread ITRACE_START, its PT in AUXTRACE records of its own AUX buffer
(tagged with its tid, CPU -1, as perf's per-thread mmaps are) and a SWITCH
in and out around each stretch it was traced (the time its trace covers);
all in time order.  Linux perf decodes it (``perf script --itrace``) as it
decodes hardware recordings, attributing each thread's trace to it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..perf.features import BuildId, Feature
from ..perf.notes import note_recording
from ..perf.records import (
    Body,
    Comm,
    Exit,
    Fork,
    ItraceStart,
    Mmap2,
    SampleId,
    SampleType,
    Switch,
    TextPoke,
)
from ..perf.sideband import TscConversion
from ..perf.writer import INTEL_PT_CONFIG_BITS, PerfDataWriter
from ..pt.config import PtConfig
from .sideband import MmapRecord

if TYPE_CHECKING:
    from .software import SoftwareRecording

_MISC_USER = 2
_HOST = -1  # perf's HOST_KERNEL_ID
_PROT = {"r": 1, "w": 2, "x": 4}
_MAP_PRIVATE, _MAP_SHARED = 0x2, 0x1


def intel_pt_config(settings: dict[str, int | bool]) -> int:
    """The intel_pt ``attr.config`` for a recording's PT settings."""
    bits = INTEL_PT_CONFIG_BITS
    config = bits["pt"]
    if settings.get("branch_enable", True):
        config |= bits["branch"]
    if settings.get("tsc"):
        config |= bits["tsc"]
    if settings.get("mtc"):
        config |= bits["mtc"] | (int(settings.get("mtc_period", 0)) << 14)
    if settings.get("cyc"):
        config |= bits["cyc"] | (int(settings.get("cyc_thresh", 0)) << 19)
    if settings.get("noretcomp"):
        config |= bits["noretcomp"]
    if settings.get("ptw"):
        config |= bits["ptw"] | bits["fup_on_ptw"]
    psb = int(settings.get("psb_period", 0))
    if psb >= 2048:
        # The PSBFreq field nearest the byte period (the software encoder
        # takes any period; the hardware powers of two from 2 KiB).
        config |= min(max(psb.bit_length() - 12, 0), 15) << 24
    return config


@dataclass(frozen=True)
class _Rec:
    """A record to write: perf time, then an order among equal times."""

    ns: int
    order: int
    body: Body | None  # None: the thread's AUXTRACE
    sid: SampleId
    misc: int = 0
    trace: AuxThread | None = None


def _mmap_bodies(pid: int, mmaps: list[MmapRecord]) -> list[Mmap2]:
    out = []
    for m in mmaps:
        # Files, and the vDSO (whose bytes go into the build-id cache).
        if "x" not in m.prot or not (m.path.startswith("/") or m.path == "[vdso]"):
            continue
        prot = sum(v for k, v in _PROT.items() if k in m.prot)
        flags = _MAP_SHARED if m.prot.endswith("s") else _MAP_PRIVATE
        body = Mmap2(
            pid, pid, m.start, m.length, m.pgoff,
            ino=m.inode, prot=prot, flags=flags, filename=m.path,
        )  # fmt: skip
        out.append(body)
    return out


@dataclass(frozen=True)
class ProcessStart:
    """A process image seen at perf time ``ns``: its COMM (an exec's flagged)
    and the MMAP2 of its files and vDSO."""

    ns: int
    pid: int
    comm: str
    exec_: bool
    mmaps: list[MmapRecord]


@dataclass(frozen=True)
class TaskRecord:
    """A thread's ``"comm"``, ``"fork"`` (``ppid``/``ptid`` its creator) or
    ``"exit"``, at perf time ``ns``."""

    ns: int
    kind: str
    pid: int
    tid: int
    ppid: int = 0
    ptid: int = 0
    comm: str = ""


@dataclass(frozen=True)
class AuxThread:
    """One thread's Intel PT, with the (on, off) perf times it covers and a
    TSC near its first packet (0 when untimed)."""

    pid: int
    tid: int
    cpu: int
    data: bytes
    spans: list[tuple[int, int]]
    reference: int


@dataclass
class PerfRecording:
    """Everything a recording's perf.data holds, whatever recorded it."""

    settings: dict[str, int | bool]
    config: PtConfig
    argv: list[str]
    time_conversion: TscConversion
    filters: str
    processes: list[ProcessStart]
    tasks: list[TaskRecord]
    threads: list[AuxThread]
    pokes: list[tuple[int, int, int, int, bytes]]  # (ns, pid, tid, address, bytes)
    notes: dict[str, object]
    mmaps: list[tuple[int, int, MmapRecord]] = field(default_factory=list)  # later: (ns, pid, .)
    #: the recorder's own command line, as perf keeps ``perf record ...``
    #: (None: ``hwtrace record`` and ``argv``)
    cmdline: list[str] | None = None
    #: zstd level of the records' compression (``perf record -z``; 0: none)
    compression: int = 0


def write_perf_data(
    rec: SoftwareRecording,
    path: str | os.PathLike[str],
    *,
    buildid_cache: bool = True,
    cmdline: list[str] | None = None,
    compression: int = 0,
) -> None:
    """Write ``rec`` to ``path`` as a perf.data that perf and hwtrace read;
    with ``buildid_cache`` the processes' vDSOs go into perf's build-id
    cache (perf's ``buildid.dir``, ``~/.debug``), as ``perf record`` puts
    them there; ``cmdline``: the recorder's command line for its header
    (see PerfRecording);
    ``compression``: zstd's level for the records (``perf record -z``)."""
    out = software_recording(rec, buildid_cache=buildid_cache)
    out.cmdline = cmdline
    out.compression = compression
    write_recording(out, path)


def software_recording(rec: SoftwareRecording, *, buildid_cache: bool = True) -> PerfRecording:
    """What a stepped recording's perf.data holds."""
    conv = rec.time_conversion
    steps = rec.steps
    assert steps is not None
    if buildid_cache:
        for index in range(len(steps.images)):
            rec.vdso_file(index)

    def ns(clock: int) -> int:
        return int(conv.to_ns(clock)) if clock else 0

    processes, tasks = [], []
    for ev in steps.events:
        t = ns(ev.time)
        if ev.kind in ("start", "exec"):
            img = steps.images[ev.image]
            processes.append(ProcessStart(t, ev.pid, img.comm, ev.kind == "exec",
                                          rec.image_mmaps[ev.image]))  # fmt: skip
        elif ev.kind in ("comm", "fork", "exit"):
            tasks.append(TaskRecord(t, ev.kind, ev.pid, ev.tid, ev.ppid, ev.ptid, ev.comm))
    # Code that ran but is in no file (JIT code) or changed while it ran,
    # as TEXT_POKE records of user code at the time each revision first ran
    # (perf itself applies only the kernel's).
    pokes = []
    for index, img in enumerate(steps.images):
        for r in rec.code_revisions(index).revisions:
            tid = r.tid if r.tid > 0 else img.pid
            pokes.append((ns(r.valid_from), img.pid, tid, r.address, r.data))
    timed = bool(rec.settings.get("tsc"))
    threads = []
    for tr in rec.threads:
        spans = []
        for seg in tr.log.segments:
            on = ns(int(tr.log.times[seg.start]))
            spans.append((on, max(ns(seg.end_time), on)))
        ref = int(tr.instruction_times[0]) if timed else 0
        threads.append(AuxThread(tr.pid, tr.tid, tr.cpu, tr.data, spans, ref))
    # perf times here are CLOCK_MONOTONIC (the stepping clock converted
    # through pairs read with it), which perf.data cannot say: noted beside
    # it, so events of other tracers can be placed on the flow.
    # Its TEXT_POKE records are timed where the trace can switch code.
    notes = {"clock": "CLOCK_MONOTONIC", "clock_error_ns": rec.clock_error_ns,
             "revisions": "stepper"}  # fmt: skip
    argv = list(rec.argv) if rec.argv else [rec.comm]
    return PerfRecording(rec.settings, rec.config, argv, conv, rec.filters, processes, tasks,
                         threads, pokes, notes)  # fmt: skip


def _records(rec: PerfRecording, processes: list[ProcessStart], streamed: set[int]) -> list[_Rec]:
    """The records of ``rec`` to write, in time order: those of
    ``processes``' starts, the later sideband, and the AUXTRACE of the
    threads not in ``streamed`` (written while recording)."""
    pid_of = {t.tid: t.pid for t in rec.tasks}
    cpu_of = {t.tid: max(t.cpu, 0) for t in rec.threads}

    def sid(pid: int, tid: int, t: int) -> SampleId:
        return SampleId(pid=pid, tid=tid, time=t, cpu=cpu_of.get(tid, cpu_of.get(pid, 0)))

    records: list[_Rec] = []
    add = records.append
    for p in processes:
        add(_Rec(p.ns, 0, Comm(p.pid, p.pid, p.comm, p.exec_), sid(p.pid, p.pid, p.ns)))
        for body in _mmap_bodies(p.pid, p.mmaps):
            add(_Rec(p.ns, 1, body, sid(p.pid, p.pid, p.ns), _MISC_USER))
    for t, pid, m in rec.mmaps:
        for body in _mmap_bodies(pid, [m]):
            add(_Rec(t, 1, body, sid(pid, pid, t), _MISC_USER))
    for ev in rec.tasks:
        t = ev.ns
        if ev.kind == "comm":
            add(_Rec(t, 0, Comm(ev.pid, ev.tid, ev.comm), sid(ev.pid, ev.tid, t)))
        elif ev.kind == "fork":
            body = Fork(ev.pid, ev.ppid, ev.tid, ev.ptid, t)
            add(_Rec(t, 0, body, sid(ev.pid, ev.tid, t)))
        elif ev.kind == "exit":
            body = Exit(ev.pid, ev.pid, ev.tid, ev.tid, t)
            add(_Rec(t, 9, body, sid(ev.pid, ev.tid, t)))
    for t, pid, tid, address, data in rec.pokes:
        add(_Rec(t, 5, TextPoke(address, b"", data), sid(pid, tid, t), _MISC_USER))
    started: set[int] = set()
    for tr in rec.threads:
        first = tr.spans[0][0]
        if tr.tid not in started:
            started.add(tr.tid)
            pid = pid_of.get(tr.tid, tr.pid)
            add(_Rec(first - 1, 2, ItraceStart(pid, tr.tid), sid(pid, tr.tid, first - 1)))
        if tr.tid not in streamed:
            add(_Rec(first - 1, 3, None, sid(tr.pid, tr.tid, first - 1), trace=tr))
        for on, off in tr.spans:
            add(_Rec(on, 4, Switch(False), sid(tr.pid, tr.tid, on)))
            add(_Rec(off, 8, Switch(True), sid(tr.pid, tr.tid, off)))
    records.sort(key=lambda r: (r.ns, r.order))
    return records


def _open_writer(
    path: str | os.PathLike[str],
    settings: dict[str, int | bool],
    cfg: PtConfig,
    argv: list[str],
    conv: TscConversion,
    filters: str,
    cmdline: list[str] | None = None,
    compression: int = 0,
) -> PerfDataWriter:
    """A perf.data with the intel_pt event of these settings."""
    timed = bool(settings.get("tsc"))
    st = SampleType
    sample_type = st.IP | st.TID | st.CPU | st.IDENTIFIER | (st.TIME if timed else 0)
    if (len(filters) + 1) % 8 == 0:
        # perf reads the filter from a roundup(length + 1, 8)-byte field;
        # hwtrace's AUXTRACE_INFO writer counts the NUL in the length, which
        # is the same size except for this length: a blank keeps them so.
        filters += " "
    w = PerfDataWriter(path, cmdline=cmdline or ["hwtrace", "record", *argv],
                       compress=compression)  # fmt: skip
    w.set_intel_pt(
        config=intel_pt_config(settings),
        sample_type=sample_type,
        time_shift=conv.time_shift,
        time_mult=conv.time_mult,
        time_zero=conv.time_zero,
        cap_user_time_zero=timed,
        tsc_ctc_ratio=(cfg.cpuid_0x15_ebx, cfg.cpuid_0x15_eax),
        max_non_turbo_ratio=cfg.nom_freq,
        filter=filters,
        context_switch=True,
    )
    return w


def _write_records(w: PerfDataWriter, records: list[_Rec], idx: dict[int, int]) -> None:
    for r in records:
        if r.trace is not None:
            k = idx.setdefault(r.trace.tid, len(idx))
            # The reference is a TSC near the trace's, which perf extends
            # the 7-byte TSC packets with (perf record reads the TSC).
            w.add_auxtrace(r.trace.data, tid=r.trace.tid, idx=k, reference=r.trace.reference)
        else:
            w.add_record(r.body, sample_id=r.sid, misc=r.misc)


def _close(w: PerfDataWriter, rec: PerfRecording, path: str | os.PathLike[str]) -> None:
    build_ids = {}
    for m in [m for p in rec.processes for m in p.mmaps] + [m for _, _, m in rec.mmaps]:
        if m.build_id and m.path not in build_ids:
            build_ids[m.path] = m.build_id
    # The machine's pid, as perf record writes it: HOST_KERNEL_ID (-1) for
    # the host (perf takes another pid for a guest machine's).
    w.set_feature(
        Feature.BUILD_ID, [BuildId(_HOST, bid, p, _MISC_USER) for p, bid in build_ids.items()]
    )
    w.finished_round()
    w.close()
    note_recording(path, **rec.notes)


def write_recording(rec: PerfRecording, path: str | os.PathLike[str]) -> None:
    """Write ``rec`` to ``path`` as a perf.data that perf and hwtrace read."""
    records = _records(rec, rec.processes, set())
    w = _open_writer(path, rec.settings, rec.config, rec.argv, rec.time_conversion, rec.filters,
                     rec.cmdline, rec.compression)  # fmt: skip
    # The sideband perf synthesizes from /proc when recording starts.
    init = [r for r in records if r.order <= 1 and r.ns <= records[0].ns]
    _write_records(w, init, {})
    w.finished_init()
    _write_records(w, records[len(init) :], {})
    _close(w, rec, path)


class StreamedRecording:
    """A perf.data written as a recording goes, as ``perf record`` writes
    one: opened when tracing starts with the program's COMM and MMAP2
    (``start``), each thread's trace appended in AUXTRACE records while
    it runs (:meth:`add`), the rest and the TSC's rate when it ends
    (:meth:`finish`): the trace is written once, never held."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        settings: dict[str, int | bool],
        argv: list[str],
        start: ProcessStart,
        reference: int,
        filters: str = "",
        cmdline: list[str] | None = None,
        compression: int = 0,
    ) -> None:
        self.path = path
        self.start = start
        self.reference = reference  # a TSC near the traces' first packets
        # The rate is known at the end (set_time_conversion then).
        self.writer = _open_writer(path, settings, PtConfig(), argv, TscConversion(0, 1, 0),
                                   filters, cmdline, compression)  # fmt: skip
        rec = PerfRecording(settings, PtConfig(), argv, TscConversion(0, 1, 0), filters, [start],
                            [], [], [], {})  # fmt: skip
        _write_records(self.writer, _records(rec, [start], set()), {})
        self.writer.finished_init()
        self.idx: dict[int, int] = {}  # tid -> its AUX buffer
        self.sizes: dict[int, int] = {}  # tid -> trace bytes written

    def add(self, tid: int, data: bytes | memoryview) -> None:
        """Append a stretch of thread ``tid``'s trace (whole packets)."""
        k = self.idx.setdefault(tid, len(self.idx))
        self.writer.add_auxtrace(data, tid=tid, idx=k, reference=self.reference)
        self.sizes[tid] = self.sizes.get(tid, 0) + len(data)

    def finish(self, rec: PerfRecording) -> None:
        """Write the sideband of ``rec`` (whose first process start is the
        one written) and close the file."""
        w = self.writer
        conv = rec.time_conversion
        w.set_time_conversion(conv.time_shift, conv.time_mult, conv.time_zero)
        _write_records(w, _records(rec, rec.processes[1:], set(self.idx)), self.idx)
        _close(w, rec, self.path)

    def abandon(self) -> None:
        """The recording failed: no file."""
        self.writer.close()
        os.unlink(self.path)
