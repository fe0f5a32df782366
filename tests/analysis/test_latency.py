"""Latency (delta) profiling against ground truth.

Programs with intervals of known length run under unicorn (the
ground-truth corpus' way, :mod:`groundtruth`): loops of chosen trip counts
between ``cli``/``sti``, the kernel's irq-save/restore sequences
(``pushf; pop; cli`` and ``push; popf``), ``pause`` pairs, and recursive
and early-returning functions; and raw code at a kernel address.  Their
paths are encoded as Intel PT with random per-instruction cycle costs, so
each instruction's true time is known.  Every ΔIC must be the path's own,
and every Δt within its reported resolution of the encoded time.
"""

from __future__ import annotations

from pathlib import Path

import groundtruth as gt
import iced_x86
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.analysis.latency import R_CALL, R_PAIR, profile_trace
from hwtrace.analysis.patterns import PatternError, PatternSet, load_toml, parse_sets
from hwtrace.export.callpaths import flame_tree
from hwtrace.export.html import call_tree
from hwtrace.image import Image
from hwtrace.pt.encode import encode_path

PROGRAM = r"""
#define NOINLINE __attribute__((noinline))
static volatile long sink;
NOINLINE void spin(long n) { for (long i = 0; i < n; i++) sink += i; }
NOINLINE unsigned long arch_local_irq_save(void) {
    unsigned long flags;
    __asm__ volatile("pushf; pop %0; cli" : "=r"(flags) : : "memory");
    return flags;
}
NOINLINE void arch_local_irq_restore(unsigned long flags) {
    __asm__ volatile("push %0; popf" : : "r"(flags) : "memory", "cc");
}
NOINLINE long critical(long n) {
    unsigned long f = arch_local_irq_save();
    spin(n);
    arch_local_irq_restore(f);
    return n;
}
NOINLINE long plain(long n) {
    __asm__ volatile("cli");
    spin(n);
    __asm__ volatile("sti");
    return n;
}
NOINLINE long fact(long n) {
    if (n < 2)
        return 1;
    long r = fact(n - 1);
    sink = r;  /* work after the call: real recursion, not a loop */
    return n * r;
}
NOINLINE long early(long n) {
    if (n & 1) { spin(2); return 1; }
    spin(n);
    return 0;
}
NOINLINE long driver(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) {
        s += critical(i * 3 + 1);
        s += plain(i + 2);
        s += fact(i % 6 + 1);
        s += early(i);
        __asm__ volatile("pause");
        spin(i % 4);
        __asm__ volatile("pause");
    }
    return s;
}
"""

pytestmark = pytest.mark.skipif(gt.skip_reason is not None, reason=str(gt.skip_reason))


def _mnemonic(read, ip: int) -> str:
    ins = iced_x86.Decoder(64, read(ip, 15), ip=ip).decode()
    return iced_x86.Formatter(iced_x86.FormatterSyntax.INTEL).format_mnemonic(ins).lower()


def _setting(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    cyc = bool(rng.integers(2))
    return {"tsc": int(rng.integers(1 << 20, 1 << 40)), "mtc_freq": int(rng.choice([0, 3, 6])),
            "cyc": cyc, "psb_period": int(rng.choice([256, 4096]))}  # fmt: skip


def _encode(ips, image, end_ip, seed: int, **extra):
    rng = np.random.default_rng(seed + 1)
    # Odd seeds: instructions far apart (stepped code, a stalled core), so
    # MTC's 8 bits wrap between timing packets.
    cycles = rng.integers(1, 1 << 17 if seed % 2 else 12, ips.shape[0])
    s = _setting(seed)
    enc = encode_path(ips, image, end_ip=end_ip, cycles=cycles, **s, **extra)
    true = s["tsc"] + np.concatenate([[0], np.cumsum(cycles)])
    return enc, true


def _function_namer(image):
    """The name of the function holding an address (the address where none does)."""
    funcs = image.symbols.functions

    def name(addr: int) -> str:
        index, _ = funcs.lookup(np.array([addr], np.uint64))
        return funcs.name(int(index[0])) if index[0] >= 0 else f"{addr:#x}"

    return name


def _check_times(res, iv, true, opens, closes):
    """Each Δt within its resolution of the true time between the ends."""
    want = true[closes] - true[opens]
    known = iv.resolution >= 0
    assert known.sum() >= len(iv) - 1  # at most the last interval lacks a later time
    err = np.abs(iv.dt - want)
    assert (err[known] <= iv.resolution[known]).all(), (iv.dt, want, iv.resolution)


@pytest.fixture(scope="module")
def program():
    run = gt.run("driver", (9,), "-O2", program=PROGRAM)
    image = Image()
    image.add_elf(run.elf)
    return run, image


def test_cli_sti_pairs_have_the_path_s_counts(program):
    run, image = program
    ips = run.ips
    names = [_mnemonic(image.read, int(ip)) for ip in ips]
    opens = np.array([i for i, n in enumerate(names) if n == "cli"])
    closes = np.array([i for i, n in enumerate(names) if n == "sti"])
    for seed in range(4):
        enc, true = _encode(ips, image, run.end_ip, seed)
        patterns = PatternSet()
        parse_sets(patterns, ["cli"], ["sti"])
        res = profile_trace(enc.data, image, patterns, enc.config)
        iv = res.intervals
        assert res.instructions == ips.shape[0]
        # cli in plain() and in arch_local_irq_save(); sti only in plain():
        # each irq-save cli is a repeated open, or opens what plain's sti closes.
        assert res.marker_counts.tolist() == [opens.shape[0], closes.shape[0]]
        assert (iv.kind == R_PAIR).all()
        starts = np.array([opens[opens < c].max() for c in closes])
        firsts = []
        last_close = -1
        for c in closes:  # the first open after the previous close stands
            firsts.append(opens[(opens > last_close) & (opens < c)].min())
            last_close = c
        firsts = np.array(firsts)
        assert iv.dic.tolist() == (closes - firsts).tolist()
        assert res.repeated_opens == sum(
            int(((opens > a) & (opens < c)).sum()) for a, c in zip(firsts, closes, strict=True)
        )  # fmt: skip
        assert (starts >= firsts).all()
        _check_times(res, iv, true, firsts, closes)


def test_super_instructions_in_their_functions(program, tmp_path):
    """The thesis' superCLI/superSTI: irq-save's ``pushf; pop; cli`` and
    irq-restore's ``popf``, scoped to those functions (plain()'s cli is
    no superCLI)."""
    run, image = program
    ips = run.ips
    names = [_mnemonic(image.read, int(ip)) for ip in ips]
    funcs = image.symbols.functions
    index, _ = funcs.lookup(ips)
    fname = [funcs.name(int(i)) if i >= 0 else "" for i in index]
    opens = np.array([j for j in range(2, len(names))
                      if names[j - 2 : j + 1] == ["pushfq", "pop", "cli"]
                      and fname[j] == "arch_local_irq_save"])  # fmt: skip
    closes = np.array([j for j, n in enumerate(names)
                       if n == "popfq" and fname[j] == "arch_local_irq_restore"])  # fmt: skip
    assert opens.shape[0] == closes.shape[0] == 9
    config = tmp_path / "irq.toml"
    config.write_text(
        '[markers]\nsuperCLI = "pushf; pop; cli in *irq_save*"\n'
        'superSTI = ["popf in *irq_restore*"]\n'
        '[interval]\nopen = "superCLI"\nclose = ["superSTI"]\n'
    )
    patterns = PatternSet()
    load_toml(config, patterns)
    enc, true = _encode(ips, image, run.end_ip, 7)
    res = profile_trace(enc.data, image, patterns, enc.config)
    iv = res.intervals
    assert res.marker_counts.tolist() == [9, 9]
    assert iv.dic.tolist() == (closes - opens).tolist()
    assert res.repeated_opens == res.unmatched_closes == 0
    _check_times(res, iv, true, opens, closes)


def _calls_of(ips: np.ndarray, read, entry: int) -> list[tuple[int, int]]:
    """(entry index, return index) of every call of the function at
    ``entry``, from a stack of return addresses over the path."""
    stack: list[list] = []
    out = []
    for j in range(ips.shape[0]):
        ip = int(ips[j])
        if j and stack and stack[-1][0] == ip and _mnemonic(read, int(ips[j - 1])) == "ret":
            _, start = stack.pop()
            if start is not None:
                out.append((start, j - 1))
        if ip == entry and stack and stack[-1][1] is None:
            stack[-1][1] = j
        if _mnemonic(read, ip) == "call":
            ins = iced_x86.Decoder(64, read(ip, 15), ip=ip).decode()
            stack.append([ip + ins.len, None])
    return sorted(out)


def test_function_calls_with_recursion_and_early_returns(program):
    run, image = program
    ips = run.ips
    for func in ("fact", "early"):
        entry = int(image.symbols.function_entries(func)[0])
        want = _calls_of(ips, image.read, entry)
        assert len(want) >= 9
        patterns = PatternSet()
        patterns.add_marker(func, f"exit:{func}")
        enc, true = _encode(ips, image, run.end_ip, 11)
        res = profile_trace(enc.data, image, patterns, enc.config)
        iv = res.intervals.select(res.intervals.kind == R_CALL)
        assert len(iv) == len(want)
        # Calls close in return order: an inner call of a recursion first.
        by_close = sorted(want, key=lambda c: c[1])
        # A call's instructions: its entry through its return, both counted.
        assert iv.dic.tolist() == [e - s + 1 for s, e in by_close]
        _check_times(res, iv, true, np.array([s for s, _ in by_close]),
                     np.array([e for _, e in by_close]))  # fmt: skip


def test_exit_closes_what_enter_opened(program):
    """``--open enter:plain --close exit:plain``: the interval is the call."""
    run, image = program
    ips = run.ips
    entry = int(image.symbols.function_entries("plain")[0])
    want = _calls_of(ips, image.read, entry)
    patterns = PatternSet()
    parse_sets(patterns, ["enter:plain"], ["exit:plain"])
    enc, true = _encode(ips, image, run.end_ip, 3)
    res = profile_trace(enc.data, image, patterns, enc.config)
    pairs = res.intervals.select(res.intervals.kind == R_PAIR)
    assert pairs.dic.tolist() == [e - s for s, e in want]
    _check_times(res, pairs, true, np.array([s for s, _ in want]), np.array([e for _, e in want]))


def test_toggle_is_the_paper_s_literal_algorithm(program):
    run, image = program
    ips = run.ips
    names = [_mnemonic(image.read, int(ip)) for ip in ips]
    marks = [j for j, n in enumerate(names) if n == "pause"]
    patterns = PatternSet()
    parse_sets(patterns, toggle=["pause"])
    enc, _ = _encode(ips, image, run.end_ip, 5)
    res = profile_trace(enc.data, image, patterns, enc.config)
    assert res.intervals.dic.tolist() == [b - a for a, b in zip(marks[::2], marks[1::2],
                                                                strict=True)]  # fmt: skip


CODE = bytes.fromhex("fab900000000ffc975fcfbebf3")
BASE = 0xFFFFFFFF81000000


def _raw_path(trips: list[int]) -> np.ndarray:
    ips: list[int] = []
    for n in trips:
        ips += [BASE, BASE + 1] + [BASE + 6, BASE + 8] * n + [BASE + 0xA, BASE + 0xB]
    return np.array(ips[:-1], np.uint64)


@pytest.fixture
def raw(tmp_path):
    path = tmp_path / "code.bin"
    path.write_bytes(CODE)
    image = Image()
    image.add_raw(path, address=BASE)
    return image


@pytest.mark.parametrize("seed", range(6))
def test_kernel_cli_sti_through_the_encoder(raw, seed):
    rng = np.random.default_rng(seed)
    trips = [int(t) for t in rng.integers(1, 200, 12)]
    ips = _raw_path(trips)
    enc, true = _encode(ips, raw, BASE + 0xB, seed)
    patterns = PatternSet()
    parse_sets(patterns, ["cli"], ["sti"])
    res = profile_trace(enc.data, raw, patterns, enc.config)
    assert res.intervals.dic.tolist() == [2 * n + 2 for n in trips]
    _check_times(res, res.intervals, true, np.flatnonzero(ips == BASE),
                 np.flatnonzero(ips == BASE + 0xA))  # fmt: skip


def test_a_gap_inside_drops_the_interval(raw):
    """Tracing off inside an interval, on again elsewhere: counted, never
    an interval."""
    trips = [5, 6, 7, 8]
    ips = _raw_path(trips)
    second = int(np.flatnonzero(ips == BASE)[1])
    enc = encode_path(ips, raw, end_ip=BASE + 0xB, trace_off=[(second + 4, second + 7)],
                      tsc=1 << 30, mtc_freq=3)  # fmt: skip
    patterns = PatternSet()
    parse_sets(patterns, ["cli"], ["sti"])
    res = profile_trace(enc.data, raw, patterns, enc.config)
    assert res.gapped == 1
    assert res.intervals.dic.tolist() == [2 * n + 2 for n in (5, 7, 8)]


def test_tracing_resumed_where_it_stopped_keeps_the_interval(raw):
    """Tracing off inside an interval and on again at the instruction where
    it went off (a system call in a user-space trace): the flow goes on,
    the interval stands with the instructions traced (two ran untraced)."""
    trips = [5, 6, 7, 8]
    ips = _raw_path(trips)
    second = int(np.flatnonzero(ips == BASE)[1])
    enc = encode_path(ips, raw, end_ip=BASE + 0xB, trace_off=[(second + 4, second + 6)],
                      tsc=1 << 30, mtc_freq=3)  # fmt: skip
    assert ips[second + 4] == ips[second + 6]
    patterns = PatternSet()
    parse_sets(patterns, ["cli"], ["sti"])
    res = profile_trace(enc.data, raw, patterns, enc.config)
    assert res.gapped == 0
    assert res.intervals.dic.tolist() == [12, 2 * 6 + 2 - 2, 16, 18]


def test_unmatched_closes_and_repeated_opens_are_counted(raw):
    patterns = PatternSet()
    parse_sets(patterns, ["sti"], ["cli"])  # the wrong way round
    ips = _raw_path([2, 3, 4])
    enc = encode_path(ips, raw, end_ip=BASE + 0xB)
    res = profile_trace(enc.data, raw, patterns, enc.config)
    assert res.unmatched_closes == 1  # the first cli
    assert res.intervals.dic.tolist() == [2, 2]  # sti, jmp, cli
    patterns = PatternSet()
    parse_sets(patterns, ["cli,dec"], ["sti"])  # every dec opens again
    res = profile_trace(enc.data, raw, patterns, enc.config)
    assert res.repeated_opens == 2 + 3 + 4
    assert res.intervals.dic.tolist() == [2 * 2 + 2, 2 * 3 + 2, 2 * 4 + 2]  # from the cli
    assert res.marker_counts.tolist() == [3, 9, 3]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((["nosuchinsn;"], ["sti"]), "empty step"),
        ((["cli"], []), "give --open and --close"),
        ((["class:bogus"], ["sti"]), "unknown class"),
        ((["exit:"], ["sti"]), "exit: needs a function"),
        ((["cli; exit:f"], ["sti"]), "exit: cannot be a step"),
        ((["???"], ["sti"]), "cannot read"),
    ],
)
def test_bad_patterns_are_named(args, message):
    with pytest.raises(PatternError, match=message):
        parse_sets(PatternSet(), *args)


@settings(max_examples=400, deadline=None)
@given(text=st.text(alphabet="0x19af+;:!._ -insymaddrclasenterxitjmp", max_size=24))
def test_any_marker_text_is_a_marker_or_one_error(text):
    """A marker of any text parses or raises PatternError (its message
    naming the marker), and every address it names resolves against a
    symbol table without another exception: an address or offset past
    64 bits, an empty symbol, a decimal offset with a leading zero."""
    from hwtrace.analysis.patterns import A_ADDRESS, resolve_address
    from hwtrace.image.symbols import SymbolTable

    patterns = PatternSet()
    try:
        patterns.add_marker("m", text)
    except PatternError as e:
        assert "'m'" in str(e)
        return
    symbols = SymbolTable(np.array([0x1000, 0x2000], np.uint64), np.array([16, 32], np.uint64),
                          np.array([0, 1], np.int32), ["main", "f"])  # fmt: skip
    for atom in patterns.atoms:
        if atom.kind == A_ADDRESS:
            resolve_address(atom.value[0], symbols)


@pytest.mark.parametrize(("spec", "message"), [
    ("0x1ffffffffffffffffff", "does not fit in 64 bits"),
    ("main+99999999999999999999999", "does not fit in 64 bits"),
    ("sym:", "no address or symbol"),
])  # fmt: skip
def test_addresses_that_cannot_be_are_refused(spec, message):
    with pytest.raises(PatternError, match=message):
        PatternSet().add_marker("m", spec)


def test_a_decimal_offset_with_a_leading_zero_is_decimal():
    from hwtrace.analysis.patterns import resolve_address
    from hwtrace.image.symbols import SymbolTable

    symbols = SymbolTable(np.array([0x1000], np.uint64), np.array([64], np.uint64),
                          np.array([0], np.int32), ["main"])  # fmt: skip
    assert resolve_address("main+010", symbols).tolist() == [0x1000 + 10]
    assert resolve_address("main+0x10", symbols).tolist() == [0x1010]


def test_bad_toml_names_the_file_and_entry(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[markers]\nx = 3\n")
    with pytest.raises(PatternError, match=r"bad.toml: markers.x"):
        load_toml(bad, PatternSet())
    bad.write_text("[markers\n")
    with pytest.raises(PatternError, match=r"bad.toml: "):
        load_toml(bad, PatternSet())
    with pytest.raises(PatternError, match="no-such"):
        load_toml(tmp_path / "no-such.toml", PatternSet())


def test_unknown_symbols_are_reported(raw):
    patterns = PatternSet()
    parse_sets(patterns, ["nosuchfunction"], ["sti"])
    enc = encode_path(_raw_path([1]), raw, end_ip=BASE + 0xB)
    res = profile_trace(enc.data, raw, patterns, enc.config)
    assert res.missing_symbols == {"nosuchfunction"}
    assert len(res.intervals) == 0


USER_PROGRAM = r"""
#include <stdlib.h>
#define NOINLINE __attribute__((noinline))
static volatile long sink;
NOINLINE void spin(long n) { for (long i = 0; i < n; i++) sink += i; }
NOINLINE long fact(long n) {
    if (n < 2)
        return 1;
    long r = fact(n - 1);
    sink = r;
    return n * r;
}
NOINLINE long work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) {
        __asm__ volatile("pause");
        spin(i % 5);
        __asm__ volatile("pause");
        s += fact(i % 4 + 2);
    }
    return s;
}
int main(int argc, char **argv) { return (int)(work(argc > 1 ? atol(argv[1]) : 6) & 1); }
"""


def test_latency_and_funclatency_of_a_recorded_program(tmp_path, capsys):
    """hwtrace record, then latency and funclatency on the perf.data: the
    intervals of what the stepper ran, exactly, per thread."""
    import json

    from test_record_software import SKIP, compile_program
    from test_record_threads import stepped

    from hwtrace.cli.main import main
    from hwtrace.record import record_software
    from hwtrace.record.perfdata import write_perf_data

    if SKIP is not None:
        pytest.skip(str(SKIP))
    exe = str(compile_program(USER_PROGRAM, "latency", ("-O2", "-g0")))
    rec = record_software([exe, "7"], calls=["work"])
    path = tmp_path / "perf.data"
    write_perf_data(rec, path)
    ((tid, ips),) = stepped(rec).items()
    image = rec.image(rec.threads[0].image)
    names = [_mnemonic(image.read, int(ip)) for ip in ips]
    pauses = [j for j, n in enumerate(names) if n == "pause"]
    out = tmp_path / "lat.json"
    assert main(["latency", "-i", str(path), "--toggle", "pause", "--json", str(out),
                 "--all-intervals"]) == 0  # fmt: skip
    got = json.loads(out.read_text())
    assert got["markers"] == {"pause": len(pauses)}
    assert [iv["dic"] for iv in got["intervals"]] == [
        b - a for a, b in zip(pauses[::2], pauses[1::2], strict=True)
    ]
    assert {iv["key"] for iv in got["intervals"]} == {tid}
    assert all(iv["dt"] >= 0 for iv in got["intervals"])
    entry = int(image.symbols.function_entries("fact")[0])
    want = sorted(_calls_of(ips, image.read, entry), key=lambda c: c[1])
    assert (
        main(["funclatency", "fact", "-i", str(path), "--json", str(out), "--all-intervals"]) == 0
    )
    got = json.loads(out.read_text())
    assert [iv["dic"] for iv in got["intervals"]] == [e - s + 1 for s, e in want]
    assert all(iv["path"].endswith("fact") for iv in got["intervals"])
    # The recorded call itself: the trace starts at its entry (no call
    # seen) and stops after its return (where it went is not traced).
    assert int(ips[0]) == int(image.symbols.function_entries("work")[0])
    assert (
        main(["funclatency", "work", "-i", str(path), "--json", str(out), "--all-intervals"]) == 0
    )
    got = json.loads(out.read_text())
    assert [iv["dic"] for iv in got["intervals"]] == [len(ips)]  # every instruction stepped
    text = capsys.readouterr().out
    assert "the " in text and "longest" in text


def test_funclatency_through_callees_left_untraced(tmp_path):
    """hwtrace record -f work (the patch backend: only work's code writes
    trace; spin and fact, which it calls, run untraced, tracing off at each
    call and on again at its return address): funclatency work has its
    call, with the instructions of work itself, as many as the stepper
    counts inside work in a recording of everything it runs."""
    import json

    from test_record_software import SKIP, compile_program
    from test_record_threads import stepped

    from hwtrace.cli.main import main
    from hwtrace.record import record_software

    if SKIP is not None:
        pytest.skip(str(SKIP))
    exe = str(compile_program(USER_PROGRAM, "latency", ("-O2", "-g0")))
    rec = record_software([exe, "7"], calls=["work"])
    ((_, ips),) = stepped(rec).items()
    symbols = rec.image(rec.threads[0].image).symbols
    index = symbols.index_of(np.asarray(ips, np.uint64))
    work = int(symbols.index_of(symbols.function_entries("work")[:1])[0])
    want = int((index == work).sum())
    path, out = tmp_path / "f.data", tmp_path / "f.json"
    assert main(["record", "-o", str(path), "--backend", "patch", "-f", "work", "--", exe,
                 "7"]) == 0  # fmt: skip
    assert main(["funclatency", "work", "-i", str(path), "--json", str(out),
                 "--all-intervals"]) == 0  # fmt: skip
    got = json.loads(out.read_text())
    assert [iv["dic"] for iv in got["intervals"]] == [want]
    assert got["intervals"][0]["dt"] > 0


# A callback that tail-calls libc (cmp's ``return strcmp(...)`` is a jmp out
# of the traced code, whose callee returns to qsort).
TAIL_CALLBACK_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
__attribute__((noinline)) int sorted(char **v, int n) { qsort(v, n, sizeof *v, cmp); return v[0][0]; }
int main(int argc, char **argv) {
    int c = sorted(argv + 1, argc - 1);
    for (int i = 1; i < argc; i++) puts(argv[i]);
    return c == 0;
}
"""


@pytest.mark.parametrize("case", ["demo", "tail-callback"])
def test_funclatency_through_callbacks_from_untraced_code(case, tmp_path):
    """Traced code that calls libc's qsort (untraced), which calls back a
    traced comparison function: tracing goes off at the call, on at each
    callback's entry, off at its return (or at its tail call of strcmp),
    and on again at qsort's return address.  make demo's recording
    (-f checksum -f digest -f mix -f by_value), and a callback that
    tail-calls strcmp: funclatency of the caller has its call, with every
    traced instruction it ran; funclatency of the callback its calls, each
    with its instructions: as the stepper counts them in a recording of
    everything the caller runs."""
    import json

    from test_record_software import SKIP, compile_program
    from test_record_threads import stepped

    from hwtrace.cli.main import main
    from hwtrace.record import record_software

    if SKIP is not None:
        pytest.skip(str(SKIP))
    if case == "demo":
        source = (Path(__file__).resolve().parents[2] / "examples" / "demo" / "demo.c").read_text()
        caller, callback, traced, args = "checksum", "by_value", ["digest", "mix"], ["24"]
    else:
        source, caller, callback, traced = TAIL_CALLBACK_PROGRAM, "sorted", "cmp", []
        args = list("qwertyuiopasdfg")
    traced = [caller, callback, *traced]
    exe = str(compile_program(source, case, ("-O2", "-g0")))
    rec = record_software([exe, *args], calls=[caller])
    ((_, ips),) = stepped(rec).items()
    symbols = rec.image(rec.threads[0].image).symbols
    index = symbols.index_of(np.asarray(ips, np.uint64))
    func = {f: int(symbols.index_of(symbols.function_entries(f)[:1])[0]) for f in traced}
    want_all = int(np.isin(index, list(func.values())).sum())
    # The callback calls nothing traced: a call is a run of its instructions.
    inside = (index == func[callback]).astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], inside, [0]])))
    want_calls = (edges[1::2] - edges[::2]).tolist()
    assert len(want_calls) > 20
    path, out = tmp_path / f"{case}.data", tmp_path / "f.json"
    flags = [a for f in traced for a in ("-f", f)]
    assert main(["record", "-o", str(path), "--backend", "patch", *flags, "--", exe, *args]) == 0
    for name, want in ((caller, [want_all]), (callback, want_calls)):
        assert main(["funclatency", name, "-i", str(path), "--json", str(out),
                     "--all-intervals"]) == 0  # fmt: skip
        got = json.loads(out.read_text())
        assert [iv["dic"] for iv in got["intervals"]] == want, name
        assert all(iv["dt"] >= 0 for iv in got["intervals"])


def test_without_every_interval_the_totals_and_longest_are_the_same(raw):
    """Keeping only the longest intervals (bounded memory) changes neither
    the histograms nor the totals, and keeps the longest."""
    rng = np.random.default_rng(3)
    trips = [int(t) for t in rng.integers(1, 6, 6000)]
    ips = _raw_path(trips)
    enc, _ = _encode(ips, raw, BASE + 0xB, 2)
    patterns = PatternSet()
    parse_sets(patterns, ["cli"], ["sti"])
    every = profile_trace(enc.data, raw, patterns, enc.config)
    some = profile_trace(enc.data, raw, patterns, enc.config, keep=False, longest=7)
    assert len(every.intervals) == 6000 and len(some.intervals) == 7
    assert np.array_equal(every.histograms, some.histograms)
    assert np.array_equal(every.totals, some.totals)
    assert sorted(some.intervals.dt.tolist()) == sorted(every.intervals.dt.tolist())[-7:]
    assert every.every_interval and not some.every_interval


def test_call_path_profile_counts_every_instruction_in_its_path(program):
    """The call-path profile (folded stacks by instructions) is what a stack
    of calls over the path gives, instruction for instruction; the time
    profile adds up to the trace's span."""
    from hwtrace.pt.decode import decode_trace

    run, image = program
    ips = run.ips
    name = _function_namer(image)

    want: dict[str, int] = {}
    stack: list[tuple[int, str]] = []  # (return address, callee name)
    root = name(int(ips[0]))
    for j in range(ips.shape[0]):
        ip = int(ips[j])
        if j:
            prev = int(ips[j - 1])
            kind = _mnemonic(image.read, prev)
            if kind == "call":
                ins = iced_x86.Decoder(64, image.read(prev, 15), ip=prev).decode()
                stack.append((prev + ins.len, name(ip)))
            elif kind == "ret":
                found = [d for d, (r, _) in enumerate(stack) if r == ip]
                if found:
                    del stack[found[-1] :]
                elif not stack:
                    root = name(ip)
        key = ";".join([root, *(n for _, n in stack)])
        want[key] = want.get(key, 0) + 1
    enc, _ = _encode(ips, image, run.end_ip, 4)
    patterns = PatternSet()
    parse_sets(patterns, ["cli"], ["sti"])
    res = profile_trace(enc.data, image, patterns, enc.config, profile=True)
    got = dict(line.rsplit(" ", 1) for line in res.folded(name))
    assert {k: int(v) for k, v in got.items()} == want
    # Each path's text, made once per caller for the paths below it, is
    # its frames' names joined (in any order of asking, the empty path too).
    every = list(range(len(res.paths) - 1, -2, -1))
    for group in (None, lambda g: f"g{g}"):
        assert res.path_texts(every, name, group) == [";".join(res.path_names(p, name, group))
                                                      for p in every]  # fmt: skip
        # The flame graph's tree, a node per path, is the tree of the
        # paths' names.
        rows = [(res.path_names(i - 1, name, group), int(res.path_insns[i]))
                for i in np.flatnonzero(res.path_insns).tolist()]  # fmt: skip
        assert flame_tree(res, res.path_insns, name, group) == call_tree(rows)
    times = decode_trace(enc.data, image, enc.config).block_time.astype(np.int64)
    span = int(times[-1] - times[0])
    assert sum(int(line.rsplit(" ", 1)[1]) for line in res.folded(name, by="time")) == span > 0


def test_timeline_slices_are_the_calls(program, tmp_path):
    """The timeline (every call as a slice) is the stack of calls over the
    path: one slice per call, at its depth, from the time of the callee's
    first block to that of the block its return goes to; and the Chrome
    trace-event file nests them on the thread's track."""
    import json

    from hwtrace.analysis.timeline import call_slices
    from hwtrace.export.timeline import write_timeline
    from hwtrace.pt.decode import decode_trace

    run, image = program
    ips = run.ips
    name = _function_namer(image)

    enc, _ = _encode(ips, image, run.end_ip, 5)
    dec = decode_trace(enc.data, image, enc.config)
    t = np.repeat(dec.block_time.astype(np.int64), dec.block_ninsn.astype(np.int64))
    assert t.shape[0] == ips.shape[0]
    want = []
    stack: list[tuple[int, str, int]] = []  # (return address, callee, entry index)
    for j in range(1, ips.shape[0]):
        ip, prev = int(ips[j]), int(ips[j - 1])
        kind = _mnemonic(image.read, prev)
        if kind == "call":
            ins = iced_x86.Decoder(64, image.read(prev, 15), ip=prev).decode()
            stack.append((prev + ins.len, name(ip), j))
        elif kind == "ret":
            found = [d for d, (r, _, _) in enumerate(stack) if r == ip]
            if found:
                for d in range(len(stack) - 1, found[-1] - 1, -1):
                    want.append((d + 1, stack[d][1], int(t[stack[d][2]]), int(t[j])))
                del stack[found[-1] :]
    end = int(t[-1])
    want += [(d + 1, f, int(t[e]), end) for d, (_, f, e) in enumerate(stack)]  # never returned
    patterns = PatternSet()
    res = profile_trace(enc.data, image, patterns, enc.config, timeline=True)
    sl = call_slices(res)
    got = [(int(d), name(int(a)), int(s), int(e))
           for d, a, s, e in zip(sl.depth, sl.addr, sl.start, sl.end, strict=True)]  # fmt: skip
    assert sorted(x for x in got if x[0] > 0) == sorted(want)
    roots = [x for x in got if x[0] == 0]
    assert roots and roots[0][2] == int(t[0]) and max(r[3] for r in roots) == end
    path = tmp_path / "timeline.json"
    n = write_timeline(path, key=sl.key, start=sl.start, end=sl.end,
                       name=np.arange(len(sl)), names=[g[1] for g in got],
                       pid_of=lambda tid: 42, thread_names={int(sl.key[0]): "driver"})  # fmt: skip
    events = json.loads(path.read_text())["traceEvents"]
    assert n == len(events) == len(sl) + 1
    xs = [e for e in events if e["ph"] == "X"]
    assert all(e["pid"] == 42 and e["tid"] == int(sl.key[0]) for e in xs)
    # Microseconds with the nanoseconds as decimals, each slice once.
    got_us = sorted((e["name"], round(e["ts"] * 1000), round(e["dur"] * 1000)) for e in xs)
    assert got_us == sorted((g[1], g[2], g[3] - g[2]) for g in got)


def test_walk_on_its_own_thread_gives_the_same_profile(program):
    """Walking on a second thread while decoding (the default) changes
    nothing: intervals, counts, the call-path profile and the timeline are
    those of the walk on the decoding thread, with batches small enough
    that many queue up."""
    from hwtrace.pt.flowdec import FlowSink

    run, image = program
    enc, _ = _encode(run.ips, image, run.end_ip, 3)
    patterns = PatternSet()
    parse_sets(patterns, ["cli"], ["sti"])
    rows = FlowSink.BLOCK_ROWS
    FlowSink.BLOCK_ROWS = 64
    try:
        got = [profile_trace(enc.data, image, patterns, enc.config, profile=True, timeline=True,
                             threaded=t) for t in (False, True)]  # fmt: skip
    finally:
        FlowSink.BLOCK_ROWS = rows
    a, b = got
    for f in ("dic", "dt", "t_open", "path", "resolution"):
        assert np.array_equal(getattr(a.intervals, f), getattr(b.intervals, f)), f
    assert a.instructions == b.instructions and a.paths == b.paths
    assert np.array_equal(a.path_insns, b.path_insns) and np.array_equal(a.path_time, b.path_time)
    assert np.array_equal(a.timeline.time, b.timeline.time)
    assert np.array_equal(a.timeline.path, b.timeline.path)
