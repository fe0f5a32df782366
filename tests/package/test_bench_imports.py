"""Every benchmark script imports: they are run by hand or by make bench,
not by the tests, so a renamed module they use would otherwise go unseen."""

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCH.glob("*.py")))
def test_bench_script_imports(name, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    try:
        importlib.import_module(name)
    finally:
        # (the scripts' own modules: another test imports them afresh)
        for key, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", "") or "").startswith(str(BENCH)):
                sys.modules.pop(key, None)
