"""Code in the vDSO (``clock_gettime``), which no file holds: the software
recorder keeps its bytes in perf's build-id cache, as ``perf record`` does,
so hwtrace and perf decode the calls into it without a gap; and the
symbols of a stripped library come from its detached debug file."""

from __future__ import annotations

import pytest
from test_record_software import SKIP, compile_program
from test_record_threads import check_listings, stepped

from hwtrace.record import record_software
from hwtrace.record.perfdata import write_perf_data

pytestmark = pytest.mark.skipif(SKIP is not None, reason=str(SKIP))

PROGRAM = r"""
#include <time.h>
#define NOINLINE __attribute__((noinline))
NOINLINE long work(int n) {
    long s = 0;
    struct timespec ts;
    for (int i = 0; i < n; i++) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        s += ts.tv_nsec & 1;
    }
    return s;
}
int main(void) { return (int)work(3) & 0; }
"""


def test_calls_into_the_vdso_decode(tmp_path, monkeypatch, capsys):
    # (no perf configuration: the build-id cache is ~/.debug)
    monkeypatch.setenv("PERF_CONFIG", "/dev/null")
    monkeypatch.setenv("HOME", str(tmp_path))
    exe = str(compile_program(PROGRAM, "vdso", ("-O2", "-g0")))
    rec = record_software([exe], calls=["work"])
    path = tmp_path / "perf.data"
    write_perf_data(rec, path)
    cached = list((tmp_path / ".debug" / "[vdso]").glob("*/vdso"))
    assert len(cached) == 1
    want = stepped(rec)  # decodes against rec.image(), vDSO included: no gap
    check_listings(path, want, capsys)
    capsys.readouterr()
    from hwtrace.cli.main import main

    assert main(["script", "-i", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any("__vdso_clock_gettime" in line and "([vdso])" in line for line in lines)
