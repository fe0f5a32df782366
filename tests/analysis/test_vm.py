"""HAVAna: VM analysis from Intel PT packets alone (``hwtrace.analysis.vm``).

Scenario streams from ``hwtrace.analysis.vmgen`` carry the packets a KVM
host traced in system-wide mode would write; the analysis must give back
every interval of the scenario's ground truth, each boundary within the
time resolution the timing packets allow (one MTC period: the time of a
PIP or VMCS is that of the last timing packet before it).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from hwtrace.analysis.vm import (
    ENTITY_NAMES,
    EV_PIP,
    EV_STATUS_PIP,
    EV_STATUS_VMCS,
    EV_VMCS,
    STATE_NAMES,
    analyze,
    stream_events,
)
from hwtrace.analysis.vmgen import (
    HOST_TASK,
    QEMU,
    Run,
    Scenario,
    mixed_scenario,
    prime_scenario,
    workers_scenario,
)

SCENARIOS = {"prime": prime_scenario, "workers": workers_scenario, "mixed": mixed_scenario}


def _labels(iv: np.ndarray) -> list[tuple[str, int, int, str]]:
    return [(ENTITY_NAMES[e], int(a), int(b), STATE_NAMES[s])
            for e, a, b, s in zip(iv["entity"], iv["key"], iv["key2"], iv["state"], strict=True)]  # fmt: skip


def _agrees_with_the_truth(sc: Scenario):
    """The analysis of ``sc``'s streams: every interval of its ground
    truth, each boundary at most one time resolution early."""
    got = analyze(sc.streams(), sc.config)
    truth = sc.truth()
    assert _labels(got.intervals) == _labels(truth)
    for edge in ("start", "end"):
        early = truth[edge].astype(np.int64) - got.intervals[edge].astype(np.int64)
        assert early.min() >= 0 and early.max() < sc.resolution, edge
    return got


@pytest.mark.parametrize("end_psb", [True, False], ids=["PSB+ at the end", "timing at the end"])
@pytest.mark.parametrize("filler", [0, 40], ids=["timing only", "with control flow"])
@pytest.mark.parametrize("name", SCENARIOS)
def test_every_interval_of_the_ground_truth(name, filler, end_psb):
    sc = SCENARIOS[name]()
    sc.filler = filler  # TNT bytes per MTC period, which the analysis skips
    sc.end_psb = end_psb
    _agrees_with_the_truth(sc)


def _span(iv: np.ndarray, state: str) -> int:
    sel = iv[iv["state"] == STATE_NAMES.index(state)]
    return int((sel["end"].astype(np.int64) - sel["start"].astype(np.int64)).sum())


def test_a_stream_ending_early_ends_its_intervals_there():
    """pCPU 1's trace ends at 20,000 while its vCPU runs a guest, pCPU 0's
    at 60,000: pCPU 1, its vCPU and that vCPU's guest process end at
    20,000, not at the end of the whole trace."""
    a0, a1, g1, g2 = 0x11000, 0x12000, 0x3000000, 0x3400000
    sc = Scenario(
        "pCPU 1 ends early",
        {0: [Run(0, "host", HOST_TASK), Run(2_000, "vmm", QEMU, a0), Run(2_300, "vm", QEMU, a0, g1),
             Run(40_000, "vmm", QEMU, a0), Run(41_000, "host", HOST_TASK)],
         1: [Run(0, "host", HOST_TASK + 0x8000), Run(3_000, "vmm", QEMU, a1),
             Run(3_300, "vm", QEMU, a1, g2)]},
        60_000, ends={1: 20_000},
    )  # fmt: skip
    got = _agrees_with_the_truth(sc)
    assert got.end == 60_000
    for rows, key in ((got.rows("pcpu"), 1), (got.rows("vcpu"), a1), (got.rows("process"), QEMU)):
        mine = rows[rows["key"] == key]
        if key == QEMU:
            mine = mine[mine["key2"] == g2]
        assert int(mine["end"].max()) == 20_000, (rows, key)
    a1_vm = _span(got.rows("vcpu")[got.rows("vcpu")["key"] == a1], "VM")
    assert a1_vm == pytest.approx(20_000 - 3_300, abs=sc.resolution)
    assert any("pCPU 1: its trace ends at 20000, before" in p for p in got.problems)


def test_the_end_is_the_last_timing_packet():
    """A VM entry followed by nothing but MTCs for 19,000 ticks: the
    stream ends at its last MTC, so the vCPU and its guest process run
    there, in the guest."""
    v, g = 0x20000, 0x5A000
    sc = Scenario("an entry, then only timing", {0: [Run(0, "vmm", QEMU, v), Run(1_000, "vm", QEMU, v, g)]},
                  20_000, end_psb=False, psb_in_every_run=False)  # fmt: skip
    got = _agrees_with_the_truth(sc)
    vcpu = got.rows("vcpu")
    assert _span(vcpu, "VM") > 18_900 and _span(vcpu, "VMM") <= 1_000
    assert _labels(got.rows("process")) == [("process", QEMU, g, "VM")]


def test_a_kpti_vmm_in_user_space_is_still_the_vmm():
    """A KPTI host with PCIDs: QEMU handles an exit in user space (its user
    page table, 4 KiB after the kernel one, and the user PCID, bit 11)
    for 20,000 ticks: one VMM exit of 20,700 ticks, not VMM, IDLE, VMM;
    and on another pCPU, with another PCID, it is the same VM."""
    a0, a1, g = 0x11000, 0x12000, 0x3000000
    kernel, user = QEMU | 2, QEMU | 0x1000 | 0x800 | 2
    sc = Scenario(
        "KPTI VMM",
        {0: [Run(0, "host", HOST_TASK), Run(2_000, "vmm", kernel, a0), Run(2_300, "vm", kernel, a0, g),
             Run(10_000, "vmm", kernel, a0), Run(10_300, "vmm", user, a0),
             Run(30_300, "vmm", kernel, a0), Run(30_700, "vm", kernel, a0, g),
             Run(50_000, "vmm", kernel, a0), Run(50_500, "host", HOST_TASK)],
         1: [Run(0, "host", HOST_TASK), Run(5_000, "vmm", QEMU | 3, a1),
             Run(5_400, "vm", QEMU | 3, a1, g | 0x1000 | 0x801)]},
        55_000,
    )  # fmt: skip
    got = _agrees_with_the_truth(sc)
    ticks = got.exits[:, 2].astype(np.int64) - got.exits[:, 1].astype(np.int64)
    assert got.exits[:, 0].tolist() == [a0, a0]
    assert abs(int(ticks[0]) - 20_700) < sc.resolution
    a0_rows = got.rows("vcpu")[got.rows("vcpu")["key"] == a0]
    assert [STATE_NAMES[s] for s in a0_rows["state"]] == ["VMM", "VM", "VMM", "VM", "VMM", "IDLE"]
    assert got.vcpu_vm == {a0: QEMU, a1: QEMU}
    procs = got.rows("process")
    assert set(procs["key"].tolist()) == {QEMU} and set(procs["key2"].tolist()) == {g}


def test_a_trace_starting_in_a_guest_knows_its_vm():
    """The trace starts while a guest runs (PSB+ with NR=1): the process
    seen before the first VM exit is the one seen after it, in the VM
    that exit names, not in an unknown VM 0."""
    v, g = 0x20000, 0x5A000
    sc = Scenario(
        "starts in a guest",
        {0: [Run(0, "vm", QEMU, v, g), Run(10_000, "vmm", QEMU, v), Run(10_500, "vm", QEMU, v, g),
             Run(20_000, "vmm", QEMU, v), Run(20_400, "host", HOST_TASK)]},
        25_000,
    )  # fmt: skip
    got = _agrees_with_the_truth(sc)
    procs = got.rows("process")
    assert set(procs["key"].tolist()) == {QEMU} and set(procs["key2"].tolist()) == {g}
    assert _span(procs, "VM") == pytest.approx(19_500, abs=2 * sc.resolution)


def test_a_trace_starting_in_a_host_task_with_a_vcpu_loaded():
    """The trace starts in a host task while a vCPU's VMCS is still current
    on that pCPU (PSB+ with NR=0 and a VMCS): the task is not that vCPU's
    VMM once a later exit shows the VMM's CR3."""
    v, g = 0x20000, 0x5A000
    sc = Scenario(
        "starts in a host task, a VMCS current",
        {0: [Run(0, "host", HOST_TASK, v), Run(5_000, "vmm", QEMU, v), Run(5_300, "vm", QEMU, v, g),
             Run(20_000, "vmm", QEMU, v), Run(20_500, "host", HOST_TASK)]},
        25_000,
    )  # fmt: skip
    got = _agrees_with_the_truth(sc)
    assert _span(got.rows("pcpu"), "HOST") == pytest.approx(5_000 + 4_500, abs=2 * sc.resolution)


def test_the_anomalous_exit_is_the_longest():
    sc = prime_scenario(long_exit=17)
    got = analyze(sc.streams(), sc.config)
    exits = got.exits
    assert exits.shape[0] == 40 and got.stats["vm_exits"] == 40
    ticks = exits[:, 2].astype(np.int64) - exits[:, 1].astype(np.int64)
    longest = int(np.argmax(ticks))
    assert int(exits[longest, 0]) == 0x20000  # turn 17 ran on the second vCPU
    assert abs(int(ticks[longest]) - 10_000) < sc.resolution  # until the next vCPU is loaded
    others = np.delete(ticks, longest)
    assert others.max() < 2_000
    # The hypervisor's row: VMM while a vCPU is in root mode (the loads and
    # the exits), IDLE while the guest runs.
    vmm = got.rows("vm")
    assert set(vmm["key"].tolist()) == {QEMU} and got.vcpu_vm[0x20000] == QEMU
    busy = vmm[vmm["state"] == 2]
    total = int((busy["end"].astype(np.int64) - busy["start"].astype(np.int64)).sum())
    assert total == pytest.approx(int(ticks.sum()) + 40 * 300, abs=80 * sc.resolution)


def test_one_process_across_pcid_and_kpti_variants():
    """The prime computation's four threads use four PCIDs and both KPTI
    page tables: one guest process."""
    sc = prime_scenario()
    got = analyze(sc.streams(), sc.config)
    procs = {
        (int(a), int(b))
        for a, b in zip(got.rows("process")["key"], got.rows("process")["key2"], strict=True)
    }
    assert len(procs) == 1


def test_libipt_decodes_the_streams_and_agrees_on_pip_and_vmcs(tmp_path):
    import libipt_oracle as oracle

    if oracle.skip_reason is not None:
        pytest.skip(oracle.skip_reason)
    sc = mixed_scenario()
    for pcpu, data in sc.streams().items():
        path = tmp_path / f"cpu{pcpu}.pt"
        path.write_bytes(data)
        rows = oracle.dump(path)
        assert not [r for r in rows if r["type"] == "error"]
        theirs = sorted(r["offset"] for r in rows if r["type"] in ("pip", "vmcs"))
        ev = stream_events(path, pcpu, sc.config)
        mine = np.isin(ev.kind, [EV_PIP, EV_VMCS, EV_STATUS_PIP, EV_STATUS_VMCS])
        assert theirs == sorted(int(o) for o in ev.offset[mine])


def test_not_a_vm_trace_is_said():
    from hwtrace.image import Image, Section
    from hwtrace.pt.encode import encode_path

    image = Image()
    image.add_section(Section.from_bytes(bytes.fromhex("90" * 8 + "c3"), 0x1000))
    enc = encode_path(np.arange(0x1000, 0x1008, dtype=np.uint64), image, end_ip=0x1008, tsc=5000)
    got = analyze({0: enc.data}, enc.config)
    assert got.intervals.shape[0] == 0
    assert any("not a trace of a VM host" in p for p in got.problems)


def test_a_truncated_stream_keeps_what_it_can():
    sc = mixed_scenario()
    streams = sc.streams()
    full = analyze(streams, sc.config)
    cut = dict(streams)
    cut[1] = streams[1][: len(streams[1]) // 2 + 3]  # ends inside a packet
    got = analyze(cut, sc.config)
    assert got.intervals.shape[0] > 0
    # pCPU 0 is untouched up to where pCPU 1's trace ends.
    v = got.rows("vcpu")
    b0 = v[v["key"] == 0x21000]
    assert _labels(b0) == _labels(full.rows("vcpu")[full.rows("vcpu")["key"] == 0x21000])
    assert got.streams[1].decode_errors == 1
    said = "\n".join(got.problems)
    assert "pCPU 1: 1 decode errors" in said and "pCPU 1: its trace ends at" in said


def _hwtrace(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "hwtrace.cli.main", "vm", *args],
                          capture_output=True, text=True, check=False)  # fmt: skip


def test_the_command(tmp_path):
    """``hwtrace vm`` over per-pCPU files: the summary, the intervals as
    JSON equal to the analysis's, and bad input as one message."""
    import json

    sc = mixed_scenario()
    args = []
    for pcpu, data in sc.streams().items():
        (tmp_path / f"cpu{pcpu}.pt").write_bytes(data)
        args += ["--cpu", f"{pcpu}={tmp_path / f'cpu{pcpu}.pt'}"]
    timing = ["--mtc-freq", "3", "--cpuid-0x15.eax", "1", "--cpuid-0x15.ebx", "2"]
    out = _hwtrace(*args, *timing, "--intervals", str(tmp_path / "iv.json"), "--tsc-hz", "2e9")
    assert out.returncode == 0, out.stderr
    assert "0x21000" in out.stdout and "longest" in out.stdout
    assert (
        out.stderr.strip()
        == "hwtrace vm: pCPU 1: 1 overflows (OVF): state unknown until the next PSB+"
    )
    rows = json.loads((tmp_path / "iv.json").read_text())["intervals"]
    assert len(rows) == analyze(sc.streams(), sc.config).intervals.shape[0]
    missing = _hwtrace("--cpu", "0=/nonexistent.pt")
    assert (
        missing.returncode == 1
        and missing.stderr == "hwtrace vm: pCPU 0: /nonexistent.pt: no such file\n"
    )
    bad = _hwtrace("--cpu", "x")
    assert bad.returncode == 2 and "expected N=FILE" in bad.stderr and "Traceback" not in bad.stderr


def test_a_tiled_stream_repeats_the_analysis():
    """Copies of a stream, each later by whole TMA/MTC wraps (how the
    benchmark makes a long trace): the analysis sees each copy's exits."""
    sc = workers_scenario()
    one = analyze(sc.streams(), sc.config)
    many = analyze({0: sc.tiled(sc.streams()[0], 5)}, sc.config)
    assert many.stats["vm_exits"] == 5 * one.stats["vm_exits"]
    assert many.exits.shape[0] == 5 * one.exits.shape[0]


def test_the_views(tmp_path):
    """The HTML time graph (both views) opens in headless Chromium with the
    network off, draws every row with intervals, and is not blank; the
    Perfetto timeline is valid trace-event JSON with a slice per interval."""
    import json
    import re

    from test_views import CHROMIUM, browse, not_blank, self_contained

    from hwtrace.export.html import write_page
    from hwtrace.export.vmviews import vm_page, vm_rows, write_vm_timeline

    sc = prime_scenario()
    got = analyze(sc.streams(), sc.config)
    timeline = tmp_path / "vm.json"
    events = write_vm_timeline(got, timeline, tsc_hz=2e9)
    trace = json.loads(timeline.read_text())["traceEvents"]
    slices = [e for e in trace if e["ph"] == "X"]
    assert len(trace) == events and len(slices) == sum(r.shape[0] for _, _, r in vm_rows(got))
    assert {e["name"] for e in slices} <= {"IDLE", "VM", "VMM", "HOST", "UNKNOWN"}
    html = tmp_path / "vm.html"
    write_page(html, vm_page(got, "prime", "4 vCPUs on 1 pCPU", tsc_hz=2e9))
    self_contained(html.read_text())
    if CHROMIUM is None:
        pytest.skip("headless Chromium is not installed (Debian: chromium)")
    for anchor, labels in (("", ["vCPU 0x10000", "vCPU 0x40000", "pCPU 0"]),
                           ("#vm-control-flow", ["VM 0x7a3f0000 CR3 0x3d0e000"])):  # fmt: skip
        dom, pixels = browse(html, tmp_path, anchor)
        assert 'data-rendered="vm"' in dom
        for label in labels:
            assert f">{label}<" in dom
        assert len(re.findall(r'<rect class="iv"', dom)) >= 20
        not_blank(pixels)


def test_ctf_and_the_trace_compass_analysis(tmp_path):
    """The state changes as CTF, which babeltrace2 reads back event for
    event, and the Trace Compass XML analysis beside it, valid against
    Trace Compass's own schema (tests/data/tracecompass)."""
    import shutil
    import subprocess
    from pathlib import Path

    from hwtrace.export.vmviews import write_vm_ctf

    sc = mixed_scenario()
    got = analyze(sc.streams(), sc.config)
    n = write_vm_ctf(got, tmp_path / "vm", tsc_hz=1e9)
    assert n == got.intervals.shape[0]
    etree = pytest.importorskip("lxml.etree")
    schema = etree.XMLSchema(
        etree.parse(str(Path(__file__).parents[1] / "data" / "tracecompass" / "xmlDefinition.xsd"))
    )
    doc = etree.parse(str(tmp_path / "vm.tracecompass.xml"))
    assert schema.validate(doc), schema.error_log
    views = [v.find("head/label").get("value") for v in doc.getroot().iter("timeGraphView")]
    assert views == ["VM Resource", "VM Control Flow"]
    bt = shutil.which("babeltrace2")
    if bt is None:
        pytest.skip("babeltrace2 is not installed (Debian: babeltrace2)")
    out = subprocess.run(
        [bt, str(tmp_path / "vm")], capture_output=True, text=True, check=True
    ).stdout
    lines = out.splitlines()
    assert len(lines) == n
    vcpu = [ln for ln in lines if "vcpu_state:" in ln]
    assert len(vcpu) == got.rows("vcpu").shape[0]
    assert "vcpu = 0x11000, state = 4" in out  # UNKNOWN across the overflow


def test_vmpt_bundles_round_trip(tmp_path):
    """vmpt's bundles.xml (the thesis's released decoder's output) written
    and read back gives the same analysis (without overflows, which the
    format cannot say); a file in vmpt's own layout reads; a wrong file is
    one message."""
    from hwtrace.analysis.vm import read_bundles, write_bundles

    for sc in (prime_scenario(), workers_scenario()):
        ev = stream_events(sc.streams()[0], 0, sc.config)
        write_bundles(ev, tmp_path / "bundles.xml")
        again = analyze([read_bundles(tmp_path / "bundles.xml")])
        first = analyze([ev])
        cols = ["entity", "key", "key2", "state", "start", "end"]
        assert np.array_equal(first.intervals[cols], again.intervals[cols])
    (tmp_path / "vmpt.xml").write_text(
        "<vmpt>\n\t<bundle>\n\t\t<pip> 7a3f1000 </pip>\n\t\t<nr> 0 </nr>\n\t\t<vmcs> 20000 </vmcs>\n"
        "\t\t<tsc> 1000 </tsc>\n\t</bundle>\n\t<bundle>\n\t\t<pip> 5a000 </pip>\n\t\t<nr> 1 </nr>\n"
        "\t\t<vmcs> 20000 </vmcs>\n\t\t<tsc> 1500 </tsc>\n\t</bundle>\n\t<bundle>\n\t\t<pip> 7a3f1000 </pip>\n"
        "\t\t<nr> 0 </nr>\n\t\t<vmcs> 20000 </vmcs>\n\t\t<tsc> 9000 </tsc>\n\t</bundle>\n</vmpt>\n"
    )
    got = analyze([read_bundles(tmp_path / "vmpt.xml")])
    v = got.rows("vcpu")
    # (the trace ends with the exit at 9000)
    assert _labels(v) == [("vcpu", 0x20000, 0, "VMM"), ("vcpu", 0x20000, 0, "VM")]
    assert v["start"].tolist() == [1000, 1500] and v["end"].tolist() == [1500, 9000]
    assert got.stats["vm_exits"] == 1
    (tmp_path / "bad.xml").write_text("<html></html>")
    out = _hwtrace(str(tmp_path / "bad.xml"))
    assert (
        out.returncode == 1
        and "not a vmpt bundles.xml" in out.stderr
        and "Traceback" not in out.stderr
    )


def test_contention_counts_the_vcpus_taking_turns():
    """The prime computation's 4 vCPUs share one pCPU: a window of four
    turns sees all of them, a window shorter than a turn at most two (a
    turn and its neighbour's)."""
    sc = prime_scenario()
    got = analyze(sc.streams(), sc.config)
    assert int(got.contention(4 * 41_000)[0].max()) == 4
    assert int(got.contention(30_000)[0].max()) <= 2
    mixed = analyze(mixed_scenario().streams(), sc.config)
    per = mixed.contention(10_000)
    # pCPU 0: a0 leaves at 32,000 and b0 comes at 34,000, in one window;
    # pCPU 1: a1 leaves at 30,400, a0 comes at 40,000, the next window.
    assert set(per) == {0, 1} and int(per[0].max()) == 2 and int(per[1].max()) == 1


def test_a_system_wide_perf_data(tmp_path):
    """A perf.data as ``perf record -e intel_pt// -a`` writes it on a KVM
    host (per-CPU AUX queues, TIME_CONV, COMM and SWITCH sideband): the
    same analysis as from the raw streams, and each vCPU named by the host
    thread that ran it (QEMU's ``CPU n/KVM``)."""
    from hwtrace.analysis.vm import analyze_perf
    from hwtrace.perf.data import PerfData
    from hwtrace.perf.records import Comm, SampleId, SampleType, Switch
    from hwtrace.perf.writer import INTEL_PT_CONFIG_BITS as B
    from hwtrace.perf.writer import PerfDataWriter

    sc = mixed_scenario()
    qemu = {0x7A3F0000: 500, 0x4E2B6000: 600}  # VMM CR3 -> pid
    vcpu_tid = {0x11000: 501, 0x12000: 502, 0x21000: 601}
    path = tmp_path / "kvm.data"
    with PerfDataWriter(path) as w:
        st = SampleType.IP | SampleType.TID | SampleType.TIME | SampleType.IDENTIFIER
        pt = w.set_intel_pt(config=B["pt"] | B["branch"] | B["tsc"] | B["mtc"] | (3 << 14),
                            sample_type=st, time_mult=1, cap_user_time_zero=True,
                            tsc_ctc_ratio=(2, 1), per_cpu_mmaps=True, exclude_kernel=False)  # fmt: skip
        for pid in qemu.values():
            w.add_record(
                Comm(pid, pid, "qemu-system-x86"),
                attr=pt,
                sample_id=SampleId(pid=pid, tid=pid, time=0, cpu=0),
            )
        for tid in vcpu_tid.values():
            pid = 500 if tid < 600 else 600
            w.add_record(Comm(pid, tid, f"CPU {tid % 100 - 1}/KVM"), attr=pt,
                         sample_id=SampleId(pid=pid, tid=tid, time=0, cpu=0))  # fmt: skip
        for cpu, runs in sc.pcpus.items():
            for r in runs:
                tid = vcpu_tid[r.vmcs] if r.what in ("vm", "vmm") else 100 + cpu
                pid = 500 if tid // 100 == 5 else 600 if tid // 100 == 6 else tid
                w.add_record(
                    Switch(False),
                    attr=pt,
                    sample_id=SampleId(pid=pid, tid=tid, time=r.start, cpu=cpu),
                )
        for cpu, data in sc.streams().items():
            w.add_auxtrace(data, cpu=cpu, tid=-1, idx=cpu)
    got = analyze_perf(PerfData(str(path)))
    raw = analyze(sc.streams(), sc.config)
    cols = ["entity", "key", "key2", "state", "start", "end"]
    assert np.array_equal(got.intervals[cols], raw.intervals[cols])
    assert got.names[("vcpu", 0x11000)] == "CPU 0/KVM (tid 501, pid 500)"
    assert got.names[("vcpu", 0x21000)] == "CPU 0/KVM (tid 601, pid 600)"


def test_the_command_on_a_perf_data(tmp_path):
    """``hwtrace vm -i perf.data``: names from the sideband in the summary;
    a file that is no perf.data is one message."""
    test_a_system_wide_perf_data(tmp_path)
    out = _hwtrace("-i", str(tmp_path / "kvm.data"))
    assert out.returncode == 0, out.stderr
    assert "CPU 0/KVM (tid 501, pid 500)" in out.stdout
    (tmp_path / "junk.data").write_bytes(b"PERFILE2" + bytes(40))
    bad = _hwtrace("-i", str(tmp_path / "junk.data"))
    assert (
        bad.returncode == 1
        and bad.stderr.startswith("hwtrace vm: ")
        and "Traceback" not in bad.stderr
    )


def test_streams_that_disagree_in_time_are_said():
    """The same pCPU's stream given as two pCPUs (as streams of different
    recordings would): each vCPU runs on two pCPUs at once, which is said."""
    sc = workers_scenario()
    data = sc.streams()[0]
    got = analyze({0: data, 1: data}, sc.config)
    assert got.stats["overlaps"] > 0
    assert any("ran on two pCPUs at once" in p and "0x20000" in p for p in got.problems)
    assert analyze({0: data}, sc.config).stats["overlaps"] == 0


def test_the_time_resolution_is_stated():
    from hwtrace.analysis.vm import time_resolution

    sc = prime_scenario()
    assert time_resolution(sc.config) == sc.resolution == 16
    assert analyze(sc.streams(), sc.config).resolution == 16
    out = _hwtrace(*_write(sc), "--mtc-freq", "3", "--cpuid-0x15.eax", "1", "--cpuid-0x15.ebx", "2")
    assert "known to within 16 ticks (one MTC period)" in out.stdout


def _write(sc) -> list[str]:
    import tempfile
    from pathlib import Path

    d = Path(tempfile.mkdtemp(prefix="hwtrace-vm-"))
    args = []
    for pcpu, data in sc.streams().items():
        (d / f"cpu{pcpu}.pt").write_bytes(data)
        args += ["--cpu", f"{pcpu}={d / f'cpu{pcpu}.pt'}"]
    return args


def test_fuzzed_streams_and_bundles_never_crash(tmp_path):
    """Random damage to a host stream (bytes flipped, cut, spliced) and to
    a bundles.xml: the analysis keeps what it can, never a traceback."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from hwtrace.analysis.vm import read_bundles, write_bundles

    sc = mixed_scenario()
    base = sc.streams()[1]
    ev = stream_events(base, 0, sc.config)
    write_bundles(ev, tmp_path / "b.xml")
    text = (tmp_path / "b.xml").read_bytes()

    @settings(
        max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(st.lists(st.tuples(st.integers(0, len(base) - 1), st.integers(0, 255)), max_size=12),
           st.integers(0, len(base)), st.binary(max_size=64))  # fmt: skip
    def damaged_stream(flips, cut, junk):
        data = bytearray(base)
        for at, value in flips:
            data[at] = value
        data = bytes(data[:cut]) + junk + bytes(data[cut:])
        got = analyze({0: data, 1: base}, sc.config)
        assert got.intervals.shape[0] > 0  # pCPU 1 is whole

    @settings(
        max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(st.integers(0, len(text)), st.binary(max_size=40))
    def damaged_bundles(cut, junk):
        path = tmp_path / "d.xml"
        path.write_bytes(text[:cut] + junk + text[cut:])
        try:
            got = read_bundles(path)
        except ValueError:
            return
        analyze([got])

    damaged_stream()
    damaged_bundles()


def test_exit_reasons_from_kvm_exit_samples(tmp_path):
    """With ``-e kvm:kvm_exit`` recorded beside the PT, each exit gets the
    reason of the sample the host took right after it, named from the
    event's own format (its VMX reason table, in TRACING_DATA)."""
    import struct
    from pathlib import Path
    from types import SimpleNamespace

    from hwtrace.analysis.vm import analyze_perf
    from hwtrace.ktrace.output import build_tracing_data
    from hwtrace.perf.attr import PerfEventAttr
    from hwtrace.perf.data import PerfData
    from hwtrace.perf.features import Feature
    from hwtrace.perf.records import SampleType
    from hwtrace.perf.writer import INTEL_PT_CONFIG_BITS as B
    from hwtrace.perf.writer import PerfDataWriter

    fmt = Path("/sys/kernel/tracing/events/kvm/kvm_exit/format")
    if not fmt.exists():
        pytest.skip("no kvm:kvm_exit format in tracefs")
    text = fmt.read_text()
    event_id = int(re.search(r"^ID:\s*(\d+)", text, re.M)[1])
    sc = mixed_scenario()
    raw = analyze(sc.streams(), sc.config)
    codes = [12, 48, 30, 1, 10, 28]  # HLT, EPT_VIOLATION, IO_INSTRUCTION, ...
    path = tmp_path / "kvm.data"
    st = (
        SampleType.IDENTIFIER
        | SampleType.TID
        | SampleType.TIME
        | SampleType.CPU
        | SampleType.PERIOD
        | SampleType.RAW
    )
    with PerfDataWriter(path) as w:
        w.set_intel_pt(config=B["pt"] | B["branch"] | B["tsc"] | B["mtc"] | (3 << 14), time_mult=1,
                       sample_type=SampleType.IP | SampleType.TID | SampleType.TIME | SampleType.IDENTIFIER,
                       cap_user_time_zero=True, tsc_ctc_ratio=(2, 1), per_cpu_mmaps=True)  # fmt: skip
        kvm = w.add_attr(PerfEventAttr(type=2, config=event_id, sample_period=1, sample_type=int(st),
                                       sample_id_all=1), name="kvm:kvm_exit")  # fmt: skip
        w.set_feature(
            Feature.TRACING_DATA,
            build_tracing_data([SimpleNamespace(name="kvm:kvm_exit", format_text=text)]),
        )
        ident = w.attrs[kvm][1][0]
        for k, (_vcpu, start, _end, pcpu) in enumerate(raw.exits.tolist()):
            rec = bytearray(72)
            struct.pack_into("<HBBi", rec, 0, event_id, 0, 0, 500)
            struct.pack_into("<I", rec, 8, codes[k % len(codes)])
            struct.pack_into("<I", rec, 24, 1)  # isa: VMX
            body = struct.pack(
                "<QIIQIIQI", ident, 500, 501, start + 40, pcpu, 0, 1, len(rec) + 4
            ) + bytes(rec)
            body += bytes(-len(body) % 8)
            w.add_record(body, attr=kvm, type=9)
        for cpu, data in sc.streams().items():
            w.add_auxtrace(data, cpu=cpu, tid=-1, idx=cpu)
    got = analyze_perf(PerfData(str(path)))
    assert got.exits.shape[0] == raw.exits.shape[0] == 6
    assert got.exit_reasons.tolist() == codes
    assert [got.reason_names[c] for c in codes[:3]] == ["HLT", "EPT_VIOLATION", "IO_INSTRUCTION"]
    out = _hwtrace("-i", str(path))
    assert "exit reasons (kvm:kvm_exit): " in out.stdout and "HLT 1" in out.stdout
