"""hwtrace diff's tables (:mod:`hwtrace.analysis.diff`) against the plain
reading of their definitions: each path's text made in full, figures
summed per text, functions per innermost name, ranked by their delta then
their text, on call-path forests with names that sort around ``;``."""

from __future__ import annotations

import numpy as np
import pytest

from hwtrace.analysis.diff import (
    diff_functions,
    diff_paths,
    folded_diff,
    function_table,
    path_table,
)
from hwtrace.analysis.latency import ROOT, LatencyResult
from hwtrace.analysis.pathnames import PathNames

# Names whose order differs from the order of their paths' texts: "." and
# "!" sort before ";", "~" after, one name is a prefix of others.
NAMES = [
    "f",
    "f.cold",
    "f!x",
    "f~",
    "g",
    "g0",
    "main",
    "a b",
    "F",
    "",
    'q"u',
    "é",
    "a",
    "a 1x",
    "a 12",
]


def _result(rng: np.random.Generator, n: int) -> tuple[LatencyResult, dict[int, str]]:
    """A random profile of ``n`` paths: roots in three groups (and none),
    callees named from NAMES (several addresses per name, some unnamed),
    recursion, paths that never ran."""
    paths = []
    for i in range(n):
        if i < 4 or rng.random() < 0.05:
            parent = int(rng.choice([ROOT, ROOT - 1, ROOT - 2, -1]))
        else:
            parent = int(rng.integers(0, i))
        paths.append((parent, int(rng.integers(0x1000, 0x1000 + 24)) * 16))
    names = {a: NAMES[(a // 16) % len(NAMES)] for _, a in paths}
    for a in list(names)[:3]:
        names[a] = ""  # no name: its address stands
    weights = [rng.integers(0, 50, n + 1) * (rng.random(n + 1) < 0.6) for _ in range(3)]
    return LatencyResult(
        patterns=None, intervals=None, marker_counts=np.zeros(0, np.int64), instructions=0,
        repeated_opens=0, unmatched_closes=0, gapped=0, gapped_calls=0, skipped_frames=0,
        paths=paths, path_insns=weights[0].astype(np.int64), path_time=weights[1].astype(np.int64),
        path_calls=weights[2].astype(np.int64),
    ), names  # fmt: skip


def _reference(result: LatencyResult, name, group) -> dict[str, dict[str, int]]:
    """Per path text, the figures summed (the definition, a path at a
    time)."""
    insn, time = result.inclusive("insn"), result.inclusive("time")
    out: dict[str, dict[str, int]] = {}
    for idx in np.flatnonzero(insn | result.path_calls).tolist():
        key = ";".join(result.path_names(idx - 1, name, group))
        s = out.setdefault(key, dict.fromkeys(("calls", "own_insn", "insn", "time", "own_time"), 0))
        s["calls"] += int(result.path_calls[idx])
        s["own_insn"] += int(result.path_insns[idx])
        s["own_time"] += int(result.path_time[idx])
        s["insn"] += int(insn[idx])
        s["time"] += int(time[idx])
    return out


def _functions(paths: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for key, s in paths.items():
        parts = key.split(";")
        f = out.setdefault(
            parts[-1], dict.fromkeys(("calls", "own_insn", "insn", "time", "own_time"), 0)
        )
        f["calls"] += s["calls"]
        f["own_insn"] += s["own_insn"]
        f["own_time"] += s["own_time"]
        if parts[-1] not in parts[:-1]:
            f["insn"] += s["insn"]
            f["time"] += s["time"]
    return out


def _ranked(a: dict, b: dict, what: str) -> list[tuple[str, dict | None, dict | None]]:
    keys = sorted(set(a) | set(b))
    delta = {k: (b[k][what] if k in b else 0) - (a[k][what] if k in a else 0) for k in keys}
    keys.sort(key=lambda k: (-abs(delta[k]), k))
    return [(k, a.get(k), b.get(k)) for k in keys]


def _rows(diffs) -> list[tuple[str, dict | None, dict | None]]:
    return [(d.key, d.a and d.a.__dict__, d.b and d.b.__dict__) for d in diffs]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("grouped", [True, False])
def test_tables_and_ranking_match_the_definition(seed, grouped):
    rng = np.random.default_rng(seed)
    (ra, na), (rb, nb) = _result(rng, 300), _result(rng, 260)
    group = (lambda g: ["comm", "other", "x;y"][g] if g >= 0 else "?") if grouped else None
    tree = PathNames()
    ta = path_table(ra, na.get, group, tree)
    tb = path_table(rb, nb.get, group, tree)
    ref_a, ref_b = _reference(ra, na.get, group), _reference(rb, nb.get, group)
    assert dict((k, s.__dict__) for k, s in ta.items()) == ref_a
    assert [k for k, _ in tb.items()] == sorted(ref_b)
    for what in ("insn", "time"):
        assert _rows(diff_paths(ta, tb, what)) == _ranked(ref_a, ref_b, what)
        assert _rows(diff_functions(ta, tb, what)) == _ranked(
            _functions(ref_a), _functions(ref_b), what
        )
    ranked = diff_paths(ta, tb)
    assert _rows(ranked[:7]) == _rows(list(ranked)[:7]) and _rows([ranked[-1]]) == _rows(
        ranked[-1:]
    )
    assert folded_diff(ta, tb) == [
        f"{k} {a['own_insn'] if a else 0} {b['own_insn'] if b else 0}"
        for k, a, b in ((k, ref_a.get(k), ref_b.get(k)) for k in sorted(set(ref_a) | set(ref_b)))
        if (a and a["own_insn"]) or (b and b["own_insn"])
    ]
    assert len(function_table(ta)) == len(_functions(ref_a))


def test_json_is_what_json_dumps_writes(tmp_path):
    import json

    from hwtrace.export.callpaths import write_diff_json

    rng = np.random.default_rng(5)
    (ra, na), (rb, nb) = _result(rng, 120), _result(rng, 90)
    tree = PathNames()
    ta, tb = path_table(ra, na.get, None, tree), path_table(rb, nb.get, None, tree)
    nothing = _result(rng, 0)[0]
    for column in (nothing.path_insns, nothing.path_time, nothing.path_calls):
        column[:] = 0
    empty = path_table(nothing, na.get, None, tree)
    assert len(empty) == 0
    head = {"a": "A.data", "b": "é/B", "by": "insn"}
    tables = {"paths": diff_paths(ta, tb), "functions": diff_functions(ta, tb),
              "none": diff_paths(empty, empty)}  # fmt: skip
    write_diff_json(tmp_path / "d.json", head, tables)
    want = {**head, **{k: [{"key": d.key, "only_in": d.only_in, "a": d.a and d.a.__dict__,
                            "b": d.b and d.b.__dict__} for d in v] for k, v in tables.items()}}  # fmt: skip
    assert (tmp_path / "d.json").read_text() == json.dumps(want, indent=1) + "\n"


@pytest.mark.parametrize("seed", range(4))
def test_lines_sort_as_their_strings(seed):
    """Folded stacks' lines ``text weight`` in string order from the tree
    (a weight sorts after a name's space: ``a 5`` against ``a 1x;f 3``),
    their texts made keeping only the last line's callers."""
    rng = np.random.default_rng(seed)
    result, names = _result(rng, 400)
    group = (lambda g: ["comm", "c 1"][g % 2] if g >= 0 else "?") if seed % 2 else None
    tree = PathNames()
    node = tree.add(result, names.get, group)
    weight = rng.integers(-3, 40, node.shape[0]) * (rng.random(node.shape[0]) < 0.7)
    wanted = np.flatnonzero(weight)
    order = tree.line_order(node[wanted], weight[wanted])
    texts = list(tree.texts_in_order(node[wanted][order]))
    got = [f"{t} {w}" for t, w in zip(texts, weight[wanted][order].tolist(), strict=True)]
    want = sorted(f"{';'.join(result.path_names(i - 1, names.get, group))} {weight[i]}"
                  for i in wanted.tolist())  # fmt: skip
    assert got == want


def test_a_run_added_twice_is_the_same_nodes():
    rng = np.random.default_rng(11)
    result, names = _result(rng, 200)
    tree = PathNames()
    first = tree.add(result, names.get)
    size = len(tree)
    assert (tree.add(result, names.get) == first).all() and len(tree) == size
    assert all(tree.parent[n] < n for n in range(size))
