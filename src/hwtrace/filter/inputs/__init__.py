"""Input adapters for ``hwtrace filter``: recorded events as
:class:`~hwtrace.filter.inputs.base.EventSource` s.

* :mod:`.perf`: perf.data with tracepoint samples;
* :mod:`.ftrace`: copies of ftrace's ``trace_pipe_raw`` (ring-buffer pages);
* :mod:`.ctf`: CTF traces through babeltrace2's Python bindings.

:func:`open_source` picks the adapter for a path and reads it whole;
:func:`open_input` reads a perf.data a range of records at a time.
"""

from __future__ import annotations

from pathlib import Path

from .base import EventSource, EventType, EventTypeInfo, StreamError, StreamInput, WholeInput
from .ctf import CtfSource, import_bt2
from .ftrace import FtraceSource
from .perf import PerfInput, PerfSource

__all__ = [
    "CtfSource",
    "EventSource",
    "EventType",
    "EventTypeInfo",
    "FtraceSource",
    "PerfInput",
    "PerfSource",
    "StreamError",
    "StreamInput",
    "WholeInput",
    "import_bt2",
    "open_input",
    "open_source",
]


def _which(path: str) -> tuple[str, str]:
    """The adapter for ``path`` (``perf``, ``ctf`` or ``ftrace``) and the
    path to give it."""
    p = Path(path)
    if not p.exists():
        raise StreamError(path, "no such file or directory")
    if p.is_dir():
        if (p / "data").is_file() and _is_perf(p / "data"):
            return "perf", str(p)
        if (p / "metadata").is_file() or any(p.rglob("metadata")):
            return "ctf", path
        return "ftrace", path
    if _is_perf(p):
        return "perf", path
    if p.name == "metadata":
        return "ctf", str(p.parent)
    return "ftrace", path


def open_source(path: str, tracefs: str | None = None) -> EventSource:
    """The source for ``path``, read whole: a perf.data (by its magic), a
    CTF trace (a directory with a ``metadata`` file somewhere under it),
    else trace_pipe_raw copies (a file, or a directory of ``cpuN`` files)."""
    kind, where = _which(path)
    if kind == "perf":
        return PerfSource(where, tracefs)
    if kind == "ctf":
        return CtfSource(where)
    return FtraceSource(where, tracefs)


def open_input(path: str, tracefs: str | None = None) -> StreamInput:
    """``path`` as :func:`open_source` reads it, in chunks where the input
    allows: a perf.data a range of records at a time (bounded memory),
    others as one chunk."""
    kind, where = _which(path)
    if kind == "perf":
        return PerfInput(where, tracefs)
    return WholeInput(open_source(path, tracefs))


def _is_perf(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(8) in (b"PERFILE2", b"2ELIFREP", b"PERFFILE")
    except OSError as e:
        raise StreamError(str(p), f"cannot read: {e.strerror}") from None
