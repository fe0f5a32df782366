"""bench/bench_filter.py at tiny sizes: the workload, the native harness and
the hand-written C filter agree with every hwtrace tier on every verdict.
No timing is asserted (the machine is shared)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="the harness needs gcc")


def _load():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_filter", BENCH / "bench_filter.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_filter"] = module
    spec.loader.exec_module(module)
    return module


bf = _load()
SIZES = (1, 3)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from hwtrace.filter.packing import EventRecord
    from hwtrace.filter.schema import DEFAULT_CONTEXT

    harness = bf.build_harness(list(SIZES), build=tmp_path_factory.mktemp("filterbench"))
    callees = {n: bf.compile_tiers(n, harness) for n in SIZES}
    context = EventRecord(DEFAULT_CONTEXT, {"pid": 1})
    return harness, callees, context


def test_workload_shape():
    assert bf.expression_for(2) == '(var0 == "str0") && (var1 == "str1") && (lyf == 42)'
    assert [f.name for f in bf.schema_for(2).fields] == ["var0", "var1", "lyf"]
    values = bf.event_values(12, fail_at=11, lyf=43)
    assert values["var10"] == "str1#"  # same length, last byte differs
    assert values["var9"] == "str9" and values["lyf"] == 43
    assert bf.doe_points(50) == [("1", 1), ("N/4", 12), ("N/2", 25), ("3N/4", 37), ("N", 50)]
    source = bf.simple_c([2])
    assert 'strcmp(e->var1, "str1")' in source and "return e->lyf == 42;" in source


def _verdicts(setup, n: int, values: dict) -> dict[str, int]:
    """How many of 5 calls each tier (C included) answers true, through the
    timing loops themselves."""
    from hwtrace.filter.packing import EventRecord

    harness, callees, context = setup
    ev = EventRecord(bf.schema_for(n), values)
    return {t: c.time(harness, ev.address, context.address, 5)[1] for t, c in callees[n].items()}


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(
    ("kw", "want"), [({}, 5), ({"lyf": 43}, 0), ({"fail_at": 1}, 0), ({"fail_at": -1}, 0)]
)
def test_biases_give_the_same_verdict_count_in_every_tier(setup, n, kw, want):
    if kw.get("fail_at") == -1:
        kw = {"fail_at": n}
    counts = _verdicts(setup, n, bf.event_values(n, **kw))
    assert set(counts) == set(bf.TIERS)
    assert counts == {t: want for t in bf.TIERS}


_text = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=6)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_event_same_verdict_in_every_tier(setup, data):
    n = data.draw(st.sampled_from(SIZES))
    values = {}
    for i in range(n):
        values[f"var{i}"] = data.draw(st.one_of(st.just(f"str{i}"), _text), label=f"var{i}")
    values["lyf"] = data.draw(st.one_of(st.just(42), st.integers(-(2**63), 2**63 - 1)))
    want = all(values[f"var{i}"] == f"str{i}" for i in range(n)) and values["lyf"] == 42
    assert _verdicts(setup, n, values) == {t: 5 * want for t in bf.TIERS}


def test_time_loops_report_per_call_numbers(setup):
    harness, callees, context = setup
    ev = bf.EventRecord(bf.schema_for(1), bf.event_values(1))
    for callee in callees[1].values():
        ns, hits, cpu = callee.time(harness, ev.address, context.address, 100)
        assert hits == 100 and ns > 0 and cpu >= 0
    assert harness.symbol_size("simple_1") > 0


def test_main_at_tiny_sizes_writes_consistent_json(tmp_path, capsys):
    out = tmp_path / "bench_filter.json"
    status = bf.main(["--predicates", "2,3", "--doe-n", "4", "--repeat", "2", "--run-ms", "0.05",
                      "--json", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0
    assert "TRUE-biased" in printed and "Depth of evaluation" in printed
    result = json.loads(out.read_text())
    assert result["verdicts_ok"] is True
    cases = [*result["bias"]["TRUE"].values(), *result["bias"]["FALSE"].values()]
    cases += list(result["doe"].values())
    assert len(cases) == 2 + 2 + 5
    for case in cases:
        cells = case["cells"]
        assert set(cells) == set(bf.TIERS)
        # Every tier ran the same event with the same expected verdict, and
        # each of its runs counted exactly that many true verdicts.
        assert len({c["expected_verdict"] for c in cells.values()}) == 1
        assert all(c["verdicts_ok"] and len(c["samples_ns"]) == 2 for c in cells.values())
    assert all(c["expected_verdict"] for c in result["bias"]["TRUE"]["2"]["cells"].values())
    assert not any(c["expected_verdict"] for c in result["bias"]["FALSE"]["3"]["cells"].values())
    assert list(result["doe"]) == ["1 (X=1)", "N/4 (X=1)", "N/2 (X=2)", "3N/4 (X=3)", "N (X=4)"]
    memory = result["memory"]["by_n"]["4"]
    assert set(memory) == set(bf.TIERS)
    assert memory["ebpf-jit"]["code_bytes"] > 0
    assert set(result["targets"]) == set(bf.TARGETS)


@pytest.mark.parametrize(
    "argv",
    [["--predicates", "a,b"], ["--repeat", "0"], ["--predicates", "0"], ["--run-ms", "-1"]],
)
def test_bad_options_are_one_message(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bf.main(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err
