"""Decoding through code revisions (FlowJIT): the flow decoder reads code
as it was at the time of the flow it decodes.

Synthetic traces from the encoder: a path that ran in several versions of
its code (``encode_path(..., versions=...)``), decoded against the files'
image with and without the revisions the path ran in.  The thesis's two
cases: a JIT loop called through a register (41 not-taken and 1 taken
branch), and a static key (a 5-byte NOP patched into a ``jmp`` between two
calls of one function), then one page rewritten several times.
"""

from __future__ import annotations

import numpy as np
import pytest

from hwtrace.image import Image, Section
from hwtrace.image.revisions import CodeRevisions
from hwtrace.pt.decode import decode_trace
from hwtrace.pt.encode import encode_path

STATIC = 0x400000
JIT = 0x500000


def _static_code() -> bytes:
    code = bytearray(0x60)

    def put(address: int, hexbytes: str) -> None:
        b = bytes.fromhex(hexbytes)
        code[address - STATIC : address - STATIC + len(b)] = b

    put(0x400000, "48c7c000005000")  # mov rax, 0x500000
    put(0x400007, "ffd0")  # call rax: into the JIT code
    put(0x400009, "e812000000")  # call foo
    put(0x40000E, "ffd3")  # call rbx: the patcher
    put(0x400010, "e80b000000")  # call foo
    put(0x400015, "90")
    put(0x400020, "0f1f440000")  # foo: nop5, the static key's site
    put(0x400025, "b801000000c3")  # mov eax, 1; ret
    put(0x400030, "b802000000c3")  # the key's branch: mov eax, 2; ret
    put(0x400040, "90c3")  # the patcher: nop; ret
    return bytes(code)


# xor ecx, ecx; l: inc ecx; cmp ecx, 42; je out; jmp l; out: ret
LOOP = bytes.fromhex("31c9ffc183f92a7402ebf7c3")
JMP_KEY = bytes.fromhex("e90b000000")  # jmp 0x400030, at 0x400020


def _path() -> tuple[list[int], int, int]:
    """The executed IPs, and where the JIT code and the patched key first ran."""
    path = [0x400000, 0x400007, 0x500000]
    for i in range(42):
        path += [0x500002, 0x500004, 0x500007] + ([0x500009] if i < 41 else [])
    path += [0x50000B, 0x400009, 0x400020, 0x400025, 0x40002A, 0x40000E, 0x400040, 0x400041]
    patched = len(path) + 1
    path += [0x400010, 0x400020, 0x400030, 0x400035, 0x400015]
    return path, 2, patched


@pytest.fixture(scope="module")
def files() -> Image:
    image = Image("files")
    image.add_section(Section.from_bytes(_static_code(), STATIC, "static"))
    return image


def _encode(files: Image, timing: dict, cost: int = 50):
    path, jit_at, patched_at = _path()
    ips = np.array(path, np.uint64)
    versions = np.zeros(len(path), np.int64)
    versions[jit_at:] = 1
    versions[patched_at:] = 2
    with_jit = files.copy()
    with_jit.add_section(Section.from_bytes(LOOP, JIT, "jit"))
    patched = with_jit.copy()
    patched.add_section(Section.from_bytes(JMP_KEY, 0x400020, "key"))
    cycles = np.full(len(path), cost, np.int64)
    enc = encode_path(
        ips, [files, with_jit, patched], versions=versions, cycles=cycles, psb_period=0, **timing
    )
    t0 = timing.get("tsc") or 0
    times = t0 + np.concatenate([[0], np.cumsum(cycles)[:-1]])
    return enc, int(times[jit_at]), int(times[patched_at]), path


TIMINGS = {
    "tsc+mtc+cyc": dict(tsc=100_000, mtc_freq=3, cyc=True, ctc_ratio=2),
    "tsc+mtc": dict(tsc=100_000, mtc_freq=0, ctc_ratio=2),
    "tsc+cyc": dict(tsc=100_000, cyc=True),
}


@pytest.mark.parametrize("timing", TIMINGS.values(), ids=TIMINGS.keys())
def test_jit_and_static_key_decode_exactly_with_revisions(files, timing):
    enc, jit_time, patch_time, _ = _encode(files, timing)
    store = CodeRevisions()
    store.add(JIT, LOOP, jit_time, "capture")
    store.add(0x400020, JMP_KEY, patch_time, "capture")
    flow = decode_trace(enc.data, files, enc.config, revisions=store)
    got = flow.instructions()
    assert not flow.gaps
    assert np.array_equal(got, enc.expected)
    # The JIT loop's exit branch: 41 times not taken, once taken.
    je = np.flatnonzero(got == 0x500007)
    after = got[je + 1]
    assert (after == 0x500009).sum() == 41 and (after == 0x50000B).sum() == 1
    # Revised: every JIT instruction (no file holds them) and the patched
    # jmp; the first call's NOP is the file's own.
    revised = flow.revised()
    assert revised[(got >= JIT)].all()
    key = np.flatnonzero(got == 0x400020)
    assert revised[key].tolist() == [False, True]
    assert int(revised.sum()) == int((got >= JIT).sum()) + 1


def test_without_revisions_decoding_stops_at_the_jit_entry(files):
    enc, *_ = _encode(files, TIMINGS["tsc+mtc+cyc"])
    flow = decode_trace(enc.data, files, enc.config)
    assert flow.gaps and "500000" in str(flow.gaps[0]) and "no memory" in str(flow.gaps[0])
    assert flow.instructions().tolist()[:2] == [0x400000, 0x400007]


def test_without_the_patch_the_decode_is_silently_wrong(files):
    """The JIT code alone: the decode succeeds, with the NOP in both calls."""
    enc, jit_time, _, _ = _encode(files, TIMINGS["tsc+mtc+cyc"])
    store = CodeRevisions()
    store.add(JIT, LOOP, jit_time, "capture")
    flow = decode_trace(enc.data, files, enc.config, revisions=store)
    got = flow.instructions()
    assert not flow.gaps
    assert not np.array_equal(got, enc.expected)
    assert 0x400030 not in got.tolist() and got.tolist().count(0x400025) == 2


def test_no_time_stamps_read_the_latest_code(files):
    """Without timing packets no revision can be placed in time: the
    latest code is used (right for the JIT, wrong for the first call)."""
    enc, jit_time, patch_time, _ = _encode(files, {})
    store = CodeRevisions()
    store.add(JIT, LOOP, jit_time, "capture")
    store.add(0x400020, JMP_KEY, patch_time, "capture")
    flow = decode_trace(enc.data, files, enc.config, revisions=store)
    got = flow.instructions().tolist()
    assert got.count(0x400030) == 2 and 0x500000 in got


def test_one_page_rewritten_several_times():
    """A JIT page rewritten four times (each a loop of another length),
    each version called once from a caller that loops: every version
    decodes at its time, in one decoder and in parallel chunks."""
    counts = [3, 7, 1, 12, 5]
    # mov rax, JIT; call rax; jmp back to the mov
    caller = Image("caller")
    caller.add_section(Section.from_bytes(bytes.fromhex("48c7c000005000ffd0ebf5"), STATIC))
    images, codes = [caller], []
    path: list[int] = []
    versions: list[int] = []
    for k, n in enumerate(counts):
        codes.append(bytes.fromhex(f"31c9ffc183f9{n:02x}7402ebf7c3"))
        image = caller.copy()
        image.add_section(Section.from_bytes(codes[-1], JIT, f"jit v{k}"))
        images.append(image)
        body = [0x500000]
        for i in range(n):
            body += [0x500002, 0x500004, 0x500007] + ([0x500009] if i < n - 1 else [])
        body.append(0x50000B)
        path += [0x400000, 0x400007, *body, 0x400009]
        versions += [k] * 2 + [k + 1] * len(body) + [k + 1]
    path.append(0x400000)
    versions.append(len(counts))
    ips = np.array(path, np.uint64)
    vers = np.array(versions, np.int64)
    cycles = np.full(len(path), 40, np.int64)
    timing = dict(tsc=5_000, mtc_freq=3, cyc=True, ctc_ratio=2)
    enc = encode_path(ips, images, versions=vers, cycles=cycles, psb_period=256, **timing)
    times = 5_000 + np.concatenate([[0], np.cumsum(cycles)[:-1]])
    store = CodeRevisions()
    for k, code in enumerate(codes):
        store.add(JIT, code, int(times[np.flatnonzero(vers == k + 1)[0]]), "capture")
    assert len(store.boundaries()) == len(counts)
    for jobs in (1, 2):
        flow = decode_trace(
            enc.data, caller, enc.config, revisions=store, jobs=jobs, chunk_bytes=64
        )
        assert not flow.gaps
        assert np.array_equal(flow.instructions(), enc.expected)
