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


def print_table(title: str, headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A table with the first column left-aligned and numbers right-aligned."""
    table = Table(title=title)
    table.add_column(headers[0])
    for h in headers[1:]:
        table.add_column(h, justify="right")
    for r in rows:
        table.add_row(*r)
    Console().print(table)
