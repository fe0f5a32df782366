"""Jump tracepoints checked in unicorn: the patched function against the original.

A 5-byte ``jmp rel32`` at a site A may cover several short instructions; each covered
instruction start at A+1..A+4 reads ``int3`` because the trampoline address is chosen
so that those rel32 bytes are 0xCC, and a trap there is redirected to the relocated
copy of that instruction (Harper-Cyr, Dagenais and Shahnejat Bushehri, "Fast &
Flexible Tracepoints in x86").  Here every instruction boundary of small hand-written
and random functions takes a tracepoint laid out by ``hwtrace.probes.plan``; the
patched code (for the hand-written ones also the two intermediate states the patching
goes through) is run from every boundary, through a caller and through jumps to each branch target, with an
``int3`` hook that applies the redirect table as the in-process SIGTRAP handler does.
Each run must end like the unpatched function run from the same registers, flags and
memory, and the hit counter must count exactly the executions of the site itself.
"""

from __future__ import annotations

import itertools
import random
import struct
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import iced_x86
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

unicorn = pytest.importorskip("unicorn")
from unicorn import x86_const as ux  # noqa: E402 (after the importorskip)

from hwtrace.image.process import Mapping  # noqa: E402
from hwtrace.probes import codegen as cg  # noqa: E402
from hwtrace.probes.alloc import (  # noqa: E402
    CHUNK_CODE,
    CHUNK_SIZE,
    REL_MAX,
    REL_MIN,
    TrampolineSpace,
    constraint,
    free_gaps,
    next_match,
)
from hwtrace.probes.plan import (  # noqa: E402
    JUMP,
    TRAP,
    Layout,
    choose_window,
    counter_address,
    data_reach,
    lay_out,
    trampoline_size,
)
from hwtrace.probes.relocate import (  # noqa: E402
    RelocationError,
    Window,
    decode_window,
    relocate,
)
from hwtrace.probes.rings import SLOT_BYTES, Geometry  # noqa: E402

PAGE = 0x1000
BASE = 0x5555_5555_4000  # a PIE text address
BASE_LOW = 0x40_1000  # a non-PIE one: calls push their return address with push imm32
CODE_SIZE = 0x2000  # functions, then the stubs, then the sentinel
STUBS = 0x800  # offset of the callers and jump stubs
SENTINEL = 0x1F00  # offset of the return address the runs stop at
DATA = 0x2000  # offset of the data the runs compare: globals, then what pointers point at
DATA_SIZE = 0x2000
HEAP = 0x3000  # offset of the area pointer arguments point into
STACK = 0x7FFF_F7FF_0000
STACK_SIZE = 0x4000
ENTRY_RSP = STACK + 0x3000 - 8  # rsp at a function's entry: 8 modulo 16, as after a call
RED_ZONE = 128
ARITH_FLAGS = 0x8D5  # CF PF AF ZF SF OF
STEP_LIMIT = 20_000
U64 = (1 << 64) - 1
RINGS = 0x6000_0000_0000  # the event rings, shared with hwtrace in a live process
RING_GEOMETRY = Geometry(buffers=4, slots=64)

# Offsets of the globals from the base (RIP-relative targets).
SYMBOLS = {"g": 0x2000, "g2": 0x2008, "g3": 0x2010, "g4": 0x2018, "fptr": 0x2020}

GPRS = {
    name: getattr(ux, f"UC_X86_REG_{name.upper()}")
    for name in ("rax rbx rcx rdx rsi rdi rbp rsp r8 r9 r10 r11 r12 r13 r14 r15".split())
}

# Where trampolines go, as rel32 lower bounds for next_match: 1 GiB below the site
# (below the ~820 MiB band that a fixed A+4 byte forces), 256 MiB above it, and the two
# ends of the ±2 GiB reach.
DISTANCES = {
    "-1GiB": -0x4000_0000,
    "+256MiB": 0x1000_0000,
    "-2GiB": REL_MIN,
    "+2GiB": REL_MAX - 0x200_0000,
}

_FMT = iced_x86.Formatter(iced_x86.FormatterSyntax.INTEL)


def disasm(code: bytes, address: int, marks: dict[int, str] | None = None) -> str:
    marks = marks or {}
    lines = []
    for ins in iced_x86.Decoder(64, code, ip=address):
        raw = code[ins.ip - address : ins.ip - address + ins.len].hex()
        lines.append(f"  {marks.get(ins.ip, ''):>3} {ins.ip:#x}: {raw:<20} {_FMT.format(ins)}")
    return "\n".join(lines)


# --- a tiny assembler for the hand-written functions --------------------------------


@dataclass(frozen=True)
class L:
    """A label."""

    name: str


@dataclass(frozen=True)
class J:
    """A relative branch or call: opcode bytes, then a rel8 (``size`` 1) or rel32."""

    op: str
    to: str
    size: int = 1


@dataclass(frozen=True)
class R:
    """A RIP-relative instruction: ``op`` bytes, disp32 to ``to``, then ``tail``."""

    op: str
    to: str
    tail: str = ""


@dataclass(frozen=True)
class D:
    """The stack depth (rsp minus the function's entry rsp) at the next instruction,
    for code the reference runs might not reach from the entry."""

    depth: int


Item = str | L | J | R | D


def _size(item: Item) -> int:
    if isinstance(item, str):
        return len(bytes.fromhex(item))
    if isinstance(item, J):
        return len(bytes.fromhex(item.op)) + item.size
    if isinstance(item, R):
        return len(bytes.fromhex(item.op)) + 4 + len(bytes.fromhex(item.tail))
    return 0


@dataclass
class Spec:
    """A program: functions (name, items) laid out from the base, 16-byte aligned."""

    name: str
    functions: list[tuple[str, list[Item]]]
    # Register values that keep every start well-defined (pointers, loop counts):
    # name -> f(rng, symbols).
    regs: dict[str, Callable[[random.Random, dict[str, int]], int]] = field(default_factory=dict)
    # Fixed contents of globals: symbol -> f(symbols).
    memory: dict[str, Callable[[dict[str, int]], bytes]] = field(default_factory=dict)
    trials: int = 2  # random states per start


@dataclass
class Program:
    spec: Spec
    base: int
    image: bytes  # CODE_SIZE bytes at base
    functions: list[tuple[str, int, int]]  # name, start, end
    boundaries: dict[int, tuple[int, int]]  # instruction start -> its function's range
    symbols: dict[str, int]
    depth: dict[int, int]  # instruction or stub start -> rsp offset from ENTRY_RSP
    starts: list[tuple[str, int]]  # (what, pc): every boundary, callers, jumps to targets

    @property
    def name(self) -> str:
        return f"{self.spec.name}@{self.base:#x}"

    def listing(self, marks: dict[int, str]) -> str:
        out = []
        for name, lo, hi in self.functions:
            out.append(f"{name}:")
            out.append(disasm(self.image[lo - self.base : hi - self.base], lo, marks))
        return "\n".join(out)


def assemble(spec: Spec, base: int) -> tuple[bytes, list[tuple[str, int, int]], dict, dict]:
    symbols = {name: base + off for name, off in SYMBOLS.items()}
    layout: list[tuple[str, int, int]] = []
    cursor = base
    for name, items in spec.functions:
        cursor = (cursor + 15) & ~15
        symbols[name] = cursor
        start = cursor
        for item in items:
            if isinstance(item, L):
                symbols[item.name] = cursor
            cursor += _size(item)
        layout.append((name, start, cursor))
    assert cursor <= base + STUBS, "the functions overlap the stubs"
    image = bytearray(b"\xcc" * CODE_SIZE)  # int3 padding: running into it fails a run
    depths: dict[int, int] = {}
    for (_, start, _), (_, items) in zip(layout, spec.functions, strict=True):
        at = start
        for item in items:
            if isinstance(item, str):
                blob = bytes.fromhex(item)
            elif isinstance(item, J):
                rel = symbols[item.to] - (at + _size(item))
                blob = bytes.fromhex(item.op) + rel.to_bytes(item.size, "little", signed=True)
            elif isinstance(item, R):
                rel = symbols[item.to] - (at + _size(item))
                blob = bytes.fromhex(item.op) + struct.pack("<i", rel) + bytes.fromhex(item.tail)
            else:
                if isinstance(item, D):
                    depths[at] = item.depth
                continue
            image[at - base : at - base + len(blob)] = blob
            at += len(blob)
    return bytes(image), layout, symbols, depths


def build(spec: Spec, base: int = BASE) -> Program:
    image, functions, symbols, depths = assemble(spec, base)
    boundaries: dict[int, tuple[int, int]] = {}
    targets: set[int] = set()  # of the functions' relative branches
    for _, lo, hi in functions:
        for ins in iced_x86.Decoder(64, image[lo - base : hi - base], ip=lo):
            assert ins.code != iced_x86.Code.INVALID, f"{spec.name}: bad bytes at {ins.ip:#x}"
            boundaries[ins.ip] = (lo, hi)
            if ins.flow_control in (
                iced_x86.FlowControl.CONDITIONAL_BRANCH,
                iced_x86.FlowControl.UNCONDITIONAL_BRANCH,
            ):
                targets.add(ins.near_branch_target)
    program = Program(spec, base, image, functions, boundaries, symbols, {}, [])
    program.depth = stack_depths(program, depths)
    # Callers (call f; xor rax, rcx; ret) and jumps to every branch target (jmp label).
    stubs = bytearray()
    at = base + STUBS
    starts = [(image_name(program, pc), pc) for pc in sorted(boundaries)]
    for name, lo, _ in functions:
        blob = b"\xe8" + struct.pack("<i", lo - (at + 5)) + b"\x48\x31\xc8\xc3"
        starts.append((f"call {name}", at))
        program.depth[at] = 0
        stubs += blob
        at += len(blob)
    for target in sorted(targets):
        if target not in boundaries or target in {lo for _, lo, _ in functions}:
            continue
        starts.append((f"jmp {image_name(program, target)}", at))
        program.depth[at] = program.depth[target]
        blob = b"\xe9" + struct.pack("<i", target - (at + 5))
        stubs += blob
        at += len(blob)
    full = bytearray(image)
    full[STUBS : STUBS + len(stubs)] = stubs
    program.image = bytes(full)
    program.starts = starts
    return program


def image_name(program: Program, pc: int) -> str:
    for name, lo, hi in program.functions:
        if lo <= pc < hi:
            return f"{name}+{pc - lo:#x}"
    return f"{pc:#x}"


# --- the emulator ---------------------------------------------------------------------


@dataclass
class Start:
    """One initial state: run from ``pc``; ``what`` names it in messages."""

    what: str
    trial: int
    pc: int
    regs: dict[str, int]
    rflags: int
    data: bytes
    stack: bytes


@dataclass
class Outcome:
    regs: dict[str, int]
    rflags: int
    rip: int
    data: bytes
    stack: bytes
    hits: Counter  # executions per address (unpatched runs)
    entries: list[dict[str, int]]  # registers at each entry into the trampoline
    traps: int  # int3 redirects taken
    counter: int | None
    error: str | None
    ring: bytes  # the event rings (event tracepoints)


def make_start(program: Program, what: str, pc: int, trial: int) -> Start:
    # A string seed is hashed with SHA-512: the same state on every run of the tests.
    rng = random.Random(f"{program.name}|{what}|{trial}")
    regs = {name: rng.getrandbits(64) for name in GPRS}
    for name, value in program.spec.regs.items():
        regs[name] = value(rng, program.symbols) & U64
    regs["rsp"] = ENTRY_RSP + program.depth[pc]
    data = bytearray(rng.randbytes(DATA_SIZE))
    for name, value in program.spec.memory.items():
        blob = value(program.symbols)
        off = program.symbols[name] - program.base - DATA
        data[off : off + len(blob)] = blob
    stack = bytearray(rng.randbytes(STACK_SIZE))
    off = ENTRY_RSP - STACK
    stack[off : off + 8] = struct.pack("<Q", program.base + SENTINEL)
    rflags = 0x2 | (rng.getrandbits(12) & ARITH_FLAGS)
    return Start(what, trial, pc, regs, rflags, bytes(data), bytes(stack))


def _page_runs(pages: set[int]) -> Iterator[tuple[int, int]]:
    run: list[int] = []
    for page in sorted(pages):
        if run and run[-1] + PAGE != page:
            yield run[0], len(run) * PAGE
            run = []
        run.append(page)
    if run:
        yield run[0], len(run) * PAGE


class Machine:
    """The program mapped once, with a tracepoint's bytes if ``layout`` is given, run
    from many starts (the code is never written while it runs)."""

    def __init__(
        self,
        program: Program,
        layout: Layout | None = None,
        patch: bytes | None = None,
        event: cg.EventSpec | None = None,
    ) -> None:
        self.program = program
        self.layout = layout
        self.event = event
        base = program.base
        uc = unicorn.Uc(unicorn.UC_ARCH_X86, unicorn.UC_MODE_64)
        pages = set(range(base, base + CODE_SIZE + DATA_SIZE, PAGE))
        pages |= set(range(STACK, STACK + STACK_SIZE, PAGE))
        if layout is not None:
            t = layout.trampoline
            pages |= set(range(t & ~(PAGE - 1), t + len(layout.code), PAGE))
            pages.add(layout.counter & ~(PAGE - 1))
        if event is not None:
            pages |= set(range(RINGS, RINGS + RING_GEOMETRY.size, PAGE))
        for start, size in _page_runs(pages):
            uc.mem_map(start, size)
        uc.mem_write(base, program.image)
        self.redirects: dict[int, int] = {}
        if layout is not None:
            uc.mem_write(layout.site, patch if patch is not None else layout.patched)
            uc.mem_write(layout.trampoline, layout.code)
            self.redirects = dict(layout.redirects)
            uc.hook_add(unicorn.UC_HOOK_CODE, self._enter, begin=t, end=t)
        else:
            first = min(lo for _, lo, _ in program.functions)
            last = max(hi for _, _, hi in program.functions)
            uc.hook_add(unicorn.UC_HOOK_CODE, self._count, begin=first, end=last - 1)
        uc.hook_add(unicorn.UC_HOOK_INTR, self._interrupt)
        self.uc = uc

    def _count(self, uc, address, size, _) -> None:
        self.hits[address] += 1

    def _enter(self, uc, address, size, _) -> None:
        self.entries.append({name: uc.reg_read(reg) for name, reg in GPRS.items()})

    def _interrupt(self, uc, number, _) -> None:
        # What the SIGTRAP handler does: look rip-1 up and continue at its destination.
        rip = uc.reg_read(ux.UC_X86_REG_RIP)
        where = self.redirects.get(rip - 1) if number == 3 else None
        if where is None:
            self.error = f"interrupt {number} at {rip - 1:#x} with no redirect"
            uc.emu_stop()
            return
        self.traps += 1
        uc.reg_write(ux.UC_X86_REG_RIP, where)

    def run(self, start: Start) -> Outcome:
        uc = self.uc
        base = self.program.base
        self.hits: Counter = Counter()
        self.entries: list[dict[str, int]] = []
        self.traps = 0
        self.error: str | None = None
        uc.mem_write(base + DATA, start.data)
        uc.mem_write(STACK, start.stack)
        if self.layout is not None:
            uc.mem_write(self.layout.counter, bytes(8))
        if self.event is not None:
            uc.mem_write(RINGS, bytes(RING_GEOMETRY.size))
        for name, value in start.regs.items():
            uc.reg_write(GPRS[name], value)
        uc.reg_write(ux.UC_X86_REG_EFLAGS, start.rflags)
        try:
            uc.emu_start(start.pc, base + SENTINEL, count=STEP_LIMIT)
        except unicorn.UcError as e:
            self.error = f"{e} at rip {uc.reg_read(ux.UC_X86_REG_RIP):#x}"
        rip = uc.reg_read(ux.UC_X86_REG_RIP)
        if self.error is None and rip != base + SENTINEL:
            self.error = f"stopped at {rip:#x} after {STEP_LIMIT} instructions"
        counter = None
        if self.layout is not None:
            counter = struct.unpack("<Q", uc.mem_read(self.layout.counter, 8))[0]
        ring = bytes(uc.mem_read(RINGS, RING_GEOMETRY.size)) if self.event else b""
        return Outcome(
            {name: uc.reg_read(reg) for name, reg in GPRS.items()},
            uc.reg_read(ux.UC_X86_REG_EFLAGS),
            rip,
            bytes(uc.mem_read(base + DATA, DATA_SIZE)),
            bytes(uc.mem_read(STACK, STACK_SIZE)),
            self.hits,
            self.entries,
            self.traps,
            counter,
            self.error,
            ring,
        )


def stack_depths(program: Program, known: dict[int, int]) -> dict[int, int]:
    """rsp - ENTRY_RSP at each instruction, from runs of each function from its entry."""
    depth = dict(known)
    uc = unicorn.Uc(unicorn.UC_ARCH_X86, unicorn.UC_MODE_64)
    base = program.base
    uc.mem_map(base, CODE_SIZE + DATA_SIZE)
    uc.mem_map(STACK, STACK_SIZE)
    uc.mem_write(base, program.image)
    seen: dict[int, int] = {}
    conflicts: list[int] = []

    def hook(uc, address, size, _):
        rsp = uc.reg_read(ux.UC_X86_REG_RSP) - ENTRY_RSP
        if seen.setdefault(address, rsp) != rsp:
            conflicts.append(address)

    for name, lo, hi in program.functions:
        seen.clear()
        h = uc.hook_add(unicorn.UC_HOOK_CODE, hook, begin=lo, end=hi - 1)
        program.depth = {lo: 0}
        for trial in range(8):
            start = make_start(program, f"depth {name}", lo, trial)
            uc.mem_write(base + DATA, start.data)
            uc.mem_write(STACK, start.stack)
            for reg, value in start.regs.items():
                uc.reg_write(GPRS[reg], value)
            uc.reg_write(ux.UC_X86_REG_EFLAGS, start.rflags)
            uc.emu_start(lo, base + SENTINEL, count=STEP_LIMIT)
            assert uc.reg_read(ux.UC_X86_REG_RIP) == base + SENTINEL, f"{name} did not return"
        uc.hook_del(h)
        for address, rsp in seen.items():
            assert depth.setdefault(address, rsp) == rsp, f"{address:#x}: depth mismatch"
    assert not conflicts, f"{program.name}: two stack depths at {conflicts[0]:#x}"
    missing = [pc for pc in program.boundaries if pc not in depth]
    assert not missing, f"{program.spec.name}: no stack depth for {[hex(a) for a in missing]}"
    return depth


# --- tracepoints at every boundary ----------------------------------------------------


@dataclass
class Case:
    """One tracepoint state to check: a layout and the bytes at its site."""

    layout: Layout
    phase: str  # "patched", or one of the states the patching goes through
    patch: bytes
    where: str  # which trampoline distance
    event: cg.EventSpec | None = None  # the trampoline writes events into rings


def frame(case: Case) -> int:
    """Bytes the trampoline's header pushes under the red zone: the flags, and the
    scratch registers of the event header."""
    return 8 * (1 + len(cg._SAVED)) if case.event else 8


FINAL = "patched"
PHASE_TRAPS = "int3 at the covered starts"
PHASE_REL = "int3 + rel32"


def _valid_trampoline(program: Program, site: int, rel: int | None) -> int | None:
    if rel is None:
        return None
    t = site + 5 + rel
    # Keep clear of the program, its stack and the null page, with room for a chunk.
    if t < 0x10000 or t + 2 * CHUNK_SIZE > 1 << 47:
        return None
    if abs(t - program.base) < 1 << 24 or abs(t - STACK) < 1 << 24:
        return None
    return t


def site_code(program: Program, site: int) -> tuple[bytes, int]:
    """The bytes a session reads at a site (up to 32, not past the function's end)."""
    _, hi = program.boundaries[site]
    off = site - program.base
    return program.image[off : off + min(32, hi - site)], hi


@dataclass
class Plan:
    """What became of each site of a program."""

    cases: list[Case] = field(default_factory=list)
    kinds: Counter = field(default_factory=Counter)
    out_of_reach: int = 0  # trampolines too far from a RIP-relative operand's target
    errors: list[str] = field(default_factory=list)  # lay_out refused a trampoline in reach


def _lay_out(
    plan: Plan, window: Window, kind: str, t: int, where: str, event: cg.EventSpec | None = None
) -> Layout | None:
    """lay_out, where the session would: not where ``data_reach`` says a RIP-relative
    operand could not follow (the session bounds its search with it)."""
    lo, hi = data_reach(window)
    if not lo <= t < hi:
        plan.out_of_reach += 1
        return None
    try:
        return lay_out(window, kind, t, event) if event else lay_out(window, kind, t)
    except RelocationError as e:
        plan.errors.append(f"{kind} at {window.address:#x} -> {t:#x} ({where}): {e}")
        return None


def plan_program(
    program: Program,
    *,
    phases: bool = True,
    distances=DISTANCES,
    event: cg.EventSpec | None = None,
) -> Plan:
    plan = Plan()
    for site in sorted(program.boundaries):
        code, limit = site_code(program, site)
        try:
            window, kind, _ = choose_window(code, site, limit)
        except RelocationError:
            plan.kinds["refused"] += 1
            continue
        trampolines: dict[int, str] = {}
        if kind == JUMP:
            mask, pat = constraint(window.starts)
            for where, x in distances.items():
                t = _valid_trampoline(program, site, next_match(x, mask, pat))
                if t is not None:
                    trampolines.setdefault(t, where)
            if not trampolines:  # the session falls back to a trap then
                window, kind = decode_window(code, site, 1), TRAP
                plan.kinds["jump without a trampoline"] += 1
        plan.kinds[kind] += 1
        cases = []
        first = True
        for t, where in trampolines.items() if kind == JUMP else ():
            layout = _lay_out(plan, window, JUMP, t, where, event)
            if layout is None:
                continue
            cases.append(Case(layout, FINAL, layout.patched, where, event))
            if phases and first:
                # The patching writes int3 at every covered start, then the rel32,
                # then the opcode: threads run through both states in between.
                traps = bytearray(window.code[:5])
                for p in window.starts:
                    traps[p] = 0xCC
                cases.append(Case(layout, PHASE_TRAPS, bytes(traps), where, event))
                rel = b"\xcc" + layout.patched[1:5]
                cases.append(Case(layout, PHASE_REL, rel, where, event))
            first = False
        # A trap tracepoint at every site: chosen, the fallback, or forced.
        trap_window = decode_window(code, site, 1)
        for where, x in distances.items():
            t = _valid_trampoline(program, site, next_match(x, 0, 0))
            layout = t and _lay_out(plan, trap_window, TRAP, t, where, event)
            if layout:
                cases.append(Case(layout, FINAL, layout.patched, where, event))
                break
        plan.cases += cases
    return plan


def describe(program: Program, case: Case, start: Start, problems: list[str]) -> str:
    layout = case.layout
    marks = {layout.site: "A>"}
    for p in layout.starts[1:]:
        marks[layout.site + p] = "*"
    if start.pc in marks:
        marks[start.pc] += "@"
    else:
        marks[start.pc] = "@"
    redirects = ", ".join(f"{a:#x}->{b:#x}" for a, b in layout.redirects)
    return (
        f"{program.name}: {layout.kind} tracepoint at {image_name(program, layout.site)} "
        f"({layout.site:#x}), trampoline {layout.trampoline:#x} ({case.where}), "
        f"state '{case.phase}' (bytes {case.patch.hex(' ')}), start '{start.what}' "
        f"trial {start.trial}\n  "
        + "\n  ".join(problems)
        + f"\nredirects: {redirects}\nfunction (A> site, * covered start, @ start):\n"
        + program.listing(marks)
        + "\ntrampoline:\n"
        + disasm(layout.code, layout.trampoline)
    )


def differences(program: Program, case: Case, want: Outcome, got: Outcome) -> list[str]:
    if got.error:
        return [got.error]
    out = []
    for name in GPRS:
        if got.regs[name] != want.regs[name]:
            out.append(f"{name} {got.regs[name]:#x}, unpatched {want.regs[name]:#x}")
    if got.rflags != want.rflags:
        out.append(f"rflags {got.rflags:#x}, unpatched {want.rflags:#x}")
    if got.rip != want.rip:
        out.append(f"rip {got.rip:#x}, unpatched {want.rip:#x}")
    base = program.base
    if got.data != want.data:
        diff = [i for i in range(DATA_SIZE) if got.data[i] != want.data[i]]
        out.append(f"data differs at {', '.join(hex(base + DATA + i) for i in diff[:8])}")
    # The trampoline's header pushes under the red zone of the rsp it entered with
    # (the flags; the event header also its scratch registers): that must be below the
    # final red zone too (dead stack), and it must be the only stack difference.
    final_rsp = want.regs["rsp"]
    stack = bytearray(got.stack)
    size = frame(case)
    for regs in got.entries:
        slot = regs["rsp"] - RED_ZONE - size
        if slot + size > final_rsp - RED_ZONE:
            out.append(f"trampoline pushed at {slot:#x}, live stack under rsp {final_rsp:#x}")
        lo, hi = slot - STACK, slot - STACK + size
        stack[lo:hi] = want.stack[lo:hi]
    if stack != want.stack:
        diff = [i for i in range(STACK_SIZE) if stack[i] != want.stack[i]]
        where = ", ".join(f"{STACK + i:#x}" for i in diff[:8])
        out.append(f"stack differs at {where} (final rsp {final_rsp:#x})")
    hits = want.hits[case.layout.site]
    if got.counter != hits:
        out.append(f"counter {got.counter}, but the site ran {hits} times unpatched")
    if case.event:
        out += event_differences(case, got, hits)
    return out


def event_differences(case: Case, got: Outcome, hits: int) -> list[str]:
    """The events written: one per hit, in order, each with the registers the
    trampoline was entered with (rip: the site)."""
    spec = case.event
    # unicorn's TSC_AUX reads 0: every event goes to buffer 0.
    head = struct.unpack_from("<Q", got.ring, 0)[0]
    if head != hits or len(got.entries) != hits:
        return [f"{head} events, {len(got.entries)} trampoline entries, {hits} hits"]
    out = []
    for i, regs in enumerate(got.entries):
        slot = spec.slots_offset + i * SLOT_BYTES
        seq, _tsc, tid, cpu, probe, kind, *values = struct.unpack_from("<QQIIII4Q", got.ring, slot)
        want = [case.layout.site if r == "rip" else regs[r] for r in spec.regs]
        if (seq, tid, cpu, probe, kind, values) != (i + 1, 0, 0, spec.probe, spec.kind, want):
            out.append(
                f"event {i}: seq {seq} tid {tid} cpu {cpu} probe {probe} kind {kind} regs "
                f"{[hex(v) for v in values]}, want {[hex(v) for v in want]}"
            )
    return out


@dataclass
class Tally:
    sites: int = 0
    layouts: int = 0
    runs: int = 0
    traps: int = 0
    counted: int = 0  # runs where the counter moved


def check_program(
    program: Program, plan: Plan, tally: Tally, starts: Callable[[Case], list] | None = None
) -> list[str]:
    """Run every case from every start; return the descriptions of mismatches."""
    plain = Machine(program)
    reference: dict[tuple[str, int], tuple[Start, Outcome]] = {}
    for what, pc in program.starts:
        for trial in range(program.spec.trials):
            start = make_start(program, what, pc, trial)
            outcome = plain.run(start)
            if outcome.error:
                pytest.fail(f"{program.name}: the unpatched run from {what}: {outcome.error}")
            reference[what, trial] = (start, outcome)
    failures = []
    tally.sites += len({case.layout.site for case in plan.cases})
    for case in plan.cases:
        tally.layouts += 1
        machine = Machine(program, case.layout, case.patch, case.event)
        keys = starts(case) if starts else list(reference)
        for key in keys:
            start, want = reference[key]
            got = machine.run(start)
            tally.runs += 1
            tally.traps += got.traps
            tally.counted += bool(got.counter)
            problems = differences(program, case, want, got)
            if problems:
                failures.append(describe(program, case, start, problems))
    return failures


def report(failures: list[str]) -> None:
    if failures:
        shown = "\n\n".join(failures[:3])
        pytest.fail(f"{len(failures)} patched runs differ from the original:\n\n{shown}")


# --- the corpus -----------------------------------------------------------------------


def _heap_pointer(rng: random.Random, sym: dict[str, int]) -> int:
    return sym["g"] - SYMBOLS["g"] + HEAP + 8 * rng.randrange(64)


def _small(lo: int, hi: int) -> Callable[[random.Random, dict[str, int]], int]:
    return lambda rng, sym: rng.randrange(lo, hi)


HANDWRITTEN = [
    Spec(
        "leaf loop back into a window",
        [
            (
                "sum",
                [
                    "31 c0",  # xor eax, eax
                    "85 f6",  # test esi, esi
                    J("7e", "done"),  # jle done
                    L("loop"),
                    "03 07",  # add eax, [rdi]
                    "48 83 c7 04",  # add rdi, 4
                    "ff ce",  # dec esi
                    J("7f", "loop"),  # jg loop
                    L("done"),
                    "c3",
                ],
            )
        ],
        regs={"rdi": _heap_pointer, "rsi": _small(-2, 7)},
    ),
    Spec(
        "frame pointer prologue",
        [
            (
                "frame",
                [
                    "55",  # push rbp
                    "48 89 e5",  # mov rbp, rsp
                    "48 83 ec 20",  # sub rsp, 0x20
                    "89 7d fc",  # mov [rbp-4], edi
                    "48 89 75 f0",  # mov [rbp-16], rsi
                    "8b 45 fc",  # mov eax, [rbp-4]
                    "48 03 45 f0",  # add rax, [rbp-16]
                    "48 89 45 e8",  # mov [rbp-24], rax
                    "48 0f af c0",  # imul rax, rax
                    "c9",  # leave
                    "c3",
                ],
            )
        ],
        # What rbp holds after the prologue: a start past it finds the frame there.
        regs={"rbp": lambda rng, sym: ENTRY_RSP - 8},
    ),
    Spec(
        "endbr64 prologue",
        [
            (
                "cet",
                [
                    "f3 0f 1e fa",  # endbr64
                    "53",  # push rbx
                    "48 89 fb",  # mov rbx, rdi
                    "31 c0",  # xor eax, eax
                    "48 39 f3",  # cmp rbx, rsi
                    "0f 92 c0",  # setb al
                    "48 01 d8",  # add rax, rbx
                    "5b",  # pop rbx
                    "c3",
                ],
            )
        ],
    ),
    Spec(
        "jcc rel8 over short instructions",
        [
            (
                "skip",
                [
                    "48 85 ff",  # test rdi, rdi
                    J("74", "l1"),  # je l1
                    "48 ff c7",  # inc rdi
                    L("l1"),
                    "48 89 f8",  # mov rax, rdi
                    "a8 01",  # test al, 1
                    J("75", "l2"),  # jne l2
                    "99",  # cdq
                    L("l2"),
                    "48 01 d0",  # add rax, rdx
                    "c3",
                ],
            )
        ],
        regs={"rdi": lambda rng, sym: rng.choice([0, 1, 2, rng.getrandbits(64)])},
        trials=4,
    ),
    Spec(
        "red zone leaf",
        [
            (
                "leaf",
                [
                    "48 89 7c 24 f8",  # mov [rsp-8], rdi
                    "89 74 24 f4",  # mov [rsp-12], esi
                    "31 c0",  # xor eax, eax
                    "03 44 24 f8",  # add eax, [rsp-8]
                    "03 44 24 f4",  # add eax, [rsp-12]
                    "88 44 24 f0",  # mov [rsp-16], al
                    "0f b6 4c 24 f0",  # movzx ecx, byte [rsp-16]
                    "01 c8",  # add eax, ecx
                    "48 8b 54 24 f8",  # mov rdx, [rsp-8]
                    "c3",
                ],
            )
        ],
    ),
    Spec(
        "RIP-relative globals",
        [
            (
                "globals",
                [
                    "31 d2",  # xor edx, edx
                    R("48 8b 05", "g"),  # mov rax, [rip+g]
                    "48 01 f8",  # add rax, rdi
                    R("48 89 05", "g"),  # mov [rip+g], rax
                    R("83 05", "g2", "01"),  # add dword [rip+g2], 1
                    R("c7 05", "g3", "78 56 34 12"),  # mov dword [rip+g3], 0x12345678
                    "90",  # nop
                    R("48 8d 0d", "g4"),  # lea rcx, [rip+g4]
                    R("f6 05", "g4", "01"),  # test byte [rip+g4], 1
                    J("74", "z"),  # je z
                    "ff c2",  # inc edx
                    L("z"),
                    R("66 81 3d", "g2", "34 12"),  # cmp word [rip+g2], 0x1234
                    "0f 95 c2",  # setne dl
                    "c3",
                ],
            )
        ],
        trials=3,
    ),
    Spec(
        "call to a helper",
        [
            (
                "main",
                [
                    "53",  # push rbx
                    "89 fb",  # mov ebx, edi
                    J("e8", "helper", 4),  # call helper
                    "01 d8",  # add eax, ebx
                    "5b",  # pop rbx
                    "c3",
                ],
            ),
            (
                "helper",
                [
                    "8d 04 3f",  # lea eax, [rdi+rdi]
                    "ff c0",  # inc eax
                    "c3",
                ],
            ),
        ],
    ),
    Spec(
        "calls through pointers",
        [
            (
                "indirect",
                [
                    R("48 8b 05", "fptr"),  # mov rax, [rip+fptr]
                    "ff d0",  # call rax
                    R("ff 15", "fptr"),  # call [rip+fptr]
                    "48 89 c1",  # mov rcx, rax
                    "c3",
                ],
            ),
            (
                "bump",
                [
                    "48 ff c0",  # inc rax
                    "c3",
                ],
            ),
        ],
        regs={"rax": lambda rng, sym: sym["bump"]},
        memory={"fptr": lambda sym: struct.pack("<Q", sym["bump"])},
    ),
    Spec(
        "loop and jrcxz",
        [
            (
                "count",
                [
                    "31 c0",  # xor eax, eax
                    L("top"),
                    J("e3", "done"),  # jrcxz done
                    "01 c8",  # add eax, ecx
                    J("e2", "top"),  # loop top
                    L("done"),
                    "c3",
                ],
            )
        ],
        regs={"rcx": _small(1, 7)},
    ),
    Spec(
        "five 1-byte instructions",
        [
            (
                "tiny",
                [
                    "53",  # push rbx
                    "55",  # push rbp
                    "f9",  # stc
                    "9c",  # pushfq
                    "5d",  # pop rbp
                    "91",  # xchg eax, ecx
                    "f5",  # cmc
                    "48 11 e8",  # adc rax, rbp
                    "5d",  # pop rbp
                    "5b",  # pop rbx
                    "c3",
                ],
            )
        ],
    ),
    Spec(
        "loop back to the site",
        [
            (
                "spin",
                [
                    L("again"),
                    "ff c9",  # dec ecx
                    J("7f", "again"),  # jg again
                    "c3",
                ],
            )
        ],
        regs={"rcx": _small(0, 6)},
    ),
]

# Instructions for random functions: no control flow, rsp and rdi never written
# (rdi points at the heap area), memory at [rdi+x] and in the red zone only.
SIMPLE = """
90 f8 f9 f5 99 4898 4899 9f 9e 91 31c0 01d8 4801d8 4829ca 4811c8 4819d3 48ffc1 ffca 48f7d8
48f7d3 4821ce 4809c2 4831d9 4885c0 4839d8 4883c007 83e903 48c1e003 48d1eb 48c1f93f
480fafc3 488d0418 8d4c1201 0f94c0 0f9cc1 480f44c1 480f4fd3 0fb6c1 4863d0 480fc8 6690
0f1f00 0f1f4000 4889c1 89d8 b878563412 41b8efbeadde 4d01c1 4c31d0 4531db 8b07 48034708
894f10 48895718 83470405 f0480107 48894424f8 895c24f0 488b4c24f8 035424f0 884424e8
488b0424 0fb65424e8
""".split()
PUSHES = ["50", "53", "4150", "56", "9c"]
POPS = ["59", "5a", "4159", "5e"]


def random_spec(seed: int, length: int = 24) -> Spec:
    rng = random.Random(seed)
    items: list[Item] = []
    depth = 0
    n = 0
    while n < length:
        r = rng.random()
        if r < 0.12 and depth > -32:
            items += [D(depth), rng.choice(PUSHES)]
            depth -= 8
        elif r < 0.22 and depth < 0:
            items += [D(depth), rng.choice(POPS)]
            depth += 8
        elif r < 0.34:
            label = f"s{n}"
            items += [D(depth), J(f"{0x70 + rng.randrange(16):02x}", label)]
            for _ in range(rng.randint(1, 3)):
                items += [D(depth), rng.choice(SIMPLE)]
                n += 1
            items.append(L(label))
        elif r < 0.38:
            items += [D(depth), J("e8", "helper", 4)]
        else:
            items += [D(depth), rng.choice(SIMPLE)]
        n += 1
    while depth < 0:
        items += [D(depth), rng.choice(POPS)]
        depth += 8
    items += [D(0), "c3"]
    helper = ["48 8d 40 01", "48 31 d0", "c3"]  # lea rax, [rax+1]; xor rax, rdx; ret
    return Spec(
        f"random {seed}",
        [("rand", items), ("helper", helper)],
        regs={"rdi": _heap_pointer},
        trials=1,
    )


RANDOM = [random_spec(seed) for seed in range(8)]
# Also below 2 GiB: a call's return address pushed as imm32, and sites whose A+4
# constraint has no address there (the trap fallback).
LOW_TOO = ("call to a helper", "five 1-byte instructions")


# --- 1. patched-code equivalence --------------------------------------------------------


def handwritten(name: str) -> Spec:
    return next(spec for spec in HANDWRITTEN if spec.name == name)


def _summary(program: Program, plan: Plan, tally: Tally) -> str:
    kinds = ", ".join(f"{k}: {n}" for k, n in sorted(plan.kinds.items()))
    return (
        f"\n{program.name}: {len(program.boundaries)} sites ({kinds}), {tally.layouts} "
        f"tracepoint states, {len(program.starts)} starts, {tally.runs} runs, "
        f"{tally.traps} trap redirects, {plan.out_of_reach} trampolines out of data reach"
    )


@pytest.mark.parametrize(
    ("spec", "base"),
    [(spec, BASE) for spec in HANDWRITTEN]
    + [(spec, BASE_LOW) for spec in HANDWRITTEN if spec.name in LOW_TOO],
    ids=lambda v: v.name if isinstance(v, Spec) else f"{v:#x}",
)
def test_patched_function_runs_like_the_original(spec: Spec, base: int) -> None:
    program = build(spec, base)
    plan = plan_program(program)
    assert plan.kinds[JUMP] + plan.kinds[TRAP] == len(program.boundaries)
    assert not plan.errors, "\n".join(plan.errors)
    tally = Tally()
    report(check_program(program, plan, tally))
    print(_summary(program, plan, tally))
    assert tally.counted > 0  # some runs went through the tracepoint ...
    if any(len(c.layout.redirects) > 1 for c in plan.cases):
        assert tally.traps > 0  # ... and some through the redirect of a covered start


@pytest.mark.parametrize("spec", RANDOM, ids=lambda s: s.name)
def test_random_function_runs_like_the_original(spec: Spec) -> None:
    program = build(spec)
    plan = plan_program(program, phases=False)
    assert not plan.errors, "\n".join(plan.errors)
    tally = Tally()
    report(check_program(program, plan, tally))
    print(_summary(program, plan, tally))


EVENT = cg.EventSpec(
    probe=7,
    rings=RINGS,
    slots_offset=RING_GEOMETRY.slots_offset,
    buffer_shift=RING_GEOMETRY.buffer_shift,
    buffers=RING_GEOMETRY.buffers,
    slots=RING_GEOMETRY.slots,
    tid_offset=-1,  # no thread pointer in the emulator
    regs=("rcx", "rdi", "rsp", "rip"),  # saved and reloaded, live, computed, constant
)


@pytest.mark.parametrize("spec", [*HANDWRITTEN, RANDOM[0]], ids=lambda s: s.name)
def test_event_tracepoint_runs_like_the_original(spec: Spec) -> None:
    """The same with the event-writing header: equal outcomes, and one event per hit
    with the registers the site saw."""
    program = build(spec)
    distances = {k: DISTANCES[k] for k in ("-1GiB", "+256MiB")}
    plan = plan_program(program, phases=False, distances=distances, event=EVENT)
    assert not plan.errors, "\n".join(plan.errors)
    tally = Tally()
    report(check_program(program, plan, tally))
    print(_summary(program, plan, tally))
    assert tally.counted > 0


# --- 2. byte-level invariants ---------------------------------------------------------


def check_bytes(program: Program, layout: Layout) -> list[str]:
    out = []
    a, window = layout.site, layout.window
    off = a - program.base
    image = bytearray(program.image)
    original = bytes(image[off : off + window.length])
    image[off : off + len(layout.patched)] = layout.patched
    patched = bytes(image)
    t = layout.trampoline
    if layout.redirects[0] != (a, t):
        out.append(f"first redirect {layout.redirects[0]} is not site -> trampoline")
    if layout.counter != counter_address(t) or layout.counter % 8:
        out.append(f"counter {layout.counter:#x} for trampoline {t:#x}")
    if not (t + len(layout.code) <= layout.counter and 0 <= layout.counter - CHUNK_CODE - t < 8):
        out.append(f"counter {layout.counter:#x} is not in the data mirror of the code")
    if len(layout.code) > trampoline_size(window):
        out.append(f"trampoline of {len(layout.code)} bytes, {trampoline_size(window)} planned")
    head = cg.counting_header(t, layout.counter)
    if not layout.code.startswith(head):
        out.append("the trampoline does not start with the counting header")
    body = iced_x86.Decoder(64, layout.code, ip=t)
    last = list(body)[-1]
    fall = window.instructions[-1].flow_control not in (
        iced_x86.FlowControl.UNCONDITIONAL_BRANCH,
        iced_x86.FlowControl.INDIRECT_BRANCH,
        iced_x86.FlowControl.RETURN,
    )
    if fall and not (last.is_jmp_near and last.near_branch_target == a + window.length):
        out.append(f"the trampoline ends with {_FMT.format(last)}, not jmp {a + window.length:#x}")
    if layout.kind == TRAP:
        if layout.patched != b"\xcc" or layout.original != original[:1]:
            out.append(f"trap bytes {layout.patched.hex()} over {layout.original.hex()}")
        if len(layout.redirects) != 1:
            out.append(f"trap redirects {layout.redirects}")
        return out
    jmp = iced_x86.Decoder(64, patched[off:], ip=a).decode()
    if jmp.code != iced_x86.Code.JMP_REL32_64 or jmp.near_branch_target != t:
        out.append(f"at the site: {_FMT.format(jmp)}, not jmp {t:#x}")
    rel = t - (a + 5)
    if not REL_MIN <= rel <= REL_MAX:
        out.append(f"trampoline {t:#x} out of rel32 reach")
    mask, pat = constraint(window.starts)
    if rel & mask != pat:
        out.append(f"rel32 {rel & 0xFFFFFFFF:#010x} misses the constraint {mask:#x}/{pat:#x}")
    if layout.original != original[:5]:
        out.append("original bytes")
    covered = [p for p in window.starts if p]
    for p in covered:
        ins = iced_x86.Decoder(64, patched[off + p :], ip=a + p).decode()
        if ins.code != iced_x86.Code.INT3:
            out.append(f"covered start {a + p:#x} decodes as {_FMT.format(ins)}, not int3")
    if patched[off + 5 : off + window.length] != original[5:]:
        out.append("bytes after A+5 changed")
    # Covered starts go to their relocated copy, past the counting header.
    targets = dict(layout.redirects[1:])
    if sorted(targets) != [a + p for p in covered]:
        out.append(f"redirects {layout.redirects} for covered starts {covered}")
    for p, ins in zip(window.starts, window.instructions, strict=True):
        if not p:
            continue
        dest = targets.get(a + p, 0)
        if not t + len(head) <= dest < t + len(layout.code):
            out.append(f"{a + p:#x} redirected to {dest:#x}, outside the relocated code")
            continue
        moved = iced_x86.Decoder(64, layout.code[dest - t :], ip=dest).decode()
        plain = ins.flow_control == iced_x86.FlowControl.NEXT
        if plain and not ins.is_ip_rel_memory_operand and moved.code != ins.code:
            out.append(f"{a + p:#x}: {_FMT.format(ins)} relocated as {_FMT.format(moved)}")
    return out


@pytest.mark.parametrize(
    "spec", HANDWRITTEN + RANDOM + [None], ids=lambda s: s.name if s else "nops"
)
def test_patched_bytes(spec: Spec | None) -> None:
    program = build(spec) if spec else nop_program(random.Random(1))
    plan = plan_program(program, phases=False)
    problems = []
    for case in plan.cases:
        layout = case.layout
        name = f"{program.name} {layout.kind} at {layout.site:#x} -> {layout.trampoline:#x}"
        problems += [f"{name} ({case.where}): {p}" for p in check_bytes(program, layout)]
    assert not problems, "\n".join(problems[:20])


# --- 3. Harper-Cyr's "random" program ---------------------------------------------------

# NOP-like instructions of 1-15 bytes (Intel SDM's multi-byte NOPs, then extra 0x66
# prefixes) and short register ALU operations, weighted so that the mean length is close
# to the 3.1 bytes Harper-Cyr (2018) takes from Blem, Menon and Sankaralingam.
NOPS = {
    "90": 10,
    "6690": 8,
    "0f1f00": 8,
    "0f1f4000": 6,
    "0f1f440000": 3,
    "660f1f440000": 2,
    "0f1f8000000000": 1.5,
    "0f1f840000000000": 1.5,
    **{"66" * k + "0f1f840000000000": 0.35 for k in range(1, 8)},
    "662e0f1f840000000000": 0.35,
    "31c0": 6,
    "4801d8": 6,
    "48ffc0": 4,
    "4883c007": 4,
    "f9": 4,
    "89d8": 6,
    "4c31d0": 4,
    "480fafc3": 2,
}


def nop_program(rng: random.Random, size: int = 1000) -> Program:
    forms, weights = list(NOPS), list(NOPS.values())
    items: list[Item] = []
    total = 0
    while total < size:
        ins = rng.choices(forms, weights)[0]
        items.append(ins)
        total += len(ins) // 2
    items.append("c3")
    return build(Spec("nops", [("nops", items)], trials=1))


def pie_space() -> list[tuple[int, int]]:
    """The free gaps of a PIE process: text and data, a heap, libraries, a stack."""
    maps = [
        Mapping(BASE - 0x4000, BASE + CODE_SIZE, "r-xp", 0, 1, "/usr/bin/prog"),
        Mapping(BASE + CODE_SIZE, BASE + 0x6000, "rw-p", 0, 1, "/usr/bin/prog"),
        Mapping(BASE + 0x100_0000, BASE + 0x102_1000, "rw-p", 0, 0, "[heap]"),
        Mapping(0x7FFF_F7D0_0000, 0x7FFF_F7F0_0000, "r-xp", 0, 2, "/usr/lib/libc.so.6"),
        Mapping(STACK, STACK + STACK_SIZE, "rw-p", 0, 0, "[stack]"),
    ]
    return free_gaps(maps)


def thesis_place(site: int, starts, size: int, gaps) -> int | None:
    """Harper-Cyr's allocation, byte-granular: the lowest address in a free gap within
    reach whose rel32 meets the constraint and leaves ``size`` bytes in the gap."""
    mask, pat = constraint(starts)
    for lo, hi in gaps:
        r0 = max(lo - (site + 5), REL_MIN)
        r1 = min(hi - size - (site + 5), REL_MAX)
        rel = next_match(r0, mask, pat) if r0 <= r1 else None
        if rel is not None and rel <= r1:
            return site + 5 + rel
    return None


@dataclass
class Placement:
    site: int
    window: Window
    kind: str
    note: str
    thesis: int | None = None  # byte-granular trampoline address
    chunk: int | None = None  # where TrampolineSpace.new_chunk puts it


def random_program_placements() -> tuple[Program, list[Placement]]:
    program = nop_program(random.Random(1))
    gaps = pie_space()
    out = []
    for site in sorted(program.boundaries):
        code, limit = site_code(program, site)
        window, kind, note = choose_window(code, site, limit)
        place = Placement(site, window, kind, note)
        if kind == JUMP:
            size = trampoline_size(window)
            place.thesis = thesis_place(site, window.starts, size, gaps)
            spot = TrampolineSpace().new_chunk(site, window.starts, size, gaps)
            place.chunk = spot and spot[0]
        out.append(place)
    return program, out


def test_random_program_placement() -> None:
    """Every instruction of the random program can take a jump: a free address within
    reach meets its constraint (Harper-Cyr's Table 4.4 "random" row: all of them)."""
    program, places = random_program_placements()
    bounds = sorted(program.boundaries)
    lengths = [b - a for a, b in itertools.pairwise(bounds)]
    mean = sum(lengths) / len(lengths)
    assert 2.9 <= mean <= 3.3, mean
    assert max(lengths) >= 10
    end = program.functions[0][2]
    placed = [p for p in places if p.thesis is not None]
    classes = Counter(constraint(p.window.starts)[0] for p in places if p.kind == JUMP)
    print(
        f"\nrandom program: {len(places)} instructions, mean {mean:.2f} bytes, "
        f"{len(placed)} jumps placeable ({len(placed) / len(places):.1%}), "
        f"{sum(p.chunk is not None for p in places)} by TrampolineSpace.new_chunk; "
        "masks: " + ", ".join(f"{m:#010x}: {n}" for m, n in sorted(classes.items()))
    )
    for p in places:
        if p.kind == JUMP:
            assert p.thesis is not None, f"{p.site:#x}: starts {p.window.starts}"
            mask, pat = constraint(p.window.starts)
            assert (p.thesis - (p.site + 5)) & mask == pat
        else:  # only where 5 bytes would run past the ret
            assert p.site + 5 > end, f"{p.site:#x}: {p.note}"
    assert len(placed) / len(places) >= 0.99


def test_allocator_places_every_random_program_site() -> None:
    _, places = random_program_placements()
    missed = [
        f"{p.site:#x} starts {p.window.starts} page offset {(p.thesis or 0) & 0xFFF:#x}"
        for p in places
        if p.kind == JUMP and p.chunk is None
    ]
    assert not missed, missed


def test_random_program_emulation() -> None:
    """A seeded sample of sites of the random program, with trampolines where the
    allocator puts them, run from every boundary near the site and from the entry."""
    program, places = random_program_placements()
    plan = Plan()
    for place in random.Random(2).sample(places, 48):
        t = place.chunk or place.thesis
        if place.kind != JUMP or t is None:
            continue
        layout = lay_out(place.window, JUMP, t)
        plan.cases.append(Case(layout, FINAL, layout.patched, "allocator"))
        traps = bytearray(place.window.code[:5])
        for p in place.window.starts:
            traps[p] = 0xCC
        plan.cases.append(Case(layout, PHASE_TRAPS, bytes(traps), "allocator"))
    keys = {pc: (what, 0) for what, pc in program.starts}
    entry = program.functions[0][1]

    def near(case: Case) -> list:
        a = case.layout.site
        return [keys[pc] for pc in keys if a - 24 <= pc < a + 24 or pc == entry]

    tally = Tally()
    report(check_program(program, plan, tally, near))
    assert tally.traps > 0
    print(f"\nrandom program: {tally.sites} sites, {tally.runs} runs, {tally.traps} traps")


# --- the harness catches what it is meant to catch --------------------------------------


def _without_red_zone(layout: Layout) -> Layout:
    """``layout`` with a trampoline that does not step over the red zone."""
    t = layout.trampoline
    head = cg.counting_header(t, layout.counter, red_zone=False)
    body = relocate(layout.window, t + len(head))
    back = layout.site + layout.window.length if body.falls_through else None
    code = cg.trampoline(t, head, body, back)
    redirects = [(layout.site, t)] + [(a, body.starts[a]) for a, _ in layout.redirects[1:]]
    return replace(layout, code=code, redirects=tuple(redirects))


def test_harness_catches_a_red_zone_clobber() -> None:
    program = build(handwritten("red zone leaf"))
    plan = plan_program(program, phases=False)
    broken = Plan([replace(c, layout=_without_red_zone(c.layout)) for c in plan.cases])
    failures = check_program(program, broken, Tally())
    assert any("stack differs" in f or "rdx" in f for f in failures)


def test_harness_catches_a_missing_redirect() -> None:
    program = build(handwritten("leaf loop back into a window"))
    plan = plan_program(program, phases=False)
    cases = [c for c in plan.cases if len(c.layout.redirects) > 1]
    assert cases
    broken = Plan([replace(c, layout=replace(c.layout, redirects=c.layout.redirects[:-1]))
                   for c in cases])  # fmt: skip
    failures = check_program(program, broken, Tally())
    assert any("with no redirect" in f for f in failures)


def test_harness_catches_a_counter_off_by_a_start() -> None:
    """Sending a covered start to the trampoline's entry counts a hit that is not one."""
    program = build(handwritten("leaf loop back into a window"))
    plan = plan_program(program, phases=False)
    broken = Plan()
    for case in plan.cases:
        (site, t), (covered, _), *_ = (*case.layout.redirects, (None, None))
        if covered is not None:
            layout = replace(case.layout, redirects=((site, t), (covered, t)))
            broken.cases.append(replace(case, layout=layout))
    failures = check_program(program, broken, Tally())
    assert any("counter" in f for f in failures)


# --- 4. next_match and constraint ---------------------------------------------------------


def _signed(u: int) -> int:
    return u - (1 << 32) if u >> 31 else u


def brute_next(x: int, mask: int, pat: int) -> int | None:
    """Smallest signed v >= x with v & mask == pat, by listing every such v (for masks
    with few free bits)."""
    free = [b for b in range(32) if not mask >> b & 1]
    values = []
    for k in range(1 << len(free)):
        v = pat
        for i, b in enumerate(free):
            if k >> i & 1:
                v |= 1 << b
        values.append(_signed(v))
    above = [v for v in values if v >= x]
    return min(above) if above else None


def count_matching(u: int, mask: int, pat: int) -> int:
    """How many unsigned 32-bit w in [0, u] have w & mask == pat (digit by digit)."""
    if u < 0:
        return 0
    total = 0
    for i in reversed(range(32)):
        bit = 1 << i
        below = bin(~mask & (bit - 1) & 0xFFFFFFFF).count("1")
        if u & bit:
            if not mask & bit or not pat & bit:
                total += 1 << below  # a 0 here, anything allowed below
            if mask & bit and not pat & bit:
                return total
        elif mask & bit and pat & bit:
            return total
    return total + 1


@settings(max_examples=400, deadline=None)
@given(
    free=st.sets(st.integers(0, 31), max_size=12).map(lambda bits: sum(1 << b for b in bits)),
    pat=st.integers(0, 0xFFFFFFFF),
    x=st.integers(REL_MIN - 5, REL_MAX + 5),
)
def test_next_match_few_free_bits(free: int, pat: int, x: int) -> None:
    mask = ~free & 0xFFFFFFFF
    pat &= mask
    assert next_match(x, mask, pat) == brute_next(max(x, REL_MIN), mask, pat)


@settings(max_examples=300, deadline=None)
@given(
    fixed=st.sampled_from([0, 0xFF, 0xFF00, 0xFFFF]),
    pat=st.integers(0, 0xFFFF) | st.just(0xCCCC),
    x=st.integers(REL_MIN - 5, REL_MAX + 5) | st.integers(REL_MAX - 0x20000, REL_MAX + 5),
)
def test_next_match_low_bytes_brute_force(fixed: int, pat: int, x: int) -> None:
    pat &= fixed
    got = next_match(x, fixed, pat)
    want = None
    for v in range(max(x, REL_MIN), min(REL_MAX, max(x, REL_MIN) + 0x10000) + 1):
        if v & fixed == pat:
            want = v
            break
    assert got == want


@settings(max_examples=500, deadline=None)
@given(
    starts=st.sets(st.integers(1, 4)),
    x=st.integers(REL_MIN - 5, REL_MAX + 5),
)
def test_next_match_minimal_for_jump_constraints(starts: set[int], x: int) -> None:
    mask, pat = constraint({0, *starts})
    got = next_match(x, mask, pat)
    flip = 1 << 31
    # Count the matches in [x, got) in the unsigned order where signed order is plain.
    fmask, fpat = mask, pat ^ (flip & mask)

    def count(v: int) -> int:
        return count_matching((v & 0xFFFFFFFF) ^ flip if v >= REL_MIN else -1, fmask, fpat)

    lo = max(x, REL_MIN)
    if got is None:
        assert x > REL_MAX or count(REL_MAX) - count(lo - 1) == 0
        return
    assert got >= lo and got & mask == pat
    assert count(got - 1) - count(lo - 1) == 0, "a smaller match exists"


@settings(max_examples=200, deadline=None)
@given(starts=st.sets(st.integers(0, 15)), rel=st.integers(REL_MIN, REL_MAX))
def test_constraint_fixes_the_covered_bytes(starts: set[int], rel: int) -> None:
    mask, pat = constraint(starts)
    covered = {p for p in starts if 1 <= p <= 4}
    assert mask == sum(0xFF << 8 * (p - 1) for p in covered)
    t = next_match(rel, mask, pat)
    if t is None:
        return
    jump = cg.jump_bytes(0x1000_0000, 0x1000_0005 + t)
    for p in range(1, 5):
        assert (jump[p] == 0xCC) or p not in covered


def test_constraint_geometry() -> None:
    # Harper-Cyr: five 1-byte instructions leave a single trampoline address, and a
    # start at A+4 a 16 MiB band about 820 MiB below the site.
    mask, pat = constraint(range(5))
    assert next_match(REL_MIN, mask, pat) == -858_993_460
    assert next_match(-858_993_460 + 1, mask, pat) is None
    mask, pat = constraint([0, 4])
    assert next_match(REL_MIN, mask, pat) == -872_415_232
    assert next_match(-855_638_017, mask, pat) == -855_638_017
    assert next_match(-855_638_016, mask, pat) is None
    assert constraint([0, 5, 9]) == (0, 0)
