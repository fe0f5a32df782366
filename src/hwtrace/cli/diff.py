"""``hwtrace diff A B``: two recordings' call-path profiles compared
(:mod:`hwtrace.analysis.diff`), e.g. the same program traced with a
software tracer enabled and disabled."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ..console import TextTable, escape, text_console
from ..textout import fit_paths
from .common import command_parser, input_dir, output_file, shown_problems
from .perfinput import decode_session, open_session


def main(argv: Sequence[str]) -> int:
    """Compare the call paths of two recordings of the same program: calls, instructions and time
    per call in each, and the paths only one of them ran."""
    from ..analysis.diff import diff_functions, diff_paths, folded_diff, path_table
    from ..analysis.feed import CallPathProfile
    from ..analysis.pathnames import PathNames

    p = command_parser("hwtrace diff", main)
    p.add_argument("a", help="the first perf.data (the baseline)")
    p.add_argument("b", help="the second perf.data")
    p.add_argument("--symfs", type=input_dir, help="look for binaries under this directory")
    p.add_argument("--by", choices=("insn", "time"), default="insn",
                   help="rank by instructions or by time")  # fmt: skip
    p.add_argument("--group", choices=("comm", "thread", "process", "cpu"), default="comm",
                   help="the root of each call path (comm: runs with other thread ids compare)")  # fmt: skip
    p.add_argument("--top", type=int, default=20, metavar="N", help="rows listed per table")
    p.add_argument(
        "--json",
        type=output_file,
        metavar="FILE",
        help="also write every path and function as JSON",
    )
    p.add_argument("--html", type=output_file, metavar="FILE",
                   help="write a self-contained HTML differential flame graph and sunburst")  # fmt: skip
    p.add_argument("--folded-diff", type=output_file, metavar="FILE",
                   help="write 'stack countA countB' lines (a differential flame graph's input)")  # fmt: skip
    a = p.parse_args(list(argv))
    tables = []
    tree = PathNames()  # (the runs' paths compare by name: one tree of names for both)
    for path in (a.a, a.b):
        args = argparse.Namespace(input=path, symfs=a.symfs, kcore=None, vmlinux=None,
                                  kallsyms=None, call=[], all=True, group=a.group)  # fmt: skip
        opened = open_session(p.prog, args)
        if opened is None:
            return 1
        paths = CallPathProfile(opened.sideband, a.group)
        try:
            flow = decode_session(p.prog, opened, paths.feed)
        finally:
            paths.close()
        for problem in shown_problems(flow.problems):
            sys.stderr.write(f"{p.prog}: warning: {path}: {problem}\n")
        result = paths.result()
        tables.append(path_table(result, paths.name, paths.group, tree, paths.names))
    ta, tb = tables
    unit = "instructions" if a.by == "insn" else "ns"
    # Wide tables when written to a file or a pipe (rich would use 80 columns).
    console = text_console(160)
    console.print(
        f"[bold]A[/] {a.a}: {len(ta)} call paths   [bold]B[/] {a.b}: {len(tb)} call paths"
    )
    ranked = {"call paths": diff_paths(ta, tb, a.by), "functions": diff_functions(ta, tb, a.by)}
    for title, rows in ranked.items():
        table = TextTable(title=f"{title}, most different {a.by} first")
        columns = (title[:-1], "calls A", "calls B", f"{unit}/call A", f"{unit}/call B",
                   "Δ/call", "Δ total", "only in")  # fmt: skip
        for col in columns:
            table.add_column(col, justify="left" if col in (title[:-1], "only in") else "right")
        cells = []
        for d in rows[: a.top]:
            per = d.delta_per_call(a.by)
            cells.append((
                str(d.total("a", "calls")), str(d.total("b", "calls")),
                _per_call(d.a, a.by), _per_call(d.b, a.by),
                f"{per:+,.1f}" if per is not None else "", f"{d.delta(a.by):+,}",
                d.only_in.upper(),
            ))  # fmt: skip
        # Long paths lose frames in the middle, never the leaf.
        keys = fit_paths([d.key for d in rows[: a.top]], columns[1:], cells, console.width)
        for key, row in zip(keys, cells, strict=True):
            table.add_row(escape(key), *row)
        console.print(table)
    if a.json:
        from ..export.callpaths import write_diff_json

        write_diff_json(a.json, {"a": a.a, "b": a.b, "by": a.by},
                        {"paths": ranked["call paths"], "functions": ranked["functions"]})  # fmt: skip
        console.print(f"written to {a.json}")
    own = "own_insn" if a.by == "insn" else "own_time"
    if a.folded_diff:
        lines = folded_diff(ta, tb, own)
        Path(a.folded_diff).write_text("".join(line + "\n" for line in lines))
        console.print(f"{len(lines)} lines written to {a.folded_diff}")
    if a.html:
        from ..export.callpaths import write_diff_page

        write_diff_page(a.html, tree, ta, tb, own, unit,
                        f"hwtrace diff: {Path(a.a).name} → {Path(a.b).name}",
                        f"call paths by {unit}; A {a.a}, B {a.b}")  # fmt: skip
        console.print(f"written to {a.html}")
    return 0


def _per_call(stats, what: str) -> str:
    """A run's per-call figure ("-": not in the run, or never called)."""
    per = stats.per_call(what) if stats is not None else None
    return f"{per:,.1f}" if per is not None else "-"


__all__ = ["main"]
