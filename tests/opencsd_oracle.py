"""OpenCSD's trc_pkt_lister as an oracle for hwtrace's CoreSight codecs.

Writes a snapshot directory (hwtrace.hwevents.cssnapshot) and parses the
lister's packet lines ``Idx:N; ID:T;\tNAME:description``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from hwtrace.hwevents.cssnapshot import Buffer, Device, Snapshot, write_snapshot

LISTER = shutil.which("trc_pkt_lister")
needs_opencsd = pytest.mark.skipif(
    LISTER is None, reason="OpenCSD's trc_pkt_lister (Debian libopencsd-bin) is not installed"
)

_ANY_LINE = re.compile(r"Idx:(\d+); ID:([0-9a-fA-Fx]+);\s*([A-Za-z0-9_]+)\s*:(.*)$")
_LINE = re.compile(r"^Idx:(\d+); ID:([0-9a-fA-Fx]+);\s*([A-Za-z0-9_]+):(.*)$")


@dataclass(frozen=True)
class Listed:
    idx: int  # byte offset of the packet in the source's (deformatted) data
    id: int  # trace ID
    name: str  # packet name as OpenCSD prints it (ASYNC, D32TS, I_ATOM_F1...)
    text: str  # the rest of the line


def run_lister(
    directory: str | Path, *args: str, timeout: float = 120, anywhere: bool = False
) -> list[Listed]:
    """Run trc_pkt_lister on a snapshot directory; its packet lines (with
    ``anywhere``, also those that follow an error message on a line)."""
    out = subprocess.run(
        [LISTER, "-ss_dir", str(directory), "-logstdout", *args],
        capture_output=True,
        cwd=str(directory),  # any log file it writes stays in the snapshot
        text=True,
        timeout=timeout,
        errors="replace",
    ).stdout
    rows = []
    for line in out.splitlines():
        if anywhere:
            m = _ANY_LINE.search(line)
            if m:
                rows.append(Listed(int(m.group(1)), int(m.group(2), 16), m.group(3), m.group(4)))
            continue
        m = _LINE.match(line)
        if m:
            rows.append(
                Listed(int(m.group(1)), int(m.group(2), 16), m.group(3), m.group(4).strip())
            )
    return rows


def list_source(
    directory: str | Path,
    data: bytes,
    type: str,
    regs: dict[str, int] | None = None,
    offsets: dict[str, int] | None = None,
    *args: str,
) -> list[Listed]:
    """One trace source's raw bytes (no frame formatting) through the lister."""
    snap = Snapshot(
        devices=[Device("SRC_0", type, regs=dict(regs or {}), offsets=dict(offsets or {}))],
        buffers=[Buffer("BUF_0", data, format="source_data", file="trace.bin")],
        source_buffers={"SRC_0": "BUF_0"},
    )
    write_snapshot(directory, snap)
    return run_lister(directory, *args)


def list_core_source(
    directory: str | Path,
    data: bytes,
    type: str,
    regs: dict[str, int],
    offsets: dict[str, int] | None = None,
    core: str = "Cortex-A57",
    timeout: float = 120,
) -> list[Listed]:
    """A trace unit attached to a core (ETM4, ETE: the lister needs the
    core's name for the architecture): its raw bytes through the lister.
    Packet lines that follow an error message on the same line count too."""
    snap = Snapshot(
        devices=[
            Device("cpu_0", core, cls="core"),
            Device("SRC_0", type, regs=dict(regs), offsets=dict(offsets or {})),
        ],
        buffers=[Buffer("BUF_0", data, format="source_data", file="trace.bin")],
        source_buffers={"SRC_0": "BUF_0"},
        core_trace_sources={"cpu_0": "SRC_0"},
    )
    write_snapshot(directory, snap)
    return run_lister(directory, timeout=timeout, anywhere=True)
