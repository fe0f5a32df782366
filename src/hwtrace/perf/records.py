"""perf_event record layouts: the kernel's PERF_RECORD_* bodies and the
``sample_id_all`` trailer, parsed from and packed to bytes.

A perf_event record is an 8-byte header (u32 type, u16 misc, u16 size)
followed by a body whose layout depends on the type.  When the event was
opened with ``sample_id_all``, every record except SAMPLE ends with a trailer
of identification fields chosen by the event's ``sample_type`` (pid/tid,
time, id, stream id, cpu, identifier); it is found by its size, counted back
from the end of the record.

:func:`parse_record` reads one non-SAMPLE kernel record into a :class:`Record`
whose ``body`` is one of the frozen dataclasses below; SAMPLE records, the
perf tool's own records (types 64 and up) and types this module does not know
come back with the raw body bytes.  :func:`pack_record` writes a body back;
packing then parsing gives the same body and sample id.  Malformed input
raises :class:`RecordError`, never another exception.

Records are parsed one at a time in Python: fine for sideband (few records),
not meant for per-sample work.
"""

from __future__ import annotations

import enum
import inspect
import struct
from dataclasses import dataclass, fields, is_dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # parsing records needs no numpy
    import numpy as np

__all__ = [
    "AUX_FLAG_COLLISION",
    "AUX_FLAG_OVERWRITE",
    "AUX_FLAG_PARTIAL",
    "AUX_FLAG_TRUNCATED",
    "HEADER_SIZE",
    "MISC_COMM_EXEC",
    "MISC_CPUMODE_MASK",
    "MISC_MMAP_BUILD_ID",
    "MISC_MMAP_DATA",
    "MISC_SWITCH_OUT",
    "MISC_SWITCH_OUT_PREEMPT",
    "Aux",
    "AuxOutputHwId",
    "Body",
    "BpfEvent",
    "Cgroup",
    "Comm",
    "Exit",
    "Fork",
    "ItraceStart",
    "Ksymbol",
    "Lost",
    "LostSamples",
    "Mmap",
    "Mmap2",
    "Namespaces",
    "Read",
    "Record",
    "RecordError",
    "RecordType",
    "SampleId",
    "SampleType",
    "Switch",
    "SwitchCpuWide",
    "TextPoke",
    "Throttle",
    "Unthrottle",
    "body_class",
    "pack_record",
    "pack_sample_id",
    "parse_header",
    "parse_record",
    "parse_sample_id",
    "sample_dtype",
    "sample_id_size",
]

HEADER_SIZE = 8
_HEADER = struct.Struct("<IHH")


class RecordType(enum.IntEnum):
    """PERF_RECORD_* (kernel) and PERF_RECORD_* user types of the perf tool."""

    MMAP = 1
    LOST = 2
    COMM = 3
    EXIT = 4
    THROTTLE = 5
    UNTHROTTLE = 6
    FORK = 7
    READ = 8
    SAMPLE = 9
    MMAP2 = 10
    AUX = 11
    ITRACE_START = 12
    LOST_SAMPLES = 13
    SWITCH = 14
    SWITCH_CPU_WIDE = 15
    NAMESPACES = 16
    KSYMBOL = 17
    BPF_EVENT = 18
    CGROUP = 19
    TEXT_POKE = 20
    AUX_OUTPUT_HW_ID = 21
    # perf tool (tools/perf/util/event.h): only found in perf.data files.
    HEADER_ATTR = 64
    HEADER_EVENT_TYPE = 65
    HEADER_TRACING_DATA = 66
    HEADER_BUILD_ID = 67
    FINISHED_ROUND = 68
    ID_INDEX = 69
    AUXTRACE_INFO = 70
    AUXTRACE = 71
    AUXTRACE_ERROR = 72
    THREAD_MAP = 73
    CPU_MAP = 74
    STAT_CONFIG = 75
    STAT = 76
    STAT_ROUND = 77
    EVENT_UPDATE = 78
    TIME_CONV = 79
    HEADER_FEATURE = 80
    COMPRESSED = 81
    FINISHED_INIT = 82


class SampleType(enum.IntFlag):
    """PERF_SAMPLE_* bits of perf_event_attr.sample_type."""

    IP = 1 << 0
    TID = 1 << 1
    TIME = 1 << 2
    ADDR = 1 << 3
    READ = 1 << 4
    CALLCHAIN = 1 << 5
    ID = 1 << 6
    CPU = 1 << 7
    PERIOD = 1 << 8
    STREAM_ID = 1 << 9
    RAW = 1 << 10
    BRANCH_STACK = 1 << 11
    REGS_USER = 1 << 12
    STACK_USER = 1 << 13
    WEIGHT = 1 << 14
    DATA_SRC = 1 << 15
    IDENTIFIER = 1 << 16
    TRANSACTION = 1 << 17
    REGS_INTR = 1 << 18
    PHYS_ADDR = 1 << 19
    AUX = 1 << 20
    CGROUP = 1 << 21
    DATA_PAGE_SIZE = 1 << 22
    CODE_PAGE_SIZE = 1 << 23
    WEIGHT_STRUCT = 1 << 24


# The fixed-size fields of a SAMPLE, in the order perf_event_open(2) gives
# (perf.data-file-format.txt): (bit, fields).
_SAMPLE_FIELDS = (
    (SampleType.IDENTIFIER, (("identifier", "<u8"),)),
    (SampleType.IP, (("ip", "<u8"),)),
    (SampleType.TID, (("pid", "<u4"), ("tid", "<u4"))),
    (SampleType.TIME, (("time", "<u8"),)),
    (SampleType.ADDR, (("addr", "<u8"),)),
    (SampleType.ID, (("id", "<u8"),)),
    (SampleType.STREAM_ID, (("stream_id", "<u8"),)),
    (SampleType.CPU, (("cpu", "<u4"), ("res", "<u4"))),
    (SampleType.PERIOD, (("period", "<u8"),)),
)


def sample_dtype(sample_type: int, nregs: int = 0) -> np.dtype:
    """A SAMPLE record of ``sample_type`` as a numpy dtype, header first,
    up to the first field of variable size: RAW ends it with ``raw_size``
    (its data follows), REGS_USER with ``abi`` and ``nregs`` registers
    ``regs``.  Raises ValueError for READ or CALLCHAIN (sizes this cannot
    know)."""
    import numpy as np

    if sample_type & (SampleType.READ | SampleType.CALLCHAIN):
        raise ValueError("READ and CALLCHAIN samples have no fixed layout")
    out = [("type", "<u4"), ("misc", "<u2"), ("size", "<u2")]
    for bit, parts in _SAMPLE_FIELDS:
        if sample_type & bit:
            out += parts
    if sample_type & SampleType.RAW:
        out.append(("raw_size", "<u4"))
    elif sample_type & SampleType.REGS_USER:
        out += [("abi", "<u8"), ("regs", "<u8", (nregs,))]
    return np.dtype(out)


# header.misc bits
MISC_CPUMODE_MASK = 0x7
MISC_COMM_EXEC = 1 << 13  # COMM: the comm changed because of exec
MISC_MMAP_DATA = 1 << 13  # MMAP/MMAP2: a data (non-exec) mapping
MISC_MMAP_BUILD_ID = 1 << 14  # MMAP2: the build-id variant of the body
MISC_SWITCH_OUT = 1 << 13  # SWITCH/SWITCH_CPU_WIDE: switching out (else in)
MISC_SWITCH_OUT_PREEMPT = 1 << 14  # ... and the task was preempted

AUX_FLAG_TRUNCATED = 0x01
AUX_FLAG_OVERWRITE = 0x02
AUX_FLAG_PARTIAL = 0x04
AUX_FLAG_COLLISION = 0x08

_U64_MAX = (1 << 64) - 1


class RecordError(Exception):
    """A malformed record.  ``str()`` names the offset and what is wrong."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(offset, message)
        self.offset = offset
        self.message = message

    def __str__(self) -> str:
        return f"record at offset {self.offset:#x}: {self.message}"


# -- sample_id ---------------------------------------------------------------

# (bit, fields, struct) in the order the kernel writes them
_SID_PARTS = (
    (SampleType.TID, ("pid", "tid"), struct.Struct("<II")),
    (SampleType.TIME, ("time",), struct.Struct("<Q")),
    (SampleType.ID, ("id",), struct.Struct("<Q")),
    (SampleType.STREAM_ID, ("stream_id",), struct.Struct("<Q")),
    (SampleType.CPU, ("cpu", None), struct.Struct("<II")),
    (SampleType.IDENTIFIER, ("identifier",), struct.Struct("<Q")),
)


@dataclass(frozen=True)
class SampleId:
    """The sample_id_all trailer; None for fields sample_type leaves out."""

    pid: int | None = None
    tid: int | None = None
    time: int | None = None
    id: int | None = None
    stream_id: int | None = None
    cpu: int | None = None
    identifier: int | None = None


def sample_id_size(sample_type: int) -> int:
    """Bytes of the sample_id_all trailer for this sample_type."""
    return sum(s.size for bit, _, s in _SID_PARTS if sample_type & bit)


def parse_sample_id(buf, end: int, sample_type: int) -> SampleId:
    """The trailer that ends at ``end`` in ``buf``.

    Raises RecordError when ``buf`` holds fewer bytes than the trailer needs.
    """
    size = sample_id_size(sample_type)
    pos = end - size
    if pos < 0 or end > len(buf):
        raise RecordError(max(pos, 0), f"no room for the {size}-byte sample_id trailer")
    values: dict[str, int] = {}
    for bit, names, s in _SID_PARTS:
        if sample_type & bit:
            for name, value in zip(names, s.unpack_from(buf, pos), strict=True):
                if name is not None:
                    values[name] = value
            pos += s.size
    return SampleId(**values)


def pack_sample_id(sample_id: SampleId | None, sample_type: int) -> bytes:
    """The trailer for ``sample_type``; absent fields are written as 0."""
    sid = sample_id or SampleId()
    out = bytearray()
    for bit, names, s in _SID_PARTS:
        if sample_type & bit:
            # Masked: a pid of -1 (the kernel's) is 0xffffffff on file.
            mask = (1 << (8 * s.size // len(names))) - 1
            out += s.pack(*[((getattr(sid, n) or 0) & mask) if n else 0 for n in names])
    return bytes(out)


# -- bodies ------------------------------------------------------------------


def _cstring(buf, start: int, stop: int, offset: int, what: str) -> str:
    raw = bytes(buf[start:stop])
    nul = raw.find(b"\0")
    if nul < 0:
        raise RecordError(offset, f"{what} is not NUL-terminated within the record")
    return raw[:nul].decode("utf-8", "surrogateescape")


def _u32(v: int) -> int:
    """A pid or tid as stored: -1 (the kernel's) is 0xffffffff."""
    return v & 0xFFFFFFFF


def _pad8(data: bytes) -> bytes:
    """A NUL-terminated string padded to a multiple of 8 bytes, as the kernel does."""
    return data + b"\0" * (8 - len(data) % 8)


def _encode(text: str) -> bytes:
    data = text.encode("utf-8", "surrogateescape")
    if b"\0" in data:
        raise ValueError("strings in perf records cannot contain NUL")
    return data


class Body:
    """Base of the record bodies.  TYPE is the record type; MIN_SIZE the
    fewest body bytes a valid record has (before the sample_id trailer)."""

    TYPE: ClassVar[RecordType]
    MIN_SIZE: ClassVar[int]

    @classmethod
    def unpack(cls, buf, start: int, stop: int, misc: int, offset: int) -> Body:
        raise NotImplementedError

    def pack(self) -> tuple[bytes, int]:
        """(body bytes, misc bits the body implies)."""
        raise NotImplementedError


class _Fixed(Body):
    """A body that is one fixed struct, field for field (so its MIN_SIZE
    is the struct's size)."""

    FMT: ClassVar[struct.Struct]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "FMT" in cls.__dict__:
            cls.MIN_SIZE = cls.FMT.size

    @classmethod
    def unpack(cls, buf, start, stop, misc, offset):
        return cls(*cls.FMT.unpack_from(buf, start))

    def pack(self):
        return self.FMT.pack(*(getattr(self, f.name) for f in fields(self))), 0


class _Named(Body):
    """A body that is one fixed struct, field for field, then a string
    field (NUL-terminated, padded to 8 bytes, as the kernel writes names);
    with MISC, a last bool field stands for that header.misc bit.  WRAP:
    fields stored as u32 with -1 (the kernel's) as 0xffffffff."""

    FMT: ClassVar[struct.Struct]
    MISC: ClassVar[int] = 0
    WRAP: ClassVar[frozenset[str]] = frozenset()
    _HEAD: ClassVar[tuple[str, ...]]  # the fields FMT holds
    _TEXT: ClassVar[str]  # the string field
    _FLAG: ClassVar[str | None]  # the field of the MISC bit

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "FMT" in cls.__dict__:
            cls.MIN_SIZE = cls.FMT.size + 1
            # The fields in the order the class declares them (the
            # dataclass is made after this runs).
            names = tuple(inspect.get_annotations(cls))
            count = len(cls.FMT.unpack(bytes(cls.FMT.size)))
            cls._HEAD, cls._TEXT = names[:count], names[count]
            cls._FLAG = names[count + 1] if cls.MISC else None

    @classmethod
    def unpack(cls, buf, start, stop, misc, offset):
        head = cls.FMT.unpack_from(buf, start)
        text = _cstring(buf, start + cls.FMT.size, stop, offset, cls._TEXT)
        return cls(*head, text, *((bool(misc & cls.MISC),) if cls.MISC else ()))

    def pack(self):
        head = [getattr(self, n) for n in self._HEAD]
        if self.WRAP:
            head = [_u32(v) if n in self.WRAP else v for n, v in zip(self._HEAD, head, strict=True)]
        misc = self.MISC if self._FLAG and getattr(self, self._FLAG) else 0
        return self.FMT.pack(*head) + _pad8(_encode(getattr(self, self._TEXT))), misc


def _flag(bit: int, doc: str) -> property:
    """A bool property: whether ``bit`` is set in the body's ``flags``."""
    return property(lambda self: bool(self.flags & bit), doc=doc)


@dataclass(frozen=True)
class Mmap(_Named):
    TYPE = RecordType.MMAP
    FMT = struct.Struct("<IIQQQ")
    MISC = MISC_MMAP_DATA
    WRAP = frozenset({"pid", "tid"})
    pid: int
    tid: int
    addr: int
    len: int
    pgoff: int
    filename: str
    data: bool = False  # misc MMAP_DATA: not an executable mapping


@dataclass(frozen=True)
class Mmap2(Body):
    """MMAP2: with ``build_id`` set, the build-id variant (misc MMAP_BUILD_ID);
    otherwise the device/inode variant."""

    TYPE = RecordType.MMAP2
    MIN_SIZE = 64 + 1
    pid: int
    tid: int
    addr: int
    len: int
    pgoff: int
    maj: int = 0
    min: int = 0
    ino: int = 0
    ino_generation: int = 0
    prot: int = 0
    flags: int = 0
    filename: str = ""
    build_id: bytes | None = None
    data: bool = False

    _HEAD: ClassVar = struct.Struct("<IIQQQ")
    _INO: ClassVar = struct.Struct("<IIQQ")
    _BID: ClassVar = struct.Struct("<BBH20s")
    _TAIL: ClassVar = struct.Struct("<II")

    @classmethod
    def unpack(cls, buf, start, stop, misc, offset):
        pid, tid, addr, length, pgoff = cls._HEAD.unpack_from(buf, start)
        prot, flags = cls._TAIL.unpack_from(buf, start + 56)
        name = _cstring(buf, start + 64, stop, offset, "filename")
        data = bool(misc & MISC_MMAP_DATA)
        if misc & MISC_MMAP_BUILD_ID:
            size, _, _, bid = cls._BID.unpack_from(buf, start + 32)
            if size > 20:
                raise RecordError(offset, f"build-id size {size} is more than 20 bytes")
            return cls(pid, tid, addr, length, pgoff, prot=prot, flags=flags,
                       filename=name, build_id=bid[:size], data=data)  # fmt: skip
        maj, mnr, ino, gen = cls._INO.unpack_from(buf, start + 32)
        return cls(pid, tid, addr, length, pgoff, maj, mnr, ino, gen, prot, flags, name, None, data)

    def pack(self):
        out = self._HEAD.pack(_u32(self.pid), _u32(self.tid), self.addr, self.len, self.pgoff)
        misc = MISC_MMAP_DATA if self.data else 0
        if self.build_id is not None:
            if len(self.build_id) > 20:
                raise ValueError("a build-id has at most 20 bytes")
            out += self._BID.pack(len(self.build_id), 0, 0, self.build_id)
            misc |= MISC_MMAP_BUILD_ID
        else:
            out += self._INO.pack(self.maj, self.min, self.ino, self.ino_generation)
        out += self._TAIL.pack(self.prot, self.flags)
        return out + _pad8(_encode(self.filename)), misc


@dataclass(frozen=True)
class Lost(_Fixed):
    TYPE = RecordType.LOST
    FMT = struct.Struct("<QQ")
    id: int
    lost: int


@dataclass(frozen=True)
class Comm(_Named):
    TYPE = RecordType.COMM
    FMT = struct.Struct("<II")
    MISC = MISC_COMM_EXEC
    pid: int
    tid: int
    comm: str
    exec: bool = False  # misc COMM_EXEC: the name changed on exec


@dataclass(frozen=True)
class _Task(_Fixed):
    FMT = struct.Struct("<IIIIQ")
    pid: int
    ppid: int
    tid: int
    ptid: int
    time: int


@dataclass(frozen=True)
class Exit(_Task):
    TYPE = RecordType.EXIT


@dataclass(frozen=True)
class Fork(_Task):
    TYPE = RecordType.FORK


@dataclass(frozen=True)
class _Throttling(_Fixed):
    FMT = struct.Struct("<QQQ")
    time: int
    id: int
    stream_id: int


@dataclass(frozen=True)
class Throttle(_Throttling):
    TYPE = RecordType.THROTTLE


@dataclass(frozen=True)
class Unthrottle(_Throttling):
    TYPE = RecordType.UNTHROTTLE


@dataclass(frozen=True)
class Read(Body):
    """READ: ``values`` are the raw read_format bytes (their layout depends
    on the event's read_format, which the record does not say)."""

    TYPE = RecordType.READ
    MIN_SIZE = 8
    pid: int
    tid: int
    values: bytes = b""

    _FMT: ClassVar = struct.Struct("<II")

    @classmethod
    def unpack(cls, buf, start, stop, misc, offset):
        pid, tid = cls._FMT.unpack_from(buf, start)
        return cls(pid, tid, bytes(buf[start + 8 : stop]))

    def pack(self):
        if len(self.values) % 8:
            raise ValueError("read values are a whole number of u64")
        return self._FMT.pack(self.pid, self.tid) + bytes(self.values), 0


@dataclass(frozen=True)
class Aux(_Fixed):
    TYPE = RecordType.AUX
    FMT = struct.Struct("<QQQ")
    aux_offset: int
    aux_size: int
    flags: int

    # The kernel's words for the bits (include/uapi/linux/perf_event.h).
    truncated = _flag(AUX_FLAG_TRUNCATED, "The record was truncated to fit.")
    overwrite = _flag(AUX_FLAG_OVERWRITE, "A snapshot from overwrite mode.")
    partial = _flag(AUX_FLAG_PARTIAL, "The record contains gaps.")
    collision = _flag(AUX_FLAG_COLLISION, "The sample collided with another.")


@dataclass(frozen=True)
class ItraceStart(_Fixed):
    TYPE = RecordType.ITRACE_START
    FMT = struct.Struct("<II")
    pid: int
    tid: int


@dataclass(frozen=True)
class LostSamples(_Fixed):
    TYPE = RecordType.LOST_SAMPLES
    FMT = struct.Struct("<Q")
    lost: int


def _switch_misc(out: bool, preempt: bool) -> int:
    return (MISC_SWITCH_OUT if out else 0) | (MISC_SWITCH_OUT_PREEMPT if preempt else 0)


@dataclass(frozen=True)
class Switch(Body):
    """SWITCH: the traced task is switched in or out (misc bits)."""

    TYPE = RecordType.SWITCH
    MIN_SIZE = 0
    out: bool = False
    preempt: bool = False

    @classmethod
    def unpack(cls, buf, start, stop, misc, offset):
        return cls(bool(misc & MISC_SWITCH_OUT), bool(misc & MISC_SWITCH_OUT_PREEMPT))

    def pack(self):
        return b"", _switch_misc(self.out, self.preempt)


@dataclass(frozen=True)
class SwitchCpuWide(Body):
    """SWITCH_CPU_WIDE: switching out, the next task; switching in, the
    previous one (both in next_prev_pid/next_prev_tid)."""

    TYPE = RecordType.SWITCH_CPU_WIDE
    MIN_SIZE = 8
    next_prev_pid: int
    next_prev_tid: int
    out: bool = False
    preempt: bool = False

    _FMT: ClassVar = struct.Struct("<II")

    @classmethod
    def unpack(cls, buf, start, stop, misc, offset):
        pid, tid = cls._FMT.unpack_from(buf, start)
        return cls(pid, tid, bool(misc & MISC_SWITCH_OUT), bool(misc & MISC_SWITCH_OUT_PREEMPT))

    def pack(self):
        body = self._FMT.pack(self.next_prev_pid, self.next_prev_tid)
        return body, _switch_misc(self.out, self.preempt)


@dataclass(frozen=True)
class Namespaces(Body):
    TYPE = RecordType.NAMESPACES
    MIN_SIZE = 16
    pid: int
    tid: int
    namespaces: tuple[tuple[int, int], ...] = ()  # (dev, inode) pairs

    _FMT: ClassVar = struct.Struct("<IIQ")
    _NS: ClassVar = struct.Struct("<QQ")

    @classmethod
    def unpack(cls, buf, start, stop, misc, offset):
        pid, tid, count = cls._FMT.unpack_from(buf, start)
        if count > (stop - start - 16) // 16:
            raise RecordError(offset, f"{count} namespaces do not fit in the record")
        ns = tuple(cls._NS.unpack_from(buf, start + 16 + 16 * i) for i in range(count))
        return cls(pid, tid, ns)

    def pack(self):
        out = self._FMT.pack(self.pid, self.tid, len(self.namespaces))
        return out + b"".join(self._NS.pack(d, i) for d, i in self.namespaces), 0


@dataclass(frozen=True)
class Ksymbol(_Named):
    TYPE = RecordType.KSYMBOL
    FMT = struct.Struct("<QIHH")
    addr: int
    len: int
    ksym_type: int
    flags: int
    name: str


@dataclass(frozen=True)
class BpfEvent(_Fixed):
    TYPE = RecordType.BPF_EVENT
    FMT = struct.Struct("<HHI8s")
    type: int
    flags: int
    id: int
    tag: bytes  # 8 bytes

    def pack(self):
        if len(self.tag) != 8:
            raise ValueError("a BPF tag has 8 bytes")
        return super().pack()


@dataclass(frozen=True)
class Cgroup(_Named):
    TYPE = RecordType.CGROUP
    FMT = struct.Struct("<Q")
    id: int
    path: str


@dataclass(frozen=True)
class TextPoke(Body):
    """TEXT_POKE: kernel text at ``addr`` changed from old to new bytes."""

    TYPE = RecordType.TEXT_POKE
    MIN_SIZE = 12
    addr: int
    old: bytes
    new: bytes

    _FMT: ClassVar = struct.Struct("<QHH")

    @classmethod
    def unpack(cls, buf, start, stop, misc, offset):
        addr, old_len, new_len = cls._FMT.unpack_from(buf, start)
        pos = start + 12
        if pos + old_len + new_len > stop:
            raise RecordError(
                offset, f"{old_len} old and {new_len} new text bytes do not fit in the record"
            )
        old = bytes(buf[pos : pos + old_len])
        new = bytes(buf[pos + old_len : pos + old_len + new_len])
        return cls(addr, old, new)

    def pack(self):
        out = self._FMT.pack(self.addr, len(self.old), len(self.new)) + self.old + self.new
        return out + b"\0" * (-len(out) % 8), 0


@dataclass(frozen=True)
class AuxOutputHwId(_Fixed):
    TYPE = RecordType.AUX_OUTPUT_HW_ID
    FMT = struct.Struct("<Q")
    hw_id: int


_BODIES: dict[int, type[Body]] = {
    cls.TYPE: cls
    for cls in (
        Mmap, Lost, Comm, Exit, Throttle, Unthrottle, Fork, Read, Mmap2, Aux, ItraceStart,
        LostSamples, Switch, SwitchCpuWide, Namespaces, Ksymbol, BpfEvent, Cgroup, TextPoke,
        AuxOutputHwId,
    )
}  # fmt: skip


def body_class(record_type: int) -> type[Body] | None:
    """The body dataclass of a record type; None for raw-bytes types."""
    return _BODIES.get(record_type)


# -- records -----------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One record: where it starts, its header, its body (a Body dataclass,
    or the raw bytes after the header for types parsed elsewhere) and its
    sample_id trailer (None when there is none)."""

    offset: int
    type: RecordType | int
    misc: int
    size: int
    body: Body | bytes
    sample_id: SampleId | None = None

    @property
    def end(self) -> int:
        return self.offset + self.size

    @property
    def cpumode(self) -> int:
        return self.misc & MISC_CPUMODE_MASK


def parse_header(buf, offset: int) -> tuple[int, int, int]:
    """(type, misc, size) of the record at ``offset``, checked to fit in ``buf``."""
    if offset < 0 or offset + HEADER_SIZE > len(buf):
        left = max(len(buf) - offset, 0)
        raise RecordError(offset, f"truncated header: {left} of {HEADER_SIZE} bytes")
    rtype, misc, size = _HEADER.unpack_from(buf, offset)
    if size < HEADER_SIZE:
        raise RecordError(
            offset, f"impossible size {size}: less than the {HEADER_SIZE}-byte header"
        )
    if offset + size > len(buf):
        raise RecordError(
            offset,
            f"size {size} goes beyond the end of the data ({len(buf) - offset} bytes left)",
        )
    return rtype, misc, size


def _type_name(rtype: int) -> str:
    try:
        return RecordType(rtype).name
    except ValueError:
        return f"type {rtype}"


def parse_record(buf, offset: int, sample_type: int, sample_id_all: bool = True) -> Record:
    """Parse the record at ``offset`` in ``buf`` (bytes, bytearray, memoryview
    or a uint8 numpy array).

    ``sample_type`` and ``sample_id_all`` are those of the event that wrote
    it; they say how long the trailer is.  Raises RecordError for a record
    that does not fit, is too small for its type or is otherwise malformed.
    """
    if not isinstance(buf, bytes | bytearray | memoryview):
        buf = memoryview(buf).cast("B")
    rtype, misc, size = parse_header(buf, offset)
    try:
        rtype = RecordType(rtype)
    except ValueError:
        pass
    end = offset + size
    cls = _BODIES.get(rtype)
    if cls is None:
        return Record(offset, rtype, misc, size, bytes(buf[offset + HEADER_SIZE : end]))
    trailer = sample_id_size(sample_type) if sample_id_all else 0
    stop = end - trailer
    need = HEADER_SIZE + cls.MIN_SIZE + trailer
    if size < need:
        raise RecordError(
            offset, f"size {size} is too small for {_type_name(rtype)} (needs at least {need})"
        )
    try:
        body = cls.unpack(buf, offset + HEADER_SIZE, stop, misc, offset)
    except struct.error as exc:  # a fixed part beyond stop; MIN_SIZE should prevent it
        raise RecordError(offset, f"malformed {_type_name(rtype)}: {exc}") from None
    sid = parse_sample_id(buf, end, sample_type) if sample_id_all else None
    return Record(offset, rtype, misc, size, body, sid)


def pack_record(
    body: Body | bytes,
    sample_type: int = 0,
    *,
    misc: int = 0,
    sample_id: SampleId | None = None,
    sample_id_all: bool = True,
    type: int | None = None,
) -> bytes:
    """The bytes of one record: header, body, then (with ``sample_id_all``
    and a body dataclass) the sample_id trailer for ``sample_type``.

    The misc bits a body implies (COMM exec, MMAP2 build-id, switch out...)
    are or-ed into ``misc``; the body's own flags win over contradicting
    bits of ``misc``.  A raw ``bytes`` body needs ``type`` and is written as
    it is (it already holds any trailer).
    """
    if isinstance(body, bytes | bytearray):
        if type is None:
            raise ValueError("a raw body needs its record type")
        data = bytes(body)
        rtype = type
    else:
        data, implied = body.pack()
        rtype = body.TYPE
        if type is not None and type != rtype:
            raise ValueError(f"{_type_name(type)} given for a {rtype.name} body")
        owned = {
            RecordType.MMAP: MISC_MMAP_DATA,
            RecordType.MMAP2: MISC_MMAP_DATA | MISC_MMAP_BUILD_ID,
            RecordType.COMM: MISC_COMM_EXEC,
            RecordType.SWITCH: MISC_SWITCH_OUT | MISC_SWITCH_OUT_PREEMPT,
            RecordType.SWITCH_CPU_WIDE: MISC_SWITCH_OUT | MISC_SWITCH_OUT_PREEMPT,
        }.get(rtype, 0)
        misc = (misc & ~owned) | implied
        if sample_id_all:
            data += pack_sample_id(sample_id, sample_type)
    size = HEADER_SIZE + len(data)
    if size > 0xFFFF:
        raise ValueError(f"record of {size} bytes: more than a u16 size allows")
    return _HEADER.pack(rtype, misc & 0xFFFF, size) + data


# Fields whose numbers are addresses, sizes or offsets: written in hex.
_HEX_FIELDS = frozenset((
    "addr", "len", "pgoff", "ip", "offset", "size", "data_offset", "aux_offset", "aux_size",
    "start", "end", "config", "reference", "hw_id", "flags", "priv", "time_zero", "time_mask",
    "bytes", "old_len", "new_len",
))  # fmt: skip


def _field_text(name: str, value: object) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return f"{value:#x}" if name in _HEX_FIELDS else str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex() if len(value) <= 32 else f"<{len(value)} bytes>"
    if isinstance(value, (tuple, list)):
        return "{ " + ", ".join(_field_text(name, v) for v in value) + " }"
    if is_dataclass(value):
        return "{ " + fields_text(value) + " }"
    return str(value)


def fields_text(body: object) -> str:
    """A record body's fields as text, ``name=value`` apart: addresses,
    sizes and offsets in hex, names as they are (for perf-dump)."""
    if not is_dataclass(body):
        return _field_text("", body)
    return " ".join(
        f"{f.name}={_field_text(f.name, getattr(body, f.name))}"
        for f in fields(body)
        if getattr(body, f.name) is not None
    )
