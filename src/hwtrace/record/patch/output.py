"""A patch recording as perf.data and as a decoder's image."""

from __future__ import annotations

import os
from pathlib import Path

from ...image import Image
from ...image.process import Mapping
from ...perf.sideband import cache_vdso, elf_build_id
from ...pt.config import PtConfig
from ..perfdata import AuxThread, PerfRecording, ProcessStart, TaskRecord, write_recording
from ..software import MmapRecord, files_image, mmap_records, tsc_conversion
from .tracer import PatchRecording

__all__ = ["BACKEND", "patch_image", "patch_perf_recording", "write_patch_perf_data"]

BACKEND = "patch: live code patching"


def _start_maps(rec: PatchRecording) -> list[Mapping]:
    return [m for m in rec.maps if m.path != "[vsyscall]"]


def _maps(rec: PatchRecording) -> list[Mapping]:
    """The mappings at the start and those of code mapped later (a module
    dlopen'ed, at an address nothing else had been at)."""
    return _start_maps(rec) + [m for _, m in rec.mapped]


def _mmaps(rec: PatchRecording) -> list[MmapRecord]:
    return mmap_records(_maps(rec), {}, rec.vdso)


def _vdso_file(rec: PatchRecording, directory: Path | None = None) -> Path | None:
    bid = elf_build_id(rec.vdso) if rec.vdso else None
    return cache_vdso(rec.vdso, bid, directory) if bid is not None else None


def patch_image(rec: PatchRecording, directory: Path | None = None) -> Image:
    """The ELF files and vDSO the recorded process ran, at their addresses;
    the vDSO is kept in perf's build-id cache (``directory``, default
    ``~/.debug``)."""
    return files_image(rec.comm, _mmaps(rec), _maps(rec), _vdso_file(rec, directory))


def patch_perf_recording(rec: PatchRecording, *, buildid_cache: bool = True) -> PerfRecording:
    """What the recording's perf.data holds: the program's COMM and MMAP2
    when tracing began, each thread's PT and its span, the exits."""
    if buildid_cache:
        _vdso_file(rec)
    conv = tsc_conversion(rec.clock_pairs[0], rec.clock_pairs[-1])
    t0, t1 = (int(conv.to_ns(c)) for c, _ in (rec.clock_pairs[0], rec.clock_pairs[-1]))
    start = mmap_records(_start_maps(rec), {}, rec.vdso)
    processes = [ProcessStart(t0, rec.pid, rec.comm, False, start)]
    later = [(int(conv.to_ns(tsc)), rec.pid, r)
             for (tsc, _), r in zip(rec.mapped, mmap_records([m for _, m in rec.mapped], {}),
                                    strict=True)]  # fmt: skip
    tasks = [TaskRecord(t1, "exit", th.pid, th.tid) for th in rec.threads]
    threads = [AuxThread(th.pid, th.tid, 0, th.data, [(t0, t1)], rec.clock_pairs[0][0])
               for th in rec.threads]  # fmt: skip
    opt = rec.options
    settings: dict[str, int | bool] = {
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
    notes: dict[str, object] = {"clock": "CLOCK_MONOTONIC", "clock_error_ns": 0}
    return PerfRecording(settings, PtConfig(), list(rec.argv), conv, "", processes, tasks,
                         threads, [], notes, later)  # fmt: skip


def write_patch_perf_data(
    rec: PatchRecording, path: str | os.PathLike[str], *, buildid_cache: bool = True
) -> None:
    """Write ``rec`` to ``path`` as perf.data (``perf record -e intel_pt//u
    --per-thread`` layout)."""
    write_recording(patch_perf_recording(rec, buildid_cache=buildid_cache), path)
