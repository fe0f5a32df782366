"""Intel Branch Trace Store (BTS) records, and events at registered
addresses.

BTS writes one 24-byte record per taken branch into memory: ``from``,
``to`` and a flags word (bit 4: predicted, on the CPUs that say) -- no
time, no filter (Intel SDM vol. 3, "Branch Trace Store").  ``perf record
-e intel_bts//`` puts the records into perf.data as AUX data; perf's
decoder (tools/perf/util/intel-bts.c) skips all-zero records, and a zero
``from`` or ``to`` marks where tracing began or ended.

The paper's use (Vergé et al., "Hardware-assisted software event tracing",
2017): a tracepoint needs no code change when it is a branch the program
takes anyway; an event is a record whose ``from`` (or ``to``) is a
registered site, found by a table lookup (:func:`events_at`).

Records are a numpy view of the bytes; nothing runs per record in Python.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..columns import Columns

__all__ = ["RECORD", "BtsBranches", "BtsError", "decode_bts", "encode_bts", "events_at", "perf_bts"]

RECORD = np.dtype([("from", "<u8"), ("to", "<u8"), ("flags", "<u8")])
assert RECORD.itemsize == 24
PREDICTED = 1 << 4


class BtsError(ValueError):
    """Damaged BTS data, with the byte offset (None: an input with no BTS
    data at all, which has no place to name)."""

    def __init__(self, offset: int | None, message: str) -> None:
        super().__init__(message if offset is None else f"offset {offset:#x}: {message}")
        self.offset = offset


@dataclass
class BtsBranches(Columns):
    """Decoded branches: ``source``/``target`` addresses, ``flags``, and the
    byte ``offset`` of each record; ``begins``/``ends``: rows where a zero
    ``from`` (trace began) or ``to`` (trace ended) marked a record;
    ``skipped``: all-zero records; ``trailing``: bytes of an incomplete
    last record (reported, not decoded)."""

    source: np.ndarray
    target: np.ndarray
    flags: np.ndarray
    offset: np.ndarray
    begins: np.ndarray
    ends: np.ndarray
    skipped: int = 0
    trailing: int = 0

    @property
    def problems(self) -> list[str]:
        if not self.trailing:
            return []
        end = int(self.offset[-1]) + RECORD.itemsize if len(self) else 0
        return [f"offset {end:#x}: {self.trailing} bytes of an incomplete last record"]


def encode_bts(source: np.ndarray, target: np.ndarray, flags: np.ndarray | None = None) -> bytes:
    """The records of branches ``source[i] -> target[i]``."""
    out = np.zeros(np.shape(source)[0], RECORD)
    out["from"], out["to"] = source, target
    if flags is not None:
        out["flags"] = flags
    return out.tobytes()


def decode_bts(data, base: int = 0) -> BtsBranches:
    """Decode BTS records (bytes or a uint8 buffer) as perf does: all-zero
    records skipped, zero ``from``/``to`` kept as trace begin/end marks;
    ``base`` is the offset of ``data[0]`` in its file."""
    buf = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
    n = buf.shape[0] // RECORD.itemsize
    trailing = buf.shape[0] - n * RECORD.itemsize
    rec = buf[: n * RECORD.itemsize].view(RECORD) if n else np.zeros(0, RECORD)
    zero = (rec["from"] == 0) & (rec["to"] == 0)
    keep = np.flatnonzero(~zero)
    r = rec[keep]
    offset = base + keep.astype(np.int64) * RECORD.itemsize
    begins = np.flatnonzero(r["from"] == 0)
    ends = np.flatnonzero(r["to"] == 0)
    return BtsBranches(r["from"].copy(), r["to"].copy(), r["flags"].copy(), offset, begins, ends,
                       int(zero.sum()), int(trailing))  # fmt: skip


def events_at(
    branches: BtsBranches, sites: Mapping[int, int], *, by: str = "source"
) -> tuple[np.ndarray, np.ndarray]:
    """Events at registered sites: the rows whose ``source`` (the branch
    instruction; or ``target``, ``by="target"``) is a key of ``sites``,
    and each one's event id (the value)."""
    keys = np.array(sorted(sites), np.uint64)
    ids = np.array([sites[int(k)] for k in keys], np.int64)
    addr = branches.source if by == "source" else branches.target
    if not keys.shape[0]:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    j = np.searchsorted(keys, addr)
    hit = (j < keys.shape[0]) & (keys[np.minimum(j, keys.shape[0] - 1)] == addr)
    rows = np.flatnonzero(hit)
    return rows, ids[j[rows]]


AUXTRACE_INTEL_BTS = 2  # perf's enum auxtrace_type


def perf_bts(data) -> dict[int, BtsBranches]:
    """The BTS records of a perf.data (``perf record -e intel_bts//``),
    decoded per AUX queue: {tid (per-thread) or cpu (per-CPU): branches}.
    Raises :class:`BtsError` when the file has no BTS AUXTRACE_INFO."""
    info = data.auxtrace_info
    if info is None or info.type != AUXTRACE_INTEL_BTS:
        raise BtsError(
            None, f"{data.path}: no Intel BTS AUXTRACE_INFO (record with -e intel_bts//)"
        )
    aux = data.auxtrace_columns()
    out: dict[int, BtsBranches] = {}
    keys = sorted(set(zip(aux["tid"].tolist(), aux["cpu"].tolist(), strict=True)))
    for tid, cpu in keys:
        sel = np.flatnonzero((aux["tid"] == tid) & (aux["cpu"] == cpu))
        sel = sel[np.argsort(aux["offset"][sel], kind="stable")]
        parts = [data.buf[int(s) : int(s) + int(n)] for s, n in
                 zip(aux["data_offset"][sel].tolist(), aux["size"][sel].tolist(), strict=True)]  # fmt: skip
        out[tid if tid >= 0 else cpu] = decode_bts(np.concatenate(parts) if parts else np.zeros(0, np.uint8),
                                                   int(aux["data_offset"][sel[0]]) if sel.shape[0] else 0)  # fmt: skip
    return out
