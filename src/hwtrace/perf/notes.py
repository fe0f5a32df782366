"""What hwtrace keeps beside a perf.data it recorded: a small JSON file
(``<perf.data>.hwtrace.json``) for what the perf.data format cannot say
(the functions a hardware ``--call`` recording is to be cut to, the clock
of the software backend's times, where its code revisions came from)."""

from __future__ import annotations

import os
from collections.abc import Sequence


def recording_notes(perf_data: str | os.PathLike[str]) -> dict:
    """What hwtrace noted beside a perf.data it recorded
    (:func:`note_recording`), for as long as the file is the one recorded
    then (same size and modification time); empty otherwise."""
    import json

    side = sidecar_path(perf_data)
    try:
        meta = json.loads(side.read_text())
        st = os.stat(perf_data)
    except (OSError, ValueError):
        return {}
    if not isinstance(meta, dict):
        return {}
    if meta.get("size") != st.st_size or meta.get("mtime_ns") != st.st_mtime_ns:
        return {}  # the perf.data was written again since
    return meta


def recorded_calls(perf_data: str | os.PathLike[str]) -> list[str]:
    """The functions whose calls a recording was made for, when it was
    recorded with ``hwtrace record --call`` on hardware (which traces
    everything and leaves the cut to decoding)."""
    calls = recording_notes(perf_data).get("calls")
    return [str(c) for c in calls] if isinstance(calls, list) else []


def note_recording(
    perf_data: str | os.PathLike[str],
    *,
    calls: Sequence[str] = (),
    clock: str | None = None,
    clock_error_ns: int = 0,
    revisions: str | None = None,
) -> None:
    """Keep beside a recording what its perf.data cannot say: the functions
    its calls are to be cut to (hardware ``--call``), the clock its perf
    times are on (``CLOCK_MONOTONIC`` for the software backend, with how
    far off they may be), which places events of other tracers on it, and
    the source of its user code revisions (``revisions="stepper"``: the
    software backend timed them at trace points, see
    :data:`hwtrace.image.revisions.EXACT_SOURCES`)."""
    import json

    st = os.stat(perf_data)
    meta: dict = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if calls:
        meta["calls"] = list(calls)
    if clock is not None:
        meta["clock"] = clock
        meta["clock_error_ns"] = int(clock_error_ns)
    if revisions is not None:
        meta["revisions"] = revisions
    sidecar_path(perf_data).write_text(json.dumps(meta) + "\n")


def sidecar_path(perf_data: str | os.PathLike[str]):
    from pathlib import Path

    p = Path(perf_data)
    return p.with_name(p.name + ".hwtrace.json")
