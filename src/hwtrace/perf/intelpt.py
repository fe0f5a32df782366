"""The Intel PT of a perf.data: the configuration it was recorded with, its
TSC to perf time conversion, its AUX queues and their trace, and the
sideband model (processes, threads, mappings, code revisions) of its
records."""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

import numpy as np

from ..image.revisions import CodeRevisions
from ..pt.config import PtConfig
from ..pt.packets import release
from .attr import PerfEventAttr, event_modifiers
from .code import add_bpf_images
from .data import PerfData, PerfDataError
from .features import Feature
from .records import RecordType as RT
from .sideband import CodeRevision, Sideband, TscConversion

_SIDEBAND = (
    RT.MMAP, RT.MMAP2, RT.COMM, RT.FORK, RT.EXIT, RT.ITRACE_START, RT.SWITCH,
    RT.SWITCH_CPU_WIDE, RT.KSYMBOL, RT.BPF_EVENT, RT.TEXT_POKE,
)  # fmt: skip
_MISC_CPUMODE_KERNEL = 1
_MISC_CPUMODE_USER = 2


def sideband_of(data: PerfData) -> Sideband:
    """The sideband model of a perf.data's records, in file order.

    Records that cannot be parsed go to ``data.errors`` and are skipped.
    """
    sb = Sideband()
    # perf keeps the build ids of the binaries it saw in the BUILD_ID
    # feature; MMAP2 records carry one only with --buildid-mmap.
    build_ids = {b.filename: b.build_id for b in data.features.get(Feature.BUILD_ID) or ()}
    r = data.records
    rows = np.flatnonzero(np.isin(r["type"], np.array(_SIDEBAND, r["type"].dtype)))
    for i in rows.tolist():
        try:
            rec = data.record(i)
        except PerfDataError as e:
            data.errors.append(e)
            continue
        t = max(int(r["time"][i]), 0)
        cpu, tid = int(r["cpu"][i]), int(r["tid"][i])
        b = rec.body
        k = rec.type
        if k in (RT.MMAP, RT.MMAP2):
            kernel = b.pid in (-1, 0xFFFFFFFF) or (rec.misc & 7) == _MISC_CPUMODE_KERNEL
            sb.add_mmap(
                t, b.pid, b.addr, b.len, b.pgoff, b.filename,
                executable=not b.data, kernel=kernel,
                build_id=getattr(b, "build_id", None) or build_ids.get(b.filename),
            )  # fmt: skip
        elif k == RT.COMM:
            sb.add_comm(t, b.pid, b.tid, b.comm, exec=b.exec)
        elif k == RT.FORK:
            sb.add_fork(t or b.time, b.pid, b.ppid, b.tid, b.ptid)
        elif k == RT.EXIT:
            sb.add_exit(t or b.time, b.pid, b.tid)
        elif k == RT.ITRACE_START:
            sb.thread_pid.setdefault(b.tid, b.pid)
            sb.add_switch(t, cpu, b.tid)
        elif k == RT.SWITCH:
            sb.add_switch(t, cpu, -1 if b.out else tid)
        elif k == RT.SWITCH_CPU_WIDE:
            if b.out:
                sb.thread_pid.setdefault(b.next_prev_tid, b.next_prev_pid)
                sb.add_switch(t, cpu, b.next_prev_tid)
            else:
                sb.add_switch(t, cpu, tid)
        elif k == RT.KSYMBOL:
            unregister = bool(b.flags & 1)
            kind = "ksymbol-unregister" if unregister else "ksymbol"
            sb.add_revision(CodeRevision(t, kind, b.addr, b.len, b.name))
        elif k == RT.BPF_EVENT:
            sb.add_revision(CodeRevision(t, "bpf", 0, 0, f"bpf prog {b.id}"))
        elif k == RT.TEXT_POKE:
            # User code's pokes (hwtrace's software recordings write the code
            # revisions they saw so) belong to their process.
            user = (rec.misc & 7) == _MISC_CPUMODE_USER
            pid = int(r["pid"][i]) if user else -1
            sb.add_revision(CodeRevision(t, "text_poke", b.addr, len(b.new), "", b.old, b.new, pid))
    # BPF programs' JIT images, which perf keeps (BPF_PROG_INFO), from their
    # KSYMBOL registration on.
    images = CodeRevisions()
    if add_bpf_images(data, images):
        for r in images.revisions:
            sb.add_revision(
                CodeRevision(r.valid_from, "bpf_image", r.address, len(r.data), r.name,
                             b"", r.data)
            )  # fmt: skip
    return sb


def pt_config_of(data: PerfData) -> PtConfig:
    """The decoder configuration a perf.data's Intel PT was recorded with."""
    pt = data.intel_pt
    config = PtConfig()
    if pt is None:
        return config
    attr = pt_attr_of(data)
    if attr is not None and pt.mtc_freq_bits:
        shift = (pt.mtc_freq_bits & -pt.mtc_freq_bits).bit_length() - 1
        config.mtc_freq = (attr.config & pt.mtc_freq_bits) >> shift
    config.nom_freq = pt.max_non_turbo_ratio or 0
    config.cpuid_0x15_eax = pt.tsc_ctc_ratio_d or 0
    config.cpuid_0x15_ebx = pt.tsc_ctc_ratio_n or 0
    return config


def pt_attr_of(data: PerfData) -> PerfEventAttr | None:
    """The attr of a perf.data's Intel PT event (None: none)."""
    pt = data.intel_pt
    if pt is None:
        return None
    return next((a.attr for a in data.attrs if a.attr.type == pt.pmu_type), None)


def event_columns(
    data: PerfData, instructions: bool = True, ptwrite: bool = False, period: int = 1
) -> tuple[str, str]:
    """What ``perf script --itrace=i...`` (``iw``, ``w``: the events perf
    makes, ``instructions`` and ``ptwrite``) prints between a sample's
    time and its address by default, for instructions and for PTWRITEs:
    the period (instructions only), then the name of the samples' event
    (``instructions`` with the Intel PT event's modifiers, as perf names
    it; ``ptwrite`` as perf sets it) right-aligned to the longest name of
    the file's events and of those made, then a colon."""
    attr = pt_attr_of(data)
    name = "instructions" + (event_modifiers(attr) if attr is not None else "")
    named = data.features.get(Feature.EVENT_DESC) or []
    made = [name] * instructions + ["ptwrite"] * ptwrite
    width = max(len(n) for n in [*made, *(d.name for d in named), ""])
    return f" {period:10d} {name:>{width}}:", f" {'ptwrite':>{width}}: "


def tsc_conversion_of(data: PerfData) -> TscConversion | None:
    """The TSC to perf time conversion of a perf.data's Intel PT (None:
    no Intel PT or no TSC)."""
    pt = data.intel_pt
    if pt is None or not pt.time_mult:
        return None
    return TscConversion(pt.time_shift, pt.time_mult, pt.time_zero)


def aux_queues(data: PerfData, per_cpu: bool) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    """The AUX queues, sorted by (buffer, cpu, tid): per queue its cpu, tid
    and its AUXTRACE records' data offsets and sizes in stream order."""
    aux = data.auxtrace_columns()
    cpu = aux["cpu"] if per_cpu else np.full(aux["cpu"].shape, -1, np.int64)
    keys = sorted(set(zip(aux["idx"].tolist(), cpu.tolist(), aux["tid"].tolist(), strict=True)))
    out = []
    for idx, c, t in keys:
        sel = np.flatnonzero((aux["idx"] == idx) & (cpu == c) & (aux["tid"] == t))
        sel = sel[np.argsort(aux["offset"][sel], kind="stable")]
        out.append((c, t, aux["data_offset"][sel], aux["size"][sel]))
    return out


@contextmanager
def queue_trace(data: PerfData, starts: np.ndarray, sizes: np.ndarray) -> Iterator[np.ndarray]:
    """A queue's trace as one buffer: a view of the mapped perf.data for one
    AUXTRACE record; for several, their data copied into an unlinked
    temporary file, mapped (its pages and the input's are dropped as they
    are copied and as they are decoded)."""
    if starts.shape[0] == 1:
        s = int(starts[0])
        yield data.buf[s : s + int(sizes[0])]
        return
    with tempfile.TemporaryFile(prefix="hwtrace-aux-") as f:
        for s, n in zip(starts.tolist(), sizes.tolist(), strict=True):
            for lo in range(s, s + n, 1 << 24):
                hi = min(s + n, lo + (1 << 24))
                f.write(data.buf[lo:hi].data)
                release(data.buf, lo, hi)
        f.flush()
        yield _map_open(f)


def iter_queue_traces(data: PerfData) -> Iterator[tuple[int, int, np.ndarray]]:
    """Each AUX queue's Intel PT as one buffer: (cpu, tid, trace); cpu -1
    for per-thread queues, tid -1 for per-CPU ones.  A buffer is valid
    until the next one is asked for."""
    pt = data.intel_pt
    if pt is None:
        return
    for cpu, tid, starts, sizes in aux_queues(data, bool(pt.per_cpu_mmaps)):
        with queue_trace(data, starts, sizes) as buf:
            yield cpu, tid, buf


def _map_open(f: BinaryIO) -> np.ndarray:
    """Map an open file read-only (as :func:`hwtrace.pt.packets.map_file`
    maps a path: :func:`~hwtrace.pt.packets.release` works on it)."""
    if os.fstat(f.fileno()).st_size == 0:
        return np.zeros(0, np.uint8)
    return np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.uint8)
