"""Recording real processes as Intel PT.

:func:`record_software` is the software backend for machines without Intel PT
hardware: it single-steps a process with ptrace inside chosen functions or
address ranges and writes the Intel PT an address-filtered hardware trace
would contain (:mod:`hwtrace.record.software`, :mod:`hwtrace.record.stepper`).
"""

from __future__ import annotations

from .software import (
    BACKEND,
    TIMING_NOTE,
    MmapRecord,
    SoftwareRecording,
    TimeConversion,
    encode_log,
    record_software,
)
from .stepper import Mapping, RecordError, Segment, StepLog, TracedRange, read_maps, step_process

__all__ = [
    "BACKEND",
    "TIMING_NOTE",
    "Mapping",
    "MmapRecord",
    "RecordError",
    "Segment",
    "SoftwareRecording",
    "StepLog",
    "TimeConversion",
    "TracedRange",
    "encode_log",
    "read_maps",
    "record_software",
    "step_process",
]
