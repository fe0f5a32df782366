"""A command's text output: rich at a terminal, the same bytes without it
into a file or a pipe.

The analysis commands print a few lines of console markup and tables
(``rich.table.Table(show_edge=False)``).  Importing rich costs a command
30-60 ms of its start and rich lays out a table row in about a
millisecond; into a file or a pipe its output is plain text, so
:func:`text_console` gives there a :class:`PlainConsole` that writes what
rich would, byte for byte, for what the commands print: markup tags
removed, tables in rich's ``HEAVY_HEAD`` box without edges.  Anything it
cannot be sure of (a table wider than the console, characters whose
width is not one cell, control characters, emoji codes, tags it does
not know) it hands to rich.  At a terminal rich does everything (styles, terminal
width).
"""

from __future__ import annotations

import os
import re
import sys
from typing import IO, Any

# Console markup tags and escapes, as rich.markup finds them.
_TAG = re.compile(r"((\\*)\[([a-z#/@][^[]*?)])")
_ESCAPE = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")
# Characters beyond printable ASCII that the commands print and rich gives
# one cell each.
_PLAIN_EXTRA = frozenset("…Δµ→←±≈×·°")
_EMOJI_CODE = re.compile(r":\S*?:")


def escape(text: str) -> str:
    """``text`` with square brackets escaped so that it is not read as
    markup (``rich.markup.escape``)."""
    text = _ESCAPE.sub(lambda m: f"{m.group(1)}{m.group(1)}\\{m.group(2)}", text)
    if text.endswith("\\") and not text.endswith("\\\\"):
        return text + "\\"
    return text


def _simple(text: str, lines: bool = False) -> bool:
    """Whether every character of ``text`` is one cell wide and needs no
    translation by rich (control codes, tabs, emoji codes); with ``lines``,
    line breaks too."""
    if lines:
        text = text.replace("\n", "")
    if text.isascii():
        if not text.isprintable():
            return False
    elif any(not (c.isascii() and c.isprintable()) and c not in _PLAIN_EXTRA for c in text):
        return False
    return ":" not in text or _EMOJI_CODE.search(text) is None


# The styles the commands' markup uses: other tags are left to rich.
_STYLES = frozenset({"bold", "italic", "dim", "yellow", "red", "green", "cyan"})


def _plain_markup(markup: str, lines: bool = False) -> str | None:
    """The text of console markup as rich reads it (tags removed, escaped
    brackets kept), or None where rich's own reading is needed; ``lines``
    as for :func:`_simple`."""
    if not _simple(markup, lines):
        return None
    if "[" not in markup:
        return markup
    out = []
    opened: list[str] = []
    position = 0
    for match in _TAG.finditer(markup):
        whole, escapes, tag = match.groups()
        start, end = match.span()
        if start > position:
            out.append(markup[position:start].replace("\\[", "["))
        position = end
        if escapes:
            backslashes, escaped = divmod(len(escapes), 2)
            out.append("\\" * backslashes)
            if escaped:
                out.append(whole[len(escapes) :].replace("\\[", "["))
                continue
        if tag == "/":
            if not opened:
                return None  # rich's error
            opened.pop()
        elif tag.startswith("/"):
            if tag[1:] not in opened:
                return None
            opened.reverse()
            opened.remove(tag[1:])
            opened.reverse()
        elif tag in _STYLES:
            opened.append(tag)
        else:
            return None
    if position < len(markup):
        out.append(markup[position:].replace("\\[", "["))
    return "".join(out)


class TextTable:
    """A table as the commands build it (the part of ``rich.table.Table``
    they use: a title, columns with a justification, rows of markup
    strings), printed by either console."""

    def __init__(self, title: str | None = None) -> None:
        self.title = title
        self.headers: list[str] = []
        self.justify: list[str] = []
        self.rows: list[tuple[str, ...]] = []

    def add_column(self, header: str, justify: str = "left") -> None:
        self.headers.append(header)
        self.justify.append(justify)

    def add_row(self, *cells: str) -> None:
        if len(cells) != len(self.headers):
            raise ValueError(
                f"a row of {len(cells)} cells in a table of {len(self.headers)} columns"
            )
        self.rows.append(tuple(cells))

    def plain(self, width: int) -> str | None:
        """rich's text of the table on a console ``width`` cells wide, or
        None when rich would lay it out otherwise (narrower columns,
        wrapped cells) or its text needs rich."""
        if not self.headers:
            return None
        title = None
        if self.title:
            title = _plain_markup(self.title)
            if title is None:
                return None
        grid = [self.headers, *self.rows]
        texts = []
        for row in grid:
            line = []
            for cell in row:
                text = _plain_markup(cell)
                if text is None or text != text.strip():
                    return None
                line.append(text)
            texts.append(line)
        widths = [max(len(r[i]) for r in texts) + 2 for i in range(len(self.headers))]
        if sum(widths) + len(widths) - 1 > width:
            return None
        out = [] if title is None else [title]
        for n, row in enumerate(texts):
            cells = []
            for text, w, how in zip(row, widths, self.justify, strict=True):
                room = w - 2 - len(text)
                if how == "right":
                    cells.append(f"{' ' * (room + 1)}{text} ")
                elif how == "center":
                    cells.append(f"{' ' * (room // 2 + 1)}{text}{' ' * (room - room // 2 + 1)}")
                else:
                    cells.append(f" {text}{' ' * room} ")
            out.append(("┃" if n == 0 else "│").join(cells))
            if n == 0:
                out.append("╇".join("━" * w for w in widths))
        return "\n".join(out) + "\n"

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table(title=self.title, show_edge=False)
        for header, how in zip(self.headers, self.justify, strict=True):
            table.add_column(header, justify=how)  # type: ignore[arg-type]
        for row in self.rows:
            table.add_row(*row)
        return table


def _rich_console(file: IO[str], width: int | None) -> Any:
    from rich.console import Console

    return Console(file=file, highlight=False, soft_wrap=True, width=width)


class PlainConsole:
    """Writes what ``rich.console.Console(highlight=False, soft_wrap=True)``
    writes into a file or a pipe, for lines of markup and
    :class:`TextTable`; anything else goes to such a rich console."""

    def __init__(self, file: IO[str], width: int) -> None:
        self.file = file
        self.width = width
        self._rich: Any = None

    def _fallback(self) -> Any:
        if self._rich is None:
            self._rich = _rich_console(self.file, self.width)
        return self._rich

    def print(self, *objects: Any, markup: bool = True) -> None:
        if len(objects) <= 1:
            obj = objects[0] if objects else ""
            if isinstance(obj, TextTable):
                text = obj.plain(self.width)
            elif isinstance(obj, str):
                text = _plain_markup(obj, True) if markup else (obj if _simple(obj, True) else None)
                text = None if text is None else text + "\n"
            else:
                text = None
            if text is not None:
                self.file.write(text)
                return
        self._fallback().print(*objects, markup=markup)


class NoProgress:
    """A progress display that shows nothing (no terminal, or a command's
    ``--no-progress``): rich is not imported for it."""

    def __enter__(self) -> NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, *args: object, **kwargs: object) -> int:
        return 0

    def update(self, *args: object, **kwargs: object) -> None:
        return None

    def advance(self, *args: object, **kwargs: object) -> None:
        return None


def _forced_terminal() -> bool:
    """Whether rich would write styles into a file or pipe (its
    ``TTY_COMPATIBLE`` and ``FORCE_COLOR`` settings)."""
    compatible = os.environ.get("TTY_COMPATIBLE", "")
    if compatible in ("0", "1"):
        return compatible == "1"
    return bool(os.environ.get("FORCE_COLOR"))


def piped_width() -> int:
    """The width rich gives a console that is not a terminal: ``COLUMNS``,
    else the terminal's that standard input or error is, else 80."""
    width = None
    for fd in (0, 1, 2):
        try:
            width = os.get_terminal_size(fd).columns
        except (AttributeError, ValueError, OSError):
            continue
        break
    columns = os.environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        width = int(columns)
    return width or 80


def text_console(width: int | None = None, file: IO[str] | None = None) -> Any:
    """A console for a command's text on ``file`` (standard output): rich's
    at a terminal; into a file or a pipe a :class:`PlainConsole`, ``width``
    cells wide (else as wide as rich would make it)."""
    file = sys.stdout if file is None else file
    isatty = getattr(file, "isatty", None)
    if (isatty is not None and isatty()) or _forced_terminal():
        return _rich_console(file, None)
    return PlainConsole(file, piped_width() if width is None else width)


__all__ = ["NoProgress", "PlainConsole", "TextTable", "escape", "piped_width", "text_console"]
