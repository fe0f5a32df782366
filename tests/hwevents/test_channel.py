"""The software PTW channel: C producers (``hwtrace_channel.h``) write PT
packets into shared-memory sub-buffers, hwtrace takes them whole and
decodes the events as it decodes hardware PTWRITE."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

import numpy as np
import pytest

from hwtrace.hwevents.channel import Channel, header_path
from hwtrace.hwevents.ptw import decode_events

PROGRAM = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "hwtrace_channel.h"

static int n_events;

static void *worker(void *arg)
{
    uint64_t me = (uint64_t)(uintptr_t)arg, words[3];
    for (int k = 0; k < n_events; k++) {
        words[0] = me;
        words[1] = (uint64_t)k;
        words[2] = me * 1000000 + (uint64_t)k;
        hwtrace_emit(7, k % 4, words);  /* 0 to 3 payload words */
    }
    hwtrace_flush();
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = atoi(argv[1]);
    pthread_t t[64];
    n_events = atoi(argv[2]);
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    return 0;
}
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    d = tmp_path_factory.mktemp("channel")
    (d / "prog.c").write_text(PROGRAM)
    exe = d / "prog"
    subprocess.run([gcc, "-O2", "-pthread", f"-I{header_path().parent}", "-o", str(exe), str(d / "prog.c")],
                   check=True)  # fmt: skip
    return str(exe)


def _run(program: str, ch: Channel, threads: int, events: int, drain_while: bool = False) -> None:
    env = dict(os.environ, **ch.env())
    proc = subprocess.Popen([program, str(threads), str(events)], env=env)
    if drain_while:
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                ch.drain()
                stop.wait(0.001)

        t = threading.Thread(target=loop)
        t.start()
        assert proc.wait(timeout=120) == 0
        stop.set()
        t.join()
    else:
        assert proc.wait(timeout=120) == 0
    ch.drain()


def _check_thread(ev, me: int, expect: np.ndarray) -> None:
    """Events of thread ``me`` (their k in ``expect``): payloads as written,
    times not going back."""
    assert np.array_equal(ev.type_id, np.full(len(ev), 7))
    k = np.where(ev.nwords >= 2, ev.words[:, 1], -1)
    n = ev.nwords
    assert np.array_equal(n, expect % 4)
    has1 = n >= 1
    assert (ev.words[has1, 0] == me).all()
    has2 = n >= 2
    assert np.array_equal(k[has2], expect[has2])
    has3 = n >= 3
    assert np.array_equal(ev.words[has3, 2], me * 1_000_000 + expect[has3])
    assert (np.diff(ev.time.astype(np.int64)) >= 0).all()


def test_every_event_of_every_thread(program):
    """4 threads of 20,000 events, drained while they run, into rings big
    enough: every event, per thread, in order, decoded as PTW; the counts
    agree."""
    with Channel(areas=8, nsub=8, sub_size=64 << 10) as ch:
        _run(program, ch, 4, 20_000, drain_while=True)
        stats = ch.stats()
        assert sorted(s["events"] + s["lost"] for s in stats.values()) == [20_000] * 4
        for tid, data in ch.streams.items():
            ev = decode_events(bytes(data))
            assert ev.lost == 0 and ev.stray == 0 and not ev.problems
            assert len(ev) == stats[tid]["events"]
            me = int(ev.words[ev.nwords >= 1, 0][0])
            if stats[tid]["lost"] == 0:
                _check_thread(ev, me, np.arange(20_000))


def test_drop_policy_when_nobody_drains(program):
    """Nobody drains until the threads end: each keeps exactly what its ring
    holds (the paper's drop policy), the rest is counted lost, and what is
    kept decodes whole: the first events, in order."""
    nsub, sub = 2, 4096
    with Channel(areas=4, nsub=nsub, sub_size=sub) as ch:
        _run(program, ch, 2, 5_000)
        # Events of 0-3 words are 18, 28, 38, 48 bytes; a sub-buffer begins
        # with a 26-byte PSB+ and takes events while they fit.
        sizes = 8 + 10 * (1 + np.arange(5_000) % 4)
        kept, k = 0, 0
        for _ in range(nsub):
            used = 26
            while k < 5_000 and used + sizes[k] <= sub:
                used += sizes[k]
                k += 1
            kept = k
        for tid, s in ch.stats().items():
            assert s["events"] == kept and s["lost"] == 5_000 - kept
            ev = decode_events(bytes(ch.streams[tid]))
            assert len(ev) == kept and ev.lost == 0
            _check_thread(ev, int(ev.words[ev.nwords >= 1, 0][0]), np.arange(kept))


def test_without_a_channel_the_program_runs(program):
    env = {k: v for k, v in os.environ.items() if k != "HWTRACE_CHANNEL"}
    assert subprocess.run([program, "2", "100"], env=env, check=False).returncode == 0
    env["HWTRACE_CHANNEL"] = "/nonexistent/channel"
    assert subprocess.run([program, "2", "100"], env=env, check=False).returncode == 0
