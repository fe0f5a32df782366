"""Trace size and temporal resolution of Intel PT settings, for one
executed path.

The path a recording executed (per thread, cut where its trace has a gap)
is encoded again with each setting (PSB period, MTC period, CYC, return
compression) by :func:`hwtrace.pt.encode.encode_path`, with each
instruction's cost in core cycles taken from the recording's times (spread
evenly over each block's instructions) or given as a fixed CPI; the
stream is decoded back, and the setting is described by

* its size: bytes per instruction, and MB/s at a given instruction rate;
* its temporal resolution: the instructions (ΔIC) and the time (Δt)
  between consecutive changes of the decoded time, their medians, and the
  thesis' TRF: ``p = median ΔIC × median Δt`` normalised to 0-100 over the
  settings compared (Sharma 2017, §5.5; lower is finer).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


class CharacterizeError(Exception):
    """A path that cannot be characterised (one line)."""


@dataclass(frozen=True)
class Setting:
    """One Intel PT configuration: ``psb_period`` (bytes), ``mtc_period``
    (MTC every 2**n crystal-clock ticks; None: no MTC), ``cyc``,
    ``ret_compression``."""

    psb_period: int
    mtc_period: int | None
    cyc: bool
    ret_compression: bool = True

    @property
    def label(self) -> str:
        mtc = "off" if self.mtc_period is None else str(self.mtc_period)
        return (f"psb {self.psb_period} mtc {mtc} cyc {'on' if self.cyc else 'off'}"
                + ("" if self.ret_compression else " noretcomp"))  # fmt: skip


@dataclass
class ExecutedPath:
    """Stretches of one thread's executed instructions (``ips``) with each
    instruction's cost in core cycles (``cycles``), the code (``image``)
    and the TSC rate (``tsc_hz``)."""

    stretches: list[tuple[np.ndarray, np.ndarray]]
    image: object
    tsc_hz: float
    tid: int = -1
    notes: list[str] = field(default_factory=list)
    ctc_ratio: int = 4  # TSC ticks per crystal-clock tick

    @property
    def instructions(self) -> int:
        return sum(ips.shape[0] for ips, _ in self.stretches)


@dataclass
class Outcome:
    """A setting's trace size and temporal resolution on a path."""

    setting: Setting
    bytes: int
    instructions: int
    updates: int  # changes of the decoded time
    dic_median: float  # instructions between changes
    dt_median_ns: float  # time between changes
    trf: float = 0.0

    @property
    def bytes_per_insn(self) -> float:
        return self.bytes / self.instructions if self.instructions else 0.0

    def mb_per_s(self, rate: float) -> float:
        """Trace bandwidth at ``rate`` instructions per second (MB/s)."""
        return self.bytes_per_insn * rate / 1e6

    @property
    def p(self) -> float:
        return self.dic_median * self.dt_median_ns


def default_settings() -> list[Setting]:
    """The thesis' three sweeps and return compression: PSB period with MTC
    and CYC off; MTC period with PSB at 4 KiB and CYC off; CYC off and on;
    return compression off."""
    out = [Setting(psb, None, False) for psb in (256, 1024, 4096, 16384, 65536)]
    out += [Setting(4096, mtc, False) for mtc in (0, 3, 6, 9, 12)]
    out += [Setting(4096, 3, True), Setting(4096, None, True), Setting(4096, 3, False, False)]
    return list(dict.fromkeys(out))


def grid(psb: Sequence[int], mtc: Sequence[int | None], cyc: Sequence[bool],
         retcomp: Sequence[bool] = (True,)) -> list[Setting]:  # fmt: skip
    """Every combination of the values given."""
    return [Setting(p, m, c, r) for p, m, c, r in itertools.product(psb, mtc, cyc, retcomp)]


def _resolution(data: bytes, image, config, tsc_hz: float) -> tuple[int, np.ndarray, np.ndarray]:
    """The decoded time's changes: their number, the instructions and the
    time (ns) between consecutive ones."""
    from ..pt.decode import decode_trace

    res = decode_trace(data, image, config)
    t = res.block_time.astype(np.int64)
    n = res.block_ninsn.astype(np.int64)
    if not t.shape[0]:
        return 0, np.zeros(0, np.int64), np.zeros(0, np.float64)
    pos = np.cumsum(n) - n  # each block's first instruction
    change = np.flatnonzero(np.diff(t) != 0) + 1
    dic = np.diff(pos[change])
    dt = np.diff(t[change]) * (1e9 / tsc_hz)
    return int(change.shape[0]), dic, dt


def characterize(
    path: ExecutedPath, settings: Sequence[Setting], *, progress=None
) -> list[Outcome]:
    """Each setting's outcome on ``path`` (``progress(i)`` after each)."""
    from ..pt.encode import encode_path

    ctc_ratio = path.ctc_ratio

    out = []
    for i, s in enumerate(settings):
        size = insns = updates = 0
        dics, dts = [], []
        for ips, cycles in path.stretches:
            options = dict(psb_period=s.psb_period, tsc=1 << 32, mtc_freq=s.mtc_period, cyc=s.cyc,
                           ret_compression=s.ret_compression, ctc_ratio=ctc_ratio)  # fmt: skip
            try:
                enc = encode_path(ips, path.image, cycles=cycles, **options)
            except ValueError as e:
                if "next IP is not known" not in str(e) or ips.shape[0] < 2:
                    raise CharacterizeError(f"the path cannot be encoded again: {e}") from None
                # It ends in a branch whose target the recording does not
                # have: without that last instruction.
                ips, cycles = ips[:-1], cycles[:-1]
                enc = encode_path(ips, path.image, cycles=cycles, **options)
            size += len(enc.data)
            insns += ips.shape[0]
            k, dic, dt = _resolution(enc.data, path.image, enc.config, path.tsc_hz)
            updates += k
            dics.append(dic)
            dts.append(dt)
        dic = np.concatenate(dics) if dics else np.zeros(0)
        dt = np.concatenate(dts) if dts else np.zeros(0)
        if dic.shape[0]:
            out.append(
                Outcome(s, size, insns, updates, float(np.median(dic)), float(np.median(dt)))
            )
        else:
            # The time never changed inside the path: it resolves nothing finer
            # than the whole path.
            total = sum(int(c.sum()) for _, c in path.stretches) * 1e9 / path.tsc_hz
            out.append(Outcome(s, size, insns, updates, float(insns), total))
        if progress is not None:
            progress(i)
    ps = np.array([o.p for o in out])
    if ps.shape[0]:
        lo, hi = float(ps.min()), float(ps.max())
        for o in out:
            o.trf = 100.0 * (o.p - lo) / (hi - lo) if hi > lo else 0.0
    return out


def path_of_perf(perf_data: str, *, tid: int | None = None, cpi: float | None = None,
                 locator=None) -> ExecutedPath:  # fmt: skip
    """The executed path of one thread of a perf.data (``tid``; default: the
    one with the most instructions), its stretches between gaps, each
    instruction's cycles from the recorded times (or ``cpi``)."""
    from ..perf.data import read_perf_data
    from ..perf.trace import stream_perf, tsc_conversion_of

    data = read_perf_data(perf_data)
    conv = tsc_conversion_of(data)
    tsc_hz = 1e9 * (1 << conv.time_shift) / conv.time_mult if conv is not None else 1e9
    per: dict[int, list] = {}

    def feed(b) -> None:
        if not len(b):
            return
        ips = b.instructions()
        n = b.ninsn.astype(np.int64)
        for t in np.unique(b.tid).tolist():
            sel = b.tid == t
            keep = np.repeat(sel, n)
            per.setdefault(int(t), []).append((
                ips[keep], np.repeat(b.ns[sel].astype(np.int64), n[sel]),
                np.repeat(b.gap[sel].astype(bool) & True, n[sel]) & _firsts(n[sel]),
                b.queue, np.unique(b.image[sel]).tolist(),
            ))  # fmt: skip

    flow = stream_perf(data, feed, locator)
    if not per:
        raise CharacterizeError(f"{perf_data}: no instruction decoded")
    if tid is None:
        tid = max(per, key=lambda k: sum(p[0].shape[0] for p in per[k]))
    if tid not in per:
        raise CharacterizeError(f"{perf_data}: thread {tid} ran no traced instruction")
    parts = per[tid]
    images = {(id(q), im) for _, _, _, q, ims in parts for im in ims}
    if len(images) != 1:
        raise CharacterizeError(f"thread {tid} ran in {len(images)} process images; "
                                "characterise one (a thread before or after its exec)")  # fmt: skip
    q, im = parts[0][3], parts[0][4][0]
    ips = np.concatenate([p[0] for p in parts])
    ns = np.concatenate([p[1] for p in parts])
    gap = np.concatenate([p[2] for p in parts])
    notes = [str(x) for x in flow.problems]
    cuts = np.flatnonzero(gap)
    stretches = []
    for lo, hi in itertools.pairwise([0, *cuts.tolist(), ips.shape[0]]):
        if hi > lo:
            part = ips[lo:hi]
            cycles = (
                _cycles(ns[lo:hi], tsc_hz)
                if cpi is None
                else np.full(hi - lo, max(round(cpi), 1), np.int64)
            )
            stretches.append((np.ascontiguousarray(part), cycles))
    pt = data.intel_pt
    ratio = pt.tsc_ctc_ratio_n // max(pt.tsc_ctc_ratio_d, 1) if pt is not None else 0
    return ExecutedPath(stretches, q.images[im], tsc_hz, tid, notes, max(ratio, 1) if ratio else 4)


def _cycles(ns: np.ndarray, tsc_hz: float) -> np.ndarray:
    """Each instruction's cost in cycles (at the TSC's rate) from the times
    of a stretch's instructions: each time step's duration (to the next
    step) spread evenly over its instructions, at least one cycle each (the
    last step's, unknown, one each)."""
    out = np.ones(ns.shape[0], np.int64)
    change = np.flatnonzero(np.diff(ns) != 0) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [ns.shape[0]]])
    if starts.shape[0] < 2:
        return out
    duration = (ns[starts[1:]] - ns[starts[:-1]]).astype(np.float64)
    duration[(ns[starts[:-1]] < 0) | (ns[starts[1:]] < 0)] = 0  # untimed
    count = (ends - starts)[:-1]
    each = np.maximum(1, np.round(duration * tsc_hz / 1e9 / count)).astype(np.int64)
    out[: starts[-1]] = np.repeat(each, count)
    return out


def _firsts(n: np.ndarray) -> np.ndarray:
    """Per instruction: whether it is its block's first."""
    out = np.zeros(int(n.sum()), bool)
    out[np.cumsum(n) - n] = True
    return out


__all__ = [
    "CharacterizeError",
    "ExecutedPath",
    "Outcome",
    "Setting",
    "characterize",
    "default_settings",
    "grid",
    "path_of_perf",
]
