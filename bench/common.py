"""What the benchmarks share: the libipt oracle and the result table."""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
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


def run_process(cmd: list[str]) -> tuple[float, int, int]:
    """Run ``cmd`` with its output to /dev/null: wall seconds, peak resident
    memory in bytes and exit status.  The memory is GNU time's ``%M`` where
    it is installed: a child forked from this (large) process would count
    this process's pages in its own ru_maxrss until it execs."""
    gnu_time = shutil.which("time", path="/usr/bin:/bin")
    with tempfile.NamedTemporaryFile("r") as report:
        wrapped = [gnu_time, "-q", "-f", "%M", "-o", report.name, *cmd] if gnu_time else cmd
        t0 = time.perf_counter()
        proc = subprocess.Popen(wrapped, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        peak = usage.ru_maxrss * 1024
        if gnu_time:
            lines = report.read().split()
            peak = int(lines[-1]) * 1024 if lines else peak
    return seconds, peak, proc.returncode


def tiled(path: Path, gib: int, out: Path) -> Path:
    """``path`` repeated to ``gib`` GiB in ``out`` (a real stream, many times)."""
    big = out / f"tiled-{gib}G-{path.stem}.pt"
    chunk = path.read_bytes()
    with open(big, "wb") as f:
        while f.tell() < gib << 30:
            f.write(chunk)
    return big


class BenchError(Exception):
    """A failure a benchmark reports in one line (no traceback)."""


def run(cmd: list[str], *, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
    """Run a tool, its output captured; BenchError with its last lines if it fails."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise BenchError(f"{cmd[0]}: not found") from None
    except subprocess.TimeoutExpired:
        raise BenchError(f"{' '.join(cmd)}: no answer within {timeout:g} s") from None
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise BenchError(f"{' '.join(cmd)}: exit {proc.returncode}: {' / '.join(msg[-3:])}")
    return proc


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), for the results."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
