"""hwtrace.columns.distinct: numpy's unique, without importing numpy.ma."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from hwtrace.columns import distinct


@given(
    st.lists(st.integers(0, 5) | st.integers(0, 2**40), max_size=200),
    st.sampled_from([np.int64, np.uint64, np.int32, np.uint8, np.bool_]),
)
def test_distinct_is_numpys_unique(values, dtype):
    a = np.array(values, np.uint64).astype(dtype)
    got = distinct(a)
    want = np.unique(a)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
