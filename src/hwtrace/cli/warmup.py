"""Compile the decoders' loops before a first real use.

A loop runs from the native library (:mod:`hwtrace.aot`) once numba
has compiled it for the argument types a command passes; until then a
command pays for numba's import and compilation.  ``hwtrace aot warm``
(which ``make venv`` runs) decodes a small trace of a loop, encoded here,
the ways the commands do, so that numba compiles each of those loops, and
then builds the library: a user's first command starts in a fraction of a
second.  The ways come in parts (:data:`PARTS`): the library decoder
keeping and counting its results, ``ptxed`` with and without disassembly,
``ptdump`` in its forms, and the perf.data commands (``report``,
``script``) on the trace wrapped as a perf.data.  numba
compiles in one thread, so the parts run in two processes where there
are two CPUs, sharing numba's cache; the library is built from that cache once
they are done.  Loops other commands need are added to the library after
their first use.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ..image import Image
from ..pt.config import PtConfig
from ..pt.decode import decode_trace
from . import ptdump as ptdump_cli
from . import ptxed as ptxed_cli

BASE = 0x1000
# A counted loop with a call in it, then the end:
#   1000: mov ecx, 40        1005: call 1010         100a: dec ecx
#   100c: jnz 1005           100e: nop               1010: ret
CODE = bytes.fromhex("b928000000e806000000ffc975f79090c3")
LOOPS = 40


# The loop's trace, as hwtrace.pt.encode encodes _path() (kept as bytes:
# compiling the encoder would cost more than anything it warms; a test
# encodes it again): TSC, MTC every 2**3 ART ticks, CYC, PSB every 64 bytes.
TRACE = bytes.fromhex(
    "02820282028202820282028202820282190000000001000002730000000000020308009901022399017100"
    "100000000063fe63fe43590123fe63fe63fe23590206028202820282028202820282028202821940000000"
    "010000027310000000000203080099017d0c1000000000022353fe63fe53590313fe63fe63fe3359043"
    "3fe028202820282028202820282028202821987000000010000027321000003000203080099017d0a1000"
    "000000022363fe63fe135905210e10"
)
CONFIG = PtConfig(mtc_freq=3, nom_freq=8, cpuid_0x15_eax=1, cpuid_0x15_ebx=4)


def _path() -> np.ndarray:
    """The loop's executed instructions."""
    ips = [BASE]
    for _ in range(LOOPS):
        ips += [0x1005, 0x1010, 0x100A, 0x100C]
    return np.array(ips, np.uint64)


# The parts, in two chains of about equal work: the library decoder, the
# perf.data commands (which call it) and ptxed; and the decoder's largest
# callees (compiled at the same time as the decoder, which then finds
# them in numba's cache), ptdump and the decode to Parquet (its page
# encoders).  "subtrees" only helps "library".
PARTS = ("library", "perf", "ptxed", "ptdump", "decode")
CHAINS = (("library", "perf", "ptxed"), ("subtrees", "ptdump", "decode"))


def warm(jobs: int | None = None, parts: tuple[str, ...] = PARTS) -> None:
    """Decode the loop's trace the ways the commands do (output dropped):
    ``parts`` of :data:`PARTS`, in the processes of :data:`CHAINS` when
    ``jobs`` (default: the CPUs this process may use) allows."""
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(
            f"no warm-up part {', '.join(sorted(unknown))} (parts: {', '.join(PARTS)})"
        )
    _byte_compile()
    jobs = jobs or len(os.sched_getaffinity(0))
    if jobs <= 1:
        warm_parts(parts)
        return
    wanted = set(parts) | ({"subtrees"} if "library" in parts else set())
    chains = [[p for p in chain if p in wanted] for chain in CHAINS]
    procs = [
        subprocess.Popen([sys.executable, "-c", _WORKER, json.dumps(chain)])
        for chain in chains
        if chain
    ]
    failed = [p for p in procs if p.wait() != 0]
    if failed:
        raise RuntimeError("decoding the warm-up trace failed")


def _byte_compile() -> None:
    """Write the package's bytecode, as installers do (pip does not for an
    editable install, and nothing does where PYTHONDONTWRITEBYTECODE is
    set): a command then imports without compiling its modules' sources,
    about 0.05 s of every start.  Where the package is not writable this
    does nothing."""
    import compileall

    package = Path(__file__).resolve().parent.parent
    with contextlib.redirect_stdout(io.StringIO()):
        compileall.compile_dir(str(package), quiet=2, workers=1)


_WORKER = "import json, sys\nfrom hwtrace.cli.warmup import warm_parts\nwarm_parts(json.loads(sys.argv[1]))"


def warm_parts(parts) -> None:
    """Run the warm-up ``parts`` (names of :data:`PARTS`) in this process."""
    with tempfile.TemporaryDirectory(prefix="hwtrace-warm-") as tmp:
        code = Path(tmp) / "code.bin"
        code.write_bytes(CODE)
        image = Image()
        image.add_raw(code, address=BASE)
        trace = Path(tmp) / "loop.pt"
        trace.write_bytes(TRACE)
        cfg = CONFIG
        timing = ["--mtc-freq", str(cfg.mtc_freq), "--nom-freq", str(cfg.nom_freq),
                  "--cpuid-0x15.eax", str(cfg.cpuid_0x15_eax),
                  "--cpuid-0x15.ebx", str(cfg.cpuid_0x15_ebx)]  # fmt: skip
        status = 0
        if "subtrees" in parts:
            _decoder_subtrees(image, cfg)
        if "library" in parts:
            for keep in (True, False):
                decode_trace(TRACE, image, cfg, keep_blocks=keep)
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            if "ptdump" in parts:
                for extra in ([], ["--quiet"], ["--time", "--lastip"], ["--tcal"]):
                    status |= ptdump_cli.main([*extra, *timing, str(trace)])
            if "ptxed" in parts:
                raw = ["--raw", f"{code}:{BASE:#x}"]
                for extra in ([], ["--no-inst"], ["--quiet"]):
                    status |= ptxed_cli.main([*timing, *raw, *extra, "--pt", str(trace)],
                                             io.BytesIO())  # fmt: skip
            if "perf" in parts:
                status |= _perf_commands(Path(tmp), trace, cfg)
            if "decode" in parts:
                from .decode import main as decode_main

                data = _wrapped(Path(tmp), trace, cfg)
                status |= decode_main(["-i", str(data), "-o", str(Path(tmp) / "flow"),
                                       "--instructions", "--no-progress"])  # fmt: skip
        if status:
            raise RuntimeError("decoding the warm-up trace failed")


def _write_elf(path: Path) -> None:
    """The loop's code as a small executable with a symbol table (its two
    functions), as the perf.data commands meet programs: their symbol
    lookups get compiled too."""
    import struct

    names = b"\0warm_loop\0warm_callee\0"
    symtab = bytes(24) + b"".join(
        struct.pack("<IBBHQQ", name, 0x12, 0, 1, BASE + start, size)  # GLOBAL FUNC in .text
        for name, start, size in ((1, 0, 0x10), (11, 0x10, len(CODE) - 0x10))
    )
    shnames = b"\0.text\0.symtab\0.strtab\0.shstrtab\0"
    text_at = 0x1000
    sym_at = text_at + len(CODE) + (-(text_at + len(CODE)) % 8)
    str_at = sym_at + len(symtab)
    shstr_at = str_at + len(names)
    sh_at = shstr_at + len(shnames) + (-(shstr_at + len(shnames)) % 8)
    header = struct.pack(
        "<4sBBBBB7sHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, bytes(7), 2, 62, 1, BASE,
        64, sh_at, 0, 64, 56, 1, 64, 5, 4,
    )  # fmt: skip
    load = struct.pack("<IIQQQQQQ", 1, 5, text_at, BASE, BASE, len(CODE), len(CODE), 0x1000)
    sections = [
        bytes(64),
        struct.pack("<IIQQQQIIQQ", 1, 1, 6, BASE, text_at, len(CODE), 0, 0, 16, 0),
        struct.pack("<IIQQQQIIQQ", 7, 2, 0, 0, sym_at, len(symtab), 3, 1, 8, 24),
        struct.pack("<IIQQQQIIQQ", 15, 3, 0, 0, str_at, len(names), 0, 0, 1, 0),
        struct.pack("<IIQQQQIIQQ", 23, 3, 0, 0, shstr_at, len(shnames), 0, 0, 1, 0),
    ]
    out = bytearray(sh_at)
    out[: len(header)] = header
    out[64 : 64 + len(load)] = load
    out[text_at : text_at + len(CODE)] = CODE
    out[sym_at:str_at] = symtab
    out[str_at:shstr_at] = names
    out[shstr_at : shstr_at + len(shnames)] = shnames
    path.write_bytes(bytes(out) + b"".join(sections))


class _Typed(Exception):
    """Stops the decoder once its arguments are known."""


def _decoder_subtrees(image: Image, cfg: PtConfig) -> None:
    """Compile the flow decoder's largest callees (in the order opposite
    to the one in which compiling the decoder itself reaches them), for
    the arguments the decoder gets, so that another process compiling the
    decoder finds them in numba's cache."""
    from numba import typeof
    from numba.core import types

    from .. import aot
    from ..pt import _flowloop as F

    original = aot.CompiledLoop.__call__

    def typed(loop, *args):
        if loop is not F.run:
            return original(loop, *args)
        ds, pk, cf, ct, out = args
        base = (typeof(ds), typeof(pk), typeof(cf), typeof(ct))
        for callee, sig in (
            (F._proceed, (*base, typeof(out))),
            (F._fast, (*base, typeof(out))),
            (F._trailing, (*base, types.boolean)),
            (F.blk_resync, (*base, typeof(ds[13]))),
        ):
            callee.dispatcher.compile(sig)
        raise _Typed

    aot.CompiledLoop.__call__ = typed  # type: ignore[method-assign]
    try:
        decode_trace(TRACE, image, cfg, keep_blocks=True)
    except _Typed:
        pass
    finally:
        aot.CompiledLoop.__call__ = original  # type: ignore[method-assign]


def _wrapped(tmp: Path, trace: Path, cfg) -> Path:
    """The trace wrapped as a perf.data (made once)."""
    from ..perf.wrap import wrap_raw_trace

    data = tmp / "loop.data"
    if not data.exists():
        elf = tmp / "warm"
        _write_elf(elf)
        wrap_raw_trace(trace, data, elf=[(elf, None)], config=cfg, comm="warm")
    return data


def _perf_commands(tmp: Path, trace: Path, cfg) -> int:
    """The perf.data commands on the trace wrapped as a perf.data."""
    from . import perfcmds

    data = _wrapped(tmp, trace, cfg)
    status = 0
    for args in (["-i", str(data)], ["-i", str(data), "--blocks"]):
        status |= perfcmds.script_main(args)
    # (with the folded call paths, as the demo's report writes them)
    status |= perfcmds.report_main(["-i", str(data), "--folded", str(tmp / "folded")])
    return status


__all__ = ["warm"]
