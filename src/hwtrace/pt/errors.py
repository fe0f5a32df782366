"""Error codes and messages of the decoder layers.

The numbering and the wording follow Intel's libipt (``enum pt_error_code``)
so that ``hwtrace ptdump`` and ``hwtrace ptxed`` print what Intel's tools print.
"""

from __future__ import annotations

import enum


class PtError(enum.IntEnum):
    OK = 0
    INTERNAL = 1
    INVALID = 2
    NOSYNC = 3
    BAD_OPC = 4
    BAD_PACKET = 5
    BAD_CONTEXT = 6
    EOS = 7
    BAD_QUERY = 8
    NOMEM = 9
    BAD_CONFIG = 10
    NOIP = 11
    IP_SUPPRESSED = 12
    NOMAP = 13
    BAD_INSN = 14
    NO_TIME = 15
    NO_CBR = 16
    BAD_IMAGE = 17
    BAD_LOCK = 18
    NOT_SUPPORTED = 19
    RETSTACK_EMPTY = 20
    BAD_RETCOMP = 21
    BAD_STATUS_UPDATE = 22
    NO_ENABLE = 23
    EVENT_IGNORED = 24
    OVERFLOW = 25
    BAD_FILE = 26
    BAD_CPU = 27


# Why the compiled flow decoder undid a step it takes again (numbers past
# libipt's: never errors of the trace; see hwtrace.pt._flowloop).
ABORT, ABORT_MISS, ABORT_WINDOW = 1000, 1001, 1002

ERROR_STRINGS: dict[int, str] = {
    PtError.OK: "OK",
    PtError.INTERNAL: "internal error",
    PtError.INVALID: "invalid argument",
    PtError.NOSYNC: "decoder out of sync",
    PtError.BAD_OPC: "unknown opcode",
    PtError.BAD_PACKET: "unknown packet",
    PtError.BAD_CONTEXT: "unexpected packet context",
    PtError.EOS: "reached end of trace stream",
    PtError.BAD_QUERY: "trace stream does not match query",
    PtError.NOMEM: "out of memory",
    PtError.BAD_CONFIG: "bad configuration",
    PtError.NOIP: "no ip",
    PtError.IP_SUPPRESSED: "ip has been suppressed",
    PtError.NOMAP: "no memory mapped at this address",
    PtError.BAD_INSN: "unknown instruction",
    PtError.NO_TIME: "no timing information",
    PtError.NO_CBR: "no core:bus ratio",
    PtError.BAD_IMAGE: "bad image",
    PtError.BAD_LOCK: "locking error",
    PtError.NOT_SUPPORTED: "not supported",
    PtError.RETSTACK_EMPTY: "compressed return without call",
    PtError.BAD_RETCOMP: "bad compressed return",
    PtError.BAD_STATUS_UPDATE: "bad status update",
    PtError.NO_ENABLE: "expected tracing enabled event",
    PtError.EVENT_IGNORED: "event ignored",
    PtError.OVERFLOW: "overflow",
    PtError.BAD_FILE: "bad file",
    PtError.BAD_CPU: "unknown cpu",
}


def errstr(code: int) -> str:
    return ERROR_STRINGS.get(abs(int(code)), "unknown error")
