"""What Intel ptxed's options say about its text: the style the compiled
formatter (:mod:`hwtrace.pt.ptxed`) reads as bits.

Apart from the formatter so that ``hwtrace ptxed`` parses its command line
into a style without loading the formatter's loops.
"""

from __future__ import annotations

from dataclasses import dataclass

# Option bits (PtxedStyle.bits), in the order of PtxedStyle's fields.
S_QUIET, S_NO_INST, S_OFFSET, S_TIME, S_RAW, S_EV_TIME, S_EV_IP, S_SHOW_BLOCKS, S_STATS = (
    1 << i for i in range(9)
)


@dataclass
class PtxedStyle:
    """What ptxed's options say about the text."""

    quiet: bool = False
    no_inst: bool = False
    offset: bool = False
    time: bool = False
    raw_insn: bool = False
    event_time: bool = False
    event_ip: bool = False
    show_blocks: bool = False
    stats: bool = False

    @property
    def bits(self) -> int:
        flags = (
            self.quiet, self.no_inst, self.offset, self.time, self.raw_insn, self.event_time,
            self.event_ip, self.show_blocks, self.stats,
        )  # fmt: skip
        return sum(1 << i for i, on in enumerate(flags) if on)


__all__ = ["PtxedStyle"]
