"""Decoding Intel PT from perf.data with its sideband: attribution to threads."""

from pathlib import Path

import groundtruth as gt
import numpy as np
import pytest

from hwtrace.image import Image
from hwtrace.perf.data import read_perf_data
from hwtrace.perf.sideband import BinaryLocator
from hwtrace.perf.trace import decode_perf, sideband_of
from hwtrace.perf.writer import INTEL_PT_CONFIG_BITS
from hwtrace.pt.encode import encode_path

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
