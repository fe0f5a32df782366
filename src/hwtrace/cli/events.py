"""``hwtrace events``: software events (LTTng-UST, perf tracepoints, ftrace)
placed on a perf.data's decoded flow (:mod:`hwtrace.analysis.swevents`):
for each event, the instruction its thread was running when it was taken."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import numpy as np

from ..columns import distinct
from .common import command_parser, open_saying, output_file, shown_problems
from .perfinput import add_input_options, decode_session, open_session


def add_event_options(p: argparse.ArgumentParser) -> None:
    """Options that say how events' times relate to the flow's clock."""
    p.add_argument("--events-clock", metavar="CLOCK",
                   help="the clock the events were taken with when the input does not say it "
                   "(monotonic, perf, tsc; ftrace: tsc, its x86-tsc trace_clock)")  # fmt: skip
    p.add_argument("--clock-offset", type=int, metavar="NS",
                   help="add this many ns to the events' times (a measured offset between "
                   "their clock and the flow's)")  # fmt: skip


def add_window_options(p: argparse.ArgumentParser) -> None:
    """``--events PATH --window OPEN,CLOSE``: analyse only inside windows
    bounded by software events."""
    g = p.add_argument_group("windows bounded by software events")
    g.add_argument("--events", metavar="PATH",
                   help="software events (a CTF trace, a perf.data, ftrace copies, or "
                   "ptwrite[:SCHEMA.json] for the trace's own PTWRITE events): for --window, "
                   "and shown on --timeline")  # fmt: skip
    g.add_argument("--window", metavar="OPEN,CLOSE",
                   help="only what each thread ran from an OPEN event to its next CLOSE event "
                   "(event names, shell wildcards)")  # fmt: skip
    add_event_options(g)


def window_gate(prog: str, opened, a: argparse.Namespace, on_blocks):
    """``on_blocks`` behind the windows ``--events``/``--window`` ask for
    (itself without them; None: a message was written)."""
    if not a.window:
        return on_blocks
    from ..analysis.swevents import EventsError, WindowGate, event_windows

    if not a.events:
        sys.stderr.write(f"{prog}: --window needs --events (where the window events are)\n")
        return None
    ends = [x.strip() for x in a.window.split(",")]
    if len(ends) != 2 or not all(ends):
        sys.stderr.write(f"{prog}: --window {a.window}: expected OPEN,CLOSE (two event names)\n")
        return None
    events = open_events(prog, a.events, opened, a)
    if events is None:
        return None
    try:
        windows = event_windows(events, *ends)
    except EventsError as e:
        sys.stderr.write(f"{prog}: {e}\n")
        return None
    problems = [(windows.unpaired_open, f"{ends[0]} with no {ends[1]} after it"),
                (windows.unpaired_close, f"{ends[1]} with no {ends[0]} before it"),
                (windows.unplaceable, "events without a thread or a time")]  # fmt: skip
    said = ", ".join(f"{n} {what}" for n, what in problems if n)
    sys.stderr.write(f"{prog}: {len(windows)} windows from {ends[0]} to {ends[1]} in "
                     f"{len(windows.by_tid)} threads" + (f" (unpaired: {said})" if said else "")
                     + "\n")  # fmt: skip
    if not len(windows):
        sys.stderr.write(f"{prog}: no window: nothing to analyse\n")
        return None
    return WindowGate(windows, on_blocks)


def open_events(prog: str, path: str, opened, a: argparse.Namespace):
    """The events at ``path`` on ``opened``'s flow clock (None: a message
    was written)."""
    from ..analysis.swevents import EventsError, flow_clock, load_events
    from ..perf.intelpt import tsc_conversion_of

    clock = flow_clock(a.input, tsc_conversion_of(opened.data))

    def load():
        if path == "ptwrite" or path.startswith("ptwrite:"):
            return _ptwrite(path, opened, clock)
        return load_events(path, clock, events_clock=a.events_clock, offset_ns=a.clock_offset)

    return open_saying(prog, load, EventsError, "note: ")


def _ptwrite(spec: str, opened, clock):
    """``ptwrite[:SCHEMA.json]``: the perf.data's own PTWRITE events."""
    from ..analysis.swevents import EventsError, ptwrite_events
    from ..hwevents.ptw import EventSchema

    schema = None
    _, _, schema_path = spec.partition(":")
    if schema_path:
        try:
            schema = EventSchema.load(schema_path)
        except (OSError, ValueError) as e:
            raise EventsError(str(e)) from None
    if opened.data.auxtrace_info is None:
        raise EventsError(f"{opened.data.path}: no Intel PT trace, so no PTWRITE events")
    return ptwrite_events(opened.data, opened.sideband, clock, schema, path=spec)


def place(opened, events, prog: str):
    """Decode ``opened``'s flow and place ``events`` on it: the placement,
    the code names gathered and the decoded stream."""
    from ..analysis.feed import CodeNames
    from ..analysis.swevents import EventPlacer

    placer = EventPlacer(events)
    names = CodeNames()

    def feed(b) -> None:
        if len(b):
            for image in distinct(b.image).tolist():
                names.add(b.queue, int(image))
        placer(b)

    flow = decode_session(prog, opened, feed)
    for problem in shown_problems(flow.problems):
        sys.stderr.write(f"{prog}: warning: {problem}\n")
    return placer.finish(), names, flow


def main(argv: Sequence[str]) -> int:
    """Place software events (an LTTng CTF trace, a perf.data with tracepoint samples, ftrace
    trace_pipe_raw copies) on a perf.data's decoded Intel PT: the instruction each event's thread
    was running when it was taken."""
    from ..analysis.swevents import PLACED, STATUS_TEXT

    p = command_parser("hwtrace events", main)
    add_input_options(p)
    p.add_argument(
        "events",
        help="the events: a CTF trace directory, a perf.data, ftrace copies, "
        "or ptwrite[:SCHEMA.json] (the input's own PTWRITE events)",
    )
    add_event_options(p)
    p.add_argument("--event", action="append", default=[], metavar="PATTERN",
                   help="only events whose name matches (shell wildcards; repeatable)")  # fmt: skip
    p.add_argument(
        "--json",
        type=output_file,
        metavar="FILE",
        help="also write every event's placement as JSON",
    )
    a = p.parse_args(list(argv))
    opened = open_session(p.prog, a)
    if opened is None:
        return 1
    events = open_events(p.prog, a.events, opened, a)
    if events is None:
        return 1
    placement, names, _ = place(opened, events, p.prog)
    keep = np.ones(len(events), bool)
    if a.event:
        keep[:] = False
        for pattern in a.event:
            keep |= events.matching(pattern)
    out = sys.stdout
    err = int(events.error.max()) if len(events) else 0
    counts = {k: int((placement.status[keep] == s).sum()) for s, k in STATUS_TEXT.items()}
    out.write(
        f"# {int(keep.sum())} events of {events.path} ({events.kind}, clock {events.clock}, "
        f"±{err} ns on the flow's): "
        + (", ".join(f"{v} {k}" for k, v in counts.items() if v) or "none listed")
        + "\n"
    )
    rows = []
    for i in np.flatnonzero(keep).tolist():
        s = int(placement.status[i])
        if s == PLACED:
            ip = int(placement.ip[i])
            where = names.where(ip) or f"{ip:#x}"
            first, at, last = (int(x[i]) for x in (placement.first, placement.at, placement.last))
            tail = f"at {where} ({ip:#x}), insn {at} of thread, {first}-{last}"
            if placement.gap[i]:
                tail += ", across a gap"
        else:
            tail = STATUS_TEXT[s]
        out.write(f"{events.text[i]}\n    {tail}\n")
        if a.json:
            rows.append({
                "event": events.names[int(events.name[i])], "time": int(events.time[i]),
                "error": int(events.error[i]), "tid": int(events.tid[i]),
                "cpu": int(events.cpu[i]), "status": STATUS_TEXT[s],
                "first": int(placement.first[i]), "at": int(placement.at[i]),
                "last": int(placement.last[i]), "ip": int(placement.ip[i]),
                "where": names.where(int(placement.ip[i])) if s == PLACED else "",
                "gap": bool(placement.gap[i]), "context": events.context[i],
                "text": events.text[i],
            })  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"events": rows, "counts": counts, "clock": events.clock}, f, indent=1)
    return 0
