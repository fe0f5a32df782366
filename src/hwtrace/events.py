"""hwtrace's event API: typed software events defined once, written through
whichever channel the machine has, read back by one decoder.

An event is a type id and up to eight 64-bit payload words, declared in an
:class:`EventSchema` (Python or JSON).  A C program includes the header
:func:`write_headers` makes and calls ``hwtrace_<name>(fields...)``:

- where the CPU has PTWRITE (CPUID leaf 0x14) and Intel PT runs with
  ``ptw`` (``perf record -e intel_pt/ptw,fup_on_ptw/``), the event is
  ``ptwrite`` instructions: PTW packets (and a FUP with the call site) in
  the processor's trace, beside the instruction flow;
- elsewhere the software channel (``hwtrace_channel.h``; a
  :class:`Channel` consumes it) writes the same PT packets into per-thread
  shared-memory sub-buffers handed over whole, Vergé et al.'s sub-buffer
  design;
- under ``hwtrace record``'s software backend with ``HWTRACE_PTWRITE=1``,
  the recorder carries out the PTWRITEs itself.

:func:`decode_events` reads any of these streams (raw PT, a perf.data's
queues through :func:`perf_events`, a channel's streams) into typed
events; :meth:`PtwEvents.json_lines` and :func:`write_ctf` export them.
The CoreSight STM path (MIPI STPv2 through a trace buffer) is
:mod:`hwtrace.hwevents.stp` and :mod:`hwtrace.hwevents.vstm`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from .hwevents.channel import Channel, header_path
from .hwevents.ptw import (
    MARK,
    MAX_WORDS,
    EventSchema,
    EventType,
    PtwEvents,
    decode_events,
    encode_events,
)

if TYPE_CHECKING:  # (loaded on first use: see __getattr__)
    from .export.ctf import write_ptw_events as write_ctf
    from .session.ptwevents import perf_events

__all__ = [
    "MARK",
    "MAX_WORDS",
    "Channel",
    "EventSchema",
    "EventType",
    "PtwEvents",
    "decode_events",
    "encode_events",
    "perf_events",
    "ptwrite_supported",
    "write_ctf",
    "write_headers",
]


def __getattr__(name: str) -> object:
    # Reading a perf.data and writing CTF load the perf.data reader and the
    # CTF writer: only when asked for, so that writing headers starts fast.
    if name == "perf_events":
        from .session.ptwevents import perf_events

        return perf_events
    if name == "write_ctf":
        from .export.ctf import write_ptw_events

        return write_ptw_events
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def ptwrite_supported() -> bool:
    """Whether this machine's CPU has PTWRITE (Linux's ``ptwrite`` CPU flag,
    CPUID.(EAX=14H,ECX=0):EBX[4])."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "ptwrite" in line.split(":", 1)[1].split()
    except OSError:
        pass
    return False


def write_headers(
    schema: EventSchema, path: str | Path, guard: str = "HWTRACE_EVENTS_H"
) -> list[Path]:
    """Write the schema's C header at ``path`` and the software channel's
    header beside it (the event functions fall back on it); returns both."""
    out = Path(path)
    out.write_text(schema.c_header(guard))
    channel = out.parent / header_path().name
    if channel.resolve() != header_path().resolve():
        shutil.copyfile(header_path(), channel)
    return [out, channel]
