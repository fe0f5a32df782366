"""CTF traces as an event source, through babeltrace2's Python bindings.

``bt2`` (Debian's python3-bt2) reads the trace with its ``ctf.fs`` source;
each event's payload is packed into a record (:func:`~hwtrace.filter.packing.pack_many`)
laid out from bt2's field classes, and its context (``cpu_id``, ``vpid``,
``vtid``, ``procname``) from the packet, common and specific contexts.
bt2 hands events over one by one as Python values, so this adapter, unlike
the perf.data and ftrace ones, does Python work per event.
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .. import schema as S
from ..errors import FilterError
from ..packing import pack_many
from .base import EventSource, EventType, StreamError, contexts


def import_bt2() -> Any:
    """babeltrace2's Python bindings, also from Debian's python3-bt2 when
    this interpreter is a virtualenv of the same Python version.  Raises
    ImportError with what to install."""
    try:
        import bt2  # type: ignore[import-not-found]

        return bt2
    except ImportError:
        pass
    # Debian's package, for the same Python version as this interpreter.
    d = "/usr/lib/python3/dist-packages"
    version = f"{sys.version_info.major}{sys.version_info.minor}"
    if list(Path(d, "bt2").glob(f"_native_bt.cpython-{version}-*.so")):
        sys.path.append(d)
        try:
            import bt2  # type: ignore[import-not-found]

            return bt2
        except ImportError:
            sys.path.remove(d)
    raise ImportError(
        "babeltrace2's Python bindings (bt2) are not importable: install python3-bt2 "
        f"(Debian) for Python {sys.version_info.major}.{sys.version_info.minor}"
    )


def _bytes_for(values: int) -> int:
    return next(n for n in (1, 2, 4, 8) if values <= 8 * n)


def _bt2_type(bt2: Any, fc: Any) -> S.Type | None:
    """A schema type for a bt2 field class (None: not representable)."""
    if isinstance(fc, bt2._BoolFieldClassConst):
        return S.IntType(1, False)
    if isinstance(fc, bt2._IntegerFieldClassConst):
        signed = isinstance(fc, bt2._SignedIntegerFieldClassConst)
        return S.IntType(_bytes_for(fc.field_value_range), signed)
    if isinstance(fc, bt2._RealFieldClassConst):
        # bt2 2.0: one class with is_single_precision; 2.1: two classes.
        single = getattr(bt2, "_SinglePrecisionRealFieldClassConst", None)
        if getattr(fc, "is_single_precision", False) or (single and isinstance(fc, single)):
            return S.FloatType(4)
        return S.FloatType(8)
    if isinstance(fc, bt2._StringFieldClassConst):
        return S.StringType("ptr")
    if isinstance(fc, bt2._StructureFieldClassConst):
        members = []
        for name in fc:
            t = _bt2_type(bt2, fc[name].field_class)
            if t is not None:
                members.append((name, t))
        return S.layout(members)
    if isinstance(fc, bt2._StaticArrayFieldClassConst):
        el = _bt2_type(bt2, fc.element_field_class)
        return S.ArrayType(el, fc.length) if el is not None else None
    if isinstance(fc, bt2._DynamicArrayFieldClassConst):
        el = _bt2_type(bt2, fc.element_field_class)
        # The length field is not kept apart: the elements go after the
        # record with their byte count (a data_loc sequence).
        return S.SequenceType(el, "data_loc") if el is not None else None
    return None  # variants, options, bit arrays


def _bt2_value(bt2: Any, f: Any, t: S.Type) -> Any:
    if isinstance(t, S.StructType):
        return {m.name: _bt2_value(bt2, f[m.name], m.type) for m in t.fields}
    if isinstance(t, (S.ArrayType, S.SequenceType)):
        return [_bt2_value(bt2, x, t.element) for x in f]
    if isinstance(t, S.StringType):
        return str(f)
    if isinstance(t, S.FloatType):
        return float(f)
    return int(f)


class CtfSource(EventSource):
    """A CTF trace (or a directory of them) through bt2 (see the module doc)."""

    def __init__(self, path: str) -> None:
        bt2 = import_bt2()
        try:
            # ctf.fs on the trace directories themselves: babeltrace2 2.0's
            # auto-discovery aborts the process on a bad metadata file.
            root = Path(path)
            dirs = (
                [root]
                if (root / "metadata").is_file()
                else sorted({m.parent for m in root.rglob("metadata")})
            )
            fs_class = bt2.find_plugin("ctf").source_component_classes["fs"]
            spec = bt2.ComponentSpec(fs_class, {"inputs": [str(d) for d in dirs]})
            it = bt2.TraceCollectionMessageIterator(spec)
            by_name: dict[str, list[int]] = {}
            schemas: dict[str, S.Schema] = {}
            values: dict[str, list[dict[str, Any]]] = {}
            time: list[int] = []
            cpu: list[int] = []
            pid: list[int] = []
            tid: list[int] = []
            comm: list[int] = []
            comms: list[str] = []
            comm_index: dict[str, int] = {}
            clock_ns: list[int] = []
            clock: list[int] = []
            clocks: list[str] = []
            clock_index: dict[tuple, int] = {}
            extra: list[dict[str, Any]] = []
            for msg in it:
                if type(msg) is not bt2._EventMessageConst:
                    continue
                ev = msg.event
                name = ev.name
                schema = schemas.get(name)
                if schema is None:
                    pfc = ev.cls.payload_field_class
                    st = _bt2_type(bt2, pfc) if pfc is not None else None
                    schema = schemas[name] = S.Schema(name, st or S.layout([]))
                row = {}
                if ev.payload_field is not None:
                    row = _bt2_value(bt2, ev.payload_field, schema.struct)
                by_name.setdefault(name, []).append(len(time))
                values.setdefault(name, []).append(row)
                try:
                    snap = msg.default_clock_snapshot
                    time.append(int(snap.ns_from_origin))
                    cc = snap.clock_class
                    key = (cc.name, cc.frequency, cc.offset.seconds, cc.offset.cycles, cc.uuid)
                    k = clock_index.get(key)
                    if k is None:
                        k = clock_index[key] = len(clocks)
                        clocks.append(str(cc.name or ""))
                    clock.append(k)
                    clock_ns.append(int(snap.value) * 1_000_000_000 // int(cc.frequency))
                except (bt2.NonexistentClockSnapshot, AttributeError, ValueError):
                    time.append(-1)
                    clock.append(-1)
                    clock_ns.append(-1)
                extra.append(_bt2_extra_context(ev))
                ctx = _bt2_context(ev)
                cpu.append(ctx.get("cpu_id", -1))
                pid.append(ctx.get("vpid", ctx.get("pid", -1)))
                tid.append(ctx.get("vtid", ctx.get("tid", -1)))
                procname = ctx.get("procname")
                if procname is None:
                    comm.append(-1)
                else:
                    comm.append(comm_index.setdefault(procname, len(comms)))
                    if comm[-1] == len(comms):
                        comms.append(procname)
        except bt2._Error as e:
            raise StreamError(str(path), f"babeltrace2 cannot read it: {_bt2_message(e)}") from None
        columns = [np.array(c, np.int64) for c in (time, cpu, pid, tid, comm)]
        t_time, t_cpu, t_pid, t_tid, t_comm = columns
        contexts_, ctx_rows = contexts(t_pid, t_tid, t_cpu, t_comm, comms)
        types = []
        keep: list[Any] = []
        for name, rows in by_name.items():
            try:
                batch = pack_many(schemas[name], values[name])
            except FilterError as e:
                raise StreamError(str(path), f"event {name}: {e}") from None
            keep.append(batch)
            types.append(EventType(name, schemas[name], np.array(rows, np.int64), batch.addresses))
        super().__init__(
            "ctf", str(path), types, t_time, t_cpu, t_tid, t_comm, comms, contexts_, None, [], [],
            keep,
        )  # fmt: skip
        self.values = values
        self.context_rows = ctx_rows
        # Each event's time on its own clock (ns from the clock's zero, not
        # from the origin its metadata offsets it to: LTTng's "monotonic" is
        # CLOCK_MONOTONIC), that clock's name, and its other context fields
        # (LTTng's ``ip``, ``vpid``...).
        self.clock_ns = np.array(clock_ns, np.int64)
        self.clock = np.array(clock, np.int64)
        self.clocks = clocks
        self.extra_contexts = extra


def _bt2_context(ev: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    packet = ev.packet if ev.stream.cls.supports_packets else None
    pc = packet.context_field if packet is not None else None
    for f in (pc, ev.common_context_field, ev.specific_context_field):
        if f is None:
            continue
        for key in ("cpu_id", "vpid", "pid", "vtid", "tid"):
            if key in f and key not in out:
                out[key] = int(f[key])
        if "procname" in f and "procname" not in out:
            out["procname"] = str(f["procname"])
    return out


_STANDARD_CONTEXT = {"cpu_id", "vpid", "pid", "vtid", "tid", "procname"}


def _bt2_extra_context(ev: Any) -> dict[str, Any]:
    """An event's context fields other than the ones of :func:`_bt2_context`."""
    out: dict[str, Any] = {}
    for f in (ev.common_context_field, ev.specific_context_field):
        if f is None:
            continue
        for key, value in f.items():
            if key not in _STANDARD_CONTEXT and key not in out:
                out[key] = _bt2_plain(value)
    return out


def _bt2_plain(value: Any) -> Any:
    """A bt2 field value as a plain Python value."""
    if isinstance(value, numbers.Integral):  # bt2's integer and bool fields are
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return str(value)


def _bt2_message(e: Any) -> str:
    """The first (innermost) cause babeltrace2 gives, on one line."""
    for cause in e:
        text = str(getattr(cause, "message", "")).strip()
        if text:
            return text.splitlines()[0]
    return (str(e).strip().splitlines() or ["unknown error"])[0]


def render_ctf_listing(source: EventSource, keep: np.ndarray, json: bool) -> Iterator[bytes]:
    """CTF events come from bt2 as Python values, one by one; they are
    listed from those values (bt2 already costs Python work per event)."""
    import json as _json

    values: dict[str, list[dict[str, Any]]] = source.values  # type: ignore[attr-defined]
    where: dict[int, tuple[str, int]] = {}
    for t in source.types:
        for j, row in enumerate(t.rows.tolist()):
            where[row] = (t.name, j)
    lines = []
    for i in np.flatnonzero(keep).tolist():
        name, j = where[i]
        c = int(source.comm[i])
        comm = source.comms[c] if c >= 0 else ""
        row = values[name][j]
        if json:
            lines.append(
                _json.dumps(
                    {
                        "time": int(source.time[i]),
                        "cpu": int(source.cpu[i]),
                        "tid": int(source.tid[i]),
                        "comm": comm,
                        "event": name,
                        "fields": row,
                    },
                    separators=(",", ":"),
                )
            )
        else:
            ts = int(source.time[i])
            stamp = f"{ts // 1_000_000_000:6d}.{ts % 1_000_000_000:09d}" if ts >= 0 else "-"
            fields = " ".join(f"{k}={_ctf_text(v)}" for k, v in row.items())
            lines.append(
                f"{comm:>16}-{int(source.tid[i]):<7} [{int(source.cpu[i]):03d}] {stamp}: "
                f"{name}: {fields}".rstrip()
            )
    if lines:
        yield ("\n".join(lines) + "\n").encode()


def _ctf_text(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}={_ctf_text(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_ctf_text(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)
    return str(v)
