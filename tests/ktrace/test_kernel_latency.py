"""The co-operative system call latency tracker (:mod:`hwtrace.ktrace.syscall_latency`)
on the running kernel: thresholds set through the shared map, from Python,
from C (``include/hwtrace_coop.h`` in ``tests/data/coop_workload.c``) and
from the userspace filter tiers' ``set_threshold`` helper, decide exactly
which calls are recorded; the published state agrees with the records; and
no BPF object outlives the tracker, even one whose process was killed.

Which calls are recorded never depends on timing: a call meant to be
recorded is at least as slow as its threshold (a sleep never ends early),
one that is not has a negative threshold or one far above its latency.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hwtrace.kernel import bpf
from hwtrace.ktrace.syscall_latency import (
    ANY,
    COLUMNS,
    HEADER_FIELDS,
    HEADER_WORDS,
    HIST_WORDS,
    MAGIC,
    STATE_FIELDS,
    STATE_WORDS,
    VERSION,
    CoopLayout,
    LatencyTracker,
)

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "include"
WORKLOAD = ROOT / "tests" / "data" / "coop_workload.c"
READ, NANOSLEEP, CLOCK_NANOSLEEP = 0, 35, 230  # x86-64 system call numbers
MS = 1_000_000

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

_libc = ctypes.CDLL(None, use_errno=True)


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


def nanosleep(ns: int) -> None:
    """The nanosleep system call itself (glibc's may be clock_nanosleep)."""
    ts = _Timespec(ns // 1_000_000_000, ns % 1_000_000_000)
    assert _libc.syscall(ctypes.c_long(NANOSLEEP), ctypes.byref(ts), None) == 0


@pytest.fixture(scope="module")
def bpf_ok() -> None:
    """Skip unless the tracker's programs load and attach here."""
    if os.geteuid() != 0:
        pytest.skip("needs root: BPF programs on raw_syscalls tracepoints")
    try:
        with LatencyTracker(rows=2) as t:
            t.start()
    except Exception as e:  # BpfError, TracepointError, OSError: no BPF here
        pytest.skip(f"BPF tracing unavailable: {e}")


@pytest.fixture
def tracker(bpf_ok):
    t = LatencyTracker()
    try:
        yield t
    finally:
        t.close()


def gcc(tmp: Path, source: Path | str, name: str) -> Path:
    exe = tmp / name
    src = source if isinstance(source, Path) else tmp / f"{name}.c"
    if not isinstance(source, Path):
        src.write_text(source)
    cmd = ["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-pedantic", "-pthread",
           f"-I{INCLUDE}", "-o", str(exe), str(src)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return exe


def records(t: LatencyTracker) -> list[tuple[int, int, int, int]]:
    return [(int(r["nr"]), int(r["tid"]), int(r["threshold"]), int(r["latency"])) for r in t.read()]


# -- the header's layout is latency.py's ------------------------------------------------


@needs_gcc
def test_header_layout_matches_latency_py(tmp_path):
    h = [f"HWTRACE_H_{n.upper()}" for n in HEADER_FIELDS]
    s = [f"HWTRACE_S_{n.upper()}" for n in STATE_FIELDS]
    src = (
        textwrap.dedent(
            """\
        #include "hwtrace_coop.h"
        #include <stdio.h>
        int main(void) {
            printf("%llu %d %d %d %d %d %d %d\\n", (unsigned long long)HWTRACE_COOP_MAGIC,
                   HWTRACE_COOP_VERSION, HWTRACE_COLUMNS, HWTRACE_ANY, HWTRACE_HEADER_WORDS,
                   HWTRACE_HIST_WORDS, HWTRACE_STATE_WORDS, HWTRACE_HIST_OFFSET);
            for (int rows = 2; rows <= 1024; rows *= 2)
                printf("%d %d %d %d\\n", rows, HWTRACE_STATE_OFFSET,
                       HWTRACE_THRESHOLDS_OFFSET(rows), HWTRACE_WORDS(rows));
            int h[] = {H}, s[] = {S};
            for (unsigned i = 0; i < sizeof h / sizeof *h; i++) printf("%d ", h[i]);
            printf("\\n");
            for (unsigned i = 0; i < sizeof s / sizeof *s; i++) printf("%d ", s[i]);
            printf("\\n");
            return 0;
        }
        """
        )
        .replace("{H}", "{" + ", ".join(h) + "}")
        .replace("{S}", "{" + ", ".join(s) + "}")
    )
    out = subprocess.run([gcc(tmp_path, src, "layout")], check=True, capture_output=True, text=True)
    lines = [[int(x) for x in line.split()] for line in out.stdout.splitlines()]
    assert lines[0] == [MAGIC, VERSION, COLUMNS, ANY, HEADER_WORDS, HIST_WORDS, STATE_WORDS,
                        CoopLayout().hist]  # fmt: skip
    for rows, state, thresholds, words in lines[1:-2]:
        lay = CoopLayout(rows)
        assert (state, thresholds, words) == (lay.state, lay.thresholds, lay.words)
    assert lines[-2] == list(range(len(HEADER_FIELDS)))
    assert lines[-1] == list(range(len(STATE_FIELDS)))
    assert len(STATE_FIELDS) <= STATE_WORDS and len(HEADER_FIELDS) <= HEADER_WORDS


# -- thresholds from Python, in this process ----------------------------------------------


def test_python_thresholds_pick_the_calls(tracker):
    t, c = tracker, tracker.coop
    t.track(os.getpid())
    t.start()
    row = c.row_of()
    tid = threading.get_native_id()
    assert row is not None and c.thread_state(row)["tid"] == tid
    want = []
    c.set_threshold(5 * MS, NANOSLEEP, row=row)
    nanosleep(20 * MS)
    want.append((NANOSLEEP, 5 * MS, 20 * MS))
    c.set_threshold(50 * MS, NANOSLEEP, row=row)
    nanosleep(1 * MS)
    nanosleep(10 * MS)
    c.set_threshold(8 * MS, NANOSLEEP, row=row)
    nanosleep(10 * MS)
    want.append((NANOSLEEP, 8 * MS, 10 * MS))
    c.set_threshold(-1, NANOSLEEP, row=row)
    nanosleep(20 * MS)
    # Python's own sleep is clock_nanosleep: another column.
    c.set_threshold(5 * MS, CLOCK_NANOSLEEP, row=row)
    time.sleep(0.02)
    want.append((CLOCK_NANOSLEEP, 5 * MS, 20 * MS))
    c.set_threshold(0, CLOCK_NANOSLEEP, row=row)
    time.sleep(0.02)
    got = records(t)
    assert [(nr, tid_, thr) for nr, tid_, thr, _ in got] == [(nr, tid, thr) for nr, thr, _ in want]
    assert all(
        lat >= max(thr, least) for (*_, thr, lat), (*_, least) in zip(got, want, strict=True)
    )
    assert c.thread_state(row)["recorded"] == len(want)


# -- thresholds from C: tests/data/coop_workload.c -----------------------------------------


@pytest.fixture(scope="module")
def workload_exe(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    return gcc(tmp_path_factory.mktemp("coop"), WORKLOAD, "coop_workload")


@pytest.fixture(scope="module")
def workload(bpf_ok, workload_exe):
    """One run of the workload under a tracker: its output, records, and a
    copy of the shared memory after it exited."""
    with LatencyTracker() as t:
        t.start()
        fd = t.coop_fd
        proc = subprocess.Popen([workload_exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, pass_fds=[fd],
                                env={"HWTRACE_COOP_FD": str(fd)})  # fmt: skip
        try:
            assert proc.stdout.readline() == "READY\n"
            t.track(proc.pid)  # before any timed call: they wait for this line
            out, err = proc.communicate("go\n", timeout=20)
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == 0, err
        recs = t.read()
        words = t.coop.words.copy()
        layout = t.layout
    return proc.pid, out, recs, words, layout


def parse(out: str, kind: str) -> list[dict[str, int | str]]:
    rows = []
    for line in out.splitlines():
        if line.startswith(kind + " "):
            rows.append({k: (int(v) if re.fullmatch(r"-?\d+", v) else v)
                         for k, v in re.findall(r"(\w+)=(\S+)", line)})  # fmt: skip
    return rows


def test_c_thresholds_pick_exactly_the_expected_calls(workload):
    pid, out, recs, _, _ = workload
    assert out.rstrip().endswith("DONE")
    expect = parse(out, "EXPECT")
    got = [(int(r["nr"]), int(r["tid"]), int(r["threshold"])) for r in recs]
    assert got == [(e["nr"], e["tid"], e["threshold"]) for e in expect]  # and in order
    for r, e in zip(recs, expect, strict=True):
        assert int(r["latency"]) >= max(e["threshold"], e["min_ns"])
        assert int(r["pid"]) == pid and r["comm"] == b"coop_workload"
    threads = {r["name"]: r for r in parse(out, "ROW")}
    main, steer = threads["main"]["tid"], threads["steer"]["tid"]
    assert main == pid
    # Read of the pipe (its writer waited until the reader was blocked).
    assert (READ, main, 5 * MS) in got
    # The other thread's store took effect at the main thread's next call
    # (the last but one record), not at its own calls; its own row is apart.
    assert got[-2:] == [(NANOSLEEP, main, 5 * MS), (NANOSLEEP, steer, 5 * MS)]
    # Threshold and app_state stores made no system call.
    (nosys,) = parse(out, "NOSYSCALL")
    assert nosys["before"] == nosys["after"] > 0


def test_published_state_agrees_with_the_records(workload):
    _, out, recs, words, layout = workload
    header = words[:HEADER_WORDS]
    hist = words[layout.hist : layout.hist + HIST_WORDS]
    state = words[layout.state : layout.thresholds].reshape(layout.rows, STATE_WORDS)
    hdr = {name: int(header[k]) for k, name in enumerate(HEADER_FIELDS)}
    assert (hdr["magic"], hdr["version"], hdr["rows"]) == (MAGIC, VERSION, layout.rows)
    threads = parse(out, "ROW")
    assert hdr["next_row"] == 1 + len(threads) and hdr["overflow"] == 0
    assert hdr["recorded"] == len(recs) and hdr["lost"] == 0
    assert int(hist.sum()) == hdr["calls"] == int(state[1 : hdr["next_row"], 1].sum())
    field = {name: k for k, name in enumerate(STATE_FIELDS)}
    for th in threads:
        st = state[th["row"]]
        mine = recs[recs["tid"] == th["tid"]]
        assert st[field["tid"]] == th["tid"]
        assert st[field["recorded"]] == mine.size <= st[field["calls"]]
        lat = mine["latency"].astype(np.int64)
        assert st[field["max_latency"]] >= (lat.max() if lat.size else 0)
        assert st[field["total_latency"]] >= max(int(lat.sum()), int(st[field["max_latency"]]))
    (app,) = parse(out, "APPSTATE")
    assert state[app["row"], field["app_state"]] == app["value"]
    # The thresholds were left as the workload reset them.
    assert not words[layout.thresholds :].any()


@needs_gcc
def test_c_open_fails_cleanly_without_the_map(workload_exe, tmp_path):
    r = subprocess.run([workload_exe], capture_output=True, text=True, env={}, timeout=10)
    assert r.returncode == 2 and "hwtrace_coop_open" in r.stderr
    with open(tmp_path / "x", "wb") as f:
        f.write(b"\0" * 4096)
    with open(tmp_path / "x", "rb") as f:  # a descriptor, but not the map
        fd = f.fileno()
        r = subprocess.run([workload_exe], capture_output=True, text=True, timeout=10,
                           pass_fds=[fd], env={"HWTRACE_COOP_FD": str(fd)})  # fmt: skip
    assert r.returncode == 2 and "hwtrace_coop_open" in r.stderr


# -- the filter tiers' set_threshold helper writes into the same map -------------------------


def test_filter_tiers_set_thresholds_the_kernel_applies(tracker):
    from hwtrace.filter import native
    from hwtrace.filter.ebpf.asm import assemble
    from hwtrace.filter.ebpf.jit import jit_compile
    from hwtrace.filter.ebpf.program import Program

    t, c = tracker, tracker.coop
    t.track(os.getpid())
    t.start()
    row = c.row_of()
    tid = threading.get_native_id()
    t.share_with_filters()
    assert native.threshold_table_address() == c.thresholds.ctypes.data

    def setter(ns: int):
        text = f"r1 = {row * COLUMNS + NANOSLEEP}\nr2 = {ns}\ncall set_threshold\nr0 = 1\nexit"
        return Program(assemble(text), event_size=64).link()

    assert setter(5 * MS)(0, 0) == 1  # the interpreter
    assert c.thresholds[row, NANOSLEEP] == 5 * MS
    nanosleep(20 * MS)
    with jit_compile(setter(7 * MS)) as code:  # the JIT
        assert code(0) == 1
    assert c.thresholds[row, NANOSLEEP] == 7 * MS
    nanosleep(20 * MS)
    assert setter(-1)(0, 0) == 1
    nanosleep(20 * MS)
    got = records(t)
    assert [g[:3] for g in got] == [(NANOSLEEP, tid, 5 * MS), (NANOSLEEP, tid, 7 * MS)]
    assert all(lat >= 20 * MS for *_, lat in got)
    t.close()
    assert native.threshold_table_address() != 0  # back to the process's own table
    assert setter(3)(0, 0) == 1 and native.threshold_table()[row * COLUMNS + NANOSLEEP] == 3
    native.threshold_table()[row * COLUMNS + NANOSLEEP] = 0


# -- no BPF object outlives the tracker ---------------------------------------------------


def own_ids(t: LatencyTracker) -> tuple[set[int], set[int]]:
    maps = [t.coop_map, t.procs, t.rows, t.entries, t.ring.map]
    return {p.info()["id"] for p in t.programs}, {m.info()["id"] for m in maps}


def settle(before: tuple[set[int], set[int]], own: tuple[set[int], set[int]], timeout=5.0):
    """The BPF objects now, once ``own`` are gone (they are freed
    asynchronously) and the sets are back to ``before`` (or time is up:
    other processes may load objects meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        now = set(bpf.prog_ids()), set(bpf.map_ids())
        gone = not (own[0] & now[0] or own[1] & now[1])
        if (gone and now[0] <= before[0] and now[1] <= before[1]) or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


def test_no_objects_left_after_close(bpf_ok):
    before = set(bpf.prog_ids()), set(bpf.map_ids())
    t = LatencyTracker()
    try:
        t.track(os.getpid())
        t.start()
        t.share_with_filters()
        own = own_ids(t)
        assert len(own[0]) == 3 and len(own[1]) == 5
        assert own[0] <= set(bpf.prog_ids()) and own[1] <= set(bpf.map_ids())
        nanosleep(MS)
        t.read()
    finally:
        t.close()
    progs, maps = settle(before, own)
    assert not own[0] & progs and not own[1] & maps


KILLED = """
import json, os, time
from hwtrace.ktrace.syscall_latency import LatencyTracker
t = LatencyTracker()
t.track(os.getpid())
t.start()
t.share_with_filters()
maps = [t.coop_map, t.procs, t.rows, t.entries, t.ring.map]
print(json.dumps([[p.info()["id"] for p in t.programs], [m.info()["id"] for m in maps]]))
print("ready", flush=True)
time.sleep(60)
"""


def test_no_objects_left_after_sigkill(bpf_ok):
    before = set(bpf.prog_ids()), set(bpf.map_ids())
    proc = subprocess.Popen([sys.executable, "-c", KILLED], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)  # fmt: skip
    try:
        ids = json.loads(proc.stdout.readline() or "null")
        assert ids and proc.stdout.readline() == "ready\n"
        own = set(ids[0]), set(ids[1])
        assert own[0] <= set(bpf.prog_ids()) and own[1] <= set(bpf.map_ids())
        os.kill(proc.pid, signal.SIGKILL)  # mid-run: the programs are attached
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
    progs, maps = settle(before, own)
    assert not own[0] & progs and not own[1] & maps
