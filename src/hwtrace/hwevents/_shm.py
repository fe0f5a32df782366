"""A file in shared memory that producers map and this process reads: the
base of the software channels' consumer sides (:mod:`.channel`,
:mod:`.vstm`)."""

from __future__ import annotations

import mmap
import os
import tempfile
from pathlib import Path
from typing import Self


class SharedFile:
    """A file of ``size`` bytes under ``directory`` (/dev/shm when there is
    one), mapped read-write and shared as :attr:`map`; :meth:`close`
    unmaps and removes it."""

    def __init__(self, size: int, prefix: str, directory: str | None) -> None:
        where = directory or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
        fd, self.path = tempfile.mkstemp(prefix=prefix, dir=where)
        try:
            os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:  # a view of it is still held: it unmaps when that goes
            pass
        Path(self.path).unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
