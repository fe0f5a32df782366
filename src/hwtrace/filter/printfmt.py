"""A tracepoint's ``print fmt``: the fields the kernel prints as words.

A tracefs format file ends with the ``printf`` the kernel's trace output
(and ``perf script``, through libtraceevent) renders a record with: a
format string and C expressions over the record's fields (``REC->name``).
Most fields are printed as numbers, but flags and enumerations go through
``__print_flags`` and ``__print_symbolic`` (``sched_switch``'s
``prev_state=S``, ``hrtimer_setup``'s ``clockid=CLOCK_MONOTONIC``).  :func:`word_fields`
finds the fields printed as ``name=`` followed by conversions whose
arguments read that field alone, and gives for each the function of its
value the kernel prints, with the kernel's semantics
(``trace_print_flags_seq``, ``trace_print_symbols_seq``): the outputs
evaluate it once per distinct value (:func:`word_rows`), not per event.

Expressions this module does not model (other helpers, several fields in
one conversion, ``%*d``) leave the field printed as its number.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

__all__ = ["PrintFmtError", "parse_print_fmt", "word_fields", "word_rows"]


class PrintFmtError(ValueError):
    """A ``print fmt`` line this module cannot read; the message says where."""


class _Unsupported(Exception):
    """An expression outside what this module evaluates."""


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>"(?:\\.|[^"\\])*")
      | (?P<chr>'(?:\\.|[^'\\])')
      | (?P<num>0[xX][0-9a-fA-F]+|\d+)[uUlL]*
      | (?P<id>[A-Za-z_]\w*)
      | (?P<op>->|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^~!?:(),{}<>\[\].])
    )""",
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'"}
# Binary operators by precedence (C's, higher binds tighter).
_BINARY = {
    "||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6,
    "<": 7, ">": 7, "<=": 7, ">=": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10,
}  # fmt: skip
_TYPE_WORDS = {
    "int", "long", "unsigned", "signed", "char", "short", "bool", "_Bool", "void", "const",
    "u8", "u16", "u32", "u64", "s8", "s16", "s32", "s64", "__u8", "__u16", "__u32", "__u64",
    "__s8", "__s16", "__s32", "__s64", "size_t", "ssize_t", "pid_t", "gfp_t", "struct", "enum",
    "union",
}  # fmt: skip
_MASK64 = (1 << 64) - 1
# Typedefs casts in print fmts name: (bits, signed).
_TYPEDEFS = {
    "uint": (32, False), "ulong": (64, False), "ushort": (16, False), "uchar": (8, False),
    "loff_t": (64, True), "off_t": (64, True), "sector_t": (64, False), "umode_t": (16, False),
    "int8_t": (8, True), "int16_t": (16, True), "int32_t": (32, True), "int64_t": (64, True),
    "uint8_t": (8, False), "uint16_t": (16, False), "uint32_t": (32, False),
    "uint64_t": (64, False), "xfs_lsn_t": (64, True),
}  # fmt: skip


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


class _Parser:
    """C expressions of a ``print fmt``'s arguments, as tuples:
    ``("num", v)``, ``("str", s)``, ``("field", name)``, ``("un", op, a)``,
    ``("bin", op, a, b)``, ``("cond", c, a, b)``, ``("call", name, args)``,
    ``("pair", a, b)`` (a ``{value, "name"}`` of a table), ``("cast",
    bits, signed, a)`` (bits 0: a pointer or unknown width, no change)."""

    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                if text[pos:].strip() == "":
                    break
                raise PrintFmtError(f"column {pos + 1}: cannot read {text[pos : pos + 12]!r}")
            kind = m.lastgroup or ""
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.at = 0

    def peek(self, k: int = 0) -> tuple[str, str]:
        j = self.at + k
        return self.tokens[j] if j < len(self.tokens) else ("end", "")

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if value is not None and tok[1] != value:
            raise PrintFmtError(f"token {self.at + 1}: expected {value!r}, found {tok[1]!r}")
        self.at += 1
        return tok

    def arguments(self) -> list[tuple]:
        out = []
        while self.peek()[0] != "end":
            out.append(self.expression())
            if self.peek()[1] == ",":
                self.take()
            elif self.peek()[0] != "end":
                raise PrintFmtError(f"token {self.at + 1}: unexpected {self.peek()[1]!r}")
        return out

    def expression(self, level: int = 0) -> tuple:
        left = self.unary()
        while True:
            op = self.peek()[1] if self.peek()[0] == "op" else ""
            if op == "?" and level == 0:
                self.take()
                then = self.expression()
                self.take(":")
                other = self.expression()
                left = ("cond", left, then, other)
                continue
            prec = _BINARY.get(op)
            if prec is None or prec <= level:
                return left
            self.take()
            left = ("bin", op, left, self.expression(prec))

    def unary(self) -> tuple:
        kind, value = self.peek()
        if kind == "op" and value in ("-", "~", "!", "+"):
            self.take()
            return ("un", value, self.unary())
        if kind == "op" and value == "(":
            if self.peek(1)[0] == "id" and (self.peek(1)[1] in _TYPE_WORDS or self._typedef_cast()):
                return self.cast()
            self.take()
            inner = self.expression()
            self.take(")")
            return self.postfix(inner)
        if kind == "op" and value == "{":
            self.take()
            a = self.expression()
            self.take(",")
            b = self.expression()
            self.take("}")
            return ("pair", a, b)
        return self.postfix(self.primary())

    def _typedef_cast(self) -> bool:
        """``(name)`` or ``(name *)`` before an operand: a cast to a typedef
        (``(uint)``, ``(loff_t)``); a parenthesised constant is not
        followed by one."""
        j = 2
        while self.peek(j)[1] == "*":
            j += 1
        return self.peek(j)[1] == ")" and (
            self.peek(j + 1)[0] in ("id", "num") or self.peek(j + 1)[1] == "("
        )

    def cast(self) -> tuple:
        self.take("(")
        words = []
        while self.peek()[1] != ")":
            kind, value = self.take()
            if kind == "end":
                raise PrintFmtError("a cast without ')'")
            words.append(value)
        self.take(")")
        return ("cast", *_cast_type(words), self.unary())

    def primary(self) -> tuple:
        kind, value = self.take()
        if kind == "num":
            return ("num", int(value, 0))
        if kind == "chr":
            return ("num", ord(_unquote(value)))
        if kind == "str":
            text = _unquote(value)
            while self.peek()[0] == "str":  # adjacent literals are one
                text += _unquote(self.take()[1])
            return ("str", text)
        if kind == "id":
            if value == "REC" and self.peek()[1] == "->":
                self.take()
                return ("field", self.take()[1])
            if self.peek()[1] == "(":
                self.take()
                args = []
                while self.peek()[1] != ")":
                    if self.peek()[0] == "end":
                        raise PrintFmtError(f"{value}(: no closing ')'")
                    args.append(self.expression())
                    if self.peek()[1] == ",":
                        self.take()
                self.take(")")
                return ("call", value, args)
            return ("name", value)
        raise PrintFmtError(f"token {self.at}: unexpected {value!r}")

    def postfix(self, node: tuple) -> tuple:
        while self.peek()[1] in ("[", ".", "->"):
            op = self.take()[1]
            if op == "[":
                index = self.expression()
                self.take("]")
                node = ("index", node, index)
            else:
                node = ("member", node, self.take()[1])
        return node


def _cast_type(words: list[str]) -> tuple[int, bool]:
    if "*" in words:
        return 0, False
    names = [w for w in words if w not in ("const", "volatile")]
    if len(names) == 1 and names[0] not in _TYPE_WORDS:
        # A typedef: those print fmts use, else no change.
        return _TYPEDEFS.get(names[0], (0, False))
    signed = "unsigned" not in names and not any(w.startswith(("u", "__u")) for w in names)
    for w in names:
        m = re.fullmatch(r"(?:__)?[su](8|16|32|64)", w)
        if m:
            return int(m.group(1)), w.lstrip("_").startswith("s")
    if "char" in names:
        return 8, signed
    if "short" in names:
        return 16, signed
    if "long" in names or names in (["size_t"], ["ssize_t"]):
        return 64, signed and names != ["size_t"]
    if names in (["bool"], ["_Bool"]):
        return 1, False
    return 32, signed  # int, unsigned, pid_t, gfp_t


def _wrap(v: int, bits: int, signed: bool) -> int:
    v &= (1 << bits) - 1
    if signed and v >> (bits - 1):
        v -= 1 << bits
    return v


def _flags(value: int, delim: str, table: list[tuple[int, str]]) -> str:
    """``trace_print_flags_seq``: the names of the masks set in ``value``
    in the table's order (each clears its bits; none once nothing is left),
    then what is left in hex."""
    value &= _MASK64
    out: list[str] = []
    for mask, name in table:
        if not value:
            break
        if value & mask == mask:
            value &= ~mask
            out.append(name)
    if value:
        out.append(f"0x{value:x}")
    return delim.join(out)


def _symbol(value: int, table: list[tuple[int, str]]) -> str:
    """``trace_print_symbols_seq``: the name of the first entry equal to
    ``value``, else ``value`` in hex."""
    for v, name in table:
        if v & _MASK64 == value & _MASK64:
            return name
    return f"0x{value & _MASK64:x}"


def _table(args: list[tuple], env: dict[str, int]) -> list[tuple[int, str]]:
    out = []
    for a in args:
        if a[0] != "pair":
            raise _Unsupported("a table entry that is not {value, name}")
        v, name = _eval(a[1], env), _eval(a[2], env)
        if name == 0:
            break  # { 0, NULL }: the end, as in the kernel's arrays
        if not isinstance(v, int) or not isinstance(name, str):
            raise _Unsupported("a table entry that is not {value, name}")
        out.append((v, name))
    return out


def _eval(node: tuple, env: dict[str, int]) -> int | str:
    kind = node[0]
    if kind in ("num", "str"):
        return node[1]
    if kind == "field":
        if node[1] not in env:
            raise _Unsupported(f"field {node[1]}")
        return env[node[1]]
    if kind == "cast":
        v = _int(_eval(node[3], env))
        return v if node[1] == 0 else (int(v != 0) if node[1] == 1 else _wrap(v, node[1], node[2]))
    if kind == "un":
        v = _int(_eval(node[2], env))
        return {"-": -v, "~": ~v, "!": int(not v), "+": v}[node[1]]
    if kind == "bin":
        return _binary(node[1], _int(_eval(node[2], env)), node[3], env)
    if kind == "cond":
        return _eval(node[2] if _int(_eval(node[1], env)) else node[3], env)
    if kind == "call":
        name, args = node[1], node[2]
        if name in ("__print_flags", "__print_flags_u64") and len(args) >= 2:
            delim = _eval(args[1], env)
            if not isinstance(delim, str):
                raise _Unsupported("a delimiter that is not a string")
            return _flags(_int(_eval(args[0], env)), delim, _table(args[2:], env))
        if name in ("__print_symbolic", "__print_symbolic_u64") and args:
            return _symbol(_int(_eval(args[0], env)), _table(args[1:], env))
        raise _Unsupported(name)
    raise _Unsupported(kind)


def _int(v: int | str) -> int:
    if not isinstance(v, int):
        raise _Unsupported("a string where a number goes")
    return v


def _binary(op: str, a: int, right: tuple, env: dict[str, int]) -> int:
    if op == "&&":
        return int(bool(a) and bool(_int(_eval(right, env))))
    if op == "||":
        return int(bool(a) or bool(_int(_eval(right, env))))
    b = _int(_eval(right, env))
    if op in ("/", "%"):
        if b == 0:
            raise _Unsupported("division by zero")
        q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)  # C truncates
        return q if op == "/" else a - q * b
    if op in ("<<", ">>"):
        return (a << b) & _MASK64 if op == "<<" else a >> b
    return {
        "|": a | b, "^": a ^ b, "&": a & b, "==": int(a == b), "!=": int(a != b),
        "<": int(a < b), ">": int(a > b), "<=": int(a <= b), ">=": int(a >= b),
        "+": a + b, "-": a - b, "*": a * b,
    }[op]  # fmt: skip


_CONVERSION = re.compile(r"%(?P<flags>[-+ #0]*)(?P<width>\*|\d+)?(?:\.(?P<prec>\*|\d+))?"
                         r"(?P<len>hh|h|ll|l|z|j|t|L)?(?P<spec>[diouxXcsp%])")  # fmt: skip


def _split_format(fmt: str) -> list[tuple[str, re.Match | None]]:
    """The format as (literal text, conversion) pairs (the last conversion
    None); ``%%`` stays in the literal as ``%``."""
    out: list[tuple[str, re.Match | None]] = []
    text, pos = "", 0
    for m in _CONVERSION.finditer(fmt):
        text += fmt[pos : m.start()]
        pos = m.end()
        if m["spec"] == "%":
            text += "%"
            continue
        out.append((text, m))
        text = ""
    out.append((text + fmt[pos:], None))
    return out


def _render(conv: re.Match, value: int | str) -> str:
    """``value`` as the conversion prints it (the kernel's vsnprintf; its
    ``%p`` extensions are not modelled)."""
    spec, length = conv["spec"], conv["len"] or ""
    if conv["width"] == "*" or conv["prec"] == "*" or spec == "p":
        raise _Unsupported("a conversion this module does not print")
    py = "%" + conv["flags"] + (conv["width"] or "") + (f".{conv['prec']}" if conv["prec"] else "")
    if spec == "s":
        if not isinstance(value, str):
            raise _Unsupported("%s of a number")
        return (py + "s") % value
    v = _int(value)
    bits = 64 if length in ("l", "ll", "z", "j", "t", "L") else {"h": 16, "hh": 8}.get(length, 32)
    if spec == "c":
        return (py + "c") % chr(v & 0xFF)
    if spec in "di":
        return (py + "d") % _wrap(v, bits, True)
    v = _wrap(v, bits, False)
    if "#" in py and spec == "o":
        # The kernel's vsnprintf: an octal's # is a 0 before it unless it is
        # 0 (Python writes 0o); hex gets its 0x even for 0, as Python's.
        return ("0" if v else "") + (py.replace("#", "") + spec) % v
    return (py + ("d" if spec == "u" else spec)) % v


def parse_print_fmt(format_text: str) -> tuple[str, list[tuple]] | None:
    """The ``print fmt`` of a tracefs format file: its format string and
    its arguments' expressions (None: the file has no ``print fmt`` line).
    Raises :class:`PrintFmtError` when the line cannot be read."""
    for line in format_text.splitlines():
        if line.startswith("print fmt:"):
            rest = line[len("print fmt:") :].strip()
            m = re.match(r'"((?:\\.|[^"\\])*)"\s*(?:,\s*(.*))?$', rest, re.S)
            if m is None:
                raise PrintFmtError("print fmt: no format string")
            fmt = _unquote(f'"{m.group(1)}"')
            try:
                return fmt, _Parser(m.group(2) or "").arguments()
            except RecursionError:
                raise PrintFmtError("print fmt: expressions nested too deeply") from None
    return None


def _fields_of(node: tuple, out: set[str]) -> set[str]:
    if node[0] == "field":
        out.add(node[1])
    for part in node[1:]:
        if isinstance(part, tuple):
            _fields_of(part, out)
        elif isinstance(part, list):
            for p in part:
                _fields_of(p, out)
    return out


def word_fields(format_text: str, names: set[str]) -> dict[str, Callable[[int], str]]:
    """The fields of ``names`` the ``print fmt`` prints as ``name=`` and
    conversions of expressions of that field alone, one of them a string
    (flags, enumerations; a field only cast or scaled stays a number): for
    each, its value's text as the kernel prints it.  Empty when the line
    is missing, unreadable, or its arguments do not match its
    conversions."""
    try:
        parsed = parse_print_fmt(format_text)
    except PrintFmtError:
        return {}
    if parsed is None:
        return {}
    fmt, args = parsed
    pieces = _split_format(fmt)
    convs = [c for _, c in pieces if c is not None]
    if len(convs) != len(args):
        return {}
    out: dict[str, Callable[[int], str]] = {}
    i = 0
    while i < len(convs):
        m = re.search(r"(\w+)=$", pieces[i][0])
        j = i + 1
        while j < len(convs) and pieces[j][0] == "":
            j += 1  # conversions right after one another print one value
        name = m.group(1) if m else None
        group = list(zip(convs[i:j], args[i:j], strict=True))
        if (
            name in names
            and all(_fields_of(a, set()) == {name} for _, a in group)
            and any(c["spec"] == "s" for c, _ in group)
        ):
            try:
                for probe in (0, 1):
                    _words_of(name, group, probe)
            except (_Unsupported, RecursionError):
                pass
            else:
                out[name] = _word(name, group)
        i = j
    return out


def _words_of(name: str, group: list[tuple[re.Match, tuple]], value: int) -> str:
    env = {name: value}
    return "".join(_render(c, _eval(a, env)) for c, a in group)


def _word(name: str, group: list[tuple[re.Match, tuple]]) -> Callable[[int], str]:
    def text(value: int) -> str:
        try:
            return _words_of(name, group, value)
        except (_Unsupported, RecursionError):
            return str(value)  # (a value the expression cannot take, e.g. / 0)

    return text


def word_rows(values: np.ndarray, text: Callable[[int], str], texts: list[str]) -> np.ndarray:
    """For each of a field's ``values``, the row of ``texts`` holding its
    words; each distinct value's words are appended to ``texts`` once."""
    distinct, inverse = np.unique(values, return_inverse=True)
    rows = inverse.reshape(-1) + len(texts)
    texts += [text(v) for v in distinct.tolist()]
    return rows
