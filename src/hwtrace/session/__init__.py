"""Sessions: an input opened once, handing out decoded blocks, instructions,
events and symbols.

:class:`PerfSession` opens a perf.data with everything decoding it needs
(sideband, binaries, kernel code, the cut to chosen calls);
:mod:`hwtrace.session.perfflow` decodes its trace queues into attributed
blocks and :mod:`hwtrace.session.listing` turns them into the rows of
``hwtrace script``'s listing.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (loaded on first use: see __getattr__)
    from .perfsession import PerfSession, SessionError

__all__ = ["PerfSession", "SessionError"]


def __getattr__(name: str) -> object:
    # The perf.data session loads the decoder, the perf.data reader and the
    # image: only when asked for, so that the light sessions (a CoreSight
    # capture) start without them.
    if name in __all__:
        from . import perfsession

        return getattr(perfsession, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
