"""perf.data feature sections (``HEADER_*`` features): parse and pack.

A file-mode perf.data marks its features in a 256-bit bitmap in the header;
after the data section comes one ``perf_file_section`` (offset, size) per set
bit, in bit order, each pointing at the feature's contents.  Pipe mode sends
the same contents in ``HEADER_FEATURE`` records.  The formats are perf's
(tools/perf/util/header.c): strings are a u32 length (padded to 64 bytes)
and NUL-padded text, string lists a u32 count and strings.

:func:`parse_feature` turns a section into Python values (documented per
feature below); features this module does not know are kept as bytes.
:func:`pack_feature` writes the ones a writer needs.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from .attr import AttrError, PerfEventAttr, attr_text

__all__ = [
    "BuildId",
    "Feature",
    "FeatureError",
    "pack_build_id",
    "pack_feature",
    "pack_string",
    "parse_build_ids",
    "parse_feature",
]

NAME_ALIGN = 64


class Feature(IntEnum):
    """Feature bits of perf.data (``HEADER_*``; perf 6.1 writes up to PMU_CAPS)."""

    RESERVED = 0
    TRACING_DATA = 1
    BUILD_ID = 2
    HOSTNAME = 3
    OSRELEASE = 4
    VERSION = 5
    ARCH = 6
    NRCPUS = 7
    CPUDESC = 8
    CPUID = 9
    TOTAL_MEM = 10
    CMDLINE = 11
    EVENT_DESC = 12
    CPU_TOPOLOGY = 13
    NUMA_TOPOLOGY = 14
    BRANCH_STACK = 15
    PMU_MAPPINGS = 16
    GROUP_DESC = 17
    AUXTRACE = 18
    STAT = 19
    CACHE = 20
    SAMPLE_TIME = 21
    MEM_TOPOLOGY = 22
    CLOCKID = 23
    DIR_FORMAT = 24
    BPF_PROG_INFO = 25
    BPF_BTF = 26
    COMPRESSED = 27
    CPU_PMU_CAPS = 28
    CLOCK_DATA = 29
    HYBRID_TOPOLOGY = 30
    PMU_CAPS = 31


class FeatureError(ValueError):
    """A feature section that does not parse; ``offset`` is within the section."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset
        self.message = message


@dataclass
class BuildId:
    """One build-id entry (feature BUILD_ID or a HEADER_BUILD_ID record)."""

    pid: int
    build_id: bytes
    filename: str
    misc: int = 0


class _Cursor:
    def __init__(self, data: bytes | memoryview) -> None:
        self.b = memoryview(data)
        self.pos = 0

    def left(self) -> int:
        return len(self.b) - self.pos

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.b):
            raise FeatureError(self.pos, f"needs {n} bytes, {self.left()} left")
        v = self.b[self.pos : self.pos + n]
        self.pos += n
        return v

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def u32(self) -> int:
        return self.unpack("<I")[0]

    def u64(self) -> int:
        return self.unpack("<Q")[0]

    def count(self, each: int) -> int:
        """A u32 count of items of at least ``each`` bytes, checked against what is left."""
        at = self.pos
        n = self.u32()
        if n * each > self.left():
            raise FeatureError(at, f"count {n} does not fit in {self.left()} bytes")
        return n

    def string(self) -> str:
        at = self.pos
        n = self.u32()
        if n > self.left():
            raise FeatureError(at, f"string of {n} bytes, {self.left()} left")
        raw = bytes(self.take(n))
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")

    def strings(self) -> list[str]:
        return [self.string() for _ in range(self.count(4))]


# HEADER_COMPRESSED's words (perf's write_compressed).
_COMPRESSED_FIELDS = ("version", "type", "level", "ratio", "mmap_len")


def pack_string(s: str) -> bytes:
    """perf's ``do_write_string``: u32 padded length, text, NULs to a 64-byte multiple."""
    raw = s.encode()
    n = (len(raw) + 1 + NAME_ALIGN - 1) // NAME_ALIGN * NAME_ALIGN
    return struct.pack("<I", n) + raw + bytes(n - len(raw))


def _pack_strings(items: list[str]) -> bytes:
    return struct.pack("<I", len(items)) + b"".join(pack_string(s) for s in items)


def parse_build_ids(data: bytes | memoryview) -> list[BuildId]:
    """The build-id entries of a BUILD_ID feature section."""
    c = _Cursor(data)
    out = []
    while c.left() >= 8:
        at = c.pos
        _type, misc, size = c.unpack("<IHH")
        if size < 36 or size - 8 > c.left():
            raise FeatureError(at, f"build-id entry of impossible size {size}")
        body = c.take(size - 8)
        pid = struct.unpack_from("<i", body, 0)[0]
        bid = bytes(body[4:28])
        n = bid[20] if misc & (1 << 15) else 20
        name = bytes(body[28:]).split(b"\0", 1)[0].decode("utf-8", "replace")
        out.append(BuildId(pid, bid[: min(n, 20)], name, misc & 0x7FFF))
    return out


def pack_build_id(entry: BuildId, record_type: int = 0) -> bytes:
    """One build-id entry (``record_type`` 67 makes it a HEADER_BUILD_ID record)."""
    name = entry.filename.encode()
    nlen = (len(name) + 1 + NAME_ALIGN - 1) // NAME_ALIGN * NAME_ALIGN
    size = 8 + 4 + 24 + nlen
    bid = entry.build_id[:20]
    misc = entry.misc | (1 << 15)
    return (
        struct.pack("<IHHi", record_type, misc, size, entry.pid)
        + bid
        + bytes(20 - len(bid))
        + bytes([len(bid), 0, 0, 0])
        + name
        + bytes(nlen - len(name))
    )


@dataclass
class EventDesc:
    """One entry of EVENT_DESC: the attr, its name and its sample IDs."""

    attr: PerfEventAttr
    name: str
    ids: list[int] = field(default_factory=list)


def _event_desc(c: _Cursor) -> list[EventDesc]:
    nr = c.u32()
    sz = c.u32()
    if sz < 64 or nr * sz > c.left():
        raise FeatureError(0, f"EVENT_DESC with {nr} attrs of {sz} bytes")
    out = []
    for _ in range(nr):
        at = c.pos
        raw = c.take(sz)
        try:
            attr = PerfEventAttr.parse(raw, 0, sz)
        except AttrError as e:
            raise FeatureError(at, str(e)) from None
        nids = c.count(8)
        name = c.string()
        ids = list(struct.unpack(f"<{nids}Q", c.take(8 * nids)))
        out.append(EventDesc(attr, name, ids))
    return out


def _cpu_topology(c: _Cursor, ctx: dict[Feature, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"core_siblings": c.strings(), "thread_siblings": c.strings()}
    ncpu = ctx.get(Feature.NRCPUS, {}).get("nr_cpus_avail", 0)
    if ncpu and c.left() >= 8 * ncpu:
        ids = struct.unpack(f"<{2 * ncpu}I", c.take(8 * ncpu))
        out["core_id"] = list(ids[0::2])
        out["socket_id"] = list(ids[1::2])
        if c.left() >= 4:
            out["die_siblings"] = c.strings()
            if c.left() >= 4 * ncpu:
                out["die_id"] = list(struct.unpack(f"<{ncpu}I", c.take(4 * ncpu)))
    return out


def _caps(c: _Cursor) -> dict[str, str]:
    return {c.string(): c.string() for _ in range(c.count(8))}


def _bitmap(c: _Cursor) -> list[int]:
    nbits = c.u64()
    words = (nbits + 63) // 64
    if words * 8 > c.left():
        raise FeatureError(c.pos, f"bitmap of {nbits} bits does not fit")
    bits = []
    for w, v in enumerate(struct.unpack(f"<{words}Q", c.take(8 * words))):
        bits += [w * 64 + i for i in range(64) if v >> i & 1]
    return bits


def parse_feature(
    feat: int, data: bytes | memoryview, ctx: dict[Feature, Any] | None = None
) -> Any:
    """Parse one feature section's contents.

    Returns: ``str`` for HOSTNAME, OSRELEASE, VERSION, ARCH, CPUDESC, CPUID;
    ``int`` for TOTAL_MEM (kB), CLOCKID (resolution ns), DIR_FORMAT;
    ``list[str]`` for CMDLINE; ``list[BuildId]`` for BUILD_ID;
    ``list[EventDesc]`` for EVENT_DESC; ``list[(offset, size)]`` of AUXTRACE
    records for AUXTRACE; dicts for the rest (keys named as in perf);
    ``bytes`` for TRACING_DATA and unknown features; ``None`` for the
    empty markers BRANCH_STACK and STAT.  ``ctx`` holds features parsed so
    far (CPU_TOPOLOGY needs NRCPUS).  Raises :class:`FeatureError`.
    """
    ctx = ctx or {}
    c = _Cursor(data)
    try:
        f = Feature(feat)
    except ValueError:
        return bytes(data)
    if f in (Feature.HOSTNAME, Feature.OSRELEASE, Feature.VERSION, Feature.ARCH,
             Feature.CPUDESC, Feature.CPUID):  # fmt: skip
        return c.string()
    if f == Feature.NRCPUS:
        a, o = c.unpack("<II")
        return {"nr_cpus_avail": a, "nr_cpus_online": o}
    if f in (Feature.TOTAL_MEM, Feature.CLOCKID, Feature.DIR_FORMAT):
        return c.u64()
    if f == Feature.CMDLINE:
        return c.strings()
    if f == Feature.BUILD_ID:
        return parse_build_ids(data)
    if f == Feature.EVENT_DESC:
        return _event_desc(c)
    if f == Feature.CPU_TOPOLOGY:
        return _cpu_topology(c, ctx)
    if f == Feature.NUMA_TOPOLOGY:
        nodes = []
        for _ in range(c.count(24)):
            node, total, free = c.unpack("<IQQ")
            nodes.append({"node": node, "mem_total": total, "mem_free": free, "cpus": c.string()})
        return nodes
    if f == Feature.PMU_MAPPINGS:
        out = {}
        for _ in range(c.count(8)):
            t = c.u32()
            out[c.string()] = t
        return out
    if f == Feature.GROUP_DESC:
        groups = []
        for _ in range(c.count(12)):
            name = c.string()
            leader, nr = c.unpack("<II")
            groups.append({"name": name, "leader_idx": leader, "nr_members": nr})
        return groups
    if f == Feature.AUXTRACE:
        n = c.u64()
        if n * 16 > c.left():
            raise FeatureError(0, f"auxtrace index of {n} entries does not fit")
        v = struct.unpack(f"<{2 * n}Q", c.take(16 * n))
        return list(zip(v[0::2], v[1::2], strict=True))
    if f == Feature.CACHE:
        version = c.u32()
        caches = []
        for _ in range(c.count(28)):
            level, line, sets, ways = c.unpack("<IIII")
            caches.append({"level": level, "line_size": line, "sets": sets, "ways": ways,
                           "type": c.string(), "size": c.string(), "map": c.string()})  # fmt: skip
        return {"version": version, "caches": caches}
    if f == Feature.SAMPLE_TIME:
        first, last = c.unpack("<QQ")
        return {"first_sample_time": first, "last_sample_time": last}
    if f == Feature.MEM_TOPOLOGY:
        version, block_size, n = c.unpack("<QQQ")
        if n * 24 > c.left():
            raise FeatureError(16, f"{n} memory nodes do not fit")
        nodes = []
        for _ in range(n):
            node, size = c.unpack("<QQ")
            nodes.append({"node": node, "size": size, "blocks": _bitmap(c)})
        return {"version": version, "block_size": block_size, "nodes": nodes}
    if f == Feature.COMPRESSED:
        return dict(zip(_COMPRESSED_FIELDS, c.unpack("<IIIII"), strict=True))
    if f == Feature.CLOCK_DATA:
        version, clockid, tod, clk = c.unpack("<IIQQ")
        return {"version": version, "clockid": clockid, "tod_ns": tod, "clockid_ns": clk}
    if f == Feature.HYBRID_TOPOLOGY:
        return [{"pmu_name": c.string(), "cpus": c.string()} for _ in range(c.count(8))]
    if f == Feature.CPU_PMU_CAPS:
        return _caps(c)
    if f == Feature.PMU_CAPS:
        pmus = {}
        for _ in range(c.count(8)):
            caps = _caps(c)
            pmus[c.string()] = caps
        return pmus
    if f == Feature.BPF_BTF:
        out = []
        for _ in range(c.count(8)):
            bid, n = c.unpack("<II")
            out.append({"id": bid, "data": bytes(c.take(n))})
        return out
    if f == Feature.BPF_PROG_INFO:
        # perf's struct perf_bpil per program (tools/perf/util/header.c,
        # process_bpf_prog_info): info_len, data_len, the ``arrays`` bitmap,
        # then bpf_prog_info (info_len bytes) and the arrays' data.
        out = []
        for _ in range(c.count(16)):
            il, dl, arrays = c.unpack("<IIQ")
            out.append({"arrays": arrays, "info": bytes(c.take(il)), "data": bytes(c.take(dl))})
        return out
    if f in (Feature.BRANCH_STACK, Feature.STAT):
        return None
    return bytes(data)


def pack_feature(feat: int, value: Any) -> bytes:
    """Pack a feature's contents from the value :func:`parse_feature` gives.

    Supported: the string features, NRCPUS, TOTAL_MEM, CLOCKID, DIR_FORMAT,
    CMDLINE, BUILD_ID, EVENT_DESC (``[(attr, name, ids)]`` or EventDesc),
    PMU_MAPPINGS, GROUP_DESC, AUXTRACE, SAMPLE_TIME, CLOCK_DATA, COMPRESSED, CPU_TOPOLOGY
    (core/thread siblings and ids), BRANCH_STACK/STAT (empty) and raw
    ``bytes`` for anything else."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    f = Feature(feat)
    if f in (Feature.HOSTNAME, Feature.OSRELEASE, Feature.VERSION, Feature.ARCH,
             Feature.CPUDESC, Feature.CPUID):  # fmt: skip
        return pack_string(value)
    if f == Feature.NRCPUS:
        return struct.pack("<II", value["nr_cpus_avail"], value["nr_cpus_online"])
    if f in (Feature.TOTAL_MEM, Feature.CLOCKID, Feature.DIR_FORMAT):
        return struct.pack("<Q", value)
    if f == Feature.CMDLINE:
        return _pack_strings(value)
    if f == Feature.BUILD_ID:
        return b"".join(pack_build_id(b) for b in value)
    if f == Feature.COMPRESSED:
        return struct.pack("<IIIII", *(value[k] for k in _COMPRESSED_FIELDS))
    if f == Feature.EVENT_DESC:
        descs = [d if isinstance(d, EventDesc) else EventDesc(*d) for d in value]
        sz = max((d.attr.size or 136 for d in descs), default=136)
        out = struct.pack("<II", len(descs), sz)
        for d in descs:
            out += d.attr.pack(sz) + struct.pack("<I", len(d.ids)) + pack_string(d.name)
            out += struct.pack(f"<{len(d.ids)}Q", *d.ids)
        return out
    if f == Feature.PMU_MAPPINGS:
        out = struct.pack("<I", len(value))
        for name, t in value.items():
            out += struct.pack("<I", t) + pack_string(name)
        return out
    if f == Feature.GROUP_DESC:
        out = struct.pack("<I", len(value))
        for g in value:
            out += pack_string(g["name"]) + struct.pack("<II", g["leader_idx"], g["nr_members"])
        return out
    if f == Feature.AUXTRACE:
        out = struct.pack("<Q", len(value))
        for off, size in value:
            out += struct.pack("<QQ", off, size)
        return out
    if f == Feature.SAMPLE_TIME:
        return struct.pack("<QQ", value["first_sample_time"], value["last_sample_time"])
    if f == Feature.CLOCK_DATA:
        return struct.pack("<IIQQ", value.get("version", 1), value["clockid"],
                           value["tod_ns"], value["clockid_ns"])  # fmt: skip
    if f == Feature.CPU_TOPOLOGY:
        out = _pack_strings(value["core_siblings"]) + _pack_strings(value["thread_siblings"])
        if "core_id" in value:
            for core, sock in zip(value["core_id"], value["socket_id"], strict=True):
                out += struct.pack("<II", core, sock)
        return out
    if f in (Feature.BRANCH_STACK, Feature.STAT):
        return b""
    raise ValueError(f"cannot pack feature {f.name} from {type(value).__name__}")


# ---------------------------------------------------------------------------
# Text, as ``perf report --header-only -I`` prints the features (perf's
# util/header.c): one list of lines (without perf's leading "# ") a feature.

_TEXT_NAMES = {
    Feature.HOSTNAME: "hostname", Feature.OSRELEASE: "os release", Feature.VERSION: "perf version",
    Feature.ARCH: "arch", Feature.CPUDESC: "cpudesc", Feature.CPUID: "cpuid",
}  # fmt: skip
_COMPRESSORS = {0: "None", 1: "Zstd"}
_CLOCKS = {0: "realtime", 1: "monotonic", 4: "monotonic_raw", 7: "boottime", 11: "tai"}


def _size_text(n: int) -> str:
    """A size as perf's unit_number__scnprintf writes it (24G, 512M)."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift:
            return f"{n >> shift}{unit}"
    return f"{n}B"


def _ranges(values: list[int]) -> str:
    """Sorted numbers as ranges, ``0-23,32-199``."""
    spans: list[list[int]] = []
    for v in values:
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _seconds(ns: int, digits: int = 6) -> str:
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000 // 10 ** (9 - digits):0{digits}d}"


def feature_lines(feat: int, value: Any) -> list[str]:
    """A parsed feature (:func:`parse_feature`'s value) as the lines perf
    prints for it; features perf does not print (build IDs, the AUX index)
    in the same manner."""
    try:
        f = Feature(feat)
    except ValueError:
        return [f"feature {feat} : {len(value)} bytes"]
    if f in _TEXT_NAMES:
        return [f"{_TEXT_NAMES[f]} : {value}"]
    if f == Feature.NRCPUS:
        return [f"nrcpus online : {value['nr_cpus_online']}",
                f"nrcpus avail : {value['nr_cpus_avail']}"]  # fmt: skip
    if f == Feature.TOTAL_MEM:
        return [f"total memory : {value} kB"]
    if f == Feature.CMDLINE:
        return ["cmdline : " + "".join(f"{a} " for a in value)]
    if f == Feature.BUILD_ID:
        return [f"build id : {b.build_id.hex()} {b.filename}" for b in value]
    if f == Feature.EVENT_DESC:
        return [
            f"event : name = {e.name}, , id = {{ {', '.join(str(i) for i in e.ids)} }}, "
            + attr_text(e.attr)
            for e in value
        ]
    if f == Feature.CPU_TOPOLOGY:
        lines = [f"sibling sockets : {s}" for s in value["core_siblings"]]
        lines += [f"sibling dies    : {s}" for s in value.get("die_siblings", [])]
        lines += [f"sibling threads : {s}" for s in value["thread_siblings"]]
        dies = value.get("die_id")
        for cpu, (core, socket) in enumerate(
            zip(value.get("core_id", []), value.get("socket_id", []), strict=True)
        ):
            die = f", Die ID {dies[cpu]}" if dies else ""
            lines.append(f"CPU {cpu}: Core ID {core}{die}, Socket ID {socket}")
        return lines
    if f == Feature.NUMA_TOPOLOGY:
        lines = []
        for n in value:
            lines.append(f"node{n['node']} meminfo  : total = {n['mem_total']} kB, "
                         f"free = {n['mem_free']} kB")  # fmt: skip
            lines.append(f"node{n['node']} cpu list : {n['cpus']}")
        return lines
    if f == Feature.PMU_MAPPINGS:
        return ["pmu mappings: " + ", ".join(f"{k} = {v}" for k, v in value.items())]
    if f == Feature.GROUP_DESC:
        return [f"group: {g['name']} (leader {g['leader_idx']}, {g['nr_members']} members)"
                for g in value]  # fmt: skip
    if f == Feature.AUXTRACE:
        return ["contains AUX area data (e.g. instruction trace)"] + [
            f"auxtrace index : offset {o:#x} size {s:#x}" for o, s in value
        ]
    if f == Feature.BRANCH_STACK:
        return ["contains samples with branch stack"]
    if f == Feature.STAT:
        return ["contains stat data"]
    if f == Feature.CACHE:
        return ["CPU cache info:"] + [
            f" L{c['level']} {c['type']:<15} {c['size']:>8} [{c['map']}]" for c in value["caches"]
        ]
    if f == Feature.SAMPLE_TIME:
        first, last = value["first_sample_time"], value["last_sample_time"]
        return [f"time of first sample : {_seconds(first)}",
                f"time of last sample : {_seconds(last)}",
                f"sample duration : {(last - first) / 1e6:10.3f} ms"]  # fmt: skip
    if f == Feature.MEM_TOPOLOGY:
        lines = [f"memory nodes (nr {len(value['nodes'])}, block size {value['block_size']:#x}):"]
        for n in value["nodes"]:
            # (the blocks present: perf prints their size, not the map's)
            size = _size_text(len(n["blocks"]) * value["block_size"])
            lines.append(f" {n['node']:3d} [{size}]: {_ranges(n['blocks'])}")
        return lines
    if f == Feature.CLOCKID:
        return [f"clockid frequency: {1000 // value if value else 0} MHz"]
    if f == Feature.DIR_FORMAT:
        return [f"directory data version : {value}"]
    if f == Feature.COMPRESSED:
        name = _COMPRESSORS.get(value["type"], str(value["type"]))
        return [f"compressed : {name}, level = {value['level']}, ratio = {value['ratio']}"]
    if f == Feature.CLOCK_DATA:
        clock = _CLOCKS.get(value["clockid"], "unknown")
        tod = value["tod_ns"]
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(tod // 1_000_000_000))
        return [f"clockid: {clock} ({value['clockid']})",
                f"reference time: {when}.{tod % 1_000_000_000 // 1000:06d} = "
                f"{_seconds(tod)} (TOD) = {_seconds(value['clockid_ns'], 9)} ({clock})"]  # fmt: skip
    if f == Feature.HYBRID_TOPOLOGY:
        return [f"{h['pmu_name']} cpu list : {h['cpus']}" for h in value]
    return _generic_lines(f.name.lower(), value)


def _generic_lines(name: str, value: Any) -> list[str]:
    """Features perf prints in ways of their own (BPF programs, PMU
    capabilities): their values as plain text."""
    if value is None or value == [] or value == {}:
        return []
    if isinstance(value, (bytes, bytearray, memoryview)):
        return [f"{name} : {len(value)} bytes"]
    if isinstance(value, dict):
        return [f"{name} : " + ", ".join(f"{k} = {_plain(v)}" for k, v in value.items())]
    if isinstance(value, list):
        return [f"{name} : {_plain(v)}" for v in value]
    return [f"{name} : {_plain(value)}"]


def _plain(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} = {_plain(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "{ " + ", ".join(_plain(v) for v in value) + " }"
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return str(value)
