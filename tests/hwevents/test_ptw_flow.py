"""PTWRITE events beside the instruction flow: a program using the event
schema's C header, recorded by ``hwtrace record``'s software backend (which
carries out the PTWRITEs this CPU lacks, as Intel PT would write them),
listed by ``hwtrace script`` at their place, decoded as typed events by
``hwtrace ptwrite`` -- and by perf itself; the same program through the
software channel gives the same events."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hwtrace.hwevents.channel import Channel
from hwtrace.hwevents.ptw import EventSchema, decode_events
from hwtrace.record import _native as nat
from hwtrace.record.stepper import ptwrite_operand

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")

SCHEMA = {"events": [{"id": 3, "name": "request", "fields": ["n", "square"]},
                     {"id": 4, "name": "odd"}]}  # fmt: skip

PROGRAM = r"""
#include <stdio.h>
#include "events.h"
static inline void raw32(const uint32_t *p)
{
	__asm__ volatile("ptwritel %0" : : "m"(*p) : "memory");
}
__attribute__((noinline)) uint64_t work(uint64_t n)
{
	uint64_t s = 0;
	uint32_t tag = 0xabcd;
	for (uint64_t i = 0; i < n; i++) {
		s += i * i;
		hwtrace_request(i, i * i);
		if (s & 1) {
			hwtrace_odd();
			if (hwtrace_use_ptwrite())
				raw32(&tag);
		}
	}
	return s;
}
int main(int argc, char **argv)
{
	printf("%lu\n", work(argc > 1 ? atoi(argv[1]) : 7));
	hwtrace_flush();
	return 0;
}
"""
N = 7


def _expected() -> tuple[list[int], list[dict]]:
    """The payloads PTWRITE writes in order, and the typed events."""
    words, events, s = [], [], 0
    for i in range(N):
        s += i * i
        words += [(0x485458 << 40) | (2 << 32) | 3, i, i * i]
        events.append({"event": "request", "fields": {"n": i, "square": i * i}})
        if s & 1:
            words += [(0x485458 << 40) | 4, 0xABCD]
            events.append({"event": "odd", "fields": {}})
    return words, events


def _hwtrace(*args: str, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "hwtrace.cli.main", *args], capture_output=True,
                          text=True, check=False, env=env, cwd=cwd)  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("ptwflow")
    (d / "s.json").write_text(json.dumps(SCHEMA))
    got = _hwtrace("ptwrite", "--schema", str(d / "s.json"), "--header", str(d / "events.h"))
    assert got.returncode == 0, got.stderr
    (d / "p.c").write_text(PROGRAM)
    subprocess.run(["gcc", "-O2", "-g", "-o", str(d / "p"), str(d / "p.c")], check=True)
    return d


@pytest.fixture(scope="module")
def recorded(built):
    env = dict(os.environ, HWTRACE_PTWRITE="1")
    env.pop("HWTRACE_CHANNEL", None)
    got = _hwtrace("record", "--backend", "software", "-o", str(built / "p.data"), "-f", "work",
                   "--", str(built / "p"), str(N), env=env)  # fmt: skip
    assert got.returncode == 0, got.stderr
    return built / "p.data"


def test_script_lists_each_ptwrite_at_its_place(recorded):
    words, _ = _expected()
    got = _hwtrace("script", "-i", str(recorded))
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    marks = [k for k, line in enumerate(lines) if " ptwrite: 0x" in line]
    assert [int(lines[k].rsplit("0x", 1)[1], 16) for k in marks] == words
    for k in marks:
        # After the PTWRITE instruction's own line (or the PTWRITE before it).
        ip = lines[k].split(":", 1)[1].split()[0]
        j = k - 1
        while " ptwrite: " in lines[j]:
            j -= 1
        assert lines[j].split(":", 1)[1].split()[0] == ip
    assert "--no-ptwrite" not in got.stderr
    plain = _hwtrace("script", "-i", str(recorded), "--no-ptwrite").stdout.splitlines()
    assert len(plain) == len(lines) - len(words)
    blocks = _hwtrace("script", "-i", str(recorded), "--blocks").stdout
    assert [
        int(x.rsplit("0x", 1)[1], 16) for x in blocks.splitlines() if " ptwrite: " in x
    ] == words
    rows = [
        json.loads(x) for x in _hwtrace("script", "-i", str(recorded), "--json").stdout.splitlines()
    ]
    assert len(rows) == len(lines)
    assert [int(r["ptwrite"], 16) for r in rows if "ptwrite" in r] == words
    assert [k for k, r in enumerate(rows) if "ptwrite" in r] == marks


def test_perf_reads_the_same_ptwrites(recorded):
    perf = shutil.which("perf")
    if perf is None:
        pytest.skip("perf is not installed")
    words, _ = _expected()
    theirs = subprocess.run([perf, "script", "-i", str(recorded), "--itrace=w", "-F", "+synth"],
                            capture_output=True, text=True, check=False).stdout.splitlines()  # fmt: skip
    theirs = [x for x in theirs if "ptwrite:" in x]
    assert [int(x.split("payload: ")[1].split()[0], 16) for x in theirs] == words
    mine = [
        x for x in _hwtrace("script", "-i", str(recorded)).stdout.splitlines() if "ptwrite:" in x
    ]
    # Same IPs and times (perf prints microseconds).
    for a, b in zip(theirs, mine, strict=True):
        assert a.split()[-3] == b.split()[3]
        assert a.split()[2].rstrip(":") == b.split()[2].rstrip(":")[:-3]


def test_typed_events_from_the_recording(recorded, built):
    _, events = _expected()
    out = built / "e.jsonl"
    got = _hwtrace("ptwrite", "-i", str(recorded), "--schema", str(built / "s.json"),
                   "--json", str(out))  # fmt: skip
    assert got.returncode == 0, got.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [{"event": r["event"], "fields": r["fields"]} for r in rows] == events
    # The call site: the FUP's IP (compressed against the last IP), that of
    # the event's first PTWRITE in the flow.
    listing = _hwtrace("script", "-i", str(recorded)).stdout.splitlines()
    headers = [x.split(":", 1)[1].split()[0] for x in listing if " ptwrite: 0x485458" in x]
    assert [int(r["ip"], 16) for r in rows] == [int(h, 16) for h in headers]


def test_the_analyses_take_the_typed_events(recorded, built):
    """``ptwrite:SCHEMA`` as an event source: placed on the flow, and as
    windows for report (request .. odd: 4 of them, 3 requests unpaired)."""
    schema = f"ptwrite:{built / 's.json'}"
    got = _hwtrace("events", "-i", str(recorded), schema)
    assert got.returncode == 0, got.stderr
    _, events = _expected()
    assert f"# {len(events)} events of {schema} (ptwrite" in got.stdout
    assert f": {len(events)} placed" in got.stdout
    rep = _hwtrace("report", "-i", str(recorded), "--events", schema, "--window", "request,odd")
    assert rep.returncode == 0, rep.stderr
    assert "4 windows from request to odd in 1 threads (unpaired: 3 request" in rep.stderr
    none = _hwtrace("events", "-i", str(recorded), "ptwrite:/nonexistent.json")
    assert none.returncode == 1 and none.stderr.count("\n") == 1


def test_the_software_channel_gives_the_same_events(built):
    """Where PTWRITE is not used the header writes the same packets into
    hwtrace's channel: the same typed events."""
    _, events = _expected()
    schema = EventSchema.load(built / "s.json")
    with Channel(areas=4, nsub=4, sub_size=16 << 10) as ch:
        env = dict(os.environ, HWTRACE_PTWRITE="0", **ch.env())
        subprocess.run([str(built / "p"), str(N)], env=env, check=True, capture_output=True)
        ch.drain()
        (data,) = ch.streams.values()
    ev = decode_events(bytes(data))
    assert [{"event": r["event"], "fields": r["fields"]} for r in ev.rows(schema)] == events


def test_ptwrite_operands():
    """What the stepper reads for each form of PTWRITE."""
    regs = np.zeros(nat.N_REGS, np.uint64)
    names = nat.REGISTER_NAMES
    regs[names.index("rax")] = 0x1122334455667788
    regs[names.index("rbx")] = 0x1000
    regs[names.index("rcx")] = 3
    regs[names.index("fs_base")] = 0x7000
    memory = {0x1000 + 3 * 8 + 8: (0xDEADBEEFCAFEF00D).to_bytes(8, "little"),
              0x7010: (0x55).to_bytes(4, "little"), 0x2007: (9).to_bytes(4, "little")}  # fmt: skip

    def read(address: int, size: int) -> bytes:
        return memory.get(address, b"")[:size]

    cases = [
        ("f3480faee0", (0x1122334455667788, 8, 0x2005)),  # ptwrite rax
        ("f30faee0", (0x55667788, 4, 0x2004)),  # ptwrite eax
        ("f3480fae64cb08", (0xDEADBEEFCAFEF00D, 8, 0x2007)),  # ptwrite qword [rbx+rcx*8+8]
        ("64f30fae242510700000", None),  # ptwrite dword fs:[0x7010]: unmapped absolute
        ("64f30fae242510000000", (0x55, 4, 0x200A)),  # ptwrite dword fs:[0x10]
        ("f30fae2500000000", (9, 4, 0x2008)),  # ptwrite dword [rip+0], the next IP
        ("90", None),
    ]
    memory[0x2008] = (9).to_bytes(4, "little")
    for hexcode, want in cases:
        assert ptwrite_operand(bytes.fromhex(hexcode), 0x2000, regs, read) == want, hexcode
