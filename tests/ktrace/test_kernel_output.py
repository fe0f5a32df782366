"""Kernel tracepoint events written as JSON lines, perf.data and CTF
(:mod:`hwtrace.ktrace.output`), read back by ``perf script``,
``babeltrace2`` and hwtrace's own readers.

A synthetic event type (every kind of field a tracefs format has) checks
the writers without a kernel; the live tests record a short session
(sched:sched_switch, raw_syscalls:sys_enter with ``id == 0 || id == 1``,
sched:sched_process_exec for a ``__data_loc`` string) and need root.
Every value is checked against the raw records, decoded here from the
tracefs layout with ``struct`` (independently of the writers' numpy code).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import struct
import subprocess
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hwtrace.filter.ebpf.kernel import HEADER
from hwtrace.filter.schema import ArrayType, IntType, SequenceType, StringType
from hwtrace.filter.sources import schema_from_tracefs
from hwtrace.ktrace.output import (
    JsonLinesOutput,
    OutputError,
    TextOutput,
    _json_line,
    _text_line,
    build_tracing_data,
    open_trace_output,
)
from hwtrace.ktrace.trace import EventBatch, TracedEvent

PERF = shutil.which("perf")
BABELTRACE = shutil.which("babeltrace2")
need_perf = pytest.mark.skipif(PERF is None, reason="perf is not installed")
need_babeltrace = pytest.mark.skipif(BABELTRACE is None, reason="babeltrace2 is not installed")

# -- decoding raw records here, the slow and obvious way -----------------------------------


def common_header(e: TracedEvent, raw: bytes, tid: int) -> bytes:
    """``raw`` with the common header the writers put back (a BPF
    program's copy starts with a pt_regs pointer instead)."""
    return struct.pack("<HBBi", e.tracepoint_id, 0, 0, tid) + raw[8:]


def decode(e: TracedEvent, raw: bytes) -> dict:
    """The payload fields of record ``raw`` (``common_*`` left out)."""
    out: dict = {}
    for f in e.schema.fields:
        if f.name.startswith("common_"):
            continue
        t, o = f.type, f.offset
        if isinstance(t, IntType):
            out[f.name] = int.from_bytes(raw[o : o + t.size], "little", signed=t.signed)
        elif isinstance(t, StringType) and t.storage == "inline":
            out[f.name] = raw[o : o + t.capacity].split(b"\0", 1)[0].decode("utf-8", "replace")
        elif isinstance(t, StringType):
            (loc,) = struct.unpack_from("<I", raw, o)
            at, n = loc & 0xFFFF, loc >> 16
            out[f.name] = raw[at : at + n].split(b"\0", 1)[0].decode("utf-8", "replace")
        elif isinstance(t, ArrayType):
            el = t.element
            code = {1: "b", 2: "h", 4: "i", 8: "q"}[el.size]
            code = code if el.signed else code.upper()
            out[f.name] = list(struct.unpack_from(f"<{t.length}{code}", raw, o))
        elif isinstance(t, SequenceType):
            (loc,) = struct.unpack_from("<I", raw, o)
            at, n = loc & 0xFFFF, loc >> 16
            el = t.element
            code = {1: "b", 2: "h", 4: "i", 8: "q"}[el.size]
            code = code if el.signed else code.upper()
            out[f.name] = list(struct.unpack_from(f"<{n // el.size}{code}", raw, at))
    return out


def expected(batches: list[EventBatch]) -> list[dict]:
    """Every event of ``batches``: header facts, record and fields."""
    out = []
    for b in batches:
        for i in range(len(b)):
            h = b.header[i]
            e = b.events[int(h["event"])]
            raw = b.record(i)
            out.append({
                "time": int(h["time"]), "cpu": int(h["cpu"]), "event": e.name,
                "pid": int(h["pid"]), "tid": int(h["tid"]),
                "comm": bytes(h["comm"]).split(b"\0", 1)[0].decode("utf-8", "replace"),
                "fields": decode(e, raw), "raw": common_header(e, raw, int(h["tid"])),
                "tracepoint": e,
            })  # fmt: skip
    return out


# -- what the tools print --------------------------------------------------------------------

_PERF_LINE = re.compile(
    r"^\s*(?P<comm>.*?)\s+(?P<tid>\d+)\s+(?P<time>\d+\.\d{9}):\s+(?P<event>\S+):\s?(?P<trace>.*)$"
)
_BT_LINE = re.compile(
    r"^\[(?P<time>\d+)\] \(\+[?\d]+\) \S+ (?P<event>\S+): \{ cpu_id = (?P<cpu>\d+) \}, "
    r"\{ pid = (?P<pid>-?\d+), tid = (?P<tid>-?\d+), procname = \"(?P<comm>[^\"]*)\" \}"
    r"(?:, \{ (?P<payload>.*) \})?$"
)


def perf_script(path: Path) -> list[dict]:
    run = subprocess.run(
        [PERF, "script", "-i", str(path), "--ns", "-F", "trace:comm,tid,time,event,trace"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "out of order" not in run.stderr, run.stderr
    out = []
    for line in run.stdout.splitlines():
        m = _PERF_LINE.match(line)
        assert m, f"unexpected perf script line {line!r}"
        secs, ns = m["time"].split(".")
        out.append({**m.groupdict(), "tid": int(m["tid"]), "time": int(secs) * 10**9 + int(ns)})
    return out


def _bt_value(text: str, pos: int) -> tuple[object, int]:
    """One value of babeltrace2's text output at ``pos``: a string, an
    integer or an array ``[ [0] = v, ... ]``."""
    if text[pos] == '"':
        end = pos + 1
        while text[end] != '"':
            end += 2 if text[end] == "\\" else 1
        return text[pos + 1 : end], end + 1
    if text[pos] == "[":
        items = []
        pos += 2
        while text[pos] != "]":
            m = re.compile(r"\[\d+\] = ").match(text, pos)
            assert m, text[pos:]
            v, pos = _bt_value(text, m.end())
            items.append(v)
            pos += 2 if text.startswith(", ", pos) else 1
        return items, pos + 1
    m = re.compile(r"-?0x[0-9a-f]+|-?\d+").match(text, pos)
    assert m, text[pos:]
    return int(m.group(), 0), m.end()


def bt_payload(text: str | None) -> dict:
    out: dict = {}
    pos = 0
    while text and pos < len(text):
        m = re.compile(r"(\w+) = ").match(text, pos)
        assert m, text[pos:]
        out[m.group(1)], pos = _bt_value(text, m.end())
        if text.startswith(", ", pos):
            pos += 2
    return out


def babeltrace(path: Path) -> list[dict]:
    run = subprocess.run([BABELTRACE, "--clock-cycles", str(path)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = []
    for line in run.stdout.splitlines():
        m = _BT_LINE.match(line)
        assert m, f"unexpected babeltrace2 line {line!r}"
        out.append({"time": int(m["time"]), "event": m["event"], "cpu": int(m["cpu"]),
                    "pid": int(m["pid"]), "tid": int(m["tid"]), "comm": m["comm"],
                    "fields": bt_payload(m["payload"])})  # fmt: skip
    return out


def _key(d: dict) -> str:
    return json.dumps([d["time"], d["event"], d["cpu"], d["tid"], d["fields"]])


def check_json(path: Path, want: list[dict], counts: dict | None) -> None:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    if counts is not None:
        assert lines[-1] == {"summary": counts}
        lines = lines[:-1]
    keys = ("time", "cpu", "event", "pid", "tid", "comm", "fields")
    assert sorted(lines, key=_key) == sorted(({k: w[k] for k in keys} for w in want), key=_key)


def check_babeltrace(path: Path, want: list[dict]) -> None:
    got = babeltrace(path)
    assert len(got) == len(want)
    keys = ("time", "event", "cpu", "pid", "tid", "comm", "fields")
    assert sorted(got, key=_key) == sorted(({k: w[k] for k in keys} for w in want), key=_key)


def check_perf_source(path: Path, want: list[dict]) -> None:
    """hwtrace's reader gives back the records, times and threads."""
    from hwtrace.filter.inputs import open_source

    src = open_source(str(path))
    assert src.kind == "perf" and not src.problems
    got = []
    for t in src.types:
        for r, off, size in zip(t.rows.tolist(), t.offsets.tolist(), t.sizes.tolist(),
                                strict=True):  # fmt: skip
            got.append(
                (int(src.time[r]), t.name, int(src.tid[r]), bytes(src.buf[off : off + size]))
            )
    got.sort()
    ref = sorted((w["time"], w["event"], w["tid"], w["raw"]) for w in want)
    assert len(got) == len(ref)
    for (t, name, tid, raw), (t2, name2, tid2, raw2) in zip(got, ref, strict=True):
        assert (t, name, tid) == (t2, name2, tid2)
        # perf pads the raw data so that its u32 size and it fill whole u64s
        assert raw[: len(raw2)] == raw2 and not raw[len(raw2) :].strip(b"\0")
        assert (len(raw) + 4) % 8 == 0


# -- a synthetic event type: no kernel needed ------------------------------------------------

# The common fields every tracefs format starts with.
COMMON_FIELDS = """\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;
"""
SYNTHETIC = (
    """\
name: synthetic
ID: 4242
format:
"""
    + COMMON_FIELDS
    + """\

\tfield:int value;\toffset:8;\tsize:4;\tsigned:1;
\tfield:char name[8];\toffset:12;\tsize:8;\tsigned:0;
\tfield:__data_loc char[] path;\toffset:20;\tsize:4;\tsigned:0;
\tfield:unsigned short ports[3];\toffset:24;\tsize:6;\tsigned:0;
\tfield:__data_loc u32[] ids;\toffset:32;\tsize:4;\tsigned:0;
\tfield:s64 delta;\toffset:40;\tsize:8;\tsigned:1;

print fmt: "value=%d name=%s path=%s delta=%lld", REC->value, REC->name, __get_str(path), REC->delta
"""
)


def synthetic_event() -> TracedEvent:
    return TracedEvent("hwtrace_test:synthetic", schema_from_tracefs(SYNTHETIC), SYNTHETIC, 4242)


def synthetic_batch(e: TracedEvent, n: int = 40, t0: int = 10**12) -> EventBatch:
    """``n`` events on two CPUs and three threads, records as a BPF
    program copies them (a kernel pointer where the common header was)."""
    header = np.zeros(n, HEADER)
    records = []
    for i in range(n):
        path = f"/tmp/file-{i}-ü".encode() + b"\0"
        ids = list(range(i % 4))
        fixed = struct.pack("<Qi8sIHHHxxI4xq", 0xFFFF888827D26B20, -i * 1000,
                            f"nm{i}".encode(), ((len(path)) << 16) | 48, i, 2 * i, 65535,
                            ((4 * len(ids)) << 16) | (48 + len(path)), -(1 << 40) + i)  # fmt: skip
        records.append(fixed + path + struct.pack(f"<{len(ids)}I", *ids))
        tid = 100 + i % 3
        header[i] = (t0 + 1000 * i + (500 if i % 2 else 0), i % 2, 0, 1, 0, 100, tid, 0, 0,
                     b"worker" if i < n // 2 else b"renamed", 0, 0)  # fmt: skip
    sizes = np.array([len(r) for r in records], np.int64)
    starts = np.cumsum(np.concatenate(([0], sizes[:-1] + 8)))  # gaps, as in a ring buffer
    buf = np.zeros(int(starts[-1] + sizes[-1]), np.uint8)
    for s, r in zip(starts.tolist(), records, strict=True):
        buf[s : s + len(r)] = np.frombuffer(r, np.uint8)
    header["size"] = sizes
    return EventBatch([e], header, buf, starts, sizes)


def test_synthetic_json(tmp_path: Path) -> None:
    e = synthetic_event()
    batches = [synthetic_batch(e, 40), synthetic_batch(e, 7, 2 * 10**12)]
    out = open_trace_output(str(tmp_path / "t.jsonl"), [e], cmdline=["test"])
    for b in batches:
        out.write(b)
    counts = {"seen": 100, "passed": 47, "lost": 2}
    out.close(counts)
    want = expected(batches)
    check_json(tmp_path / "t.jsonl", want, counts)
    first = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[3])
    assert set(first["fields"]) == {"value", "name", "path", "ports", "ids", "delta"}


def task_state(v: int) -> str:
    """sched_switch's ``prev_state`` as the kernel prints it: the letters
    of TASK_REPORT's bits joined by ``|`` (R for none), ``+`` when the task
    was preempted (TASK_REPORT_MAX)."""
    letters = "|".join(c for bit, c in enumerate("SDTtXZPI") if v >> bit & 1)
    return (letters or "R") + ("+" if v & 0x100 else "")


# Fields the kernel prints as words, and how (the test's own account).
WORDS = {("sched:sched_switch", "prev_state"): task_state}


def text_lines(want: list[dict]) -> list[str]:
    """``hwtrace trace``'s lines for ``expected``'s events, in time order:
    perf script's layout, each field ``name=value`` (lists as Python
    writes them; flags and enumerations as the kernel prints them)."""
    out = []
    for w in sorted(want, key=lambda w: w["time"]):
        t = w["time"]
        fields = " ".join(
            f"{k}={WORDS[w['event'], k](v) if (w['event'], k) in WORDS else v}"
            for k, v in w["fields"].items()
        )
        out.append(f"{w['comm']:>16} {w['pid']:>7}/{w['tid']:<7} [{w['cpu']:03d}] "
                   f"{t // 10**9}.{t % 10**9:09d}: {w['event']}: {fields}")  # fmt: skip
    return out


def _text_of(events: list[TracedEvent], batches: list[EventBatch]) -> list[str]:
    stream = io.StringIO()
    out = TextOutput(stream, events)
    for b in batches:
        out.write(b)
    return stream.getvalue().splitlines()


# The synthetic type without its __data_loc sequence: every field is one
# the compiled line writer takes.
NO_SEQ = SYNTHETIC.replace("\tfield:__data_loc u32[] ids;\toffset:32;\tsize:4;\tsigned:0;\n", "")


def test_synthetic_text_lines() -> None:
    """The lines (compiled: ints, char[N], a __data_loc string, an array;
    Python for an event type with a sequence, and for a batch with a
    string that is not UTF-8) are what the fields say."""
    for text in (SYNTHETIC, NO_SEQ):
        e = TracedEvent("hwtrace_test:synthetic", schema_from_tracefs(text), text, 4242)
        batches = [synthetic_batch(e, 40), synthetic_batch(e, 7, 2 * 10**12)]
        assert _text_of([e], batches) == text_lines(expected(batches))
    e = TracedEvent("hwtrace_test:synthetic", schema_from_tracefs(NO_SEQ), NO_SEQ, 4242)
    compiled = TextOutput(io.StringIO(), [e])
    assert compiled.lines(synthetic_batch(e, 5)) is not None
    bad = synthetic_batch(e, 5)
    bad.buf[bad.starts[2] + 12] = 0xFF  # name[0]: not UTF-8
    assert compiled.lines(bad) is None
    assert _text_of([e], [bad]) == text_lines(expected([bad]))
    assert "name=\ufffdm2" in _text_of([e], [bad])[2]


def _both_ways(out: JsonLinesOutput, batch: EventBatch) -> tuple[bytes | None, bytes]:
    """A batch's lines by the compiled writer and by the Python one."""
    line = _json_line if out.JSON else _text_line
    return out.lines(batch), "".join(f"{x}\n" for x in out.render(batch, line)).encode()


def test_compiled_lines_equal_the_python_writers(tmp_path: Path) -> None:
    """Byte for byte, text and JSON, with strings JSON must escape
    (quotes, backslashes, control characters) and characters it keeps."""
    e = TracedEvent("hwtrace_test:synthetic", schema_from_tracefs(NO_SEQ), NO_SEQ, 4242)
    batch = synthetic_batch(e, 40)
    names = [b'a"b\\c', b"\n\t\x01\x1f", b"\x7f\x08\x0c\r", "né€ü".encode()]
    for i, name in enumerate(names):
        at = int(batch.starts[i]) + 12
        batch.buf[at : at + 8] = np.frombuffer(name.ljust(8, b"\0")[:8], np.uint8)
    for out in (TextOutput(io.StringIO(), [e]), JsonLinesOutput(str(tmp_path / "t.jsonl"), [e])):
        compiled, python = _both_ways(out, batch)
        assert compiled is not None and compiled == python
    lines = JsonLinesOutput(str(tmp_path / "u.jsonl"), [e]).lines(batch).decode().splitlines()
    assert [json.loads(x)["fields"]["name"] for x in lines[:4]] == [
        n.split(b"\0")[0].decode() for n in names
    ]


@need_babeltrace
def test_synthetic_ctf(tmp_path: Path) -> None:
    e = synthetic_event()
    batches = [synthetic_batch(e, 40), synthetic_batch(e, 7, 2 * 10**12)]
    with open_trace_output(str(tmp_path / "ctf"), [e], cmdline=["test"]) as out:
        for b in batches:
            out.write(b)
    want = expected(batches)
    for w in want:  # CTF shows a sequence's length as a field of its own
        w["fields"] = {**w["fields"], "_ids_length": len(w["fields"]["ids"])}
        w["fields"] = {k: w["fields"][k] for k in
                       ("value", "name", "path", "ports", "_ids_length", "ids", "delta")}  # fmt: skip
    check_babeltrace(tmp_path / "ctf", want)


# A system call's event: an int argument and a pointer in 8-byte slots (the
# registers the kernel records).
OPENAT = (
    """\
name: sys_enter_openat
ID: 4243
format:
"""
    + COMMON_FIELDS
    + """\

\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;
\tfield:int dfd;\toffset:16;\tsize:8;\tsigned:0;
\tfield:const char * filename;\toffset:24;\tsize:8;\tsigned:0;

print fmt: "dfd: 0x%08lx, filename: 0x%08lx", ((unsigned long)(REC->dfd)), ((unsigned long)(REC->filename))
"""
)


def test_pointers_listed_in_hex(tmp_path: Path) -> None:
    """A pointer is listed as ftrace and perf print it, 0x and lower-case
    hex (compiled and Python writers alike; CTF declares it base 16), a
    number in JSON; an int argument is its register's low half."""
    e = TracedEvent("syscalls:sys_enter_openat", schema_from_tracefs(OPENAT), OPENAT, 4243)
    n = 6
    header = np.zeros(n, HEADER)
    pointers = [0x7F328965DDA0 + 0x1000 * i for i in range(n - 1)] + [0]
    records = [struct.pack("<QiiQQ", 0xFFFF888827D26B20, 257, 0, 0xFFFFFF9C, p) for p in pointers]
    for i in range(n):
        header[i] = (10**12 + 1000 * i, 0, 0, 1, 0, 100, 100, 0, 0, b"cat", 0, 0)
    sizes = np.full(n, 32, np.int64)
    starts = np.arange(n, dtype=np.int64) * 40
    buf = np.zeros(40 * n, np.uint8)
    for s, r in zip(starts.tolist(), records, strict=True):
        buf[s : s + 32] = np.frombuffer(r, np.uint8)
    header["size"] = sizes
    batch = EventBatch([e], header, buf, starts, sizes)
    text = TextOutput(io.StringIO(), [e])
    compiled, python = _both_ways(text, batch)
    assert compiled is not None and compiled == python
    lines = compiled.decode().splitlines()
    assert [x.split(": ", 2)[2] for x in lines] == [
        f"__syscall_nr=257 dfd=-100 filename={p:#x}" for p in pointers
    ]
    assert lines[0].endswith("filename=0x7f328965dda0") and lines[-1].endswith("filename=0x0")
    js = JsonLinesOutput(str(tmp_path / "t.jsonl"), [e])
    compiled, python = _both_ways(js, batch)
    assert compiled == python
    assert [json.loads(x)["fields"]["filename"] for x in compiled.decode().splitlines()] == pointers
    with open_trace_output(str(tmp_path / "ctf"), [e], cmdline=["test"]) as out:
        out.write(batch)
    metadata = (tmp_path / "ctf" / "metadata").read_text()
    assert re.search(r"base = 16; \} _filename;", metadata)
    assert re.search(r"signed = true; byte_order = le; base = 10; \} _dfd;", metadata)
    if BABELTRACE is not None:
        listed = subprocess.run([BABELTRACE, str(tmp_path / "ctf")], capture_output=True,
                                text=True, timeout=60).stdout  # fmt: skip
        assert "filename = 0x7f328965dda0" in listed.lower() and "dfd = -100" in listed


@need_perf
def test_synthetic_perf(tmp_path: Path) -> None:
    e = synthetic_event()
    batches = [synthetic_batch(e, 40), synthetic_batch(e, 7, 2 * 10**12)]
    path = tmp_path / "perf.data"
    with open_trace_output(str(path), [e], cmdline=["test"]) as out:
        for b in batches:
            out.write(b)
    want = sorted(expected(batches), key=lambda w: w["time"])
    got = perf_script(path)
    assert [g["time"] for g in got] == [w["time"] for w in want]
    for g, w in zip(got, want, strict=True):
        f = w["fields"]
        assert g["event"] == "hwtrace_test:synthetic"
        assert (
            g["trace"] == f"value={f['value']} name={f['name']} path={f['path']} delta={f['delta']}"
        )
        assert (g["comm"], g["tid"]) == (w["comm"], w["tid"])
    check_perf_source(path, want)


def test_pt_commands_point_tracepoint_recordings_to_filter(tmp_path: Path, capsys) -> None:
    """A perf.data of tracepoints only (``hwtrace trace -o x.data``, ``perf
    record -e SYSTEM:EVENT``) has no Intel PT to decode: ``hwtrace script``
    says so and names the command that lists its samples, which does."""
    from hwtrace.cli.main import main

    e = synthetic_event()
    path = tmp_path / "perf.data"
    with open_trace_output(str(path), [e], cmdline=["test"]) as out:
        out.write(synthetic_batch(e, 5))
    capsys.readouterr()
    main(["script", "-i", str(path)])
    err = capsys.readouterr().err
    assert f"nothing to decode (its tracepoint samples: hwtrace filter 1 {path})" in err
    assert main(["filter", "1", str(path)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 5


def test_tracing_data_parses() -> None:
    from hwtrace.filter.ftrace_raw import parse_tracing_data

    e = synthetic_event()
    data = build_tracing_data([e], header_page="page", header_event="event", page_size=4096)
    td = parse_tracing_data(data)
    assert (td.version, td.long_size, td.page_size) == ("0.6", 8, 4096)
    assert (td.header_page, td.header_event) == ("page", "event")
    assert td.formats == {4242: ("hwtrace_test", "synthetic", SYNTHETIC)}
    # kallsyms (u32), printk (u32) and saved cmdlines (u64), all empty, end it.
    assert data.endswith(bytes(16))


def test_bad_paths(tmp_path: Path) -> None:
    e = [synthetic_event()]
    (tmp_path / "d.jsonl").mkdir()
    (tmp_path / "afile").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "metadata").write_text("x")
    bad = {
        str(tmp_path / "d.jsonl"): "is a directory",
        str(tmp_path / "nodir" / "x.data"): "no directory",
        str(tmp_path / "afile"): "exists and is not a directory",
        str(tmp_path / "full"): "not empty",
        str(tmp_path / "afile" / "ctf"): "cannot create",
        "": "no output path",
    }
    for path, message in bad.items():
        with pytest.raises(OutputError, match=message) as info:
            open_trace_output(path, e, cmdline=[])
        assert "\n" not in str(info.value)
    with pytest.raises(OutputError, match="no events"):
        open_trace_output(str(tmp_path / "x.jsonl"), [], cmdline=[])
    other = TracedEvent("other:event", e[0].schema, SYNTHETIC, 1)
    out = open_trace_output(str(tmp_path / "x.jsonl"), [other], cmdline=[])
    with pytest.raises(OutputError, match="hwtrace_test:synthetic was not given"):
        out.write(synthetic_batch(e[0], 2))
    out.close()


# -- a live session --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):
    """A short recording written to the three outputs: (directory,
    batches, counts)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (BPF programs on tracepoints)")
    if not Path("/sys/kernel/tracing/events").is_dir():
        pytest.skip("no tracefs at /sys/kernel/tracing")
    from hwtrace.filter.errors import FilterError
    from hwtrace.ktrace.trace import KernelTrace, TraceError

    # One session's expression is for all its events (a field an event
    # lacks makes it false, LTTng's rule), so each filter has a session.
    sessions = [
        (["sched:sched_switch"], "prev_pid >= 0"),
        (["raw_syscalls:sys_enter"], "id == 0 || id == 1"),
        (["sched:sched_process_exec"], 'filename == "*"'),
    ]
    traces = []
    try:
        for names, expression in sessions:
            traces.append(KernelTrace(names, expression))
    except (TraceError, FilterError) as err:
        for t in traces:
            t.close()
        pytest.skip(f"cannot trace: {err}")
    d = tmp_path_factory.mktemp("kernel_output")
    events = [e for t in traces for e in t.events]
    outputs = [open_trace_output(str(d / name), events, cmdline=["test_kernel_output"])
               for name in ("events.jsonl", "perf.data", "ctf")]  # fmt: skip
    batches: list[EventBatch] = []
    try:
        for t in traces:
            t.start()
        for _ in range(2):
            subprocess.run(["cat", "/etc/hostname"], stdout=subprocess.DEVNULL, check=False)
            time.sleep(0.05)
            for t in traces:
                batches.append(t.read())
        for t in traces:
            t.stop()
        time.sleep(0.01)  # programs running as they were detached finish
        for t in traces:
            batches.append(t.read())
        counts = Counter()
        for t in traces:
            counts.update(t.counts())
        for b in batches:
            for out in outputs:
                out.write(b)
        for out in outputs:
            out.close(dict(counts))
    finally:
        for t in traces:
            t.close()
    return d, batches, dict(counts)


def test_live_recorded(live) -> None:
    _, batches, counts = live
    want = expected(batches)
    names = Counter(w["event"] for w in want)
    assert names["sched:sched_switch"] > 0 and names["raw_syscalls:sys_enter"] > 0
    assert names["sched:sched_process_exec"] >= 2  # the two cats
    assert all(w["fields"]["id"] in (0, 1) for w in want if w["event"] == "raw_syscalls:sys_enter")
    assert counts["passed"] - counts["lost"] == len(want)


def test_live_text(live) -> None:
    """Real records (char[N], __data_loc strings, the argument array of
    raw_syscalls) as the compiled writer lists them."""
    _, batches, _ = live
    events = list({id(e): e for b in batches for e in b.events}.values())
    # (each batch in time order, as it is read)
    got = _text_of(events, [b for b in batches if len(b)])
    assert got == [line for b in batches for line in text_lines(expected([b]))]
    assert TextOutput(io.StringIO(), events).lines(next(b for b in batches if len(b)))


def test_live_lines_compiled_as_python_writes_them(live, tmp_path) -> None:
    _, batches, _ = live
    events = list({id(e): e for b in batches for e in b.events}.values())
    for out in (TextOutput(io.StringIO(), events), JsonLinesOutput(str(tmp_path / "j"), events)):
        for b in batches:
            if len(b):
                compiled, python = _both_ways(out, b)
                assert compiled == python


def test_live_json(live) -> None:
    d, batches, counts = live
    check_json(d / "events.jsonl", expected(batches), counts)


def test_live_words_in_text_numbers_in_json(live) -> None:
    """sched_switch's prev_state: S, R+... in a text line (as the kernel and
    perf print it), the number in JSON."""
    d, batches, _ = live
    events = list({id(e): e for b in batches for e in b.events}.values())
    got = _text_of(events, [b for b in batches if len(b)])
    states = [m[1] for m in (re.search(r" prev_state=(\S+) ", x) for x in got) if m]
    assert states and all(re.fullmatch(r"[SDTtXZPIR|]+\+?", s) for s in states)
    lines = [json.loads(x) for x in (d / "events.jsonl").read_text().splitlines()]
    numbers = [x["fields"]["prev_state"] for x in lines if x.get("event") == "sched:sched_switch"]
    assert numbers and all(isinstance(v, int) for v in numbers)
    assert sorted(task_state(v) for v in numbers) == sorted(states)


@need_perf
def test_live_perf_script(live) -> None:
    d, batches, _ = live
    want = sorted(expected(batches), key=lambda w: (w["time"], w["event"], w["tid"]))
    got = perf_script(d / "perf.data")
    assert len(got) == len(want)
    assert sorted((g["time"], g["event"], g["tid"]) for g in got) == [
        (w["time"], w["event"], w["tid"]) for w in want
    ]
    switch = re.compile(r"prev_comm=(.*) prev_pid=(-?\d+) .* ==> next_comm=(.*) next_pid=(-?\d+) ")
    comms = {(w["time"], w["tid"]): w for w in want}
    for g in got:
        w = comms[(g["time"], g["tid"])]
        if g["event"] == "sched:sched_switch":
            m = switch.search(g["trace"])
            assert m, g["trace"]
            f = w["fields"]
            assert m.groups() == (f["prev_comm"], str(f["prev_pid"]), f["next_comm"],
                                  str(f["next_pid"]))  # fmt: skip
        elif g["event"] == "sched:sched_process_exec":
            assert g["trace"].startswith(f"filename={w['fields']['filename']} ")
        else:
            assert g["trace"].startswith(f"NR {w['fields']['id']} (")
        # COMM records name every thread (perf calls thread 0 swapper).
        assert g["comm"] == (w["comm"] if w["tid"] else "swapper")


def test_live_perf_source(live) -> None:
    d, batches, _ = live
    check_perf_source(d / "perf.data", expected(batches))


@need_babeltrace
def test_live_babeltrace(live) -> None:
    d, batches, _ = live
    check_babeltrace(d / "ctf", expected(batches))


def test_live_ctf_source(live) -> None:
    """hwtrace's CTF reader (babeltrace2's Python bindings) reads the trace."""
    from hwtrace.filter.inputs import open_source
    from hwtrace.filter.inputs.ctf import import_bt2

    try:
        import_bt2()
    except ImportError as e:
        pytest.skip(str(e))
    d, batches, _ = live
    want = expected(batches)
    src = open_source(str(d / "ctf"))
    assert src.kind == "ctf" and not src.problems
    got = sorted((int(src.time[r]), t.name, int(src.tid[r]), src.comms[int(src.comm[r])])
                 for t in src.types for r in t.rows.tolist())  # fmt: skip
    ref = sorted((w["time"], w["event"], w["tid"], w["comm"]) for w in want)
    assert [g[1:] for g in got] == [r[1:] for r in ref]
    # Times are of the day there: the monotonic clock plus the clock's offset.
    assert len({g[0] - r[0] for g, r in zip(got, ref, strict=True)}) == 1


def test_bpf_prog_info_feature_parses():
    """perf record writes BPF_PROG_INFO for every loaded BPF program (ours
    while hwtrace trace runs): struct perf_bpil with its ``arrays`` word."""
    import struct

    from hwtrace.perf.features import Feature, parse_feature

    info, data = bytes(range(40)), b"\xaa" * 24
    body = struct.pack("<I", 2)
    for arrays in (0x1F9, 0):
        body += struct.pack("<IIQ", len(info), len(data), arrays) + info + data
    got = parse_feature(Feature.BPF_PROG_INFO, body)
    assert got == [
        {"arrays": 0x1F9, "info": info, "data": data},
        {"arrays": 0, "info": info, "data": data},
    ]
