"""Inlining string helpers into verified programs, for the JIT.

A filter's string predicate is a ``str_eq`` helper call: the verifier can
check its arguments (a field path, a literal in rodata) where it could not
check loads through the string's pointer.  Once a program is verified, the
loader may rewrite what it knows to be safe, as the kernel does after its
verifier (``do_misc_fixups`` inlines map lookups and other helpers): a
``str_eq`` whose field is a static ``char *`` or ``char[N]`` of the record
and whose literal is a known rodata string becomes byte loads and compares
against immediates.  The bytes are read in order and only while they match
the literal's (non-NUL) bytes, so no byte past the string's end is read.

The instructions that only set the call's arguments (R3-R5) go too.  What
the program computes is unchanged: R0 is 1, 0 or -1 as the helper returns
it, R1-R5 are dead after the call either way.
"""

from __future__ import annotations

import numpy as np

from .. import abi
from ..schema import ROOT_CONTEXT, FieldPath
from . import isa
from .isa import R0, R1, R2, R3, R4, R5

MAX_INLINE_LITERAL = 64  # longer literals stay helper calls

_JUMP_CLASSES = (isa.JMP, isa.JMP32)


def _is_jump(code: int) -> bool:
    return (code & 7) in _JUMP_CLASSES and (code & 0xF0) not in (isa.CALL, isa.EXIT)


def _reads(code: int, dst: int, src: int) -> set[int]:
    """Registers an instruction reads (enough for dead-argument removal)."""
    cls = code & 7
    out: set[int] = set()
    if cls in (isa.ALU, isa.ALU64):
        if code & 0xF0 != isa.MOV:
            out.add(dst)
        if code & isa.X:
            out.add(src)
    elif cls == isa.LDX:
        out.add(src)
    elif cls in (isa.STX, isa.ST):
        out.add(dst)
        if cls == isa.STX:
            out.add(src)
    elif cls in _JUMP_CLASSES:
        op = code & 0xF0
        if op == isa.CALL:
            out |= {R1, R2, R3, R4, R5}
        elif op == isa.EXIT:
            out.add(R0)
        elif op != isa.JA:
            out.add(dst)
            if code & isa.X:
                out.add(src)
    return out


def _writes(code: int, dst: int) -> set[int]:
    cls = code & 7
    if cls in (isa.ALU, isa.ALU64, isa.LDX) or code == isa.LD | isa.DW | isa.IMM:
        return {dst}
    if cls in _JUMP_CLASSES and code & 0xF0 == isa.CALL:
        return {R0, R1, R2, R3, R4, R5}
    return set()


def _sequence(path: FieldPath, literal: bytes) -> list | None:
    """Instructions computing str_eq's R0 for a static field, or None."""
    if path.static_offset is None or path.leaf != "string":
        return None
    base = R2 if path.root == ROOT_CONTEXT else R1
    off = path.static_offset
    n = len(literal)
    if off + max(n + 1, 8) > 0x7FFF:
        return None
    body: list = []  # items: insn, or ("no" | "missing" | "end", builder)
    if path.storage == "ptr":
        body.append(isa.ldx(isa.DW, R3, base, off))
        body.append(("missing", isa.JEQ, R3, 0))
        at, reg = 0, R3
        capacity = None
    elif path.storage == "inline":
        at, reg = off, base
        capacity = path.capacity
        if n > capacity:
            return [isa.mov_imm(R0, 0)]
    else:
        return None
    for k, byte in enumerate(literal):
        body.append(isa.ldx(isa.B, R0, reg, at + k))
        body.append(("no", isa.JNE, R0, byte))
    if capacity is None or n < capacity:
        body.append(isa.ldx(isa.B, R0, reg, at + n))
        body.append(("no", isa.JNE, R0, 0))
    body.append(isa.mov_imm(R0, 1))
    body.append(("end", isa.JA, 0, 0))
    labels = {"no": len(body)}
    body.append(isa.mov_imm(R0, 0))
    if path.storage == "ptr":
        body.append(("end", isa.JA, 0, 0))
        labels["missing"] = len(body)
        body.append(isa.mov_imm(R0, -1))
    labels["end"] = len(body)
    out = []
    for k, item in enumerate(body):
        if isinstance(item, tuple) and isinstance(item[0], str):
            name, op, dst, imm = item
            rel = labels[name] - (k + 1)
            out.append(isa.ja(rel) if op == isa.JA else isa.jmp(op, dst, imm, rel, reg=False))
        else:
            out.append(item)
    return out


def inline_string_helpers(linked) -> np.ndarray:
    """The linked program's instructions with its inlinable ``str_eq`` calls
    inlined (a new array; jump offsets adjusted)."""
    insns = linked.insns
    code, dst, src, off, imm = (np.asarray(c).astype(np.int64) for c in isa.fields(insns))
    n = insns.shape[0]
    paths = {int(c.ctypes.data): p for p, c in zip(linked.paths, linked.path_codes, strict=True)}
    rodata = bytes(linked.rodata)
    rbase = int(linked.rodata_address)
    second = np.zeros(n, np.bool_)  # second slots of ld_imm64
    targets = np.zeros(n + 1, np.bool_)
    i = 0
    while i < n:
        if code[i] == isa.LD | isa.DW | isa.IMM:
            second[i + 1] = True
            i += 2
            continue
        if _is_jump(int(code[i])):
            targets[i + 1 + off[i]] = True
        i += 1

    edits: dict[int, list] = {}
    consts: dict[int, tuple[int, int]] = {}  # reg -> (value, defining index)
    i = 0
    while i < n:
        if targets[i]:
            consts.clear()
        c = int(code[i])
        if c == isa.LD | isa.DW | isa.IMM:
            value = (int(imm[i]) & 0xFFFFFFFF) | ((int(imm[i + 1]) & 0xFFFFFFFF) << 32)
            consts[int(dst[i])] = (value, i)
            i += 2
            continue
        if c == isa.ALU64 | isa.MOV | isa.K:
            consts[int(dst[i])] = (int(imm[i]), i)
            i += 1
            continue
        if c == isa.JMP | isa.CALL:
            site = _site(i, int(imm[i]), consts, paths, rodata, rbase)
            if site is not None:
                seq, defs = site
                edits[i] = seq
                for d in defs:
                    if _dead_until(d, i, code, dst, src, second):
                        edits[d] = []
            consts.clear()
            i += 1
            continue
        if (c & 7) in _JUMP_CLASSES:
            consts.clear()
        else:
            for r in _writes(c, int(dst[i])):
                consts.pop(r, None)
        i += 1
    if not edits:
        return insns
    return _splice(insns, code, off, second, edits)


def _site(i, helper, consts, paths, rodata, rbase):
    if helper != abi.HELPER_STR_EQ or not all(r in consts for r in (R3, R4, R5)):
        return None
    path = paths.get(consts[R3][0])
    lit_at, length = consts[R4][0] - rbase, consts[R5][0]
    if path is None or not 0 <= length <= MAX_INLINE_LITERAL:
        return None
    if not 0 <= lit_at <= len(rodata) - length:
        return None
    literal = rodata[lit_at : lit_at + length]
    if b"\0" in literal:
        return None
    seq = _sequence(path, literal)
    if seq is None:
        return None
    return seq, [consts[r][1] for r in (R3, R4, R5)]


def _dead_until(d: int, call: int, code, dst, src, second) -> bool:
    """Whether the value defined at ``d`` is read by nothing before ``call``."""
    reg = int(dst[d])
    j = d + (2 if code[d] == isa.LD | isa.DW | isa.IMM else 1)
    while j < call:
        if not second[j] and reg in _reads(int(code[j]), int(dst[j]), int(src[j])):
            return False
        j += 1
    return True


def _splice(insns: np.ndarray, code, off, second, edits: dict[int, list]) -> np.ndarray:
    """Replace instructions (by index; an ld_imm64 with both slots) and
    re-aim every jump at its old target's new place."""
    n = insns.shape[0]
    new_index = np.zeros(n + 1, np.int64)
    pieces: list[np.ndarray] = []
    pos = 0
    i = 0
    while i < n:
        width = 2 if code[i] == isa.LD | isa.DW | isa.IMM else 1
        new_index[i : i + width] = pos
        if i in edits:
            piece = isa.program(edits[i]) if edits[i] else np.zeros(0, insns.dtype)
        else:
            piece = insns[i : i + width].copy()
        pieces.append((i, piece))
        pos += piece.shape[0]
        i += width
    new_index[n] = pos
    out = []
    for i, piece in pieces:
        if i not in edits and piece.shape[0] == 1 and _is_jump(int(code[i])):
            target = i + 1 + int(off[i])
            piece["off"] = new_index[target] - (new_index[i] + 1)
        out.append(piece)
    return np.concatenate(out) if out else insns[:0].copy()
