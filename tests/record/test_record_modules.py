"""Modules are named after the files a recording mapped, wherever their bytes
are found: a binary found in perf's build-id cache (``~/.debug``) is not
called ``elf`` (the cache file's name) by ``hwtrace script`` and ``report``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_record_calls import build
from test_record_software import SKIP
from test_record_threads import PERF

from hwtrace.cli.main import main as hwtrace_main
from hwtrace.perf.sideband import BinaryLocator
from hwtrace.record import SoftwareRecording, record_software
from hwtrace.record.perfdata import write_perf_data

pytestmark = pytest.mark.skipif(SKIP is not None, reason=str(SKIP))


def recorded(tmp_path: Path) -> tuple[SoftwareRecording, Path, Path]:
    """A recording of calls into libc by a copy of the program, in perf.data;
    the copy is deleted afterwards (its bytes are then only in a cache)."""
    exe = tmp_path / "bin" / "sorts"
    exe.parent.mkdir()
    shutil.copy(build(), exe)
    rec = record_software([str(exe), str(tmp_path / "out")], calls=["sorter"])
    path = tmp_path / "perf.data"
    write_perf_data(rec, path)
    exe.unlink()
    return rec, path, exe


def cache(rec: SoftwareRecording, debug: Path, *, links: bool) -> dict[str, Path]:
    """perf's build-id cache of the mapped files: ``debug/<path>/<id>/elf``,
    with ``debug/.build-id/xx/yyyy`` linking to its directory (``links``)."""
    out = {}
    for m in rec.mmaps:
        if not m.build_id or m.path in out:
            continue
        hexid = m.build_id.hex()
        where = debug / m.path.lstrip("/") / hexid
        where.mkdir(parents=True)
        source = Path(m.path) if os.path.exists(m.path) else None
        if source is None:  # the deleted program: its bytes from the build
            source = build()
        shutil.copy(source, where / "elf")
        out[m.path] = where / "elf"
        if links:
            link = debug / ".build-id" / hexid[:2] / hexid[2:]
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(where, link.parent))
    return out


def run(args: list[str], home: Path) -> subprocess.CompletedProcess:
    # (no perf configuration: the build-id cache is ~/.debug)
    env = dict(os.environ, HOME=str(home), PERF_CONFIG="/dev/null")
    return subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, check=False)


def hwtrace(args: list[str], home: Path, monkeypatch, capsys) -> str:
    """An hwtrace command's output, run here with HOME at ``home``."""
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PERF_CONFIG", "/dev/null")
    capsys.readouterr()
    assert hwtrace_main(args) == 0
    return capsys.readouterr().out


def script_modules(path: Path, home: Path, monkeypatch, capsys) -> list[str | None]:
    """``hwtrace script``'s module column, line by line (None where no
    symbol covers the address: ``[unknown] (...)``)."""
    out = hwtrace(["script", "-i", str(path)], home, monkeypatch, capsys)
    return [
        None if " [unknown] (" in line else line.rsplit("(", 1)[1].rstrip(")")
        for line in out.splitlines()
    ]


def test_binaries_from_the_build_id_cache_keep_their_names(tmp_path, monkeypatch, capsys):
    rec, path, exe = recorded(tmp_path)
    home = tmp_path / "home"
    files = cache(rec, home / ".debug", links=True)
    libc = next(p for p in files if os.path.basename(p) == "libc.so.6")
    # The bytes come from the cache (the program is gone from its path).
    locator = BinaryLocator(buildid_dirs=(home / ".debug",))
    for m in rec.mmaps:
        if m.path in files:
            assert locator.find(m.path, m.build_id).resolve() == files[m.path].resolve()
    modules = script_modules(path, home, monkeypatch, capsys)
    assert len(modules) == sum(len(t.instructions) for t in rec.threads)
    # The mapped paths, never "elf"; the dynamic linker (lazy binding) is
    # named when its symbols are found (Debian's libc6-dbg has them).
    loader = {m.path for m in rec.mmaps if "/ld-linux" in m.path}
    assert {str(exe), libc} <= set(modules) - {None} <= {str(exe), libc} | loader
    report = " ".join(hwtrace(["report", "-i", str(path)], home, monkeypatch, capsys).split())
    assert "0 gap(s)" in report and "not found" not in report
    assert "sorts!sorter" in report and "libc.so.6!" in report
    assert "elf!" not in report
    if PERF is not None:
        # perf finds the same files in the same cache and names every
        # instruction's module the same way.
        perf = run([PERF, "script", "-i", str(path), "--itrace=i0ns", "-F", "ip,dso"], home)
        assert perf.returncode == 0, perf.stderr
        dsos = [line.rsplit("(", 1)[1].rstrip(")") for line in perf.stdout.splitlines()]
        assert len(dsos) == len(modules)
        assert all(m is None or m == d for m, d in zip(modules, dsos, strict=True))


def test_a_cache_without_build_id_links(tmp_path, monkeypatch, capsys):
    """Only ``~/.debug/<path>/<build id>/elf``: found there, still named
    after the mapped path."""
    rec, path, exe = recorded(tmp_path)
    home = tmp_path / "home"
    files = cache(rec, home / ".debug", links=False)
    found = BinaryLocator(buildid_dirs=(home / ".debug",)).find(
        str(exe), next(m.build_id for m in rec.mmaps if m.path == str(exe))
    )
    assert found == files[str(exe)]
    modules = script_modules(path, home, monkeypatch, capsys)
    assert str(exe) in modules and "elf" not in modules
