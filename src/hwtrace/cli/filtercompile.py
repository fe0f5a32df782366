"""``hwtrace filter-compile EXPR``: a filter as a native object for C tracers.

The LLVM tier's code is self-contained (strings compared inline, no
helpers), so it can leave the process: a relocatable object (``-o x.o``)
or a shared library (``-o x.so``) exporting ``int64_t NAME(const void
*event, const void *context)``, and a C header (``--header``) with the
record layouts it reads.  The event's layout comes from a tracefs event
(``--tracefs-event SYS:EVENT``), a tracefs ``format`` file or a JSON
mapping (``--schema FILE``: ``{"name": ..., "fields": {"field": "type"}}``,
see :func:`hwtrace.filter.sources.schema_from_mapping`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ..filter.errors import FilterError
from ..filter.schema import Schema
from .common import command_parser, output_file

PROG = "hwtrace filter-compile"


def _schema(a: argparse.Namespace) -> Schema:
    from ..filter import sources

    if a.tracefs_event:
        system, _, event = a.tracefs_event.partition(":")
        if not event:
            raise FilterError(f"--tracefs-event {a.tracefs_event}: expected SYSTEM:EVENT")
        return sources.tracefs_schema(system, event, a.tracefs or "/sys/kernel/tracing")
    path = Path(a.schema)
    try:
        text = path.read_text()
    except OSError as e:
        raise FilterError(f"{path}: {e.strerror or e}") from None
    if text.lstrip().startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as e:
            raise FilterError(f"{path}: line {e.lineno} column {e.colno}: {e.msg}") from None
        if not isinstance(spec, dict) or not isinstance(spec.get("fields"), dict):
            raise FilterError(f'{path}: expected {{"name": ..., "fields": {{...}}}}')
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["fields"].items()}
        return sources.schema_from_mapping(str(spec.get("name", path.stem)), fields)
    return sources.schema_from_tracefs(text, path.stem)


def main(argv: Sequence[str]) -> int:
    """Compile an LTTng filter expression to a native object or shared library (LLVM tier) that a
    C tracer links."""
    p = command_parser(PROG, main)
    p.add_argument("expression", metavar="EXPR")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--tracefs-event", metavar="SYS:EVENT", help="the event's tracefs format")
    src.add_argument("--schema", metavar="FILE", help="a tracefs format file or a JSON mapping")
    p.add_argument(
        "--tracefs", metavar="DIR", help="tracefs directory (default /sys/kernel/tracing)"
    )
    p.add_argument(
        "-o",
        "--output",
        "--emit-object",
        dest="output",
        required=True,
        type=output_file,
        metavar="FILE",
        help="x.o (relocatable object) or x.so (shared library)",
    )
    p.add_argument("--header", type=output_file, metavar="FILE", help="write the C header here")
    p.add_argument("--name", default="hwtrace_filter", help="the function's symbol")
    p.add_argument("--portable", action="store_true", help="generic x86-64, not this CPU")
    a = p.parse_args(list(argv))
    from ..filter.check import compile_check
    from ..filter.llvm import compile_llvm

    try:
        schema = _schema(a)
        tree = compile_check(a.expression, schema)
        fn = compile_llvm(tree, name=a.name, event_schema=schema)
        out = Path(a.output)
        if out.suffix == ".so":
            fn.emit_shared(out, portable=a.portable)
        else:
            fn.emit_object(out, portable=a.portable)
        if a.header:
            Path(a.header).write_text(fn.c_header())
    except FilterError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 2
    except OSError as e:
        sys.stderr.write(f"{PROG}: {e.filename or a.output}: {e.strerror or e}\n")
        return 1
    sys.stderr.write(
        f"{PROG}: wrote {out} ({a.name}: {fn.code_bytes} bytes of code)"
        + (f" and {a.header}" if a.header else "")
        + "\n"
    )
    return 0
