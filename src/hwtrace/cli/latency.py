"""``hwtrace latency`` and ``hwtrace funclatency``: latency profiles of a
decoded flow (:mod:`hwtrace.analysis.latency`), from a perf.data or a raw
Intel PT trace with its code."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .common import Parser, command_parser, output_file, shown_problems
from .events import add_window_options, window_gate
from .perfinput import add_input_options, decode_session, open_session


def _input_options(p: argparse.ArgumentParser) -> None:
    add_input_options(p)
    raw = p.add_argument_group("a raw Intel PT trace instead of a perf.data")
    raw.add_argument("--pt", metavar="FILE", help="the trace (one CPU's or thread's)")
    raw.add_argument("--elf", action="append", default=[], metavar="FILE[:BASE]",
                     help="code and symbols from an ELF file (repeatable)")  # fmt: skip
    raw.add_argument("--raw", action="append", default=[], metavar="FILE:BASE",
                     help="raw code loaded at BASE (repeatable)")  # fmt: skip
    for opt in ("--mtc-freq", "--nom-freq", "--cpuid-0x15.eax", "--cpuid-0x15.ebx"):
        raw.add_argument(opt, type=lambda v: int(v, 0), default=0, metavar="N",
                         help="as for hwtrace ptxed")  # fmt: skip
    p.add_argument("--top", type=int, default=10, metavar="N", help="longest intervals listed")
    p.add_argument(
        "--json", type=output_file, metavar="FILE", help="also write the profile as JSON"
    )
    p.add_argument("--html", type=output_file, metavar="FILE",
                   help="also write a self-contained HTML view (histograms, longest intervals)")  # fmt: skip
    add_window_options(p)
    p.add_argument("--all-intervals", action="store_true",
                   help="keep every interval (for --json and exact medians; memory grows "
                   "with their number), not only the longest")  # fmt: skip


def latency_main(argv: Sequence[str]) -> int:
    """Profile the time and instructions between two kinds of instructions (delta
    profiling, after Sharma 2017): per thread or CPU, with histograms and the longest intervals."""
    p = command_parser("hwtrace latency", latency_main)
    p.add_argument("--open", action="append", default=[], metavar="PATTERN",
                   help="an interval opens here (repeatable; comma-separated list)")  # fmt: skip
    p.add_argument("--close", action="append", default=[], metavar="PATTERN",
                   help="an interval closes here (repeatable)")  # fmt: skip
    p.add_argument("--toggle", action="append", default=[], metavar="PATTERN",
                   help="open and close alternately at these (Sharma's literal toggle)")  # fmt: skip
    p.add_argument("--marker", action="append", default=[], metavar="NAME=PATTERN",
                   help="name a pattern or super-instruction, e.g. "
                   "'superCLI=pushf; pop; cli in *irq_save*'")  # fmt: skip
    p.add_argument("--config", metavar="FILE", help="markers and interval sets from TOML")
    p.add_argument("--per", choices=("thread", "cpu"), help="keep intervals per thread or CPU")
    return _profile_command(p, argv, "latency", _interval_patterns)


def _interval_patterns(a: argparse.Namespace, patterns) -> None:
    """latency's patterns: --config, --marker, and --open/--close/--toggle."""
    from ..analysis.patterns import PatternError, load_toml, parse_sets

    if a.config:
        load_toml(a.config, patterns)
    for m in a.marker:
        name, eq, spec = m.partition("=")
        if not eq or not name.strip():
            raise PatternError(f"--marker {m!r}: expected NAME=PATTERN")
        patterns.add_marker(name.strip(), spec)
    if a.open or a.close or a.toggle or not a.config:
        parse_sets(patterns, a.open, a.close, a.toggle)
    elif not patterns.toggle and (not patterns.open or not patterns.close):
        raise PatternError(f"{a.config}: [interval] needs open and close (or toggle)")
    if a.per:
        patterns.per = a.per


def funclatency_main(argv: Sequence[str]) -> int:
    """Time and instructions of every call of a function, from its entry to the return that
    leaves it (recursion and early returns paired on a per-thread stack), as bcc's funclatency
    but exact and with no probe in the program."""
    p = command_parser("hwtrace funclatency", funclatency_main)
    p.add_argument("function", help="FUNC or module!FUNC")
    return _profile_command(p, argv, "funclatency", _call_patterns)


def _call_patterns(a: argparse.Namespace, patterns) -> None:
    """funclatency's pattern: the function's entry to its exit."""
    patterns.add_marker(a.function, f"exit:{a.function}")


def _profile_command(
    p: Parser, argv: Sequence[str], what: str, set_patterns: Callable[..., None]
) -> int:
    """Parse ``argv`` (``p`` given the input options here), build the
    patterns ``set_patterns`` reads from the arguments (a bad one is a usage
    error), and profile."""
    from ..analysis.patterns import PatternError, PatternSet

    _input_options(p)
    a = p.parse_args(list(argv))
    patterns = PatternSet()
    try:
        set_patterns(a, patterns)
    except PatternError as e:
        p.error(str(e))
    a.calls = what == "funclatency"
    return _run(p, a, patterns, what)


def _run(p: Parser, a: argparse.Namespace, patterns, what: str) -> int:
    from ..analysis.latency_report import render, to_json
    from ..console import text_console

    if a.pt:
        if a.window or a.events:
            sys.stderr.write(f"{p.prog}: --window needs a perf.data (its threads and clock)\n")
            return 1
        got = _profile_raw(p, a, patterns)
    else:
        got = _profile_perf(p, a, patterns)
    if got is None:
        return 1
    from ..analysis.latency import R_CALL, R_PAIR

    result, name, unit, title = got
    kind = R_CALL if what == "funclatency" else R_PAIR
    # Wide tables when written to a file or a pipe (rich would use 80 columns).
    console = text_console(160)
    key_label = "cpu" if patterns.per == "cpu" else "tid"
    render(result, name, unit, kind, a.top, key_label, title, console)
    if a.json or a.html:
        data = to_json(result, name, unit, kind)
    if a.json:
        Path(a.json).write_text(json.dumps(data, indent=1) + "\n")
        console.print(f"written to {a.json}")
    if a.html:
        from ..export.html import latency_page, write_page

        heading = f"hwtrace {what}: {title}"
        sub = (f"{result.instructions:,} instructions; "
               + ("every interval kept" if result.every_interval else "longest intervals kept"))  # fmt: skip
        write_page(a.html, latency_page(data, heading, sub, key_label))
        console.print(f"written to {a.html}")
    return 0


def _profile_raw(p: Parser, a: argparse.Namespace, patterns):
    from ..analysis.latency import profile_trace
    from ..pt.config import PtConfig
    from ..session import SessionError
    from ..session.rawtrace import RawTrace
    from .common import load_trace

    loaded = load_trace(p.prog, a.pt)
    if loaded is None:
        return None
    path, buf = loaded
    config = PtConfig(mtc_freq=a.mtc_freq, nom_freq=a.nom_freq,
                      cpuid_0x15_eax=getattr(a, "cpuid_0x15.eax"),
                      cpuid_0x15_ebx=getattr(a, "cpuid_0x15.ebx"))  # fmt: skip
    try:
        trace = RawTrace.open(path, elf=a.elf, raw=a.raw, config=config, data=buf)
    except SessionError as e:
        sys.stderr.write(f"{p.prog}: {e}\n")
        return None
    result = profile_trace(trace.data, trace.image, patterns, trace.config, keep=a.all_intervals,
                           longest=max(a.top, 1), calls=a.calls)  # fmt: skip
    return result, trace.symbol, "TSC ticks", a.pt


def _profile_perf(p: Parser, a: argparse.Namespace, patterns):
    from ..analysis.feed import LatencyFeed
    from ..analysis.latency import LatencyProfiler

    opened = open_session(p.prog, a)
    if opened is None:
        return None
    profiler = LatencyProfiler(patterns, keep=a.all_intervals, longest=max(a.top, 1),
                               calls=a.calls)  # fmt: skip
    feed = LatencyFeed(profiler)
    gate = window_gate(p.prog, opened, a, feed)
    if gate is None:
        feed.close()
        return None
    try:
        flow = decode_session(p.prog, opened, gate)
    finally:
        feed.close()
    for problem in shown_problems(flow.problems):
        sys.stderr.write(f"{p.prog}: warning: {problem}\n")
    if gate is not feed:
        total = gate.kept + gate.dropped
        sys.stderr.write(f"{p.prog}: {gate.kept:,} of {total:,} instructions inside the windows\n")
    return feed.result(), feed.name, "ns", str(opened.data.path)


Main = Callable[[Sequence[str]], int]
__all__ = ["funclatency_main", "latency_main"]
