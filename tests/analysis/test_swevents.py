"""Software events placed on a decoded flow (hwtrace.analysis.swevents):
the streaming placer against a plain per-instruction model, whatever the
batches; clocks and bad input.  (The real correlation, LTTng-UST events on
a recording, is in test_tracer_impact.py.)"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.analysis.swevents import (
    AFTER,
    BEFORE,
    CLOCK_MONOTONIC,
    PERF_CLOCK,
    PLACED,
    TSC,
    UNTRACED,
    EventPlacer,
    EventsError,
    FlowClock,
    SoftwareEvents,
    clock_name,
    load_events,
)
from hwtrace.perf.sideband import TscConversion


@dataclass
class Blocks:
    """The columns of a PerfBlocks batch the placer reads."""

    ns: np.ndarray
    duration: np.ndarray
    ninsn: np.ndarray
    ip: np.ndarray
    gap: np.ndarray
    tid: np.ndarray

    def __len__(self) -> int:
        return self.ns.shape[0]

    def part(self, lo: int, hi: int) -> Blocks:
        return Blocks(*(getattr(self, c)[lo:hi] for c in
                        ("ns", "duration", "ninsn", "ip", "gap", "tid")))  # fmt: skip


def thread_blocks(rng: np.random.Generator, tid: int, n: int, t0: int) -> Blocks:
    """A thread's blocks: a few untimed ones first maybe, then times that
    rise now and then; stretches broken by gaps (tracing stopped: time
    goes by untraced); each block lasts until the next of its stretch."""
    ninsn = rng.integers(1, 6, n)
    gap = (rng.random(n) < 0.08).astype(np.uint8)
    gap[0] = 0
    ns = np.empty(n, np.int64)
    t = t0
    for k in range(n):
        if gap[k]:
            t += int(rng.integers(50, 500))  # untraced
        elif rng.random() < 0.4:
            t += int(rng.integers(1, 40))
        ns[k] = t
    untimed = min(int(rng.integers(0, 3)), n - 1)
    ns[:untimed] = -1
    duration = np.zeros(n, np.int64)
    for k in range(n):
        if ns[k] < 0:
            continue
        if k + 1 < n and not gap[k + 1]:
            duration[k] = ns[k + 1] - ns[k]
        else:
            duration[k] = int(rng.integers(0, 30))  # until tracing stopped
    ip = rng.integers(0x1000, 0x9000, n).astype(np.uint64)
    return Blocks(ns, duration, ninsn.astype(np.uint32), ip, gap, np.full(n, tid, np.int64))


def model(b: Blocks, t: int, err: int) -> tuple[int, int, int, int, int, bool]:
    """(status, first, at, last, ip, gap) of an event at ``t`` ± ``err``
    from each instruction's time interval: its step's time (the blocks of
    one time, unbroken by a gap) to the step's end."""
    steps = []  # [ns, end, start, stop, ip, gap]
    pos = 0
    for k in range(len(b)):
        ns, n = int(b.ns[k]), int(b.ninsn[k])
        if steps and not b.gap[k] and (ns < 0 or ns == steps[-1][0]):
            s = steps[-1]
            s[3] = pos + n - 1
            if ns >= 0:
                s[1] = max(s[1], ns + int(b.duration[k]))
        else:
            end = ns + int(b.duration[k]) if ns >= 0 else -1
            steps.append(
                [ns if ns >= 0 else -2, end, pos, pos + n - 1, int(b.ip[k]), int(b.gap[k])]
            )
        pos += n
    timed = [s for s in steps if s[0] >= 0]
    lo, hi = t - err, t + err
    meet = [i for i, s in enumerate(timed) if s[0] <= hi and s[1] >= lo]
    if not meet:
        if hi < timed[0][0]:
            return BEFORE, -1, -1, -1, 0, False
        if lo > max(s[1] for s in timed):
            return AFTER, -1, -1, -1, 0, False
        return UNTRACED, -1, -1, -1, 0, False
    a, z = meet[0], meet[-1]
    k = max([i for i in range(a, z + 1) if timed[i][0] <= t], default=a)
    gap = any(timed[i][5] for i in range(a + 1, z + 1))
    return PLACED, timed[a][2], timed[k][2], timed[z][3], timed[k][4], gap


def events_of(tids, times, err) -> SoftwareEvents:
    n = len(times)
    return SoftwareEvents(
        "test", "ctf", CLOCK_MONOTONIC, ["p:e"], np.zeros(n, np.int64),
        np.array(times, np.int64), np.full(n, err, np.int64), np.array(tids, np.int64),
        np.zeros(n, np.int64), [""] * n,
    )  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), err=st.sampled_from([0, 3, 25, 200]))
def test_placement_matches_the_model_whatever_the_batches(seed, err):
    rng = np.random.default_rng(seed)
    threads = {tid: thread_blocks(rng, tid, int(rng.integers(1, 60)), int(rng.integers(0, 300)))
               for tid in (7, 9)}  # fmt: skip
    tids, times = [], []
    for tid, b in threads.items():
        known = b.ns[b.ns >= 0]
        lo, hi = max(int(known.min()) - 100, 0), int((b.ns + b.duration).max()) + 100
        for t in rng.integers(lo, hi, 12).tolist():
            tids.append(tid)
            times.append(t)
    tids += [8, -1]  # a thread never traced, no thread
    times += [50, 50]
    ev = events_of(tids, times, err)
    placer = EventPlacer(ev)
    # Batches of either thread in turn, cut anywhere.
    cursors = {tid: 0 for tid in threads}
    while any(cursors[t] < len(b) for t, b in threads.items()):
        for tid, b in threads.items():
            lo = cursors[tid]
            if lo < len(b):
                hi = lo + int(rng.integers(1, 9))
                placer(b.part(lo, hi))
                cursors[tid] = hi
    got = placer.finish()
    for i, (tid, t) in enumerate(zip(tids, times, strict=True)):
        if tid not in threads:
            assert got.status[i] == (UNTRACED if tid >= 0 else 4)
            continue
        want = model(threads[tid], t, err)
        have = (int(got.status[i]), int(got.first[i]), int(got.at[i]), int(got.last[i]),
                int(got.ip[i]), bool(got.gap[i]))  # fmt: skip
        assert have == want, (i, tid, t)


def test_clocks_convert_or_say_why_not():
    conv = TscConversion(time_shift=31, time_mult=1 << 30, time_zero=1000)  # 0.5 ns per tick
    mono = FlowClock(CLOCK_MONOTONIC, 40, conv)
    perf = FlowClock(PERF_CLOCK, 0, conv)
    from hwtrace.analysis.swevents import _convert

    raw = np.array([0, 2000, 4001], np.int64)
    t, e = _convert(raw, TSC, perf, None, "x")
    assert t.tolist() == [1000, 2000, 3000] and e.tolist() == [1, 1, 1]
    t, e = _convert(raw, CLOCK_MONOTONIC, mono, None, "x")
    assert t.tolist() == raw.tolist() and e.tolist() == [40] * 3
    with pytest.raises(EventsError, match=r"relation is not known.*--clock-offset"):
        _convert(raw, CLOCK_MONOTONIC, perf, None, "trace")
    t, _ = _convert(raw, CLOCK_MONOTONIC, perf, -5, "trace")
    assert t.tolist() == [-5, 1995, 3996]
    with pytest.raises(EventsError, match="no TSC conversion"):
        _convert(raw, TSC, FlowClock(PERF_CLOCK), None, "trace")
    assert clock_name("x86-tsc") == TSC and clock_name("mono") == CLOCK_MONOTONIC
    with pytest.raises(EventsError, match="unknown clock 'boot'"):
        clock_name("boot")


def test_bad_event_inputs_are_one_line_errors(tmp_path):
    clock = FlowClock(CLOCK_MONOTONIC)
    with pytest.raises(EventsError, match="no such file"):
        load_events(tmp_path / "missing", clock)
    bad = tmp_path / "ctf"
    bad.mkdir()
    (bad / "metadata").write_text("/* CTF 1.8 */ this is not TSDL\n")
    with pytest.raises(EventsError):
        load_events(bad, clock)
