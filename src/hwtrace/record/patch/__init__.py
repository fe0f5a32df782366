"""Recording by live code patching: Intel PT written by the traced program's
own patched branches, where the CPU has no Intel PT (see :mod:`.tracer`)."""

from .tracer import PatchError, PatchOptions, PatchRecording, PatchThread, record_patched

__all__ = ["PatchError", "PatchOptions", "PatchRecording", "PatchThread", "record_patched"]
