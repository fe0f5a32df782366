"""A file a command reads whole (raw PT for ``ptwrite`` and ``vm``, a raw
CoreSight capture for ``csdump``) is checked when the command line is
read: a missing file, a directory or a device is one usage error naming
it, not "no such file" for all three, and never an endless read."""

from __future__ import annotations

import pytest

from hwtrace.cli.main import main

READERS = [
    ["ptwrite"],
    ["vm"],
    ["csdump", "--protocol", "stm"],
]


@pytest.mark.parametrize("head", READERS, ids=[h[0] for h in READERS])
@pytest.mark.parametrize(
    ("kind", "problem"),
    [("missing", "no such file"), ("directory", "a directory, not a file"),
     ("device", "not a regular file")],
)  # fmt: skip
def test_a_file_read_whole_must_be_a_regular_file(head, kind, problem, tmp_path, capsys):
    path = {"missing": str(tmp_path / "none"), "directory": str(tmp_path),
            "device": "/dev/zero"}[kind]  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        main([*head, path])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert f"{path}: {problem}" in err and "Traceback" not in err


def test_vm_names_the_pcpu_whose_file_is_wrong(tmp_path, capsys):
    assert main(["vm", "--cpu", f"0={tmp_path}"]) == 1
    assert f"pCPU 0: {tmp_path}: a directory, not a file" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-1", "0x70", "999", "abc"])
def test_csdump_takes_only_trace_ids(value, tmp_path, capsys):
    capture = tmp_path / "stm.bin"
    capture.write_bytes(b"\xff" * 64)
    with pytest.raises(SystemExit) as exit_:
        main(["csdump", "--protocol", "stm", "--frames", "memory", "--id", value, str(capture)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--id" in err and "not a trace ID" in err
