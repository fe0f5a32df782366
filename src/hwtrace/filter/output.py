"""Writing what a filter kept: a perf.data, JSON lines or a text listing.

The output's form follows its name, as ``hwtrace filter -o FILE`` documents:
for perf.data input, a perf.data of the samples kept with every other record
(:func:`hwtrace.perf.rewrite.write_subset`), unless the name ends in
``.jsonl`` (JSON lines) or ``.txt`` (the text listing); for other input, JSON
lines for ``.jsonl``, else the text listing (:mod:`hwtrace.filter.listing`).

:func:`write_result` writes a whole source's result; :class:`ResultWriter`
writes an input's chunk by chunk as the filter gets through them (a
perf.data through :class:`~hwtrace.perf.rewrite.SubsetWriter`, listings
through :class:`~hwtrace.filter.listing.ListingWriter`).
"""

from __future__ import annotations

from typing import BinaryIO, Literal

import numpy as np

from .inputs.base import EventSource, StreamError, StreamInput
from .listing import ListingWriter, render_listing

Form = Literal["perf.data", "json", "text"]


def output_form(path: str | None, source_kind: str) -> Form:
    """What ``hwtrace filter`` writes to ``path`` (None: standard output)
    for a source of ``source_kind``."""
    if path is None:
        return "text"
    if path.endswith(".jsonl"):
        return "json"
    if source_kind == "perf" and not path.endswith(".txt"):
        return "perf.data"
    return "text"


def write_result(
    source: EventSource, keep: np.ndarray, path: str | None, stream: BinaryIO | None = None
) -> None:
    """Write the events of ``source`` whose ``keep`` is set (one flag per
    event in source order) to ``path`` in its form (:func:`output_form`), or
    as a text listing to ``stream`` when ``path`` is None.  Raises
    :class:`~hwtrace.filter.inputs.base.StreamError` for input that cannot
    be rewritten and OSError for output that cannot be written."""
    form = output_form(path, source.kind)
    if form == "perf.data":
        assert path is not None
        source.write_subset(path, keep)  # type: ignore[attr-defined]
        return
    json = form == "json"
    if path is None:
        assert stream is not None
        for chunk in render_listing(source, keep, json=json):
            stream.write(chunk)
        stream.flush()
        return
    with open(path, "wb") as f:
        for chunk in render_listing(source, keep, json=json):
            f.write(chunk)


class ResultWriter:
    """What ``hwtrace filter`` writes for ``input`` to ``path`` (None: a
    text listing to ``stream``), fed chunk by chunk (:meth:`add`, then
    :meth:`close`).  Raises :class:`~hwtrace.filter.inputs.base.StreamError`
    for input that cannot be rewritten and OSError for output that cannot
    be written."""

    def __init__(
        self, input: StreamInput, path: str | None, stream: BinaryIO | None = None
    ) -> None:
        self.form = output_form(path, input.kind)
        self._file: BinaryIO | None = None
        self._subset = None
        self._listing: ListingWriter | None = None
        if self.form == "perf.data":
            from ..perf.data import PerfDataError
            from ..perf.rewrite import SubsetWriter

            assert path is not None
            try:
                self._subset = SubsetWriter(input.data, path)  # type: ignore[attr-defined]
            except PerfDataError as e:
                raise StreamError(e.path, e.message, e.offset) from None
            return
        if path is not None:
            self._file = open(path, "wb")
            stream = self._file
        assert stream is not None
        self._stream = stream
        self._listing = ListingWriter(stream, input, json=self.form == "json")

    def add(self, chunk: EventSource, keep: np.ndarray, later: int | None) -> None:
        """Chunk ``chunk``'s events whose ``keep`` is set; ``later``: the
        earliest event time of the chunks to come (None: none)."""
        if self._subset is not None:
            drop = chunk.sample_record[~keep]  # type: ignore[attr-defined]
            self._subset.add(chunk.stop, drop)  # type: ignore[attr-defined]
        else:
            assert self._listing is not None
            self._listing.add(chunk, keep, later)

    def close(self) -> None:
        """Finish the output (the perf.data's header and features)."""
        if self._subset is not None:
            self._subset.close()
        elif self._file is not None:
            self._file.close()
        else:
            self._stream.flush()
