"""A raw Intel PT trace (what ``ptxed --pt`` reads) written as a perf.data,
so that every perf.data reader (``hwtrace decode``, its distributed form,
``report``, ``script``, Linux perf) takes it.

The file is what ``perf record -e intel_pt//u --per-thread`` writes for one
thread: the ``intel_pt`` event with the trace's timing configuration
(IA32_RTIT_CTL's MTC period and TSC bits in ``attr.config``, the TSC:crystal
ratio and the nominal frequency in AUXTRACE_INFO, perf's
``tools/perf/arch/x86/util/intel-pt.c``), COMM and one MMAP2 per executable
``PT_LOAD`` segment of each ELF (and one per raw file section), then the
trace as AUXTRACE records of one AUX buffer.  Records hold at most
``record_bytes`` each and end where a PSB begins, so each also decodes on
its own: a reader that starts at a record (perf after lost data, a Dask
task reading one record) synchronises at once, losing nothing.

With TSC packets in the trace (looked for in its first PSB+), records carry
perf times: TSC ticks are converted at ``tsc_hz`` (default: the nominal
frequency times 100 MHz, the bus clock perf assumes for
``max_non_turbo_ratio``; else 1 GHz, TSC ticks as nanoseconds).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..image.elf import read_elf
from ..pt.config import PtConfig
from ..pt.kinds import Kind
from ..pt.packets import decode_range, map_file, psb_plus_end, release, sync_backward, sync_forward
from .records import Comm, Mmap2, SampleId, SampleType
from .writer import INTEL_PT_CONFIG_BITS, PerfDataWriter

__all__ = ["RECORD_BYTES", "WrapError", "first_tsc", "split_at_psbs", "wrap_raw_trace"]

#: the most trace one AUXTRACE record holds
RECORD_BYTES = 64 << 20
_MISC_USER = 2
_PROT_RX = 1 | 4
_MAP_PRIVATE = 2
_TIME_SHIFT = 24


class WrapError(Exception):
    """A raw trace or binary that cannot be wrapped: one line naming it."""


def split_at_psbs(buf: np.ndarray, record_bytes: int = RECORD_BYTES) -> list[tuple[int, int]]:
    """``(start, end)`` pieces of ``buf`` of at most ``record_bytes``, each
    but the first starting at a PSB (a stretch of ``record_bytes`` without
    one is cut where it is full)."""
    end = buf.shape[0]
    out: list[tuple[int, int]] = []
    lo = 0
    while end - lo > record_bytes:
        cut = sync_backward(buf, lo + record_bytes + 1)
        if cut <= lo:
            cut = lo + record_bytes
        out.append((lo, cut))
        lo = cut
    if end > lo or not out:
        out.append((lo, end))
    return out


def first_tsc(buf: np.ndarray) -> int | None:
    """The TSC value in the trace's first PSB+ (None: no TSC packet there,
    or no PSB)."""
    psb = sync_forward(buf, 0) if buf.shape[0] else -1
    if psb < 0:
        return None
    stop = psb_plus_end(buf, psb, min(buf.shape[0], psb + (1 << 20)))
    table = decode_range(buf, psb, stop, resync=False)
    hit = np.flatnonzero(table.kind == Kind.TSC)
    return int(table.a[hit[0]]) if hit.shape[0] else None


def _time_conv(tsc_hz: float) -> tuple[int, int]:
    """perf's (time_shift, time_mult): ns = (tsc * mult) >> shift."""
    return _TIME_SHIFT, max(1, round(1e9 / tsc_hz * (1 << _TIME_SHIFT)))


def _elf_maps(path: str, base: int | None) -> list[tuple[int, int, int]]:
    """``(address, length, file offset)`` of an ELF's executable segments,
    placed as :meth:`hwtrace.image.Image.add_elf` places them."""
    try:
        elf = read_elf(path)
    except Exception as e:  # ImageError and OSError: one line either way
        raise WrapError(f"{path}: {e}") from None
    bias = 0 if base is None else base - elf.min_vaddr
    maps = [(s.vaddr + bias, max(s.memsz, s.filesz), s.offset) for s in elf.segments
            if s.flags & 1 and s.filesz > 0]  # fmt: skip
    if not maps:
        raise WrapError(f"{path}: no executable PT_LOAD segment")
    return maps


def wrap_raw_trace(
    pt_path: str | os.PathLike[str],
    out_perf_data: str | os.PathLike[str],
    *,
    elf: Sequence[tuple[str | os.PathLike[str], int | None]] = (),
    raw: Sequence[tuple[str | os.PathLike[str], int, int | None, int]] = (),
    config: PtConfig | None = None,
    cpu: int = 0,
    tid: int = 1,
    comm: str | None = None,
    tsc_hz: float | None = None,
    record_bytes: int = RECORD_BYTES,
) -> dict[str, object]:
    """Write the trace at ``pt_path`` and the code it ran as the perf.data
    ``out_perf_data`` (see the module doc).

    ``elf``: ``(path, base)`` per ELF file (base: where its lowest segment
    loads, None: its link addresses, as ptxed's ``--elf file[:base]``);
    ``raw``: ``(file, offset, size, address)`` per raw code section (size
    None: to the file's end, as ptxed's ``--raw``); ``config``: the trace's
    MTC frequency, nominal frequency and CPUID 0x15 ratio; ``cpu``, ``tid``,
    ``comm``: the CPU, thread (and process) and name the records give the
    trace.  Paths are written absolute, so the file is usable from any
    directory on a shared file system.  Returns what was written: trace
    bytes, records, whether the trace is timed."""
    config = config or PtConfig()
    pt_path = Path(pt_path)
    try:
        buf = map_file(pt_path)
    except OSError as e:
        raise WrapError(f"{pt_path}: {e.strerror or e}") from None
    if record_bytes < 4096:
        raise WrapError(f"record_bytes {record_bytes}: too small (at least 4096)")
    # A record cut where no PSB is gets no padding (perf pads to 8 bytes).
    record_bytes -= record_bytes % 8
    maps: list[tuple[int, int, int, str]] = []
    for path, base in elf:
        p = os.path.abspath(path)
        maps += [(a, n, off, p) for a, n, off in _elf_maps(p, base)]
    for path, offset, size, address in raw:
        p = os.path.abspath(path)
        try:
            total = os.stat(p).st_size
        except OSError as e:
            raise WrapError(f"{path}: {e.strerror or e}") from None
        n = total - offset if size is None else size
        if offset < 0 or n <= 0 or offset + n > total:
            raise WrapError(f"{path}: section {offset:#x}+{n:#x} is outside the file "
                            f"({total} bytes)")  # fmt: skip
        maps.append((address, n, offset, p))
    if not maps:
        raise WrapError("no code: give at least one ELF or raw section")
    tsc = first_tsc(buf)
    timed = tsc is not None
    if tsc_hz is None:
        tsc_hz = config.nom_freq * 100e6 if config.nom_freq else 1e9
    shift, mult = _time_conv(tsc_hz) if timed else (0, 0)
    bits = INTEL_PT_CONFIG_BITS
    attr_config = bits["pt"] | bits["branch"]
    if timed:
        attr_config |= bits["tsc"]
    if config.mtc_freq:
        attr_config |= bits["mtc"] | (config.mtc_freq << 14)
    st = SampleType
    sample_type = st.IP | st.TID | st.CPU | st.IDENTIFIER | (st.TIME if timed else 0)
    name = comm or (Path(elf[0][0]).name if elf else pt_path.name)
    pieces = split_at_psbs(buf, record_bytes)
    with PerfDataWriter(out_perf_data, cmdline=["hwtrace", "decode", "--pt", str(pt_path)]) as w:
        w.set_intel_pt(
            config=attr_config,
            sample_type=sample_type,
            time_shift=shift,
            time_mult=mult,
            time_zero=0,
            cap_user_time_zero=timed,
            tsc_ctc_ratio=(config.cpuid_0x15_ebx, config.cpuid_0x15_eax),
            max_non_turbo_ratio=config.nom_freq,
        )
        sid = SampleId(pid=tid, tid=tid, time=0, cpu=cpu)
        w.add_record(Comm(tid, tid, name[:15], True), sample_id=sid)
        for address, length, offset, path in maps:
            body = Mmap2(tid, tid, address, length, offset, prot=_PROT_RX, flags=_MAP_PRIVATE,
                         filename=path)  # fmt: skip
            w.add_record(body, sample_id=sid, misc=_MISC_USER)
        w.finished_init()
        for lo, hi in pieces:
            # The reference: a TSC near the data's, which perf extends the
            # trace's 7-byte TSC packets with.
            w.add_auxtrace(buf[lo:hi].tobytes(), tid=tid, cpu=cpu, reference=tsc or 0)
            release(buf, lo, hi)
        w.finished_round()
    return {"trace_bytes": int(buf.shape[0]), "records": len(pieces), "timed": timed,
            "first_tsc": tsc, "mappings": len(maps)}  # fmt: skip
