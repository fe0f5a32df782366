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
  TRF of Sharma 2017: ``p = median ΔIC × median Δt`` normalised to 0-100 over the
  settings compared (Sharma 2017, §5.5; lower is finer).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..columns import distinct
from ..session import PerfSession, SessionError


class CharacterizeError(Exception):
    """A path that cannot be characterised (one line)."""


@dataclass(frozen=True)
class Setting:
    """One Intel PT configuration: ``psb_period`` (bytes), ``mtc_period``
    (MTC every 2**n crystal-clock ticks; None: no MTC), ``cyc``,
    ``ret_compression`` and ``cyc_thresh`` (a CYC only after at least
    2**(n - 1) cycles; 0: at every eligible packet)."""

    psb_period: int
    mtc_period: int | None
    cyc: bool
    ret_compression: bool = True
    cyc_thresh: int = 0

    @property
    def label(self) -> str:
        mtc = "off" if self.mtc_period is None else str(self.mtc_period)
        cyc = "on" if self.cyc else "off"
        if self.cyc and self.cyc_thresh:
            cyc += f" thresh {self.cyc_thresh}"
        return f"psb {self.psb_period} mtc {mtc} cyc {cyc}" + (
            "" if self.ret_compression else " noretcomp"
        )

    def problem(self, *, hardware: bool = False) -> str | None:
        """What is wrong with the setting (None: nothing); ``hardware``:
        also what PT hardware cannot do (PSB periods are powers of two from
        2 KiB to 64 MiB)."""
        if self.psb_period < 0:
            return f"PSB period {self.psb_period}: bytes >= 0"
        if self.mtc_period is not None and not 0 <= self.mtc_period <= 15:
            return f"MTC period {self.mtc_period}: 0-15"
        if not 0 <= self.cyc_thresh <= 15:
            return f"CYC threshold {self.cyc_thresh}: 0-15"
        p = self.psb_period
        if hardware and (p < 2048 or p > 1 << 26 or p & (p - 1)):
            return f"PSB period {p}: the hardware's are powers of two from 2048 to 2**26 bytes"
        return None


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


def default_settings(*, hardware: bool = False) -> list[Setting]:
    """Sharma's three sweeps (2017, §5.5) and return compression: PSB period with MTC
    and CYC off; MTC period with PSB at 4 KiB and CYC off; CYC off and on;
    return compression off; and CYC thresholds.  ``hardware``: PSB periods
    PT hardware has (from 2 KiB)."""
    psbs = (2048, 4096, 16384, 65536, 262144) if hardware else (256, 1024, 4096, 16384, 65536)
    out = [Setting(psb, None, False) for psb in psbs]
    out += [Setting(4096, mtc, False) for mtc in (0, 3, 6, 9, 12)]
    out += [Setting(4096, 3, True), Setting(4096, None, True), Setting(4096, 3, False, False)]
    out += [Setting(4096, 3, True, cyc_thresh=t) for t in (2, 4, 6, 8)]
    return list(dict.fromkeys(out))


def grid(psb: Sequence[int], mtc: Sequence[int | None], cyc: Sequence[bool],
         retcomp: Sequence[bool] = (True,), cyc_thresh: Sequence[int] = (0,)) -> list[Setting]:  # fmt: skip
    """Every combination of the values given (a CYC threshold only with CYC on)."""
    out = [Setting(p, m, c, r, t if c else 0)
           for p, m, c, r, t in itertools.product(psb, mtc, cyc, retcomp, cyc_thresh)]  # fmt: skip
    return list(dict.fromkeys(out))


def time_changes(ns: np.ndarray, ninsn: np.ndarray, gap: np.ndarray | None = None
                 ) -> tuple[int, np.ndarray, np.ndarray]:  # fmt: skip
    """Where a flow's decoded time changes, from its blocks' times (``ns``,
    negative: untimed), instruction counts and gaps (``gap``: the flow
    stopped before the block): the number of changes, and the instructions
    and the time between consecutive changes inside one gap-free stretch
    (in ``ns``'s unit)."""
    ns = np.asarray(ns, np.int64)
    n = np.asarray(ninsn, np.int64)
    pos = np.cumsum(n) - n  # each block's first instruction
    stretch = np.cumsum(gap.astype(np.int64)) if gap is not None else np.zeros_like(ns)
    timed = ns >= 0
    ns, pos, stretch = ns[timed], pos[timed], stretch[timed]
    if ns.shape[0] < 2:
        return 0, np.zeros(0, np.int64), np.zeros(0, np.int64)
    change = np.flatnonzero((np.diff(ns) != 0) & (np.diff(stretch) == 0)) + 1
    both = stretch[change[1:]] == stretch[change[:-1]]
    return int(change.shape[0]), np.diff(pos[change])[both], np.diff(ns[change])[both]


def _resolution(data: bytes, image, config, tsc_hz: float) -> tuple[int, np.ndarray, np.ndarray]:
    """The decoded time's changes: their number, the instructions and the
    time (ns) between consecutive ones."""
    from ..pt.decode import decode_trace

    res = decode_trace(data, image, config)
    k, dic, dt = time_changes(res.block_time.astype(np.int64), res.block_ninsn)
    return k, dic, dt * (1e9 / tsc_hz)


def characterize(
    path: ExecutedPath, settings: Sequence[Setting], *, progress=None
) -> list[Outcome]:
    """Each setting's outcome on ``path`` (``progress(i)`` after each)."""
    from ..pt.encode import classify_path, encode_path

    ctc_ratio = path.ctc_ratio
    # (each stretch's instructions classified once, for every setting)
    codes = [classify_path(ips, path.image) for ips, _ in path.stretches]

    out = []
    for i, s in enumerate(settings):
        size = insns = updates = 0
        dics, dts = [], []
        for (ips, cycles), code in zip(path.stretches, codes, strict=True):
            options = dict(psb_period=s.psb_period, tsc=1 << 32, mtc_freq=s.mtc_period, cyc=s.cyc,
                           cyc_thresh=s.cyc_thresh, ret_compression=s.ret_compression,
                           ctc_ratio=ctc_ratio)  # fmt: skip
            while True:
                try:
                    enc = encode_path(ips, code, cycles=cycles, **options)
                    break
                except ValueError as e:
                    if "next IP is not known" not in str(e) or ips.shape[0] < 2:
                        raise CharacterizeError(f"the path cannot be encoded again: {e}") from None
                    # It ends in a branch whose target the recording does
                    # not have (where tracing stopped: a system call, the
                    # jump to it): without the instructions from there.
                    ips, cycles = ips[:-1], cycles[:-1]
            size += len(enc.data)
            insns += ips.shape[0]
            k, dic, dt = _resolution(enc.data, path.image, enc.config, path.tsc_hz)
            updates += k
            dics.append(dic)
            dts.append(dt)
        # The time never changing inside the path resolves nothing finer than
        # the whole path.
        whole = sum(int(c.sum()) for _, c in path.stretches) * 1e9 / path.tsc_hz
        out.append(_outcome(s, size, insns, updates, dics, dts, whole))
        if progress is not None:
            progress(i)
    rank(out)
    return out


def _outcome(setting: Setting, size: int, insns: int, updates: int, dics: list, dts: list,
             whole_ns: float) -> Outcome:  # fmt: skip
    dic = np.concatenate(dics) if dics else np.zeros(0)
    dt = np.concatenate(dts) if dts else np.zeros(0)
    if dic.shape[0]:
        return Outcome(setting, size, insns, updates, _median(dic), _median(dt))
    return Outcome(setting, size, insns, updates, float(insns), whole_ns or float("nan"))


def _median(values: np.ndarray) -> float:
    """``np.median`` of a non-empty 1-D array (whose NaN check imports
    ``numpy.ma``, a fortieth of a second of the command's start)."""
    a = np.sort(np.asarray(values, np.float64))
    if np.isnan(a[-1]):
        return float("nan")
    half = a.shape[0] // 2
    return float(a[half]) if a.shape[0] % 2 else float((a[half - 1] + a[half]) / 2)


def rank(outcomes: Sequence[Outcome]) -> None:
    """Set each outcome's TRF: its ``p`` normalised to 0-100 over them
    (unknown, NaN, where the time never changed and its span is unknown)."""
    ps = np.array([o.p for o in outcomes])
    if ps.shape[0] and not np.isnan(ps).all():
        lo, hi = float(np.nanmin(ps)), float(np.nanmax(ps))
        for o in outcomes:
            o.trf = 100.0 * (o.p - lo) / (hi - lo) if hi > lo else 0.0
    else:
        for o in outcomes:
            o.trf = float("nan")


def _session(perf_data: str | PerfSession) -> PerfSession:
    """``perf_data`` opened, whole (not cut to recorded calls)."""
    if isinstance(perf_data, PerfSession):
        return perf_data
    try:
        return PerfSession.open(perf_data, all_calls=True)
    except SessionError as e:
        raise CharacterizeError(str(e)) from None


def measure_recording(perf_data: str | PerfSession, setting: Setting, *,
                      tid: int | None = None) -> Outcome:  # fmt: skip
    """A recording's own size and temporal resolution, as :func:`characterize`
    measures an encoded path: its Intel PT bytes (every AUXTRACE), its
    decoded instructions and the changes of their time, over every thread
    (or ``tid``).  Rank several with :func:`rank`."""
    session = _session(perf_data)
    size = int(session.data.auxtrace_columns()["size"].sum())
    per: dict[int, list[tuple[np.ndarray, ...]]] = {}

    def feed(b) -> None:
        for t in distinct(b.tid).tolist() if len(b) else []:
            if tid is None or t == tid:
                sel = b.tid == t
                per.setdefault(int(t), []).append((b.ns[sel], b.ninsn[sel], b.gap[sel]))

    session.decode(feed)
    if not per:
        what = f"thread {tid}" if tid is not None else "any thread"
        raise CharacterizeError(f"{session.path}: no instruction decoded for {what}")
    insns = updates = 0
    dics, dts = [], []
    first, last = None, None
    for parts in per.values():
        ns, n, gap = (np.concatenate([p[k] for p in parts]) for k in range(3))
        k, dic, dt = time_changes(ns, n, gap.astype(bool))
        insns += int(n.astype(np.int64).sum())
        updates += k
        dics.append(dic)
        dts.append(dt.astype(np.float64))
        timed = ns[ns >= 0].astype(np.int64)
        if timed.shape[0]:
            first = min(first, int(timed.min())) if first is not None else int(timed.min())
            last = max(last, int(timed.max())) if last is not None else int(timed.max())
    # A recording whose time never changes says nothing of its resolution.
    whole = float(last - first) if first is not None and last is not None else 0.0
    return _outcome(setting, size, insns, updates, dics, dts, whole)


def path_of_perf(perf_data: str | PerfSession, *, tid: int | None = None,
                 cpi: float | None = None) -> ExecutedPath:  # fmt: skip
    """The executed path of one thread of a perf.data (``tid``; default: the
    one with the most instructions), its stretches between gaps, each
    instruction's cycles from the recorded times (or ``cpi``)."""
    from ..perf.intelpt import tsc_conversion_of

    session = _session(perf_data)
    conv = tsc_conversion_of(session.data)
    tsc_hz = 1e9 * (1 << conv.time_shift) / conv.time_mult if conv is not None else 1e9
    per: dict[int, list] = {}

    def feed(b) -> None:
        if not len(b):
            return
        ips = b.instructions()
        n = b.ninsn.astype(np.int64)
        for t in distinct(b.tid).tolist():
            sel = b.tid == t
            keep = np.repeat(sel, n)
            per.setdefault(int(t), []).append((
                ips[keep], np.repeat(b.ns[sel].astype(np.int64), n[sel]),
                np.repeat(b.gap[sel].astype(bool) & True, n[sel]) & _firsts(n[sel]),
                b.queue, distinct(b.image[sel]).tolist(),
            ))  # fmt: skip

    flow = session.decode(feed)
    if not per:
        raise CharacterizeError(f"{session.path}: no instruction decoded")
    if tid is None:
        tid = max(per, key=lambda k: sum(p[0].shape[0] for p in per[k]))
    if tid not in per:
        raise CharacterizeError(f"{session.path}: thread {tid} ran no traced instruction")
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
    pt = session.data.intel_pt
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
