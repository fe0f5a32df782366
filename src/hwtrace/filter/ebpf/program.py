"""eBPF filter programs: unlinked (:class:`Program`) and linked
(:class:`LinkedProgram`), and loading restricted-C objects built by
clang/LLVM's BPF back end (:meth:`Program.from_elf`).

A :class:`Program` is what code generators, the assembler and the ELF
loader produce: instructions (:data:`~hwtrace.filter.abi.INSN`), read-only
data (string literals), the field paths its ``ld_imm64`` pseudo sources
name, and the sizes of the two records it reads (R1 = event, R2 = context).
Pseudo ``ld_imm64`` (see :mod:`~hwtrace.filter.abi`):

* ``src = PSEUDO_RODATA``: first ``imm`` 0, second slot ``imm`` = offset in
  ``rodata``; the register holds ``&rodata[offset]``;
* ``src = PSEUDO_FIELD_PATH``: first ``imm`` = index into ``paths``, second
  ``imm`` 0; the register holds the address of ``paths[i].code`` (only
  helpers take it).

:meth:`Program.link` verifies the program (:func:`.verifier.verify`, which
raises :class:`~hwtrace.filter.errors.VerifierError`) and returns a
:class:`LinkedProgram`.  Its attributes are a stable contract for the
interpreter and the JIT:

``insns``
    The linked INSN array (C-contiguous, owned): every pseudo ``ld_imm64``
    is rewritten to a plain one (``src = 0``) holding an absolute address.
    Nothing else changes, so instruction indices match the source program.
``address``, ``count``
    ``insns.ctypes.data`` and ``len(insns)`` (slots, ``ld_imm64`` is two).
``rodata``
    The owned read-only data buffer (``numpy.uint8`` array, at least one
    byte so its address is valid); ``rodata_address`` is its address.
``paths``
    The program's :class:`~hwtrace.filter.schema.FieldPath` tuple;
    ``path_codes`` the owned int64 copies of their ``code`` arrays whose
    addresses the linked ``ld_imm64``s hold.
``info``
    The :class:`~.verifier.VerifierInfo` (``max_stack_depth``,
    ``insn_count``).
``memory_bytes``
    Bytes the linked program occupies: instructions + rodata + path codes
    (+ the descriptor).
``descriptor``, ``descriptor_address``
    An owned int64 array ``[insns_address, count]`` and its address: what
    the interpreter's C entry point :data:`.interp.run_address` (``int64
    run(const int64 *descriptor, const void *event, const void *context)``)
    takes as its program; ``program_address`` is the same address (the
    name the design note gives it).
``event_size``, ``context_size``, ``name``, ``program``
    From the source :class:`Program` (``program`` is the source itself).

Calling a linked program (``linked(event, context)``) runs it in the
interpreter and returns R0 as an int; ``event``/``context`` are addresses
(or objects that have one: numpy arrays, ctypes instances, writable
buffers).  All memory a linked program refers to is owned by it, so keep
it alive while machine code or a C harness uses its addresses.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import abi
from ..errors import FilterError
from ..schema import DEFAULT_CONTEXT, FieldPath
from . import isa

EM_BPF = 247
R_BPF_NONE = 0
R_BPF_64_64 = 1  # ld_imm64 of a symbol's address (+ the addend in the first imm)


class Program:
    """An unlinked eBPF filter program (see the module docstring)."""

    def __init__(
        self,
        insns: np.ndarray | Sequence[Any],
        rodata: bytes = b"",
        paths: Sequence[FieldPath] = (),
        *,
        event_size: int,
        context_size: int = DEFAULT_CONTEXT.size,
        name: str = "",
    ) -> None:
        if isinstance(insns, (bytes, bytearray, memoryview)):
            if len(insns) % 8:
                raise FilterError(f"{len(insns)} bytes are not whole 8-byte eBPF instructions")
            arr = np.frombuffer(bytes(insns), dtype=abi.INSN)
        elif isinstance(insns, np.ndarray):
            if insns.dtype == abi.INSN:
                arr = insns
            elif insns.dtype == np.uint8 and insns.size % 8 == 0:
                arr = np.ascontiguousarray(insns).view(abi.INSN)
            else:
                raise FilterError(f"instructions must be an INSN array, not {insns.dtype}")
        else:
            arr = isa.program(insns)  # builder tuples and ld_imm64 pairs
        # A private copy: what was verified is what gets linked.
        self.insns: np.ndarray = np.array(arr, dtype=abi.INSN, copy=True).reshape(-1)
        self.rodata = bytes(rodata)
        self.paths: tuple[FieldPath, ...] = tuple(paths)
        if event_size < 0 or context_size < 0:
            raise FilterError("event_size and context_size must not be negative")
        self.event_size = int(event_size)
        self.context_size = int(context_size)
        self.name = name

    def __len__(self) -> int:
        return len(self.insns)

    def __repr__(self) -> str:
        return (
            f"Program({self.name or '<anonymous>'}: {len(self.insns)} insns, "
            f"{len(self.rodata)} rodata bytes, {len(self.paths)} paths)"
        )

    def verify(self):  # -> VerifierInfo
        """Run the verifier; raises :class:`VerifierError` when unsafe."""
        from .verifier import verify

        return verify(self)

    def link(self) -> LinkedProgram:
        """Verify, then resolve the pseudo ``ld_imm64`` sources to absolute
        addresses of memory the returned program owns."""
        info = self.verify()
        return LinkedProgram(self, info)

    @classmethod
    def from_elf(
        cls,
        path: str | Path,
        section: str | None = None,
        *,
        event_size: int,
        context_size: int = DEFAULT_CONTEXT.size,
        paths: Sequence[FieldPath] = (),
        name: str | None = None,
    ) -> Program:
        """The program in an eBPF ELF object (``clang -target bpf -O2 -c``,
        or LLVM's BPF back end through llvmlite).

        ``section`` names the code section; by default the first executable
        section with code.  ``.rodata*`` sections become the program's
        rodata, and ``R_BPF_64_64`` relocations of ``ld_imm64`` against
        their symbols become ``PSEUDO_RODATA`` loads.  The ELF carries no
        record sizes, so the caller gives them.
        """
        return _load_elf(Path(path), section, event_size, context_size, tuple(paths), name)


class LinkedProgram:
    """A verified program with absolute addresses (see the module docstring
    for the attributes, a contract for the interpreter and the JIT)."""

    def __init__(self, program: Program, info: Any) -> None:
        self.program = program
        self.info = info
        self.name = program.name
        self.event_size = program.event_size
        self.context_size = program.context_size
        self.paths = program.paths
        # Owned copies: their addresses go into the instructions.
        self.rodata = np.zeros(max(len(program.rodata), 1), dtype=np.uint8)
        self.rodata[: len(program.rodata)] = np.frombuffer(program.rodata, dtype=np.uint8)
        self.rodata_address = int(self.rodata.ctypes.data)
        self.path_codes = tuple(
            np.ascontiguousarray(p.code, dtype=np.int64).copy() for p in program.paths
        )
        insns = program.insns.copy()
        code, dst, src, _off, imm = (np.asarray(c) for c in isa.fields(insns))
        ld = np.flatnonzero(code == (isa.LD | isa.DW | isa.IMM))
        skip = -1
        for i in ld.tolist():
            if i == skip:  # the second slot of the previous ld_imm64
                continue
            skip = i + 1
            s = int(src[i])
            if s == abi.PSEUDO_RODATA:
                value = self.rodata_address + int(imm[i + 1])
            elif s == abi.PSEUDO_FIELD_PATH:
                value = int(self.path_codes[int(imm[i])].ctypes.data)
            else:
                continue
            lo, hi = value & 0xFFFFFFFF, (value >> 32) & 0xFFFFFFFF
            insns["regs"][i] = int(dst[i])  # src = 0: a plain 64-bit immediate
            insns["imm"][i] = lo - (1 << 32) if lo >= 1 << 31 else lo
            insns["imm"][i + 1] = hi - (1 << 32) if hi >= 1 << 31 else hi
        self.insns: np.ndarray = np.ascontiguousarray(insns)
        self.address = int(self.insns.ctypes.data)
        self.count = len(self.insns)
        self.descriptor = np.array([self.address, self.count], dtype=np.int64)
        self.descriptor_address = int(self.descriptor.ctypes.data)
        self.program_address = self.descriptor_address
        self.memory_bytes = (
            self.insns.nbytes
            + len(program.rodata)
            + sum(c.nbytes for c in self.path_codes)
            + self.descriptor.nbytes
        )

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return (
            f"LinkedProgram({self.name or '<anonymous>'}: {self.count} insns at {self.address:#x})"
        )

    def __call__(self, event: Any, context: Any = 0) -> int:
        """Run in the interpreter; R0 as a signed int.  ``context`` may be
        left 0 only for programs that do not read the context."""
        from .interp import run

        return int(run(self.address, self.count, address_of(event), address_of(context)))


def address_of(obj: Any) -> int:
    """The address of a record: an int, a numpy array, a ctypes instance or
    a writable buffer (bytearray)."""
    if obj is None:
        return 0
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, np.ndarray):
        return int(obj.ctypes.data)
    if isinstance(obj, ctypes._SimpleCData | ctypes.Structure | ctypes.Union | ctypes.Array):
        return ctypes.addressof(obj)
    address = getattr(obj, "address", None)
    if isinstance(address, int):
        return address
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(obj))
    except TypeError:
        raise TypeError(
            f"cannot take the address of a {type(obj).__name__} (give an int, a numpy "
            "array, a ctypes object or a writable buffer)"
        ) from None


# -- ELF objects ---------------------------------------------------------------------


def _load_elf(
    path: Path,
    section: str | None,
    event_size: int,
    context_size: int,
    paths: tuple[FieldPath, ...],
    name: str | None,
) -> Program:
    from elftools.common.exceptions import ELFError
    from elftools.elf.constants import SH_FLAGS
    from elftools.elf.elffile import ELFFile
    from elftools.elf.relocation import RelocationSection

    try:
        f = path.open("rb")
    except OSError as e:
        raise FilterError(f"{path}: cannot open: {e.strerror}") from None
    with f:
        try:
            elf = ELFFile(f)
            machine = elf.header["e_machine"]
            if machine not in ("EM_BPF", EM_BPF):
                raise FilterError(
                    f"{path}: not an eBPF object (e_machine is {machine}, not EM_BPF)"
                )
            if elf.little_endian is False:
                raise FilterError(f"{path}: big-endian eBPF objects are not supported")
            sections = list(elf.iter_sections())
            if section is None:
                code = next(
                    (
                        s
                        for s in sections
                        if s["sh_type"] == "SHT_PROGBITS"
                        and s["sh_flags"] & SH_FLAGS.SHF_EXECINSTR
                        and s["sh_size"] > 0
                    ),
                    None,
                )
                if code is None:
                    raise FilterError(f"{path}: no executable section with code")
            else:
                code = elf.get_section_by_name(section)
                if code is None:
                    names = [s.name for s in sections if s.name]
                    raise FilterError(
                        f"{path}: no section {section!r} (sections: {', '.join(names)})"
                    )
                if code["sh_type"] != "SHT_PROGBITS" or code["sh_size"] == 0:
                    raise FilterError(f"{path}: section {section!r} holds no code")
            data = code.data()
            if len(data) % 8:
                raise FilterError(
                    f"{path}: section {code.name!r} is {len(data)} bytes, not a whole number of "
                    "8-byte instructions"
                )
            insns = np.frombuffer(data, dtype=abi.INSN).copy()

            # Read-only data: every .rodata* section, each at an 8-aligned base.
            rodata = bytearray()
            bases: dict[int, int] = {}
            for idx, s in enumerate(sections):
                if s.name.startswith(".rodata") and s["sh_type"] in ("SHT_PROGBITS", "SHT_NOBITS"):
                    rodata += b"\0" * (-len(rodata) % 8)
                    bases[idx] = len(rodata)
                    rodata += s.data() if s["sh_type"] == "SHT_PROGBITS" else bytes(s["sh_size"])

            code_index = sections.index(code)
            symtab = elf.get_section_by_name(".symtab")
            for rel_sec in sections:
                if not isinstance(rel_sec, RelocationSection):
                    continue
                if rel_sec["sh_info"] != code_index:
                    continue
                for rel in rel_sec.iter_relocations():
                    _apply_relocation(path, code.name, insns, rel, rel_sec, elf, symtab, bases)
        except ELFError as e:
            raise FilterError(f"{path}: not a valid ELF object ({e})") from None
    return Program(
        insns,
        bytes(rodata),
        paths,
        event_size=event_size,
        context_size=context_size,
        name=name if name is not None else f"{path.name}:{code.name}",
    )


def _apply_relocation(path, section_name, insns, rel, rel_sec, elf, symtab, bases) -> None:
    offset = rel["r_offset"]
    rtype = rel["r_info_type"]
    where = f"{path}: section {section_name!r} offset {offset:#x}"
    if rtype == R_BPF_NONE:
        return
    if rtype != R_BPF_64_64:
        raise FilterError(
            f"{where}: unsupported relocation type {rtype} (only R_BPF_64_64 against .rodata; "
            "calls to other functions and global variables are not supported)"
        )
    if offset % 8 or offset // 8 + 1 >= len(insns):
        raise FilterError(f"{where}: relocation does not point at an ld_imm64 instruction")
    i = offset // 8
    if insns["code"][i] != (isa.LD | isa.DW | isa.IMM):
        raise FilterError(f"{where}: R_BPF_64_64 relocation on an instruction that is not ld_imm64")
    syms = elf.get_section(rel_sec["sh_link"]) if rel_sec["sh_link"] else symtab
    sym = syms.get_symbol(rel["r_info_sym"])
    shndx = sym["st_shndx"]
    target = elf.get_section(shndx) if isinstance(shndx, int) else None
    if not isinstance(shndx, int) or shndx not in bases:
        sname = target.name if target is not None else str(shndx)
        raise FilterError(
            f"{where}: relocation against symbol {sym.name or '<section>'!r} in {sname} "
            "(only .rodata data is supported)"
        )
    # REL (LLVM's BPF back end): the addend is in the first immediate.
    if rel_sec.is_RELA():
        addend = rel["r_addend"]
    else:
        addend = int(insns["imm"][i]) & 0xFFFFFFFF
    value = bases[shndx] + sym["st_value"] + addend
    insns["regs"][i] = (insns["regs"][i] & 0xF) | (abi.PSEUDO_RODATA << 4)
    insns["imm"][i] = 0
    insns["imm"][i + 1] = value
