"""``hwtrace ptwrite``: typed software events from PTWRITE packets (or the
software channel's streams), as text, JSON lines or CTF; and the C header
of an event schema."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ..pt.config import PtConfig
from .common import command_parser, input_file, output_dir, output_file

PROG = "hwtrace ptwrite"


def main(argv: Sequence[str]) -> int:
    """Decode the typed events PTWRITE (or hwtrace's software channel) put into Intel PT: from a
    perf.data (-i) or raw PT files."""
    p = command_parser(PROG, main)
    p.add_argument("traces", nargs="*", type=input_file, metavar="FILE",
                   help="raw PT files (one stream each)")  # fmt: skip
    p.add_argument(
        "-i", "--input", metavar="PERF.DATA", help="a perf.data recorded with intel_pt/ptw/"
    )
    p.add_argument("--schema", metavar="JSON", help="event types: names and field names")
    p.add_argument(
        "--json", type=output_file, metavar="FILE", help="write the events as JSON lines"
    )
    p.add_argument("--ctf", type=output_dir, metavar="DIR", help="write the events as a CTF trace")
    p.add_argument(
        "--header",
        metavar="FILE",
        help="write the schema's C header (and hwtrace_channel.h beside it) and stop",
    )
    p.add_argument("--mtc-freq", type=int, default=0, metavar="N")
    p.add_argument("--cpuid-0x15.eax", dest="cpuid_eax", type=int, default=0, metavar="N")
    p.add_argument("--cpuid-0x15.ebx", dest="cpuid_ebx", type=int, default=0, metavar="N")
    a = p.parse_args(list(argv))
    from ..export.ctf import write_ptw_events
    from ..hwevents.ptw import EventSchema, decode_events
    from ..perf.data import PerfDataError
    from ..session.ptwevents import perf_events

    schema = None
    try:
        if a.schema:
            schema = EventSchema.load(a.schema)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 1
    if a.header:
        if schema is None:
            p.error("--header needs --schema")
        from ..events import write_headers

        write_headers(schema, a.header)
        return 0
    if bool(a.input) == bool(a.traces):
        p.error("give a perf.data (-i) or raw PT files")
    streams = {}
    to_ns = None
    try:
        if a.input:
            from ..perf.intelpt import tsc_conversion_of
            from ..session import PerfSession

            data = PerfSession.open(a.input, all_calls=True).data
            streams = {f"cpu {c} tid {t}": ev for (c, t), ev in perf_events(data).items()}
            conv = tsc_conversion_of(data)
            to_ns = conv.to_ns if conv is not None else None
        else:
            config = PtConfig(
                mtc_freq=a.mtc_freq, cpuid_0x15_eax=a.cpuid_eax, cpuid_0x15_ebx=a.cpuid_ebx
            )
            for path in a.traces:
                streams[path] = decode_events(path, config)
    except Exception as e:
        from ..perf.data import PerfDataError

        if not isinstance(e, (PerfDataError, OSError, ValueError)):
            raise
        sys.stderr.write(f"{PROG}: {e}\n")
        return 1
    lines = []
    for name, ev in streams.items():
        for problem in ev.problems:
            sys.stderr.write(f"{PROG}: {name}: {problem}\n")
        rows = ev.rows(schema)
        ns = to_ns(ev.time).tolist() if to_ns is not None and len(ev) else None
        for k, d in enumerate(rows):
            if ns is not None:
                d["ns"] = int(ns[k])
            d["stream"] = name
        lines += rows
    if a.json:
        Path(a.json).write_text("".join(json.dumps(d) + "\n" for d in lines))
    if a.ctf:
        for k, ev in enumerate(streams.values()):
            directory = a.ctf if len(streams) == 1 else f"{a.ctf}/{k}"
            write_ptw_events(ev, directory, schema, to_ns=to_ns)
    if not a.json and not a.ctf:
        for d in lines:
            fields = " ".join(f"{k}={v}" for k, v in d["fields"].items())
            ip = f" ip={d['ip']}" if "ip" in d else ""
            sys.stdout.write(f"{d['time']:>16} {d['stream']}: {d['event']}{ip} {fields}\n")
    return 0
