"""The sideband options ptdump and ptxed share (``--sb:*``, ``--pevent:*``),
parsed the way Intel's tools parse them, and the session they set up."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .common import UsageError, parse_uint, split_range

U64 = (1 << 64) - 1

_HELP = [
    ("sb", "--sb:compact | --sb", "show sideband records in compact format."),
    ("sb", "--sb:verbose", "show sideband records in verbose format."),
    ("sb", "--sb:filename", "show the filename on sideband records."),
    ("sb", "--sb:offset", "show the offset on sideband records."),
    ("sb", "--sb:time", "show the time on sideband records."),
    ("ptxed", "--sb:switch", "print the new image name on context switches."),
    ("sb", "--sb:warn", "show sideband warnings."),
    ("sb", "--pevent:primary/secondary <file>[:<from>[-<to>]]", None),
    ("sb", "", "load a perf_event sideband stream from <file>."),
    ("sb", "", "an optional offset or range can be given."),
    ("ptdump", "--pevent <file>[:<from>[-<to>]]", "the same as --pevent:primary."),
    ("sb", "--pevent:sample-type <val>", "set perf_event_attr.sample_type to <val> (default: 0)."),
    ("sb", "--pevent:time-zero <val>", "set perf_event_mmap_page.time_zero to <val> (default: 0)."),
    ("sb", "--pevent:time-shift <val>", "set perf_event_mmap_page.time_shift to <val> (default: 0)."),
    ("sb", "--pevent:time-mult <val>", "set perf_event_mmap_page.time_mult to <val> (default: 1)."),
    ("sb", "--pevent:tsc-offset <val>", "show perf events <val> ticks earlier."),
    ("sb", "--pevent:kernel-start <val>", "the start address of the kernel."),
    ("ptxed", "--pevent:sysroot <path>", "prepend <path> to sideband filenames."),
    ("ptxed", "--pevent:vdso-x64 <file>", "use <file> as 64-bit vdso."),
    ("ptxed", "--pevent:vdso-x32 <file>", "use <file> as x32 vdso."),
    ("ptxed", "--pevent:vdso-ia32 <file>", "use <file> as 32-bit vdso."),
    ("ptdump", "--pevent:sysroot|kcore|vdso-x64|vdso-x32|vdso-ia32 <arg>", None),
    ("ptdump", "", "ignored (for ptxed's command lines)."),
]  # fmt: skip


def sideband_help(tool: str, width: int) -> str:
    """The sideband options' help, descriptions in column ``width``."""
    lines = []
    for who, option, text in _HELP:
        if who not in ("sb", tool):
            continue
        if text is None:
            lines.append(f"  {option}")
        elif len(option) + 3 > width:
            lines += [f"  {option}", " " * width + text]
        else:
            lines.append(f"  {option}".ljust(width) + text)
    return "\n".join(lines) + "\n"


_NUMBERS = {
    "--pevent:sample-type": ("sample_type", U64),
    "--pevent:time-zero": ("time_zero", U64),
    "--pevent:time-shift": ("time_shift", 0xFFFF),
    "--pevent:time-mult": ("time_mult", 0xFFFFFFFF),
    "--pevent:tsc-offset": ("tsc_offset", U64),
    "--pevent:kernel-start": ("kernel_start", U64),
}
_PATHS = {
    "--pevent:sysroot": "sysroot",
    "--pevent:vdso-x64": "vdso_x64",
    "--pevent:vdso-x32": "vdso_x32",
    "--pevent:vdso-ia32": "vdso_ia32",
    "--pevent:kcore": None,  # ptdump ignores it; ptxed has no kernel core support
}


@dataclass
class SbOptions:
    flags: int = 0
    warn: bool = False
    switch: bool = False
    files: list = field(default_factory=list)  # (spec, PeventConfig)
    _config: object = None

    def __post_init__(self) -> None:
        from ..perf.pevent import PeventConfig

        self._config = PeventConfig()

    @property
    def active(self) -> bool:
        return bool(self.files)

    def parse(self, arg: str, take: Callable[[], str], *, ptxed: bool) -> bool:
        """Consume ``arg`` (and its value, from ``take``) if it is a sideband
        option; False when it is not one."""
        from ..perf import pevent as P

        if arg in ("--sb:compact", "--sb"):
            self.flags = (self.flags & ~P.P_VERBOSE) | P.P_COMPACT
        elif arg == "--sb:verbose":
            self.flags = (self.flags & ~P.P_COMPACT) | P.P_VERBOSE
        elif arg == "--sb:filename":
            self.flags |= P.P_FILENAME
        elif arg == "--sb:offset":
            self.flags |= P.P_OFFSET
        elif arg == "--sb:time":
            self.flags |= P.P_TSC
        elif arg == "--sb:warn":
            self.warn = True
        elif arg == "--sb:switch" and ptxed:
            self.switch = True
        elif arg in ("--pevent:primary", "--pevent:secondary") or (arg == "--pevent" and not ptxed):
            spec = take()
            self.files.append((spec, self._config.copy(primary=arg != "--pevent:secondary")))
        elif arg in _NUMBERS:
            name, limit = _NUMBERS[arg]
            setattr(self._config, name, parse_uint(arg, take(), limit))
        elif arg in _PATHS and (_PATHS[arg] or not ptxed):
            value = take()
            if ptxed:
                setattr(self._config, _PATHS[arg], value)
        else:
            return False
        return True

    def session(self, report, on_switch=None):
        """The session with every named file loaded (not yet fetched).
        Raises UsageError naming the file when one cannot be loaded."""
        from ..perf.pevent import SidebandError, load
        from ..perf.sbsession import Session

        session = Session(report, on_switch)
        for spec, config in self.files:
            path, begin, size = split_range(spec)
            try:
                data = load(path, begin, begin + size if size else 0)
            except SidebandError as exc:
                raise UsageError(f"error loading {path}: {exc}") from None
            session.add_pevent(path, data, config)
        return session
