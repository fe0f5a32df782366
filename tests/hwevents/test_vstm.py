"""The virtual STM + ETB: C producers (``hwtrace_stm.h``) write the STPv2
packets an STM would into a small shared-memory ring, hwtrace drains and
decodes them (stall and drop policies), and the ETB model."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import time

import numpy as np
import pytest
from opencsd_oracle import list_source, needs_opencsd

from hwtrace.hwevents.stp import StpKind, decode_stp
from hwtrace.hwevents.vstm import (
    ASYNC_VERSION,
    VirtualStm,
    decode_events,
    header_path,
    simulate_etb,
)

PROGRAM = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "hwtrace_stm.h"

static int n_events, size;
static long kept[64];

/* Thread `me`'s event k: 1 to 3 values (me, k, me * 1000000 + k) of
 * `size` bytes each. */
static void *worker(void *arg)
{
    uint64_t me = (uint64_t)(uintptr_t)arg, words[3];
    for (int k = 0; k < n_events; k++) {
        words[0] = me;
        words[1] = (uint64_t)k;
        words[2] = me * 1000000 + (uint64_t)k;
        kept[me] += hwtrace_stm_emit_sized(size, 1 + k % 3, words);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = atoi(argv[1]);
    pthread_t t[64];
    n_events = atoi(argv[2]);
    size = atoi(argv[3]);
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < threads; i++)
        printf("%ld\n", kept[i + 1]);
    return 0;
}
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    d = tmp_path_factory.mktemp("vstm")
    (d / "prog.c").write_text(PROGRAM)
    exe = d / "prog"
    subprocess.run([gcc, "-O2", "-Wall", "-Werror", "-pthread", f"-I{header_path().parent}", "-o", str(exe),
                    str(d / "prog.c")], check=True)  # fmt: skip
    return str(exe)


def _run(program: str, stm: VirtualStm, threads: int, events: int, size: int = 8) -> list[int]:
    out = subprocess.run([program, str(threads), str(events), str(size)], env=dict(os.environ, **stm.env()),
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return [int(x) for x in out.stdout.split()]


def _values(ev, i: int, size: int) -> np.ndarray:
    return np.frombuffer(ev.data(i), f"<u{size}").astype(np.uint64)


def _check_event(vals: np.ndarray, size: int) -> tuple[int, int]:
    """An event's values (me, k, me * 1000000 + k, cut to ``size`` bytes,
    1 + k % 3 of them): (me, k), k = -1 when the event has one value."""
    mask = (1 << (8 * size)) - 1
    me = int(vals[0])
    assert 1 <= me <= 64
    if len(vals) == 1:
        return me, -1
    k = int(vals[1])
    assert len(vals) == 1 + k % 3
    if len(vals) == 3:
        assert int(vals[2]) == (me * 1_000_000 + k) & mask
    return me, k


@pytest.mark.parametrize("size", [8, 2])
def test_stall_every_event_in_order(program, size):
    """Two threads, a 4 KiB ETB drained while they run, stall policy:
    every event of both threads decodes, on the thread's own channel, with
    its payload, in order; nothing dropped; the stream's clock never goes
    back; the counters agree."""
    n = 20_000 if size == 8 else 6_000
    with VirtualStm(4096, "stall") as stm:
        stm.start(1e-3)
        try:
            kept = _run(program, stm, 2, n, size)
        finally:
            stm.stop()
        assert kept == [n, n]
        threads = stm.threads()
        assert stm.written == 2 * n and stm.dropped == 0
        assert sorted(t["events"] for t in threads.values()) == [n, n]
        assert stm.drained == len(stm.stream) and bytes(stm.stream[:13]) == ASYNC_VERSION
        ev = stm.events()
    assert len(ev) == 2 * n and ev.complete.all() and ev.partial == 0 and ev.lost == 0
    assert set(np.unique(ev.channel).tolist()) == set(threads) and len(threads) == 2
    assert len(set(np.unique(ev.master).tolist())) == 1
    assert (np.diff(ev.ts.astype(np.int64)) >= 0).all()
    for chan in threads:
        rows = np.flatnonzero(ev.channel == chan)
        assert len(rows) == n
        got = [_check_event(_values(ev, int(i), size), size) for i in rows]
        me = {m for m, _ in got}
        assert len(me) == 1
        ks = np.array([k for _, k in got])
        expect = np.arange(n)
        assert np.array_equal(ks, np.where(expect % 3 == 0, -1, expect % (1 << min(8 * size, 62))))


def test_drop_accounting_with_a_tiny_etb(program):
    """Drop policy, a 256-byte ETB, nobody draining while two threads emit:
    what was kept plus what was dropped is what was emitted, per thread;
    the kept events decode whole (no torn event), their count agrees."""
    n = 5_000
    with VirtualStm(256, "drop") as stm:
        kept = _run(program, stm, 2, n)
        threads = stm.threads()
        assert sorted(t["events"] for t in threads.values()) == sorted(kept)
        for t in threads.values():
            assert t["events"] + t["dropped"] == n and t["dropped"] > 0 and t["stalls"] == 0
        stm.drain()
        assert 0 < len(stm.stream) <= 256
        ev = stm.events()
        packets = decode_stp(bytes(stm.stream))
    assert not packets.errors
    assert len(ev) == sum(kept) and ev.complete.all() and ev.partial == 0
    for i in range(len(ev)):
        me, _ = _check_event(_values(ev, i, 8), 8)
        assert threads[int(ev.channel[i])]["tid"] > 0
        assert me in (1, 2)


def test_drop_while_draining_slowly(program):
    """Drop policy, a 512-byte ETB drained every few milliseconds: across
    many drains the stream stays one decodable stream; kept + dropped =
    emitted; every kept event intact, each thread's in order."""
    n = 30_000
    with VirtualStm(512, "drop") as stm:
        stm.start(3e-3)
        try:
            kept = _run(program, stm, 2, n)
        finally:
            stm.stop()
        threads = stm.threads()
        assert stm.written + stm.dropped == 2 * n and stm.written == sum(kept)
        assert stm.drains >= 1
        packets = decode_stp(bytes(stm.stream))
        ev = stm.events()
    assert not packets.errors
    assert len(ev) == sum(kept) and ev.complete.all()
    for chan, t in threads.items():
        rows = np.flatnonzero(ev.channel == chan)
        assert len(rows) == t["events"]
        ks = [_check_event(_values(ev, int(i), 8), 8)[1] for i in rows]
        ks = np.array([k for k in ks if k >= 0])
        assert (np.diff(ks) > 0).all()


@needs_opencsd
def test_opencsd_reads_the_stream(program, tmp_path):
    """OpenCSD's STM packet lister reads the produced stream without an
    error, packet for packet as hwtrace's decoder (channels crossing 255,
    so C16 as well as C8, and every data size)."""
    with VirtualStm(4096, "stall", channel_base=254) as stm:
        stm.start(1e-3)
        try:
            for size in (1, 2, 4, 8):
                _run(program, stm, 3, 300, size)
        finally:
            stm.stop()
        data = bytes(stm.stream)
    rows = list_source(tmp_path / "snap", data, "STM", {"STMTCSR": 0x00100003})
    packets = decode_stp(data)
    kinds = {int(k) for k in packets.kind}
    assert {int(StpKind.C8), int(StpKind.C16), int(StpKind.M8)} <= kinds
    assert not any("ERR" in r.name or "BAD" in r.name or "RESERVED" in r.name for r in rows)
    assert [r.idx for r in rows] == packets.offset.tolist()
    events = decode_events(data)
    assert len(events) == 4 * 3 * 300 and events.complete.all()
    assert sum(r.name.endswith("MTS") for r in rows) == len(events)


def test_stalled_producers_let_go_when_the_consumer_closes(program):
    """Stall policy and nobody draining: the producers wait; closing the
    ETB releases them (they drop from then on) and the program ends."""
    stm = VirtualStm(256, "stall")
    proc = subprocess.Popen([program, "2", "2000", "8"], env=dict(os.environ, **stm.env()),
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while stm.used() + 64 < 256 and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(0.02)
        assert proc.poll() is None  # waiting for room
    finally:
        stm.close()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and 0 < sum(int(x) for x in out.split()) < 4000


FORK = r"""
#include <sys/wait.h>
#include "hwtrace_stm.h"
int main(void)
{
    uint64_t w;
    pid_t child;
    for (w = 100; w < 110; w++)
        hwtrace_stm_emit(1, &w);
    child = fork();
    for (w = child ? 300 : 200; w % 100 < 10; w++)
        hwtrace_stm_emit(1, &w);
    if (child)
        waitpid(child, NULL, 0);
    return 0;
}
"""


def test_a_forked_child_is_another_master(program, tmp_path):
    """A process is a master: after fork the child writes as a master of
    its own, the parent's events stay on its channel, in order."""
    (tmp_path / "fork.c").write_text(FORK)
    exe = tmp_path / "fork"
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", f"-I{header_path().parent}", "-o", str(exe),
                    str(tmp_path / "fork.c")], check=True)  # fmt: skip
    with VirtualStm() as stm:
        subprocess.run([str(exe)], env=dict(os.environ, **stm.env()), check=True, timeout=30)
        stm.drain()
        threads = stm.threads()
        ev = stm.events()
    by = {}
    for i in range(len(ev)):
        by.setdefault((int(ev.master[i]), int(ev.channel[i])), []).append(
            int.from_bytes(ev.data(i), "little")
        )
    assert sorted(by.values()) == [[*range(100, 110), *range(300, 310)], list(range(200, 210))]
    assert len({m for m, _ in by}) == 2
    assert {(t["master"], c) for c, t in threads.items()} == set(by)


def test_without_an_etb_the_program_runs(program):
    env = {k: v for k, v in os.environ.items() if k != "HWTRACE_STM"}
    out = subprocess.run(
        [program, "2", "100", "8"], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["0", "0"]
    env["HWTRACE_STM"] = "/nonexistent/etb"
    assert (
        subprocess.run(
            [program, "2", "100", "8"], env=env, capture_output=True, check=False
        ).returncode
        == 0
    )


def test_bad_arguments():
    with pytest.raises(ValueError):
        VirtualStm(1000)
    with pytest.raises(ValueError):
        VirtualStm(4096, "overwrite")
    with pytest.raises(ValueError):
        simulate_etb(1e5, 8, 4, 1e-3, 1e9, "drop", 0.01)


# -- the model ---------------------------------------------------------------


def test_model_drop_no_loss_while_the_consumer_keeps_up():
    """8-byte events at 1e5/s into 4 KiB, drained every ms: 800 bytes per
    period fit, so nothing is lost; at higher rates the loss grows."""
    r = simulate_etb(1e5, 8, 4096, 1e-3, 1e9, "drop", 0.2)
    assert r["dropped"] == 0 and r["written"] == r["attempted"] == 20_000 and r["stall_s"] == 0
    losses = [
        simulate_etb(rate, 8, 4096, 1e-3, 1e9, "drop", 0.05)["loss"]
        for rate in (1e5, 1e6, 3e6, 1e7)
    ]
    assert losses[0] == 0 and all(b > a for a, b in itertools.pairwise(losses))
    # Drained faster than produced but rarely: loss from the ETB's size alone.
    r = simulate_etb(1e6, 8, 1024, 1e-3, 1e12, "drop", 0.1)
    assert r["loss"] == pytest.approx(1 - 128 / 1000, abs=0.01)
    assert r["written"] + r["dropped"] == r["attempted"]


def test_model_drop_slow_consumer():
    """A consumer that moves fewer bytes per second than the producer
    writes loses at least the difference, less what the ETB holds."""
    for size in (1024, 65536):
        r = simulate_etb(1e6, 10, size, 1e-4, 2e6, "drop", 0.1)
        assert r["loss"] >= 1 - (2e6 * 0.1 + size) / (1e7 * 0.1)
        assert r["loss"] < 0.9


def test_model_stall():
    """Stall: never a drop; no stall while the ETB never fills; when it
    does, the producer waits and finishes late by about that time."""
    r = simulate_etb(1e5, 8, 4096, 1e-3, 1e9, "stall", 0.2)
    assert r["stalls"] == 0 and r["stall_s"] == 0 and r["dropped"] == 0 and r["peak_fill"] <= 4096
    r = simulate_etb(1e7, 8, 1024, 1e-3, 5e7, "stall", 0.05, wake_latency_s=20e-6)
    assert r["dropped"] == 0 and r["written"] == r["attempted"] and r["stalls"] > 0
    assert r["peak_fill"] <= 1024
    # The consumer moves 5e7 B/s, the producer wants 8e7 B/s: it runs late.
    assert r["elapsed_s"] > 0.05 * 8e7 / 5e7 * 0.9
    # Late by at least the waits' excess over the idle pacing, never more.
    assert r["elapsed_s"] - 0.05 <= r["stall_s"] <= r["elapsed_s"]
    # Each cycle: the ETB fills, the consumer wakes (20 us) and copies 1 KiB
    # (20 us) while the producer waits; events cost nothing here.
    assert r["stall_s"] == pytest.approx(500_000 / 128 * 40e-6, rel=0.05)
    stalls = [
        simulate_etb(rate, 8, 4096, 1e-3, 1e8, "stall", 0.05)["stall_fraction"]
        for rate in (1e5, 1e6, 1e7)
    ]
    assert stalls[0] == 0 and stalls[1] > 0 and stalls[2] > stalls[1]


def test_model_late_consumer():
    """The consumer's sleeps as measured: one long sleep in ten overflows a
    4 KiB ETB at 1e5 events/s that regular 1 ms sleeps never fill."""
    regular = simulate_etb(1e5, 8, 4096, 1e-3, 1e9, "drop", 0.2)
    late = simulate_etb(1e5, 8, 4096, 1e-3, 1e9, "drop", 0.2, sleeps=[1e-3] * 9 + [10e-3])
    assert regular["loss"] == 0 and late["loss"] > 0
    # per 19 ms: 9 short cycles lose nothing, the long one 1000 - 512 events
    assert late["loss"] == pytest.approx(488 / 1900, abs=0.02)
    with pytest.raises(ValueError):
        simulate_etb(1e5, 8, 4096, 1e-3, 1e9, "drop", 0.2, sleeps=[0.0])
