"""JSON lines and the human listing agree with the Python packet view."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from test_packets import PACKETS

from hwtrace.pt.config import PtConfig
from hwtrace.pt.kinds import Kind
from hwtrace.pt.packets import Packet, decode, encode
from hwtrace.pt.render import human_lines, json_lines
from hwtrace.pt.timing import estimate_time


def text(blocks):
    return b"".join(blocks).decode()


@settings(max_examples=200, deadline=None)
@given(st.lists(PACKETS, max_size=40))
def test_json_equals_packet_view(packets):
    table = decode(encode(packets), sync=False, resync=False)
    rows = [json.loads(line) for line in text(json_lines(table)).splitlines()]
    assert rows == [p.to_dict() for p in table]


def test_json_time_and_errors_in_stream_order():
    good = encode([Packet(Kind.PSB), Packet(Kind.TSC, 0x1000), Packet(Kind.PSBEND)])
    data = good + b"\x02\xff" + good  # an unknown extended opcode between two PSB+
    table = decode(data)
    times = estimate_time(table, PtConfig())
    rows = [json.loads(line) for line in text(json_lines(table, times)).splitlines()]
    assert [r.get("kind", "error") for r in rows] == [
        "psb", "tsc", "psbend", "error", "psb", "tsc", "psbend",
    ]  # fmt: skip
    assert rows[3] == {"offset": len(good), "error": "unknown opcode"}
    assert rows[1]["time"] == 0x1000 and rows[1]["tsc"] == 0x1000


def test_human_listing():
    table = decode(
        encode(
            [
                Packet(Kind.PSB),
                Packet(Kind.FUP, 0x401000, 6),
                Packet(Kind.PSBEND),
                Packet(Kind.TNT8, 0b110, 3),
                Packet(Kind.PIP, 0x1000, 1),
            ]
        )
    )
    lines = text(human_lines(table)).splitlines()
    assert lines[0] == "0000000000000000  psb"
    assert lines[1].split() == ["0000000000000010", "fup", "ip=0x401000", "ipc=6"]
    assert lines[3].split()[1:] == ["tnt.8", "TTN", "nbits=3"]
    assert lines[4].split()[1:] == ["pip", "cr3=0x1000", "nr=1"]
    colored = text(human_lines(table, color=True)).splitlines()
    assert "\x1b[" in colored[1] and colored[1].index("ip=") == lines[1].index("ip=") + 9
