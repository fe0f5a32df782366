"""Decoding Intel PT from perf.data with its sideband: attribution to threads."""

import itertools
from pathlib import Path

import groundtruth as gt
import numpy as np
import pytest

from hwtrace.image import Image
from hwtrace.perf.data import read_perf_data
from hwtrace.perf.intelpt import sideband_of
from hwtrace.perf.sideband import BinaryLocator
from hwtrace.perf.writer import INTEL_PT_CONFIG_BITS
from hwtrace.pt.encode import encode_path
from hwtrace.session.perfflow import decode_perf

pytestmark = pytest.mark.skipif(gt.skip_reason is not None, reason=str(gt.skip_reason))


def _write(path: Path, run: gt.Run, pt: bytes) -> None:
    from test_perf_data import write_pt_file

    write_pt_file(path, run, pt, INTEL_PT_CONFIG_BITS["pt"] | INTEL_PT_CONFIG_BITS["branch"])


def _fib_perf_data(tmp_path: Path):
    """fib's ground-truth path as PT in a perf.data; (run, encoded, data)."""
    run = gt.case("fib", "-O2")
    image = Image()
    image.add_elf(run.elf, run.load_address)
    enc = encode_path(run.ips, image, end_ip=run.end_ip)
    path = tmp_path / "pt.data"
    _write(path, run, enc.data)
    return run, enc, read_perf_data(path)


def test_decode_perf_attributes_the_flow(tmp_path):
    _, enc, data = _fib_perf_data(tmp_path)
    sb = sideband_of(data)
    (pid,) = sb.spaces
    assert sb.comm_of(pid) == "groundtruth"

    flow = decode_perf(data, BinaryLocator(buildid_dirs=()))
    assert not flow.problems and flow.n_gaps == 0
    (q,) = flow.queues
    assert q.tid == pid and q.cpu == -1
    np.testing.assert_array_equal(q.flow.instructions(), enc.expected)
    blocks = flow.blocks()
    assert set(blocks["pid"].tolist()) == {pid} and set(blocks["tid"].tolist()) == {pid}
    names = flow.symbol_names()
    assert int(blocks["ninsn"].sum()) == len(enc.expected)
    assert any(n.endswith("fib") for n in names), names


def test_decode_perf_reports_a_missing_binary(tmp_path):
    run, _, data = _fib_perf_data(tmp_path)
    # The binary is gone (another root): a gap, and the dso named.
    flow = decode_perf(data, BinaryLocator(root=tmp_path / "nowhere", buildid_dirs=()))
    assert any(str(run.elf) in p and "not found" in p for p in flow.problems)
    assert flow.n_gaps > 0


# -- per-CPU tracing of two processes ---------------------------------------------------

_P1, _P2 = 101, 202


def _slices(run: gt.Run, cuts: list[int]) -> list[tuple[np.ndarray, int]]:
    """The run's path cut into pieces: (ips, where the piece's flow went)."""
    edges = [0, *cuts, len(run.ips)]
    out = []
    for a, b in itertools.pairwise(edges):
        end = int(run.ips[b]) if b < len(run.ips) else run.end_ip
        out.append((run.ips[a:b], end))
    return out


def test_per_cpu_trace_of_two_processes_with_the_same_addresses(tmp_path):
    """Two processes whose different code sits at the same addresses (-O0
    and -O2 builds), scheduled in turns on two CPUs: each CPU's trace goes
    from one process to the other at the context switches, and must be
    decoded with each stretch's own binary and attributed to its thread."""
    from test_perf_data import add_elf_mmaps

    from hwtrace.perf.records import Comm, SampleId, SampleType, SwitchCpuWide
    from hwtrace.perf.writer import PerfDataWriter

    runs = {_P1: gt.case("sort", "-O0"), _P2: gt.case("interp", "-O2")}
    assert runs[_P1].elf != runs[_P2].elf
    pieces = {pid: _slices(r, [len(r.ips) // 3, 2 * len(r.ips) // 3]) for pid, r in runs.items()}
    # (time, cpu, pid, piece): A1 B1 A3 on CPU 0, B2 A2 B3 on CPU 1.
    plan = [
        (1_000, 0, _P1, 0), (2_000, 0, _P2, 0), (3_000, 1, _P2, 1),
        (4_000, 1, _P1, 1), (5_000, 0, _P1, 2), (6_000, 1, _P2, 2),
    ]  # fmt: skip
    images = {}
    for pid, r in runs.items():
        images[pid] = Image()
        images[pid].add_elf(r.elf)
    per_cpu: dict[int, list] = {0: [], 1: []}
    expected: dict[int, list[np.ndarray]] = {0: [], 1: []}
    for t, cpu, pid, k in plan:
        ips, end = pieces[pid][k]
        enc = encode_path(ips, images[pid], end_ip=end, tsc=t)
        per_cpu[cpu].append((t, pid, enc.data))
        expected[cpu].append(enc.expected)

    bits = INTEL_PT_CONFIG_BITS
    path = tmp_path / "percpu.data"
    st = SampleType
    with PerfDataWriter(path) as w:
        w.set_intel_pt(
            config=bits["pt"] | bits["branch"] | bits["tsc"],
            sample_type=st.IP | st.TID | st.TIME | st.IDENTIFIER,
            time_shift=0, time_mult=1, time_zero=0, cap_user_time_zero=True,
            per_cpu_mmaps=True, context_switch=True,
        )  # fmt: skip
        for pid, r in runs.items():
            sid = SampleId(pid=pid, tid=pid, time=1, cpu=0)
            w.add_record(Comm(pid, pid, f"proc{pid}"), sample_id=sid)
            add_elf_mmaps(w, r.elf, pid, sid)
        w.finished_init()
        running = {0: None, 1: None}
        for t, cpu, pid, _ in plan:
            prev = running[cpu]
            if prev is not None:
                w.add_record(
                    SwitchCpuWide(pid, pid, out=True),
                    sample_id=SampleId(pid=prev, tid=prev, time=t - 10, cpu=cpu),
                )
            w.add_record(
                SwitchCpuWide(prev or 0, prev or 0, out=False),
                sample_id=SampleId(pid=pid, tid=pid, time=t - 5, cpu=cpu),
            )
            running[cpu] = pid
        for cpu, parts in per_cpu.items():
            w.add_auxtrace(b"".join(d for _, _, d in parts), cpu=cpu, idx=cpu)
        w.finished_round()

    data = read_perf_data(path)
    assert not data.errors, [str(e) for e in data.errors]
    flow = decode_perf(data, BinaryLocator(buildid_dirs=()))
    assert not flow.problems, flow.problems
    assert flow.n_gaps == 0, [str(g) for q in flow.queues for g in q.flow.gaps]
    assert [q.cpu for q in flow.queues] == [0, 1]
    for q in flow.queues:
        np.testing.assert_array_equal(q.instructions(), np.concatenate(expected[q.cpu]))
        # Each block belongs to the process whose piece it decodes.
        owner = np.repeat(q.block_tid, q.flow.block_ninsn.astype(np.int64))
        want = np.concatenate(
            [
                np.full(len(e), pid)
                for (_, pid, _), e in zip(per_cpu[q.cpu], expected[q.cpu], strict=True)
            ]
        )
        np.testing.assert_array_equal(owner, want)
    blocks = flow.blocks()
    for pid in runs:
        total = sum(
            len(e)
            for cpu in (0, 1)
            for (_, p, _), e in zip(per_cpu[cpu], expected[cpu], strict=True)
            if p == pid
        )
        assert int(blocks["ninsn"][blocks["pid"] == pid].sum()) == total
    assert np.all(np.diff(blocks["ns"]) >= 0)
