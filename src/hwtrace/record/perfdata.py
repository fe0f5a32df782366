"""A software recording written as perf.data, the layout ``perf record -e
intel_pt//u --per-thread`` writes: the intel_pt event with AUXTRACE_INFO and
TIME_CONV, COMM and MMAP2 sideband, ITRACE_START, the PT in an AUXTRACE
record, EXIT.  Linux perf decodes it (``perf script --itrace``) as it
decodes hardware recordings."""

from __future__ import annotations

import os

from ..perf.features import BuildId, Feature
from ..perf.records import Comm, Exit, ItraceStart, Mmap2, SampleId
from ..perf.writer import INTEL_PT_CONFIG_BITS, PerfDataWriter
from .software import SoftwareRecording

_MISC_USER = 2
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
        config |= bits["cyc"]
    if settings.get("noretcomp"):
        config |= bits["noretcomp"]
    psb = int(settings.get("psb_period", 0))
    if psb >= 2048:
        # The PSBFreq field nearest the byte period (the software encoder
        # takes any period; the hardware powers of two from 2 KiB).
        config |= min(max(psb.bit_length() - 12, 0), 15) << 24
    return config


def write_perf_data(rec: SoftwareRecording, path: str | os.PathLike[str]) -> None:
    """Write ``rec`` to ``path`` as a perf.data that perf and hwtrace read."""
    conv = rec.time_conversion
    start_ns = int(conv.to_ns(rec.first_tsc)) if rec.first_tsc else 0
    end_tsc = int(rec.log.times[-1]) if rec.log.times.shape[0] else rec.first_tsc
    end_ns = int(conv.to_ns(end_tsc)) if end_tsc else start_ns
    cfg = rec.config
    argv = list(rec.argv) if rec.argv else [rec.comm]
    with PerfDataWriter(path, cmdline=["hwtrace", "record", *argv]) as w:
        w.set_intel_pt(
            config=intel_pt_config(rec.settings),
            time_shift=conv.time_shift,
            time_mult=conv.time_mult,
            time_zero=conv.time_zero,
            cap_user_time_zero=bool(rec.settings.get("tsc")),
            tsc_ctc_ratio=(cfg.cpuid_0x15_ebx, cfg.cpuid_0x15_eax),
            max_non_turbo_ratio=cfg.nom_freq,
            filter=rec.filters,
        )
        # Sideband just before the trace begins, as perf has it from
        # /proc at record start (synthesized) or from the kernel.
        sid = SampleId(pid=rec.pid, tid=rec.tid, time=max(start_ns - 1, 0))
        w.add_record(Comm(rec.pid, rec.tid, rec.comm), sample_id=sid)
        for m in rec.mmaps:
            if "x" not in m.prot or not m.path.startswith("/"):
                continue
            prot = sum(v for k, v in _PROT.items() if k in m.prot)
            flags = _MAP_SHARED if m.prot.endswith("s") else _MAP_PRIVATE
            body = Mmap2(
                rec.pid, rec.tid, m.start, m.length, m.pgoff,
                ino=m.inode, prot=prot, flags=flags, filename=m.path,
            )  # fmt: skip
            w.add_record(body, sample_id=sid, misc=_MISC_USER)
        w.set_feature(
            Feature.BUILD_ID,
            [
                BuildId(rec.pid, bid, path, _MISC_USER)
                for path, bid in {m.path: m.build_id for m in rec.mmaps if m.build_id}.items()
            ],
        )
        w.finished_init()
        w.add_record(ItraceStart(rec.pid, rec.tid), sample_id=sid)
        w.add_auxtrace(rec.data, tid=rec.tid)
        w.finished_round()
        if rec.exit_status is not None:
            w.add_record(
                Exit(rec.pid, rec.pid, rec.tid, rec.tid, end_ns),
                sample_id=SampleId(pid=rec.pid, tid=rec.tid, time=end_ns),
            )
