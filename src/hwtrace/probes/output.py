"""Where recorded tracepoint events go: JSON lines or a CTF trace.

Both are written from whole drained batches with numpy (string columns
built by ``astype`` and ``np.char``; CTF records packed by
:class:`~hwtrace.export.ctf.CtfWriter`), never one event at a time.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..export.ctf import CtfWriter, EventClass
from .rings import Clock

__all__ = ["EventOutput", "ProbeInfo", "open_output"]

KIND_NAMES = ("hit", "return")


@dataclass(frozen=True)
class ProbeInfo:
    """What the events of tracepoint ``id`` carry: its name and registers."""

    id: int
    name: str
    regs: tuple[str, ...]


class EventOutput:
    """Base: ``write`` a drained batch, ``close`` at the end."""

    count = 0

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
        for pid in np.unique(events["probe"]).tolist():
            sel = events["probe"] == pid
            ev = events[sel]
            info = self.probes.get(pid, ProbeInfo(pid, f"probe{pid}", ()))
            kind = np.where(ev["kind"] == 1, '"return"', '"hit"')
            s = np.char.add('{"time_ns": ', ns[sel].astype(str))
            s = np.char.add(s, ', "tsc": ')
            s = np.char.add(s, ev["tsc"].astype(str))
            s = np.char.add(s, ', "cpu": ')
            s = np.char.add(s, ev["cpu"].astype(str))
            s = np.char.add(s, ', "tid": ')
            s = np.char.add(s, ev["tid"].astype(str))
            s = np.char.add(s, f', "probe": {pid}, "name": "{info.name}", "kind": ')
            s = np.char.add(s, kind)
            for i, reg in enumerate(info.regs):
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
        classes = []
        for p in probes:
            for kind in range(len(KIND_NAMES)):
                cid = len(classes)
                name = f"hwtrace_probe:{_ident(p.name)}" + ("_return" if kind else "")
                fields = (("tid", 32), ("probe", 32), *((r, 64) for r in p.regs))
                c = EventClass(cid, name, fields, frozenset(p.regs))
                classes.append(c)
                self.classes[(p.id, kind)] = c
        self.writer = CtfWriter(path, classes, env={"domain": "ust", "tracer_name": "hwtrace",
                                                     "vpid": pid})  # fmt: skip
        self.probes = {p.id: p for p in probes}
        self.count = 0

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
            for (pid, _kind), c in self.classes.items():
                sel = ids == c.id
                if not sel.any():
                    continue
                rows = np.zeros(int(sel.sum()), c.dtype)
                rows["tid"] = ev["tid"][sel]
                rows["probe"] = pid
                for i, reg in enumerate(self.probes[pid].regs):
                    rows[reg] = ev["regs"][sel][:, i]
                payload[c.id] = rows
            self.writer.write(int(cpu), ns[on], ids, payload, discarded=lost)
            lost = 0
        self.count += events.shape[0]

    def close(self) -> None:
        self.writer.close()


def _ident(name: str) -> str:
    out = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return out or "probe"


def open_output(path: str, probes: Sequence[ProbeInfo], pid: int) -> EventOutput:
    """JSON lines for ``*.jsonl``; otherwise a CTF trace in directory ``path``."""
    if path.endswith(".jsonl"):
        return JsonLines(path, probes)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{path}: exists and is not a directory (CTF output is a directory; "
                         "name the file *.jsonl for JSON lines)")  # fmt: skip
    return Ctf(path, probes, pid)
