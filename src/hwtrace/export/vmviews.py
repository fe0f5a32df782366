"""Views of a VM analysis (:mod:`hwtrace.analysis.vm`): Sharma's (2017) *VM
Resource* view (a row per vCPU, and per pCPU) and *VM Control Flow* view
(a row per guest process), as a self-contained HTML time graph
(:func:`vm_page`) and as a Chrome trace-event timeline for Perfetto
(:func:`write_vm_timeline`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..analysis.vm import ENT_PCPU, ENT_PROCESS, ENT_VCPU, ENT_VM, STATE_NAMES, VmAnalysis
from ..columns import distinct
from .html import page
from .timeline import write_timeline

__all__ = ["trace_compass_xml", "vm_page", "vm_rows", "write_vm_ctf", "write_vm_timeline"]

# VM red and VMM green, as in Sharma's figures; host blue; idle light.
COLOURS = ("#e3e6ec", "#d9534f", "#4caf50", "#5b8bd0", "#9e9e9e")


# The views' rows in order: (view, entity, a row's label from its keys).
_ROWS = (
    ("VM Resource", ENT_VCPU, "vCPU {key:#x}"),
    ("VM Resource", ENT_VM, "VMM {key:#x}"),
    ("VM Resource", ENT_PCPU, "pCPU {key}"),
    ("VM Control Flow", ENT_PROCESS, "VM {key:#x} CR3 {key2:#x}"),
)


def vm_rows(result: VmAnalysis) -> list[tuple[str, str, np.ndarray]]:
    """(group, row label, that row's intervals) in view order: vCPUs, the
    VMM of each VM, pCPUs (VM Resource), guest processes (VM Control Flow)."""
    iv = result.intervals
    out = []
    for group, entity, label in _ROWS:
        mine = iv[iv["entity"] == entity]
        keys = distinct(mine[["key", "key2"]]) if mine.shape[0] else []
        for k in keys:
            rows = mine[(mine["key"] == k["key"]) & (mine["key2"] == k["key2"])]
            out.append((group, label.format(key=int(k["key"]), key2=int(k["key2"])), rows))
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
        cols = np.stack([rows["start"].astype(np.float64), rows["end"].astype(np.float64)], axis=1)
        times = (start + (cols - start) * scale).tolist()
        ivs = [[a, b, s] for (a, b), s in zip(times, rows["state"].tolist(), strict=True)]
        groups.setdefault(group, []).append({"label": label, "iv": ivs})
    ex = result.exits
    dur = (
        ex[:, 2].astype(np.int64) - ex[:, 1].astype(np.int64)
        if ex.shape[0]
        else np.zeros(0, np.int64)
    )
    order = np.argsort(-dur)[:top]
    exits = [[f"{int(ex[j, 0]):#x}", t(ex[j, 1]), float(dur[j]) * scale, result.exit_reason(int(j))]
             for j in order]  # fmt: skip
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


# -- CTF and a Trace Compass XML analysis ----------------------------------------------


def _ctf_classes():
    from .ctf import EventClass

    return (
        EventClass(
            0, "vcpu_state", (("vcpu", 64), ("state", 8), ("pcpu", 32)), frozenset({"vcpu"})
        ),
        EventClass(
            1,
            "process_state",
            (("vm", 64), ("cr3", 64), ("state", 8), ("pcpu", 32)),
            frozenset({"vm", "cr3"}),
        ),
        EventClass(2, "pcpu_state", (("pcpu", 32), ("state", 8)), frozenset()),
        EventClass(3, "vmm_state", (("vm", 64), ("state", 8), ("pcpu", 32)), frozenset({"vm"})),
    )


def write_vm_ctf(result: VmAnalysis, directory: str | Path, *, tsc_hz: float = 0.0) -> int:
    """A CTF trace of the state changes (``vcpu_state``, ``process_state``,
    ``pcpu_state``, ``vmm_state``: an event where each interval begins, on the stream of
    the pCPU it happened on), times in ns with ``tsc_hz``, else TSC ticks;
    and beside the directory ``<directory>.tracecompass.xml``, the Trace
    Compass XML analysis that turns it into the two views (outside the
    directory: CTF readers take every file in it for a stream).  Returns
    the number of events."""
    from .ctf import CtfWriter

    _, scale = _unit(result, tsc_hz)
    classes = _ctf_classes()
    iv = result.intervals
    cls = np.select([iv["entity"] == ENT_VCPU, iv["entity"] == ENT_PROCESS, iv["entity"] == ENT_VM],
                    [0, 1, 3], 2)  # fmt: skip
    iv = iv.copy()
    iv["pcpu"] = np.maximum(iv["pcpu"], 0)  # a VMM's idle tail belongs to no pCPU: the first
    ts = ((iv["start"].astype(np.float64) - result.start) * scale).astype(np.uint64)
    env = {"domain": "hwtrace-vm", "tracer_name": "hwtrace", "time_unit": "ns" if tsc_hz else "tsc"}
    with CtfWriter(directory, classes, env=env) as w:
        for pcpu in distinct(iv["pcpu"]).tolist():
            sel = np.flatnonzero(iv["pcpu"] == pcpu)
            sel = sel[np.argsort(ts[sel], kind="stable")]
            rows, cid = iv[sel], cls[sel]
            payload = {}
            for c in classes:
                mine = rows[cid == c.id]
                rec = np.zeros(mine.shape[0], c.dtype)
                for name, _ in c.fields:
                    src = {"vcpu": "key", "vm": "key", "cr3": "key2"}.get(name, name)
                    rec[name] = mine["key"] if (c.id == 2 and name == "pcpu") else mine[src]
                payload[c.id] = rec
            w.write(int(pcpu), ts[sel], cid.astype(np.uint32), payload)
    xml = Path(directory)
    xml.with_name(xml.name + ".tracecompass.xml").write_text(trace_compass_xml(), encoding="utf-8")
    return int(iv.shape[0])


def trace_compass_xml() -> str:
    """Trace Compass's XML analysis for :func:`write_vm_ctf`'s traces: a
    state provider (vCPUs/<VMCS>, VMMs/<CR3>, Processes/<VM>/<CR3>, pCPUs/<n>, each
    the state its events set) and the VM Resource and VM Control Flow time
    graph views, coloured as hwtrace's."""
    defined = "".join(
        f'\t\t<definedValue name="{name}" value="{k}" color="{COLOURS[k]}" />\n'
        for k, name in enumerate(STATE_NAMES)
    )

    def handler(event: str, path: list[str]) -> str:
        attrs = "".join(
            f'\t\t\t\t<stateAttribute type="{kind}" value="{value}" />\n'
            for kind, value in [("constant", path[0])] + [("eventField", f) for f in path[1:]]
        )
        return (f'\t\t<eventHandler eventName="{event}">\n\t\t\t<stateChange>\n{attrs}'
                '\t\t\t\t<stateValue type="eventField" value="state" />\n'
                "\t\t\t</stateChange>\n\t\t</eventHandler>\n")  # fmt: skip

    def view(vid: str, label: str, entries: str) -> str:
        return (f'\t<timeGraphView id="{vid}">\n\t\t<head>\n\t\t\t<analysis id="org.hwtrace.vm.sp" />\n'
                f'\t\t\t<label value="{label}" />\n\t\t</head>\n{defined}{entries}\t</timeGraphView>\n')  # fmt: skip

    flat = '\t\t<entry path="{}/*">\n\t\t\t<display type="self" />\n\t\t</entry>\n'
    nested = ('\t\t<entry path="Processes/*">\n\t\t\t<entry path="*">\n\t\t\t\t<display type="self" />\n'
              "\t\t\t</entry>\n\t\t</entry>\n")  # fmt: skip
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        "<!-- hwtrace vm: the VM Resource and VM Control Flow views of a CTF trace written by\n"
        "     hwtrace vm - -ctf (HAVAna state changes from a KVM host's Intel PT). -->\n"
        '<tmfxml xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        'xsi:noNamespaceSchemaLocation="xmlDefinition.xsd">\n'
        + view(
            "org.hwtrace.vm.resource", "VM Resource", flat.format("vCPUs") + flat.format("pCPUs")
        )
        + view("org.hwtrace.vm.controlflow", "VM Control Flow", nested)
        + '\t<stateProvider id="org.hwtrace.vm.sp" version="1">\n\t\t<head>\n'
        '\t\t\t<traceType id="org.eclipse.linuxtools.tmf.ui.type.ctf" />\n'
        '\t\t\t<label value="hwtrace VM analysis" />\n\t\t</head>\n'
        + defined
        + handler("vcpu_state", ["vCPUs", "vcpu"])
        + handler("process_state", ["Processes", "vm", "cr3"])
        + handler("pcpu_state", ["pCPUs", "pcpu"])
        + handler("vmm_state", ["VMMs", "vm"])
        + "\t</stateProvider>\n</tmfxml>\n"
    )
