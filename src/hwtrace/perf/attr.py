"""``struct perf_event_attr``: parse and pack every size perf has written.

The kernel grew the structure over the years; perf.data stores the size the
writing perf knew (``attr.size``) and readers take the fields that fit, the
rest are zero.  Sizes (``PERF_ATTR_SIZE_VER*``): 64 (VER0), 72 (config2),
80 (branch_sample_type), 96 (sample_regs_user, sample_stack_user, clockid),
104 (sample_regs_intr), 112 (aux_watermark, sample_max_stack), 120
(aux_sample_size), 128 (sig_data), 136 (config3).  A size of 0 means VER0
(old perf wrote it so).  Larger sizes than known are accepted: the known
prefix is parsed and the rest kept in :attr:`PerfEventAttr.extra`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, fields
from enum import IntEnum

from .records import SampleType

__all__ = [
    "ATTR_FLAG_BITS",
    "ATTR_SIZES",
    "ATTR_SIZE_CURRENT",
    "AttrError",
    "PerfEventAttr",
    "PerfType",
    "ReadFormat",
    "id_is_positions",
]

ATTR_SIZES = (64, 72, 80, 96, 104, 112, 120, 128, 136)
ATTR_SIZE_CURRENT = 136


class PerfType(IntEnum):
    """``attr.type`` values of the kernel's generic PMUs (others are dynamic)."""

    HARDWARE = 0
    SOFTWARE = 1
    TRACEPOINT = 2
    HW_CACHE = 3
    RAW = 4
    BREAKPOINT = 5


class ReadFormat:
    """``PERF_FORMAT_*`` bits of ``attr.read_format``."""

    TOTAL_TIME_ENABLED = 1 << 0
    TOTAL_TIME_RUNNING = 1 << 1
    ID = 1 << 2
    GROUP = 1 << 3
    LOST = 1 << 4


# The bitfield word at offset 40, from bit 0 up; precise_ip is 2 bits wide.
ATTR_FLAG_BITS: tuple[tuple[str, int, int], ...] = tuple(
    (name, bit, width)
    for name, bit, width in (
        ("disabled", 0, 1),
        ("inherit", 1, 1),
        ("pinned", 2, 1),
        ("exclusive", 3, 1),
        ("exclude_user", 4, 1),
        ("exclude_kernel", 5, 1),
        ("exclude_hv", 6, 1),
        ("exclude_idle", 7, 1),
        ("mmap", 8, 1),
        ("comm", 9, 1),
        ("freq", 10, 1),
        ("inherit_stat", 11, 1),
        ("enable_on_exec", 12, 1),
        ("task", 13, 1),
        ("watermark", 14, 1),
        ("precise_ip", 15, 2),
        ("mmap_data", 17, 1),
        ("sample_id_all", 18, 1),
        ("exclude_host", 19, 1),
        ("exclude_guest", 20, 1),
        ("exclude_callchain_kernel", 21, 1),
        ("exclude_callchain_user", 22, 1),
        ("mmap2", 23, 1),
        ("comm_exec", 24, 1),
        ("use_clockid", 25, 1),
        ("context_switch", 26, 1),
        ("write_backward", 27, 1),
        ("namespaces", 28, 1),
        ("ksymbol", 29, 1),
        ("bpf_event", 30, 1),
        ("aux_output", 31, 1),
        ("cgroup", 32, 1),
        ("text_poke", 33, 1),
        ("build_id", 34, 1),
        ("inherit_thread", 35, 1),
        ("remove_on_exec", 36, 1),
        ("sigtrap", 37, 1),
    )
)
_FLAG_MASK = 0
for _n, _b, _w in ATTR_FLAG_BITS:
    _FLAG_MASK |= ((1 << _w) - 1) << _b

# (first size containing the field, struct format, field names) in layout order.
_LAYOUT: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (64, "<IIQQQQQIIQ", ("type", "size", "config", "sample_period", "sample_type",
                         "read_format", "flags", "wakeup_events", "bp_type", "config1")),
    (72, "<Q", ("config2",)),
    (80, "<Q", ("branch_sample_type",)),
    (96, "<QIi", ("sample_regs_user", "sample_stack_user", "clockid")),
    (104, "<Q", ("sample_regs_intr",)),
    (112, "<IHH", ("aux_watermark", "sample_max_stack", "reserved_2")),
    (120, "<II", ("aux_sample_size", "reserved_3")),
    (128, "<Q", ("sig_data",)),
    (136, "<Q", ("config3",)),
)  # fmt: skip


class AttrError(ValueError):
    """An attr that cannot be parsed (too short, or a size below VER0)."""


@dataclass
class PerfEventAttr:
    """One ``struct perf_event_attr``.

    ``flags`` is the raw bitfield word; each named bit (``sample_id_all``,
    ``exclude_kernel``, ``context_switch``, ``text_poke``, ``aux_output``, …,
    see :data:`ATTR_FLAG_BITS`) reads and writes through it as an attribute.
    ``sample_period`` doubles as ``sample_freq`` (when ``freq`` is set),
    ``wakeup_events`` as ``wakeup_watermark``, ``config1`` as ``bp_addr`` and
    ``config2`` as ``bp_len``.  ``size`` is what the attr says of itself
    (0 for some VER0 writers); :meth:`pack` writes ``size`` bytes (or
    :data:`ATTR_SIZE_CURRENT` when 0 is asked).
    """

    type: int = 0
    size: int = ATTR_SIZE_CURRENT
    config: int = 0
    sample_period: int = 0
    sample_type: int = 0
    read_format: int = 0
    flags: int = 0
    wakeup_events: int = 0
    bp_type: int = 0
    config1: int = 0
    config2: int = 0
    branch_sample_type: int = 0
    sample_regs_user: int = 0
    sample_stack_user: int = 0
    clockid: int = 0
    sample_regs_intr: int = 0
    aux_watermark: int = 0
    sample_max_stack: int = 0
    reserved_2: int = 0
    aux_sample_size: int = 0
    reserved_3: int = 0
    sig_data: int = 0
    config3: int = 0
    extra: bytes = field(default=b"", repr=False)

    def __init__(self, **kw: int | bytes) -> None:
        for f in fields(self):
            if f.name == "extra":
                self.extra = b""
            else:
                setattr(self, f.name, f.default)
        for k, v in kw.items():
            setattr(self, k, v)

    def __getattr__(self, name: str) -> int:
        for n, bit, width in ATTR_FLAG_BITS:
            if n == name:
                return (self.__dict__["flags"] >> bit) & ((1 << width) - 1)
        raise AttributeError(name)

    def __setattr__(self, name: str, value: object) -> None:
        for n, bit, width in ATTR_FLAG_BITS:
            if n == name:
                mask = ((1 << width) - 1) << bit
                flags = self.__dict__.get("flags", 0)
                self.__dict__["flags"] = (flags & ~mask) | ((int(value) << bit) & mask)  # type: ignore[call-overload]
                return
        object.__setattr__(self, name, value)

    @property
    def sample_freq(self) -> int:
        return self.sample_period

    @property
    def flag_names(self) -> list[str]:
        """The names of the set flag bits (precise_ip as ``precise_ip=N``)."""
        out = []
        for n, bit, width in ATTR_FLAG_BITS:
            v = (self.flags >> bit) & ((1 << width) - 1)
            if v:
                out.append(n if width == 1 else f"{n}={v}")
        return out

    @classmethod
    def parse(
        cls, buf: bytes | memoryview, offset: int = 0, size: int | None = None
    ) -> PerfEventAttr:
        """Parse an attr at ``offset``; ``size`` overrides the attr's own size field
        (perf.data's header says how big each stored attr is)."""
        mv = memoryview(buf)
        if len(mv) - offset < 8:
            raise AttrError(f"attr truncated: {len(mv) - offset} bytes")
        own = struct.unpack_from("<I", mv, offset + 4)[0]
        n = own if size is None else size
        if n == 0:
            n = 64
        if n < 64:
            raise AttrError(f"attr size {n} below the first published size 64")
        if len(mv) - offset < n:
            raise AttrError(f"attr of {n} bytes truncated to {len(mv) - offset}")
        a = cls()
        pos = offset
        for first, fmt, names in _LAYOUT:
            if first > n:
                break
            for name, v in zip(names, struct.unpack_from(fmt, mv, pos), strict=True):
                object.__setattr__(a, name, v)
            pos += struct.calcsize(fmt)
        a.extra = bytes(mv[pos : offset + n])
        return a

    def pack(self, size: int | None = None) -> bytes:
        """The attr as ``size`` bytes (default: its ``size``, or the current size
        when that is 0); the ``size`` field is written as the size packed."""
        n = size if size is not None else (self.size or ATTR_SIZE_CURRENT)
        if n < 64:
            raise AttrError(f"attr size {n} below the first published size 64")
        out = bytearray()
        for first, fmt, names in _LAYOUT:
            if first > n:
                break
            vals = [getattr(self, x) for x in names]
            if names[0] == "type":
                vals[1] = n
            out += struct.pack(fmt, *vals)
        if len(out) < n:
            out += self.extra[: n - len(out)]
            out += bytes(n - len(out))
        return bytes(out)

    @property
    def id_pos(self) -> int:
        """Index (in u64s) of the event ID in a SAMPLE record, -1 if none (perf's id_pos)."""
        return id_is_positions(self.sample_type)[0]

    @property
    def is_pos(self) -> int:
        """Index from the end (in u64s) of the ID in other records' sample_id, -1 if none."""
        return id_is_positions(self.sample_type)[1]


def id_is_positions(sample_type: int) -> tuple[int, int]:
    """perf's ``id_pos`` and ``is_pos`` for ``sample_type`` (see evsel.c)."""
    IDENTIFIER, ID = 1 << 16, 1 << 6
    if sample_type & IDENTIFIER:
        return 0, 1
    if not sample_type & ID:
        return -1, -1
    idp = 0
    for bit in (0, 1, 2, 3):  # IP, TID, TIME, ADDR precede ID
        if sample_type & (1 << bit):
            idp += 1
    isp = 1
    if sample_type & (1 << 7):  # CPU
        isp += 1
    if sample_type & (1 << 9):  # STREAM_ID
        isp += 1
    return idp, isp


# perf_event_attr__fprintf's names (perf's util/perf_event_attr_fprintf.c):
# the sample type's are SampleType's, bit by bit.
_SAMPLE_TYPE_NAMES = tuple(str(m.name) for m in SampleType)
_READ_FORMAT_NAMES = ("TOTAL_TIME_ENABLED", "TOTAL_TIME_RUNNING", "ID", "GROUP", "LOST")


def _bit_names(value: int, names: tuple[str, ...]) -> str:
    out = [n for i, n in enumerate(names) if value >> i & 1]
    rest = value & ~((1 << len(names)) - 1)
    if rest:
        out.append(f"{rest:#x}")
    return "|".join(out)


def attr_text(attr: PerfEventAttr) -> str:
    """The attr's set fields as ``perf report --header-only`` prints them
    (``type = 8, size = 128, config = 0x1002401, ...``)."""
    a = attr
    parts = [("type", str(a.type)), ("size", str(a.size)), ("config", f"{a.config:#x}"),
             ("{ sample_period, sample_freq }", str(a.sample_period)),
             ("sample_type", _bit_names(a.sample_type, _SAMPLE_TYPE_NAMES)),
             ("read_format", _bit_names(a.read_format, _READ_FORMAT_NAMES))]  # fmt: skip
    for name, bit, width in ATTR_FLAG_BITS:
        v = (a.flags >> bit) & ((1 << width) - 1)
        parts.append((name, str(v) if v else ""))
    parts += [("{ wakeup_events, wakeup_watermark }", str(a.wakeup_events)),
              ("bp_type", str(a.bp_type)), ("{ bp_addr, config1 }", f"{a.config1:#x}"),
              ("{ bp_len, config2 }", f"{a.config2:#x}"),
              ("branch_sample_type", f"{a.branch_sample_type:#x}"),
              ("sample_regs_user", f"{a.sample_regs_user:#x}"),
              ("sample_stack_user", str(a.sample_stack_user)), ("clockid", str(a.clockid)),
              ("sample_regs_intr", f"{a.sample_regs_intr:#x}"),
              ("aux_watermark", str(a.aux_watermark)),
              ("sample_max_stack", str(a.sample_max_stack)),
              ("aux_sample_size", str(a.aux_sample_size)), ("sig_data", str(a.sig_data))]  # fmt: skip
    return ", ".join(f"{k} = {v}" for k, v in parts if v not in ("", "0", "0x0"))


def event_modifiers(attr: PerfEventAttr) -> str:
    """The modifiers perf adds to a name it makes from an attr (``:u``,
    ``:kH``, ``:ppp``; empty when none), as perf's evsel__add_modifiers
    writes them: the contexts counted when some are excluded, precision,
    then host and guest when they differ from what excluding implies."""
    mods = ""
    guest_default = False
    if attr.exclude_kernel or attr.exclude_user or attr.exclude_hv:
        mods += "".join(m for m, off in (("k", attr.exclude_kernel), ("u", attr.exclude_user),
                                         ("h", attr.exclude_hv)) if not off)  # fmt: skip
        guest_default = True
    if attr.precise_ip:
        mods += "ppp"[: attr.precise_ip]
        guest_default = True
    if attr.exclude_host or bool(attr.exclude_guest) == guest_default:
        mods += "".join(m for m, off in (("H", attr.exclude_host), ("G", attr.exclude_guest))
                        if not off)  # fmt: skip
    return ":" + mods if mods else ""
