"""Tables held as equal-length numpy columns.

Decoders and analyses return their rows as a dataclass of numpy arrays, one
per column; :class:`Columns` is the base that gives such a table its row
count, so each table only declares its columns."""

from __future__ import annotations

from typing import ClassVar


class Columns:
    """Base of a dataclass whose numpy columns have one length: ``len()``
    is the number of rows, the length of the ``ROWS`` field (by default
    the first field)."""

    ROWS: ClassVar[str | None] = None

    def __len__(self) -> int:
        name = self.ROWS or next(iter(self.__dataclass_fields__))  # type: ignore[attr-defined]
        return int(getattr(self, name).shape[0])
