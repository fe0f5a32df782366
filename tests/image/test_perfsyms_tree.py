"""perf's symbol tree (image/perfsyms.py's red-black tree): after any sequence
of insertions and erasures it is a valid red-black tree whose in-order walk
is the live symbols by start, an equal start after those inserted before it
(perf's ``__symbols__insert``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.image.perfsyms import _RbTree


def black_height(tree: _RbTree, x: int) -> int:
    """The subtree's black height, checking the red-black rules on the way."""
    if x == -1:
        return 1
    for c in (tree.left[x], tree.right[x]):
        if c != -1:
            assert tree.parent[c] == x
            assert not (tree.red[x] and tree.red[c]), "a red node with a red child"
    hl, hr = black_height(tree, tree.left[x]), black_height(tree, tree.right[x])
    assert hl == hr, "paths of different black lengths"
    return hl + (0 if tree.red[x] else 1)


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(st.integers(0, 12), min_size=1, max_size=80),
    erase=st.lists(st.booleans(), min_size=80, max_size=80),
    pick=st.lists(st.integers(0, 1000), min_size=80, max_size=80),
)
def test_tree_stays_balanced_and_ordered(keys, erase, pick) -> None:
    tree = _RbTree(keys)
    live: list[int] = []
    for z in range(len(keys)):
        tree.insert(z)
        live.append(z)
        if erase[z] and live:
            tree.erase(live.pop(pick[z] % len(live)))
        if tree.root != -1:
            assert not tree.red[tree.root]
            assert tree.parent[tree.root] == -1
        black_height(tree, tree.root)
        # Stable by start: equal starts keep the order they were inserted in.
        assert tree.in_order() == sorted(live, key=lambda i: (keys[i], i))
