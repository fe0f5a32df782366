"""A BPF ring buffer (``BPF_MAP_TYPE_RINGBUF``) read through its mmap.

Layout (kernel/bpf/ringbuf.c, Documentation/bpf/ringbuf.rst): one page
with the consumer position (read-write), one page with the producer
position, then the data pages, mapped twice in a row so that a record
never wraps in virtual memory.  A record is an 8-byte header (length with
the BUSY and DISCARD bits, page offset) and its data, padded to 8 bytes.
Records are copied out by a compiled loop (:func:`_drain`) into one flat
buffer with their offsets; the consumer position is published after the
copy, so the kernel reuses the space only once it has been read.
"""

from __future__ import annotations

import mmap
import select

import numpy as np

from .. import aot
from .bpf import MAP_RINGBUF, Map

__all__ = ["RingBuffer"]

_BUSY = 1 << 31
_DISCARD = 1 << 30
_HDR = 8


@aot.njit(cache=True, nogil=True)
def _drain(data, mask, cons, prod, out, out_len, starts, lengths, count):
    """Copy committed records from ``cons`` up to ``prod``; stops early at a
    record still being written, or when ``out``/``starts`` are full.
    Returns (new consumer position, bytes used in out, records)."""
    while cons < prod and count < starts.shape[0]:
        at = cons & mask
        word = np.uint32(data[at]) | (np.uint32(data[at + 1]) << 8)
        word |= (np.uint32(data[at + 2]) << 16) | (np.uint32(data[at + 3]) << 24)
        if word & _BUSY:
            break
        n = word & 0x3FFFFFFF
        total = (n + _HDR + 7) & ~7
        if not (word & _DISCARD):
            if out_len + n > out.shape[0]:
                break
            src = at + _HDR
            for i in range(n):
                out[out_len + i] = data[src + i]
            starts[count] = out_len
            lengths[count] = n
            out_len += (n + 7) & ~7
            count += 1
        cons += total
    return cons, out_len, count


_NO_BYTES = np.zeros(0, np.uint8)
_NO_ROWS = np.zeros(0, np.int64)
_NO_BYTES.flags.writeable = _NO_ROWS.flags.writeable = False


@aot.njit(cache=True, nogil=True)
def gather_prefixes(buf, starts, lengths, width, out):
    """The first ``width`` bytes of each record (at ``starts``, ``lengths``
    long) into the rows of ``out`` (n, width); a shorter record's row is
    its bytes, zero-padded."""
    for i in range(starts.shape[0]):
        s = starts[i]
        k = min(width, lengths[i])
        for j in range(k):
            out[i, j] = buf[s + j]
        for j in range(k, width):
            out[i, j] = 0


class RingBuffer:
    """A ring buffer map of ``size`` bytes (a power of two, at least a page)
    and its reader."""

    def __init__(self, size: int = 1 << 22, name: str = "hwtrace_rb") -> None:
        if size < mmap.PAGESIZE or size & (size - 1):
            raise ValueError(f"ring buffer size {size}: a power of two of at least a page")
        self.size = size
        self.map = Map(MAP_RINGBUF, 0, 0, size, name=name)
        page = mmap.PAGESIZE
        self._cons_map = mmap.mmap(
            self.map.fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
        )
        self._data_map = mmap.mmap(
            self.map.fd, page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page
        )
        self._cons = np.frombuffer(self._cons_map, np.uint64, 1)
        self._prod = np.frombuffer(self._data_map, np.uint64, 1)
        self._data = np.frombuffer(self._data_map, np.uint8, 2 * size, page)
        self._epoll = select.epoll()
        self._epoll.register(self.map.fd, select.EPOLLIN)

    @property
    def fd(self) -> int:
        return self.map.fd

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for data; True when some is there."""
        if int(self._prod[0]) != int(self._cons[0]):
            return True
        return bool(self._epoll.poll(timeout))

    def read(self, max_bytes: int = 1 << 24) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The records written since the last read: one byte buffer and
        each record's start and length in it (starts 8-byte aligned)."""
        # Buffers the size of what is there (no record's copy is larger than
        # its place in the ring): fresh memory costs a page fault and a
        # cleared page per 4 KiB touched, at millions of events a second.
        size = min(max_bytes, int(self._prod[0]) - int(self._cons[0]))
        if size <= 0:
            return _NO_BYTES, _NO_ROWS, _NO_ROWS
        out = np.empty(size, np.uint8)
        cap = size // 16 + 1
        starts = np.empty(cap, np.int64)
        lengths = np.empty(cap, np.int64)
        used = count = 0
        while True:
            prod = int(self._prod[0])
            cons = int(self._cons[0])
            if cons == prod:
                break
            cons, used, count = _drain(self._data, self.size - 1, cons, prod, out, used,
                                       starts, lengths, count)  # fmt: skip
            self._cons[0] = cons  # the space is the kernel's again
            if count == starts.shape[0] or used + 4096 > size or cons != prod:
                break
        return out[:used], starts[:count], lengths[:count]

    def close(self) -> None:
        try:
            self._epoll.close()
        except OSError:
            pass
        self._cons = self._prod = self._data = None  # type: ignore[assignment]
        for m in (self._cons_map, self._data_map):
            try:
                m.close()
            except (BufferError, ValueError):
                pass
        self.map.close()


def warm_reader() -> None:
    """Compile the reader's loops for the arguments :meth:`RingBuffer.read`
    and its callers give them (the ring's read-only mapping, a copy), on
    one made-up record: ``hwtrace aot warm`` builds them into the native
    library, so that a first trace does not compile while its ring fills."""
    data = np.zeros(2 * 4096, np.uint8)
    data[0] = 8  # a committed record of 8 bytes
    data.flags.writeable = False
    out = np.empty(64, np.uint8)
    starts, lengths = np.empty(4, np.int64), np.empty(4, np.int64)
    _, used, count = _drain(data, 4095, 0, 16, out, 0, starts, lengths, 0)
    gather_prefixes(out[:used], starts[:count], lengths[:count], 8, np.empty((count, 8), np.uint8))
