"""A software recording of a real program as perf.data: Linux perf decodes
exactly the instructions that were stepped, and so does hwtrace."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from hwtrace.perf.data import read_perf_data
from hwtrace.record import record_software
from hwtrace.record.perfdata import intel_pt_config, write_perf_data
from hwtrace.session.perfflow import decode_perf

PERF = shutil.which("perf")


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    from test_record_software import SKIP, build

    if SKIP is not None:
        pytest.skip(SKIP)
    exe = build("pie")
    out = tmp_path_factory.mktemp("rec") / "out"
    rec = record_software([str(exe), "work", "12", str(out)], functions=["work", "cmp_long"])
    assert os.WIFEXITED(rec.exit_status)
    path = tmp_path_factory.mktemp("rec") / "perf.data"
    write_perf_data(rec, path)
    return rec, path


def test_hwtrace_decodes_its_perf_data(recording):
    rec, path = recording
    data = read_perf_data(path)
    assert not data.errors, [str(e) for e in data.errors]
    flow = decode_perf(data)
    assert not flow.problems and flow.n_gaps == 0
    (q,) = flow.queues
    np.testing.assert_array_equal(q.flow.instructions(), rec.instructions)
    blocks = flow.blocks()
    assert set(blocks["pid"].tolist()) == {rec.pid}
    names = flow.symbol_names()
    assert any(n.endswith("!work") or n == "work" for n in names), names
    # Times are the stepping clock's, in perf ns, in order.
    ns = blocks["ns"][blocks["ns"] >= 0]
    assert ns.shape[0] and (np.diff(ns) >= 0).all()


@pytest.mark.skipif(PERF is None, reason="perf is not installed (Debian: linux-perf)")
def test_perf_lists_the_stepped_instructions(recording):
    from test_record_threads import perf_lists

    rec, path = recording
    got = perf_lists(path)
    assert list(got) == [rec.tid]
    np.testing.assert_array_equal(got[rec.tid], rec.instructions)


def test_config_bits():
    cfg = intel_pt_config({"tsc": True, "mtc": True, "mtc_period": 3, "psb_period": 4096})
    assert cfg & (1 << 10) and cfg & (1 << 9) and (cfg >> 14) & 15 == 3
    assert (cfg >> 24) & 15 == 1  # 2**(1 + 11) bytes
    cfg = intel_pt_config({"cyc": True, "cyc_thresh": 5})
    assert cfg & (1 << 1) and (cfg >> 19) & 15 == 5  # CycThresh, bits 19-22
    assert (intel_pt_config({"cyc_thresh": 5}) >> 19) & 15 == 0  # only with CYC
