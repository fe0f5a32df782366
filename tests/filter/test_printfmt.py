"""A tracepoint's ``print fmt``: the fields the kernel prints as words.

Stored format files (Linux 6.18, x86-64) say what each rendering must be;
on a machine with tracefs every format of the running kernel is read, and
the kernel's own trace output (one ring buffer read twice: as the kernel
prints it, and with the ``fields`` option's raw values) is the oracle for
the words of every event a short workload produces.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.filter.printfmt import PrintFmtError, parse_print_fmt, word_fields

TRACEFS = Path("/sys/kernel/tracing")

_COMMON = (
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
)
_STATE_BITS = "(((0x00000000 | 0x00000001 | 0x00000002 | 0x00000004 | 0x00000008 | 0x00000010 | 0x00000020 | 0x00000040) + 1) << 1)"
SCHED_SWITCH = (
    "name: sched_switch\nID: 372\nformat:\n" + _COMMON
    + "\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n"
    "\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;\n"
    "\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;\n"
    "\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;\n"
    "\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;\n"
    "\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;\n"
    "\tfield:int next_prio;\toffset:60;\tsize:4;\tsigned:1;\n\n"
    'print fmt: "prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%s%s ==> next_comm=%s '
    'next_pid=%d next_prio=%d", REC->prev_comm, REC->prev_pid, REC->prev_prio, '
    f"(REC->prev_state & ({_STATE_BITS} - 1)) ? __print_flags(REC->prev_state & ({_STATE_BITS}"
    ' - 1), "|", { 0x00000001, "S" }, { 0x00000002, "D" }, { 0x00000004, "T" }, '
    '{ 0x00000008, "t" }, { 0x00000010, "X" }, { 0x00000020, "Z" }, { 0x00000040, "P" }, '
    f'{{ 0x00000080, "I" }}) : "R", REC->prev_state & {_STATE_BITS} ? "+" : "", '
    "REC->next_comm, REC->next_pid, REC->next_prio\n"
)  # fmt: skip
HRTIMER_SETUP = (
    "name: hrtimer_setup\nID: 461\nformat:\n" + _COMMON
    + "\tfield:void * hrtimer;\toffset:8;\tsize:8;\tsigned:0;\n"
    "\tfield:clockid_t clockid;\toffset:16;\tsize:4;\tsigned:1;\n"
    "\tfield:enum hrtimer_mode mode;\toffset:20;\tsize:4;\tsigned:0;\n\n"
    'print fmt: "hrtimer=%p clockid=%s mode=%s", REC->hrtimer, __print_symbolic(REC->clockid, '
    '{ 0, "CLOCK_REALTIME" }, { 1, "CLOCK_MONOTONIC" }, { 7, "CLOCK_BOOTTIME" }, '
    '{ 11, "CLOCK_TAI" }), __print_symbolic(REC->mode, { HRTIMER_MODE_ABS, "ABS" }, '
    '{ HRTIMER_MODE_REL, "REL" })\n'
)  # fmt: skip
SOFTIRQ_ENTRY = (
    "name: softirq_entry\nID: 150\nformat:\n" + _COMMON
    + "\tfield:unsigned int vec;\toffset:8;\tsize:4;\tsigned:0;\n\n"
    'print fmt: "vec=%u [action=%s]", REC->vec, __print_symbolic(REC->vec, { 0, "HI" }, '
    '{ 1, "TIMER" }, { 2, "NET_TX" })\n'
)  # fmt: skip


def _fmt(
    body: str, fields: str = "\tfield:unsigned long v;\toffset:8;\tsize:8;\tsigned:0;\n"
) -> str:
    return f"name: t\nID: 1\nformat:\n{_COMMON}{fields}\nprint fmt: {body}\n"


def test_sched_switch_prev_state_as_the_kernel_prints_it() -> None:
    words = word_fields(SCHED_SWITCH, {"prev_pid", "prev_prio", "prev_state", "next_pid"})
    assert set(words) == {"prev_state"}
    state = words["prev_state"]
    # (TASK_REPORT's letters joined by |, R when none; + when preempted)
    cases = {0: "R", 1: "S", 2: "D", 3: "S|D", 0x80: "I", 0x100: "R+", 0x101: "S+", 0x400: "R"}
    assert {v: state(v) for v in cases} == cases


def test_symbols_flags_and_c_as_the_kernel_evaluates_them() -> None:
    clock = word_fields(HRTIMER_SETUP, {"clockid", "mode"})
    # mode's table names enum constants the format does not define: a number
    assert set(clock) == {"clockid"}
    assert [clock["clockid"](v) for v in (0, 1, 7, 3)] == [
        "CLOCK_REALTIME", "CLOCK_MONOTONIC", "CLOCK_BOOTTIME", "0x3",
    ]  # fmt: skip
    # vec=%u is the number; action= is no field
    assert word_fields(SOFTIRQ_ENTRY, {"vec"}) == {}
    flags = word_fields(
        _fmt(
            '"v=%s", __print_flags(REC->v, "|", { 1, "A" }, { 6, "BC" }, { 4, "C" }, '
            '{ 0, ((void *)0) }, { 8, "never" })'
        ),
        {"v"},
    )["v"]
    # each name clears its bits (C after BC: nothing left of 4), the rest
    # in hex, the table ends at its NULL name, nothing at all for 0
    assert [flags(v) for v in (0, 1, 7, 4, 0x31, 8)] == ["", "A", "A|BC", "C", "A|0x30", "0x8"]
    expr = word_fields(
        _fmt(
            '"v=%s%d%s", REC->v > 1 + 2 * 3 ? "big" : "small", (int)(REC->v << 1) - (u8)300, '
            '!REC->v || REC->v % 3 == 2 && REC->v & 1 ? "!" : ""'
        ),
        {"v"},
    )["v"]
    # precedence: * before +, % before ==, == before &, & before &&, && before ||
    assert expr(0) == "small-44!" and expr(8) == "big-28" and expr(5) == "small-34!"
    assert expr(0x80000000) == "big-44"  # (int) wraps, then 44 off
    width = word_fields(_fmt('"v=%-6s%#x", REC->v ? "on" : "off", REC->v'), {"v"})["v"]
    # (the kernel's vsnprintf writes 0x before 0 too, where glibc does not)
    assert width(0) == "off   0x0" and width(255) == "on    0xff"
    octal = word_fields(_fmt('"v=%s%#o", REC->v ? "on" : "off", REC->v'), {"v"})["v"]
    assert octal(0) == "off0" and octal(8) == "on010"


def test_casts_to_typedefs() -> None:
    """``(uint)``, ``(int64_t)``: casts (xfs's print fmts), truncating."""
    text = word_fields(
        _fmt('"v=%s%lld", REC->v ? "+" : "", (uint)(REC->v >> 4) + (int64_t)REC->v'), {"v"}
    )["v"]
    assert text(0xF00000010) == f"+{0xF0000001 + 0xF00000010}"
    assert text(0) == "0"


def test_what_it_does_not_model_stays_a_number() -> None:
    assert word_fields(_fmt('"v=%*d", 4, REC->v'), {"v"}) == {}  # width from an argument
    assert word_fields(_fmt('"v=%s", __get_str(v)'), {"v"}) == {}
    assert word_fields(_fmt('"v=%s", REC->v ? "x" : "y"'), set()) == {}  # not a field named
    assert word_fields(_fmt('"v=%s %d", REC->v ? "x" : "y"'), {"v"}) == {}  # args short
    assert word_fields(_fmt('"v=%s", REC->v ? "x" : REC->w'), {"v"}) == {}  # two fields
    assert word_fields(_fmt('"v=%s", REC->v $ 2'), {"v"}) == {}  # unreadable: no words
    # a parenthesised constant is no cast, and a name the format does not
    # define cannot be evaluated
    assert word_fields(_fmt('"v=%s", (REC->v & (MASK) - 1) ? "x" : "y"'), {"v"}) == {}
    assert word_fields("name: t\nformat:\n", {"v"}) == {}
    with pytest.raises(PrintFmtError, match="column"):
        parse_print_fmt(_fmt('"v=%s", REC->v $ 2'))


@pytest.mark.skipif(not (TRACEFS / "events").is_dir(), reason="no tracefs at /sys/kernel/tracing")
def test_every_format_of_the_running_kernel() -> None:
    """Every format reads, or fails with its own error (the kernel's GNU C
    statement expressions, multi-line strings), never anything else."""
    paths = glob.glob(str(TRACEFS / "events/*/*/format"))
    if not paths or not os.access(paths[0], os.R_OK):
        pytest.skip("tracefs formats not readable (needs root)")
    read = words = 0
    for path in paths:
        text = Path(path).read_text()
        try:
            parse_print_fmt(text)
            read += 1
        except PrintFmtError:
            pass
        names = set(re.findall(r"field:[^;]*?(\w+)(?:\[\d*\])?;", text))
        words += bool(word_fields(text, names))
    assert read > 0.9 * len(paths) and words > 10


def _fields_values(line: str) -> dict[str, int]:
    """The raw values of a ``fields``-option line: ``name=0x1 (1)``."""
    return {m[1]: int(m[2]) for m in re.finditer(r"(\w+)=0x[0-9a-f]+ \((-?\d+)\)", line)}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a tracefs instance)")
@pytest.mark.skipif(not (TRACEFS / "instances").is_dir(), reason="no tracefs instances")
def test_words_are_the_kernels_own() -> None:
    """Events of a short workload, printed by the kernel from its ring
    buffer, and the same buffer read again with raw values: every word
    field of every event is what the kernel printed after ``name=``."""
    inst = TRACEFS / "instances" / f"hwtrace-printfmt-{uuid.uuid4().hex[:8]}"
    wanted = ["sched/sched_switch", "timer/hrtimer_setup", "compaction/mm_compaction_end"]
    try:
        inst.mkdir()
    except OSError as e:
        pytest.skip(f"cannot make a tracefs instance: {e}")
    try:
        if not (inst / "options" / "fields").exists():
            pytest.skip("this kernel's trace output has no 'fields' option")
        formats, enabled = {}, []
        for ev in wanted:
            if (inst / "events" / ev / "enable").exists():
                formats[ev.split("/")[1]] = (TRACEFS / "events" / ev / "format").read_text()
                (inst / "events" / ev / "enable").write_text("1")
                enabled.append(ev)
        for _ in range(3):
            subprocess.run(["sh", "-c", "sleep 0.01; cat /etc/hostname >/dev/null"], check=False)
        time.sleep(0.05)
        for ev in enabled:
            (inst / "events" / ev / "enable").write_text("0")
        printed = [x for x in (inst / "trace").read_text().splitlines() if not x.startswith("#")]
        (inst / "options" / "fields").write_text("1")
        raw = [x for x in (inst / "trace").read_text().splitlines() if not x.startswith("#")]
    finally:
        for ev in wanted:
            enable = inst / "events" / ev / "enable"
            if enable.exists():
                enable.write_text("0")
        inst.rmdir()
    assert len(printed) == len(raw) > 0
    checked: dict[str, set[str]] = {}
    for kernel, fields in zip(printed, raw, strict=True):
        event = re.search(r" (\w+): ", kernel)
        assert event is not None and event[1] in formats
        values = _fields_values(fields)
        for name, text in word_fields(formats[event[1]], set(values)).items():
            want = text(values[name])
            assert f" {name}={want} " in f"{kernel} ", (kernel, fields)
            checked.setdefault(name, set()).add(want)
    # a running machine switches from running and from sleeping tasks
    assert {"R", "S"} <= checked.get("prev_state", set())


_PIECES = st.sampled_from([
    "REC->v", "REC->w", "(", ")", "{", "}", ",", "?", ":", "1", "0x10", "-", "~", "!", "<<", "&&",
    "|", "&", "==", '"S"', '"|"', "(int)", "(void *)", "__print_flags(", "__print_symbolic(",
    "__get_str(", "/", "%", "[", "]", "->", ".", "$", "'c'", "sizeof", " ",
])  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=40), st.sampled_from(['"v=%s"', '"v=%d%s"', '"%s v=%s"']))
def test_fuzz_never_more_than_its_own_error(pieces: list[str], fmt: str) -> None:
    """Any ``print fmt`` either reads or raises PrintFmtError; word_fields
    never raises, and its texts take any value."""
    text = _fmt(f"{fmt}, {''.join(pieces)}")
    try:
        parse_print_fmt(text)
    except PrintFmtError:
        pass
    for f in word_fields(text, {"v", "w"}).values():
        for v in (0, 1, -1, 0xFFFF, 1 << 63):
            assert isinstance(f(v), str)


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    with pytest.raises(PrintFmtError, match="nested"):
        parse_print_fmt(_fmt('"v=%d", ' + "(" * 5000 + "REC->v" + ")" * 5000))
    assert word_fields(_fmt('"v=%d", ' + "-" * 5000 + "REC->v"), {"v"}) == {}
