"""The compiled methods of dataclasses, kept between a command's runs.

``dataclasses`` writes each class's ``__init__``, ``__repr__``, ``__eq__``,
``__setattr__``, ... as source text and compiles it when the class is
created: about 0.8 ms a frozen class here, where the code it compiles is
the same on every run.  A command imports a hundred such classes (perf's
record types, options, results), 60-80 ms of its start.  The compiled code
depends only on that text (and the interpreter), so the command keeps it,
marshalled, in the user's cache, keyed by the text, and hands it back;
text not seen before is compiled as ``exec`` would and written at exit.

Only the ``hwtrace`` command installs this (a library user's process is
left as it was); ``HWTRACE_NO_CODE_CACHE=1`` turns it off.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import marshal
import os
import sys
from pathlib import Path
from types import CodeType

# Entries kept in the file at most (a few hundred classes use it; the rest
# is room for other versions of the same classes, oldest dropped first).
MAX_ENTRIES = 2048


def cache_file(command: str) -> Path:
    """Where a command's compiled methods are kept: one file a command (each
    loads only what it uses) and interpreter version (marshal's format is
    the interpreter's)."""
    from ..aot import user_cache_dir

    return user_cache_dir() / "dataclass-code" / f"{command}.{sys.implementation.cache_tag}.marshal"


def _load(path: Path) -> dict[str, CodeType]:
    try:
        table = marshal.loads(path.read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if not isinstance(table, dict):
        return {}
    return {k: v for k, v in table.items() if isinstance(k, str) and isinstance(v, CodeType)}


def _save(path: Path, table: dict[str, CodeType]) -> None:
    if len(table) > MAX_ENTRIES:
        # Insertion order: what this run compiled is last, the file's oldest first.
        table = dict(list(table.items())[-MAX_ENTRIES:])
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(marshal.dumps(table))
        os.replace(tmp, path)
    except OSError:
        # A cache that cannot be written only costs the next start its time.
        with contextlib.suppress(OSError):
            tmp.unlink()


def install(path: Path) -> None:
    """Have ``dataclasses`` take its compiled methods from the cache at
    ``path`` (see :func:`cache_file`) from now on in this process."""
    if os.environ.get("HWTRACE_NO_CODE_CACHE") == "1":
        return
    import dataclasses

    if hasattr(dataclasses, "exec"):
        return  # installed already
    table = _load(path)
    added: list[str] = []
    builtin_exec = builtins.exec

    def exec_cached(source, globals=None, locals=None, /):
        if type(source) is str and globals is not None:
            code = table.get(source)
            if code is None:
                # exec's own compilation: no __future__ flags of this module.
                code = compile(source, "<string>", "exec", dont_inherit=True)
                table[source] = code
                added.append(source)
            source = code
        elif globals is None:
            # exec's defaults are its caller's namespaces.
            frame = sys._getframe(1)
            globals, locals = frame.f_globals, frame.f_locals if locals is None else locals
        return builtin_exec(source, globals, locals)

    # A module global of dataclasses is found before the builtin.
    dataclasses.exec = exec_cached

    def save() -> None:
        if added:
            _save(path, table)

    atexit.register(save)
