"""Self-contained HTML views of hwtrace's analyses.

One file per analysis: the page's style, its script (``views.js``: SVG
drawn in the browser, no library) and the data (JSON) are all inline, so
the file opens anywhere, offline, and can be mailed or attached to a bug.

* :func:`latency_page`: Δt and ΔIC histograms (power-of-two buckets, linear
  or logarithmic counts), the summary and the longest intervals;
* :func:`callpath_page`: a zoomable, searchable flame graph, a sunburst of
  the same call paths and the paths as a table;
* :func:`diff_page`: the differential flame graph and sunburst of two
  runs (width: the larger of the two, colour: more in B red, less blue);
* :func:`plots_page`: line plots (the resolution characterisation).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="hwtrace">
<title>{title}</title>
<style>{css}</style>
</head><body>
<header><h1>{title}</h1><div class="sub">{subtitle}</div></header>
<main></main>
<script type="application/json" id="hwtrace-data">{data}</script>
<script>{js}</script>
</body></html>
"""


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def page(view: str, title: str, subtitle: str, data: dict[str, Any]) -> str:
    """A view's page: ``data`` (plain JSON values) drawn by ``views.js``'s
    ``view``."""
    payload = json.dumps({"view": view, **data}, separators=(",", ":"), allow_nan=False)
    # Inside <script>, "</" would end the element: JSON allows "<\/".
    payload = payload.replace("</", "<\\/")
    return _PAGE.format(
        title=html.escape(title), subtitle=html.escape(subtitle), css=_asset("views.css"),
        js=_asset("views.js"), data=payload,
    )  # fmt: skip


def write_page(path: str | Path, text: str) -> None:
    Path(path).write_text(text, encoding="utf-8")


def call_tree(paths: Iterable[tuple[Sequence[str], int]], root: str = "all") -> dict:
    """The tree of call paths (each a list of names, outermost first, and
    its own weight) as the views take it: ``{"n", "v", "s", "c"}`` with
    ``v`` the weight along the node and below, ``s`` its own."""
    top = new_node(root)
    for parts, weight in paths:
        node = top
        node["v"] += weight
        for name in parts:
            node = node["c"].setdefault(name, new_node(name))
            node["v"] += weight
        node["s"] += weight
    return tree_lists(top)


def diff_tree(paths: Iterable[tuple[Sequence[str], int, int]], root: str = "all") -> dict:
    """Two runs' call paths (names, weight in A, weight in B) as one tree
    with ``a`` and ``b`` along each node and below."""
    top: dict[str, Any] = {"n": root, "a": 0, "b": 0, "v": 0, "c": {}}
    for parts, a, b in paths:
        node = top
        node["a"] += a
        node["b"] += b
        for name in parts:
            node = node["c"].setdefault(name, {"n": name, "a": 0, "b": 0, "v": 0, "c": {}})
            node["a"] += a
            node["b"] += b
    _fill_v(top)
    return tree_lists(top)


def _fill_v(node: dict) -> None:
    stack = [node]
    while stack:
        n = stack.pop()
        n["v"] = max(n["a"], n["b"])
        stack.extend(n["c"].values())


def new_node(name: str) -> dict[str, Any]:
    """A node of :func:`call_tree`'s tree, before its weights are added."""
    return {"n": name, "v": 0, "s": 0, "c": {}}


def tree_lists(node: dict) -> dict:
    """Children as lists (JSON arrays), iteratively (deep paths)."""
    stack = [node]
    while stack:
        n = stack.pop()
        kids = list(n["c"].values())
        n["c"] = kids
        stack.extend(kids)
    return node


def latency_page(profile: dict, title: str, subtitle: str = "", key_label: str = "tid") -> str:
    """The page of a latency profile (:func:`hwtrace.analysis.latency_report.to_json`)."""
    return page("latency", title, subtitle, {**profile, "key_label": key_label})


def callpath_page(
    lines: Sequence[tuple[Sequence[str], int]], unit: str, title: str, subtitle: str = ""
) -> str:
    """The page of a call-path profile: ``lines`` are the paths (names,
    outermost first) with their own weight in ``unit``."""
    table = sorted(((";".join(p), w) for p, w in lines if w), key=lambda r: -r[1])[:TOP_PATHS]
    return callpath_view(call_tree(lines), table, unit, title, subtitle)


#: The heaviest paths a call-path page lists.
TOP_PATHS = 2000


def callpath_view(
    tree: dict, table: Sequence[tuple[str, int]], unit: str, title: str, subtitle: str = ""
) -> str:
    """:func:`callpath_page` of a tree made already (:func:`call_tree`'s
    form) and the heaviest paths (``;``-joined names, own weight; at most
    :data:`TOP_PATHS`, heaviest first)."""
    return page("callpaths", title, subtitle, {"unit": unit, "tree": tree, "paths": table})


def diff_page(
    lines: Sequence[tuple[Sequence[str], int, int]], unit: str, title: str, subtitle: str = ""
) -> str:
    """The page of two runs' call paths: ``(names, own weight in A, in B)``."""
    rows = sorted(((";".join(p), a, b) for p, a, b in lines if a or b),
                  key=lambda r: -abs(r[2] - r[1]))[:TOP_PATHS]  # fmt: skip
    return diff_view(diff_tree(lines), rows, unit, title, subtitle)


def diff_view(
    tree: dict, rows: Sequence[tuple[str, int, int]], unit: str, title: str, subtitle: str = ""
) -> str:
    """:func:`diff_page` of a tree made already (:func:`diff_tree`'s form)
    and the paths that differ most (``;``-joined names, own weight in A,
    in B; at most :data:`TOP_PATHS`, most different first)."""
    return page("diff", title, subtitle, {"unit": unit, "tree": tree, "paths": rows})


def plots_page(
    plots: list[dict], title: str, subtitle: str = "", facts: list | None = None,
    table: dict | None = None,
) -> str:  # fmt: skip
    """Line plots (points only with ``"scatter": true``): each ``{"title", "x", "y", "logx", "logy", "series":
    [{"name", "points": [[x, y, note?]...]}]}``; ``facts`` ``[label,
    value]`` pairs; ``table`` ``{"title", "columns", "rows"}``."""
    return page("plots", title, subtitle, {"plots": plots, "facts": facts or [], "table": table})


__all__ = [
    "call_tree",
    "callpath_page",
    "callpath_view",
    "diff_page",
    "diff_tree",
    "diff_view",
    "latency_page",
    "new_node",
    "page",
    "plots_page",
    "tree_lists",
    "write_page",
]
