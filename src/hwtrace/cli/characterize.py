"""``hwtrace characterize``: trace size and temporal resolution of Intel PT
settings on a recording's executed path (:mod:`hwtrace.analysis.characterize`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .perfcmds import _Parser


def _ints(text: str) -> list[int | None]:
    return [None if x.strip() == "off" else int(x, 0) for x in text.split(",") if x.strip()]


def _bools(text: str) -> list[bool]:
    out = []
    for x in text.split(","):
        x = x.strip().lower()
        if x not in ("on", "off"):
            raise ValueError(f"{x!r}: on or off")
        out.append(x == "on")
    return out


def main(argv: Sequence[str]) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from ..analysis.characterize import (
        CharacterizeError,
        characterize,
        default_settings,
        grid,
        path_of_perf,
    )
    from ..perf.data import PerfDataError

    p = _Parser(
        prog="hwtrace characterize",
        description="Trace size and temporal resolution of Intel PT settings (PSB, MTC, CYC, "
        "return compression) on the path a recording executed, encoded again with each.",
    )
    p.add_argument("-i", "--input", default="perf.data", help="the recording (perf.data)")
    p.add_argument("--tid", type=int, help="the thread (default: the one that ran the most)")
    p.add_argument("--cpi", type=float,
                   help="cycles per instruction (default: from the recording's times; give it "
                   "for a software recording, whose times are stepping times)")  # fmt: skip
    p.add_argument("--rate", type=float, default=1e9, metavar="INSN_PER_S",
                   help="instructions per second the bandwidth is given at (default 1e9)")  # fmt: skip
    g = p.add_argument_group("a grid of settings instead of the default sweeps (every "
                             "combination; comma-separated values)")  # fmt: skip
    g.add_argument("--psb", help="PSB periods in bytes (default 4096)")
    g.add_argument("--mtc", help="MTC periods, off or 0-15 (default off,3)")
    g.add_argument("--cyc", help="CYC off, on (default off,on)")
    g.add_argument("--retcomp", help="return compression off, on (default on)")
    p.add_argument("--json", metavar="FILE", help="also write the outcomes as JSON")
    p.add_argument("--html", metavar="FILE", help="also write the plots as a self-contained page")
    a = p.parse_args(list(argv))
    try:
        chosen = a.psb or a.mtc or a.cyc or a.retcomp
        settings = (grid(_ints(a.psb or "4096"), _ints(a.mtc or "off,3"), _bools(a.cyc or "off,on"),
                         _bools(a.retcomp or "on")) if chosen else default_settings())  # fmt: skip
    except ValueError as e:
        p.error(f"bad setting list: {e}")
    if any(s.psb_period < 0 or (s.mtc_period is not None and not 0 <= s.mtc_period <= 15)
           for s in settings):  # fmt: skip
        p.error("PSB periods are bytes >= 0, MTC periods 0-15")
    try:
        path = path_of_perf(a.input, tid=a.tid, cpi=a.cpi)
    except (CharacterizeError, PerfDataError, OSError) as e:
        sys.stderr.write(f"{p.prog}: {e}\n")
        return 1
    for note in path.notes:
        sys.stderr.write(f"{p.prog}: warning: {note}\n")
    from ..perf.calls import recording_notes

    if a.cpi is None and recording_notes(a.input).get("clock"):
        sys.stderr.write(f"{p.prog}: note: {a.input} is a software recording: its times are "
                         "stepping times, give --cpi for a native speed\n")  # fmt: skip
    console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 140)
    try:
        with Progress(console=Console(stderr=True), transient=True,
                      disable=not sys.stderr.isatty()) as bar:  # fmt: skip
            task = bar.add_task("encoding", total=len(settings))
            outcomes = characterize(path, settings, progress=lambda i: bar.advance(task))
    except CharacterizeError as e:
        sys.stderr.write(f"{p.prog}: {e}\n")
        return 1
    console.print(f"[bold]{a.input}[/]: thread {path.tid}, {path.instructions:,} instructions in "
                  f"{len(path.stretches)} stretch(es); bandwidth at {a.rate:g} instructions/s")  # fmt: skip
    table = Table(show_edge=False)
    for col in ("setting", "bytes", "bytes/insn", "MB/s", "time updates", "median ΔIC",
                "median Δt", "TRF"):  # fmt: skip
        table.add_column(col, justify="left" if col == "setting" else "right")
    for o in outcomes:
        table.add_row(o.setting.label, f"{o.bytes:,}", f"{o.bytes_per_insn:.3f}",
                      f"{o.mb_per_s(a.rate):,.1f}", f"{o.updates:,}", f"{o.dic_median:,.1f}",
                      _ns(o.dt_median_ns), f"{o.trf:.3g}")  # fmt: skip
    console.print(table)
    rows = [{"setting": o.setting.label, "psb_period": o.setting.psb_period,
             "mtc_period": o.setting.mtc_period, "cyc": o.setting.cyc,
             "ret_compression": o.setting.ret_compression, "bytes": o.bytes,
             "instructions": o.instructions, "bytes_per_insn": o.bytes_per_insn,
             "mb_per_s": o.mb_per_s(a.rate), "time_updates": o.updates,
             "dic_median": o.dic_median, "dt_median_ns": o.dt_median_ns, "trf": o.trf}
            for o in outcomes]  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps({"input": a.input, "tid": path.tid,
                                            "instructions": path.instructions,
                                            "rate": a.rate, "settings": rows}, indent=1) + "\n")  # fmt: skip
        console.print(f"written to {a.json}")
    if a.html:
        from ..export.html import plots_page, write_page

        write_page(a.html, plots_page(
            _plots(outcomes), f"hwtrace characterize: {Path(a.input).name}",
            f"thread {path.tid}, {path.instructions:,} instructions, bandwidth at {a.rate:g} insn/s",
            facts=[["instructions", f"{path.instructions:,}"], ["settings", str(len(outcomes))],
                   ["smallest trace", f"{min(o.bytes for o in outcomes):,} bytes"],
                   ["finest median Δt", _ns(min(o.dt_median_ns for o in outcomes))]],
            table={"title": "settings", "columns": ["setting", "bytes/insn", "MB/s",
                                                     "median ΔIC", "median Δt", "TRF"],
                   "rows": [[o.setting.label, f"{o.bytes_per_insn:.3f}",
                             f"{o.mb_per_s(a.rate):,.1f}", f"{o.dic_median:,.1f}",
                             _ns(o.dt_median_ns), f"{o.trf:.3g}"] for o in outcomes]},
        ))  # fmt: skip
        console.print(f"written to {a.html}")
    return 0


def _ns(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:,.3f} ms"
    if v >= 1e3:
        return f"{v / 1e3:,.2f} µs"
    return f"{v:,.1f} ns"


def _plots(outcomes) -> list[dict]:
    """Size and resolution along each sweep the settings hold, and size
    against resolution."""
    plots = []

    def series(name, pts):
        return {"name": name, "points": sorted(pts)}

    def sweep(chosen, along: str, what: str, x: str, logx: bool, logy_size: bool) -> None:
        """Size and resolution along one setting, if it varies."""
        if len({getattr(o.setting, along) for o in chosen}) < 2:
            return
        for title, y, value, logy in (
            (f"trace size by {what}", "bytes per instruction", "bytes_per_insn", logy_size),
            (f"resolution by {what}", "median Δt (ns)", "dt_median_ns", True),
        ):
            points = [[getattr(o.setting, along), getattr(o, value)] for o in chosen]
            plots.append({"title": title, "x": x, "y": y, "logx": logx, "logy": logy,
                          "series": [series(y, points)]})  # fmt: skip

    plain = [o for o in outcomes if not o.setting.cyc and o.setting.ret_compression]
    sweep([o for o in plain if o.setting.mtc_period is None], "psb_period",
          "PSB period (MTC, CYC off)", "PSB period (bytes)", True, False)  # fmt: skip
    sweep([o for o in plain if o.setting.mtc_period is not None], "mtc_period",
          "MTC period (CYC off)", "MTC period (log2 ticks)", False, True)  # fmt: skip
    plots.append({"title": "size against resolution", "x": "bytes per instruction",
                  "y": "TRF (0-100, lower: finer)", "logx": True, "logy": False, "scatter": True,
                  "series": [series(f"CYC {'on' if cyc else 'off'}",
                                    [[o.bytes_per_insn, o.trf, o.setting.label]
                                     for o in outcomes if o.setting.cyc == cyc])
                             for cyc in (False, True)
                             if any(o.setting.cyc == cyc for o in outcomes)]})  # fmt: skip
    return plots
