"""A perf.data's decoded flow cut to the calls of chosen functions.

``hwtrace script --call FUNC`` and ``hwtrace report --call FUNC`` (and a
hardware recording made with ``hwtrace record --call``, which traces the
whole address space) keep each call of FUNC with everything it runs until
it returns: :class:`CallFilter` passes :class:`~hwtrace.perf.trace.PerfBlocks`
batches through :class:`hwtrace.analysis.calls.CallCut`, per trace queue
and thread, and gives back the blocks cut to the calls' instructions.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np

from ..analysis.calls import CallCut, entry_flags, kept_blocks, transfers
from .trace import PerfBlocks, QueueInfo

# Instructions expanded at a time.
EXPAND_INSNS = 1 << 18


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
            held = self._entries[id(im)] = (im, np.unique(np.concatenate(parts)))
        return held[1]

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
            mode = np.repeat(part.mode, n)
            kinds = np.zeros(ips.shape[0], np.uint8)
            falls = np.zeros(ips.shape[0], np.uint64)
            succs = np.zeros(ips.shape[0], np.uint64)
            funcs = np.zeros(ips.shape[0], np.int64)
            starts = np.zeros(ips.shape[0], np.bool_)
            entry = np.zeros(ips.shape[0], np.bool_)
            images = part.images()
            owner = np.repeat(part.image, n) if len(images) > 1 else None
            for image, _ in images:
                sel = slice(None) if owner is None else np.flatnonzero(owner == image)
                kinds[sel], falls[sel], succs[sel] = transfers(q.code(image), ips[sel], mode[sel])
                entry[sel] = entry_flags(ips[sel], self.entries(q, image))
                # Functions are told apart by symbol, in each image's table.
                index, offset = q.symbols(image).functions.lookup(ips[sel])
                funcs[sel] = np.where(index >= 0, index + (image << 32), -1)
                starts[sel] = (index >= 0) & (offset == 0)
            tids, thread = np.unique(np.repeat(part.tid, n), return_inverse=True)
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


def recording_notes(perf_data: str | os.PathLike[str]) -> dict:
    """What hwtrace noted beside a perf.data it recorded
    (:func:`note_recording`), for as long as the file is the one recorded
    then (same size and modification time); empty otherwise."""
    import json

    side = sidecar_path(perf_data)
    try:
        meta = json.loads(side.read_text())
        st = os.stat(perf_data)
    except (OSError, ValueError):
        return {}
    if not isinstance(meta, dict):
        return {}
    if meta.get("size") != st.st_size or meta.get("mtime_ns") != st.st_mtime_ns:
        return {}  # the perf.data was written again since
    return meta


def recorded_calls(perf_data: str | os.PathLike[str]) -> list[str]:
    """The functions whose calls a recording was made for, when it was
    recorded with ``hwtrace record --call`` on hardware (which traces
    everything and leaves the cut to decoding)."""
    calls = recording_notes(perf_data).get("calls")
    return [str(c) for c in calls] if isinstance(calls, list) else []


def note_recording(
    perf_data: str | os.PathLike[str],
    *,
    calls: Sequence[str] = (),
    clock: str | None = None,
    clock_error_ns: int = 0,
    revisions: str | None = None,
) -> None:
    """Keep beside a recording what its perf.data cannot say: the functions
    its calls are to be cut to (hardware ``--call``), the clock its perf
    times are on (``CLOCK_MONOTONIC`` for the software backend, with how
    far off they may be), which places events of other tracers on it, and
    the source of its user code revisions (``revisions="stepper"``: the
    software backend timed them at trace points, see
    :data:`hwtrace.image.revisions.EXACT_SOURCES`)."""
    import json

    st = os.stat(perf_data)
    meta: dict = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if calls:
        meta["calls"] = list(calls)
    if clock is not None:
        meta["clock"] = clock
        meta["clock_error_ns"] = int(clock_error_ns)
    if revisions is not None:
        meta["revisions"] = revisions
    sidecar_path(perf_data).write_text(json.dumps(meta) + "\n")


def sidecar_path(perf_data: str | os.PathLike[str]):
    from pathlib import Path

    p = Path(perf_data)
    return p.with_name(p.name + ".hwtrace.json")


__all__ = [
    "EXPAND_INSNS",
    "CallFilter",
    "note_recording",
    "recorded_calls",
    "recording_notes",
    "sidecar_path",
]
