"""The rows of ``hwtrace script``'s listing, as ``perf script --itrace=i0ns``
(or ``b``, per block) gives them: per instruction its thread, perf's time
for it, its address and the symbol and offset perf would name, with a row
per PTWRITE payload at its place.

Rows are columns (:class:`ListingRows`); the text is written from them by
:func:`hwtrace.textout.perfscript.write_listing`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import numpy as np

from .. import aot
from ..columns import distinct
from .perfflow import PerfBlocks, PtwMarks, QueueInfo
from .perftime import table_transfer_classes

# Instructions expanded at a time: a batch's blocks are taken in pieces of
# about this many instructions, so memory stays bounded.
EXPAND_INSNS = 1 << 17


@dataclass
class ListingRows:
    """Listing rows of one piece of a batch: per row ``comm`` (an index into
    ``comms``), ``tid``, ``ns`` (perf time, -1: unknown), ``ip``, ``sym``
    (an index into ``names``/``modules``; -1: no file mapped there),
    ``off`` (bytes into the symbol), ``ninsn`` (per block, block listings
    only), ``kind`` (1: a PTWRITE of ``payload``; 2: one whose packet gave
    no IP) and per name ``plain``
    (printed without an offset: perf's ``[unknown]`` in a mapped file)."""

    comms: list[str]
    comm: np.ndarray
    tid: np.ndarray
    ns: np.ndarray
    ip: np.ndarray
    names: list[str]
    modules: list[str]
    sym: np.ndarray
    off: np.ndarray
    ninsn: np.ndarray | None
    kind: np.ndarray | None
    payload: np.ndarray | None
    plain: np.ndarray
    #: each row's instruction in the code table ``code`` (None: not known)
    code_row: np.ndarray | None = None
    code: object | None = None

    def __len__(self) -> int:
        return int(self.ip.shape[0])

    def ptwrites(self) -> ListingRows:
        """The PTWRITEs' rows alone."""
        keep = np.zeros(len(self), np.bool_) if self.kind is None else self.kind != 0
        return ListingRows(
            self.comms, self.comm[keep], self.tid[keep], self.ns[keep], self.ip[keep],
            self.names, self.modules, self.sym[keep], self.off[keep],
            None if self.ninsn is None else self.ninsn[keep],
            None if self.kind is None else self.kind[keep],
            None if self.payload is None else self.payload[keep], self.plain,
        )  # fmt: skip


class PerfNameRows:
    """The names perf script gives instructions, kept across a listing's
    pieces: each distinct (name, module) once (``names``, ``modules``,
    ``plain``: printed without an offset), and per instruction of a code
    table (:meth:`QueueInfo.listing_table`) its name and offset, looked up the
    first time that instruction is listed.  So a piece's names are gathers,
    not a symbol search and a sort per instruction."""

    _UNSET = -3

    def __init__(self) -> None:
        self.names: list[str] = []
        self.modules: list[str] = []
        self._plain: list[int] = []
        self._ids: dict[tuple[str, str, int], int] = {}
        # (by code table, while the table lives: a decoder lets go of the
        # tables of code no longer run)
        self._rows: WeakKeyDictionary[object, tuple[np.ndarray, np.ndarray]] = WeakKeyDictionary()

    @property
    def plain(self) -> np.ndarray:
        return np.array(self._plain, np.uint8)

    def intern(self, name: str, module: str, unknown: int) -> int:
        key = (name, module, unknown)
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = len(self.names)
            self.names.append(name)
            self.modules.append(module)
            self._plain.append(unknown)
        return got

    def of_rows(
        self,
        q: QueueInfo,
        image: int,
        ips: np.ndarray,
        rows: np.ndarray,
        out: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Name (index into :attr:`names`; -1: no file mapped there) and
        offset of instructions ``ips`` of image number ``image``, at
        ``rows`` of its listing table (:meth:`QueueInfo.listing_table`;
        into the int64 arrays ``out`` when given)."""
        code = q.listing_table(image)
        cap = code.i_ip.shape[0]
        got = self._rows.get(code)
        if got is None or got[0].shape[0] < cap:
            sym_k = np.full(cap, self._UNSET, np.int64)
            off_k = np.zeros(cap, np.int64)
            if got is not None:
                sym_k[: got[0].shape[0]] = got[0]
                off_k[: got[1].shape[0]] = got[1]
            self._rows[code] = got = (sym_k, off_k)
        sym_k, off_k = got
        if out is None:
            out = np.empty(rows.shape[0], np.int64), np.empty(rows.shape[0], np.int64)
        sym, off = out
        np.take(sym_k, rows, out=sym)
        if sym.shape[0] and sym.min() == self._UNSET:
            fresh = distinct(rows[sym == self._UNSET])
            sym_k[fresh], off_k[fresh] = self.lookup(q, image, code.i_ip[fresh])
            np.take(sym_k, rows, out=sym)
        np.take(off_k, rows, out=off)
        return sym, off

    def lookup(self, q: QueueInfo, image: int, addr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Name and offset of the addresses ``addr`` of image number
        ``image``, by symbol search (see :meth:`of_rows`)."""
        view = q.perf_names(image)
        table = view.symbols
        index, offset = table.lookup(addr)
        files = view.files_of(addr)
        # Unnamed addresses take their file: index -2 - file.
        index = np.where(index >= 0, index, np.where(files >= 0, -2 - files, -1))
        uniq, inverse = np.unique(index, return_inverse=True)
        glob = np.empty(uniq.shape[0], np.int64)
        for j, u in enumerate(uniq.tolist()):
            if u == -1:
                glob[j] = -1
            elif u < -1:
                glob[j] = self.intern("[unknown]", view.paths[-2 - u], 1)
            else:
                glob[j] = self.intern(table.name(u), table.module_name(u), 0)
        return glob[inverse.reshape(-1)], np.asarray(offset, np.int64)


class _Columns:
    """A listing piece's per-instruction columns, in memory kept from piece
    to piece: a piece's worth of fresh pages costs more than filling them."""

    def __init__(self) -> None:
        self.cap = 0

    def take(self, n: int) -> _Columns:
        if n > self.cap:
            self.cap = max(n, self.cap * 5 // 4, 1 << 12)
            c = self.cap
            self.ip, self.row = np.empty(c, np.uint64), np.empty(c, np.int64)
            self.cls, self.ns = np.empty(c, np.uint8), np.empty(c, np.int64)
            self.tgt = np.empty(c, np.uint64)
            self.tid, self.comm = np.empty(c, np.int64), np.empty(c, np.int64)
            self.sym, self.off = np.empty(c, np.int64), np.empty(c, np.int64)
        return self


class ListingBuilder:
    """Turns batches of blocks into listing rows (:meth:`rows`), keeping
    the names found (:class:`PerfNameRows`) and its working memory from
    batch to batch; ``comm`` names a thread."""

    def __init__(
        self,
        comm: Callable[[int], str],
        *,
        blocks: bool = False,
        ptwrite: bool = True,
        perf_order: bool = False,
    ) -> None:
        self.comm, self.blocks, self.ptwrite = comm, blocks, ptwrite
        self.perf_order = perf_order  # PTWRITEs before their instruction, as perf lists them
        self.names = PerfNameRows()
        self._cols = _Columns()

    def rows(self, b: PerfBlocks) -> Iterator[ListingRows]:
        """The listing rows of a batch of blocks, in pieces of about
        :data:`EXPAND_INSNS` instructions.  A piece's columns are valid until
        the next piece is asked for."""
        for part in b.split(EXPAND_INSNS):
            yield self._piece(part)

    def _piece(self, part: PerfBlocks) -> ListingRows:
        names = self.names
        per = part.ninsn.astype(np.int64)
        n = int(per.sum())
        w = self._cols.take(n)
        ips, rows, owner = part.instruction_rows(out=(w.ip, w.row))
        q = part.queue
        timed = None
        if q.has_clock():
            # Only a block's last instruction can be a transfer (the others
            # go on without trace): perf's clock needs the classes of those.
            ends = np.cumsum(per)[per > 0] - 1
            cls, tgt = w.cls[:n], w.tgt[:n]
            cls.fill(0)
            for image, sel in _by_image(part.image[per > 0], owner, ends):
                cls[sel], tgt[sel] = table_transfer_classes(q.listing_table(image), rows[sel])
            timed = q.perf_times(ips, _NO_IMAGES, cls, out=w.ns[:n], targets=tgt)
        if self.blocks:
            ip, tid, ns, count, which = part.ip, part.tid, part.ns, part.ninsn, part.image
            first = np.cumsum(per) - per
            if timed is not None and n:
                # A block's time: perf's for its first instruction.
                ns = timed[np.minimum(first, n - 1)]
            # A block's name: its first instruction's.
            sym, off = _names_at(names, q, part.image, part.ip, owner, ips, rows, first, per > 0)
            ends = np.arange(1, len(part) + 1)
            comms, comm_index = _comm_rows(tid, self.comm)
        else:
            ip, count, which = ips, None, None
            tid, comm_index = w.tid[:n], w.comm[:n]
            comms = _repeat_threads(part.tid, per, tid, comm_index, self.comm)
            ns = timed if timed is not None else _repeat(part.ns, per, w.ns[:n])
            sym, off = _names_of(names, q, part.image, owner, ips, rows, (w.sym[:n], w.off[:n]))
            ends = np.cumsum(per)
        kind = payload = code_row = code = None
        if not self.blocks and owner is None and n:
            code_row, code = rows, q.listing_table(int(part.image[0]))
        if part.ptw is not None and len(part.ptw) and self.ptwrite:
            code_row = code = None
            if which is None:
                which = owner if owner is not None else np.full(ip.shape[0], part.image[0])
            ip, tid, ns, which, count, kind, payload, sym, off = _with_ptwrite(
                part.ptw, ends, ip, tid, ns, which, count, sym, off, self.perf_order
            )
            marks = kind != 0
            # A PTWRITE's own IP is named afresh (its block's name before).
            for image in np.unique(which[marks]).tolist():
                at = np.flatnonzero(marks & (which == image))
                sym[at], off[at] = names.lookup(q, int(image), ip[at])
            comms, comm_index = _comm_rows(tid, self.comm)
        return ListingRows(
            comms, comm_index, tid, ns, ip, names.names, names.modules, sym, off, count, kind,
            payload, names.plain, code_row, code,
        )  # fmt: skip


def listing_rows(
    b: PerfBlocks, comm: Callable[[int], str], *, blocks: bool = False, ptwrite: bool = True
) -> Iterator[ListingRows]:
    """The listing rows of one batch of blocks (see :class:`ListingBuilder`,
    which keeps what it learns across batches)."""
    yield from ListingBuilder(comm, blocks=blocks, ptwrite=ptwrite).rows(b)


@aot.njit(cache=True, _nrt=False)
def _repeat_into(values, counts, out):
    """``np.repeat(values, counts)`` into ``out``."""
    j = 0
    for i in range(values.shape[0]):
        v = values[i]
        for _ in range(counts[i]):
            out[j] = v
            j += 1


def _repeat(values: np.ndarray, counts: np.ndarray, out: np.ndarray) -> np.ndarray:
    _repeat_into(np.ascontiguousarray(values, np.int64), counts, out)
    return out


def _repeat_threads(
    tids: np.ndarray, counts: np.ndarray, tid: np.ndarray, index: np.ndarray, comm
) -> list[str]:
    """Each instruction's thread into ``tid`` and its index into the names
    returned into ``index`` (blocks' ``tids``, ``counts`` instructions each)."""
    if tids.shape[0] == 0 or (tids == tids[0]).all():
        t = int(tids[0]) if tids.shape[0] else -1
        tid.fill(t)
        index.fill(0)
        return [comm(t)]
    uniq, which = np.unique(tids, return_inverse=True)
    _repeat(tids, counts, tid)
    _repeat(which.reshape(-1), counts, index)
    return [comm(int(t)) for t in uniq.tolist()]


_NO_IMAGES = np.zeros(0, np.int64)


def _by_image(block_image, owner, at):
    """``(image, selection of at)`` for the instructions ``at``, by image."""
    if owner is None:
        yield int(block_image[0]) if block_image.shape[0] else 0, at
        return
    of = owner[at]
    for image in np.unique(of).tolist():
        yield int(image), at[of == image]


def _names_of(names, q, block_image, owner, ips, rows, out=None):
    if owner is None:
        if not ips.shape[0]:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return names.of_rows(q, int(block_image[0]), ips, rows, out)
    sym, off = np.empty(ips.shape[0], np.int64), np.empty(ips.shape[0], np.int64)
    for image in np.unique(owner).tolist():
        sel = np.flatnonzero(owner == image)
        sym[sel], off[sel] = names.of_rows(q, int(image), ips[sel], rows[sel])
    return sym, off


def _names_at(names, q, block_image, block_ip, owner, ips, rows, first, nonempty):
    """Names of the blocks' first instructions (a block of none: its own
    address, by search)."""
    sym = np.full(first.shape[0], -1, np.int64)
    off = np.zeros(first.shape[0], np.int64)
    at = first[nonempty]
    s, o = _names_of(names, q, block_image, None if owner is None else owner[at], ips[at], rows[at])
    sym[nonempty], off[nonempty] = s, o
    for k in np.flatnonzero(~nonempty).tolist():
        sym[k : k + 1], off[k : k + 1] = names.lookup(q, int(block_image[k]), block_ip[k : k + 1])
    return sym, off


def _comm_rows(tid: np.ndarray, comm: Callable[[int], str]) -> tuple[list[str], np.ndarray]:
    """The threads' names and each row's index into them."""
    if tid.shape[0] == 0 or (tid == tid[0]).all():
        t = int(tid[0]) if tid.shape[0] else -1
        return [comm(t)], np.zeros(tid.shape[0], np.int64)
    tids, index = np.unique(tid, return_inverse=True)
    return [comm(int(t)) for t in tids.tolist()], index.reshape(-1)


def _with_ptwrite(
    marks: PtwMarks, ends: np.ndarray, ips, tid, ns, which, n, sym, off, perf_order: bool = False
):  # fmt: skip
    """The listing's rows with a row per PTWRITE inserted after the rows of
    the blocks before it (``ends``: rows up to each block's end): its own
    IP (the previous row's when the trace had none), time where known; its
    name is left to the caller (``sym`` -1).  ``perf_order``: as perf
    script lists them, a PTWRITE whose IP the trace gave before its
    instruction's row, at that row's time."""
    rows = ips.shape[0]
    pos = np.where(marks.at > 0, ends[np.maximum(marks.at - 1, 0)], 0)
    prev = np.maximum(pos - 1, 0)
    own = np.zeros(len(marks), np.bool_)
    if perf_order and rows:
        own = (marks.ip != 0) & (pos > 0) & (ips[prev] == marks.ip)
        pos = np.where(own, prev, pos)
    ip = np.where(marks.ip != 0, marks.ip, ips[prev] if rows else np.uint64(0)).astype(ips.dtype)
    t = tid[prev] if rows else np.full(len(marks), -1, tid.dtype)
    at_ns = np.where(marks.ns >= 0, marks.ns, ns[prev] if rows else -1).astype(ns.dtype)
    if rows:
        at_ns = np.where(own, ns[prev], at_ns).astype(ns.dtype)
    image = which[prev] if rows else np.zeros(len(marks), which.dtype)
    # (2: a PTWRITE whose packet gave no IP, no FUP)
    kind = np.insert(np.zeros(rows, np.uint8), pos, np.where(marks.ip != 0, 1, 2))
    payload = np.insert(np.zeros(rows, np.uint64), pos, marks.payload)
    count = None if n is None else np.insert(n, pos, 0)
    return (np.insert(ips, pos, ip), np.insert(tid, pos, t), np.insert(ns, pos, at_ns),
            np.insert(which, pos, image), count, kind, payload, np.insert(sym, pos, -1),
            np.insert(off, pos, 0))  # fmt: skip


__all__ = [
    "EXPAND_INSNS",
    "ListingBuilder",
    "ListingRows",
    "PerfNameRows",
    "listing_rows",
]
