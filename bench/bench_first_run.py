"""A user's first run: ``make demo`` from a fresh clone, set-up included.

Clones this checkout (its committed state) into a temporary directory and
runs ``make demo`` there with an empty cache directory (``XDG_CACHE_HOME``),
so that everything is paid for as on a new machine: the virtual
environment, the dependencies (from pip's own cache, as a second install
would), numba's compilation of the loops the demo's commands call, the
native library, then the demo (record, report, script).  Prints the wall
time of each step of the make log and the whole, against the goal of two
minutes.

    python bench/bench_first_run.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

REPO = Path(__file__).resolve().parent.parent
GOAL = 120.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", metavar="DIR", help="clone into DIR and keep it")
    args = parser.parse_args(argv)
    if shutil.which("make") is None or shutil.which("git") is None:
        print("needs make and git")
        return 2
    top = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="hwtrace-first-run-"))
    clone, cache = top / "clone", top / "cache"
    shutil.rmtree(clone, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    env.pop("HWTRACE_CACHE_DIR", None)
    env.pop("NUMBA_CACHE_DIR", None)
    steps: list[tuple[str, float]] = []
    t0 = last = time.perf_counter()
    proc = subprocess.Popen(["make", "demo"], cwd=clone, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    assert proc.stdout is not None
    command = "(start)"
    for line in proc.stdout:
        # make echoes each command before running it: a step ends where the next begins
        if line.startswith((".venv/", "python3 ", "gcc ", "mkdir ", "touch ")) or "-m venv" in line:
            now = time.perf_counter()
            steps.append((command, now - last))
            command, last = line.strip()[:70], now
    status = proc.wait()
    total = time.perf_counter() - t0
    steps.append((command, time.perf_counter() - last))
    common.print_table(
        "make demo from a fresh clone, empty caches (wall clock)",
        ("step", "seconds"),
        [(name, f"{sec:.1f}") for name, sec in steps if name != "(start)"]
        + [("total", f"{total:.1f}"), ("goal", f"< {GOAL:.0f}")],
        width=100,
    )
    if not args.keep:
        shutil.rmtree(top, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
