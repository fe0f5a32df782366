"""The names perf gives events it names from their attrs (the instruction
samples it makes from Intel PT among them): hwtrace's against perf's own."""

from __future__ import annotations

import itertools
import shutil
import subprocess

import pytest

import hwtrace.perf.writer as writer_module
from hwtrace.perf.attr import PerfEventAttr, event_modifiers
from hwtrace.perf.features import Feature
from hwtrace.perf.records import SampleType
from hwtrace.perf.writer import PerfDataWriter


@pytest.mark.parametrize(
    ("bits", "name"),
    [
        ({"exclude_kernel": 1, "exclude_hv": 1}, ":u"),  # hwtrace record's intel_pt//u
        ({"exclude_kernel": 1, "exclude_hv": 1, "exclude_guest": 1}, ":uH"),  # perf's //u
        ({"exclude_guest": 1}, ""),  # perf's intel_pt//
        ({}, ":HG"),
        ({"exclude_user": 1, "exclude_hv": 1}, ":k"),
        ({"precise_ip": 2, "exclude_guest": 1}, ":ppH"),
        ({"exclude_host": 1}, ":G"),
    ],
)
def test_modifiers(bits, name):
    assert event_modifiers(PerfEventAttr(**bits)) == name


def _attrs() -> list[PerfEventAttr]:
    out = []
    for ek, eu, eh, e_host, e_guest, precise in itertools.product(
        (0, 1), (0, 1), (0, 1), (0, 1), (0, 1), (0, 2)
    ):
        if ek and eu:
            continue
        out.append(PerfEventAttr(
            type=0, size=128, config=1, sample_id_all=1,
            sample_type=SampleType.IP | SampleType.TID | SampleType.TIME | SampleType.ID
            | SampleType.IDENTIFIER,
            exclude_kernel=ek, exclude_user=eu, exclude_hv=eh, exclude_host=e_host,
            exclude_guest=e_guest, precise_ip=precise,
        ))  # fmt: skip
    return out


@pytest.mark.skipif(shutil.which("perf") is None, reason="perf is not installed")
def test_modifiers_are_perfs(tmp_path, monkeypatch):
    """Every combination of excluded contexts, host, guest and precision:
    perf names the events of a file that names none (``perf evlist``) as
    hwtrace does."""
    pack = writer_module.pack_feature
    # (no names in EVENT_DESC: perf then makes them from the attrs)
    monkeypatch.setattr(
        writer_module, "pack_feature",
        lambda k, v: pack(k, [] if k == Feature.EVENT_DESC else v),
    )  # fmt: skip
    attrs = _attrs()
    path = tmp_path / "names.data"
    with PerfDataWriter(path) as w:
        for a in attrs:
            w.add_attr(a)
    got = subprocess.run(["perf", "evlist", "-i", str(path)], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["instructions" + event_modifiers(a) for a in attrs]
