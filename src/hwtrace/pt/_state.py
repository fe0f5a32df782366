"""State records shared by the compiled packet loops and their Python drivers.

The streaming packet decoder (:func:`hwtrace.pt._loops.decode_stream`) and
the ptdump text loop (:func:`hwtrace.pt._ptdump_loop.format_loop`) keep
what must survive from one call to the next in a one-element numpy record
array: named fields on both sides, one pointer for a native caller (the
loops' ahead-of-time library, :mod:`hwtrace.aot`).

Every field is an int64.  This module needs neither numba nor numpy (it
builds the records' numpy types when first asked for them), so a command
can read and set these records without importing either: as numpy records,
or as plain int64 words at the field's index (:data:`DECODER_FIELDS`,
:data:`FORMAT_FIELDS`) where numpy is not loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from .config import PtConfig

# ---------------------------------------------------------------------------
# The streaming decoder (decode_stream)

DECODER_FIELDS = (
    # Where decoding stands (absolute stream offsets: 0 is the first byte
    # of the trace buffer, as libipt's config.begin).
    "pos",  # the next packet (PHASE_DECODE)
    "sync_pos",  # the last synchronisation point
    "in_block",  # 0, or inside BBP..BEP (1: 8-byte BIP, 2: 4-byte)
    "phase",  # PHASE_*
    # Looking for a PSB (PHASE_SYNC), as libipt's pt_sync_forward does.
    "scan",  # the next aligned 8-byte word to test
    "scan_start",  # the PSB found must start here or later
    "walk",  # inside a run of PSB pattern: where the walk is (else -1)
    "walk_from",  # where that walk began
    # Set by the caller before each call.
    "base",  # the stream offset of the buffer's first byte
    "final",  # 1: the buffer holds the end of the stream
    "resync",  # 1: after an error, go on at the next PSB
    "errata",  # ERRATUM_* workaround bits (and ROWS_FOLD_CYC)
    # Results of a call.
    "rows",  # packet rows written
    "errors",  # errors written (a caller may pre-fill some)
    "packets",  # packets decoded so far, rows written or not
    "keep",  # the caller must keep the input from here on
    "synced",  # 1 once decoding has started (a PSB was found)
)

PHASE_SYNC = 0  # looking for a PSB: at the start, and after an error
PHASE_DECODE = 1
PHASE_DONE = 2

# What stopped decode_stream.
STOP_DONE = 0  # the end of the stream (or the first error without resync)
STOP_INPUT = 1  # more input is needed: move the bytes from `keep` on to the
#                 front of the buffer, append more and call again
STOP_ROWS = 2  # the packet rows are full: use them and call again
STOP_ERRORS = 3  # the error rows are full: use them and call again

# The longest packet is a PSB (16 bytes).  Before the stream's end is in the
# buffer, a packet is decoded only with this many bytes from its start at
# hand, so a buffer boundary never changes what a packet decodes to.
LOOKAHEAD = 16
# Bytes after a PSB the end of its PSB+ is first looked for in (four
# times as many at each try after): see _loops.psb_plus_end.
PSB_PLUS_SPAN = 4096
# A caller's buffer holds at most this many bytes besides a new chunk: what
# decode_stream asks to keep is never more.
KEEP_MAX = 64

# Packet-level erratum workarounds (the decoder's `errata` bits).
ERRATUM_SKD007 = 1
ERRATUM_SKZ84 = 2
# Not an erratum, an option among those bits for the flow decoder's
# windows: a CYC and the TNT-8 right after it in one row (see
# hwtrace.pt.kinds.TNT8_AFTER_CYC).
ROWS_FOLD_CYC = 1 << 16


def packet_errata(config: PtConfig | None) -> int:
    """The packet-level erratum workaround bits for ``config``'s CPU."""
    if config is None:
        return 0
    bits = 0
    if "skd007" in config.errata:
        bits |= ERRATUM_SKD007
    if "skz84" in config.errata:
        bits |= ERRATUM_SKZ84
    return bits


def new_decoder_state(*, sync: bool = True, resync: bool = True, errata: int = 0) -> np.ndarray:
    """A decoder state for a stream's first byte: looking for the first PSB
    (``sync``) or decoding from offset 0."""
    import numpy as np

    st = np.zeros(1, _record(DECODER_FIELDS))
    s = st[0]
    s["phase"] = PHASE_SYNC if sync else PHASE_DECODE
    s["synced"] = 0 if sync else 1
    s["walk"] = -1
    s["resync"] = int(resync)
    s["errata"] = errata
    return st


# ---------------------------------------------------------------------------
# The ptdump text loop (format_loop)

FORMAT_FIELDS = (
    "flags",  # F_* options
    "base",  # stream offset of the raw buffer's first byte (--raw)
    "next",  # the next packet row to print
    "stop",  # print rows up to here (exclusive)
    "error",  # the next error row to print
    "diag",  # the next time-model diagnostic to print
    "last",  # 1: these rows end the stream (print the errors after them)
    "written",  # bytes written into the output by the last call
    # What ptdump tracks from packet to packet (reset after an error).
    "last_ip",  # --lastip
    "have_ip",
    "ip_suppressed",
    "last_tsc",  # --time-delta
    "last_fcr",
    # Sideband goes after the diagnostics of packet ``mark`` and before
    # its line: the loop notes where that line starts in ``split``.
    "mark",
    "split",
)

# Options (the text loop's "flags" field), as Intel's ptdump names them.
F_OFFSET = 1 << 0  # show the offset column (not --no-offset)
F_RAW = 1 << 1  # --raw
F_LASTIP = 1 << 2  # --lastip
F_EXEC = 1 << 3  # --exec-mode
F_TIME = 1 << 4  # --time
F_TCAL = 1 << 5  # --tcal
F_DELTA = 1 << 6  # --time-delta
F_QUIET = 1 << 7  # --quiet
F_NO_PAD = 1 << 8  # --no-pad
F_NO_TIMING = 1 << 9  # --no-timing
F_NO_CYC = 1 << 10  # --no-cyc
F_NO_WALL = 1 << 11  # --no-wall-clock
F_TRACK = 1 << 12  # track time without showing it (Intel's ptdump does with sideband)
# The same options by their names in hwtrace.pt.ptdump.DumpOptions.
OPTION_FLAGS = {
    "show_offset": F_OFFSET,
    "raw": F_RAW,
    "lastip": F_LASTIP,
    "exec_mode": F_EXEC,
    "time": F_TIME,
    "tcal": F_TCAL,
    "time_delta": F_DELTA,
    "quiet": F_QUIET,
    "no_pad": F_NO_PAD,
    "no_timing": F_NO_TIMING,
    "no_cyc": F_NO_CYC,
    "no_wall_clock": F_NO_WALL,
}

# format_loop stops when less room than this is left in its output: enough
# for one packet's line with everything printed before it.
LINE_MAX = 512


def new_format_state(flags: int) -> np.ndarray:
    import numpy as np

    st = np.zeros(1, _record(FORMAT_FIELDS))
    st[0]["flags"] = flags
    st[0]["mark"] = -1
    st[0]["split"] = -1
    return st


_records: dict[tuple[str, ...], np.dtype] = {}


def _record(fields: tuple[str, ...]) -> np.dtype:
    """The numpy record type of ``fields`` (int64 each): one object per
    fields, so that what is worked out per dtype (the compiled loops'
    argument keys, 40 us for a record's) is worked out once."""
    got = _records.get(fields)
    if got is None:
        import numpy as np

        got = _records[fields] = np.dtype([(name, np.int64) for name in fields])
    return got


def record_key(fields: tuple[str, ...]) -> str:
    """How the compiled loops' library names the record type of ``fields``
    (numpy's ``repr(dtype.descr)``), for callers without numpy."""
    return repr([(name, "<i8") for name in fields])
