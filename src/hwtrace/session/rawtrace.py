"""A raw Intel PT trace opened with the code it ran: the trace bytes
(memory-mapped), the image its ``--elf`` and ``--raw`` files make (ptxed's
spellings: ``file[:base]``, ``file[:from[-to]]:base``) and the decoder's
configuration, read once for the commands that take ``--pt``::

    trace = RawTrace.open("loop.pt", elf=["loop"], config=PtConfig(mtc_freq=3))
    result = decode_trace(trace.data, trace.image, trace.config)

It is what a perf.data session is without perf's sideband: one address
space, no threads, times in TSC ticks.  :meth:`RawTrace.as_perf_data`
writes it as a perf.data for what needs one (Parquet datasets).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..image import Image, ImageError
from ..image.sections import RawSpec, parse_elf_spec, parse_raw_spec
from ..pt.config import PtConfig
from ..pt.packets import map_file
from .perfsession import SessionError


@dataclass
class RawTrace:
    """The trace at ``path`` (``data``: its bytes), the ``image`` of the
    binaries it ran (``elf``, ``raw``: as parsed) and its ``config``."""

    path: str
    data: np.ndarray
    image: Image
    config: PtConfig = field(default_factory=PtConfig)
    elf: list[tuple[str, int | None]] = field(default_factory=list)
    raw: list[RawSpec] = field(default_factory=list)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        elf: Sequence[str] = (),
        raw: Sequence[str] = (),
        config: PtConfig | None = None,
        data: np.ndarray | None = None,
    ) -> RawTrace:
        """Open the trace at ``path`` (``data``: its bytes, already read,
        e.g. a range of the file) with the binaries ``elf`` and ``raw``
        (ptxed's ``--elf``/``--raw`` arguments).  Raises
        :class:`SessionError` (one line naming the file) when a file cannot
        be used."""
        try:
            elfs = [parse_elf_spec(spec) for spec in elf]
            raws = [parse_raw_spec(spec) for spec in raw]
            image = Image()
            for file, base in elfs:
                image.add_elf(file, base)
            for spec in raws:
                image.add_raw(*spec)
        except ImageError as e:
            raise SessionError(str(e)) from None
        except OSError as e:
            raise SessionError(f"{e.filename}: {e.strerror or e}") from None
        if data is None:
            try:
                data = map_file(path)
            except OSError as e:
                raise SessionError(f"cannot read {path}: {e.strerror or e}") from None
        return cls(str(path), data, image, config or PtConfig(), elfs, raws)

    def symbol(self, address: int) -> str:
        """The function at ``address`` (``name+0x..``), else where it is."""
        return self.image.symbolize(address, with_module=False) or self.image.locate(address)

    def as_perf_data(self, out: str | os.PathLike[str], *, cpu: int = 0, tid: int = 1) -> dict:
        """Write the trace and its binaries as the perf.data ``out``, as
        recorded on ``cpu`` by thread ``tid`` (see
        :func:`hwtrace.perf.wrap.wrap_raw_trace`); what was written, with
        ``pt``: the trace's path.  Raises :class:`SessionError`."""
        from ..perf.wrap import WrapError, wrap_raw_trace

        try:
            wrapped = wrap_raw_trace(self.path, out, elf=self.elf, raw=self.raw, config=self.config,
                                     cpu=cpu, tid=tid)  # fmt: skip
        except WrapError as e:
            raise SessionError(str(e)) from None
        except OSError as e:
            raise SessionError(f"{out}: {e.strerror or e}") from None
        wrapped["pt"] = str(Path(self.path).resolve())
        return wrapped
