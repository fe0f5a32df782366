"""hwtrace characterize: a ground-truth path encoded with each setting
shows the trends the settings must give (sizes fall with longer periods,
resolution coarsens; CYC and MTC refine it), the decoded time's changes are
counted exactly, and the command works on a recording, with its views."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from groundtruth import skip_reason

from hwtrace.analysis.characterize import (
    ExecutedPath,
    Setting,
    characterize,
    default_settings,
    grid,
)

pytestmark = pytest.mark.skipif(skip_reason is not None, reason=str(skip_reason))


@pytest.fixture(scope="module")
def path():
    import groundtruth as gt

    from hwtrace.image import Image

    run = gt.run("mixed", (9, 400), "-O2", blocks=True)
    image = Image()
    image.add_elf(run.elf)
    rng = np.random.default_rng(2)
    ips = run.ips[:-1]  # it ends in a return the path does not follow
    cycles = rng.integers(1, 6, ips.shape[0])
    return ExecutedPath([(ips, cycles)], image, tsc_hz=2e9, tid=1, ctc_ratio=64)


def test_sweeps_show_the_settings_trends(path):
    out = characterize(path, default_settings())
    by = {o.setting: o for o in out}
    psb = [by[Setting(p, None, False)] for p in (256, 1024, 4096, 16384, 65536)]
    assert all(a.bytes >= b.bytes for a, b in itertools.pairwise(psb))
    assert all(a.dt_median_ns <= b.dt_median_ns for a, b in itertools.pairwise(psb))
    mtc = [by[Setting(4096, m, False)] for m in (0, 3, 6, 9, 12)]
    assert all(a.bytes >= b.bytes for a, b in itertools.pairwise(mtc))
    assert all(a.updates >= b.updates for a, b in itertools.pairwise(mtc))
    assert mtc[0].dt_median_ns < psb[-1].dt_median_ns
    cyc, no_cyc = by[Setting(4096, 3, True)], by[Setting(4096, 3, False)]
    assert cyc.updates > no_cyc.updates and cyc.bytes > no_cyc.bytes
    assert cyc.dt_median_ns <= no_cyc.dt_median_ns
    noret = by[Setting(4096, 3, False, False)]
    assert noret.bytes > no_cyc.bytes  # returns as TIPs
    trf = np.array([o.trf for o in out])
    assert trf.min() == 0 and trf.max() == 100
    assert all(o.instructions == path.instructions for o in out)


def test_resolution_counts_the_time_changes(path):
    """With CYC and MTC 0, every timing packet moves the decoded time: the
    changes are where the encoder put a timing packet before a block."""
    from hwtrace.pt.decode import decode_trace
    from hwtrace.pt.encode import encode_path

    (o,) = characterize(path, [Setting(4096, 0, True)])
    ips, cycles = path.stretches[0]
    enc = encode_path(ips, path.image, psb_period=4096, tsc=1 << 32, mtc_freq=0, cyc=True,
                      cycles=cycles, ctc_ratio=path.ctc_ratio)  # fmt: skip
    t = decode_trace(enc.data, path.image, enc.config).block_time.astype(np.int64)
    assert o.updates == int((np.diff(t) != 0).sum())
    assert o.bytes == len(enc.data)


def test_a_stretch_ending_in_branches_is_encoded_without_them(path):
    """A stretch that ends where tracing stopped may end in more than one
    instruction whose successor the recording lacks (a conditional branch
    falling through to another): they are left out, as many as it takes,
    and the rest is characterised (it ended in a traceback)."""
    from hwtrace.pt.encode import encode_path

    ips, cycles = path.stretches[0]

    def encodes(k: int) -> bool:
        try:
            encode_path(ips[:k], path.image, psb_period=4096, tsc=1 << 32)
        except ValueError as e:
            assert "next IP is not known" in str(e)
            return False
        return True

    k = next(k for k in range(3, 5000) if not encodes(k) and not encodes(k - 1))
    short = ExecutedPath([(ips[:k], cycles[:k])], path.image, tsc_hz=2e9, tid=1, ctc_ratio=64)
    (o,) = characterize(short, [Setting(4096, 3, False)])
    kept = next(j for j in range(k - 2, 0, -1) if encodes(j))
    assert o.instructions == kept < k - 1


def test_grid_is_every_combination():
    g = grid([256, 4096], [None, 3], [False, True])
    assert len(g) == 8 and len(set(g)) == 8


def test_command_on_a_recording(tmp_path, capsys):
    from test_record_calls import build
    from test_record_software import SKIP

    if SKIP is not None:
        pytest.skip(str(SKIP))
    from hwtrace.cli.main import main
    from hwtrace.record import record_software
    from hwtrace.record.perfdata import write_perf_data

    rec = record_software([build(), str(tmp_path / "out")], calls=["fib"])
    data = tmp_path / "perf.data"
    write_perf_data(rec, data, buildid_cache=False)
    out, page = tmp_path / "c.json", tmp_path / "c.html"
    capsys.readouterr()
    assert main(["characterize", "-i", str(data), "--cpi", "1", "--psb", "256,4096",
                 "--mtc", "off,3", "--cyc", "off,on", "--json", str(out),
                 "--html", str(page)]) == 0  # fmt: skip
    got = json.loads(out.read_text())
    assert len(got["settings"]) == 8
    assert got["instructions"] == sum(
        len(t.instructions) for t in rec.threads if t.tid == got["tid"]
    )
    assert '"view":"plots"' in page.read_text()
    with pytest.raises(SystemExit) as exit_:
        main(["characterize", "-i", str(data), "--mtc", "99"])
    assert exit_.value.code == 2 and "MTC period 99: 0-15" in capsys.readouterr().err
    for option in ("--cpi", "--rate"):
        with pytest.raises(SystemExit) as exit_:
            main(["characterize", "-i", str(data), option, "nan"])
        assert exit_.value.code == 2 and f"{option} nan: a positive" in capsys.readouterr().err
    assert main(["characterize", "-i", str(tmp_path / "none.data")]) == 1


def test_cyc_threshold_thins_the_cyc_packets(path):
    """A CYC only after 2**(n-1) cycles: fewer CYC packets as n grows, each
    carrying at least that many cycles, and the flow still decodes the same."""
    from hwtrace.pt.decode import decode_trace
    from hwtrace.pt.encode import encode_path
    from hwtrace.pt.kinds import Kind
    from hwtrace.pt.packets import decode

    ips, cycles = path.stretches[0]
    counts = []
    for thresh in (0, 3, 6, 9):
        enc = encode_path(ips, path.image, tsc=1 << 32, mtc_freq=3, cyc=True, cyc_thresh=thresh,
                          cycles=cycles, ctc_ratio=path.ctc_ratio)  # fmt: skip
        table = decode(enc.data)
        cyc = table.a[table.kind == Kind.CYC]
        assert (cyc >= (1 << max(thresh - 1, 0))).all()
        counts.append(cyc.shape[0])
        res = decode_trace(enc.data, path.image, enc.config)
        assert int(res.block_ninsn.sum()) == ips.shape[0]
    assert all(a > b for a, b in itertools.pairwise(counts)), counts
    out = characterize(path, grid([4096], [3], [True], cyc_thresh=[0, 6]))
    assert out[0].updates > out[1].updates and out[0].bytes > out[1].bytes


def test_command_recorded_with_each_setting(tmp_path, capsys):
    """Given a command, characterize records it once per setting (here with
    the software backend) and measures each recording as it is."""
    from test_record_calls import build
    from test_record_software import SKIP

    if SKIP is not None:
        pytest.skip(str(SKIP))
    from hwtrace.analysis.characterize import measure_recording
    from hwtrace.cli.main import main

    out, keep = tmp_path / "c.json", tmp_path / "runs"
    capsys.readouterr()
    assert main(["characterize", "--backend", "software", "--call", "sorter", "--psb", "256,4096",
                 "--mtc", "0", "--cyc", "off", "--keep", str(keep), "--json", str(out),
                 "--", build(), str(tmp_path / "out")]) == 0  # fmt: skip
    got = json.loads(out.read_text())
    assert got["backend"] == "software" and len(got["settings"]) == 2
    small, large = got["settings"]
    assert small["psb_period"] == 256 and large["psb_period"] == 4096
    assert small["instructions"] == large["instructions"] > 0  # the same calls, recorded twice
    assert small["bytes"] > large["bytes"]  # PSB+ 16 times as often
    assert small["time_updates"] > 0 and small["dt_median_ns"] > 0
    again = measure_recording(str(keep / "perf-0.data"), Setting(256, 0, False))
    assert (again.bytes, again.instructions) == (small["bytes"], small["instructions"])
    assert main(["characterize", "--backend", "software", "--psb", "4096", "--",
                 build(), str(tmp_path / "out")]) == 1  # fmt: skip
    assert "give -f FUNCTION or --call FUNCTION" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["characterize", "--backend", "perf", "--psb", "1000", "--", "true"])
    assert exit_.value.code == 2 and "powers of two" in capsys.readouterr().err
