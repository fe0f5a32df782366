"""ptdump's text without numpy: the options, and the plain listing.

A packet dump of a small trace is over in a few milliseconds of compiled
work; importing numpy takes longer than that.  :func:`dump_plain` lists a
stream as :func:`hwtrace.pt.ptdump.dump_stream` does in Intel's ptdump
text, chunk by chunk through the same two compiled loops (the streaming
packet decoder and the text loop), called straight from the native
library (:class:`hwtrace.aot.NativeLoop`) on ctypes buffers
(:class:`hwtrace.aot.Buffer`) with the loops' state records as int64
words.  It takes what needs no time model and no sideband; for the rest,
or when the library lacks the loops (not built yet, sources changed), it
returns None and the caller goes through ``dump_stream``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from ..aot import Buffer, NativeLoop
from ._state import (
    DECODER_FIELDS,
    FORMAT_FIELDS,
    KEEP_MAX,
    LINE_MAX,
    OPTION_FLAGS,
    PHASE_DECODE,
    PHASE_SYNC,
    STOP_DONE,
    STOP_INPUT,
    packet_errata,
    record_key,
)
from .kinds import DecodeError

if TYPE_CHECKING:
    import numpy as np

    from .config import PtConfig
    from .packets import PacketTable
    from .timing import TimeColumns

# Input read per chunk, packet rows per table, output bytes per write.
CHUNK_SIZE = 1 << 20
TABLE_ROWS = 1 << 18
OUT_SIZE = 1 << 20
ERROR_ROWS = 1 << 10


@dataclass
class DumpOptions:
    """ptdump's options (same names, same defaults)."""

    show_offset: bool = True
    raw: bool = False
    lastip: bool = False
    exec_mode: bool = False
    time: bool = False
    tcal: bool = False
    time_delta: bool = False
    quiet: bool = False
    no_pad: bool = False
    no_timing: bool = False
    no_cyc: bool = False
    no_tcal: bool = False
    no_wall_clock: bool = False
    keep_tcal_on_ovf: bool = False

    @property
    def track_time(self) -> bool:
        return self.time or self.tcal

    def estimate_time(
        self, table: PacketTable, config: PtConfig | None, state: np.ndarray | None = None
    ) -> TimeColumns:
        """The time model as these options ask for it (from ``state``, left
        by an earlier table of the same stream, when given)."""
        from .timing import estimate_time

        return estimate_time(
            table,
            config,
            calibrate=not self.no_tcal,
            use_cyc=not self.no_cyc,
            keep_tcal_on_ovf=self.keep_tcal_on_ovf,
            state=state,
        )

    def flags(self) -> int:
        """The options as the text loop's flag bits."""
        return sum(bit for name, bit in OPTION_FLAGS.items() if getattr(self, name))


@dataclass
class DumpSummary:
    """What a dump met, for the messages after the listing."""

    bytes: int = 0  # stream bytes read
    packets: int = 0
    synced: bool = False  # a PSB was found (or --no-sync)
    first_error: tuple[int, DecodeError] | None = None  # (offset, why), not truncation
    error_count: int = 0  # decode errors other than a truncated last packet
    truncated_at: int | None = None  # the stream ends inside the packet there

    def note_error(self, offset: int, code: int) -> None:
        """An error of the decoder's at ``offset``."""
        if code == DecodeError.TRUNCATED:
            self.truncated_at = offset
        else:
            self.error_count += 1
            if self.first_error is None:
                self.first_error = (offset, DecodeError(code))


# The packet columns (offset, kind, size, a, b, c) and error columns
# (offset, DecodeError, row index) as the loops take them: ctypes type and
# numpy's type string (hwtrace.pt.packets.ROW_TYPES, new_errors).
_ROWS = (
    (ctypes.c_int64, "<i8"), (ctypes.c_uint8, "|u1"), (ctypes.c_uint8, "|u1"),
    (ctypes.c_uint64, "<u8"), (ctypes.c_uint32, "<u4"), (ctypes.c_uint8, "|u1"),
)  # fmt: skip
_ERRORS = ((ctypes.c_int64, "<i8"), (ctypes.c_int8, "|i1"), (ctypes.c_int64, "<i8"))
# The text loop's time columns (hwtrace.pt.ptdump's, empty: no time shown).
_TIMES = (
    (ctypes.c_int64, "<i8"), (ctypes.c_bool, "|b1"), (ctypes.c_int64, "<i8"),
    (ctypes.c_bool, "|b1"), (ctypes.c_int64, "<i8"), (ctypes.c_int8, "|i1"),
    (ctypes.c_int8, "|i1"),
)  # fmt: skip


class _Record:
    """A loop's one-record state (int64 fields) in a :class:`Buffer`."""

    def __init__(self, fields: tuple[str, ...], **values: int) -> None:
        self.buffer = Buffer(ctypes.c_int64 * len(fields), 1, record_key(fields), record=True)
        self.words = self.buffer.memory().cast("q")
        self.index = {name: i for i, name in enumerate(fields)}
        for name, value in values.items():
            self[name] = value

    def __getitem__(self, name: str) -> int:
        return self.words[self.index[name]]

    def __setitem__(self, name: str, value: int) -> None:
        self.words[self.index[name]] = value


def _columns(types, length: int) -> tuple[Buffer, ...]:
    return tuple(Buffer(ct, length, dt) for ct, dt in types)


def dump_plain(
    source: BinaryIO,
    write: Callable[[memoryview | bytes], object],
    options: DumpOptions,
    config: PtConfig | None = None,
    *,
    sync: bool = True,
    chunk_size: int | None = None,
    table_rows: int | None = None,
    out_size: int | None = None,
    size_hint: int | None = None,
) -> DumpSummary | None:
    """Intel ptdump's listing of the stream ``source`` reads (from its
    current position to its end), as
    :func:`~hwtrace.pt.ptdump.dump_stream` writes it with ``options``
    and no sideband, without numpy.  None, having read nothing, when the
    options need the time model or the native library lacks the loops.
    ``size_hint``: about how many bytes ``source`` holds (buffers are
    sized for them; it may hold more)."""
    if options.track_time:
        return None
    chunk_size = max(chunk_size or CHUNK_SIZE, 1)
    table_rows = max(table_rows or TABLE_ROWS, 1)
    out_size = max(out_size or OUT_SIZE, 2 * LINE_MAX)
    if size_hint is not None:
        # A small input, small buffers: zeroing the megabytes of the
        # defaults takes longer than listing a few kilobytes (a packet
        # is a byte at least; a line a few dozen).
        chunk_size = min(chunk_size, max(size_hint, 1))
        table_rows = min(table_rows, max(size_hint, 1))
        out_size = min(out_size, max(64 * size_hint, 2 * LINE_MAX))
    store = not (options.quiet and not options.lastip)
    buf = Buffer(ctypes.c_uint8, chunk_size + KEEP_MAX, "|u1")
    state = _Record(
        DECODER_FIELDS, phase=PHASE_SYNC if sync else PHASE_DECODE, synced=int(not sync),
        walk=-1, resync=1, errata=packet_errata(config),
    )  # fmt: skip
    rows = _columns(_ROWS, table_rows if store else 0)
    errs = _columns(_ERRORS, ERROR_ROWS)
    times = _columns(_TIMES, 0)
    text = _Record(FORMAT_FIELDS, flags=options.flags(), mark=-1, split=-1)
    out = Buffer(ctypes.c_uint8, out_size, "|u1")
    decode = NativeLoop("hwtrace.pt._loops:decode_stream").entry(
        buf, 0, state.buffer, rows, errs, store
    )
    # (the text loop takes the errors as row index, offset, code)
    fmt = NativeLoop("hwtrace.pt._ptdump_loop:format_loop").entry(
        rows, (errs[2], errs[0], errs[1]), times, buf, text.buffer, out
    )
    if decode is None or fmt is None:
        return None
    memory, out_memory = buf.memory(), out.memory()
    summary = DumpSummary()
    base = 0  # the stream offset of buf's first byte
    avail = 0
    eof = False
    carried = 0  # errors after the last packet of a table: moved to the next
    stop = STOP_INPUT
    while True:
        if stop == STOP_INPUT:
            keep = state["keep"] - base if avail else 0
            if keep:
                memory[: avail - keep] = memory[keep:avail]
                base += keep
                avail -= keep
            end = avail + chunk_size  # (the decoder keeps less than KEEP_MAX)
            while not eof and avail < end:
                got = source.readinto(memory[avail:end])
                if not got:
                    eof = True
                    break
                avail += got
                summary.bytes += got
        if carried >= len(errs[0]):
            grown = _columns(_ERRORS, 2 * len(errs[0]))
            for old, new in zip(errs, grown, strict=True):
                new.memory()[: len(old) * old.itemsize] = old.memory()
            errs = grown
        state["base"] = base
        state["final"] = int(eof)
        state["errors"] = carried
        stop = int(decode(buf, avail, state.buffer, rows, errs, store))
        n, nerr = state["rows"], state["errors"]
        if stop == STOP_INPUT and eof:
            raise AssertionError("the decoder asked for input after the end")
        done = stop == STOP_DONE
        # Errors after the table's last packet go with the next table (the
        # packet after an error starts afresh: time model, last IP).
        err_offset = errs[0].memory().cast("q")
        err_code = errs[1].memory().cast("b")
        err_row = errs[2].memory().cast("q")
        kept = nerr
        if store and not done:
            while kept and err_row[kept - 1] >= n:
                kept -= 1
        for k in range(kept):
            summary.note_error(err_offset[k], err_code[k])
        if n or kept:
            table = tuple(col.view(0, n) for col in rows)
            table_errs = (errs[2].view(0, kept), errs[0].view(0, kept), errs[1].view(0, kept))
            _write_text(fmt, table, table_errs, times, buf.view(0, avail), text, out,
                        out_memory, base, done or not store, write)  # fmt: skip
        trailing = nerr - kept
        for col in errs:
            size = col.itemsize
            m = col.memory()
            m[: trailing * size] = m[kept * size : nerr * size]
        for k in range(trailing):
            err_row[k] = 0
        carried = trailing
        if done:
            break
    summary.packets = state["packets"]
    summary.synced = bool(state["synced"])
    return summary


def _write_text(fmt, rows, errs, times, raw, text: _Record, out: Buffer, out_memory: memoryview,
                base: int, last: bool, write) -> None:  # fmt: skip
    """The text of one table's packets and errors (and, with ``last``, of
    the errors after its last packet), as ``_TextWriter.blocks`` writes it
    without sideband."""
    n, nerr = len(rows[0]), len(errs[0])
    text["base"] = base
    for name in ("next", "error", "diag"):
        text[name] = 0
    text["stop"] = n
    text["mark"] = -1
    text["split"] = -1
    text["last"] = int(last)
    while True:
        size = int(fmt(rows, errs, times, raw, text.buffer, out))
        if size:
            write(out_memory[:size])
        if text["next"] >= n and (not text["last"] or text["error"] >= nerr):
            break


__all__ = ["CHUNK_SIZE", "DumpOptions", "DumpSummary", "dump_plain"]
