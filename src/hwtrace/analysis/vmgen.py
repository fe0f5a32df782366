"""KVM host PT streams with known answers, for testing :mod:`.vm`.

A :class:`Scenario` says what each physical CPU runs from when on
(:class:`Run`: a host task, the VMM for a vCPU, a guest process in a vCPU,
or nothing known: trace lost); :meth:`Scenario.streams` writes the Intel
PT a processor tracing in system-wide mode would (PSB+ with TSC, TMA,
PIP and VMCS status; PIP at every CR3 load, VM entry and exit; VMCS at
every vCPU load; OVF where trace is lost, then PSB+; MTC every period;
a PSB+ at each stream's end, or only timing packets up to it), and
:meth:`Scenario.truth` the intervals the analysis must give back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..pt.config import PtConfig
from ..pt.kinds import Kind
from ..pt.packets import encode_table
from .vm import (
    ENT_PCPU,
    ENT_PROCESS,
    ENT_VCPU,
    INTERVAL_DTYPE,
    ST_HOST,
    ST_IDLE,
    ST_UNKNOWN,
    ST_VM,
    ST_VMM,
    normalize_cr3,
)

__all__ = ["Run", "Scenario", "mixed_scenario", "prime_scenario", "workers_scenario"]

WHAT_STATE = {"host": ST_HOST, "vmm": ST_VMM, "vm": ST_VM, "lost": ST_UNKNOWN}
# The CR3 bits a PIP carries: 51:5 (Intel SDM vol. 3C, the PIP packet), so a PCID's
# low 5 bits are not in it.
_PIP_CR3 = 0x000F_FFFF_FFFF_FFE0


@dataclass(frozen=True)
class Run:
    """From ``start`` (TSC) on, a pCPU runs: ``host`` (a task with CR3
    ``cr3``; at a stream's start, ``vmcs`` is the VMCS still current there
    from a vCPU that ran before, if any), ``vmm`` (the VMM process, CR3
    ``cr3``, handling vCPU ``vmcs``), ``vm`` (vCPU ``vmcs`` of the VM whose
    VMM has CR3 ``cr3``, running the guest process with CR3 ``guest``), or
    ``lost`` (an overflow: no trace until the next run)."""

    start: int
    what: str
    cr3: int = 0
    vmcs: int = 0
    guest: int = 0


@dataclass
class Scenario:
    name: str
    pcpus: dict[int, list[Run]]
    end: int
    tsc0: int = 1_000_000
    mtc_freq: int = 3
    ctc_ratio: int = 2
    psb_in_every_run: bool = True
    # Control-flow packets written per MTC period (TNT-8, every fourth a
    # TIP), standing in for what a real trace is mostly made of (the
    # analysis skips them).
    filler: int = 0
    # pCPUs whose trace ends before ``end`` (pCPU -> its stream's end).
    ends: dict[int, int] = field(default_factory=dict)
    # Each stream ends with a PSB+ (True) or with the timing packets (MTC)
    # up to its end and nothing else after its last PIP/VMCS (False).
    end_psb: bool = True
    notes: list[str] = field(default_factory=list)

    def end_of(self, pcpu: int) -> int:
        """Where pCPU ``pcpu``'s trace ends."""
        return self.ends.get(pcpu, self.end)

    @property
    def config(self) -> PtConfig:
        return PtConfig(mtc_freq=self.mtc_freq, cpuid_0x15_eax=1, cpuid_0x15_ebx=self.ctc_ratio)

    @property
    def resolution(self) -> int:
        """TSC ticks within which a boundary is known: one MTC period."""
        return (1 << self.mtc_freq) * self.ctc_ratio

    # -- packets ------------------------------------------------------------------------

    def streams(self) -> dict[int, bytes]:
        return {p: self._stream(runs, self.end_of(p)) for p, runs in self.pcpus.items()}

    def _stream(self, runs: list[Run], stream_end: int) -> bytes:
        # (time, kind, a, b); kind -1: PSB+ marker, -2: only the timing up to it
        ev: list[tuple[int, int, int, int]] = []
        loaded = 0  # the VMCS current on this pCPU
        if runs and runs[-1].start >= stream_end:
            raise ValueError(f"run at {runs[-1].start}: after its stream's end ({stream_end})")
        for i, r in enumerate(runs):
            end = runs[i + 1].start if i + 1 < len(runs) else stream_end
            prev = runs[i - 1] if i else None
            t = r.start
            if r.what == "lost":
                ev.append((t, int(Kind.OVF), 0, 0))
                continue
            if (
                r.what in ("vmm", "vm")
                and r.vmcs != loaded
                and not (prev is None or prev.what == "lost")
            ):
                if prev.what == "vm":
                    raise ValueError(f"run at {t}: a vCPU switch without a VM exit")
            if prev is None or prev.what == "lost":
                if r.what in ("vmm", "vm") or (prev is None and r.vmcs):
                    loaded = r.vmcs
                ev.append((t, -1, loaded, 0))
            else:
                ev.extend(self._transition(t, prev, r, loaded))
                if r.what in ("vmm", "vm"):
                    loaded = r.vmcs
            if self.psb_in_every_run and end - t > 4 * self.resolution:
                ev.append(((t + end) // 2, -1, loaded, 0))
        ev.append((stream_end, -1 if self.end_psb else -2, loaded, 0))
        return self._encode(ev, runs)

    @staticmethod
    def _transition(t: int, prev: Run, r: Run, loaded: int) -> list[tuple[int, int, int, int]]:
        pip, vmcs = int(Kind.PIP), int(Kind.VMCS)
        out = []
        if r.what == "vm":
            if prev.what == "host" or (prev.what in ("vmm", "vm") and prev.vmcs != r.vmcs):
                raise ValueError(f"run at {t}: a VM entry must follow the VMM of the same vCPU")
            if prev.what == "vmm" or prev.guest != r.guest:
                out.append((t, pip, r.guest & _PIP_CR3, 1))
            return out
        # host or vmm: root mode
        if prev.what == "vm" and r.what == "host":
            raise ValueError(f"run at {t}: leaving a guest for a host task needs a VM exit first")
        if prev.what == "vm" or prev.cr3 != r.cr3:
            out.append((t, pip, r.cr3 & _PIP_CR3, 0))
        if r.what == "vmm" and r.vmcs != loaded:
            out.append((t, vmcs, r.vmcs, 0))
        return out

    def _status(self, t: int, runs: list[Run], loaded: int) -> list[tuple[int, int, int]]:
        """PSB+ at ``t``: TSC, TMA, the PIP in force, the VMCS loaded."""
        r = max((x for x in runs if x.start <= t), key=lambda x: x.start)
        out = [(int(Kind.PSB), 0, 0), (int(Kind.TSC), t, 0),
               (int(Kind.TMA), (t // self.ctc_ratio) & 0xFFFF, t % self.ctc_ratio)]  # fmt: skip
        if r.what == "vm":
            out.append((int(Kind.PIP), r.guest & _PIP_CR3, 1))
        else:
            out.append((int(Kind.PIP), r.cr3 & _PIP_CR3, 0))
        if loaded:
            out.append((int(Kind.VMCS), loaded, 0))
        out.append((int(Kind.PSBEND), 0, 0))
        return out

    def _encode(self, ev: list[tuple[int, int, int, int]], runs: list[Run]) -> bytes:
        ev.sort(key=lambda e: e[0])
        f, ratio = self.mtc_freq, self.ctc_ratio
        kinds: list[np.ndarray] = []
        a_cols: list[np.ndarray] = []
        b_cols: list[np.ndarray] = []

        def put(k, a, b) -> None:
            kinds.append(np.asarray(k, np.uint8).reshape(-1))
            a_cols.append(np.asarray(a, np.uint64).reshape(-1))
            b_cols.append(np.asarray(b, np.uint32).reshape(-1))

        last = None  # the MTC period of the last timing packet
        lost = False
        for t, kind, a, _b in ev:
            period = (t // ratio) >> f
            if kind == -1:
                for k, x, y in self._status(t, runs, a):
                    put(k, x, y)
                last, lost = period, False
                continue
            if lost:
                continue
            if last is not None and period > last:
                if period - last >= 256:  # a long wait: the time in full
                    put([int(Kind.TSC), int(Kind.TMA)], [t, (t // ratio) & 0xFFFF], [0, t % ratio])
                else:
                    m = np.arange(last + 1, period + 1, dtype=np.uint64)
                    put(
                        np.full(m.shape[0], int(Kind.MTC)),
                        m & np.uint64(0xFF),
                        np.zeros(m.shape[0]),
                    )
                if self.filler:
                    # Branches: TNT bytes, and a TIP (48-bit IP) per 4 of them.
                    nf = self.filler * int(min(period - last, 256))
                    fk = np.full(nf, int(Kind.TNT8))
                    fk[3::4] = int(Kind.TIP)
                    put(fk, np.where(fk == int(Kind.TIP), 0x7F0000401000, 0b101010),
                        np.where(fk == int(Kind.TIP), 3, 6))  # fmt: skip
                last = period
            if kind != -2:
                put(kind, a, _b)
            if kind == int(Kind.OVF):
                lost = True
        k = np.concatenate(kinds)
        return encode_table(
            k, np.concatenate(a_cols), np.concatenate(b_cols), np.zeros(k.shape[0], np.uint8)
        )

    def tiled(self, data: bytes, copies: int) -> bytes:
        """``data`` (one of :meth:`streams`) repeated ``copies`` times, each
        copy later by a whole number of TMA and MTC wraps, so only its TSC
        packets change: a long trace for benchmarks, made in numpy."""
        from ..pt.packets import decode

        table = decode(data)
        wrap = self.ctc_ratio * 65536
        span = -(-(self.end + 1) // wrap) * wrap
        k = np.repeat(np.arange(copies, dtype=np.uint64), len(table))
        kinds = np.tile(table.kind, copies)
        a = np.tile(table.a, copies)
        a = np.where(kinds == int(Kind.TSC), a + k * np.uint64(span), a)
        return encode_table(kinds, a, np.tile(table.b, copies), np.tile(table.c, copies))

    # -- the answer ---------------------------------------------------------------------

    def truth(self) -> np.ndarray:
        """The intervals :func:`~hwtrace.analysis.vm.analyze` must find
        (exact times; the analysis's are up to :attr:`resolution` early)."""
        rows: list[tuple[int, int, int, int, int, int]] = []  # (t, entity, key, key2, state, pcpu)
        # vCPU timelines: (t, vcpu, state, process key or None), per pCPU in order.
        vevents: list[tuple[int, int, int, tuple[int, int] | None, int]] = []
        for p, runs in self.pcpus.items():
            current = None  # (vcpu, process) this pCPU is about
            for r in runs:
                rows.append((r.start, ENT_PCPU, p, 0, WHAT_STATE[r.what], p))
                if r.what in ("vm", "vmm"):
                    proc = (
                        (normalize_cr3(r.cr3), normalize_cr3(r.guest)) if r.what == "vm" else None
                    )
                    if proc is None and current is not None and current[0] == r.vmcs:
                        proc = current[1]
                    if current is not None and current[0] != r.vmcs:
                        vevents.append((r.start, current[0], ST_IDLE, None, p))
                    current = (r.vmcs, proc)
                    vevents.append((r.start, r.vmcs, WHAT_STATE[r.what], proc, p))
                elif r.what == "lost":
                    if current is not None:
                        vevents.append((r.start, current[0], ST_UNKNOWN, current[1], p))
                else:
                    if current is not None:
                        vevents.append((r.start, current[0], ST_IDLE, None, p))
                    current = None
            # Where its trace ends, the pCPU's intervals and its vCPU's end.
            if current is not None:
                vevents.append((self.end_of(p), current[0], -1, None, p))
            if self.end_of(p) < self.end:
                rows.append((self.end_of(p), ENT_PCPU, p, 0, -1, p))
        vevents.sort(key=lambda e: e[0])
        # vcpu -> (process, as what: a state, or ENDED: its trace ended there)
        vproc: dict[int, tuple[tuple[int, int], int]] = {}
        ended = 5
        counts: dict[tuple[int, int], list[int]] = {}
        pstate: dict[tuple[int, int], int] = {}
        vstate: dict[int, int] = {}
        for t, v, st, proc, p in vevents:
            if vstate.get(v) != st:
                vstate[v] = st
                rows.append((t, ENT_VCPU, v, 0, st, p))
            touched = []
            if v in vproc:
                q, was = vproc.pop(v)
                counts[q][was] -= 1
                touched.append(q)
                if st == -1:
                    counts[q][ended] += 1
                    vproc[v] = (q, ended)
            if proc is not None and st in (ST_VM, ST_VMM, ST_UNKNOWN):
                counts.setdefault(proc, [0] * 6)[st] += 1
                vproc[v] = (proc, st)
                touched.append(proc)
            for q in dict.fromkeys(touched):
                c = counts[q]
                s = (
                    ST_VM
                    if c[ST_VM]
                    else ST_VMM
                    if c[ST_VMM]
                    else ST_UNKNOWN
                    if c[ST_UNKNOWN]
                    else -1
                    if c[ended]
                    else ST_IDLE
                )
                if pstate.get(q, -1) != s:
                    pstate[q] = s
                    rows.append((t, ENT_PROCESS, q[0], q[1], s, p))
        rows.sort(key=lambda r: (r[1], r[2], r[3], r[0]))
        out = []
        for j, (t, e, k1, k2, st, p) in enumerate(rows):
            nxt = rows[j + 1] if j + 1 < len(rows) else None
            stop = nxt[0] if nxt is not None and nxt[1:4] == (e, k1, k2) else self.end
            if st >= 0 and stop > t:
                out.append((e, k1, k2, st, t, stop, p))
        from .vm import _merge_runs, _vmm_rows

        arr = _merge_runs(np.array(out, INTERVAL_DTYPE))
        vcpu_vm = {
            r.vmcs: normalize_cr3(r.cr3)
            for runs in self.pcpus.values()
            for r in runs
            if r.what in ("vm", "vmm")
        }
        return np.concatenate([arr, _vmm_rows(arr, vcpu_vm)])


# -- Sharma's scenarios (2017, ch. 6) ----------------------------------------------------------

QEMU = 0x7A3F0000  # the VMM's CR3 (a kernel page table, 8 KiB aligned as KPTI has it)
HOST_TASK = 0x1C2000


def prime_scenario(slices: int = 40, slice_ticks: int = 40_000, long_exit: int = 17) -> Scenario:
    """A VM with 4 vCPUs on one pCPU, each running a thread of one prime
    computation (one guest process, one CR3), taking turns; each turn is
    a VMCS load, VM entry, a run, a VM exit; one exit (turn ``long_exit``)
    lasts 20 times longer than the others (Sharma's anomalous VMM bar)."""
    vcpus = [0x10000 * (k + 1) for k in range(4)]
    guest = 0x3D0E000  # the prime computation's CR3
    runs: list[Run] = [Run(0, "host", HOST_TASK)]
    t = 2_000
    for s in range(slices):
        v = vcpus[s % 4]
        exit_ticks = 500 * (20 if s == long_exit else 1)
        runs.append(Run(t, "vmm", QEMU, v))
        runs.append(
            Run(t + 300, "vm", QEMU, v, guest | (0x1000 if s % 2 else 0) | ((s % 4 + 1) << 5))
        )
        runs.append(Run(t + slice_ticks, "vmm", QEMU, v))
        t += slice_ticks + exit_ticks
        if s % 4 == 3:
            runs.append(Run(t, "host", HOST_TASK))
            t += 1_000
    return Scenario("prime: 4 vCPUs on 1 pCPU", {0: runs}, t + 5_000)


def workers_scenario(turns: int = 12, turn_ticks: int = 60_000, vcpu: int = 0x20000) -> Scenario:
    """One vCPU whose guest runs 3 worker processes in turn (Sharma's
    RabbitMQ case): guest CR3 switches seen as PIPs with NR=1, and VM exits
    between some of them."""
    v = vcpu
    workers = [0x5A000, 0x6B000, 0x7C000]
    runs: list[Run] = [Run(0, "vmm", QEMU, v)]
    t = 1_000
    for k in range(turns):
        runs.append(Run(t, "vm", QEMU, v, workers[k % 3]))
        if k % 2:
            runs.append(Run(t + turn_ticks - 2_000, "vmm", QEMU, v))
        t += turn_ticks
    return Scenario("3 guest workers in turn", {0: runs}, t + 1_000)


QEMU_B = 0x4E2B6000  # a second VM's VMM


def mixed_scenario() -> Scenario:
    """Two VMs on two pCPUs: VM A's vCPU a0 migrates from pCPU 0 to pCPU 1,
    VM B's vCPU runs on pCPU 0 meanwhile; guest processes switch inside a
    run and with PCID/KPTI variants of their CR3; an overflow on pCPU 1 in
    the middle of a VM run; host tasks in between."""
    a0, a1, b0 = 0x11000, 0x12000, 0x21000
    g1, g2, h1 = 0x3000000, 0x3400000, 0x5000000
    p0 = [
        Run(0, "host", HOST_TASK),
        Run(3_000, "vmm", QEMU, a0),
        Run(3_400, "vm", QEMU, a0, g1 | 0x40),
        Run(20_000, "vm", QEMU, a0, g2 | 0x1000 | 0x60),  # a guest switch, seen at once
        Run(31_000, "vmm", QEMU, a0),
        Run(32_000, "host", HOST_TASK),  # a0's thread leaves pCPU 0 ...
        Run(34_000, "vmm", QEMU_B, b0),
        Run(34_500, "vm", QEMU_B, b0, h1),
        Run(60_000, "vmm", QEMU_B, b0),
        Run(61_000, "vm", QEMU_B, b0, h1 | 0x1000),
        Run(80_000, "vmm", QEMU_B, b0),
        Run(80_700, "host", HOST_TASK),
    ]
    p1 = [
        Run(0, "host", HOST_TASK + 0x8000),
        Run(5_000, "vmm", QEMU, a1),
        Run(5_300, "vm", QEMU, a1, g1),
        Run(30_000, "vmm", QEMU, a1),
        Run(30_400, "host", HOST_TASK + 0x8000),
        Run(40_000, "vmm", QEMU, a0),  # ... and comes back on pCPU 1
        Run(40_300, "vm", QEMU, a0, g2 | 0x20),
        Run(52_000, "lost"),  # overflow in the middle of the VM run
        Run(58_000, "vm", QEMU, a0, g2),
        Run(70_000, "vmm", QEMU, a0),
        Run(70_600, "vm", QEMU, a0, g1 | 0x1000),
        Run(85_000, "vmm", QEMU, a0),
        Run(85_900, "host", HOST_TASK + 0x8000),
    ]
    return Scenario("2 VMs, 2 pCPUs, migration, overflow", {0: p0, 1: p1}, 90_000)
