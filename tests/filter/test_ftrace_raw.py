"""ftrace's binary formats as hwtrace reads them: trace_pipe_raw pages
(the ring buffer's page and event headers, as the kernel's
``events/header_page`` and ``events/header_event`` describe them) and
perf's TRACING_DATA.  Bad input gives problems at offsets or one
FilterError, never a crash or a read outside the buffer."""

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtrace.filter.errors import FilterError
from hwtrace.filter.ftrace_raw import (
    BAD_LENGTH,
    PROBLEMS,
    EventHeader,
    PageLayout,
    parse_tracing_data,
    read_pages,
)

# This kernel's files (Linux 6.x, x86-64): what the defaults stand for.
HEADER_PAGE = """\
\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;
\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;
\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;
\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;
"""
HEADER_EVENT = """\
# compressed entry header
\ttype_len    :    5 bits
\ttime_delta  :   27 bits
\tarray       :   32 bits

\tpadding     : type == 29
\ttime_extend : type == 30
\ttime_stamp : type == 31
\tdata max type_len  == 28
"""


def _event(type_len: int, delta: int, body: bytes = b"", length: int | None = None) -> bytes:
    head = struct.pack("<I", (delta << 5) | type_len)
    if length is not None:
        head += struct.pack("<I", length)
    return head + body


def _page(ts: int, events: bytes, flags: int = 0) -> bytes:
    page = struct.pack("<QQ", ts, len(events) | flags) + events
    return page + bytes(4096 - len(page))


def test_the_kernels_headers_are_the_defaults():
    assert PageLayout.parse(HEADER_PAGE) == PageLayout()
    assert EventHeader.parse(HEADER_EVENT) == EventHeader()


def test_a_page_of_every_kind_of_event():
    """Data events of one and of a length word, a time extend, padding
    and an absolute time stamp, at the offsets, times and ids the ring
    buffer's format gives them."""
    e1 = _event(2, 5, struct.pack("<HHI", 7, 0, 11))  # 8 bytes: id 7
    ext = _event(30, 1, struct.pack("<I", 2))  # +(2 << 27) + 1
    e2 = _event(0, 3, struct.pack("<H", 9) + bytes(10), length=16)  # 12 bytes: id 9
    pad = _event(29, 1, struct.pack("<I", 8) + bytes(4))  # 8 bytes after its header
    stamp = _event(31, 0x1234, struct.pack("<I", 1))  # absolute: (1 << 27) | 0x1234
    e3 = _event(1, 2, struct.pack("<HH", 4, 0))
    buf = np.frombuffer(_page(1000, e1 + ext + e2 + pad + stamp + e3), np.uint8)
    ev = read_pages(buf)
    assert ev.problems == [] and ev.missed_pages == 0
    # (headers at 16, 28, 36, 56, 68, 76; a length word after e2's)
    assert ev.offsets.tolist() == [20, 44, 80]
    assert ev.lengths.tolist() == [8, 12, 4]
    assert ev.ids.tolist() == [7, 9, 4]
    t1 = 1000 + 5
    t2 = t1 + (2 << 27) + 1 + 3
    t3 = ((1 << 27) | 0x1234) + 2
    assert ev.times.tolist() == [t1, t2, t3]


def test_a_page_that_lost_events_and_one_cut_short():
    full = _page(0, _event(1, 0, struct.pack("<HH", 1, 0)), flags=1 << 31)
    cut = _page(0, _event(1, 0, struct.pack("<HH", 2, 0)))[:20]
    ev = read_pages(np.frombuffer(full + cut, np.uint8))
    assert ev.ids.tolist() == [1] and ev.missed_pages == 1
    assert ev.problems == [(4096 + 8, PROBLEMS[4])]  # (its commit word)


def test_an_event_longer_than_its_page_is_a_problem_at_its_header():
    bad = _event(0, 0, struct.pack("<H", 3), length=4000)
    ev = read_pages(np.frombuffer(_page(0, bad), np.uint8))
    assert len(ev) == 0 and ev.problems == [(16, PROBLEMS[BAD_LENGTH])]


@pytest.mark.parametrize("line, what", [
    ("\tfield: u64 timestamp;\toffset:12;\tsize:8;\tsigned:0;", "timestamp"),
    ("\tfield: local_t commit;\toffset:16;\tsize:8;\tsigned:1;", "commit"),
])  # fmt: skip
def test_a_header_page_with_its_words_past_the_data_is_refused(line, what):
    """The walk reads every page's time stamp and commit word before its
    data: a header_page (a tracefs copy, perf's TRACING_DATA) that puts
    them elsewhere would have it read past the buffer."""
    text = HEADER_PAGE.replace(
        next(x for x in HEADER_PAGE.splitlines() if what in x), line)  # fmt: skip
    with pytest.raises(FilterError, match=f"{what} at offset"):
        PageLayout.parse(text)


_layouts = st.builds(
    lambda ts, commit, extra, size: PageLayout(ts, commit[0], commit[1],
                                               max(ts + 8, commit[0] + commit[1]) + extra, size),
    st.integers(0, 24), st.tuples(st.integers(0, 24), st.sampled_from([4, 8])),
    st.integers(0, 16), st.integers(1, 256),
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=3000), layout=_layouts, delta_bits=st.integers(20, 28),
       seed=st.integers(0, 2**32 - 1))  # fmt: skip
def test_any_bytes_walk_to_events_inside_the_buffer(data, layout, delta_bits, seed):
    """Random pages (random bytes, and pages of plausible headers and
    random events) under any consistent layout: every event the walk gives
    lies inside its page's committed data, problems are at offsets in the
    buffer, and the walk ends."""
    rng = np.random.default_rng(seed)
    pages = bytearray(data)
    for _ in range(int(rng.integers(0, 4))):
        page = bytearray(rng.integers(0, 256, layout.page_size, dtype=np.uint8).tobytes())
        commit = int(rng.integers(0, layout.data_size + 8))
        page[layout.commit_offset : layout.commit_offset + layout.commit_size] = commit.to_bytes(
            8, "little")[: layout.commit_size]  # fmt: skip
        pages += page
    header = EventHeader(type_len_bits=32 - delta_bits, time_delta_bits=delta_bits)
    buf = np.frombuffer(bytes(pages), np.uint8)
    ev = read_pages(buf, 0, layout, header)
    for off, length in zip(ev.offsets.tolist(), ev.lengths.tolist(), strict=True):
        page = (off // layout.page_size) * layout.page_size
        assert page + layout.data_offset <= off and length >= 2
        assert off + length <= min(page + layout.page_size, buf.shape[0])
    assert all(0 <= off < max(buf.shape[0], 1) for off, _ in ev.problems)


def _tracing_data(formats: dict[str, list[str]]) -> bytes:
    out = b"\x17\x08\x44tracing" + b"0.6\0" + b"\0" + b"\x08" + struct.pack("<I", 4096)
    out += b"header_page\0" + struct.pack("<Q", len(HEADER_PAGE)) + HEADER_PAGE.encode()
    out += b"header_event\0" + struct.pack("<Q", len(HEADER_EVENT)) + HEADER_EVENT.encode()
    ftrace = formats.get("ftrace", [])
    out += struct.pack("<I", len(ftrace))
    for text in ftrace:
        out += struct.pack("<Q", len(text)) + text.encode()
    systems = {k: v for k, v in formats.items() if k != "ftrace"}
    out += struct.pack("<I", len(systems))
    for system, texts in systems.items():
        out += system.encode() + b"\0" + struct.pack("<I", len(texts))
        for text in texts:
            out += struct.pack("<Q", len(text)) + text.encode()
    return out


_FORMAT = "name: sys_enter_read\nID: 712\nformat:\n\tfield:unsigned short common_type;\n"


def test_tracing_data_gives_the_event_formats_by_id():
    td = parse_tracing_data(_tracing_data({"ftrace": ["name: function\nID: 1\n"],
                                           "syscalls": [_FORMAT]}))  # fmt: skip
    assert td.page_size == 4096 and td.long_size == 8
    assert PageLayout.parse(td.header_page) == PageLayout()
    assert td.formats[712][:2] == ("syscalls", "sys_enter_read")
    assert td.formats[1][:2] == ("ftrace", "function")


@settings(max_examples=300, deadline=None)
@given(
    cut=st.integers(0, 2000),
    flips=st.lists(st.tuples(st.integers(0, 2000), st.integers(1, 255)), max_size=4),
)
def test_damaged_tracing_data_is_one_error(cut, flips):
    """Tracing data cut short or with bytes changed parses or raises
    FilterError (a message with the byte it stopped at), nothing else."""
    good = bytearray(_tracing_data({"syscalls": [_FORMAT, _FORMAT.replace("712", "713")]}))
    for at, x in flips:
        if at < len(good):
            good[at] ^= x
    try:
        parse_tracing_data(bytes(good[: len(good) - cut % (len(good) + 1)]))
    except FilterError as e:
        assert "TRACING_DATA" in str(e)
