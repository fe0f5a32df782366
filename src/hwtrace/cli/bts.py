"""``hwtrace bts``: the branches of a perf.data recorded with Intel BTS
(``perf record -e intel_bts//``), named by the recording's binaries, and
the events at registered branch sites (Vergé et al.'s tracepoint that is
a branch the program takes anyway)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .common import command_parser, input_dir, output_file

PROG = "hwtrace bts"


def main(argv: Sequence[str]) -> int:
    """List the branches of an Intel BTS perf.data, or the events at registered branch sites."""
    p = command_parser(PROG, main)
    p.add_argument("-i", "--input", default="perf.data", help="input file (perf.data)")
    p.add_argument("--symfs", type=input_dir, help="look for binaries under this directory")
    p.add_argument("--at", action="append", default=[], metavar="SITE[=NAME]",
                   help="a branch site: an address or a function (name, module!name, "
                   "name+0xOFF); each branch from it is an event (repeatable)")  # fmt: skip
    p.add_argument("--by", choices=("source", "target"), default="source",
                   help="match the sites against the branch's source or its target")  # fmt: skip
    p.add_argument(
        "--json", type=output_file, metavar="FILE", help="write the events as JSON lines"
    )
    a = p.parse_args(list(argv))
    from ..hwevents.bts import BtsError, perf_bts
    from ..session import PerfSession, SessionError

    try:
        session = PerfSession.open(a.input, symfs=a.symfs, all_calls=True)
        queues = perf_bts(session.data)
    except (SessionError, BtsError) as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 1
    data, sb, locator = session.data, session.sideband, session.locator
    out = sys.stdout
    rows: list[dict] = []
    try:
        for key, br in queues.items():
            for problem in br.problems:
                sys.stderr.write(f"{PROG}: {a.input}: {problem}\n")
            tid = key if data_is_per_thread(data) else -1
            pid = sb.pid_of(tid) if tid >= 0 else -1
            comm = sb.comm_of(tid) if tid >= 0 else f"cpu {key}"
            symbols = _symbols(sb, pid, locator)
            if a.at:
                try:
                    sites = _sites(a.at, symbols)
                except ValueError as e:
                    sys.stderr.write(f"{PROG}: {e}\n")
                    return 2
                from ..hwevents.bts import events_at

                ids = {addr: k for k, addr in enumerate(sites)}
                hit, which = events_at(br, ids, by=a.by)
                names = list(sites.values())
                for r, w in zip(hit.tolist(), which.tolist(), strict=True):
                    rows.append({"event": names[w], "tid": tid, "comm": comm,
                                 "from": f"{int(br.source[r]):#x}", "to": f"{int(br.target[r]):#x}",
                                 "offset": int(br.offset[r])})  # fmt: skip
                continue
            src = _names(symbols, br.source)
            dst = _names(symbols, br.target)
            for s_ip, s_name, d_ip, d_name in zip(br.source.tolist(), src, br.target.tolist(), dst,
                                                  strict=True):  # fmt: skip
                out.write(f"{comm:>16} {tid:>7}  {s_ip:16x} {s_name} => {d_ip:16x} {d_name}\n")
        if a.at:
            if a.json:
                Path(a.json).write_text("".join(json.dumps(r) + "\n" for r in rows))
            counts: dict[str, int] = {}
            for r in rows:
                counts[r["event"]] = counts.get(r["event"], 0) + 1
            for r in rows:
                out.write(
                    f"{r['comm']:>16} {r['tid']:>7}  {r['event']}: {r['from']} => {r['to']}\n"
                )
            for name in sites_order(rows):
                sys.stderr.write(f"{PROG}: {name}: {counts[name]} events\n")
        out.flush()
    except BrokenPipeError:
        return 0
    return 0


def data_is_per_thread(data) -> bool:
    aux = data.auxtrace_columns()
    return bool(aux["tid"].shape[0]) and bool((aux["tid"] >= 0).all())


def sites_order(rows: list[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for r in rows:
        seen.setdefault(r["event"], None)
    return list(seen)


def _symbols(sb, pid: int, locator):
    """The symbols of the process's mappings (None: unknown process)."""
    space = sb.space_at(pid, 1 << 62) if pid >= 0 else None
    if space is None:
        return None
    _, table = space.image(locator)
    return table


def _names(symbols, addresses: np.ndarray) -> list[str]:
    """``name+0xoff (module)`` per address, ``[unknown]`` where no symbol
    covers it (as perf script prints them)."""
    if symbols is None or not len(symbols):
        return ["[unknown]"] * addresses.shape[0]
    index, offset = symbols.lookup(addresses)
    uniq, inverse = np.unique(
        np.stack([index, offset.astype(np.int64)]), axis=1, return_inverse=True
    )
    text = []
    for i, off in uniq.T.tolist():
        if i < 0:
            text.append("[unknown]")
            continue
        name = symbols.name(i) + (f"+{off:#x}" if off else "")
        text.append(f"{name} ({symbols.module_name(i)})")
    return [text[k] for k in inverse.reshape(-1).tolist()]


def _sites(specs: list[str], symbols) -> dict[int, str]:
    out: dict[int, str] = {}
    for spec in specs:
        where, _, name = spec.partition("=")
        try:
            addr = int(where, 0)
        except ValueError:
            func, plus, off = where.partition("+")
            entries = symbols.function_entries(func) if symbols is not None else np.zeros(0)
            if not len(entries):
                raise ValueError(
                    f"--at {spec}: no function {func!r} in the recording's binaries"
                ) from None
            from ..image.symbols import address_number

            try:
                delta = address_number(off) if plus else 0
            except ValueError:
                raise ValueError(f"--at {spec}: offset {off!r} is not a number") from None
            addr = int(entries[0]) + delta
        out[addr] = name or where
    return out
