"""MkDocs hook: the command and Python API reference pages, generated at build time.

Nothing here is written by hand, so the reference cannot drift from the code:

- one page per ``hwtrace`` command, from the command's own argument parser
  (its usage, description and options, and the exact text ``hwtrace CMD
  --help`` prints).  The list of commands is the one ``hwtrace --help``
  prints (``hwtrace.cli.main.USAGE``).  Each command builds its parser in
  its ``main`` function, so the parser is caught at its ``parse_args`` call;
  ``ptdump`` and ``ptxed`` parse their options by hand, as Intel's tools do,
  and their pages carry their ``--help`` text.
- one page per public module of the ``hwtrace`` package (no name part
  starting with ``_``), found by walking ``src/hwtrace``, each rendered by
  mkdocstrings from the docstrings: a module moved or added is documented
  without editing the docs.

The pages are added to the navigation where ``mkdocs.yml`` names
``reference/commands/index.md`` and ``reference/api/index.md``.
``tests/package/test_docs.py`` imports this file to check the pages against the
command line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = "hwtrace"
COMMANDS_DIR = "reference/commands"
API_DIR = "reference/api"
# argparse wraps help text to the terminal's width: fix it, so that the pages
# do not depend on where they were built (the tests run --help with the same).
HELP_COLUMNS = "80"

# The guide that explains each command in prose.
GUIDES = {
    "ptdump": "guides/decoding.md",
    "ptxed": "guides/decoding.md",
    "record": "guides/perf.md",
    "report": "guides/perf.md",
    "script": "guides/perf.md",
    "perf-dump": "guides/perf.md",
    "decode": "guides/exports.md",
    "query": "guides/exports.md",
    "latency": "guides/analyses.md",
    "funclatency": "guides/analyses.md",
    "diff": "guides/analyses.md",
    "events": "guides/analyses.md",
    "characterize": "guides/analyses.md",
    "vm": "guides/analyses.md",
    "filter": "guides/filters.md",
    "filter-compile": "guides/filters.md",
    "trace": "guides/filters.md",
    "probe": "guides/probes.md",
    "ptwrite": "guides/software-events.md",
    "bts": "guides/software-events.md",
    "csdump": "guides/software-events.md",
    "aot": "guides/aot.md",
}


def _src_on_path() -> None:
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))


def commands() -> list[tuple[str, str]]:
    """The commands ``hwtrace --help`` lists, with their one-line summaries."""
    _src_on_path()
    from hwtrace.cli.main import USAGE

    listing = USAGE.split("commands:\n", 1)[1].split("\n\n", 1)[0]
    found = []
    for line in listing.splitlines():
        match = re.match(r"\s+(\S+)\s+(.*)", line)
        if match:
            found.append((match.group(1), match.group(2).strip()))
    return found


@contextlib.contextmanager
def _help_columns() -> Iterator[None]:
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        yield
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


class _Caught(BaseException):
    """Carries a command's parser out of its ``main`` (a BaseException so
    that no ``except Exception`` in a command swallows it)."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser


def command_parser(command: str) -> argparse.ArgumentParser | None:
    """The argument parser ``hwtrace COMMAND`` builds, caught before it parses
    anything; None for the commands that parse their options by hand."""
    _src_on_path()
    from hwtrace.cli import main

    def catch(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Caught(self)

    saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_args = catch  # type: ignore[assignment]
    argparse.ArgumentParser.parse_known_args = catch  # type: ignore[assignment]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main._run(command, ["--help"])
    except _Caught as caught:
        return caught.parser
    except SystemExit:
        pass
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved
    return None


def help_text(command: str) -> str:
    """What ``hwtrace COMMAND --help`` prints (with COLUMNS=HELP_COLUMNS)."""
    with _help_columns():
        parser = command_parser(command)
        if parser is not None:
            return parser.format_help()
        _src_on_path()
        from hwtrace.cli import main

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                main._run(command, ["--help"])
            except SystemExit:
                pass
        return out.getvalue()


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _option_rows(parser: argparse.ArgumentParser) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """Each argument group's title and its rows (invocation, help), as
    argparse's own formatter words them."""
    formatter = parser._get_formatter()
    for group in parser._action_groups:
        rows = []
        for action in group._group_actions:
            if action.help == argparse.SUPPRESS:
                continue
            invocation = formatter._format_action_invocation(action)
            helptext = formatter._expand_help(action) if action.help else ""
            rows.append((invocation, helptext))
        if rows:
            yield group.title or "options", rows


def command_page(command: str, summary: str) -> str:
    """The Markdown reference page of one command."""
    parser = command_parser(command)
    text = help_text(command)
    guide = GUIDES.get(command)
    lines = [f"# hwtrace {command}", "", f"{summary[:1].upper()}{summary[1:]}.", ""]
    if guide:
        lines += [f"How it works and examples: [the guide](../../{guide}).", ""]
    if parser is None:
        lines += [
            "The options are Intel's; `hwtrace` parses them as Intel's tool does:",
            "",
            "```text",
            text.rstrip("\n"),
            "```",
            "",
        ]
        return "\n".join(lines)
    with _help_columns():
        usage = parser.format_usage().rstrip("\n")
    lines += ["```text", usage, "```", ""]
    if parser.description:
        lines += [parser.description.strip(), ""]
    for title, rows in _option_rows(parser):
        lines += [
            f"## {title[:1].upper()}{title[1:]}",
            "",
            "| argument | meaning |",
            "| --- | --- |",
        ]
        lines += [f"| `{_cell(inv)}` | {_cell(helptext)} |" for inv, helptext in rows]
        lines.append("")
    if parser.epilog:
        lines += [parser.epilog.strip(), ""]
    lines += [
        f'??? note "`hwtrace {command} --help`"',
        "",
        "    ```text",
        *(f"    {line}" if line else "" for line in text.rstrip("\n").split("\n")),
        "    ```",
        "",
    ]
    return "\n".join(lines)


def commands_index() -> str:
    lines = [
        "# Command reference",
        "",
        "Generated from the commands' argument parsers: each page shows what",
        "`hwtrace COMMAND --help` prints.",
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    lines += [f"| [`{c}`]({c}.md) | {_cell(s)} |" for c, s in commands()]
    return "\n".join(lines) + "\n"


def api_modules() -> list[str]:
    """Every public module of the package, in dotted form, packages first."""
    names = []
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if any(part.startswith("_") for part in parts):
            continue
        package_dirs = [SRC.joinpath(*parts[:i]) for i in range(1, len(parts))]
        if not all((d / "__init__.py").exists() for d in package_dirs):
            continue
        names.append(".".join(parts))
    return sorted(names, key=lambda name: name.split("."))


def api_page(module: str) -> str:
    return f"# `{module}`\n\n::: {module}\n"


def api_index() -> str:
    lines = [
        "# Python API reference",
        "",
        "Generated from the docstrings of every public module (walked from",
        "`src/hwtrace` at build time).  The [Python API guide](../../guides/python-api.md)",
        "shows how the pieces fit together.",
        "",
    ]
    lines += [f"- [`{m}`]({m}.md)" for m in api_modules()]
    return "\n".join(lines) + "\n"


def generated_pages() -> dict[str, str]:
    """Every generated page: path under docs/ to Markdown."""
    pages = {f"{COMMANDS_DIR}/index.md": commands_index()}
    for command, summary in commands():
        pages[f"{COMMANDS_DIR}/{command}.md"] = command_page(command, summary)
    pages[f"{API_DIR}/index.md"] = api_index()
    for module in api_modules():
        pages[f"{API_DIR}/{module}.md"] = api_page(module)
    return pages


def _api_nav() -> list[object]:
    nav: list[object] = [{"Overview": f"{API_DIR}/index.md"}]
    sections: dict[str, list[object]] = {}
    for module in api_modules():
        parts = module.split(".")
        top = ".".join(parts[:2]) if len(parts) > 1 else module
        if len(parts) == 2 and not (SRC.joinpath(*parts) / "__init__.py").exists():
            top = PACKAGE  # a top-level module: listed with the package itself
        sections.setdefault(top, []).append({module: f"{API_DIR}/{module}.md"})
    for title, items in sections.items():
        nav.append({title: items})
    return nav


def _expand_nav(nav: list[object]) -> list[object]:
    out: list[object] = []
    for item in nav:
        if isinstance(item, dict):
            ((title, value),) = item.items()
            if value == f"{COMMANDS_DIR}/index.md":
                pages = [{"Overview": value}]
                pages += [{c: f"{COMMANDS_DIR}/{c}.md"} for c, _ in commands()]
                item = {title: pages}
            elif value == f"{API_DIR}/index.md":
                item = {title: _api_nav()}
            elif isinstance(value, list):
                item = {title: _expand_nav(value)}
        out.append(item)
    return out


# MkDocs event hooks ---------------------------------------------------------

_pages: dict[str, str] = {}


def on_config(config):  # type: ignore[no-untyped-def]
    _pages.clear()
    _pages.update(generated_pages())
    if config.nav:
        config.nav = _expand_nav(config.nav)
    return config


def on_files(files, config):  # type: ignore[no-untyped-def]
    from mkdocs.structure.files import File

    for path, content in _pages.items():
        files.append(File.generated(config, path, content=content))
    return files
