"""``hwtrace report`` and ``hwtrace script``: perf's workflow for Intel PT,
on any machine (``record`` is :mod:`.recordcmd`).

``report`` summarises a perf.data's decoded PT per process and thread;
``script`` lists it per instruction or per block like ``perf script
--itrace``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from ..session.perfflow import PerfBlocks
from ..textout import fit_paths
from .common import command_parser, output_file, shown_problems
from .perfinput import add_input_options, decode_session, open_session, warn_missing_calls

#: Blocks a batch of ``report``'s decoding holds when it needs no code runs
#: (the per-batch costs spread over more blocks; a batch of 2**17 takes
#: about the memory the stream's default 2**15 with runs does).
REPORT_BATCH_ROWS = 1 << 17

# -- report and script ----------------------------------------------------------


def report_main(argv: Sequence[str]) -> int:
    """Summarise the decoded Intel PT of a perf.data per process and thread."""
    p = command_parser("hwtrace report", report_main)
    add_input_options(p)
    p.add_argument("--top", type=int, default=10, help="functions listed per thread")
    p.add_argument("--folded", type=output_file, metavar="FILE",
                   help="write the call-path profile as folded stacks (flame graphs)")  # fmt: skip
    p.add_argument("--paths", type=output_file, metavar="FILE",
                   help="write every call path with the weight along it and below it")  # fmt: skip
    p.add_argument("--html", type=output_file, metavar="FILE",
                   help="write the call paths as a self-contained HTML flame graph and sunburst")  # fmt: skip
    p.add_argument("--timeline", type=output_file, metavar="FILE",
                   help="write every thread's calls as a timeline (Chrome trace-event JSON, "
                   "for Perfetto), with --events on the threads' tracks")  # fmt: skip
    p.add_argument("--by", choices=("insn", "time"), default="insn",
                   help="rank functions and weigh call paths by instructions or by time "
                   "(ns)")  # fmt: skip
    p.add_argument("--group", choices=("comm", "thread", "process", "cpu"), default="comm",
                   help="the root of each call path: the command, thread, process or CPU")  # fmt: skip
    from .events import add_window_options, window_gate

    add_window_options(p)
    a = p.parse_args(list(argv))
    from ..console import TextTable, escape, text_console

    def show(path, n_queues: int, profile, problems, gaps, top: int):
        """``hwtrace report``'s text: the input, its problems and gaps, and
        per thread its top functions by instructions (``--by time``: by
        time)."""
        console = text_console()
        console.print(f"[bold]{escape(str(path))}[/]: {n_queues} trace queue(s), "
                      f"{profile.instructions:,} instructions decoded, "
                      f"{len(gaps)} gap(s)")  # fmt: skip
        for problem in shown_problems(problems):
            # Escaped: ``[vdso]`` and ``[kernel.kallsyms]`` are not markup.
            console.print(f"[yellow]warning[/]: {escape(str(problem))}")
        for offset, ip, reason in gaps:
            console.print(
                f"[yellow]gap[/] at trace offset {offset:#x}, ip {ip:#x}: {escape(str(reason))}"
            )
        for th in profile.threads:
            span = th.span_ns
            console.print(
                f"\n[bold]{escape(th.comm)}[/] pid {th.pid} tid {th.tid}: {th.instructions:,} instructions"
                + (f", {span / 1e3:,.1f} µs from first to last" if span else "")
            )
            table = TextTable()
            columns = ("function", "instructions", "%", "time (µs)", "%")
            for col in columns:
                table.add_column(col, justify="left" if col == "function" else "right")
            funcs = th.top(top, a.by)
            cells = [(f"{int(fc.instructions):,}", f"{fc.instruction_share:.1f}",
                      f"{fc.time_ns / 1e3:,.1f}", f"{fc.time_share:.1f}") for fc in funcs]  # fmt: skip
            # A long name loses its middle, never the function's name at its end.
            names = fit_paths([fc.name for fc in funcs], columns[1:], cells, console.width)
            for name, row in zip(names, cells, strict=True):
                table.add_row(escape(name), *row)  # names like [vdso]!f are not markup
            console.print(table)
        return console

    if Path(a.input, "_meta.json").is_file():
        # A directory hwtrace decode wrote: the same report from its rows.
        needs = [o for o in ("folded", "paths", "html", "timeline", "window", "events", "call")
                 if getattr(a, o, None)]  # fmt: skip
        if needs:
            p.error(f"--{needs[0]} needs a perf.data, not a decode directory")
        from ..export.query import DatasetError, dataset_profile

        try:
            got = dataset_profile(a.input)
        except DatasetError as e:
            sys.stderr.write(f"{p.prog}: {e}\n")
            return 1
        path, n_queues, profile, problems, gaps = got
        show(path, n_queues, profile, problems, gaps, a.top)
        return 0
    opened = open_session(p.prog, a)
    if opened is None:
        return 1
    from ..analysis.profile import ThreadProfiler

    profiler = ThreadProfiler()
    paths = None
    if a.folded or a.paths or a.html or a.timeline:
        # (the call-path walk loads its compiled loops: only when asked for)
        from ..analysis.feed import CallPathProfile

        paths = CallPathProfile(opened.sideband, a.group, timeline=bool(a.timeline))

    def on_blocks(b: PerfBlocks) -> None:
        profiler.add_blocks(b)
        if paths is not None:
            paths.feed(b)

    gate = window_gate(p.prog, opened, a, on_blocks)
    if gate is None:
        if paths is not None:
            paths.close()
        return 1
    timeline_events = None
    if a.timeline and a.events:
        from .events import open_events

        timeline_events = open_events(p.prog, a.events, opened, a)
        if timeline_events is None:
            paths.close()
            return 1
    # The profile alone needs no code runs: the decoder then replays what it
    # decoded before, and the profile reads the blocks by key (a 78 M-block
    # recording: 0.8 s of decoding instead of 2.5 s, the same memory).  A
    # window reads them laid out.
    alone = paths is None and not opened.calls
    take = gate if gate is on_blocks else (lambda b: gate(b.dense()))
    try:
        if alone:
            flow = decode_session(p.prog, opened, take, runs=False, batch_rows=REPORT_BATCH_ROWS)
        else:
            flow = decode_session(p.prog, opened, gate)
    finally:
        if paths is not None:
            paths.close()
    profile = profiler.result(opened.comm)
    gaps = [(g.offset, g.ip, g.reason) for q in flow.queues for g in q.gaps]
    console = show(opened.data.path, len(flow.queues), profile, flow.problems, gaps, a.top)
    if paths is not None:
        for what, count, path in _write_call_paths(a, paths, timeline_events):
            console.print(f"\ncall paths: {count} {what} written to {path}")
    return 0


def _write_call_paths(a: argparse.Namespace, paths, events) -> list[tuple[str, int, str]]:
    """The call-path files the options ask for: (what, count, file) each."""
    from ..export.callpaths import (
        write_call_timeline,
        write_flame_page,
        write_folded,
        write_weighted_paths,
    )

    result = paths.result()
    out = []
    if a.folded:
        out.append(("folded stacks", write_folded(paths, result, a.folded, a.by), a.folded))
    if a.paths:
        out.append(("paths", write_weighted_paths(paths, result, a.paths, a.by), a.paths))
    if a.html:
        n = write_flame_page(paths, result, a.html, a.by, f"hwtrace report: {a.input}")
        out.append(("views (flame graph, sunburst)", n, a.html))
    if a.timeline:
        n = write_call_timeline(paths, result, a.timeline, events)
        out.append(("timeline events", n, a.timeline))
    return out


# perf script's --itrace letters (perf's Documentation/itrace.txt) and the
# fields of -F: the ones the listing is.
_ITRACE_LETTERS = {
    "i": "instructions", "y": "cycles", "b": "branches", "c": "calls", "r": "returns",
    "x": "transactions", "w": "PTWRITEs", "p": "power events", "o": "other events",
    "e": "errors", "d": "debug log", "f": "the first", "g": "call chains", "G": "call chains",
    "l": "last branches", "L": "last branches", "s": "skipped events", "q": "quicker decoding",
    "Z": "timestamps for each sample", "m": "memory events", "t": "timing events",
    "A": "the instruction count", "I": "interrupts",
}  # fmt: skip
_LISTED_FIELDS = ("comm", "tid", "time", "ip", "sym", "symoff", "dso")


# An --itrace option: a letter, then a period with its unit or flags.
_ITRACE_ITEM = re.compile(r"([A-Za-z])(\d+(?:ns|us|ms|i|t)?|(?:[+-][A-Za-z])*)")


def _itrace_lists(p: argparse.ArgumentParser, spec: str) -> tuple[bool, bool]:
    """Whether perf's ``--itrace`` options ``spec`` list instructions and
    PTWRITEs; an error for what the listing is not (hwtrace script lists
    every instruction, PTWRITEs at their place, and reports gaps)."""
    letters: dict[str, str] = {}
    pos = 0
    while pos < len(spec):
        m = _ITRACE_ITEM.match(spec, pos)
        if m is None or m.group(1) not in _ITRACE_LETTERS:
            p.error(f"--itrace={spec}: {spec[pos:]!r} is not one of perf's --itrace options")
        letters[m.group(1)] = m.group(2)
        pos = m.end()
    for letter in letters:
        if letter not in "iwe":
            p.error(
                f"--itrace={spec}: {letter!r} ({_ITRACE_LETTERS[letter]}) is not what hwtrace "
                "script lists: every instruction (i), PTWRITEs (w), errors (e)"
            )
    if "i" not in letters and "w" not in letters:
        p.error(f"--itrace={spec}: hwtrace script lists instructions (i) and PTWRITEs (w)")
    if "i" in letters and not re.fullmatch(r"(0\D*|1i)?", letters["i"]):
        p.error(f"--itrace={spec}: i{letters['i']}: hwtrace script lists every instruction "
                "(i, i0ns, i1i), not a sample of them")  # fmt: skip
    return "i" in letters, "w" in letters


def _check_fields(p: argparse.ArgumentParser, fields: str) -> None:
    """perf's ``-F`` list: the listing's fields, all of them (perf prints
    them in its order whatever the list's)."""
    named = [f.strip() for f in fields.split(",") if f.strip()]
    if sorted(named) != sorted(_LISTED_FIELDS):
        p.error(f"-F {fields}: hwtrace script prints {','.join(_LISTED_FIELDS)}: -F may name "
                "those, all of them")  # fmt: skip


def script_main(argv: Sequence[str]) -> int:
    """List the decoded Intel PT of a perf.data per instruction or per block."""
    p = command_parser("hwtrace script", script_main)
    add_input_options(p)
    p.add_argument(
        "--blocks", action="store_true", help="one line per block instead of per instruction"
    )
    p.add_argument("--no-ptwrite", action="store_true",
                   help="leave out the PTWRITE payloads (listed at their place by default)")  # fmt: skip
    p.add_argument("--json", action="store_true",
                   help="one JSON object a line (comm, tid, time, ip, sym, symoff, dso; insns "
                        "or ptwrite) instead of perf script's text")  # fmt: skip
    p.add_argument("--itrace", metavar="OPTS",
                   help="perf script's spelling of what to list: i (every instruction: i, i0ns), "
                        "w (PTWRITEs), e (errors); without w no PTWRITEs; without -F "
                        "perf's default fields (period and event name after the time)")  # fmt: skip
    p.add_argument("-F", "--fields", metavar="FIELDS",
                   help="perf script's field list: comm,tid,time,ip,sym,symoff,dso (what is "
                        "printed)")  # fmt: skip
    p.add_argument("--ns", action="store_true",
                   help="times in nanoseconds: the default, but with --itrace or -F times are "
                        "in microseconds without it, as perf script prints them")  # fmt: skip
    a = p.parse_args(list(argv))
    ptwrite = not a.no_ptwrite
    instructions = True
    if a.itrace is not None:
        instructions, listed = _itrace_lists(p, a.itrace)
        ptwrite = ptwrite and listed
        if not instructions and a.blocks:
            p.error(f"--itrace={a.itrace}: --blocks lists instructions: give i")
    if a.fields is not None:
        _check_fields(p, a.fields)
    # perf's spelling, perf's times: microseconds unless --ns; and without
    # -F perf's default fields, the period and event name after the time.
    usec = (a.itrace is not None or a.fields is not None) and not a.ns
    perf_lines = a.itrace is not None and not a.blocks and not a.json
    perf_fields = perf_lines and a.fields is None
    session = open_session(p.prog, a)
    if session is None:
        return 1
    from ..textout.perfscript import ListingWriter

    out = sys.stdout.buffer
    try:
        # (with --itrace the lines are perf script's, PTWRITEs' too)
        event, ptw_event = (
            session.event_columns(instructions, ptwrite) if perf_fields else ("", "")
        )  # fmt: skip
        writer = ListingWriter(out, json=a.json, usec=usec, event=event,
                               ptwrite=ptw_event if perf_lines else None)  # fmt: skip
        write = writer.write if instructions else lambda rows: writer.write(rows.ptwrites())
        flow = session.listing(write, blocks=a.blocks, ptwrite=ptwrite, perf_order=perf_lines)
        warn_missing_calls(p.prog, flow)
        out.flush()
        for problem in shown_problems(flow.problems):
            sys.stderr.write(f"hwtrace script: warning: {problem}\n")
        # What report shows as gaps: the listing has nothing there.
        for q in flow.queues:
            for g in q.gaps:
                sys.stderr.write(f"hwtrace script: gap at trace offset {g.offset:#x}, "
                                 f"ip {g.ip:#x}: {g.reason}\n")  # fmt: skip
    except BrokenPipeError:
        return 0
    return 0
