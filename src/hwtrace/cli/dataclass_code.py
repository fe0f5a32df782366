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
from types import CodeType

# Entries kept in the file at most (a few hundred classes use it; the rest
# is room for other versions of the same classes, oldest dropped first).
MAX_ENTRIES = 2048
# The file is written again only when a run compiled something new (a new
# hwtrace, a class met for the first time).  An entry no run used in the
# last KEEP_SAVES writes is dropped then: the code of classes that changed
# goes instead of being loaded at every start until MAX_ENTRIES pushes it
# out.
KEEP_SAVES = 4


def cache_file(command: str) -> str:
    """Where a command's compiled methods are kept: one file a command (each
    loads only what it uses) and interpreter version (marshal's format is
    the interpreter's).  (A string: pathlib's import would cost more than
    the file saves on a small command.)"""
    from ..aot import user_cache_path

    name = f"{command}.{sys.implementation.cache_tag}.marshal"
    return os.path.join(user_cache_path(), "dataclass-code", name)


def _load(path: str | os.PathLike[str]) -> tuple[int, dict[str, tuple[CodeType, int]]]:
    """The file's number of writes and its entries: source text -> (code,
    the write that last kept it as used).  Nothing for a file of another
    form (damaged, older)."""
    try:
        with open(path, "rb") as f:
            data = marshal.loads(f.read())
    except (OSError, EOFError, ValueError, TypeError):
        return 0, {}
    if not (isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], int)
            and isinstance(data[1], dict)):  # fmt: skip
        return 0, {}
    table = {
        k: v
        for k, v in data[1].items()
        if isinstance(k, str) and type(v) is tuple and len(v) == 2
        and isinstance(v[0], CodeType) and isinstance(v[1], int)
    }  # fmt: skip
    return data[0], table


def _save(path: str | os.PathLike[str], saves: int, table: dict[str, tuple[CodeType, int]],
          used: set[str]) -> None:  # fmt: skip
    """Write ``table`` as the file's write ``saves + 1``: ``used`` (this
    run's entries) marked so, those unused for KEEP_SAVES writes dropped."""
    now = saves + 1
    kept = {k: (v[0], now if k in used else v[1]) for k, v in table.items()
            if k in used or v[1] > now - KEEP_SAVES}  # fmt: skip
    if len(kept) > MAX_ENTRIES:
        newest = sorted(kept.items(), key=lambda kv: kv[1][1])[-MAX_ENTRIES:]
        kept = dict(newest)
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(marshal.dumps((now, kept)))
        os.replace(tmp, path)
    except OSError:
        # A cache that cannot be written only costs the next start its time.
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def install(path: str | os.PathLike[str]) -> None:
    """Have ``dataclasses`` take its compiled methods from the cache at
    ``path`` (see :func:`cache_file`) from now on in this process."""
    if os.environ.get("HWTRACE_NO_CODE_CACHE") == "1":
        return
    import dataclasses

    if hasattr(dataclasses, "exec"):
        return  # installed already
    saves, table = _load(path)
    added: list[str] = []
    used: set[str] = set()
    builtin_exec = builtins.exec

    def exec_cached(source, globals=None, locals=None, /):
        if type(source) is str and globals is not None:
            entry = table.get(source)
            if entry is None:
                # exec's own compilation: no __future__ flags of this module.
                entry = table[source] = (
                    compile(source, "<string>", "exec", dont_inherit=True), saves
                )  # fmt: skip
                added.append(source)
            used.add(source)
            source = entry[0]
        elif globals is None:
            # exec's defaults are its caller's namespaces.
            frame = sys._getframe(1)
            globals, locals = frame.f_globals, frame.f_locals if locals is None else locals
        return builtin_exec(source, globals, locals)

    # A module global of dataclasses is found before the builtin.
    dataclasses.exec = exec_cached

    def save() -> None:
        if added:
            _save(path, saves, table, used)

    atexit.register(save)
