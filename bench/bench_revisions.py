"""Two revisions of hwtrace on the same inputs, in one run: did a change cost speed?

A change that only moves code (new modules, folded repetitions, public names
for what was private) must leave every command as fast as it was.  This
extracts the ``src/`` tree of two git revisions (``BASE`` and ``HEAD``) into
``bench/out/rev-<commit>/``, each with its own numba cache and native loop
library (``HWTRACE_CACHE_DIR``), and times whole ``hwtrace`` processes of
both, alternately, on

* ``bench_flow.py``'s trace (122 M instructions of real compiled code):
  ``ptdump``, ``ptxed --quiet`` and the library's ``decode_trace`` with the
  block columns kept;
* a perf.data made from ``hwtrace record`` of ``examples/demo/demo.c``
  (the software backend) whose AUX trace is repeated ``--copies`` times
  (as ``bench_perf_memory.py`` builds it): ``script``, ``report``,
  ``funclatency digest`` and ``decode`` to a Parquet dataset.

Each command runs twice per revision before timing (numba compiles), the
revision's loop library is built from its numba cache, then each command
runs ``--repeat`` times per revision, the two revisions interleaved so that
a machine that slows down slows both; the table gives the best wall time
of each and HEAD/BASE.  Output goes to /dev/null; both revisions must print
the same number of lines.

    python bench/bench_revisions.py BASE [HEAD] [--repeat N] [--copies N] [--only WORD]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import bench_flow
import common
from bench_perf_memory import record_demo, repeat_aux

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out"


def extract(rev: str) -> Path:
    """The ``src/`` tree of ``rev`` under bench/out (kept between runs)."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    root = OUT / f"rev-{commit[:12]}"
    if not (root / "src" / "hwtrace").is_dir():
        root.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", commit, "src"],
            check=True, capture_output=True,
        ).stdout  # fmt: skip
        with tempfile.TemporaryFile() as f:
            f.write(archive)
            f.seek(0)
            with tarfile.open(fileobj=f) as tar:
                tar.extractall(root, filter="data")
    (root / "cache").mkdir(exist_ok=True)
    return root


def environment(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root / "src")
    env["HWTRACE_CACHE_DIR"] = str(root / "cache")
    return env


def build_library(root: Path, env: dict[str, str]) -> None:
    """The revision's native loop library, built with every specialisation
    its numba cache holds: a library call (``-c``) never builds one on its
    own, and a command's own build may predate the loops it calls."""
    module = "hwtrace.aot" if (root / "src" / "hwtrace" / "aot.py").is_file() else "hwtrace.kernels"
    subprocess.run([sys.executable, "-m", module, "build"], env=env, check=True,
                   capture_output=True)  # fmt: skip


def run_once(args: list[str], env: dict[str, str], scratch: Path) -> tuple[float, int]:
    """Wall seconds and output lines of one ``hwtrace`` process."""
    if scratch.exists():
        shutil.rmtree(scratch)
    # A command's arguments, or ["-c", code, ...]: a library call.
    cmd = (
        [sys.executable, *args]
        if args[0] == "-c"
        else [sys.executable, "-m", "hwtrace.cli.main", *args]
    )
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(args)} failed ({env['PYTHONPATH']}):\n{proc.stderr.decode()[-2000:]}"
        )
    return seconds, proc.stdout.count(b"\n")


# The library's decoder with its block columns kept (what every analysis
# uses), as bench_decode.py runs it.
DECODE_TRACE = r"""
import json, sys
from hwtrace.image import Image
from hwtrace.pt.config import PtConfig
from hwtrace.pt.decode import decode_trace
image = Image()
image.add_elf(sys.argv[2])
result = decode_trace(open(sys.argv[1], "rb").read(), image, PtConfig(**json.loads(sys.argv[3])))
print(result.n_insn)
"""


def commands(
    workload: bench_flow.Workload, data: Path, scratch: Path
) -> list[tuple[str, list[str]]]:
    timing = workload.meta()["config"]
    clock = ["--mtc-freq", str(timing["mtc_freq"]), "--nom-freq", str(timing["nom_freq"]),
             "--cpuid-0x15.eax", str(timing["cpuid_0x15_eax"]),
             "--cpuid-0x15.ebx", str(timing["cpuid_0x15_ebx"])]  # fmt: skip
    flow = ["--pt", str(workload.trace), "--elf", str(workload.elf), *clock]
    return [
        ("ptdump flow", ["ptdump", *clock, str(workload.trace)]),
        ("ptxed --quiet flow", ["ptxed", *flow, "--quiet"]),
        (
            "decode_trace flow, kept",
            ["-c", DECODE_TRACE, str(workload.trace), str(workload.elf), json.dumps(timing)],
        ),
        ("script", ["script", "-i", str(data)]),
        ("report", ["report", "-i", str(data)]),
        ("funclatency digest", ["funclatency", "-i", str(data), "digest"]),
        ("decode to Parquet", ["decode", "-i", str(data), "-o", str(scratch)]),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the revision before (git rev)")
    parser.add_argument("head", nargs="?", default="HEAD", help="the revision after (default HEAD)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--copies", type=int, default=400, help="repetitions of the demo's trace")
    parser.add_argument("--only", metavar="WORD", help="only the commands whose name has WORD")
    args = parser.parse_args(argv)

    revisions = {"base": extract(args.base), "head": extract(args.head)}
    workload = bench_flow.prepare(False)
    OUT.mkdir(exist_ok=True)
    # The demo's binary stays beside its recording: decoding reads its code.
    demo = OUT / "revisions-demo"
    data = demo / f"demo-x{args.copies}.data"
    if not data.is_file():
        from hwtrace.perf.data import read_perf_data

        demo.mkdir(parents=True, exist_ok=True)
        repeat_aux(read_perf_data(record_demo(demo)), data, args.copies, split=1 << 16)
    scratch = OUT / "revisions-scratch"
    rows = []
    for name, cmd in commands(workload, data, scratch):
        if args.only and args.only not in name:
            continue
        best = {}
        lines = {}
        for label, root in revisions.items():
            env = environment(root)
            for _ in range(2):
                run_once(cmd, env, scratch)
            build_library(root, env)
            best[label] = float("inf")
        for i in range(args.repeat):
            order = list(revisions.items())
            if i % 2:
                order.reverse()
            for label, root in order:
                seconds, lines[label] = run_once(cmd, environment(root), scratch)
                best[label] = min(best[label], seconds)
        if name == "script" and lines["head"] < args.copies:
            raise SystemExit(f"script listed {lines['head']} lines: the demo's code is missing")
        same = (
            "yes" if lines["base"] == lines["head"] else f"no ({lines['base']} / {lines['head']})"
        )
        rows.append((name, f"{best['base']:.2f}", f"{best['head']:.2f}",
                     f"{best['head'] / best['base']:.3f}", same))  # fmt: skip
        print(f"  {name}: {rows[-1][1]} s -> {rows[-1][2]} s", flush=True)
    if scratch.exists():
        shutil.rmtree(scratch)
    title = f"{common.cpu_model()}; best of {args.repeat}; BASE {args.base}, HEAD {args.head}"
    common.print_table(
        title, ("command", "BASE s", "HEAD s", "HEAD/BASE", "same lines"), rows, width=100
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
