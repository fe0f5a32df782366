"""Relocation of tracepoint windows, checked by differential emulation with unicorn.

Each window runs twice from the same random registers, flags and memory: the original
bytes at A until execution leaves the window, and the relocated bytes at T (plus a
``jmp A+len`` marker) until execution leaves the trampoline. Both runs must end with the
same GPRs, XMM registers, rflags, RIP and memory. The relocated run sees 0xCC over the
original window, so any jump back into it shows up as a different final RIP.
"""

from __future__ import annotations

import pickle
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import iced_x86
import pytest
from iced_x86 import Code, MemoryOperand, Register

unicorn = pytest.importorskip("unicorn")
from unicorn import x86_const as ux  # noqa: E402 (after the importorskip)

from hwtrace.probes.relocate import (  # noqa: E402
    Relocated,
    RelocationError,
    Window,
    decode_window,
    relocate,
)

A = 0x5555_5555_4000  # a PIE-like address, above 4 GiB
A_LOW = 0x40_1000  # a non-PIE address, below 2 GiB
# The only trampoline address five 1-byte instructions allow (about -819 MiB), and +1 GiB.
T_NEG = -858_993_460 + 5
T_POS = 0x4000_0123
CODE_SPAN = 0x10000  # mapped on each side of A, random bytes
LANDING = 0x3000  # offset from A of an address outside the window that branches go to
FAR = 0x7000_0000  # +1.75 GiB: out of rel32 reach from A + T_NEG
STACK = 0x7FFF_F7FF_0000
STACK_SIZE = 0x10000
PAGE = 0x1000
ARITH_FLAGS = 0x8D5  # CF PF AF ZF SF OF
ZF = 0x40

GPRS = {
    "rax": ux.UC_X86_REG_RAX,
    "rbx": ux.UC_X86_REG_RBX,
    "rcx": ux.UC_X86_REG_RCX,
    "rdx": ux.UC_X86_REG_RDX,
    "rsi": ux.UC_X86_REG_RSI,
    "rdi": ux.UC_X86_REG_RDI,
    "rbp": ux.UC_X86_REG_RBP,
    "rsp": ux.UC_X86_REG_RSP,
    "r8": ux.UC_X86_REG_R8,
    "r9": ux.UC_X86_REG_R9,
    "r10": ux.UC_X86_REG_R10,
    "r11": ux.UC_X86_REG_R11,
    "r12": ux.UC_X86_REG_R12,
    "r13": ux.UC_X86_REG_R13,
    "r14": ux.UC_X86_REG_R14,
    "r15": ux.UC_X86_REG_R15,
}
XMMS = [getattr(ux, f"UC_X86_REG_XMM{i}") for i in range(16)]


def rel32(next_ip: int, target: int) -> bytes:
    return struct.pack("<i", target - next_ip)


def q(value: int) -> bytes:
    return struct.pack("<Q", value & (1 << 64) - 1)


ENC = iced_x86.Encoder(64)
FMT = iced_x86.Formatter(iced_x86.FormatterSyntax.INTEL)


def asm(instr: iced_x86.Instruction, ip: int) -> bytes:
    ENC.encode(instr, ip)
    return ENC.take_buffer()


# --- the emulation harness ------------------------------------------------------------


@dataclass
class Setup:
    """Initial state shared by both runs (A-relative values already resolved)."""

    regs: dict[str, int]
    xmm: list[int]
    rflags: int
    memory: dict[int, bytearray]  # page-aligned region start -> contents


@dataclass
class Final:
    regs: dict[str, int]
    xmm: list[int]
    rflags: int
    rip: int
    memory: dict[int, bytes]


def _pages_around(address: int) -> set[int]:
    page = address & ~(PAGE - 1)
    return {page - PAGE, page, page + PAGE}


def _regions(pages: set[int]) -> list[tuple[int, int]]:
    """Runs of consecutive pages, as (start, size)."""
    out: list[tuple[int, int]] = []
    for page in sorted(pages):
        if out and out[-1][0] + out[-1][1] == page:
            out[-1] = (out[-1][0], out[-1][1] + PAGE)
        else:
            out.append((page, PAGE))
    return out


def make_setup(
    rng: random.Random,
    window: Window,
    extra_pages: set[int],
    regs: dict[str, int],
    rflags: int | None,
) -> Setup:
    a = window.address
    pages = {p for p in range(a - CODE_SPAN, a + CODE_SPAN, PAGE)}
    pages |= set(range(STACK, STACK + STACK_SIZE, PAGE))
    for instr in window.instructions:
        if instr.is_ip_rel_memory_operand:
            pages |= _pages_around(instr.ip_rel_memory_address)
    pages |= extra_pages
    memory = {start: bytearray(rng.randbytes(size)) for start, size in _regions(pages)}
    values = {name: rng.getrandbits(64) for name in GPRS}
    values["rsp"] = STACK + STACK_SIZE // 2 + 8 * rng.randrange(-16, 16)
    values.update(regs)
    if rflags is None:
        rflags = 0x2 | (rng.getrandbits(12) & ARITH_FLAGS)
    return Setup(values, [rng.getrandbits(128) for _ in XMMS], rflags, memory)


def poke(setup: Setup, address: int, data: bytes) -> None:
    for start, buf in setup.memory.items():
        if start <= address and address + len(data) <= start + len(buf):
            buf[address - start : address - start + len(data)] = data
            return
    raise AssertionError(f"{address:#x} is not mapped")


def emulate(
    setup: Setup, code: dict[int, bytes], start: int, inside: Callable[[int], bool]
) -> Final:
    """Run from ``start`` until an instruction at an address where ``inside`` is false."""
    uc = unicorn.Uc(unicorn.UC_ARCH_X86, unicorn.UC_MODE_64)
    pages: set[int] = set()
    for address, blob in code.items():
        first = address & ~(PAGE - 1)
        pages |= set(range(first, address + len(blob) + PAGE, PAGE))
    pages -= {p for s, b in setup.memory.items() for p in range(s, s + len(b), PAGE)}
    for s, size in _regions(pages):
        uc.mem_map(s, size)
    for s, buf in setup.memory.items():
        uc.mem_map(s, len(buf))
        uc.mem_write(s, bytes(buf))
    for address, blob in code.items():
        uc.mem_write(address, blob)
    for name, value in setup.regs.items():
        uc.reg_write(GPRS[name], value)
    for reg, value in zip(XMMS, setup.xmm, strict=True):
        uc.reg_write(reg, value)
    uc.reg_write(ux.UC_X86_REG_EFLAGS, setup.rflags)
    steps = [0]

    def hook(uc, address, size, _):
        # Stopping from a code hook leaves RIP at the instruction not executed.
        if steps[0] and not inside(address):
            uc.emu_stop()
        steps[0] += 1

    uc.hook_add(unicorn.UC_HOOK_CODE, hook)
    uc.emu_start(start, -1, count=5000)
    return Final(
        {name: uc.reg_read(reg) for name, reg in GPRS.items()},
        [uc.reg_read(reg) for reg in XMMS],
        uc.reg_read(ux.UC_X86_REG_EFLAGS),
        uc.reg_read(ux.UC_X86_REG_RIP),
        {s: bytes(uc.mem_read(s, len(b))) for s, b in setup.memory.items()},
    )


def jmp_to(ip: int, target: int) -> bytes:
    encoder = iced_x86.BlockEncoder(64)
    jmp = iced_x86.Instruction.create_branch(Code.JMP_REL32_64, target)
    jmp.ip = ip
    encoder.add(jmp)
    return encoder.encode(ip)


def differential(
    window: Window,
    tramp: int,
    setup: Setup,
) -> tuple[Relocated, Final, Final]:
    """Run the original window and its relocation at ``tramp``; assert equal outcomes."""
    a, end = window.address, window.address + window.length
    reloc = relocate(window, tramp)
    assert reloc.address == tramp
    assert set(reloc.starts) == {a + s for s in window.starts}
    assert reloc.starts[a] == tramp
    body = reloc.code
    if reloc.falls_through:
        body += jmp_to(tramp + len(body), end)
    # The original run stops when it leaves the window, or comes back to A (the
    # relocated code jumps to A itself then, to go through the tracepoint again).
    orig = emulate(setup, {a: window.code}, a, lambda x: a < x < end)
    moved = emulate(
        setup,
        {a: b"\xcc" * window.length, tramp: body},
        tramp,
        lambda x: tramp <= x < tramp + len(body),
    )
    assert not a < orig.rip < end, "the original run did not leave the window"
    assert moved.rip == orig.rip, f"RIP {moved.rip:#x} != {orig.rip:#x}"
    assert moved.regs == orig.regs
    assert moved.xmm == orig.xmm
    assert moved.rflags == orig.rflags, f"rflags {moved.rflags:#x} != {orig.rflags:#x}"
    for start in setup.memory:
        got, want = bytearray(moved.memory[start]), bytearray(orig.memory[start])
        if start <= a < start + len(got):
            # The window itself holds different bytes in the two runs by design.
            lo = a - start
            got[lo : lo + window.length] = want[lo : lo + window.length]
        assert got == want, f"memory differs in the region at {start:#x}"
    return reloc, orig, moved


# --- hand-written cases ---------------------------------------------------------------


@dataclass
class Case:
    """A window at ``base`` (A unless told); ``build(base)`` gives its bytes."""

    name: str
    build: Callable[[int], bytes]
    regs: dict[str, int] = field(default_factory=dict)
    rflags: int | None = None
    stack: dict[int, int] = field(default_factory=dict)  # rsp offset -> qword (A-relative)
    rip_pointer: int | None = None  # qword (A-relative) stored at each RIP-relative target
    base: int = A
    trampolines: tuple[int, ...] = (T_NEG, T_POS)
    far_pages: tuple[int, ...] = ()  # A-relative addresses to map (far branch targets)
    falls_through: bool = True
    length: int | None = None


def fixed(hexbytes: str) -> Callable[[int], bytes]:
    data = bytes.fromhex(hexbytes)
    return lambda base: data


def flags(zf: bool) -> int:
    return 0x2 | (ZF if zf else 0)


CASES: list[Case] = [
    Case("endbr64", fixed("f30f1efa 55"), length=5),
    Case("push rbp; mov rbp,rsp; sub rsp,16", fixed("55 4889e5 4883ec10"), length=8),
    Case("straddle: add rax,1 (4) + add ebx,imm32 (6)", fixed("4883c001 81c344332211"), length=10),
    Case("five 1-byte instructions", fixed("55 53 f9 9c 5b"), length=5),
    Case("nop5", fixed("0f1f440000"), length=5),
    Case("red-zone store mov [rsp-8],rax", fixed("48894424f8"), length=5),
    Case("push imm8; pop rax", fixed("6a7f 58 90 90"), length=5),
]
for taken in (False, True):
    CASES += [
        Case(f"je inside window, taken={taken}", fixed("7401 90 90 90 90"), rflags=flags(taken)),
        Case(f"jne outside window, taken={taken}", fixed("7510 90 90 90"), rflags=flags(not taken)),
        Case(f"je rel8 to window end, taken={taken}", fixed("7403 90 90 90"), rflags=flags(taken)),
        Case(
            f"je rel32 far, taken={taken}",
            lambda b: b"\x0f\x84" + rel32(b + 6, b + FAR),
            rflags=flags(taken),
            far_pages=(FAR,),
        ),
    ]
CASES += [
    Case("jmp rel8 inside window", fixed("eb01 90 90 90 90"), falls_through=True),
    Case("jmp rel8 outside window", fixed("90 90 90 eb20"), falls_through=False),
    Case(
        "jmp rel32 outside",
        lambda b: b"\x90\xe9" + rel32(b + 6, b + LANDING),
        length=6,
        falls_through=False,
    ),
    Case(
        "jmp rel32 out of reach of T_NEG",
        lambda b: b"\xe9" + rel32(b + 5, b + FAR),
        far_pages=(FAR,),
        falls_through=False,
    ),
    Case("backward jnz to A (dec ecx; jnz A)", fixed("ffc9 75fc 90"), regs={"rcx": 3}),
    Case("backward jnz inside (nop; dec ecx; jnz)", fixed("90 ffc9 75fc 90"), regs={"rcx": 3}),
    Case("jmp $ at A", fixed("ebfe 90 90 90"), falls_through=True),
    Case("call rel32", lambda b: b"\xe8" + rel32(b + 5, b + LANDING)),
    Case(
        "call rel32 below 2 GiB (push imm32)",
        lambda b: b"\xe8" + rel32(b + 5, b + LANDING),
        base=A_LOW,
        trampolines=(0x1000_0000,),
    ),
    Case("call rel32 far", lambda b: b"\xe8" + rel32(b + 5, b + FAR), far_pages=(FAR,)),
    Case("call $+5 (get PC)", fixed("e800000000"), length=5),
    Case("call back to A", fixed("90 e8faffffff"), length=6),
    Case("call rax", fixed("ffd0 90 90 90"), regs={"rax": A + LANDING}),
    Case("call qword [rsp+8]", fixed("ff542408 90"), stack={8: LANDING}),
    Case("call qword [rsp]", fixed("ff1424 90 90"), stack={0: LANDING}),
    Case(
        "call qword [rsp+0x7c] (disp8 becomes disp32)", fixed("ff54247c 90"), stack={0x7C: LANDING}
    ),
    Case("call qword [rsp+rbx*8]", fixed("ff14dc 90 90"), regs={"rbx": 2}, stack={16: LANDING}),
    Case(
        "call qword [rip+x]",
        lambda b: b"\xff\x15" + rel32(b + 6, b + 0x2000),
        rip_pointer=LANDING,
    ),
    Case(
        "jmp qword [rip+x]",
        lambda b: b"\xff\x25" + rel32(b + 6, b - 0x2008),
        rip_pointer=LANDING,
        falls_through=False,
    ),
    Case("ret after pop rbp", fixed("4889f8 5d c3"), stack={8: LANDING}, falls_through=False),
    Case("ret imm16", fixed("90 90 c21000"), stack={0: LANDING}, falls_through=False),
    Case("lea rax,[rip+x]", lambda b: b"\x48\x8d\x05" + rel32(b + 7, b + 0x1234)),
    Case("mov rax,[rip+x]", lambda b: b"\x48\x8b\x05" + rel32(b + 7, b - 0x1234)),
    Case("mov [rip+x],rbx", lambda b: b"\x48\x89\x1d" + rel32(b + 7, b + 0x2345)),
    Case(
        "mov rax,[rip+x] 512 MiB away",
        lambda b: b"\x48\x8b\x05" + rel32(b + 7, b - 0x2000_0000),
    ),
    Case("cmp qword [rip+x],imm8", lambda b: b"\x48\x83\x3d" + rel32(b + 8, b + 0x100) + b"\x05"),
    Case(
        "cmp dword [rip+x],imm32",
        lambda b: b"\x81\x3d" + rel32(b + 10, b + 0x108) + b"\x44\x33\x22\x11",
    ),
    Case("cmp byte [rip+x],imm8", lambda b: b"\x80\x3d" + rel32(b + 7, b + 0x110) + b"\x80"),
    Case("add qword [rip+x],imm8", lambda b: b"\x48\x83\x05" + rel32(b + 8, b + 0x118) + b"\x7f"),
    Case(
        "add qword [rip+x],imm32",
        lambda b: b"\x48\x81\x05" + rel32(b + 11, b + 0x120) + b"\x78\x56\x34\x12",
    ),
    Case(
        "mov word [rip+x],imm16",
        lambda b: b"\x66\xc7\x05" + rel32(b + 9, b + 0x130) + b"\x34\x12",
    ),
    Case("movaps xmm1,[rip+x]", lambda b: b"\x0f\x28\x0d" + rel32(b + 7, b + 0x1000)),
    Case("movq xmm9,[rip+x]", lambda b: b"\xf3\x44\x0f\x7e\x0d" + rel32(b + 9, b + 0x1008)),
    Case("push qword [rip+x]", lambda b: b"\xff\x35" + rel32(b + 6, b + 0x140)),
    Case("pop qword [rip+x]", lambda b: b"\x8f\x05" + rel32(b + 6, b + 0x148)),
    Case("eip-relative mov eax,[eip+x]", lambda b: b"\x67\x8b\x05" + rel32(b + 7, b + 0x150)),
]

# The loop family, with rcx 0/1/5, ZF both ways, a target inside and one outside.
LOOPS = {"loop": "e2", "loopz": "e1", "loopnz": "e0", "jrcxz": "e3", "jecxz": "67e3"}
for mnemonic, opcode in LOOPS.items():
    for where, rel in (("inside", 1), ("outside", 0x20)):
        for rcx in (0, 1, 5):
            for zf in (False, True):
                CASES.append(
                    Case(
                        f"{mnemonic} {where}, rcx={rcx}, ZF={int(zf)}",
                        fixed(f"{opcode} {rel:02x} 90 90 90"),
                        regs={"rcx": rcx},
                        rflags=flags(zf),
                    )
                )
for rcx in (1, 5):
    CASES.append(Case(f"loop $ (to itself), rcx={rcx}", fixed("90 e2fe 90 90"), regs={"rcx": rcx}))
# A trampoline at the far end of the jump's reach: the branch targets past the window are
# out of rel32 reach from there, so each becomes an absolute jmp qword [rip+0].
T_EDGE = 5 - (1 << 31)
for mnemonic, opcode in {**LOOPS, "je": "74", "jmp": "eb"}.items():
    for rcx in (0, 1, 5):
        for zf in (False, True):
            CASES.append(
                Case(
                    f"{mnemonic} out of reach, rcx={rcx}, ZF={int(zf)}",
                    fixed(f"{opcode} 20 90 90 90"),
                    regs={"rcx": rcx},
                    rflags=flags(zf),
                    trampolines=(T_EDGE,),
                )
            )


def prepare(case: Case, rng: random.Random) -> tuple[Window, Setup]:
    base = case.base
    code = case.build(base)
    window = decode_window(code + b"\x90" * 15, base)
    extra = {p for off in (LANDING, *case.far_pages) for p in _pages_around(base + off)}
    setup = make_setup(rng, window, extra, dict(case.regs), case.rflags)
    rsp = setup.regs["rsp"]
    for off, value in case.stack.items():
        poke(setup, rsp + off, q(base + value))
    if case.rip_pointer is not None:
        for instr in window.instructions:
            if instr.is_ip_rel_memory_operand:
                poke(setup, instr.ip_rel_memory_address, q(base + case.rip_pointer))
    return window, setup


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_relocation_matches_original(case: Case) -> None:
    rng = random.Random(case.name)
    window, setup = prepare(case, rng)
    if case.length is not None:
        assert window.length == case.length
    for offset in case.trampolines:
        reloc, _, _ = differential(window, case.base + offset, setup)
        assert reloc.falls_through == case.falls_through


def test_call_pushes_original_return_address() -> None:
    for case in (c for c in CASES if c.name.startswith("call")):
        window, setup = prepare(case, random.Random(0))
        for offset in case.trampolines:
            _, _, moved = differential(window, case.base + offset, setup)
            rsp = moved.regs["rsp"]
            assert rsp == setup.regs["rsp"] - 8
            stack = moved.memory[STACK]
            pushed = struct.unpack_from("<Q", stack, rsp - STACK)[0]
            call = next(i for i in window.instructions if i.is_call_near or i.is_call_near_indirect)
            assert pushed == call.next_ip, case.name


def test_relocated_code_shape() -> None:
    # jcc rel8 is promoted to jcc rel32; loop keeps its rel8 form plus a local expansion.
    window = decode_window(bytes.fromhex("7510 909090") + b"\x90" * 15, A)
    reloc = relocate(window, A + T_NEG)
    first = iced_x86.Decoder(64, reloc.code, ip=reloc.address).decode()
    assert first.code == Code.JNE_REL32_64
    assert first.near_branch_target == A + 0x12
    window = decode_window(bytes.fromhex("e210 909090") + b"\x90" * 15, A)
    reloc = relocate(window, A + T_POS)
    decoded = list(iced_x86.Decoder(64, reloc.code, ip=reloc.address))
    assert decoded[0].code == Code.LOOP_REL8_64_RCX
    assert any(i.is_jmp_near and i.near_branch_target == A + 0x12 for i in decoded)
    # Ordinary instructions are copied byte for byte.
    window = decode_window(bytes.fromhex("66 2e 0f1f840000000000") + b"\x90" * 15, A)
    assert relocate(window, A + T_POS).code == window.code


def _rip_cases() -> dict[str, iced_x86.Instruction]:
    new = iced_x86.Instruction

    def rip(offset: int, seg: Register = Register.NONE, bcst: bool = False) -> MemoryOperand:
        return MemoryOperand(Register.RIP, displ=A + offset, is_broadcast=bcst, seg=seg)

    lock_add = new.create_mem_reg(Code.ADD_RM32_R32, rip(0x1234), Register.EAX)
    lock_add.has_lock_prefix = True
    masked = new.create_reg_reg_mem(
        Code.EVEX_VADDPS_ZMM_K1Z_ZMM_ZMMM512B32_ER, Register.ZMM1, Register.ZMM2, rip(0x40)
    )
    masked.op_mask = Register.K1
    masked.zeroing_masking = True
    return {
        "lock add [rip+x],eax": lock_add,
        "mov rax,fs:[rip+x]": new.create_reg_mem(
            Code.MOV_R64_RM64, Register.RAX, rip(0x10, Register.FS)
        ),
        "vmovdqu ymm3,[rip-x]": new.create_reg_mem(
            Code.VEX_VMOVDQU_YMM_YMMM256, Register.YMM3, rip(-0x2000)
        ),
        "vaddps zmm1{k1}{z},zmm2,[rip+x]": masked,
        "vaddps zmm1,zmm2,[rip+x]{1to16}": new.create_reg_reg_mem(
            Code.EVEX_VADDPS_ZMM_K1Z_ZMM_ZMMM512B32_ER,
            Register.ZMM1,
            Register.ZMM2,
            rip(0x44, bcst=True),
        ),
        "cmp word [rip+x],imm16": new.create_mem_i32(Code.CMP_RM16_IMM16, rip(0x80), 0x1234),
        "notrack jmp qword [rip+x]": new.create_mem(Code.JMP_RM64, rip(0x100, Register.DS)),
        "bt qword [rip+x],imm8": new.create_mem_i32(Code.BT_RM64_IMM8, rip(0x20), 5),
    }


RIP_CASES = _rip_cases()


@pytest.mark.parametrize("name", list(RIP_CASES))
def test_rip_relative_reencoding_keeps_operands(name: str) -> None:
    # Encodings unicorn cannot run (AVX-512, ...) are checked statically: same instruction,
    # same prefixes, same absolute memory address.
    code = asm(RIP_CASES[name], A)
    window = decode_window(code + b"\x90" * 15, A)
    original = window.instructions[0]
    assert original.is_ip_rel_memory_operand
    for offset in (T_NEG, T_POS):
        reloc = relocate(window, A + offset)
        moved = iced_x86.Decoder(64, reloc.code, ip=reloc.address).decode()
        assert moved.len == len(reloc.code) == len(code)
        assert moved.code == original.code
        # The formatter shows RIP-relative operands as absolute addresses, with prefixes,
        # masks, broadcasts and immediates.
        assert FMT.format(moved) == FMT.format(original)


def test_syscall_is_copied() -> None:
    window = decode_window(bytes.fromhex("0f05 4889c7") + b"\x90" * 15, A)
    assert relocate(window, A + T_POS).code == window.code


def test_long_window_converges() -> None:
    # A larger min_len (the caller may want one): a jcc over ten calls that each grow from
    # 5 to 21 bytes must become a near jcc on the second pass, and the layout settle.
    code = b"\x74\x32"  # je A+0x34: the first nop after the calls
    code += b"".join(b"\xe8" + rel32(A + 2 + 5 * (i + 1), A + LANDING) for i in range(10))
    code += b"\x90\x90"
    window = decode_window(code + b"\x90" * 15, A, min_len=len(code))
    assert window.length == 0x36
    reloc = relocate(window, A + T_NEG)
    first = iced_x86.Decoder(64, reloc.code, ip=reloc.address).decode()
    assert first.code == Code.JE_REL32_64
    assert first.near_branch_target == reloc.starts[A + 0x34]
    for zf in (False, True):
        setup = make_setup(random.Random(zf), window, _pages_around(A + LANDING), {}, flags(zf))
        differential(window, A + T_NEG, setup)


def test_internal_branch_goes_to_relocated_copy() -> None:
    window = decode_window(bytes.fromhex("7401 90 4889c3") + b"\x90" * 15, A)
    reloc = relocate(window, A + T_NEG)
    jcc = iced_x86.Decoder(64, reloc.code, ip=reloc.address).decode()
    assert jcc.near_branch_target == reloc.starts[A + 3]
    assert reloc.starts == {A: A + T_NEG, A + 2: A + T_NEG + 2, A + 3: A + T_NEG + 3}


def test_decode_window_starts_and_length() -> None:
    w = decode_window(bytes.fromhex("4883c001 81c344332211") + b"\x90" * 15, A)
    assert (w.address, w.length, w.starts) == (A, 10, (0, 4))
    assert [i.ip for i in w.instructions] == [A, A + 4]
    assert w.code == bytes.fromhex("4883c001 81c344332211")
    w = decode_window(bytes.fromhex("55 53 f9 9c 5b 90"), A)
    assert (w.length, w.starts) == (5, (0, 1, 2, 3, 4))
    w = decode_window(bytes.fromhex("0f1f440000 c3"), A)
    assert (w.length, w.starts) == (5, (0,))
    w = decode_window(bytes.fromhex("90 90 90 90 90 90 90 90"), A, min_len=8)
    assert w.length == 8
    # A short section end: exactly the window, nothing after.
    w = decode_window(bytes.fromhex("4889e5 4883ec10"), A)
    assert (w.length, w.starts) == (7, (0, 3))


def test_hand_built_window_without_bytes() -> None:
    # A Window built from instructions alone is re-encoded instead of copied.
    w = decode_window(bytes.fromhex("4889e5 4883ec10"), A)
    bare = Window(w.address, w.instructions, w.length, w.starts)
    assert relocate(bare, A + T_POS).code == relocate(w, A + T_POS).code


@pytest.mark.parametrize(
    ("hexcode", "where", "words"),
    [
        ("90 cc 90 90 90", 1, "int3"),
        ("cc 90 90 90 90", 0, "debugger"),
        ("90 f1 90 90 90", 1, "int1"),
        ("c7f8 00000000", 0, "xbegin"),
        ("90 90 c7f8 00000000", 2, "xbegin"),
        ("ff5424f8 90", 0, "return-address slot"),
        ("ffd4 90 90 90", 0, "call rsp"),
        ("66e8 00000000", 0, "Intel and AMD"),
        ("6674 00 90 90 90", 0, "Intel and AMD"),
        ("ff1c25 00100000", 0, "far call"),
        ("90 06 90 90 90", 1, "not a valid"),
        ("90 90 90", 3, "bytes of code"),
        ("90 90 48 8b", 2, "runs past"),
    ],
)
def test_decode_window_refuses(hexcode: str, where: int, words: str) -> None:
    with pytest.raises(RelocationError) as info:
        decode_window(bytes.fromhex(hexcode), A)
    message = str(info.value)
    assert message.startswith(f"{A + where:#x}: cannot relocate"), message
    assert words in message
    assert info.value.address == A + where


def test_relocate_refuses() -> None:
    # A RIP-relative operand out of ±2 GiB from the trampoline.
    code = b"\x48\x8b\x05" + rel32(A + 7, A + FAR) + b"\x90" * 15
    window = decode_window(code, A)
    relocate(window, A + T_POS)  # 0.75 GiB away: fine
    with pytest.raises(RelocationError, match=f"^{A:#x}: cannot relocate 'mov rax,"):
        relocate(window, A + T_NEG)
    # A branch into the middle of an instruction of the window.
    window = decode_window(bytes.fromhex("eb01 4883c001") + b"\x90" * 15, A)
    with pytest.raises(RelocationError, match="middle of an instruction"):
        relocate(window, A + T_POS)
    # The error pickles (it crosses process boundaries in the tracer).
    err = pickle.loads(pickle.dumps(RelocationError(A, "int3", "why")))
    assert str(err) == f"{A:#x}: cannot relocate 'int3': why"


# --- random windows -------------------------------------------------------------------

SAFE64 = [
    Register.RAX,
    Register.RBX,
    Register.RCX,
    Register.RDX,
    Register.RSI,
    Register.RDI,
    Register.RBP,
    Register.R8,
    Register.R9,
    Register.R10,
    Register.R11,
    Register.R12,
    Register.R13,
    Register.R14,
    Register.R15,
]
SAFE32 = [
    Register.EAX,
    Register.EBX,
    Register.ECX,
    Register.EDX,
    Register.ESI,
    Register.EDI,
    Register.EBP,
    Register.R8D,
    Register.R11D,
    Register.R15D,
]
RR = [
    Code.ADD_RM64_R64,
    Code.SUB_RM64_R64,
    Code.ADC_RM64_R64,
    Code.SBB_RM64_R64,
    Code.XOR_RM64_R64,
    Code.AND_RM64_R64,
    Code.OR_RM64_R64,
    Code.CMP_RM64_R64,
    Code.TEST_RM64_R64,
    Code.MOV_RM64_R64,
    Code.MOV_R64_RM64,
    Code.XCHG_RM64_R64,
    Code.IMUL_R64_RM64,
    Code.CMOVE_R64_RM64,
    Code.CMOVB_R64_RM64,
]
RI8 = [Code.ADD_RM64_IMM8, Code.SUB_RM64_IMM8, Code.CMP_RM64_IMM8, Code.SHL_RM64_IMM8]
R = [Code.INC_RM64, Code.DEC_RM64, Code.NEG_RM64, Code.NOT_RM64, Code.BSWAP_R64]
ONE_BYTE = ["90", "f8", "f9", "f5", "9c", "98", "99", "9f", "50", "53", "55"]
NOP_N = ["6690", "0f1f00", "0f1f4000", "0f1f440000", "660f1f440000", "0f1f8000000000"]
JCC = [Code.JE_REL8_64, Code.JNE_REL8_64, Code.JB_REL8_64, Code.JA_REL8_64, Code.JS_REL8_64]
JCX = [
    Code.LOOP_REL8_64_RCX,
    Code.LOOPE_REL8_64_RCX,
    Code.LOOPNE_REL8_64_RCX,
    Code.JRCXZ_REL8_64,
]


def random_item(rng: random.Random):
    """(size, builder(ip, target) -> bytes, is_forward_branch)."""
    k = rng.randrange(12)
    new = iced_x86.Instruction
    r1, r2 = rng.choice(SAFE64), rng.choice(SAFE64)
    if k == 0:
        data = bytes.fromhex(rng.choice(ONE_BYTE + NOP_N))
        return len(data), lambda ip, t: data, False
    if k == 1:
        data = asm(new.create_reg_reg(rng.choice(RR), r1, r2), 0)
        return len(data), lambda ip, t: data, False
    if k == 2:
        data = asm(new.create_reg_i32(rng.choice(RI8), r1, rng.randrange(-128, 128) & 0x3F), 0)
        return len(data), lambda ip, t: data, False
    if k == 3:
        data = asm(new.create_reg(rng.choice(R), r1), 0)
        return len(data), lambda ip, t: data, False
    if k == 4:
        data = asm(new.create_reg(Code.POP_R64, r1), 0)
        return len(data), lambda ip, t: data, False
    if k == 5:  # RIP-relative data, away from the window
        disp = rng.choice((-1, 1)) * rng.randrange(0x1000, 0x8000)
        imm = rng.getrandbits(31)
        reg32 = rng.choice(SAFE32)
        make = rng.choice(
            [
                lambda m: new.create_reg_mem(Code.MOV_R64_RM64, r1, m),
                lambda m: new.create_mem_reg(Code.MOV_RM32_R32, m, reg32),
                lambda m: new.create_reg_mem(Code.LEA_R64_M, r1, m),
                lambda m: new.create_mem_i32(Code.CMP_RM64_IMM8, m, imm & 0x7F),
                lambda m: new.create_mem_i32(Code.CMP_RM64_IMM32, m, imm),
                lambda m: new.create_mem_i32(Code.ADD_RM32_IMM32, m, imm),
                lambda m: new.create_mem_u32(Code.MOV_RM8_IMM8, m, imm & 0xFF),
                lambda m: new.create_mem(Code.INC_RM64, m),
                lambda m: new.create_reg_mem(Code.MOVZX_R32_RM8, reg32, m),
                lambda m: new.create_mem(Code.PUSH_RM64, m),
                lambda m: new.create_mem(Code.POP_RM64, m),
            ]
        )

        def build(ip, t):
            return asm(make(MemoryOperand(Register.RIP, displ=A + disp)), ip)

        return len(build(A, 0)), build, False
    if k == 6:  # stack and red zone
        m = MemoryOperand(Register.RSP, displ=8 * rng.randrange(-8, 8), displ_size=1)
        make = rng.choice([new.create_reg_mem, new.create_mem_reg])
        instr = (
            make(Code.MOV_R64_RM64, r1, m)
            if make is new.create_reg_mem
            else make(Code.MOV_RM64_R64, m, r1)
        )
        data = asm(instr, 0)
        return len(data), lambda ip, t: data, False
    if k == 7:
        return 2, lambda ip, t: asm(new.create_branch(rng.choice(JCC), t), ip), True
    if k == 8:
        return 2, lambda ip, t: asm(new.create_branch(Code.JMP_REL8_64, t), ip), True
    if k == 9:
        return 2, lambda ip, t: asm(new.create_branch(rng.choice(JCX), t), ip), True
    if k == 10:
        return 6, lambda ip, t: asm(new.create_branch(Code.JNE_REL32_64, t), ip), True
    call_target = A + LANDING + rng.randrange(0, 0x100)
    return 5, lambda ip, t: asm(new.create_branch(Code.CALL_REL32_64, call_target), ip), False


def random_window(rng: random.Random) -> bytes:
    items = []
    total = 0
    while total < 5:
        item = random_item(rng)
        items.append(item)
        total += item[0]
    starts = []
    offset = 0
    for size, _, _ in items:
        starts.append(offset)
        offset += size
    out = b""
    for start, (size, build, branch) in zip(starts, items, strict=True):
        target = 0
        if branch:
            # Forward only, so that no run loops forever: another instruction of the
            # window, its end, or somewhere after it.
            choices = [s for s in starts if s > start] + [offset, offset + rng.randrange(1, 60)]
            target = A + rng.choice(choices)
        data = build(A + start, target)
        assert len(data) == size
        out += data
    return out


@pytest.mark.parametrize("seed", range(300))
def test_random_windows(seed: int) -> None:
    rng = random.Random(seed)
    code = random_window(rng)
    window = decode_window(code + b"\x90" * 15, A)
    assert window.code == code
    extra = _pages_around(A + LANDING)
    setup = make_setup(rng, window, extra, {}, None)
    for offset in (T_NEG, T_POS):
        differential(window, A + offset, setup)
