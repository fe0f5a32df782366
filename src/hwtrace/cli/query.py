"""``hwtrace query``: SQL (DuckDB) over a directory ``hwtrace decode``
wrote, through the views of :mod:`hwtrace.export.query`."""

from __future__ import annotations

import csv
import json
import re
import sys
from collections.abc import Sequence

from ..export.query import READY_VIEWS, TABLES, WRITTEN_WITH, connect
from .common import Parser

PROG = "hwtrace query"


def main(argv: Sequence[str]) -> int:
    p = Parser(
        prog=PROG,
        description="Run SQL (DuckDB) over a directory 'hwtrace decode' wrote. Tables: "
        + ", ".join(TABLES)
        + "; ready views: "
        + ", ".join(READY_VIEWS)
        + " (--views says what each holds).",
    )
    p.add_argument("directory", metavar="DIR")
    p.add_argument("sql", nargs="?", metavar="SQL")
    p.add_argument("--views", action="store_true", help="list the tables and views")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="CSV on standard output")
    fmt.add_argument("--json", action="store_true", help="JSON lines on standard output")
    p.add_argument("--limit", type=int, default=200, metavar="N",
                   help="rows shown in the table (default 200; --csv and --json write all)")  # fmt: skip
    a = p.parse_args(list(argv))
    if not a.views and not a.sql:
        p.error("give a SQL query (or --views)")
    try:
        con, _ = connect(a.directory)
    except ValueError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 1
    import duckdb

    if a.views:
        return _list_views(con)
    try:
        cur = con.execute(a.sql)
        columns = [d[0] for d in cur.description] if cur.description else []
        if a.csv:
            w = csv.writer(sys.stdout, lineterminator="\n")
            w.writerow(columns)
            while rows := cur.fetchmany(1 << 14):
                w.writerows(rows)
            return 0
        if a.json:
            while rows := cur.fetchmany(1 << 14):
                sys.stdout.write(
                    "".join(
                        json.dumps(dict(zip(columns, r, strict=True)), default=str) + "\n"
                        for r in rows
                    )
                )
            return 0
        rows = cur.fetchmany(max(a.limit, 0) + 1)
    except duckdb.Error as e:
        line = sql_error_line(str(e), a.sql) or type(e).__name__
        sys.stderr.write(f"{PROG}: {_missing_table(str(e), line, a.directory, con)}\n")
        return 1
    _print_table(columns, rows, a.limit)
    return 0


def _missing_table(message: str, line: str, directory: str, con) -> str:
    """``line``, DuckDB's error ``message`` on one line, saying what to do
    when it is about a table or view that is not there: which decode
    option writes it, or which of the directory's is meant (DuckDB's hint
    names its own catalog's tables, pg_class)."""
    m = re.search(r"Table with name (\w+) does not exist", message)
    if m is None:
        return line
    import difflib

    name = m.group(1).lower()
    at = re.search(r" \(line \d+, column \d+\)", line)
    place = at.group(0) if at else ""
    if name in WRITTEN_WITH:
        return f"{name}: not in {directory}{place}: 'hwtrace decode {WRITTEN_WITH[name]}' writes it"
    have = [
        r[0]
        for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()
    ]
    near = difflib.get_close_matches(name, have, 1)
    hint = f"; did you mean {near[0]}?" if near else ""
    return f"{name}: no such table or view{place}{hint} (--views lists them)"


def sql_error_line(message: str, sql: str) -> str:
    """DuckDB's error ``message`` about ``sql`` on one line: its first line,
    the place its excerpt and caret point at as line and column of ``sql``,
    and its hints (candidate names) after."""
    lines = [line for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    place, hints = "", []
    rest = iter(lines[1:])
    for line in rest:
        m = re.match(r"LINE (\d+): ", line)
        if m is None:
            hints.append(line.strip())
            continue
        caret = next(rest, "")
        if "^" not in caret:
            continue
        excerpt, at = line[m.end() :], caret.index("^") - m.end()
        if excerpt.startswith("..."):  # (a long line, cut around the place)
            excerpt, at = excerpt[3:], at - 3
        row = int(m.group(1))
        query_lines = sql.splitlines() or [""]
        found = query_lines[row - 1].find(excerpt.rstrip(".")) if row <= len(query_lines) else -1
        if found >= 0 and at >= 0:
            place = f" (line {row}, column {found + at + 1})"
    return lines[0] + place + "".join(f"; {h}" for h in hints)


def _print_table(columns: list[str], rows: list[tuple], limit: int) -> None:
    from ..console import TextTable, escape, text_console

    console = text_console(200)
    table = TextTable()
    for c in columns:
        table.add_column(escape(c))
    for r in rows[:limit]:
        table.add_row(*(escape(_cell(v)) for v in r))
    console.print(table)
    more = len(rows) > limit
    console.print(
        f"{min(len(rows), limit):,} row(s)" + (" shown; more with --limit, --csv" if more else "")
    )


def _cell(v: object) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return f"{v:,.6g}"
    return str(v)


def _list_views(con) -> int:
    from ..console import TextTable, text_console

    have = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views()").fetchall()}
    table = TextTable()
    table.add_column("name")
    table.add_column("kind")
    table.add_column("holds")
    for name, what in TABLES.items():
        if name in have:
            table.add_row(name, "table", what)
    for name, (_, what) in READY_VIEWS.items():
        if name in have:
            table.add_row(name, "view", what)
    text_console().print(table)
    return 0


__all__ = ["main"]
