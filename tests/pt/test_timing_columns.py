"""The compiled column passes of :mod:`hwtrace.pt.timing` against their
numpy definitions."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.pt.timing import durations


def _numpy_durations(ns: np.ndarray, stops: np.ndarray, values: np.ndarray) -> np.ndarray:
    if ns.shape[0] == 0:
        return ns.copy()
    dur = np.diff(ns, append=ns[-1])
    dur[stops] = values
    return np.where((dur > 0) & (ns >= 0), dur, 0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-1, 1 << 40), max_size=40),
    st.lists(st.tuples(st.integers(0, 39), st.integers(-5, 1 << 20)), max_size=6),
)
def test_durations_are_numpys(times, stops):
    ns = np.array(times, np.int64)
    stops = [(k, v) for k, v in stops if k < len(times)]
    k = np.array([s for s, _ in stops], np.int64)
    v = np.array([x for _, x in stops], np.int64)
    assert np.array_equal(durations(ns, k, v), _numpy_durations(ns, k, v))
