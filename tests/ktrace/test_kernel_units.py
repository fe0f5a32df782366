"""The kernel side's parsers and pieces that need no kernel: the BPF ring
buffer reader on synthetic rings (hypothesis), the verifier-log reader,
unreachable-code removal, times and system call names."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.cli.trace import parse_time
from hwtrace.filter.ebpf import isa
from hwtrace.filter.ebpf.kernel import _drop_unreachable
from hwtrace.kernel.ringbuf import _BUSY, _DISCARD, _drain, gather_prefixes
from hwtrace.kernel.syscalls import syscall_name, syscall_number
from hwtrace.ktrace.trace import verifier_message

SIZE = 256  # a tiny ring: records wrap often


def _ring(records, start: int):
    """A ring of SIZE bytes mapped twice in a row (as the kernel maps its
    data pages), with ``records`` (payload, discarded, busy) written from
    position ``start``; returns the data, and the producer position."""
    data = np.zeros(2 * SIZE, np.uint8)
    pos = start
    for payload, discarded, busy in records:
        n = len(payload)
        word = n | (_DISCARD if discarded else 0) | (_BUSY if busy else 0)
        rec = np.frombuffer(word.to_bytes(4, "little") + bytes(4) + payload, np.uint8)
        for i, b in enumerate(rec):
            data[(pos + i) % SIZE] = b
        pos += (n + 8 + 7) & ~7
    data[SIZE:] = data[:SIZE]
    return data, pos


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.binary(min_size=0, max_size=40), st.booleans()), max_size=5),
    st.integers(0, SIZE // 8 - 1),
    st.booleans(),
)
def test_ring_reader_takes_committed_records_in_order(records, start8, last_busy):
    start = start8 * 8
    total = sum((len(p) + 15) & ~7 for p, _ in records)
    if total > SIZE:
        records = records[:1]
    recs = [(p, d, False) for p, d in records]
    if last_busy and recs:
        recs[-1] = (recs[-1][0], recs[-1][1], True)
    data, prod = _ring(recs, start)
    out = np.zeros(4096, np.uint8)
    starts = np.zeros(64, np.int64)
    lengths = np.zeros(64, np.int64)
    cons, used, count = _drain(data, SIZE - 1, start, prod, out, 0, starts, lengths, 0)
    want = []
    stop = start
    for p, d, busy in recs:
        if busy:
            break
        stop += (len(p) + 15) & ~7
        if not d:
            want.append(p)
    assert cons == stop
    got = [out[s : s + n].tobytes() for s, n in zip(starts[:count], lengths[:count], strict=True)]
    assert got == want
    assert all(s % 8 == 0 for s in starts[:count])
    assert used <= out.shape[0]


def test_ring_reader_stops_when_out_is_full():
    data, prod = _ring([(b"a" * 40, False, False)] * 3, 0)
    out = np.zeros(50, np.uint8)
    starts = np.zeros(8, np.int64)
    lengths = np.zeros(8, np.int64)
    cons, used, count = _drain(data, SIZE - 1, 0, prod, out, 0, starts, lengths, 0)
    assert count == 1 and cons == 48 and used == 40


LOG = """func#0 @0
0: R1=ctx() R10=fp0
0: (bf) r6 = r1                       ; R1=ctx() R6_w=ctx()
1: (7b) *(u64 *)(r10 -520) = r0
invalid write to stack R10 off=-520 size=8
processed 2 insns (limit 1000000) max_states_per_insn 0 total_states 0 peak_states 0 mark_read 0
"""


@settings(deadline=None)  # (a first call may compile the loop)
@given(st.lists(st.binary(min_size=0, max_size=40), max_size=12), st.integers(1, 24))
def test_record_prefixes_are_gathered_zero_padded(records, width):
    buf = bytearray()
    starts, lengths = [], []
    for r in records:
        starts.append(len(buf))
        lengths.append(len(r))
        buf += r + bytes(-len(r) % 8)
    out = np.full((len(records), width), 0xAA, np.uint8)
    gather_prefixes(np.frombuffer(bytes(buf) + bytes(8), np.uint8).copy(), np.array(starts, np.int64),
                    np.array(lengths, np.int64), width, out)  # fmt: skip
    for row, r in zip(out, records, strict=True):
        assert row.tobytes() == r[:width].ljust(width, b"\0")


def test_verifier_message_and_instruction():
    assert verifier_message(LOG) == ("invalid write to stack R10 off=-520 size=8", 1)
    assert verifier_message("") == ("rejected", None)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_verifier_message_reads_any_text(text):
    message, index = verifier_message(text)
    assert isinstance(message, str) and message
    assert index is None or index >= 0


def test_unreachable_code_goes_and_jumps_follow():
    prog = isa.program([
        isa.mov_imm(0, 1),
        isa.ja(2),  # over the two dead instructions
        isa.mov_imm(0, 2),
        isa.mov_imm(0, 3),
        isa.jmp(isa.JEQ, 0, 1, 1, reg=False),
        isa.mov_imm(0, 4),
        isa.exit_(),
    ])  # fmt: skip
    out, cols = _drop_unreachable(prog, list(range(7)))
    assert cols == [0, 1, 4, 5, 6]
    _, _, _, off, imm = isa.fields(out)
    assert int(off[1]) == 0 and int(off[2]) == 1  # ja +0 now, jeq still over one
    assert int(imm[3]) == 4


def test_parse_time():
    assert parse_time("800") == 800
    assert parse_time("250us") == 250_000
    assert parse_time("1.5s") == 1_500_000_000
    assert parse_time("-1") == -1
    for bad in ("", "ms", "1 ks", "1e3"):
        try:
            parse_time(bad)
        except ValueError:
            continue
        raise AssertionError(bad)


def test_syscall_names():
    if syscall_name(0) == "0":
        return  # no asm/unistd_64.h here: numbers only
    assert syscall_number("read") == 0 and syscall_name(59) == "execve"
    assert syscall_number("35") == 35
    try:
        syscall_number("no_such_call")
    except ValueError as e:
        assert "no_such_call" in str(e)
    else:
        raise AssertionError
