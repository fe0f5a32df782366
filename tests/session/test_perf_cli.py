"""`hwtrace record`, `report` and `script` on a real program (the demo)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HWTRACE = [sys.executable, "-m", "hwtrace.cli.main"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*HWTRACE, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from test_record_software import SKIP

    if SKIP is not None:
        pytest.skip(SKIP)
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    d = tmp_path_factory.mktemp("demo")
    exe = d / "demo"
    subprocess.run(["gcc", "-O2", "-o", exe, ROOT / "examples/demo/demo.c"], check=True)
    data = d / "demo.data"
    # The stepper (its times are stepping times), as the demo shows it.
    args = ["--backend", "step", "-o", str(data), "-f", "checksum", "-f", "digest"]
    out = run("record", *args, "--", str(exe), "9")
    assert out.returncode == 0, out.stderr
    return exe, data, out


def test_record_says_which_backend_and_timing(recorded):
    from hwtrace.perf.data import read_perf_data
    from hwtrace.perf.features import Feature

    exe, data, out = recorded
    assert "backend software: ptrace single-step" in out.stderr
    assert "stepping times" in out.stderr
    assert "checksum(9) =" in out.stdout
    assert data.stat().st_size > 0
    # The header keeps the command that recorded it, as perf keeps its own.
    want = ["hwtrace", "record", "--backend", "step", "-o", str(data), "-f", "checksum", "-f",
            "digest", "--", str(exe), "9"]  # fmt: skip
    assert read_perf_data(data).features[Feature.CMDLINE] == want


def test_report_lists_functions_and_folded_stacks(recorded, tmp_path):
    _, data, _ = recorded
    folded = tmp_path / "f.txt"
    out = run("report", "-i", str(data), "--folded", str(folded))
    assert out.returncode == 0, out.stderr
    assert "demo!digest" in out.stdout and "demo!checksum" in out.stdout
    assert "0 gap(s)" in out.stdout
    lines = folded.read_text().splitlines()
    assert any(line.startswith("demo;demo!checksum;demo!digest ") for line in lines)


def test_script_lists_every_instruction(recorded):
    _, data, _ = recorded
    out = run("script", "-i", str(data))
    assert out.returncode == 0, out.stderr
    rows = out.stdout.splitlines()
    assert rows[0].split()[-2] == "checksum+0x0" and len(rows) > 100
    blocks = run("script", "-i", str(data), "--blocks")
    assert len(blocks.stdout.splitlines()) < len(rows)


PERF_LISTING = ["--itrace=i0ns", "-F", "comm,tid,time,ip,sym,symoff,dso"]


def _untimed(line: str) -> str:
    """A listing line without its time's digits."""
    head, _, rest = line.partition(":  ")
    return head.rsplit(" ", 1)[0] + ":  " + rest


def test_script_takes_perfs_spelling_of_its_listing(recorded):
    """perf script's options for what hwtrace script lists are taken, and
    the text is perf's (times in microseconds without --ns); options for
    anything else are one line naming what is listed."""
    _, data, _ = recorded
    plain = run("script", "-i", str(data))
    with_ns = run("script", "-i", str(data), *PERF_LISTING, "--ns")
    assert with_ns.returncode == 0, with_ns.stderr
    assert with_ns.stdout == plain.stdout
    usec = run("script", "-i", str(data), *PERF_LISTING)
    assert usec.returncode == 0, usec.stderr
    first = usec.stdout.splitlines()[0]
    assert first.split()[2].endswith(":") and len(first.split()[2].split(".")[1]) == 7
    if shutil.which("perf") is not None:
        for extra in (["--ns"], []):
            perf = subprocess.run(["perf", "script", "-i", str(data), *PERF_LISTING, *extra],
                                  capture_output=True, text=True, timeout=300)  # fmt: skip
            assert perf.returncode == 0, perf.stderr
            # (the text, and the times' form; the times themselves are each
            # decoder's timing model's, compared elsewhere)
            ours = (with_ns if extra else usec).stdout.splitlines()
            theirs = perf.stdout.splitlines()
            assert [_untimed(line) for line in ours] == [_untimed(line) for line in theirs]
            assert [len(line) for line in ours] == [len(line) for line in theirs]
    for bad, says in (("--itrace=b", "'b' (branches)"), ("--itrace=i100us", "not a sample"),
                      ("--itrace=e", "lists instructions (i) and PTWRITEs (w)"),
                      ("-Fip,sym", "comm,tid,time,ip,sym,symoff,dso")):  # fmt: skip
        out = run("script", "-i", str(data), bad)
        assert out.returncode == 2 and says in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


def test_a_recording_cut_short_lists_what_it_holds(recorded, tmp_path):
    """A perf.data cut inside its trace (perf killed, a disk full): the
    trace up to the cut is decoded, its instructions those of the whole
    recording's start, and the cut is named at its record."""
    from hwtrace.perf.data import read_perf_data

    _, data, _ = recorded
    whole = run("script", "-i", str(data))
    assert whole.returncode == 0, whole.stderr
    aux = read_perf_data(str(data)).auxtrace_columns()
    assert len(aux["size"]) and int(aux["size"][-1]) > 200
    cut = tmp_path / "cut.data"
    cut.write_bytes(data.read_bytes()[: int(aux["data_offset"][-1] + aux["size"][-1] // 2)])
    out = run("script", "-i", str(cut))
    assert out.returncode == 0, out.stderr
    assert "cut short by the end of the data" in out.stderr and "Traceback" not in out.stderr
    got, want = out.stdout.splitlines(), whole.stdout.splitlines()
    assert 0 < len(got) < len(want) and got == want[: len(got)]


def test_profile_by_key_is_the_profile_of_laid_out_blocks(recorded):
    """report's profile read from blocks given by key and times as runs (a
    stream without code runs, the decoder replaying) is the profile of the
    same blocks laid out row by row."""
    import numpy as np

    from hwtrace.analysis.profile import ThreadProfiler
    from hwtrace.session import PerfSession

    _, data, _ = recorded
    got = []
    for kw in ({}, {"runs": False, "batch_rows": 1 << 6}):
        s = PerfSession.open(str(data))
        p = ThreadProfiler()
        s.decode(p.add_blocks, **kw)
        got.append(p.result(s.comm))
    a, b = got
    assert a.names == b.names and a.instructions == b.instructions > 0
    assert [(t.tid, t.pid, t.instructions, t.span_ns) for t in a.threads] == [
        (t.tid, t.pid, t.instructions, t.span_ns) for t in b.threads
    ]
    for x, y in zip(a.threads, b.threads, strict=True):
        np.testing.assert_array_equal(x.by_insn, y.by_insn)
        np.testing.assert_array_equal(x.by_time, y.by_time)


def test_bad_input_is_one_clear_line(tmp_path):
    junk = tmp_path / "junk.data"
    junk.write_bytes(b"not a perf file at all")
    for cmd in ("report", "script"):
        out = run(cmd, "-i", str(junk))
        assert out.returncode == 1
        assert out.stderr.count("\n") == 1 and "not a perf.data file" in out.stderr
        assert "Traceback" not in out.stderr
    # Stepping needs chosen code (the patch backend records a whole program).
    out = run("record", "--backend", "step", "--", "true")
    assert out.returncode == 2 and "give -f FUNCTION" in out.stderr
    out = run("record", "-f", "main")
    assert out.returncode == 2 and "command to launch" in out.stderr


def test_report_names_a_changed_binary_and_counts_gaps(recorded, tmp_path):
    """The binary was rebuilt after recording: its build id differs from the
    one the perf.data keeps, so its code is not trusted: the report names
    the file, counts the gaps, and still reports what it could decode."""
    exe, _, _ = recorded
    copy = tmp_path / "demo"
    shutil.copy(exe, copy)
    data = tmp_path / "demo.data"
    # checksum calls into libc (printf's helpers are not traced, but memcpy-like
    # code in digest is the program's own): record, then rebuild the program.
    out = run(
        "record", "--backend", "step", "-o", str(data), "-f", "checksum", "--", str(copy), "5"
    )
    assert out.returncode == 0, out.stderr
    good = run("report", "-i", str(data))
    assert "0 gap(s)" in good.stdout and "since recording" not in good.stdout
    subprocess.run(
        ["gcc", "-O1", "-DCHANGED=1", "-o", copy, ROOT / "examples/demo/demo.c"], check=True
    )
    bad = run("report", "-i", str(data))
    assert bad.returncode == 0, bad.stderr
    text = " ".join(bad.stdout.split())
    assert f"{copy}: build id" in text and "changed since recording" in text, text
    gaps = int(text.split(" gap(s)")[0].rsplit(" ", 1)[-1])
    assert gaps > 0
    assert "Traceback" not in bad.stderr


def test_report_call_paths_by_thread_and_inclusive(recorded, tmp_path):
    """``--group thread`` roots every path at its thread; ``--paths`` gives
    each path with everything under it; ``--by time`` weighs by time."""
    _, data, _ = recorded
    folded, paths, timed = tmp_path / "f.txt", tmp_path / "p.txt", tmp_path / "t.txt"
    out = run("report", "-i", str(data), "--folded", str(folded), "--paths", str(paths),
              "--group", "thread")  # fmt: skip
    assert out.returncode == 0, out.stderr

    def read(path: Path) -> dict[str, int]:
        return {k: int(v) for k, v in (x.rsplit(" ", 1) for x in path.read_text().splitlines())}

    own, under = read(folded), read(paths)
    assert own and all(k.split(";")[0].startswith("demo/") for k in own)
    assert set(own) <= set(under)
    for path, weight in under.items():
        assert weight == sum(v for k, v in own.items() if k == path or k.startswith(path + ";"))
    out = run("report", "-i", str(data), "--folded", str(timed), "--by", "time")
    assert out.returncode == 0, out.stderr
    assert sum(read(timed).values()) > 0
    # (the functions' table ranks by time too)
    times = [float(line.split("│")[3].replace(",", "")) for line in out.stdout.splitlines()
             if line.count("│") == 4]  # fmt: skip
    assert len(times) >= 2 and times == sorted(times, reverse=True) and times[-1] > 0
