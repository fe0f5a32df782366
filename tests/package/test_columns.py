"""hwtrace.columns: ``distinct`` is numpy's unique without importing
numpy.ma; ``Ramps`` holds a column that rises by one a row as runs."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.columns import Ramps, distinct


@given(
    st.lists(st.integers(0, 5) | st.integers(0, 2**40), max_size=200),
    st.sampled_from([np.int64, np.uint64, np.int32, np.uint8, np.bool_]),
)
@settings(deadline=None)  # (numpy's first unique imports numpy.ma: slow on a busy machine)
def test_distinct_is_numpys_unique(values, dtype):
    a = np.array(values, np.uint64).astype(dtype)
    got = distinct(a)
    want = np.unique(a)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@given(st.lists(st.tuples(st.integers(-(2**40), 2**40), st.integers(0, 40)), max_size=30))
def test_ramps_hold_what_they_were_made_of(pieces):
    values = np.concatenate(
        [np.zeros(0, np.int64)] + [v + np.arange(n, dtype=np.int64) for v, n in pieces]
    )
    r = Ramps.of(values)
    assert len(r) == values.shape[0]
    np.testing.assert_array_equal(np.asarray(r), values)
    rows = np.arange(values.shape[0])[::-1]
    np.testing.assert_array_equal(r.at(rows), values[rows])
    np.testing.assert_array_equal(np.asarray(r + 5), values + 5)
    # one run per break of the rise, none more
    assert r.starts.shape[0] == (values.shape[0] > 0) + int(np.sum(np.diff(values) != 1))
