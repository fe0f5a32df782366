"""The PTWRITE events of a perf.data's Intel PT (recorded with ``ptw``),
decoded queue by queue with :func:`hwtrace.hwevents.ptw.decode_events`."""

from __future__ import annotations

from ..hwevents.ptw import PtwEvents, decode_events
from ..perf.data import PerfData
from ..perf.intelpt import iter_queue_traces, pt_config_of


def perf_events(data: PerfData) -> dict[tuple[int, int], PtwEvents]:
    """The PTWRITE events of each AUX queue of a perf.data, keyed by (cpu,
    tid) as the queue is (-1 where it is not per CPU or per thread); times
    stay TSC (perf's conversion: :func:`hwtrace.perf.intelpt.tsc_conversion_of`)."""
    config = pt_config_of(data)
    return {
        (cpu, tid): decode_events(buf.copy(), config) for cpu, tid, buf in iter_queue_traces(data)
    }


__all__ = ["perf_events"]
