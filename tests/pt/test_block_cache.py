"""Block boundaries of ``ptxed --block-decoder`` against Intel's ptxed.

libipt's block decoder ends a block where its block cache says so (after a
direct call or a backward direct jump met while filling the cache, after
0x400 filled instructions), not only where trace is needed.  The golden
files are Intel's ptxed (built with XED) run with ``--block-decoder
--block:show-blocks --stat`` on the conformance inputs named after them.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from conftest import run_captured
from oracles.ptxed import decode_reference
from test_conformance import _load_runner

from hwtrace.cli import ptxed

GOLDEN = Path(__file__).parents[1] / "golden" / "blocks"
CASES = sorted(p.stem for p in GOLDEN.glob("*.txt"))
OPTIONS = ["--block-decoder", "--block:show-blocks", "--stat"]


@pytest.fixture(scope="module")
def manifest(conformance_dir):
    data = json.loads((conformance_dir / "manifest.json").read_text())
    return {case["name"]: case for case in data["cases"]}


def _ptxed(argv: list[str], reference: bool) -> bytes:
    if not reference:
        return run_captured(argv)
    out = io.BytesIO()
    ptxed.main(argv[1:], out, decoder=decode_reference)
    return out.getvalue()


@pytest.mark.parametrize("reference", [False, True], ids=["compiled", "reference"])
@pytest.mark.parametrize("name", CASES)
def test_blocks_as_intel(conformance_dir, manifest, name, reference, monkeypatch):
    runner = _load_runner()
    case = manifest[name]
    monkeypatch.chdir(conformance_dir / "cases")
    got = b""
    for argv in runner.command_lines(case, "ptxed", ["ptxed"]):
        got += _ptxed(argv[:1] + OPTIONS + argv[1:], reference)
    expected = (GOLDEN / f"{name}.txt").read_bytes()
    assert runner.normalize(got) == runner.normalize(expected)


def test_counts_without_listing(conformance_dir, manifest, monkeypatch):
    """``--quiet --stat`` counts the same blocks as the listing shows."""
    runner = _load_runner()
    case = manifest["ret_near_far"]
    monkeypatch.chdir(conformance_dir / "cases")
    (argv,) = runner.command_lines(case, "ptxed", ["ptxed"])
    got = runner.normalize(
        run_captured(argv[:1] + ["--block-decoder", "--quiet", "--stat"] + argv[1:])
    )
    expected = runner.normalize((GOLDEN / "ret_near_far.txt").read_bytes())
    assert got == [line for line in expected if line.startswith(("insn:", "blocks:"))]


def test_golden_files_present():
    assert len(CASES) == 5


# 1,100 NOPs at 0x1000, then jmp rax.
NOPS = 1100
LONG = b"\x90" * NOPS + bytes([0xFF, 0xE0]) + b"\xcc" * 16


def _block_sizes(tmp_path, enable_at: int, loops: int, reference: bool) -> list[int]:
    from hwtrace.pt import _loops as K
    from hwtrace.pt.kinds import Kind
    from hwtrace.pt.packets import Packet, encode

    packets = [
        Packet(Kind.PSB),
        Packet(Kind.PSBEND),
        Packet(Kind.MODE_EXEC, K.MODE_CSL),
        Packet(Kind.TIP_PGE, 0x1000 + enable_at, 3),
        *[Packet(Kind.TIP, 0x1000, 3) for _ in range(loops)],
        Packet(Kind.TIP_PGD, 0, 0),
    ]
    (tmp_path / "a.pt").write_bytes(encode(packets))
    (tmp_path / "a.bin").write_bytes(LONG)
    argv = ["ptxed", "--block-decoder", "--block:show-blocks", "--raw", f"{tmp_path / 'a.bin'}:0x1000",
            "--no-inst", "--pt", str(tmp_path / "a.pt")]  # fmt: skip
    sizes: list[int] = []
    for line in _ptxed(argv, reference).decode().splitlines():
        if line == "[block]":
            sizes.append(0)
        elif not line.startswith("[") and sizes:
            sizes[-1] += 1
    return sizes


@pytest.mark.parametrize("reference", [False, True], ids=["compiled", "reference"])
def test_fill_steps(tmp_path, reference):
    """Filling the cache ends a block after 0x400 instructions (a
    trampoline); the second time round the code is cached: one block.
    Intel's ptxed lists the same."""
    assert _block_sizes(tmp_path, 0, 1, reference) == [0x400, NOPS + 1 - 0x400, NOPS + 1]


@pytest.mark.parametrize("reference", [False, True], ids=["compiled", "reference"])
def test_entry_overflow(tmp_path, reference):
    """Entered at NOP 591, the cache holds entries of 1..255 instructions
    (ninsn is 8 bits) down to it, NOP 591's being 255: filling from 0x1000
    stops at NOP 590, whose entry would overflow (a trampoline ends the
    block).  Intel's ptxed lists the same."""
    assert _block_sizes(tmp_path, 591, 2, reference) == [
        NOPS + 1 - 591,
        591,
        NOPS + 1 - 591,
        NOPS + 1,
    ]
