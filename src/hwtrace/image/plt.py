"""Symbols for PLT entries (``qsort@plt``), which ELF files do not name.

A call to a shared library's function goes through a PLT stub: ``jmp
*GOT(%rip)`` through the function's GOT slot (lazily bound: first to the
stub's ``push $index; jmp PLT0``, which enters ld.so's resolver).  Linkers
give the stubs no symbols; perf synthesizes ``name@plt`` ones from the
relocations of the GOT slots (``dso__synthesize_plt_symbols`` in perf's
``symbol-elf.c``), ``*ABS*+0xaddr@plt`` for an ``R_X86_64_IRELATIVE`` slot
(an IFUNC the file binds itself; the addend is its resolver).  Here each
entry of ``.plt``, ``.plt.sec`` and ``.plt.got`` is read rather than
counted, so the name holds whatever the linker's layout (IBT's
``endbr64``/``bnd`` forms, a ``.plt`` without entries for ``.plt.sec``):
the slot of its ``jmp *disp32(%rip)``, else the relocation index its
``push`` passes to the resolver (IBT's lazy ``.plt`` entries).  x86-64 only.
"""

from __future__ import annotations

import struct

import numpy as np

from .elfheaders import ElfHeaders, c_string

__all__ = ["plt_symbols"]

R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT, R_X86_64_IRELATIVE = 6, 7, 37
SHT_PROGBITS, SHT_RELA = 1, 4
_PLT_SECTIONS = (".plt", ".plt.sec", ".plt.got")
_ENDBR64 = b"\xf3\x0f\x1e\xfa"


def _slot_names(head: ElfHeaders) -> tuple[dict[int, str], list[str]]:
    """GOT slot address -> the name of what is bound there (``.rela.plt``
    and ``.rela.dyn``), and ``.rela.plt``'s names in order."""
    by_slot: dict[int, str] = {}
    in_order: list[str] = []
    n = head.section_headers.shape[0]
    for name in (".rela.plt", ".rela.dyn"):
        index = head.section_index(name)
        if index < 0 or int(head.section_headers["sh_type"][index]) != SHT_RELA:
            continue
        rel = head.relocations(index)
        kinds = (rel["r_info"] & 0xFFFFFFFF).astype(np.int64)
        symbols = (rel["r_info"] >> 32).astype(np.int64)
        link = int(head.section_headers["sh_link"][index])
        names = _symbol_names(head, link, symbols, kinds) if 0 < link < n else None
        for k, kind in enumerate(kinds.tolist()):
            if kind in (R_X86_64_JUMP_SLOT, R_X86_64_GLOB_DAT) and names is not None:
                label = names[k].split("@")[0]
            elif kind == R_X86_64_IRELATIVE:
                label = f"*ABS*+{int(rel['r_addend'][k]):#x}"
            else:
                label = ""
            if name == ".rela.plt":
                in_order.append(label)
            slot = int(rel["r_offset"][k])
            if label and (kind != R_X86_64_GLOB_DAT or slot not in by_slot):
                by_slot[slot] = label
    return by_slot, in_order


def _symbol_names(head: ElfHeaders, table: int, index: np.ndarray, kinds: np.ndarray) -> list[str]:
    """The names of symbols ``index`` of symbol table section ``table``
    (those of relocations that bind no symbol by name are left empty)."""
    s = head.section_headers[table]
    entsize = 24 if head.elfclass == 64 else 16
    count = int(s["sh_size"]) // entsize
    wanted = (kinds == R_X86_64_JUMP_SLOT) | (kinds == R_X86_64_GLOB_DAT)
    if count == 0 or int(s["sh_link"]) >= head.section_headers.shape[0]:
        return [""] * index.shape[0]
    entries = head.section_bytes(table)
    strtab = head.section_bytes(int(s["sh_link"]))
    order = "<" if head.little else ">"
    out = []
    for i, want in zip(index.tolist(), wanted.tolist(), strict=True):
        if not want or i >= count:
            out.append("")
            continue
        (at,) = struct.unpack_from(f"{order}I", entries, i * entsize)
        out.append(c_string(strtab, at))
    return out


def _entry_name(code: bytes, address: int, by_slot: dict[int, str], in_order: list[str]) -> str:
    """The name an entry's code binds: the slot its ``jmp *disp32(%rip)``
    goes through, else the relocation its ``push $index`` names."""
    for at in (0, 4):  # after an endbr64
        if at and not code.startswith(_ENDBR64):
            break
        for pre in (b"\xff\x25", b"\xf2\xff\x25"):  # jmp, bnd jmp
            if code[at : at + len(pre)] == pre and len(code) >= at + len(pre) + 4:
                (disp,) = struct.unpack_from("<i", code, at + len(pre))
                end = at + len(pre) + 4
                got = by_slot.get(address + end + disp, "")
                if got:
                    return got
        if code[at : at + 1] == b"\x68" and len(code) >= at + 5:  # push $index
            (index,) = struct.unpack_from("<I", code, at + 1)
            if index < len(in_order) and in_order[index]:
                return in_order[index]
    return ""


def plt_symbols(head: ElfHeaders) -> list[tuple[int, int, str]]:
    """``(address, size, name@plt)`` of every PLT entry of an ELF file
    (link addresses)."""
    if head.machine != "EM_X86_64" or head.section_index(".dynsym") < 0:
        return []
    by_slot, in_order = _slot_names(head)
    if not by_slot and not in_order:
        return []
    out = []
    for name in _PLT_SECTIONS:
        index = head.section_index(name)
        if index < 0:
            continue
        sec = head.section_headers[index]
        if int(sec["sh_type"]) != SHT_PROGBITS or not int(sec["sh_size"]):
            continue
        step = int(sec["sh_entsize"]) or (8 if name == ".plt.got" else 16)
        base, size = int(sec["sh_addr"]), int(sec["sh_size"])
        data = head.section_bytes(index)
        for off in range(0, size - step + 1, step):
            label = _entry_name(data[off : off + step], base + off, by_slot, in_order)
            if label:  # (PLT0, the resolver's entry, binds nothing)
                out.append((base + off, step, f"{label}@plt"))
    return out
