"""Timelines in the Chrome trace-event JSON format, which Perfetto's UI
(ui.perfetto.dev), chrome://tracing and Speedscope open.

Each thread is a track of nested slices, one per call
(:func:`hwtrace.analysis.timeline.call_slices`; complete events, ``"ph":
"X"``), named ``module!function``; software events placed on the flow
(:mod:`hwtrace.analysis.swevents`) are instant events (``"ph": "i"``) on
their thread's track.  Processes and threads are named by metadata events.
Times are microseconds with nanosecond decimals, as the format wants.

The events are written by a compiled writer, a chunk of the file at a
time; only names (one per function, event type, thread) go through
Python.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .. import aot
from ..columns import distinct
from ..textout import put_byte, put_dec, put_row, string_list_table

_CHUNK = 1 << 16  # events per write


@aot.njit(cache=True, _nrt=False)
def _put_us(out, p, ns):
    """``ns`` nanoseconds as microseconds with three decimals."""
    p = put_dec(out, p, ns // 1000)
    out[p] = 46  # '.'
    r = ns % 1000
    out[p + 1] = 48 + r // 100
    out[p + 2] = 48 + (r // 10) % 10
    out[p + 3] = 48 + r % 10
    return p + 4


@aot.njit(cache=True, _nrt=False)
def _put_key(out, p, text):
    for c in text:
        out[p] = c
        p += 1
    return p


@aot.njit(cache=True, _nrt=False)
def _write(out, kind, name, pid, tid, start, dur, tab, lens, lo, hi, pre_x, pre_i, mid_pid,
           mid_tid, mid_ts, mid_dur, post_x, post_i):  # fmt: skip
    """Events ``lo..hi`` as JSON objects, each on its own line after a
    comma: complete events (``kind`` 0) or thread-scoped instants (1)."""
    p = 0
    for i in range(lo, hi):
        p = put_byte(out, p, 44)  # ','
        p = put_byte(out, p, 10)
        p = _put_key(out, p, pre_x if kind[i] == 0 else pre_i)
        p = put_row(out, p, tab, lens, name[i])
        p = _put_key(out, p, mid_pid)
        p = put_dec(out, p, pid[i])
        p = _put_key(out, p, mid_tid)
        p = put_dec(out, p, tid[i])
        p = _put_key(out, p, mid_ts)
        p = _put_us(out, p, start[i])
        if kind[i] == 0:
            p = _put_key(out, p, mid_dur)
            p = _put_us(out, p, dur[i])
            p = _put_key(out, p, post_x)
        else:
            p = _put_key(out, p, post_i)
    return p


def _bytes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), np.uint8)


def write_timeline(
    path: str | Path,
    *,
    key: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    name: np.ndarray,
    names: list[str],
    pid_of: Callable[[int], int],
    thread_names: dict[int, str],
    process_names: dict[int, str] | None = None,
    instants: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    instant_names: list[str] | None = None,
) -> int:
    """Write the slices (per slice: the thread ``key``, ``start`` and
    ``end`` in ns, ``name`` an index into ``names``) and the instants
    (``(tid, time ns, name index into instant_names)``) as a Chrome
    trace-event file; returns the number of events."""
    keys = distinct(key)
    if instants is not None:
        keys = distinct(np.concatenate([keys, instants[0]]))
    pids = {int(k): int(pid_of(int(k))) for k in keys.tolist()}
    n_x = start.shape[0]
    all_names = list(names) + list(instant_names or [])
    kind = np.zeros(n_x, np.int8)
    nm = name.astype(np.int64)
    tids = key.astype(np.int64)
    t0 = start.astype(np.int64)
    dur = (end - start).astype(np.int64)
    if instants is not None and instants[0].shape[0]:
        itid, itime, iname = instants
        kind = np.concatenate([kind, np.ones(itid.shape[0], np.int8)])
        nm = np.concatenate([nm, iname.astype(np.int64) + len(names)])
        tids = np.concatenate([tids, itid.astype(np.int64)])
        t0 = np.concatenate([t0, itime.astype(np.int64)])
        dur = np.concatenate([dur, np.zeros(itid.shape[0], np.int64)])
    order = np.argsort(t0, kind="stable")
    kind, nm, tids, t0, dur = kind[order], nm[order], tids[order], t0[order], dur[order]
    pid = np.array([pids.get(int(t), 0) for t in distinct(tids).tolist()], np.int64)
    pid = pid[np.searchsorted(distinct(tids), tids)] if tids.shape[0] else tids
    # Names as JSON strings (quotes and escapes included), one row each.
    tab, lens = string_list_table([json.dumps(s) for s in all_names])
    meta = []
    for k in keys.tolist():
        p = pids[int(k)]
        meta.append({"ph": "M", "name": "thread_name", "pid": p, "tid": int(k),
                     "args": {"name": thread_names.get(int(k), str(k))}})  # fmt: skip
    for p, label in sorted((process_names or {}).items()):
        meta.append({"ph": "M", "name": "process_name", "pid": int(p), "tid": int(p),
                     "args": {"name": label}})  # fmt: skip
    width = int(tab.shape[1]) + 160
    buf = np.zeros(_CHUNK * width, np.uint8)
    keys_b = [_bytes(x) for x in ('{"ph":"X","cat":"call","name":', '{"ph":"i","s":"t","name":',
                                  ',"pid":', ',"tid":', ',"ts":', ',"dur":', "}", "}")]  # fmt: skip
    with open(path, "wb") as f:
        f.write(b'{"displayTimeUnit":"ns","traceEvents":[\n')
        f.write(",\n".join(json.dumps(m, separators=(",", ":")) for m in meta).encode())
        lo = 0
        if not meta:
            # The writer puts a comma before each event: a harmless first one.
            f.write(b'{"ph":"M","name":"process_name","pid":0,"tid":0,"args":{"name":"hwtrace"}}')
        while lo < t0.shape[0]:
            hi = min(lo + _CHUNK, t0.shape[0])
            p = _write(buf, kind, nm, pid, tids, t0, dur, tab, lens, lo, hi, *keys_b)
            f.write(buf[:p].tobytes())
            lo = hi
        f.write(b"\n]}\n")
    return len(meta) + t0.shape[0]


__all__ = ["write_timeline"]
