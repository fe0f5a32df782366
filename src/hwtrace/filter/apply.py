"""Running a filter over an event source.

:func:`apply_filter` parses the expression once, compiles it once per event
type of the source and runs it over each type's events in native loops
(:meth:`~hwtrace.filter.compile.CompiledFilter.run_many`); events whose
context differs (``$ctx`` fields) run in one native loop per distinct
context record.  Across types it follows LTTng's rule for fields a type
lacks (the filter is false for its events).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from . import ast
from .compile import CompiledFilter, compile_filter
from .errors import FilterError
from .inputs.base import EventSource, EventType, EventTypeInfo
from .packing import RecordBatch
from .parse import parse
from .schema import Schema

T = TypeVar("T", EventType, EventTypeInfo)


@dataclass
class TypeResult:
    """One event type's run: its compiled filter, the verdict per event of
    the type, and the fields the filter names that the type lacks."""

    type: EventType
    filter: CompiledFilter
    passed: np.ndarray
    missing: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return int(self.passed.sum())


@dataclass
class FilterRun:
    source: EventSource
    results: list[TypeResult]
    keep: np.ndarray  # per event in source order: selected and passed

    def __iter__(self) -> Iterator[TypeResult]:
        return iter(self.results)


def _uses_context(tree: ast.Node) -> bool:
    return any(
        isinstance(n, ast.FieldRef) and n.root != "event" and n.path is not None
        for n in ast.walk(tree)
    )


def select_types(types: Sequence[T], patterns: Sequence[str] | None) -> list[T]:
    """Types whose name (or the part after ``system:``) matches a glob of
    ``patterns``; all of them when there is none."""
    if not patterns:
        return list(types)
    out = []
    for t in types:
        short = t.name.split(":", 1)[-1]
        if any(fnmatch.fnmatchcase(t.name, p) or fnmatch.fnmatchcase(short, p) for p in patterns):
            out.append(t)
    return out


@dataclass
class PlannedType:
    """One event type a :class:`FilterPlan` runs on: its position among
    the input's types, the type, its compiled filter, the fields the filter
    names that it lacks, and the events seen and passed so far."""

    index: int
    type: EventTypeInfo
    filter: CompiledFilter
    missing: tuple[str, ...] = ()
    events: int = 0
    passed: int = 0


class FilterPlan:
    """``expression`` compiled once per event type of ``types`` (those
    ``events`` globs select), to run on sources whose ``types`` are those
    types in that order (a whole source, or each chunk of an input).

    LTTng's rule across types: a type that lacks a field the filter names
    gets the filter compiled with ``unknown="false"`` (its events then fail
    where that field is read); a field no type has is an error, reported
    against the first type with its column.  Raises :class:`FilterError`.
    """

    def __init__(
        self,
        expression: str,
        types: Sequence[EventTypeInfo],
        tier: str = "ebpf-jit",
        *,
        events: Sequence[str] | None = None,
    ) -> None:
        tree = parse(expression)  # syntax errors, once, with the caret
        refs = ast.field_refs(tree, "event")
        selected = select_types(types, events)
        picked = [i for i, t in enumerate(types) if any(t is s for s in selected)]
        missing_by_type: list[tuple[str, ...]] = []
        for i in picked:
            missing = []
            for ref in refs:
                try:
                    found = types[i].schema.resolve(ref.names, ref.text)
                except FilterError:
                    found = True  # misuse: compile_filter reports it with the column
                if found is None and ref.text not in missing:
                    missing.append(ref.text)
            missing_by_type.append(tuple(missing))
        if picked:
            everywhere = set(missing_by_type[0]).intersection(*missing_by_type[1:])
            if everywhere:
                # No type has it: a typo, not LTTng's lenient case.
                compile_filter(expression, types[picked[0]].schema, tier)  # type: ignore[arg-type]
        else:
            compile_filter(expression, Schema.declare("none", []), tier, unknown="false")  # type: ignore[arg-type]
        self.types: list[PlannedType] = [
            PlannedType(i, types[i], _compile(expression, types[i].schema, tier, bool(m)), m)
            for i, m in zip(picked, missing_by_type, strict=True)
        ]

    def run(self, source: EventSource) -> tuple[np.ndarray, list[np.ndarray]]:
        """The verdict per event of ``source`` (selected and passed), and
        per planned type the verdict per event of that type; adds to the
        types' counts."""
        keep = np.zeros(len(source), np.bool_)
        context_address = source.contexts.address(0)
        ctx_rows = getattr(source, "context_rows", np.zeros(len(source), np.int64))
        verdicts = []
        for p in self.types:
            t = source.types[p.index]
            cf = p.filter
            if len(t) == 0:
                passed = np.zeros(0, np.bool_)
            elif not _uses_context(cf.tree):
                passed = cf.run_many(t.addresses, context_address)
            else:
                passed = _run_by_context(cf, t.addresses, ctx_rows[t.rows], source.contexts)
            keep[t.rows] = passed
            p.events += len(t)
            p.passed += int(passed.sum())
            verdicts.append(passed)
        return keep, verdicts


def apply_filter(
    source: EventSource,
    expression: str,
    tier: str = "ebpf-jit",
    *,
    events: Sequence[str] | None = None,
) -> FilterRun:
    """Compile ``expression`` once per event type of ``source`` (selected by
    ``events`` globs) and run it over each type's events in native loops
    (:class:`FilterPlan` on the whole source).  Raises :class:`FilterError`.
    """
    plan = FilterPlan(expression, source.types, tier, events=events)
    keep, verdicts = plan.run(source)
    results = [
        TypeResult(source.types[p.index], p.filter, passed, p.missing)
        for p, passed in zip(plan.types, verdicts, strict=True)
    ]
    return FilterRun(source, results, keep)


def _compile(expression: str, schema: Schema, tier: str, lenient: bool) -> CompiledFilter:
    unknown = "false" if lenient else "error"
    return compile_filter(expression, schema, tier, unknown=unknown)  # type: ignore[arg-type]


def _run_by_context(
    cf: CompiledFilter, addresses: np.ndarray, rows: np.ndarray, contexts: RecordBatch
) -> np.ndarray:
    """Verdicts with each event's own context: one native run per context
    record (events grouped by it), not a Python step per event."""
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    cuts = np.flatnonzero(np.diff(sorted_rows)) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [rows.shape[0]]])
    out = np.zeros(rows.shape[0], np.bool_)
    ordered = addresses[order]
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        out[order[s:e]] = cf.run_many(ordered[s:e], contexts.address(int(sorted_rows[s])))
    return out
