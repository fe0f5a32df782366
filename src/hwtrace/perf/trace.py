"""Decoding the Intel PT of a perf.data, attributed to processes and threads.

Each AUX queue (one per CPU, or per thread with ``--per-thread``) is decoded
on its own; at every enabling of tracing the sideband says which thread ran
then and so which image the decoder must walk (see
:func:`hwtrace.pt.decode.decode_trace`'s ``context``).  Blocks then get their
perf time, CPU, thread and process as columns, and a symbol on demand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..image import Image
from ..image.symbols import SymbolTable
from ..pt.config import PtConfig
from ..pt.decode import FlowResult, decode_trace
from ..pt.events import Ev
from .data import PerfData, PerfDataError
from .features import Feature
from .kernel import KernelCode
from .records import RecordType as RT
from .sideband import BinaryLocator, CodeRevision, Sideband, TscConversion

_SIDEBAND = (
    RT.MMAP, RT.MMAP2, RT.COMM, RT.FORK, RT.EXIT, RT.ITRACE_START, RT.SWITCH,
    RT.SWITCH_CPU_WIDE, RT.KSYMBOL, RT.BPF_EVENT, RT.TEXT_POKE,
)  # fmt: skip
_MISC_CPUMODE_KERNEL = 1


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
            sb.add_revision(CodeRevision(t, "text_poke", b.addr, len(b.new), "", b.old, b.new))
    return sb


def pt_config_of(data: PerfData) -> PtConfig:
    """The decoder configuration a perf.data's Intel PT was recorded with."""
    pt = data.intel_pt
    config = PtConfig()
    if pt is None:
        return config
    attr = next((a.attr for a in data.attrs if a.attr.type == pt.pmu_type), None)
    if attr is not None and pt.mtc_freq_bits:
        shift = (pt.mtc_freq_bits & -pt.mtc_freq_bits).bit_length() - 1
        config.mtc_freq = (attr.config & pt.mtc_freq_bits) >> shift
    config.nom_freq = pt.max_non_turbo_ratio or 0
    config.cpuid_0x15_eax = pt.tsc_ctc_ratio_d or 0
    config.cpuid_0x15_ebx = pt.tsc_ctc_ratio_n or 0
    return config


@dataclass
class QueueFlow:
    """One AUX queue's decoded flow with per-block attribution columns."""

    cpu: int  # -1 for a per-thread queue
    tid: int  # -1 for a per-CPU queue
    flow: FlowResult
    block_ns: np.ndarray  # perf time of each block (int64; -1: no time)
    block_duration: np.ndarray  # ns until the next block or until tracing stopped
    block_tid: np.ndarray  # int64, -1 where unknown
    block_pid: np.ndarray
    symbols: list[SymbolTable]  # per image index of ``flow.images``
    trace_bytes: int = 0
    _instructions: np.ndarray | None = field(default=None, repr=False)

    def instructions(self) -> np.ndarray:
        """Every instruction's address (expanded once, then kept)."""
        if self._instructions is None:
            self._instructions = self.flow.instructions()
        return self._instructions


@dataclass
class PerfFlow:
    """The decoded Intel PT of a perf.data."""

    queues: list[QueueFlow]
    sideband: Sideband
    conversion: TscConversion | None
    problems: list[str] = field(default_factory=list)

    @property
    def n_gaps(self) -> int:
        return sum(len(q.flow.gaps) for q in self.queues)

    def blocks(self) -> dict[str, np.ndarray]:
        """All queues' blocks as columns, in time order: ``ip``, ``ninsn``,
        ``ns``, ``duration`` (ns), ``cpu``, ``tid``, ``pid``, ``queue`` and ``symbol`` (index into
        :meth:`symbol_names`, -1 where none covers the address)."""
        cols: dict[str, list[np.ndarray]] = {
            k: [] for k in ("ip", "ninsn", "ns", "duration", "cpu", "tid", "pid", "queue", "symbol")
        }
        names: dict[str, int] = {}
        self._names = []
        for qi, q in enumerate(self.queues):
            f = q.flow
            n = f.block_ip.shape[0]
            cols["ip"].append(f.block_ip)
            cols["ninsn"].append(f.block_ninsn.astype(np.int64))
            cols["ns"].append(q.block_ns)
            cols["duration"].append(q.block_duration)
            cols["cpu"].append(np.full(n, q.cpu, np.int64))
            cols["tid"].append(q.block_tid)
            cols["pid"].append(q.block_pid)
            cols["queue"].append(np.full(n, qi, np.int64))
            cols["symbol"].append(self._symbolize(q, names))
        out = {k: (np.concatenate(v) if v else np.zeros(0, np.int64)) for k, v in cols.items()}
        order = np.argsort(out["ns"], kind="stable")
        return {k: v[order] for k, v in out.items()}

    def _symbolize(self, q: QueueFlow, names: dict[str, int]) -> np.ndarray:
        f = q.flow
        which = f.block_image if f.block_image is not None else np.zeros(f.block_ip.shape, int)
        out = np.full(f.block_ip.shape[0], -1, np.int64)
        for image_index in np.unique(which).tolist():
            sel = np.flatnonzero(which == image_index)
            table = q.symbols[image_index]
            index, _ = table.lookup(f.block_ip[sel])
            uniq, inverse = np.unique(index, return_inverse=True)
            ids = []
            for u in uniq.tolist():
                if u < 0:
                    ids.append(-1)
                    continue
                name = table.qualified_name(u)
                if name not in names:
                    names[name] = len(self._names)
                    self._names.append(name)
                ids.append(names[name])
            out[sel] = np.array(ids, np.int64)[inverse]
        return out

    def symbol_names(self) -> list[str]:
        """Names behind the ``symbol`` column of the last :meth:`blocks`."""
        return list(getattr(self, "_names", []))


def decode_perf(
    data: PerfData,
    locator: BinaryLocator | None = None,
    *,
    kernel: KernelCode | None = None,
    jobs: int = 1,
    sideband: Sideband | None = None,
) -> PerfFlow:
    """Decode every AUX queue of ``data`` against the sideband's images.

    ``kernel`` is the kernel's code (:mod:`.kernel`: a ``--kcore``
    directory, a vmlinux or kallsyms); without it, kernel modules the
    sideband maps as files are used where the locator finds them.
    ``sideband``: the model of ``data``'s sideband, when the caller already
    built it (:func:`sideband_of`).
    """
    locator = locator or BinaryLocator()
    sb = sideband if sideband is not None else sideband_of(data)
    pt = data.intel_pt
    problems: list[str] = [str(e) for e in data.errors]
    if pt is None:
        problems.append(f"{data.path}: no Intel PT AUXTRACE_INFO: nothing to decode")
        return PerfFlow([], sb, None, problems)
    conv = TscConversion(pt.time_shift, pt.time_mult, pt.time_zero) if pt.time_mult else None
    config = pt_config_of(data)
    kernel = kernel if kernel is not None else sb.kernel_image(locator)
    if sb.kernel_mappings and (kernel is None or not len(kernel.image)):
        problems.append(
            f"{data.path}: no kernel code: traced kernel code shows as gaps"
            + ("" if kernel is not None else " and without names")
            + "; give a --kcore directory or a --vmlinux"
            + ("" if kernel is not None else " (or --kallsyms for names)")
        )

    queues: dict[tuple[int, int, int], list] = {}
    for aux in data.auxtrace():
        key = (aux.idx, aux.cpu, aux.tid) if pt.per_cpu_mmaps else (aux.idx, -1, aux.tid)
        queues.setdefault(key, []).append(aux)

    out: list[QueueFlow] = []
    for (_, cpu, tid), parts in sorted(queues.items()):
        parts.sort(key=lambda a: a.offset)
        trace = b"".join(bytes(a.data) for a in parts)
        out.append(_decode_queue(trace, cpu, tid, sb, conv, config, locator, kernel, jobs))
    problems += list(locator.problems.values())
    return PerfFlow(out, sb, conv, problems)


def _decode_queue(trace, cpu, tid, sb, conv, config, locator, kernel, jobs) -> QueueFlow:
    images: dict[tuple[int, int, int], tuple[Image, SymbolTable]] = {}
    symbols_of: dict[int, SymbolTable] = {}
    last_ns = [0]

    def image_for(ns: int) -> Image:
        t = tid if tid >= 0 else int(sb.threads_on(cpu, np.array([ns]))[0])
        pid = sb.pid_of(t)
        space = sb.space_at(pid, ns)
        live = len(space.mappings_at(ns)) if space is not None else 0
        key = (pid, id(space), live)
        got = images.get(key)
        if got is None:
            if space is None:
                got = (
                    kernel.image if kernel is not None else Image("empty"),
                    kernel.symbols if kernel is not None else SymbolTable.empty(),
                )
            else:
                got = space.image(locator, ns, kernel)
            images[key] = got
            symbols_of[id(got[0])] = got[1]
        return got[0]

    def context(tsc: int | None, ip: int) -> Image:
        if tsc is not None and conv is not None:
            last_ns[0] = int(conv.to_ns(tsc))
        return image_for(last_ns[0])

    first = image_for(0 if conv is None else last_ns[0])
    flow = decode_trace(trace, first, config, jobs=jobs, context=context)
    images_used = flow.images or [first]
    symbols = [symbols_of.get(id(im), SymbolTable.empty()) for im in images_used]
    if conv is not None:
        ns = np.asarray(conv.to_ns(flow.block_time), dtype=np.int64)
        ns = np.where(flow.block_time == 0, -1, ns)
    else:
        ns = np.full(flow.block_ip.shape[0], -1, np.int64)
    if tid >= 0:
        tids = np.full(ns.shape[0], tid, np.int64)
    else:
        tids = sb.threads_on(cpu, np.maximum(ns, 0))
    uniq, inverse = np.unique(tids, return_inverse=True)
    pids = np.array([sb.pid_of(int(t)) if t >= 0 else -1 for t in uniq], np.int64)[inverse]
    duration = _durations(flow, ns, conv)
    return QueueFlow(cpu, tid, flow, ns, duration, tids, pids, symbols, len(trace))


def _durations(flow: FlowResult, ns: np.ndarray, conv: TscConversion | None) -> np.ndarray:
    """How long each block ran: until the next block, or until tracing
    stopped where it stopped in between (untraced time is nobody's)."""
    if ns.shape[0] == 0:
        return ns.copy()
    dur = np.diff(ns, append=ns[-1])
    ev = flow.event_columns()
    stop = np.isin(ev["type"], (int(Ev.DISABLED), int(Ev.ASYNC_DISABLED)))
    k = ev["block"][stop] - 1
    t = ev["time"][stop]
    ok = (k >= 0) & (k < ns.shape[0])
    k, t = k[ok], t[ok]
    if conv is not None:
        dur[k] = np.where(t > 0, np.asarray(conv.to_ns(t), np.int64) - ns[k], 0)
    else:
        dur[k] = 0
    return np.where((dur > 0) & (ns >= 0), dur, 0)
