"""x86 instruction decoding and classification for flow reconstruction.

Flow decoders need four things from an instruction: its length, how control
leaves it (the class below), a direct branch's displacement, and a few special
kinds that events bind to (MOV to CR3, VMLAUNCH/VMRESUME, PTWRITE, IRET and
friends).  iced-x86 decodes; this module classifies the way Intel's decoder
does, so that events bind to the same instructions as in Intel's ``ptxed``.

Each address is decoded once per address space and mode: :class:`InsnCache`
keeps decoded instructions keyed by ``(ip, mode)``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace

import iced_x86 as iced

MAX_INSN_SIZE = 15


class IClass(enum.IntEnum):
    """How control leaves an instruction (Intel's ``enum pt_insn_class``)."""

    UNKNOWN = 0
    OTHER = 1
    CALL = 2
    RETURN = 3
    JUMP = 4
    COND_JUMP = 5
    FAR_CALL = 6
    FAR_RETURN = 7
    FAR_JUMP = 8
    PTWRITE = 9
    INDIRECT = 10


class Special(enum.IntEnum):
    """Instructions events bind to (Intel's ``pti_inst`` classes we need)."""

    NONE = 0
    MOV_CR3 = 1
    VMLAUNCH = 2
    VMRESUME = 3
    VMPTRLD = 4
    IRET = 5  # IRET, SYSRET, SYSEXIT, ERETS, ERETU: what an iret event binds to
    UIRET = 6
    JMPABS = 7
    CPL = 8  # INT, INT3, INTO, INT1, SYSCALL, SYSENTER: CPL-changing far calls


_M = iced.Mnemonic
_F = iced.FlowControl
_FAR_CALL = {_M.INT, _M.INT1, _M.INT3, _M.INTO, _M.SYSCALL, _M.SYSENTER, _M.VMCALL}
_FAR_RETURN = {
    _M.IRET, _M.IRETD, _M.IRETQ, _M.RETF, _M.SYSEXIT, _M.SYSRET, _M.SYSRETQ, _M.UIRET,
    _M.VMLAUNCH, _M.VMRESUME, _M.ERETS, _M.ERETU,
}  # fmt: skip
_IRET_LIKE = {_M.IRET, _M.IRETD, _M.IRETQ, _M.SYSRET, _M.SYSRETQ, _M.SYSEXIT, _M.ERETS, _M.ERETU}
_CPL = {_M.INT, _M.INT1, _M.INT3, _M.INTO, _M.SYSCALL, _M.SYSENTER}

# Jumps and calls by iced's flow control: their near class, far class, the
# iced property that says the instruction is far, and whether the near one
# is direct.
_JUMPS_AND_CALLS = {
    _F.UNCONDITIONAL_BRANCH: (IClass.JUMP, IClass.FAR_JUMP, "is_jmp_far", True),
    _F.INDIRECT_BRANCH: (IClass.JUMP, IClass.FAR_JUMP, "is_jmp_far_indirect", False),
    _F.CALL: (IClass.CALL, IClass.FAR_CALL, "is_call_far", True),
    _F.INDIRECT_CALL: (IClass.CALL, IClass.FAR_CALL, "is_call_far_indirect", False),
}


@dataclass(frozen=True, slots=True)
class Insn:
    """A decoded instruction."""

    ip: int
    size: int
    iclass: IClass
    special: Special
    is_direct: bool  # a near branch with a displacement
    displacement: int  # target - (ip + size) for direct near branches
    raw: bytes
    mode: int  # 16, 32 or 64
    truncated: bool = False  # its bytes come from more than one section

    @property
    def next_ip(self) -> int:
        return (self.ip + self.size) & 0xFFFFFFFFFFFFFFFF


def classify(ins: iced.Instruction) -> tuple[IClass, Special, bool]:
    """Class, special kind and directness of an iced instruction."""
    mn = ins.mnemonic
    fc = ins.flow_control
    if ins.code == iced.Code.INVALID:
        return IClass.UNKNOWN, Special.NONE, False
    if mn == _M.PTWRITE:
        return IClass.PTWRITE, Special.NONE, False
    if mn in _FAR_CALL:
        return IClass.FAR_CALL, Special.CPL if mn in _CPL else Special.NONE, False
    if mn in _FAR_RETURN:
        if mn in _IRET_LIKE:
            special = Special.IRET
        elif mn == _M.UIRET:
            special = Special.UIRET
        elif mn == _M.VMLAUNCH:
            special = Special.VMLAUNCH
        elif mn == _M.VMRESUME:
            special = Special.VMRESUME
        else:
            special = Special.NONE
        return IClass.FAR_RETURN, special, False
    if fc == _F.CONDITIONAL_BRANCH:
        return IClass.COND_JUMP, Special.NONE, True
    if fc == _F.RETURN:
        return IClass.RETURN, Special.NONE, False
    branch = _JUMPS_AND_CALLS.get(fc)
    if branch is not None:
        near, far, is_far, direct = branch
        if getattr(ins, is_far):
            return far, Special.NONE, False
        return near, Special.NONE, direct
    if mn == _M.MOV and ins.op_count == 2 and ins.op0_register == iced.Register.CR3:
        return IClass.OTHER, Special.MOV_CR3, False
    if mn == _M.VMPTRLD:
        return IClass.OTHER, Special.VMPTRLD, False
    return IClass.OTHER, Special.NONE, False


_JMPABS_SIZE = 11  # REX2 (D5 payload), opcode A1, 64-bit absolute target


def _is_jmpabs(data: bytes) -> bool:
    """JMPABS: REX2 prefix with map 0 (M0 clear) and W clear, then A1 imm64."""
    return len(data) >= _JMPABS_SIZE and data[0] == 0xD5 and not data[1] & 0x88 and data[2] == 0xA1


def decode(data: bytes, ip: int, mode: int) -> Insn | None:
    """Decode one instruction from ``data`` at ``ip``; None if it is not a
    valid instruction (or ``data`` ends inside it)."""
    if mode not in (16, 32, 64):
        return None
    if mode == 64 and _is_jmpabs(data):
        # iced-x86 (1.21) does not know APX: decode JMPABS ourselves.  Intel's
        # decoder treats it as an indirect jump (its target comes from a TIP).
        return Insn(ip, _JMPABS_SIZE, IClass.JUMP, Special.JMPABS, False, 0, bytes(data[:11]), mode)
    ins = iced.Decoder(mode, data, ip=ip).decode()
    if ins.code == iced.Code.INVALID:
        return None
    return _insn_of(ins, data[: ins.len], ip, mode)


def _insn_of(ins: iced.Instruction, raw: bytes, ip: int, mode: int) -> Insn:
    """An iced-x86 instruction (decoded from ``raw`` at ``ip``) classified."""
    iclass, special, direct = classify(ins)
    disp = 0
    if direct:
        target = ins.near_branch_target
        disp = target - ((ip + ins.len) & 0xFFFFFFFFFFFFFFFF)
        if mode != 64:
            width = 1 << mode
            disp = ((disp + width // 2) % width) - width // 2
    return Insn(ip, ins.len, iclass, special, direct, disp, bytes(raw), mode)


_STRAIGHT = (IClass.OTHER, IClass.PTWRITE)  # classes after which control goes on
#: bytes read and decoded ahead at once: code is decoded in runs (one
#: iced-x86 decoder over a stretch, a fraction of a decoder per instruction)
RUN_BYTES = 256


Reader = Callable[[int, int], bytes]


class InsnCache:
    """Decoded instructions of one address space, each decoded once.

    ``read(address, size)`` returns the bytes available at ``address`` (fewer
    at the end of mapped memory, none when unmapped).
    """

    def __init__(self, read: Reader) -> None:
        self.read = read
        self._cache: dict[tuple[int, int], Insn | int] = {}

    def get(self, ip: int, mode: int) -> Insn | int:
        """The instruction at ``ip``, or a libipt error code (nomap: 13,
        bad_insn: 14) when there is none."""
        key = (ip, mode)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if mode in (16, 32, 64):
            self._decode_run(ip, mode)
            hit = self._cache.get(key)
            if hit is not None:
                return hit
        data = self.read(ip, MAX_INSN_SIZE)
        if not data:
            result: Insn | int = 13
        else:
            insn = decode(data, ip, mode)
            # Reads stop at a section's end; an instruction may continue in
            # the next section (code patched by an overlapping section).
            while insn is None and len(data) < MAX_INSN_SIZE:
                more = self.read(ip + len(data), MAX_INSN_SIZE - len(data))
                if not more:
                    break
                data += more
                insn = decode(data, ip, mode)
                if insn is not None:
                    insn = replace(insn, truncated=True)
            result = insn if insn is not None else 14
        self._cache[key] = result
        return result

    def _decode_run(self, ip: int, mode: int) -> None:
        """Decode and keep the straight-line instructions from ``ip`` on,
        through the first that may transfer control, in the first
        :data:`RUN_BYTES` bytes; stopping at one that does not decode whole
        from those bytes (which :meth:`get` then decodes alone: one across
        sections, APX's JMPABS, an error)."""
        data = self.read(ip, RUN_BYTES)
        if not data:
            return
        cache = self._cache
        at = ip
        for ins in iced.Decoder(mode, data, ip=ip):
            if ins.code == iced.Code.INVALID:
                break
            off = at - ip
            key = (at, mode)
            insn = cache.get(key)
            if insn is None:
                insn = cache[key] = _insn_of(ins, data[off : off + ins.len], at, mode)
            if isinstance(insn, int) or insn.iclass not in _STRAIGHT:
                break
            at += ins.len

    def forget(self, ranges: list[tuple[int, int]], before: int = 0) -> None:
        """Forget what was decoded at addresses in ``ranges`` (and up to
        ``before`` bytes before each: an instruction there may reach
        into it), as when those addresses come to hold other bytes."""
        if not ranges or not self._cache:
            return
        import numpy as np  # (only here: importing this module stays light)

        keys = list(self._cache)
        ips = np.array([k[0] for k in keys], np.uint64)
        hit = np.zeros(len(keys), bool)
        for a, b in ranges:
            hit |= (ips >= np.uint64(max(a - before, 0))) & (ips < np.uint64(b))
        for i in np.flatnonzero(hit).tolist():
            del self._cache[keys[i]]

    def clear(self) -> None:
        self._cache.clear()


class Formatter:
    """Disassembly text for ptxed's instruction column (Intel syntax)."""

    def __init__(self, att: bool = False) -> None:
        self._att = att
        self._fmt = iced.Formatter(iced.FormatterSyntax.GAS if att else iced.FormatterSyntax.INTEL)

    def format(self, insn: Insn) -> str:
        return self.format_bytes(insn.raw, insn.ip, insn.mode, insn.special)

    def format_bytes(self, raw: bytes, ip: int, mode: int, special: int = Special.NONE) -> str:
        """The text of the instruction ``raw`` (its bytes, as far as they
        go) decoded at ``ip`` in ``mode``."""
        if special == Special.JMPABS:
            target = int.from_bytes(raw[3:11], "little")
            return f"jmpabs ${target:#x}" if self._att else f"jmpabs {target:#x}"
        ins = iced.Decoder(mode, raw, ip=ip).decode()
        return self._fmt.format(ins)
