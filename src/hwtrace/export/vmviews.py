"""Views of a VM analysis (:mod:`hwtrace.analysis.vm`): the thesis's *VM
Resource* view (a row per vCPU, and per pCPU) and *VM Control Flow* view
(a row per guest process), as a self-contained HTML time graph
(:func:`vm_page`) and as a Chrome trace-event timeline for Perfetto
(:func:`write_vm_timeline`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..analysis.vm import ENT_PCPU, ENT_PROCESS, ENT_VCPU, STATE_NAMES, VmAnalysis
from .html import page
from .timeline import write_timeline

__all__ = ["vm_page", "vm_rows", "write_vm_timeline"]

# VM red and VMM green, as in the thesis's figures; host blue; idle light.
COLOURS = ("#e3e6ec", "#d9534f", "#4caf50", "#5b8bd0", "#9e9e9e")


def _label(entity: int, key: int, key2: int) -> str:
    if entity == ENT_PCPU:
        return f"pCPU {key}"
    if entity == ENT_VCPU:
        return f"vCPU {key:#x}"
    return f"VM {key:#x} CR3 {key2:#x}"


def vm_rows(result: VmAnalysis) -> list[tuple[str, str, np.ndarray]]:
    """(group, row label, that row's intervals) in view order: vCPUs then
    pCPUs (VM Resource), guest processes (VM Control Flow)."""
    iv = result.intervals
    out = []
    for group, entity in (("VM Resource", ENT_VCPU), ("VM Resource", ENT_PCPU),
                          ("VM Control Flow", ENT_PROCESS)):  # fmt: skip
        mine = iv[iv["entity"] == entity]
        keys = np.unique(mine[["key", "key2"]]) if mine.shape[0] else []
        for k in keys:
            rows = mine[(mine["key"] == k["key"]) & (mine["key2"] == k["key2"])]
            out.append((group, _label(entity, int(k["key"]), int(k["key2"])), rows))
    return out


def _unit(result: VmAnalysis, tsc_hz: float) -> tuple[str, float]:
    return ("ns", 1e9 / tsc_hz) if tsc_hz else ("ticks", 1.0)


def vm_page(result: VmAnalysis, title: str, subtitle: str = "", *, tsc_hz: float = 0.0,
            top: int = 20) -> str:  # fmt: skip
    """The HTML page: both views as zoomable time graphs, facts, the
    longest exits."""
    unit, scale = _unit(result, tsc_hz)
    start = int(result.start)

    def t(v) -> float:
        return start + (int(v) - start) * scale

    groups: dict[str, list[dict]] = {}
    for group, label, rows in vm_rows(result):
        ivs = [
            [t(a), t(b), int(s)]
            for a, b, s in zip(rows["start"], rows["end"], rows["state"], strict=True)
        ]
        groups.setdefault(group, []).append({"label": label, "iv": ivs})
    ex = result.exits
    dur = (
        ex[:, 2].astype(np.int64) - ex[:, 1].astype(np.int64)
        if ex.shape[0]
        else np.zeros(0, np.int64)
    )
    order = np.argsort(-dur)[:top]
    exits = [[f"{int(ex[j, 0]):#x}", t(ex[j, 1]), float(dur[j]) * scale] for j in order]
    vcpus = len({int(k) for k in result.rows("vcpu")["key"]})
    procs = result.rows("process")
    facts = [
        ("pCPUs", str(len(result.streams))),
        ("vCPUs", str(vcpus)),
        ("guest processes", str(len({(int(a), int(b)) for a, b in zip(procs["key"], procs["key2"], strict=True)}))),
        ("VM exits", f"{result.stats['vm_exits']:,}"),
        ("gaps", str(result.stats["gaps"])),
    ]  # fmt: skip
    data = {
        "unit": unit, "start": float(start), "end": t(result.end), "states": list(STATE_NAMES),
        "colours": list(COLOURS), "groups": [{"title": g, "rows": r} for g, r in groups.items()],
        "exits": exits, "facts": facts,
    }  # fmt: skip
    return page("vm", title, subtitle, data)


def write_vm_timeline(result: VmAnalysis, path: str | Path, *, tsc_hz: float = 0.0) -> int:
    """Both views as a Chrome trace-event file (Perfetto, chrome://tracing):
    a process per view, a thread per row, a slice per interval named by its
    state.  Times are ns with ``tsc_hz``, else TSC ticks written as ns."""
    _, scale = _unit(result, tsc_hz)
    rows = vm_rows(result)
    keys, starts, ends, names = [], [], [], []
    thread_names, pid = {}, {}
    views = {"VM Resource": 1, "VM Control Flow": 2}
    for k, (group, label, iv) in enumerate(rows, start=10):
        thread_names[k] = label
        pid[k] = views[group]
        keys.append(np.full(iv.shape[0], k, np.int64))
        starts.append(((iv["start"].astype(np.float64) - result.start) * scale).astype(np.int64))
        ends.append(((iv["end"].astype(np.float64) - result.start) * scale).astype(np.int64))
        names.append(iv["state"].astype(np.int64))
    cat = np.concatenate if rows else (lambda parts: np.zeros(0, np.int64))
    return write_timeline(
        path, key=cat(keys), start=cat(starts), end=cat(ends), name=cat(names),
        names=list(STATE_NAMES), pid_of=lambda k: pid.get(k, 0), thread_names=thread_names,
        process_names={v: k for k, v in views.items()},
    )  # fmt: skip
