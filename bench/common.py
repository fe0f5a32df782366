"""What the benchmarks share: the libipt oracle and the result table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent


def load_oracle() -> ModuleType:
    """Import tests/libipt_oracle.py by path (tests/ is not a package)."""
    path = REPO / "tests" / "libipt_oracle.py"
    spec = importlib.util.spec_from_file_location("libipt_oracle", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def print_table(
    title: str,
    headers: tuple[str, ...],
    rows: list[tuple[str, ...]],
    *,
    width: int | None = None,
    title_justify: str = "center",
) -> None:
    """A table with the first column left-aligned and numbers right-aligned.
    ``width``: the columns to use when not writing to a terminal (wide tables
    would otherwise be squeezed into 80 columns of ellipses in a pipe)."""
    table = Table(title=title, title_justify=title_justify)  # type: ignore[arg-type]
    table.add_column(headers[0])
    for h in headers[1:]:
        table.add_column(h, justify="right")
    for r in rows:
        table.add_row(*r)
    console = Console()
    if width is not None and not console.is_terminal:
        console = Console(width=width)
    console.print(table)
