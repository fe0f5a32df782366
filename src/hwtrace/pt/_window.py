"""A trace window's packets and times in one compiled call.

The flow decoder reads a trace window by window (:mod:`hwtrace.pt.flowdec`):
each needs where it ends (the PSB past its size, and the PSB+ after that,
as far as decoding ahead may read), its packets (decode_stream) and the
time model over them (time_loop).  Done as separate calls from Python,
with the packet table and time columns made between them, that costed
about a tenth of a millisecond a window, a tenth of what decoding a
window of plain flow takes.  :func:`open_window` does it in one call into
the decoder's kept columns, exactly as those calls do; what it cannot
(columns too small, more errors than their room) it leaves to them.
"""

from __future__ import annotations

import numpy as np

from .. import aot
from ._loops import decode_stream, psb_plus_end, sync_forward
from ._state import DECODER_FIELDS, STOP_ERRORS, STOP_ROWS
from .errors import ABORT_WINDOW, PtError
from .kinds import DecodeError
from .timing import time_loop

# What open_window reports first: the window is ready; the columns need
# room for a window of this many rows (its third result); the caller
# decodes it the long way.
WIN_READY, WIN_ROOM, WIN_SLOW = 0, 1, 2

# The time model's settings, in the order open_window takes them (an
# array: see hwtrace.pt.timing.time_options).
TC_MTC_FREQ, TC_NOM_FREQ, TC_EAX, TC_EBX, TC_OPTS = range(5)

# open_window's scalar arguments, in one array (so that every argument is
# the same object from call to call, see hwtrace.aot.CompiledLoop.prepare):
# the window's PSB, the trace's end, the window size, how far it must reach
# (-1: no further), and which row of the time states it starts from.  The
# flow loop, which opens the next window itself where Python need not see
# it (hwtrace.pt._flowloop.run), finds the window it decodes after them:
# the row of its limit's time state (-1: not a row, Python opens the next),
# its end and limit, how many windows it opened, and how many more it may.
WA_START, WA_END, WA_BYTES, WA_GROW, WA_TIME = range(5)
WA_SAVED, WA_EXT, WA_LIMIT, WA_OPENED, WA_CONTINUE = range(5, 10)
WA_SIZE = 10

# The rows of open_window's time states: a segment's start (never
# written), the two a window starts from and saves into in turn, and one
# for a state from elsewhere, copied there.
TS_START, TS_LIMIT_A, TS_LIMIT_B, TS_OTHER = range(4)
TS_ROWS = 4

_F_POS = DECODER_FIELDS.index("pos")
_F_SYNC_POS = DECODER_FIELDS.index("sync_pos")
_F_FINAL = DECODER_FIELDS.index("final")
_F_ROWS = DECODER_FIELDS.index("rows")
_F_ERRORS = DECODER_FIELDS.index("errors")
_EOS, _BAD_OPC, _BAD_PACKET = int(PtError.EOS), int(PtError.BAD_OPC), int(PtError.BAD_PACKET)
_E_OPCODE, _E_PACKET = int(DecodeError.BAD_OPCODE), int(DecodeError.BAD_PACKET)


@aot.njit(cache=True, inline="always", _nrt=False)
def _extent(buf, after, end):
    """Where a window reaching past ``after`` ends: after the PSB+ of the
    first PSB at or after it (``end`` without one)."""
    psb = sync_forward(buf, after, 0, end) if after < end else -1
    if psb < 0:
        return end
    got = psb_plus_end(buf, psb, end)
    return got if got >= 0 else end


@aot.njit(cache=True, nogil=True, _nrt=False)
def window_extent(buf, ws, end, window_bytes, grow):
    """The window of ``buf[:end]`` from the PSB at ``ws``: ``(limit, ext)``,
    the PSB ``window_bytes`` on where the next window starts (-1: none) and
    the end of that PSB's PSB+, as far as decoding ahead of the limit
    reads but for a rare step (which comes back for the window again with
    ``grow`` >= 0: reaching past that offset, through the next PSB+)."""
    target = ws + window_bytes
    limit = sync_forward(buf, target, ws, end) if target < end else -1
    ext = end if limit < 0 else _extent(buf, limit, end)
    if grow >= 0 and ext <= grow:
        ext = _extent(buf, grow, end)
        if ext <= grow:
            ext = end
    return limit, ext


@aot.njit(cache=True, nogil=True, _nrt=False)
def open_window(buf, wargs, fresh, words, state, rows, errs, tc, tstates, twork, starts, tout):
    """Open the window of ``buf[:end]`` from the PSB at ``ws`` (see
    :func:`window_extent`; they and its other scalars in ``wargs``, WA_*).
    Its packets go to ``rows`` (errors to ``errs``) from a decoder state
    ``words`` set to ``fresh`` (both as int64 words; ``state`` is ``words``
    as the record); their times to ``tout`` (time_loop's output) from a
    copy ``twork`` of the time state ``tstates[wargs[WA_TIME]]``, with the
    state before the limit's packet in the limit row it does not start
    from (TS_LIMIT_B when it starts from TS_LIMIT_A, else TS_LIMIT_A); a
    window opened says that row, its end and its limit in ``wargs``.

    Returns ``(what, limit, ext, n, limit index, end error, end offset)``:
    ``what`` is WIN_READY, WIN_ROOM (``n``: the rows the columns need) or
    WIN_SLOW (decode_stream stopped with its columns full)."""
    ws, end = wargs[WA_START], wargs[WA_END]
    limit, ext = window_extent(buf, ws, end, wargs[WA_BYTES], wargs[WA_GROW])
    # (No packet is shorter than a byte: a row per byte never overflows.)
    need = ext - ws + 64
    if (
        rows[0].shape[0] < need
        or starts.shape[0] < need
        or tout[0].shape[0] < need
        or tout[4].shape[0] < 3 * need + 1
    ):
        return WIN_ROOM, limit, ext, need, -1, 0, 0
    for i in range(words.shape[0]):
        words[i] = fresh[i]
    words[_F_POS] = ws
    words[_F_SYNC_POS] = ws
    words[_F_FINAL] = 1
    words[_F_ERRORS] = 0
    stop = decode_stream(buf, ext, state, rows, errs, True)
    if stop == STOP_ERRORS or stop == STOP_ROWS:
        return WIN_SLOW, limit, ext, 0, -1, 0, 0
    n = words[_F_ROWS]
    nerr = words[_F_ERRORS]
    offsets = rows[0]
    limit_index = -1
    if limit >= 0:
        idx = np.searchsorted(offsets[:n], limit)
        if idx < n and offsets[idx] == limit:
            limit_index = idx
    if nerr:
        code = errs[1][0]
        end_error = _BAD_OPC if code == _E_OPCODE else (_BAD_PACKET if code == _E_PACKET else _EOS)
    else:
        end_error = _EOS if ext >= end else ABORT_WINDOW
    end_offset = offsets[n - 1] + rows[2][n - 1] if n else ws
    # The time model, from a resynchronisation's packet afresh.
    starts[:n] = False
    err_index = errs[2]
    for j in range(nerr):
        if err_index[j] < n:
            starts[err_index[j]] = True
    which = wargs[WA_TIME]
    tstate = tstates[which]
    saved = TS_LIMIT_B if which == TS_LIMIT_A else TS_LIMIT_A
    for i in range(tstate.shape[0]):
        twork[i] = tstate[i]
    time_loop(rows[1], rows[3], rows[4], n, starts, tc[TC_MTC_FREQ], tc[TC_NOM_FREQ], tc[TC_EAX],
              tc[TC_EBX], tc[TC_OPTS], twork, limit_index, tstates[saved], tout)  # fmt: skip
    # (Where the window ends, for the flow loop opening the next itself.)
    wargs[WA_SAVED], wargs[WA_EXT], wargs[WA_LIMIT] = saved, ext, limit
    return WIN_READY, limit, ext, n, limit_index, end_error, end_offset
