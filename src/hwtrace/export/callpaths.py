"""``hwtrace report``'s call-path files, from a
:class:`~hwtrace.analysis.feed.CallPathProfile`: folded stacks (Brendan
Gregg's FlameGraph input), every path with its weight along and below it,
a self-contained HTML flame graph and sunburst, and a Chrome trace-event
timeline of every thread's calls (for Perfetto)."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from ..analysis.diff import FIGURES, Differences, Table, weights
from ..analysis.feed import CallPathProfile
from ..analysis.pathnames import PathNames
from ..columns import distinct, distinct_inverse


def _write_sorted(paths: CallPathProfile, result, weight: np.ndarray,
                  file: str | os.PathLike[str]) -> int:  # fmt: skip
    """Lines ``text weight`` of the paths whose ``weight`` (at ``path +
    1``) is not 0, in string order, as :meth:`LatencyResult.weighted_paths`
    makes them; returns their number.  A real program's run to a GB: they
    are ordered by the tree of the paths' names and written a few
    thousand at a time, each text made from its caller's, which is kept
    only while lines below it follow."""
    tree = PathNames()
    node = tree.add(result, paths.name, paths.group, paths.names)
    wanted = np.flatnonzero(weight)
    order = tree.line_order(node[wanted], weight[wanted])
    nodes, weights = node[wanted][order], weight[wanted][order].tolist()
    with open(file, "w") as out:
        block: list[str] = []
        for text, w in zip(tree.texts_in_order(nodes), weights, strict=True):
            block.append(f"{text} {w}\n")
            if len(block) >= 4096:
                out.write("".join(block))
                block.clear()
        out.write("".join(block))
    return len(weights)


def _namer(paths: CallPathProfile, result) -> Callable[[int], str]:
    """``paths.name``, every address of ``result``'s paths named first in
    one pass over the symbol tables (a real program's few thousand
    functions, a lookup each otherwise)."""
    paths.names(distinct(result.path_heads()))
    return paths.name


def write_folded(paths: CallPathProfile, result, file: str | os.PathLike[str], by: str) -> int:
    """Folded stacks weighed by ``by`` (``insn`` or ``time``); returns the
    number of lines."""
    return _write_sorted(paths, result, result.path_insns if by == "insn" else result.path_time,
                         file)  # fmt: skip


def write_weighted_paths(
    paths: CallPathProfile, result, file: str | os.PathLike[str], by: str
) -> int:
    """Every call path with the weight along it and below it."""
    return _write_sorted(paths, result, result.inclusive(by), file)


def write_flame_page(
    paths: CallPathProfile, result, file: str | os.PathLike[str], by: str, title: str
) -> int:
    """The call paths as a self-contained HTML flame graph and sunburst."""
    from .html import TOP_PATHS, callpath_view, write_page

    weight = result.path_insns if by == "insn" else result.path_time
    wanted = np.flatnonzero(weight)
    own = weight[wanted]
    # (the heaviest first, ties in path order, as the page lists them)
    top = wanted[np.argsort(-own, kind="stable")[:TOP_PATHS]]
    name = _namer(paths, result)
    texts = result.path_texts((top - 1).tolist(), name, paths.group)
    table = list(zip(texts, weight[top].tolist(), strict=True))
    unit = "instructions" if by == "insn" else "ns"
    tree = flame_tree(result, weight, name, paths.group)
    write_page(file, callpath_view(tree, table, unit, title,
                                   f"call paths by {unit}, rooted per {paths.group_by}"))  # fmt: skip
    return int(wanted.shape[0])


def flame_tree(
    result, weight: np.ndarray, name: Callable[[int], str],
    group: Callable[[int], str] | None = None,
) -> dict:  # fmt: skip
    """The tree :func:`~hwtrace.export.html.call_tree` makes of ``result``'s
    paths with their ``weight`` (indexed ``path + 1``; the paths of none
    left out) named by ``name`` and ``group``, made a node per path
    rather than a node per frame of every path: each path's node is found
    once, from its caller's."""
    from .html import new_node, tree_lists

    top = new_node("all")
    node_of: dict[int, dict] = {}
    wanted = np.flatnonzero(weight)
    walked = result.walk_new((wanted - 1).tolist(), node_of, name, group)
    for (at, chain, frames), w in zip(walked, weight[wanted].tolist(), strict=True):
        node = node_of[at] if at >= 0 else top
        for path, called in zip(chain, frames, strict=True):
            node = node["c"].setdefault(called, new_node(called))
            if path >= 0:
                node_of[path] = node
        node["s"] += w
    # Each node's weight along it and below: its own and its children's.
    for n in _callees_first(top):
        n["v"] = n["s"] + sum(c["v"] for c in n["c"].values())
    return tree_lists(top)


def _callees_first(top: dict) -> list[dict]:
    """The nodes of a tree (children in ``"c"``), each after its children
    (iteratively: deep paths)."""
    order, stack = [], [top]
    while stack:
        n = stack.pop()
        order.append(n)
        stack.extend(n["c"].values())
    return order[::-1]


def diff_flame_tree(names: PathNames, keys: np.ndarray, a: np.ndarray, b: np.ndarray) -> dict:
    """The tree :func:`~hwtrace.export.html.diff_tree` makes of two runs'
    paths, nodes ``keys`` of ``names`` in the order of their texts (see
    :func:`hwtrace.analysis.diff.weights`) with their own weights ``a``
    and ``b``, made a node per path: each path's node is found once, from
    its caller's."""
    node_of: dict[int, dict] = {}
    top = node_of[-1] = {"n": "all", "a": 0, "b": 0, "v": 0, "c": {}}
    parent, name, texts = names.parent.tolist(), names.name.tolist(), names.names
    for key, wa, wb in zip(keys.tolist(), a.tolist(), b.tolist(), strict=True):
        chain = []
        p = key
        while p not in node_of:
            chain.append(p)
            p = parent[p]
        node = node_of[p]
        for q in reversed(chain):
            called = texts[name[q]]
            child = {"n": called, "a": 0, "b": 0, "v": 0, "c": {}}
            node["c"][called] = node_of[q] = child
            node = child
        node["a"] += wa
        node["b"] += wb
    # Each node's weights along it and below: its own and its children's.
    for n in _callees_first(top):
        for c in n["c"].values():
            n["a"] += c["a"]
            n["b"] += c["b"]
        n["v"] = max(n["a"], n["b"])
    from .html import tree_lists

    return tree_lists(top)


def write_diff_page(
    file: str | os.PathLike[str], names: PathNames, a: Table, b: Table, what: str, unit: str,
    title: str, subtitle: str,
) -> None:  # fmt: skip
    """``hwtrace diff --html``: two runs' call paths (tables ``a`` and
    ``b`` of ``names``) by their own ``what`` as a differential flame
    graph and sunburst, with the paths that differ most (ties in the
    order of their texts)."""
    from .html import TOP_PATHS, diff_view, write_page

    keys, wa, wb = weights(a, b, what)
    shown = np.flatnonzero((wa != 0) | (wb != 0))
    top = shown[np.argsort(-np.abs(wb[shown] - wa[shown]), kind="stable")[:TOP_PATHS]]
    rows = list(zip(names.texts(keys[top]), wa[top].tolist(), wb[top].tolist(), strict=True))
    write_page(file, diff_view(diff_flame_tree(names, keys, wa, wb), rows, unit, title, subtitle))


def write_diff_json(
    file: str | os.PathLike[str], head: dict, tables: dict[str, Differences]
) -> None:
    """``hwtrace diff --json``: ``head``'s items, then each of ``tables``
    as a list of ``{"key", "only_in", "a", "b"}`` (``a``, ``b``: the
    figures, null where the run has none), as ``json.dumps(indent=1)``
    writes them, a block of rows at a time (a real program's runs give a
    GB of it, which Python's indenting encoder takes minutes over)."""
    import json

    def stats(figures: list[int] | None, pad: str) -> str:
        if figures is None:
            return "null"
        inner = ",\n".join(f'{pad} "{f}": {v}' for f, v in zip(FIGURES, figures, strict=True))
        return "{\n" + inner + "\n" + pad + "}"

    with open(file, "w") as out:
        out.write("{\n" + "".join(f" {json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items()))
        for t, (name, ranked) in enumerate(tables.items()):
            out.write(f" {json.dumps(name)}: [")
            block, first = [], True
            for text, a, b in ranked.rows():
                only = "a" if b is None else "b" if a is None else ""
                block.append(("\n" if first else ",\n") + "  {\n"
                             f'   "key": {json.dumps(text)},\n   "only_in": "{only}",\n'
                             f'   "a": {stats(a, "   ")},\n   "b": {stats(b, "   ")}\n  }}')  # fmt: skip
                first = False
                if len(block) >= 4096:
                    out.write("".join(block))
                    block.clear()
            out.write("".join(block) + ("]" if first else "\n ]"))
            out.write(",\n" if t + 1 < len(tables) else "\n}\n")


def write_call_timeline(
    paths: CallPathProfile, result, file: str | os.PathLike[str], events=None
) -> int:
    """The calls of every thread as a Chrome trace-event file, with the
    software ``events`` (:mod:`hwtrace.analysis.swevents`) on their
    threads; returns the number of trace events."""
    from ..analysis.timeline import call_slices
    from .timeline import write_timeline

    sl = call_slices(result)
    uniq, index = distinct_inverse(sl.addr)
    names = [n or f"{x:#x}" for n, x in zip(paths.names(uniq), uniq.tolist(), strict=True)]
    sb = paths.sideband
    keys = set(distinct(sl.key).tolist())
    instants = None
    instant_names = None
    if events is not None:
        ok = (events.time >= 0) & (events.tid >= 0)
        instants = (events.tid[ok], events.time[ok], events.name[ok])
        instant_names = events.names
        keys |= set(distinct(events.tid[ok]).tolist())
    threads = {int(k): f"{sb.comm_of(int(k))} {int(k)}" for k in keys}
    pids = {sb.pid_of(int(k)) for k in keys}
    processes = {p: f"{sb.comm_of(p)} {p}" for p in pids if p >= 0}
    return write_timeline(
        file, key=sl.key, start=sl.start, end=sl.end, name=index.reshape(-1),
        names=names, pid_of=lambda t: max(sb.pid_of(t), 0), thread_names=threads,
        process_names=processes, instants=instants, instant_names=instant_names,
    )  # fmt: skip


__all__ = [
    "diff_flame_tree",
    "flame_tree",
    "write_call_timeline",
    "write_diff_json",
    "write_diff_page",
    "write_flame_page",
    "write_folded",
    "write_weighted_paths",
]
