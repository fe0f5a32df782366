"""Every file or directory a command writes is checked when its command
line is read: a missing directory (or a directory where a file goes, a
file where a directory goes) is one usage error before any work, not a
traceback at the end of it.  What the checks cannot foresee (a file
system that refuses the name) is one line too."""

from __future__ import annotations

from pathlib import Path

import pytest

from hwtrace.cli.main import main

QUIPPER = str(Path(__file__).resolve().parents[1] / "data" / "real" / "quipper-intel_pt")

# (command line before the option, the option, a file (or a directory))
OUTPUTS = [
    (["report", "-i", QUIPPER], "--html", "file"),
    (["report", "-i", QUIPPER], "--folded", "file"),
    (["report", "-i", QUIPPER], "--timeline", "file"),
    (["latency", "-i", QUIPPER, "--open", "cli", "--close", "sti"], "--json", "file"),
    (["latency", "-i", QUIPPER, "--open", "cli", "--close", "sti"], "--html", "file"),
    (["funclatency", "-i", QUIPPER, "main"], "--json", "file"),
    (["diff", QUIPPER, QUIPPER], "--json", "file"),
    (["diff", QUIPPER, QUIPPER], "--html", "file"),
    (["diff", QUIPPER, QUIPPER], "--folded-diff", "file"),
    (["events", "-i", QUIPPER], "--json", "file"),
    (["characterize", "-i", QUIPPER], "--json", "file"),
    (["characterize", "-i", QUIPPER], "--html", "file"),
    (["ptwrite", "-i", QUIPPER], "--json", "file"),
    (["ptwrite", "-i", QUIPPER], "--ctf", "dir"),
    (["bts", "-i", QUIPPER], "--json", "file"),
    (["vm", "-i", QUIPPER], "--html", "file"),
    (["vm", "-i", QUIPPER], "--perfetto", "file"),
    (["vm", "-i", QUIPPER], "--ctf", "dir"),
    (["vm", "-i", QUIPPER], "--intervals", "file"),
    (["report", "-i", QUIPPER], "--paths", "file"),
    (["filter", "a == 1", QUIPPER], "-o", "file"),
    (["filter-compile", "a == 1"], "-o", "file"),
    (["filter-compile", "a == 1"], "--header", "file"),
    (["decode"], "--perf-data", "file"),
    (["csdump", QUIPPER, "--protocol", "stm"], "--json", "file"),
    (["probe", "-p", "1", "main"], "--json", "file"),
    (["record"], "-o", "file"),
]


@pytest.mark.parametrize(("head", "option", "kind"), OUTPUTS,
                         ids=[f"{h[0]} {o}" for h, o, _ in OUTPUTS])  # fmt: skip
def test_an_output_where_none_can_be_is_a_usage_error(head, option, kind, tmp_path, capsys):
    args = [*head, option]
    missing = tmp_path / "no" / "out"
    with pytest.raises(SystemExit) as exit_:
        main([*args, str(missing), *(["--", "/bin/true"] if head == ["record"] else [])])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"{option}" in err and f"no directory {missing.parent}" in err
    wrong = tmp_path
    if kind == "dir":
        wrong = tmp_path / "a-file"
        wrong.touch()
    with pytest.raises(SystemExit) as exit_:
        main([*args, str(wrong), *(["--", "/bin/true"] if head == ["record"] else [])])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and ("a directory, not a file" if kind == "file"
                                      else "a file, not a directory") in err  # fmt: skip
    assert not missing.parent.exists()


def test_a_write_the_checks_cannot_foresee_is_one_line(tmp_path, capsys):
    """/proc takes no new files, whatever its permissions say."""
    assert main(["report", "-i", QUIPPER, "--html", "/proc/hwtrace-report.html"]) == 1
    err = capsys.readouterr().err
    assert "hwtrace report: /proc/hwtrace-report.html:" in err and "Traceback" not in err


@pytest.mark.parametrize("head", [["script", "-i", QUIPPER], ["report", "-i", QUIPPER],
                                  ["diff", QUIPPER, QUIPPER], ["bts", "-i", QUIPPER],
                                  ["latency", "-i", QUIPPER, "--open", "cli", "--close", "sti"]],
                         ids=lambda h: h[0])  # fmt: skip
def test_a_symfs_that_is_no_directory_is_a_usage_error(head, tmp_path, capsys):
    """--symfs naming nothing (a typo) was taken silently: every binary
    then went missing, its code decoded as gaps."""
    for symfs, message in ((tmp_path / "typo", "no such directory"),
                           (Path(QUIPPER), "not a directory")):  # fmt: skip
        with pytest.raises(SystemExit) as exit_:
            main([*head, "--symfs", str(symfs)])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and f"--symfs: {symfs}: {message}" in err


@pytest.mark.parametrize(("args", "message"), [
    (["trace", "-d", "-1", "sched:sched_switch"], "--duration: -1: a number of seconds, 0 or"),
    (["trace", "-d", "nan", "sched:sched_switch"], "--duration: nan: a number of seconds"),
    (["trace", "-p", "-1", "sched:sched_switch"], "--pid: -1: not a process id"),
    (["trace", "--max-string", "-3", "sched:sched_switch"], "--max-string: -3: 1 to 8191 bytes"),
    (["probe", "-p", "1", "-i", "-2", "main"], "--interval: -2: a number of seconds"),
    (["probe", "-p", "-5", "main"], "--pid: -5: not a process id"),
    (["record", "-p", "0"], "--pid: 0: not a process id"),
    (["record", "--mtc-period", "99", "--", "/bin/true"], "--mtc-period: 99: not 0 to 15"),
    (["record", "--cyc-thresh", "-1", "--", "/bin/true"], "--cyc-thresh: -1: not 0 to 15"),
    (["record", "--psb-period", "0", "--", "/bin/true"], "--psb-period: 0: not a number of bytes"),
    (["record", "-p", "1", "--", "/bin/true"], "or a --pid to attach to, not both"),
])  # fmt: skip
def test_durations_and_process_ids_are_checked_when_read(args, message, capsys):
    """A negative pid was an OverflowError traceback (trace -p -1); a
    negative or NaN duration ran anyway; record --mtc-period 99 launched and
    patched the program and then failed in a traceback."""
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_trace_of_a_process_that_is_not_there_says_so(capsys):
    """perf trace -p says so too; it traced nothing for the whole duration."""
    pid = 2**22 + 12345  # (past pid_max's default: never a process)
    assert main(["trace", "-d", "0.1", "-p", str(pid), "sched:sched_switch"]) == 1
    assert f"no process with pid {pid}" in capsys.readouterr().err
