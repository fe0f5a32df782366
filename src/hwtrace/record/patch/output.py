"""A patch recording as perf.data and as a decoder's image."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...image import Image
from ...image.process import Mapping
from ...perf.sideband import cache_vdso, elf_build_id
from ...pt.config import PtConfig
from ..perfdata import (
    AuxThread,
    PerfRecording,
    ProcessStart,
    StreamedRecording,
    TaskRecord,
    write_recording,
)
from ..sideband import MmapRecord, files_image, mmap_records, perf_filters, tsc_conversion
from .tracer import PatchOptions, PatchRecording, record_patched

__all__ = [
    "BACKEND",
    "patch_image",
    "patch_perf_recording",
    "record_patched_perf",
    "write_patch_perf_data",
]

BACKEND = "patch: live code patching"


def _start_maps(rec: PatchRecording) -> list[Mapping]:
    return [m for m in rec.maps if m.path != "[vsyscall]"]


def _maps(rec: PatchRecording) -> list[Mapping]:
    """The mappings at the start and those of code the program mapped
    later (a module dlopen'ed, at an address nothing else had been at)."""
    return _start_maps(rec) + [m for _, m, pid in rec.mapped if pid == rec.pid]


def _mmaps(rec: PatchRecording) -> list[MmapRecord]:
    return mmap_records(_maps(rec), {}, rec.vdso)


def _vdso_file(rec: PatchRecording, directory: Path | None = None) -> Path | None:
    bid = elf_build_id(rec.vdso) if rec.vdso else None
    return cache_vdso(rec.vdso, bid, directory) if bid is not None else None


def patch_image(rec: PatchRecording, directory: Path | None = None) -> Image:
    """The ELF files and vDSO the recorded process ran, at their addresses;
    the vDSO is kept in perf's build-id cache (``directory``, default
    perf's ``buildid.dir``, ``~/.debug`` unless configured)."""
    return files_image(rec.comm, _mmaps(rec), _maps(rec), _vdso_file(rec, directory))


def patch_perf_recording(rec: PatchRecording, *, buildid_cache: bool = True) -> PerfRecording:
    """What the recording's perf.data holds: the program's COMM and MMAP2
    when tracing began, each thread's PT and its span, the exits."""
    if buildid_cache:
        _vdso_file(rec)
    conv = tsc_conversion(rec.clock_pairs[0], rec.clock_pairs[-1])
    t0, t1 = (int(conv.to_ns(c)) for c, _ in (rec.clock_pairs[0], rec.clock_pairs[-1]))
    processes = [_process_start(rec, t0)]
    for e in rec.execs:
        mmaps = mmap_records([m for m in e.maps if m.path != "[vsyscall]"], {}, e.vdso)
        processes.append(ProcessStart(int(conv.to_ns(e.tsc)), e.pid, e.comm, True, mmaps))
    later = [(int(conv.to_ns(tsc)), pid, r)
             for (tsc, _, pid), r in zip(rec.mapped, mmap_records([m for _, m, _ in rec.mapped], {}),
                                         strict=True)]  # fmt: skip
    tasks = [TaskRecord(int(conv.to_ns(tsc)), "fork", pid, tid, parent if pid == tid else pid,
                        parent if pid == tid else pid)
             for tsc, pid, tid, parent in rec.forked]  # fmt: skip
    tasks += [TaskRecord(t1, "exit", th.pid, th.tid) for th in rec.threads]
    threads = [AuxThread(th.pid, th.tid, 0, th.data, [(t0, t1)], rec.clock_pairs[0][0])
               for th in rec.threads]  # fmt: skip
    notes: dict[str, object] = {"clock": "CLOCK_MONOTONIC", "clock_error_ns": 0}
    return PerfRecording(_settings(rec.options), PtConfig(), list(rec.argv), conv, _filters(rec),
                         processes, tasks, threads, [], notes, later)  # fmt: skip


def _filters(rec: PatchRecording) -> str:
    """The address ranges traced, as perf's address filters."""
    return perf_filters(rec.ranges, _start_maps(rec))


def _process_start(rec: PatchRecording, ns: int) -> ProcessStart:
    return ProcessStart(ns, rec.pid, rec.comm, False,
                        mmap_records(_start_maps(rec), {}, rec.vdso))  # fmt: skip


def _settings(opt: PatchOptions) -> dict[str, int | bool]:
    return {
        "tsc": opt.tsc,
        "mtc": False,
        "mtc_period": 0,
        "cyc": False,
        "cyc_thresh": 0,
        "noretcomp": opt.noretcomp,
        "psb_period": opt.psb_period,
        "branch_enable": True,
        "user": True,
        "kernel": False,
        "ptw": False,
    }


def write_patch_perf_data(
    rec: PatchRecording, path: str | os.PathLike[str], *, buildid_cache: bool = True
) -> None:
    """Write ``rec`` to ``path`` as perf.data (``perf record -e intel_pt//u
    --per-thread`` layout)."""
    write_recording(patch_perf_recording(rec, buildid_cache=buildid_cache), path)


class _PerfSink:
    """The threads' traces written into perf.data as they come."""

    def __init__(
        self, path: str | os.PathLike[str], cmdline: list[str] | None, compression: int
    ) -> None:
        self.path, self.cmdline, self.compression = path, cmdline, compression
        self.stream: StreamedRecording | None = None

    def begin(self, head: PatchRecording) -> None:
        tsc, ns = head.clock_pairs[0]
        # The conversion found at the end passes through this pair: the
        # start's perf time is its CLOCK_MONOTONIC time.
        self.stream = StreamedRecording(self.path, _settings(head.options), list(head.argv),
                                        _process_start(head, ns), tsc, _filters(head),
                                        self.cmdline, self.compression)  # fmt: skip

    def add(self, tid: int, data: memoryview) -> None:
        assert self.stream is not None
        self.stream.add(tid, data)


def record_patched_perf(
    argv: Sequence[str],
    path: str | os.PathLike[str],
    options: PatchOptions | None = None,
    *,
    buildid_cache: bool = True,
    cmdline: list[str] | None = None,
    compression: int = 0,
    **popen: Any,
) -> PatchRecording:
    """:func:`~hwtrace.record.patch.record_patched` writing ``path`` (as
    :func:`write_patch_perf_data` does) while the program runs: the trace
    goes from the threads' buffers into the file once, never held;
    ``cmdline``: the recorder's command line for its header;
    ``compression``: zstd's level for the records (``perf record -z``)."""
    sink = _PerfSink(path, cmdline, compression)
    try:
        rec = record_patched(argv, options, sink=sink, **popen)
    except BaseException:
        if sink.stream is not None:
            sink.stream.abandon()
        raise
    assert sink.stream is not None
    sink.stream.finish(patch_perf_recording(rec, buildid_cache=buildid_cache))
    return rec
