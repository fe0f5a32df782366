"""Intel's libipt as a test oracle and benchmark peer (helpers, no tests here).

The C tools in ``bench/libipt`` are built once with ``gcc -O2`` against the
system's libipt (Debian's ``libipt-dev``) into a cache directory keyed by a
hash of their sources (``$XDG_CACHE_HOME/hwtrace/libipt-<hash>``, else
``/tmp/hwtrace-libipt-<hash>``), then run as subprocesses:

* ``ptgen``: writes random Intel PT streams with libipt's encoder
  (:func:`generate`);
* ``ptpkt_dump``: prints every packet as libipt's packet decoder sees it
  (:func:`dump`, line format documented at the top of ``ptpkt_dump.c``);
* ``ptpkt_loop``: times libipt's packet decoder on a file (:func:`loop_bench`);
* ``ptflow_loop``: times libipt's block or instruction decoder over a trace
  and an image of raw sections (:func:`flow_bench`);
* ``ptinsn_dump``: prints the instruction flow as libipt's instruction (or
  block) decoder reconstructs it (:func:`insn_dump`, line format documented
  at the top of ``ptinsn_dump.c``).

When gcc or ``intel-pt.h`` is missing, :data:`skip_reason` says why and the
functions raise :class:`OracleUnavailable`::

    import libipt_oracle as oracle
    pytestmark = pytest.mark.skipif(oracle.skip_reason is not None,
                                    reason=oracle.skip_reason or "")
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

__all__ = [
    "PTE_BAD_OPC",
    "PTE_BAD_PACKET",
    "PTE_EOS",
    "OracleUnavailable",
    "Tools",
    "build",
    "dump",
    "flow_bench",
    "generate",
    "insn_dump",
    "loop_bench",
    "parse_dump",
    "skip_reason",
]

REPO = Path(__file__).resolve().parent.parent
SOURCE_DIR = REPO / "bench" / "libipt"
TOOLS = ("ptgen", "ptpkt_dump", "ptpkt_loop", "ptflow_loop", "ptinsn_dump")
HEADER = Path(os.environ.get("LIBIPT_HEADER", "/usr/include/intel-pt.h"))
CFLAGS = ("-O2", "-Wall", "-Wextra")
LIBS = ("-lipt",)

# The error codes ptpkt_dump prints (positive enum pt_error_code values).
PTE_BAD_OPC = 4  # no packet starts with these bytes
PTE_BAD_PACKET = 5  # a known opcode with an invalid payload
PTE_EOS = 7  # the stream ends inside a packet

Mix = Literal["bench", "all"]
DumpRow = dict[str, int | str]


class OracleUnavailable(RuntimeError):
    """libipt or a C compiler is missing, or the tools failed to build."""


def _find_skip_reason() -> tuple[str | None, str | None]:
    """Return ``(compiler, None)`` or ``(None, reason)``."""
    cc = os.environ.get("CC") or "gcc"
    compiler = shutil.which(cc)
    if compiler is None:
        return None, f"no C compiler ({cc}) on PATH"
    if not HEADER.is_file():
        return None, f"libipt headers not installed ({HEADER} missing; apt-get install libipt-dev)"
    missing = [t for t in TOOLS if not (SOURCE_DIR / f"{t}.c").is_file()]
    if missing:
        return None, f"libipt tool sources missing in {SOURCE_DIR}: {', '.join(missing)}"
    return compiler, None


# Why the oracle cannot be used here, or None when it can.
_compiler, skip_reason = _find_skip_reason()


class Tools:
    """Paths of the built tools."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ptgen = directory / "ptgen"
        self.ptpkt_dump = directory / "ptpkt_dump"
        self.ptpkt_loop = directory / "ptpkt_loop"
        self.ptflow_loop = directory / "ptflow_loop"
        self.ptinsn_dump = directory / "ptinsn_dump"

    def __repr__(self) -> str:
        return f"Tools({str(self.directory)!r})"


def _cache_dir(digest: str) -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "hwtrace" / f"libipt-{digest}"
    return Path(tempfile.gettempdir()) / f"hwtrace-libipt-{digest}"


def _source_hash(compiler: str) -> str:
    h = hashlib.sha256()
    h.update(compiler.encode())
    h.update(" ".join(CFLAGS + LIBS).encode())
    h.update(HEADER.read_bytes())
    for tool in TOOLS:
        h.update(tool.encode())
        h.update((SOURCE_DIR / f"{tool}.c").read_bytes())
    return h.hexdigest()[:16]


@functools.cache
def build() -> Tools:
    """Build the tools once (per source hash) and return their paths.

    Safe to call from concurrent processes: each binary is compiled to a
    private name and renamed into place.
    """
    if _compiler is None:
        raise OracleUnavailable(skip_reason)
    directory = _cache_dir(_source_hash(_compiler))
    directory.mkdir(parents=True, exist_ok=True)
    tools = Tools(directory)
    for tool in TOOLS:
        target = directory / tool
        if target.is_file() and os.access(target, os.X_OK):
            continue
        tmp = directory / f".{tool}.{os.getpid()}.tmp"
        cmd = [_compiler, *CFLAGS, "-o", str(tmp), str(SOURCE_DIR / f"{tool}.c"), *LIBS]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise OracleUnavailable(f"building {tool} failed:\n{' '.join(cmd)}\n{proc.stderr}")
        os.replace(tmp, target)
    return tools


def _run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc.stdout


def generate(
    path: str | os.PathLike[str],
    size: int,
    seed: int = 1,
    mix: Mix = "bench",
    *,
    psb_period: int = 4096,
    check: bool = False,
) -> Path:
    """Write a random Intel PT stream of ``size`` bytes (or a few more: packets
    are never cut) encoded by libipt; the same arguments give the same bytes.

    ``mix="bench"`` is a branch-heavy mix (TNT, TIP, ...); ``mix="all"`` has
    every packet type libipt 2.0.5 can encode.  ``check`` makes the generator
    re-decode its output with libipt and verify it.
    """
    if mix not in ("bench", "all"):
        raise ValueError(f"mix must be 'bench' or 'all', not {mix!r}")
    tools = build()
    cmd = [str(tools.ptgen), os.fspath(path), str(size), "--seed", str(seed)]
    cmd += ["--psb-period", str(psb_period), "--mix", mix]
    if check:
        cmd.append("--check")
    _run(cmd)
    return Path(path)


def parse_dump(text: str) -> list[DumpRow]:
    """Parse ptpkt_dump output into dicts.

    Packets give ``{"offset": int, "size": int, "type": str, <field>: int, ...}``
    with libipt's field names (e.g. ``ipc``/``ip``, ``bit_size``/``payload``);
    decode errors give ``{"offset": int, "size": 0, "type": "error",
    "code": int}`` (see ``PTE_*``).
    """
    rows: list[DumpRow] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if parts[1] == "error":
            rows.append(
                {"offset": int(parts[0]), "size": 0, "type": "error", "code": int(parts[2])}
            )
            continue
        row: DumpRow = {"offset": int(parts[0]), "size": int(parts[1]), "type": parts[2]}
        for item in parts[3:]:
            key, _, value = item.partition("=")
            row[key] = int(value, 0)
        rows.append(row)
    return rows


def dump(path: str | os.PathLike[str], *, sync: bool = True) -> list[DumpRow]:
    """Decode a file with libipt's packet decoder, one dict per packet or
    error (see :func:`parse_dump`).

    With ``sync`` (the default) decoding starts at the first PSB, as libipt
    must; ``sync=False`` starts at offset 0.
    """
    tools = build()
    cmd = [str(tools.ptpkt_dump)]
    if not sync:
        cmd.append("--no-sync")
    cmd.append(os.fspath(path))
    return parse_dump(_run(cmd))


def loop_bench(path: str | os.PathLike[str], repeat: int = 5) -> dict[str, float]:
    """Time libipt's packet decoder over a whole file, best of ``repeat``.

    Returns ``{"bytes", "packets", "errors", "best_seconds", "mb_per_s",
    "repeat"}`` (MB = 1e6 bytes).
    """
    tools = build()
    out = _run([str(tools.ptpkt_loop), os.fspath(path), "--repeat", str(repeat)])
    result: dict[str, float] = json.loads(out)
    return result


def flow_bench(
    path: str | os.PathLike[str],
    sections: list[tuple[str | os.PathLike[str], int, int, int]],
    decoder: Literal["blk", "insn"] = "blk",
    repeat: int = 5,
    timing: dict[str, int] | None = None,
) -> dict[str, float | str]:
    """Time libipt's instruction-flow decoding of a whole trace, best of ``repeat``.

    ``sections`` is the image: ``(file, offset, size, vaddr)`` raw sections
    (e.g. an ELF file's ``PT_LOAD`` segments); ``decoder`` picks
    ``pt_blk_next`` or ``pt_insn_next``; ``timing`` gives the trace's
    ``mtc_freq``, ``nom_freq``, ``cpuid_0x15_eax`` and ``cpuid_0x15_ebx``
    (ptxed's options of those names).  Returns ``{"decoder", "bytes",
    "instructions", "blocks", "events", "errors", "best_seconds",
    "insn_per_s", "repeat"}`` (``blocks`` is 0 for ``"insn"``).
    """
    if decoder not in ("blk", "insn"):
        raise ValueError(f"decoder must be 'blk' or 'insn', not {decoder!r}")
    tools = build()
    cmd = [str(tools.ptflow_loop), os.fspath(path), "--decoder", decoder]
    cmd += ["--repeat", str(repeat)]
    options = {"mtc_freq": "--mtc-freq", "nom_freq": "--nom-freq",
               "cpuid_0x15_eax": "--cpuid-0x15.eax", "cpuid_0x15_ebx": "--cpuid-0x15.ebx"}  # fmt: skip
    for key, value in (timing or {}).items():
        cmd += [options[key], str(value)]
    for file, offset, size, vaddr in sections:
        cmd += ["--raw", f"{os.fspath(file)}:{offset:#x}:{size:#x}:{vaddr:#x}"]
    result: dict[str, float | str] = json.loads(_run(cmd))
    return result


def insn_dump(
    path: str | os.PathLike[str],
    *,
    elf: Sequence[str | os.PathLike[str] | tuple[str | os.PathLike[str], int]] = (),
    timing: dict[str, int] | None = None,
    block: bool = False,
    raw: Sequence[tuple[str | os.PathLike[str], int, int, int]] = (),
) -> tuple[list[int] | list[tuple[int, int, int]], list[dict[str, int | str]]]:
    """Reconstruct a trace's instruction flow with libipt, resynchronizing
    at the next PSB after an error (as ptxed does).

    ``elf`` files are mapped at their link addresses, or given as ``(file,
    base)`` with the lowest segment at ``base``, ``raw`` sections as
    ``(file, offset, size, vaddr)``; ``timing`` gives the
    trace's ``mtc_freq``, ``nom_freq``, ``cpuid_0x15_eax`` and
    ``cpuid_0x15_ebx``.  Returns ``(flow, errors)``: the executed
    instructions' IPs (pt_insn_next), or with ``block`` the blocks as ``(ip,
    end_ip, ninsn)`` (pt_blk_next; instructions in a block are sequential
    apart from direct jumps and calls); errors as ``{"offset", "ip", "code",
    "text"}``.
    """
    flow, errors, _ = _insn_dump(path, elf=elf, raw=raw, timing=timing, block=block)
    return flow, errors


def block_times(
    path: str | os.PathLike[str],
    *,
    raw: Sequence[tuple[str | os.PathLike[str], int, int, int]] = (),
    timing: dict[str, int] | None = None,
) -> tuple[list[tuple[int, int, int]], list[int]]:
    """libipt's blocks of a trace (as :func:`insn_dump` with ``block``) and
    the time ``pt_blk_time`` gives before each (0: none yet), which Intel's
    ptxed prints with ``--time``.  ``raw``: ``(file, offset, size, vaddr)``
    sections."""
    flow, _, times = _insn_dump(path, raw=raw, timing=timing, block=True, time=True)
    return flow, times  # type: ignore[return-value]


def _insn_dump(path, *, elf=(), raw=(), timing=None, block=False, time=False):
    tools = build()
    cmd = [str(tools.ptinsn_dump)]
    options = {"mtc_freq": "--mtc-freq", "nom_freq": "--nom-freq",
               "cpuid_0x15_eax": "--cpuid-0x15.eax", "cpuid_0x15_ebx": "--cpuid-0x15.ebx"}  # fmt: skip
    for key, value in (timing or {}).items():
        cmd += [options[key], str(value)]
    for file in elf:
        if isinstance(file, tuple):
            cmd += ["--elf", f"{os.fspath(file[0])}:{file[1]:#x}"]
        else:
            cmd += ["--elf", os.fspath(file)]
    for file, offset, size, vaddr in raw:
        cmd += ["--raw", f"{os.fspath(file)}:{offset:#x}:{size:#x}:{vaddr:#x}"]
    if block:
        cmd.append("--block")
    if time:
        cmd.append("--time")
    cmd.append(os.fspath(path))
    flow: list = []
    errors: list[dict[str, int | str]] = []
    times: list[int] = []
    now = 0
    for line in _run(cmd).splitlines():
        if line.startswith("! error "):
            _, _, offset, ip, code, text = line.split(" ", 5)
            errors.append(
                {"offset": int(offset, 16), "ip": int(ip, 16), "code": int(code), "text": text}
            )
        elif line.startswith("time "):
            now = int(line.split()[1], 16)
        elif line.startswith("block "):
            _, ip, end_ip, ninsn = line.split()
            flow.append((int(ip, 16), int(end_ip, 16), int(ninsn)))
            times.append(now)
        elif line and not line.startswith("#"):
            flow.append(int(line, 16))
            times.append(now)
    return flow, errors, times
