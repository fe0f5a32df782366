"""The perf.data input options every decoding command shares, and opening
a :class:`~hwtrace.session.PerfSession` from them with errors and notes
said on stderr, as the command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from ..session import PerfSession, SessionError
from ..session.perfflow import PerfBlocks, PerfStream
from .common import input_dir, open_saying


def add_input_options(p: argparse.ArgumentParser) -> None:
    """``-i``, ``--symfs``, ``--kcore``, ``--vmlinux``, ``--kallsyms``,
    ``--call`` and ``--all``."""
    p.add_argument("-i", "--input", default="perf.data", help="input file (perf.data)")
    p.add_argument("--symfs", type=input_dir, help="look for binaries under this directory")
    p.add_argument(
        "--kcore",
        metavar="DIR",
        help="kernel code from a perf --kcore directory (kcore, kallsyms); "
        "a perf.data directory's own kcore_dir is used by default",
    )
    p.add_argument("--vmlinux", metavar="FILE", help="kernel code and symbols from a vmlinux")
    p.add_argument("--kallsyms", metavar="FILE", help="kernel symbols from a kallsyms copy")
    p.add_argument(
        "--call",
        action="append",
        default=[],
        metavar="FUNCTION",
        help="only each call of this function with everything it runs until it returns "
        "(repeatable; module!name too)",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="everything the trace holds, even if it was recorded for --call",
    )


def open_session(prog: str, a: argparse.Namespace) -> PerfSession | None:
    """The session of ``a``'s input options (None: a bad input, said on
    stderr)."""

    def open_() -> PerfSession:
        return PerfSession.open(
            a.input, symfs=a.symfs, kcore=a.kcore, vmlinux=a.vmlinux, kallsyms=a.kallsyms,
            calls=a.call, all_calls=a.all,
        )  # fmt: skip

    return open_saying(prog, open_, SessionError)


def warn_missing_calls(prog: str, flow: PerfStream) -> PerfStream:
    """Say which ``--call`` functions the decoded code lacks."""
    for name in flow.missing_calls:
        sys.stderr.write(f"{prog}: warning: --call {name}: no such function in the decoded code\n")
    return flow


def decode_session(
    prog: str,
    session: PerfSession,
    on_blocks: Callable[[PerfBlocks], None],
    batch_rows: int | None = None,
    runs: bool = True,
    window_bytes: int | None = None,
    deferred: bool = False,
) -> PerfStream:
    """:meth:`PerfSession.decode`, with the ``--call`` functions not found said."""
    flow = session.decode(on_blocks, batch_rows=batch_rows, runs=runs, window_bytes=window_bytes,
                          deferred=deferred)  # fmt: skip
    return warn_missing_calls(prog, flow)
