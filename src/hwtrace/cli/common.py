"""Pieces the commands share: argument parsing in Intel's style, loading a
trace file with an optional byte range, and writing output blocks."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NoReturn, Protocol, TypeVar

if TYPE_CHECKING:
    import numpy as np

T = TypeVar("T")


class Parser(argparse.ArgumentParser):
    """argparse with errors on one line, no usage dump."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: {message}\n")
        raise SystemExit(2)


def shown_problems(problems: Iterable[object], most: int = 3) -> list[str]:
    """A decoding's problems as the commands print them, one a line; the
    binaries not found, when more than ``most`` (a recording from another
    machine names every module and library it had loaded), in one line
    naming the first ``most``."""
    lines = [str(p) for p in problems]
    if len(lines) <= most:
        return lines  # (nothing to fold: the sideband model stays unimported)
    from ..perf.sideband import NOT_FOUND

    suffix = f": {NOT_FOUND}"
    missing = [line[: -len(suffix)] for line in lines if line.endswith(suffix)]
    if len(missing) <= most:
        return lines
    folded = (
        f"{len(missing)} binaries not found, their code decoded as gaps (--symfs DIR or "
        f"perf's build-id cache finds them): {', '.join(missing[:most])} and "
        f"{len(missing) - most} more"
    )
    out: list[str] = []
    for line in lines:
        if not line.endswith(suffix):
            out.append(line)
        elif folded:
            out.append(folded)  # where the first of them was
            folded = ""
    return out


def command_parser(prog: str, main: Callable[..., int], **kwargs: str) -> Parser:
    """The parser of the command ``prog`` runs as ``main``, described by
    ``main``'s docstring: the command's description is written once, for the
    code's readers and for ``--help`` alike (argparse reflows it anyway)."""
    return Parser(prog=prog, description=" ".join((main.__doc__ or "").split()), **kwargs)


def output_file(value: str) -> str:
    """An argparse type for a file a command writes: refused when the
    command line is read, not after the work, when it names a directory or
    its directory is missing or not writable."""
    if os.path.isdir(value):
        raise argparse.ArgumentTypeError(f"{value}: a directory, not a file")
    return _in_writable_directory(value, os.path.dirname(value))


def input_file(value: str) -> str:
    """An argparse type for a file a command reads whole: refused when the
    command line is read if it is missing, a directory, or not a regular
    file (a device or pipe could be endless, and is read into memory)."""
    if not os.path.isfile(value):
        if not os.path.exists(value):
            problem = "no such file"
        elif os.path.isdir(value):
            problem = "a directory, not a file"
        else:
            problem = "not a regular file"
        raise argparse.ArgumentTypeError(f"{value}: {problem}")
    return value


def _in_writable_directory(value: str, where: str) -> str:
    """``value``, made in directory ``where`` (empty: the current one), or
    the argparse error saying why nothing can be made there."""
    where = where or "."
    if not os.path.isdir(where):
        raise argparse.ArgumentTypeError(f"{value}: no directory {where}")
    if not os.access(where, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{value}: {where} is not writable")
    return value


def checked(value: str, convert: Callable[[str], T], noun: str, ok: Callable[[T], bool],
             rule: str) -> T:  # fmt: skip
    """``convert(value)``, an argparse error naming ``noun`` when it cannot
    be made, or ``rule`` when it is not ``ok``."""
    try:
        got = convert(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: not {noun}") from None
    if not ok(got):
        raise argparse.ArgumentTypeError(f"{value}: {rule}")
    return got


def seconds(value: str) -> float:
    """An argparse type for a duration: a finite number of seconds, 0 or
    more (NaN fails the test too)."""
    return checked(value, float, "a number of seconds", lambda s: 0 <= s < float("inf"),
                    "a number of seconds, 0 or more")  # fmt: skip


def process_id(value: str) -> int:
    """An argparse type for a process id: a positive integer."""
    return checked(value, int, "a process id", lambda pid: pid > 0,
                    "not a process id (a positive number)")  # fmt: skip


def input_dir(value: str) -> str:
    """An argparse type for a directory a command reads from (``--symfs``):
    refused when the command line is read if there is none."""
    if not os.path.isdir(value):
        raise argparse.ArgumentTypeError(
            f"{value}: {'not a directory' if os.path.exists(value) else 'no such directory'}"
        )
    return value


def output_dir(value: str) -> str:
    """An argparse type for a directory a command writes into (made if it
    is not there): refused at once when that cannot be."""
    if os.path.isdir(value):
        if not os.access(value, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"{value}: not writable")
        return value
    if os.path.exists(value):
        raise argparse.ArgumentTypeError(f"{value}: a file, not a directory")
    return _in_writable_directory(value, os.path.dirname(os.path.normpath(value)))


class UsageError(Exception):
    """A bad command line; the message says what is wrong."""


# The trace configuration's numbers Intel's ptdump and ptxed take as
# options: option -> (PtConfig field, largest value).
CONFIG_UINTS = {
    "--mtc-freq": ("mtc_freq", 0xFF),
    "--nom-freq": ("nom_freq", 0xFF),
    "--cpuid-0x15.eax": ("cpuid_0x15_eax", 0xFFFFFFFF),
    "--cpuid-0x15.ebx": ("cpuid_0x15_ebx", 0xFFFFFFFF),
}

_CONFIG_HELP = (
    ("--cpu none|f/m[/s]", "set cpu to the given value and decode according to:"),
    ("", "  none     spec (default)"),
    ("", "  f/m[/s]  family/model[/stepping]"),
    ("--mtc-freq <n>", "set the MTC frequency (IA32_RTIT_CTL[17:14]) to <n>."),
    ("--nom-freq <n>", "set the nominal frequency (MSR_PLATFORM_INFO[15:8]) to <n>."),
    ("--cpuid-0x15.eax", "set the value of cpuid[0x15].eax."),
    ("--cpuid-0x15.ebx", "set the value of cpuid[0x15].ebx."),
)


def config_help(width: int) -> str:
    """The help of ``--cpu`` and CONFIG_UINTS' options (Intel's ptdump and
    ptxed word them alike), descriptions in column ``width``."""
    return "".join(f"  {option}".ljust(width) + text + "\n" for option, text in _CONFIG_HELP)


def help_or_version(arg: str, help_text: str, tool: str) -> bool:
    """Intel's ``--help``/``-h`` and ``--version``: when ``arg`` is one,
    print the help or ``hwtrace-<tool>-<version>`` and return True (the
    command then exits with 0)."""
    if arg in ("-h", "--help"):
        sys.stdout.write(help_text)
        return True
    if arg == "--version":
        from .. import __version__

        print(f"hwtrace-{tool}-{__version__}")
        return True
    return False


def parse_uint(option: str, value: str | None, limit: int) -> int:
    """Parse an option's unsigned argument (decimal, 0x-hex or 0-octal)."""
    if value is None or value == "" or value.startswith("--"):
        raise UsageError(f"{option}: missing argument")
    try:
        number = int(value, 0)
    except ValueError:
        try:  # C's strtoull accepts leading zeros as octal
            number = int(value, 8) if value.startswith("0") else int(value, 10)
        except ValueError:
            raise UsageError(f"{option}: bad argument: {value}") from None
    if number < 0:
        raise UsageError(f"{option}: bad argument: {value}")
    if number > limit:
        raise UsageError(f"{option}: value too big: {value}")
    return number


def split_range(arg: str) -> tuple[str, int, int]:
    """Split ``file[:from[-to]]`` into (file, from, size); size 0 is to the end.

    A suffix that is not a range is part of the file name, as in Intel's tools.
    """
    head, sep, tail = arg.rpartition(":")
    if not sep or not tail:
        return arg, 0, 0
    lo_text, dash, hi_text = tail.partition("-")
    try:
        lo = int(lo_text, 0)
        hi = int(hi_text, 0) if dash else None
    except ValueError:
        return arg, 0, 0
    if hi is None:
        return head, lo, 0
    if hi <= lo:
        raise UsageError(f"bad range {tail} in {arg}: the end must be after the start")
    return head, lo, hi - lo


class _Noted(Protocol):
    notes: list[str]


Noted = TypeVar("Noted", bound=_Noted)


def open_saying(
    prog: str, opener: Callable[[], Noted], errors: type[Exception], note: str = ""
) -> Noted | None:
    """What ``opener`` returns, its ``notes`` written to standard error as
    ``PROG: <note>NOTE``; None when it raises ``errors`` (the message written
    as ``PROG: MESSAGE``)."""
    try:
        opened = opener()
    except errors as e:
        sys.stderr.write(f"{prog}: {e}\n")
        return None
    for text in opened.notes:
        sys.stderr.write(f"{prog}: {note}{text}\n")
    return opened


def open_range(prog: str, arg: str, opener: Callable[[str], T]) -> tuple[str, int, int, T] | None:
    """``file[:from[-to]]`` split (see :func:`split_range`) and its file
    opened by ``opener(path)``: (file, from, size, what ``opener`` gave).
    Prints one clear message and returns None when either fails."""
    try:
        path, offset, size = split_range(arg)
    except UsageError as exc:
        sys.stderr.write(f"{prog}: {exc}\n")
        return None
    try:
        if os.path.isdir(path):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        return path, offset, size, opener(path)
    except OSError as exc:
        sys.stderr.write(f"{prog}: cannot read {path}: {exc.strerror or exc}\n")
        return None


def load_trace(prog: str, arg: str) -> tuple[str, np.ndarray] | None:
    """Memory-map ``file[:from[-to]]``.  Prints one clear message and returns
    None when the file cannot be used."""
    from ..pt.packets import map_file

    opened = open_range(prog, arg, map_file)
    if opened is None:
        return None
    path, offset, size, buf = opened
    if offset or size:
        end = range_end(prog, path, offset, size, buf.shape[0])
        if end is None:
            return None
        buf = buf[offset:end]
    return path, buf


def range_end(prog: str, path: str, offset: int, size: int, total: int) -> int | None:
    """Where ``file:offset[-...]`` of ``size`` bytes (0: to the end) ends in a
    file of ``total`` bytes; prints one message and returns None when the
    range does not fit."""
    end = offset + size if size else total
    problem = None
    if offset >= total:
        problem = f"offset {offset:#x} is beyond the end ({total:#x})"
    elif end > total:
        problem = f"range end {end:#x} is beyond the end ({total:#x})"
    if problem:
        sys.stderr.write(f"{prog}: {path}: {problem}\n")
        return None
    return end


def write_blocks(blocks: Iterable[bytes]) -> None:
    """Write byte blocks to standard output."""
    out = sys.stdout.buffer
    for block in blocks:
        out.write(block)
    out.flush()
