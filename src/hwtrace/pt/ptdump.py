"""Packet dumps: Intel's ``ptdump`` text format, a human format and JSON lines.

:func:`dump_stream` reads a trace in chunks and writes its listing as it
goes, so memory stays the same whatever the trace's size: the compiled
streaming decoder (:func:`hwtrace.pt._loops.decode_stream`) turns each
chunk into a bounded table of packets, the time model follows them from
table to table when time is shown, and the compiled text writer
(:func:`hwtrace.pt._ptdump_loop.format_loop`) prints many packets per
call into one output buffer.  How the input is cut into chunks never shows
in the output.  With ``--quiet`` (nothing but errors) the decoder only
checks the stream and stores no packets.

The loops are hwtrace loops (:mod:`hwtrace.aot`): from the native
library built ahead of time when it has them, so dumping a trace does not
import numba, else through numba.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from ._loops import decode_stream
from ._ptdump_loop import format_loop
from ._state import (
    F_TRACK,
    KEEP_MAX,
    LINE_MAX,
    STOP_DONE,
    STOP_INPUT,
    new_decoder_state,
    new_format_state,
)
from .config import PtConfig
from .dumpplain import CHUNK_SIZE, ERROR_ROWS, OUT_SIZE, TABLE_ROWS, DumpOptions, DumpSummary
from .packets import ROW_TYPES, PacketTable, new_errors, new_rows, packet_errata, table_of

if TYPE_CHECKING:
    from .timing import TimeColumns

__all__ = [
    "CHUNK_SIZE",
    "DumpOptions",
    "DumpSummary",
    "dump_stream",
    "format_table",
    "ptdump_lines",
]

_EMPTY_TIMES = (
    np.zeros(0, np.int64),
    np.zeros(0, np.bool_),
    np.zeros(0, np.int64),
    np.zeros(0, np.bool_),
    np.zeros(0, np.int64),
    np.zeros(0, np.int8),
    np.zeros(0, np.int8),
)


def _times_bundle(times: TimeColumns | None) -> tuple[np.ndarray, ...]:
    if times is None:
        return _EMPTY_TIMES
    return (
        np.ascontiguousarray(times.tsc).view(np.int64),
        np.ascontiguousarray(times.have_tsc, np.bool_),
        np.ascontiguousarray(times.fcr, np.int64),
        np.ascontiguousarray(times.have_fcr, np.bool_),
        np.ascontiguousarray(times.diag_index, np.int64),
        np.ascontiguousarray(times.diag_kind, np.int8),
        np.ascontiguousarray(times.diag_error, np.int8),
    )


class _TextWriter:
    """Formats tables of one stream with the text loop, keeping its
    tracking state (last IP, previous time) from table to table."""

    def __init__(
        self, options: DumpOptions, out_size: int = OUT_SIZE, *, track: bool = False
    ) -> None:
        self.state = new_format_state(options.flags() | (F_TRACK if track else 0))
        self.out = np.empty(max(out_size, 2 * LINE_MAX), np.uint8)

    def blocks(
        self,
        table: PacketTable,
        raw: np.ndarray,
        base: int,
        times: TimeColumns | None,
        *,
        last: bool,
        inserts: dict[int, bytes] | None = None,
    ) -> Iterator[memoryview | bytes]:
        """The text of ``table``'s packets and errors (and, with ``last``,
        of the errors after its last packet), in blocks valid until the
        next one is asked for.  ``inserts`` are printed before the lines of
        the packets they are keyed by, after those packets' diagnostics, as
        Intel's ptdump prints sideband when it updates the time."""
        # The loops take C arrays of these types (no copy when they are).
        columns = (table.offset, table.kind, table.size, table.a, table.b, table.c)
        rows = tuple(
            np.ascontiguousarray(col, t) for col, t in zip(columns, ROW_TYPES, strict=True)
        )
        errs = (
            np.ascontiguousarray(table.err_index, np.int64),
            np.ascontiguousarray(table.err_offset, np.int64),
            np.ascontiguousarray(table.err_code, np.int8),
        )
        bundle = _times_bundle(times)
        nerr = errs[0].shape[0]
        s = self.state[0]
        s["base"] = base
        s["next"] = 0
        s["error"] = 0
        s["diag"] = 0
        n = len(table)
        cuts = sorted(k for k in inserts if k < n) if inserts else []
        for cut in [*cuts, n]:
            # Through the packet of an insert (its line split from what
            # comes before it), or to the end.
            stop = cut + 1 if cut < n else n
            s["stop"] = stop
            s["mark"] = cut if cut < n else -1
            s["split"] = -1
            s["last"] = int(last and stop == n)
            while True:
                size = int(format_loop(rows, errs, bundle, raw, self.state, self.out))
                split = int(s["split"])
                if split >= 0:
                    s["split"] = -1
                    s["mark"] = -1
                    if split:
                        yield memoryview(self.out)[:split]
                    yield inserts[cut]
                    if size > split:
                        yield memoryview(self.out)[split:size]
                elif size:
                    yield memoryview(self.out)[:size]
                if s["next"] >= stop and (not s["last"] or s["error"] >= nerr):
                    break


# A hook giving the text to print before packets of a table (sideband).
Inserts = Callable[[PacketTable, "TimeColumns | None"], dict[int, bytes]]


def dump_stream(
    source: BinaryIO,
    write: Callable[[memoryview | bytes], object],
    options: DumpOptions,
    config: PtConfig | None = None,
    *,
    sync: bool = True,
    style: str = "ptdump",
    color: bool = False,
    need_time: bool = False,
    inserts: Inserts | None = None,
    chunk_size: int | None = None,
    table_rows: int | None = None,
    out_size: int | None = None,
) -> DumpSummary:
    """Decode the stream ``source`` reads (from its current position to its
    end) chunk by chunk and ``write`` its listing: Intel's ptdump text,
    ``style="json"`` or ``"human"`` (:mod:`hwtrace.pt.render`).

    ``sync``: start at the first PSB, as Intel's ptdump does (else at the
    first byte).  ``need_time``: run the time model even when no time is
    shown (its diagnostics are printed; the sideband needs it).
    ``inserts(table, times)`` gives text to print before some of a table's
    packets.  Memory use depends on ``chunk_size``, ``table_rows`` and
    ``out_size`` (default :data:`CHUNK_SIZE`, :data:`TABLE_ROWS`,
    :data:`OUT_SIZE`), not on the stream.
    """
    chunk_size = max(chunk_size or CHUNK_SIZE, 1)
    table_rows = max(table_rows or TABLE_ROWS, 1)
    ptdump = style == "ptdump"
    track = options.track_time or (need_time and ptdump)
    store = not (ptdump and options.quiet and not options.lastip and not track and not inserts)
    buf = np.empty(chunk_size + KEEP_MAX, np.uint8)
    state = new_decoder_state(sync=sync, errata=packet_errata(config))
    s = state[0]
    rows = new_rows(table_rows if store else 0)
    errs = new_errors(ERROR_ROWS)
    text = _TextWriter(options, out_size or OUT_SIZE, track=track) if ptdump else None
    time_state = None
    if track:
        from .timing import new_time_state

        time_state = new_time_state()
    summary = DumpSummary()
    base = 0  # the stream offset of buf[0]
    avail = 0
    eof = False
    carried = 0  # errors after the last packet of a table: moved to the next
    stop = STOP_INPUT
    while True:
        if stop == STOP_INPUT:
            keep = int(s["keep"]) - base if avail else 0
            if keep:
                buf[: avail - keep] = buf[keep:avail]
                base += keep
                avail -= keep
            if avail + chunk_size > buf.shape[0]:  # (the decoder keeps less than KEEP_MAX)
                buf = np.concatenate([buf[:avail], np.empty(chunk_size, np.uint8)])
            end = avail + chunk_size
            while not eof and avail < end:
                got = source.readinto(memoryview(buf)[avail:end])
                if not got:
                    eof = True
                    break
                avail += got
                summary.bytes += got
        if carried >= errs[0].shape[0]:
            errs = tuple(np.concatenate([col, col]) for col in errs)
        s["base"] = base
        s["final"] = int(eof)
        s["errors"] = carried
        stop = int(decode_stream(buf, avail, state, rows, errs, store))
        n, nerr = int(s["rows"]), int(s["errors"])
        if stop == STOP_INPUT and eof:
            raise AssertionError("the decoder asked for input after the end")
        done = stop == STOP_DONE
        # Errors after the table's last packet go with the next table (the
        # packet after an error starts afresh: time model, last IP).
        if store and not done:
            trailing = nerr - int(np.searchsorted(errs[2][:nerr], n, "left"))
        else:
            trailing = 0
        table = table_of(rows, errs, n, nerr - trailing)
        _note_errors(summary, table)
        if n or nerr - trailing:
            times = None
            if track:
                times = options.estimate_time(table, config, time_state)
            if text is not None:
                extra = inserts(table, times) if inserts is not None else None
                raw = buf[:avail]
                for block in text.blocks(
                    table, raw, base, times, last=done or not store, inserts=extra
                ):
                    write(block)
            else:
                from .render import human_lines, json_lines

                lines = (
                    json_lines(table, times)
                    if style == "json"
                    else human_lines(table, times, color)
                )
                for block in lines:
                    write(block)
        if trailing:
            for col in errs:
                col[:trailing] = col[nerr - trailing : nerr]
            errs[2][:trailing] = 0
        carried = trailing
        if done:
            break
    summary.packets = int(s["packets"])
    summary.synced = bool(s["synced"])
    return summary


def _note_errors(summary: DumpSummary, table: PacketTable) -> None:
    for off, code in zip(table.err_offset.tolist(), table.err_code.tolist(), strict=True):
        summary.note_error(off, code)


def format_table(
    table: PacketTable,
    buf: np.ndarray,
    options: DumpOptions,
    times: TimeColumns | None = None,
    inserts: dict[int, bytes] | None = None,
) -> Iterator[bytes]:
    """Intel ptdump text for a whole decoded ``table`` (``buf`` the stream
    it was decoded from, for ``--raw``), in blocks."""
    raw = np.ascontiguousarray(buf, np.uint8)
    if not raw.flags.writeable:
        # (read-only, a ``np.frombuffer`` of bytes: copied, as the stream
        # dump's buffer is writable; the compiled loop has that one
        # specialisation, and a copy is a fraction of writing the text)
        raw = raw.copy()
    text = _TextWriter(options)
    for block in text.blocks(table, raw, 0, times, last=True, inserts=inserts):
        yield bytes(block)


def ptdump_lines(
    table: PacketTable,
    buf: np.ndarray,
    options: DumpOptions,
    config: PtConfig | None = None,
    times: TimeColumns | None = None,
    inserts: dict[int, bytes] | None = None,
) -> Iterator[bytes]:
    """Yield Intel ptdump text for ``table`` in blocks of bytes.

    ``buf`` is the stream the table was decoded from (for ``--raw``).
    Truncated-packet errors are not printed: Intel's ptdump ends silently
    there; callers report them separately.  ``inserts`` maps packet indices
    to text printed just before that packet's line (sideband records).
    """
    if options.track_time and times is None:
        times = options.estimate_time(table, config)
    return format_table(table, buf, options, times, inserts)
