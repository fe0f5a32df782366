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

    python bench/bench_flow.py [--repeat N] [--check] [--regenerate]
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
    decode_trace: Callable[..., Any], workload: Workload, repeat: int, jobs: int, keep: bool
) -> dict[str, Any]:
    """Best of ``repeat`` runs of ``decode_trace`` after one warm-up run (numba
    compiles on first use).  Image and configuration are built outside the
    timing, as for libipt."""
    from hwtrace.image import Image
    from hwtrace.pt.config import PtConfig

    data = workload.trace.read_bytes()
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

    warmup, result = run()
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
        "warmup_seconds": warmup,
        "result": result,
    }


def instruction_count(result: Any) -> int:
    """The instruction count of a decode result (``n_insn`` when it has one)."""
    count = getattr(result, "n_insn", None)
    if count is None:
        count = len(result.instructions())
    return int(count)


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
    return status


if __name__ == "__main__":
    sys.exit(main())
