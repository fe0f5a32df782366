"""eBPF assembly text: the syntax of ``llvm-objdump -d`` and the kernel
verifier's log, for hand-written filters (the first of the routes to a
filter in Sharma and Dagenais, "Enhanced Userspace and In-Kernel Trace
Filtering for Production Systems", JCST 2016).

One instruction per line; ``;`` or ``#`` starts a comment; ``NAME:``
defines a label (alone or before an instruction)::

    r0 = 1                      r1 = *(u64 *)(r1 + 8)
    w0 = w1                     *(u32 *)(r10 - 4) = r2
    r1 += -3                    *(u64 *)(r10 - 16) = 7
    r1 s>>= 2                   if r1 == r2 goto +3
    r1 = -r1                    if w1 s> 5 goto out        (w: JMP32)
    r1 = be16 r1                goto out
    r2 = 0x1122334455667788 ll  call 2 / call str_eq
    r3 = rodata[16] ll          exit
    r3 = path[0] ll             .insn 0x18, 1, 0, 0, 5     (raw: code, dst, src, off, imm)

``wN`` destinations make 32-bit ALU instructions (both operands ``w``);
``r``/``w`` are the same on loads and stores.  Immediates are decimal or
``0x`` hex, 32-bit (hex up to ``0xffffffff`` wraps to the signed value),
64-bit with ``ll``.  Jump targets are ``+N``/``-N`` (slots after the next
instruction) or a label; ``<...>`` after a target (objdump's annotation) is
ignored.  :func:`disassemble` prints every instruction so that
:func:`assemble` gives back the same bits (``.insn`` for encodings with no
canonical text).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .. import abi
from ..errors import FilterError
from . import isa


class AsmError(FilterError):
    """Assembly text that cannot be assembled; ``where`` is ``line N`` and
    ``column`` points into that line."""


_HELPER_BY_NAME = {name: n for n, (name, _) in abi.HELPERS.items()}
_ALU_BY_SYM = {sym[:-1]: op for op, sym in isa.ALU_NAMES.items() if op != isa.MOV}
_JMP_BY_SYM = {sym: op for op, sym in isa.JMP_NAMES.items()}
_SIZE_BY_NAME = {"u8": isa.B, "u16": isa.H, "u32": isa.W, "u64": isa.DW}
_SIZE_NAME = {v: k for k, v in _SIZE_BY_NAME.items()}

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<reg>[rw][0-9]+\b)
  | (?P<num>0[xX][0-9a-fA-F]+|[0-9]+)\b
  | (?P<annot><[A-Za-z_.$][^<>]*>)
  | (?P<op>s>>=|<<=|>>=|s>=|s<=|s>|s<|==|!=|>=|<=|\+=|-=|\*=|/=|%=|\|=|&=|\^=|[=<>+\-*/&|^()\[\],:])
  | (?P<ident>[A-Za-z_.$][\w.$]*)
    """,
    re.VERBOSE,
)


@dataclass
class _Tok:
    kind: str  # reg, num, op, ident, end
    text: str
    col: int  # 1-based


class _Line:
    """The tokens of one line and a cursor, with errors that point."""

    def __init__(self, text: str, number: int) -> None:
        self.text = text
        self.lineno = number
        self.toks: list[_Tok] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                self.error(f"unexpected character {text[pos]!r}", pos + 1)
            kind = m.lastgroup or ""
            if kind not in ("ws", "annot"):
                self.toks.append(_Tok(kind, m.group(), pos + 1))
            pos = m.end()
        self.toks.append(_Tok("end", "", len(text.rstrip()) + 1))
        self.i = 0

    def error(self, message: str, col: int | None = None):
        if col is None:
            col = self.peek().col
        raise AsmError(message, expression=self.text, column=col, where=f"line {self.lineno}")

    def peek(self, k: int = 0) -> _Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def next(self) -> _Tok:
        t = self.peek()
        self.i += 1
        return t

    def accept(self, text: str) -> bool:
        if self.peek().text == text and self.peek().kind in ("op", "ident"):
            self.i += 1
            return True
        return False

    def expect(self, text: str, what: str | None = None) -> _Tok:
        t = self.peek()
        if t.text != text or t.kind not in ("op", "ident"):
            found = repr(t.text) if t.kind != "end" else "the end of the line"
            self.error(f"expected {what or repr(text)}, found {found}")
        self.i += 1
        return t

    def end(self) -> None:
        t = self.peek()
        if t.kind != "end":
            self.error(f"unexpected {t.text!r} after the instruction")

    def reg(self) -> tuple[int, bool]:
        """A register: (number, is 32-bit name)."""
        t = self.next()
        if t.kind != "reg":
            self.i -= 1
            self.error(f"expected a register (r0-r10 or w0-w10), found {t.text or 'nothing'!r}")
        n = int(t.text[1:])
        if n > 10:
            self.i -= 1
            self.error(f"invalid register {t.text} (r0-r10, w0-w10)")
        return n, t.text[0] == "w"

    def number(self, lo: int, hi: int, what: str) -> int:
        col = self.peek().col
        sign = 1
        if self.accept("-"):
            sign = -1
        elif self.accept("+"):
            pass
        t = self.next()
        if t.kind != "num":
            self.i -= 1
            self.error(f"expected {what}, found {t.text or 'nothing'!r}")
        v = sign * int(t.text, 0)
        if not lo <= v <= hi:
            self.error(f"{what} {v} out of range [{lo}, {hi}]", col)
        return v


_S32 = (-(1 << 31), (1 << 32) - 1)
_S16 = (-(1 << 15), (1 << 15) - 1)


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >> 31 else v


# A parsed statement: the instruction(s) with unresolved jump targets.
@dataclass
class _Stmt:
    insns: list[isa.Insn]
    line: _Line
    label: str | None = None  # jump target label of insns[0]
    label_col: int = 0


def _parse_target(ln: _Line) -> tuple[int | None, str | None, int]:
    t = ln.peek()
    if t.kind == "ident":
        ln.next()
        return None, t.text, t.col
    return ln.number(*_S16, "jump offset"), None, t.col


def _parse_mem(ln: _Line) -> tuple[int, int, int]:
    """``*(uN *)(rX + off)``: (size code, register, offset)."""
    ln.expect("*", "'*(' of a memory operand")
    ln.expect("(")
    t = ln.next()
    if t.text not in _SIZE_BY_NAME:
        ln.i -= 1
        ln.error("expected u8, u16, u32 or u64")
    ln.expect("*")
    ln.expect(")")
    ln.expect("(")
    r, _ = ln.reg()
    off = 0
    if ln.peek().text in ("+", "-"):
        neg = ln.next().text == "-"
        col = ln.peek().col
        off = ln.number(0, 1 << 16, "offset")
        off = -off if neg else off
        if not _S16[0] <= off <= _S16[1]:
            ln.error(f"offset {off} out of range [{_S16[0]}, {_S16[1]}]", col)
    ln.expect(")")
    return _SIZE_BY_NAME[t.text], r, off


def _parse_line(ln: _Line) -> _Stmt | None:
    t = ln.peek()
    if t.kind == "end":
        return None
    if t.kind == "ident":
        word = t.text
        if word == "exit":
            ln.next()
            ln.end()
            return _Stmt([isa.exit_()], ln)
        if word == "call":
            ln.next()
            h = ln.peek()
            if h.kind == "ident":
                ln.next()
                if h.text not in _HELPER_BY_NAME:
                    ln.error(
                        f"unknown helper {h.text!r} (known: {', '.join(_HELPER_BY_NAME)})", h.col
                    )
                n = _HELPER_BY_NAME[h.text]
            else:
                n = ln.number(*_S32, "helper number")
            ln.end()
            return _Stmt([isa.call(_s32(n))], ln)
        if word == "goto":
            ln.next()
            off, label, col = _parse_target(ln)
            ln.end()
            return _Stmt([isa.ja(off or 0)], ln, label, col)
        if word == "if":
            ln.next()
            d, d32 = ln.reg()
            op_tok = ln.next()
            if op_tok.text not in _JMP_BY_SYM:
                ln.i -= 1
                ln.error("expected a comparison (== != > >= < <= s> s>= s< s<= &)")
            op = _JMP_BY_SYM[op_tok.text]
            cls = isa.JMP32 if d32 else isa.JMP
            if ln.peek().kind == "reg":
                col = ln.peek().col
                s, s32 = ln.reg()
                if s32 != d32:
                    ln.error(
                        "both registers of a comparison must be rN (64-bit) or wN (32-bit)", col
                    )
                insn = isa.insn(cls | op | isa.X, d, s)
            else:
                insn = isa.insn(cls | op | isa.K, d, 0, 0, _s32(ln.number(*_S32, "immediate")))
            ln.expect("goto")
            off, label, col = _parse_target(ln)
            ln.end()
            code, regs, _, imm = insn
            return _Stmt([(code, regs, off or 0, imm)], ln, label, col)
        if word == ".insn":
            ln.next()
            vals = []
            for i, (lo, hi, what) in enumerate(
                (
                    (0, 255, "opcode"),
                    (0, 15, "dst"),
                    (0, 15, "src"),
                    (*_S16, "offset"),
                    (*_S32, "immediate"),
                )
            ):
                if i:
                    ln.expect(",")
                vals.append(ln.number(lo, hi, what))
            ln.end()
            code, d, s, off, imm = vals
            return _Stmt([(code, d | (s << 4), off, _s32(imm))], ln)
        ln.error(f"unknown instruction {word!r}")
    if t.kind == "op" and t.text == "*":
        size, d, off = _parse_mem(ln)
        ln.expect("=")
        if ln.peek().kind == "reg":
            s, _ = ln.reg()
            insn = isa.stx(size, d, s, off)
        else:
            insn = isa.st(size, d, off, _s32(ln.number(*_S32, "immediate")))
        ln.end()
        return _Stmt([insn], ln)
    if t.kind != "reg":
        ln.error(f"expected an instruction, found {t.text!r}")
    d, d32 = ln.reg()
    op_tok = ln.next()
    cls = isa.ALU if d32 else isa.ALU64
    if op_tok.text == "=":
        nxt = ln.peek()
        if nxt.text == "*" and nxt.kind == "op":
            size, s, off = _parse_mem(ln)
            ln.end()
            return _Stmt([isa.ldx(size, d, s, off)], ln)
        if nxt.kind == "ident" and nxt.text in ("be16", "be32", "be64", "le16", "le32", "le64"):
            ln.next()
            col = ln.peek().col
            s, _ = ln.reg()
            if s != d:
                ln.error(f"a byte swap works in place: expected r{d}", col)
            if d32:
                ln.error("byte swaps are written with r registers", t.col)
            src = isa.X if nxt.text.startswith("be") else isa.K
            ln.end()
            return _Stmt([isa.insn(isa.ALU | isa.END | src, d, 0, 0, int(nxt.text[2:]))], ln)
        if nxt.kind == "ident" and nxt.text in ("rodata", "path"):
            ln.next()
            ln.expect("[")
            v = ln.number(0, (1 << 31) - 1, "index")
            ln.expect("]")
            ln.expect("ll")
            ln.end()
            if d32:
                ln.error("ld_imm64 loads a 64-bit register: write r", t.col)
            if nxt.text == "rodata":
                return _Stmt(isa.ld_pseudo(d, abi.PSEUDO_RODATA, 0, v), ln)
            return _Stmt(isa.ld_pseudo(d, abi.PSEUDO_FIELD_PATH, v, 0), ln)
        if nxt.text == "-" and ln.peek(1).kind == "reg":
            ln.next()
            col = ln.peek().col
            s, s32 = ln.reg()
            if s != d or s32 != d32:
                ln.error(f"negation works in place: expected {'w' if d32 else 'r'}{d}", col)
            ln.end()
            return _Stmt([isa.insn(cls | isa.NEG, d)], ln)
        if ln.peek().kind == "reg":
            col = ln.peek().col
            s, s32 = ln.reg()
            if s32 != d32:
                ln.error("both registers must be rN (64-bit) or wN (32-bit)", col)
            ln.end()
            return _Stmt([isa.insn(cls | isa.MOV | isa.X, d, s)], ln)
        # An immediate: 32-bit, or 64-bit with ``ll``.
        col = ln.peek().col
        v = ln.number(-(1 << 63), (1 << 64) - 1, "immediate")
        if ln.accept("ll"):
            ln.end()
            if d32:
                ln.error("ld_imm64 loads a 64-bit register: write r", t.col)
            return _Stmt(isa.ld_imm64(d, v), ln)
        ln.end()
        if not _S32[0] <= v <= _S32[1]:
            ln.error(f"immediate {v} does not fit in 32 bits (add 'll' for a 64-bit load)", col)
        return _Stmt([isa.insn(cls | isa.MOV | isa.K, d, 0, 0, _s32(v))], ln)
    sym = op_tok.text[:-1] if op_tok.text.endswith("=") else None
    if sym not in _ALU_BY_SYM:
        ln.i -= 1
        ln.error("expected an assignment (= += -= *= /= %= |= &= ^= <<= >>= s>>=)")
    op = _ALU_BY_SYM[sym]
    if ln.peek().kind == "reg":
        col = ln.peek().col
        s, s32 = ln.reg()
        if s32 != d32:
            ln.error("both registers must be rN (64-bit) or wN (32-bit)", col)
        insn = isa.insn(cls | op | isa.X, d, s)
    else:
        insn = isa.insn(cls | op | isa.K, d, 0, 0, _s32(ln.number(*_S32, "immediate")))
    ln.end()
    return _Stmt([insn], ln)


_COMMENT = re.compile(r"[;#]")
_LABEL = re.compile(r"\s*([A-Za-z_.$][\w.$]*)\s*:")


def assemble(text: str) -> np.ndarray:
    """The instructions of ``text`` as an INSN array; :class:`AsmError`
    (line and column) on bad input."""
    stmts: list[_Stmt] = []
    labels: dict[str, int] = {}
    slot = 0
    for number, raw in enumerate(text.splitlines(), 1):
        m = _COMMENT.search(raw)
        line = raw[: m.start()] if m else raw
        # Labels: ``NAME:`` (any number) before the instruction.
        while True:
            lm = _LABEL.match(line)
            if lm is None or lm.group(1) in ("if", "goto", "call", "exit"):
                break
            name = lm.group(1)
            if name in labels:
                _Line(raw, number).error(f"label {name!r} defined twice", lm.start(1) + 1)
            labels[name] = slot
            line = " " * lm.end() + line[lm.end() :]
        ln = _Line(line, number)
        ln.text = raw.rstrip("\n")
        stmt = _parse_line(ln)
        if stmt is not None:
            stmts.append(stmt)
            slot += len(stmt.insns)
    out: list[isa.Insn] = []
    for stmt in stmts:
        first = stmt.insns[0]
        if stmt.label is not None:
            if stmt.label not in labels:
                stmt.line.error(f"undefined label {stmt.label!r}", stmt.label_col)
            off = labels[stmt.label] - (len(out) + 1)
            if not _S16[0] <= off <= _S16[1]:
                stmt.line.error(f"label {stmt.label!r} is too far ({off} slots)", stmt.label_col)
            first = (first[0], first[1], off, first[3])
        out.append(first)
        out += stmt.insns[1:]
    return np.array(out, dtype=abi.INSN)


# -- disassembly -------------------------------------------------------------------------


def _fmt_off(off: int) -> str:
    return f"+ {off}" if off >= 0 else f"- {-off}"


def _text(code: int, d: int, s: int, off: int, imm: int, nxt: tuple | None) -> str | None:
    """The canonical text of one instruction (ld_imm64 with its second
    slot ``nxt``), or None when it has no text form."""
    cls = code & 7
    if cls in (isa.ALU, isa.ALU64):
        op = code & 0xF0
        p = "w" if cls == isa.ALU else "r"
        if op == isa.END:
            kind = "be" if code & isa.X else "le"
            return f"r{d} = {kind}{imm} r{d}"
        if op == isa.NEG:
            return f"{p}{d} = -{p}{d}"
        if op not in isa.ALU_NAMES:
            return None
        rhs = f"{p}{s}" if code & isa.X else str(imm)
        return f"{p}{d} {isa.ALU_NAMES[op]} {rhs}"
    if cls == isa.LDX:
        size = _SIZE_NAME[code & 0x18]
        return f"r{d} = *({size} *)(r{s} {_fmt_off(off)})"
    if cls in (isa.ST, isa.STX):
        size = _SIZE_NAME[code & 0x18]
        rhs = f"r{s}" if cls == isa.STX else str(imm)
        return f"*({size} *)(r{d} {_fmt_off(off)}) = {rhs}"
    if cls == isa.LD:
        if nxt is None:
            return None
        if s == abi.PSEUDO_RODATA:
            return f"r{d} = rodata[{nxt[4]}] ll"
        if s == abi.PSEUDO_FIELD_PATH:
            return f"r{d} = path[{imm}] ll"
        value = (imm & 0xFFFFFFFF) | ((nxt[4] & 0xFFFFFFFF) << 32)
        return f"r{d} = {value} ll"  # unsigned decimal, as llvm-objdump
    op = code & 0xF0
    if cls == isa.JMP:
        if op == isa.JA:
            return f"goto {off:+d}"
        if op == isa.EXIT:
            return "exit"
        if op == isa.CALL:
            name = abi.HELPERS.get(imm, (None,))[0]
            return f"call {name}" if name else f"call {imm}"
    if op not in isa.JMP_NAMES:
        return None
    p = "w" if cls == isa.JMP32 else "r"
    rhs = f"{p}{s}" if code & isa.X else str(imm)
    return f"if {p}{d} {isa.JMP_NAMES[op]} {rhs} goto {off:+d}"


def _raw(code: int, d: int, s: int, off: int, imm: int) -> str:
    return f".insn {code:#04x}, {d}, {s}, {off}, {imm}"


def disassemble(insns: np.ndarray | Iterable) -> list[str]:
    """One line per instruction (``ld_imm64`` is one line for two slots),
    in the syntax :func:`assemble` reads back to the same bits."""
    arr = np.asarray(insns, dtype=abi.INSN).reshape(-1)
    code, dst, src, off, imm = (c.tolist() for c in isa.fields(arr))
    rows = list(zip(code, dst, src, off, imm, strict=True))
    lines: list[str] = []
    i = 0
    while i < len(rows):
        row = rows[i]
        width = 2 if row[0] == isa.LD | isa.DW | isa.IMM and i + 1 < len(rows) else 1
        nxt = rows[i + 1] if width == 2 else None
        text = _text(*row, nxt)
        want = arr[i : i + width]
        # Keep the text only if it reads back to exactly these bits.
        if text is not None:
            try:
                back = assemble(text)
            except AsmError:
                back = None
            if back is None or len(back) != width or back.tobytes() != want.tobytes():
                text = None
        if text is None:
            lines.append(_raw(*row))
            i += 1
            continue
        lines.append(text)
        i += width
    return lines


def listing(insns: np.ndarray) -> str:
    """Disassembly with slot numbers (``  12: r0 = 1``), for messages."""
    out = []
    slot = 0
    for line in disassemble(insns):
        out.append(f"{slot:5d}: {line}")
        slot += 2 if line.endswith(" ll") else 1
    return "\n".join(out)
