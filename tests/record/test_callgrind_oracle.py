"""The callgrind oracle (tests/record/callgrind.py) checked against what
can be counted without it: the Callgrind Format Specification's example,
instruction counts read from objdump's disassembly times known call
counts, and the native runs of the patch recorder's test programs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from callgrind import callgrind_self_ir, parse_callgrind_out, skip_reason
from patch_programs import PROGRAM_NAMES, build_dlopen_library, build_program, expected_output
from test_record_software import compile_program

needs_callgrind = pytest.mark.skipif(
    shutil.which("gcc") is None or shutil.which("objdump") is None or skip_reason() is not None,
    reason=str(skip_reason() or "no gcc or objdump on PATH"),
)

# The Callgrind Format Specification's "Extended Example": main calls func1
# once and func2 three times, func1 calls func2 twice; main's self cost is
# 20, func1's 100, func2's 700 (the call lines' 400, 400 and 300 are
# inclusive).
SPEC_EXAMPLE = """# callgrind format
events: Instructions

fl=file1.c
fn=main
16 20
cfn=func1
calls=1 50
16 400
cfi=file2.c
cfn=func2
calls=3 20
16 400

fn=func1
51 100
cfi=file2.c
cfn=func2
calls=2 20
51 300

fl=file2.c
fn=func2
20 700
"""

# The same with name compression and relative positions, and an object.
SPEC_EXAMPLE_COMPRESSED = """# callgrind format
version: 1
positions: line
events: Ir
summary: 820

ob=(1) /lib/a.so
fl=(1) file1.c
fn=(1) main
16 20
cfn=(2) func1
calls=1 50
* 400
cfi=(2) file2.c
cfn=(3) func2
calls=3 20
+0 400

fn=(2)
51 100
cob=(2) /lib/b.so
cfi=(2)
cfn=(3)
calls=2 20
* 300

ob=(2)
fl=(2)
fn=(3)
20 700

totals: 820
"""


def test_calls_lines_inclusive_costs_are_not_self_costs():
    for text, ob in ((SPEC_EXAMPLE, "???"), (SPEC_EXAMPLE_COMPRESSED, "/lib/a.so")):
        profile = parse_callgrind_out(text)
        by_name = {fn: v for (_, fn), v in profile.self_ir.items()}
        assert by_name == {"main": 20, "func1": 100, "func2": 700}
        assert profile.self_ir[(ob, "main")] == 20
        assert profile.call_count("main", "func1") == 1
        assert profile.call_count("main", "func2") == 3
        assert profile.call_count("func1", "func2") == 2
    compressed = parse_callgrind_out(SPEC_EXAMPLE_COMPRESSED)
    assert compressed.totals == compressed.summary == sum(compressed.self_ir.values())
    # cob= names the next call's object only; the object of func2's code
    # is the ob= before its fn=.
    assert compressed.self_ir[("/lib/b.so", "func2")] == 700
    calls = compressed.calls
    assert calls[(("/lib/a.so", "main"), ("/lib/a.so", "func2"))] == 3
    assert calls[(("/lib/a.so", "func1"), ("/lib/b.so", "func2"))] == 2


# leaf and via_plt are straight-line code (no branch but ret and the call):
# their instructions per call are their disassembly's lines.
COUNTED = r"""
#include <stdio.h>
#include <stdlib.h>
#define NOINLINE __attribute__((noinline))
NOINLINE long leaf(long x) { return (x * 3 + 1) ^ (x >> 2); }
/* rand_r is no builtin: a call through the PLT. */
NOINLINE long via_plt(long x) {
    unsigned seed = (unsigned)x;
    return rand_r(&seed) + 1;
}
int main(int argc, char **argv) {
    long n = atol(argv[1]), s = 0;
    for (long i = 0; i < n; i++)
        s += leaf(i) + via_plt(i);
    printf("counted %ld\n", s);
    return argc == 2 ? 0 : 1;
}
"""
CALLS = 1000
_BRANCH = re.compile(r"\s(j[a-z]+|loop\w*)\s")


def _instructions(exe: Path, function: str) -> tuple[int, list[str]]:
    """Address and instruction lines of ``function`` in objdump's listing."""
    text = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", f"--disassemble={function}", str(exe)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    start = re.search(rf"^([0-9a-f]+) <{function}>:$", text, re.M)
    assert start, text
    lines = re.findall(r"^\s+[0-9a-f]+:\t(.+)$", text[start.end() :], re.M)
    assert lines and lines[-1].startswith("ret"), lines
    assert not [x for x in lines if _BRANCH.search(" " + x + " ")], lines
    return int(start.group(1), 16), lines


def _has_section(exe: Path, name: str) -> bool:
    text = subprocess.run(["objdump", "-h", str(exe)], capture_output=True, text=True).stdout
    return re.search(rf"\s{re.escape(name)}\s", text) is not None


def _counted(variant: str, flags: tuple[str, ...]) -> Path:
    return compile_program(COUNTED, f"cg-counted-{variant}", ("-O2", "-g0", *flags))


def _run(exe: Path):
    profile = callgrind_self_ir([exe, str(CALLS)])
    native = subprocess.run([str(exe), str(CALLS)], capture_output=True, text=True, check=True)
    assert profile.returncode == 0 and profile.stdout == native.stdout
    # Self costs add up to the run's total: no inclusive call cost in them.
    assert sum(profile.self_ir.values()) == profile.totals == profile.summary
    return profile, profile.self_ir_in(exe)


@needs_callgrind
def test_self_ir_is_calls_times_instructions_and_plt_stubs_are_the_caller_s(tmp_path):
    exe = _counted("now", ("-fcf-protection=none", "-Wl,-z,now"))
    assert _has_section(exe, ".plt") and not _has_section(exe, ".plt.sec")
    leaf_at, leaf = _instructions(exe, "leaf")
    _, via_plt = _instructions(exe, "via_plt")
    assert [x for x in via_plt if re.match(r"call\s+[0-9a-f]+ <rand_r@plt>", x)]
    profile, mine = _run(exe)
    assert mine["leaf"] == CALLS * len(leaf)
    # The bound stub's jmp *GOT is counted as via_plt's.
    assert mine["via_plt"] == CALLS * (len(via_plt) + 1)
    assert profile.call_count("main", "leaf") == CALLS
    assert profile.call_count("via_plt", "rand_r") == CALLS
    assert not [k for k in profile.self_ir if "@plt" in k[1] or "[PLT]" in k[1]]
    assert not [k for k in mine if k.startswith("0x") and int(k, 16) == leaf_at]

    # Lazily bound: the first call also runs the stub's push and jmp and
    # PLT0's push and jmp, and calls ld.so's resolver.
    lazy = _counted("lazy", ("-fcf-protection=none", "-Wl,-z,lazy"))
    profile, mine = _run(lazy)
    assert mine["via_plt"] == CALLS * (len(via_plt) + 1) + 4
    resolver = [
        n
        for (a, b), n in profile.calls.items()
        if a[1] == "via_plt" and b[1].startswith("_dl_runtime_resolve")
    ]
    assert resolver == [1]

    # Without a PLT: only via_plt's own instructions.
    noplt = _counted("noplt", ("-fcf-protection=none", "-fno-plt"))
    _, via_got = _instructions(noplt, "via_plt")
    _, mine = _run(noplt)
    assert mine["via_plt"] == CALLS * len(via_got)

    # Stripped: leaf is named by its address in the file, with the same count.
    stripped = tmp_path / "counted-stripped"
    subprocess.run(["objcopy", "--strip-all", str(exe), str(stripped)], check=True)
    _, mine = _run(stripped)
    assert "leaf" not in mine and "via_plt" not in mine
    assert mine[f"0x{leaf_at:016x}"] == CALLS * len(leaf)


@needs_callgrind
def test_an_ibt_plt_sec_stub_is_a_function_of_no_object():
    exe = _counted("ibt", ("-fcf-protection=full", "-Wl,-z,ibtplt", "-Wl,-z,now"))
    if not _has_section(exe, ".plt.sec"):
        pytest.skip("the linker made no .plt.sec (IBT PLT) here")
    _, via_plt = _instructions(exe, "via_plt")
    assert via_plt[0] == "endbr64"
    profile, mine = _run(exe)
    assert mine["via_plt"] == CALLS * len(via_plt)
    # The .plt.sec stub (endbr64; bnd jmp *GOT): under ob=???, named by its
    # run-time address, calling rand_r.
    (stub,) = [a for (a, b), n in profile.calls.items() if b[1] == "rand_r" and a[0] == "???"]
    assert re.fullmatch(r"0x[0-9a-f]{16}", stub[1])
    assert profile.self_ir[stub] == 2 * CALLS
    assert profile.call_count("via_plt", stub[1]) == CALLS


@needs_callgrind
@pytest.mark.parametrize("name", PROGRAM_NAMES)
def test_the_patch_test_programs_run_alike_under_callgrind(name):
    exe = build_program(name)
    profile = callgrind_self_ir([exe])
    assert profile.returncode == 0
    assert profile.stdout == expected_output(name)
    assert re.fullmatch(rf"{name} .*checksum \d+\n", profile.stdout)
    assert sum(profile.self_ir.values()) == profile.totals
    if name == "signals":
        # summary: leaves out what ran in the signal handlers.
        handlers = profile.self_ir_of("mix")
        assert handlers > 0 and profile.summary is not None
        assert profile.summary <= profile.totals - handlers
    else:
        assert profile.summary == profile.totals
    mine = profile.self_ir_in(exe)
    assert mine["main"] > 0
    if name == "dlopen":
        assert profile.self_ir_in(build_dlopen_library())["lib_work"] > 0
