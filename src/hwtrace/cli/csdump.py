"""``hwtrace csdump``: ARM CoreSight trace (STM's MIPI STPv2, ETMv4, ETE),
raw or in formatter frames, an OpenCSD snapshot directory, or a perf.data
recorded with ``perf record -e cs_etm//`` (``-i``), listed packet by packet
as OpenCSD's ``trc_pkt_lister`` (and ``perf report -D``) does; and the
software events they carry (STM messages, ETM trace-on at registered
addresses, ETE ITE).  The capture is read by
:class:`hwtrace.session.coresight.CoreSightCapture`."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .common import checked, command_parser, input_file, output_file

PROG = "hwtrace csdump"
# As hwtrace.session.coresight's PROTOCOLS and FRAME_MODES (not imported:
# --help stays light).
PROTOCOLS = ("stm", "etm4", "ete")
FRAME_MODES = ("memory", "fsync", "hsync", "dstream")


def _trace_id(value: str) -> int:
    """An argparse type for a CoreSight trace ID: 0x01-0x6f (0 is none and
    0x70-0x7f are reserved, as CoreSight's architecture has it)."""
    return checked(value, lambda v: int(v, 0), "a trace ID", lambda t: 1 <= t <= 0x6F,
                    "not a trace ID (0x01 to 0x6f)")  # fmt: skip


def main(argv: Sequence[str]) -> int:
    """List ARM CoreSight trace packets (STM, ETMv4, ETE) as OpenCSD's trc_pkt_lister does, and
    the software events they carry."""
    p = command_parser(PROG, main)
    p.add_argument(
        "file",
        nargs="?",
        type=input_file,
        metavar="FILE",
        help="a raw trace file (with --protocol)",
    )
    p.add_argument("--snapshot", metavar="DIR", help="an OpenCSD snapshot directory")
    p.add_argument("-i", "--input", metavar="PERF.DATA",
                   help="a perf.data with CoreSight ETM trace (perf record -e cs_etm//)")  # fmt: skip
    p.add_argument("--protocol", choices=PROTOCOLS, help="what FILE holds")
    p.add_argument("--frames", choices=FRAME_MODES,
                   help="FILE is in CoreSight formatter frames (ETB/ETF/ETR: memory; "
                   "TPIU: fsync, hsync; a DSTREAM capture: dstream)")  # fmt: skip
    p.add_argument("--id", type=_trace_id, action="append", default=[], metavar="N",
                   help="only this trace ID (repeatable)")  # fmt: skip
    p.add_argument("--source", action="append", default=[], metavar="NAME",
                   help="only this snapshot source (repeatable)")  # fmt: skip
    p.add_argument("--reg", action="append", default=[], metavar="NAME=VALUE",
                   help="a trace unit register for FILE (TRCIDR0=0x28000ea1, STMTCSR=...)")  # fmt: skip
    p.add_argument("--raw-frames", action="store_true",
                   help="also list the frames (as trc_pkt_lister -o_raw_packed -o_raw_unpacked)")  # fmt: skip
    p.add_argument("--events", action="store_true", help="list the software events instead")
    p.add_argument("--at", action="append", default=[], metavar="ADDR[=NAME]",
                   help="ETM: a trace-on at this address is an event (repeatable)")  # fmt: skip
    p.add_argument("--convention", choices=("flag", "marker"), default="flag",
                   help="STM: a message ends at a FLAG (Linux's STM framework) or at a "
                   "marked packet")  # fmt: skip
    p.add_argument(
        "--json", type=output_file, metavar="FILE", help="write the events as JSON lines"
    )
    a = p.parse_args(list(argv))
    if (bool(a.snapshot) + bool(a.file) + bool(a.input)) != 1:
        p.error("give a snapshot directory (--snapshot), a perf.data (-i) or a trace FILE")
    if a.file and a.protocol is None:
        p.error("FILE needs --protocol stm|etm4|ete")
    try:
        capture = _open(a)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 1
    out = sys.stdout
    try:
        if a.raw_frames:
            for text in capture.frame_listing_chunks():
                sys.stdout.buffer.write(text)
        if a.events or a.json:
            try:
                at = _addresses(a.at)
            except ValueError as e:
                sys.stderr.write(f"{PROG}: {e}\n")
                return 2
            rows = capture.events(a.convention, at)
            if a.json:
                Path(a.json).write_text("".join(json.dumps(r) + "\n" for r in rows))
            if a.events:
                for r in rows:
                    rest = " ".join(
                        f"{k}={v}" for k, v in r.items() if k not in ("source", "event")
                    )
                    out.write(f"{r['source']}: {r['event']} {rest}\n")
            return 0
        out.flush()
        for text in capture.listing_chunks():
            sys.stdout.buffer.write(text)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        return 0
    return 0


def _warn(message: str) -> None:
    sys.stderr.write(f"{PROG}: {message}\n")


def _open(a):
    """The capture the arguments name."""
    from ..session.coresight import CoreSightCapture

    if a.snapshot:
        return CoreSightCapture.snapshot(a.snapshot, ids=a.id, names=a.source, warn=_warn)
    if a.input:
        return CoreSightCapture.perf(a.input, ids=a.id, warn=_warn)
    return CoreSightCapture.raw(a.file, a.protocol, frames=a.frames, regs=_regs(a.reg),
                                ids=a.id, warn=_warn)  # fmt: skip


def _regs(pairs: list[str]) -> dict[str, int]:
    regs = {}
    for item in pairs:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--reg {item}: not NAME=VALUE")
        try:
            regs[name.strip().upper()] = int(value, 0)
        except ValueError:
            raise ValueError(f"--reg {item}: {value!r} is not a number") from None
    return regs


def _addresses(items: list[str]) -> dict[int, str]:
    out = {}
    for item in items:
        addr, _, name = item.partition("=")
        try:
            value = int(addr, 0)
        except ValueError:
            raise ValueError(f"--at {item}: {addr!r} is not an address") from None
        out[value] = name or f"{value:#x}"
    return out
