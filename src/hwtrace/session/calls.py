"""A perf.data's decoded flow cut to the calls of chosen functions.

``hwtrace script --call FUNC`` and ``hwtrace report --call FUNC`` (and a
hardware recording made with ``hwtrace record --call``, which traces the
whole address space) keep each call of FUNC with everything it runs until
it returns: :class:`CallFilter` passes :class:`~hwtrace.session.perfflow.PerfBlocks`
batches through :class:`hwtrace.session.callcut.CallCut`, per trace queue
and thread, and gives back the blocks cut to the calls' instructions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from ..columns import distinct, distinct_inverse
from .callcut import CallCut, entry_flags, kept_blocks, transfers
from .listing import EXPAND_INSNS
from .perfflow import PerfBlocks, QueueInfo


class CallFilter:
    """Cuts batches of blocks to the calls of ``functions`` (``name`` or
    ``module!name``); call it on each batch, in flow order."""

    def __init__(self, functions: Sequence[str]) -> None:
        self.functions = list(functions)
        self.cut = CallCut()
        self._entries: dict[int, tuple[object, np.ndarray]] = {}
        self.found: set[str] = set()

    def entries(self, q: QueueInfo, image: int) -> np.ndarray:
        """The functions' entry addresses in image ``image`` of ``q``."""
        im = q.images[image]
        held = self._entries.get(id(im))
        if held is None or held[0] is not im:
            table = q.symbols(image)
            parts = []
            for spec in self.functions:
                at = table.function_entries(spec)
                if at.shape[0]:
                    self.found.add(spec)
                parts.append(at)
            held = self._entries[id(im)] = (im, distinct(np.concatenate(parts)))
        return held[1]

    def _classify(
        self, q: QueueInfo, image: int, ips: np.ndarray, mode: int | np.ndarray
    ) -> tuple[np.ndarray, ...]:
        """What the cut needs of each of ``ips`` in image ``image``: its
        kind, fall-through and successor, its function (told apart by
        symbol, in the image's table; -1: none), whether it starts its
        function and whether it is a chosen function's entry."""
        code = q.code(image)
        if isinstance(mode, int):
            kinds, falls, succs = code.transfers(ips, mode)
        else:
            kinds, falls, succs = transfers(code, ips, mode)
        index, offset = q.symbols(image).functions.lookup(ips)
        found = index >= 0
        funcs = np.where(found, index + (image << 32), -1)
        starts = found & (offset == 0)
        return kinds, falls, succs, funcs, starts, entry_flags(ips, self.entries(q, image))

    def missing(self) -> list[str]:
        """The functions no image decoded so far has a symbol for."""
        return [f for f in self.functions if f not in self.found]

    def __call__(self, b: PerfBlocks) -> Iterator[PerfBlocks]:
        q = b.queue
        for part in b.split(EXPAND_INSNS):
            if not len(part):
                continue
            n = part.ninsn.astype(np.int64)
            ips = part.instructions()
            # (one execution mode, as nearly always: no column of it)
            one_mode = part.mode.shape[0] == 0 or (part.mode == part.mode[0]).all()
            mode = int(part.mode[0]) if one_mode and part.mode.shape[0] else 64
            modes = None if one_mode else np.repeat(part.mode, n)
            images = part.images()
            if len(images) == 1:
                kinds, falls, succs, funcs, starts, entry = self._classify(
                    q, images[0][0], ips, mode if modes is None else modes
                )  # fmt: skip
            else:
                kinds = np.zeros(ips.shape[0], np.uint8)
                falls = np.zeros(ips.shape[0], np.uint64)
                succs = np.zeros(ips.shape[0], np.uint64)
                funcs = np.zeros(ips.shape[0], np.int64)
                starts = np.zeros(ips.shape[0], np.bool_)
                entry = np.zeros(ips.shape[0], np.bool_)
                owner = np.repeat(part.image, n)
                for image, _ in images:
                    sel = np.flatnonzero(owner == image)
                    (kinds[sel], falls[sel], succs[sel], funcs[sel], starts[sel],
                     entry[sel]) = self._classify(
                        q, image, ips[sel], mode if modes is None else modes[sel]
                    )  # fmt: skip
            if (part.tid == part.tid[0]).all():  # (one thread's blocks: no sort)
                tids, thread = part.tid[:1], np.zeros(ips.shape[0], np.intp)
            else:
                tids, thread = distinct_inverse(np.repeat(part.tid, n))
            keys = [(q.index, int(t)) for t in tids.tolist()]
            keep = self.cut.keep(
                ips, kinds, falls, succs, funcs, starts, entry, thread.reshape(-1), keys
            )
            blk, first, length = kept_blocks(part.ninsn, keep)
            if not blk.shape[0]:
                continue
            share = length / np.maximum(n[blk], 1)
            # A stretch from a block's first instruction keeps the gap before
            # it; one that is the whole block stays its code run.
            starts = np.concatenate([[0], np.cumsum(n)[:-1]])[blk] == first
            whole = starts & (length == n[blk])
            yield PerfBlocks(
                q, ips[first], length.astype(part.ninsn.dtype), part.mode[blk], part.ns[blk],
                (part.duration[blk] * share).astype(part.duration.dtype), part.tid[blk],
                part.pid[blk], part.image[blk], np.where(whole, part.run[blk], -1),
                part.gap[blk] & starts, row=part.row,
                offset=part.offset[blk] if part.offset is not None else None,
            )  # fmt: skip


__all__ = [
    "CallFilter",
]
