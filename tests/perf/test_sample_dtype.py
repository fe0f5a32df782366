"""sample_dtype: a SAMPLE's fixed fields in perf_event_open(2)'s order."""

import pytest

from hwtrace.perf.records import SampleType as S
from hwtrace.perf.records import sample_dtype


def test_raw_sample_ends_at_raw_size() -> None:
    dt = sample_dtype(S.IDENTIFIER | S.TID | S.TIME | S.CPU | S.PERIOD | S.RAW)
    assert dt.names == ("type", "misc", "size", "identifier", "pid", "tid", "time", "cpu",
                        "res", "period", "raw_size")  # fmt: skip
    assert dt.itemsize == 52  # 4 + size: whole u64s once perf pads the data


def test_register_sample_and_field_order() -> None:
    # Bits given out of order: the layout follows the kernel's order anyway.
    dt = sample_dtype(S.REGS_USER | S.PERIOD | S.ADDR | S.IP | S.STREAM_ID | S.ID, nregs=3)
    assert dt.names == ("type", "misc", "size", "ip", "addr", "id", "stream_id", "period",
                        "abi", "regs")  # fmt: skip
    assert dt["regs"].shape == (3,) and dt.itemsize == 8 + 6 * 8 + 3 * 8


def test_variable_fields_before_the_end_are_refused() -> None:
    with pytest.raises(ValueError):
        sample_dtype(S.TID | S.CALLCHAIN)
