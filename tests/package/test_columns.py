"""hwtrace.columns: ``distinct`` is numpy's unique without importing
numpy.ma; ``Ramps`` holds a column that rises by one a row as runs;
``Deferred`` makes its column once, when first asked."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.columns import (
    Deferred,
    Keyed,
    Ramps,
    Runs,
    distinct,
    distinct_inverse,
    distinct_rows_inverse,
    member,
    resolved,
)


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


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6) | st.integers(0, 2**40)), max_size=200),
    st.lists(st.integers(0, 6), max_size=8),
)
@settings(deadline=None)
def test_inverses_and_members_are_numpys(pairs, chosen):
    keys = np.array(pairs, np.uint64).reshape(-1, 2)
    got, got_inv = distinct_rows_inverse(keys)
    want, want_inv = np.unique(keys, axis=0, return_inverse=True)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_inv, want_inv.reshape(-1))
    got, got_inv = distinct_inverse(keys[:, 1])
    want, want_inv = np.unique(keys[:, 1], return_inverse=True)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_inv, want_inv.reshape(-1))
    wanted = np.unique(np.array(chosen, np.uint64))
    np.testing.assert_array_equal(member(keys[:, 1], wanted), np.isin(keys[:, 1], wanted))


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


@given(st.integers(0, 50), st.integers(-60, 60), st.integers(-60, 60))
def test_a_deferred_column_is_made_once_and_sliced_as_numpy_does(n, lo, hi):
    made = []

    def make() -> np.ndarray:
        made.append(1)
        return np.arange(n, dtype=np.uint16) * 3

    d = Deferred(n, np.uint16, make, nbytes=8)
    part = d[lo:hi]
    want = (np.arange(n, dtype=np.uint16) * 3)[lo:hi]
    assert not made and len(part) == want.shape[0] and part.shape == want.shape
    keyed = resolved(Keyed(part, np.arange(200, dtype=np.int64) + 7, 3))
    assert isinstance(keyed.keys, np.ndarray) and keyed.source == 3
    np.testing.assert_array_equal(np.asarray(keyed), want + 7)
    np.testing.assert_array_equal(np.asarray(d), np.arange(n) * 3)
    np.testing.assert_array_equal(resolved(part), want)
    assert made == [1] and d[0:n] is d and resolved(want) is want


def test_a_deferred_column_may_be_runs():
    d = Deferred(5, np.int64, lambda: Runs(np.array([0, 2]), np.array([4, 9]), 5))
    assert isinstance(resolved(d), Runs)
    np.testing.assert_array_equal(np.asarray(d[1:4]), [4, 9, 9])
