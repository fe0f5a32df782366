"""Recording with Intel PT hardware through perf: settings, checks, argv."""

from pathlib import Path

import pytest

from hwtrace.record.perf_pt import (
    AddressFilter,
    PtCapabilities,
    PtSettings,
    SettingsError,
    have_intel_pt,
    perf_record_argv,
    record_with_perf,
)


def test_event_terms_follow_perf_syntax():
    s = PtSettings(
        psb_period=3, mtc=True, mtc_period=6, cyc=True, cyc_thresh=2, tsc=True, noretcomp=True
    )
    assert s.event() == (
        "intel_pt/cyc=1,cyc_thresh=2,mtc=1,mtc_period=6,psb_period=3,tsc=1,noretcomp=1/u"
    )
    assert PtSettings(user=True, kernel=True).event() == "intel_pt//"
    assert PtSettings(user=False, kernel=True, branch=False).event() == "intel_pt/branch=0/k"
    assert s.psb_period_bytes() == 1 << 14
    assert PtSettings().psb_period_bytes() == 2048


def test_argv_for_command_pid_filters_and_snapshot():
    s = PtSettings(
        filters=(
            AddressFilter(symbol="main", dso="/bin/prog"),
            AddressFilter(action="stop", start=0x401000, size=0x20, dso="/bin/prog"),
        ),
        snapshot=1 << 20,
    )
    argv = perf_record_argv(s, "out.data", command=["./prog", "1"])
    assert argv == [
        "perf", "record", "-e", "intel_pt//u", "-o", "out.data", "--switch-events",
        "--filter", "filter main @ /bin/prog,stop 0x401000/0x20 @ /bin/prog",
        "-S1048576", "--", "./prog", "1",
    ]  # fmt: skip
    argv = perf_record_argv(PtSettings(snapshot=True), "o", pid=42, per_thread=True, kcore=True)
    assert argv[-5:] == ["-S", "--per-thread", "--kcore", "-p", "42"]
    with pytest.raises(SettingsError, match="either a command or a pid"):
        perf_record_argv(PtSettings(), "o")
    with pytest.raises(SettingsError, match="either a command or a pid"):
        perf_record_argv(PtSettings(), "o", command=["x"], pid=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"psb_period": 16}, "psb_period 16: must be in 0..15"),
        ({"mtc_period": -1}, "mtc_period -1"),
        ({"user": False, "kernel": False}, "nothing to record"),
    ],
)
def test_impossible_settings_are_named(kwargs, message):
    with pytest.raises(SettingsError, match=message):
        PtSettings(**kwargs)


def test_filter_needs_one_place():
    with pytest.raises(SettingsError, match="either a symbol or a start"):
        AddressFilter(symbol="f", start=1)
    with pytest.raises(SettingsError, match="unknown action"):
        AddressFilter(action="trace", symbol="f")


def _fake_pmu(root: Path, **caps: str) -> Path:
    d = root / "intel_pt" / "caps"
    d.mkdir(parents=True)
    for name, text in caps.items():
        (d / name).write_text(text + "\n")
    return root / "intel_pt"


def test_capabilities_are_checked(tmp_path):
    # A Skylake-like PMU: psb_periods 0x3f, mtc_periods 0x249, cycle_thresholds 0x3fff.
    pmu = _fake_pmu(
        tmp_path,
        psb_periods="003f",
        mtc_periods="0249",
        cycle_thresholds="3fff",
        mtc="1",
        psb_cyc="1",
        ip_filtering="1",
        num_address_ranges="2",
        ptwrite="0",
        power_event_trace="0",
    )
    caps = PtCapabilities.read(pmu)
    assert caps is not None and caps.num_address_ranges == 2
    caps.check(PtSettings(psb_period=5, mtc_period=3, cyc=True, cyc_thresh=13))
    with pytest.raises(SettingsError, match=r"mtc_period=4 .*allowed: 0, 3, 6, 9"):
        caps.check(PtSettings(mtc_period=4))
    with pytest.raises(SettingsError, match="psb_period=6"):
        caps.check(PtSettings(psb_period=6))
    with pytest.raises(SettingsError, match="no PTWRITE"):
        caps.check(PtSettings(ptw=True))
    three = tuple(AddressFilter(symbol=f"f{i}") for i in range(3))
    with pytest.raises(SettingsError, match="3 address filters given, this CPU has 2"):
        caps.check(PtSettings(filters=three))
    assert PtCapabilities.read(tmp_path / "absent") is None


@pytest.mark.skipif(have_intel_pt(), reason="this machine has Intel PT")
def test_without_pt_hardware_the_software_backend_is_named(tmp_path):
    with pytest.raises(SettingsError, match=r"no Intel PT on this machine.*software backend"):
        record_with_perf(PtSettings(), tmp_path / "x.data", command=["true"])


def test_call_on_hardware_traces_everything_and_notes_the_calls(tmp_path, monkeypatch, capsys):
    """``record --call`` with perf: no address filter (a call's extent
    reaches any code), and the calls noted beside the perf.data, so that
    script and report cut the flow to them."""
    import hwtrace.record.perf_pt as perf_pt
    from hwtrace.cli.main import main
    from hwtrace.perf.notes import recorded_calls

    seen = []

    def fake_record(settings, output, **kw):
        seen.append(settings)
        Path(output).write_bytes(b"PERFILE2")
        return 0

    monkeypatch.setattr(perf_pt, "record_with_perf", fake_record)
    out = tmp_path / "perf.data"
    args = ["record", "--backend", "perf", "-o", str(out), "--call", "libc.so.6!qsort"]
    assert main([*args, "-f", "main", "--", "ls"]) == 0
    (settings,) = seen
    assert settings.filters == ()
    assert recorded_calls(out) == ["libc.so.6!qsort"]
    assert "cut it to the calls" in capsys.readouterr().err
