"""Decoder configuration: timing parameters, the traced CPU and its errata.

The values a decoder needs but the trace does not carry: the MTC frequency
(IA32_RTIT_CTL[17:14]), the nominal core:bus ratio (MSR_PLATFORM_INFO[15:8]),
the TSC:crystal-clock ratio (CPUID leaf 0x15) and the CPU, whose errata change
how some packet sequences must be read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ERRATA = (
    "bdm70",
    "bdm64",
    "skd007",
    "skd022",
    "skd010",
    "skl014",
    "skl168",
    "skz84",
    "apl11",
    "apl12",
)

# family -> model -> errata.  Intel's decoder keeps the same table; the
# conformance suite lists which CPUs each erratum's tests run on.
_SKL = ("bdm70", "skd007", "skd022", "skd010", "skl014", "skl168")
_SKX = ("bdm70", "skl014", "skd022", "skz84")
_ICL = ("bdm70", "skl014", "skd022")
_LATER = ("bdm70", "skd022", "apl11")
_ERRATA_TABLE: dict[int, dict[int, tuple[str, ...]]] = {
    6: {
        0x3D: ("bdm70", "bdm64"),
        0x47: ("bdm70", "bdm64"),
        0x4F: ("bdm70", "bdm64"),
        0x56: ("bdm70", "bdm64"),
        0x4E: _SKL,
        0x5E: _SKL,
        0x8E: _SKL,
        0x9E: _SKL,
        0xA5: _SKL,
        0xA6: _SKL,
        0x55: _SKX,
        0x6A: _SKX,
        0x6C: _SKX,
        0x8F: _SKX,
        0xAD: _SKX,
        0xAE: _SKX,
        0xCF: _SKX,
        0x66: _ICL,
        0x7D: _ICL,
        0x7E: _ICL,
        0x8C: _ICL,
        0x8D: _ICL,
        0xA7: _ICL,
        0xA8: _ICL,
        0x97: _LATER,
        0x9A: _LATER,
        0xBF: _LATER,
        0xB7: _LATER,
        0xB5: _LATER,
        0xAA: _LATER,
        0xAC: _LATER,
        0xBA: _LATER,
        0xCC: _LATER,
        0xBD: _LATER,
        0xC5: _LATER,
        0xC6: _LATER,
        0xD5: _LATER,
        0x5C: ("apl12", "apl11"),
        0x5F: ("apl12", "apl11"),
        0x7A: ("apl11",),
        0x86: ("apl11",),
        0x96: ("apl11",),
        0x9C: ("apl11",),
        0xB6: ("apl11",),
        0xAF: ("apl11",),
        0xDD: ("apl11",),
    },
    0x12: {0x01: _LATER, 0x03: _LATER},
    0x13: {0x01: _SKX},
}


@dataclass(frozen=True)
class Cpu:
    family: int
    model: int
    stepping: int = 0

    @classmethod
    def parse(cls, text: str) -> Cpu:
        """Parse ``family/model[/stepping]`` (decimal or 0x-hex numbers)."""
        parts = text.split("/")
        if len(parts) not in (2, 3):
            raise ValueError("cpu must be specified as f/m[/s]")
        try:
            nums = [int(p, 0) for p in parts]
        except ValueError:
            raise ValueError("cpu must be specified as f/m[/s]") from None
        if any(n < 0 or n > 0xFFFF for n in nums):
            raise ValueError("cpu must be specified as f/m[/s]")
        return cls(*nums)

    def errata(self) -> frozenset[str] | None:
        """The errata of this CPU, or None for a CPU we know nothing about."""
        names = _ERRATA_TABLE.get(self.family, {}).get(self.model)
        return None if names is None else frozenset(names)


@dataclass
class PtConfig:
    """What the decoder must be told about the traced system."""

    mtc_freq: int = 0
    nom_freq: int = 0
    cpuid_0x15_eax: int = 0
    cpuid_0x15_ebx: int = 0
    cpu: Cpu | None = None
    errata: frozenset[str] = field(default_factory=frozenset)

    def set_cpu(self, cpu: Cpu | None) -> bool:
        """Select the CPU and its errata.  False if the CPU is unknown."""
        self.cpu = cpu
        if cpu is None:
            self.errata = frozenset()
            return True
        known = cpu.errata()
        self.errata = known or frozenset()
        return known is not None
