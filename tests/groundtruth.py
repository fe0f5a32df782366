"""Ground-truth instruction paths: small C programs run in an emulator (helpers, no tests).

The programs are compiled freestanding (no libc, no OS: ``-ffreestanding
-nostdlib -static``, text at :data:`TEXT_BASE`) so unicorn can run any of
their functions directly: the ELF's ``PT_LOAD`` segments are mapped, a stack
is set up, the function is called with up to four integer arguments and a
sentinel return address, and every executed instruction's IP is recorded.
The same ELF then builds the decoder's image (``Image.add_elf``, at
``Run.load_address``), so a flow decoder fed the matching Intel PT
(:mod:`hwtrace.pt.encode`) must give the recorded path back.  Builds are
``-O0``, ``-O2`` and ``-O2-high``, the latter seen at a kernel-like address
(see :data:`BUILDS`).

The functions exercise what makes flow decoding hard: loops of conditional
branches, recursion deeper than the 64-entry return stack, indirect calls
through function-pointer tables, switch jump tables, direct and indirect tail
calls, returns used as indirect jumps and setjmp/longjmp unwinding (returns
that do not go where their call said).

Builds are cached per source hash in ``$XDG_CACHE_HOME/hwtrace`` (else the
temp directory), like :mod:`libipt_oracle`.  :data:`skip_reason` is None when
gcc and unicorn are usable.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from array import array
from dataclasses import dataclass
from pathlib import Path

import iced_x86 as iced
import numpy as np
from elftools.elf.elffile import ELFFile

TEXT_BASE = 0x401000
STACK_TOP = 0x7FFF0000
STACK_SIZE = 1 << 20
SENTINEL = 0x1000  # the return address the called function returns to
MAX_INSNS = 5_000_000  # an emulation stops here: a runaway program is a bug

CFLAGS = (
    "-fno-pic",
    "-fno-pie",
    "-no-pie",
    "-ffreestanding",
    "-fno-builtin",
    "-fno-stack-protector",
    "-fno-asynchronous-unwind-tables",
    "-nostdlib",
    "-static",
    "-Wl,--build-id=none",
)
# Builds: name -> (optimization flag, where the decoder's image maps the
# ELF, None: at its link address).  "-O2-high" is the -O2 program seen at a
# kernel-like address, so IPs are sign-extended 48-bit values that compress
# differently: unicorn cannot run code up there without page tables, but the
# flow does not depend on where code is (direct branches are relative;
# indirect targets come from the trace), so its path is the -O2 path moved.
BUILDS: dict[str, tuple[str, int | None]] = {
    "-O0": ("-O0", None),
    "-O2": ("-O2", None),
    "-O2-high": ("-O2", 0xFFFFFFFF80C00000),
}
OPT_LEVELS = tuple(BUILDS)

# Every function takes (seed, count) and returns a checksum, so builds at
# different optimization levels can be checked against each other.
PROGRAM = r"""
typedef unsigned long u64;
typedef u64 (*op_fn)(u64);
#define NOINLINE __attribute__((noinline))

volatile u64 sink;

void _start(void) { for (;;) {} }

/* Loops of conditional branches. */
NOINLINE u64 collatz(u64 seed, u64 count) {
    u64 steps = 0;
    for (u64 i = 0; i < count; i++) {
        u64 n = seed + i;
        while (n > 1) {
            n = (n & 1) ? 3 * n + 1 : n / 2;
            steps++;
        }
    }
    return steps;
}

static u64 arr[48];

NOINLINE u64 sort(u64 seed, u64 count) {
    u64 n = count < 48 ? count : 48, x = seed, sum = 0;
    for (u64 i = 0; i < n; i++) {
        x = x * 6364136223846793005UL + 1442695040888963407UL;
        arr[i] = x >> 40;
    }
    for (u64 i = 1; i < n; i++) {
        u64 v = arr[i], j = i;
        while (j > 0 && arr[j - 1] > v) {
            arr[j] = arr[j - 1];
            j--;
        }
        arr[j] = v;
    }
    for (u64 i = 0; i < n; i++)
        sum = sum * 31 + arr[i];
    return sum;
}

/* Recursion deeper than the return stack: the result is used in a way gcc
 * cannot turn into a loop. */
NOINLINE u64 deep(u64 seed, u64 depth) {
    if (depth == 0)
        return seed;
    u64 r = deep(seed + 1, depth - 1);
    return (r * r + depth) % 1000003;
}

NOINLINE u64 fib(u64 seed, u64 n) {
    return n < 2 ? seed + n : fib(seed, n - 1) + fib(seed, n - 2);
}

/* Indirect calls through a table of function pointers. */
NOINLINE u64 op_add(u64 x) { return x + 0x9e37; }
NOINLINE u64 op_mul(u64 x) { return x * 2654435761UL; }
NOINLINE u64 op_xor(u64 x) { return x ^ (x >> 7); }
NOINLINE u64 op_rot(u64 x) { return (x << 13) | (x >> 51); }
op_fn const ops[4] = {op_add, op_mul, op_xor, op_rot};

NOINLINE u64 indirect(u64 seed, u64 count) {
    u64 x = seed;
    for (u64 i = 0; i < count; i++)
        x = ops[(x >> 9) & 3](x) + i;
    return x;
}

/* A switch compiled to a jump table (an indirect jump). */
NOINLINE u64 interp(u64 seed, u64 count) {
    u64 x = seed, acc = 0;
    for (u64 i = 0; i < count; i++) {
        x = x * 1103515245UL + 12345UL;
        switch ((x >> 16) % 10) {
        case 0: acc += 1; break;
        case 1: acc ^= x; break;
        case 2: acc *= 3; break;
        case 3: acc -= x >> 3; break;
        case 4: acc = (acc << 1) | 1; break;
        case 5: acc += i * i; break;
        case 6: acc = ~acc; break;
        case 7: acc >>= 1; break;
        case 8: acc += x & 0xff; break;
        default: acc ^= 0x5555; break;
        }
    }
    return acc;
}

/* Tail calls: direct (mutual recursion) and through a pointer table. */
NOINLINE u64 tail_b(u64 x, u64 n);
NOINLINE u64 tail_a(u64 x, u64 n) { return n == 0 ? x : tail_b(x * 3 + 1, n - 1); }
NOINLINE u64 tail_b(u64 x, u64 n) { return n == 0 ? x : tail_a(x ^ (x >> 2), n - 1); }
NOINLINE u64 tail_ind(u64 x, u64 n) { return ops[n & 3](x + n); }

NOINLINE u64 tails(u64 seed, u64 count) {
    u64 acc = 0;
    for (u64 i = 0; i < count; i++)
        acc += tail_a(seed + i, i % 7) + tail_ind(acc, i);
    return acc;
}

/* A return used as an indirect jump, and setjmp/longjmp unwinding: returns
 * whose target is not what their call pushed. */
u64 call_via_ret(op_fn fn, u64 arg);
long my_setjmp(u64 *buf) __attribute__((returns_twice));
void my_longjmp(u64 *buf, long val) __attribute__((noreturn));
__asm__(
    ".text\n"
    ".globl call_via_ret\n"
    "call_via_ret:\n"
    "  mov %rdi, %rax\n"
    "  mov %rsi, %rdi\n"
    "  push %rax\n"
    "  ret\n"
    ".globl my_setjmp\n"
    "my_setjmp:\n"
    "  mov %rbx, 0(%rdi)\n"
    "  mov %rbp, 8(%rdi)\n"
    "  mov %r12, 16(%rdi)\n"
    "  mov %r13, 24(%rdi)\n"
    "  mov %r14, 32(%rdi)\n"
    "  mov %r15, 40(%rdi)\n"
    "  lea 8(%rsp), %rdx\n"
    "  mov %rdx, 48(%rdi)\n"
    "  mov (%rsp), %rdx\n"
    "  mov %rdx, 56(%rdi)\n"
    "  xor %eax, %eax\n"
    "  ret\n"
    ".globl my_longjmp\n"
    "my_longjmp:\n"
    "  mov 0(%rdi), %rbx\n"
    "  mov 8(%rdi), %rbp\n"
    "  mov 16(%rdi), %r12\n"
    "  mov 24(%rdi), %r13\n"
    "  mov 32(%rdi), %r14\n"
    "  mov 40(%rdi), %r15\n"
    "  mov 48(%rdi), %rsp\n"
    "  mov %rsi, %rax\n"
    "  jmp *56(%rdi)\n");

static u64 jb[8];

NOINLINE void thrower(u64 depth) {
    if (depth == 0)
        my_longjmp(jb, 7);
    thrower(depth - 1);
    sink = depth;
}

NOINLINE u64 unwind(u64 seed, u64 count) {
    volatile u64 acc = 0;
    for (volatile u64 i = 0; i < count; i++) {
        if (my_setjmp(jb) == 0)
            thrower((seed + i) % 5 + 1);
        else
            acc += i;
        acc += call_via_ret(ops[i & 3], seed + i);
    }
    return acc;
}

/* Everything together, for longer mixed paths. */
NOINLINE u64 mixed(u64 seed, u64 count) {
    u64 acc = 0;
    for (u64 i = 0; i < count; i++) {
        acc += collatz(seed + i, 2) + interp(acc, 3) + indirect(acc, 2);
        acc ^= deep(acc & 0xff, 3 + i % 5) + tails(i, 2) + unwind(i, 1);
    }
    return acc;
}
"""

# name -> (seed, count) arguments that give short but interesting paths.
CASES: dict[str, tuple[int, int]] = {
    "collatz": (27, 3),
    "sort": (7, 24),
    "deep": (5, 90),  # deeper than the 64-entry return stack
    "fib": (1, 9),
    "indirect": (3, 40),
    "interp": (11, 60),
    "tails": (2, 12),
    "unwind": (1, 6),
    "mixed": (4, 3),
}


def _find_skip_reason() -> str | None:
    if shutil.which(os.environ.get("CC") or "gcc") is None:
        return "no C compiler (gcc) on PATH"
    try:
        import unicorn  # noqa: F401
    except ImportError:
        return "unicorn is not installed (pip install -e '.[dev]')"
    return None


# Why ground-truth programs cannot be built and run here, or None.
skip_reason = _find_skip_reason()


def _cache_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = Path(xdg) / "hwtrace" if xdg else Path(tempfile.gettempdir())
    return root / "hwtrace-groundtruth"


@functools.cache
def build(opt: str = "-O2", program: str = PROGRAM) -> Path:
    """Compile ``program`` (default :data:`PROGRAM`) for build ``opt`` of
    :data:`BUILDS`; the ELF's path.

    Cached per source, flags and compiler; safe for concurrent processes."""
    cc = shutil.which(os.environ.get("CC") or "gcc")
    if cc is None:
        raise RuntimeError(skip_reason)
    flags = (BUILDS[opt][0], *CFLAGS, f"-Wl,-Ttext={TEXT_BASE:#x}")
    h = hashlib.sha256("\0".join((cc, *flags, program)).encode()).hexdigest()[:16]
    directory = _cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"prog{flags[0]}-{h}.elf"
    if target.is_file():
        return target
    src = directory / f".prog-{h}-{os.getpid()}.c"
    tmp = directory / f".prog{flags[0]}-{h}-{os.getpid()}.tmp"
    src.write_text(program)
    try:
        cmd = [cc, *flags, "-o", str(tmp), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
        os.replace(tmp, target)
    finally:
        src.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return target


@dataclass
class Run:
    """One emulated call: the executed instruction IPs and where they came from."""

    elf: Path
    function: str
    args: tuple[int, ...]
    ips: np.ndarray  # uint64, every executed instruction in order
    result: int  # rax at the return
    end_ip: int  # where the last instruction (the function's RET) went
    load_address: int | None = None  # where the image maps the ELF (None: link addresses)

    @property
    def entry(self) -> int:
        """The called function's address as the path sees it."""
        return (symbols(self.elf)[self.function] + self.bias) & 0xFFFFFFFFFFFFFFFF

    @property
    def bias(self) -> int:
        """How far the ELF is moved from its link addresses."""
        if self.load_address is None:
            return 0
        return self.load_address - min(vaddr for vaddr, _, _ in _segments(self.elf))


def symbols(elf: Path) -> dict[str, int]:
    """Function symbols of ``elf``: name -> address."""
    with open(elf, "rb") as f:
        tab = ELFFile(f).get_section_by_name(".symtab")
        return {s.name: s["st_value"] for s in tab.iter_symbols() if s.name and s["st_value"]}


@functools.cache
def _segments(elf: Path) -> tuple[tuple[int, int, bytes], ...]:
    """(vaddr, memsz, file bytes) of each PT_LOAD segment."""
    with open(elf, "rb") as f:
        e = ELFFile(f)
        return tuple(
            (seg["p_vaddr"], seg["p_memsz"], seg.data())
            for seg in e.iter_segments()
            if seg["p_type"] == "PT_LOAD"
        )


def _is_rep_string(code: bytes, ip: int) -> bool:
    ins = iced.Decoder(64, code, ip=ip).decode()
    return (
        ins.has_rep_prefix or ins.has_repe_prefix or ins.has_repne_prefix
    ) and ins.is_string_instruction


def _collapse_rep(ips: np.ndarray, read) -> np.ndarray:
    """Emulators report each iteration of a REP string instruction; Intel PT
    (and its decoders) see one instruction.  Collapse such repeats."""
    if ips.shape[0] < 2:
        return ips
    same = np.flatnonzero(ips[1:] == ips[:-1]) + 1
    if same.shape[0] == 0:
        return ips
    keep = np.ones(ips.shape[0], np.bool_)
    rep = {ip: _is_rep_string(read(ip), ip) for ip in map(int, np.unique(ips[same]))}
    for k in same:
        if rep[int(ips[k])]:
            keep[k] = False
    return ips[keep]


def run(
    function: str,
    args: tuple[int, ...],
    opt: str = "-O2",
    *,
    blocks: bool = False,
    program: str = PROGRAM,
) -> Run:
    """Call ``function(*args)`` of build ``opt`` of ``program`` in unicorn.

    ``blocks`` records basic blocks (UC_HOOK_BLOCK) and expands them into
    instructions, which is much faster for long runs; otherwise every
    instruction is hooked (UC_HOOK_CODE)."""
    import unicorn as uc
    from unicorn import x86_const as X

    elf = build(opt, program)
    entry = symbols(elf)[function]
    mu = uc.Uc(uc.UC_ARCH_X86, uc.UC_MODE_64)
    mapped: list[tuple[int, int]] = []
    image: dict[int, bytes] = {}
    for vaddr, memsz, data in _segments(elf):
        lo, hi = vaddr & ~0xFFF, (vaddr + memsz + 0xFFF) & ~0xFFF
        # Segments may share a page; map only what is not mapped yet.
        for a in range(lo, hi, 0x1000):
            if not any(s <= a < e for s, e in mapped):
                mu.mem_map(a, 0x1000)
                mapped.append((a, a + 0x1000))
        mu.mem_write(vaddr, data)
        image[vaddr] = data
    mu.mem_map(STACK_TOP - STACK_SIZE, STACK_SIZE)
    mu.mem_map(SENTINEL, 0x1000)
    mu.mem_write(SENTINEL, b"\xf4")  # hlt: never executed, emulation stops first
    sp = STACK_TOP - 0x100
    mu.mem_write(sp, SENTINEL.to_bytes(8, "little"))
    mu.reg_write(X.UC_X86_REG_RSP, sp)
    for reg, value in zip(
        (X.UC_X86_REG_RDI, X.UC_X86_REG_RSI, X.UC_X86_REG_RDX, X.UC_X86_REG_RCX),
        args,
        strict=False,
    ):
        mu.reg_write(reg, value)

    def read(ip: int, size: int = 15) -> bytes:
        for vaddr, data in image.items():
            if vaddr <= ip < vaddr + len(data):
                return data[ip - vaddr : ip - vaddr + size]
        return b""

    trace = array("Q")
    if blocks:
        sizes = array("Q")

        def on_block(_mu, address, size, _data):
            trace.append(address)
            sizes.append(size)

        mu.hook_add(uc.UC_HOOK_BLOCK, on_block)
    else:

        def on_code(_mu, address, _size, _data):
            trace.append(address)

        mu.hook_add(uc.UC_HOOK_CODE, on_code)
    mu.emu_start(entry, SENTINEL, count=MAX_INSNS)
    if mu.reg_read(X.UC_X86_REG_RIP) != SENTINEL:
        raise RuntimeError(
            f"{function}{args} did not return (stopped at {mu.reg_read(X.UC_X86_REG_RIP):#x})"
        )

    if blocks:
        ips = _expand_blocks(np.frombuffer(trace, np.uint64), np.frombuffer(sizes, np.uint64), read)
    else:
        ips = np.frombuffer(trace, np.uint64).copy()
    ips = ips[ips != SENTINEL]
    ips = _collapse_rep(ips, read)
    result = Run(elf, function, tuple(args), ips, mu.reg_read(X.UC_X86_REG_RAX), SENTINEL)
    result.load_address = BUILDS[opt][1]
    result.ips = (ips + np.uint64(result.bias % (1 << 64))).astype(np.uint64)
    return result


def _expand_blocks(starts: np.ndarray, sizes: np.ndarray, read) -> np.ndarray:
    """Instruction IPs of executed blocks, each block decoded once."""
    cache: dict[tuple[int, int], np.ndarray] = {}
    parts = []
    for start, size in zip(map(int, starts), map(int, sizes), strict=True):
        key = (start, size)
        got = cache.get(key)
        if got is None:
            dec = iced.Decoder(64, read(start, size), ip=start)
            got = np.array([ins.ip for ins in dec], np.uint64)
            cache[key] = got
        parts.append(got)
    return np.concatenate(parts) if parts else np.zeros(0, np.uint64)


def expand_pt_blocks(blocks: list[tuple[int, int, int]], read) -> np.ndarray:
    """Instruction IPs of libipt's blocks ``(ip, end_ip, ninsn)``: sequential
    instructions, apart from direct jumps and calls, which are followed."""
    from hwtrace.isa.x86 import IClass, InsnCache, Special

    cache = InsnCache(read)
    out: list[int] = []
    for ip, end_ip, ninsn in blocks:
        for k in range(ninsn):
            out.append(ip)
            if k == ninsn - 1:
                break
            insn = cache.get(ip, 64)
            if isinstance(insn, int):
                raise ValueError(f"block at {ip:#x}: no instruction")
            direct = insn.is_direct and insn.special != Special.JMPABS
            if direct and insn.iclass in (IClass.JUMP, IClass.CALL):
                ip = (insn.next_ip + insn.displacement) & 0xFFFFFFFFFFFFFFFF
            else:
                ip = insn.next_ip
        if out and out[-1] != end_ip:
            raise ValueError(f"block ends at {out[-1]:#x}, libipt says {end_ip:#x}")
    return np.array(out, np.uint64)


def case(name: str, opt: str = "-O2") -> Run:
    """The emulated path of one of :data:`CASES` (cached)."""
    return _case(name, opt)


@functools.cache
def _case(name: str, opt: str) -> Run:
    return run(name, CASES[name], opt, blocks=True)


__all__ = [
    "BUILDS",
    "CASES",
    "OPT_LEVELS",
    "PROGRAM",
    "SENTINEL",
    "Run",
    "build",
    "case",
    "expand_pt_blocks",
    "run",
    "skip_reason",
    "symbols",
]
