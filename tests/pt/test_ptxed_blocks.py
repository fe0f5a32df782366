"""ptxed's blocks (``--block:show-blocks``, ``--stat``) and its recovery
from errors (``--resync-on-error``) on small traces made with hwtrace's
encoder: the expected listings are Intel's ptxed's (libipt built with XED)
on the same inputs.  Each runs through the compiled decoder and through the
interpreted reference."""

from __future__ import annotations

import io

import pytest
from oracles.ptxed import decode_reference

from hwtrace.cli import ptxed
from hwtrace.pt import _loops as K
from hwtrace.pt.kinds import Kind
from hwtrace.pt.packets import Packet, encode

# Code at 0x1000: nop; nop; jmp rax; then int3 padding.
CODE = bytes([0x90, 0x90, 0xFF, 0xE0]) + b"\xcc" * 16


def run(tmp_path, packets, code, *options, reference=False):
    (tmp_path / "a.pt").write_bytes(encode(packets))
    (tmp_path / "a.bin").write_bytes(code)
    out = io.BytesIO()
    argv = ["--raw", f"{tmp_path / 'a.bin'}:0x1000", "--no-inst", *options,
            "--pt", str(tmp_path / "a.pt")]  # fmt: skip
    ptxed.main(argv, out, decoder=decode_reference if reference else None)
    return out.getvalue().decode().splitlines()


def _psb() -> list[Packet]:
    return [Packet(Kind.PSB), Packet(Kind.PSBEND)]


@pytest.mark.parametrize("reference", [False, True])
def test_no_block_while_disabled(tmp_path, reference):
    """A PSB+ with tracing off is a status update libipt reports as an
    event: no block is made for it, before the trace is enabled or when
    nothing follows."""
    got = run(tmp_path, _psb(), CODE, "--block:show-blocks", "--stat", reference=reference)
    assert got == ["insn: 0.", "blocks:\t0."]
    packets = [
        *_psb(),
        Packet(Kind.MODE_EXEC, K.MODE_CSL),
        Packet(Kind.TIP_PGE, 0x1000, 3),
        Packet(Kind.TIP_PGD, 0, 0),
    ]
    got = run(tmp_path, packets, CODE, "--block:show-blocks", "--stat", reference=reference)
    assert got == [
        "[enabled]",
        "[exec mode: 64-bit]",
        "[block 1]",
        "0000000000001000",
        "0000000000001001",
        "0000000000001002",
        "[disabled]",
        "insn: 3.",
        "blocks:\t1.",
    ]


@pytest.mark.parametrize("reference", [False, True])
def test_insn_decoder_shows_no_blocks(tmp_path, reference):
    packets = [
        *_psb(),
        Packet(Kind.MODE_EXEC, K.MODE_CSL),
        Packet(Kind.TIP_PGE, 0x1000, 3),
        Packet(Kind.TIP_PGD, 0, 0),
    ]
    got = run(tmp_path, packets, CODE, "--insn-decoder", "--block:show-blocks", "--stat",
              reference=reference)  # fmt: skip
    assert got == [
        "[enabled]",
        "[exec mode: 64-bit]",
        "0000000000001000",
        "0000000000001001",
        "0000000000001002",
        "[disabled]",
        "insn: 3.",
    ]


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("decoder", [[], ["--insn-decoder"]])
def test_resync_passes_over_what_tells_no_ip(tmp_path, reference, decoder):
    """After an error, libipt's resync passes over the events that do not
    tell where execution is (paging, cbr) without reporting them, and
    resumes at the asynchronous disable that does."""
    packets = [
        *_psb(),
        Packet(Kind.MODE_EXEC, K.MODE_CSL),
        Packet(Kind.TIP_PGE, 0x1000, 3),
        Packet(Kind.TNT8, 0b1, 1),  # a taken branch where jmp rax needs a TIP
        Packet(Kind.PIP, 0x5000),
        Packet(Kind.CBR, 0x1D),
        Packet(Kind.FUP, 0x1001, 3),
        Packet(Kind.TIP_PGD, 0, 0),
        Packet(Kind.TIP_PGE, 0x1000, 3),
        Packet(Kind.TIP_PGD, 0, 0),
    ]
    got = run(tmp_path, packets, CODE, *decoder, "--resync-on-error", reference=reference)
    flow = ["0000000000001000", "0000000000001001", "0000000000001002"]
    assert got == [
        "[enabled]",
        "[exec mode: 64-bit]",
        *flow,
        "[1c, 1002: error: trace stream does not match query]",
        "[disabled]",
        "[enabled]",
        *flow,
        "[disabled]",
    ]
