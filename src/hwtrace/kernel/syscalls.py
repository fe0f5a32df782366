"""x86-64 system call names and numbers, from the kernel's uapi header
(``asm/unistd_64.h``, Debian's linux-libc-dev) where it is installed."""

from __future__ import annotations

import functools
import re
from pathlib import Path

__all__ = ["syscall_name", "syscall_number"]

_HEADERS = (
    "/usr/include/x86_64-linux-gnu/asm/unistd_64.h",
    "/usr/include/asm/unistd_64.h",
)
_DEFINE = re.compile(r"^#define __NR_(\w+)\s+(\d+)\s*$", re.M)


@functools.cache
def _table() -> dict[str, int]:
    for h in _HEADERS:
        try:
            return {m.group(1): int(m.group(2)) for m in _DEFINE.finditer(Path(h).read_text())}
        except OSError:
            continue
    return {}


@functools.cache
def _names() -> dict[int, str]:
    return {v: k for k, v in _table().items()}


def syscall_name(nr: int) -> str:
    """``read`` for 0; the number itself when the name is not known."""
    return _names().get(nr, str(nr))


def syscall_number(text: str) -> int:
    """The number of system call ``text`` (a name or a number)."""
    if text.isdigit():
        return int(text)
    nr = _table().get(text)
    if nr is None:
        if not _table():
            raise ValueError(f"unknown system call {text!r} (no asm/unistd_64.h: give its number)")
        raise ValueError(f"unknown system call {text!r}")
    return nr
