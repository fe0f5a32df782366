"""Out-of-line relocation of the instructions covered by a 5-byte tracepoint jump.

A tracepoint at address A overwrites the first 5 bytes there with ``jmp rel32``. The
instructions it covers (the *window*) are moved into a trampoline at another address T,
within ±2 GiB of A, where they must behave exactly as they did at A. The caller then
appends a jump back to A + window length.

How each instruction is moved:

* Ordinary instructions are copied byte for byte.
* RIP-relative memory operands are re-encoded with the displacement recomputed for the
  new address. iced-x86's encoder places disp32 correctly whatever immediate follows
  it. A target more than ±2 GiB from T raises :class:`RelocationError`; no scratch
  register is used.
* Relative branches (jmp, jcc, loop family, jrcxz/jecxz) are retargeted with iced-x86's
  ``BlockEncoder``. It promotes short branches to near ones, and the loop family keeps
  its semantics exactly through the ``loopX 1f; jmp short 2f; 1: jmp target; 2:``
  expansion. A target out of rel32 reach from T gets an absolute ``jmp qword [rip+0]``
  followed by the 8-byte target, behind an inverted jcc or the same loop expansion.
  A branch to another instruction of the window goes to that instruction's relocated
  copy, because the original bytes at A+1..A+len-1 are overwritten. A branch to A
  itself stays at A. The jump written at A is always valid, and going through it
  counts the new execution of A like any other entry into A.
* Calls push the *original* return address, so unwinders, ``__builtin_return_address``
  and exceptions never see a trampoline address, and nothing ever returns into a
  trampoline that may since have been freed. The call is then replaced by a ``jmp``
  with the same operand. No register and no flag changes, and the only memory written
  is the return-address slot at [rsp-8], exactly as a real call writes it. Such calls
  bypass a CET shadow stack, so a process running with user shadow stacks enabled
  faults at the callee's ``ret``. The caller must check for that.

Instructions that save their own next address keep saving the trampoline's: ``syscall``
(rcx, which the syscall ABI clobbers anyway) and ``int n`` (the interrupt frame). A
fault inside the window reports a trampoline RIP to the signal handler. These are
accepted. ``int3``, ``int1``, ``xbegin`` and far calls are refused.

iced-x86's Python ``BlockEncoder`` does not report where each instruction ended up.
:func:`relocate` therefore encodes one instruction at a time, at its final address, and
iterates until the layout is stable (see :func:`relocate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import iced_x86
from iced_x86 import Code, FlowControl, Register

__all__ = ["Relocated", "RelocationError", "Window", "decode_window", "relocate"]

_U64 = (1 << 64) - 1

# Legacy prefixes (Intel SDM Vol. 2A §2.1.1). REX and VEX come after them.
_LEGACY_PREFIXES = frozenset(b"\xf0\xf2\xf3\x2e\x36\x3e\x26\x64\x65\x66\x67")

# Multi-byte NOPs recommended by the Intel SDM (Vol. 2B, NOP), used only as padding.
_NOPS = (
    b"",
    b"\x90",
    b"\x66\x90",
    b"\x0f\x1f\x00",
    b"\x0f\x1f\x40\x00",
    b"\x0f\x1f\x44\x00\x00",
    b"\x66\x0f\x1f\x44\x00\x00",
    b"\x0f\x1f\x80\x00\x00\x00\x00",
    b"\x0f\x1f\x84\x00\x00\x00\x00\x00",
    b"\x66\x0f\x1f\x84\x00\x00\x00\x00\x00",
)

_LEA_RSP_MINUS_8 = b"\x48\x8d\x64\x24\xf8"  # lea rsp,[rsp-8]: moves rsp, leaves flags alone

_MAX_PASSES = 64

# jmp qword [rip+0], followed by the 8-byte target: no register, no flag, no stack.
_ABS_JMP = b"\xff\x25\x00\x00\x00\x00"
# A relative branch within this distance of its own start always fits rel32, whichever
# form (short, near, loop expansion) the encoder picks.
_NEAR_REACH = (1 << 31) - 64


def _formatter() -> iced_x86.Formatter:
    fmt = iced_x86.Formatter(iced_x86.FormatterSyntax.INTEL)
    fmt.hex_prefix = "0x"
    fmt.hex_suffix = ""
    fmt.uppercase_hex = False
    fmt.show_branch_size = False
    fmt.branch_leading_zeros = False
    fmt.leading_zeros = False
    return fmt


_FORMATTER = _formatter()


def _text(instr: iced_x86.Instruction) -> str:
    return _FORMATTER.format(instr)


class RelocationError(ValueError):
    """An instruction that cannot be moved out of line.

    The message names the instruction's address and text, for example
    ``0x401234: cannot relocate 'xbegin 0x401240': ...``.
    """

    def __init__(self, address: int, instruction: str, reason: str) -> None:
        super().__init__(address, instruction, reason)
        self.address = address
        self.instruction = instruction
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.address:#x}: cannot relocate {self.instruction!r}: {self.reason}"


@dataclass(frozen=True)
class Window:
    """The instructions covered by a jump written at ``address``.

    ``code`` holds the original bytes of the window, so that :func:`relocate` can copy
    ordinary instructions byte for byte. When it is empty (a hand-built window),
    :func:`relocate` re-encodes those instructions with iced-x86 instead.
    """

    address: int
    instructions: tuple[iced_x86.Instruction, ...]
    length: int
    starts: tuple[int, ...]
    code: bytes = field(default=b"", repr=False)

    def raw(self, index: int) -> bytes:
        """The original bytes of instruction ``index``, or ``b""`` if unknown."""
        if len(self.code) < self.length:
            return b""
        start = self.starts[index]
        return self.code[start : start + self.instructions[index].len]


@dataclass(frozen=True)
class Relocated:
    """Relocated instructions, encoded to run at ``address``.

    ``starts`` maps each original instruction address of the window to the address of
    its relocated copy. When ``falls_through`` is true, the caller must append a jump to
    ``window.address + window.length``.
    """

    code: bytes
    address: int
    starts: dict[int, int]
    falls_through: bool


def _legacy_prefixes(raw: bytes) -> bytes:
    n = 0
    while n < len(raw) and raw[n] in _LEGACY_PREFIXES:
        n += 1
    return raw[:n]


def _is_relative_branch(instr: iced_x86.Instruction) -> bool:
    return (
        instr.is_jmp_short_or_near
        or instr.is_jcc_short_or_near
        or instr.is_loop
        or instr.is_loopcc
        or instr.is_jcx_short
    )


def _check(instr: iced_x86.Instruction, raw: bytes) -> None:
    """Raise RelocationError if ``instr`` cannot run correctly away from its address."""

    def fail(reason: str) -> None:
        raise RelocationError(instr.ip, _text(instr), reason)

    code = instr.code
    if code == Code.INT3:
        fail("int3 is already there (another debugger's breakpoint, or padding)")
    if code == Code.INT1:
        fail("int1/icebp is a debug trap")
    if code in (Code.XBEGIN_REL16, Code.XBEGIN_REL32):
        # A transaction aborting inside the trampoline would resume at the relocated
        # fallback, but aborts may also happen after the jump back, in original code.
        fail("xbegin's abort address is relative to the instruction")
    if instr.is_call_far or instr.is_call_far_indirect:
        fail("a far call pushes the trampoline's return address")
    if instr.is_jkcc_short_or_near:
        fail("Knights Corner branches are not supported")
    reencoded = (
        _is_relative_branch(instr)
        or instr.is_call_near
        or instr.is_call_near_indirect
        or (instr.is_jmp_near_indirect and instr.is_ip_rel_memory_operand)
    )
    if reencoded and 0x66 in _legacy_prefixes(raw):
        # Intel CPUs ignore 0x66 on near branches in 64-bit mode; AMD CPUs truncate the
        # target to 16 bits (AMD APM Vol. 3). Re-encoding cannot keep that ambiguity.
        fail("operand-size prefix on a near branch means different things on Intel and AMD")
    if instr.is_call_near_indirect and instr.op0_kind == iced_x86.OpKind.REGISTER:
        if instr.op0_register == Register.RSP:
            fail("call rsp cannot be turned into push + jmp without a scratch register")
    if instr.is_call_near_indirect and instr.op0_kind == iced_x86.OpKind.MEMORY:
        base, index = instr.memory_base, instr.memory_index
        if base in (Register.RSP, Register.ESP) and index == Register.NONE:
            displ = instr.memory_displacement
            displ = displ - (1 << 64) if displ >> 63 else displ
            if base == Register.ESP:
                displ = ((displ & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000
            if -15 <= displ <= -1:
                # The pointer overlaps the return-address slot, which push + jmp would
                # overwrite before the jmp reads it.
                fail("the call's pointer overlaps its own return-address slot")


def decode_window(code: bytes, address: int, min_len: int = 5) -> Window:
    """Decode the instructions at ``address`` until at least ``min_len`` bytes are covered.

    ``code`` holds the bytes at ``address``; at least ``min_len + 15`` bytes should be
    passed when available. Raises RelocationError for undecodable bytes, for code too
    short to cover ``min_len`` bytes, and for instructions that cannot be moved out of
    line (int3, int1, xbegin, far calls, ...).
    """
    decoder = iced_x86.Decoder(64, code, ip=address)
    instructions: list[iced_x86.Instruction] = []
    starts: list[int] = []
    offset = 0
    while offset < min_len:
        if offset >= len(code):
            raise RelocationError(
                address + offset,
                "(end of code)",
                f"only {len(code)} bytes of code, {min_len} needed",
            )
        instr = decoder.decode()
        if instr.code == Code.INVALID:
            raw = code[offset : offset + 15]
            if decoder.last_error == iced_x86.DecoderError.NO_MORE_BYTES:
                reason = f"instruction runs past the {len(code)} bytes of code given"
            else:
                reason = "not a valid x86-64 instruction"
            raise RelocationError(address + offset, raw.hex(" "), reason)
        _check(instr, code[offset : offset + instr.len])
        instructions.append(instr)
        starts.append(offset)
        offset += instr.len
    return Window(
        address=address,
        instructions=tuple(instructions),
        length=offset,
        starts=tuple(starts),
        code=bytes(code[:offset]),
    )


def _push_imm64(value: int) -> bytes:
    """Code storing ``value`` as a call would push it: no flags, no scratch register."""
    if value < 0x8000_0000 or value >= (1 << 64) - 0x8000_0000:
        # push imm32 sign-extends to 64 bits (Intel SDM Vol. 2B, PUSH).
        return b"\x68" + (value & 0xFFFFFFFF).to_bytes(4, "little")
    lo, hi = value & 0xFFFFFFFF, value >> 32
    return (
        _LEA_RSP_MINUS_8
        + b"\xc7\x04\x24"  # mov dword [rsp], lo
        + lo.to_bytes(4, "little")
        + b"\xc7\x44\x24\x04"  # mov dword [rsp+4], hi
        + hi.to_bytes(4, "little")
    )


def _nops(n: int) -> bytes:
    out = b""
    while n > 0:
        chunk = min(n, len(_NOPS) - 1)
        out += _NOPS[chunk]
        n -= chunk
    return out


# One step of a relocation plan: fixed bytes, or an instruction re-encoded at the cursor
# (``retarget``: its near branch target is an original address to map through the window).
_Step = tuple[bytes | iced_x86.Instruction, bool]


def _plan(window: Window, index: int) -> list[_Step]:
    """The steps that reproduce instruction ``index`` of ``window`` out of line."""
    instr = window.instructions[index]
    raw = window.raw(index)
    _check(instr, raw)
    if instr.is_call_near:
        jmp = iced_x86.Instruction.create_branch(Code.JMP_REL32_64, instr.near_branch_target)
        return [(_push_imm64(instr.next_ip), False), (jmp, True)]
    if instr.is_call_near_indirect:
        jmp = instr.copy()
        jmp.code = Code.JMP_RM64
        if jmp.op0_kind == iced_x86.OpKind.MEMORY and jmp.memory_base in (
            Register.RSP,
            Register.ESP,
        ):
            # The pushed return address moved rsp down by 8 before the jmp reads memory.
            if jmp.memory_base == Register.ESP:
                displ = (jmp.memory_displacement + 8) & 0xFFFFFFFF
            else:
                displ = (jmp.memory_displacement + 8) & _U64
                signed = displ - (1 << 64) if displ >> 63 else displ
                if not -0x8000_0000 <= signed < 0x8000_0000:
                    raise RelocationError(instr.ip, _text(instr), "rsp displacement overflows")
            jmp.memory_displacement = displ
            # displ_size 0 means "no displacement"; 1 lets the encoder pick disp8 or disp32.
            jmp.memory_displ_size = max(jmp.memory_displ_size, 1)
        return [(_push_imm64(instr.next_ip), False), (jmp, False)]
    if _is_relative_branch(instr):
        return [(instr.copy(), True)]
    if instr.is_ip_rel_memory_operand or not raw:
        return [(instr.copy(), False)]
    return [(raw, False)]


def _block_encode(instr: iced_x86.Instruction, rip: int) -> bytes:
    # BlockEncoder treats an instruction's ip as its label: a branch whose target equals
    # some ip in the block goes to that instruction's new location. Giving the
    # instruction its real new address keeps that from capturing a target by accident.
    instr.ip = rip
    encoder = iced_x86.BlockEncoder(64)
    encoder.add(instr)
    return encoder.encode(rip)


def _short(instr: iced_x86.Instruction, rip: int, skip: int) -> bytes:
    """``instr`` (a jcc, loopX or jrcxz) at ``rip`` as a rel8 branch over ``skip`` bytes."""
    instr.as_short_branch()
    encoder = iced_x86.Encoder(64)
    instr.near_branch64 = rip
    size = encoder.encode(instr, rip)  # prefixes included; rel8 counts from the end
    encoder.take_buffer()
    instr.near_branch64 = rip + size + skip
    encoder.encode(instr, rip)
    return encoder.take_buffer()


def _encode(instr: iced_x86.Instruction, rip: int) -> bytes:
    """``instr`` encoded at ``rip``: branches retargeted, RIP-relative operands fixed."""
    if not _is_relative_branch(instr):
        return _block_encode(instr, rip)
    target = instr.near_branch_target
    if -_NEAR_REACH <= target - rip <= _NEAR_REACH:
        return _block_encode(instr, rip)
    # Out of rel32 reach. iced-x86's BlockEncoder would switch to ``jmp [rip+x]`` too,
    # but it puts the 8-byte target after the *last instruction of the block*, padded
    # with int3: with one instruction per block, that is exactly where a jcc or loop
    # that is not taken continues. These sequences keep the pointer inside the code
    # path, behind the absolute jump.
    absolute = _ABS_JMP + (target & _U64).to_bytes(8, "little")
    if instr.is_jmp_short_or_near:
        return absolute
    if instr.is_jcc_short_or_near:
        instr.negate_condition_code()
        return _short(instr, rip, len(absolute)) + absolute
    # loopX/jrcxz have only a rel8 form: loopX 1f; jmp short 2f; 1: jmp [rip+0]; .quad; 2:
    over = b"\xeb" + len(absolute).to_bytes(1, "little")
    return _short(instr, rip, len(over)) + over + absolute


def _falls_through(instr: iced_x86.Instruction) -> bool:
    return instr.flow_control not in (
        FlowControl.UNCONDITIONAL_BRANCH,
        FlowControl.INDIRECT_BRANCH,
        FlowControl.RETURN,
    )


def relocate(window: Window, address: int) -> Relocated:
    """Encode the instructions of ``window`` to run at ``address``.

    The caller guarantees that ``address`` is within ±2 GiB of ``window.address``. A
    RIP-relative data operand that is still out of reach raises RelocationError.
    Branches out of rel32 reach become absolute jumps.

    Each instruction is encoded at its final address, by itself, with
    ``iced_x86.BlockEncoder(64)``. Targets inside the window are resolved through the
    layout of the previous pass, repeated until the layout stops changing. An encoding
    never shrinks from one pass to the next: a shorter one is padded with NOPs. The
    layout therefore only grows and the iteration terminates.
    """
    if len(window.instructions) != len(window.starts) or not window.instructions:
        raise ValueError("window.instructions and window.starts must be non-empty and match")
    end = window.address + window.length
    original = [window.address + s for s in window.starts]
    index_of = {a: k for k, a in enumerate(original)}
    plans = [_plan(window, k) for k in range(len(original))]

    def resolve(target: int, instr: iced_x86.Instruction, layout: list[int]) -> int:
        if target == window.address or not window.address < target < end:
            return target
        k = index_of.get(target)
        if k is None:
            raise RelocationError(
                instr.ip, _text(instr), "branch into the middle of an instruction of the window"
            )
        return layout[k]

    # First guess: every instruction keeps its size. Later passes use the actual layout.
    layout = [address + s for s in window.starts]
    sizes = [0] * len(plans)
    for _ in range(_MAX_PASSES):
        chunks: list[bytes] = []
        new_layout: list[int] = []
        cursor = address
        for k, plan in enumerate(plans):
            new_layout.append(cursor)
            blob = b""
            for item, retarget in plan:
                if isinstance(item, bytes):
                    blob += item
                    continue
                instr = item.copy()
                if retarget:
                    instr.near_branch64 = resolve(
                        instr.near_branch_target, window.instructions[k], layout
                    )
                try:
                    blob += _encode(instr, cursor + len(blob))
                except ValueError as exc:
                    orig = window.instructions[k]
                    raise RelocationError(orig.ip, _text(orig), str(exc)) from exc
            if len(blob) < sizes[k]:
                blob += _nops(sizes[k] - len(blob))
            sizes[k] = len(blob)
            chunks.append(blob)
            cursor += len(blob)
        if new_layout == layout:
            return Relocated(
                code=b"".join(chunks),
                address=address,
                starts=dict(zip(original, layout, strict=True)),
                falls_through=_falls_through(window.instructions[-1]),
            )
        layout = new_layout
    raise RuntimeError(f"relocation of the window at {window.address:#x} did not converge")
