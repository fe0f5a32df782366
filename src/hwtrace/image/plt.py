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

__all__ = ["plt_symbols"]

R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT, R_X86_64_IRELATIVE = 6, 7, 37
_PLT_SECTIONS = (".plt", ".plt.sec", ".plt.got")
_ENDBR64 = b"\xf3\x0f\x1e\xfa"


def _slot_names(elf) -> tuple[dict[int, str], list[str]]:
    """GOT slot address -> the name of what is bound there (``.rela.plt``
    and ``.rela.dyn``), and ``.rela.plt``'s names in order."""
    from elftools.elf.relocation import RelocationSection

    by_slot: dict[int, str] = {}
    in_order: list[str] = []
    for name in (".rela.plt", ".rela.dyn"):
        sec = elf.get_section_by_name(name)
        if not isinstance(sec, RelocationSection) or not sec.is_RELA():
            continue
        symtab = elf.get_section(sec["sh_link"]) if sec["sh_link"] else None
        for rel in sec.iter_relocations():
            kind = rel["r_info_type"]
            if kind in (R_X86_64_JUMP_SLOT, R_X86_64_GLOB_DAT) and symtab is not None:
                label = symtab.get_symbol(rel["r_info_sym"]).name.split("@")[0]
            elif kind == R_X86_64_IRELATIVE:
                label = f"*ABS*+{rel['r_addend']:#x}"
            else:
                label = ""
            if name == ".rela.plt":
                in_order.append(label)
            if label and (kind != R_X86_64_GLOB_DAT or rel["r_offset"] not in by_slot):
                by_slot[rel["r_offset"]] = label
    return by_slot, in_order


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


def plt_symbols(elf, read) -> list[tuple[int, int, str]]:
    """``(address, size, name@plt)`` of every PLT entry of a pyelftools
    ``ELFFile`` (link addresses); ``read(offset, size)`` reads the file."""
    if elf["e_machine"] != "EM_X86_64" or elf.get_section_by_name(".dynsym") is None:
        return []
    by_slot, in_order = _slot_names(elf)
    if not by_slot and not in_order:
        return []
    out = []
    for name in _PLT_SECTIONS:
        sec = elf.get_section_by_name(name)
        if sec is None or sec["sh_type"] != "SHT_PROGBITS" or not sec["sh_size"]:
            continue
        step = sec["sh_entsize"] or (8 if name == ".plt.got" else 16)
        base, size = sec["sh_addr"], sec["sh_size"]
        data = read(sec["sh_offset"], size)
        for off in range(0, size - step + 1, step):
            label = _entry_name(data[off : off + step], base + off, by_slot, in_order)
            if label:  # (PLT0, the resolver's entry, binds nothing)
                out.append((base + off, step, f"{label}@plt"))
    return out
