"""``hwtrace perf-dump``: print a perf.data's header and records, like ``perf report -D``.

One line per record: ``offset [size]: NAME`` followed by its decoded body
(kernel records through hwtrace.perf.records, perf's own through
hwtrace.perf.user; SAMPLEs from the decoded sample columns).  Damage is
reported with file offsets; the exit status is 1 when any was found.
The records a COMPRESSED record holds (``perf record -z``) follow it, at
its offset, as ``perf report -D`` shows them.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from ..perf.data import PerfDataError, read_perf_data
from ..perf.features import feature_lines
from ..perf.records import RecordType, fields_text


def _name(t: int) -> str:
    try:
        return RecordType(t).name
    except ValueError:
        return f"UNKNOWN({t})"


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # output cut short (| head): not an error
        sys.stderr.close()
        return 0


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(prog="hwtrace perf-dump", description=__doc__.split("\n")[0])
    ap.add_argument("file", help="perf.data file ('-' for a pipe on stdin)")
    ap.add_argument("--header-only", action="store_true", help="print the header and features only")
    ap.add_argument(
        "--type", action="append", default=[], help="only records of this type (name or number)"
    )
    args = ap.parse_args(argv)
    try:
        d = read_perf_data(args.file)
    except PerfDataError as e:
        sys.stderr.write(f"hwtrace perf-dump: {e}\n")
        return 1
    out = sys.stdout
    h = d.header
    out.write(f"# {'pipe' if d.pipe else 'file'} mode, {len(d)} records\n")
    if not d.pipe:
        out.write(f"# data offset {h.data_offset:#x} size {h.data_size:#x}\n")
    for k, ea in enumerate(d.attrs):
        a = ea.attr
        out.write(
            f"# event {k}: {ea.name or '?'} type={a.type} config={a.config:#x} "
            f"sample_type={a.sample_type:#x} read_format={a.read_format:#x} "
            f"ids={list(ea.ids)} flags={','.join(a.flag_names)}\n"
        )
    for f, v in d.features.items():
        for line in feature_lines(f, v):
            out.write(f"# {line}\n")
    if args.header_only:
        return _errors(d)
    wanted = set()
    for t in args.type:
        wanted.add(int(t) if t.isdigit() else RecordType[t.upper()].value)
    r = d.records
    rows = np.arange(len(d)) if not wanted else np.flatnonzero(np.isin(r["type"], list(wanted)))
    s = d.samples()
    sample_row = {int(x): i for i, x in enumerate(s.record.tolist())}
    for i in rows.tolist():
        t = int(r["type"][i])
        line = f"{d.file_offset(i):#x} [{int(r['size'][i]):#x}]: {_name(t)}"
        if r["time"][i] >= 0:
            line += f" time={int(r['time'][i])}"
        try:
            if t == RecordType.SAMPLE and i in sample_row:
                j = sample_row[i]
                line += " " + " ".join(f"{c}={int(s[c][j]):#x}" for c in s.columns)
            elif t < 64:
                line += f" {fields_text(d.record(i).body)}"
            elif 64 <= t <= 82:
                v = d.user_record(i)
                if v is not None:
                    text = fields_text(v)
                    line += f" {text[:300]}{'...' if len(text) > 300 else ''}"
        except PerfDataError as e:
            line += f" <{e.message}>"
        out.write(line + "\n")
    return _errors(d)


def _errors(d) -> int:
    for e in d.errors:
        sys.stderr.write(f"hwtrace perf-dump: {e}\n")
    return 1 if d.errors else 0
