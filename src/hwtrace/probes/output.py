"""Where recorded tracepoint events go: JSON lines, a CTF trace or perf.data.

All are written from whole drained batches with numpy (string columns
built by ``astype`` and ``np.char``; CTF records packed by
:class:`~hwtrace.export.ctf.CtfWriter`; perf SAMPLE records as one
structured array), never one event at a time.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..export.ctf import CtfWriter, EventClass
from ..image.process import Mapping, ProcessModules
from ..perf.attr import PerfEventAttr
from ..perf.records import (
    Comm,
    LostSamples,
    Mmap2,
    RecordType,
    SampleId,
    SampleType,
    pack_record,
    sample_dtype,
)
from ..perf.writer import CLOCK_MONOTONIC, PerfDataWriter, host_env
from .locate import resolve
from .plan import EXIT_REGS
from .rings import NREGS, Clock

__all__ = ["EventOutput", "PerfData", "ProbeInfo", "open_output"]

KIND_NAMES = ("hit", "return")


@dataclass(frozen=True)
class ProbeInfo:
    """What the events of tracepoint ``id`` carry: its name and registers."""

    id: int
    name: str
    regs: tuple[str, ...]
    address: int = 0  # the tracepoint's site (0: resolve ``name`` in the process)


class EventOutput:
    """Base: ``write`` a drained batch, ``close`` at the end."""

    count = 0

    probes: dict[int, ProbeInfo]

    def add_probe(self, info: ProbeInfo) -> None:
        """A tracepoint placed after the output was opened."""
        self.probes[info.id] = info

    def write(self, events: np.ndarray, clock: Clock, lost: int = 0) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class JsonLines(EventOutput):
    def __init__(self, path: str, probes: Sequence[ProbeInfo]) -> None:
        self.file = open(path, "w")
        self.probes = {p.id: p for p in probes}
        self.count = 0

    def write(self, events: np.ndarray, clock: Clock, lost: int = 0) -> None:
        if not events.shape[0]:
            return
        ns = clock.to_ns(events["tsc"])
        lines = np.full(events.shape[0], "", dtype=object)
        keys = np.unique(np.stack([events["probe"], events["kind"]], axis=1), axis=0)
        for pid, kind_value in keys.tolist():
            sel = (events["probe"] == pid) & (events["kind"] == kind_value)
            ev = events[sel]
            info = self.probes.get(pid, ProbeInfo(pid, f"probe{pid}", ()))
            regs = EXIT_REGS if kind_value == 1 else info.regs
            kind = '"return"' if kind_value == 1 else '"hit"'
            s = np.char.add('{"time_ns": ', ns[sel].astype(str))
            s = np.char.add(s, ', "tsc": ')
            s = np.char.add(s, ev["tsc"].astype(str))
            s = np.char.add(s, ', "cpu": ')
            s = np.char.add(s, ev["cpu"].astype(str))
            s = np.char.add(s, ', "tid": ')
            s = np.char.add(s, ev["tid"].astype(str))
            s = np.char.add(s, f', "probe": {pid}, "name": "{info.name}", "kind": ')
            s = np.char.add(s, kind)
            for i, reg in enumerate(regs):
                s = np.char.add(s, f', "{reg}": ')
                s = np.char.add(s, ev["regs"][:, i].astype(str))
            lines[sel] = np.char.add(s, "}\n")
        self.file.write("".join(lines.tolist()))
        self.count += events.shape[0]

    def close(self) -> None:
        self.file.close()


class Ctf(EventOutput):
    def __init__(self, path: str, probes: Sequence[ProbeInfo], pid: int) -> None:
        self.classes: dict[tuple[int, int], EventClass] = {}
        self.probes = {}
        for p in probes:
            self._classes_of(p)
        self.writer = CtfWriter(path, list(self.classes.values()),
                                env={"domain": "ust", "tracer_name": "hwtrace", "vpid": pid})  # fmt: skip
        self.count = 0

    def _classes_of(self, p: ProbeInfo) -> list[EventClass]:
        self.probes[p.id] = p
        out = []
        for kind in range(len(KIND_NAMES)):
            cid = len(self.classes)
            name = f"hwtrace_probe:{_ident(p.name)}" + ("_return" if kind else "")
            regs = p.regs if kind == 0 else EXIT_REGS
            fields = (("tid", 32), ("probe", 32), *((r, 64) for r in regs))
            c = EventClass(cid, name, fields, frozenset(regs))
            self.classes[(p.id, kind)] = c
            out.append(c)
        return out

    def add_probe(self, info: ProbeInfo) -> None:
        self.writer.add_classes(self._classes_of(info))

    def write(self, events: np.ndarray, clock: Clock, lost: int = 0) -> None:
        if not events.shape[0]:
            return
        ns = clock.to_ns(events["tsc"]).astype(np.uint64)
        class_id = np.zeros(events.shape[0], np.int64)
        for (pid, kind), c in self.classes.items():
            class_id[(events["probe"] == pid) & (events["kind"] == kind)] = c.id
        for cpu in np.unique(events["cpu"]).tolist():
            on = events["cpu"] == cpu
            ev, ids = events[on], class_id[on]
            payload = {}
            for (pid, kind), c in self.classes.items():
                sel = ids == c.id
                if not sel.any():
                    continue
                rows = np.zeros(int(sel.sum()), c.dtype)
                rows["tid"] = ev["tid"][sel]
                rows["probe"] = pid
                regs = EXIT_REGS if kind else self.probes[pid].regs
                for i, reg in enumerate(regs):
                    rows[reg] = ev["regs"][sel][:, i]
                payload[c.id] = rows
            self.writer.write(int(cpu), ns[on], ids, payload, discarded=lost)
            lost = 0
        self.count += events.shape[0]

    def close(self) -> None:
        self.writer.close()


# perf's x86 register numbers (arch/x86/include/uapi/asm/perf_regs.h): the
# bits of sample_regs_user, and the order a sample carries the registers in.
PERF_REGS_X86 = {
    "rax": 0, "rbx": 1, "rcx": 2, "rdx": 3, "rsi": 4, "rdi": 5, "rbp": 6, "rsp": 7,
    "rip": 8, **{f"r{i}": i + 8 for i in range(8, 16)},
}  # fmt: skip
_REGS_ABI_64 = 2  # PERF_SAMPLE_REGS_ABI_64
_MISC_USER = 2  # PERF_RECORD_MISC_USER
_TYPE_BREAKPOINT, _HW_BREAKPOINT_X = 5, 4  # PERF_TYPE_BREAKPOINT, an execute breakpoint
_EVENT_UPDATE_NAME = 2  # PERF_EVENT_UPDATE__NAME
_SAMPLE_TYPE = (
    SampleType.IDENTIFIER | SampleType.IP | SampleType.TID | SampleType.TIME
    | SampleType.CPU | SampleType.PERIOD | SampleType.REGS_USER
)  # fmt: skip
# A SAMPLE record of _SAMPLE_TYPE with every register; a record ends after
# its event's registers.
_SAMPLE = sample_dtype(_SAMPLE_TYPE, NREGS)
_SAMPLE_HEAD = _SAMPLE.itemsize - 8 * NREGS


class PerfData(EventOutput):
    """perf.data that ``perf script`` and ``perf report`` read.

    One event per tracepoint, ``hwtrace_probe:NAME``, and one for its
    returns, ``hwtrace_probe:NAME__return`` (as ``perf probe`` names a
    return probe), named through the EVENT_DESC feature: an execute
    breakpoint at the tracepoint's address, which is what a tracepoint is
    (a tracepoint-typed event would need the kernel's tracing data).  Each
    hit is a SAMPLE at that address with thread, CPU, CLOCK_MONOTONIC time
    (``use_clockid``) and the recorded registers as user registers
    (``perf script -F +uregs``).  COMM and MMAP2 records for the process,
    read from ``/proc`` when the output is opened, let perf name threads
    and symbolize addresses; a thread seen later gets a COMM before its
    first sample, a tracepoint added later its event in the data
    (HEADER_ATTR and EVENT_UPDATE, as perf's pipe mode announces events)."""

    def __init__(self, path: str, probes: Sequence[ProbeInfo], pid: int) -> None:
        self.pid = pid
        self.probes = {p.id: p for p in probes}  # the CLI adds the ones placed later
        self.count = 0
        self._lost = 0
        self._modules: ProcessModules | None = None
        self._mapped: set[tuple[int, int, str]] = set()
        self._threads: set[int] = set()
        self._classes: dict[int, tuple[int, int, int, tuple[int, ...]]] = {}
        self._table: tuple[np.ndarray, ...] | None = None
        self._started = False
        names = [p.name for p in probes]
        self.writer = PerfDataWriter(
            path, cmdline=["hwtrace", "probe", *names, "-p", str(pid), "-o", path], **host_env()
        )
        maps = self._read_maps()
        for p in probes:
            for kind in range(len(KIND_NAMES)):
                self._declare(p, kind, 0)
        self.writer.set_monotonic_clock()
        # What perf record synthesizes from /proc at its start (time 0).
        try:
            tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        except OSError:
            tids = []
        self._name = _comm(pid, pid) or f":{pid}"
        for tid in [pid, *(t for t in tids if t != pid)]:
            self._comm(tid, 0)
        self._mmaps(maps, 0)
        self.writer.finished_init()
        self._started = True

    # -- events ----------------------------------------------------------------

    def _declare(self, p: ProbeInfo, kind: int, ns: int) -> None:
        """Add the event of tracepoint ``p``'s hits (``kind`` 0) or returns."""
        if self._started:
            # A tracepoint placed since: its code may be in a library mapped since.
            self._mmaps(self._read_maps(), ns)
        regs = EXIT_REGS if kind else p.regs
        bits = [PERF_REGS_X86[r] for r in regs]
        address = p.address
        if not address and self._modules is not None and p.id in self.probes:
            try:
                address = resolve(self._modules, p.name).address
            except (ValueError, OSError):
                pass
        attr = PerfEventAttr(
            type=_TYPE_BREAKPOINT, bp_type=_HW_BREAKPOINT_X, config1=address, config2=8,
            sample_period=1, sample_type=int(_SAMPLE_TYPE),
            sample_regs_user=sum(1 << b for b in bits), sample_id_all=1,
            exclude_kernel=1, exclude_hv=1, use_clockid=1, clockid=CLOCK_MONOTONIC,
        )  # fmt: skip
        if not self._classes:
            # The event the sideband belongs to, as perf record's first.
            attr.comm = attr.mmap = attr.mmap2 = attr.task = attr.comm_exec = 1
        name = f"hwtrace_probe:{_ident(p.name)}" + ("__return" if kind else "")
        sid = len(self._classes) + 1
        if self._started:
            # Too late for the header's attrs: perf takes the event from a
            # HEADER_ATTR (the attr at perf's own size, then the IDs) and its
            # name from an EVENT_UPDATE, as in a pipe-mode recording.
            body = attr.pack(self.writer.attr_size) + struct.pack("<Q", sid)
            self.writer.add_bytes(pack_record(body, type=RecordType.HEADER_ATTR))
            text = name.encode()
            text += bytes(8 - len(text) % 8)
            update = struct.pack("<QQ", _EVENT_UPDATE_NAME, sid) + text
            self.writer.add_bytes(pack_record(update, type=RecordType.EVENT_UPDATE))
        else:
            self.writer.add_attr(attr, [sid], name)
        # Without an address, the recorded rip (the site) is the sample's IP.
        rip = regs.index("rip") if not address and "rip" in regs else -1
        order = tuple(sorted(range(len(regs)), key=bits.__getitem__))
        self._classes[p.id * 2 + kind] = (sid, address, rip, order)
        self._table = None

    def _lookup(self, keys: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per event (``keys``: probe * 2 + kind): its sample ID, address,
        the column of its recorded rip (-1: none), its register count and
        the columns of its registers in perf's order."""
        if self._table is None:
            known = np.array(sorted(self._classes), np.int64)
            rows = [self._classes[k] for k in known.tolist()]
            perm = np.zeros((len(rows), NREGS), np.int64)
            for i, r in enumerate(rows):
                perm[i, : len(r[3])] = r[3]
            self._table = (
                known,
                np.array([r[0] for r in rows], np.uint64),
                np.array([r[1] for r in rows], np.uint64),
                np.array([r[2] for r in rows], np.int64),
                np.array([len(r[3]) for r in rows], np.int64),
                perm,
            )
        known, *columns = self._table
        at = np.searchsorted(known, keys)
        return tuple(c[at] for c in columns)

    # -- sideband --------------------------------------------------------------

    def _read_maps(self) -> list[Mapping]:
        try:
            self._modules = ProcessModules(self.pid)
        except OSError:  # the process is gone
            return []
        return self._modules.maps

    def _comm(self, tid: int, ns: int) -> None:
        # A thread gone by now has the name it inherited, as likely as not.
        comm = _comm(self.pid, tid) or self._name
        sid = SampleId(pid=self.pid, tid=tid, time=ns, cpu=0)
        self.writer.add_record(Comm(self.pid, tid, comm), sample_id=sid)
        self._threads.add(tid)

    def _mmaps(self, maps: list[Mapping], ns: int) -> None:
        """MMAP2 records for the executable mappings not written yet."""
        sid = SampleId(pid=self.pid, tid=self.pid, time=ns, cpu=0)
        for m in maps:
            if not m.executable or not (m.path.startswith("/") or m.path == "[vdso]"):
                continue
            if (m.start, m.end, m.path) in self._mapped:
                continue
            self._mapped.add((m.start, m.end, m.path))
            prot = sum(bit for ch, bit in (("r", 1), ("w", 2), ("x", 4)) if ch in m.prot)
            flags = 0x1 if m.prot.endswith("s") else 0x2  # MAP_SHARED, MAP_PRIVATE
            body = Mmap2(self.pid, self.pid, m.start, m.length, m.offset, ino=m.inode,
                         prot=prot, flags=flags, filename=m.path)  # fmt: skip
            self.writer.add_record(body, sample_id=sid, misc=_MISC_USER)

    # -- batches ---------------------------------------------------------------

    def write(self, events: np.ndarray, clock: Clock, lost: int = 0) -> None:
        n = events.shape[0]
        ns = np.maximum(clock.to_ns(events["tsc"]), 0).astype(np.uint64)
        # Records about this batch come just before its first event.
        before = max(int(ns[0]) - 1, 0) if n else time.monotonic_ns()
        if lost > self._lost:
            # ``lost`` counts from the start; perf adds up LOST_SAMPLES records.
            sid = SampleId(pid=self.pid, tid=self.pid, time=before, cpu=0)
            self.writer.add_record(LostSamples(lost - self._lost), sample_id=sid)
            self._lost = lost
        if not n:
            return
        keys = events["probe"].astype(np.int64) * 2 + (events["kind"] != 0)
        for key in np.unique(keys).tolist():
            if key not in self._classes:
                probe = key // 2
                info = self.probes.get(probe, ProbeInfo(probe, f"probe{probe}", ()))
                self._declare(info, key % 2, before)
        tid = np.where(events["tid"] == 0, self.pid, events["tid"]).astype(np.uint32)
        seen = np.fromiter(self._threads, np.uint32, len(self._threads))
        for t in np.setdiff1d(tid, seen).tolist():
            self._comm(t, before)
        ids, addrs, rips, nregs, perm = self._lookup(keys)
        regs = events["regs"]
        rec = np.zeros(n, _SAMPLE)
        rec["type"] = RecordType.SAMPLE
        rec["misc"] = _MISC_USER
        rec["size"] = _SAMPLE_HEAD + 8 * nregs
        rec["identifier"] = ids
        rec["ip"] = np.where(rips >= 0, regs[np.arange(n), np.maximum(rips, 0)], addrs)
        rec["pid"] = self.pid
        rec["tid"] = tid
        rec["time"] = ns
        rec["cpu"] = events["cpu"]
        rec["period"] = 1
        rec["abi"] = _REGS_ABI_64
        rec["regs"] = np.take_along_axis(regs, perm, axis=1)
        # Each record cut to its size (whole u64s): the rows' words under a mask.
        words = rec.view(np.uint64).reshape(n, _SAMPLE.itemsize // 8)
        keep = np.arange(_SAMPLE.itemsize // 8) < (rec["size"] // 8)[:, None]
        self.writer.add_bytes(words[keep].tobytes())
        # Batches follow each other in time: perf may sort and deliver what
        # came before this point (FINISHED_ROUND, perf.data-file-format.txt).
        self.writer.finished_round()
        self.count += n

    def close(self) -> None:
        self.writer.close()


def _comm(pid: int, tid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().rstrip("\n")
    except OSError:
        return None


def _ident(name: str) -> str:
    out = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return out or "probe"


def open_output(path: str, probes: Sequence[ProbeInfo], pid: int) -> EventOutput:
    """JSON lines for ``*.jsonl``; perf.data for ``*.data``; otherwise a CTF
    trace in directory ``path``."""
    if path.endswith(".jsonl"):
        return JsonLines(path, probes)
    if path.endswith(".data"):
        if os.path.isdir(path):
            raise ValueError(f"{path}: is a directory (perf.data output is a file)")
        return PerfData(path, probes, pid)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{path}: exists and is not a directory (CTF output is a directory; "
                         "name the file *.jsonl for JSON lines)")  # fmt: skip
    return Ctf(path, probes, pid)
