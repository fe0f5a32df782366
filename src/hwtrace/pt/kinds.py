"""Packet kinds, payload column meanings and error codes of the Intel PT codec.

Every decoded packet is one row of a struct-of-arrays table (see
:mod:`hwtrace.pt.packets`).  Besides ``offset``, ``kind`` and ``size`` each row
has three payload columns whose meaning depends on the kind:

==========  ======================  =================  =========================
kind        ``a`` (uint64)          ``b`` (uint32)     ``c`` (uint8 flags)
==========  ======================  =================  =========================
TIP/FUP/    raw IP bytes as found   IP compression
PGE/PGD     (not sign-extended)     (0,1,2,3,4,6)
TNT8/TNT64  branch bits, oldest is  number of bits
            the most significant
MODE_EXEC   mode bits (CS.L=1,
            CS.D=2, IF=4)
MODE_TSX    bits (INTX=1, ABRT=2)
PIP         CR3                     NR (non-root)
VMCS        VMCS base address
CBR         core:bus ratio
TSC         TSC[55:0]
MTC         CTC payload (8 bits)
TMA         CTC[15:0]               fast counter
CYC         cycle count
MNT         payload
PTW         payload                 payload size code  IP
EXSTOP                              IP
MWAIT       hints                   extensions
PWRE        resolved C-state        sub C-state        HW
PWRX        last core C-state       deepest C-state    INT=1, ST=2, HW=4
BBP         block type              SZ (1: 4-byte BIP)
BIP         payload                 register id        4-byte payload
BEP                                 IP
CFE         type                    vector             IP
EVD         payload                 type
TRIG        trigger bits (TRBV)     instruction count  IP=1, ICNTV=2, MULT=4
==========  ======================  =================  =========================
"""

from __future__ import annotations

import enum


class Kind(enum.IntEnum):
    """Packet kinds.  Values are stable: they are stored in packet tables."""

    PAD = 1
    PSB = 2
    PSBEND = 3
    TNT8 = 4
    TNT64 = 5
    TIP = 6
    TIP_PGE = 7
    TIP_PGD = 8
    FUP = 9
    MODE_EXEC = 10
    MODE_TSX = 11
    PIP = 12
    VMCS = 13
    CBR = 14
    TSC = 15
    MTC = 16
    TMA = 17
    CYC = 18
    OVF = 19
    STOP = 20
    MNT = 21
    PTW = 22
    EXSTOP = 23
    MWAIT = 24
    PWRE = 25
    PWRX = 26
    BBP = 27
    BIP = 28
    BEP = 29
    CFE = 30
    EVD = 31
    TRIG = 32
    INVALID = 33  # bytes skipped by an erratum workaround


# A row of the flow decoder's windows only, never of a packet table: a CYC
# and the TNT-8 right after it, in one row.  Most CYCs of a cycle-accurate
# trace come right before a TNT-8, and the flow decoder only passes over
# them, so its windows save a row (and a step of the time model) for each.
# The row has the CYC's offset (after the packet before it, the decoder
# stands there), both packets' size, the TNT's bits in ``a``, their number
# in ``b & 0xFF`` and the CYC's cycle count in ``b >> 8``.
# (Not a Kind: outside 4-13, so the time model's runs of packets that
# leave it as it is end there.)
TNT8_AFTER_CYC = 40


# Names as Intel's ptdump prints them.
KIND_NAMES: dict[int, str] = {
    Kind.PAD: "pad",
    Kind.PSB: "psb",
    Kind.PSBEND: "psbend",
    Kind.TNT8: "tnt.8",
    Kind.TNT64: "tnt.64",
    Kind.TIP: "tip",
    Kind.TIP_PGE: "tip.pge",
    Kind.TIP_PGD: "tip.pgd",
    Kind.FUP: "fup",
    Kind.MODE_EXEC: "mode.exec",
    Kind.MODE_TSX: "mode.tsx",
    Kind.PIP: "pip",
    Kind.VMCS: "vmcs",
    Kind.CBR: "cbr",
    Kind.TSC: "tsc",
    Kind.MTC: "mtc",
    Kind.TMA: "tma",
    Kind.CYC: "cyc",
    Kind.OVF: "ovf",
    Kind.STOP: "stop",
    Kind.MNT: "mnt",
    Kind.PTW: "ptw",
    Kind.EXSTOP: "exstop",
    Kind.MWAIT: "mwait",
    Kind.PWRE: "pwre",
    Kind.PWRX: "pwrx",
    Kind.BBP: "bbp",
    Kind.BIP: "bip",
    Kind.BEP: "bep",
    Kind.CFE: "cfe",
    Kind.EVD: "evd",
    Kind.TRIG: "trig",
    Kind.INVALID: "<invalid>",
}

IP_KINDS = frozenset({Kind.TIP, Kind.TIP_PGE, Kind.TIP_PGD, Kind.FUP})


class IPC(enum.IntEnum):
    """IP compression, the IPBytes field of TIP, TIP.PGE, TIP.PGD and FUP."""

    SUPPRESSED = 0
    UPDATE_16 = 1
    UPDATE_32 = 2
    SEXT_48 = 3
    UPDATE_48 = 4
    FULL = 6


IPC_PAYLOAD_BYTES = {0: 0, 1: 2, 2: 4, 3: 6, 4: 6, 6: 8}


class DecodeError(enum.IntEnum):
    """Why the decoder stopped at an offset (it resynchronises after these)."""

    BAD_OPCODE = 1  # no packet starts with these bytes
    BAD_PACKET = 2  # a known opcode with an invalid payload
    TRUNCATED = 3  # the stream ends inside a packet


ERROR_TEXT = {
    DecodeError.BAD_OPCODE: "unknown opcode",
    DecodeError.BAD_PACKET: "unknown packet",
    DecodeError.TRUNCATED: "truncated packet",
}

# Control-flow event types (CFE) and event data types (EVD), as named by the SDM.
CFE_TYPE_NAMES = {
    1: "intr",
    2: "iret",
    3: "smi",
    4: "rsm",
    5: "sipi",
    6: "init",
    7: "vmentry",
    8: "vmexit",
    9: "vmexit_intr",
    10: "shutdown",
    12: "uintr",
    13: "uiret",
    14: "swintr",
    15: "syscall",
}
CFE_DECIMAL_VECTOR = frozenset({1, 9, 12, 14})  # intr, vmexit_intr, uintr, swintr
CFE_HEX_VECTOR = frozenset({5})  # sipi
EVD_TYPE_NAMES = {0: "cr2", 1: "vmxq", 2: "vmxr"}
