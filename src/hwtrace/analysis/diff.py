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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .latency import LatencyResult


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


def path_table(
    result: LatencyResult, name: Callable[[int], str], group: Callable[[int], str] | None = None
) -> dict[str, Stats]:
    """Per call path (``root;caller;callee`` by name, after its group's
    name when ``group`` is given), its calls and instructions and time,
    own and with everything below it."""
    insn = result.inclusive("insn")
    time = result.inclusive("time")
    out: dict[str, Stats] = {}
    wanted = np.flatnonzero(insn | result.path_calls).tolist()
    keys = result.path_texts([idx - 1 for idx in wanted], name, group)
    for idx, key in zip(wanted, keys, strict=True):
        s = out.setdefault(key, Stats())
        s.calls += int(result.path_calls[idx])
        s.own_insn += int(result.path_insns[idx])
        s.own_time += int(result.path_time[idx])
        s.insn += int(insn[idx])
        s.time += int(time[idx])
    return out


def function_table(paths: dict[str, Stats]) -> dict[str, Stats]:
    """Per function (a path's innermost name): its calls and own
    instructions, and instructions and time with its callees counted once
    (a recursion's inner calls are inside the outer one)."""
    out: dict[str, Stats] = {}
    for key, s in paths.items():
        parts = key.split(";")
        func = parts[-1]
        f = out.setdefault(func, Stats())
        f.calls += s.calls
        f.own_insn += s.own_insn
        if func not in parts[:-1]:  # the outermost occurrence on the path
            f.insn += s.insn
            f.time += s.time
    return out


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


def diff(a: dict[str, Stats], b: dict[str, Stats], what: str = "insn") -> list[Difference]:
    """Every key of either table, those that differ most in ``what``
    (``insn`` or ``time``, totals with everything below) first."""
    out = [Difference(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b))]
    out.sort(key=lambda d: (-abs(d.delta(what)), d.key))
    return out


def diff_paths(a: dict[str, Stats], b: dict[str, Stats], what: str = "insn") -> list[Difference]:
    """Call paths, most different first."""
    return diff(a, b, what)


def diff_functions(
    a: dict[str, Stats], b: dict[str, Stats], what: str = "insn"
) -> list[Difference]:
    """Functions, most different first."""
    return diff(function_table(a), function_table(b), what)


def folded_diff(a: dict[str, Stats], b: dict[str, Stats], what: str = "own_insn") -> list[str]:
    """Brendan Gregg's differential folded format: ``stack countA countB``
    (``flamegraph.pl`` draws it with its difffolded input)."""
    lines = []
    for key in sorted(set(a) | set(b)):
        wa = getattr(a[key], what) if key in a else 0
        wb = getattr(b[key], what) if key in b else 0
        if wa or wb:
            lines.append(f"{key} {wa} {wb}")
    return lines


__all__ = [
    "Difference",
    "Stats",
    "diff",
    "diff_functions",
    "diff_paths",
    "folded_diff",
    "function_table",
    "path_table",
]
