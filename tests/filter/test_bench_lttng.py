"""bench/bench_lttng.py: the workload and the arithmetic of Sharma and
Dagenais's Fig. 13 (F3 and F4, as the benchmark names its two results)
everywhere; an end-to-end run at tiny sizes where LTTng is installed (it
skips, saying what is missing, where it is not).  No timing is asserted (the
machine is shared)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "bench_lttng.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_lttng", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_lttng"] = module
    spec.loader.exec_module(module)
    return module


bl = _load()


def test_expression_and_schema_are_the_papers():
    assert bl.EXPRESSION == (
        '(var0 == "str0") && (var1 == "str1") && (var2 == "str2") && (var3 == "str3") && '
        '(var4 == "str4") && (var5 == "str5") && (var6 == "str6") && (var7 == "str7") && '
        '(var8 == "str8") && (lyf == 42)'
    )
    # Nine char * then the s64: the C struct of bench/lttng/retlif_bench.c.
    assert [(f.name, f.offset) for f in bl.SCHEMA.struct.fields] == [
        *((f"var{i}", 8 * i) for i in range(9)),
        ("lyf", 72),
    ]
    assert bl.SCHEMA.size == 80
    source = (REPO / "bench" / "lttng" / "retlif_tp.h").read_text()
    for i in range(9):
        assert f"ctf_string(var{i}, var{i})" in source
    assert "ctf_integer(int64_t, lyf, lyf)" in source


def test_every_tier_agrees_on_the_workload():
    """The filter every guard compiles: true on the TRUE-biased event only,
    and false when any one string differs."""
    from hwtrace.filter.compile import compile_filter
    from hwtrace.filter.packing import EventRecord

    true_values = {**{f"var{i}": f"str{i}" for i in range(9)}, "lyf": 42}
    events = [(true_values, True), ({**true_values, "lyf": 43}, False)]
    events += [({**true_values, f"var{i}": f"str{i}#"}, False) for i in range(9)]
    for tier in bl.HWTRACE_TIERS:
        cf = compile_filter(bl.EXPRESSION, bl.SCHEMA, tier)
        assert cf.tier == tier
        for values, want in events:
            record = EventRecord(bl.SCHEMA, values)
            assert cf(record.address, 0) is want, (tier, values)


def _samples(lt_true, lt_false, ref, floor, guard_true, guard_false, alone):
    """One round of each (mode, bias) as derive() takes them."""
    s = {
        ("lttng-filter", "TRUE"): [lt_true],
        ("lttng-filter", "FALSE"): [lt_false],
        ("no-filter", "TRUE"): [ref],
        ("no-filter", "FALSE"): [ref],
        ("disabled", "TRUE"): [floor],
        ("disabled", "FALSE"): [floor],
    }
    for tier in bl.GUARDS:
        s[(f"guard:{tier}", "TRUE")] = [guard_true]
        s[(f"guard:{tier}", "FALSE")] = [guard_false]
        s[(f"off:guard:{tier}", "TRUE")] = [floor + alone]
        s[(f"off:guard:{tier}", "FALSE")] = [floor + alone]
    return s


def test_derive_reproduces_the_papers_arithmetic():
    # The artifact's raw data (lttng-10000000.dat): LTTng TRUE 828, FALSE 359,
    # no filter 493, JIT TRUE 637, FALSE 113: overheads 335 and 144, F3 (Fig. 13, FALSE-biased) 3.18x.
    d = bl.derive(_samples(828.0, 359.0, 493.0, 1.0, 637.0, 113.0, 112.0))
    jit = d["tiers"]["ebpf-jit"]
    assert d["lttng_filter_overhead_true_ns"] == pytest.approx(335.0)
    assert jit["overhead_true_ns"] == pytest.approx(144.0)
    assert jit["ratio_true_overhead"] == pytest.approx(335.0 / 144.0)
    assert jit["ratio_false_total"] == pytest.approx(359.0 / 113.0)
    assert jit["ratio_false_over_floor"] == pytest.approx(358.0 / 112.0)
    assert jit["filter_alone_ns"] == {"TRUE": pytest.approx(112.0), "FALSE": pytest.approx(112.0)}
    assert jit["hwtrace_faster"] is True
    # A guard slower than LTTng's filter is reported as such.
    d = bl.derive(_samples(300.0, 150.0, 200.0, 1.0, 400.0, 160.0, 150.0))
    assert d["tiers"]["ebpf"]["hwtrace_faster"] is False
    assert d["tiers"]["ebpf"]["ratio_true_total"] == pytest.approx(0.75)


@given(
    base=st.floats(50, 500),
    lt_cost=st.floats(1, 500),
    guard_cost=st.floats(-5, 5),
    alone=st.floats(0.5, 50),
)
def test_f4_ratio_never_divides_by_noise(base, lt_cost, guard_cost, alone):
    """A guard whose TRUE overhead is within noise of zero (or below) gets no
    F4 ratio, and the conservative ratio charges it at least its cost alone."""
    d = bl.derive(_samples(base + lt_cost, lt_cost, base, 1.0, base + guard_cost, 10.0, alone))
    jit = d["tiers"]["ebpf-jit"]
    if guard_cost <= 0:
        assert jit["ratio_true_overhead"] is None
        assert jit["ratio_true_overhead_paired"] is None
    conservative = jit["ratio_true_overhead_conservative"]
    assert conservative == pytest.approx(lt_cost / max(guard_cost, alone), rel=1e-6, abs=1e-6)
    assert conservative <= lt_cost / alone * (1 + 1e-9)


def test_paired_differences_cancel_round_drift():
    # Load that doubles every round hits both modes alike.
    a = [110.0, 220.0, 440.0]
    b = [100.0, 200.0, 400.0]
    assert bl.paired(a, b) == 20.0
    assert bl.paired([5.0, 1.0, 9.0], [1.0, 1.0, 1.0]) == 4.0


@pytest.fixture(scope="module")
def lttng_available():
    missing = bl.lttng_missing()
    if missing:
        pytest.skip(f"LTTng is not installed here (missing {', '.join(missing)})")


def test_tiny_run_end_to_end(lttng_available, tmp_path):
    """The whole benchmark at 2,000 events and one round: every
    configuration's recorded events are checked against the filter (when
    babeltrace2 is there), every guard's verdicts are right, the JSON holds
    every cell, and a session daemon it started is gone afterwards."""
    out = tmp_path / "bench_lttng.json"
    cmd = [sys.executable, str(BENCH), "--nr", "2000", "--repeat", "1", "--no-install"]
    proc = subprocess.run(
        [*cmd, "--json", str(out)], capture_output=True, text=True, timeout=240, check=False
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["versions"]["lttng"].startswith("lttng")
    assert result["events_per_run"] == 2000 and result["rounds"] == 1
    cells = {(c["config"], c["mode"], c["bias"]): c for c in result["cells"]}
    want = {(c, m, b) for c, modes in bl.CONFIGS.items() for m in modes for b in bl.BIASES}
    assert set(cells) == want
    for key, cell in cells.items():
        assert cell["verdicts_ok"], key
        assert len(cell["cpu_ns"]) == 1 and cell["median_cpu_ns"] > 0, key
    if not result["checks_skipped"]:
        checked = {(c["config"], c["mode"]) for c in result["checks"]}
        assert checked == {(c, m) for c in ("filter", "record") for m in bl.CONFIGS[c]}
        for c in result["checks"]:
            assert c["recorded_true_false"] == c["expected"], c
    assert set(result["derived"]["tiers"]) == set(bl.GUARDS)
    daemon = result["session_daemon"]
    if daemon["started_by_benchmark"]:
        assert daemon["exit_status"] is not None
        assert not Path(f"/proc/{daemon['pid']}").exists() or _zombie(daemon["pid"])
    # No session of the run is left behind.
    listing = subprocess.run(
        ["lttng", "--no-sessiond", "list"], capture_output=True, text=True, check=False
    )
    assert "hwtrace-bench-" not in listing.stdout


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_no_install_reports_what_is_missing(monkeypatch, capsys):
    """--no-install on a machine without LTTng: one line naming what is
    missing, exit status 1, no traceback."""
    monkeypatch.setattr(bl, "lttng_missing", lambda: ["lttng", "lttng-sessiond"])
    assert bl.main(["--nr", "10", "--repeat", "1", "--no-install"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bench_lttng: missing lttng, lttng-sessiond")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
