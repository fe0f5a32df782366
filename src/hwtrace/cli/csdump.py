"""``hwtrace csdump``: ARM CoreSight trace (STM's MIPI STPv2, ETMv4, ETE),
raw or in formatter frames, an OpenCSD snapshot directory, or a perf.data
recorded with ``perf record -e cs_etm//`` (``-i``), listed packet by packet
as OpenCSD's ``trc_pkt_lister`` (and ``perf report -D``) does; and the
software events they carry (STM messages, ETM trace-on at registered
addresses, ETE ITE)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .common import Parser, command_parser

PROG = "hwtrace csdump"
PROTOCOLS = ("stm", "etm4", "ete")
_TYPES = {"STM": "stm", "ETM4": "etm4", "ETMV4": "etm4", "ETE": "ete"}
_LISTER_READ = 1024  # trc_pkt_lister reads a source's own buffer 1 KiB at a time


@dataclass
class Source:
    """One trace source's bytes: its name, protocol, trace ID, registers,
    and where each byte was in the file (None: at its own offset)."""

    name: str
    protocol: str
    trace_id: int
    data: bytes
    regs: dict[str, int]
    file_offset: np.ndarray | None = None
    #: per byte, the index OpenCSD lists its packets at (the start of the
    #: frame's run of the ID); None: the file offset
    list_index: np.ndarray | None = None
    #: sources of one group are listed together, groups in order (perf.data:
    #: one group per AUX buffer fragment, as perf dumps them)
    group: int = 0
    #: stream offsets where the blocks OpenCSD is handed the data in begin
    #: (None: blocks of the size trc_pkt_lister reads a file in)
    blocks: np.ndarray | None = None

    def block_starts(self) -> np.ndarray:
        if self.blocks is not None:
            return self.blocks
        return np.arange(0, len(self.data), _LISTER_READ, dtype=np.int64)


def main(argv: Sequence[str]) -> int:
    """List ARM CoreSight trace packets (STM, ETMv4, ETE) as OpenCSD's trc_pkt_lister does, and
    the software events they carry."""
    p = command_parser(PROG, main)
    p.add_argument("file", nargs="?", metavar="FILE", help="a raw trace file (with --protocol)")
    p.add_argument("--snapshot", metavar="DIR", help="an OpenCSD snapshot directory")
    p.add_argument("-i", "--input", metavar="PERF.DATA",
                   help="a perf.data with CoreSight ETM trace (perf record -e cs_etm//)")  # fmt: skip
    p.add_argument("--protocol", choices=PROTOCOLS, help="what FILE holds")
    p.add_argument("--frames", choices=("memory", "fsync", "hsync", "dstream"),
                   help="FILE is in CoreSight formatter frames (ETB/ETF/ETR: memory; "
                   "TPIU: fsync, hsync; a DSTREAM capture: dstream)")  # fmt: skip
    p.add_argument("--id", type=lambda v: int(v, 0), action="append", default=[], metavar="N",
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
    p.add_argument("--json", metavar="FILE", help="write the events as JSON lines")
    a = p.parse_args(list(argv))
    try:
        sources, frames = _sources(p, a)
    except (OSError, ValueError) as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 1
    out = sys.stdout
    try:
        if a.raw_frames:
            from ..hwevents.csframes import frame_dump_lines

            for data, mode in frames:
                for line in frame_dump_lines(data, mode):
                    out.write(line + "\n")
        if a.events or a.json:
            return _events(a, sources, out)
        lines: list[tuple[int, int, str]] = []
        for k, src in enumerate(sources):
            for idx, line in _dump(src):
                lines.append((idx, k, line))
        lines.sort(key=lambda r: (sources[r[1]].group, r[0], r[1]))
        out.writelines(line + "\n" for _, _, line in lines)
        out.flush()
    except BrokenPipeError:
        return 0
    return 0


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


def _sources(p: Parser, a) -> tuple[list[Source], list[tuple[bytes, str]]]:
    from ..hwevents.csframes import block_indices, block_starts, deformat

    if (bool(a.snapshot) + bool(a.file) + bool(a.input)) != 1:
        p.error("give a snapshot directory (--snapshot), a perf.data (-i) or a trace FILE")
    if a.snapshot:
        return _snapshot_sources(a)
    if a.input:
        return _perf_sources(a)
    if a.protocol is None:
        p.error("FILE needs --protocol stm|etm4|ete")
    path = Path(a.file)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    data = path.read_bytes()
    regs = _regs(a.reg)
    if a.frames is None:
        tid = (
            (regs.get("STMTCSR", 0) >> 16) & 0x7F
            if a.protocol == "stm"
            else regs.get("TRCTRACEIDR", 0)
        )
        return [Source(str(path), a.protocol, tid, data, regs)], []
    d = deformat(data, mode=a.frames, ids=a.id or None)
    for off, msg in d.errors:
        sys.stderr.write(f"{PROG}: {path}: offset {off:#x}: {msg}\n")
    index, starts = block_indices(data, a.frames), block_starts(data, a.frames)
    out = [
        Source(
            f"{path} ID {tid:#x}",
            a.protocol,
            tid,
            stream,
            regs,
            d.offsets[tid],
            index.get(tid),
            blocks=starts.get(tid),
        )
        for tid, stream in sorted(d.streams.items())
        if not a.id or tid in a.id
    ]
    return out, [(data, a.frames)]


def _snapshot_sources(a) -> tuple[list[Source], list[tuple[bytes, str]]]:
    from ..hwevents.csframes import block_indices, block_starts, deformat, trace_ids
    from ..hwevents.cssnapshot import read_snapshot

    snap = read_snapshot(a.snapshot)
    ids = trace_ids(snap)
    decoded: dict[str, object] = {}
    listed: dict[str, dict[int, np.ndarray]] = {}
    starts: dict[str, dict[int, np.ndarray]] = {}
    out = []
    for dev in snap.devices:
        proto = _protocol(dev.type)
        if proto is None or dev.name not in snap.source_buffers:
            continue
        if a.source and dev.name not in a.source:
            continue
        tid = ids.get(dev.name, 0)
        if a.id and tid not in a.id:
            continue
        buf = snap.source_data(dev.name)
        regs = {k.upper(): v for k, v in dev.regs.items()}
        if buf.format == "source_data":
            # one source's own buffer: OpenCSD lists it under ID 0
            out.append(Source(dev.name, proto, 0, bytes(buf.data), regs))
            continue
        mode = _buffer_mode(buf.format)
        d = decoded.get(buf.name)
        if d is None:
            d = decoded[buf.name] = deformat(buf.data, mode=mode)
            listed[buf.name] = block_indices(buf.data, mode)
            starts[buf.name] = block_starts(buf.data, mode)
            for off, msg in d.errors:
                sys.stderr.write(f"{PROG}: {buf.name}: offset {off:#x}: {msg}\n")
        stream = d.streams.get(tid, b"")
        none = np.zeros(0, np.int64)
        offsets = d.offsets.get(tid, none)
        out.append(
            Source(
                dev.name,
                proto,
                tid,
                stream,
                regs,
                offsets,
                listed[buf.name].get(tid, none),
                blocks=starts[buf.name].get(tid, none),
            )
        )
    if not out:
        raise ValueError(f"{a.snapshot}: no STM, ETM4 or ETE trace source with trace data")
    frames = [(snap.buffer(name).data, _buffer_mode(snap.buffer(name).format)) for name in decoded]
    return out, frames


def _protocol(device_type: str) -> str | None:
    """The protocol of a snapshot device type; DS-5 adds the architecture
    version (``ETM4.1``, ``ETM4.4``), which OpenCSD's snapshot reader cuts
    at the first dot."""
    return _TYPES.get(device_type.split(".", 1)[0].strip().upper())


def _perf_sources(a) -> tuple[list[Source], list[tuple[bytes, str]]]:
    """One source per trace ID of each AUX buffer fragment perf decodes on
    its own (its decoder restarts between them), with the CPU block's
    registers."""
    from ..perf.cs_etm import cs_etm_buffers, cs_etm_info
    from ..perf.data import PerfData, PerfDataError

    path = Path(a.input)
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    try:
        data = PerfData(str(path))
        info = cs_etm_info(data)
        buffers = cs_etm_buffers(data, info)
    except PerfDataError as e:
        raise ValueError(str(e)) from None
    by_id = info.by_trace_id()
    for e in data.errors:
        sys.stderr.write(f"{PROG}: {e}\n")
    out, frames, unknown = [], [], set()
    for g, b in enumerate(buffers):
        for off, msg in b.errors:
            sys.stderr.write(f"{PROG}: {path}: offset {off:#x}: {msg}\n")
        if b.formatted:
            frames.append((bytes(b.raw(data)), "memory"))
        for tid, stream in sorted(b.streams.items()):
            if a.id and tid not in a.id:
                continue
            cpu = by_id.get(tid)
            if cpu is None or cpu.kind == "ETMv3":
                if tid not in unknown:
                    unknown.add(tid)
                    why = "no CPU block" if cpu is None else "ETMv3/PTM trace (not decoded)"
                    at = int(b.offsets[tid][0]) if len(b.offsets[tid]) else b.record
                    sys.stderr.write(
                        f"{PROG}: {path}: offset {at:#x}: trace ID {tid:#x}: {why}, skipped\n"
                    )
                continue
            regs = dict(cpu.regs)
            regs["TRCTRACEIDR"] = tid
            name = f"cpu{cpu.cpu} ID {tid:#x} @{b.record:#x}"
            out.append(
                Source(name, cpu.protocol, tid, stream, regs, b.offsets[tid], b.indices[tid], g)
            )
    return out, frames


def _buffer_mode(fmt: str) -> str:
    return "dstream" if fmt.startswith("dstream") else "memory"


def _file_offsets(src: Source, offsets: np.ndarray, table: np.ndarray | None = None) -> np.ndarray:
    """Stream offsets as offsets in the file the source came from (or as
    ``table`` maps them)."""
    table = src.file_offset if table is None else table
    if table is None or table.shape[0] == 0:
        return offsets
    return table[np.minimum(offsets, table.shape[0] - 1)]


def _problems(src: Source, errors) -> None:
    for off, msg in errors:
        where = (
            int(_file_offsets(src, np.array([off], np.int64))[0])
            if src.file_offset is not None
            else off
        )
        sys.stderr.write(f"{PROG}: {src.name}: offset {where:#x}: {msg}\n")


def _decode(src: Source, resync: bool):
    """The source's packets; ``resync=False`` carries on after damage as
    OpenCSD's packet processors do (the listing), True skips to the next
    sync packet (the events)."""
    if src.protocol == "stm":
        from ..hwevents.stp import decode_stp

        pk = decode_stp(src.data, resync=resync, blocks=src.block_starts())
    else:
        from ..hwevents.etm4 import Etm4Config, decode_etm4

        regs = dict(src.regs)
        if src.protocol == "ete":
            # OpenCSD's default for an ETE without TRCDEVARCH: ETE 1.0
            regs.setdefault("TRCDEVARCH", 0x47705A13)
        config = Etm4Config.from_regs(regs) if src.regs else Etm4Config(ete=src.protocol == "ete")
        pk = decode_etm4(src.data, config, resync=resync)
    _problems(src, pk.errors)
    return pk


def _stm_index(src: Source, nibble: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """OpenCSD's indices of STM packets (or damage) starting at ``nibble``
    of the stream, whose stream offsets the decoder gave as ``offset``."""
    byte = np.asarray(nibble, np.int64) // 2
    after = np.asarray(offset, np.int64) - byte
    return _file_offsets(src, byte, src.list_index) + after


def _dump(src: Source):
    pk = _decode(src, resync=False)
    if src.protocol == "stm" and src.list_index is not None:
        # OpenCSD counts the bytes consumed when a packet's first nibble is
        # read: a packet starting in a high nibble is at its byte's index + 1
        # (within the block that byte came in), except an ASYNC found while
        # synchronising, at the byte of its first F: the decoder's offset
        # says which.
        offsets = _stm_index(src, pk.nibble, pk.offset)
        errs = _stm_index(src, pk.error_nibbles, pk.error_offsets)
        shown = replace(pk, offset=offsets, error_offsets=errs)
    else:
        offsets = _file_offsets(src, np.asarray(pk.offset, np.int64), src.list_index)
        shown = replace(pk, offset=offsets)
    if src.protocol == "stm":
        from ..hwevents.stp import stp_dump_lines

        lines = stp_dump_lines(src.data, shown, src.trace_id)
    else:
        from ..hwevents.etm4 import etm4_dump_lines

        lines = etm4_dump_lines(src.data, shown, src.trace_id, ete=src.protocol == "ete")
    # Damage lines (STM) come between packets: every line carries its index.
    for line in lines:
        yield int(line[4 : line.index(";")]), line


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


def _events(a, sources: list[Source], out) -> int:
    try:
        at = _addresses(a.at)
    except ValueError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 2
    rows: list[dict] = []
    for src in sources:
        pk = _decode(src, resync=True)
        if src.protocol == "stm":
            from ..hwevents.stp import stp_events

            ev = stp_events(pk, a.convention)
            first = _file_offsets(src, np.asarray(pk.offset, np.int64)[ev.first])
            for k in range(len(ev)):
                row = {"source": src.name, "event": "stm", "master": int(ev.master[k]),
                       "channel": int(ev.channel[k]), "offset": int(first[k])}  # fmt: skip
                if ev.has_ts[k]:
                    row["ts"] = int(ev.ts[k])
                row["payload"] = ev.data(k).hex()
                if not ev.complete[k]:
                    row["partial"] = True
                rows.append(row)
            if ev.partial or ev.lost:
                sys.stderr.write(f"{PROG}: {src.name}: {ev.partial} events cut short, "
                                 f"{ev.lost} STM error packets (trace lost)\n")  # fmt: skip
        else:
            from ..hwevents.etm4 import trace_on_events

            ev = trace_on_events(pk, at)
            offsets = _file_offsets(src, np.asarray(ev.offset, np.int64))
            for k in range(len(ev)):
                row = {"source": src.name, "event": ev.name[k], "offset": int(offsets[k]),
                       "address": f"{int(ev.address[k]):#x}"}  # fmt: skip
                if int(ev.ts[k]) >= 0:
                    row["ts"] = int(ev.ts[k])
                if int(ev.cc[k]) >= 0:
                    row["cc"] = int(ev.cc[k])
                if ev.name[k] == "ITE":
                    row["payload"] = f"{int(ev.payload[k]):#x}"
                else:
                    row["context"] = f"{int(ev.context[k]):#x}"
                rows.append(row)
    if a.json:
        Path(a.json).write_text("".join(json.dumps(r) + "\n" for r in rows))
    if a.events:
        for r in rows:
            rest = " ".join(f"{k}={v}" for k, v in r.items() if k not in ("source", "event"))
            out.write(f"{r['source']}: {r['event']} {rest}\n")
    return 0
