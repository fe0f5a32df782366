"""The consumer side of the software PTW channel (``hwtrace_channel.h``).

A :class:`Channel` is a shared-memory file: a header, then per thread an
area (counters) and a ring of sub-buffers.  Programs including
``hwtrace_channel.h`` find it through ``HWTRACE_CHANNEL`` (:meth:`env`),
claim an area on a thread's first event, write PT packets (TSC and PTW)
into sub-buffers and hand full ones over whole; :meth:`drain` takes the
handed-over sub-buffers (each begins with a PSB+, so it decodes alone),
appends them to that thread's PT stream and gives them back.  This is
the sub-buffer ("splice") design of Vergé et al.: the producer never
copies or waits, the consumer moves whole sub-buffers.  The streams are
decoded by :func:`hwtrace.hwevents.ptw.decode_events`, as hardware PTWRITE
traces are.
"""

from __future__ import annotations

import struct
from importlib import resources
from pathlib import Path

import numpy as np

from ._shm import SharedFile

__all__ = ["Channel", "header_path"]

MAGIC = 0x314E484352545748  # "HWTRCHN1"
_AREA = 64


def header_path() -> Path:
    """Where ``hwtrace_channel.h`` is (for ``-I``)."""
    return Path(str(resources.files(__package__).joinpath("hwtrace_channel.h")))


class Channel(SharedFile):
    """A channel of ``areas`` thread areas, each ``nsub`` sub-buffers of
    ``sub_size`` bytes, in a file under ``directory`` (/dev/shm when there
    is one), removed by :meth:`close`."""

    def __init__(self, *, areas: int = 64, nsub: int = 8, sub_size: int = 64 << 10,
                 directory: str | None = None) -> None:  # fmt: skip
        if sub_size < 256 or sub_size % 8:
            raise ValueError("sub_size: a multiple of 8, at least 256")
        self.areas, self.nsub, self.sub_size = areas, nsub, sub_size
        table = 64 + _AREA * areas + 16 * nsub * areas
        self.header_size = -(-table // 4096) * 4096
        size = self.header_size + areas * nsub * sub_size
        super().__init__(size, "hwtrace-channel-", directory)
        struct.pack_into("<QIIIIQ", self.map, 0, MAGIC, areas, nsub, sub_size, self.header_size, 0)
        raw = np.frombuffer(self.map, np.uint8)
        self._raw = raw
        self._areas = raw[64 : 64 + _AREA * areas].view("<u8").reshape(areas, _AREA // 8)
        self._table = raw[64 + _AREA * areas : table].view("<u8").reshape(areas, nsub, 2)
        self._data = raw[self.header_size :].reshape(areas, nsub, sub_size)
        self.streams: dict[int, bytearray] = {}

    def env(self) -> dict[str, str]:
        """The environment a producer needs."""
        return {"HWTRACE_CHANNEL": self.path}

    @property
    def claimed(self) -> int:
        return min(int(np.frombuffer(self.map, "<u8", 1, 24)[0]), self.areas)

    def drain(self, sink=None) -> int:
        """Take every handed-over sub-buffer, in order, per thread; returns
        how many were taken.  ``sink(tid, view)`` receives each one (a view
        of the shared memory, valid during the call; e.g. a file's write);
        by default they are appended to :attr:`streams`."""
        taken = 0
        for k in range(self.claimed):
            area = self._areas[k]
            tid = int(area[4])
            out = self.streams.setdefault(tid, bytearray()) if sink is None else None
            consumed, produced = int(area[1]), int(area[0])
            while consumed < produced:
                s = consumed % self.nsub
                if int(self._table[k, s, 1]) != consumed + 1:
                    break  # not committed yet
                used = int(self._table[k, s, 0])
                if sink is None:
                    out += self._data[k, s, :used].data
                else:
                    sink(tid, self._data[k, s, :used].data)
                consumed += 1
                area[1] = consumed  # give it back
                taken += 1
        return taken

    def stats(self) -> dict[int, dict[str, int]]:
        """Per thread: events written and lost, sub-buffers handed over."""
        return {int(self._areas[k, 4]): {"events": int(self._areas[k, 2]), "lost": int(self._areas[k, 3]),
                                        "subbuffers": int(self._areas[k, 0])}
                for k in range(self.claimed)}  # fmt: skip

    def close(self) -> None:
        self._areas = self._table = self._data = self._raw = None  # type: ignore[assignment]
        super().close()
