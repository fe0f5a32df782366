"""Recording with Intel PT hardware: ``perf record -e intel_pt/.../``.

Where the CPU has Intel PT (``/sys/bus/event_source/devices/intel_pt``),
hwtrace records with Linux perf, whose kernel driver owns the hardware.  This
module turns :class:`PtSettings` (PSB period, timing packets, return
compression, filters) into perf's event terms and command line, checks them
against what the hardware enumerates (the PMU's ``caps`` directory, CPUID
leaf 0x14 as the kernel reads it) and runs perf.  The same settings drive the software backend, so a recording made
on a machine without PT uses the packet settings a real one would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

SYSFS_PMU = Path("/sys/bus/event_source/devices/intel_pt")


class SettingsError(ValueError):
    """A PT setting the hardware or perf cannot take; the message says which."""


@dataclass(frozen=True)
class AddressFilter:
    """One perf address filter (``--filter``), as the PT hardware applies it.

    ``action`` is ``filter`` (trace only inside), ``start``/``stop`` (trace
    from/until an address) or ``tracestop``.  The place is a symbol
    (``symbol``, optionally with ``size``) or an address range (``start`` and
    ``size``), inside ``dso`` (a path; None for the kernel).
    """

    action: str = "filter"
    symbol: str | None = None
    start: int | None = None
    size: int | None = None
    dso: str | None = None

    def __post_init__(self) -> None:
        if self.action not in ("filter", "start", "stop", "tracestop"):
            raise SettingsError(f"address filter: unknown action '{self.action}'")
        if (self.symbol is None) == (self.start is None):
            raise SettingsError("address filter: give either a symbol or a start address")
        if self.size is not None and self.size <= 0:
            raise SettingsError(f"address filter: size {self.size} must be positive")

    def perf_syntax(self) -> str:
        place = self.symbol if self.symbol is not None else f"{self.start:#x}"
        if self.size is not None:
            place += f"/{self.size:#x}"
        text = f"{self.action} {place}"
        if self.dso is not None:
            text += f" @ {self.dso}"
        return text


# The settings that are perf's intel_pt event terms, in the order written.
_EVENT_TERMS = ("cyc", "cyc_thresh", "mtc", "mtc_period", "psb_period", "tsc", "noretcomp",
                "branch", "ptw", "pwr_evt")  # fmt: skip


@dataclass(frozen=True)
class PtSettings:
    """Intel PT packet settings, in the units of ``IA32_RTIT_CTL``'s fields.

    ``psb_period``: PSB+ every 2**(n + 11) bytes (PSBFreq); ``mtc_period``:
    an MTC every 2**n crystal-clock ticks (MTCFreq); ``cyc_thresh``: CYC when
    at least 2**(n - 1) cycles passed (0: at every eligible packet).  None
    leaves perf's (the driver's) default.  ``noretcomp`` disables return
    compression; ``branch=False`` traces no control flow (timing and events
    only); ``user``/``kernel`` select the privilege levels; ``snapshot``
    records into a ring buffer dumped on SIGUSR2 (a size in bytes, or True
    for perf's default); ``compression``: perf's ``-z`` level for the
    records (0: none).
    """

    psb_period: int | None = None
    mtc: bool | None = None
    mtc_period: int | None = None
    cyc: bool = False
    cyc_thresh: int | None = None
    tsc: bool | None = None
    noretcomp: bool = False
    branch: bool | None = None
    ptw: bool = False
    pwr_evt: bool = False
    user: bool = True
    kernel: bool = False
    filters: tuple[AddressFilter, ...] = field(default_factory=tuple)
    snapshot: bool | int = False
    compression: int = 0

    def __post_init__(self) -> None:
        for name, top in (("psb_period", 15), ("mtc_period", 15), ("cyc_thresh", 15)):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= top:
                raise SettingsError(f"{name} {value}: must be in 0..{top} (a 4-bit field)")
        if not (self.user or self.kernel):
            raise SettingsError("trace neither user nor kernel code: nothing to record")

    def psb_period_bytes(self) -> int:
        """Bytes between PSB+ (unset: PSBFreq 0, the hardware's reset value)."""
        return 1 << ((self.psb_period or 0) + 11)

    def event_terms(self) -> str:
        """perf's ``intel_pt`` event terms, e.g. ``cyc=1,mtc_period=3``: a
        term for each setting that is not its default here (the defaults
        leave the driver's own)."""
        defaults = {f.name: f.default for f in fields(self)}
        values = ((name, getattr(self, name)) for name in _EVENT_TERMS)
        return ",".join(f"{name}={int(v)}" for name, v in values if v != defaults[name])

    def event(self) -> str:
        """The event for ``perf record -e``: ``intel_pt/TERMS/MODIFIERS``."""
        modifiers = ("u" if self.user else "") + ("k" if self.kernel else "")
        if modifiers == "uk":
            modifiers = ""
        return f"intel_pt/{self.event_terms()}/{modifiers}"

    def filter_argument(self) -> str | None:
        if not self.filters:
            return None
        return ",".join(f.perf_syntax() for f in self.filters)


@dataclass(frozen=True)
class PtCapabilities:
    """What the PT hardware enumerates (the PMU's ``caps`` files)."""

    psb_periods: int  # bitmap of allowed psb_period values
    mtc_periods: int
    cycle_thresholds: int
    mtc: bool
    psb_cyc: bool
    ip_filtering: bool
    num_address_ranges: int
    ptwrite: bool
    power_event_trace: bool

    @classmethod
    def read(cls, pmu: Path = SYSFS_PMU) -> PtCapabilities | None:
        """The capabilities of this machine's PT, or None without PT."""
        caps = pmu / "caps"
        if not caps.is_dir():
            return None

        def number(name: str, base: int = 10) -> int:
            # The period and threshold files are hex bitmaps, the rest decimal.
            try:
                return int(_read(caps / name) or "0", base)
            except ValueError:
                return 0

        return cls(
            psb_periods=number("psb_periods", 16),
            mtc_periods=number("mtc_periods", 16),
            cycle_thresholds=number("cycle_thresholds", 16),
            mtc=bool(number("mtc")),
            psb_cyc=bool(number("psb_cyc")),
            ip_filtering=bool(number("ip_filtering")),
            num_address_ranges=number("num_address_ranges"),
            ptwrite=bool(number("ptwrite")),
            power_event_trace=bool(number("power_event_trace")),
        )

    def check(self, settings: PtSettings) -> None:
        """Raise :class:`SettingsError` for a setting this hardware lacks."""
        for name, allowed in (
            ("psb_period", self.psb_periods),
            ("mtc_period", self.mtc_periods),
            ("cyc_thresh", self.cycle_thresholds),
        ):
            value = getattr(settings, name)
            if value is not None and not (allowed >> value) & 1:
                values = [str(v) for v in range(16) if (allowed >> v) & 1]
                raise SettingsError(
                    f"{name}={value} is not supported by this CPU "
                    f"(allowed: {', '.join(values) or 'none'})"
                )
        if (settings.mtc or settings.mtc_period is not None) and not self.mtc:
            raise SettingsError("this CPU's PT has no MTC packets")
        if (settings.cyc or settings.cyc_thresh is not None) and not self.psb_cyc:
            raise SettingsError("this CPU's PT has no CYC packets")
        if settings.ptw and not self.ptwrite:
            raise SettingsError("this CPU's PT has no PTWRITE")
        if settings.pwr_evt and not self.power_event_trace:
            raise SettingsError("this CPU's PT has no power event trace")
        if settings.filters and not self.ip_filtering:
            raise SettingsError("this CPU's PT has no address filtering")
        if len(settings.filters) > self.num_address_ranges:
            raise SettingsError(
                f"{len(settings.filters)} address filters given, this CPU has "
                f"{self.num_address_ranges} address ranges"
            )


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def perf_record_argv(
    settings: PtSettings,
    output: str | os.PathLike[str],
    *,
    command: Sequence[str] = (),
    pid: int | None = None,
    perf: str = "perf",
    per_thread: bool = False,
    kcore: bool = False,
    target: bool = True,
) -> list[str]:
    """The ``perf record`` command line for a PT recording.

    Either a ``command`` to launch or a ``pid`` to attach to (neither with
    ``target=False``: the caller adds its own).  Context-switch
    sideband (``--switch-events``) is always asked for, since attributing PT
    to threads needs it; ``kcore`` copies ``/proc/kcore`` for kernel decoding.
    """
    if target and bool(command) == (pid is not None):
        raise SettingsError("record either a command or a pid")
    argv = [perf, "record", "-e", settings.event(), "-o", os.fspath(output), "--switch-events"]
    flt = settings.filter_argument()
    if flt is not None:
        argv += ["--filter", flt]
    if settings.snapshot is not False:
        argv.append("-S" if settings.snapshot is True else f"-S{int(settings.snapshot)}")
    if per_thread:
        argv.append("--per-thread")
    if settings.compression:
        argv.append(f"--compression-level={settings.compression}")
    if kcore:
        argv.append("--kcore")
    if not target:
        return argv
    if pid is not None:
        argv += ["-p", str(pid)]
    else:
        argv += ["--", *command]
    return argv


def have_intel_pt(pmu: Path = SYSFS_PMU) -> bool:
    return pmu.is_dir()


def record_with_perf(
    settings: PtSettings,
    output: str | os.PathLike[str],
    *,
    command: Sequence[str] = (),
    pid: int | None = None,
    per_thread: bool = False,
    kcore: bool = False,
    jit: bool = False,
    on_capture=None,
) -> int:
    """Record with perf and Intel PT hardware; returns perf's exit status.
    ``jit``: the code capture agent runs alongside and its revisions go into
    the perf.data (:mod:`hwtrace.record.jitrecord`); ``on_capture`` gets
    what it captured (a :class:`~hwtrace.record.jitcapture.CaptureResult`).

    Raises :class:`SettingsError` when this machine has no Intel PT or perf,
    or a setting its PT cannot take.
    """
    caps = PtCapabilities.read()
    if caps is None:
        raise SettingsError(
            f"no Intel PT on this machine ({SYSFS_PMU} is missing); "
            "use the software backend (hwtrace record --backend software)"
        )
    caps.check(settings)
    perf = shutil.which("perf")
    if perf is None:
        raise SettingsError("perf is not installed (Debian: apt-get install linux-perf)")
    if jit:
        from .jitrecord import record_perf_with_capture  # perf.data rewriting: only with --jit

        argv = perf_record_argv(
            settings, output, perf=perf, per_thread=per_thread, kcore=kcore, target=False
        )
        status, result = record_perf_with_capture(argv, list(command) if command else pid, output)
        if on_capture is not None:
            on_capture(result)
        return status
    argv = perf_record_argv(
        settings, output, command=command, pid=pid, perf=perf, per_thread=per_thread, kcore=kcore
    )
    return subprocess.call(argv)
