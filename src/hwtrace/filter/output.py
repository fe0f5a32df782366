"""Writing what a filter kept: a perf.data, JSON lines or a text listing.

The output's form follows its name, as ``hwtrace filter -o FILE`` documents:
for perf.data input, a perf.data of the samples kept with every other record
(:func:`hwtrace.perf.rewrite.write_subset`), unless the name ends in
``.jsonl`` (JSON lines) or ``.txt`` (the text listing); for other input, JSON
lines for ``.jsonl``, else the text listing (:mod:`hwtrace.filter.listing`).
"""

from __future__ import annotations

from typing import BinaryIO, Literal

import numpy as np

from .inputs.base import EventSource
from .listing import render_listing

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
