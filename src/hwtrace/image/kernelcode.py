"""Kernel code for decoding: where its bytes and symbols come from.

perf users give the kernel's code one of three ways, and so do we:

* a ``perf record --kcore`` directory (``kcore_dir`` inside the perf.data
  directory, or any copy): ``kcore`` is an ELF core file whose ``PT_LOAD``
  segments hold the kernel text (and modules) at their run-time addresses,
  ``kallsyms`` names them;
* a ``vmlinux`` with symbols: its text is moved by the KASLR offset the
  recording gives (the kernel MMAP record's ``pgoff`` is where ``_text`` was);
* ``kallsyms`` alone: names, but no bytes, so kernel flow cannot be followed
  (the decoder reports gaps there) though kernel addresses are named.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import Image
from .elf import read_elf
from .sections import ImageError, Section
from .symbols import SymbolTable


class KernelCodeError(ValueError):
    """Kernel code that cannot be used; the message names the file."""


@dataclass
class KernelCode:
    """The kernel's code bytes (``image``, may be empty) and symbols."""

    image: Image
    symbols: SymbolTable
    source: str  # what it came from, for messages


def _segments(path: Path) -> list[tuple[int, int, int, bool]]:
    """``(vaddr, offset, filesz, executable)`` of each PT_LOAD of an ELF file."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            if elf["e_machine"] != "EM_X86_64":
                raise KernelCodeError(f"{path}: not an x86-64 ELF file ({elf['e_machine']})")
            return [
                (s["p_vaddr"], s["p_offset"], s["p_filesz"], bool(s["p_flags"] & 1))
                for s in elf.iter_segments()
                if s["p_type"] == "PT_LOAD" and s["p_filesz"]
            ]
    except (ELFError, OSError) as e:
        raise KernelCodeError(f"{path}: cannot read as ELF: {e}") from None


def from_kcore(directory: str | os.PathLike[str]) -> KernelCode:
    """Kernel code from a ``perf record --kcore`` directory (``kcore`` and
    ``kallsyms``)."""
    d = Path(directory)
    kcore = d / "kcore"
    if not kcore.is_file():
        raise KernelCodeError(f"{d}: no kcore file (expected a perf --kcore directory)")
    image = Image("[kernel.kallsyms]")
    for vaddr, offset, size, _ in _segments(kcore):
        try:
            image.add_section(Section.from_file(kcore, offset, size, vaddr, name="kcore"))
        except ImageError as e:
            raise KernelCodeError(str(e)) from None
    kallsyms = d / "kallsyms"
    symbols = read_kallsyms(kallsyms) if kallsyms.is_file() else SymbolTable.empty()
    return KernelCode(image, symbols, str(kcore))


def from_vmlinux(path: str | os.PathLike[str], text_address: int | None = None) -> KernelCode:
    """Kernel code from a ``vmlinux``; ``text_address`` is where ``_text``
    ran (KASLR), None keeps the link addresses."""
    p = Path(path)
    try:
        elf = read_elf(p)
    except ImageError as e:
        raise KernelCodeError(str(e)) from None
    image = Image("[kernel.kallsyms]")
    bias = 0
    if text_address is not None:
        anchor = _text_symbol(p)
        if anchor is None:
            anchor = min((s.vaddr for s in elf.segments if s.executable), default=elf.min_vaddr)
        bias = text_address - anchor
    try:
        loaded = image.add_elf(p, elf.min_vaddr + bias, executable_only=True)
    except ImageError as e:
        raise KernelCodeError(str(e)) from None
    return KernelCode(image, loaded.symbols, str(p))


def _text_symbol(path: Path) -> int | None:
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        tab = ELFFile(f).get_section_by_name(".symtab")
        if tab is None:
            return None
        for name in ("_text", "_stext"):
            found = tab.get_symbol_by_name(name)
            if found:
                return found[0]["st_value"]
    return None


def load_kernel(
    *,
    kcore: str | os.PathLike[str] | None = None,
    vmlinux: str | os.PathLike[str] | None = None,
    kallsyms: str | os.PathLike[str] | None = None,
    text_address: int | None = None,
) -> KernelCode | None:
    """Kernel code from whichever sources are given (kcore, then vmlinux;
    ``kallsyms`` adds or replaces names), or None when none is."""
    code: KernelCode | None = None
    if kcore is not None:
        code = from_kcore(kcore)
    elif vmlinux is not None:
        code = from_vmlinux(vmlinux, text_address)
    if kallsyms is not None:
        try:
            names = read_kallsyms(kallsyms)
        except OSError as e:
            raise KernelCodeError(f"{kallsyms}: {e.strerror or e}") from None
        if not len(names):
            raise KernelCodeError(f"{kallsyms}: {_no_symbols(kallsyms)}")
        if code is None:
            code = KernelCode(Image("[kernel.kallsyms]"), names, str(kallsyms))
        else:
            code.symbols = names if len(names) else code.symbols
    return code


def read_kallsyms(path: str | os.PathLike[str]) -> SymbolTable:
    """Kernel symbols from a ``/proc/kallsyms`` copy (text symbols only)."""
    addresses: list[int] = []
    names: list[str] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3 or parts[1] not in ("t", "T", "w", "W"):
                continue
            try:
                address = int(parts[0], 16)
            except ValueError:
                continue
            if 0 < address < 1 << 64:  # (no line of a real kallsyms is past 64 bits)
                addresses.append(address)
                names.append(parts[2])
    return _kernel_table(addresses, names)


def _no_symbols(path: str | os.PathLike[str]) -> str:
    """Why a kallsyms copy gave no symbol."""
    with open(path, encoding="utf-8", errors="replace") as f:
        zeros = any(line.split()[:1] and set(line.split()[0]) == {"0"} for line in f)
    if zeros:
        return ("every address is 0: a copy of /proc/kallsyms made without the right to "
                "see them (kernel.kptr_restrict); copy it as root")  # fmt: skip
    return "no text symbol (lines 'ADDRESS t|T NAME' of /proc/kallsyms): not a kallsyms copy"


def _kernel_table(addresses: Iterable[int], names: Iterable[str]) -> SymbolTable:
    # kallsyms has no sizes: a symbol reaches the next one (the last, a page).
    start = np.asarray(list(addresses), dtype=np.uint64)
    order = np.argsort(start, kind="stable")
    start = start[order]
    names = [list(names)[i] for i in order]
    size = np.diff(start, append=start[-1:] + np.uint64(4096)) if start.shape[0] else start
    return SymbolTable.from_symbols(
        [(int(a), int(z), n, True) for a, z, n in zip(start, size, names, strict=True)],
        module="[kernel.kallsyms]",
    )
