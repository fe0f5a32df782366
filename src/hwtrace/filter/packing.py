"""Event and context records in memory, built from Python values.

A filter reads records where the tracer put them; tests, the CLI and the
benchmarks need such records without a tracer.  :class:`EventRecord` lays
out one record as its :class:`~.schema.Schema` says; :func:`pack_many` lays
out N of them in one contiguous buffer (a columnar build: each field is
converted for all records at once with numpy) and gives their addresses as
a numpy ``uint64`` array, for native loops.

Values are given as a dict per record (field name -> value):

* integers wrap to the field's width (``-1`` in a ``u8`` is ``0xff``),
* floats are stored at the field's width (a ``float`` field rounds),
* strings (``str``, stored as UTF-8, or ``bytes``): ``ptr`` fields point to
  a separate NUL-terminated buffer (``None`` is a null pointer); ``inline``
  ones are truncated to the capacity (NUL-padded when shorter); ``data_loc``
  ones are appended after the record's fixed part with the u32
  ``offset | length << 16``, the length counting the NUL, as tracefs does,
* arrays and sequences are lists; a ``ptr`` sequence points to a separate
  buffer of its elements and sets its length field (unless the values give
  that field, to make inconsistent records on purpose); ``None`` is a null
  pointer.  A ``data_loc`` sequence is appended like a string, its length
  in bytes,
* nested structs are dicts.

A field without a value is zero (a null pointer, an empty data_loc).  The
record keeps every buffer it points to alive.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from . import schema as S
from .errors import FilterError


class RecordBatch:
    """N records of one schema in one buffer, ``stride`` bytes apart.

    ``addresses[i]`` is record i's address, ``sizes[i]`` its length (fixed
    part plus its data_loc payloads).  Buffers the records point to (ptr
    strings and sequences) live as long as the batch.
    """

    def __init__(
        self,
        schema: S.Schema,
        buffer: np.ndarray,
        stride: int,
        sizes: np.ndarray,
        keep: list[Any],
    ) -> None:
        self.schema = schema
        self.buffer = buffer
        self.stride = stride
        self.sizes = sizes
        self.count = len(sizes)
        base = buffer.ctypes.data
        self.addresses = np.uint64(base) + np.arange(self.count, dtype=np.uint64) * np.uint64(
            stride
        )
        self._keep = keep

    def __len__(self) -> int:
        return self.count

    def address(self, i: int) -> int:
        return int(self.addresses[i])

    def record_bytes(self, i: int) -> bytes:
        """Record ``i`` as bytes (its fixed part and data_loc payloads)."""
        start = i * self.stride
        return self.buffer[start : start + int(self.sizes[i])].tobytes()


class EventRecord:
    """One record of ``schema`` holding ``values`` (see the module doc)."""

    def __init__(self, schema: S.Schema, values: Mapping[str, Any] | None = None) -> None:
        self.schema = schema
        self.values = dict(values or {})
        self._batch = pack_many(schema, [self.values])
        self.address: int = self._batch.address(0)
        self.size: int = int(self._batch.sizes[0])

    def __bytes__(self) -> bytes:
        return self._batch.record_bytes(0)

    def __repr__(self) -> str:
        return f"EventRecord({self.schema.name!r}, {self.values!r}, address=0x{self.address:x})"


def pack_many(
    schema: S.Schema, rows: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]]
) -> RecordBatch:
    """Records of ``schema`` for ``rows``: a list of value dicts, or a dict
    of columns (field name -> N values, numpy arrays welcome for numbers)."""
    if isinstance(rows, Mapping):
        lengths = {len(v) for v in rows.values()}
        if len(lengths) > 1:
            raise FilterError(f"{schema.name}: columns of different lengths {sorted(lengths)}")
        n = lengths.pop() if lengths else 0
        columns = dict(rows)
    else:
        n = len(rows)
        columns = None
    packer = _Packer(n, schema.size, dynamic=True, keep=[], strings={})
    if columns is not None:
        packer.struct_columns(schema.struct, 0, columns, schema.name)
    else:
        packer.column(schema.struct, 0, list(rows), schema.name)
    return packer.finish(schema)


# -- the column writer ------------------------------------------------------------------

_MAX_LOC = 0xFFFF


class _Packer:
    """Writes columns of values into an (n, size) byte matrix: one row per
    record (or per element, for a sequence's buffer)."""

    def __init__(
        self,
        n: int,
        size: int,
        *,
        dynamic: bool,
        keep: list[Any],
        strings: dict[bytes, Any],
    ) -> None:
        self.n = n
        self.size = size
        self.fixed = np.zeros((n, size), np.uint8)
        # Row -> its data_loc payloads (rows without any are not listed).
        self.dynamic: dict[int, bytearray] | None = {} if dynamic else None
        self.keep = keep
        self.strings = strings  # one buffer per distinct ptr string

    def finish(self, schema: S.Schema) -> RecordBatch:
        assert self.dynamic is not None
        extra = max((len(d) for d in self.dynamic.values()), default=0)
        stride = max(8, -(-(self.size + extra) // 8) * 8)
        buf = np.zeros(self.n * stride, np.uint8)
        view = buf.reshape(self.n, stride)
        view[:, : self.size] = self.fixed
        sizes = np.full(self.n, self.size, np.int64)
        for i, d in self.dynamic.items():
            if d:
                view[i, self.size : self.size + len(d)] = np.frombuffer(bytes(d), np.uint8)
                sizes[i] += len(d)
        return RecordBatch(schema, buf, stride, sizes, self.keep)

    def put(self, offset: int, data: np.ndarray) -> None:
        """Store ``data`` (one fixed-width value per row) at ``offset``."""
        width = data.dtype.itemsize
        self.fixed[:, offset : offset + width] = data.view(np.uint8).reshape(self.n, width)

    def column(self, t: S.Type, offset: int, values: Sequence[Any], where: str) -> None:
        if isinstance(t, S.IntType):
            self.put(offset, _ints(values, t.size, where))
        elif isinstance(t, S.FloatType):
            self.put(offset, _floats(values, t.size, where))
        elif isinstance(t, S.StringType):
            self.string_column(t, offset, values, where)
        elif isinstance(t, S.ArrayType):
            self.array_column(t, offset, values, where)
        elif isinstance(t, S.SequenceType):
            self.sequence_column(t, offset, values, where)
        elif isinstance(t, S.StructType):
            names = {f.name for f in t.fields}
            plain = True  # every value a dict: columns are cut at C speed
            for i, v in enumerate(values):
                if type(v) is not dict:
                    plain = False
                    if v is None:
                        continue
                    if not isinstance(v, Mapping):
                        raise FilterError(
                            f"{_at(where, i)}: expected a dict for a structure, got {v!r}"
                        )
                if not v.keys() <= names:
                    raise FilterError(f"{_at(where, i)}: no field {sorted(v.keys() - names)[0]!r}")
            if plain:
                columns = {f.name: list(map(dict.get, values, repeat(f.name))) for f in t.fields}
            else:
                columns = {
                    f.name: [None if v is None else v.get(f.name) for v in values] for f in t.fields
                }
            self.struct_columns(t, offset, columns, where)
        else:
            raise FilterError(f"{where}: cannot store a {type(t).__name__}")

    def struct_columns(
        self, t: S.StructType, offset: int, columns: dict[str, Sequence[Any]], where: str
    ) -> None:
        unknown = set(columns) - {f.name for f in t.fields}
        if unknown:
            raise FilterError(f"{where}: no field {sorted(unknown)[0]!r}")
        # A ptr sequence's length field counts its elements unless given
        # (several sequences may share one: the first present one counts).
        counted: dict[str, list[Sequence[Any]]] = {}
        for f in t.fields:
            if (
                isinstance(f.type, S.SequenceType)
                and f.type.storage == "ptr"
                and f.type.length_field
            ):
                if f.name in columns:
                    counted.setdefault(f.type.length_field, []).append(columns[f.name])
        columns = dict(columns)
        for length_field, seqs in counted.items():
            given = columns.get(length_field)
            lengths = []
            for i in range(self.n):
                if given is not None and given[i] is not None:
                    lengths.append(given[i])
                else:
                    present = [s[i] for s in seqs if s[i] is not None]
                    lengths.append(len(present[0]) if present else 0)
            columns[length_field] = lengths
        for f in t.fields:
            values = columns.get(f.name)
            if values is None:
                continue  # zeros already
            self.column(f.type, offset + f.offset, values, f"{where}.{f.name}")

    def string_column(
        self, t: S.StringType, offset: int, values: Sequence[Any], where: str
    ) -> None:
        if t.storage == "ptr":
            self.put(offset, self.c_strings(values, where))
            return
        data = [None if v is None else _bytes(v, _at(where, i)) for i, v in enumerate(values)]
        if t.storage == "inline":
            cap = t.capacity
            if cap:
                packed = b"".join((d or b"")[:cap].ljust(cap, b"\0") for d in data)
                self.fixed[:, offset : offset + cap] = np.frombuffer(packed, np.uint8).reshape(
                    self.n, cap
                )
        else:
            locs = np.zeros(self.n, np.uint32)
            for i, d in enumerate(data):
                if d is not None:
                    locs[i] = self.append(i, d + b"\0", 1, _at(where, i))
            self.put(offset, locs)

    def c_strings(self, values: Sequence[Any], where: str) -> np.ndarray:
        """Addresses of NUL-terminated copies of ``values``: one buffer per
        distinct string, None a null pointer."""
        try:
            distinct = dict.fromkeys(values)
        except TypeError:  # a bytearray, or no string at all
            values = [bytes(v) if isinstance(v, bytearray) else v for v in values]
            try:
                distinct = dict.fromkeys(values)
            except TypeError:
                bad = next(i for i, v in enumerate(values) if not isinstance(v, (str, bytes)))
                raise FilterError(
                    f"{_at(where, bad)}: expected a string, got {values[bad]!r}"
                ) from None
        table: dict[Any, int] = {None: 0}
        for v in distinct:
            if v is None:
                continue
            if not isinstance(v, (str, bytes)):
                bad = list(values).index(v)
                raise FilterError(f"{_at(where, bad)}: expected a string, got {v!r}")
            data = _bytes(v, where)
            buf = self.strings.get(data)
            if buf is None:
                buf = self.strings[data] = ctypes.create_string_buffer(data)
                self.keep.append(buf)
            table[v] = ctypes.addressof(buf)
        return np.fromiter(map(table.__getitem__, values), np.uint64, len(values))

    def append(self, row: int, data: bytes, align: int, where: str) -> int:
        """Put ``data`` after row ``row``'s fixed part: its data_loc word."""
        if self.dynamic is None:
            raise FilterError(f"{where}: a data_loc field cannot sit inside a pointed-to sequence")
        d = self.dynamic.setdefault(row, bytearray())
        d.extend(b"\0" * (-(self.size + len(d)) % align))
        at = self.size + len(d)
        d.extend(data)
        if at > _MAX_LOC or len(data) > _MAX_LOC:
            raise FilterError(f"{where}: data_loc offset or length above 0xffff")
        return at | (len(data) << 16)

    def array_column(self, t: S.ArrayType, offset: int, values: Sequence[Any], where: str) -> None:
        lists = [_list(v, _at(where, i)) for i, v in enumerate(values)]
        for i, v in enumerate(lists):
            if len(v) > t.length:
                raise FilterError(f"{_at(where, i)}: {len(v)} values for an array of {t.length}")
        step = t.element.fixed_size
        for k in range(t.length):
            column = [v[k] if k < len(v) else None for v in lists]
            if any(c is not None for c in column):
                self.column(t.element, offset + k * step, column, f"{where}[{k}]")

    def sequence_column(
        self, t: S.SequenceType, offset: int, values: Sequence[Any], where: str
    ) -> None:
        step = t.element.fixed_size
        words = np.zeros(self.n, np.uint64 if t.storage == "ptr" else np.uint32)
        for i, v in enumerate(values):
            if v is None:
                continue
            elements = _list(v, _at(where, i))
            sub = _Packer(len(elements), step, dynamic=False, keep=self.keep, strings=self.strings)
            sub.column(t.element, 0, elements, f"{_at(where, i)}[]")
            if t.storage == "ptr":
                buf = sub.fixed if elements else np.zeros(1, np.uint8)  # empty but not null
                self.keep.append(buf)
                words[i] = buf.ctypes.data
            else:
                words[i] = self.append(i, sub.fixed.tobytes(), t.element.align, _at(where, i))
        self.put(offset, words)


def _at(where: str, i: int) -> str:
    return f"{where} (value {i})"


def _ints(values: Sequence[Any], size: int, where: str) -> np.ndarray:
    out = np.dtype(f"<u{size}")
    if not isinstance(values, np.ndarray) and len(values) and type(values[0]) is int:
        # Plain ints within 64 bits convert at numpy's speed; else one by one
        # (numpy makes floats of a mix of negative and above-2^63 ints).
        try:
            converted = np.array(values)
            if converted.dtype.kind in "iu":
                values = converted
        except OverflowError:
            pass
    if isinstance(values, np.ndarray) and values.dtype.kind in "iub":
        return values.astype(np.int64 if values.dtype.kind != "u" else np.uint64).astype(out)
    mask = (1 << (8 * size)) - 1
    wrapped = []
    for i, v in enumerate(values):
        if v is None:
            wrapped.append(0)
        elif isinstance(v, (int, np.integer)):
            wrapped.append(int(v) & mask)
        else:
            raise FilterError(f"{_at(where, i)}: expected an integer, got {v!r}")
    return np.array(wrapped, dtype=np.uint64).astype(out)


def _floats(values: Sequence[Any], size: int, where: str) -> np.ndarray:
    out = np.float32 if size == 4 else np.float64
    if not isinstance(values, np.ndarray) and len(values) and type(values[0]) in (int, float):
        try:
            values = np.array(values)  # all numbers: an int or float dtype
        except OverflowError:
            pass
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
        with np.errstate(over="ignore"):
            return values.astype(np.float64).astype(out)
    converted = []
    for i, v in enumerate(values):
        if v is None:
            converted.append(0.0)
            continue
        if isinstance(v, (bool, str, bytes)) or not isinstance(v, (int, float, np.number)):
            raise FilterError(f"{_at(where, i)}: expected a number, got {v!r}")
        try:
            converted.append(float(v))
        except OverflowError:
            raise FilterError(f"{_at(where, i)}: {v} does not fit a double") from None
    with np.errstate(over="ignore"):
        return np.array(converted, dtype=np.float64).astype(out)


def _bytes(v: Any, where: str) -> bytes:
    if isinstance(v, str):
        return v.encode("utf-8", "surrogatepass")
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    raise FilterError(f"{where}: expected a string, got {v!r}")


def _list(v: Any, where: str) -> list[Any]:
    if v is None:
        return []
    if isinstance(v, (list, tuple, bytes, bytearray, np.ndarray)):
        return list(v)
    raise FilterError(f"{where}: expected a list, got {v!r}")
