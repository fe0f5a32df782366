"""Decoding only some packet kinds (hwtrace.pt.select) keeps exactly the
full decoder's packets of those kinds, however dense they are."""

from __future__ import annotations

import numpy as np
import pytest

from hwtrace.hwevents.ptw import MAX_WORDS, encode_events
from hwtrace.pt.kinds import Kind
from hwtrace.pt.packets import Packet, as_buffer, decode_range, encode
from hwtrace.pt.select import decode_selected, kind_mask


def _psb_plus() -> list[Packet]:
    return [Packet(Kind.PSB), Packet(Kind.TSC, a=1000), Packet(Kind.PSBEND)]


def _cyc_dense() -> bytes:
    """Mostly one-byte CYC packets (a cycle-accurate trace at threshold 0
    of code without branches): more kept packets than half its bytes."""
    return encode(_psb_plus() + [Packet(Kind.CYC, a=1 + i % 30) for i in range(20_000)])


def _ptw_dense() -> bytes:
    """PTWRITE events, each a TSC, a header PTW and two payload PTWs."""
    n = 5_000
    words = np.zeros((n, MAX_WORDS), np.uint64)
    words[:, 0], words[:, 1] = np.arange(n), np.arange(n) * 7
    return encode_events(np.ones(n, np.uint64), words, np.full(n, 2), 100 + 10 * np.arange(n))


@pytest.mark.parametrize("make", [_cyc_dense, _ptw_dense], ids=["cyc", "ptw"])
def test_the_kept_packets_are_the_full_decoders(make):
    data = make()
    buf = as_buffer(data)
    mask = kind_mask([Kind.PTW, Kind.FUP, Kind.TIP])
    got = decode_selected(buf, 0, buf.shape[0], mask)
    full = decode_range(buf, 0, buf.shape[0])
    keep = mask[full.kind]
    assert got.kind.shape[0] == int(keep.sum()) > buf.shape[0] // 16
    for name in ("offset", "kind", "a", "b", "c"):
        assert np.array_equal(getattr(got, name), getattr(full, name)[keep]), name
