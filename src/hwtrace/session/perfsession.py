"""A perf.data opened once for decoding: its records, sideband, kernel code
and binaries, and the cut to chosen calls, handing out decoded blocks.

Every command that reads the Intel PT of a perf.data (``script``,
``report``, ``latency``, ``diff``, ``events``, ``decode``) opens it through
:meth:`PerfSession.open` and decodes through :meth:`PerfSession.decode`, so
the input's options (``--symfs``, ``--kcore``, ``--vmlinux``,
``--kallsyms``, ``--call``/``--all``) mean the same everywhere, and so does
the flow they get: batches of attributed blocks
(:class:`~hwtrace.session.perfflow.PerfBlocks`), cut to the calls of the
chosen functions when there are any, as ``perf script --itrace`` would list
them.  :meth:`PerfSession.listing` goes one step further, to the rows of
``hwtrace script``'s listing (:mod:`hwtrace.session.listing`).

A library user::

    from hwtrace.session import PerfSession

    session = PerfSession.open("perf.data")
    session.decode(lambda blocks: print(len(blocks), blocks.instructions()[:4]))
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..image.kernelcode import KernelCode, KernelCodeError, load_kernel
from ..perf.data import PerfData, PerfDataError, read_perf_data
from ..perf.intelpt import sideband_of
from ..perf.notes import recorded_calls
from ..perf.sideband import BinaryLocator, Sideband
from .listing import ListingBuilder, ListingRows
from .perfflow import PerfBlocks, PerfStream, stream_perf


class SessionError(ValueError):
    """The input cannot be opened; the message names the file and why."""


@dataclass
class PerfSession:
    """A perf.data with what decoding it needs, read once.

    ``calls``: the functions the flow is cut to (each call with everything
    it runs until it returns; empty: the whole flow).  ``notes``: what the
    opening decided that a user should hear (the cut taken from the
    recording's notes)."""

    data: PerfData
    locator: BinaryLocator
    kernel: KernelCode | None
    sideband: Sideband
    calls: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _comms: dict[int, str] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] = "perf.data",
        *,
        symfs: str | os.PathLike[str] | None = None,
        kcore: str | os.PathLike[str] | None = None,
        vmlinux: str | os.PathLike[str] | None = None,
        kallsyms: str | os.PathLike[str] | None = None,
        calls: Sequence[str] = (),
        all_calls: bool = False,
    ) -> PerfSession:
        """Open ``path``: binaries looked up under ``symfs`` (else where the
        sideband says they were), kernel code from a ``perf record --kcore``
        directory (by default the perf.data directory's own), a vmlinux
        and/or a kallsyms copy.  The flow is cut to the calls of ``calls``,
        or, when none are given and ``all_calls`` is false, to those the
        recording was made for (``hwtrace record --call`` on hardware).
        Raises :class:`SessionError` for an input that cannot be used."""
        try:
            data = read_perf_data(path)
        except PerfDataError as e:
            raise SessionError(str(e)) from None
        locator = BinaryLocator(root=Path(symfs) if symfs else None)
        sideband = sideband_of(data)
        try:
            kernel = load_kernel(
                kcore=kcore or data.kcore_dir,
                vmlinux=vmlinux,
                kallsyms=kallsyms,
                text_address=sideband.kernel_text_address() if vmlinux else None,
            )
        except KernelCodeError as e:
            raise SessionError(str(e)) from None
        cut = list(calls)
        notes = []
        if not cut and not all_calls:
            cut = recorded_calls(path)
            if cut:
                notes.append(
                    f"cutting the flow to the calls of {', '.join(cut)}, as recorded "
                    "(--all: everything the trace holds)"
                )
        return cls(data, locator, kernel, sideband, cut, notes)

    @property
    def path(self) -> Path:
        return Path(self.data.path)

    def comm(self, tid: int) -> str:
        """The command a thread ran when it was last named (``?``: unknown)."""
        got = self._comms.get(tid)
        if got is None:
            got = self._comms[tid] = self.sideband.comm_of(tid) if tid >= 0 else "?"
        return got

    def cut_to_calls(
        self, on_blocks: Callable[[PerfBlocks], None]
    ) -> tuple[Callable[[PerfBlocks], None], Callable[[], list[str]]]:
        """``on_blocks`` behind the cut to :attr:`calls` (itself when there
        are none), and a function naming the calls found nowhere so far;
        for decodings driven elsewhere (the cluster decoder)."""
        if not self.calls:
            return on_blocks, list
        from .calls import CallFilter

        cut = CallFilter(self.calls)

        def take(b: PerfBlocks) -> None:
            for part in cut(b):
                on_blocks(part)

        return take, lambda: list(cut.missing())

    def decode(
        self, on_blocks: Callable[[PerfBlocks], None], *, batch_rows: int | None = None,
        runs: bool = True, window_bytes: int | None = None, deferred: bool = False,
    ) -> PerfStream:  # fmt: skip
        """Decode every trace queue, batch by batch into ``on_blocks`` (cut
        to the calls); nothing of a batch is kept once it returns.  The
        result has the queues with their gaps, the problems met and
        ``missing_calls``: the ``calls`` found nowhere in the decoded code.
        ``batch_rows``: blocks a batch holds at most (default
        :func:`~hwtrace.session.perfflow.stream_perf`'s); ``runs=False``:
        the blocks' code-table runs are not needed (faster, see
        :func:`~hwtrace.session.perfflow.stream_perf`); ``window_bytes``:
        the trace whose packets are decoded at a time (default
        :func:`~hwtrace.session.perfflow.stream_perf`'s); ``deferred``: a
        batch's keys and trace offsets may be made by whoever takes it
        (:meth:`~hwtrace.session.perfflow.PerfBlocks.resolved`)."""
        take, missing = self.cut_to_calls(on_blocks)
        extra = {} if batch_rows is None else {"batch_rows": batch_rows}
        if window_bytes is not None:
            extra["window_bytes"] = window_bytes
        flow = stream_perf(
            self.data, take, self.locator, kernel=self.kernel, sideband=self.sideband,
            runs=runs, deferred=deferred and not self.calls, **extra,
        )  # fmt: skip
        flow.missing_calls = missing()
        return flow

    def event_columns(self, instructions: bool = True, ptwrite: bool = False) -> tuple[str, str]:
        """What ``perf script --itrace=i0ns`` (``i0nsw``, ``w``) prints by
        default between an instruction's (a PTWRITE's) time and its
        address: the period and event name (see
        :func:`hwtrace.perf.intelpt.event_columns`)."""
        from ..perf.intelpt import event_columns

        return event_columns(self.data, instructions, ptwrite)

    def listing(
        self,
        on_rows: Callable[[ListingRows], None],
        *,
        blocks: bool = False,
        ptwrite: bool = True,
        perf_order: bool = False,
    ) -> PerfStream:
        """Decode into the rows of ``hwtrace script``'s listing
        (:class:`~hwtrace.session.listing.ListingRows`, per instruction or
        with ``blocks`` per block, PTWRITE payloads at their place unless
        ``ptwrite`` is false, with ``perf_order`` before their instruction,
        as perf script lists them), batch by batch into ``on_rows``.  The rows'
        columns are reused for the next piece once ``on_rows`` returns:
        copy what is to be kept."""

        builder = ListingBuilder(self.comm, blocks=blocks, ptwrite=ptwrite, perf_order=perf_order)

        def on_blocks(b: PerfBlocks) -> None:
            for rows in builder.rows(b):
                on_rows(rows)

        return self.decode(on_blocks)


__all__ = ["PerfSession", "SessionError"]
