"""Recording real processes as Intel PT.

:func:`record_software` is the software backend for machines without Intel PT
hardware: it single-steps a process's threads with ptrace inside chosen
functions, address ranges and calls and writes the Intel PT a hardware trace
would contain (:mod:`hwtrace.record.software`, :mod:`hwtrace.record.stepper`).
"""

from __future__ import annotations

import importlib
from typing import Any

# What each name is imported from, on first use: recording with the patch
# backend needs none of the stepper's and software encoder's imports.
_FROM = {
    "BACKEND": "software",
    "TIMING_NOTE": "software",
    "MmapRecord": "sideband",
    "SoftwarePtOptions": "software",
    "SoftwareRecording": "software",
    "ThreadTrace": "software",
    "TimeConversion": "sideband",
    "encode_log": "software",
    "record_software": "software",
    "Mapping": "stepper",
    "ProcessImage": "stepper",
    "RecordError": "errors",
    "Segment": "stepper",
    "StepLog": "stepper",
    "StepRecording": "stepper",
    "TaskEvent": "stepper",
    "TracedRange": "functions",
    "read_maps": "stepper",
    "step_process": "stepper",
    "step_threads": "stepper",
}


def __getattr__(name: str) -> Any:
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


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
