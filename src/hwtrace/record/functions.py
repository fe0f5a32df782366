"""The functions a recording traces, by name, in a running process.

Kept apart from the stepping recorder (:mod:`hwtrace.record.stepper`),
whose compiled core imports numba: the patching backend resolves
``-f`` names too, and a recording whose patch plans are cached imports
no numba.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..image.process import Mapping, ProcessModules
from .errors import RecordError


@dataclass(frozen=True)
class TracedRange:
    """``[start, end)``, named after the function it covers (or ``""``)."""

    start: int
    end: int
    name: str = ""


def resolve_functions(
    pid: int, maps: list[Mapping], functions: Sequence[str], *, missing_ok: bool = False
) -> list[TracedRange]:
    """Address ranges of functions named ``name`` or ``module!name`` (module:
    a mapped file's base name, e.g. ``libc.so.6``), from the ELF symbols of the
    files mapped executable in the process, relocated by their load bias.  A
    plain name is looked up in the main executable first, then in the others.
    ``missing_ok``: leave out the names not found instead of raising.
    """
    modules = ProcessModules(pid, maps)
    out: list[TracedRange] = []
    for spec in functions:
        found = modules.find_function(spec)
        if found is None:
            if missing_ok:
                continue
            module, _, name = spec.rpartition("!")
            where = f"in {module}" if module else "in the mapped files"
            raise RecordError(f"function {name!r} not found {where} of process {pid}")
        out.append(TracedRange(found.start, found.end, spec))
    return out


__all__ = ["TracedRange", "resolve_functions"]
