"""The plain console (hwtrace.console) writes what rich writes into a
file or a pipe: the same bytes for any markup line and any table, rich
itself the oracle, and most of what the commands print without rich."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.errors import MarkupError
from rich.markup import escape as rich_escape
from rich.table import Table

from hwtrace import console as tc

# Text as the commands print it: names from binaries (brackets, colons,
# backslashes, C++ and Rust punctuation), numbers, the few symbols used,
# and now and then what rich must handle (wide characters, tabs, emoji codes).
ALPHABET = st.sampled_from(
    list("abcxyz_0189 ,.+-;!@<>()*&%/'\"")
    + ["[", "]", "[/]", "[bold]", "\\", ":", "::", "…", "Δ", "µ", "→", "±", "≈"]
    + ["宽", "\t", ":smile:", "é", "\u0301", "\x1b", "\n"]
)
TEXT = st.lists(ALPHABET, max_size=12).map("".join)
JUSTIFY = st.sampled_from(["left", "right", "center"])


def _printed(console, out, objects, markup: bool) -> str:
    """What ``console`` wrote, or the error it raised (bad markup is rich's
    to reject, either way)."""
    try:
        for obj in objects:
            console.print(obj, markup=markup)
    except MarkupError as e:
        return f"MarkupError: {e}"
    return out.getvalue()


def rich_text(objects, width: int, markup: bool = True) -> str:
    out = io.StringIO()
    return _printed(
        Console(file=out, highlight=False, soft_wrap=True, width=width), out, objects, markup
    )


def plain_text(objects, width: int, markup: bool = True) -> str:
    out = io.StringIO()
    return _printed(tc.PlainConsole(out, width), out, objects, markup)


@settings(max_examples=300, deadline=None)
@given(TEXT, st.booleans())
def test_escape_and_markup_lines_as_rich(text, styled):
    assert tc.escape(text) == rich_escape(text)
    line = f"[bold]{tc.escape(text)}[/]: x" if styled else tc.escape(text)
    assert plain_text([line], 80) == rich_text([line], 80)
    assert plain_text([text], 80, markup=False) == rich_text([text], 80, markup=False)


@st.composite
def tables(draw):
    ncols = draw(st.integers(1, 6))
    columns = [(draw(TEXT), draw(JUSTIFY)) for _ in range(ncols)]
    rows = draw(st.lists(st.lists(TEXT, min_size=ncols, max_size=ncols), max_size=6))
    title = draw(st.none() | TEXT)
    return title, columns, rows


@settings(max_examples=400, deadline=None)
@given(tables(), st.integers(20, 120), st.booleans())
def test_tables_as_rich(table, width, escaped):
    title, columns, rows = table
    fix = tc.escape if escaped else (lambda s: s)
    ours = tc.TextTable(title=None if title is None else fix(title))
    theirs = Table(title=None if title is None else fix(title), show_edge=False)
    for header, how in columns:
        ours.add_column(fix(header), justify=how)
        theirs.add_column(fix(header), justify=how)
    for row in rows:
        ours.add_row(*map(fix, row))
        theirs.add_row(*map(fix, row))
    assert plain_text([ours], width) == rich_text([theirs], width)


def test_commands_tables_need_no_rich():
    """What the commands print (names, numbers, the symbols they use) is
    written without rich: a table, a title, markup lines."""
    table = tc.TextTable(title="call paths, most different insn first")
    for header, how in (("call path", "left"), ("calls A", "right"), ("Δ/call", "right"),
                        ("only in", "left")):  # fmt: skip
        table.add_column(header, justify=how)
    table.add_row(tc.escape("small;…(2);libc.so.6!__cxa_atexit"), "1", "+0.0", "")
    table.add_row(tc.escape("[vdso]!__vdso_clock_gettime"), "12", "-3.5", "B")
    text = table.plain(160)
    assert text is not None and text == rich_text([table.__rich__()], 160)
    assert "[vdso]!__vdso_clock_gettime" in text
    console = tc.PlainConsole(io.StringIO(), 160)
    console.print(table)
    console.print(f"[bold]A[/] {tc.escape('a.data')}: 78 call paths")
    console.print(f"\n[bold]{tc.escape('[worker]')}[/] pid 1: 197.8 µs")
    assert console._rich is None  # rich was not needed


def test_text_console_chooses_by_output():
    """A terminal (or rich's FORCE_COLOR) gets rich's console; a pipe gets
    the plain one, as wide as rich would make it."""
    code = (
        "import sys; from hwtrace.console import text_console, PlainConsole; "
        "c = text_console(); print(type(c).__name__, c.width, 'rich' in sys.modules)"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS")
    }

    def run(**extra) -> list[str]:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**env, **extra}, stdin=subprocess.DEVNULL,
                              check=True).stdout.split()  # fmt: skip

    assert run() == ["PlainConsole", "80", "False"]
    assert run(COLUMNS="133") == ["PlainConsole", "133", "False"]
    assert run(FORCE_COLOR="1")[0] == "Console"
    width = subprocess.run(
        [sys.executable, "-c", "from rich.console import Console; print(Console().width)"],
        capture_output=True, text=True, env={**env, "COLUMNS": "133"}, stdin=subprocess.DEVNULL,
    ).stdout.strip()  # fmt: skip
    assert width == "133"
