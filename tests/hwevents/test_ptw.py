"""Typed software events in Intel PT's PTW packets (``hwtrace.hwevents.ptw``)."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.hwevents.channel import header_path
from hwtrace.hwevents.ptw import (
    MARK,
    MAX_WORDS,
    EventSchema,
    decode_events,
    encode_events,
    header_word,
)

u64 = st.integers(0, (1 << 64) - 1)
event = st.tuples(
    st.integers(0, (1 << 32) - 1), st.lists(u64, max_size=MAX_WORDS), st.integers(1, 5000)
)


def _columns(events):
    n = len(events)
    ids = np.array([e[0] for e in events], np.uint64)
    nw = np.array([len(e[1]) for e in events], np.int64)
    words = np.zeros((n, MAX_WORDS), np.uint64)
    for k, e in enumerate(events):
        words[k, : len(e[1])] = e[1]
    times = (
        10_000 + np.cumsum([e[2] for e in events]).astype(np.int64) if n else np.zeros(0, np.int64)
    )
    return ids, nw, words, times


@settings(max_examples=120, deadline=None)
@given(st.lists(event, min_size=1, max_size=40), st.booleans(), st.integers(1, 10))
def test_events_round_trip(events, with_ip, psb_every):
    ids, nw, words, times = _columns(events)
    ips = 0x7F0000000000 + np.arange(len(events), dtype=np.int64) * 8 if with_ip else None
    got = decode_events(encode_events(ids, words, nw, times, ips, psb_every=psb_every))
    assert len(got) == len(events) and got.lost == 0 and got.stray == 0
    assert np.array_equal(got.type_id, ids) and np.array_equal(got.nwords, nw)
    assert np.array_equal(got.time.astype(np.int64), times)
    assert np.array_equal(got.words, words)
    assert np.array_equal(got.ip, ips if with_ip else np.zeros(len(events)))


def test_libipt_reads_the_ptw_packets(tmp_path):
    """Intel's packet decoder reads the stream with no error and finds every
    word written, in order: headers and payloads."""
    import libipt_oracle as oracle

    if oracle.skip_reason is not None:
        pytest.skip(oracle.skip_reason)
    rng = np.random.default_rng(4)
    n = 300
    ids = rng.integers(0, 1 << 32, n).astype(np.uint64)
    nw = rng.integers(0, MAX_WORDS + 1, n)
    words = rng.integers(0, 1 << 63, (n, MAX_WORDS)).astype(np.uint64)
    times = 5_000 + np.cumsum(rng.integers(1, 900, n))
    path = tmp_path / "ptw.pt"
    path.write_bytes(encode_events(ids, words, nw, times, ips=0x401000 + np.arange(n) * 4))
    rows = oracle.dump(path)
    assert not [r for r in rows if r["type"] == "error"]
    theirs = [r["payload"] for r in rows if r["type"] == "ptw"]
    mine = []
    for k in range(n):
        mine.append(header_word(int(ids[k]), int(nw[k])))
        mine += [int(w) for w in words[k, : nw[k]]]
    assert theirs == mine
    assert len([r for r in rows if r["type"] == "fup"]) == n


def test_damage_loses_only_what_it_cuts():
    """An overflow inside an event loses that event; a stray word is
    counted; a stream with no PSB says so."""
    from hwtrace.pt.kinds import Kind
    from hwtrace.pt.packets import decode, encode_table

    ids = np.array([1, 2, 3], np.uint64)
    nw = np.array([2, 2, 2])
    words = np.arange(3 * MAX_WORDS, dtype=np.uint64).reshape(3, MAX_WORDS)
    data = encode_events(ids, words, nw, np.array([100, 200, 300]), psb_every=1)
    t = decode(data)
    k, a, b, c = t.kind.copy(), t.a.copy(), t.b.copy(), t.c.copy()
    second = np.flatnonzero((k == Kind.PTW) & (a == header_word(2, 2)))[0]
    k[second + 1] = Kind.OVF  # the second event's first payload word: gone
    got = decode_events(encode_table(k, a, b, c))
    assert got.type_id.tolist() == [1, 3] and got.lost == 1 and got.stray == 1
    assert any("cut by an overflow" in p for p in got.problems)
    assert decode_events(b"\x00" * 64).problems == ["no PSB: the stream never synchronises"]
    assert (MARK >> 16) == 0x48


def test_schema_json_and_c_header(tmp_path):
    schema_file = tmp_path / "events.json"
    schema_file.write_text(json.dumps({"events": [{"id": 1, "name": "request", "fields": ["size", "us"]},
                                                   {"id": 2, "name": "tick"}]}))  # fmt: skip
    schema = EventSchema.load(schema_file)
    got = decode_events(encode_events(np.array([1, 2]), np.array([[5, 6] + [0] * 6, [0] * 8], np.uint64),
                                      np.array([2, 0]), np.array([10, 20])))  # fmt: skip
    assert [json.loads(x) for x in got.json_lines(schema)] == [
        {"time": 10, "event": "request", "fields": {"size": 5, "us": 6}},
        {"time": 20, "event": "tick", "fields": {}},
    ]
    (tmp_path / "bad.json").write_text('{"events": [}')
    with pytest.raises(ValueError, match="line 1 column"):
        EventSchema.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="already request"):
        schema.add(1, "again")
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    header = tmp_path / "events.h"
    header.write_text(schema.c_header())
    shutil.copyfile(header_path(), tmp_path / "hwtrace_channel.h")
    (tmp_path / "use.c").write_text(
        '#include "events.h"\nvoid f(void) { hwtrace_request(1, 2); hwtrace_tick(); }\n'
    )
    subprocess.run(
        [gcc, "-c", "-O2", "-o", str(tmp_path / "use.o"), str(tmp_path / "use.c")], check=True
    )
    dis = subprocess.run(
        ["objdump", "-d", str(tmp_path / "use.o")], capture_output=True, text=True
    ).stdout
    assert dis.count("ptwrite") == 4  # request: header + 2 words; tick: header


def _hwtrace(*args: str):
    import sys

    return subprocess.run([sys.executable, "-m", "hwtrace.cli.main", "ptwrite", *args],
                          capture_output=True, text=True, check=False)  # fmt: skip


def test_perf_data_ctf_and_the_command(tmp_path):
    """Events in a perf.data's Intel PT (as ``perf record -e intel_pt/ptw/``
    writes it): decoded per queue, as JSON lines with perf's ns, as CTF
    that babeltrace2 prints, and by ``hwtrace ptwrite``."""
    from hwtrace.export.ctf import write_ptw_events
    from hwtrace.perf.data import PerfData
    from hwtrace.perf.records import SampleType
    from hwtrace.perf.writer import INTEL_PT_CONFIG_BITS as B
    from hwtrace.perf.writer import PerfDataWriter
    from hwtrace.session.ptwevents import perf_events

    n = 50
    ids = np.where(np.arange(n) % 2 == 0, 1, 2).astype(np.uint64)
    nw = np.where(ids == 1, 2, 0)
    words = np.zeros((n, MAX_WORDS), np.uint64)
    words[:, 0], words[:, 1] = np.arange(n), np.arange(n) * 10
    times = 1_000 + np.arange(n) * 100
    data = encode_events(ids, words, nw, times, ips=0x401000 + np.arange(n))
    path = tmp_path / "ptw.data"
    with PerfDataWriter(path) as w:
        w.set_intel_pt(config=B["pt"] | B["tsc"] | B["ptw"], time_mult=1, cap_user_time_zero=True,
                       sample_type=SampleType.IP | SampleType.TID | SampleType.TIME | SampleType.IDENTIFIER)  # fmt: skip
        w.add_auxtrace(data, tid=7)
    per_queue = perf_events(PerfData(str(path)))
    (ev,) = per_queue.values()
    assert len(ev) == n and np.array_equal(ev.time.astype(np.int64), times)
    schema_file = tmp_path / "s.json"
    schema_file.write_text(json.dumps({"events": [{"id": 1, "name": "request", "fields": ["n", "tenfold"]},
                                                   {"id": 2, "name": "tick"}]}))  # fmt: skip
    schema = EventSchema.load(schema_file)
    assert write_ptw_events(ev, tmp_path / "ctf", schema) == n
    bt = shutil.which("babeltrace2")
    if bt is not None:
        out = subprocess.run(
            [bt, str(tmp_path / "ctf")], capture_output=True, text=True, check=True
        ).stdout
        lines = out.splitlines()
        assert len(lines) == n and "request: " in lines[0] and "n = 0, tenfold = 0" in lines[0]
        assert "tick: " in lines[1] and "ip = 0x401001" in lines[1]
    got = _hwtrace(
        "-i", str(path), "--schema", str(schema_file), "--json", str(tmp_path / "e.jsonl")
    )
    assert got.returncode == 0, got.stderr
    rows = [json.loads(x) for x in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert len(rows) == n and rows[2] == {"time": 1200, "event": "request", "ip": "0x401002",
                                          "fields": {"n": 2, "tenfold": 20}, "ns": 1200,
                                          "stream": "cpu -1 tid 7"}  # fmt: skip
    header = tmp_path / "events.h"
    assert _hwtrace("--schema", str(schema_file), "--header", str(header)).returncode == 0
    assert "hwtrace_request(uint64_t n, uint64_t tenfold)" in header.read_text()
    bad = _hwtrace(str(tmp_path / "missing.pt"))
    assert (
        bad.returncode == 2
        and bad.stderr
        == f"hwtrace ptwrite: argument FILE: {tmp_path / 'missing.pt'}: no such file\n"
    )


def test_libipt_follows_a_flow_with_ptwrites(tmp_path):
    """A path through PTWRITE instructions encoded with PTW + FUP packets
    (as the software recorder writes them): libipt's instruction flow is
    the path, with no error, and hwtrace's decoder gives the payloads at
    the PTWRITE."""
    import libipt_oracle as oracle

    from hwtrace.image import Image
    from hwtrace.image.sections import Section
    from hwtrace.pt.decode import decode_trace
    from hwtrace.pt.encode import encode_path
    from hwtrace.pt.flowrows import Ev

    if oracle.skip_reason is not None:
        pytest.skip(oracle.skip_reason)
    # loop: ptwrite rax; add rax, 1; cmp rax, 5; jne loop; nop
    code = bytes.fromhex("f3480faee04883c0014883f80575f190")
    base = 0x400000
    image = Image()
    image.add_section(Section.from_bytes(code, base))
    ips, ptws = [], []
    for rax in range(5):
        ptws.append((len(ips), 0x1000 + rax, 8))
        ips += [base, base + 5, base + 9, base + 13]
    ips.append(base + 15)
    enc = encode_path(np.array(ips, np.uint64), image, ptwrites=ptws, tsc=1000, mtc_freq=3)
    path = tmp_path / "ptw.pt"
    path.write_bytes(enc.data)
    (tmp_path / "code.bin").write_bytes(code)
    flow, errors = oracle.insn_dump(path, raw=[(tmp_path / "code.bin", 0, len(code), base)])
    assert errors == [] and flow == ips
    events = decode_trace(enc.data, image, enc.config).events
    got = [(e.ip, e.payload) for _, e in events if e.type == Ev.PTWRITE]
    assert got == [(base, 0x1000 + k) for k in range(5)]
