"""Two runs' call-path profiles side by side: what one run executed that
the other did not, per call path and per function.

Sharma's tracer-impact measurement (2017, §5.4.5) compares the
same code recorded with a software tracer enabled and disabled: the extra
paths (the tracer's probes) and the extra instructions and time per call
of the paths both runs share.  :func:`path_table` turns a profile
(:class:`~hwtrace.analysis.latency.LatencyResult` with ``profile``) into
per-path statistics keyed by the path's names (addresses differ between
runs); :func:`diff_paths` and :func:`diff_functions` rank the
differences.

A real program's profile holds a few hundred thousand call paths a
hundred frames deep, whose texts (``root;caller;callee``) run to a GB.
Paths are therefore kept as the nodes of one tree of names shared by the
runs compared (:class:`PathNames`: a path is its caller's path and a
name), their figures in columns, and a path's text is made only where it
is shown.  Ties rank in the order of the paths' texts, which the tree
gives without making them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..columns import distinct, distinct_inverse
from .latency import LatencyResult, _root_group, depth_levels, path_depths

# A tree node's key among its siblings: its caller's node (plus one, 0 for
# none) above these bits, its name's number below.
_NAME_BITS = 32


@dataclass
class Stats:
    """One call path's (or function's) share of a run."""

    calls: int = 0
    own_insn: int = 0  # executed in the path itself
    insn: int = 0  # in the path and every path below it
    time: int = 0  # likewise, in the run's time unit
    own_time: int = 0  # in the path itself, in the run's time unit

    def per_call(self, what: str) -> float | None:
        """``what`` per call; None for a path never called in the run (the
        function tracing began in: its total is the run's)."""
        return getattr(self, what) / self.calls if self.calls else None


FIGURES = ("calls", "own_insn", "insn", "time", "own_time")


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
        addrs = np.fromiter((a for _, a in result.paths), np.uint64, len(result.paths))
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
            glabels = [group(_root_group(int(v))) for v in values.tolist()]
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
            chain = []
            p = node
            while p >= 0 and p not in known:
                chain.append(p)
                p = parent[p]
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
        below = np.zeros(n, np.int64)
        levels = depth_levels(self.depth)
        for level in reversed(levels[1:]):
            np.add.at(below, self.parent[level], 1 + below[level])
        # The rank of each name and of each name with ";" after it.
        keys = sorted([(t, i, 0) for i, t in enumerate(self.names)]
                      + [(t + ";", i, 1) for i, t in enumerate(self.names)])  # fmt: skip
        key_rank = np.empty((len(self.names), 2), np.int64)
        for r, (_, i, kind) in enumerate(keys):
            key_rank[i, kind] = r
        # Every node's own entry (one rank) and, with nodes below it, its
        # block's entry, sorted by caller and key: an entry's offset in its
        # caller's block is the size of the entries before it.
        has_below = np.flatnonzero(below)
        e_node = np.concatenate([np.arange(n, dtype=np.int64), has_below])
        e_block = np.concatenate([np.zeros(n, bool), np.ones(has_below.shape[0], bool)])
        e_key = key_rank[self.name[e_node], e_block.astype(np.int64)]
        e_size = np.where(e_block, below[e_node], 1)
        order = np.lexsort((e_key, self.parent[e_node]))
        size = e_size[order]
        before = np.cumsum(size) - size
        callers = self.parent[e_node[order]]
        first = np.r_[True, callers[1:] != callers[:-1]]
        offset = before - np.maximum.accumulate(np.where(first, before, 0))
        own_offset = np.empty(n, np.int64)
        block_offset = np.zeros(n, np.int64)
        blocks = e_block[order]
        own_offset[e_node[order][~blocks]] = offset[~blocks]
        block_offset[e_node[order][blocks]] = offset[blocks]
        rank = np.empty(n, np.int64)
        sub = np.empty(n + 1, np.int64)  # at node + 1 (0: the forest's roots)
        sub[0] = 0
        for level in levels:
            start = sub[self.parent[level] + 1]
            rank[level] = start + own_offset[level]
            sub[level + 1] = start + block_offset[level]
        sub = sub[1:]
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
            self._rank = np.empty(len(names), np.int64)
            self._rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
        return self._rank


Keys = PathNames | FunctionNames


@dataclass
class Table:
    """One run's figures per key (a call path, a function) present in it:
    ``keys`` ascending, a column per figure of :class:`Stats`."""

    space: Keys
    keys: np.ndarray
    figures: dict[str, np.ndarray]

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def index(self, keys: np.ndarray) -> np.ndarray:
        """Where each of ``keys`` is in the table (-1: not in it)."""
        at = np.searchsorted(self.keys, keys)
        ok = at < self.keys.shape[0]
        ok[ok] = self.keys[at[ok]] == keys[ok]
        return np.where(ok, at, -1)

    def stats(self, i: int) -> Stats | None:
        """Row ``i``'s :class:`Stats` (None for -1)."""
        if i < 0:
            return None
        return Stats(**{f: int(self.figures[f][i]) for f in FIGURES})

    def column(self, what: str, keys: np.ndarray) -> np.ndarray:
        """``what`` of each of ``keys`` (0 where not present)."""
        at = self.index(keys)
        return np.where(at >= 0, self.figures[what][np.maximum(at, 0)], 0)

    def items(self) -> Iterator[tuple[str, Stats]]:
        """(text, Stats) of each key, in text order."""
        order = np.argsort(self.space.text_order()[self.keys], kind="stable")
        for i, text in zip(order.tolist(), self.space.texts(self.keys[order]), strict=True):
            yield text, self.stats(i)


def _summed(space: Keys, keys: np.ndarray, columns: dict[str, np.ndarray]) -> Table:
    """The table of rows' figures summed per key."""
    uniq, which = distinct_inverse(keys)
    figures = {}
    for f in FIGURES:
        total = np.zeros(uniq.shape[0], np.int64)
        np.add.at(total, which, columns[f])
        figures[f] = total
    return Table(space, uniq, figures)


def path_table(
    result: LatencyResult, name: Callable[[int], str], group: Callable[[int], str] | None = None,
    names: PathNames | None = None, name_all: Callable[[np.ndarray], list[str]] | None = None,
) -> Table:  # fmt: skip
    """Per call path (``root;caller;callee`` by name, after its group's
    name when ``group`` is given), its calls and instructions and time,
    own and with everything below it; the paths are nodes of ``names``
    (a new tree when None), the tree of the runs it is compared with
    (``name_all``: see :meth:`PathNames.add`)."""
    names = PathNames() if names is None else names
    node = names.add(result, name, group, name_all)
    insn = result.inclusive("insn")
    time = result.inclusive("time")
    wanted = np.flatnonzero(insn | result.path_calls)
    columns = {"calls": result.path_calls[wanted], "own_insn": result.path_insns[wanted],
               "own_time": result.path_time[wanted], "insn": insn[wanted], "time": time[wanted]}  # fmt: skip
    return _summed(names, node[wanted], {f: c.astype(np.int64) for f, c in columns.items()})


def function_table(paths: Table) -> Table:
    """Per function (a path's innermost name): its calls and own
    instructions, and instructions and time with its callees counted once
    (a recursion's inner calls are inside the outer one)."""
    tree = paths.space
    assert isinstance(tree, PathNames)
    outer = ~tree.recursive()[paths.keys]
    columns = {f: paths.figures[f] for f in ("calls", "own_insn", "own_time")}
    columns["insn"] = np.where(outer, paths.figures["insn"], 0)
    columns["time"] = np.where(outer, paths.figures["time"], 0)
    return _summed(tree.functions, tree.name[paths.keys], columns)


@dataclass
class Difference:
    """A path or function in two runs (None: not in that run)."""

    key: str
    a: Stats | None
    b: Stats | None

    def total(self, run: str, what: str) -> int:
        s = getattr(self, run)
        return getattr(s, what) if s is not None else 0

    def delta(self, what: str) -> int:
        """B's total minus A's."""
        return self.total("b", what) - self.total("a", what)

    def delta_per_call(self, what: str) -> float | None:
        """B's per call minus A's (None unless both called it)."""
        if self.a is None or self.b is None:
            return None
        a, b = self.a.per_call(what), self.b.per_call(what)
        return None if a is None or b is None else b - a

    @property
    def only_in(self) -> str:
        return "a" if self.b is None else "b" if self.a is None else ""


class Differences(Sequence[Difference]):
    """Every key of two tables, ranked (see :func:`diff`); its
    :class:`Difference` objects are made as they are read."""

    def __init__(self, a: Table, b: Table, keys: np.ndarray) -> None:
        self._a, self._b, self.keys = a, b, keys
        self._at_a, self._at_b = a.index(keys), b.index(keys)

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            rows = range(len(self))[i]
            texts = self._a.space.texts(self.keys[list(rows)])
            return [self._make(r, t) for r, t in zip(rows, texts, strict=True)]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._make(i, self._a.space.text(int(self.keys[i])))

    def __iter__(self) -> Iterator[Difference]:
        step = 4096  # (texts a block at a time: a caller's made once per block)
        for lo in range(0, len(self), step):
            yield from self[lo : lo + step]

    def rows(self, step: int = 4096) -> Iterator[tuple[str, list[int] | None, list[int] | None]]:
        """Each key in rank order as ``(text, A's figures, B's figures)``,
        the figures in :data:`FIGURES`' order (None: not in that run),
        without a :class:`Difference` each (a real program's few hundred
        thousand paths)."""
        columns = [np.stack([t.figures[f] for f in FIGURES], axis=1) for t in (self._a, self._b)]
        for lo in range(0, len(self), step):
            texts = self._a.space.texts(self.keys[lo : lo + step])
            got = []
            for table, at in zip(columns, (self._at_a[lo : lo + step], self._at_b[lo : lo + step]),
                                 strict=True):  # fmt: skip
                rows = table[np.maximum(at, 0)].tolist() if table.shape[0] else [None] * len(at)
                got.append([r if i >= 0 else None for r, i in zip(rows, at.tolist(), strict=True)])
            yield from zip(texts, *got, strict=True)

    def _make(self, i: int, text: str) -> Difference:
        return Difference(
            text, self._a.stats(int(self._at_a[i])), self._b.stats(int(self._at_b[i]))
        )


def diff(a: Table, b: Table, what: str = "insn") -> Differences:
    """Every key of either table, those that differ most in ``what``
    (``insn`` or ``time``, totals with everything below) first, ties in
    the order of their texts."""
    if a.space is not b.space:
        raise ValueError("the tables' keys are not of one tree of names (PathNames)")
    keys = distinct(np.concatenate([a.keys, b.keys]))
    delta = b.column(what, keys) - a.column(what, keys)
    order = np.lexsort((a.space.text_order()[keys], -np.abs(delta)))
    return Differences(a, b, keys[order])


def diff_paths(a: Table, b: Table, what: str = "insn") -> Differences:
    """Call paths, most different first."""
    return diff(a, b, what)


def diff_functions(a: Table, b: Table, what: str = "insn") -> Differences:
    """Functions, most different first."""
    return diff(function_table(a), function_table(b), what)


def weights(
    a: Table, b: Table, what: str = "own_insn"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every key of either table in the order of their texts, with its
    ``what`` in A and in B (0 where not present)."""
    keys = distinct(np.concatenate([a.keys, b.keys]))
    keys = keys[np.argsort(a.space.text_order()[keys], kind="stable")]
    return keys, a.column(what, keys), b.column(what, keys)


def folded_diff(a: Table, b: Table, what: str = "own_insn") -> list[str]:
    """Brendan Gregg's differential folded format: ``stack countA countB``
    (``flamegraph.pl`` draws it with its difffolded input)."""
    keys, wa, wb = weights(a, b, what)
    shown = (wa != 0) | (wb != 0)
    lines = list(a.space.texts(keys[shown]))
    for i, (x, y) in enumerate(zip(wa[shown].tolist(), wb[shown].tolist(), strict=True)):
        lines[i] = f"{lines[i]} {x} {y}"
    return lines


__all__ = [
    "FIGURES",
    "Difference",
    "Differences",
    "FunctionNames",
    "PathNames",
    "Stats",
    "Table",
    "diff",
    "diff_functions",
    "diff_paths",
    "folded_diff",
    "function_table",
    "path_table",
    "weights",
]
