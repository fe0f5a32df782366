"""Reading back the datasets :mod:`hwtrace.export.parquet` writes (``hwtrace
decode``), with DuckDB.

The datasets are views (``blocks``, ``events``, ``gaps``, ``symbols``,
``images``, ``comms`` and, when decoded with ``--instructions``,
``instructions``) over their Parquet files, ``blocks`` and
``instructions`` with Hive partitioning (DuckDB reads only the ``cpu=`` and
``bucket=`` directories a filter on those columns leaves).  Ready-made
views answer the usual questions (:data:`READY_VIEWS`); ``hwtrace query``
runs SQL over them and ``hwtrace report -i DIR`` is built on them
(:func:`dataset_profile`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..analysis.profile import Profile


class DatasetError(ValueError):
    """A directory that is not a readable dataset; the message says why."""


#: name -> (SQL, what it holds); created in this order
READY_VIEWS: dict[str, tuple[str, str]] = {
    "thread_functions": (
        """SELECT b.tid, coalesce(s.function, '[unknown]') AS function,
                  sum(b.instructions) AS instructions, sum(b.duration) AS time_ns,
                  count(*) AS blocks
           FROM blocks b LEFT JOIN symbols s ON b.symbol = s.id
           GROUP BY ALL""",
        "instructions, time (ns) and blocks per thread and function (module!name, as "
        "hwtrace report counts them: a block is its first instruction's function's)",
    ),
    "functions": (
        """SELECT function, sum(instructions) AS instructions, sum(time_ns) AS time_ns,
                  sum(blocks) AS blocks, count(*) AS threads
           FROM thread_functions GROUP BY function""",
        "instructions, time (ns), blocks and threads per function, all threads together",
    ),
    "threads": (
        """SELECT b.tid,
                  arg_min(b.pid, (coalesce(b.time, -1), b.queue, b.row)) AS pid,
                  any_value(c.comm) AS comm,
                  sum(b.instructions) AS instructions, sum(b.duration) AS time_ns,
                  coalesce(max(b.time) - min(b.time), 0) AS span_ns,
                  min(b.time) AS first_ns, max(b.time) AS last_ns,
                  count(*) AS blocks, count(*) FILTER (WHERE b.gap) AS gaps_before
           FROM blocks b LEFT JOIN comms c ON b.tid = c.tid
           GROUP BY b.tid""",
        "per thread: its process (that of its earliest block), command, instructions, time "
        "(ns), first to last block (ns), blocks and blocks after a gap",
    ),
    "entries": (
        """SELECT b.tid, s.function, count(*) AS entries, sum(b.instructions) AS entry_insns
           FROM blocks b JOIN symbols s ON b.symbol = s.id
           WHERE b.ip = s.start
           GROUP BY ALL""",
        "entries per thread and function: blocks that begin at a function's first "
        "instruction (its calls, with tail calls and jumps back to its start), and those "
        "blocks' instructions",
    ),
    "calls": (
        """SELECT tid, function, count(*) AS calls, sum(instructions) AS instructions,
                  sum(duration) AS time_ns, min(instructions) AS min_insns,
                  max(instructions) AS max_insns
           FROM function_calls GROUP BY ALL""",
        "calls per thread and function (decoded with --function-calls): each call's "
        "instructions are its entry through its return, both counted, as funclatency counts "
        "them; time in ns",
    ),
    "gap_summary": (
        """SELECT g.queue, g.cpu, g.queue_tid, g.reason, count(*) AS gaps,
                  min(g.trace_offset) AS first_offset, max(g.trace_offset) AS last_offset
           FROM gaps g GROUP BY ALL""",
        "gaps per queue and reason, with the first and last trace offset",
    ),
}

TABLES = {
    "blocks": "a decoded block per row (cpu and bucket: partition columns)",
    "instructions": "an instruction per row (with --instructions)",
    "events": "PTWRITE payloads at their place (row: the block each follows)",
    "gaps": "where the trace could not be decoded",
    "symbols": "id, name, module, function (module!name), start, size, image",
    "images": "id, path, build_id",
    "comms": "tid, pid, comm",
    "function_calls": "a function call per row (with --function-calls): tid, cpu, entry, "
    "function, time, duration, instructions (entry through return)",
}


#: the tables (and the views over them) only some decodes write, and the
#: ``hwtrace decode`` option that writes them
WRITTEN_WITH = {
    "instructions": "--instructions",
    "function_calls": "--function-calls",
    "calls": "--function-calls",
}


#: the dataset format a decode directory's ``_meta.json`` names
FORMAT = "hwtrace-flow/1"


def read_meta(directory: str | os.PathLike[str]) -> dict[str, object]:
    """A flow directory's ``_meta.json`` (ValueError: not one, or unfinished)."""
    path = Path(directory) / "_meta.json"
    try:
        meta = json.loads(path.read_text())
    except NotADirectoryError:
        raise ValueError(
            f"{directory}: not an hwtrace decode directory (a file: give the directory "
            "`hwtrace decode -o` wrote)"
        ) from None
    except FileNotFoundError:
        raise ValueError(
            f"{directory}: not an hwtrace decode directory (no _meta.json; "
            "an unfinished decode leaves none)"
        ) from None
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not an {FORMAT} directory")
    return meta


def _literal(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def connect(directory: str | Path):
    """A DuckDB connection with the views of a decode directory, and the
    directory's ``_meta.json`` (ValueError: not one)."""
    import duckdb

    root = Path(directory)
    meta = read_meta(root)
    con = duckdb.connect()
    for name in TABLES:
        d = root / name
        if not d.is_dir():
            continue
        if name in ("blocks", "instructions"):
            src = (f"read_parquet({_literal(d / '*' / '*' / '*.parquet')}, hive_partitioning=true, "
                   "hive_types={'cpu': INTEGER, 'bucket': BIGINT})")  # fmt: skip
        else:
            src = f"read_parquet({_literal(d / '*.parquet')})"
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM {src}")
    for name, (sql, _) in READY_VIEWS.items():
        try:
            con.execute(f"CREATE VIEW {name} AS {sql}")
        except duckdb.CatalogException:
            continue  # a table it reads is not there (calls: decoded without --function-calls)
    return con, meta


def dataset_profile(directory: str | Path) -> tuple[str, int, Profile, list[str], list[tuple]]:
    """What ``hwtrace report`` prints, from a decode directory: (input path,
    number of queues, :class:`~hwtrace.analysis.profile.Profile`, problems,
    gaps as (offset, ip, reason)).  Raises :class:`DatasetError` (one line)
    when ``directory`` is not a readable dataset."""
    import duckdb

    # (the profile's classes bring the perf.data session: not for hwtrace query)
    from ..analysis.profile import Profile, ThreadProfile

    try:
        con, meta = connect(directory)
        # Functions in the order hwtrace report numbers them: by where it
        # first met each (queue, address space, symbol index).
        names = [r[0] for r in con.execute(
            """SELECT function FROM symbols GROUP BY function
               ORDER BY min((first_queue, first_space, first_index))""").fetchall()]  # fmt: skip
        index = {n: k + 1 for k, n in enumerate(names)}
        per = con.execute(
            "SELECT tid, function, instructions, time_ns FROM thread_functions"
        ).fetchall()
        threads = con.execute(
            "SELECT t.tid, t.pid, coalesce(t.comm, ':' || t.tid::VARCHAR), t.instructions, "
            "t.span_ns FROM threads t ORDER BY t.tid"
        ).fetchall()
        total = con.execute("SELECT coalesce(sum(instructions), 0) FROM blocks").fetchone()[0]
        gaps = con.execute(
            "SELECT trace_offset, ip, reason FROM gaps ORDER BY queue, seq"
        ).fetchall()
    except (ValueError, duckdb.Error) as e:
        lines = [line for line in str(e).splitlines() if line.strip()]
        raise DatasetError(f"{directory}: {lines[0] if lines else e}") from None
    import numpy as np

    by_insn = {t[0]: np.zeros(len(names) + 1) for t in threads}
    by_time = {t[0]: np.zeros(len(names) + 1) for t in threads}
    for tid, function, insn, t in per:
        k = 0 if function == "[unknown]" else index[function]
        by_insn[tid][k] += insn
        by_time[tid][k] += t
    profile = Profile(
        [
            ThreadProfile(tid, pid, comm, int(insn), int(span), by_insn[tid], by_time[tid], names)
            for tid, pid, comm, insn, span in threads
        ],
        names,
        int(total),
    )
    source = meta.get("input", {})
    path = source.get("report_path") or source.get("path") or directory
    return path, len(meta.get("queues", [])), profile, list(meta.get("problems", [])), gaps


__all__ = [
    "FORMAT", "READY_VIEWS", "TABLES", "DatasetError", "connect", "dataset_profile", "read_meta",
]  # fmt: skip
