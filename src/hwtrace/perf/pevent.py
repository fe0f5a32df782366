"""A perf_event sideband file as Intel's libipt-sb reads it (``--pevent:*``).

The file is a plain sequence of perf_event records (what ``perf record``'s
sideband or Intel's ``perf-read-*`` scripts write), read with the options'
``sample_type``; each record's perf time is converted to TSC the way
libipt-sb does it (time-zero, time-shift, time-mult, then tsc-offset) so the
record can be applied when the trace reaches that time.

Only the record types libipt-sb understands are decoded with their
sample_id trailer; any other type is kept and printed as UNKNOWN without
samples, as libipt-sb does.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..pt.errors import PtError
from . import records as R

U64 = (1 << 64) - 1

# Sideband warnings (libipt-sb's enum pt_sb_error_code); negative codes are
# libipt errors (-PtError).
SB_LOST = 1
SB_TRACE_LOST = 2
SB_SECTION_LOST = 3
SB_WARNINGS = {SB_LOST: "sideband lost", SB_TRACE_LOST: "trace lost", SB_SECTION_LOST: "image section lost"}  # fmt: skip

# Print flags (--sb:compact, --sb:verbose, --sb:filename, --sb:offset, --sb:time).
P_COMPACT = 1
P_VERBOSE = 2
P_FILENAME = 4
P_OFFSET = 8
P_TSC = 16

# The record types libipt-sb decodes (others are UNKNOWN to it).
KNOWN_TYPES = frozenset(
    {
        R.RecordType.MMAP, R.RecordType.LOST, R.RecordType.COMM, R.RecordType.EXIT,
        R.RecordType.THROTTLE, R.RecordType.UNTHROTTLE, R.RecordType.FORK,
        R.RecordType.MMAP2, R.RecordType.AUX, R.RecordType.ITRACE_START,
        R.RecordType.LOST_SAMPLES, R.RecordType.SWITCH, R.RecordType.SWITCH_CPU_WIDE,
    }
)  # fmt: skip


@dataclass
class PeventConfig:
    """The ``--pevent:*`` options in effect when a sideband file is named."""

    sample_type: int = 0
    time_zero: int = 0
    time_shift: int = 0
    time_mult: int = 1
    tsc_offset: int = 0
    kernel_start: int = U64
    sysroot: str | None = None
    vdso_x64: str | None = None
    vdso_x32: str | None = None
    vdso_ia32: str | None = None
    primary: bool = True

    def copy(self, **changes) -> PeventConfig:
        return PeventConfig(**{**self.__dict__, **changes})


class SidebandError(Exception):
    """A sideband file that cannot be used at all (missing, bad range)."""


class FetchError(Exception):
    """A record that cannot be read: ``code`` is the libipt error, ``detail``
    says what is wrong, for people."""

    def __init__(self, code: PtError, offset: int, detail: str) -> None:
        super().__init__(code, offset, detail)
        self.code = code
        self.offset = offset
        self.detail = detail


def perf_time_to_tsc(time: int, config: PeventConfig) -> int:
    """libipt-sb's conversion of a perf timestamp to TSC (time 0 stays 0)."""
    if not time:
        return 0
    if not config.time_mult:
        raise ZeroDivisionError
    time = (time - config.time_zero) & U64
    quot, rem = divmod(time, config.time_mult)
    quot = (quot << config.time_shift) & U64
    rem = ((rem << config.time_shift) & U64) // config.time_mult
    return (quot + rem) & U64


def apply_tsc_offset(tsc: int, offset: int) -> int:
    """Move a record ``offset`` ticks earlier without wrapping around (a
    'negative' offset, i.e. one with the top bit set, moves it later)."""
    if offset <= tsc:
        return tsc - offset
    if offset < (1 << 63):
        return 0
    return (tsc - offset) & U64  # later, saturating below


def load(path: str, begin: int = 0, end: int = 0) -> bytes:
    """The bytes ``begin..end`` of a sideband file (to its end when end is 0)."""
    if end and end <= begin:
        raise SidebandError(f"bad range {begin:#x}-{end:#x}")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise SidebandError(exc.strerror or str(exc)) from None
    if begin >= len(data) and begin:
        raise SidebandError(f"offset {begin:#x} is beyond the end ({len(data):#x})")
    return data[begin : (min(end, len(data)) if end else len(data))]


class PeventFile:
    """Reads the records of one sideband file in order.

    After :meth:`fetch`, ``record`` is the current record, ``offset`` where
    it starts, ``tsc`` when it is due (0: at once) and ``has_time`` whether
    it carried a time sample.
    """

    def __init__(self, filename: str, data: bytes, config: PeventConfig) -> None:
        self.filename = filename
        self.data = data
        self.config = config
        self.next = 0
        self.offset = 0
        self.record: R.Record | None = None
        self.tsc = 0
        self.has_time = False
        self.truncated: str | None = None  # why the file ended early, if it did

    def fetch(self) -> bool:
        """Read the next record; False at the end.  Raises FetchError."""
        data, pos = self.data, self.next
        self.offset = pos
        left = len(data) - pos
        if left < R.HEADER_SIZE:
            if left > 0:
                self.truncated = f"{left} bytes left, less than a record header"
            return False
        rtype, _, size = struct.unpack_from("<IHH", data, pos)
        if size < R.HEADER_SIZE:
            raise FetchError(
                PtError.NOSYNC, pos, f"impossible record size {size} (less than the header)"
            )
        if not rtype:
            self.truncated = "a record of type 0 (zero fill)"
            return False
        if size > left:
            self.truncated = f"the record needs {size} bytes, {left} left"
            return False
        sample_type = self.config.sample_type
        if rtype not in KNOWN_TYPES:
            rec = R.Record(pos, rtype, struct.unpack_from("<H", data, pos + 4)[0], size,
                           bytes(data[pos + 8 : pos + size]))  # fmt: skip
        else:
            try:
                rec = R.parse_record(data, pos, sample_type)
            except R.RecordError as exc:
                code = PtError.BAD_PACKET if "NUL" in exc.message else PtError.NOSYNC
                raise FetchError(code, pos, exc.message) from None
        self.next = pos + size
        self.record = rec
        sid = rec.sample_id
        self.has_time = sid is not None and sid.time is not None
        if self.has_time:
            try:
                tsc = perf_time_to_tsc(sid.time, self.config)
            except ZeroDivisionError:
                raise FetchError(PtError.BAD_CONFIG, pos, "time-mult is 0") from None
            tsc = apply_tsc_offset(tsc, self.config.tsc_offset)
        else:
            tsc = 0
        self.tsc = tsc
        return True

    # -- printing ------------------------------------------------------------

    def format(self, flags: int) -> str | None:
        """The current record as libipt-sb prints it (None when flags say
        print nothing)."""
        if not flags:
            return None
        rec = self.record
        assert rec is not None
        parts = []
        where = flags & (P_FILENAME | P_OFFSET)
        if where == P_FILENAME | P_OFFSET:
            parts.append(f"{self.filename}:{self.offset:016x}  ")
        elif where == P_FILENAME:
            parts.append(f"{self.filename}  ")
        elif where == P_OFFSET:
            parts.append(f"{self.offset:016x}  ")
        if flags & P_TSC and self.has_time:
            parts.append(f"{self.tsc:016x}  ")
        parts.append(_body_text(rec, flags))
        parts.append(_samples_text(rec.sample_id, flags))
        return "".join(parts)


def _mmap2_union(body: R.Mmap2) -> tuple[int, int, int, int]:
    if body.build_id is None:
        return body.maj, body.min, body.ino, body.ino_generation
    raw = bytes([len(body.build_id), 0, 0, 0]) + body.build_id.ljust(20, b"\0")
    return struct.unpack("<IIQQ", raw)


def _body_text(rec: R.Record, flags: int) -> str:
    b = rec.body
    t = rec.type
    compact, verbose = flags & P_COMPACT, flags & P_VERBOSE
    fields: list[tuple[str, str]]
    if t == R.RecordType.MMAP:
        name = "PERF_RECORD_MMAP"
        short = f"{b.pid:x}/{b.tid:x}, {b.addr:x}, {b.len:x}, {b.pgoff:x}, {b.filename}"
        fields = [("pid", f"{b.pid:x}"), ("tid", f"{b.tid:x}"), ("addr", f"{b.addr:x}"),
                  ("len", f"{b.len:x}"), ("pgoff", f"{b.pgoff:x}"), ("filename", b.filename)]  # fmt: skip
    elif t == R.RecordType.LOST:
        name = "PERF_RECORD_LOST"
        short = f"{b.id:x}, {b.lost:x}"
        fields = [("id", f"{b.id:x}"), ("lost", f"{b.lost:x}")]
    elif t == R.RecordType.COMM:
        name = "PERF_RECORD_COMM" + (".EXEC" if rec.misc & R.MISC_COMM_EXEC else "")
        short = f"{b.pid:x}/{b.tid:x}, {b.comm}"
        fields = [("pid", f"{b.pid:x}"), ("tid", f"{b.tid:x}"), ("comm", b.comm)]
    elif t in (R.RecordType.EXIT, R.RecordType.FORK):
        name = "PERF_RECORD_EXIT" if t == R.RecordType.EXIT else "PERF_RECORD_FORK"
        short = f"{b.pid:x}/{b.tid:x}, {b.ppid:x}/{b.ptid:x}, {b.time:x}"
        fields = [("pid", f"{b.pid:x}"), ("ppid", f"{b.ppid:x}"), ("tid", f"{b.tid:x}"),
                  ("ptid", f"{b.ptid:x}"), ("time", f"{b.time:x}")]  # fmt: skip
    elif t in (R.RecordType.THROTTLE, R.RecordType.UNTHROTTLE):
        name = "PERF_RECORD_" + R.RecordType(t).name
        short = f"{b.time:x}, {b.id:x}, {b.stream_id:x}"
        fields = [("time", f"{b.time:x}"), ("id", f"{b.id:x}"), ("stream_id", f"{b.stream_id:x}")]
    elif t == R.RecordType.MMAP2:
        name = "PERF_RECORD_MMAP2"
        maj, mnr, ino, gen = _mmap2_union(b)
        short = (f"{b.pid:x}/{b.tid:x}, {b.addr:x}, {b.len:x}, {b.pgoff:x}, {maj:x}, {mnr:x}, "
                 f"{ino:x}, {gen:x}, {b.prot:x}, {b.flags:x}, {b.filename}")  # fmt: skip
        fields = [("pid", f"{b.pid:x}"), ("tid", f"{b.tid:x}"), ("addr", f"{b.addr:x}"),
                  ("len", f"{b.len:x}"), ("pgoff", f"{b.pgoff:x}"), ("maj", f"{maj:x}"),
                  ("min", f"{mnr:x}"), ("ino", f"{ino:x}"), ("ino_generation", f"{gen:x}"),
                  ("prot", f"{b.prot:x}"), ("flags", f"{b.flags:x}"),
                  ("filename", b.filename)]  # fmt: skip
    elif t == R.RecordType.AUX:
        name = "PERF_RECORD_AUX" + (".TRUNCATED" if b.truncated else "")
        short = f"{b.aux_offset:x}, {b.aux_size:x}, {b.flags:x}"
        fields = [("aux offset", f"{b.aux_offset:x}"), ("aux size", f"{b.aux_size:x}"),
                  ("flags", f"{b.flags:x}")]  # fmt: skip
    elif t == R.RecordType.ITRACE_START:
        name = "PERF_RECORD_ITRACE_START"
        short = f"{b.pid:x}/{b.tid:x}"
        fields = [("pid", f"{b.pid:x}"), ("tid", f"{b.tid:x}")]
    elif t == R.RecordType.LOST_SAMPLES:
        name = "PERF_RECORD_LOST_SAMPLES"
        short = f"{b.lost:x}"
        fields = [("lost", f"{b.lost:x}")]
    elif t == R.RecordType.SWITCH:
        name = "PERF_RECORD_SWITCH." + ("OUT" if rec.misc & R.MISC_SWITCH_OUT else "IN")
        return name
    elif t == R.RecordType.SWITCH_CPU_WIDE:
        out = rec.misc & R.MISC_SWITCH_OUT
        name = "PERF_RECORD_SWITCH_CPU_WIDE." + ("OUT" if out else "IN")
        pfx = "next" if out else "prev"
        short = f"{b.next_prev_pid:x}/{b.next_prev_tid:x}"
        fields = [(f"{pfx} pid", f"{b.next_prev_pid:x}"), (f"{pfx} tid", f"{b.next_prev_tid:x}")]
    else:
        text = ""
        if compact:
            text += f"UNKNOWN ({int(t):x}, {rec.misc:x})"
        if verbose:
            text += f"UNKNOWN\n  type: {int(t):x}\n  misc: {rec.misc:x}"
        return text
    text = ""
    if compact:
        text += f"{name}  {short}"
    if verbose:
        text += name + "".join(f"\n  {k}: {v}" for k, v in fields)
    return text


def _samples_text(sid: R.SampleId | None, flags: int) -> str:
    sid = sid or R.SampleId()
    text = ""
    if flags & P_COMPACT:
        items = []
        if sid.pid is not None and sid.tid is not None:
            items.append(f"{sid.pid:x}/{sid.tid:x}")
        if sid.time is not None:
            items.append(f"{sid.time:x}")
        if sid.id is not None:
            items.append(f"{sid.id:x}")
        if sid.cpu is not None:
            items.append(f"cpu-{sid.cpu:x}")
        if sid.stream_id is not None:
            items.append(f"{sid.stream_id:x}")
        if sid.identifier is not None:
            items.append(f"{sid.identifier:x}")
        text += "  {" + "".join(" " + i for i in items) + " }"
    if flags & P_VERBOSE:
        if sid.pid is not None and sid.tid is not None:
            text += f"\n  pid: {sid.pid:x}\n  tid: {sid.tid:x}"
        for label, value in (("time", sid.time), ("id", sid.id), ("cpu", sid.cpu),
                             ("stream id", sid.stream_id), ("identifier", sid.identifier)):  # fmt: skip
            if value is not None:
                text += f"\n  {label}: {value:x}"
    return text
