"""Instruction-flow decoding throughput: hwtrace against Intel's libipt.

Generates (once) a long Intel PT trace of real compiled code and its image:

* ``bench/flow_workload.c`` (sorting with indirect comparator calls, a hash
  table, recursive tree walks, a switch-dispatch interpreter, a string scan)
  is compiled with ``gcc -O2`` into a freestanding static executable;
* the executable runs under the unicorn emulator, which records the address
  and size of every executed basic block; each distinct block is split into
  instructions with iced-x86, so the block sequence expands to the IP of
  every executed instruction (well over 100 million);
* ``hwtrace.pt.encode.encode_path`` turns that IP sequence into Intel PT.

The ELF, the trace and what the emulator saw are cached in
``bench/out/flow-<hash>/``, keyed by a hash of everything that shapes them
(the workload source, compiler and flags, the encoder's source).  Then every
instruction of the trace is reconstructed, in the same run, by

* libipt's block decoder (``pt_blk_next``) and instruction decoder
  (``pt_insn_next``), each in a C loop (``bench/libipt/ptflow_loop.c``) over
  the ELF's ``PT_LOAD`` segments, best of N runs;
* hwtrace's decoder (``hwtrace.pt.decode.decode_trace``) on one core and in
  parallel on every core, one warm-up run (numba compiles), then best of N;

and prints instructions per second, the ratio to ``pt_blk_next`` and whether
every decoder found exactly the instructions the emulator executed.

A second table gives throughput in trace bytes (MB/s, MB = 10^6 bytes),
with libxdc (kAFL/Nyx's decoder, https://github.com/nyx-fuzz/libxdc, pinned
at ``LIBXDC_COMMIT``) as a peer.  libxdc produces a coverage bitmap, not
instructions, and only accepts traces recorded with return compression and
TSC, MTC and CYC packets off (its readme): on ``flow.pt`` it stops at the
first TSC.  So the same instruction path is also encoded that way, once, as
``flow-libxdc.pt`` in the cache directory, and libxdc and hwtrace are both
timed on it.  libxdc runs in a C loop (``bench/libxdc/xdc_loop.c``) built
against libxdc's Makefile build (``bench/out/libxdc-<commit>/``); its
sources come from ``--libxdc-src DIR`` (or ``$HWTRACE_LIBXDC_SRC``), else a
clone of GitHub's repository or of a local mirror into
``bench/out/libxdc-src``.  It needs capstone 4 (Debian's ``libcapstone-dev``,
installed by the benchmark when it runs as root with apt-get); without it
libxdc is skipped and the rest runs.

    python bench/bench_flow.py [--repeat N] [--check] [--regenerate] [--libxdc-src DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import common
import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out"
WORKLOAD = HERE / "flow_workload.c"
ENCODER = REPO / "src" / "hwtrace" / "pt" / "encode.py"

# Workload rounds: 17.4 million instructions per four rounds (every fourth
# builds deep trees), so 28 rounds give ~122 million instructions; emulating
# them takes about half a minute.
ROUNDS = 28
MIN_INSTRUCTIONS = 100_000_000
# Freestanding (no libc, no system calls: unicorn has no kernel) and free of
# `rep` string instructions, whose repetitions unicorn reports as separate
# block executions while Intel PT treats them as one instruction.
GCC_FLAGS = (
    "-O2", "-static", "-nostdlib", "-ffreestanding", "-fno-pie", "-no-pie",
    "-fno-builtin", "-fno-tree-loop-distribute-patterns", "-mstringop-strategy=loop",
    "-fcf-protection=none", "-fno-stack-protector", "-Wall", "-Wextra",
)  # fmt: skip
STACK_TOP = 0x7FFF_F000_0000
STACK_SIZE = 8 << 20
# Bump when the generation below changes in a way the hash cannot see.
GEN_VERSION = 1
TIMING_FIELDS = ("mtc_freq", "nom_freq", "cpuid_0x15_eax", "cpuid_0x15_ebx")


def import_hwtrace(module: str, name: str) -> tuple[Any, str]:
    """Return ``(module.name, "")`` or ``(None, why not)``; falls back to the
    checkout's ``src`` when hwtrace is not installed."""
    src = str(REPO / "src")
    for attempt in range(2):
        try:
            return getattr(importlib.import_module(module), name), ""
        except Exception as exc:  # a missing or half-written module must not stop the bench
            if attempt or src in sys.path:
                return None, f"{type(exc).__name__}: {exc}"
            sys.path.insert(0, src)
            for mod in [m for m in sys.modules if m == "hwtrace" or m.startswith("hwtrace.")]:
                del sys.modules[mod]
    raise AssertionError("unreachable")


# -- generation ----------------------------------------------------------------


@dataclass
class Workload:
    """The cached artefacts of one generation."""

    directory: Path

    @property
    def elf(self) -> Path:
        return self.directory / "flow_workload"

    @property
    def trace(self) -> Path:
        return self.directory / "flow.pt"

    @property
    def meta_path(self) -> Path:
        return self.directory / "flow.json"

    @property
    def blocks_path(self) -> Path:
        return self.directory / "blocks.npz"

    def meta(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.meta_path.read_text())
        return result

    def complete(self) -> bool:
        paths = (self.elf, self.trace, self.meta_path, self.blocks_path)
        return all(p.is_file() for p in paths)


def shown(path: Path) -> str:
    """``path`` relative to the checkout when inside it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def gcc() -> str:
    compiler = shutil.which(os.environ.get("CC") or "gcc")
    if compiler is None:
        raise SystemExit("no C compiler (gcc) on PATH: cannot build the workload")
    return compiler


def generation_key(compiler: str) -> str:
    """A hash of everything the ELF and the trace depend on."""
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, check=True
    ).stdout.splitlines()[0]
    import unicorn

    h = hashlib.sha256()
    for part in (str(GEN_VERSION), version, " ".join(GCC_FLAGS), str(ROUNDS), unicorn.__version__):
        h.update(part.encode() + b"\0")
    h.update(WORKLOAD.read_bytes())
    h.update(ENCODER.read_bytes() if ENCODER.is_file() else b"no encoder")
    return h.hexdigest()[:16]


def compile_workload(compiler: str, target: Path) -> None:
    cmd = [compiler, *GCC_FLAGS, f"-DWORKLOAD_ROUNDS={ROUNDS}", "-o", str(target), str(WORKLOAD)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"building the workload failed:\n{' '.join(cmd)}\n{proc.stderr}")


def load_segments(elf_path: Path) -> list[tuple[int, int, int, int]]:
    """``(offset, filesz, vaddr, memsz)`` of every ``PT_LOAD`` segment with
    file bytes, what ptxed (and libipt's image) would map."""
    from elftools.elf.elffile import ELFFile

    with open(elf_path, "rb") as f:
        elf = ELFFile(f)
        return [
            (seg["p_offset"], seg["p_filesz"], seg["p_vaddr"], seg["p_memsz"])
            for seg in elf.iter_segments()
            if seg["p_type"] == "PT_LOAD" and seg["p_filesz"] > 0
        ]


def elf_symbol(elf_path: Path, name: str) -> int:
    from elftools.elf.elffile import ELFFile

    with open(elf_path, "rb") as f:
        symtab = ELFFile(f).get_section_by_name(".symtab")
        for sym in symtab.iter_symbols():
            if sym.name == name:
                return int(sym["st_value"])
    raise SystemExit(f"{elf_path}: no symbol {name}")


@dataclass
class BlockTrace:
    """What the emulator executed, compactly: the sequence of basic blocks
    (indices into the table) and, per distinct block, its instructions."""

    sequence: np.ndarray  # uint16/uint32 block index per executed block
    address: np.ndarray  # uint64 block start
    ninsn: np.ndarray  # int64 instructions per block
    first: np.ndarray  # int64 index of the block's first instruction in insn_ips
    insn_ips: np.ndarray  # uint64 instruction addresses of all blocks, block after block

    @property
    def instructions(self) -> int:
        return int(np.bincount(self.sequence, minlength=len(self.ninsn)) @ self.ninsn)

    def ips(self) -> np.ndarray:
        """The IP of every executed instruction, in order (uint64)."""
        counts = self.ninsn[self.sequence]
        total = int(counts.sum())
        # Instruction k of the path, the j-th of its block, is insn_ips[first
        # + j], and j = k - (where the block's instructions start in the path).
        index = np.repeat(self.first[self.sequence] - (np.cumsum(counts) - counts), counts)
        index += np.arange(total, dtype=np.int64)
        return self.insn_ips[index]

    def save(self, path: Path) -> None:
        with open(path, "wb") as f:
            np.savez(f, sequence=self.sequence, address=self.address, ninsn=self.ninsn,
                     first=self.first, insn_ips=self.insn_ips)  # fmt: skip

    @classmethod
    def load(cls, path: Path) -> BlockTrace:
        with np.load(path) as z:
            return cls(z["sequence"], z["address"], z["ninsn"], z["first"], z["insn_ips"])


def emulate(elf_path: Path) -> BlockTrace:
    """Run the workload under unicorn from ``_start`` to ``workload_done``."""
    from elftools.elf.elffile import ELFFile
    from iced_x86 import Decoder
    from unicorn import UC_ARCH_X86, UC_HOOK_BLOCK, UC_MODE_64, Uc
    from unicorn.x86_const import UC_X86_REG_RSP

    with open(elf_path, "rb") as f:
        entry = int(ELFFile(f).header["e_entry"])
    done = elf_symbol(elf_path, "workload_done")
    image = elf_path.read_bytes()

    uc = Uc(UC_ARCH_X86, UC_MODE_64)
    for offset, filesz, vaddr, memsz in load_segments(elf_path):
        lo, hi = vaddr & ~0xFFF, (vaddr + memsz + 0xFFF) & ~0xFFF
        uc.mem_map(lo, hi - lo)  # zero-filled: .bss needs no writing
        uc.mem_write(vaddr, image[offset : offset + filesz])
    uc.mem_map(STACK_TOP - STACK_SIZE, STACK_SIZE)
    uc.reg_write(UC_X86_REG_RSP, STACK_TOP - 64)

    # One Python call per executed block (about a million a second); typed
    # arrays keep the 32 M blocks at 10 bytes each.
    addresses = array("Q")
    sizes = array("H")
    add_address, add_size = addresses.append, sizes.append

    def on_block(_uc: Any, address: int, size: int, _data: Any) -> None:
        add_address(address)
        add_size(size)

    uc.hook_add(UC_HOOK_BLOCK, on_block)
    uc.emu_start(entry, done)

    addr = np.frombuffer(addresses, dtype=np.uint64)
    size = np.frombuffer(sizes, dtype=np.uint16).astype(np.uint64)
    # unicorn stops *at* workload_done; a block reported there never ran.
    if len(addr) and addr[-1] == done:
        addr, size = addr[:-1], size[:-1]
    # Blocks are identified by start and size: an emulator may translate the
    # same start twice with different lengths.
    keys, sequence = np.unique((addr << np.uint64(16)) | size, return_inverse=True)
    dtype = np.uint16 if len(keys) <= 0xFFFF else np.uint32

    address = keys >> np.uint64(16)
    ninsn = np.zeros(len(keys), dtype=np.int64)
    first = np.zeros(len(keys), dtype=np.int64)
    insn_ips: list[int] = []
    for i, key in enumerate(keys.tolist()):
        start, length = key >> 16, key & 0xFFFF
        code = bytes(uc.mem_read(start, length))
        first[i] = len(insn_ips)
        end = start
        for insn in Decoder(64, code, ip=start):
            # A repeated string instruction is one instruction to Intel PT
            # but one block execution per repetition to unicorn.
            repeated = insn.is_string_instruction and (insn.has_rep_prefix or insn.has_repne_prefix)
            if insn.is_invalid or repeated:
                raise SystemExit(f"workload block at {start:#x}: unusable instruction {insn}")
            insn_ips.append(insn.ip)
            end = insn.next_ip
        if end != start + length:
            raise SystemExit(f"workload block at {start:#x}: instructions overrun the block")
        ninsn[i] = len(insn_ips) - first[i]
    return BlockTrace(
        sequence.astype(dtype).reshape(-1),
        address,
        ninsn,
        first,
        np.array(insn_ips, dtype=np.uint64),
    )


def generate(workload: Workload, compiler: str) -> None:
    """Build, emulate and encode into ``workload.directory`` (written under a
    temporary name and renamed, so an interrupted run leaves no cache)."""
    encode_path, why = import_hwtrace("hwtrace.pt.encode", "encode_path")
    if encode_path is None:
        raise SystemExit(f"cannot import hwtrace.pt.encode.encode_path ({why}): no trace")
    from hwtrace.image import Image

    tmp = workload.directory.with_name(workload.directory.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    staged = Workload(tmp)

    t0 = time.perf_counter()
    compile_workload(compiler, staged.elf)
    print("  emulating the workload under unicorn ...", flush=True)
    t1 = time.perf_counter()
    blocks = emulate(staged.elf)
    t2 = time.perf_counter()
    ips = blocks.ips()
    instructions = len(ips)
    if instructions < MIN_INSTRUCTIONS:
        raise SystemExit(f"the workload ran only {instructions:,} instructions; raise ROUNDS")
    print(f"  {instructions:,} instructions in {len(blocks.sequence):,} blocks "
          f"({t2 - t1:.1f} s); encoding ...", flush=True)  # fmt: skip
    t3 = time.perf_counter()
    image = Image()
    image.add_elf(staged.elf)
    # The last instruction is workload_main's RET: the trace ends with a
    # TIP.PGD at its target.  Timing as perf records by default (TSC, MTC
    # every 8 crystal ticks, no CYC) on a 2.4 GHz part with a 24 MHz crystal
    # and a 100 MHz bus: an MTC every ~800 instructions, so the decoders also
    # do the time keeping a real trace needs.
    encoded = encode_path(ips, image, end_ip=elf_symbol(staged.elf, "workload_done"),
                          tsc=1 << 40, mtc_freq=3, ctc_ratio=100, cbr=24)  # fmt: skip
    del ips
    t4 = time.perf_counter()
    staged.trace.write_bytes(encoded.data)
    blocks.save(staged.blocks_path)
    config = encoded.config
    meta = {
        "instructions": instructions,
        "blocks_executed": len(blocks.sequence),
        "distinct_blocks": len(blocks.ninsn),
        "trace_bytes": len(encoded.data),
        "rounds": ROUNDS,
        # The decoders' configuration: ptxed's options / PtConfig fields.
        "config": {key: int(getattr(config, key)) for key in TIMING_FIELDS},
        "encoder_stats": encoded.stats,
        "generation_seconds": {
            "compile": t1 - t0,
            "emulate": t2 - t1,
            "expand": t3 - t2,
            "encode": t4 - t3,
        },
    }
    staged.meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    shutil.rmtree(workload.directory, ignore_errors=True)
    tmp.replace(workload.directory)
    # Generations for older sources are never used again: ~80 MB each.
    for old in workload.directory.parent.glob("flow-" + "?" * 16):
        if old != workload.directory:
            shutil.rmtree(old, ignore_errors=True)


def prepare(regenerate: bool) -> Workload:
    compiler = gcc()
    workload = Workload(OUT / f"flow-{generation_key(compiler)}")
    if workload.complete() and not regenerate:
        print(f"reusing {shown(workload.directory)}")
        return workload
    print(f"generating {shown(workload.directory)} ...", flush=True)
    t0 = time.perf_counter()
    generate(workload, compiler)
    print(f"  done in {time.perf_counter() - t0:.1f} s")
    return workload


# -- measuring -----------------------------------------------------------------


def time_hwtrace(
    decode_trace: Callable[..., Any],
    workload: Workload,
    repeat: int,
    jobs: int,
    keep: bool,
    *,
    trace: Path | None = None,
    warmup: bool = True,
) -> dict[str, Any]:
    """Best of ``repeat`` runs of ``decode_trace`` after one warm-up run (numba
    compiles on first use; ``warmup=False`` when an earlier call compiled).
    Image and configuration are built outside the timing, as for libipt.
    ``trace``: another encoding of the workload's path (default its trace)."""
    from hwtrace.image import Image
    from hwtrace.pt.config import PtConfig

    data = (trace or workload.trace).read_bytes()
    # keep_blocks=False decodes everything but keeps only totals, events and
    # gaps: the work libipt's loop does.  With it, the block columns stay.
    kwargs: dict[str, Any] = {"keep_blocks": keep}
    if jobs > 1:
        kwargs["jobs"] = jobs
    timing = workload.meta()["config"]

    def run() -> tuple[float, Any]:
        image = Image()
        image.add_elf(workload.elf)
        config = PtConfig(**timing)
        t0 = time.perf_counter()
        result = decode_trace(data, image, config, **kwargs)
        return time.perf_counter() - t0, result

    warmup_seconds = run()[0] if warmup else None
    best = float("inf")
    counts = set()
    for _ in range(repeat):
        seconds, result = run()
        best = min(best, seconds)
        counts.add(instruction_count(result))
    if len(counts) > 1:
        print(f"warning: hwtrace instruction count changed between runs: {sorted(counts)}")
    instructions = instruction_count(result)
    return {
        "instructions": instructions,
        "errors": len(getattr(result, "gaps", ())),
        "best_seconds": best,
        "insn_per_s": instructions / best,
        "warmup_seconds": warmup_seconds,
        "bytes": len(data),
        "result": result,
    }


def instruction_count(result: Any) -> int:
    """The instruction count of a decode result (``n_insn`` when it has one)."""
    count = getattr(result, "n_insn", None)
    if count is None:
        count = len(result.instructions())
    return int(count)


# -- libxdc ---------------------------------------------------------------------

LIBXDC_URL = "https://github.com/nyx-fuzz/libxdc"
# Pinned, so that figures from different machines come from the same decoder.
LIBXDC_COMMIT = "7a7894a"
# A local mirror of LIBXDC_URL, cloned from when GitHub cannot be reached.
LIBXDC_MIRROR = Path("/work/.mirror/nyx-fuzz+libxdc/repo")
LIBXDC_HARNESS = HERE / "libxdc" / "xdc_loop.c"
# libxdc's Makefile compiles with -Ofast -flto: its archive holds LTO objects,
# so the harness links with the same flags (as its tester_static target does).
LIBXDC_CFLAGS = ("-Ofast", "-flto", "-Wall", "-Wextra")
CAPSTONE_HINT = "install capstone 4 as root: apt-get install -y libcapstone-dev"
XDC_SUCCESS = ("decoder_success", "decoder_success_pt_overflow")


class LibxdcSkipped(Exception):
    """Why libxdc cannot be measured here."""


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "no message"


def git(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # No credential prompt: an unreachable or private origin fails at once.
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    try:
        return subprocess.run(["git", *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, env=env, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(args, 1, "", f"git: {exc}")


def libxdc_source(given: Path | None) -> Path:
    """libxdc's source tree: ``given`` as it is, else a clone of LIBXDC_URL
    (or of LIBXDC_MIRROR) in bench/out/libxdc-src checked out at
    LIBXDC_COMMIT."""
    if given is not None:
        if not ((given / "libxdc.h").is_file() and (given / "Makefile").is_file()):
            raise LibxdcSkipped(f"{given} has no libxdc.h and Makefile")
        return given
    checkout = OUT / "libxdc-src"
    if not (checkout / ".git").exists():
        failures = []
        for origin in (LIBXDC_URL, str(LIBXDC_MIRROR)):
            if origin == str(LIBXDC_MIRROR) and not LIBXDC_MIRROR.is_dir():
                continue
            shutil.rmtree(checkout, ignore_errors=True)
            print(f"libxdc: git clone {origin} ...", flush=True)
            proc = git("clone", "--quiet", origin, checkout)
            if proc.returncode == 0:
                break
            failures.append(f"git clone {origin}: {last_line(proc.stderr)}")
        else:
            shutil.rmtree(checkout, ignore_errors=True)
            raise LibxdcSkipped("no sources; " + "; ".join(failures) +
                                "; give a checkout with --libxdc-src DIR")  # fmt: skip
    checkout_cmd = ("-C", checkout, "checkout", "--quiet", "--detach", LIBXDC_COMMIT)
    if git(*checkout_cmd).returncode != 0:
        git("-C", checkout, "fetch", "--quiet", "origin")  # a clone older than the pin
        proc = git(*checkout_cmd)
        if proc.returncode != 0:
            raise LibxdcSkipped(f"cannot check out {LIBXDC_COMMIT} in {shown(checkout)}: "
                                f"{last_line(proc.stderr)}")  # fmt: skip
    return checkout


def libxdc_id(source: Path) -> str:
    """The source tree's commit (short) when it is a clean git checkout, else
    a hash of its sources: the name of its build directory."""
    top = git("-C", source, "rev-parse", "--show-toplevel")
    if top.returncode == 0 and Path(top.stdout.strip()).resolve() == source.resolve():
        status = git("-C", source, "status", "--porcelain", "--untracked-files=no")
        head = git("-C", source, "rev-parse", "--short=7", "HEAD")
        if status.returncode == 0 and not status.stdout.strip() and head.returncode == 0:
            return head.stdout.strip()
    h = hashlib.sha256()
    for path in sorted([source / "Makefile", source / "libxdc.h", *(source / "src").iterdir()]):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return "src-" + h.hexdigest()[:12]


def capstone_problem(compiler: str) -> str | None:
    """Why libxdc cannot be built against the installed capstone (None: it can)."""
    probe = "#include <capstone/capstone.h>\n#if CS_API_MAJOR != 4\n#error not 4\n#endif\n"
    cmd = [compiler, "-E", "-x", "c", "-o", os.devnull, "-"]
    proc = subprocess.run(cmd, input=probe, capture_output=True, text=True, check=False)
    if proc.returncode == 0:
        return None
    if "not 4" in proc.stderr:
        return f"libxdc needs capstone 4, another version is installed; {CAPSTONE_HINT}"
    return f"capstone's headers are missing; {CAPSTONE_HINT}"


def ensure_capstone(compiler: str) -> None:
    """Capstone 4's headers, installed from Debian when missing (as root
    with apt-get, as the benchmark's setup); LibxdcSkipped says why not."""
    problem = capstone_problem(compiler)
    if problem is not None and "missing" in problem:
        try:
            common.apt_install(["libcapstone-dev"], "capstone 4's headers (for libxdc)")
        except common.BenchError as exc:
            raise LibxdcSkipped(str(exc)) from None
        problem = capstone_problem(compiler)
    if problem is not None:
        raise LibxdcSkipped(problem)


def libxdc_harness(source_dir: Path | None) -> tuple[Path, Path]:
    """libxdc built from its sources (``source_dir``, else the pinned clone)
    against capstone 4 and the timing harness linked to it: ``(harness,
    directory)``; LibxdcSkipped says why it cannot be."""
    compiler = gcc()
    ensure_capstone(compiler)
    harness, directory = build_libxdc(libxdc_source(source_dir), compiler)
    if directory.name != f"libxdc-{LIBXDC_COMMIT}":
        print(f"libxdc: note: {directory.name} is not the pinned commit {LIBXDC_COMMIT}; "
              "its figures may not compare with others")  # fmt: skip
    return harness, directory


def build_libxdc(source: Path, compiler: str) -> tuple[Path, Path]:
    """libxdc.a built by libxdc's Makefile in bench/out/libxdc-<id>/ (kept:
    built once) and the harness linked against it: (harness, directory)."""
    directory = OUT / f"libxdc-{libxdc_id(source)}"
    library = directory / "libxdc.a"
    if not library.is_file():
        # Built in a copy: the source tree (maybe the user's) stays untouched,
        # and a failed build leaves no half-built directory behind.
        tmp = directory.with_name(directory.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(source / "src", tmp / "src")
        for name in ("Makefile", "libxdc.h"):
            shutil.copy2(source / name, tmp / name)
        print(f"libxdc: make libxdc.a in {shown(directory)} ...", flush=True)
        cmd = ["make", "-C", str(tmp), f"CC={compiler}", "libxdc.a"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise LibxdcSkipped(f"make libxdc.a failed: {last_line(proc.stderr or proc.stdout)}")
        shutil.rmtree(directory, ignore_errors=True)
        tmp.replace(directory)
    h = hashlib.sha256(" ".join((compiler, *LIBXDC_CFLAGS)).encode())
    h.update(LIBXDC_HARNESS.read_bytes())
    harness = directory / f"xdc_loop-{h.hexdigest()[:12]}"
    if not harness.is_file():
        tmp = directory / f".{harness.name}.{os.getpid()}.tmp"
        cmd = [compiler, *LIBXDC_CFLAGS, "-I", str(directory), "-o", str(tmp),
               str(LIBXDC_HARNESS), str(library), "-lcapstone"]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise LibxdcSkipped(f"building {LIBXDC_HARNESS.name} failed: {last_line(proc.stderr)}")
        os.replace(tmp, harness)
    return harness, directory


def libxdc_trace(workload: Workload) -> tuple[Path, dict[str, Any]]:
    """The workload's instruction path encoded as libxdc's readme requires
    (return compression off, no TSC, MTC or CYC packets), cached beside
    flow.pt: ``(trace, metadata)``."""
    trace = workload.directory / "flow-libxdc.pt"
    meta_path = workload.directory / "flow-libxdc.json"
    if trace.is_file() and meta_path.is_file():
        meta: dict[str, Any] = json.loads(meta_path.read_text())
        return trace, meta
    encode_path, why = import_hwtrace("hwtrace.pt.encode", "encode_path")
    if encode_path is None:
        raise LibxdcSkipped(f"cannot import hwtrace.pt.encode.encode_path ({why})")
    from hwtrace.image import Image

    print(f"libxdc: encoding {shown(trace)} (no return compression, no timing) ...", flush=True)
    t0 = time.perf_counter()
    ips = BlockTrace.load(workload.blocks_path).ips()
    image = Image()
    image.add_elf(workload.elf)
    encoded = encode_path(ips, image, end_ip=elf_symbol(workload.elf, "workload_done"),
                          ret_compression=False)  # fmt: skip
    del ips
    meta = {
        "trace_bytes": len(encoded.data),
        "ret_compression": False,
        "timing": None,
        "encoder_stats": encoded.stats,
        "encode_seconds": time.perf_counter() - t0,
    }
    tmp = trace.with_name(trace.name + f".tmp{os.getpid()}")
    tmp.write_bytes(encoded.data)
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    tmp.replace(trace)
    return trace, meta


def branch_count(workload: Workload) -> int:
    """Branches executed (jumps, calls, returns: what ends a basic block), from
    the emulator's blocks; libxdc's trace mode reports an edge for each."""
    from iced_x86 import Decoder, FlowControl

    blocks = BlockTrace.load(workload.blocks_path)
    image = workload.elf.read_bytes()
    segments = load_segments(workload.elf)

    def ends_in_branch(ip: int) -> bool:
        for offset, filesz, vaddr, _ in segments:
            if vaddr <= ip < vaddr + filesz:
                code = image[offset + ip - vaddr : offset + filesz]
                return Decoder(64, code, ip=ip).decode().flow_control != FlowControl.NEXT
        raise SystemExit(f"{workload.elf}: no code at {ip:#x}")

    last = blocks.insn_ips[blocks.first + blocks.ninsn - 1]
    branch = np.array([ends_in_branch(ip) for ip in last.tolist()], dtype=np.int64)
    return int(np.bincount(blocks.sequence, minlength=len(last)) @ branch)


def run_libxdc(
    harness: Path, elf: Path, trace: Path, repeat: int, *, strip_timing: bool = False
) -> dict[str, Any]:
    """One run of the harness: a first decode, best of ``repeat`` warm ones
    and a trace-mode decode counting edges (see bench/libxdc/xdc_loop.c)."""
    cmd = [str(harness), str(elf), str(trace), str(repeat)]
    if strip_timing:
        cmd.append("--strip-timing")
    try:
        out = common.run(cmd, timeout=1800).stdout
    except common.BenchError as exc:
        raise LibxdcSkipped(str(exc)) from None
    fields = dict(item.split("=", 1) for item in out.split())
    return {
        "bytes": int(fields["bytes"]),
        "first_seconds": float(fields["first_seconds"]),
        "first_result": fields["first_result"],
        "best_seconds": float(fields["seconds"]),
        "result": fields["result"],
        "edges": int(fields["edges"]),
        "edges_result": fields["edges_result"],
    }


def measure_libxdc(
    workload: Workload,
    repeat: int,
    source_dir: Path | None,
    decode_trace: Callable[..., Any] | None,
) -> dict[str, Any] | None:
    """Build libxdc and time it on flow.pt and on flow-libxdc.pt, and
    hwtrace (1 thread, counting) on flow-libxdc.pt; None (after saying why)
    when libxdc cannot be built or run here."""
    try:
        harness, directory = libxdc_harness(source_dir)
        print(f"libxdc: {shown(workload.trace)} as it is, and without timing packets ...",
              flush=True)  # fmt: skip
        found: dict[str, Any] = {
            "directory": directory,
            "repeat": repeat,
            "as_is": run_libxdc(harness, workload.elf, workload.trace, 1),
            "stripped": run_libxdc(harness, workload.elf, workload.trace, 1, strip_timing=True),
        }
        trace, meta = libxdc_trace(workload)
        found.update(trace=trace, trace_meta=meta, branches=branch_count(workload))
        print(f"libxdc: {shown(trace)}, first run + best of {repeat} ...", flush=True)
        found["libxdc"] = run_libxdc(harness, workload.elf, trace, repeat)
    except LibxdcSkipped as exc:
        print(f"libxdc: skipped ({exc})")
        return None
    if decode_trace is not None:
        print(f"hwtrace: decode_trace on {shown(trace)}, best of {repeat} ...", flush=True)
        # numba compiled in the runs on flow.pt: no warm-up.
        found["hwtrace"] = time_hwtrace(decode_trace, workload, repeat, 1, False,
                                        trace=trace, warmup=False)  # fmt: skip
    return found


def mb_per_s(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e6:.1f}"


def print_bytes_table(rows: list[tuple[str, ...]]) -> None:
    # Wide enough in a pipe for libxdc's result names.
    common.print_table("Intel PT decoding, trace bytes per second (MB = 10^6 bytes)",
                       ("decoder", "trace", "MB/s", "seconds", "result"), rows, width=110)  # fmt: skip


def print_libxdc(
    results: list[tuple[str, dict[str, Any]]], workload: Workload, found: dict[str, Any] | None
) -> bool:
    """The trace-bytes table: every decoder on flow.pt, libxdc and hwtrace on
    flow-libxdc.pt, then what libxdc made of each trace.  False when
    hwtrace's instruction count on flow-libxdc.pt is wrong."""
    flow = workload.trace.name
    rows: list[tuple[str, ...]] = []
    for name, res in results:
        seconds = float(res["best_seconds"])
        rows.append((name, flow, mb_per_s(int(res["bytes"]), seconds), f"{seconds:.3f}",
                     f"{int(res['instructions']):,} insn"))  # fmt: skip
    if found is None:
        rows.append(("libxdc", flow, "-", "-", "skipped"))
        print_bytes_table(rows)
        return True

    def xdc_row(name: str, trace: str, nbytes: int, seconds: float, result: str) -> None:
        # A failed decode stopped early or went astray: its speed means nothing.
        ok = result in XDC_SUCCESS
        rate = mb_per_s(nbytes, seconds) if ok else "-"
        rows.append((name, trace, rate, f"{seconds:.3f}" if ok else "-", result))

    as_is, stripped, xdc = found["as_is"], found["stripped"], found["libxdc"]
    xdc_row("libxdc", flow, as_is["bytes"], as_is["best_seconds"], as_is["result"])
    xdc_row("libxdc, timing packets dropped", flow, stripped["bytes"],
            stripped["best_seconds"], stripped["result"])  # fmt: skip
    name = found["trace"].name
    hw = found.get("hwtrace")
    if hw is not None:
        seconds = float(hw["best_seconds"])
        rows.append(("hwtrace, 1 thread", name, mb_per_s(int(hw["bytes"]), seconds),
                     f"{seconds:.3f}", f"{int(hw['instructions']):,} insn"))  # fmt: skip
    xdc_row("libxdc, first run (fresh decoder)", name, xdc["bytes"], xdc["first_seconds"],
            xdc["first_result"])  # fmt: skip
    runs = f"best of {found['repeat']}"
    xdc_row(f"libxdc, warm caches, {runs}", name, xdc["bytes"], xdc["best_seconds"], xdc["result"])
    print_bytes_table(rows)

    expected = found["branches"] + 2  # plus the edges into and out of the traced code
    st = found["trace_meta"]["encoder_stats"]
    print(f"libxdc: {found['directory'].name} ({shown(found['directory'])}); it wants return "
          "compression and TSC, MTC and CYC packets off (its readme), so on "
          f"{flow} it stops at its first timing packet ({as_is['result']}); with the timing packets "
          f"dropped its compressed returns derail it: {stripped['edges']:,} edges of "
          f"{expected:,}, {stripped['edges_result']}")  # fmt: skip
    print(f"{name}: the same path without return compression or timing packets, "
          f"{int(found['trace_meta']['trace_bytes']):,} bytes ({st['tip']:,} TIPs, "
          f"{st['tnt_bits']:,} TNT bits)")  # fmt: skip
    extra, fups = xdc["edges"] - expected, int(st["psb"]) - 1
    if extra == 0:
        verdict = "agree"
    elif 0 < extra <= fups:
        # Checked on this trace: with the FUPs taken out of its PSB+ (and the
        # next IP sent in full), trace mode reports exactly the expected edges.
        verdict = (f"{extra:+,}: trace mode walks again from the FUP of a PSB+ "
                   f"({fups:,} here) and reports some edges twice")  # fmt: skip
    else:
        verdict = f"DIFFER ({extra:+,})"
    print(f"libxdc edges on {name} (trace mode): {xdc['edges']:,}, {xdc['edges_result']}; "
          f"the emulator's branches + 2: {expected:,}: {verdict}")  # fmt: skip
    if hw is not None and int(hw["instructions"]) != int(workload.meta()["instructions"]):
        print(f"hwtrace's instruction count on {name} DISAGREES with the emulator's")
        return False
    return True


def print_table(rows: list[tuple[str, ...]]) -> None:
    common.print_table(
        "Intel PT instruction-flow decoding",
        ("decoder", "Minsn/s", "instructions", "errors", "ratio vs pt_blk_next"),
        rows,
    )


def row(name: str, res: dict[str, Any], base: float) -> tuple[str, ...]:
    rate = float(res["insn_per_s"])
    return (
        name,
        f"{rate / 1e6:.1f}",
        f"{int(res['instructions']):,}",
        f"{int(res['errors'])}",
        f"{rate / base:.2f}x",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, metavar="N", help="timed runs, best kept")
    parser.add_argument(
        "--check",
        action="store_true",
        help="also compare hwtrace's instruction addresses with the emulator's, one by one",
    )
    parser.add_argument(
        "--regenerate", action="store_true", help="rebuild the workload and trace even if cached"
    )
    parser.add_argument(
        "--libxdc-src",
        type=Path,
        default=os.environ.get("HWTRACE_LIBXDC_SRC") or None,
        metavar="DIR",
        help="libxdc's source tree (default $HWTRACE_LIBXDC_SRC, else cloned into bench/out)",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    oracle = common.load_oracle()
    if oracle.skip_reason is not None:
        print(f"libipt is not available: {oracle.skip_reason}")
        print("(run `make oracles` as root to install libipt-dev)")
        return 2
    workload = prepare(args.regenerate)
    meta = workload.meta()
    expected = int(meta["instructions"])
    sections = [(workload.elf, off, size, vaddr) for off, size, vaddr, _ in
                load_segments(workload.elf)]  # fmt: skip

    results: list[tuple[str, dict[str, Any]]] = []
    for decoder, name in (("blk", "libipt pt_blk_next"), ("insn", "libipt pt_insn_next")):
        print(f"{name}: best of {args.repeat} ...", flush=True)
        res = oracle.flow_bench(workload.trace, sections, decoder, args.repeat, meta["config"])
        results.append((name, res))
    base = float(results[0][1]["insn_per_s"])

    decode_trace, why = import_hwtrace("hwtrace.pt.decode", "decode_trace")
    hw_single: dict[str, Any] | None = None
    if decode_trace is None:
        print(f"hwtrace: TODO, cannot import hwtrace.pt.decode.decode_trace ({why})")
    else:
        print(f"hwtrace: decode_trace, warm-up + best of {args.repeat} ...", flush=True)
        results.append(
            ("hwtrace, 1 thread", time_hwtrace(decode_trace, workload, args.repeat, 1, False))
        )
        # PSB-aligned chunks on every core: how hwtrace decodes large traces.
        jobs = os.cpu_count() or 1
        if jobs > 1:
            print(f"hwtrace: decode_trace(jobs={jobs}), warm-up + best of {args.repeat} ...")
            results.append(
                (
                    f"hwtrace, {jobs} threads",
                    time_hwtrace(decode_trace, workload, args.repeat, jobs, False),
                )
            )
        print("hwtrace: decode_trace keeping block columns ...", flush=True)
        hw_single = time_hwtrace(decode_trace, workload, args.repeat, 1, True)
        results.append(("hwtrace, 1 thread, block columns kept", hw_single))
    xdc = measure_libxdc(workload, args.repeat, args.libxdc_src, decode_trace)

    print()
    print_table([row(name, res, base) for name, res in results])
    print(f"trace: {shown(workload.trace)}, {int(meta['trace_bytes']):,} bytes; "
          f"image: {shown(workload.elf)} ({len(sections)} PT_LOAD segments)")  # fmt: skip
    st = meta["encoder_stats"]
    print(f"trace content: {st['tnt_bits']:,} TNT bits, {st['tip']:,} TIPs, "
          f"{st['ret_compressed']:,} compressed and {st['ret_uncompressed']:,} uncompressed "
          f"returns, {st['psb']:,} PSB+, {st['mtc']:,} MTCs")  # fmt: skip
    gen = meta["generation_seconds"]
    print("generation (cached): " + ", ".join(f"{k} {v:.1f} s" for k, v in gen.items()))
    if hw_single is not None:
        print(f"hwtrace warm-up run (includes numba compile): {hw_single['warmup_seconds']:.2f} s")

    status = 0
    disagree = [
        (n, int(r["instructions"])) for n, r in results if int(r["instructions"]) != expected
    ]
    if disagree:
        status = 1
        for name, count in disagree:
            print(f"instruction count DISAGREES: {name} {count:,}, emulator {expected:,} "
                  f"({count - expected:+,})")  # fmt: skip
    else:
        print(f"instruction counts agree with the emulator: {expected:,}")
    if args.check and hw_single is not None:
        truth = BlockTrace.load(workload.blocks_path).ips()
        got = hw_single["result"].instructions()
        if len(got) == len(truth) and np.array_equal(got, truth):
            print("hwtrace's instruction addresses match the emulator's, one by one")
        else:
            status = 1
            n = min(len(got), len(truth))
            diff = np.flatnonzero(got[:n] != truth[:n])
            at = int(diff[0]) if len(diff) else n
            print(f"hwtrace's instruction addresses DIFFER from instruction {at:,} on")
    print()
    if not print_libxdc(results, workload, xdc):
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
