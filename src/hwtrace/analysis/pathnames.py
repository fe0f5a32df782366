"""Call paths by name: the paths of one or more call-path profiles as
one tree of names (:class:`PathNames`), a node per distinct path text
(``group;root;...;callee``), and the order of their texts (and of lines
``text weight``, as folded stacks sort) worked out from the tree without
making the texts.

A real program's profile holds a few hundred thousand paths a hundred
frames deep, whose texts run to a GB: what is made of them (folded
stacks, two runs compared) goes a node at a time, and a text is made
where it is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ..columns import distinct_inverse
from .latency import LatencyResult, depth_levels, path_depths, root_group

# A tree node's key among its siblings: its caller's node (plus one, 0 for
# none) above these bits, its name's number below.
_NAME_BITS = 32


class PathNames:
    """Call paths of one or more runs as one tree of names: a node per
    distinct path text (``group;root;...;callee``), a caller numbered
    before its callees.  Runs added to one tree compare node for node."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._name_ids: dict[str, int] = {}
        self.parent = np.empty(0, np.int64)  # each node's caller (-1: none)
        self.name = np.empty(0, np.int64)  # each node's name (in ``names``)
        self.depth = np.empty(0, np.int64)
        self._keys = np.empty(0, np.int64)  # the nodes' keys (see _NAME_BITS), sorted
        self._nodes = np.empty(0, np.int64)  # the node of each of them
        self._order: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.functions = FunctionNames(self)  # (functions as keys: the names)

    def __len__(self) -> int:
        return int(self.parent.shape[0])

    def name_ids(self, texts: Sequence[str]) -> np.ndarray:
        """The numbers of names (new ones added)."""
        ids = self._name_ids
        out = np.empty(len(texts), np.int64)
        for i, text in enumerate(texts):
            k = ids.get(text)
            if k is None:
                k = ids[text] = len(self.names)
                self.names.append(text)
            out[i] = k
        return out

    def add(
        self, result: LatencyResult, name: Callable[[int], str],
        group: Callable[[int], str] | None = None,
        name_all: Callable[[np.ndarray], list[str]] | None = None,
    ) -> np.ndarray:  # fmt: skip
        """The node of each of ``result``'s paths, at ``path + 1`` (0: the
        empty path, ``[unknown]``), by :meth:`LatencyResult.path_names`
        (each address named once, by ``name_all`` when given: ``name`` of
        each of an array's addresses): the paths of the tree's other runs
        that read the same are the same nodes."""
        parents = result.path_parents()
        addrs = result.path_heads()
        # Local nodes: the groups' (with ``group``), then the empty path and
        # every path, at ``path + 1`` after the groups'.
        uniq, inverse = distinct_inverse(addrs)
        named = name_all(uniq) if name_all is not None else [name(a) for a in uniq.tolist()]
        labels = [t or f"{a:#x}" for t, a in zip(named, uniq.tolist(), strict=True)]
        names = np.concatenate([self.name_ids(["[unknown]"]), self.name_ids(labels)[inverse]])
        up = np.concatenate([[-1], parents])  # (the empty path: a root of no group)
        roots = up < 0
        if group is not None:
            values, which = distinct_inverse(up[roots])
            base = values.shape[0]
            glabels = [group(root_group(int(v))) for v in values.tolist()]
            names = np.concatenate([self.name_ids(glabels), names])
            up = np.where(roots, -1, up + 1 + base)
            up[roots] = which
            up = np.concatenate([np.full(base, -1, np.int64), up])
        else:
            base = 0
            up = np.where(roots, -1, up + 1)
        node = self._intern(up, names)
        return node[base:]

    def _intern(self, up: np.ndarray, names: np.ndarray) -> np.ndarray:
        """The tree's node of each of a forest's nodes (``up``: their
        parents, -1 for roots; ``names``), level by level from the roots."""
        node = np.empty(up.shape[0], np.int64)
        count = len(self)
        new_keys, new_parent, new_name, new_depth = [], [], [], []
        for depth, level in enumerate(depth_levels(path_depths(up))):
            caller = np.where(up[level] >= 0, node[up[level]], -1)
            keys = ((caller + 1) << _NAME_BITS) | names[level]
            at = np.searchsorted(self._keys, keys)
            found = at < self._keys.shape[0]
            found[found] = self._keys[at[found]] == keys[found]
            node[level[found]] = self._nodes[at[found]]
            fresh, which = distinct_inverse(keys[~found])
            node[level[~found]] = count + which
            new_keys.append(fresh)
            new_parent.append((fresh >> _NAME_BITS) - 1)
            new_name.append(fresh & ((1 << _NAME_BITS) - 1))
            new_depth.append(np.full(fresh.shape[0], depth, np.int64))
            count += fresh.shape[0]
        if count > len(self):
            keys = np.concatenate([self._keys, *new_keys])
            nodes = np.arange(count, dtype=np.int64)
            nodes = np.concatenate([self._nodes, nodes[len(self) :]])
            order = np.argsort(keys, kind="stable")
            self._keys, self._nodes = keys[order], nodes[order]
            self.parent = np.concatenate([self.parent, *new_parent])
            self.name = np.concatenate([self.name, *new_name])
            self.depth = np.concatenate([self.depth, *new_depth])
            self._order = None
        return node

    def parts(self, node: int) -> list[str]:
        """A node's names, outermost first."""
        out = []
        while node >= 0:
            out.append(self.names[self.name[node]])
            node = int(self.parent[node])
        return out[::-1]

    def text(self, node: int) -> str:
        """A node's path text, ``;``-joined."""
        return ";".join(self.parts(node))

    def texts(self, nodes: Sequence[int] | np.ndarray) -> Iterator[str]:
        """:meth:`text` of each of ``nodes`` in turn, a caller's text made
        once for the nodes below it that follow."""
        known: dict[int, str] = {}  # (of the nodes with nodes below them)
        callers = np.zeros(len(self), bool)
        callers[self.parent[self.parent >= 0]] = True
        parent, name, names, caller = (
            self.parent.tolist(), self.name.tolist(), self.names, callers.tolist()
        )  # fmt: skip
        for node in np.asarray(nodes, np.int64).tolist():
            chain, p = _up_to(node, known, parent)
            text = known[p] if p >= 0 else None
            for q in reversed(chain):
                text = names[name[q]] if text is None else text + ";" + names[name[q]]
                if caller[q]:
                    known[q] = text
            yield text

    def text_order(self) -> np.ndarray:
        """Each node's rank among the nodes' texts in string order."""
        return self._ordered()[0]

    def recursive(self) -> np.ndarray:
        """Whether each node's name is also a name above it (a recursion's
        inner call, or a function named as its path's group)."""
        return self._ordered()[2]

    def _ordered(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rank, sub, recursive): the text order of the nodes and, per
        node, where the ranks of the nodes below it start (they are
        ``sub[n]`` to ``sub[n]`` plus their number).

        A path's text is its caller's, ``;`` and its name; the texts that
        go on below a node all read ``name;`` after the caller's.  So
        among the texts below a caller, a callee's own sorts by its name
        and the block of those below it by ``name;`` (``f.cold`` sorts
        between ``f`` and ``f;g``): ranking both keys per callee and
        placing blocks level by level gives the string order."""
        if self._order is not None:
            return self._order
        n = len(self)
        below = self._below(np.ones(n, np.int64))
        key_rank = _ranks([*self.names, *(t + ";" for t in self.names)])
        own, block = key_rank[: len(self.names)], key_rank[len(self.names) :]
        rank, sub = self._place(np.arange(n, dtype=np.int64), own[self.name], below, block)
        # A node is recursive when a node of its name above it holds its
        # rank in its block: per name, blocks (start, end) and ranks sorted
        # together, a block before a rank at the same place; a rank is inside
        # one when the furthest end of the blocks before it passes it.
        span = int(n) + 1
        coord = np.concatenate([sub, rank])
        is_rank = np.concatenate([np.zeros(n, bool), np.ones(n, bool)])
        names2 = np.concatenate([self.name, self.name])
        ev = np.lexsort((is_rank, coord, names2))
        base = names2[ev] * span
        ends = np.where(is_rank[ev], 0, np.concatenate([sub + below, np.zeros(n, np.int64)])[ev])
        reach = np.maximum.accumulate(base + ends) - base
        recursive = np.zeros(n, bool)
        ranks = is_rank[ev]
        who = ev[ranks] - n
        recursive[who] = reach[ranks] > rank[who]
        self._order = (rank, sub, recursive)
        return self._order

    def _below(self, items: np.ndarray) -> np.ndarray:
        """Per node, the sum of ``items`` (per node) over the nodes below
        it."""
        below = np.zeros(len(self), np.int64)
        for level in reversed(depth_levels(self.depth)[1:]):
            np.add.at(below, self.parent[level], items[level] + below[level])
        return below

    def _place(
        self, owner: np.ndarray, key: np.ndarray, below: np.ndarray, block_key: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """The order of items (one place each) at nodes ``owner`` with
        sort keys ``key`` among their node's siblings, ``below`` the items
        below each node, whose block sorts among its siblings by its
        name's ``block_key``: each item's place, and where each node's
        block starts."""
        n = len(self)
        nodes = np.flatnonzero(below)
        e_caller = np.concatenate([self.parent[owner], self.parent[nodes]])
        e_key = np.concatenate([key, block_key[self.name[nodes]]])
        e_size = np.concatenate([np.ones(owner.shape[0], np.int64), below[nodes]])
        # Sorted by caller and key, an entry's offset in its caller's block
        # is the size of the entries before it.
        order = np.lexsort((e_key, e_caller))
        size = e_size[order]
        before = np.cumsum(size) - size
        callers = e_caller[order]
        first = np.r_[True, callers[1:] != callers[:-1]]
        offset = np.empty(order.shape[0], np.int64)
        offset[order] = before - np.maximum.accumulate(np.where(first, before, 0))
        block_offset = np.zeros(n, np.int64)
        block_offset[nodes] = offset[owner.shape[0] :]
        sub = np.zeros(n + 1, np.int64)  # at node + 1 (0: the forest's roots)
        for level in depth_levels(self.depth):
            sub[level + 1] = sub[self.parent[level] + 1] + block_offset[level]
        place = sub[self.parent[owner] + 1] + offset[: owner.shape[0]]
        return place, sub[1:]

    def line_order(self, nodes: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """The order in which lines ``text weight`` (the texts of
        ``nodes``, ``weights``) sort as strings (folded stacks' order):
        indices into them."""
        nodes = np.asarray(nodes, np.int64)
        lines = np.bincount(nodes, minlength=len(self)).astype(np.int64)
        names = self.names
        own = [f"{names[k]} {w}" for k, w in zip(self.name[nodes].tolist(), weights.tolist(),
                                                  strict=True)]  # fmt: skip
        key_rank = _ranks([*own, *(t + ";" for t in names)])
        place, _ = self._place(
            nodes, key_rank[: len(own)], self._below(lines), key_rank[len(own) :]
        )
        order = np.empty(nodes.shape[0], np.int64)
        order[place] = np.arange(nodes.shape[0])
        return order

    def texts_in_order(self, nodes: Sequence[int] | np.ndarray) -> Iterator[str]:
        """:meth:`texts` of nodes that mostly follow one another's callers
        (in text order): the texts of the last node's callers are kept,
        and no others (memory as deep as a path, not as many)."""
        parent, name, names = self.parent.tolist(), self.name.tolist(), self.names
        chain: list[int] = []  # the last node and its callers, outermost first
        text_of: dict[int, str] = {}
        for node in np.asarray(nodes, np.int64).tolist():
            fresh, p = _up_to(node, text_of, parent)
            keep = chain.index(p) + 1 if p >= 0 else 0
            for q in chain[keep:]:
                del text_of[q]
            del chain[keep:]
            text = text_of[p] if p >= 0 else None
            for q in reversed(fresh):
                text = names[name[q]] if text is None else text + ";" + names[name[q]]
                text_of[q] = text
                chain.append(q)
            yield text


def _up_to(node: int, known: dict[int, str], parent: list[int]) -> tuple[list[int], int]:
    """``node`` and its callers up to the first in ``known`` (innermost
    first), and that one (-1: none is)."""
    chain = []
    while node >= 0 and node not in known:
        chain.append(node)
        node = parent[node]
    return chain, node


def _ranks(keys: list[str]) -> np.ndarray:
    """Each key's rank among them in string order."""
    rank = np.empty(len(keys), np.int64)
    rank[sorted(range(len(keys)), key=keys.__getitem__)] = np.arange(len(keys))
    return rank


class FunctionNames:
    """Functions as keys: a :class:`PathNames`'s names."""

    def __init__(self, paths: PathNames) -> None:
        self.paths = paths
        self._rank = np.empty(0, np.int64)

    def __len__(self) -> int:
        return len(self.paths.names)

    def text(self, key: int) -> str:
        return self.paths.names[key]

    def texts(self, keys: Sequence[int] | np.ndarray) -> Iterator[str]:
        names = self.paths.names
        return (names[k] for k in np.asarray(keys, np.int64).tolist())

    def text_order(self) -> np.ndarray:
        names = self.paths.names
        if self._rank.shape[0] != len(names):
            self._rank = _ranks(names)
        return self._rank


__all__ = ["FunctionNames", "PathNames"]
