"""The compiled column passes of :mod:`hwtrace.pt.timing` against their
numpy definitions."""

import numpy as np
from hypothesis import example, given, settings
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


# Kinds a run meets: mostly TNT-8 and TIP (4, 6), some of the other
# timeless kinds (PAD 1, PTW 22, the range 4-13's ends) and the ones that
# end it (PSB 2, MTC 16, CYC 18, 14 just past the range).
_RUN_KINDS = st.sampled_from([4, 4, 4, 4, 6, 6, 6, 1, 13, 22, 2, 14, 16, 18])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_RUN_KINDS, min_size=16, max_size=80),
    st.lists(st.integers(0, 79), max_size=3),
    st.integers(0, 79),
    st.integers(0, 80),
    st.booleans(),
)
@example([4] * 9 + [14] + [4] * 10, [], 0, 20, False)  # (14: the first kind past the range)
def test_timeless_run_ends_where_the_model_must_look(packets, seg, start, end, want_fcr):
    """The run the time model skips, found eight packets at a time, ends at
    the first later packet that is a segment start or not timeless (or at
    ``end``), and every packet of it gets the model's time."""
    from hwtrace.pt.timing import _TIMELESS, _timeless_run

    n = len(packets)
    start = min(start, n - 1)
    end = max(start + 1, min(end, n))
    kinds = np.array(packets, np.uint8)
    kinds[start] = 4  # (the caller's packet: timeless, whatever came before)
    starts = np.zeros(n, np.bool_)
    starts[[s for s in seg if s < n]] = True
    expect = start + 1
    while expect < end and not starts[expect] and _TIMELESS[kinds[expect]]:
        expect += 1
    out = (np.full(n, -1, np.int64), np.zeros(n, np.bool_), np.full(n, -1, np.int64),
           np.zeros(n, np.bool_))  # fmt: skip
    got = _timeless_run(kinds, starts, start, end, out, want_fcr, 77, True, 5, True)
    assert got == expect
    assert (out[0][start:got] == 77).all() and out[1][start:got].all()
    assert (out[0][:start] == -1).all() and (out[0][got:] == -1).all()
    assert not out[1][got:].any()
    filled = got - start if want_fcr else 0
    assert (out[2] == 5).sum() == filled and out[3].sum() == filled
    assert (out[2][start : start + filled] == 5).all()
