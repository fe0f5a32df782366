"""Virtual machine analysis from Intel PT packets alone (HAVAna).

Sharma's HAVAna (thesis, ch. 6) reads a KVM host's Intel PT, traced in
system-wide mode (PT packets go on across VMX transitions), and tells
which vCPU and which guest process ran when, with no software tracing in
the guest: a VMCS packet names the vCPU a physical CPU (pCPU) loads
(``VMPTRLD``); a PIP carries the CR3 and the non-root bit at every CR3
load, VM entry and VM exit.  hwtrace does it from the packet semantics
and the full time model (TSC, TMA, MTC, CYC):

* each pCPU's stream is decoded to its PIP, VMCS and OVF packets with
  their time (:func:`stream_events`); PIP and VMCS inside PSB+ are status,
  not transitions: they set the state where it is not known (the start,
  after an overflow or a decode error) and are checked otherwise;
* the streams are merged by time and one state machine runs over them
  (:func:`analyze`), with a state per pCPU: the VMCS loaded, the non-root
  bit, the CR3.  A pCPU runs a guest (``VM``: NR=1, the vCPU loaded and
  the guest process its CR3), the hypervisor for its vCPU (``VMM``: NR=0
  and the CR3 of the VMM process that vCPU's exits return to, in its
  kernel or user page table, with any PCID) or another host task
  (``HOST``); an overflow makes it ``UNKNOWN`` until the next PSB+;
* entities: pCPUs; vCPUs, keyed by VMCS base, ``VM``, ``VMM`` or ``IDLE``
  wherever they run (they migrate); VMs, keyed by the VMM process's host
  CR3 with the PCID and KPTI bits masked (learnt from the CR3 in force
  when a vCPU is loaded, and at VM exits: once known, a vCPU's VM holds
  from the trace's start, so a trace starting in a guest puts what ran
  before the first exit in its VM); guest processes keyed by (VM, CR3
  with PCID and the KPTI bit masked), ``VM`` while one of their threads
  runs on a vCPU, ``VMM`` while the vCPU one was running on handles an
  exit, ``IDLE`` otherwise;
* each pCPU's intervals end where its trace does (its last timing packet),
  and so do those of the vCPU running there and of its guest process,
  unless another pCPU's trace shows them.

Times are TSC ticks as the time model gives them: a PIP or VMCS takes the
time of the last timing packet before it, so a boundary is known to within
one MTC period (or one CYC, with cycle-accurate mode).

Limits, as Sharma's: the VMM process's other threads (QEMU's I/O
threads) share its CR3, so they count as VMM time of the vCPU last loaded
on that pCPU; a guest's processes have no names (its CR3 is all PT says).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import aot
from ..columns import distinct, distinct_rows
from ..pt.config import PtConfig
from ..pt.kinds import Kind
from ..pt.packets import as_buffer, map_file, release
from ..pt.select import kind_mask, timed_chunks

__all__ = [
    "ENTITY_NAMES",
    "STATE_NAMES",
    "StreamEvents",
    "VmAnalysis",
    "analyze",
    "analyze_perf",
    "normalize_cr3",
    "read_bundles",
    "stream_events",
    "time_resolution",
    "write_bundles",
]

# Event kinds (a pCPU stream's packets that matter here).
EV_PIP, EV_VMCS, EV_OVF, EV_STATUS_PIP, EV_STATUS_VMCS, EV_STATUS_END, EV_GAP, EV_END = range(8)
# Entity kinds and states.
ENT_PCPU, ENT_VCPU, ENT_PROCESS, ENT_VM = range(4)
ENTITY_NAMES = ("pcpu", "vcpu", "process", "vm")
ST_IDLE, ST_VM, ST_VMM, ST_HOST, ST_UNKNOWN = range(5)
STATE_NAMES = ("IDLE", "VM", "VMM", "HOST", "UNKNOWN")

# CR3 bits 11:0 hold the PCID (with CR4.PCIDE, Intel SDM vol. 3 4.10.1); Linux's
# page-table isolation (KPTI, Documentation/arch/x86/pti.rst) gives each
# process a second, user page table 4 KiB after its kernel one (bit 12), and
# a user PCID (bit 11 set): a task runs with up to four CR3 values, one key.
_CR3_KEY_MASK = np.uint64(0xFFFFFFFFFFFFE000)


def normalize_cr3(cr3: int) -> int:
    """A process's key from any of its CR3 values (PCID and KPTI masked)."""
    return int(cr3) & int(_CR3_KEY_MASK)


@dataclass
class StreamEvents:
    """One pCPU's events: time (TSC), kind (``EV_*``), payloads (PIP: CR3 and
    NR; VMCS: base), the trace offset; and what was lost."""

    pcpu: int
    time: np.ndarray
    kind: np.ndarray
    a: np.ndarray
    b: np.ndarray
    offset: np.ndarray
    overflows: int = 0
    decode_errors: int = 0
    # The time of its last timing packet (the trace goes on to there after
    # its last event); None: that of its last event.
    end: int | None = None

    @property
    def stop(self) -> int:
        """Where this pCPU's trace ends (TSC)."""
        last = int(self.time[-1]) if self.time.shape[0] else 0
        return last if self.end is None else max(int(self.end), last)


_PSB, _PSBEND, _PIP, _VMCS, _OVF = (
    int(k) for k in (Kind.PSB, Kind.PSBEND, Kind.PIP, Kind.VMCS, Kind.OVF)
)


@aot.njit(cache=True)
def _select(kind, a, b, tsc, offset, err_rows, in_psb0, out_t, out_k, out_a, out_b, out_o):
    """The events of one chunk of packets; returns (rows, in PSB+ at the end)."""
    n = 0
    in_psb = in_psb0
    e = 0
    for i in range(kind.shape[0]):
        while e < err_rows.shape[0] and err_rows[e] <= i:
            # A decode error: what came before is cut from what follows.
            out_t[n] = tsc[i - 1] if i > 0 else 0
            out_k[n] = EV_GAP
            out_a[n] = 0
            out_b[n] = 0
            out_o[n] = offset[i] if i < offset.shape[0] else 0
            n += 1
            in_psb = False
            e += 1
        k = kind[i]
        ev = -1
        if k == _PSB:
            in_psb = True
            continue
        if k == _PSBEND:
            if in_psb:
                ev = EV_STATUS_END
            in_psb = False
        elif k == _PIP:
            ev = EV_STATUS_PIP if in_psb else EV_PIP
        elif k == _VMCS:
            ev = EV_STATUS_VMCS if in_psb else EV_VMCS
        elif k == _OVF:
            ev = EV_OVF
            in_psb = False
        if ev < 0:
            continue
        out_t[n] = tsc[i]
        out_k[n] = ev
        out_a[n] = a[i]
        out_b[n] = b[i]
        out_o[n] = offset[i]
        n += 1
    return n, in_psb


# What the analysis reads: its events and what the time model needs.
_KEEP = kind_mask((Kind.PIP, Kind.VMCS))


def stream_events(
    data, pcpu: int = 0, config: PtConfig | None = None, *, chunk_bytes: int = 4 << 20
) -> StreamEvents:
    """Decode one pCPU's PT (bytes, a numpy buffer or a file path) to its
    PIP, VMCS and OVF events with their times, a PSB-aligned chunk at a
    time (the time model carries over).  Only the packets the analysis and
    the time model need are decoded into columns; the others are skipped."""
    config = config or PtConfig()
    buf = map_file(data) if isinstance(data, (str, os.PathLike)) else as_buffer(data)
    parts = []
    in_psb = False
    overflows = errors = 0
    last_time = None  # the time model's time at the last packet: the last timing packet's
    for start, end, table, times in timed_chunks(buf, _KEEP, config, chunk_bytes):
        if times.tsc.shape[0]:
            last_time = int(times.tsc[-1])
        overflows += int(np.count_nonzero(table.kind == Kind.OVF))
        errors += int(table.err_code.shape[0])
        cap = int(np.count_nonzero(np.isin(table.kind, _KEPT))) + table.err_code.shape[0] + 1
        cols = (np.zeros(cap, np.uint64), np.zeros(cap, np.uint8), np.zeros(cap, np.uint64),
                np.zeros(cap, np.uint32), np.zeros(cap, np.int64))  # fmt: skip
        rows, in_psb = _select(
            table.kind, table.a, table.b, times.tsc, table.offset,
            table.err_index.astype(np.int64), in_psb, *cols,
        )  # fmt: skip
        parts.append(tuple(c[:rows] for c in cols))
        release(buf, start, end)
    if parts:
        t, k, a, b, o = (np.concatenate([p[j] for p in parts]) for j in range(5))
    else:
        t, k, a, b, o = (
            np.zeros(0, d) for d in (np.uint64, np.uint8, np.uint64, np.uint32, np.int64)
        )
    return StreamEvents(pcpu, t, k, a, b, o, overflows, errors, last_time)


_KEPT = np.array([Kind.PSBEND, Kind.PIP, Kind.VMCS, Kind.OVF], np.uint8)


# -- the state machine ------------------------------------------------------------------

# Transition rows: time, entity kind, key a, key b, new state, pCPU.
_HASH_BITS = 16


@aot.njit(cache=True)
def _proc_id(keys_vm, keys_cr3, vm, cr3):
    """The process slot of (vm, cr3) (claimed if new); -1 if the table is full."""
    cap = keys_vm.shape[0]
    h = (
        (np.uint64(cr3) >> np.uint64(12)) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(vm)
    ) >> np.uint64(64 - _HASH_BITS)
    j = np.int64(h) % cap
    for _ in range(cap):
        if keys_cr3[j] == cr3 and keys_vm[j] == vm and keys_cr3[j] != 0:
            return j
        if keys_cr3[j] == 0:
            keys_cr3[j] = cr3
            keys_vm[j] = vm
            return j
        j = (j + 1) % cap
    return -1


@aot.njit(cache=True)
def _emit(out, n, t, ent, ka, kb, state, pcpu):
    if n < out[0].shape[0]:
        out[0][n] = t
        out[1][n] = ent
        out[2][n] = ka
        out[3][n] = kb
        out[4][n] = state
        out[5][n] = pcpu
    return n + 1


# What a process counts a vCPU as, beside ST_VM, ST_VMM and ST_UNKNOWN: the
# trace of the pCPU it last ran on ended while it ran the process.
_ENDED = 5


@aot.njit(cache=True)
def _uncount(state, q, cnt):
    """Process ``q`` no longer counts a vCPU as ``state`` (-1: nothing)."""
    if state >= 0:
        cnt[q, state] -= 1


@aot.njit(cache=True)
def _learn_vm(v, vm, vmm_cr3, first_vmm, stats):
    """An exit or a load shows vCPU ``v``'s VM: ``stats[7]`` counts it if
    what was taken for it before (from status in root mode) was wrong."""
    if first_vmm[v] == 0:
        first_vmm[v] = vm
        if vmm_cr3[v] != 0 and vmm_cr3[v] != vm:
            stats[7] += 1
    vmm_cr3[v] = vm


def _machine_state(npcpu: int, nv: int) -> tuple:
    """The state :func:`_machine` starts from (made here: the loop itself
    allocates nothing, so it runs from the native library)."""
    cap = 1 << _HASH_BITS
    return (
        # Per pCPU: known, VMCS (vCPU index, -1 none), NR, CR3, the derived
        # state and the vCPU / guest CR3 it is about; status being
        # collected in PSB+ (VMCS -2: no status seen in this PSB+).
        np.zeros(npcpu, np.bool_), np.full(npcpu, -1, np.int64), np.zeros(npcpu, np.int64),
        np.zeros(npcpu, np.uint64), np.full(npcpu, -1, np.int64), np.full(npcpu, -1, np.int64),
        np.zeros(npcpu, np.uint64), np.full(npcpu, -2, np.int64), np.full(npcpu, -1, np.int64),
        np.zeros(npcpu, np.uint64),
        # Per vCPU: state, where it is active, the guest process it last
        # ran and what that process counts it as.
        np.full(nv, -1, np.int64), np.full(nv, -1, np.int64), np.full(nv, -1, np.int64),
        np.full(nv, -1, np.int64),
        # Processes: keys and how many vCPUs run them (per state) / handle
        # their exits.
        np.zeros(cap, np.uint64), np.zeros(cap, np.uint64),
        np.zeros((cap, _ENDED + 1), np.int64), np.full(cap, -1, np.int64),
    )  # fmt: skip


@aot.njit(cache=True, _nrt=False)
def _machine(
    ev_t, ev_p, ev_k, ev_a, ev_b, vcpu_of, vcpu_base, out, stats, vmm_cr3, first_vmm, state
):
    """Run the merged events from ``state`` (:func:`_machine_state`);
    returns the number of transition rows.
    ``vmm_cr3`` holds each vCPU's VM where known beforehand (0: not known)
    and is updated as exits and loads show it; ``first_vmm`` gets the first
    VM an exit or a load showed for each vCPU; ``stats[7]`` counts what
    was decided with a vCPU's VM not known (a guest process put in VM 0) or
    taken wrongly (from status)."""
    known, vm_of_p, nr, cr3, pstate, pvcpu, pguest, s_vmcs, s_nr, s_cr3 = state[:10]
    vstate, vpcpu, vproc, vproc_state = state[10:14]
    keys_vm, keys_cr3, cnt, pst = state[14:]
    n = 0
    for i in range(ev_t.shape[0]):
        t = ev_t[i]
        p = ev_p[i]
        k = ev_k[i]
        vcpu_now = -1
        if k == EV_VMCS or k == EV_STATUS_VMCS:
            vcpu_now = vcpu_of[i]
        if k == EV_PIP:
            if not known[p]:
                continue
            new_nr = np.int64(ev_b[i])
            v = vm_of_p[p]
            if nr[p] == 1 and new_nr == 0 and v >= 0:
                # A VM exit returns to the VMM.
                _learn_vm(v, ev_a[i] & _CR3_KEY_MASK, vmm_cr3, first_vmm, stats)
                stats[0] += 1
            nr[p] = new_nr
            cr3[p] = ev_a[i]
        elif k == EV_VMCS:
            if not known[p]:
                continue
            vm_of_p[p] = vcpu_now
            if nr[p] == 0 and vcpu_now >= 0:
                # Loaded by the VMM running here.
                _learn_vm(vcpu_now, cr3[p] & _CR3_KEY_MASK, vmm_cr3, first_vmm, stats)
        elif k == EV_STATUS_VMCS:
            s_vmcs[p] = vcpu_now
            continue
        elif k == EV_STATUS_PIP:
            s_nr[p] = np.int64(ev_b[i])
            s_cr3[p] = ev_a[i]
            continue
        elif k == EV_STATUS_END:
            if s_nr[p] >= 0:
                if not known[p]:
                    known[p] = True
                    nr[p] = s_nr[p]
                    cr3[p] = s_cr3[p]
                    vm_of_p[p] = s_vmcs[p] if s_vmcs[p] != -2 else -1
                    v = vm_of_p[p]
                    if v >= 0 and nr[p] == 0 and vmm_cr3[v] == 0:
                        # Root mode with a vCPU loaded, its VMM not known yet:
                        # taken to be the VMM until an exit or a load says
                        # otherwise (then :func:`analyze` runs again).
                        vmm_cr3[v] = cr3[p] & _CR3_KEY_MASK
                elif nr[p] != s_nr[p] or cr3[p] != s_cr3[p]:
                    stats[1] += 1  # status disagreeing with the state: believe the status
                    nr[p] = s_nr[p]
                    cr3[p] = s_cr3[p]
                    if s_vmcs[p] != -2:
                        vm_of_p[p] = s_vmcs[p]
            s_vmcs[p] = -2
            s_nr[p] = -1
            if not known[p]:
                continue
        elif k == EV_OVF or k == EV_GAP:
            known[p] = False
            stats[2] += 1
        elif k == EV_END:
            known[p] = False
        # The pCPU's state now.
        if k == EV_END:
            ns, nvc, ng = -1, -1, np.uint64(0)  # its trace ends: so do its intervals
        elif not known[p]:
            ns, nvc, ng = ST_UNKNOWN, pvcpu[p], pguest[p]
        elif nr[p] == 1:
            ns, nvc, ng = ST_VM, vm_of_p[p], cr3[p] & _CR3_KEY_MASK
        elif (
            vm_of_p[p] >= 0
            and vmm_cr3[vm_of_p[p]] != 0
            and cr3[p] & _CR3_KEY_MASK == vmm_cr3[vm_of_p[p]]
        ):
            # The VMM in its kernel or (a KPTI host's) user page table.
            ns, nvc, ng = ST_VMM, vm_of_p[p], np.uint64(0)
        else:
            ns, nvc, ng = ST_HOST, -1, np.uint64(0)
        if ns == pstate[p] and nvc == pvcpu[p] and ng == pguest[p]:
            continue
        # The vCPU this pCPU was about, if it leaves it.
        old = pvcpu[p]
        if old >= 0 and old != nvc:
            st = -1 if ns == -1 else ST_IDLE  # the trace's end, or it left this pCPU
            if vstate[old] != st:
                vstate[old] = st
                n = _emit(out, n, t, ENT_VCPU, vcpu_base[old], np.uint64(0), st, p)
            q = vproc[old]
            if q >= 0:
                _uncount(vproc_state[old], q, cnt)  # its process loses this vCPU
                if st == -1:
                    # Not known what it runs from here on, unless another
                    # pCPU's trace shows it.
                    cnt[q, _ENDED] += 1
                    vproc_state[old] = _ENDED
                else:
                    vproc_state[old] = -1
                    vproc[old] = -1
                n = _settle(out, n, t, q, keys_vm, keys_cr3, cnt, pst, p)
        pstate[p] = ns
        pvcpu[p] = nvc
        pguest[p] = ng
        n = _emit(out, n, t, ENT_PCPU, np.uint64(p), np.uint64(0), ns, p)
        if nvc >= 0 and ns == ST_UNKNOWN:
            # Trace lost while this vCPU ran here: it and its process unknown.
            if vstate[nvc] != ST_UNKNOWN:
                vstate[nvc] = ST_UNKNOWN
                n = _emit(out, n, t, ENT_VCPU, vcpu_base[nvc], np.uint64(0), ST_UNKNOWN, p)
            q = vproc[nvc]
            if q >= 0 and vproc_state[nvc] != ST_UNKNOWN:
                _uncount(vproc_state[nvc], q, cnt)
                cnt[q, ST_UNKNOWN] += 1
                vproc_state[nvc] = ST_UNKNOWN
                n = _settle(out, n, t, q, keys_vm, keys_cr3, cnt, pst, p)
        if nvc >= 0 and (ns == ST_VM or ns == ST_VMM):
            if (
                (vstate[nvc] == ST_VM or vstate[nvc] == ST_VMM)
                and vpcpu[nvc] != p
                and vpcpu[nvc] >= 0
            ):
                # Active on two pCPUs at once: the streams' times disagree.
                if stats[4] == 0:
                    stats[5] = np.int64(t)
                    stats[6] = vcpu_base[nvc]
                stats[4] += 1
            vpcpu[nvc] = p
            if vstate[nvc] != ns:
                vstate[nvc] = ns
                n = _emit(out, n, t, ENT_VCPU, vcpu_base[nvc], np.uint64(0), ns, p)
            q_old = vproc[nvc]
            if ns == ST_VM:
                if vmm_cr3[nvc] == 0:
                    stats[7] += 1  # a guest process in a VM not known (yet)
                q = _proc_id(keys_vm, keys_cr3, vmm_cr3[nvc], ng)
                if q < 0:
                    stats[3] += 1
                    continue
            elif vproc_state[nvc] != _ENDED:
                q = q_old  # the process whose vCPU exited
            else:
                q = -1  # back after its pCPU's trace ended: what it ran is not known
            if q_old >= 0 and (q_old != q or vproc_state[nvc] != ns):
                _uncount(vproc_state[nvc], q_old, cnt)
                vproc_state[nvc] = -1
                vproc[nvc] = -1
                n = _settle(out, n, t, q_old, keys_vm, keys_cr3, cnt, pst, p)
            if q >= 0 and vproc_state[nvc] != ns:
                cnt[q, ns] += 1
                vproc[nvc] = q
                vproc_state[nvc] = ns
                n = _settle(out, n, t, q, keys_vm, keys_cr3, cnt, pst, p)
    return n


@aot.njit(cache=True)
def _settle(out, n, t, q, keys_vm, keys_cr3, cnt, pst, p):
    """Emit process ``q``'s state if its counts changed it: VM while a vCPU
    runs it, else VMM while one handles its exit, else UNKNOWN while one's
    trace is lost, else none (-1: no interval) while one's trace has ended,
    else IDLE."""
    if cnt[q, ST_VM] > 0:
        s = ST_VM
    elif cnt[q, ST_VMM] > 0:
        s = ST_VMM
    elif cnt[q, ST_UNKNOWN] > 0:
        s = ST_UNKNOWN
    elif cnt[q, _ENDED] > 0:
        s = -1
    else:
        s = ST_IDLE
    if pst[q] != s:
        pst[q] = s
        n = _emit(out, n, t, ENT_PROCESS, keys_vm[q], keys_cr3[q], s, p)
    return n


INTERVAL_DTYPE = np.dtype(
    [("entity", "u1"), ("key", "<u8"), ("key2", "<u8"), ("state", "u1"), ("start", "<u8"),
     ("end", "<u8"), ("pcpu", "<i4")]
)  # fmt: skip


@dataclass
class VmAnalysis:
    """What :func:`analyze` found: intervals (:data:`INTERVAL_DTYPE`: entity
    kind, key (pCPU number, VMCS base, or the process's VM), key2 (the
    process's CR3), state, start and end in TSC, the pCPU it happened on),
    the VMs (VMM host CR3 per vCPU), exits, and what could not be known."""

    intervals: np.ndarray
    vcpu_vm: dict[int, int]
    exits: np.ndarray  # (vCPU VMCS base, start, end, pCPU) of each VM exit's VMM time
    start: int
    end: int
    streams: list[StreamEvents]
    stats: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # Names the sideband gave (("vcpu", VMCS base) -> the vCPU thread).
    names: dict[tuple[str, int], str] = field(default_factory=dict)
    tsc_conversion: object = None
    resolution: int | None = None  # TSC ticks within which boundaries are known
    # Per exit (rows of ``exits``), its reason from kvm:kvm_exit samples (-1:
    # none recorded), and the reasons' names from the event's format.
    exit_reasons: np.ndarray | None = None
    reason_names: dict[int, str] = field(default_factory=dict)

    def exit_reason(self, j: int) -> str:
        """Exit ``j``'s reason, by name where the format gave one ("": none)."""
        if self.exit_reasons is None or self.exit_reasons[j] < 0:
            return ""
        code = int(self.exit_reasons[j])
        return self.reason_names.get(code, f"reason {code}")

    def rows(self, entity: str) -> np.ndarray:
        return self.intervals[self.intervals["entity"] == ENTITY_NAMES.index(entity)]

    def contention(self, window: int) -> dict[int, np.ndarray]:
        """Per pCPU, how many distinct vCPUs ran on it (in VM or VMM) in
        each ``window`` ticks from the start: vCPUs taking turns on one
        pCPU contend for it (Sharma's prime computation: 4)."""
        v = self.intervals[(self.intervals["entity"] == ENT_VCPU)
                           & np.isin(self.intervals["state"], [ST_VM, ST_VMM])]  # fmt: skip
        nwin = max(1, -(-(self.end - self.start) // max(window, 1)))
        out = {int(e.pcpu): np.zeros(nwin, np.int64) for e in self.streams}
        if not v.shape[0]:
            return out
        lo = (v["start"].astype(np.int64) - self.start) // window
        hi = np.maximum(lo, (v["end"].astype(np.int64) - 1 - self.start) // window)
        reps = (hi - lo + 1).astype(np.int64)
        win = np.repeat(lo, reps) + (
            np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)
        )
        pc = np.repeat(v["pcpu"].astype(np.int64), reps)
        key = np.repeat(v["key"], reps)
        uniq = distinct_rows(np.stack([pc, win, key.astype(np.int64)], axis=1))
        for p in distinct(uniq[:, 0]).tolist():
            w = uniq[uniq[:, 0] == p, 1]
            out[int(p)] = np.bincount(w[w < nwin], minlength=nwin)
        return out

    def time_in_states(self) -> dict[tuple[str, int, int], dict[str, int]]:
        """Per entity (kind, key, key2), the ticks in each state."""
        iv = self.intervals
        keys, row = np.unique(iv[["entity", "key", "key2"]], return_inverse=True)
        ticks = np.zeros((keys.shape[0], len(STATE_NAMES)), np.int64)
        np.add.at(ticks, (row.reshape(-1), iv["state"].astype(np.int64)),
                  iv["end"].astype(np.int64) - iv["start"].astype(np.int64))  # fmt: skip
        return {
            (ENTITY_NAMES[int(k["entity"])], int(k["key"]), int(k["key2"])):
                {STATE_NAMES[s]: int(t) for s, t in enumerate(ticks[j]) if t}
            for j, k in enumerate(keys)
        }  # fmt: skip


def time_resolution(config: PtConfig) -> int | None:
    """TSC ticks within which a PIP or VMCS is placed: one MTC period
    (2**mtc_freq crystal ticks at the CPUID 0x15 ratio); None without MTC
    (then only TSC packets in PSB+, or CYC, place them)."""
    if not config.cpuid_0x15_eax or not config.cpuid_0x15_ebx:
        return None
    return int((1 << config.mtc_freq) * config.cpuid_0x15_ebx // config.cpuid_0x15_eax)


def analyze(
    streams: Mapping[int, object] | list[StreamEvents], config: PtConfig | None = None
) -> VmAnalysis:
    """HAVAna over one PT stream per pCPU: ``streams`` maps pCPU numbers to
    traces (bytes, buffers, paths) or is a list of :class:`StreamEvents`."""
    resolution = time_resolution(config) if config is not None else None
    if isinstance(streams, Mapping):
        evs = [stream_events(d, int(p), config) for p, d in sorted(streams.items())]
    else:
        evs = list(streams)
    problems: list[str] = []
    if not evs:
        raise ValueError("no streams")
    npcpu = max(e.pcpu for e in evs) + 1
    # Merge by time; at equal times a stream keeps its order.  Each stream
    # ends with an END event where its trace ends: its last timing packet,
    # which may come well after its last PIP or VMCS.
    cols = []
    for e in evs:
        cols.append((
            np.concatenate([e.time, [e.stop]]).astype(np.uint64),
            np.full(e.time.shape[0] + 1, e.pcpu, np.int64),
            np.concatenate([e.kind, [EV_END]]).astype(np.uint8),
            np.concatenate([e.a, [0]]).astype(np.uint64),
            np.concatenate([e.b, [0]]).astype(np.uint32),
        ))  # fmt: skip
    t, p, k, a, b = (np.concatenate([c[j] for c in cols]) for j in range(5))
    order = np.lexsort((np.arange(t.shape[0]), t))
    t, p, k, a, b = t[order], p[order], k[order], a[order], b[order]
    is_vmcs = (k == EV_VMCS) | (k == EV_STATUS_VMCS)
    bases, inverse = np.unique(a[is_vmcs], return_inverse=True)
    vcpu_of = np.full(t.shape[0], -1, np.int64)
    vcpu_of[is_vmcs] = inverse
    stats = np.zeros(8, np.int64)
    cap = 4 * t.shape[0] + 16
    known_vm = np.zeros(bases.shape[0], np.uint64)
    while True:
        out = (np.zeros(cap, np.uint64), np.zeros(cap, np.uint8), np.zeros(cap, np.uint64),
               np.zeros(cap, np.uint64), np.zeros(cap, np.int64), np.zeros(cap, np.int32))  # fmt: skip
        stats[:] = 0
        vmm_of = known_vm.copy()
        first_vmm = np.zeros(bases.shape[0], np.uint64)
        rows = _machine(t, p, k, a, b, vcpu_of, bases.astype(np.uint64), out, stats, vmm_of,
                        first_vmm, _machine_state(npcpu, bases.shape[0]))  # fmt: skip
        if rows > cap:
            cap = rows
        elif stats[7] and ((first_vmm != 0) & (known_vm == 0)).any():
            # A vCPU ran before an exit or a load showed its VM (a trace
            # starting in a guest, or in a host task with a VMCS current,
            # taken for its VMM): run again knowing each vCPU's VM from the
            # start, so its processes are in that VM from the start.
            known_vm = np.where(known_vm != 0, known_vm, first_vmm)
        else:
            break
    tr = tuple(c[:rows] for c in out)
    start = int(t[0]) if t.shape[0] else 0
    end = int(t[-1]) if t.shape[0] else 0  # the last stream's END
    vcpu_vm = {int(b): int(v) for b, v in zip(bases.tolist(), vmm_of.tolist(), strict=True) if v}
    intervals = _intervals(tr, end)
    intervals = np.concatenate([intervals, _vmm_rows(intervals, vcpu_vm)])
    exits = _exits(intervals)
    no_vm = [
        e
        for e in evs
        if not np.isin(e.kind, [EV_PIP, EV_VMCS, EV_STATUS_PIP, EV_STATUS_VMCS]).any()
    ]
    for e in no_vm:
        problems.append(f"pCPU {e.pcpu}: no PIP or VMCS packets: not a trace of a VM host "
                        "(trace with Intel PT in system-wide mode on a KVM host)")  # fmt: skip
    if bases.shape[0] == 0 and evs:
        problems.append("no VMCS packets in any stream: no vCPU ran (not a VM host trace?)")
    for e in evs:
        if not e.time.shape[0]:
            continue
        first, last = int(e.time[0]), e.stop
        if first > start:
            problems.append(f"pCPU {e.pcpu}: its trace starts at {first}, after the first time "
                            f"seen ({start}): what ran there before is not known")  # fmt: skip
        if last < end:
            problems.append(f"pCPU {e.pcpu}: its trace ends at {last}, before the last time seen "
                            f"({end}): what ran there after is not known")  # fmt: skip
    if stats[4]:
        problems.append(f"vCPU {int(stats[6]):#x} ran on two pCPUs at once at {int(stats[5])} "
                        f"({int(stats[4])} such overlaps): the streams' times disagree (streams of "
                        "different recordings, or clocks not in step)")  # fmt: skip
    for e in evs:
        if e.overflows:
            problems.append(
                f"pCPU {e.pcpu}: {e.overflows} overflows (OVF): state unknown until the next PSB+"
            )
        if e.decode_errors:
            problems.append(
                f"pCPU {e.pcpu}: {e.decode_errors} decode errors: state unknown until the next PSB+"
            )
    return VmAnalysis(
        intervals, vcpu_vm, exits, start, end, evs,
        {"vm_exits": int(stats[0]), "status_disagreements": int(stats[1]), "gaps": int(stats[2]),
         "process_table_full": int(stats[3]), "overlaps": int(stats[4])},
        problems, resolution=resolution,
    )  # fmt: skip


def _intervals(tr, end: int) -> np.ndarray:
    """Transition rows to intervals: each entity's state from one row to
    its next (the last one to the end of the trace); state -1 ends it."""
    t, ent, ka, kb, st, pc = tr
    order = np.lexsort((np.arange(t.shape[0]), t, kb, ka, ent))
    t, ent, ka, kb, st, pc = t[order], ent[order], ka[order], kb[order], st[order], pc[order]
    same_next = np.zeros(t.shape[0], np.bool_)
    if t.shape[0] > 1:
        same_next[:-1] = (ent[1:] == ent[:-1]) & (ka[1:] == ka[:-1]) & (kb[1:] == kb[:-1])
    nxt = np.empty(t.shape[0], np.uint64)
    nxt[:-1] = t[1:] if t.shape[0] else nxt[:-1]
    stop = np.where(same_next, nxt, np.uint64(end))
    keep = (st >= 0) & (stop > t)
    out = np.zeros(int(keep.sum()), INTERVAL_DTYPE)
    out["entity"], out["key"], out["key2"] = ent[keep], ka[keep], kb[keep]
    out["state"], out["start"], out["end"], out["pcpu"] = st[keep], t[keep], stop[keep], pc[keep]
    return _merge_runs(out)


def _merge_runs(iv: np.ndarray) -> np.ndarray:
    """Adjacent intervals of one entity in the same state become one."""
    if iv.shape[0] < 2:
        return iv
    same = np.zeros(iv.shape[0], np.bool_)
    same[1:] = ((iv["entity"][1:] == iv["entity"][:-1]) & (iv["key"][1:] == iv["key"][:-1])
                & (iv["key2"][1:] == iv["key2"][:-1]) & (iv["state"][1:] == iv["state"][:-1])
                & (iv["start"][1:] == iv["end"][:-1]))  # fmt: skip
    heads = np.flatnonzero(~same)
    out = iv[heads].copy()
    last = np.r_[heads[1:] - 1, iv.shape[0] - 1]
    out["end"] = iv["end"][last]
    return out


def _vmm_rows(iv: np.ndarray, vcpu_vm: dict[int, int]) -> np.ndarray:
    """The hypervisor's row per VM (entity ``vm``, keyed by the VMM's CR3):
    ``VMM`` while one of its vCPUs is in root mode for it, ``IDLE`` from
    its first vCPU's appearance on otherwise, up to where the last thing
    known of its vCPUs ends."""
    v = iv[iv["entity"] == ENT_VCPU]
    parts = []
    for vm in sorted(set(vcpu_vm.values())):
        mine = v[np.isin(v["key"], [b for b, m in vcpu_vm.items() if m == vm])]
        if not mine.shape[0]:
            continue
        busy = mine[mine["state"] == ST_VMM]
        busy = busy[np.argsort(busy["start"], kind="stable")]
        # Union of the VMM intervals: a new run where a start passes every
        # end before it; the gaps between runs (and after the last) idle.
        s0 = busy["start"].astype(np.int64)
        e0 = np.maximum.accumulate(busy["end"].astype(np.int64))
        heads = np.flatnonzero(np.r_[True, s0[1:] > e0[:-1]]) if s0.shape[0] else s0
        tails = np.r_[heads[1:] - 1, s0.shape[0] - 1].astype(np.int64) if s0.shape[0] else s0
        run_a, run_b = s0[heads], e0[tails]
        idle_a = np.r_[int(mine["start"].min()), run_b]
        idle_b = np.r_[run_a, int(mine["end"].max())]
        idle_pc = np.r_[busy["pcpu"][heads], -1]
        keep = idle_b > idle_a
        rows = np.zeros(run_a.shape[0] + int(keep.sum()), INTERVAL_DTYPE)
        rows["entity"], rows["key"] = ENT_VM, vm
        rows["state"] = np.r_[np.full(run_a.shape[0], ST_VMM), np.full(int(keep.sum()), ST_IDLE)]
        rows["start"] = np.r_[run_a, idle_a[keep]]
        rows["end"] = np.r_[run_b, idle_b[keep]]
        rows["pcpu"] = np.r_[busy["pcpu"][heads], idle_pc[keep]]
        parts.append(rows[np.argsort(rows["start"], kind="stable")])
    return np.concatenate(parts) if parts else np.zeros(0, INTERVAL_DTYPE)


def _exits(iv: np.ndarray) -> np.ndarray:
    """Each vCPU's VMM intervals that follow a VM interval, its exits:
    (VMCS base, start, end, pCPU)."""
    v = iv[iv["entity"] == ENT_VCPU]
    if v.shape[0] < 2:
        return np.zeros((0, 4), np.uint64)
    after_vm = np.zeros(v.shape[0], np.bool_)
    after_vm[1:] = (
        (v["key"][1:] == v["key"][:-1])
        & (v["state"][:-1] == ST_VM)
        & (v["start"][1:] == v["end"][:-1])
    )
    sel = after_vm & (v["state"] == ST_VMM)
    return np.stack([v["key"][sel], v["start"][sel], v["end"][sel], v["pcpu"][sel].astype(np.int64)],
                    axis=1).astype(np.uint64)  # fmt: skip


# -- vmpt's bundles.xml ------------------------------------------------------------------

_BUNDLE = re.compile(
    rb"<bundle>\s*<pip>\s*([0-9a-fA-F]+)\s*</pip>\s*<nr>\s*(\d+)\s*</nr>\s*"
    rb"(?:<vmcs>\s*([0-9a-fA-F]+)\s*</vmcs>\s*)?<tsc>\s*(\d+)\s*</tsc>\s*</bundle>"
)


def read_bundles(path: str | os.PathLike[str], pcpu: int = 0) -> StreamEvents:
    """Events from vmpt's ``bundles.xml`` (Sharma's released decoder:
    ``<bundle><pip>CR3 hex</pip><nr>0|1</nr><vmcs>base hex</vmcs><tsc>decimal</tsc></bundle>``),
    for :func:`analyze`: the first bundle is taken as status, then each
    bundle is a VMCS load where its base changes and a PIP."""
    data = Path(path).read_bytes()
    found = _BUNDLE.findall(data)
    if not found and b"<vmpt" not in data:
        raise ValueError(f"{path}: not a vmpt bundles.xml (no <vmpt> element)")
    cr3 = np.array([int(f[0], 16) for f in found], np.uint64)
    nr = np.array([int(f[1]) for f in found], np.uint32)
    vmcs = np.array([int(f[2], 16) if f[2] else 0 for f in found], np.uint64)
    tsc = np.array([int(f[3]) for f in found], np.uint64)
    if not found:
        empty = np.zeros(0, np.uint64)
        return StreamEvents(pcpu, empty, np.zeros(0, np.uint8), empty, np.zeros(0, np.uint32),
                            np.zeros(0, np.int64))  # fmt: skip
    # The first bundle is status (PSB+); then per bundle a VMCS load where
    # the base changes, and its PIP.
    status_k = [EV_STATUS_PIP] + ([EV_STATUS_VMCS] if vmcs[0] else []) + [EV_STATUS_END]
    status_a = [cr3[0]] + ([vmcs[0]] if vmcs[0] else []) + [0]
    status_b = [nr[0]] + [0] * (len(status_k) - 1)
    load = np.r_[False, vmcs[1:] != vmcs[:-1]] & (vmcs != 0)
    load[0] = False
    rest = np.arange(1, len(found))
    per = 1 + load[rest].astype(np.int64)  # events per bundle
    at = np.cumsum(per) - 1  # each bundle's PIP
    n = int(per.sum())
    t, a = np.zeros(n, np.uint64), np.zeros(n, np.uint64)
    k, b = np.full(n, EV_PIP, np.uint8), np.zeros(n, np.uint32)
    t[at], a[at], b[at] = tsc[rest], cr3[rest], nr[rest]
    loads = at[load[rest]] - 1
    t[loads], a[loads], k[loads] = tsc[rest][load[rest]], vmcs[rest][load[rest]], EV_VMCS
    m = len(status_k)
    return StreamEvents(
        pcpu, np.r_[np.full(m, tsc[0]), t].astype(np.uint64), np.r_[status_k, k].astype(np.uint8),
        np.r_[np.array(status_a, np.uint64), a], np.r_[np.array(status_b, np.uint32), b],
        np.zeros(m + n, np.int64),
    )  # fmt: skip


def write_bundles(events: StreamEvents, path: str | os.PathLike[str]) -> int:
    """One pCPU's events as vmpt's ``bundles.xml``: a bundle per PIP (in
    PSB+ or not) and per vCPU load, with the CR3 and NR in force, the VMCS
    loaded (0 when none is known) and the time.  Returns the number of
    bundles."""
    vmcs = cr3 = nr = 0
    lines = ["<vmpt>"]
    for t, k, a, b in zip(events.time.tolist(), events.kind.tolist(), events.a.tolist(),
                          events.b.tolist(), strict=True):  # fmt: skip
        if k in (EV_VMCS, EV_STATUS_VMCS):
            vmcs = a
        elif k in (EV_PIP, EV_STATUS_PIP):
            cr3, nr = a, b
        if k in (EV_PIP, EV_VMCS, EV_STATUS_END):  # a PSB+ is one bundle, at its end
            lines.append(f"\t<bundle>\n\t\t<pip> {cr3:x} </pip>\n\t\t<nr> {nr} </nr>\n"
                         f"\t\t<vmcs> {vmcs:x} </vmcs>\n\t\t<tsc> {t} </tsc>\n\t</bundle>")  # fmt: skip
    lines.append("</vmpt>\n")
    Path(path).write_text("\n".join(lines))
    return len(lines) - 2


# -- perf.data ---------------------------------------------------------------------------


def analyze_perf(data) -> VmAnalysis:
    """HAVAna over a perf.data of a system-wide ``perf record -e intel_pt//
    -a`` (per-CPU AUX queues) on a KVM host.  The sideband names each
    vCPU's thread (the host thread running on its pCPU when it first ran,
    QEMU's ``CPU n/KVM``) and its VMM process (:attr:`VmAnalysis.names`);
    times stay TSC (:attr:`VmAnalysis.tsc_conversion` gives perf's ns)."""
    from ..perf.intelpt import iter_queue_traces, pt_config_of, sideband_of, tsc_conversion_of

    config = pt_config_of(data)
    problems: list[str] = []
    streams = []
    for cpu, tid, buf in iter_queue_traces(data):
        if cpu < 0:
            problems.append(f"{data.path}: AUX queue of thread {tid} is per thread, not per CPU: "
                            "record system-wide (perf record -a) for a VM analysis")  # fmt: skip
            continue
        streams.append(stream_events(buf.copy(), cpu, config))
    if not streams:
        raise ValueError(
            f"{data.path}: no per-CPU Intel PT (record with perf record -e intel_pt// -a)"
        )
    result = analyze(streams)
    result.problems[:0] = problems
    result.resolution = time_resolution(config)
    conv = tsc_conversion_of(data)
    result.tsc_conversion = conv
    if conv is not None:
        _exit_reasons(data, result, conv)
    if conv is not None:
        sb = sideband_of(data)
        v = result.rows("vcpu")
        v = v[v["state"] == ST_VM]
        keys, first = np.unique(v["key"], return_index=True)
        for key, j in zip(keys.tolist(), first.tolist(), strict=True):
            t = int(conv.to_ns(int(v["start"][j])))
            tid = int(sb.threads_on(int(v["pcpu"][j]), np.array([t], np.int64))[0])
            if tid > 0:
                pid = sb.pid_of(tid)
                result.names[("vcpu", int(key))] = f"{sb.comm_of(tid, t)} (tid {tid}, pid {pid})"
    return result


_FIELD = re.compile(r"field:[^;]*\b(\w+);\s*offset:(\d+);\s*size:(\d+);")
_VMX_TABLE = re.compile(r"REC->exit_reason\s*&\s*0xffff,(.*?)\)\s*:", re.S)
_PAIR = re.compile(r"\{\s*(-?(?:0x)?[0-9a-fA-F]+)\s*(?:\+\s*(\d+))?\s*,\s*\"([^\"]+)\"\s*\}")


def _exit_reasons(data, result: VmAnalysis, conv) -> None:
    """Each exit's reason from ``kvm:kvm_exit`` samples, when recorded
    (``perf record -e intel_pt// -e kvm:kvm_exit -a``): the sample on the
    exit's pCPU nearest after the exit began, within the exit; the names
    from the VMX table in the event's format (TRACING_DATA)."""
    from ..filter.errors import FilterError
    from ..filter.ftrace_raw import parse_tracing_data
    from ..perf.features import Feature

    raw = data.raw_features.get(int(Feature.TRACING_DATA))
    if raw is None:
        return
    try:
        formats = parse_tracing_data(raw).formats
    except FilterError:
        result.problems.append(f"{data.path}: TRACING_DATA cannot be read: no exit reasons")
        return
    found = [
        (i, text)
        for i, (system, name, text) in formats.items()
        if (system, name) == ("kvm", "kvm_exit")
    ]
    if not found:
        return
    event_id, text = found[0]
    fields = {m[1]: (int(m[2]), int(m[3])) for m in _FIELD.finditer(text)}
    if "exit_reason" not in fields:
        return
    table = _VMX_TABLE.search(text)
    if table:
        for m in _PAIR.finditer(table.group(1)):
            result.reason_names[int(m[1], 0) + int(m[2] or 0)] = m[3]
    attrs = [
        k for k, ea in enumerate(data.attrs) if ea.attr.type == 2 and ea.attr.config == event_id
    ]
    if not attrs:
        return
    smp = data.samples(attrs[0])
    if not len(smp) or "raw_offset" not in smp.columns:
        return
    rec = data.records["offset"][smp.record].astype(np.int64)
    at = rec + smp["raw_offset"].astype(np.int64) + fields["exit_reason"][0]
    buf = data.buf
    reason = (buf[at].astype(np.int64) | buf[at + 1].astype(np.int64) << 8
              | buf[at + 2].astype(np.int64) << 16 | buf[at + 3].astype(np.int64) << 24)  # fmt: skip
    times, cpus = smp["time"].astype(np.int64), smp["cpu"].astype(np.int64)
    ex = result.exits
    out = np.full(ex.shape[0], -1, np.int64)
    if ex.shape[0]:
        start = np.asarray(conv.to_ns(ex[:, 1]), np.int64)
        end = np.asarray(conv.to_ns(ex[:, 2]), np.int64)
        pcpu = ex[:, 3].astype(np.int64)
        for c in distinct(pcpu).tolist():
            mine = np.flatnonzero(cpus == c)
            order = mine[np.argsort(times[mine], kind="stable")]
            st = times[order]
            rows = np.flatnonzero(pcpu == c)
            # The tracepoint runs in the host right after the exit: the
            # first sample at or after the exit's start (within a time
            # resolution before it), and before its end.
            slack = int(conv.to_ns(result.resolution or 0)) - int(conv.to_ns(0))
            j = np.searchsorted(st, start[rows] - slack, side="left")
            ok = j < st.shape[0]
            ok[ok] &= st[j[ok]] <= end[rows][ok]
            out[rows[ok]] = reason[order[j[ok]]] & 0xFFFF
    result.exit_reasons = out
