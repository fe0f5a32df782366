"""Recorded event streams a compiled filter runs over: one import for the
pieces of ``hwtrace filter``.

* input adapters (:mod:`hwtrace.filter.inputs`): :class:`PerfSource`
  (perf.data tracepoint samples), :class:`FtraceSource` (``trace_pipe_raw``
  copies), :class:`CtfSource` (CTF through babeltrace2), and
  :func:`open_source`, which picks one for a path; :func:`open_input` reads
  a perf.data in ranges of records (:class:`PerfInput`);
* running a filter over a source (:mod:`hwtrace.filter.apply`):
  :func:`apply_filter`, :class:`FilterPlan` (compiled once, run per chunk),
  :func:`select_types`;
* listing what passed (:mod:`hwtrace.filter.listing`): :func:`render_listing`,
  :class:`ListingWriter` (chunk by chunk, in time order);
* writing the result (:mod:`hwtrace.filter.output`): :func:`write_result`,
  :class:`ResultWriter` (chunk by chunk).

Bad input raises :class:`StreamError` (one line: file and offset).
"""

from __future__ import annotations

from .apply import FilterPlan, FilterRun, TypeResult, apply_filter, select_types
from .inputs import (
    CtfSource,
    EventSource,
    EventType,
    FtraceSource,
    PerfInput,
    PerfSource,
    StreamError,
    StreamInput,
    import_bt2,
    open_input,
    open_source,
)
from .listing import ListingWriter, render_listing
from .output import ResultWriter, write_result

__all__ = [
    "CtfSource",
    "EventSource",
    "EventType",
    "FilterPlan",
    "FilterRun",
    "FtraceSource",
    "ListingWriter",
    "PerfInput",
    "PerfSource",
    "ResultWriter",
    "StreamError",
    "StreamInput",
    "TypeResult",
    "apply_filter",
    "import_bt2",
    "open_input",
    "open_source",
    "render_listing",
    "select_types",
    "write_result",
]
