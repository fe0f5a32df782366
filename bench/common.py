"""What the benchmarks share: the libipt oracle and the result table."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

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


def apt_install(packages: list[str], missing: str) -> None:
    """``apt-get install`` Debian ``packages`` (without recommends), as root
    where apt exists, running ``apt-get update`` once if the first attempt
    fails; BenchError naming ``missing`` and the packages otherwise."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise BenchError(
            f"missing {missing}; install {' '.join(packages)} "
            "(the benchmark installs them itself only as root with apt-get)"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    print(f"installing: {' '.join(cmd)}", flush=True)
    if subprocess.run(cmd, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=False)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BenchError(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-300:]}")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), for the results."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def lttng(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    # --no-sessiond: never let the CLI spawn a daemon this benchmark does not track.
    return run(["lttng", "--no-sessiond", *args], check=check)


def sessiond_running() -> bool:
    return lttng("list", check=False).returncode == 0


@contextlib.contextmanager
def session_daemon(log: Path) -> Iterator[dict[str, Any]]:
    """A session daemon for the benchmark: the one already running, left
    alone, or one started here (by pid, not daemonized, so exactly that
    process is stopped at the end)."""
    info: dict[str, Any] = {"started_by_benchmark": False, "pid": None}
    if sessiond_running():
        yield info
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as logf:
        proc = subprocess.Popen(
            ["lttng-sessiond", "--no-kernel"],
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C here is handled by the cleanup below
        )
    info.update(started_by_benchmark=True, pid=proc.pid)
    try:
        deadline = time.monotonic() + 15
        while not sessiond_running():
            if proc.poll() is not None:
                raise BenchError(f"lttng-sessiond exited with {proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise BenchError(f"lttng-sessiond did not answer within 15 s; see {log}")
            time.sleep(0.05)
        yield info
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # it stops its consumer daemons itself
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        info["exit_status"] = proc.returncode


def close_fds_under(directory: Path) -> None:
    """Close this process's descriptors of files under ``directory``: one
    left open by an interrupt between open() and close() keeps a tracefs
    instance busy (rmdir fails with EBUSY)."""
    prefix = f"{directory}/"
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith(prefix):
                os.close(int(name))
        except OSError:
            pass


def bench_main(name: str, run, *, interrupted: str, cleanup=None) -> int:
    """Run a benchmark's ``run()``: SIGTERM and SIGHUP unwind like ^C, so
    what it set up is taken down; a BenchError is one line; ``cleanup()``
    runs however it ends."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    try:
        return run()
    except BenchError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted ({interrupted})", file=sys.stderr)
        return 130
    finally:
        if cleanup is not None:
            cleanup()
