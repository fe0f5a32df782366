"""Tables held as equal-length numpy columns.

Decoders and analyses return their rows as a dataclass of numpy arrays, one
per column; :class:`Columns` is the base that gives such a table its row
count, so each table only declares its columns."""

from __future__ import annotations

from typing import ClassVar

import numpy as np


class Columns:
    """Base of a dataclass whose numpy columns have one length: ``len()``
    is the number of rows, the length of the ``ROWS`` field (by default
    the first field)."""

    ROWS: ClassVar[str | None] = None

    def __len__(self) -> int:
        name = self.ROWS or next(iter(self.__dataclass_fields__))  # type: ignore[attr-defined]
        return int(getattr(self, name).shape[0])


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a 1-D array (``np.unique(values)``,
    whose first call imports ``numpy.ma``, a fortieth of a second of every
    command's start)."""
    a = np.sort(np.asarray(values).reshape(-1), kind="stable")
    if a.shape[0] < 2:
        return a
    keep = np.empty(a.shape[0], np.bool_)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def repeated(value: object, n: int, kind: type) -> np.ndarray:
    """``n`` rows of ``value`` as ``kind``: a read-only broadcast of one
    value (no memory a row), for a column known to hold one value."""
    return np.broadcast_to(np.array(value, kind), (n,))
