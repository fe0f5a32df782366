"""Recorded event streams a compiled filter runs over: one import for the
pieces of ``hwtrace filter``.

* input adapters (:mod:`hwtrace.filter.inputs`): :class:`PerfSource`
  (perf.data tracepoint samples), :class:`FtraceSource` (``trace_pipe_raw``
  copies), :class:`CtfSource` (CTF through babeltrace2), and
  :func:`open_source`, which picks one for a path;
* running a filter over a source (:mod:`hwtrace.filter.apply`):
  :func:`apply_filter`, :func:`select_types`;
* listing what passed (:mod:`hwtrace.filter.listing`): :func:`render_listing`;
* writing the result (:mod:`hwtrace.filter.output`): :func:`write_result`.

Bad input raises :class:`StreamError` (one line: file and offset).
"""

from __future__ import annotations

from .apply import FilterRun, TypeResult, apply_filter, select_types
from .inputs import (
    CtfSource,
    EventSource,
    EventType,
    FtraceSource,
    PerfSource,
    StreamError,
    import_bt2,
    open_source,
)
from .listing import render_listing
from .output import write_result

__all__ = [
    "CtfSource",
    "EventSource",
    "EventType",
    "FilterRun",
    "FtraceSource",
    "PerfSource",
    "StreamError",
    "TypeResult",
    "apply_filter",
    "import_bt2",
    "open_source",
    "render_listing",
    "select_types",
    "write_result",
]
