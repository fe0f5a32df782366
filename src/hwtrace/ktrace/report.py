"""What ``hwtrace trace --latency`` prints and writes: the recorded calls
(a line each, or JSON lines) and, at the end, what the kernel published in
the shared map (per-thread counts, the latency histogram)."""

from __future__ import annotations

import json
import sys
from typing import TextIO

import numpy as np

from ..kernel.syscalls import syscall_name
from .syscall_latency import HEADER_FIELDS, RECORD, STATE_FIELDS, CoopMap

__all__ = ["LatencyOutput"]


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.3f} ms"


class LatencyOutput:
    """Recorded calls to ``path`` (``*.jsonl``: JSON lines; None: a line
    each on stdout)."""

    def __init__(self, path: str | None, stream: TextIO | None = None) -> None:
        self.path = path
        self.count = 0
        if path is None:
            self.f = stream or sys.stdout
            self.json = False
        else:
            if not path.endswith((".jsonl", ".json")):
                raise OSError(f"{path}: the latency tracker writes JSON lines (*.jsonl)")
            self.f = open(path, "w")
            self.json = True

    def write(self, records: np.ndarray) -> None:
        if not records.size:
            return
        assert records.dtype == RECORD
        cols = {name: records[name].tolist() for name in RECORD.names}
        lines = []
        for i in range(records.shape[0]):
            comm = cols["comm"][i].decode("utf-8", "replace")
            nr = cols["nr"][i]
            if self.json:
                lines.append(json.dumps({
                    "enter": cols["enter"][i], "latency": cols["latency"][i],
                    "threshold": cols["threshold"][i], "nr": nr, "call": syscall_name(nr),
                    "ret": cols["ret"][i], "pid": cols["pid"][i], "tid": cols["tid"][i],
                    "cpu": cols["cpu"][i], "comm": comm, "args": cols["args"][i],
                }))  # fmt: skip
            else:
                lines.append(
                    f"{cols['enter'][i] / 1e9:17.9f} {comm:>16} {cols['pid'][i]:>7}/"
                    f"{cols['tid'][i]:<7} [{cols['cpu'][i]:03d}] {syscall_name(nr)}() = "
                    f"{cols['ret'][i]}  {_ms(cols['latency'][i])} (threshold "
                    f"{_ms(cols['threshold'][i])})"
                )
        self.f.write("\n".join(lines) + "\n")
        self.count += len(lines)

    def close(self, coop: CoopMap | None = None, *, quiet: bool = False) -> None:
        if coop is not None:
            summary = summarize(coop)
            if self.json:
                self.f.write(json.dumps({"summary": summary}) + "\n")
            if not quiet:
                sys.stderr.write(format_summary(summary))
        if self.path is not None:
            self.f.close()
        else:
            self.f.flush()


def summarize(coop: CoopMap) -> dict:
    """The kernel's published counts: totals, per-thread state, histogram."""
    head = {name: int(coop.header[k]) for k, name in enumerate(HEADER_FIELDS)
            if name not in ("magic", "version")}  # fmt: skip
    used = min(int(coop.header[HEADER_FIELDS.index("next_row")]), coop.layout.rows)
    threads = []
    for row in range(1, used):
        st = {name: int(coop.state[row, k]) for k, name in enumerate(STATE_FIELDS)}
        if st["tid"]:
            threads.append({"row": row, **st})
    hist = {f"{1 << b}": int(v) for b, v in enumerate(coop.hist.tolist()) if v}
    return {**head, "threads": threads, "histogram_ns": hist}


def format_summary(s: dict) -> str:
    out = [f"hwtrace trace: {s['calls']} system calls timed, {s['recorded']} recorded, "
           f"{s['lost']} lost"]  # fmt: skip
    if s["threads"]:
        out.append(f"  {'tid':>8} {'calls':>9} {'recorded':>9} {'max':>12} {'mean':>12}")
        for t in s["threads"]:
            mean = t["total_latency"] / t["calls"] if t["calls"] else 0
            out.append(f"  {t['tid']:>8} {t['calls']:>9} {t['recorded']:>9} "
                       f"{_ms(t['max_latency']):>12} {_ms(int(mean)):>12}")  # fmt: skip
    if s["histogram_ns"]:
        out.append("  latency (ns, at least)  calls")
        for lo, n in s["histogram_ns"].items():
            out.append(f"  {int(lo):>22}  {n}")
    return "\n".join(out) + "\n"
