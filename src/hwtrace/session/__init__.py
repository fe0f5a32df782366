"""Sessions: an input opened once, handing out decoded blocks, instructions,
events and symbols.

:class:`PerfSession` opens a perf.data with everything decoding it needs
(sideband, binaries, kernel code, the cut to chosen calls);
:mod:`hwtrace.session.perfflow` decodes its trace queues into attributed
blocks and :mod:`hwtrace.session.listing` turns them into the rows of
``hwtrace script``'s listing.
"""

from .perfsession import PerfSession, SessionError

__all__ = ["PerfSession", "SessionError"]
