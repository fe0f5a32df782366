"""The error every recorder raises for a process it could not record."""

from __future__ import annotations

__all__ = ["RecordError"]


class RecordError(Exception):
    """The process could not be recorded (a clear message, no traceback needed)."""
