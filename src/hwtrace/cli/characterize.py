"""``hwtrace characterize``: trace size and temporal resolution of Intel PT
settings on a recording's executed path (:mod:`hwtrace.analysis.characterize`)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..console import NoProgress, TextTable, text_console
from .common import command_parser, output_file


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
    """Trace size and temporal resolution of Intel PT settings (PSB, MTC, CYC, return
    compression) on the path a recording executed, encoded again with each; or, given a command,
    of recordings of it made with each setting."""
    from ..analysis.characterize import CharacterizeError, default_settings, grid

    p = command_parser("hwtrace characterize", main)
    p.add_argument("-i", "--input", default="perf.data", help="the recording (perf.data)")
    r = p.add_argument_group("recording a command with each setting (after --)")
    r.add_argument("--backend", choices=("auto", "perf", "software"), default="auto",
                   help="perf with Intel PT where the CPU has it, else the software backend")  # fmt: skip
    r.add_argument("-f", "--function", action="append", default=[],
                   help="record this function (repeatable)")  # fmt: skip
    r.add_argument("--call", action="append", default=[],
                   help="record each call of this function with all it calls (repeatable)")  # fmt: skip
    r.add_argument("--keep", metavar="DIR", help="keep the recordings in DIR")
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
    g.add_argument("--cyc-thresh", help="CYC thresholds 0-15 (with CYC on; default 0)")
    p.add_argument(
        "--json", type=output_file, metavar="FILE", help="also write the outcomes as JSON"
    )
    p.add_argument(
        "--html",
        type=output_file,
        metavar="FILE",
        help="also write the plots as a self-contained page",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")
    a = p.parse_args(list(argv))
    command = [c for c in a.command if c != "--"] if a.command else []
    backend = None
    if command:
        from ..record.perf_pt import have_intel_pt

        backend = a.backend if a.backend != "auto" else "perf" if have_intel_pt() else "software"
    try:
        chosen = a.psb or a.mtc or a.cyc or a.retcomp or a.cyc_thresh
        settings = (grid(_ints(a.psb or "4096"), _ints(a.mtc or "off,3"), _bools(a.cyc or "off,on"),
                         _bools(a.retcomp or "on"), _ints(a.cyc_thresh or "0"))
                    if chosen else default_settings(hardware=backend == "perf"))  # fmt: skip
    except (ValueError, TypeError) as e:
        p.error(f"bad setting list: {e}")
    for name, value in (("--cpi", a.cpi), ("--rate", a.rate)):
        if value is not None and not 0 < value < float("inf"):  # (NaN fails it too)
            p.error(f"{name} {value}: a positive number")
    for s in settings:
        problem = s.problem(hardware=backend == "perf")
        if problem:
            p.error(problem)
    console = text_console(140)
    with _progress() as bar:
        task = bar.add_task("recording" if command else "encoding", total=len(settings))
        try:
            if command:
                outcomes, title, what, extra = _recorded(p.prog, a, command, backend, settings,
                                                         lambda: bar.advance(task))  # fmt: skip
            else:
                outcomes, title, what, extra = _encoded(p.prog, a, settings,
                                                        lambda: bar.advance(task))  # fmt: skip
        except CharacterizeError as e:
            sys.stderr.write(f"{p.prog}: {e}\n")
            return 1
    console.print(f"[bold]{title}[/]: {what}; bandwidth at {a.rate:g} instructions/s")
    table = TextTable()
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
             "cyc_thresh": o.setting.cyc_thresh,
             "ret_compression": o.setting.ret_compression, "bytes": o.bytes,
             "instructions": o.instructions, "bytes_per_insn": o.bytes_per_insn,
             "mb_per_s": o.mb_per_s(a.rate), "time_updates": o.updates,
             "dic_median": o.dic_median, "dt_median_ns": o.dt_median_ns, "trf": o.trf}
            for o in outcomes]  # fmt: skip
    if a.json:
        for row in rows:  # JSON has no NaN
            row.update((k, None) for k, v in list(row.items()) if isinstance(v, float) and v != v)
        doc = {"input": title, "what": what, **extra, "rate": a.rate, "settings": rows}
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
        console.print(f"written to {a.json}")
    if a.html:
        from ..export.html import plots_page, write_page

        write_page(a.html, plots_page(
            _plots(outcomes), f"hwtrace characterize: {title}",
            f"{what}, bandwidth at {a.rate:g} insn/s",
            facts=[_instructions_fact(outcomes), ["settings", str(len(outcomes))],
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


def _progress():
    """The settings' progress bar on stderr, when it is a terminal."""
    if not sys.stderr.isatty():
        return NoProgress()
    from rich.console import Console
    from rich.progress import Progress

    return Progress(console=Console(stderr=True), transient=True)


def _encoded(prog: str, a: argparse.Namespace, settings, advance):
    """The recording's path encoded again with each setting."""
    from ..analysis.characterize import CharacterizeError, characterize, path_of_perf
    from ..perf.data import PerfDataError
    from ..perf.notes import recording_notes

    try:
        path = path_of_perf(a.input, tid=a.tid, cpi=a.cpi)
    except (PerfDataError, OSError) as e:
        raise CharacterizeError(str(e)) from None
    for note in path.notes:
        sys.stderr.write(f"{prog}: warning: {note}\n")
    if a.cpi is None and recording_notes(a.input).get("clock"):
        sys.stderr.write(f"{prog}: note: {a.input} is a software recording: its times are "
                         "stepping times, give --cpi for a native speed\n")  # fmt: skip
    outcomes = characterize(path, settings, progress=lambda i: advance())
    what = (f"thread {path.tid}, {path.instructions:,} instructions in "
            f"{len(path.stretches)} stretch(es)")  # fmt: skip
    return outcomes, a.input, what, {"tid": path.tid, "instructions": path.instructions}


def _recorded(prog: str, a: argparse.Namespace, command: list[str], backend: str, settings,
              advance):  # fmt: skip
    """``command`` recorded with each setting (``hwtrace record``'s backends)
    and each recording measured as it is."""
    from ..analysis.characterize import CharacterizeError, measure_recording, rank
    from ..perf.data import PerfDataError
    from .recordcmd import record_main

    if a.cpi is not None:
        sys.stderr.write(f"{prog}: note: --cpi is for a recording encoded again; recordings "
                         "are measured with their own times\n")  # fmt: skip
    if backend == "software":
        if not (a.function or a.call):
            raise CharacterizeError("the software backend steps chosen code: give -f FUNCTION "
                                    "or --call FUNCTION")  # fmt: skip
        sys.stderr.write(f"{prog}: note: the software backend's times are stepping times\n")
    keep = a.keep
    with contextlib.ExitStack() as stack:
        where = Path(keep) if keep else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        where.mkdir(parents=True, exist_ok=True)
        outcomes = []
        for i, s in enumerate(settings):
            out = where / f"perf-{i}.data"
            argv = ["-o", str(out), "--backend", backend, "-N",
                    "--psb-period", str(s.psb_period)]  # fmt: skip
            argv += ["--no-mtc"] if s.mtc_period is None else ["--mtc-period", str(s.mtc_period)]
            argv += ["--cyc", "--cyc-thresh", str(s.cyc_thresh)] if s.cyc else []
            argv += [] if s.ret_compression else ["--noretcomp"]
            for f in a.function:
                argv += ["-f", f]
            for f in a.call:
                argv += ["--call", f]
            log = io.StringIO()
            with contextlib.redirect_stderr(log):
                status = record_main([*argv, "--", *command])
            if status != 0 or not out.exists():
                said = log.getvalue().strip().splitlines()
                raise CharacterizeError(f"recording with {s.label} failed ({status}): "
                                        + (said[-1] if said else "no message"))  # fmt: skip
            try:
                outcomes.append(measure_recording(str(out), s, tid=a.tid))
            except (PerfDataError, OSError) as e:
                raise CharacterizeError(f"{out}: {e}") from None
            advance()
        rank(outcomes)
    if keep:
        sys.stderr.write(f"{prog}: recordings kept in {keep} (perf-N.data, in table order)\n")
    what = (f"{len(outcomes)} recordings with backend {backend}, "
            f"{sum(o.instructions for o in outcomes):,} instructions in all")  # fmt: skip
    return outcomes, " ".join(command), what, {"backend": backend, "command": command}


def _instructions_fact(outcomes) -> list[str]:
    counts = {o.instructions for o in outcomes}
    if len(counts) == 1:
        return ["instructions", f"{counts.pop():,}"]
    mean = sum(o.instructions for o in outcomes) // len(outcomes)
    return ["instructions (mean per recording)", f"{mean:,}"]


def _ns(v: float) -> str:
    if v != v:
        return "unknown"  # the time never changed
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
    # The CYC thresholds tried with the most settings otherwise the same.
    groups: dict[tuple, list] = {}
    for o in outcomes:
        if o.setting.cyc:
            s = o.setting
            groups.setdefault((s.psb_period, s.mtc_period, s.ret_compression), []).append(o)
    if groups:
        (psb, mtc, _), chosen = max(groups.items(), key=lambda kv: len(kv[1]))
        sweep(chosen, "cyc_thresh", f"CYC threshold (PSB {psb}, MTC {'off' if mtc is None else mtc})",
              "CYC threshold (a CYC after 2**(n-1) cycles)", False, True)  # fmt: skip
    plots.append({"title": "size against resolution", "x": "bytes per instruction",
                  "y": "TRF (0-100, lower: finer)", "logx": True, "logy": False, "scatter": True,
                  "series": [series(f"CYC {'on' if cyc else 'off'}",
                                    [[o.bytes_per_insn, o.trf, o.setting.label]
                                     for o in outcomes if o.setting.cyc == cyc])
                             for cyc in (False, True)
                             if any(o.setting.cyc == cyc for o in outcomes)]})  # fmt: skip
    return plots
