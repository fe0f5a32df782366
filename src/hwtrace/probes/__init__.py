"""Fast dynamic tracepoints in live x86-64 processes.

Jump tracepoints made safe by embedded traps (Harper-Cyr, Dagenais and
Shahnejat Bushehri, "Fast & Flexible Tracepoints in x86"): a 5-byte jump
may cover several short instructions because every covered instruction
start reads ``int3`` and a redirect handler in the target sends a thread
that arrives there to that instruction's relocated copy.
"""

from __future__ import annotations

from .locate import Site, SiteError
from .session import JUMP, TRAP, UPROBE, ProbeError, ProbeSession, Tracepoint

__all__ = [
    "JUMP",
    "TRAP",
    "UPROBE",
    "ProbeError",
    "ProbeSession",
    "Site",
    "SiteError",
    "Tracepoint",
]
