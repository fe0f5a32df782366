"""Software events beside the hardware flow.

Events of other tracers (LTTng-UST through its CTF traces, perf tracepoint
samples, ftrace ring-buffer copies) are put on the decoded flow's clock and
placed at the instructions that ran when each was taken, per thread.

Clocks.  A flow's times are perf times (ns).  What clock that is depends
on the recording: ``hwtrace record``'s software backend writes
CLOCK_MONOTONIC (its stepping clock converted through pairs of readings,
noted beside the perf.data with how far off it may be); ``perf record``
writes perf's own clock, which is TSC-based (``time_zero``,
``time_mult``, ``time_shift``).  An event's clock is:

* LTTng's (CTF): the clock class the metadata names, ``monotonic`` being
  CLOCK_MONOTONIC (the metadata's offset only moves it to the epoch);
* perf tracepoint samples: perf's clock, the flow's own when recorded with
  it, or CLOCK_MONOTONIC when recorded with ``-k CLOCK_MONOTONIC``;
* ftrace: whatever ``trace_clock`` was; ``x86-tsc`` (the default here)
  gives TSC values, converted exactly as the flow's own TSC is.

Where the relation is unknown (LTTng's CLOCK_MONOTONIC against a perf
clock), an offset measured by the user can be given.

Placement.  The flow's time is a step function of the instruction position:
a timing packet gives the blocks after it one time, until the next one, so
an instruction ran somewhere in its step's ``[time, end]``; steps end when
tracing stops (nothing is known of untraced time).  An event at ``t`` with
clock error ``e`` lands on every instruction whose step meets
``[t - e, t + e]``: positions ``first .. last`` of its thread's decoded
instructions (counted in decoding order; a per-thread recording's order is
its time order), ``at`` the start of the step holding ``t``.  Only the
steps near some event are kept while the flow streams by.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..columns import distinct

CLOCK_MONOTONIC = "CLOCK_MONOTONIC"
PERF_CLOCK = "perf"
_CLOCKID_MONOTONIC = 1  # a perf_event_attr's clockid
TSC = "tsc"
_CLOCK_NAMES = {
    "monotonic": CLOCK_MONOTONIC, "mono": CLOCK_MONOTONIC, CLOCK_MONOTONIC.lower(): CLOCK_MONOTONIC,
    "perf": PERF_CLOCK, "local": PERF_CLOCK, "tsc": TSC, "x86-tsc": TSC,
}  # fmt: skip

# Placement status of an event.
PLACED, BEFORE, AFTER, UNTRACED, NO_THREAD = 0, 1, 2, 3, 4
STATUS_TEXT = {
    PLACED: "placed",
    BEFORE: "before the thread's trace",
    AFTER: "after the thread's trace",
    UNTRACED: "while the thread was not traced",
    NO_THREAD: "no thread or no time",
}


class EventsError(Exception):
    """Events that cannot be read or put on the flow's clock (one line)."""


@dataclass(frozen=True)
class FlowClock:
    """What a flow's perf times are: ``kind`` (:data:`CLOCK_MONOTONIC` or
    :data:`PERF_CLOCK`), how far off they may be from that clock
    (``error_ns``) and the TSC conversion they were made with (None: the
    trace has no TSC)."""

    kind: str
    error_ns: int = 0
    conversion: object | None = None


def flow_clock(perf_data: str | Path, conversion: object | None) -> FlowClock:
    """The clock of a perf.data's flow: CLOCK_MONOTONIC for a recording of
    ``hwtrace record`` (noted beside it), perf's clock otherwise."""
    from ..perf.notes import recording_notes

    notes = recording_notes(perf_data)
    if notes.get("clock") == CLOCK_MONOTONIC:
        return FlowClock(CLOCK_MONOTONIC, int(notes.get("clock_error_ns", 0)), conversion)
    return FlowClock(PERF_CLOCK, 0, conversion)


def clock_name(text: str) -> str:
    """A clock as named on the command line (``mono``, ``perf``, ``x86-tsc``)."""
    got = _CLOCK_NAMES.get(text.strip().lower())
    if got is None:
        raise EventsError(f"unknown clock {text!r} (monotonic, perf or tsc)")
    return got


@dataclass
class SoftwareEvents:
    """Events in time order: ``name`` (index into ``names``), ``time`` (ns
    on the flow's clock, -1: none), ``error`` (ns: how far ``time`` may be
    off), ``tid`` and ``cpu`` (-1: unknown), ``text`` the event as a
    listing line (ftrace's ``trace`` format) and ``context`` its context
    fields beyond those (LTTng's ``ip``...)."""

    path: str
    kind: str
    clock: str
    names: list[str]
    name: np.ndarray
    time: np.ndarray
    error: np.ndarray
    tid: np.ndarray
    cpu: np.ndarray
    text: list[str]
    context: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return self.time.shape[0]

    def matching(self, pattern: str) -> np.ndarray:
        """The events whose name matches ``pattern`` (shell wildcards; a
        name without ``:`` also matches the part after the provider)."""
        hit = np.zeros(len(self.names), bool)
        for k, n in enumerate(self.names):
            short = n.split(":", 1)[-1]
            hit[k] = fnmatch.fnmatchcase(n, pattern) or (
                ":" not in pattern and fnmatch.fnmatchcase(short, pattern)
            )
        return hit[self.name] if len(self) else np.zeros(0, bool)


def load_events(
    path: str | Path,
    clock: FlowClock,
    *,
    events_clock: str | None = None,
    offset_ns: int | None = None,
) -> SoftwareEvents:
    """Read the events at ``path`` (a CTF trace directory, a perf.data with
    tracepoint samples, ftrace ``trace_pipe_raw`` copies) and put them on
    the flow's ``clock``.  ``events_clock`` says which clock they were
    taken with when the input does not (ftrace: ``tsc`` by default);
    ``offset_ns`` is added to convert them where the relation is not known."""
    from ..filter.inputs import StreamError, open_source
    from ..filter.listing import render_listing

    try:
        src = open_source(str(path))
    except StreamError as e:
        raise EventsError(str(e)) from None
    except ImportError as e:
        raise EventsError(f"{path}: {e}") from None
    n = len(src)
    names = [t.name for t in src.types]
    name = np.full(n, -1, np.int64)
    for k, t in enumerate(src.types):
        name[t.rows] = k
    raw = src.time.astype(np.int64)
    context: list[dict] = [{} for _ in range(n)]
    notes = list(src.notes) + list(src.problems)
    if src.kind == "ctf":
        own = _ctf_clock(src)
        raw = src.clock_ns.copy()  # type: ignore[attr-defined]
        context = list(src.extra_contexts)  # type: ignore[attr-defined]
    elif src.kind == "perf":
        own = _perf_clock(src)
    else:
        own = TSC
    kind = clock_name(events_clock) if events_clock else own
    time, error = _convert(raw, kind, clock, offset_ns, str(path))
    time[raw < 0] = -1
    lines = b"".join(render_listing(src, np.ones(n, bool))).decode(errors="replace")
    text = lines.splitlines()
    order = np.arange(n) if src.kind == "ctf" else np.argsort(src.time, kind="stable")
    # Listing order is time order (the CTF reader's already is).
    tid = src.tid.astype(np.int64)
    if src.kind == "ctf" and not (tid >= 0).any() and n:
        notes.append(
            "the events have no thread context: add it to the LTTng channel "
            "(lttng add-context -u -t vtid) to place them"
        )
    ctx = [context[i] for i in order.tolist()] if src.kind != "ctf" else context
    out = SoftwareEvents(
        str(path), src.kind, kind, names, name[order], time[order], error[order],
        tid[order], src.cpu.astype(np.int64)[order], text, ctx, notes,
    )  # fmt: skip
    if len(out.text) != n:
        raise EventsError(f"{path}: {n} events but {len(out.text)} listing lines")
    return out


def ptwrite_events(
    data, sideband, clock: FlowClock, schema=None, *, path: str = "ptwrite"
) -> SoftwareEvents:
    """The typed PTWRITE events of a perf.data's own Intel PT
    (:func:`hwtrace.session.ptwevents.perf_events`), as software events on its
    flow's clock: named by ``schema`` (an :class:`EventSchema`, else
    ``ptw:<id>``), their thread the queue's or the one the sideband has on
    its CPU then.  They come from the same trace as the flow, so their time
    is as exact as the flow's."""
    from ..session.ptwevents import perf_events

    parts = perf_events(data)
    types = schema.types if schema is not None else {}
    rows: list[tuple[int, int, int, int, str]] = []  # (ns, tid, cpu, name, text)
    names: list[str] = []
    index: dict[int, int] = {}
    notes: list[str] = []
    for (cpu, tid), ev in parts.items():
        notes += [f"queue cpu {cpu} tid {tid}: {p}" for p in ev.problems]
        if not len(ev):
            continue
        ns, _ = _convert(ev.time.astype(np.int64), TSC, clock, None, path)
        tids = np.full(len(ev), tid, np.int64) if tid >= 0 else sideband.threads_on(cpu, ns)
        for k, line in enumerate(ev.json_lines(schema)):
            tid_k = int(tids[k])
            tname = types.get(int(ev.type_id[k]))
            name = tname.name if tname is not None else f"ptw:{int(ev.type_id[k])}"
            if name not in index:
                index[name] = len(names)
                names.append(name)
            rows.append((int(ns[k]), tid_k, cpu, index[name], line))
    rows.sort(key=lambda r: r[0])
    n = len(rows)
    col = list(zip(*rows, strict=True)) if n else [[], [], [], [], []]
    time = np.asarray(col[0], np.int64)
    return SoftwareEvents(
        path, "ptwrite", TSC, names, np.asarray(col[3], np.int64), time, np.ones(n, np.int64),
        np.asarray(col[1], np.int64), np.asarray(col[2], np.int64), list(col[4]),
        [{} for _ in range(n)], notes,
    )  # fmt: skip


def _perf_clock(src) -> str:
    """The clock of a perf.data's samples: CLOCK_MONOTONIC when every
    attr says it was taken with it (``perf record -k
    CLOCK_MONOTONIC``: ``use_clockid``, ``clockid`` 1), else perf's own."""
    attrs = [a.attr for a in src.data.attrs]
    if attrs and all(a.use_clockid and a.clockid == _CLOCKID_MONOTONIC for a in attrs):
        return CLOCK_MONOTONIC
    return PERF_CLOCK


def _ctf_clock(src) -> str:
    names = {c.lower() for c in src.clocks}
    if not names:
        return CLOCK_MONOTONIC
    if len(names) > 1:
        raise EventsError(f"{src.path}: events on several clocks ({', '.join(sorted(names))})")
    (only,) = names
    if only not in ("monotonic", "clock_monotonic"):
        raise EventsError(
            f"{src.path}: events on clock {only!r}; only LTTng's monotonic clock is "
            "placed on a flow (or give the clock and an offset)"
        )
    return CLOCK_MONOTONIC


def _convert(
    raw: np.ndarray, kind: str, clock: FlowClock, offset_ns: int | None, where: str
) -> tuple[np.ndarray, np.ndarray]:
    """Event times on the flow's clock and their error."""
    n = raw.shape[0]
    if kind == TSC:
        if clock.conversion is None:
            raise EventsError(f"{where}: TSC times, but the trace has no TSC conversion")
        time = np.asarray(clock.conversion.to_ns(raw.astype(np.uint64)), np.int64)  # type: ignore[attr-defined]
        return time + (offset_ns or 0), np.full(n, 1, np.int64)
    if kind == clock.kind:
        return raw + (offset_ns or 0), np.full(n, clock.error_ns, np.int64)
    if offset_ns is None:
        raise EventsError(
            f"{where}: events on {kind}, the flow on {clock.kind}: their relation is "
            "not known (record with hwtrace record, whose times are CLOCK_MONOTONIC, "
            "or give --clock-offset)"
        )
    return raw + offset_ns, np.full(n, clock.error_ns, np.int64)


# -- placement -----------------------------------------------------------------------


@dataclass
class Placement:
    """Where each event of a :class:`SoftwareEvents` landed (same order):
    ``status`` (:data:`PLACED`...), the positions ``first .. last`` of its
    thread's instructions it may have been taken at and ``at`` (the start
    of the time step holding it; -1 where not placed), the ``ip`` there and
    ``gap``: the flow has a gap inside ``first .. last``."""

    status: np.ndarray
    first: np.ndarray
    at: np.ndarray
    last: np.ndarray
    ip: np.ndarray
    gap: np.ndarray

    def counts(self) -> dict[str, int]:
        return {STATUS_TEXT[s]: int((self.status == s).sum()) for s in STATUS_TEXT}


class _Steps:
    """One thread's time steps kept so far, and the open one."""

    def __init__(self) -> None:
        self.pos = 0  # instructions seen
        self.kept: list[np.ndarray] = []  # rows (ns, end, start, stop, ip, gap)
        self.open: np.ndarray | None = None  # the step still growing
        self.first_ns = -1  # the thread's first known time
        self.last_end = -1  # and the end of its last step


_NS, _END, _START, _STOP, _IP, _GAP = range(6)


class EventPlacer:
    """Call it on each :class:`~hwtrace.session.perfflow.PerfBlocks` batch in flow
    order, then :meth:`finish` for the :class:`Placement`."""

    def __init__(self, events: SoftwareEvents) -> None:
        self.events = events
        ok = (events.time >= 0) & (events.tid >= 0)
        self.lo = np.where(ok, events.time - events.error, -1)
        self.hi = np.where(ok, events.time + events.error, -1)
        self.by_tid: dict[int, np.ndarray] = {}
        for tid in distinct(events.tid[ok]).tolist():
            rows = np.flatnonzero(ok & (events.tid == tid))
            self.by_tid[tid] = rows[np.argsort(self.lo[rows], kind="stable")]
        self.threads: dict[int, _Steps] = {}

    def __call__(self, b) -> None:
        tids = b.tid
        if not len(b):
            return
        uniq = distinct(tids)
        for tid in uniq.tolist():
            sel = slice(None) if uniq.shape[0] == 1 else np.flatnonzero(tids == tid)
            self._add(int(tid), b.ns[sel], b.duration[sel], b.ninsn[sel], b.ip[sel], b.gap[sel])

    def _add(self, tid, ns, dur, ninsn, ip, gap) -> None:
        st = self.threads.get(tid)
        if st is None:
            st = self.threads[tid] = _Steps()
        n = ninsn.astype(np.int64)
        starts = st.pos + np.cumsum(n) - n
        st.pos += int(n.sum())
        ns = ns.astype(np.int64)
        known = ns >= 0
        # The time in force before each block: the last known one (or the open step's).
        prev_ns = st.open[_NS] if st.open is not None else np.int64(-2)
        idx = np.where(known, np.arange(ns.shape[0]), -1)
        np.maximum.accumulate(idx, out=idx)
        filled = np.where(idx >= 0, ns[np.maximum(idx, 0)], prev_ns)
        before = np.concatenate(([prev_ns], filled[:-1]))
        new = gap.astype(bool) | (known & (ns != before))
        if st.open is None:
            new[0] = True
        ends = np.where(known, ns + dur.astype(np.int64), -1)
        if known.any():
            if st.first_ns < 0:
                st.first_ns = int(ns[known][0])
            st.last_end = max(st.last_end, int(ends.max()))
        heads = np.flatnonzero(new)
        if heads.shape[0] and heads[0] == 0:
            tail_of_open = 0
        else:
            tail_of_open = heads[0] if heads.shape[0] else ns.shape[0]
        if st.open is not None and tail_of_open:
            # The first blocks grow the open step.
            st.open[_END] = max(int(st.open[_END]), int(ends[:tail_of_open].max()))
            st.open[_STOP] = starts[tail_of_open - 1] + n[tail_of_open - 1] - 1
        if not heads.shape[0]:
            return
        steps = np.empty((heads.shape[0], 6), np.int64)
        steps[:, _NS] = filled[heads]
        steps[:, _END] = np.maximum.reduceat(ends, heads)
        steps[:, _END] = np.maximum(steps[:, _END], steps[:, _NS])
        steps[:, _START] = starts[heads]
        last_block = np.concatenate((heads[1:], [ns.shape[0]])) - 1
        steps[:, _STOP] = starts[last_block] + n[last_block] - 1
        steps[:, _IP] = ip[heads].astype(np.int64)
        steps[:, _GAP] = gap[heads].astype(np.int64)
        if st.open is not None:
            steps = np.concatenate((st.open[None, :], steps))
        st.open = steps[-1].copy()
        self._keep(tid, st, steps[:-1])

    def _keep(self, tid: int, st: _Steps, steps: np.ndarray) -> None:
        """Keep the finished ``steps`` that meet some event's window (and a
        gap step wherever one is, to see windows across gaps)."""
        rows = self.by_tid.get(tid)
        if rows is None or not steps.shape[0]:
            return
        lo, hi = self.lo[rows], self.hi[rows]
        his = np.maximum.accumulate(hi)
        j = np.searchsorted(his, steps[:, _NS], side="left")  # first window not ended
        j = np.minimum(j, rows.shape[0] - 1)
        meets = (his[j] >= steps[:, _NS]) & (lo[j] <= steps[:, _END])
        meets |= steps[:, _GAP] != 0
        if meets.any():
            st.kept.append(steps[meets])

    def finish(self) -> Placement:
        ev = self.events
        n = len(ev)
        status = np.full(n, NO_THREAD, np.int8)
        first = np.full(n, -1, np.int64)
        at = np.full(n, -1, np.int64)
        last = np.full(n, -1, np.int64)
        ip = np.zeros(n, np.uint64)
        gap = np.zeros(n, bool)
        for tid, rows in self.by_tid.items():
            st = self.threads.get(tid)
            if st is None:
                status[rows] = UNTRACED  # the thread was never traced
                continue
            parts = st.kept + ([st.open[None, :]] if st.open is not None else [])
            steps = np.concatenate(parts) if parts else np.zeros((0, 6), np.int64)
            steps = steps[np.argsort(steps[:, _NS], kind="stable")]
            timed = steps[steps[:, _NS] >= 0]
            lo, hi, t = self.lo[rows], self.hi[rows], ev.time[rows]
            if not timed.shape[0]:
                status[rows] = UNTRACED
                status[rows[hi < st.first_ns]] = BEFORE
                status[rows[(st.last_end >= 0) & (lo > st.last_end)]] = AFTER
                continue
            ends = np.maximum.accumulate(timed[:, _END])
            j0 = np.searchsorted(ends, lo, side="left")  # first step not over by lo
            j1 = np.searchsorted(timed[:, _NS], hi, side="right") - 1  # last begun by hi
            placed = (j0 <= j1) & (j0 < timed.shape[0]) & (j1 >= 0)
            s = np.full(rows.shape[0], UNTRACED, np.int8)
            s[hi < st.first_ns] = BEFORE
            s[lo > st.last_end] = AFTER
            s[placed] = PLACED
            status[rows] = s
            pr = rows[placed]
            a, z = j0[placed], j1[placed]
            first[pr] = timed[a, _START]
            last[pr] = timed[z, _STOP]
            k = np.searchsorted(timed[:, _NS], t[placed], side="right") - 1
            k = np.clip(k, a, z)
            at[pr] = timed[k, _START]
            ip[pr] = timed[k, _IP].astype(np.uint64)
            gaps = np.cumsum(timed[:, _GAP] != 0)
            gap[pr] = gaps[z] - gaps[a] > 0
        return Placement(status, first, at, last, ip, gap)


# -- windows ---------------------------------------------------------------------


@dataclass
class Windows:
    """Time windows per thread bounded by pairs of events: ``starts`` and
    ``ends`` (ns, flow clock) sorted per tid; the events that paired with
    none (``unpaired_open``, ``unpaired_close``) and those without a thread
    or time (``unplaceable``)."""

    by_tid: dict[int, tuple[np.ndarray, np.ndarray]]
    unpaired_open: int = 0
    unpaired_close: int = 0
    unplaceable: int = 0

    def __len__(self) -> int:
        return sum(s.shape[0] for s, _ in self.by_tid.values())


def event_windows(events: SoftwareEvents, open_pattern: str, close_pattern: str) -> Windows:
    """Windows from each thread's ``open_pattern`` event to its next
    ``close_pattern`` event (a thread's ``sys_enter``/``sys_exit``, two
    user tracepoints).  An open while one is open replaces it (the earlier
    counts as unpaired), a close with none open is unpaired, as is an open
    never closed."""
    opens, closes = events.matching(open_pattern), events.matching(close_pattern)
    if not opens.any():
        raise EventsError(f"{events.path}: no event matches {open_pattern!r}")
    if not closes.any():
        raise EventsError(f"{events.path}: no event matches {close_pattern!r}")
    both = opens & closes
    if both.any():
        raise EventsError(f"{open_pattern!r} and {close_pattern!r} both match "
                          f"{events.names[int(events.name[np.flatnonzero(both)[0]])]}")  # fmt: skip
    ok = (events.time >= 0) & (events.tid >= 0)
    out = Windows({}, unplaceable=int(((opens | closes) & ~ok).sum()))
    sel = np.flatnonzero((opens | closes) & ok)
    order = sel[np.lexsort((events.time[sel], events.tid[sel]))]
    tids = events.tid[order]
    is_open = opens[order]
    times = events.time[order]
    # Per thread, an open pairs with a close right after it; everything
    # else is unpaired.
    same = np.concatenate((tids[1:] == tids[:-1], [False]))
    pair = is_open & np.concatenate((~is_open[1:], [False])) & same
    ends_taken = np.concatenate(([False], pair[:-1]))
    out.unpaired_open = int((is_open & ~pair).sum())
    out.unpaired_close = int((~is_open & ~ends_taken).sum())
    at = np.flatnonzero(pair)
    for tid in np.unique(tids[at]).tolist():
        mine = at[tids[at] == tid]
        out.by_tid[int(tid)] = (times[mine], times[mine + 1])
    return out


class WindowGate:
    """Pass on to ``on_blocks`` only the blocks that started inside a window
    of their thread; a block after a cut is marked as after a gap, so that
    no interval or call spans two windows.  ``kept`` and ``dropped``
    count instructions."""

    def __init__(self, windows: Windows, on_blocks) -> None:
        self.windows = windows
        self.on_blocks = on_blocks
        self.last: dict[tuple[int, int], int] = {}  # (queue, tid): window of the last block
        self.kept = 0
        self.dropped = 0

    def __call__(self, b) -> None:
        n = len(b)
        if not n:
            return
        win = np.full(n, -1, np.int64)
        for tid in np.unique(b.tid).tolist():
            got = self.windows.by_tid.get(int(tid))
            if got is None:
                continue
            starts, ends = got
            sel = np.flatnonzero(b.tid == tid)
            ns = b.ns[sel].astype(np.int64)
            k = np.searchsorted(starts, ns, side="right") - 1
            inside = (k >= 0) & (ns >= 0) & (ns <= ends[np.maximum(k, 0)])
            win[sel] = np.where(inside, k, -1)
        keep = win >= 0
        insns = b.ninsn.astype(np.int64)
        self.kept += int(insns[keep].sum())
        self.dropped += int(insns[~keep].sum())
        if not keep.any():
            for tid in np.unique(b.tid).tolist():
                self.last[(b.queue.index, int(tid))] = -1
            return
        # A kept block follows a cut where its thread's previous block in
        # the queue was in no window or in another one.
        before = np.full(n, -1, np.int64)
        for tid in np.unique(b.tid).tolist():
            sel = np.flatnonzero(b.tid == tid)
            key = (b.queue.index, int(tid))
            prev = np.concatenate(([self.last.get(key, -1)], win[sel][:-1]))
            before[sel] = prev
            self.last[key] = int(win[sel][-1])
        cut = keep & (before != win)
        idx = np.flatnonzero(keep)
        self.on_blocks(b.take(idx, b.gap[idx].astype(bool) | cut[idx]))


__all__ = [
    "AFTER",
    "BEFORE",
    "CLOCK_MONOTONIC",
    "NO_THREAD",
    "PERF_CLOCK",
    "PLACED",
    "STATUS_TEXT",
    "TSC",
    "UNTRACED",
    "EventPlacer",
    "EventsError",
    "FlowClock",
    "Placement",
    "SoftwareEvents",
    "WindowGate",
    "Windows",
    "clock_name",
    "event_windows",
    "flow_clock",
    "load_events",
]
