"""``hwtrace aot warm|build|status``: the native library of compiled loops
(:mod:`hwtrace.aot`).

``warm`` is a command-line matter: it runs ``ptdump`` and ``ptxed`` on a
small trace (:mod:`hwtrace.cli.warmup`) so that numba compiles what they
call, then builds the library.  ``build`` and ``status`` are the library's
own (``python -m hwtrace.aot build|status`` does the same without the
command line).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .. import aot


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="hwtrace aot",
        description="The native library of hwtrace's compiled loops (built from numba's code).",
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="{warm,build,status}")
    w = sub.add_parser("warm", help="compile what the commands call, then build")
    w.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="processes compiling at once (default: one per CPU)",
    )
    w.add_argument("--parts", default=None, metavar="P[,P...]",
                   help="what to warm: library (the decoder), perf (report, script), record, "
                        "ptxed, ptdump, decode (to Parquet), csdump, trace, calls (--call) "
                        "(default: all)")  # fmt: skip
    sub.add_parser("build", help="build the library from numba's cache")
    sub.add_parser("status", help="print the library in use")
    a = p.parse_args(list(argv))
    if a.action == "status":
        return aot.main(["status"])
    if a.action == "warm":
        # (imports the decoders: only for this action)
        from .warmup import PARTS, warm

        parts = tuple(a.parts.split(",")) if a.parts else PARTS
        try:
            warm(a.jobs, parts)
        except ValueError as e:
            p.error(str(e))
    return aot.main(["build"])
