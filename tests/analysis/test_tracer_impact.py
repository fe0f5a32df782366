"""The thesis' tracer-impact experiment (Sharma 2017, §5.4.5), real and in
user space: a program's function hits an LTTng-UST tracepoint; recorded
with ``hwtrace record`` once with an LTTng session enabled on that
tracepoint and once without, ``hwtrace diff`` shows the LTTng-UST probe
paths only in the traced run, and the extra instructions and time per
call of the function."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from test_record_software import SKIP

REPO = Path(__file__).resolve().parents[2]
PROVIDER = r"""
#undef TRACEPOINT_PROVIDER
#define TRACEPOINT_PROVIDER hwtrace_impact
#undef TRACEPOINT_INCLUDE
#define TRACEPOINT_INCLUDE "./impact_tp.h"
#if !defined(IMPACT_TP_H) || defined(TRACEPOINT_HEADER_MULTI_READ)
#define IMPACT_TP_H
#include <lttng/tracepoint.h>
TRACEPOINT_EVENT(hwtrace_impact, hit,
    TP_ARGS(long, value),
    TP_FIELDS(ctf_integer(long, value, value)))
#endif
#include <lttng/tracepoint-event.h>
"""
PROGRAM = r"""
#define TRACEPOINT_DEFINE
#define TRACEPOINT_CREATE_PROBES
#include "impact_tp.h"
#define NOINLINE __attribute__((noinline))
static volatile long sink;
NOINLINE long handle(long x) {
    tracepoint(hwtrace_impact, hit, x);
    sink += x;
    return x * 7;
}
NOINLINE long work(int n) {
    long s = 0;
    for (int i = 0; i < n; i++)
        s += handle(i);
    return s;
}
int main(void) { return (int)(work(6) & 1); }
"""
EVENT = "hwtrace_impact:hit"


def _bench_lttng():
    spec = importlib.util.spec_from_file_location("bench_lttng", REPO / "bench" / "bench_lttng.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_lttng"] = module
    sys.path.insert(0, str(REPO / "bench"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "bench"))
    return module


@pytest.fixture(scope="module")
def lttng(tmp_path_factory):
    if SKIP is not None:
        pytest.skip(str(SKIP))
    bl = _bench_lttng()
    missing = bl.lttng_missing()
    if missing:
        pytest.skip(f"LTTng-UST is not installed (missing {', '.join(missing)})")
    d = tmp_path_factory.mktemp("impact")
    (d / "impact_tp.h").write_text(PROVIDER)
    (d / "impact.c").write_text(PROGRAM)
    exe = d / "impact"
    bl.run([bl.compiler(), "-O2", "-g0", "-I", str(d), "-o", str(exe), str(d / "impact.c"),
            *bl.LIBS], timeout=120)  # fmt: skip
    with bl.session_daemon(d / "sessiond.log"):
        yield bl, exe, d


def test_diff_shows_the_tracer_s_paths_and_cost(lttng, tmp_path, capsys, monkeypatch):
    from hwtrace.cli.main import main
    from hwtrace.record import record_software
    from hwtrace.record.perfdata import write_perf_data

    bl, exe, _ = lttng
    # The tracepoint must be enabled before main: LTTng-UST's constructor
    # waits for the session daemon that long (3 s by default).
    monkeypatch.setenv("LTTNG_UST_REGISTER_TIMEOUT", "20000")
    runs = []
    for traced in (False, True):
        session = bl.Session(f"hwtrace-impact-{os.getpid()}", None, tmp_path)
        if traced:
            bl.lttng("create", session.name, "--snapshot", "--output", str(tmp_path / "snap"))
            session.live = True
            bl.lttng("enable-event", "-u", "-s", session.name, EVENT)
            bl.lttng("start", session.name)
        try:
            rec = record_software([str(exe)], calls=["work"])
        finally:
            session.destroy()
        path = tmp_path / f"{'traced' if traced else 'plain'}.data"
        write_perf_data(rec, path, buildid_cache=False)
        runs.append(str(path))
    out = tmp_path / "diff.json"
    capsys.readouterr()
    view = tmp_path / "diff.html"
    assert main(["diff", *runs, "--json", str(out), "--html", str(view)]) == 0
    data = json.loads(out.read_text())
    page = view.read_text()
    assert '"view":"diff"' in page and "liblttng-ust" in page
    paths = {p["key"]: p for p in data["paths"]}
    only_b = [k for k, p in paths.items() if p["only_in"] == "b"]
    assert any("liblttng-ust" in k for k in only_b), only_b
    assert not any(p["only_in"] == "a" for p in paths.values())
    handle = next(k for k in paths if k.endswith("!handle") and paths[k]["a"] and paths[k]["b"])
    a, b = paths[handle]["a"], paths[handle]["b"]
    assert a["calls"] == b["calls"] == 6
    extra_insn = (b["insn"] - a["insn"]) / 6
    extra_time = (b["time"] - a["time"]) / 6
    assert extra_insn > 100
    functions = {f["key"]: f for f in data["functions"]}
    assert any("liblttng-ust" in k and f["only_in"] == "b" for k, f in functions.items())
    print(f"tracer impact per call of handle: +{extra_insn:.0f} instructions, "
          f"+{extra_time:.0f} ns (stepping time)")  # fmt: skip


def record_with_lttng(bl, exe, tmp_path, name: str, events: str, contexts: list[str]):
    """``exe`` recorded by ``hwtrace record --call work`` while an LTTng-UST
    session (a channel with ``contexts``) traces ``events``: the recording,
    written to ``tmp_path/perf.data``, and the session's CTF snapshot in
    ``tmp_path/ctf``."""
    from hwtrace.record import record_software
    from hwtrace.record.perfdata import write_perf_data

    session = bl.Session(f"hwtrace-{name}-{os.getpid()}", None, tmp_path)
    bl.lttng("create", session.name, "--snapshot", "--output", str(tmp_path / "snap"))
    session.live = True
    try:
        bl.lttng("enable-channel", "-u", "-s", session.name, "ch")
        bl.lttng("add-context", "-u", "-s", session.name, "-c", "ch",
                 *(a for c in contexts for a in ("-t", c)))  # fmt: skip
        bl.lttng("enable-event", "-u", "-s", session.name, "-c", "ch", events)
        bl.lttng("start", session.name)
        rec = record_software([str(exe)], calls=["work"])
        bl.lttng("stop", session.name)
        bl.lttng("snapshot", "record", "-s", session.name, str(tmp_path / "ctf"))
    finally:
        session.destroy()
    write_perf_data(rec, tmp_path / "perf.data", buildid_cache=False)
    return rec, tmp_path / "perf.data"


def test_events_land_at_their_call_sites(lttng, tmp_path, capsys, monkeypatch):
    """Correlation: the program recorded by ``hwtrace record`` and by an
    LTTng-UST session together; ``hwtrace events`` places every tracepoint
    event (CTF, LTTng's monotonic clock) on the flow (CLOCK_MONOTONIC),
    within the clock conversion's stated error, inside the call of the
    probe made at the event's call site (LTTng's ``ip`` context: the
    return address of that call)."""
    import numpy as np

    from hwtrace.cli.main import main

    bl, exe, _ = lttng
    monkeypatch.setenv("LTTNG_UST_REGISTER_TIMEOUT", "20000")
    rec, data = record_with_lttng(bl, exe, tmp_path, "events", EVENT, ["vtid", "ip"])
    out = tmp_path / "events.json"
    capsys.readouterr()
    assert main(["events", "-i", str(data), str(tmp_path / "ctf"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    got = json.loads(out.read_text())
    events = got["events"]
    assert len(events) == 6 and got["clock"] == "CLOCK_MONOTONIC"
    assert all(e["status"] == "placed" for e in events), text
    (tr,) = rec.threads
    ips = tr.instructions.astype(np.int64)
    assert 0 < events[0]["error"] == rec.clock_error_ns < 1_000_000
    for e in events:
        assert e["tid"] == tr.tid and not e["gap"]
        ret = int(e["context"]["ip"])  # where the probe's call returns to
        call = max(int(ip) for ip in np.unique(ips) if ret - 15 <= ip < ret)  # the call
        back = np.flatnonzero(ips == ret)
        p = int(back[np.searchsorted(back, e["at"])])  # the return after the event
        c = int(np.flatnonzero(ips[:p] == call)[-1])  # its call
        assert c < e["first"] <= e["at"] <= e["last"] < p, (e, c, p)
        assert "clock_gettime" in e["where"]  # where LTTng read its clock
    print(f"placement error ±{rec.clock_error_ns} ns; windows of "
          f"{[e['last'] - e['first'] + 1 for e in events]} instructions")  # fmt: skip


WINDOW_PROVIDER = r"""
#undef TRACEPOINT_PROVIDER
#define TRACEPOINT_PROVIDER hwtrace_window
#undef TRACEPOINT_INCLUDE
#define TRACEPOINT_INCLUDE "./window_tp.h"
#if !defined(WINDOW_TP_H) || defined(TRACEPOINT_HEADER_MULTI_READ)
#define WINDOW_TP_H
#include <lttng/tracepoint.h>
TRACEPOINT_EVENT(hwtrace_window, begin, TP_ARGS(int, i), TP_FIELDS(ctf_integer(int, i, i)))
TRACEPOINT_EVENT(hwtrace_window, end, TP_ARGS(int, i), TP_FIELDS(ctf_integer(int, i, i)))
#endif
#include <lttng/tracepoint-event.h>
"""
WINDOW_PROGRAM = r"""
#define TRACEPOINT_DEFINE
#define TRACEPOINT_CREATE_PROBES
#include "window_tp.h"
#define NOINLINE __attribute__((noinline))
NOINLINE long inner(long x) {
    long s = 0;
    for (long i = 0; i < 3 * x + 1; i++)
        s += i ^ x;
    return s;
}
NOINLINE long work(int n) {
    long s = 0;
    for (int i = 0; i < n; i++) {
        if (i % 2) {  /* odd i: inside a window */
            tracepoint(hwtrace_window, begin, i);
            s += inner(i);
            tracepoint(hwtrace_window, end, i);
        } else {
            s += inner(i);
        }
    }
    return s;
}
int main(void) { return (int)(work(6) & 1); }
"""


def test_windows_of_event_pairs_bound_the_analysis(lttng, tmp_path, capsys, monkeypatch):
    """``--window begin,end``: funclatency (and report) see only what each
    thread ran between its ``begin`` and ``end`` LTTng-UST events, exactly
    the calls made inside them; an unpaired window event is counted."""
    from hwtrace.cli.main import main

    bl, _, d = lttng
    (d / "window_tp.h").write_text(WINDOW_PROVIDER)
    (d / "window.c").write_text(WINDOW_PROGRAM)
    exe = d / "window"
    bl.run([bl.compiler(), "-O1", "-g0", "-I", str(d), "-o", str(exe), str(d / "window.c"),
            *bl.LIBS], timeout=120)  # fmt: skip
    monkeypatch.setenv("LTTNG_UST_REGISTER_TIMEOUT", "20000")
    rec, data = record_with_lttng(bl, exe, tmp_path, "window", "hwtrace_window:*", ["vtid"])

    def calls(*extra):
        out = tmp_path / "f.json"
        assert main(["funclatency", "inner", "-i", str(data), "--all-intervals",
                     "--json", str(out), *extra]) == 0  # fmt: skip
        got = json.loads(out.read_text())
        return sorted(iv["t_open"] for iv in got["intervals"]), got

    capsys.readouterr()
    every, _ = calls()
    assert len(every) == 6
    inside, got = calls("--events", str(tmp_path / "ctf"), "--window", "begin,end")
    err = capsys.readouterr().err
    assert "3 windows from begin to end in 1 threads" in err, err
    # The calls of odd i, and those only, with the same counts.
    assert inside == [every[1], every[3], every[5]]
    _, plain = calls("--html", str(tmp_path / "f.html"))
    assert '"view":"latency"' in (tmp_path / "f.html").read_text()
    assert main(["report", "-i", str(data), "--html", str(tmp_path / "r.html")]) == 0
    assert "inner" in (tmp_path / "r.html").read_text()
    # The timeline: inner's calls as slices, the LTTng events on the same track.
    tl = tmp_path / "tl.json"
    assert main(["report", "-i", str(data), "--timeline", str(tl), "--events",
                 str(tmp_path / "ctf")]) == 0  # fmt: skip
    events = json.loads(tl.read_text())["traceEvents"]
    inner = [e for e in events if e["ph"] == "X" and e["name"].endswith("!inner")]
    marks = [e for e in events if e["ph"] == "i"]
    assert len(inner) == 6 and len(marks) == 6
    assert {e["tid"] for e in inner} == {e["tid"] for e in marks} == {rec.threads[0].tid}
    begins = sorted(e["ts"] for e in marks if e["name"] == "hwtrace_window:begin")
    odd = sorted(inner, key=lambda e: e["ts"])[1::2]
    assert all(b <= e["ts"] for b, e in zip(begins, odd, strict=True))
    dic = {iv["t_open"]: iv["dic"] for iv in plain["intervals"]}
    assert [iv["dic"] for iv in sorted(got["intervals"], key=lambda x: x["t_open"])] == [
        dic[t] for t in inside
    ]
    # A pair of patterns matching nothing, or unpaired: said, no traceback.
    capsys.readouterr()
    assert main(["funclatency", "inner", "-i", str(data), "--events", str(tmp_path / "ctf"),
                 "--window", "begin,nothing"]) == 1  # fmt: skip
    assert "no event matches 'nothing'" in capsys.readouterr().err
    assert main(["report", "-i", str(data), "--events", str(tmp_path / "ctf"),
                 "--window", "end,begin"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "2 windows from end to begin" in err and "1 end with no begin" in err, err
    assert "1 begin with no end" in err, err
