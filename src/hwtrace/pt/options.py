"""What a flow decoding is asked for beyond the PT configuration.

The option types every flow decoder takes (the compiled
:class:`~hwtrace.pt.flowdec.FlowDecoder`, the library's
:func:`~hwtrace.pt.decode.decode_trace`, ``hwtrace ptxed``): which events
the event layer reports, where the block layer ends blocks, and the
IA32_RTIT_ADDRn address filters the trace was recorded with.  Their
meaning is libipt's (``pt_config.flags``, ``pt_conf_addr_filter``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EventOptions:
    """Decoder flags that change which events are produced."""

    iflags: bool = False  # report interrupt-flag changes (MODE.Exec IF)
    keep_tcal_on_ovf: bool = False


@dataclass
class BlockFlags:
    """Block-decoder flags (libipt's ``pt_conf_flags.variant.block``)."""

    end_on_call: bool = False
    end_on_jump: bool = False
    tick_events: bool = False


@dataclass
class AddrFilter:
    """IA32_RTIT_ADDRn configuration: (cfg, a, b) per range; cfg 1 = filter,
    2 = trace stop."""

    ranges: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def configured(self) -> bool:
        return any(cfg for cfg, _, _ in self.ranges)


__all__ = ["AddrFilter", "BlockFlags", "EventOptions"]
