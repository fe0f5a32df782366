"""``hwtrace decode``: a recording's decoded instruction flow written as
Apache Parquet datasets (:mod:`hwtrace.export.parquet`) for ``hwtrace
query``, ``hwtrace report -i DIR``, DuckDB or any Arrow reader.

A perf.data is decoded as ``hwtrace report`` decodes it (every AUX queue,
the same kernel options, cut to the recorded calls unless ``--all``),
batch by batch through :func:`hwtrace.session.perfflow.stream_perf`, or through
:func:`hwtrace.cluster.decode_distributed` on worker processes or a Dask
cluster with ``--workers`` or ``--cluster``.

A raw Intel PT trace (``--pt`` with ``--elf``/``--raw``, as ptxed takes
it) is first written as a perf.data (:func:`hwtrace.perf.wrap.wrap_raw_trace`)
beside the output directory, where distributed workers read it from the
same shared path; it is removed afterwards unless ``--perf-data`` names it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..console import NoProgress
from .common import command_parser, output_file, shown_problems
from .perfinput import add_input_options, decode_session, open_session, warn_missing_calls

PROG = "hwtrace decode"
#: hwtrace.export.parquet_file.COMPRESSIONS' names (not imported: pyarrow
#: stays out of the command's start).
COMPRESSIONS = ("zstd", "lz4", "snappy", "none")


def _parser() -> argparse.ArgumentParser:
    p = command_parser(PROG, main)
    p.add_argument("source", nargs="?", metavar="INPUT", help="the perf.data (or -i INPUT)")
    add_input_options(p)
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="the directory to write (new, or empty)")  # fmt: skip
    p.add_argument("--instructions", action="store_true",
                   help="also write one row per instruction (large)")  # fmt: skip
    p.add_argument("--function-calls", action="store_true",
                   help="also write every function call (thread, entry, time, duration and "
                   "instructions, entry through return) for the calls view; memory grows with "
                   "the calls; not with --workers/--cluster")  # fmt: skip
    p.add_argument("--compression", choices=COMPRESSIONS, default="zstd",
                   help="how the Parquet pages are compressed: zstd (default; the smallest "
                   "files), lz4 or snappy (faster, files about twice as large), none")  # fmt: skip
    p.add_argument("--bucket", type=float, default=1.0, metavar="SECONDS",
                   help="width of the time buckets blocks are partitioned by (default 1 s)")  # fmt: skip
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="decode on N local worker processes (hwtrace.cluster)")  # fmt: skip
    p.add_argument("--cluster", metavar="ADDRESS",
                   help="decode on a Dask cluster at ADDRESS (hwtrace.cluster)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    raw = p.add_argument_group("raw Intel PT input (instead of a perf.data)")
    raw.add_argument("--pt", metavar="FILE", help="a raw Intel PT trace (as ptxed --pt)")
    raw.add_argument("--elf", action="append", default=[], metavar="FILE[:BASE]",
                     help="an ELF the trace ran, its lowest segment at BASE (default: its link "
                     "addresses); repeatable")  # fmt: skip
    raw.add_argument("--raw", action="append", default=[], metavar="FILE[:FROM[-TO]]:BASE",
                     help="raw code bytes of FILE mapped at BASE (as ptxed); repeatable")  # fmt: skip
    for flag, what in (("--mtc-freq", "the MTC frequency (IA32_RTIT_CTL[17:14])"),
                       ("--nom-freq", "the nominal frequency (MSR_PLATFORM_INFO[15:8])"),
                       ("--cpuid-0x15.eax", "cpuid[0x15].eax"),
                       ("--cpuid-0x15.ebx", "cpuid[0x15].ebx")):  # fmt: skip
        raw.add_argument(flag, dest=flag[2:].replace("-", "_").replace(".", "_"),
                         type=_number, default=0, metavar="N", help=what)  # fmt: skip
    raw.add_argument("--cpu-number", type=int, default=0, metavar="N",
                     help="the CPU the trace ran on (default 0)")  # fmt: skip
    raw.add_argument("--tid", type=int, default=1, metavar="TID",
                     help="the thread (and process) the trace is named after (default 1)")  # fmt: skip
    raw.add_argument("--perf-data", type=output_file, metavar="FILE",
                     help="write the trace's perf.data here and keep it (default: beside the "
                     "output directory, removed afterwards)")  # fmt: skip
    return p


def _number(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number") from None


def main(argv: Sequence[str]) -> int:
    """Decode a perf.data's Intel PT (every queue, every CPU) into a directory of Parquet
    datasets: blocks (partitioned by cpu and time bucket), events, gaps, symbols, images; query
    it with 'hwtrace query DIR SQL' or DuckDB."""
    p = _parser()
    a = p.parse_args(list(argv))
    if a.source:
        a.input = a.source
    if not 0 < a.bucket <= 1e9:  # (NaN fails it too)
        p.error(f"--bucket {a.bucket}: a positive number of seconds, at most 1e9")
    distributed = a.workers is not None or a.cluster is not None
    if distributed and (a.kcore or a.vmlinux or a.kallsyms):
        p.error("--kcore, --vmlinux and --kallsyms are not passed to the distributed decoder; "
                "decode without --workers/--cluster")  # fmt: skip
    if distributed and a.function_calls:
        p.error("--function-calls follows each thread's calls across the whole trace; decode "
                "without --workers/--cluster")  # fmt: skip
    decode_distributed = None
    if distributed:
        try:
            from ..cluster import decode_distributed, decode_to_parquet

            decode_distributed = (decode_distributed, decode_to_parquet)
        except ImportError as e:
            sys.stderr.write(
                f"{PROG}: --workers/--cluster: hwtrace.cluster is not available ({e})\n"
            )
            return 1
    out = Path(a.output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        sys.stderr.write(f"{PROG}: {out}: exists and is not an empty directory\n")
        return 1
    if a.pt is None:
        if a.elf or a.raw or a.perf_data:
            p.error("--elf, --raw and --perf-data go with --pt")
        opened = open_session(PROG, a)
        if opened is None:
            return 1
        return _decode(a, argv, opened, decode_distributed)
    if a.source:
        p.error("--pt: give either a perf.data or a raw trace, not both")
    wrapped = Path(a.perf_data) if a.perf_data else out.parent / f".{out.name}.perf.data"
    try:
        if not _wrap(a, wrapped):
            return 1
        a.input = str(wrapped)
        opened = open_session(PROG, a)
        if opened is None:
            return 1
        return _decode(a, argv, opened, decode_distributed)
    finally:
        if not a.perf_data:
            wrapped.unlink(missing_ok=True)


def _wrap(a: argparse.Namespace, path: Path) -> bool:
    """The raw trace ``a.pt`` written as the perf.data ``path`` (False: a
    bad trace or binary, said on stderr)."""
    from ..pt.config import PtConfig
    from ..session import SessionError
    from ..session.rawtrace import RawTrace

    config = PtConfig(mtc_freq=a.mtc_freq, nom_freq=a.nom_freq, cpuid_0x15_eax=a.cpuid_0x15_eax,
                      cpuid_0x15_ebx=a.cpuid_0x15_ebx)  # fmt: skip
    try:
        trace = RawTrace.open(a.pt, elf=a.elf, raw=a.raw, config=config)
        a.wrapped = trace.as_perf_data(path, cpu=a.cpu_number, tid=a.tid)
    except SessionError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return False
    return True


def _metadata(a: argparse.Namespace, argv: Sequence[str], opened) -> dict[str, object]:
    from .. import __version__
    from ..perf.intelpt import pt_config_of

    data = opened.data
    path = Path(a.input)
    st = os.stat(path) if path.exists() else None
    config = pt_config_of(data)
    cfg = {k: v for k, v in asdict(config).items() if k not in ("cpu", "errata")}
    cfg["cpu"] = str(config.cpu) if config.cpu is not None else None
    cfg["errata"] = sorted(config.errata)
    return {
        "hwtrace_version": __version__,
        "command_line": ["hwtrace", "decode", *argv],
        "input": {
            "path": str(path.resolve()),
            "size": st.st_size if st else None,
            "mtime_ns": st.st_mtime_ns if st else None,
            "report_path": str(data.path),
        },
        "pt_config": cfg,
        "options": {k: getattr(a, k) for k in ("symfs", "kcore", "vmlinux", "kallsyms", "all")}
        | {"calls": list(opened.calls), "workers": a.workers, "cluster": a.cluster},
        "raw_input": getattr(a, "wrapped", None),
    }


def _progress(a: argparse.Namespace):
    """The decode's progress bar on stderr, when it is a terminal."""
    if a.no_progress or not sys.stderr.isatty():
        return NoProgress()
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]decode[/]"), BarColumn(), DownloadColumn(),
        TextColumn("{task.fields[rows]:,} blocks"), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True,
    )  # fmt: skip


def _decode(a: argparse.Namespace, argv: Sequence[str], opened, decode_distributed) -> int:
    from ..export.parquet import (
        BATCH_ROWS,
        WINDOW_BYTES,
        FlowParquetWriter,
        FunctionCallRows,
        Names,
        build_ids_of,
        finish_dataset,
        threads_of,
    )

    data = opened.data
    names = Names(build_ids=build_ids_of(opened.sideband))
    try:
        writer = FlowParquetWriter(a.output, _metadata(a, argv, opened), names=names,
                                   bucket_ns=int(a.bucket * 1e9),
                                   instructions=a.instructions, compression=a.compression,
                                   background=True)  # fmt: skip
    except OSError as e:
        sys.stderr.write(f"{PROG}: {a.output}: {e.strerror or e}\n")
        return 1
    aux = data.auxtrace_columns()
    total_bytes = int(np.asarray(aux["size"]).sum()) if len(aux["size"]) else 0
    progress = _progress(a)
    task = progress.add_task("decode", total=max(total_bytes, 1), rows=0)
    state = {"queue": -1, "done": 0, "bytes": 0, "rows": 0}
    tids: set[int] = set()
    calls = FunctionCallRows() if a.function_calls else None

    def on_blocks(b) -> None:
        if calls is not None:
            calls.feed(b)
        q = b.queue
        if q.index != state["queue"]:
            # Queues come one after the other: the last one's bytes are done.
            state["done"] += state["bytes"]
            state["queue"], state["bytes"] = q.index, q.trace_bytes
        writer.write_blocks(b)
        tids.update(threads_of(b))
        state["rows"] += len(b)
        progress.update(task, completed=state["done"], rows=state["rows"])

    take, missing_calls = opened.cut_to_calls(on_blocks)
    started = time.perf_counter()
    ok = False
    try:
        with progress:
            if decode_distributed is None:
                # (the batches' keys and offsets laid out in the writer's
                # thread, unless the calls are cut from them here)
                flow = decode_session(PROG, opened, on_blocks, batch_rows=BATCH_ROWS, runs=False,
                                      window_bytes=WINDOW_BYTES,
                                      deferred=calls is None)  # fmt: skip
            elif opened.calls:
                # Cut to calls: the blocks pass through the call filter here.
                flow = decode_distributed[0](str(a.input), take, workers=a.workers or 0,
                                             cluster=a.cluster, symfs=a.symfs)  # fmt: skip
                flow.missing_calls = missing_calls()
                warn_missing_calls(PROG, flow)
            else:
                # The workers write the blocks; the client counts.
                def on_piece(nbytes: int, rows: int) -> None:
                    state["done"] += nbytes
                    state["rows"] += rows
                    progress.update(task, completed=state["done"], rows=state["rows"])

                flow, seen = decode_distributed[1](str(a.input), writer, workers=a.workers or 0,
                                                   cluster=a.cluster, symfs=a.symfs,
                                                   on_piece=on_piece)  # fmt: skip
                tids.update(seen)
            progress.update(task, completed=max(total_bytes, 1))
        # (the decode's time includes writing what it decoded: the rows
        # still waiting or being written on the writer's thread)
        writer.drain()
        seconds = time.perf_counter() - started
        extra = calls.write(writer) if calls is not None else {}
        meta = finish_dataset(
            writer, flow, tids,
            {"trace_bytes": total_bytes, "decode_seconds": round(seconds, 3)} | extra,
        )  # fmt: skip
        ok = True
    finally:
        if calls is not None:
            calls.close()
        if not ok:
            writer.abort()
    for problem in shown_problems(flow.problems):
        sys.stderr.write(f"{PROG}: warning: {problem}\n")
    rows = meta["rows"]
    mb = total_bytes / 1e6
    sys.stderr.write(
        f"{PROG}: {a.output}: {rows['blocks']:,} blocks ({writer.n_insn:,} instructions), "
        f"{rows['events']:,} events, {flow.n_gaps} gap(s), {rows['symbols']:,} symbols from "
        f"{len(flow.queues)} queue(s), {mb:,.1f} MB of trace in {seconds:.2f} s "
        f"({mb / max(seconds, 1e-9):,.1f} MB/s, {rows['blocks'] / max(seconds, 1e-9):,.0f} "
        "blocks/s)\n"
    )
    return 0
