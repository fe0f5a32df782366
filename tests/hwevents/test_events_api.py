"""hwtrace.events, the typed software-event API: every name it offers
resolves to its implementation, and importing it leaves the perf.data
reader and the CTF writer unloaded until they are used."""

import subprocess
import sys

import hwtrace.events as events
from hwtrace.export.ctf import write_ptw_events
from hwtrace.hwevents.ptw import decode_events
from hwtrace.session.ptwevents import perf_events


def test_every_name_of_the_api_resolves():
    for name in events.__all__:
        assert getattr(events, name) is not None, name
    assert events.write_ctf is write_ptw_events
    assert events.perf_events is perf_events
    assert events.decode_events is decode_events


def test_an_unknown_name_is_an_attribute_error():
    try:
        events.no_such_thing  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("no AttributeError")


def test_importing_the_api_loads_neither_reader_nor_writer():
    code = (
        "import sys, hwtrace.events\n"
        "print(sorted(m for m in ('hwtrace.session.ptwevents', 'hwtrace.export.ctf')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300)  # fmt: skip
    assert out.stdout.strip() == "[]"
