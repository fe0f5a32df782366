"""Decoding through code revisions (FlowJIT): the flow decoder reads code
as it was at the time of the flow it decodes.

Synthetic traces from the encoder: a path that ran in several versions of
its code (``encode_path(..., versions=...)``), decoded against the files'
image with and without the revisions the path ran in.  The thesis's two
cases: a JIT loop called through a register (41 not-taken and 1 taken
branch), and a static key (a 5-byte NOP patched into a ``jmp`` between two
calls of one function), then one page rewritten several times.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hwtrace.image import Image, Section
from hwtrace.image.revisions import CodeRevisions
from hwtrace.pt.decode import AmbiguousRevision, UnplacedRevision, decode_trace
from hwtrace.pt.encode import encode_path

STATIC = 0x400000
JIT = 0x500000


def _static_code() -> bytes:
    code = bytearray(0x60)

    def put(address: int, hexbytes: str) -> None:
        b = bytes.fromhex(hexbytes)
        code[address - STATIC : address - STATIC + len(b)] = b

    put(0x400000, "48c7c000005000")  # mov rax, 0x500000
    put(0x400007, "ffd0")  # call rax: into the JIT code
    put(0x400009, "e812000000")  # call foo
    put(0x40000E, "ffd3")  # call rbx: the patcher
    put(0x400010, "e80b000000")  # call foo
    put(0x400015, "90")
    put(0x400020, "0f1f440000")  # foo: nop5, the static key's site
    put(0x400025, "b801000000c3")  # mov eax, 1; ret
    put(0x400030, "b802000000c3")  # the key's branch: mov eax, 2; ret
    put(0x400040, "90c3")  # the patcher: nop; ret
    return bytes(code)


# xor ecx, ecx; l: inc ecx; cmp ecx, 42; je out; jmp l; out: ret
LOOP = bytes.fromhex("31c9ffc183f92a7402ebf7c3")
JMP_KEY = bytes.fromhex("e90b000000")  # jmp 0x400030, at 0x400020


def _path() -> tuple[list[int], int, int]:
    """The executed IPs, and where the JIT code and the patched key first ran."""
    path = [0x400000, 0x400007, 0x500000]
    for i in range(42):
        path += [0x500002, 0x500004, 0x500007] + ([0x500009] if i < 41 else [])
    path += [0x50000B, 0x400009, 0x400020, 0x400025, 0x40002A, 0x40000E, 0x400040, 0x400041]
    patched = len(path) + 1
    path += [0x400010, 0x400020, 0x400030, 0x400035, 0x400015]
    return path, 2, patched


@pytest.fixture(scope="module")
def files() -> Image:
    image = Image("files")
    image.add_section(Section.from_bytes(_static_code(), STATIC, "static"))
    return image


def _encode(files: Image, timing: dict, cost: int = 50):
    path, jit_at, patched_at = _path()
    ips = np.array(path, np.uint64)
    versions = np.zeros(len(path), np.int64)
    versions[jit_at:] = 1
    versions[patched_at:] = 2
    with_jit = files.copy()
    with_jit.add_section(Section.from_bytes(LOOP, JIT, "jit"))
    patched = with_jit.copy()
    patched.add_section(Section.from_bytes(JMP_KEY, 0x400020, "key"))
    cycles = np.full(len(path), cost, np.int64)
    enc = encode_path(
        ips, [files, with_jit, patched], versions=versions, cycles=cycles, psb_period=0, **timing
    )
    t0 = timing.get("tsc") or 0
    times = t0 + np.concatenate([[0], np.cumsum(cycles)[:-1]])
    return enc, int(times[jit_at]), int(times[patched_at]), path


TIMINGS = {
    "tsc+mtc+cyc": dict(tsc=100_000, mtc_freq=3, cyc=True, ctc_ratio=2),
    "tsc+mtc": dict(tsc=100_000, mtc_freq=0, ctc_ratio=2),
    "tsc+cyc": dict(tsc=100_000, cyc=True),
}


@pytest.mark.parametrize("timing", TIMINGS.values(), ids=TIMINGS.keys())
def test_jit_and_static_key_decode_exactly_with_revisions(files, timing):
    enc, jit_time, patch_time, _ = _encode(files, timing)
    store = CodeRevisions()
    store.add(JIT, LOOP, jit_time, "capture")
    store.add(0x400020, JMP_KEY, patch_time, "capture")
    flow = decode_trace(enc.data, files, enc.config, revisions=store)
    got = flow.instructions()
    assert not flow.gaps
    assert np.array_equal(got, enc.expected)
    # The JIT loop's exit branch: 41 times not taken, once taken.
    je = np.flatnonzero(got == 0x500007)
    after = got[je + 1]
    assert (after == 0x500009).sum() == 41 and (after == 0x50000B).sum() == 1
    # Revised: every JIT instruction (no file holds them) and the patched
    # jmp; the first call's NOP is the file's own.
    revised = flow.revised()
    assert revised[(got >= JIT)].all()
    key = np.flatnonzero(got == 0x400020)
    assert revised[key].tolist() == [False, True]
    assert int(revised.sum()) == int((got >= JIT).sum()) + 1


def test_without_revisions_decoding_stops_at_the_jit_entry(files):
    enc, *_ = _encode(files, TIMINGS["tsc+mtc+cyc"])
    flow = decode_trace(enc.data, files, enc.config)
    assert flow.gaps and "500000" in str(flow.gaps[0]) and "no memory" in str(flow.gaps[0])
    assert flow.instructions().tolist()[:2] == [0x400000, 0x400007]


def test_without_the_patch_the_decode_is_silently_wrong(files):
    """The JIT code alone: the decode succeeds, with the NOP in both calls."""
    enc, jit_time, _, _ = _encode(files, TIMINGS["tsc+mtc+cyc"])
    store = CodeRevisions()
    store.add(JIT, LOOP, jit_time, "capture")
    flow = decode_trace(enc.data, files, enc.config, revisions=store)
    got = flow.instructions()
    assert not flow.gaps
    assert not np.array_equal(got, enc.expected)
    assert 0x400030 not in got.tolist() and got.tolist().count(0x400025) == 2


def test_no_time_stamps_read_the_latest_code(files):
    """Without timing packets no revision can be placed in time: the
    latest code is used (right for the JIT, wrong for the first call)."""
    enc, jit_time, patch_time, _ = _encode(files, {})
    store = CodeRevisions()
    store.add(JIT, LOOP, jit_time, "capture")
    store.add(0x400020, JMP_KEY, patch_time, "capture")
    flow = decode_trace(enc.data, files, enc.config, revisions=store)
    got = flow.instructions().tolist()
    assert got.count(0x400030) == 2 and 0x500000 in got
    # Not silently: the key's jmp replaced a NOP the trace cannot tell
    # from it; the JIT code replaced nothing.
    (unplaced,) = flow.ambiguous
    assert isinstance(unplaced, UnplacedRevision)
    assert (unplaced.address, unplaced.ips) == (0x400020, (0x400020,))
    assert "cannot be placed" in str(unplaced)


@pytest.mark.parametrize("timing", TIMINGS.values(), ids=TIMINGS.keys())
def test_a_revision_timed_late_is_tried_earlier_inside_its_window(files, timing):
    """A source whose time lags the code's first run (a text_poke seen
    late, a coarse clock): the JIT entry is a gap; inside the modification
    window the decoder tries the revision as beginning at the failure, and
    keeps that decode, which is exact, reporting the revision ambiguous."""
    enc, jit_time, patch_time, _ = _encode(files, timing)
    store = CodeRevisions()
    store.add(JIT, LOOP, jit_time + 5000, "text_poke")
    store.add(0x400020, JMP_KEY, patch_time, "capture")
    late = decode_trace(enc.data, files, enc.config, revisions=store)
    assert len(late.gaps) == 1 and late.gaps[0].ip == JIT and not late.ambiguous
    narrow = decode_trace(enc.data, files, enc.config, revisions=store, revision_window=1000)
    assert len(narrow.gaps) == 1 and not narrow.ambiguous
    flow = decode_trace(enc.data, files, enc.config, revisions=store, revision_window=8000)
    assert not flow.gaps and np.array_equal(flow.instructions(), enc.expected)
    (amb,) = [a for a in flow.ambiguous if isinstance(a, AmbiguousRevision)]
    assert (amb.address, amb.valid_from, amb.source) == (JIT, jit_time + 5000, "text_poke")
    assert amb.used_from == late.gaps[0].time < jit_time + 5000
    assert amb.offset == late.gaps[0].offset and "earlier" in str(amb)


def test_one_page_rewritten_several_times():
    """A JIT page rewritten four times (each a loop of another length),
    each version called once from a caller that loops: every version
    decodes at its time, in one decoder and in parallel chunks."""
    counts = [3, 7, 1, 12, 5]
    # mov rax, JIT; call rax; jmp back to the mov
    caller = Image("caller")
    caller.add_section(Section.from_bytes(bytes.fromhex("48c7c000005000ffd0ebf5"), STATIC))
    images, codes = [caller], []
    path: list[int] = []
    versions: list[int] = []
    for k, n in enumerate(counts):
        codes.append(bytes.fromhex(f"31c9ffc183f9{n:02x}7402ebf7c3"))
        image = caller.copy()
        image.add_section(Section.from_bytes(codes[-1], JIT, f"jit v{k}"))
        images.append(image)
        body = [0x500000]
        for i in range(n):
            body += [0x500002, 0x500004, 0x500007] + ([0x500009] if i < n - 1 else [])
        body.append(0x50000B)
        path += [0x400000, 0x400007, *body, 0x400009]
        versions += [k] * 2 + [k + 1] * len(body) + [k + 1]
    path.append(0x400000)
    versions.append(len(counts))
    ips = np.array(path, np.uint64)
    vers = np.array(versions, np.int64)
    cycles = np.full(len(path), 40, np.int64)
    timing = dict(tsc=5_000, mtc_freq=3, cyc=True, ctc_ratio=2)
    enc = encode_path(ips, images, versions=vers, cycles=cycles, psb_period=256, **timing)
    times = 5_000 + np.concatenate([[0], np.cumsum(cycles)[:-1]])
    store = CodeRevisions()
    for k, code in enumerate(codes):
        store.add(JIT, code, int(times[np.flatnonzero(vers == k + 1)[0]]), "capture")
    assert len(store.boundaries()) == len(counts)
    for jobs in (1, 2):
        flow = decode_trace(
            enc.data, caller, enc.config, revisions=store, jobs=jobs, chunk_bytes=64
        )
        assert not flow.gaps
        assert np.array_equal(flow.instructions(), enc.expected)


# -- real processes, recorded by the software recorder ---------------------------------

PROGRAM = r"""
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int (*fn_t)(void);

/* A uBPF-style program compiled at run time: a loop of 42 iterations. */
static const unsigned char loop_code[] = {
    0x31, 0xc0,       /* xor eax, eax */
    0xff, 0xc0,       /* l: inc eax */
    0x83, 0xf8, 0x2a, /* cmp eax, 42 */
    0x74, 0x02,       /* je out */
    0xeb, 0xf7,       /* jmp l */
    0xc3,             /* out: ret */
};

__attribute__((noinline)) int run_jit(fn_t f) { return f() + 1; }

/* A static key: a 5-byte NOP, patched into a jmp to the "yes" branch.
   The site and its target are kept in a section, as jump labels are. */
__attribute__((noinline)) int foo(int x) {
    x = x * 5 + 1;
    asm volatile("" : "+r"(x));
    asm goto("1: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n\t"
             ".pushsection key_sites, \"aw\"\n\t.quad 1b, %l[yes]\n\t.popsection"
             :::: yes);
    return x + 1;
yes:
    return x * 3;
}

extern const uint64_t __start_key_sites[];

static void patch_key(void) {
    uint64_t site = __start_key_sites[0], target = __start_key_sites[1];
    long pg = sysconf(_SC_PAGESIZE);
    void *page = (void *)(site & ~(uint64_t)(pg - 1));
    unsigned char jmp[5] = {0xe9};
    int32_t rel = (int32_t)(target - (site + 5));
    memcpy(jmp + 1, &rel, 4);
    mprotect(page, 2 * pg, PROT_READ | PROT_WRITE | PROT_EXEC);
    memcpy((void *)site, jmp, 5);
    mprotect(page, 2 * pg, PROT_READ | PROT_EXEC);
}

int main(void) {
    unsigned char *mem = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memcpy(mem, loop_code, sizeof loop_code);
    /* Named for profilers, as JITs do (perf's /tmp/perf-PID.map). */
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
    FILE *map = fopen(path, "w");
    if (map) {
        fprintf(map, "%lx %zx jit_loop\n", (unsigned long)mem, sizeof loop_code);
        fclose(map);
    }
    int r = run_jit((fn_t)mem);
    int a = foo(10);
    patch_key();
    int b = foo(10);
    int total = 0;
    for (int k = 0; k < 4; k++) { /* the same page rewritten: 3, 7, 11, 15 iterations */
        mem[6] = (unsigned char)(3 + 4 * k);
        total += run_jit((fn_t)mem);
    }
    printf("%d %d %d %d\n", r, a, b, total);
    munmap(mem, 4096); /* gone before the trace is decoded */
    return 0;
}
"""


@pytest.fixture(scope="module")
def recorded():
    from test_record_software import SKIP, compile_program

    if SKIP is not None:
        pytest.skip(SKIP)
    from hwtrace.record.software import record_software

    exe = compile_program(PROGRAM, "flowjit", ("-O1", "-g0", "-fno-pie", "-no-pie"))
    rec = record_software([str(exe)], calls=["run_jit", "foo"])
    yield rec
    Path(f"/tmp/perf-{rec.pid}.map").unlink(missing_ok=True)


def _jit_runs(ips: np.ndarray, page: int) -> list[int]:
    """Per call of the JIT code (at ``page``): how often its loop ran."""
    inside = (ips >= page) & (ips < page + 0x1000)
    starts = np.flatnonzero(inside & ~np.r_[False, inside[:-1]])
    ends = np.flatnonzero(inside & ~np.r_[inside[1:], False]) + 1
    return [int((ips[s:e] == page + 2).sum()) for s, e in zip(starts, ends, strict=True)]


def test_recorded_code_changes(recorded):
    rec = recorded
    assert rec.exit_status == 0
    changes = rec.log.changes
    jit_page = next(r.address for r in rec.code_revisions().revisions if r.address >= 1 << 32)
    # The key patched once, then the JIT page rewritten four times.
    assert [c.address == jit_page for c in changes] == [False, True, True, True, True]
    times = [c.time for c in changes]
    assert times == sorted(set(times))
    # The loop ran 42, then 3, 7, 11 and 15 times.
    assert _jit_runs(rec.instructions, jit_page) == [42, 3, 7, 11, 15]


def test_recorded_jit_and_static_key_decode_exactly(recorded):
    rec = recorded
    store = rec.code_revisions()
    files = rec.image()
    flow = decode_trace(rec.data, files, rec.config, revisions=store)
    assert not flow.gaps
    got = flow.instructions()
    assert np.array_equal(got, rec.instructions)
    jit_page = store.revisions[0].address
    assert _jit_runs(got, jit_page) == [42, 3, 7, 11, 15]
    # The first run's exit branch: 41 times not taken, once taken.
    je = np.flatnonzero(got == jit_page + 7)[:42]
    assert (got[je + 1] == jit_page + 9).sum() == 41 and got[je[-1] + 1] == jit_page + 11
    # Flagged: the JIT code (no file holds it) and the patched jmp, which
    # ran once (the second call of foo).
    revised = flow.revised()
    inside = (got >= jit_page) & (got < jit_page + 0x1000)
    assert revised[inside].all()
    assert int(revised[~inside].sum()) == 1
    # Without the store the decode stops where the JIT code is called.
    bare = decode_trace(rec.data, files, rec.config)
    assert bare.gaps and "no memory" in str(bare.gaps[0]) and f"{jit_page:x}" in str(bare.gaps[0])


def test_recorded_static_key_without_its_revision_is_silently_wrong(recorded):
    rec = recorded
    jit_only = CodeRevisions()
    for r in rec.code_revisions().revisions:
        if r.address >= 1 << 32:
            jit_only.add(r.address, r.data, r.valid_from, r.source)
    flow = decode_trace(rec.data, rec.image(), rec.config, revisions=jit_only)
    assert not flow.gaps
    got = flow.instructions()
    assert not np.array_equal(got, rec.instructions)
    # Only the second call of foo differs: it took the NOP, not the jmp.
    assert _jit_runs(got, rec.code_revisions().revisions[0].address) == [42, 3, 7, 11, 15]


def _script(path: Path) -> subprocess.CompletedProcess:
    """``hwtrace script -i path``, which must succeed."""
    out = subprocess.run(
        [sys.executable, "-m", "hwtrace.cli.main", "script", "-i", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out


def test_recorded_jit_through_perf_data(recorded, tmp_path):
    """perf.data carries the revisions (TEXT_POKE records of user code):
    ``hwtrace script`` decodes the JIT code with no gap and names it from
    the process's perf map; Linux perf reads the file too."""
    from hwtrace.perf.data import PerfData
    from hwtrace.record.perfdata import write_perf_data
    from hwtrace.session.perfflow import decode_perf

    path = tmp_path / "jit.data"
    write_perf_data(recorded, path, buildid_cache=False)
    flow = decode_perf(PerfData(str(path)))
    assert not flow.problems and flow.n_gaps == 0 and not flow.queues[0].flow.ambiguous
    assert np.array_equal(flow.queues[0].flow.instructions(), recorded.instructions)
    out = _script(path)
    assert not out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == recorded.instructions.shape[0]
    # xor, then per iteration inc, cmp, je (and jmp but the last), ret
    assert sum("jit_loop" in line for line in lines) == sum(4 * n + 1 for n in (42, 3, 7, 11, 15))
    assert "jit_loop+0x7 (/tmp/perf-" in out.stdout


def test_capture_revisions_added_to_a_perf_data(recorded, tmp_path):
    """What ``hwtrace record --jit`` does after perf: the agent's revisions
    go into the perf.data in time order, placed in perf time through its
    TIME_CONV.  Without them the JIT entry is a gap; with them the decode is
    exact again, and perf still finds every AUXTRACE record (its index moved
    with the inserted bytes)."""
    from hwtrace.perf.data import PerfData
    from hwtrace.perf.records import RecordType
    from hwtrace.perf.rewrite import write_subset
    from hwtrace.record.jitcapture import CaptureResult
    from hwtrace.record.jitrecord import add_code_revisions
    from hwtrace.record.perfdata import write_perf_data
    from hwtrace.record.stepper import CodeChange
    from hwtrace.session.perfflow import decode_perf

    full, path = tmp_path / "full.data", tmp_path / "jit.data"
    write_perf_data(recorded, full, buildid_cache=False)
    data = PerfData(str(full))
    pokes = data.where(RecordType.TEXT_POKE)
    revisions = recorded.code_revisions().revisions
    assert len(pokes) == len(revisions) == 6  # the JIT page's first bytes, then 5 changes
    write_subset(data, path, pokes)
    bare = decode_perf(PerfData(str(path)))
    assert bare.n_gaps > 0
    changes = [CodeChange(r.valid_from, r.address, r.data, r.tid, r.cpu, r.ip) for r in revisions]
    assert add_code_revisions(path, CaptureResult(recorded.pid, changes, {}, 0)) == 6
    again = PerfData(str(path))
    assert [int(t) for t in again.records["time"][again.where(RecordType.TEXT_POKE)]] == [
        int(t) for t in data.records["time"][pokes]
    ]
    flow = decode_perf(again)
    assert not flow.problems and flow.n_gaps == 0
    assert np.array_equal(flow.queues[0].flow.instructions(), recorded.instructions)
    perf = shutil.which("perf")
    if perf is not None:  # Linux perf decodes the same branches from both files

        def branches(p):
            out = subprocess.run([perf, "script", "-i", str(p), "--itrace=b", "-F", "ip,addr"],
                                 capture_output=True, text=True, check=True)  # fmt: skip
            assert "out of order" not in out.stderr
            return out.stdout

        assert branches(path) == branches(full) and branches(path).count("\n") >= 10


def test_a_late_revision_in_perf_data_is_tried_earlier(recorded, tmp_path):
    """The JIT page's first capture placed late in a perf.data (as a
    TEXT_POKE seen late would be): its entry is a gap; with a revision
    window, decode_perf tries it earlier and the flow equals the step log."""
    from hwtrace.perf.data import PerfData
    from hwtrace.perf.records import RecordType
    from hwtrace.perf.rewrite import write_subset
    from hwtrace.record.jitcapture import CaptureResult
    from hwtrace.record.jitrecord import add_code_revisions
    from hwtrace.record.perfdata import write_perf_data
    from hwtrace.record.stepper import CodeChange
    from hwtrace.session.perfflow import decode_perf

    full, path = tmp_path / "full.data", tmp_path / "late.data"
    write_perf_data(recorded, full, buildid_cache=False)
    data = PerfData(str(full))
    write_subset(data, path, data.where(RecordType.TEXT_POKE))
    revisions = recorded.code_revisions().revisions
    jit = revisions[0].address
    first = next(k for k, r in enumerate(revisions) if r.address == jit)
    # Late by the whole first call: to the time of the first instruction
    # after the JIT code returned (every packet of that call is earlier,
    # however the stepping clock ran).
    ips, times = recorded.instructions, recorded.instruction_times.astype(np.int64)
    inside = (ips >= jit) & (ips < jit + 0x1000)
    back = int(np.flatnonzero(~inside & (np.cumsum(inside) > 0))[0])
    step = int(times[back]) - revisions[first].valid_from + 1
    changes = [CodeChange(r.valid_from + (step if k == first else 0), r.address, r.data, r.tid,
                          r.cpu, r.ip) for k, r in enumerate(revisions)]  # fmt: skip
    add_code_revisions(path, CaptureResult(recorded.pid, changes, {}, 0))
    late = decode_perf(PerfData(str(path)))
    retimed = [a for a in late.queues[0].flow.ambiguous if isinstance(a, AmbiguousRevision)]
    assert late.queues[0].flow.gaps and not retimed
    flow = decode_perf(PerfData(str(path)), revision_window=2 * step).queues[0].flow
    assert not flow.gaps and np.array_equal(flow.instructions(), recorded.instructions)
    (amb,) = [a for a in flow.ambiguous if isinstance(a, AmbiguousRevision)]
    assert amb.address == jit and amb.used_from < amb.valid_from


def test_without_mtc_jit_code_decodes_and_script_reports_gaps(tmp_path):
    """TSC only in PSB+ (``record --no-mtc``): the JIT code's first run
    and each rewrite still begin where the recorder placed them, so the
    flow is the stepped one; without its revisions the perf.data decodes
    with a gap at the JIT entry, which ``script`` reports on stderr as
    ``report`` does."""
    from test_record_software import SKIP, compile_program

    if SKIP is not None:
        pytest.skip(SKIP)
    from hwtrace.perf.data import PerfData
    from hwtrace.perf.records import RecordType
    from hwtrace.perf.rewrite import write_subset
    from hwtrace.record.perfdata import write_perf_data
    from hwtrace.record.software import record_software

    exe = compile_program(PROGRAM, "flowjit", ("-O1", "-g0", "-fno-pie", "-no-pie"))
    rec = record_software([str(exe)], calls=["run_jit", "foo"], mtc_period=None)
    Path(f"/tmp/perf-{rec.pid}.map").unlink(missing_ok=True)
    flow = decode_trace(rec.data, rec.image(), rec.config, revisions=rec.code_revisions())
    assert not flow.gaps and not flow.ambiguous
    assert np.array_equal(flow.instructions(), rec.instructions)
    full, bare = tmp_path / "full.data", tmp_path / "bare.data"
    write_perf_data(rec, full, buildid_cache=False)
    out = _script(full)
    assert len(out.stdout.splitlines()) == rec.instructions.shape[0] and not out.stderr
    data = PerfData(str(full))
    write_subset(data, bare, data.where(RecordType.TEXT_POKE))
    out = _script(bare)
    report = subprocess.run(
        [sys.executable, "-m", "hwtrace.cli.main", "report", "-i", str(bare)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    gaps = [line.split("gap ", 1)[1] for line in report.stdout.splitlines() if "gap at" in line]
    said = [line.split("gap ", 1)[1] for line in out.stderr.splitlines() if "gap at" in line]
    assert gaps and said == gaps and "no memory mapped" in said[0]


# -- code rewritten inside one call: a loop patching its own jmp --------------------------

SELF_PATCH = r"""
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

/* Each iteration patches the rel8 of the jmp at 5: to go to 4: (odd n) or
   6: (even n), then runs it: the jmp's bytes change between two of its
   runs, with a handful of branches in between. */
long work(long n);
asm(".text\n.globl work\n.type work,@function\nwork:\n"
    "  xor %eax, %eax\n"
    "1: test $1, %dil\n"
    "  jz 2f\n"
    "  movb $(4f - 3f), 3f-1(%rip)\n"
    "  jmp 5f\n"
    "2: movb $(6f - 3f), 3f-1(%rip)\n"
    "5: .byte 0xeb, 0x00\n"
    "3: nop\n"
    "4: add $3, %rax\n"
    "  jmp 7f\n"
    "6: add $5, %rax\n"
    "7: dec %rdi\n"
    "  jnz 1b\n"
    "  ret\n"
    ".size work, .-work\n");

int main(void) {
    long pg = sysconf(_SC_PAGESIZE);
    void *page = (void *)((uintptr_t)work & ~(uintptr_t)(pg - 1));
    mprotect(page, 2 * pg, PROT_READ | PROT_WRITE | PROT_EXEC);
    printf("%ld\n", work(20));
    return 0;
}
"""

# The recorder's timing settings: TSC with MTC (the default), with CYC too,
# and TSC alone (no MTC), where the time between PSBs is not known.
SELF_PATCH_TIMINGS = {
    "tsc+mtc": {},
    "tsc+mtc+cyc": dict(cyc=True),
    "tsc": dict(mtc_period=None),
}


@pytest.fixture(scope="module")
def self_patch():
    from test_record_software import SKIP, compile_program

    if SKIP is not None:
        pytest.skip(SKIP)
    return compile_program(SELF_PATCH, "selfpatch", ("-O1", "-g0", "-fno-pie", "-no-pie"))


@pytest.mark.parametrize("timing", SELF_PATCH_TIMINGS.values(), ids=SELF_PATCH_TIMINGS.keys())
def test_code_rewritten_inside_one_call_decodes_exactly(self_patch, timing, tmp_path):
    """The stepper sees the jmp rewritten before each of its 20 runs: the
    flow decoded through its revisions is the stepped one, instruction for
    instruction, from the recording and from its perf.data."""
    from hwtrace.perf.data import PerfData
    from hwtrace.record.perfdata import write_perf_data
    from hwtrace.record.software import record_software
    from hwtrace.session.perfflow import decode_perf

    rec = record_software([str(self_patch)], calls=["work"], **timing)
    assert rec.exit_status == 0
    store = rec.code_revisions()
    assert len(store) == len(rec.log.changes) == 20  # a rewrite before each run of the jmp
    flow = decode_trace(rec.data, rec.image(), rec.config, revisions=store)
    assert not flow.gaps and not flow.ambiguous
    assert np.array_equal(flow.instructions(), rec.instructions)
    # Both targets of the jmp, ten times each.
    got = flow.instructions()
    after = got[np.flatnonzero(got == got[0] + 0x18) + 1]
    assert sorted(np.unique(after, return_counts=True)[1].tolist()) == [10, 10]
    path = tmp_path / "selfpatch.data"
    write_perf_data(rec, path, buildid_cache=False)
    perf = decode_perf(PerfData(str(path)))
    assert not perf.problems and perf.n_gaps == 0 and not perf.queues[0].flow.ambiguous
    assert np.array_equal(perf.queues[0].flow.instructions(), rec.instructions)


def test_code_rewritten_where_the_trace_cannot_place_it_is_reported(self_patch, tmp_path):
    """Never silently wrong: without time stamps the latest code is read,
    and every rewrite of the jmp is reported with the jmp's address; with
    them, revisions of a source that does not time them at a trace point
    (a capture agent's) are reported too, the decode being right only if
    each began after the branch before the jmp.  ``script`` says so on
    stderr."""
    from hwtrace.record.perfdata import write_perf_data
    from hwtrace.record.software import record_software

    untimed = record_software([str(self_patch)], calls=["work"], tsc=False, mtc_period=None)
    jmp = int(untimed.instructions[0]) + 0x18
    flow = decode_trace(untimed.data, untimed.image(), untimed.config,
                        revisions=untimed.code_revisions())  # fmt: skip
    assert not np.array_equal(flow.instructions(), untimed.instructions)
    assert len(flow.ambiguous) == 20
    assert all(isinstance(u, UnplacedRevision) and u.ips == (jmp,) for u in flow.ambiguous)
    path = tmp_path / "untimed.data"
    write_perf_data(untimed, path, buildid_cache=False)
    said = [line for line in _script(path).stderr.splitlines() if "cannot be placed" in line]
    assert len(said) == 20 and all(f"at {jmp:#x}" in line for line in said)

    timed = record_software([str(self_patch)], calls=["work"])
    captured = CodeRevisions()
    for r in timed.code_revisions().revisions:
        captured.add(r.address, r.data, r.valid_from, "capture")
    flow = decode_trace(timed.data, timed.image(), timed.config, revisions=captured)
    assert np.array_equal(flow.instructions(), timed.instructions)
    assert len(flow.ambiguous) == 20 and {u.ips for u in flow.ambiguous} == {(jmp,)}


# -- a kernel BPF program's JIT image ---------------------------------------------------

LOADER = """
import json, sys
from hwtrace.filter.ebpf.asm import assemble
from hwtrace.kernel import bpf

insns = assemble("r0 = 0\\nr2 = 0\\nloop:\\nr0 += 3\\nr2 += 1\\nif r2 < 42 goto loop\\nexit\\n")
prog = bpf.Program(bpf.PROG_SOCKET_FILTER, insns, name="flowjit_loop")
image = prog.jited_image()
retval, _ = prog.test_run(bytes(64))
json.dump({"id": image.id, "name": image.name, "tag": image.tag.hex(),
           "code": image.code.hex(), "addresses": image.addresses, "lengths": image.lengths,
           "retval": retval}, open(sys.argv[1], "w"))
prog.close()
"""


def _bpf_skip() -> str | None:
    import os
    import shutil

    if os.geteuid() != 0:
        return "needs root (BPF programs, perf record -a)"
    if shutil.which("perf") is None:
        return "needs perf (Debian's linux-perf)"
    try:
        from hwtrace.kernel import bpf

        bpf.Map(bpf.MAP_ARRAY, 4, 8, 1).close()
    except Exception as e:
        return f"BPF is not usable here: {e}"
    return None


def _emulate(code: bytes, address: int) -> tuple[list[int], int]:
    """The IPs a JIT image runs from its entry to its way out (a jump to
    the return thunk, kernel text, where the kernel has one, else a plain
    return), executed by unicorn, and where control went from there.
    Unicorn does not run code at kernel addresses, so the image runs at a
    user-space alias with the same page offset (its branches are relative)
    and the IPs are moved back."""
    import unicorn
    from unicorn import x86_const as X

    alias = 0x1000_0000 + (address & 0xFFF)
    uc = unicorn.Uc(unicorn.UC_ARCH_X86, unicorn.UC_MODE_64)
    uc.mem_map(alias & ~0xFFF, 0x2000)
    uc.mem_write(alias, code)
    uc.mem_map(0x7000_0000, 0x10000)
    uc.reg_write(X.UC_X86_REG_RSP, 0x7000_F000)
    ips: list[int] = []
    uc.hook_add(unicorn.UC_HOOK_CODE, lambda _uc, ip, _size, _data: ips.append(ip))
    back = 0x6000_0000  # where the plain return goes: not mapped either
    uc.mem_write(0x7000_F000, back.to_bytes(8, "little"))
    if code[-1] == 0xC3:  # ret
        last, out = alias + len(code) - 1, back
    else:
        assert code[-5] == 0xE9  # jmp rel32 to the return thunk
        last = alias + len(code) - 5
        out = (last + 5 + int.from_bytes(code[-4:], "little", signed=True)) & ((1 << 64) - 1)
    try:
        uc.emu_start(alias, 0, count=10_000)
    except unicorn.UcError as e:  # fetching the thunk, which is not mapped here
        assert e.errno == unicorn.UC_ERR_FETCH_UNMAPPED
    assert uc.reg_read(X.UC_X86_REG_RIP) == out and ips[-1] == last
    moved = [ip - alias + address for ip in ips]
    return moved, (out if out == back else out - alias + address)


@pytest.mark.skipif(_bpf_skip() is not None, reason=str(_bpf_skip()))
def test_kernel_bpf_jit_image_from_perf_decodes_exactly(tmp_path):
    """A BPF program loaded and run while ``perf record -a`` watched: its
    KSYMBOL, BPF_EVENTs and JIT image (perf's BPF_PROG_INFO) come out of
    perf.data equal to what BPF_OBJ_GET_INFO_BY_FD gave while it was
    loaded; a trace through that kernel address range (encoded from the
    path unicorn runs through the captured bytes) decodes exactly with the
    revisions, and is a gap without them."""
    import json

    from hwtrace.kernel import bpf
    from hwtrace.perf.code import ksymbols
    from hwtrace.perf.data import PerfData
    from hwtrace.perf.intelpt import sideband_of
    from hwtrace.perf.records import RecordType

    (tmp_path / "load.py").write_text(LOADER)
    data_path, out = tmp_path / "bpf.data", tmp_path / "image.json"
    run = subprocess.run(
        ["perf", "record", "-q", "-a", "-e", "dummy", "-o", str(data_path), "--",
         sys.executable, str(tmp_path / "load.py"), str(out)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    loaded = json.loads(out.read_text())
    assert loaded["retval"] == 3 * 42  # it ran in the kernel
    data = PerfData(str(data_path))
    image = bpf.JitedImage(
        loaded["id"], loaded["name"], bytes.fromhex(loaded["tag"]),
        bytes.fromhex(loaded["code"]), loaded["addresses"], loaded["lengths"],
    )  # fmt: skip
    # KSYMBOL says where and when (load to unload), BPF_EVENT which program.
    (sym,) = [k for k in ksymbols(data) if k.name == image.symbol]
    assert (sym.address, sym.size) == (image.addresses[0], len(image.code))
    assert sym.end is not None
    rows = np.flatnonzero(data.records["type"] == RecordType.BPF_EVENT).tolist()
    events = [data.record(i).body for i in rows]
    assert {e.type for e in events if e.id == image.id} == {1, 2}  # load, unload
    store = CodeRevisions()
    assert bpf.add_images(store, [image], sym.start) == 1
    (rev,) = store.revisions
    # perf keeps the image too (BPF_PROG_INFO) when its side-band thread
    # read it before the program went: then the same bytes, in the
    # sideband's store.
    kept = sideband_of(data).code_revisions(-1, None)
    for r in kept.revisions if kept is not None else []:
        if r.name == image.symbol:
            assert (r.address, r.data, r.valid_from) == (rev.address, rev.data, rev.valid_from)
    path, end_ip = _emulate(rev.data, rev.address)
    ips = np.array(path, np.uint64)
    start = rev.valid_from + 1_000  # perf time as the trace's time
    enc = encode_path(
        ips, store.overlay(None, store.epoch(start)), tsc=start, mtc_freq=3, cyc=True,
        ctc_ratio=2, psb_period=0, end_ip=end_ip if rev.data[-1] == 0xC3 else None,
    )  # fmt: skip
    assert np.array_equal(enc.expected, ips)
    nothing = Image("kernel without BPF")
    flow = decode_trace(enc.data, nothing, enc.config, revisions=store)
    assert not flow.gaps
    got = flow.instructions()
    assert np.array_equal(got, ips)
    jb = np.flatnonzero(got == rev.address + rev.data.index(bytes.fromhex("72f2")))
    assert jb.shape[0] == 42 and (got[jb[:-1] + 1] < got[jb[:-1]]).all()
    assert flow.revised().all()
    bare = decode_trace(enc.data, nothing, enc.config)
    assert bare.gaps and "no memory" in str(bare.gaps[0])


# -- a JIT in the wild: CPython's perf trampolines ----------------------------------------

# f runs once before "ready": its trampoline and the jitdump's or perf map's
# entry for it exist before hwtrace attaches, on a busy machine too (else
# its first call may come under the recorder, whose own capture of the new
# code then precedes the entry that names it).
# SIGINT ends the target (KeyboardInterrupt) even when it was started with
# SIGINT ignored, as a shell's background job starts its children.
PY_TARGET = """
import signal
import time
signal.signal(signal.SIGINT, signal.default_int_handler)
def f(x):
    return x + 1
f(0)
print("ready", flush=True)
while True:
    f(1)
    time.sleep(0.002)
"""


def _cpython_with_perf() -> str | None:
    """A CPython 3.12+ whose ``-X perf`` works (pyenv's, or on PATH)."""
    import glob
    import shutil

    found = sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.1[2-9]*/bin/python3.1[2-9]")))
    found += [p for p in (shutil.which("python3.12"), shutil.which("python3.13")) if p]
    probe = "import os, sys; print(os.getpid(), sys.is_stack_trampoline_active())"
    for exe in found:
        run = subprocess.run(
            [exe, "-X", "perf", "-c", probe], capture_output=True, text=True, check=False
        )
        words = run.stdout.split()
        if len(words) == 2:
            Path(f"/tmp/perf-{words[0]}.map").unlink(missing_ok=True)  # the probe's own
            if words[1] == "True":
                return exe
    return None


def _start_cpython(exe: str, option: str, tmp_path: Path) -> subprocess.Popen:
    """``exe -X option`` running :data:`PY_TARGET` (read its "ready")."""
    script = tmp_path / "target.py"
    script.write_text(PY_TARGET)
    return subprocess.Popen([exe, "-X", option, str(script)], stdout=subprocess.PIPE, text=True)


def _record_trampolines(proc: subprocess.Popen, exe: str, instructions: int):
    """Once it is ready, attach the software recorder to each call of
    CPython's trampoline evaluator, for ``instructions``."""
    from hwtrace.record.software import record_software

    assert proc.stdout.readline().strip() == "ready"
    library = next(Path(exe).resolve().parent.parent.glob("lib/libpython3.1*.so.1.0"), None)
    where = f"{library.name}!" if library is not None else ""
    return record_software(
        proc.pid, calls=[f"{where}py_trampoline_evaluator"], max_instructions=instructions
    )


def test_cpython_perf_trampolines_decode_with_names(tmp_path):
    """CPython 3.12's ``-X perf`` runs each Python call through a trampoline
    copied into anonymous executable memory and names it in
    /tmp/perf-PID.map.  Recorded by attaching: the trampoline code decodes
    with no gap through the recorder's revisions (without them, a gap at
    each call), equal to the step log, and ``hwtrace script`` names it."""
    from test_record_software import SKIP

    if SKIP is not None:
        pytest.skip(SKIP)
    exe = _cpython_with_perf()
    if exe is None:
        pytest.skip("no CPython 3.12+ with -X perf (pyenv's or on PATH)")
    from hwtrace.record.perfdata import write_perf_data

    proc = _start_cpython(exe, "perf", tmp_path)
    perf_map = Path(f"/tmp/perf-{proc.pid}.map")
    try:
        rec = _record_trampolines(proc, exe, 6000)
    finally:
        proc.kill()
        proc.wait()
    try:
        store = rec.code_revisions()
        (trampolines,) = store.revisions  # the arena page, not in any file
        flow = decode_trace(rec.data, rec.image(), rec.config, revisions=store)
        assert not flow.gaps
        got = flow.instructions()
        assert np.array_equal(got, rec.instructions)
        inside = (got >= trampolines.address) & (got < trampolines.end)
        assert inside.any() and flow.revised()[inside].all()
        bare = decode_trace(rec.data, rec.image(), rec.config)
        assert bare.gaps and all("no memory" in str(g) for g in bare.gaps)

        path = tmp_path / "py.data"
        write_perf_data(rec, path, buildid_cache=False)
        out = _script(path)
        lines = out.stdout.splitlines()
        assert len(lines) == got.shape[0]
        named = [line for line in lines if "py::f:" in line]
        assert len(named) == int(inside.sum())
        assert f"(/tmp/perf-{proc.pid}.map)" in named[0]
    finally:
        perf_map.unlink(missing_ok=True)


# -- bad input ---------------------------------------------------------------------------


def test_a_missing_revision_is_a_gap_at_the_jit_entry_and_decoding_resumes():
    """The store lacks the JIT code's first revision: an explicit gap where
    the JIT code is entered (no file or revision holds it), and the
    decoder resumes at the next PSB, keeping the rest of the flow."""
    from test_record_software import SKIP, compile_program

    if SKIP is not None:
        pytest.skip(SKIP)
    from hwtrace.record.software import record_software

    exe = compile_program(PROGRAM, "flowjit", ("-O1", "-g0", "-fno-pie", "-no-pie"))
    rec = record_software([str(exe)], calls=["run_jit", "foo"], psb_period=256)
    Path(f"/tmp/perf-{rec.pid}.map").unlink(missing_ok=True)
    full = rec.code_revisions()
    entry = full.revisions[0]  # the JIT page's first capture
    partial = CodeRevisions()
    for r in full.revisions[1:]:
        partial.add(r.address, r.data, r.valid_from, r.source)
    flow = decode_trace(rec.data, rec.image(), rec.config, revisions=partial)
    assert flow.gaps
    gap = flow.gaps[0]
    assert gap.ip == entry.address and "no memory mapped" in gap.reason
    got = flow.instructions()
    # Everything before the gap, exactly; after it, the flow from the next
    # PSB on: the end of the recording is there again.
    before = int(np.flatnonzero(rec.instructions == entry.address)[0])
    assert np.array_equal(got[:before], rec.instructions[:before])
    tail = got[before:]
    assert tail.shape[0] > 0
    assert np.array_equal(tail, rec.instructions[-tail.shape[0] :])


def test_jit_names_from_damaged_or_foreign_files(tmp_path):
    """A truncated jitdump keeps the functions before the damage, one of
    another process is refused, a perf map's bad line is named: each a
    problem with its place, never an exception."""
    from hwtrace.image.jitdump import JitCode, encode_jitdump, jit_symbols

    codes = [
        JitCode("first", 0x7000_0000, 16, 10, 4242, 4242, code=b"\x90" * 16),
        JitCode("second", 0x7000_0100, 16, 20, 4242, 4242, code=b"\xc3" * 16),
    ]
    whole = encode_jitdump(4242, codes, close=False)
    mine = tmp_path / "jit-4242.dump"
    mine.write_bytes(whole[:-10])  # the second record cut short
    other = tmp_path / "jit-77.dump"
    other.write_bytes(encode_jitdump(77, codes))
    symbols, problems = jit_symbols(4242, [str(mine), str(other)])
    assert [symbols.name(i) for i in range(len(symbols))] == ["first"]
    text = [str(p) for p in problems]
    assert any(str(mine) in t and "offset" in t for t in text), text
    assert any(str(other) in t and "77" in t for t in text), text


def test_jitdump_code_joins_the_processes_revisions(tmp_path):
    """A process that mapped its jitdump (as JITs do for perf): the code of
    each load becomes a revision of that process's code from the load's
    time; a source that disagrees at the same time is a conflict; a
    foreign file is a problem, not code."""
    from hwtrace.image.jitdump import JitCode, encode_jitdump
    from hwtrace.perf.sideband import BinaryLocator, CodeRevision, Sideband

    code = bytes.fromhex("b82a000000c3")
    dump = tmp_path / "jit-4242.dump"
    dump.write_bytes(encode_jitdump(4242, [JitCode("jitted", 0x7000_0000, 6, 100, 4242, 4242,
                                                  code=code)]))  # fmt: skip
    foreign = tmp_path / "jit-77.dump"
    foreign.write_bytes(encode_jitdump(77, []))
    sb = Sideband()
    sb.add_comm(1, 4242, 4242, "jit", exec=True)
    sb.add_mmap(5, 4242, 0x7F00_0000, 4096, 0, str(dump))
    sb.add_mmap(6, 4242, 0x7F00_1000, 4096, 0, str(foreign))
    problems = sb.add_jitdump_code(BinaryLocator(), None)
    assert len(problems) == 1 and "77" in problems[0]
    store = sb.code_revisions(4242, None)
    (rev,) = store.revisions
    assert (rev.address, rev.data, rev.valid_from, rev.source, rev.name) == (
        0x7000_0000, code, 100, "jitdump", "jitted",
    )  # fmt: skip
    assert sb.code_revisions(1, None) is None  # another process's code
    sb.add_revision(CodeRevision(100, "text_poke", 0x7000_0000, 6, "", b"", b"\x90" * 6, 4242))
    sb.code_revisions(4242, None)
    (conflict,) = sb.revision_conflicts()
    assert "disagree" in conflict and "0x70000000" in conflict


def test_cpython_jitdump_joins_the_revisions(tmp_path):
    """CPython 3.13's ``-X perf_jit`` writes a jitdump and maps it: the
    perf decoders take its code as revisions of the process next to the
    recorder's own captures, with no conflict between them, decode with no
    gap, and name the trampolines from it."""
    import glob
    import signal as signals

    from test_record_software import SKIP

    if SKIP is not None:
        pytest.skip(SKIP)
    found = sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.1[3-9]*/bin/python3.1[3-9]")))
    if not found:
        pytest.skip("no CPython 3.13+ (pyenv's) for -X perf_jit")
    exe = found[0]
    from hwtrace.perf.data import PerfData
    from hwtrace.record.perfdata import write_perf_data
    from hwtrace.session.perfflow import decode_perf

    proc = _start_cpython(exe, "perf_jit", tmp_path)
    dump = Path(f"/tmp/jit-{proc.pid}.dump")
    try:
        rec = _record_trampolines(proc, exe, 3000)
        proc.send_signal(signals.SIGINT)  # a clean exit: the jitdump is written whole
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
            keep = ("State", "TracerPid", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
            pytest.fail("no exit on SIGINT: " + "; ".join(x for x in status if x.startswith(keep)))
        assert str(dump) in [m.path for m in rec.mmaps]
        path = tmp_path / "py.data"
        write_perf_data(rec, path, buildid_cache=False)
        flow = decode_perf(PerfData(str(path)))
        assert flow.n_gaps == 0 and not flow.problems, flow.problems
        assert np.array_equal(flow.queues[0].flow.instructions(), rec.instructions)
        store = flow.sideband.code_revisions(rec.pid, None)
        # The recorder's own (timed at trace points, as noted beside the
        # file) where the stepped stretch reached other run-time code.
        sources = {r.source for r in store.revisions}
        assert "jitdump" in sources and sources <= {"jitdump", "stepper"}
        assert not store.conflicts
        lines = _script(path).stdout.splitlines()
        assert any("py::f:" in line and f"(/tmp/jit-{proc.pid}.dump)" in line for line in lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        dump.unlink(missing_ok=True)
        Path(f"/tmp/perf-{proc.pid}.map").unlink(missing_ok=True)
