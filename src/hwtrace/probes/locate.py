"""Tracepoint locations in a live process, as users of uprobes and GDB write
them: ``func``, ``func+0x12``, ``module!func``, ``0x401136``, ``file.c:42``.

Names come from the ELF symbol tables of the files mapped into the process
(:class:`~hwtrace.image.process.ProcessModules`), lines from the DWARF line
tables (pyelftools) of those files or of their detached debug files.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from ..image.process import ProcessModules
from ..image.symbols import address_number

__all__ = ["Site", "SiteError", "check_boundary", "resolve"]


class SiteError(ValueError):
    """A location that names nothing in the process."""


@dataclass(frozen=True)
class Site:
    """A resolved tracepoint location."""

    address: int
    function: str  # "func+0x12", or "" for an address outside any function
    path: str  # the mapped file, or ""
    limit: int  # end of the function (the jump must not run past it), 0 if unknown
    entry: bool  # at the function's first instruction
    start: int = 0  # the function's first instruction, 0 if unknown


_OFFSET = re.compile(r"^(?P<name>.+?)\+(?P<off>0x[0-9a-fA-F]+|\d+)$")
_LINE = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+)$")


def resolve(modules: ProcessModules, spec: str) -> Site:
    """The site ``spec`` names in the process, or :class:`SiteError`."""
    spec = spec.strip()
    if not spec:
        raise SiteError("empty tracepoint location")
    if re.fullmatch(r"0x[0-9a-fA-F]+", spec):
        return _at_address(modules, int(spec, 16), spec)
    m = _LINE.match(spec)
    if m and "!" not in spec:
        return _at_line(modules, m["file"], int(m["line"]), spec)
    m = _OFFSET.match(spec)
    name, offset = (m["name"], address_number(m["off"])) if m else (spec, 0)
    func = modules.find_function(name)
    if func is None:
        module, _, bare = name.rpartition("!")
        where = f"in {module}" if module else "in any file mapped by the process"
        if module and not any(os.path.basename(p) == module for p in modules.files):
            where = f"in {module}: no such module is mapped"
        raise SiteError(f"{spec}: no function {bare!r} {where} (process {modules.pid})")
    if offset >= func.size:
        raise SiteError(f"{spec}: offset {offset:#x} is past the end of {name} "
                        f"({func.size:#x} bytes)")  # fmt: skip
    label = f"{func.name}+{offset:#x}" if offset else func.name
    return Site(func.start + offset, label, func.path, func.end, offset == 0, func.start)


def check_boundary(site: Site, code: bytes) -> None:
    """Raise :class:`SiteError` unless ``site`` starts an instruction of its
    function, decoding ``code`` (the function's bytes from its start) in a
    linear sweep, as objdump does."""
    from iced_x86 import Decoder

    if not site.start or site.address == site.start:
        return
    previous = site.start
    for ins in Decoder(64, code, ip=site.start):
        if ins.ip == site.address:
            return
        if ins.ip > site.address:
            raise SiteError(
                f"{site.address:#x} ({site.function}) is inside the instruction at "
                f"{previous:#x}: instructions start at {previous:#x} and {ins.ip:#x}"
            )
        previous = ins.ip
    raise SiteError(f"{site.address:#x} ({site.function}): past the code decoded")


def _at_address(modules: ProcessModules, address: int, spec: str) -> Site:
    mapping = modules.module_at(address)
    if mapping is None or not mapping.executable:
        raise SiteError(f"{spec}: not in executable memory of process {modules.pid}")
    func = modules.function_at(address)
    if func is None:
        return Site(address, "", mapping.path, mapping.end, False)
    off = address - func.start
    label = f"{func.name}+{off:#x}" if off else func.name
    return Site(address, label, func.path, func.end, off == 0, func.start)


def _at_line(modules: ProcessModules, filename: str, line: int, spec: str) -> Site:
    """The lowest address of a statement of ``filename:line`` in any mapped
    file's DWARF line table."""
    seen_debug = False
    for path in modules.files:
        entry = modules.symbols(path)
        if entry is None:
            continue
        _, bias = entry
        addresses = _line_addresses(path, filename, line)
        if addresses is None:
            continue
        seen_debug = True
        if addresses:
            return _at_address(modules, min(addresses) + bias, spec)
    if not seen_debug:
        raise SiteError(f"{spec}: no mapped file of process {modules.pid} has DWARF line tables")
    raise SiteError(f"{spec}: no code for line {line} of {filename} in process {modules.pid}")


def _line_addresses(path: str, filename: str, line: int) -> list[int] | None:
    """Statement addresses (link addresses) of ``filename:line``; None when
    the file has no line tables."""
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            if not elf.has_dwarf_info():
                return None
            dwarf = elf.get_dwarf_info()
            if not dwarf.has_debug_info:
                return None
            out = []
            want = os.path.basename(filename)
            for cu in dwarf.iter_CUs():
                lp = dwarf.line_program_for_CU(cu)
                if lp is None:
                    continue
                names = _file_names(lp)
                for e in lp.get_entries():
                    s = e.state
                    if s is None or s.end_sequence or not s.is_stmt or s.line != line:
                        continue
                    name = names.get(s.file, "")
                    if name == filename or os.path.basename(name) == want:
                        out.append(s.address)
            return out
    except (OSError, ELFError, ValueError, KeyError):
        return None


def _file_names(lp) -> dict[int, str]:
    """File index → name (with its directory) for a line program; DWARF 5
    numbers files from 0, earlier versions from 1."""
    header = lp.header
    entries = header.file_entry
    dirs = header.include_directory
    base = 0 if header.version >= 5 else 1
    out = {}
    for i, fe in enumerate(entries):
        name = fe.name.decode() if isinstance(fe.name, bytes) else fe.name
        d = fe.dir_index
        if header.version < 5:
            d -= 1
        if 0 <= d < len(dirs):
            dname = dirs[d].decode() if isinstance(dirs[d], bytes) else dirs[d]
            name = os.path.join(dname, name)
        out[i + base] = name
    return out
