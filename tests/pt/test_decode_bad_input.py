"""Bad input for the library decoder: gaps are reported, nothing else is lost.

The trace is a loop (call, ret, conditional branch) encoded with PSB+ every
few packets, so every corruption has good trace on both sides of it.
"""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtrace.image import Image
from hwtrace.pt.decode import DecodeOptions, decode_trace
from hwtrace.pt.kinds import Kind
from hwtrace.pt.packets import encode_table

ORG = 0x400000


def _loop_code() -> bytes:
    # loop: call f ; nop*3 ; jnz loop ; int3 ; f: nop*5 ; ret
    f_at = 11
    code = bytearray(b"\xe8" + (f_at - 5).to_bytes(4, "little", signed=True))
    code += b"\x90" * 3
    code += b"\x75" + ((0 - 10) & 0xFF).to_bytes(1, "little")
    code += b"\xcc"
    code += b"\x90" * 5 + b"\xc3"
    return bytes(code)


def _loop_trace(n_tnt: int, psb_every: int = 8) -> tuple[bytes, list[int]]:
    """TNT.64 packets of all-taken bits; a PSB+ (FUP at the loop head) after
    every ``psb_every`` packets (an even number of bits: at the loop head).
    Returns the bytes and the offsets of the PSBs."""
    kinds, a, b = [], [], []

    def psb():
        kinds.extend([Kind.PSB, Kind.TSC, Kind.FUP, Kind.MODE_EXEC, Kind.PSBEND])
        a.extend([0, 1000 + len(kinds), ORG, 1, 0])
        b.extend([0, 0, 3, 0, 0])

    psb()
    for i in range(n_tnt):
        if i and i % psb_every == 0:
            psb()
        kinds.append(Kind.TNT64)
        a.append((1 << 47) - 1)
        b.append(47)
    data = encode_table(
        np.array(kinds, np.uint8),
        np.array(a, np.uint64),
        np.array(b, np.uint32),
        np.zeros(len(kinds), np.uint8),
    )
    psbs = [i for i in range(len(data)) if data.startswith(b"\x02\x82" * 8, i)]
    return data, psbs


def _image(tmp_path, code: bytes | None = None) -> Image:
    path = tmp_path / "code.bin"
    path.write_bytes(_loop_code() if code is None else code)
    img = Image()
    img.add_raw_spec(f"{path}:{ORG:#x}")
    return img


def test_good_trace_has_no_gaps(tmp_path):
    data, psbs = _loop_trace(64)
    res = decode_trace(data, _image(tmp_path))
    assert res.gaps == []
    # Each bit pair is one iteration: call, 5 nops, ret, 3 nops, jnz = 11.
    # The call and nops after the last bit wait for a ret bit that never comes.
    assert res.n_insn == 64 * 47 // 2 * 11
    assert len(psbs) == 8


def test_corrupt_packet_loses_only_its_segment(tmp_path):
    data, psbs = _loop_trace(64)
    img = _image(tmp_path)
    good = decode_trace(data, img)
    bad = bytearray(data)
    hit = psbs[3] + 40  # inside the fourth segment's TNT packets
    bad[hit] = 0xD9  # no packet starts with these bits
    res = decode_trace(bytes(bad), img)
    assert len(res.gaps) == 1
    gap = res.gaps[0]
    assert psbs[3] < gap.offset < psbs[4]
    assert gap.reason and gap.time > 0
    # Everything before the segment and from the next PSB on is intact.
    _assert_intact(good, res, psbs[3], psbs[4])


def _insns(res, keep):
    n = res.block_ninsn[keep].astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(res.block_ninsn.astype(np.int64))])[:-1][keep]
    all_ips = res.instructions()
    return np.concatenate([all_ips[s : s + k] for s, k in zip(starts, n, strict=True)])


def _assert_intact(good, res, lost_from, resync):
    # Before the damaged segment: identical.
    before = _insns(good, good.block_offset < lost_from)
    assert np.array_equal(_insns(res, res.block_offset < lost_from), before)
    # From the PSB after it: the good decode ends with what was decoded
    # there, which covers everything the good decode read after that PSB+.
    after = _insns(res, res.block_offset >= resync)
    assert np.array_equal(good.instructions()[-len(after) :], after)
    assert len(after) >= len(_insns(good, good.block_offset > resync + 32))


def test_missing_code_is_a_gap_with_its_address(tmp_path):
    data, _ = _loop_trace(16)
    code = _loop_code()[:11]  # f is not in the image
    res = decode_trace(data, _image(tmp_path, code))
    assert res.gaps, "each segment walks into f"
    assert {g.ip for g in res.gaps} == {ORG + 11}
    assert all(g.reason == "no memory mapped at this address" for g in res.gaps)
    assert res.n_insn > 0  # the call before each gap was decoded


def test_mismatched_image_reports_and_goes_on(tmp_path):
    data, psbs = _loop_trace(32)
    code = bytearray(_loop_code())
    code[15:17] = b"\xff\xe0"  # f ends in jmp rax: it needs a TIP, the trace has TNT
    res = decode_trace(data, _image(tmp_path, bytes(code)))
    # One gap a segment, each at f's indirect jump; every segment's first
    # instructions (the call into f) are still there.
    assert len(res.gaps) == len(psbs)
    assert {g.ip for g in res.gaps} == {ORG + 15}
    assert res.n_insn >= 5 * len(psbs)


def test_truncated_trace_keeps_what_it_has(tmp_path):
    data, psbs = _loop_trace(32)
    img = _image(tmp_path)
    good = decode_trace(data, img)
    cut = psbs[2] + 37
    res = decode_trace(data[:cut], img)
    prefix = res.instructions()
    assert np.array_equal(good.instructions()[: len(prefix)], prefix)
    assert len(prefix) >= len(_insns(good, good.block_offset < psbs[2]))
    assert res.n_insn < good.n_insn


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6))
def test_random_corruption_never_raises_and_paths_agree(tmp_path, flips):
    data, _ = _loop_trace(24, psb_every=4)
    bad = bytearray(data)
    for where, value in flips:
        bad[where % len(bad)] = value
    img = _image(tmp_path)
    fast = decode_trace(bytes(bad), img)
    slow = decode_trace(bytes(bad), img, options=DecodeOptions(fast=False))
    assert np.array_equal(fast.instructions(), slow.instructions())
    assert np.array_equal(fast.instruction_times(), slow.instruction_times())
    assert [str(g) for g in fast.gaps] == [str(g) for g in slow.gaps]


def test_symbolized_columns_and_instruction_times(tmp_path):
    from hwtrace.image.symbols import SymbolTable

    data, _ = _loop_trace(2)
    res = decode_trace(data, _image(tmp_path))
    syms = SymbolTable.from_symbols([(ORG, 11, "loop", True), (ORG + 11, 6, "f", True)], "a.out")
    by_insn = res.symbolize(syms, instructions=True)
    labels = by_insn.labels()
    assert labels[:8] == ["loop", "f", "f+0x1", "f+0x2", "f+0x3", "f+0x4", "f+0x5", "loop+0x5"]
    assert set(by_insn.names(with_module=True)) == {"a.out!loop", "a.out!f"}
    times = res.instruction_times()
    assert len(times) == res.n_insn and np.all(np.diff(times.astype(np.int64)) >= 0)
