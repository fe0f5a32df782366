"""Analyses fed a flow in pieces (hwtrace.analysis): block expansion,
call trees and per-thread profiles give what the whole flow gives, on the
decoded flow of real compiled programs."""

from __future__ import annotations

import itertools
import os

import groundtruth as gt
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.analysis.callpath import K_CALL, K_RET, CallTreeBuilder, ThreadCallPaths, call_tree
from hwtrace.analysis.profile import ThreadProfiler
from hwtrace.image import Image
from hwtrace.image.symbols import SymbolTable
from hwtrace.isa.x86 import IClass, InsnCache
from hwtrace.pt.codeindex import CodeIndex
from hwtrace.pt.decode import decode_trace
from hwtrace.pt.encode import encode_path

needs_gt = pytest.mark.skipif(gt.skip_reason is not None, reason=str(gt.skip_reason))
CASES = [("fib", "-O0"), ("sort", "-O2"), ("interp", "-O2")]
_decoded: dict[tuple[str, str], tuple] = {}


def _flow(name: str, opt: str):
    """(run, image, decoded flow) of a ground-truth program, once per case."""
    if (name, opt) not in _decoded:
        run = gt.case(name, opt)
        image = Image()
        image.add_elf(run.elf, run.load_address)
        enc = encode_path(run.ips, image, end_ip=run.end_ip)
        _decoded[(name, opt)] = (run, image, decode_trace(enc.data, image))
    return _decoded[(name, opt)]


def _cuts(n: int, data) -> list[int]:
    """Split points of ``n`` items drawn by hypothesis."""
    k = data.draw(st.integers(0, 6))
    return sorted(set(data.draw(st.lists(st.integers(0, n), min_size=k, max_size=k))))


@needs_gt
@pytest.mark.parametrize(("name", "opt"), CASES)
def test_expand_gives_every_instruction_in_any_pieces(name, opt):
    run, image, flow = _flow(name, opt)
    code = CodeIndex(image.read)
    whole = code.expand(flow.block_ip, flow.block_ninsn)
    np.testing.assert_array_equal(whole, run.ips)
    np.testing.assert_array_equal(whole, flow.instructions())
    # A fresh index, fed the blocks in pieces, learns as it goes.
    code = CodeIndex(image.read)
    n = flow.block_ip.shape[0]
    edges = [0, n // 7, n // 2, n // 2 + 1, n]
    got = [
        code.expand(flow.block_ip[a:b], flow.block_ninsn[a:b], flow.block_mode[a:b])
        for a, b in itertools.pairwise(edges)
    ]
    np.testing.assert_array_equal(np.concatenate(got), run.ips)


@needs_gt
def test_classify_kinds_and_fall_through():
    run, image, _ = _flow("fib", "-O0")
    kind, nxt = CodeIndex(image.read).classify(run.ips)
    cache = InsnCache(image.read)
    for ip, k, n in zip(run.ips[:2000].tolist(), kind.tolist(), nxt.tolist(), strict=False):
        insn = cache.get(ip, 64)
        want = {IClass.CALL: K_CALL, IClass.RETURN: K_RET}.get(insn.iclass, 0)
        assert (k, n) == (want, insn.next_ip)
    unmapped = np.array([0x10], np.uint64)
    assert [a.tolist() for a in CodeIndex(image.read).classify(unmapped)] == [[0], [0]]


def test_expand_names_bytes_that_are_no_instruction(tmp_path):
    (tmp_path / "code.bin").write_bytes(b"\x90\x90\x0f\x0b")  # nop nop ud2
    image = Image()
    image.add_raw(tmp_path / "code.bin", address=0x1000)
    code = CodeIndex(image.read)
    np.testing.assert_array_equal(
        code.expand(np.array([0x1000], np.uint64), np.array([3])), [0x1000, 0x1001, 0x1002]
    )
    with pytest.raises(ValueError, match="0x1004"):
        code.expand(np.array([0x1002], np.uint64), np.array([3]))


@pytest.fixture(scope="module")
def fib_flow():
    """The fib case decoded before a test draws anything (its first run
    makes temporary files, which draw from ``random``: not inside a
    strategy)."""
    return _flow("fib", "-O0")


@needs_gt
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_call_tree_from_pieces_is_the_whole_tree(fib_flow, data):
    run, image, _ = fib_flow
    table = image.symbols.functions
    index, _ = table.lookup(run.ips)
    names = [table.name(i) for i in range(len(table))]
    weights = np.arange(len(run.ips), dtype=np.float64) % 7
    whole = call_tree(run.ips, index, names, image.read, weights)
    builder = CallTreeBuilder(names, CodeIndex(image.read))
    edges = [0, *_cuts(len(run.ips), data), len(run.ips)]
    for a, b in itertools.pairwise(edges):
        builder.add(run.ips[a:b], index[a:b], weights[a:b])
    tree = builder.finish()
    assert tree.folded(root="p") == whole.folded(root="p")
    assert tree.folded(by="time") == whole.folded(by="time")
    np.testing.assert_array_equal(tree.parent, whole.parent)


@needs_gt
def test_thread_call_paths_keep_one_tree_per_thread_and_space():
    run, image, _ = _flow("fib", "-O0")
    n = len(run.ips)
    tid = np.where(np.arange(n) < n // 3, 7, 5)  # two threads, one after the other
    paths = ThreadCallPaths()
    code = CodeIndex(image.read)
    for a, b in ((0, n // 5), (n // 5, n)):
        paths.add(("q", 0), image.symbols, code, run.ips[a:b], tid[a:b])
    table = image.symbols.functions
    index, _ = table.lookup(run.ips)
    names = [table.qualified_name(i) for i in range(len(table))]
    want = []
    for t, sel in ((5, tid == 5), (7, tid == 7)):
        want += call_tree(run.ips[sel], index[sel], names, image.read).folded(root=f"t{t}")
    assert paths.folded(lambda t: f"t{t}") == want


def _profile_blocks(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {
        "ip": rng.choice(np.array([0x1000, 0x1010, 0x2000, 0x2400, 0x9000], np.uint64), n),
        "ninsn": rng.integers(1, 50, n),
        "ns": np.where(rng.random(n) < 0.1, -1, rng.integers(0, 10_000, n)),
        "duration": rng.integers(0, 500, n),
        "tid": rng.choice(np.array([3, 4, 9]), n),
        "pid": rng.integers(1, 3, n),
    }


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), data=st.data())
def test_thread_profile_of_pieces_is_the_sums(seed, data):
    rng = np.random.default_rng(seed)
    syms = SymbolTable.from_symbols(
        [(0x1000, 0x20, "a", True), (0x2000, 0x100, "b", True), (0x2400, 8, "c", True)], "m"
    )
    queues = [_profile_blocks(rng, int(rng.integers(1, 300))) for _ in range(2)]
    profiler = ThreadProfiler()
    for qi, q in enumerate(queues):
        n = q["ip"].shape[0]
        edges = [0, *_cuts(n, data), n]
        for a, b in itertools.pairwise(edges):
            cols = {k: v[a:b] for k, v in q.items()}
            profiler.add(qi, 0, syms, row=np.arange(a, b), **cols)
    profile = profiler.result(lambda t: f"t{t}")
    allb = {k: np.concatenate([q[k] for q in queues]) for k in queues[0]}
    qidx = np.concatenate([np.full(q["ip"].shape[0], i) for i, q in enumerate(queues)])
    rows = np.concatenate([np.arange(q["ip"].shape[0]) for q in queues])
    index, _ = syms.lookup(allb["ip"])
    assert profile.instructions == int(allb["ninsn"].sum())
    assert [t.tid for t in profile.threads] == sorted(set(allb["tid"].tolist()))
    for th in profile.threads:
        sel = allb["tid"] == th.tid
        assert th.comm == f"t{th.tid}" and th.instructions == int(allb["ninsn"][sel].sum())
        first = np.lexsort((rows[sel], qidx[sel], allb["ns"][sel]))[0]
        assert th.pid == int(allb["pid"][sel][first])
        timed = allb["ns"][sel][allb["ns"][sel] >= 0]
        assert th.span_ns == (int(timed.max() - timed.min()) if timed.shape[0] else 0)
        for k, name in enumerate(["[unknown]", *profile.names]):
            want = index[sel] == (syms.names.index(name.split("!")[1]) if k else -1)
            assert th.by_insn[k] == allb["ninsn"][sel][want].sum(), name
            assert th.by_time[k] == allb["duration"][sel][want].sum(), name
        top = th.top(2)
        assert [f.instructions for f in top] == sorted(th.by_insn[th.by_insn > 0], reverse=True)[:2]
        by_time = th.top(2, "time")
        assert [f.time_ns for f in by_time] == sorted(th.by_time[th.by_time > 0], reverse=True)[:2]


def test_transfers_of_every_instruction_of_libc():
    """CodeIndex.transfers (compiled) against iced-x86's decoding, one
    instruction at a time, at every address a linear sweep of 64 KiB of
    libc's code meets, and at addresses no section holds; asked twice (the
    first time each address is decoded, the second found)."""
    from elftools.elf.elffile import ELFFile

    from hwtrace.pt.codeindex import K_IJUMP, K_OTHER

    path = "/lib/x86_64-linux-gnu/libc.so.6"
    if not os.path.exists(path):
        pytest.skip(f"{path} not present")
    with open(path, "rb") as f:
        text = ELFFile(f).get_section_by_name(".text")
        lo = text["sh_addr"]
    image = Image()
    image.add_elf(path)
    cache = InsnCache(image.read)
    ips, ip = [], lo
    while ip < lo + (1 << 16):
        ips.append(ip)
        ip += max(cache.get(ip, 64).size, 1)
    ips += [0x10, 0x7FFF_0000_0000]
    want = []
    for ip in ips:
        insn = cache.get(ip, 64)
        if isinstance(insn, int) or insn.iclass == IClass.UNKNOWN:  # (an error code)
            want.append((K_OTHER, 0, 0))
            continue
        c, direct = insn.iclass, insn.is_direct
        kind = {IClass.CALL: K_CALL, IClass.FAR_CALL: K_CALL, IClass.RETURN: K_RET,
                IClass.FAR_RETURN: K_RET}.get(c, K_OTHER)  # fmt: skip
        if c in (IClass.JUMP, IClass.FAR_JUMP) and not direct:
            kind = K_IJUMP
        succ = insn.next_ip
        if direct and c in (IClass.JUMP, IClass.CALL, IClass.COND_JUMP):
            succ = (insn.next_ip + insn.displacement) & 0xFFFFFFFFFFFFFFFF
        want.append((kind, insn.next_ip, succ))
    code = CodeIndex(image)
    assert {w[0] for w in want} == {K_OTHER, K_CALL, K_RET, K_IJUMP}
    for _ in range(2):
        got = code.transfers(np.array(ips, np.uint64))
        assert list(zip(*(a.tolist() for a in got), strict=True)) == want
