"""CoreSight trace snapshots in OpenCSD's directory format.

A snapshot directory (ARM's DS-5 "snapshot" layout, which OpenCSD's
``trc_pkt_lister -ss_dir`` reads) holds:

- ``snapshot.ini``: ``[device_list]`` naming one ini file per device, and
  ``[trace] metadata=trace.ini``;
- one ini file per device: ``[device]`` name, class (``core`` or
  ``trace_source``) and type (``STM``, ``ETM4``, ``ETE``, a core name...),
  and ``[regs]`` with the trace unit's registers as ``NAME(0xOFF)=value``
  (hwtrace, perf) or, as DS-5 writes them, ``NAME(id:0xN)=``,
  ``NAME(size:64)=`` or ``NAME(id:0xN,size:64)=`` (``id`` is the register
  number: its offset is ``4 * id``); OpenCSD's snapshot reader matches a
  register by the name before the parenthesis;
- ``trace.ini``: the captured buffers (``[trace_buffers] buffers=...``,
  one section per buffer with its file and ``format``: ``coresight`` for
  frame-formatted ETB/ETF/ETR data, ``source_data`` for one source's raw
  bytes, ``dstream_coresight`` for DSTREAM captures), which source feeds
  which buffer (``[source_buffers]``) and which trace unit traces which core
  (``[core_trace_sources]``).

:func:`write_snapshot` and :func:`read_snapshot` convert between such a
directory and a :class:`Snapshot`; buffers' bytes are files beside the ini
files.  A bad directory is one :class:`SnapshotError` naming the file and
what is wrong.
"""

from __future__ import annotations

import configparser
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Buffer", "Device", "Snapshot", "SnapshotError", "read_snapshot", "write_snapshot"]

_REG = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(?:\(([^()]*)\))?\s*$")
_NUM = re.compile(r"^(0x[0-9A-Fa-f]+|\d+)$")


class SnapshotError(ValueError):
    """A snapshot directory that cannot be read, naming the file."""


@dataclass
class Device:
    """One device: a core or a trace source, with its registers."""

    name: str
    type: str
    cls: str = "trace_source"
    #: register name -> value; names as the trace unit's (``TRCCONFIGR``)
    regs: dict[str, int] = field(default_factory=dict)
    #: register name -> offset, written as ``NAME(0xOFF)`` when known
    offsets: dict[str, int] = field(default_factory=dict)


@dataclass
class Buffer:
    """One captured buffer: its bytes and how they are framed."""

    name: str
    data: bytes
    format: str = "coresight"
    file: str = ""


@dataclass
class Snapshot:
    devices: list[Device] = field(default_factory=list)
    buffers: list[Buffer] = field(default_factory=list)
    #: trace source name -> buffer name
    source_buffers: dict[str, str] = field(default_factory=dict)
    #: core name -> trace source name
    core_trace_sources: dict[str, str] = field(default_factory=dict)

    def device(self, name: str) -> Device:
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(name)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def source_data(self, source: str) -> Buffer:
        """The buffer a trace source writes into."""
        return self.buffer(self.source_buffers[source])


def _ini() -> configparser.ConfigParser:
    # '=' only: DS-5's register keys hold ':' (``PC(size:64)=...``)
    p = configparser.ConfigParser(interpolation=None, strict=False, delimiters=("=",))
    p.optionxform = str  # register and device names keep their case
    return p


def _write_ini(path: Path, p: configparser.ConfigParser) -> None:
    with path.open("w") as f:
        p.write(f, space_around_delimiters=False)


def write_snapshot(directory: str | Path, snap: Snapshot) -> Path:
    """Write ``snap`` as an OpenCSD snapshot directory; returns the directory."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    top = _ini()
    top["snapshot"] = {"version": "1.0"}
    top["device_list"] = {}
    for i, dev in enumerate(snap.devices):
        fname = f"device_{i}.ini"
        top["device_list"][f"device{i}"] = fname
        d = _ini()
        d["device"] = {"name": dev.name, "class": dev.cls, "type": dev.type}
        d["regs"] = {}
        for reg, value in dev.regs.items():
            off = dev.offsets.get(reg)
            key = f"{reg}(0x{off:03X})" if off is not None else reg
            d["regs"][key] = f"0x{value:08X}"
        _write_ini(root / fname, d)
    top["trace"] = {"metadata": "trace.ini"}
    _write_ini(root / "snapshot.ini", top)
    tr = _ini()
    names = [b.name for b in snap.buffers]
    tr["trace_buffers"] = {"buffers": ",".join(f"buffer{i}" for i in range(len(names)))}
    for i, buf in enumerate(snap.buffers):
        fname = buf.file or f"{buf.name}.bin"
        (root / fname).write_bytes(bytes(buf.data))
        tr[f"buffer{i}"] = {"name": buf.name, "file": fname, "format": buf.format}
    tr["source_buffers"] = dict(snap.source_buffers)
    tr["core_trace_sources"] = dict(snap.core_trace_sources)
    _write_ini(root / "trace.ini", tr)
    return root


def _read_ini(path: Path) -> configparser.ConfigParser:
    p = _ini()
    try:
        with path.open() as f:
            p.read_file(f)
    except OSError as e:
        raise SnapshotError(f"{path}: {e.strerror or e}") from None
    except configparser.Error as e:
        raise SnapshotError(f"{path}: {e.message.splitlines()[0]}") from None
    return p


def _int(text: str, where: str) -> int:
    try:
        return int(text.strip().strip("\"'"), 0)
    except ValueError:
        raise SnapshotError(f"{where}: {text.strip()!r} is not a number") from None


def _reg_key(key: str, where: str) -> tuple[str, int | None]:
    """A ``[regs]`` key's register name and offset (None: not given):
    ``NAME``, ``NAME(0xOFF)``, or DS-5's ``NAME(id:0xN[,size:64])``."""
    m = _REG.match(key)
    if m:
        inner = m.group(2)
        if inner is None:
            return m.group(1), None
        inner = inner.strip()
        if _NUM.match(inner):
            return m.group(1), int(inner, 0)
        attrs: dict[str, str] = {}
        for part in inner.split(","):
            name, sep, value = part.partition(":")
            if not sep or not name.strip() or not value.strip():
                break
            attrs[name.strip().lower()] = value.strip()
        else:
            ident = attrs.get("id")
            if ident is None:
                return m.group(1), None
            if _NUM.match(ident):
                return m.group(1), 4 * int(ident, 0)
    raise SnapshotError(
        f"{where}: register {key!r} is not NAME, NAME(0xOFF) or NAME(id:0xN,size:N)"
    )


def read_snapshot(directory: str | Path) -> Snapshot:
    """Read an OpenCSD snapshot directory (devices, registers, buffers)."""
    root = Path(directory)
    top_path = root / "snapshot.ini"
    top = _read_ini(top_path)
    snap = Snapshot()
    if not top.has_section("device_list"):
        raise SnapshotError(f"{top_path}: no [device_list] section")
    for _, fname in top.items("device_list"):
        dpath = root / fname.strip()
        d = _read_ini(dpath)
        if not d.has_section("device"):
            raise SnapshotError(f"{dpath}: no [device] section")
        info = d["device"]
        dev = Device(
            name=info.get("name", dpath.stem).strip(),
            type=info.get("type", "").strip(),
            cls=info.get("class", "trace_source").strip(),
        )
        if d.has_section("regs"):
            for key, value in d.items("regs"):
                name, off = _reg_key(key, str(dpath))
                dev.regs[name] = _int(value, f"{dpath}: {key}")
                if off is not None:
                    dev.offsets[name] = off
        snap.devices.append(dev)
    meta = top.get("trace", "metadata", fallback="trace.ini").strip()
    tpath = root / meta
    if not tpath.exists():
        return snap
    tr = _read_ini(tpath)
    if tr.has_section("trace_buffers"):
        for sect in (s.strip() for s in tr["trace_buffers"].get("buffers", "").split(",")):
            if not sect:
                continue
            if not tr.has_section(sect):
                raise SnapshotError(f"{tpath}: buffer section [{sect}] is missing")
            b = tr[sect]
            fname = b.get("file", "").strip()
            try:
                data = (root / fname).read_bytes()
            except OSError as e:
                raise SnapshotError(
                    f"{tpath}: [{sect}] file {fname!r}: {e.strerror or e}"
                ) from None
            snap.buffers.append(
                Buffer(
                    name=b.get("name", sect).strip(),
                    data=data,
                    format=b.get("format", "coresight").strip(),
                    file=fname,
                )
            )
    if tr.has_section("source_buffers"):
        snap.source_buffers = {k: v.strip() for k, v in tr.items("source_buffers")}
    if tr.has_section("core_trace_sources"):
        snap.core_trace_sources = {k: v.strip() for k, v in tr.items("core_trace_sources")}
    return snap
