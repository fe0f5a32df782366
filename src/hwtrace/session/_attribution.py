"""The per-batch work of attributing decoded blocks to perf time, threads
and processes, in one compiled pass over a batch (the decoder's rows in,
the columns passed on out), so that a stream of batches costs about what
its rows do, whatever their number.

A block's perf time is its decoder time stamp as perf converts TSC
(:func:`~hwtrace.pt.timing.tsc_ns`; -1: no time); its thread is the one
the CPU's context switches say ran then (a per-thread queue's own), its
process that thread's; its duration runs until the next block's time, or,
when tracing stopped after it, until the stop (0 where either is unknown
or not later).
"""

from __future__ import annotations

import numpy as np

from .. import aot
from ..pt import flowrows as FK
from ..pt.blocks import blocks_of, next_offset_change, offsets_of
from ..pt.timing import tsc_ns

#: ``conv``'s fields: whether there is a conversion, then perf's
#: ``time_shift``, ``time_mult`` and ``time_zero`` (modulo 2**64).
CONV_HAVE, CONV_SHIFT, CONV_MULT, CONV_ZERO = range(4)


@aot.njit(cache=True, inline="always", _nrt=False)
def _conversion(conv):
    """``conv``'s fields as :func:`~hwtrace.pt.timing.tsc_ns` takes them:
    whether there is one, then shift, multiplier and zero."""
    return (
        conv[CONV_HAVE] != 0,
        np.uint64(conv[CONV_SHIFT]),
        np.uint64(conv[CONV_MULT]),
        np.uint64(conv[CONV_ZERO]),
    )


@aot.njit(cache=True, inline="always", _nrt=False)
def _perf_ns(t, have, shift, mult, zero):
    """The perf time of decoder time ``t`` (-1: none, or no conversion),
    as :func:`attribute_rows` converts a row's."""
    return tsc_ns(t, shift, mult, zero) if have and t != 0 else np.int64(-1)


@aot.njit(cache=True, nogil=True, _nrt=False)
def _switch_at(switch_time, t, k):
    """The last switch at or before ``t`` (-1: none), starting from the
    one ``k`` found for the previous block (times mostly rise)."""
    m = switch_time.shape[0]
    if k >= 0 and switch_time[k] <= t and (k + 1 == m or t < switch_time[k + 1]):
        return k
    return np.int64(np.searchsorted(switch_time, t, side="right")) - 1


@aot.njit(cache=True, nogil=True, _nrt=False)
def attribute_rows(
    ip, ninsn, mode, time, image, run, offset, at, conv, tid, pid,
    switch_time, switch_tid, switch_pid,
    out_ip, out_ninsn, out_mode, out_image, out_run, out_offset, out_ns, out_tid, out_pid,
):  # fmt: skip
    """Rows ``at + i`` of the ``out_`` columns from the decoder's row ``i``
    (``image``: one value for all rows or a value a row; ``run``,
    ``offset``: empty when the batch has none, -1 then).  Threads: ``tid``
    and ``pid`` for every row when ``tid`` >= 0, else the CPU's switches
    (``switch_time`` sorted, the thread and process each switched to).
    An empty ``out_`` column is not written (a column of one value).
    The durations come after, for all rows (:func:`durations_of`)."""
    n = ip.shape[0]
    have, shift, mult, zero = _conversion(conv)
    # (each column in a loop of its own over slices indexed from a range:
    # no checks for negative indices, and the copies vectorise)
    o_ip, o_ninsn, o_mode = out_ip[at:], out_ninsn[at:], out_mode[at:]
    o_image, o_run, o_offset = out_image[at:], out_run[at:], out_offset[at:]
    o_ns, o_tid, o_pid = out_ns[at:], out_tid[at:], out_pid[at:]
    # (a loop writes a column only when it has the rows: an empty one is
    # left alone; slice assignments clip)
    if o_ip.shape[0] >= n:
        for i in range(n):
            o_ip[i] = ip[i]
    if o_ninsn.shape[0] >= n:
        for i in range(n):
            o_ninsn[i] = ninsn[i]
    if o_mode.shape[0] >= n:
        for i in range(n):
            o_mode[i] = mode[i]
    if image.shape[0] == 1:
        o_image[:n] = image[0]
    elif o_image.shape[0] >= n:
        for i in range(n):
            o_image[i] = image[i]
    if run.shape[0] == n and o_run.shape[0] >= n:
        for i in range(n):
            o_run[i] = run[i]
    else:
        o_run[:n] = -1
    if offset.shape[0] == n and o_offset.shape[0] >= n:
        for i in range(n):
            o_offset[i] = offset[i]
    else:
        o_offset[:n] = -1
    if have:
        for i in range(n):
            t = time[i]
            o_ns[i] = tsc_ns(t, shift, mult, zero) if t != 0 else np.int64(-1)
    else:
        o_ns[:n] = -1
    if tid >= 0:
        o_tid[:n] = tid
        o_pid[:n] = pid
    elif o_tid.shape[0] >= n and o_pid.shape[0] >= n:
        k = -1
        for i in range(n):
            k = _switch_at(switch_time, max(o_ns[i], np.int64(0)), k)
            o_tid[i] = switch_tid[k] if k >= 0 else -1
            o_pid[i] = switch_pid[k] if k >= 0 else -1


@aot.njit(cache=True, nogil=True, _nrt=False)
def durations_of(out_ns, out_duration, stop_row, stop_tsc, conv):
    """Every row's duration: until the next row's time, or, for rows
    ``stop_row``, until tracing stopped after it at TSC ``stop_tsc`` (0:
    unknown; the last stop of a row counting); 0 where either time is
    unknown or not later."""
    total = out_ns.shape[0]
    later = out_ns[1:]
    for r in range(total - 1):
        d = later[r] - out_ns[r]
        out_duration[r] = d if d > 0 and out_ns[r] >= 0 else 0
    if total:
        out_duration[total - 1] = 0
    have, shift, mult, zero = _conversion(conv)
    for j in range(stop_row.shape[0]):
        r = stop_row[j]
        t = stop_tsc[j]
        v = tsc_ns(t, shift, mult, zero) - out_ns[r] if have and t != 0 else np.int64(0)
        out_duration[r] = v if v > 0 and out_ns[r] >= 0 else 0


@aot.njit(cache=True, nogil=True, _nrt=False)
def attribute_stored(
    keys, k_ip, k_ninsn, k_mode, k_image, off_pts, off_far_row, off_far_val, t_row, t_val, at, conv,
    tid, pid, switch_time, switch_tid, switch_pid,
    out_ip, out_ninsn, out_mode, out_image, out_run, out_offset, out_ns, out_tid, out_pid,
):  # fmt: skip
    """:func:`attribute_rows` of the rows a block store holds (``keys``
    into the distinct blocks ``k_*``; the trace offset's points ``off_*``,
    see hwtrace.pt.blocks.put_offset; the time's change points ``t_row``, ``t_val``): the
    time, thread and process once per change of time; ``run`` -1.  An
    empty ``out_`` column is not written."""
    n = keys.shape[0]
    have, shift, mult, zero = _conversion(conv)
    o_ip, o_ninsn, o_mode = out_ip[at:], out_ninsn[at:], out_mode[at:]
    o_image, o_offset = out_image[at:], out_offset[at:]
    o_ns, o_tid, o_pid = out_ns[at:], out_tid[at:], out_pid[at:]
    blocks_of(keys, k_ip, k_ninsn, k_mode, k_image, o_ip, o_ninsn, o_mode, o_image)
    o_run = out_run[at:]
    o_run[:n] = -1
    if o_offset.shape[0] >= n:
        offsets_of(off_pts, off_far_row, off_far_val, n, o_offset)
    k = -1
    for j in range(t_row.shape[0]):
        t = t_val[j]
        ns = _perf_ns(t, have, shift, mult, zero)
        if tid >= 0:
            th, pr = tid, pid
        else:
            k = _switch_at(switch_time, max(ns, np.int64(0)), k)
            th = switch_tid[k] if k >= 0 else -1
            pr = switch_pid[k] if k >= 0 else -1
        end = t_row[j + 1] if j + 1 < t_row.shape[0] else n
        o_ns[t_row[j] : end] = ns
        o_tid[t_row[j] : end] = th
        o_pid[t_row[j] : end] = pr


@aot.njit(cache=True, nogil=True, _nrt=False)
def _add_run(out_s, out_v, m, row, value):
    """Append the run of ``value`` from ``row`` to the ``m`` runs so far
    unless the last has that value (runs stay maximal); the new count."""
    if m > 0 and out_v[m - 1] == value:
        return m
    out_s[m] = row
    out_v[m] = value
    return m + 1


@aot.njit(cache=True, nogil=True, _nrt=False)
def time_runs_into(has_first, first, t_row, t_val, at, rest, rest_at, conv, out_s, out_v):
    """:func:`time_runs` into ``out_s``/``out_v`` (room for a run per time
    point and written-out row, and one); how many runs."""
    have, shift, mult, zero = _conversion(conv)
    m = 0
    if has_first:
        m = _add_run(out_s, out_v, m, 0, first)
    for j in range(t_row.shape[0]):
        ns = _perf_ns(t_val[j], have, shift, mult, zero)
        m = _add_run(out_s, out_v, m, t_row[j] + at, ns)
    for r in range(rest.shape[0]):
        m = _add_run(out_s, out_v, m, rest_at + r, rest[r])
    return m


_E_TYPE, _E_FLAGS, _E_TSC = FK.E_TYPE, FK.E_FLAGS, FK.E_TSC
_F_STATUS, _F_HAS_TSC, _F_ON_AGAIN = FK.F_STATUS, FK.F_HAS_TSC, FK.F_ON_AGAIN
_F_SUPP, _GAP_LOST, _GAP_REJOINED = FK.F_SUPP, FK.GAP_LOST, FK.GAP_REJOINED
# A stop whose next enable is not among the events yet: what it is waits
# for the next events (one at a branch out of the traced ranges may turn
# out a rejoin, any a resume).
GAP_PENDING_REJOIN, GAP_PENDING = 3, 4
_EV_ENABLED, _EV_PTWRITE, _X_ERROR = FK.EV_ENABLED, FK.EV_PTWRITE, FK.X_ERROR
_EV_DISABLED, _EV_ASYNC_DISABLED = FK.EV_DISABLED, FK.EV_ASYNC_DISABLED


@aot.njit(cache=True, inline="always", _nrt=False)
def _in_table(table, t):
    return table[min(t, np.uint64(table.shape[0] - 1))]


@aot.njit(cache=True, nogil=True, _nrt=False)
def stops_and_gaps_into(ev, blocks, is_stop, is_gap, flag, stop_k, stop_t, gap_k, gap_v, counts,
                        lead):  # fmt: skip
    """The stops of tracing among a stream's event rows ``ev`` (the block
    before each, ``blocks``, into ``stop_k``; its time stamp or 0 into
    ``stop_t``) and the blocks before which the flow has a gap (into
    ``gap_k``, its kind into ``gap_v``), as
    :func:`~hwtrace.pt.flowrows.gap_kinds` has them: a gap event, except a
    stop whose next enable resumed where it stopped with no other gap
    between; a stop at a branch out of the traced ranges whose next enable
    came back elsewhere with none between is a rejoin; a stop with no
    enable after it is pending (GAP_PENDING*), as is ``lead``, a stop before
    these events, until its enable comes.  ``flag``: uint8 scratch of a row
    each.  ``counts`` receives the stops, the gaps, the error rows, the
    PTWRITE rows and what ``lead`` is now."""
    n = ev.shape[0]
    # Backward: whether the first enable after a row resumed, and whether a
    # gap event lies between the row and it (that enable included).
    seen = resumed = between = False
    for i in range(n - 1, -1, -1):
        t, f = ev[i, _E_TYPE], ev[i, _E_FLAGS]
        real = (f & _F_STATUS) == 0
        g = real and _in_table(is_gap, t)
        keep = _GAP_LOST if g else 0
        if g and (t == _EV_DISABLED or t == _EV_ASYNC_DISABLED) and not between:
            keep = _settled(t, f, seen, resumed)
        flag[i] = keep
        if real and t == _EV_ENABLED:
            seen = True
            resumed = (f & _F_ON_AGAIN) != 0
            between = g
        elif g:
            between = True
    if lead == GAP_PENDING_REJOIN or lead == GAP_PENDING:
        if between:
            lead = _GAP_LOST
        elif seen:
            lead = 0 if resumed else (_GAP_REJOINED if lead == GAP_PENDING_REJOIN else _GAP_LOST)
    n_stop = n_gap = n_err = n_ptw = 0
    for i in range(n):
        t, f = ev[i, _E_TYPE], ev[i, _E_FLAGS]
        if t == _X_ERROR:
            n_err += 1
        if (f & _F_STATUS) == 0 and t < _X_ERROR:
            if _in_table(is_stop, t):
                stop_k[n_stop] = blocks[i]
                stop_t[n_stop] = ev[i, _E_TSC] if (f & _F_HAS_TSC) != 0 else np.uint64(0)
                n_stop += 1
            if t == _EV_PTWRITE:
                n_ptw += 1
        if flag[i]:
            gap_k[n_gap] = blocks[i]
            gap_v[n_gap] = flag[i]
            n_gap += 1
    counts[0], counts[1], counts[2], counts[3], counts[4] = n_stop, n_gap, n_err, n_ptw, lead


@aot.njit(cache=True, inline="always", _nrt=False)
def _settled(t, f, seen, resumed):
    """What a stop (type ``t``, flags ``f``) with no other gap before the
    next enable is: none when that enable resumed, a rejoin when tracing
    left at a branch out of the traced ranges, else lost; pending when
    no enable was seen."""
    out = t == _EV_DISABLED and (f & _F_SUPP) == 0
    if not seen:
        return GAP_PENDING_REJOIN if out else GAP_PENDING
    if resumed:
        return 0
    return _GAP_REJOINED if out else _GAP_LOST


@aot.njit(cache=True, nogil=True, _nrt=False)
def offset_runs_into(has_first, first, off_pts, off_far_row, off_far_val, at, total, out_s, out_v):
    """The trace offsets of ``total`` rows as maximal runs into
    ``out_s``/``out_v`` (room for a run per offset step, and two): a held
    row's (``first``) at row 0, then from row ``at`` a block store's rows
    from their offset points (see hwtrace.pt.blocks.next_offset_change;
    the first is at the store's first row).  How many runs."""
    m = 0
    last = np.int64(-1)  # (offsets are not negative: the first point is a change)
    if has_first:
        m = _add_run(out_s, out_v, m, 0, first)
        last = np.int64(first)
    j = 0
    k = np.uint64(0)
    row = np.int64(0)
    value = np.int64(0)
    while True:
        r, v, j, k, row, value = next_offset_change(off_pts, off_far_row, off_far_val, j, k, row,
                                                    value, at, total, last)  # fmt: skip
        if r >= total:
            return m
        out_s[m] = r
        out_v[m] = v
        m += 1
        last = v


@aot.njit(cache=True, nogil=True, _nrt=False)
def duration_runs_into(starts, ns, total, stop_row, stop_tsc, conv, out_s, out_v):
    """:func:`duration_runs` into ``out_s``/``out_v`` (room for two runs
    per run of time and stop, and one), ``stop_row`` ascending; how many
    runs.  The rows with a duration are met in order, the last rows of
    the runs of time and the stops merged (at a row with both, the last
    stop's)."""
    have, shift, mult, zero = _conversion(conv)
    n_runs = starts.shape[0]
    n_stops = stop_row.shape[0]
    m = 0
    end = np.int64(0)  # the rows before it have their runs
    i = 1  # the next run of time: its start's row before ends the run before
    j = 0  # the next stop
    k = 0  # the run of time the last stop's row is in
    while i < n_runs or j < n_stops:
        if j >= n_stops or (i < n_runs and starts[i] - 1 < stop_row[j]):
            row = starts[i] - 1
            d = ns[i] - ns[i - 1]
            if d <= 0 or ns[i - 1] < 0:
                d = 0
            i += 1
        else:
            row = stop_row[j]
            while j + 1 < n_stops and stop_row[j + 1] == row:
                j += 1
            while k + 1 < n_runs and starts[k + 1] <= row:
                k += 1
            stop_ns = _perf_ns(stop_tsc[j], have, shift, mult, zero)
            j += 1
            d = np.int64(0)
            if stop_ns >= 0 and ns[k] >= 0 and stop_ns - ns[k] > 0:
                d = stop_ns - ns[k]
            if i < n_runs and starts[i] - 1 == row:
                i += 1  # (the stop's duration, not the next block's time)
        if d != 0:
            if row > end:
                m = _add_run(out_s, out_v, m, end, 0)
            m = _add_run(out_s, out_v, m, row, d)
            end = row + 1
    if end < total:
        m = _add_run(out_s, out_v, m, end, 0)
    return m


def time_runs(first: np.ndarray | None, t_row: np.ndarray, t_val: np.ndarray, at: int,
              rest: np.ndarray, rest_at: int, conv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The perf times of a batch's rows as runs (their first rows and
    times): ``first``, a held row's time (or None) at row 0; from row
    ``at`` a block store's rows, whose time points are ``t_row``/``t_val``
    (decoder times, the first at the store's first row); from row
    ``rest_at`` the rows of ``rest`` (perf times, a row each).  A run with
    the time of the one before is joined to it."""
    cap = 1 + t_row.shape[0] + rest.shape[0]
    out_s, out_v = np.empty(cap, np.int64), np.empty(cap, np.int64)
    held = first is not None
    m = time_runs_into(held, int(first[0]) if held else 0, t_row, t_val, at, rest, rest_at,
                       conv, out_s, out_v)  # fmt: skip
    return out_s[:m], out_v[:m]


def stops_and_gaps(
    ev: np.ndarray, blocks: np.ndarray, is_stop: np.ndarray, lead: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int, int]:
    """:func:`stops_and_gaps_into`: the stops' blocks and time stamps, the
    gaps' blocks and kinds, how many error and PTWRITE rows there are, and
    what the pending stop ``lead`` is now."""
    n = ev.shape[0]
    stop_k, gap_k = np.empty(n, np.int64), np.empty(n, np.int64)
    stop_t, counts = np.empty(n, np.uint64), np.zeros(5, np.int64)
    gap_v = np.empty(n, np.uint8)
    stops_and_gaps_into(ev, np.asarray(blocks, np.int64), is_stop, FK.IS_GAP,
                        np.empty(n, np.uint8), stop_k, stop_t, gap_k, gap_v, counts,
                        np.int64(lead))  # fmt: skip
    n_stop, n_gap, n_err, n_ptw, lead = counts.tolist()
    return stop_k[:n_stop], stop_t[:n_stop], gap_k[:n_gap], gap_v[:n_gap], n_err, n_ptw, lead


def offset_runs(first: int | None, off_pts: np.ndarray, off_far_row: np.ndarray,
                off_far_val: np.ndarray, at: int, total: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """:func:`offset_runs_into`: the runs' first rows and trace offsets."""
    cap = off_pts.shape[0] + 2
    out_s, out_v = np.empty(cap, np.int64), np.empty(cap, np.int64)
    held = first is not None
    m = offset_runs_into(held, first if held else 0, off_pts, off_far_row, off_far_val, at, total,
                         out_s, out_v)  # fmt: skip
    return out_s[:m], out_v[:m]


def duration_runs(starts: np.ndarray, ns: np.ndarray, total: int, stop_row: np.ndarray,
                  stop_tsc: np.ndarray, conv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """:func:`durations_of` of ``total`` rows whose times are the runs
    ``starts``/``ns``, as runs: a block runs until the next one's time, so
    only the last row of a run (and a row after which tracing stopped) has
    a duration; the rest are 0."""
    stop_row = np.asarray(stop_row, np.int64)
    stop_tsc = np.asarray(stop_tsc, np.uint64)
    if stop_row.shape[0] > 1 and (stop_row[1:] < stop_row[:-1]).any():
        # (in order of rows, a row's stops in their order: the last counts)
        order = np.argsort(stop_row, kind="stable")
        stop_row, stop_tsc = stop_row[order], stop_tsc[order]
    cap = 2 * (starts.shape[0] + stop_row.shape[0]) + 1
    out_s, out_v = np.empty(cap, np.int64), np.empty(cap, np.int64)
    m = duration_runs_into(starts, ns, total, stop_row, stop_tsc, conv, out_s, out_v)
    return out_s[:m], out_v[:m]
