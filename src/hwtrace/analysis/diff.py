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
from .latency import LatencyResult
from .pathnames import FunctionNames, PathNames


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
