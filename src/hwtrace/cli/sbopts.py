"""The sideband options ptdump and ptxed share (``--sb:*``, ``--pevent:*``),
parsed the way Intel's tools parse them, and the session they set up."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .common import UsageError, parse_uint, split_range

U64 = (1 << 64) - 1

HELP_SB = """\
  --sb:compact | --sb           show sideband records in compact format.
  --sb:verbose                  show sideband records in verbose format.
  --sb:filename                 show the filename on sideband records.
  --sb:offset                   show the offset on sideband records.
  --sb:time                     show the time on sideband records.
"""
HELP_SWITCH = """\
  --sb:switch                   print the new image name on context switches.
"""
HELP_WARN = """\
  --sb:warn                     show sideband warnings.
"""
HELP_PEVENT = """\
  --pevent:primary/secondary <file>[:<from>[-<to>]]
                                load a perf_event sideband stream from <file>.
                                an optional offset or range can be given.
  --pevent:sample-type <val>    set perf_event_attr.sample_type to <val> (default: 0).
  --pevent:time-zero <val>      set perf_event_mmap_page.time_zero to <val> (default: 0).
  --pevent:time-shift <val>     set perf_event_mmap_page.time_shift to <val> (default: 0).
  --pevent:time-mult <val>      set perf_event_mmap_page.time_mult to <val> (default: 1).
  --pevent:tsc-offset <val>     show perf events <val> ticks earlier.
  --pevent:kernel-start <val>   the start address of the kernel.
"""
HELP_PEVENT_FILES = """\
  --pevent:sysroot <path>       prepend <path> to sideband filenames.
  --pevent:vdso-x64 <file>      use <file> as 64-bit vdso.
  --pevent:vdso-x32 <file>      use <file> as x32 vdso.
  --pevent:vdso-ia32 <file>     use <file> as 32-bit vdso.
"""
HELP_PEVENT_IGNORED = """\
  --pevent:sysroot|vdso-x64|vdso-x32|vdso-ia32 <arg>
                                ignored (ptxed uses them).
"""

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
        elif arg in _PATHS:
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
