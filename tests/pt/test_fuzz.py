"""Random and mutated bytes never crash the decoder, the time model or the dump."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtrace.pt.config import PtConfig
from hwtrace.pt.kinds import Kind
from hwtrace.pt.packets import Packet, decode, encode
from hwtrace.pt.ptdump import DumpOptions, ptdump_lines
from hwtrace.pt.timing import estimate_time

SEED = encode(
    [Packet(Kind.PSB), Packet(Kind.TSC, 99), Packet(Kind.TMA, 3, 4), Packet(Kind.CBR, 2)]
    + [Packet(Kind.PSBEND), Packet(Kind.MTC, 1), Packet(Kind.CYC, 77), Packet(Kind.TIP, 5, 1)]
)
CONFIG = PtConfig(mtc_freq=3, nom_freq=4, cpuid_0x15_eax=2, cpuid_0x15_ebx=7)


def exercise(data: bytes) -> None:
    buf = np.frombuffer(data, np.uint8)
    for sync in (True, False):
        table = decode(data, sync=sync)
        assert int(table.offset.max(initial=0)) <= len(data)
        times = estimate_time(table, CONFIG)
        assert len(times.tsc) == len(table)
        opts = DumpOptions(time=True, time_delta=True, raw=True, lastip=True, exec_mode=True)
        text = b"".join(ptdump_lines(table, buf, opts, CONFIG, times))
        assert text.count(b"\n") >= len(table)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def test_random_bytes(data):
    exercise(data)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=12), st.integers(1, 4)
)
def test_mutated_streams(flips, copies):
    data = bytearray(SEED * copies)
    for pos, value in flips:
        data[pos % len(data)] = value
    exercise(bytes(data))
