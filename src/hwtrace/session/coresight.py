"""An ARM CoreSight capture opened once: its trace sources (STM's MIPI STPv2,
ETMv4, ETE), listed packet by packet as OpenCSD's ``trc_pkt_lister`` (and
``perf report -D``) lists them, and the software events they carry (STM
messages, ETM trace-on at registered addresses, ETE ITE).

A capture is a raw trace file (one source, or several in CoreSight
formatter frames), an OpenCSD snapshot directory, or a perf.data recorded
with ``perf record -e cs_etm//``::

    capture = CoreSightCapture.snapshot("juno-snapshot")
    for line in capture.listing():
        print(line)

Problems found on the way (formatter damage, packets that do not decode,
trace IDs with no CPU) go to ``warn`` as one line each, naming the source
and the file offset; what could be read is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..columns import Ramps
from ..hwevents.csframes import block_maps, deformat

if TYPE_CHECKING:
    from ..hwevents.etm4 import Etm4Config

PROTOCOLS = ("stm", "etm4", "ete")
FRAME_MODES = ("memory", "fsync", "hsync", "dstream")
_TYPES = {"STM": "stm", "ETM4": "etm4", "ETMV4": "etm4", "ETE": "ete"}
_LISTER_READ = 1024  # trc_pkt_lister reads a source's own buffer 1 KiB at a time
_NONE = np.zeros(0, np.int64)

#: lines of a source listed at a time (about 1 MB of text)
LISTING_ROWS = 1 << 14

#: lines: their text, where each starts (and the end) and their indices
_Lines = tuple[np.ndarray, np.ndarray, np.ndarray]

Warn = Callable[[str], None]


def _ignore(message: str) -> None:
    pass


@dataclass
class TraceSource:
    """One trace source's bytes: its name, protocol, trace ID, registers,
    and where each byte was in the file (None: at its own offset)."""

    name: str
    protocol: str
    trace_id: int
    data: bytes
    regs: dict[str, int]
    #: per byte, where it was in the file (None: at its own offset)
    file_offset: np.ndarray | Ramps | None = None
    #: per byte, the index OpenCSD lists its packets at (the start of the
    #: frame's run of the ID); None: the file offset
    list_index: np.ndarray | Ramps | None = None
    #: sources of one group are listed together, groups in order (perf.data:
    #: one group per AUX buffer fragment, as perf dumps them)
    group: int = 0
    #: stream offsets where the blocks OpenCSD is handed the data in begin
    #: (None: blocks of the size trc_pkt_lister reads a file in)
    blocks: np.ndarray | None = None
    warn: Warn = field(default=_ignore, repr=False)

    def block_starts(self) -> np.ndarray:
        if self.blocks is not None:
            return self.blocks
        return np.arange(0, len(self.data), _LISTER_READ, dtype=np.int64)

    def file_offsets(
        self, offsets: np.ndarray, table: np.ndarray | Ramps | None = None
    ) -> np.ndarray:
        """Stream offsets as offsets in the file the source came from (or
        as ``table`` maps them)."""
        table = self.file_offset if table is None else table
        if table is None or len(table) == 0:
            return offsets
        rows = np.minimum(offsets, len(table) - 1)
        return table.at(rows) if isinstance(table, Ramps) else table[rows]

    def etm4_config(self) -> Etm4Config:
        """The trace unit's configuration an ETMv4/ETE source is decoded
        with (from its registers; without any, OpenCSD's defaults)."""
        from ..hwevents.etm4 import Etm4Config

        regs = dict(self.regs)
        ete = self.protocol == "ete"
        if ete:
            # OpenCSD's default for an ETE without TRCDEVARCH: ETE 1.0
            regs.setdefault("TRCDEVARCH", 0x47705A13)
        return Etm4Config.from_regs(regs) if self.regs else Etm4Config(ete=ete)

    def _warn_damage(self, errors: Sequence[tuple[int, str]]) -> None:
        for off, msg in errors:
            where = off
            if self.file_offset is not None:
                where = int(self.file_offsets(np.array([off], np.int64))[0])
            self.warn(f"{self.name}: offset {where:#x}: {msg}")

    def packets(self, resync: bool):
        """The source's packets; ``resync=False`` carries on after damage as
        OpenCSD's packet processors do (the listing), True skips to the next
        sync packet (the events).  Damage goes to ``warn``."""
        if self.protocol == "stm":
            from ..hwevents.stp import decode_stp

            pk = decode_stp(self.data, resync=resync, blocks=self.block_starts())
        else:
            from ..hwevents.etm4 import decode_etm4

            pk = decode_etm4(self.data, self.etm4_config(), resync=resync)
        self._warn_damage(pk.errors)
        return pk

    def _stm_index(self, nibble: np.ndarray, offset: np.ndarray) -> np.ndarray:
        """OpenCSD's indices of STM packets (or damage) starting at
        ``nibble`` of the stream, whose stream offsets the decoder gave as
        ``offset``."""
        byte = np.asarray(nibble, np.int64) // 2
        after = np.asarray(offset, np.int64) - byte
        return self.file_offsets(byte, self.list_index) + after

    def listing_chunks(
        self, rows: int = LISTING_ROWS
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """trc_pkt_lister's lines of the source, in pieces of about ``rows``
        lines: each a ``uint8`` text, where its lines start (one more than
        there are lines, the last the text's end) and the index each line
        is at.  The source is decoded a piece at a time, so its listing
        takes the memory of a piece whatever its length."""
        if self.protocol == "stm":
            from ..hwevents.stp import stp_windows

            for pk in stp_windows(self.data, resync=False, blocks=self.block_starts(), rows=rows):
                self._warn_damage(pk.errors)
                yield self._stm_lines(pk)
            return
        from ..hwevents.etm4 import etm4_windows
        from ..hwevents.etm4text import etm4_listing

        ete = self.protocol == "ete"
        for pk in etm4_windows(self.data, self.etm4_config(), resync=False, rows=rows):
            self._warn_damage(pk.errors)
            index = self.file_offsets(np.asarray(pk.offset, np.int64), self.list_index)
            text, starts = etm4_listing(replace(pk, offset=index), self.trace_id, ete=ete)
            yield text, starts, index

    def _stm_lines(self, pk) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The listing of STM packets (a window of the source's)."""
        from ..hwevents.stptext import stp_listing

        if self.list_index is None:
            return stp_listing(pk, self.trace_id)
        # OpenCSD counts the bytes consumed when a packet's first nibble is
        # read: a packet starting in a high nibble is at its byte's index
        # + 1 (within the block that byte came in), except an ASYNC found
        # while synchronising, at the byte of its first F: the decoder's
        # offset says which.
        offsets = self._stm_index(pk.nibble, pk.offset)
        errs = self._stm_index(pk.error_nibbles, pk.error_offsets)
        return stp_listing(replace(pk, offset=offsets, error_offsets=errs), self.trace_id)

    def listing_text(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """trc_pkt_lister's lines of the source as one ``uint8`` text, where
        each line starts (one more than there are lines, the last the
        text's end) and the index each line is at."""
        return _joined(list(self.listing_chunks()))

    def listing(self) -> Iterator[tuple[int, str]]:
        """trc_pkt_lister's lines of the source, with the index each is at."""
        text, _, index = self.listing_text()
        lines = bytes(text).decode().split("\n")
        return zip(index.tolist(), lines[: len(index)], strict=True)

    def events(self, convention: str = "flag", at: dict[int, str] | None = None) -> list[dict]:
        """The software events: STM messages (ending at a FLAG or at a
        marked packet: ``convention``), ETM trace-on at the addresses named
        in ``at``, ETE ITE; one dict a row, file offsets."""
        rows: list[dict] = []
        if self.protocol == "stm":
            from ..hwevents.stp import stp_event_windows, stp_windows

            def windows():
                # (a window of packets at a time, its damage reported as it comes)
                for pk in stp_windows(self.data, resync=True, blocks=self.block_starts(),
                                      rows=LISTING_ROWS):  # fmt: skip
                    self._warn_damage(pk.errors)
                    yield pk

            partial = lost = 0
            for pk, ev in stp_event_windows(windows(), convention):
                first = self.file_offsets(np.asarray(pk.offset, np.int64)[ev.first])
                for k in range(len(ev)):
                    row = {"source": self.name, "event": "stm", "master": int(ev.master[k]),
                           "channel": int(ev.channel[k]), "offset": int(first[k])}  # fmt: skip
                    if ev.has_ts[k]:
                        row["ts"] = int(ev.ts[k])
                    row["payload"] = ev.data(k).hex()
                    if not ev.complete[k]:
                        row["partial"] = True
                    rows.append(row)
                partial, lost = partial + ev.partial, lost + ev.lost
            if partial or lost:
                self.warn(f"{self.name}: {partial} events cut short, "
                          f"{lost} STM error packets (trace lost)")  # fmt: skip
            return rows
        from ..hwevents.etm4 import event_packets, trace_on_events

        pk = event_packets(self.data, self.etm4_config(), on_damage=self._warn_damage)
        ev = trace_on_events(pk, at or {})
        offsets = self.file_offsets(np.asarray(ev.offset, np.int64))
        for k in range(len(ev)):
            row = {"source": self.name, "event": ev.name[k], "offset": int(offsets[k]),
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
        return rows


@dataclass
class CoreSightCapture:
    """A capture's trace sources, and the formatted buffers they were cut
    from (``(bytes, frame mode)``, for a listing of the frames)."""

    sources: list[TraceSource]
    frames: list[tuple[bytes, str]]

    @classmethod
    def raw(
        cls,
        path: str | Path,
        protocol: str,
        *,
        frames: str | None = None,
        regs: dict[str, int] | None = None,
        ids: Sequence[int] = (),
        warn: Warn = _ignore,
    ) -> CoreSightCapture:
        """A raw trace file of ``protocol``: one source, or (``frames``: a
        mode of :data:`FRAME_MODES`) one per trace ID of its formatter
        frames (``ids``: only these).  ``regs``: the trace unit's registers
        (TRCIDR0, STMTCSR, ...).  Raises ValueError on a missing file."""
        if protocol not in PROTOCOLS:
            raise ValueError(f"{protocol}: not one of {', '.join(PROTOCOLS)}")
        path = Path(path)
        if not path.is_file():
            # (a device or pipe could be endless: only files are read whole)
            raise ValueError(f"{path}: {'not a regular file' if path.exists() else 'no such file'}")
        data = path.read_bytes()
        regs = dict(regs or {})
        if frames is None:
            if protocol == "stm":
                tid = (regs.get("STMTCSR", 0) >> 16) & 0x7F
            else:
                tid = regs.get("TRCTRACEIDR", 0)
            return cls([TraceSource(str(path), protocol, tid, data, regs, warn=warn)], [])
        # Every ID's stream is cut (no more bytes than the file's): those not
        # asked for are left out, not reported as unknown.
        cut = _Frames(data, frames, str(path), warn)
        sources = [
            cut.source(f"{path} ID {tid:#x}", protocol, tid, regs)
            for tid in sorted(cut.streams)
            if not ids or tid in ids
        ]
        if ids and not sources and cut.streams:
            asked = " or ".join(f"{i:#x}" for i in ids)
            there = ", ".join(f"{t:#x}" for t in sorted(cut.streams))
            raise ValueError(f"{path}: no data of trace ID {asked}; its frames carry IDs {there}")
        return cls(sources, [(data, frames)])

    @classmethod
    def snapshot(
        cls,
        directory: str | Path,
        *,
        ids: Sequence[int] = (),
        names: Sequence[str] = (),
        warn: Warn = _ignore,
    ) -> CoreSightCapture:
        """An OpenCSD snapshot directory's STM, ETMv4 and ETE sources
        (``names``, ``ids``: only these).  Raises ValueError when it has
        none with trace data."""
        from ..hwevents.csframes import trace_ids
        from ..hwevents.cssnapshot import read_snapshot

        snap = read_snapshot(directory)
        trace_id = trace_ids(snap)
        cut: dict[str, _Frames] = {}
        sources = []
        left_out: dict[str, int] = {}  # sources with trace data not asked for: their IDs
        for dev in snap.devices:
            proto = _protocol(dev.type)
            if proto is None or dev.name not in snap.source_buffers:
                continue
            tid = trace_id.get(dev.name, 0)
            if (names and dev.name not in names) or (ids and tid not in ids):
                left_out[dev.name] = tid
                continue
            buf = snap.source_data(dev.name)
            regs = {k.upper(): v for k, v in dev.regs.items()}
            if buf.format == "source_data":
                # one source's own buffer: OpenCSD lists it under ID 0
                sources.append(TraceSource(dev.name, proto, 0, bytes(buf.data), regs, warn=warn))
                continue
            framed = cut.get(buf.name)
            if framed is None:
                framed = cut[buf.name] = _Frames(buf.data, _buffer_mode(buf.format), buf.name, warn)
            sources.append(framed.source(dev.name, proto, tid, regs))
        if not sources and left_out:
            asked = [f"ID {i:#x}" for i in ids] + [f"source {n!r}" for n in names]
            there = ", ".join(f"{n} (ID {i:#x})" for n, i in sorted(left_out.items()))
            raise ValueError(f"{directory}: no trace source with trace data is "
                             f"{' or '.join(asked)}; the snapshot's: {there}")  # fmt: skip
        if not sources:
            raise ValueError(f"{directory}: no STM, ETM4 or ETE trace source with trace data")
        return cls(sources, [(f.data, f.mode) for f in cut.values()])

    @classmethod
    def perf(
        cls, path: str | Path, *, ids: Sequence[int] = (), warn: Warn = _ignore
    ) -> CoreSightCapture:
        """A perf.data recorded with ``perf record -e cs_etm//``: one source
        per trace ID of each AUX buffer fragment perf decodes on its own
        (its decoder restarts between them), with the CPU block's
        registers.  Raises ValueError on a file that cannot be read."""
        from ..perf.cs_etm import cs_etm_buffers, cs_etm_info
        from ..perf.data import PerfData, PerfDataError

        path = Path(path)
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
            warn(str(e))
        sources, frames, unknown = [], [], set()
        for g, b in enumerate(buffers):
            for off, msg in b.errors:
                warn(f"{path}: offset {off:#x}: {msg}")
            if b.formatted:
                frames.append((bytes(b.raw(data)), "memory"))
            for tid, stream in sorted(b.streams.items()):
                if ids and tid not in ids:
                    continue
                cpu = by_id.get(tid)
                if cpu is None or cpu.kind == "ETMv3":
                    if tid not in unknown:
                        unknown.add(tid)
                        why = "no CPU block" if cpu is None else "ETMv3/PTM trace (not decoded)"
                        at = int(b.offsets[tid].values[0]) if len(b.offsets[tid]) else b.record
                        warn(f"{path}: offset {at:#x}: trace ID {tid:#x}: {why}, skipped")
                    continue
                regs = dict(cpu.regs)
                regs["TRCTRACEIDR"] = tid
                name = f"cpu{cpu.cpu} ID {tid:#x} @{b.record:#x}"
                sources.append(
                    TraceSource(
                        name,
                        cpu.protocol,
                        tid,
                        stream,
                        regs,
                        b.offsets[tid],
                        b.indices[tid],
                        g,
                        warn=warn,
                    )
                )
        return cls(sources, frames)

    def listing_chunks(self, rows: int = LISTING_ROWS) -> Iterator[np.ndarray]:
        """trc_pkt_lister's lines of every source, in the order it lists
        them (group by group, by index, sources in order at one index), as
        ``uint8`` texts of whole lines, a few times ``rows`` lines each:
        the sources are decoded and merged a piece at a time."""
        groups = sorted({src.group for src in self.sources})
        for g in groups:
            members = [src for src in self.sources if src.group == g]
            yield from _merge_by_index([src.listing_chunks(rows) for src in members])

    def listing_text(self) -> np.ndarray:
        """trc_pkt_lister's lines of every source as one ``uint8`` text, in
        the order it lists them (:meth:`listing_chunks`, joined)."""
        texts = list(self.listing_chunks())
        if len(texts) == 1:
            return texts[0]
        return np.concatenate(texts) if texts else np.zeros(0, np.uint8)

    def listing(self) -> Iterator[str]:
        """trc_pkt_lister's lines of every source, in the order it lists
        them (:meth:`listing_text`'s lines)."""
        lines = bytes(self.listing_text()).decode().split("\n")
        return iter(lines[:-1])

    def frame_listing_chunks(self) -> Iterator[np.ndarray]:
        """The formatter frames, as ``trc_pkt_lister -o_raw_packed
        -o_raw_unpacked`` lists them, as ``uint8`` texts of whole lines,
        each made when asked for."""
        from ..hwevents.frametext import frame_listing_chunks

        for data, mode in self.frames:
            yield from frame_listing_chunks(data, mode)

    def frame_listing_text(self) -> np.ndarray:
        """:meth:`frame_listing_chunks` as one ``uint8`` text."""
        texts = list(self.frame_listing_chunks())
        return np.concatenate(texts) if texts else np.zeros(0, np.uint8)

    def frame_listing(self) -> Iterator[str]:
        """The formatter frames, as ``trc_pkt_lister -o_raw_packed
        -o_raw_unpacked`` lists them (:meth:`frame_listing_text`'s lines)."""
        return iter(bytes(self.frame_listing_text()).decode().split("\n")[:-1])

    def events(self, convention: str = "flag", at: dict[int, str] | None = None) -> list[dict]:
        """Every source's software events (see :meth:`TraceSource.events`)."""
        return [row for src in self.sources for row in src.events(convention, at)]


def _joined(pieces: list[_Lines]) -> _Lines:
    """Pieces of lines as one."""
    if len(pieces) == 1:
        return pieces[0]
    if not pieces:
        return np.zeros(0, np.uint8), np.zeros(1, np.int64), _NONE
    base = np.cumsum([0] + [len(t) for t, _, _ in pieces[:-1]])
    starts = [s[:-1] + b for (_, s, _), b in zip(pieces, base, strict=True)]
    ends = np.array([base[-1] + len(pieces[-1][0])], np.int64)
    return (np.concatenate([t for t, _, _ in pieces]), np.concatenate([*starts, ends]),
            np.concatenate([i for _, _, i in pieces]))  # fmt: skip


def _cut(lines: _Lines, n: int) -> _Lines:
    """The first ``n`` of ``lines`` as lines of their own (their text cut
    from the piece's)."""
    text, starts, index = lines
    return text[starts[0] : starts[n]], starts[: n + 1] - starts[0], index[:n]


def _in_order(lines: _Lines) -> _Lines:
    """The lines in the order of their indices (stably)."""
    from ..textout import reorder_lines

    text, starts, index = lines
    if index.shape[0] < 2 or bool(np.all(index[1:] >= index[:-1])):
        return lines
    order = np.argsort(index, kind="stable")
    merged, new_starts = reorder_lines(text, starts[:-1], starts[1:], order)
    return merged, new_starts, index[order]


def _merge_by_index(sources: list[Iterator[_Lines]]) -> Iterator[np.ndarray]:
    """The lines of several sources, each given in pieces in the order of
    their indices, merged by index (sources in order at one index), as
    texts: what can be listed is listed as soon as every source still
    going has passed it, so only a piece per source waits."""
    from ..textout import reorder_lines

    k = len(sources)
    pending: list[_Lines | None] = [None] * k
    going = [True] * k

    def pull(j: int) -> None:
        # (until the source has a line waiting or is done)
        while going[j]:
            got = next(sources[j], None)
            if got is None:
                going[j] = False
            else:
                got = _in_order(got)
                before = pending[j]
                if before is not None and len(before[2]):
                    got = _joined([_cut(before, len(before[2])), got])
                pending[j] = got
            if pending[j] is not None and len(pending[j][2]):
                return

    for j in range(k):
        pull(j)
    while True:
        live = [j for j in range(k) if going[j]]
        # Every line below the lowest last index of a source still going is
        # final: later pieces of that source come at that index or after.
        bound = min(int(pending[j][2][-1]) for j in live) if live else None
        out: list[tuple[int, int, _Lines]] = []
        for j in range(k):
            p = pending[j]
            if p is None or not len(p[2]):
                continue
            cut = len(p[2]) if bound is None else int(np.searchsorted(p[2], bound, "left"))
            if cut:
                out.append((j, cut, p))
                text, starts, index = p
                pending[j] = (text, starts[cut:], index[cut:])
        if len(out) == 1:
            _, cut, p = out[0]
            yield _cut(p, cut)[0]
        elif out:
            text, starts, index = _joined([_cut(p, cut) for _, cut, p in out])
            source = np.concatenate([np.full(cut, j, np.int64) for j, cut, _ in out])
            order = np.lexsort((source, index))
            yield reorder_lines(text, starts[:-1], starts[1:], order)[0]
        if not live:
            return
        for j in live:
            if int(pending[j][2][-1]) == bound:
                pull(j)


class _Frames:
    """A buffer of CoreSight formatter frames cut into its trace IDs'
    streams, with the index OpenCSD lists each byte at and the blocks it
    is handed them in."""

    def __init__(self, data: bytes, mode: str, name: str, warn: Warn):
        self.data, self.mode, self.warn = data, mode, warn
        # (each byte's file offset and index as runs: about a number per
        # frame, where arrays took 16 bytes per byte of trace)
        cut = deformat(data, mode=mode, as_ramps=True)
        self.streams = cut.streams
        self.offsets = cut.offsets
        for off, msg in cut.errors:
            warn(f"{name}: offset {off:#x}: {msg}")
        del cut
        self.index, self.starts = block_maps(data, mode)

    def source(self, name: str, protocol: str, tid: int, regs: dict[str, int]) -> TraceSource:
        return TraceSource(name, protocol, tid, self.streams.get(tid, b""), regs,
                           self.offsets.get(tid, Ramps.of(_NONE)), self.index.get(tid),
                           blocks=self.starts.get(tid), warn=self.warn)  # fmt: skip


def _protocol(device_type: str) -> str | None:
    """The protocol of a snapshot device type; DS-5 adds the architecture
    version (``ETM4.1``, ``ETM4.4``), which OpenCSD's snapshot reader cuts
    at the first dot."""
    return _TYPES.get(device_type.split(".", 1)[0].strip().upper())


def _buffer_mode(fmt: str) -> str:
    return "dstream" if fmt.startswith("dstream") else "memory"
