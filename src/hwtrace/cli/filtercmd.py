"""``hwtrace filter EXPR INPUT``: keep the recorded events a filter accepts.

EXPR is an LTTng filter expression (docs/filter-design.md), compiled once
per event type of INPUT for the chosen tier and run over the type's events
in native loops.  INPUT is a perf.data with tracepoint samples, a copy of
ftrace's ``trace_pipe_raw`` (or a directory of per-CPU copies), or a CTF
trace (through babeltrace2's Python bindings).

Output: ``-o FILE`` writes a perf.data of the passing samples for perf.data
input (unless FILE ends in ``.jsonl`` or ``.txt``), JSON lines for
``.jsonl``, else a text listing like ftrace's ``trace``; without ``-o``
the listing goes to standard output (nothing with ``--count``).  A
perf.data is read, filtered and written a range of records at a time
(:func:`hwtrace.filter.inputs.open_input`), so memory does not grow with
its size.
``--count`` prints, per event type, its events, how many passed and the
tier used.

Exit codes: 0 done; 1 unreadable input (one line naming the file and
offset); 2 a bad command line or a filter that does not compile (the
message shows the column with a caret).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..filter.compile import TIERS
from ..filter.errors import FilterError
from .common import command_parser, output_file

PROG = "hwtrace filter"


def _parser() -> argparse.ArgumentParser:
    p = command_parser(PROG, main)
    p.add_argument("expression", metavar="EXPR", help="LTTng filter expression")
    p.add_argument("input", metavar="INPUT", help="perf.data, trace_pipe_raw copy(s), or CTF")
    p.add_argument(
        "-o",
        "--output",
        type=output_file,
        metavar="FILE",
        help="perf.data for perf.data input; .jsonl: JSON lines; else a text listing",
    )
    p.add_argument("--tier", choices=TIERS, default="ebpf-jit", help="execution tier")
    p.add_argument(
        "--event",
        action="append",
        default=[],
        metavar="NAME",
        help="only events of this type (glob, 'sys:name' or 'name'; repeatable)",
    )
    p.add_argument("--count", action="store_true", help="print events and passed per event type")
    p.add_argument(
        "--tracefs",
        metavar="DIR",
        help="tracefs directory for event formats (default: the live /sys/kernel/tracing)",
    )
    return p


def main(argv: Sequence[str]) -> int:
    """Filter recorded events (perf.data tracepoint samples, ftrace trace_pipe_raw copies, CTF
    traces) with an LTTng filter expression compiled per event type."""
    a = _parser().parse_args(list(argv))
    from ..filter.apply import FilterPlan
    from ..filter.inputs import StreamError, open_input
    from ..filter.output import ResultWriter

    def say(message: str) -> None:
        sys.stderr.write(f"{PROG}: {message}\n")

    try:
        # A perf.data is read a range of records at a time; its damage is
        # found by a first pass, so it is said before anything is written.
        source = open_input(a.input, a.tracefs)
        problems = source.problems
    except StreamError as e:
        say(str(e))
        return 1
    except ImportError as e:  # CTF without bt2
        say(f"{a.input}: {e}")
        return 1
    # Damage: what can be read is filtered, and the exit code says so.
    for problem in problems[:20]:
        say(f"warning: {problem}")
    if len(problems) > 20:
        say(f"warning: {len(problems) - 20} more problems not shown")
    for note in source.notes:
        say(f"note: {note}")
    try:
        plan = FilterPlan(a.expression, source.types, a.tier, events=a.event or None)
    except FilterError as e:
        for line in str(e).splitlines():
            sys.stderr.write(f"{PROG}: {line}\n" if line == str(e).splitlines()[0] else f"{line}\n")
        return 2
    if a.event and not plan.types:
        names = ", ".join(t.name for t in source.types) or "none"
        say(f"no event type matches {', '.join(a.event)} (types: {names})")
    for r in plan.types:
        if r.type.note:
            say(f"note: {r.type.name}: {r.type.note}")
        if r.missing:
            say(
                f"note: {r.type.name} has no field {', '.join(r.missing)}: "
                "the filter is false for its events (LTTng's rule)"
            )
        if r.filter.note:
            say(f"note: {r.type.name}: {r.filter.note}")
    failure = None  # why the output could not be written (counting goes on)
    writer = None
    if a.output or not a.count:
        try:
            writer = ResultWriter(source, a.output, sys.stdout.buffer)
        except StreamError as e:
            failure = str(e)
        except OSError as e:
            failure = f"cannot write {a.output}: {e.strerror}"
    try:
        # Chunk by chunk: filtered and written as the input is read.
        for chunk, later in source.chunks():
            keep, _ = plan.run(chunk)
            if writer is None:
                continue
            try:
                writer.add(chunk, keep, later)
            except BrokenPipeError:
                raise
            except OSError as e:
                failure, writer = f"cannot write {a.output}: {e.strerror}", None
        if writer is not None:
            writer.close()
    except BrokenPipeError:
        return 0
    except OSError as e:
        failure = f"cannot write {a.output}: {e.strerror}"
    if a.count:
        width = max([len(r.type.name) for r in plan.types] + [10])
        out = [f"{'event':<{width}} {'events':>10} {'passed':>10}  tier"]
        for r in plan.types:
            tier = r.filter.tier + (f" ({r.filter.note})" if r.filter.note else "")
            out.append(f"{r.type.name:<{width}} {r.events:>10} {r.passed:>10}  {tier}")
        total = sum(r.events for r in plan.types)
        passed = sum(r.passed for r in plan.types)
        out.append(f"{'total':<{width}} {total:>10} {passed:>10}")
        sys.stdout.write("\n".join(out) + "\n")
        sys.stdout.flush()
    if failure is not None:
        say(failure)
        return 1
    return 1 if problems else 0
