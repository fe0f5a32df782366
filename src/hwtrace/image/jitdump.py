"""What JIT compilers tell profilers about the code they generate: perf's
jitdump files (``jit-PID.dump``) and perf maps (``/tmp/perf-PID.map``).

jitdump (tools/perf/Documentation/jitdump-specification.txt) is a header
and records; ``JIT_CODE_LOAD`` carries a function's name, address and its
code bytes, ``JIT_CODE_MOVE`` moves one, ``JIT_CODE_DEBUG_INFO`` maps its
addresses to source lines, ``JIT_CODE_UNWINDING_INFO`` holds its
``.eh_frame``, ``JIT_CODE_CLOSE`` ends the file.  Written by V8/Node
(``--perf-prof``), CPython 3.13 (``-X perf_jit``), the JVM (through
agents), LLVM's ORC.  A perf map is text: ``START SIZE name`` per line,
hexadecimal (CPython 3.12's ``-X perf``, ``--perf-basic-prof``).

Reading never raises on damage: a truncated or garbled file gives the
records before the damage and a :class:`JitProblem` that names the byte
offset (or line) and what is wrong.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .symbols import SymbolTable

__all__ = [
    "JIT_CODE_CLOSE",
    "JIT_CODE_DEBUG_INFO",
    "JIT_CODE_LOAD",
    "JIT_CODE_MOVE",
    "JIT_CODE_UNWINDING_INFO",
    "JitCode",
    "JitDump",
    "JitProblem",
    "PerfMapEntry",
    "encode_jitdump",
    "is_jitdump_path",
    "jit_symbols",
    "read_jitdump",
    "read_mapped_jitdumps",
    "read_perf_map",
]

MAGIC = 0x4A695444  # "JiTD" as a little-endian u32
MAGIC_SWAPPED = 0x4454694A
JIT_CODE_LOAD, JIT_CODE_MOVE, JIT_CODE_DEBUG_INFO, JIT_CODE_CLOSE, JIT_CODE_UNWINDING_INFO = range(
    5
)
_HEADER = struct.Struct("<IIIIIIQQ")  # magic version total_size elf_mach pad1 pid timestamp flags
_PREFIX = struct.Struct("<IIQ")  # id total_size timestamp
_LOAD = struct.Struct("<IIQQQQ")  # pid tid vma code_addr code_size code_index
_MOVE = struct.Struct("<IIQQQQQ")  # pid tid vma old_code_addr new_code_addr code_size code_index
_DEBUG = struct.Struct("<QQ")  # code_addr nr_entry
_DEBUG_ENTRY = struct.Struct("<QII")  # code_addr line discrim (then a name)
EM_X86_64 = 62
FLAG_ARCH_TIMESTAMP = 1  # timestamps are the CPU's TSC, not the perf clock


@dataclass(frozen=True)
class JitProblem:
    """Damage in an input: ``where`` (a byte offset or ``line N``) and what."""

    path: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.where}: {self.message}"


@dataclass
class JitCode:
    """One function's code: loaded at ``time`` (the file's clock), at
    ``address`` (the record's ``code_addr``), ``code`` its bytes (empty
    when only a perf map named it), and where ``code_index`` numbers it.
    ``moved`` lists (time, new address) moves; ``lines`` (address, line,
    file) debug info."""

    name: str
    address: int
    size: int
    time: int
    pid: int
    tid: int
    code: bytes = b""
    code_index: int = -1
    moved: list[tuple[int, int]] = field(default_factory=list)
    lines: list[tuple[int, int, str]] = field(default_factory=list)


@dataclass
class JitDump:
    """A jitdump file: its header fields, the code it loaded, problems."""

    path: str
    version: int
    elf_mach: int
    pid: int
    timestamp: int
    flags: int
    codes: list[JitCode]
    problems: list[JitProblem]
    closed: bool = False

    @property
    def tsc_timestamps(self) -> bool:
        """Record times are the TSC (JITDUMP_FLAGS_ARCH_TIMESTAMP), else the
        perf clock (CLOCK_MONOTONIC on x86)."""
        return bool(self.flags & FLAG_ARCH_TIMESTAMP)


def _cstring(data: bytes, at: int, end: int) -> tuple[str, int] | None:
    nul = data.find(b"\0", at, end)
    if nul < 0:
        return None
    return data[at:nul].decode("utf-8", "replace"), nul + 1


def read_jitdump(path: str | Path, data: bytes | None = None, *, pid: int | None = None) -> JitDump:
    """Read a jitdump file (or its ``data``).  ``pid``: the process it must
    belong to (a file of another process is refused, as a problem)."""
    name = str(path)
    if data is None:
        data = Path(path).read_bytes()
    problems: list[JitProblem] = []
    empty = JitDump(name, 0, 0, 0, 0, 0, [], problems)
    if len(data) < _HEADER.size:
        problems.append(
            JitProblem(name, "offset 0x0", f"{len(data)} bytes: too short for a jitdump header")
        )
        return empty
    magic = struct.unpack_from("<I", data, 0)[0]
    if magic == MAGIC_SWAPPED:
        problems.append(JitProblem(name, "offset 0x0", "a big-endian jitdump: not supported"))
        return empty
    if magic != MAGIC:
        problems.append(JitProblem(name, "offset 0x0", f"magic {magic:#x}: not a jitdump file"))
        return empty
    _, version, hsize, mach, _, fpid, stamp, flags = _HEADER.unpack_from(data, 0)
    dump = JitDump(name, version, mach, fpid, stamp, flags, [], problems)
    if pid is not None and fpid != pid:
        problems.append(JitProblem(name, "offset 0x14", f"written by process {fpid}, not {pid}"))
        return dump
    if hsize < _HEADER.size or hsize > len(data):
        problems.append(JitProblem(name, "offset 0x8", f"header size {hsize} is wrong"))
        return dump
    by_index: dict[int, JitCode] = {}
    at = hsize
    while at < len(data):
        where = f"offset {at:#x}"
        if at + _PREFIX.size > len(data):
            problems.append(JitProblem(name, where, "truncated record header"))
            break
        rid, size, t = _PREFIX.unpack_from(data, at)
        if size < _PREFIX.size or at + size > len(data):
            problems.append(JitProblem(name, where, f"record of {size} bytes runs past the end"
                                       if size >= _PREFIX.size else f"record size {size}"))  # fmt: skip
            break
        body, end = at + _PREFIX.size, at + size
        if rid == JIT_CODE_LOAD:
            if body + _LOAD.size > end:
                problems.append(JitProblem(name, where, "code load record too short"))
            else:
                rpid, tid, _vma, addr, csize, index = _LOAD.unpack_from(data, body)
                got = _cstring(data, body + _LOAD.size, end)
                if got is None or got[1] + csize > end:
                    problems.append(
                        JitProblem(name, where, "code load: name or code past the record")
                    )
                else:
                    fname, code_at = got
                    # code_addr is where the code runs (perf inject --jit maps
                    # it there); vma names the same place for most JITs.
                    code = JitCode(fname, addr, csize, t, rpid, tid, data[code_at : code_at + csize],
                                   index)  # fmt: skip
                    dump.codes.append(code)
                    by_index[index] = code
        elif rid == JIT_CODE_MOVE:
            if body + _MOVE.size > end:
                problems.append(JitProblem(name, where, "code move record too short"))
            else:
                _, _, _, _old, new, _, index = _MOVE.unpack_from(data, body)
                code = by_index.get(index)
                if code is None:
                    problems.append(JitProblem(name, where, f"move of unknown code index {index}"))
                else:
                    code.moved.append((t, new))
        elif rid == JIT_CODE_DEBUG_INFO:
            if body + _DEBUG.size > end:
                problems.append(JitProblem(name, where, "debug info record too short"))
            else:
                caddr, count = _DEBUG.unpack_from(data, body)
                pos = body + _DEBUG.size
                lines = []
                for _ in range(min(count, (end - pos) // _DEBUG_ENTRY.size)):
                    if pos + _DEBUG_ENTRY.size > end:
                        break
                    a, line, _disc = _DEBUG_ENTRY.unpack_from(data, pos)
                    got = _cstring(data, pos + _DEBUG_ENTRY.size, end)
                    if got is None:
                        break
                    # "\xff\0" repeats the previous entry's file name.
                    fname = (
                        got[0]
                        if got[0] != "\xff" and got[0] != "\ufffd"
                        else (lines[-1][2] if lines else "")
                    )
                    lines.append((a, line, fname))
                    pos = got[1]
                if len(lines) != count:
                    problems.append(
                        JitProblem(name, where, f"debug info: {len(lines)} of {count} entries")
                    )
                target = next((c for c in reversed(dump.codes) if c.address == caddr), None)
                if target is not None:
                    target.lines = lines
        elif rid == JIT_CODE_CLOSE:
            dump.closed = True
        elif rid != JIT_CODE_UNWINDING_INFO:
            problems.append(JitProblem(name, where, f"unknown record type {rid} (skipped)"))
        at = end
    return dump


@dataclass(frozen=True)
class PerfMapEntry:
    address: int
    size: int
    name: str


def read_perf_map(
    path: str | Path, text: str | None = None
) -> tuple[list[PerfMapEntry], list[JitProblem]]:
    """A perf map's entries and the lines that could not be read."""
    name = str(path)
    if text is None:
        text = Path(path).read_text(errors="replace")
    out: list[PerfMapEntry] = []
    problems: list[JitProblem] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=2)
        try:
            if len(parts) < 3:
                raise ValueError
            start, size = int(parts[0], 16), int(parts[1], 16)
        except ValueError:
            problems.append(JitProblem(name, f"line {n}", f"not START SIZE NAME: {line[:60]!r}"))
            continue
        out.append(PerfMapEntry(start, size, parts[2]))
    return out, problems


def encode_jitdump(pid: int, codes: list[JitCode], *, timestamp: int = 0, flags: int = 0,
                   close: bool = True) -> bytes:  # fmt: skip
    """A jitdump file loading ``codes`` (each with its debug lines), as a
    JIT writes one: for tests and for tools that synthesize them."""
    out = bytearray(_HEADER.pack(MAGIC, 1, _HEADER.size, EM_X86_64, 0, pid, timestamp, flags))
    for k, c in enumerate(codes):
        index = c.code_index if c.code_index >= 0 else k
        body = _LOAD.pack(c.pid or pid, c.tid, c.address, c.address, len(c.code), index)
        body += c.name.encode() + b"\0" + c.code
        out += _PREFIX.pack(JIT_CODE_LOAD, _PREFIX.size + len(body), c.time) + body
        if c.lines:
            dbg = _DEBUG.pack(c.address, len(c.lines))
            for a, line, fname in c.lines:
                dbg += _DEBUG_ENTRY.pack(a, line, 0) + fname.encode() + b"\0"
            out += _PREFIX.pack(JIT_CODE_DEBUG_INFO, _PREFIX.size + len(dbg), c.time) + dbg
        for t, new in c.moved:
            mv = _MOVE.pack(c.pid or pid, c.tid, new, c.address, new, len(c.code), index)
            out += _PREFIX.pack(JIT_CODE_MOVE, _PREFIX.size + len(mv), t) + mv
    if close:
        t = max((c.time for c in codes), default=timestamp)
        out += _PREFIX.pack(JIT_CODE_CLOSE, _PREFIX.size, t)
    return bytes(out)


def is_jitdump_path(path: str) -> bool:
    """Is ``path`` named as a JIT names its jitdump (``jit-*.dump``)?"""
    name = Path(path).name
    return name.startswith("jit-") and name.endswith(".dump")


def read_mapped_jitdumps(
    pid: int, mapped: Sequence[str], root: Path | None = None
) -> dict[str, JitDump]:
    """The jitdump files among process ``pid``'s mappings (``mapped``: their
    paths), read, by path; a file not there is left out.  ``root`` is where
    the recorded system's files are (a sysroot)."""
    out: dict[str, JitDump] = {}
    for path in dict.fromkeys(p for p in mapped if is_jitdump_path(p)):
        where = root / path.lstrip("/") if root is not None else Path(path)
        if where.is_file():
            out[path] = read_jitdump(where, pid=pid)
    return out


def jit_symbols(
    pid: int,
    mapped: Sequence[str] = (),
    root: Path | None = None,
    dumps: dict[str, JitDump] | None = None,
) -> tuple[SymbolTable, list[JitProblem]]:
    """Names for process ``pid``'s JIT code, as perf finds them: its perf map
    (``/tmp/perf-PID.map``) and the jitdump files it mapped (``mapped``: the
    paths of its mappings; a JIT maps its ``jit-PID.dump`` so profilers see
    it).  ``root`` is where the recorded system's files are (a sysroot);
    ``dumps``: jitdumps already read (:func:`read_mapped_jitdumps`), whose
    problems were reported then.  Each symbol's module is the file that
    named it."""
    from .symbols import SymbolTable

    tables = []
    problems: list[JitProblem] = []
    perf_map = f"/tmp/perf-{pid}.map"
    where = root / perf_map.lstrip("/") if root is not None else Path(perf_map)
    if where.is_file():
        entries, bad = read_perf_map(where)
        problems += bad
        rows = [(e.address, e.size, e.name, True) for e in entries]
        tables.append(SymbolTable.from_symbols(rows, perf_map))
    known = dumps if dumps is not None else {}
    unread = [p for p in mapped if p not in known]
    fresh = read_mapped_jitdumps(pid, unread, root)
    for dump in fresh.values():
        problems += dump.problems
    for path, dump in {**known, **fresh}.items():
        if path in mapped:
            rows = [(c.address, c.size, c.name, True) for c in dump.codes]
            tables.append(SymbolTable.from_symbols(rows, path))
    return SymbolTable.merge(tables), problems
