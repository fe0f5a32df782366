"""Input adapters for ``hwtrace filter``: recorded events as
:class:`~hwtrace.filter.inputs.base.EventSource` s.

* :mod:`.perf`: perf.data with tracepoint samples;
* :mod:`.ftrace`: copies of ftrace's ``trace_pipe_raw`` (ring-buffer pages);
* :mod:`.ctf`: CTF traces through babeltrace2's Python bindings.

:func:`open_source` picks the adapter for a path.
"""

from __future__ import annotations

from pathlib import Path

from .base import EventSource, EventType, StreamError
from .ctf import CtfSource, import_bt2
from .ftrace import FtraceSource
from .perf import PerfSource

__all__ = [
    "CtfSource",
    "EventSource",
    "EventType",
    "FtraceSource",
    "PerfSource",
    "StreamError",
    "import_bt2",
    "open_source",
]


def open_source(path: str, tracefs: str | None = None) -> EventSource:
    """The source for ``path``: a perf.data (by its magic), a CTF trace (a
    directory with a ``metadata`` file somewhere under it), else
    trace_pipe_raw copies (a file, or a directory of ``cpuN`` files)."""
    p = Path(path)
    if not p.exists():
        raise StreamError(path, "no such file or directory")
    if p.is_dir():
        if (p / "data").is_file() and _is_perf(p / "data"):
            return PerfSource(str(p), tracefs)
        if (p / "metadata").is_file() or any(p.rglob("metadata")):
            return CtfSource(path)
        return FtraceSource(path, tracefs)
    if _is_perf(p):
        return PerfSource(path, tracefs)
    if p.name == "metadata":
        return CtfSource(str(p.parent))
    return FtraceSource(path, tracefs)


def _is_perf(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(8) in (b"PERFILE2", b"2ELIFREP", b"PERFFILE")
    except OSError as e:
        raise StreamError(str(p), f"cannot read: {e.strerror}") from None
