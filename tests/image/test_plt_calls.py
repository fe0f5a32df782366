"""Calls as users count them, on recorded programs: through PLT stubs
(lazily bound or not), to IFUNCs, through a switch's jump table, and
with one definition of a call's instructions everywhere."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from test_record_software import SKIP, compile_program

from hwtrace.cli.main import main

pytestmark = pytest.mark.skipif(SKIP is not None, reason=str(SKIP))

PLT_PROGRAM = r"""
#include <stdlib.h>
#include <string.h>
#define NOINLINE __attribute__((noinline))
static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
NOINLINE long work(const char *s) {
    int v[8] = {5, 3, 7, 1, 8, 2, 6, 4};
    qsort(v, 8, sizeof v[0], cmp);
    return v[0] + (long)strlen(s);
}
int main(int argc, char **argv) { return (int)(work(argv[0]) & 1); }
"""

SWITCH_PROGRAM = r"""
#define NOINLINE __attribute__((noinline))
static volatile long sink;
NOINLINE long dispatch(int op, long x) {
    switch (op & 7) {  /* every case handled: no bounds check before the table */
    case 0: return x + 1;
    case 1: return x * 3;
    case 2: return x - 7;
    case 3: return x ^ 0x55;
    case 4: return x << 2;
    case 5: return x / 3;
    case 6: return -x;
    case 7: return x + 11;
    }
    return 0;
}
NOINLINE long work(int n) {
    long s = 0;
    for (int i = 0; i < n; i++)
        s += dispatch(i % 8, i);
    return s;
}
int main(void) { sink = work(100); return 0; }
"""


def _record(exe: str, path, calls=("work",)) -> object:
    from hwtrace.record import record_software
    from hwtrace.record.perfdata import write_perf_data

    rec = record_software([exe], calls=list(calls))
    write_perf_data(rec, path)
    return rec


def _folded(path, tmp_path) -> dict[str, int]:
    out = tmp_path / "f.folded"
    assert main(["report", "-i", str(path), "--folded", str(out)]) == 0
    lines = out.read_text().splitlines()
    keys = [line.rsplit(" ", 1)[0] for line in lines]
    assert len(keys) == len(set(keys)), "a call path written twice"
    return {k: int(v) for k, v in (line.rsplit(" ", 1) for line in lines)}


def _calls(func: str, path, tmp_path) -> list[dict]:
    out = tmp_path / "c.json"
    assert main(["funclatency", func, "-i", str(path), "--json", str(out),
                 "--all-intervals"]) == 0  # fmt: skip
    return json.loads(out.read_text())["intervals"]


@pytest.fixture(scope="module")
def plt_runs(tmp_path_factory):
    """The PLT program lazily bound, bound at start (LD_BIND_NOW), and
    built for IBT (its calls go through .plt.sec stubs, whose slots lead
    lazily to .plt entries)."""
    exe = str(compile_program(PLT_PROGRAM, "plt", ("-O2", "-g0", "-Wl,-z,lazy")))
    ibt = str(compile_program(PLT_PROGRAM, "pltibt", ("-O2", "-g0", "-fcf-protection=full",
                                                      "-Wl,-z,lazy", "-Wl,-z,ibtplt")))  # fmt: skip
    d = tmp_path_factory.mktemp("plt")
    mp = pytest.MonkeyPatch()
    runs = {}
    try:
        for mode, program in (("lazy", exe), ("now", exe), ("ibt", ibt)):
            if mode == "now":
                mp.setenv("LD_BIND_NOW", "1")
            else:
                mp.delenv("LD_BIND_NOW", raising=False)
            runs[mode] = d / f"{mode}.data"
            _record(program, runs[mode])
    finally:
        mp.undo()
    runs["exe"] = exe
    return runs


def _frames(key: str) -> list[str]:
    """A path's frames without the command, the program's module named
    ``prog`` (the builds' names differ)."""
    return re.sub(r"(^|;)plt(ibt)?-[0-9a-f]+!", r"\1prog!", key).split(";")[1:]


def _callgrind_self(exe: str, tmp_path, env: dict | None = None) -> dict[str, int] | None:
    """callgrind's self instructions per function of a run (None without
    valgrind)."""
    import os

    if not (shutil.which("valgrind") and shutil.which("callgrind_annotate")):
        return None
    out = tmp_path / "cg.out"
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", exe],
                   capture_output=True, check=False, env={**os.environ, **(env or {})})  # fmt: skip
    text = subprocess.run(["callgrind_annotate", "--threshold=100", str(out)],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    return {m.group(2): int(m.group(1).replace(",", "")) for m in
            re.finditer(r"^\s*([\d,]+) \([^)]*\)\s+\S*?:(\w+) \[", text, re.M)}  # fmt: skip


def test_plt_stubs_are_named_and_lazy_binding_keeps_the_callee_s_path(plt_runs, tmp_path, capsys):
    lazy = _folded(plt_runs["lazy"], tmp_path)
    now = _folded(plt_runs["now"], tmp_path)
    ibt = _folded(plt_runs["ibt"], tmp_path)
    for folded in (lazy, now, ibt):
        # No frame named by a file offset, none a stub's.
        assert not [k for k in folded if re.search(r"\+0x[0-9a-f]+(;|$)|@plt", k)], folded

    def qsort_paths(folded):
        return {";".join(_frames(k)) for k in folded if "!qsort" in (k.split(";") + ["", ""])[2]}

    # qsort and everything below it: the paths LD_BIND_NOW gives.
    assert qsort_paths(lazy) == qsort_paths(now) == qsort_paths(ibt)
    assert any(k.endswith(";libc.so.6!qsort") for k in qsort_paths(now))
    # The stubs run in work, as callgrind counts them: each one's jump
    # bound; lazily, its jump, push and jump to PLT0 and PLT0's push and
    # jump (with IBT: the .plt.sec stub's endbr64 and jump, the .plt
    # entry's endbr64, push and jump, PLT0's push and jump).
    (work_now,) = [v for k, v in now.items() if k.endswith("!work")]
    (work_lazy,) = [v for k, v in lazy.items() if k.endswith("!work")]
    (work_ibt,) = [v for k, v in ibt.items() if k.endswith("!work")]
    assert work_lazy - work_now == 2 * (5 - 1)
    assert work_ibt - work_now == 2 * 7 - 2 * 1 + 1  # (+ work's own endbr64)
    cg = _callgrind_self(plt_runs["exe"], tmp_path)
    if cg is not None:
        assert cg["work"] == work_lazy
        assert _callgrind_self(plt_runs["exe"], tmp_path, {"LD_BIND_NOW": "1"})["work"] == work_now
    # Then ld.so's resolver, called from work as callgrind has it.
    for folded in (lazy, ibt):
        resolver = {_frames(k)[1] for k in folded if "_dl_fixup" in k}
        assert len(resolver) == 1
        assert resolver.pop().startswith("ld-linux-x86-64.so.2!_dl_runtime_")
    assert not [k for k in now if "ld-linux" in k]
    # The stubs have their perf names where functions are listed, with
    # their own instructions (jump, push, jump; PLT0's are no stub's).
    capsys.readouterr()
    assert main(["report", "-i", str(plt_runs["lazy"]), "--top", "40"]) == 0
    text = capsys.readouterr().out
    for stub, count in (("qsort@plt", 3), ("strlen@plt", 3)):
        (line,) = [x for x in text.splitlines() if f"!{stub} " in x]
        assert line.split("│")[1].strip() == str(count)


def test_funclatency_through_a_plt_stub_and_an_ifunc(plt_runs, tmp_path):
    for mode in ("lazy", "now", "ibt"):
        folded = _folded(plt_runs[mode], tmp_path)
        # strlen is an IFUNC: the call runs the implementation the
        # resolver chose (__strlen_avx2, _evex, _sse2...), nothing else.
        calls = _calls("strlen", plt_runs[mode], tmp_path)
        assert len(calls) == 1, calls
        frames = calls[0]["path"].split(";")
        assert frames[0] == "work" and re.fullmatch(r"__strlen_\w+", frames[1]), frames
        impl = [v for k, v in folded.items() if re.search(r"!work;libc\.so\.6!__strlen_\w+$", k)]
        assert calls[0]["dic"] == impl[0]  # (it calls nothing)
        # qsort: the same call path either way, its instructions those of
        # its path and everything below.
        (call,) = _calls("qsort", plt_runs[mode], tmp_path)
        assert call["path"] == "work;qsort"
        below = sum(v for k, v in folded.items() if ";libc.so.6!qsort" in k)
        assert call["dic"] == below
        # enter:qsort fires once, at qsort (its stub is no IFUNC's).
        out = tmp_path / "l.json"
        assert main(["latency", "-i", str(plt_runs[mode]), "--open", "enter:qsort",
                     "--close", "exit:qsort", "--json", str(out)]) == 0  # fmt: skip
        got = json.loads(out.read_text())
        assert got["repeated_opens"] == 0
        assert [i["dic"] for i in got["intervals"]] == [below - 1]  # (close minus open)


@pytest.fixture(scope="module")
def switch_run(tmp_path_factory):
    from test_record_threads import stepped

    exe = str(compile_program(SWITCH_PROGRAM, "switch", ("-O2", "-g0", "-fno-pie", "-no-pie")))
    path = tmp_path_factory.mktemp("switch") / "sw.data"
    rec = _record(exe, path)
    ((_, ips),) = stepped(rec).items()
    image = rec.image(rec.threads[0].image)
    return exe, path, ips, image


def _in(image, name: str, ips: np.ndarray) -> np.ndarray:
    start = int(image.symbols.function_entries(name)[0])
    table = image.symbols.functions
    index, _ = table.lookup(np.array([start], np.uint64))
    end = start + int(table.size[int(index[0])])
    return (ips >= start) & (ips < end)


def test_a_jump_table_stays_in_its_function(switch_run, tmp_path):
    exe, path, ips, image = switch_run
    folded = _folded(path, tmp_path)
    here = _in(image, "dispatch", ips)
    mine = {k: v for k, v in folded.items() if k.endswith("!dispatch")}
    assert list(mine.values()) == [int(here.sum())]
    assert [v for k, v in folded.items() if k.endswith("!work")] == [int((~here).sum())]
    if shutil.which("valgrind") and shutil.which("callgrind_annotate"):
        # callgrind counts the same self instructions per function.
        out = tmp_path / "cg.out"
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", exe],
                       capture_output=True, check=True)  # fmt: skip
        text = subprocess.run(["callgrind_annotate", str(out)], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip
        got = {m.group(2): int(m.group(1).replace(",", "")) for m in
               re.finditer(r"^\s*([\d,]+) \([^)]*\)\s+\?\?\?:(\w+) ", text, re.M)}  # fmt: skip
        assert got["dispatch"] == int(here.sum())


def test_a_call_s_instructions_are_entry_through_return(switch_run, tmp_path, capsys):
    """funclatency, report --call and diff count a call's instructions the
    same way: N for a call whose entry through its ret are N."""
    _, path, ips, image = switch_run
    here = _in(image, "dispatch", ips)
    entry = int(image.symbols.function_entries("dispatch")[0])
    starts = np.flatnonzero(ips == entry)
    # Each call runs from its entry to its ret, which is where it leaves
    # the function.
    ends = np.flatnonzero(here[:-1] & ~here[1:])
    want = (ends - starts + 1).tolist()
    assert len(want) == 100 and min(want) >= 3
    assert [c["dic"] for c in _calls("dispatch", path, tmp_path)] == want
    capsys.readouterr()
    assert main(["report", "-i", str(path), "--call", "dispatch"]) == 0
    assert f"{sum(want):,} instructions decoded" in capsys.readouterr().out
    out = tmp_path / "d.json"
    assert main(["diff", str(path), str(path), "--json", str(out)]) == 0
    paths = {p["key"]: p for p in json.loads(out.read_text())["paths"]}
    (key,) = [k for k in paths if k.endswith("!dispatch")]
    assert paths[key]["a"]["calls"] == 100 and paths[key]["a"]["insn"] == sum(want)
    # hwtrace decode --function-calls: one row per call, the same counts.
    from hwtrace.export.query import connect

    assert main(["decode", str(path), "-o", str(tmp_path / "dir"), "--function-calls"]) == 0
    con, meta = connect(tmp_path / "dir")
    rows = con.execute("SELECT instructions FROM function_calls WHERE function LIKE '%!dispatch' "
                       "ORDER BY time").fetchall()  # fmt: skip
    assert [r[0] for r in rows] == want
    view = con.execute("SELECT calls, instructions, min_insns FROM calls "
                       "WHERE function LIKE '%!dispatch'").fetchall()  # fmt: skip
    assert view == [(100, sum(want), min(want))]
    # The recorded call of work, whose trace starts at its entry, is one too.
    (work,) = con.execute("SELECT instructions FROM function_calls "
                          "WHERE function LIKE '%!work'").fetchall()  # fmt: skip
    assert work[0] == ips.shape[0] and meta["function_calls"] == 101


def test_diff_and_report_tables_keep_the_leaf_of_long_paths(plt_runs, tmp_path, capsys):
    """Paths too long for the table lose frames in the middle: each row
    still ends with its path's innermost function, and rows stay apart."""
    out = tmp_path / "d.json"
    capsys.readouterr()
    assert main(["diff", str(plt_runs["lazy"]), str(plt_runs["now"]), "--top", "20",
                 "--json", str(out)]) == 0  # fmt: skip
    text = capsys.readouterr().out.splitlines()
    keys = [p["key"] for p in json.loads(out.read_text())["paths"]][:20]
    start = next(i for i, line in enumerate(text) if line.startswith("call paths, most"))
    cells = [line.split("│")[0].strip() for line in text[start + 3 : start + 3 + len(keys)]]
    assert any(len(k) > len(c) for k, c in zip(keys, cells, strict=True))  # some were cut
    for key, cell in zip(keys, cells, strict=True):
        leaf = key.rsplit(";", 1)[1]
        # (the leaf's module may lose its middle; its function never)
        assert cell == key or cell.endswith(leaf.rsplit("!", 1)[-1]), (cell, key)
        assert cell.split(";")[0] == key.split(";")[0]
    assert len(set(cells)) == len(cells)


def test_elided_paths_say_how_many_frames_went():
    from hwtrace.textout import elide_paths

    deep = "fp;fp!work;fp+0x1036;" + "libc.so.6!msort_with_tmp.part.0;" * 3
    keys = [deep + "fp!cmp", deep[:-32] + "fp!cmp", deep + "libc.so.6!__memcpy_avx_unaligned"]
    got = elide_paths(keys, 60)
    assert all(len(g) <= 60 for g in got) and len(set(got)) == 3
    assert got[0] == "fp;…(4);libc.so.6!msort_with_tmp.part.0;fp!cmp"
    assert got[1] == "fp;…(3);libc.so.6!msort_with_tmp.part.0;fp!cmp"
    assert elide_paths(["a;b"], 60) == ["a;b"]
    assert elide_paths(["x" * 30 + "!name"], 12) == ["xxx…xxx!name"]


def test_plt_entries_are_named_from_their_slots():
    """Each entry of .plt, .plt.sec and .plt.got is named after what its
    GOT slot binds, as objdump and perf name them; PLT0 binds nothing."""
    from hwtrace.image import read_elf

    for name, flags in (("plt", ("-O2", "-g0", "-Wl,-z,lazy")),
                        ("pltibt", ("-O2", "-g0", "-fcf-protection=full", "-Wl,-z,lazy",
                                    "-Wl,-z,ibtplt"))):  # fmt: skip
        exe = str(compile_program(PLT_PROGRAM, name, flags))
        sections = {}
        out = subprocess.run(["objdump", "-d", "-j", ".plt", "-j", ".plt.sec", "-j", ".plt.got",
                              exe], capture_output=True, text=True, check=True).stdout  # fmt: skip
        for m in re.finditer(r"^([0-9a-f]+) <([^>]+@plt)>:", out, re.M):
            sections[int(m.group(1), 16)] = m.group(2)
        got = {s: n for s, _, n, _ in read_elf(exe).symbols if n.endswith("@plt")}
        assert sections and all(got.get(s) == n for s, n in sections.items()), (got, sections)
        assert {"qsort@plt", "strlen@plt", "__cxa_finalize@plt"} <= set(got.values())
        if name == "pltibt":  # the lazy .plt entries (push $index) too
            assert sorted(got.values()).count("qsort@plt") == 2


STRDUP_PROGRAM = r"""
#include <stdlib.h>
#include <string.h>
#define NOINLINE __attribute__((noinline))
NOINLINE long work(const char *s) {
    char *d = strdup(s);  /* libc's strdup calls strlen through its own PLT */
    long n = d[0];
    free(d);
    return n;
}
int main(int argc, char **argv) { return (int)(work(argv[0]) & 1); }
"""


def test_an_ifunc_called_inside_its_own_library(tmp_path):
    """libc calls its IFUNCs through IRELATIVE slots (``*ABS*+0x...@plt``
    stubs): funclatency strlen finds strdup's call of the implementation."""
    exe = str(compile_program(STRDUP_PROGRAM, "strdup", ("-O2", "-g0")))
    path = tmp_path / "s.data"
    _record(exe, path)
    folded = _folded(path, tmp_path)
    calls = _calls("strlen", path, tmp_path)
    assert len(calls) == 1, calls
    frames = calls[0]["path"].split(";")
    assert frames[0] == "work" and frames[1].endswith("strdup"), frames
    assert re.fullmatch(r"__strlen_\w+", frames[2]), frames
    (impl,) = [v for k, v in folded.items() if re.search(r"strdup;libc\.so\.6!__strlen_\w+$", k)]
    assert calls[0]["dic"] == impl


def test_paths_fit_a_table_without_rows():
    """``hwtrace diff --top 0`` and ``report --top 0``: headers only."""
    from hwtrace.textout import fit_paths

    assert fit_paths([], ["calls A", "calls B"], [], 100) == []
    assert fit_paths(["a;b"], ["calls"], [["12"]], 100) == ["a;b"]
