"""`hwtrace filter-compile`: a filter as an object or shared library that C
code links, with the header describing the records."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from hwtrace.cli.main import main
from hwtrace.filter.packing import EventRecord
from hwtrace.filter.sources import schema_from_mapping

needs_cc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
FIELDS = {"var0": "string", "name": "char[8]", "lyf": "s64"}
EXPR = 'var0 == "str*" && name == "abc" && lyf == 42'


def _schema_file(tmp_path: Path) -> Path:
    spec = tmp_path / "tp.json"
    spec.write_text(json.dumps({"name": "tpfilt", "fields": FIELDS}))
    return spec


@needs_cc
def test_shared_library_is_callable(tmp_path, capsys):
    so = tmp_path / "libf.so"
    assert (
        main(
            [
                "filter-compile",
                EXPR,
                "--schema",
                str(_schema_file(tmp_path)),
                "-o",
                str(so),
                "--name",
                "tp_filter",
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().err
    fn = ctypes.CDLL(str(so)).tp_filter
    fn.restype, fn.argtypes = ctypes.c_int64, [ctypes.c_void_p, ctypes.c_void_p]
    schema = schema_from_mapping("tpfilt", FIELDS)
    yes = EventRecord(schema, {"var0": b"str0", "name": b"abc", "lyf": 42})
    no = EventRecord(schema, {"var0": b"st", "name": b"abc", "lyf": 42})
    assert fn(yes.address, None) == 1 and fn(no.address, None) == 0


@needs_cc
def test_object_links_into_a_c_tracer(tmp_path):
    obj, header = tmp_path / "f.o", tmp_path / "f.h"
    assert (
        main(
            [
                "filter-compile",
                EXPR,
                "--schema",
                str(_schema_file(tmp_path)),
                "-o",
                str(obj),
                "--header",
                str(header),
            ]
        )
        == 0
    )
    text = header.read_text()
    assert "hwtrace_filter" in text and "lyf" in text
    prog = tmp_path / "tracer.c"
    prog.write_text(
        '#include <stdio.h>\n#include <stdint.h>\n#include <string.h>\n#include "f.h"\n'
        "struct ev { const char *var0; char name[8]; int64_t lyf; };\n"
        "int main(void) {\n"
        '  struct ev a = {"string", "abc", 42}, b = {"string", "abd", 42};\n'
        '  printf("%lld %lld\\n", (long long)hwtrace_filter(&a, 0), (long long)hwtrace_filter(&b, 0));\n'
        "  return 0;\n}\n"
    )
    exe = tmp_path / "tracer"
    subprocess.run(["gcc", "-O2", "-o", exe, prog, obj], check=True, cwd=tmp_path)
    assert subprocess.run([exe], capture_output=True, text=True, check=True).stdout.split() == [
        "1",
        "0",
    ]


def test_tracefs_event_schema(tmp_path):
    tracefs = Path("/sys/kernel/tracing/events/sched/sched_switch/format")
    if not tracefs.exists():
        pytest.skip("tracefs (sched:sched_switch) is not available")
    obj = tmp_path / "f.o"
    assert (
        main(
            [
                "filter-compile",
                'prev_comm == "bash*" && prev_pid > 1',
                "--tracefs-event",
                "sched:sched_switch",
                "-o",
                str(obj),
            ]
        )
        == 0
    )
    assert obj.read_bytes()[:4] == b"\x7fELF"
    # The option as the README spells it.
    other = tmp_path / "g.o"
    assert (
        main(
            [
                "filter-compile",
                "prev_pid > 1",
                "--tracefs-event",
                "sched:sched_switch",
                "--emit-object",
                str(other),
            ]
        )
        == 0
    )
    assert other.read_bytes()[:4] == b"\x7fELF"


def test_bad_input(tmp_path, capsys):
    spec = _schema_file(tmp_path)
    assert (
        main(["filter-compile", "var0 == ", "--schema", str(spec), "-o", str(tmp_path / "x.o")])
        == 2
    )
    err = capsys.readouterr().err
    assert "column" in err and "^" in err and "Traceback" not in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "fields": {"a": "s65"}}')
    assert (
        main(["filter-compile", "a == 1", "--schema", str(bad), "-o", str(tmp_path / "x.o")]) == 2
    )
    assert "s65" in capsys.readouterr().err
    assert (
        main(
            ["filter-compile", "a == 1", "--tracefs-event", "nocolon", "-o", str(tmp_path / "x.o")]
        )
        == 2
    )
    assert "SYSTEM:EVENT" in capsys.readouterr().err
