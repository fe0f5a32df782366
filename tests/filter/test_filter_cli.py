"""``hwtrace filter``: compiled filters over recorded event streams.

Real recordings where the machine allows (root, Linux perf, tracefs): a
``perf record`` of two tracepoints, filtered per tier and checked against
``perf script`` of the original filtered in Python; a private tracefs
instance's sched_switch events read from ``trace_pipe_raw`` and checked
against the same instance's ``trace`` text.  Synthetic ring-buffer pages
(every event header kind) against a tracefs directory made here; a CTF
trace written with bt2 when it is present; bad input.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from ftrace_util import copy_trace_pipe_raw
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtrace.cli.main import main
from hwtrace.filter.compile import TIERS
from hwtrace.filter.streams import FtraceSource, apply_filter, import_bt2

TRACEFS = Path("/sys/kernel/tracing")
PERF = shutil.which("perf") or "/usr/bin/perf"


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["filter", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def counts(out: str) -> dict[str, tuple[int, int, str]]:
    """``--count`` table: event -> (events, passed, tier)."""
    table = {}
    for line in out.splitlines()[1:]:
        parts = line.split()
        if parts[0] != "total":
            table[parts[0]] = (int(parts[1]), int(parts[2]), parts[3])
    return table


# -- perf.data ------------------------------------------------------------------------------

_SWITCH = re.compile(r" sched:sched_switch: prev_comm=(.*?) prev_pid=")


def _perf_script(path: Path) -> list[str]:
    done = subprocess.run(
        [PERF, "script", "-i", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> tuple[Path, list[str]]:
    if not os.path.exists(PERF):
        pytest.skip("Linux perf is not installed")
    if os.geteuid() != 0:
        pytest.skip("system-wide tracepoint recording needs root")
    for tp in ("sched/sched_switch", "raw_syscalls/sys_enter"):
        if not (TRACEFS / "events" / tp).is_dir():
            pytest.skip(f"tracepoint {tp} is not available")
    d = tmp_path_factory.mktemp("perf")
    path = d / "in.data"
    done = subprocess.run(
        [PERF, "record", "-q", "-o", str(path), "-e", "sched:sched_switch",
         "-e", "raw_syscalls:sys_enter", "-a", "--", "sleep", "0.2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if done.returncode != 0 or not path.exists():
        pytest.skip(f"perf record failed: {done.stderr.strip()[:200]}")
    lines = _perf_script(path)
    if not any(_SWITCH.search(line) for line in lines):
        pytest.skip("the recording holds no sched_switch sample")
    return path, lines


def _prefixes(lines: list[str]) -> list[str]:
    """The idle task's prefix, and one this recording surely has (a busy
    machine may never run its idle task in 0.2 s)."""
    comms = Counter(m.group(1) for line in lines if (m := _SWITCH.search(line)))
    common = comms.most_common(1)[0][0]
    return ["swapper", common[:3]]


@pytest.mark.parametrize("tier", TIERS)
def test_perf_output_lists_exactly_the_matching_samples(recording, tier, tmp_path, capsys):
    path, lines = recording
    for prefix in _prefixes(lines):
        expected = [
            line for line in lines if (m := _SWITCH.search(line)) and m.group(1).startswith(prefix)
        ]
        out = tmp_path / f"{prefix}.data"
        rc, _, err = run(capsys, f'prev_comm == "{prefix}*"', path, "-o", out, "--tier", tier)
        assert rc == 0, err
        assert "raw_syscalls:sys_enter has no field prev_comm" in err
        assert _perf_script(out) == expected

        from hwtrace.perf.data import read_perf_data

        before, after = read_perf_data(path), read_perf_data(out)
        assert not after.errors
        assert [a.attr for a in after.attrs] == [a.attr for a in before.attrs]
        assert set(after.raw_features) == set(before.raw_features)
        kinds_before, kinds_after = before.summary(), after.summary()
        assert kinds_after.pop("SAMPLE", 0) == len(expected)
        kinds_before.pop("SAMPLE")
        assert kinds_after == kinds_before  # every other record kept

        rc, out_text, _ = run(capsys, f'prev_comm == "{prefix}*"', path, "--count", "--tier", tier)
        table = counts(out_text)
        n_switch = sum(1 for line in lines if _SWITCH.search(line))
        n_enter = sum(1 for line in lines if " raw_syscalls:sys_enter: " in line)
        assert table["sched:sched_switch"][:2] == (n_switch, len(expected))
        assert table["raw_syscalls:sys_enter"][:2] == (n_enter, 0)
        assert table["sched:sched_switch"][2] == tier


def test_perf_context_fields_and_listing(recording, tmp_path, capsys):
    path, lines = recording
    # $ctx.cpu_id against the sample's cpu, as perf script shows it ([001]).
    expected = [line for line in lines if " raw_syscalls:sys_enter: " in line and "[001]" in line]
    out = tmp_path / "cpu1.data"
    rc, _, err = run(capsys, "$ctx.cpu_id == 1", path, "-o", out, "--event", "sys_enter")
    assert rc == 0, err
    assert _perf_script(out) == expected
    # The listing of the same samples: one JSON line each, fields decoded.
    rc, _, err = run(
        capsys, "$ctx.cpu_id == 1", path, "-o", tmp_path / "x.jsonl", "--event", "raw_syscalls:*"
    )
    assert rc == 0, err
    rows = [json.loads(x) for x in (tmp_path / "x.jsonl").read_text().splitlines()]
    assert len(rows) == len(expected)
    assert all(r["cpu"] == 1 and r["event"] == "raw_syscalls:sys_enter" for r in rows)
    nrs = [int(re.search(r"NR (-?\d+)", line).group(1)) for line in expected]
    assert [r["fields"]["id"] for r in rows] == nrs


def _switch_words(lines: list[str], after: str) -> dict[tuple[str, int], str]:
    """sched_switch's prev_state text by (time to the microsecond, pid)."""
    out = {}
    for line in lines:
        m = re.search(r" (\d+\.\d{6})\d*:\s+sched:sched_switch: .*? prev_pid=(\d+) .*?"
                      rf"prev_state=(\S+){after}", line)  # fmt: skip
        if m:
            out[m[1], int(m[2])] = m[3]
    return out


def test_perf_listing_prints_words_as_perf_does(recording, tmp_path, capsys):
    """The text listing prints sched_switch's prev_state in the words perf
    script prints (S, D, R+, from the event's print fmt), event for event;
    JSON keeps the number."""
    path, lines = recording
    want = _switch_words(lines, " ==> ")
    rc, listing, err = run(capsys, "prev_pid >= 0", path, "--event", "sched_switch")
    assert rc == 0, err
    got = _switch_words(listing.splitlines(), " next_comm=")
    assert want and got == want
    rc, _, err = run(capsys, "prev_pid >= 0", path, "-o", tmp_path / "s.jsonl", "--event",
                     "sched_switch")  # fmt: skip
    rows = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    # (every sched_switch perf lists: two of one pid in one microsecond are
    # one key of ``want``)
    switches = sum(" sched:sched_switch: " in line for line in lines)
    assert len(rows) == switches and all(isinstance(r["fields"]["prev_state"], int) for r in rows)


# -- trace_pipe_raw of a private tracefs instance -------------------------------------------


@pytest.fixture(scope="module")
def instance_trace(tmp_path_factory) -> tuple[Path, str, Path]:
    """(directory of cpuN.raw copies, the instance's `trace` text, the
    instance directory while it exists)."""
    instances = TRACEFS / "instances"
    if os.geteuid() != 0 or not instances.is_dir():
        pytest.skip("needs root and tracefs instances")
    inst = instances / f"hwtrace-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    try:
        inst.mkdir()
    except OSError as e:
        pytest.skip(f"cannot create a tracefs instance: {e}")
    d = tmp_path_factory.mktemp("ftrace")
    try:
        (inst / "events/sched/sched_switch/enable").write_text("1")
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:
            subprocess.run(["true"])  # context switches
            time.sleep(0.01)
        (inst / "tracing_on").write_text("0")
        (inst / "events/sched/sched_switch/enable").write_text("0")
        text = (inst / "trace").read_text()  # before the raw reads consume it
        copy_trace_pipe_raw(inst, d)
        formats = d / "tracefs"
        for rel in ("events/header_page", "events/header_event",
                    "events/sched/sched_switch/format", "events/sched/sched_switch/id"):  # fmt: skip
            (formats / rel).parent.mkdir(parents=True, exist_ok=True)
            (formats / rel).write_text((TRACEFS / rel).read_text())
        yield d, text, formats
    finally:
        inst.rmdir()


_TRACE_LINE = re.compile(
    r"^\s*.*?-(\d+)\s+\[(\d+)\]\s+\S+\s+(\d+)\.(\d{6}): sched_switch: prev_comm=(.*?) "
    r"prev_pid=(\d+) prev_prio=(-?\d+) prev_state=\S+ ==> next_comm=(.*?) next_pid=(\d+) "
    r"next_prio=(-?\d+)$"
)


def _trace_rows(text: str) -> list[tuple]:
    rows = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = _TRACE_LINE.match(line)
        assert m, line
        _pid, cpu, sec, usec, pc, pp, _prio, nc, np_, _nprio = m.groups()
        rows.append((int(cpu), int(sec) * 1_000_000 + int(usec), pc, int(pp), nc, int(np_)))
    return rows


@pytest.mark.parametrize("tier", ["ebpf-jit", "lttng"])
def test_trace_pipe_raw_matches_the_trace_text(instance_trace, tier, tmp_path, capsys):
    raw, text, formats = instance_trace
    rows = _trace_rows(text)
    if not rows:
        pytest.skip("no sched_switch event was traced")
    prefixes = ["swapper", Counter(r[2] for r in rows).most_common(1)[0][0][:3]]
    for prefix in prefixes:
        expected = sorted(r for r in rows if r[2].startswith(prefix))
        out = tmp_path / "x.jsonl"
        rc, _, err = run(
            capsys, f'prev_comm == "{prefix}*"', raw, "-o", out, "--tier", tier,
            "--tracefs", formats,
        )  # fmt: skip
        assert rc == 0, err
        got = []
        for line in out.read_text().splitlines():
            r = json.loads(line)
            f = r["fields"]
            assert r["event"] == "sched:sched_switch"
            # `trace` rounds nanoseconds to microseconds.
            got.append(
                (r["cpu"], (r["time"] + 500) // 1000, f["prev_comm"], f["prev_pid"],
                 f["next_comm"], f["next_pid"])
            )  # fmt: skip
        assert sorted(got) == expected
        # The text listing: the same events, one line each, in time order.
        rc, listing, _ = run(capsys, f'prev_comm == "{prefix}*"', raw, "--tracefs", formats)
        lines = listing.splitlines()
        assert len(lines) == len(expected)
        assert all(f"sched:sched_switch: prev_comm={prefix}" in line for line in lines)
        stamps = [float(line.split("]", 1)[1].split(":")[0]) for line in lines]
        assert stamps == sorted(stamps)
        rc, count_text, _ = run(
            capsys, f'prev_comm == "{prefix}*"', raw, "--count", "--tracefs", formats
        )
        assert counts(count_text)["sched:sched_switch"][:2] == (len(rows), len(expected))


# -- synthetic ring-buffer pages --------------------------------------------------------------

_FORMAT = """name: ev
ID: 7
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:int value;\toffset:8;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] msg;\toffset:12;\tsize:4;\tsigned:0;

print fmt: "value=%d msg=%s", REC->value, __get_str(msg)
"""
_HEADER_PAGE = (
    "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
    "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n"
    "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
    "\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n"
)
_HEADER_EVENT = (TRACEFS / "events/header_event").read_text() if (
    TRACEFS / "events/header_event"
).exists() else (
    "# compressed entry header\n\ttype_len    :    5 bits\n\ttime_delta  :   27 bits\n"
    "\tarray       :   32 bits\n\n\tpadding     : type == 29\n\ttime_extend : type == 30\n"
    "\ttime_stamp : type == 31\n\tdata max type_len  == 28\n"
)  # fmt: skip


@pytest.fixture(scope="module")
def fake_tracefs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tracefs")
    (root / "events/test/ev").mkdir(parents=True)
    (root / "events/test/ev/format").write_text(_FORMAT)
    (root / "events/test/ev/id").write_text("7\n")
    (root / "events/header_page").write_text(_HEADER_PAGE)
    (root / "events/header_event").write_text(_HEADER_EVENT)
    return root


def _record(value: int, msg: bytes, pid: int) -> bytes:
    body = struct.pack("<HBBiiI", 7, 0, 0, pid, value, 16 | (len(msg) + 1) << 16) + msg + b"\0"
    return body + bytes(-len(body) % 4)


def _pages(
    events: list[tuple[int, int, bytes]], start: int = 1_000_000_000
) -> tuple[bytes, list[int]]:
    """Pages of (delta ns, value, msg) events, with a discarded event
    (padding) and every header kind: short and long (type_len 0) events,
    time extends for big deltas.  Returns the bytes and each event's time."""
    pages: list[bytes] = []
    data = b""
    page_ts = start
    ts = start
    times = []

    def flush() -> None:
        nonlocal data
        pages.append(struct.pack("<QQ", page_ts, len(data)) + data + bytes(4080 - len(data)))
        data = b""

    for k, (delta, value, msg) in enumerate(events):
        rec = _record(value, msg, 100 + k)
        entry = b""
        if delta >= 1 << 27:
            entry += struct.pack("<II", 30 | (delta & ((1 << 27) - 1)) << 5, delta >> 27)
            head_delta = 0
        else:
            head_delta = delta
        if len(rec) <= 112 and k % 3:
            entry += struct.pack("<I", len(rec) // 4 | head_delta << 5) + rec
        else:
            entry += struct.pack("<II", head_delta << 5, len(rec) + 4) + rec
        if k % 5 == 4:  # a discarded event before it: padding with a length
            entry = struct.pack("<II", 29 | 1 << 5, 16) + bytes(12) + entry
        if len(data) + len(entry) > 4080:
            flush()
            page_ts = ts
        data += entry
        ts += delta
        times.append(ts)
    flush()
    return b"".join(pages), times


_events = st.lists(
    st.tuples(
        st.one_of(st.integers(0, 1000), st.integers(1 << 27, 1 << 40)),
        st.integers(-(2**31), 2**31 - 1),
        st.binary(max_size=150).map(lambda b: b.replace(b"\0", b"x")),
    ),
    max_size=80,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(events=_events, threshold=st.integers(-(2**31), 2**31 - 1))
def test_synthetic_pages_filter_like_python(fake_tracefs, tmp_path, events, threshold):
    data, times = _pages(events)
    path = tmp_path / "cpu3.raw"
    path.write_bytes(data)
    source = FtraceSource(str(path), str(fake_tracefs))
    assert not source.problems
    assert source.time.tolist() == times
    assert set(source.cpu.tolist()) <= {3}
    run_ = apply_filter(source, f'value > {threshold} || msg == "ab*"', "llvm")
    expected = [v > threshold or m.startswith(b"ab") for _, v, m in events]
    assert run_.keep.tolist() == expected


def test_synthetic_pages_cli(fake_tracefs, tmp_path, capsys):
    events = [(10, 5, b"abc"), (1 << 30, -7, b"x" * 200), (3, 9, b"ab"), (0, 1, b"")]
    data, times = _pages(events)
    (tmp_path / "cpu0").write_bytes(data)
    (tmp_path / "cpu1").write_bytes(b"")
    rc, out, err = run(capsys, 'value > 4 && msg == "ab*"', tmp_path, "--tracefs", fake_tracefs)
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[0].endswith(": test:ev: value=5 msg=abc")
    assert lines[1].endswith(": test:ev: value=9 msg=ab")
    stamp = f"{times[0] // 10**9}.{times[0] % 10**9:09d}"
    assert lines[0] == f"           <...>-100     [000]      {stamp}: test:ev: value=5 msg=abc"
    assert lines[1].startswith("           <...>-102     [000] ")
    rc, out, _ = run(
        capsys,
        "$ctx.tid == 103 || $ctx.tid == 101",
        tmp_path,
        "--tracefs",
        fake_tracefs,
        "-o",
        tmp_path / "y.jsonl",
    )
    rows = [json.loads(x) for x in (tmp_path / "y.jsonl").read_text().splitlines()]
    assert [r["tid"] for r in rows] == [101, 103]
    assert rows[0]["fields"] == {"value": -7, "msg": "x" * 200}


def test_synthetic_pages_damage_names_the_offset(fake_tracefs, tmp_path, capsys):
    data, _ = _pages([(1, 1, b"a"), (1, 2, b"b")])
    bad = bytearray(data)
    struct.pack_into("<Q", bad, 8, 5000)  # commit beyond the page
    (tmp_path / "cpu0.raw").write_bytes(bytes(bad))
    rc, _, err = run(capsys, "value > 0", tmp_path / "cpu0.raw", "--tracefs", fake_tracefs)
    assert rc == 1
    assert err.count("\n") == 1 and "offset 0x8" in err and "cpu0.raw" in err
    # A good page after a bad one: its events are kept, the damage reported.
    (tmp_path / "cpu1.raw").write_bytes(bytes(bad) + data)
    rc, out, err = run(capsys, "value > 0", tmp_path / "cpu1.raw", "--tracefs", fake_tracefs)
    assert rc == 1 and len(out.splitlines()) == 2 and "offset 0x8" in err


# -- CTF -------------------------------------------------------------------------------------


def _write_ctf(path: Path) -> list[dict]:
    """A two-event-class CTF trace through bt2's sink.ctf.fs; returns the
    events written (name, payload, vtid, procname)."""
    bt2 = import_bt2()
    written: list[dict] = []

    class Iter(bt2._UserMessageIterator):
        def __init__(self, config, port):
            d = port.user_data
            stream = d["tc"]().create_stream(d["sc"])
            packet = stream.create_packet()
            packet.context_field["cpu_id"] = 1
            msgs = [self._create_stream_beginning_message(stream),
                    self._create_packet_beginning_message(packet, 0)]  # fmt: skip
            for i in range(8):
                cls = d["ecs"][i % 2]
                m = self._create_event_message(cls, packet, 1000 + i)
                payload = (
                    {"count": i, "msg": f"hello {i}", "vals": [i, -i], "ratio": i / 2}
                    if i % 2 == 0
                    else {"code": -i}
                )
                for k, v in payload.items():
                    m.event.payload_field[k] = v
                procname = "app" if i < 4 else "other"
                m.event.common_context_field["vtid"] = 100 + i
                m.event.common_context_field["procname"] = procname
                written.append({"name": cls.name, "payload": payload, "tid": 100 + i,
                                "procname": procname, "time": 1000 + i})  # fmt: skip
                msgs.append(m)
            msgs += [self._create_packet_end_message(packet, 2000),
                     self._create_stream_end_message(stream)]  # fmt: skip
            self._msgs = iter(msgs)

        def __next__(self):
            return next(self._msgs)

    class Src(bt2._UserSourceComponent, message_iterator_class=Iter):
        def __init__(self, config, params, obj):
            tc = self._create_trace_class()
            cc = self._create_clock_class(frequency=1_000_000_000)
            pctx = tc.create_structure_field_class()
            pctx.append_member("cpu_id", tc.create_unsigned_integer_field_class(32))
            ectx = tc.create_structure_field_class()
            ectx.append_member("vtid", tc.create_signed_integer_field_class(32))
            ectx.append_member("procname", tc.create_string_field_class())
            sc = tc.create_stream_class(
                default_clock_class=cc, supports_packets=True,
                packets_have_beginning_default_clock_snapshot=True,
                packets_have_end_default_clock_snapshot=True,
                packet_context_field_class=pctx, event_common_context_field_class=ectx,
            )  # fmt: skip
            p1 = tc.create_structure_field_class()
            p1.append_member("count", tc.create_unsigned_integer_field_class(64))
            p1.append_member("msg", tc.create_string_field_class())
            p1.append_member(
                "vals",
                tc.create_static_array_field_class(tc.create_signed_integer_field_class(16), 2),
            )
            p1.append_member("ratio", tc.create_double_precision_real_field_class())
            p2 = tc.create_structure_field_class()
            p2.append_member("code", tc.create_signed_integer_field_class(32))
            ecs = [sc.create_event_class(name="app:hello", payload_field_class=p1),
                   sc.create_event_class(name="app:error", payload_field_class=p2)]  # fmt: skip
            self._add_output_port("out", {"tc": tc, "sc": sc, "ecs": ecs})

    graph = bt2.Graph()
    src = graph.add_component(Src, "src")
    sink_cls = bt2.find_plugin("ctf").sink_component_classes["fs"]
    sink = graph.add_component(sink_cls, "sink", {"path": str(path), "quiet": True})
    graph.connect_ports(src.output_ports["out"], sink.input_ports["in"])
    graph.run()
    return written


@pytest.fixture(scope="module")
def ctf_trace(tmp_path_factory) -> tuple[Path, list[dict]]:
    try:
        import_bt2()
    except ImportError as e:
        pytest.skip(str(e))
    d = tmp_path_factory.mktemp("ctf")
    return d, _write_ctf(d)


@pytest.mark.parametrize("tier", TIERS)
def test_ctf_events_filtered_per_type(ctf_trace, tier, tmp_path, capsys):
    path, written = ctf_trace
    expr = '(count >= 2 && msg == "hello*" && vals[1] < -3) || ratio == 1.0'
    rc, _, err = run(capsys, expr, path, "-o", tmp_path / "c.jsonl", "--tier", tier)
    assert rc == 0, err
    assert "app:error has no field" in err
    rows = [json.loads(x) for x in (tmp_path / "c.jsonl").read_text().splitlines()]
    want = [
        w for w in written if w["name"] == "app:hello"
        and ((w["payload"]["count"] >= 2 and w["payload"]["vals"][1] < -3)
             or w["payload"]["ratio"] == 1.0)
    ]  # fmt: skip
    assert [(r["event"], r["fields"], r["tid"], r["time"]) for r in rows] == [
        (w["name"], w["payload"], w["tid"], w["time"]) for w in want
    ]
    rc, out, _ = run(
        capsys, '$ctx.procname == "other" && $ctx.cpu_id == 1', path, "--count", "--tier", tier
    )
    table = counts(out)
    assert table["app:hello"][:2] == (4, 2) and table["app:error"][:2] == (4, 2)


def test_ctf_text_listing(ctf_trace, capsys):
    path, _ = ctf_trace
    rc, out, _ = run(capsys, "code == -3", path)
    assert rc == 0
    assert out.splitlines() == [
        "             app-103     [001]      0.000001003: app:error: code=-3"
    ]


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "column", "what"),
    [
        ("value == ", 9, "expected an operand"),
        ('value < "x"', 7, "string"),
        ("nosuch == 1", 1, "unknown field"),
        ("value == 1 &&", 14, "operand"),
    ],
)
def test_filter_errors_show_the_column(fake_tracefs, tmp_path, capsys, expr, column, what):
    data, _ = _pages([(1, 1, b"a")])
    (tmp_path / "cpu0").write_bytes(data)
    rc, out, err = run(capsys, expr, tmp_path / "cpu0", "--tracefs", fake_tracefs)
    assert rc == 2 and out == ""
    first, text, caret = err.splitlines()
    assert first.startswith(f"hwtrace filter: column {column}:") and what in first
    assert text.strip() == expr.strip()
    assert caret.index("^") - caret.index(caret.strip()[0]) == 0
    assert caret.index("^") == 2 + column - 1


def test_unreadable_inputs_one_line(tmp_path, capsys, fake_tracefs):
    cases = {
        tmp_path / "missing": "no such file",
        tmp_path / "junk.raw": "offset 0x",
        tmp_path / "short.data": "offset 0x",
    }
    (tmp_path / "junk.raw").write_bytes(os.urandom(64) * 64)
    (tmp_path / "short.data").write_bytes(b"PERFILE2" + struct.pack("<Q", 104) + bytes(40))
    for path, what in cases.items():
        rc, out, err = run(capsys, "value > 0", path, "--tracefs", fake_tracefs)
        assert rc == 1, err
        assert out == "" and err.count("\n") == 1, err
        assert str(path) in err and what in err
    rc, _, err = run(capsys, "value > 0", tmp_path / "junk.raw", "--tracefs", tmp_path)
    assert rc == 1 and "not a tracefs directory" in err and err.count("\n") == 1


def test_ctf_without_bt2_or_bad_ctf_is_one_line(tmp_path, capsys):
    (tmp_path / "metadata").write_text("/* CTF 1.8 */ trace { major = 1; minor = 8; };\nnonsense")
    rc, out, err = run(capsys, "a == 1", tmp_path)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and str(tmp_path) in err
