"""Recording real processes as Intel PT.

:func:`record_software` is the software backend for machines without Intel PT
hardware: it single-steps a process's threads with ptrace inside chosen
functions, address ranges and calls and writes the Intel PT a hardware trace
would contain (:mod:`hwtrace.record.software`, :mod:`hwtrace.record.stepper`).
"""

from __future__ import annotations

from .software import (
    BACKEND,
    TIMING_NOTE,
    MmapRecord,
    SoftwarePtOptions,
    SoftwareRecording,
    ThreadTrace,
    TimeConversion,
    encode_log,
    record_software,
)
from .stepper import (
    Mapping,
    ProcessImage,
    RecordError,
    Segment,
    StepLog,
    StepRecording,
    TaskEvent,
    TracedRange,
    read_maps,
    step_process,
    step_threads,
)

__all__ = [
    "BACKEND",
    "TIMING_NOTE",
    "Mapping",
    "MmapRecord",
    "ProcessImage",
    "RecordError",
    "Segment",
    "SoftwarePtOptions",
    "SoftwareRecording",
    "StepLog",
    "StepRecording",
    "TaskEvent",
    "ThreadTrace",
    "TimeConversion",
    "TracedRange",
    "encode_log",
    "read_maps",
    "record_software",
    "step_process",
    "step_threads",
]
