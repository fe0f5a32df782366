"""Event schemas from where users have them.

* tracefs ``format`` files (kernel tracepoints): :func:`schema_from_tracefs`,
  :func:`tracefs_schema`.  The record layout is the kernel's: the offsets
  and sizes the file gives are used as they are.
* CTF 1.8 metadata (TSDL), as LTTng writes in a trace's ``metadata`` file:
  :func:`schemas_from_ctf_metadata`.  CTF's packed stream layout is not an
  in-memory one, so these schemas lay fields out as a C struct (strings as
  ``char *``, sequences as a pointer plus their length field); a reader
  unpacks events into such records (:mod:`.packing`).
* Python mappings: :func:`schema_from_mapping`.

Bad input gives one :class:`FilterError` whose ``where`` names the file (or
event) and line.
"""

from __future__ import annotations

import re
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from .errors import FilterError
from .schema import (
    ROOT_EVENT,
    ArrayType,
    Field,
    FloatType,
    IntType,
    Schema,
    SequenceType,
    StringType,
    StructType,
    Type,
    layout,
    type_named,
)

# -- C integer type names (for tracefs __data_loc T[] elements) --------------------------

_C_INTS: dict[str, tuple[int, bool]] = {
    "char": (1, True),
    "signed char": (1, True),
    "unsigned char": (1, False),
    "bool": (1, False),
    "_Bool": (1, False),
    "short": (2, True),
    "short int": (2, True),
    "signed short": (2, True),
    "unsigned short": (2, False),
    "unsigned short int": (2, False),
    "int": (4, True),
    "signed": (4, True),
    "signed int": (4, True),
    "unsigned": (4, False),
    "unsigned int": (4, False),
    "long": (8, True),
    "long int": (8, True),
    "signed long": (8, True),
    "unsigned long": (8, False),
    "unsigned long int": (8, False),
    "long long": (8, True),
    "long long int": (8, True),
    "unsigned long long": (8, False),
    "unsigned long long int": (8, False),
    "size_t": (8, False),
    "ssize_t": (8, True),
    "pid_t": (4, True),
    "uid_t": (4, False),
    "gid_t": (4, False),
    "dev_t": (4, False),
    "loff_t": (8, True),
    "umode_t": (2, False),
    "cpumask_t": (8, False),  # a bitmap of unsigned longs
}
for _bits in (8, 16, 32, 64):
    _n = _bits // 8
    for _fmt, _signed in (
        ("u{}", False),
        ("s{}", True),
        ("__u{}", False),
        ("__s{}", True),
        ("uint{}_t", False),
        ("int{}_t", True),
        ("__le{}", False),
        ("__be{}", False),
    ):
        _C_INTS[_fmt.format(_bits)] = (_n, _signed)


def _c_int(name: str) -> IntType | None:
    words = [w for w in name.split() if w not in ("const", "volatile")]
    if words[:1] == ["enum"]:
        return IntType(4, True)
    known = _C_INTS.get(" ".join(words))
    return IntType(*known) if known else None


# -- tracefs ------------------------------------------------------------------------------

_FIELD_LINE = re.compile(
    r"\s*field:(?P<decl>[^;]*);\s*offset:(?P<offset>\d+);\s*size:(?P<size>\d+);"
    r"(?:\s*signed:(?P<signed>-?\d+);)?\s*$"
)
_PLAIN_DECL = re.compile(r"(?P<type>.*?)\s*\b(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\]]*\]\s*)*)")


def schema_from_tracefs(text: str, name: str = "", *, pointer_strings: bool = False) -> Schema:
    """The schema of a tracefs event ``format`` file's text.

    Every ``field:`` line is read, ``common_*`` fields included:
    ``char name[N]`` is an inline string, ``T name[N]`` an inline array,
    ``__data_loc char[] name`` a data_loc string, ``__data_loc T[] name`` a
    data_loc sequence, any other field of 1, 2, 4 or 8 bytes an integer of
    that size and signedness (a pointer such as ``const char *filename`` is
    the pointer's value: the pointee is not in the record; with
    ``pointer_strings``, for a reader that can follow it, a ``char *`` is a
    string read through the pointer).  An integer whose C type is narrower
    than its field (a system call's ``int`` argument, recorded as the
    8-byte register) is that type, its low bytes.  Fields that
    cannot be read as values (flexible ``T name[]`` tails, ``__rel_loc``
    fields, structures of other sizes) are left out of the schema.
    """
    lines = text.splitlines()
    event = name
    for line in lines:
        if line.startswith("name:") and not event:
            event = line.split(":", 1)[1].strip()
    label = event or "format"
    fields: list[Field] = []
    seen: set[str] = set()
    for lineno, line in enumerate(lines, 1):
        if line.startswith("print fmt:"):
            break
        if not line.strip().startswith("field:"):
            continue
        where = f"{label} format line {lineno}"
        m = _FIELD_LINE.fullmatch(line)
        if m is None:
            raise FilterError(f"cannot read field line {line.strip()!r}", where=where)
        offset, size = int(m["offset"]), int(m["size"])
        signed = m["signed"] is not None and int(m["signed"]) != 0
        parsed = _tracefs_field(m["decl"].strip(), size, signed, where, pointer_strings)
        if parsed is None:
            continue
        fname, ftype = parsed
        if fname in seen:
            raise FilterError(f"field {fname!r} appears twice", where=where)
        seen.add(fname)
        fields.append(Field(fname, ftype, offset))
    if not fields:
        raise FilterError("no 'field:' lines: not a tracefs format file", where=label)
    end = max(f.offset + _slot_size(f.type) for f in fields)
    return Schema(event or "event", StructType(tuple(fields), end), ROOT_EVENT)


def _slot_size(t: Type) -> int:
    return t.fixed_size


def _tracefs_field(
    decl: str, size: int, signed: bool, where: str, pointer_strings: bool = False
) -> tuple[str, Type] | None:
    words = decl.split(None, 1)
    if words and words[0] in ("__data_loc", "__rel_loc"):
        if len(words) < 2:
            raise FilterError(f"cannot read {decl!r}", where=where)
        if words[0] == "__rel_loc":
            return None  # offset from the field's end: no path step expresses it
        ctype, _, fname = words[1].rpartition(" ")
        ctype = ctype.strip()
        if not fname.isidentifier() or not ctype:
            raise FilterError(f"cannot read {decl!r}", where=where)
        if size != 4:
            raise FilterError(f"__data_loc field {fname!r} has size {size}, not 4", where=where)
        element_name = ctype[:-2].strip() if ctype.endswith("[]") else ctype
        if element_name in ("char", "const char"):
            return fname, StringType("data_loc")
        element = _c_int(element_name)
        if element is None:
            return None
        return fname, SequenceType(element, "data_loc")
    m = _PLAIN_DECL.fullmatch(decl)
    if m is None:
        raise FilterError(f"cannot read {decl!r}", where=where)
    ctype, fname, dims_text = m["type"].strip(), m["name"], m["dims"]
    if not ctype:
        raise FilterError(f"no type in {decl!r}", where=where)
    if not dims_text:
        if size not in (1, 2, 4, 8):
            return None
        if pointer_strings and size == 8 and _is_char_pointer(ctype):
            return fname, StringType("ptr")
        if "*" in ctype:
            # A pointer is its value: the pointee is not in the record.
            return fname, IntType(size, False)
        declared = _c_int(ctype)
        if declared is not None and declared.size < size and sys.byteorder == "little":
            # A system call's argument: the kernel records the whole
            # register (8 bytes, signed:0), the call takes its C type's low
            # bytes (an ``int dfd`` of AT_FDCWD is -100, as in C and in
            # LTTng's system call events, not 4294967196).
            return fname, declared
        return fname, IntType(size, signed)
    dims = [d.strip() for d in re.findall(r"\[([^\]]*)\]", dims_text)]
    base = " ".join(w for w in ctype.split() if w not in ("const", "volatile"))
    if base == "char" and len(dims) == 1:
        if size == 0:
            return None  # flexible tail: its length is not in the record
        return fname, StringType("inline", size)
    counts = []
    for d in dims:
        if not d:
            return None  # flexible tail
        try:
            counts.append(int(d, 0))
        except ValueError:
            counts.append(-1)  # a macro name: worked out from the size below
    known = _c_int(base)
    total = 1
    for c in counts:
        total *= max(c, 1)
    if -1 in counts:
        if known is None or len(counts) != 1:
            return None
        counts = [size // known.size]
        total = counts[0]
    if total == 0 or size % total:
        raise FilterError(
            f"array {fname!r} of {dims_text.strip()} does not divide its {size} bytes", where=where
        )
    esize = size // total
    if esize not in (1, 2, 4, 8):
        return None
    t: Type = IntType(esize, signed)
    for c in reversed(counts):
        t = ArrayType(t, c)
    return fname, t


def pointer_fields(text: str) -> frozenset[str]:
    """The fields of a tracefs event ``format`` file's text that are
    pointers (``const char * filename``, ``void * addr``): integers to the
    filter, addresses to a reader, who expects them in hex as ftrace and
    perf print them."""
    out = set()
    for line in text.splitlines():
        if line.startswith("print fmt:"):
            break
        m = _FIELD_LINE.fullmatch(line)
        if m is None or m["decl"].split(None, 1)[0] in ("__data_loc", "__rel_loc"):
            continue
        d = _PLAIN_DECL.fullmatch(m["decl"].strip())
        if d is not None and not d["dims"] and "*" in d["type"]:
            out.add(d["name"])
    return frozenset(out)


def _is_char_pointer(ctype: str) -> bool:
    """``char *``, ``const char *``, ``const char __user *``: one level of
    pointer to plain char."""
    words = ctype.replace("*", " * ").split()
    words = [w for w in words if w not in ("const", "volatile", "__user")]
    return words == ["char", "*"]


def tracefs_schema(
    system: str, event: str, tracefs: str = "/sys/kernel/tracing", *, pointer_strings: bool = False
) -> Schema:
    """The schema of tracepoint ``system:event`` from the running kernel
    (``pointer_strings``: see :func:`schema_from_tracefs`)."""
    path = Path(tracefs) / "events" / system / event / "format"
    try:
        text = path.read_text()
    except FileNotFoundError:
        if not (Path(tracefs) / "events").is_dir():
            raise FilterError(f"no tracefs at {tracefs} (mount it, or run as root)") from None
        raise FilterError(f"no event {system}:{event} ({path} not found)") from None
    except OSError as e:
        raise FilterError(f"cannot read {path}: {e.strerror}") from None
    try:
        return schema_from_tracefs(text, event, pointer_strings=pointer_strings)
    except FilterError as e:
        e.where = f"{path}: {e.where}" if e.where else str(path)
        raise


# -- CTF 1.8 metadata (TSDL) ----------------------------------------------------------------

_CTF_MAGIC = 0x75D11D57
_CTF_HEADER = struct.Struct("<I16sIIIBBBBB")  # magic uuid checksum content packet ...

_TSDL_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<comment>/\*.*?\*/|//[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<number>(?:0[xX][0-9a-fA-F]+|\d+)[uUlL]*)
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<punct>:=|\.\.\.|[{}\[\]();,=:<>.+\-*])
    """,
    re.S | re.X,
)


@dataclass
class _CInt:
    size: int
    signed: bool
    encoding: str
    line: int


@dataclass
class _CFloat:
    exp_dig: int
    mant_dig: int
    line: int


@dataclass
class _CString:
    line: int


@dataclass
class _CEnum:
    container: _CInt
    line: int


@dataclass
class _CVariant:
    line: int


@dataclass
class _CArray:
    element: _CType
    length: int


@dataclass
class _CSequence:
    element: _CType
    length: str  # the length field's name (leading underscore removed)


@dataclass
class _CStruct:
    fields: list[tuple[str, _CType, int]] = field(default_factory=list)  # name, type, line
    line: int = 0


_CType = Union[_CInt, _CFloat, _CString, _CEnum, _CVariant, _CArray, _CSequence, _CStruct]  # noqa: UP007


def schemas_from_ctf_metadata(
    text: str | bytes, *, skip_unsupported: bool = False
) -> dict[str, Schema]:
    """Event schemas (by event name) from a CTF 1.8 metadata text, or from
    a trace's packetized ``metadata`` file given as bytes.

    Integers (any bit size up to 64, rounded up to 1, 2, 4 or 8 bytes),
    enums (their integer), floating point (IEEE single and double), strings,
    structures, arrays and sequences are read; field names lose one leading
    underscore (LTTng prefixes them all; CTF readers strip it).  Arrays and
    sequences of UTF-8/ASCII bytes (LTTng's ``ctf_array_text`` and
    ``ctf_sequence_text``) are strings.  A variant field is an error that
    names its line, or is left out with ``skip_unsupported=True``.  When an
    event name appears in several streams, the first definition is kept.
    """
    if isinstance(text, (bytes, bytearray)):
        text = _depacketize(bytes(text))
    parser = _TSDL(text, skip_unsupported)
    return parser.parse()


def _depacketize(data: bytes) -> str:
    if len(data) < 4 or struct.unpack_from("<I", data)[0] != _CTF_MAGIC:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise FilterError("metadata is neither text nor CTF metadata packets") from None
    out = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < _CTF_HEADER.size:
            raise FilterError(f"metadata packet at byte {pos} is truncated")
        magic, _uuid, _sum, content, packet, *_ = _CTF_HEADER.unpack_from(data, pos)
        if magic != _CTF_MAGIC or packet < content or content < 8 * _CTF_HEADER.size:
            raise FilterError(f"metadata packet at byte {pos} has a bad header")
        body = data[pos + _CTF_HEADER.size : pos + content // 8]
        out.append(body.decode("utf-8", "replace"))
        pos += packet // 8
    return "".join(out)


class _TSDL:
    """A recursive-descent reader of the TSDL subset LTTng writes."""

    def __init__(self, text: str, skip_unsupported: bool) -> None:
        self.tokens: list[tuple[str, str, int]] = []
        self.skip_unsupported = skip_unsupported
        line = 1
        pos = 0
        while pos < len(text):
            m = _TSDL_TOKEN.match(text, pos)
            if m is None:
                raise FilterError(
                    f"unexpected character {text[pos]!r}", where=f"metadata line {line}"
                )
            kind = m.lastgroup
            if kind not in ("space", "comment"):
                self.tokens.append((kind, m.group(), line))  # type: ignore[arg-type]
            line += m.group().count("\n")
            pos = m.end()
        self.pos = 0
        self.aliases: dict[str, _CType] = {}
        self.alias_prefixes: set[tuple[str, ...]] = set()
        self.structs: dict[str, _CStruct] = {}
        self.enums: dict[str, _CEnum] = {}

    # Tokens.

    def peek(self, k: int = 0) -> str | None:
        i = self.pos + k
        return self.tokens[i][1] if i < len(self.tokens) else None

    def kind(self) -> str | None:
        return self.tokens[self.pos][0] if self.pos < len(self.tokens) else None

    def line(self) -> int:
        if self.pos < len(self.tokens):
            return self.tokens[self.pos][2]
        return self.tokens[-1][2] if self.tokens else 1

    def error(self, message: str, line: int | None = None) -> FilterError:
        return FilterError(message, where=f"metadata line {line or self.line()}")

    def next(self) -> str:
        if self.pos >= len(self.tokens):
            raise self.error("unexpected end of metadata")
        self.pos += 1
        return self.tokens[self.pos - 1][1]

    def expect(self, value: str) -> None:
        got = self.peek()
        if got != value:
            raise self.error(f"expected {value!r}, found {got!r}" if got else f"expected {value!r}")
        self.pos += 1

    def ident(self) -> str:
        if self.kind() != "ident":
            raise self.error(f"expected a name, found {self.peek()!r}")
        return self.next()

    def number(self) -> int:
        negative = self.peek() == "-"
        if negative:
            self.next()
        if self.kind() != "number":
            raise self.error(f"expected a number, found {self.peek()!r}")
        digits = self.next().rstrip("uUlL")
        try:
            if len(digits) > 1 and digits[0] == "0" and digits[1] not in "xX":
                value = int(digits, 8)
            else:
                value = int(digits, 0)
        except ValueError:
            raise self.error(f"bad number {digits!r}") from None
        return -value if negative else value

    def skip_block(self) -> None:
        """Skip a ``{ ... }`` block, nested ones included."""
        self.expect("{")
        depth = 1
        while depth:
            tok = self.next()
            depth += {"{": 1, "}": -1}.get(tok, 0) if self.tokens[self.pos - 1][0] == "punct" else 0

    # Declarations.

    def parse(self) -> dict[str, Schema]:
        schemas: dict[str, Schema] = {}
        while self.pos < len(self.tokens):
            word = self.peek()
            if word in ("trace", "env", "clock", "callsite", "stream"):
                self.next()
                self.skip_block()
                self.expect(";")
            elif word == "event":
                self.next()
                event = self.event()
                if event is not None and event.name not in schemas:
                    schemas[event.name] = event
            elif word == "typealias":
                self.typealias()
            elif word == "typedef":
                self.typedef()
            elif word in ("struct", "enum", "variant", "integer", "floating_point", "string"):
                self.type_spec()
                self.expect(";")
            elif word == ";":
                self.next()
            else:
                raise self.error(f"unexpected {word!r} at the top level")
        return schemas

    def typealias(self) -> None:
        self.expect("typealias")
        target = self.type_spec()
        self.expect(":=")
        words = []
        while self.peek() not in (";", None):
            words.append(self.next())
        self.expect(";")
        self.alias(" ".join(w for w in words if w != "*"), target)

    def typedef(self) -> None:
        self.expect("typedef")
        target = self.type_spec()
        name = self.ident()
        target = self.dims(target)
        self.expect(";")
        self.alias(name, target)

    def alias(self, name: str, target: _CType) -> None:
        if not name:
            raise self.error("typealias without a name")
        self.aliases[name] = target
        words = tuple(name.split())
        for k in range(1, len(words) + 1):
            self.alias_prefixes.add(words[:k])

    def event(self) -> Schema | None:
        start = self.line()
        self.expect("{")
        name = None
        fields: _CStruct | None = None
        while self.peek() != "}":
            key = [self.ident()]
            while self.peek() == ".":
                self.next()
                key.append(self.ident())
            if self.peek() == ":=":
                self.next()
                t = self.type_spec()
                if key == ["fields"]:
                    if not isinstance(t, _CStruct):
                        raise self.error("an event's fields must be a struct")
                    fields = t
            else:
                self.expect("=")
                value = self.attr_value()
                if key == ["name"]:
                    name = str(value)
            self.expect(";")
        self.expect("}")
        self.expect(";")
        if name is None:
            raise self.error("event without a name", start)
        return Schema(name, self.struct_type(fields or _CStruct(line=start), name), ROOT_EVENT)

    def attr_value(self) -> Any:
        if self.kind() == "string":
            return _unquote(self.next())
        if self.kind() == "number" or self.peek() == "-":
            return self.number()
        words = [self.ident()]
        while self.peek() == ".":
            self.next()
            words.append(self.ident())
        return ".".join(words)

    def attributes(self) -> dict[str, Any]:
        self.expect("{")
        attrs: dict[str, Any] = {}
        while self.peek() != "}":
            key = self.ident()
            self.expect("=")
            attrs[key] = self.attr_value()
            self.expect(";")
        self.expect("}")
        return attrs

    # Types.

    def type_spec(self) -> _CType:
        line = self.line()
        word = self.peek()
        if word == "integer":
            self.next()
            return self.integer(self.attributes(), line)
        if word == "floating_point":
            self.next()
            a = self.attributes()
            try:
                return _CFloat(int(a["exp_dig"]), int(a["mant_dig"]), line)
            except (KeyError, ValueError):
                raise self.error("floating_point needs exp_dig and mant_dig", line) from None
        if word == "string":
            self.next()
            if self.peek() == "{":
                self.attributes()
            return _CString(line)
        if word == "enum":
            return self.enum(line)
        if word == "struct":
            return self.struct(line)
        if word == "variant":
            self.next()
            if self.kind() == "ident":
                self.next()
            if self.peek() == "<":
                while self.next() != ">":
                    pass
            if self.peek() == "{":
                self.skip_block()
            return _CVariant(line)
        return self.named_type(line)

    def integer(self, a: dict[str, Any], line: int) -> _CInt:
        if "size" not in a:
            raise self.error("integer without a size", line)
        size = a["size"]
        if not isinstance(size, int) or not 1 <= size <= 64:
            raise self.error(f"integer size {size} is not supported (1 to 64 bits)", line)
        signed = a.get("signed", 0)
        if isinstance(signed, str):
            if signed.lower() not in ("true", "false"):
                raise self.error(f"signed = {signed} (expected 0, 1, true or false)", line)
            signed = signed.lower() == "true"
        encoding = str(a.get("encoding", "none"))
        return _CInt(size, bool(signed), encoding, line)

    def named_type(self, line: int) -> _CType:
        words: list[str] = []
        while self.kind() == "ident" and (*words, self.peek()) in self.alias_prefixes:
            words.append(self.next())
        name = " ".join(words)
        if name not in self.aliases:
            shown = name or self.peek()
            raise self.error(f"unknown type {shown!r}", line)
        return self.aliases[name]

    def enum(self, line: int) -> _CEnum:
        self.expect("enum")
        name = self.next() if self.kind() == "ident" else None
        container: _CType | None = None
        if self.peek() == ":":
            self.next()
            container = self.type_spec()
        if self.peek() != "{":
            if name in self.enums:
                return self.enums[name]
            raise self.error(f"unknown enum {name!r}", line)
        if container is None:
            container = self.aliases.get("int")
        if not isinstance(container, _CInt):
            raise self.error("an enum's container must be an integer type", line)
        self.expect("{")
        while self.peek() != "}":
            if self.kind() not in ("ident", "string"):
                raise self.error(f"expected an enumerator, found {self.peek()!r}")
            self.next()
            if self.peek() == "=":
                self.next()
                self.number()
                if self.peek() == "...":
                    self.next()
                    self.number()
            if self.peek() == ",":
                self.next()
            elif self.peek() != "}":
                raise self.error(f"expected ',' or '}}', found {self.peek()!r}")
        self.expect("}")
        enum = _CEnum(container, line)
        if name:
            self.enums[name] = enum
        return enum

    def struct(self, line: int) -> _CStruct:
        self.expect("struct")
        name = self.next() if self.kind() == "ident" else None
        if self.peek() != "{":
            if name in self.structs:
                return self.structs[name]
            raise self.error(f"unknown struct {name!r}", line)
        self.expect("{")
        s = _CStruct(line=line)
        while self.peek() != "}":
            if self.peek() == "typealias":
                self.typealias()
                continue
            t = self.type_spec()
            while True:
                fline = self.line()
                fname = self.ident()
                s.fields.append((fname, self.dims(t), fline))
                if self.peek() != ",":
                    break
                self.next()
            self.expect(";")
        self.expect("}")
        if self.peek() == "align":
            self.next()
            self.expect("(")
            self.number()
            self.expect(")")
        if name:
            self.structs[name] = s
        return s

    def dims(self, t: _CType) -> _CType:
        """``name[4][len]``: C order, the last bracket innermost."""
        dims: list[int | str] = []
        while self.peek() == "[":
            self.next()
            if self.kind() == "number":
                dims.append(self.number())
            else:
                path = [self.ident()]
                while self.peek() == ".":
                    self.next()
                    path.append(self.ident())
                dims.append(_strip(path[-1]))
            self.expect("]")
        for d in reversed(dims):
            t = _CArray(t, d) if isinstance(d, int) else _CSequence(t, d)
        return t

    # To schema types.

    def struct_type(self, s: _CStruct, event: str) -> StructType:
        members: list[tuple[str, Type]] = []
        names: dict[str, Type] = {}
        for raw, ct, line in s.fields:
            fname = _strip(raw)
            t = self.schema_type(ct, event, fname, line)
            if t is None:
                continue
            if isinstance(t, SequenceType):
                length = names.get(t.length_field or "")
                if not isinstance(length, IntType):
                    raise self.error(
                        f"event {event!r}: sequence {fname!r} is counted by "
                        f"{t.length_field!r}, not an integer field before it in the same structure",
                        line,
                    )
            if fname in names:
                raise self.error(f"event {event!r}: field {fname!r} appears twice", line)
            names[fname] = t
            members.append((fname, t))
        return layout(members)

    def schema_type(self, ct: _CType, event: str, fname: str, line: int) -> Type | None:
        if isinstance(ct, _CInt):
            return IntType(_bytes_for(ct.size), ct.signed)
        if isinstance(ct, _CEnum):
            return IntType(_bytes_for(ct.container.size), ct.container.signed)
        if isinstance(ct, _CFloat):
            if (ct.exp_dig, ct.mant_dig) == (8, 24):
                return FloatType(4)
            if (ct.exp_dig, ct.mant_dig) == (11, 53):
                return FloatType(8)
            raise self.error(
                f"event {event!r}, field {fname!r}: floating point with exp_dig {ct.exp_dig} "
                f"and mant_dig {ct.mant_dig} is not supported (only IEEE single and double)",
                line,
            )
        if isinstance(ct, _CString):
            return StringType("ptr")
        if isinstance(ct, _CVariant):
            if self.skip_unsupported:
                return None
            raise self.error(
                f"event {event!r}, field {fname!r}: variant fields are not supported", line
            )
        if isinstance(ct, _CStruct):
            return self.struct_type(ct, event)
        if isinstance(ct, (_CArray, _CSequence)):
            el = ct.element
            if isinstance(el, _CInt) and el.size == 8 and el.encoding.upper() in ("UTF8", "ASCII"):
                return StringType("ptr")  # text: unpacked as a NUL-terminated string
            element = self.schema_type(el, event, fname, line)
            if element is None:
                return None
            if isinstance(ct, _CArray):
                return ArrayType(element, ct.length)
            return SequenceType(element, "ptr", ct.length)
        raise self.error(f"event {event!r}, field {fname!r}: unsupported type", line)


def _bytes_for(bits: int) -> int:
    return next(n for n in (1, 2, 4, 8) if bits <= 8 * n)


def _strip(name: str) -> str:
    """CTF readers drop one leading underscore (LTTng prefixes every name)."""
    return name[1:] if name.startswith("_") and len(name) > 1 else name


def _unquote(s: str) -> str:
    return re.sub(r"\\(.)", r"\1", s[1:-1])


# -- Python mappings ------------------------------------------------------------------------


def schema_from_mapping(name: str, mapping: Mapping[str, Any], *, root: int = ROOT_EVENT) -> Schema:
    """A schema from ``{"field": type, ...}``, laid out as a C struct in order.

    A type is

    * a name :func:`~.schema.type_named` knows: ``"s64"``, ``"u8"``,
      ``"int"``, ``"double"``, ``"float"``, ``"string"`` (a ``char *``),
      ``"char[16]"`` (an inline string), ``"s32[4]"`` (an inline array),
    * a dict: a nested structure,
    * ``("seq", ELEMENT, "length_field")``: a pointer to elements counted by
      the integer field ``length_field`` of the same structure,
    * ``("array", ELEMENT, N)``: an inline array of any element type,
    * ``("data_loc", "string")`` / ``("data_loc", ELEMENT)``: a tracefs
      ``__data_loc`` string or sequence,
    * a :mod:`.schema` type object.

    ELEMENT is any of these.  Example::

        schema_from_mapping("req", {"id": "u32", "n": "u8",
                                    "vals": ("seq", "s32", "n"),
                                    "peer": {"addr": "u8[4]", "port": "u16"}})
    """
    struct_type = _mapping_struct(mapping, name)
    return Schema(name, struct_type, root)


_MEMBER_NAME = re.compile(r"[A-Za-z_]\w*(?::[A-Za-z_0-9]\w*)*")


def _mapping_struct(mapping: Mapping[str, Any], where: str) -> StructType:
    if not isinstance(mapping, Mapping):
        raise FilterError(f"{where}: a structure is a dict of field types, not {mapping!r}")
    members: list[tuple[str, Type]] = []
    for fname, spec in mapping.items():
        # ':' is allowed for application contexts ($app.PROVIDER:NAME).
        if not isinstance(fname, str) or not _MEMBER_NAME.fullmatch(fname):
            raise FilterError(f"{where}: field name {fname!r} is not an identifier")
        members.append((fname, _mapping_type(spec, f"{where}.{fname}")))
    struct_type = layout(members)
    for f in struct_type.fields:
        if isinstance(f.type, SequenceType) and f.type.storage == "ptr":
            length = struct_type.member(f.type.length_field or "")
            if length is None or not isinstance(length.type, IntType):
                raise FilterError(
                    f"{where}.{f.name}: length field {f.type.length_field!r} is not an "
                    "integer field of the same structure"
                )
    return struct_type


def _mapping_type(spec: Any, where: str) -> Type:
    if isinstance(spec, (IntType, FloatType, StringType, ArrayType, SequenceType, StructType)):
        return spec
    if isinstance(spec, str):
        try:
            return type_named(spec)
        except (FilterError, ValueError):
            raise FilterError(f"{where}: unknown type {spec!r}") from None
    if isinstance(spec, Mapping):
        return _mapping_struct(spec, where)
    if isinstance(spec, tuple) and spec:
        kind = spec[0]
        if kind == "seq" and len(spec) == 3 and isinstance(spec[2], str):
            return SequenceType(_mapping_type(spec[1], f"{where}[]"), "ptr", spec[2])
        if kind == "array" and len(spec) == 3 and isinstance(spec[2], int) and spec[2] >= 0:
            return ArrayType(_mapping_type(spec[1], f"{where}[]"), spec[2])
        if kind == "data_loc" and len(spec) == 2:
            if spec[1] == "string":
                return StringType("data_loc")
            return SequenceType(_mapping_type(spec[1], f"{where}[]"), "data_loc")
    raise FilterError(
        f"{where}: cannot read type {spec!r} (a type name, a dict, ('seq', T, 'len'), "
        "('array', T, N) or ('data_loc', T))"
    )
