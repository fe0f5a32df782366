"""Reading a latency profile: histograms, summaries, the longest intervals,
as text and as JSON."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..textout import fit_paths
from .latency import (
    A_COUNT,
    A_MAX_DIC,
    A_MAX_DT,
    A_MIN_DIC,
    A_MIN_DT,
    A_NEGATIVE,
    A_SUM_DIC,
    A_SUM_DT,
    R_CALL,
    Intervals,
    LatencyResult,
    bucket_bounds,
)


def log2_histogram(counts: np.ndarray) -> list[tuple[int, int, int]]:
    """bcc's power-of-two buckets from a profile's fine histogram
    (:func:`~hwtrace.analysis.latency.bucket_of`): ``(low, high, count)``
    with ``low <= v <= high``, from 0 up to the largest value's bucket."""
    nz = np.flatnonzero(counts)
    if nz.shape[0] == 0:
        return []
    low, _ = bucket_bounds(np.arange(counts.shape[0]))
    power = np.where(low > 0, np.floor(np.log2(np.maximum(low, 1))).astype(np.int64) + 1, 0)
    merged = np.bincount(power, weights=counts, minlength=int(power[nz[-1]]) + 1)
    out = []
    for b, c in enumerate(merged[: int(power[nz[-1]]) + 1].tolist()):
        lo = 0 if b == 0 else 1 << (b - 1)
        hi = 0 if b == 0 else (1 << b) - 1
        out.append((lo, hi, int(c)))
    return out


def histogram_text(counts: np.ndarray, label: str, width: int = 40) -> str:
    """A bcc-style text histogram of a fine histogram."""
    rows = log2_histogram(counts)
    if not rows:
        return f"{label}: no intervals\n"
    peak = max(c for _, _, c in rows) or 1
    lines = [f"{label:>24} : count     distribution"]
    for low, high, count in rows:
        bar = "*" * round(width * count / peak)
        lines.append(f"{low:>10} -> {high:<10} : {count:<9} |{bar:<{width}}|")
    return "\n".join(lines) + "\n"


def _median(counts: np.ndarray) -> float:
    """The median of a fine histogram, as its bucket's middle (within the
    bucket's 12.5%)."""
    total = int(counts.sum())
    if not total:
        return -1.0
    b = int(np.searchsorted(np.cumsum(counts), (total + 1) // 2))
    low, high = bucket_bounds(np.array([b]))
    return float(low[0] + high[0]) / 2


@dataclass
class Summary:
    count: int
    dt_min: int
    dt_median: float
    dt_mean: float
    dt_max: int
    dic_min: int
    dic_median: float
    dic_mean: float
    dic_max: int
    resolution_median: float  # over the intervals kept; -1 when none is known
    exact_medians: bool  # from every interval (else from the histograms)
    backwards: int  # intervals whose time went backwards (no Δt)


def summarize(result: LatencyResult, kind: int) -> Summary | None:
    """Totals of the intervals of ``kind`` (:data:`R_PAIR`, :data:`R_CALL`)."""
    a = result.totals[kind]
    n = int(a[A_COUNT])
    if not n:
        return None
    iv = result.intervals.select(result.intervals.kind == kind)
    res = iv.resolution[iv.resolution >= 0]
    timed = n - int(a[A_NEGATIVE])
    if result.every_interval:
        ok = iv.dt >= 0
        dt_med = float(np.median(iv.dt[ok])) if ok.any() else -1.0
        dic_med = float(np.median(iv.dic))
    else:
        dt_med = _median(result.histograms[kind, 0])
        dic_med = _median(result.histograms[kind, 1])
    return Summary(
        n, int(a[A_MIN_DT]), dt_med, float(a[A_SUM_DT]) / max(timed, 1), int(a[A_MAX_DT]),
        int(a[A_MIN_DIC]), dic_med, float(a[A_SUM_DIC]) / n, int(a[A_MAX_DIC]),
        float(np.median(res)) if res.shape[0] else -1.0, result.every_interval,
        int(a[A_NEGATIVE]),
    )  # fmt: skip


def longest(iv: Intervals, n: int) -> Intervals:
    """The ``n`` longest intervals (by time, then instructions)."""
    order = np.lexsort((-iv.dic, -iv.dt))[:n]
    return iv.select(order)


Namer = Callable[[int], str]


def path_text(result: LatencyResult, path: int, name: Namer) -> str:
    """``outer;inner`` call path where an interval opened ("?" unknown)."""
    if not result.path_addresses(int(path)):
        return "?"
    return ";".join(result.path_names(int(path), name))


def to_json(result: LatencyResult, name: Namer, unit: str, kind: int) -> dict:
    """Everything a profile found about intervals of ``kind``, as plain
    data (every interval when the profile kept them all, else the longest)."""
    iv = result.intervals.select(result.intervals.kind == kind)
    markers = [m.name for m in result.patterns.markers]
    s = summarize(result, kind)
    return {
        "unit": unit,
        "instructions": result.instructions,
        "markers": dict(zip(markers, result.marker_counts.tolist(), strict=True)),
        "repeated_opens": result.repeated_opens,
        "unmatched_closes": result.unmatched_closes,
        "dropped_for_gaps": result.gapped + result.gapped_calls,
        "frames_left_without_return": result.skipped_frames,
        "missing_symbols": sorted(result.missing_symbols),
        "summary": None if s is None else s.__dict__,
        "dt_histogram": log2_histogram(result.histograms[kind, 0]),
        "dic_histogram": log2_histogram(result.histograms[kind, 1]),
        "every_interval": result.every_interval,
        "intervals": [
            {
                "kind": "call" if int(iv.kind[j]) == R_CALL else "pair",
                "key": int(iv.key[j]),
                "cpu": int(iv.cpu[j]),
                "open": markers[int(iv.open[j])],
                "close": markers[int(iv.close[j])],
                "t_open": int(iv.t_open[j]),
                "dt": int(iv.dt[j]),
                "resolution": int(iv.resolution[j]),
                "dic": int(iv.dic[j]),
                "path": path_text(result, int(iv.path[j]), name),
            }
            for j in range(len(iv))
        ],
    }


def render(
    result: LatencyResult,
    name: Namer,
    unit: str,
    kind: int,
    top: int,
    key_label: str,
    title: str,
    console,
) -> None:
    """The intervals of ``kind`` of a profile as text on ``console`` (see
    :func:`hwtrace.console.text_console`)."""
    from ..console import TextTable, escape

    iv = result.intervals.select(result.intervals.kind == kind)
    markers = [m.name for m in result.patterns.markers]
    s = summarize(result, kind)
    console.print(f"[bold]{title}[/]: {result.instructions:,} instructions, "
                  f"{s.count if s else 0:,} intervals")  # fmt: skip
    counts = TextTable(title="marker occurrences")
    counts.add_column("marker")
    counts.add_column("count", justify="right")
    for m, c in zip(markers, result.marker_counts.tolist(), strict=True):
        counts.add_row(escape(m), f"{c:,}")
    console.print(counts)
    dropped = result.gapped + result.gapped_calls
    notes = [
        ("repeated opens (the first stands)", result.repeated_opens),
        ("closes with nothing open", result.unmatched_closes),
        ("dropped: tracing stopped inside (code not traced ran, or the trace has a gap)", dropped),
        ("calls left without a return", result.skipped_frames),
        ("time went backwards (no Δt)", s.backwards if s else 0),
    ]
    for text, value in notes:
        if value:
            console.print(f"{text}: {value:,}")
    for sym in sorted(result.missing_symbols):
        console.print(f"[yellow]warning[/]: no symbol {sym!r} in the decoded code")
    if s is None:
        console.print("no interval closed")
        return
    approx = "" if s.exact_medians else "≈"
    res = f"±{s.resolution_median:,.0f}" if s.resolution_median >= 0 else "unknown"
    console.print(
        f"Δt ({unit}): min {s.dt_min:,}  median {approx}{s.dt_median:,.0f}  "
        f"mean {s.dt_mean:,.1f}  max {s.dt_max:,}   (median resolution {res})"
    )
    console.print(f"ΔIC (instructions): min {s.dic_min:,}  median {approx}{s.dic_median:,.0f}  "
                  f"mean {s.dic_mean:,.1f}  max {s.dic_max:,}")  # fmt: skip
    console.print(histogram_text(result.histograms[kind, 0], f"Δt ({unit})"), markup=False)
    console.print(histogram_text(result.histograms[kind, 1], "ΔIC (instructions)"), markup=False)
    table = TextTable(title=f"the {min(top, len(iv))} longest")
    columns = ("opened at", key_label, "cpu", f"Δt ({unit})", "±", "ΔIC", "open → close",
               "call path where it opened")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="left" if col.startswith(("open", "call")) else "right")
    cells = []
    for j in range(len(lg := longest(iv, top))):
        r = int(lg.resolution[j])
        cells.append((
            f"{int(lg.t_open[j]):,}", str(int(lg.key[j])),
            str(int(lg.cpu[j])) if lg.cpu[j] >= 0 else "-", f"{int(lg.dt[j]):,}",
            f"{r:,}" if r >= 0 else "?", f"{int(lg.dic[j]):,}",
            f"{markers[int(lg.open[j])]} → {markers[int(lg.close[j])]}",
        ))  # fmt: skip
    # Long paths lose frames in the middle, never the innermost.
    paths = fit_paths([path_text(result, int(p), name) for p in lg.path.tolist()],
                      columns[:-1], cells, console.width)  # fmt: skip
    for row, path in zip(cells, paths, strict=True):
        table.add_row(*row[:-1], escape(row[-1]), escape(path))
    console.print(table)


__all__ = [
    "Summary",
    "histogram_text",
    "log2_histogram",
    "longest",
    "path_text",
    "render",
    "summarize",
    "to_json",
]
