"""Soak: the patch recorder against the ptrace stepper on every test program.

``make test`` steps three of the programs of ``tests/record/patch_programs.py``
(stepping runs ~40 k instructions a second here); this runs all six (0.4-2.9
M instructions each, 30-130 s of stepping) and checks that every thread's
decoded flow equals the stepper's log, instruction for instruction, with
return compression on and off; then, with only chosen functions traced
(``-f``: an address filter) and only chosen calls (``--call``), each
program's flow against the stepper's with the same functions.

    python bench/soak_patch_vs_step.py [NAME ...]   (python3: the real program)
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "record"))

from patch_programs import PROGRAM_NAMES, build_program  # noqa: E402
from test_record_patch import ADDR_NO_RANDOMIZE, decoded, stepped  # noqa: E402

from hwtrace.record import record_software  # noqa: E402
from hwtrace.record.patch import PatchOptions, record_patched  # noqa: E402

# Functions traced alone (the stepper notices a range entered at its start
# or where a call it saw leave returns; not where a longjmp or a second
# return of setjmp lands, which the patch backend, like Intel PT, traces:
# longjmp's functions are left out).
RANGED = {
    "threads": ("worker", "fib", "sieve"),
    "recursion": ("deep", "even_walk", "odd_walk", "dispatch", "tree", "add_five"),
    "signals": ("mix", "raise_from", "on_alarm", "on_usr1", "on_usr2"),
    "dlopen": ("main", "square_plus"),
}


def same(got: dict[int, np.ndarray], want: dict[int, np.ndarray]) -> str:
    if len(got) != len(want):
        return f"{len(got)} threads, the stepper {len(want)}"
    counts = []
    for (_, g), (_, w) in zip(sorted(got.items()), sorted(want.items()), strict=True):
        n = min(len(g), len(w))
        first = np.flatnonzero(g[:n] != w[:n])
        if first.size or len(g) != len(w):
            where = int(first[0]) if first.size else n
            return f"differs at instruction {where} of {len(g)} (stepper: {len(w)})"
        counts.append(f"{len(g):,}")
    return "equal: " + " / ".join(counts)


# Calls traced with all they run (--call): C++ exceptions thrown inside
# them and caught there, or past them (an unwinder's cut is before its
# last jump, as the patch backend sees it; the stepper's a step or two
# earlier, where the stack rose: level1, level3 differ so).
CALLS = {
    "cxx_exceptions": ("_ZL12parse_numberRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",),
    "recursion": ("main",),
    "threads": ("worker",),
}


# A real program's function traced alone: the interpreter loop of Debian's
# python3, entered and left hundreds of thousands of times.
REAL = {
    "python3": (["/usr/bin/python3", "-S", "-c", "pass"], ("_PyEval_EvalFrameDefault",)),
}


def compare_filtered(argv: list[str], calls: bool, chosen: tuple[str, ...], debug: Path) -> str:
    """``argv``'s flow with the functions ``chosen`` traced (or their
    calls), against the stepper's."""
    kind = "calls" if calls else "functions"
    rec = record_patched(argv, PatchOptions(**{kind: chosen}))
    got = {tid: ins for tid, ins in decoded(rec, debug).items() if len(ins)}
    steps = record_software(argv, registers="basic", **{kind: list(chosen)})
    want = {t.tid: t.instructions for t in steps.threads if len(t.instructions)}
    return same(got, want)


def compare_chosen(name: str, debug: Path, calls: bool) -> str:
    """``name``'s flow with its RANGED functions (or CALLS calls) traced."""
    chosen = (CALLS if calls else RANGED)[name]
    return compare_filtered([str(build_program(name))], calls, chosen, debug)


def compare(name: str, noretcomp: bool, debug: Path) -> str:
    exe = build_program(name)
    # Both runs write to this process's standard output: stdio takes other
    # paths for a terminal, a pipe, a file or /dev/null.
    rec = record_patched([str(exe)], PatchOptions(noretcomp=noretcomp))
    return same(decoded(rec, debug), stepped(exe, rec))


def main() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.personality(libc.personality(0xFFFFFFFF) | ADDR_NO_RANDOMIZE)
    os.environ["LD_BIND_NOW"] = "1"
    names = sys.argv[1:] or [*PROGRAM_NAMES, *REAL]
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in [n for n in names if n in PROGRAM_NAMES]:
            for noretcomp in (False, True):
                t = time.monotonic()
                verdict = compare(name, noretcomp, Path(tmp))
                bad += not verdict.startswith("equal")
                mode = "noretcomp" if noretcomp else "retcomp"
                print(f"{name:15} {mode:9} {verdict} ({time.monotonic() - t:.0f} s)", flush=True)
        for calls, table in ((False, RANGED), (True, CALLS)):
            for name in [n for n in names if n in table]:
                t = time.monotonic()
                verdict = compare_chosen(name, Path(tmp), calls)
                bad += not verdict.startswith("equal")
                mode = "--call" if calls else "-f"
                print(f"{name:15} {mode:9} {verdict} ({time.monotonic() - t:.0f} s)", flush=True)
        for name in [n for n in names if n in REAL]:
            t = time.monotonic()
            verdict = compare_filtered(REAL[name][0], False, REAL[name][1], Path(tmp))
            bad += not verdict.startswith("equal")
            print(f"{name:15} {'-f':9} {verdict} ({time.monotonic() - t:.0f} s)", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
