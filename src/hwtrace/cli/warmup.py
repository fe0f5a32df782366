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
compiles in one thread, so the parts run in two processes (:data:`CHAINS`) where there
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
from ..image.sections import Section
from ..pt.codetable import CodeTable
from ..pt.config import PtConfig
from ..pt.decode import decode_trace
from ..pt.packets import psb_plus_end
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


PARTS = ("library", "perf", "record", "ptxed", "ptdump", "decode", "csdump", "trace", "calls")
#: The pieces of each part, as the processes run them.
PIECES = {
    "library": ("bytecode", "packets", "library", "subtrees", "fill"),
    "perf": ("attribution", "walks", "listing", "perfread", "script", "report"),
    "record": ("record",),
    "ptxed": ("ptxed",),
    "ptdump": ("ptdump",),
    "decode": ("decode",),
    "csdump": ("csdump",),
    "trace": ("trace",),
    "calls": ("calls",),
}
# The pieces in two chains of about equal work.  The decoder is compiled
# in two halves at once: one process compiles the packet and timing loops
# ("packets"), then the decoder ("library") from its entry; the other,
# once the first has cached the packet loops (it needs their results to
# type the decoder's arguments), the subtrees the decoder reaches last
# ("subtrees"), which the first then finds in numba's cache.  What runs the
# whole decoder waits for it to be cached.  Ordered after a simulation of
# the two processes on the compile times of each loop (numba compiles a
# function in the process that first needs it, again in another one that
# needs it before it is cached).
CHAINS = (
    ("packets", "library", "perfread", "script", "ptdump", "calls"),
    (
        "bytecode",
        "record",
        "attribution",
        "walks",
        "subtrees",
        "fill",
        "listing",
        "report",
        "ptxed",
        "decode",
        "csdump",
        "trace",
    ),
)
# While the first process compiles the packet loops, the second writes
# the bytecode of the modules the commands import where the installer left
# none ("bytecode": make demo installs without it, pip compiling every
# module of every dependency being a few seconds more than the few hundred
# imported), records /bin/true's calls to exit as the demo records its
# functions ("record": where the software backend records, its planner's
# loops are compiled then), compiles the loops that attribute a stream's
# blocks ("attribution", which both perf commands need) and the report's
# call-path walk ("walks": its arguments need no decoder, and it is most of
# what the report would compile).  While the first ends the decoder, the
# second compiles the code table's instruction decoding ("fill", which the
# decoder's first call needs next) and the script's listing and perf time
# loops ("listing", no decoder needed either); the first then compiles the
# perf.data reader's loops and perf's symbol tree ("perfread", which both
# perf commands meet first), and the perf commands find all but little
# compiled.  Measured on two CPUs: the demo's parts in 118 s where the
# walk and the listing compiled with their commands took 135 s.  Then the
# development parts: ptdump's listing loop (its single largest loop) in
# the first, ptxed's, the decoder to Parquet and the CoreSight listing in
# the second.
#: the piece another chain's piece waits for
AFTER = {
    "subtrees": "packets",
    "script": "listing",
    "report": "perfread",
    "decode": "library",
    "calls": "report",
}
# Longest a piece waits for another process's (that process failing
# ends the wait sooner: the parent stops both).
WAIT_SECONDS = 900.0


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
    wanted = {piece for part in parts for piece in PIECES[part]}
    if jobs <= 1:
        warm_parts([p for p in (*CHAINS[0], *CHAINS[1]) if p in wanted and p != "subtrees"])
        return
    chains = [[p for p in chain if p in wanted] for chain in CHAINS]
    with tempfile.TemporaryDirectory(prefix="hwtrace-warm-marks-") as marks:
        procs = []
        for chain in filter(None, chains):
            elsewhere = json.dumps(sorted(wanted - set(chain)))
            command = [sys.executable, "-c", _WORKER, json.dumps(chain), marks, elsewhere,
                       str(os.getpid())]  # fmt: skip
            procs.append(subprocess.Popen(command))
        failed = _wait_all(procs)
    if failed:
        raise RuntimeError("decoding the warm-up trace failed")


def _wait_all(procs: list[subprocess.Popen]) -> bool:
    """Wait for the chains' processes; when one fails, stop the others
    (they may be waiting for its pieces).  Whether one failed."""
    import time

    try:
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                return True
            if all(c == 0 for c in codes):
                return False
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


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


def _imported_bytecode() -> None:
    """Write the bytecode of every module the commands import (numba's
    compiler, numpy, pyarrow, the command modules: imported here first)
    that has none, as an installer would have."""
    import importlib.util
    import py_compile

    import numba.core.compiler  # noqa: F401  (imported here for their files)
    import pyarrow  # noqa: F401

    from . import decode, perfcmds  # noqa: F401

    for module in list(sys.modules.values()):
        source = getattr(module, "__file__", None)
        if not source or not source.endswith(".py"):
            continue
        cached = importlib.util.cache_from_source(source)
        if os.path.exists(cached):
            continue
        try:
            py_compile.compile(source, cfile=cached, doraise=True)
        except (OSError, py_compile.PyCompileError):
            pass  # (not writable: imported from source, as before)


_WORKER = (
    "import json, sys\nfrom hwtrace.cli.warmup import warm_parts\n"
    "warm_parts(json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]))"
)


def die_with_parent(parent: int) -> None:
    """End this process when process ``parent`` (its parent) ends, however
    it ends (Linux's PR_SET_PDEATHSIG): a warm-up whose command is killed
    leaves no process compiling on.  Exits now if the parent is gone."""
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # (no prctl: the waits still end when the parent changes)
    if os.getppid() != parent:
        os._exit(1)


def _await(marks: Path, piece: str) -> None:
    """Wait until another process has done ``piece`` (its mark exists)."""
    import time

    deadline = time.monotonic() + WAIT_SECONDS
    parent = os.getppid()
    while not (marks / piece).exists():
        if os.getppid() != parent or time.monotonic() > deadline:
            raise RuntimeError(f"the warm-up piece {piece} did not end")
        time.sleep(0.05)


def _joined_stores() -> None:
    """Join threads' block stores, as a decoding on several threads does
    (its renumbering loop): of a small program (2-byte keys), and of one
    with more than 65,535 distinct blocks (4-byte keys in the joined column
    and in one of the stores, either first)."""
    from ..pt.blocks import BlockStore, CompactBlocks

    def store(first: int, n: int) -> BlockStore:
        s = BlockStore(16)
        ip = first + 0x10 * np.arange(n, dtype=np.uint64)
        s.append(ip, np.ones(n, np.uint32), np.full(n, 64, np.uint8), np.zeros(n, np.int64),
                 np.zeros(n, np.uint64))  # fmt: skip
        return s

    # (the join is made when the rows' keys are first asked for)
    _ = CompactBlocks([store(BASE, 2), store(BASE + 0x10, 2)]).keys
    big = store(BASE, 1 << 16)
    _ = CompactBlocks([big, store(BASE + 0x10, 2)]).keys
    _ = CompactBlocks([store(BASE + 0x10, 2), big]).keys


def warm_parts(pieces, marks: str | None = None, elsewhere=(), parent: int | None = None) -> None:
    """Run the warm-up ``pieces`` (of :data:`PIECES`' values) in this
    process, in order.  With ``marks`` (a directory the processes of one
    warm-up share), each piece leaves a mark there when done, and a piece
    first waits for the mark of what :data:`AFTER` says when that is
    among the pieces another process runs (``elsewhere``).  ``parent``:
    the warm-up's process, which this one does not outlive."""
    if parent is not None:
        die_with_parent(parent)
    mark_dir = Path(marks) if marks is not None else None
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
        for piece in pieces:
            before = AFTER.get(piece)
            if mark_dir is not None and before in elsewhere:
                _await(mark_dir, before)
            with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
                status |= _piece(piece, Path(tmp), image, cfg, trace, code, timing)
            if mark_dir is not None:
                (mark_dir / piece).touch()
        if status:
            raise RuntimeError("decoding the warm-up trace failed")


def _piece(piece: str, tmp: Path, image: Image, cfg: PtConfig, trace: Path, code: Path,
           timing: list[str]) -> int:  # fmt: skip
    """Run one warm-up piece; its exit status."""
    status = 0
    if piece == "bytecode":
        _imported_bytecode()
    elif piece == "record":
        _record_loops(tmp)
    elif piece == "packets":
        _until_decoder(image, cfg, lambda args: None)
    elif piece == "subtrees":
        _decoder_subtrees(image, cfg)
    elif piece == "attribution":
        _attribution_loops()
    elif piece == "walks":
        _call_path_walk()
    elif piece == "listing":
        _listing_loops()
    elif piece == "library":
        for keep in (True, False):
            decode_trace(TRACE, image, cfg, keep_blocks=keep)
        # (where a window ends, in a trace mapped or copied: the warm-up's
        # trace is too short for a decoder to cut it into windows)
        for buf in (np.frombuffer(TRACE, np.uint8), np.frombuffer(TRACE, np.uint8).copy()):
            psb_plus_end(buf, 0)
        _joined_stores()
    elif piece == "fill":
        # The decoder's fills, a code table that grows (any program larger
        # than the warm-up's), and one filled by iced-x86 (32-bit code, or
        # an instruction the compiled decoding leaves to it): their
        # hashing, else the first real decoding compiles it.
        for mode in (64, 32):
            table = CodeTable(image, capacity=16)
            table.fill(BASE, mode)
            # A lookup from Python of what the compiled fill decoded.
            table.lookup(BASE, mode)
        # An AVX-512 load the compiled decoding leaves to iced-x86, which
        # the fills then learn (vmovdqu64 zmm16, [rsi]; ret).
        avx = Image()
        avx.add_section(Section.from_bytes(bytes.fromhex("62e1fe486f06c3"), BASE))
        CodeTable(avx, capacity=16).fill(BASE, 64)
    elif piece == "perfread":
        from ..image.perfsyms import perf_symbols
        from ..perf.data import PerfData

        PerfData(_wrapped(tmp, trace, cfg))
        perf_symbols(str(tmp / "warm"))
    elif piece == "ptdump":
        for extra in ([], ["--quiet"], ["--time", "--lastip"], ["--tcal"]):
            status |= ptdump_cli.main([*extra, *timing, str(trace)])
    elif piece == "ptxed":
        raw = ["--raw", f"{code}:{BASE:#x}"]
        for extra in ([], ["--no-inst"], ["--quiet"]):
            status |= ptxed_cli.main([*timing, *raw, *extra, "--pt", str(trace)], io.BytesIO())
    elif piece in ("script", "report"):
        from . import perfcmds

        data = _wrapped(tmp, trace, cfg)
        if piece == "script":
            for args in (["-i", str(data)], ["-i", str(data), "--blocks"]):
                status |= perfcmds.script_main(args)
        else:
            # (with the folded call paths, as the demo's report writes them,
            # and without: the profile alone decodes without code runs)
            status |= perfcmds.report_main(["-i", str(data), "--folded", str(tmp / "folded")])
            status |= perfcmds.report_main(["-i", str(data)])
    elif piece == "calls":
        from . import perfcmds

        # (report and script --call: the flow cut to a function's calls,
        # its instructions classified and walked on a shadow stack)
        data = _wrapped(tmp, trace, cfg)
        status |= perfcmds.report_main(["-i", str(data), "--call", "warm_callee"])
    elif piece == "csdump":
        status |= _coresight_listing(tmp)
    elif piece == "trace":
        # (hwtrace trace's reader and text lines: no kernel needed)
        from ..kernel.ringbuf import warm_reader
        from ..ktrace.output import warm_text

        warm_reader()
        warm_text()
    elif piece == "decode":
        from .decode import main as decode_main

        data = _wrapped(tmp, trace, cfg)
        status |= decode_main(["-i", str(data), "-o", str(tmp / "flow"), "--instructions",
                               "--no-progress"])  # fmt: skip
        _writer_loops(tmp / "writer.parquet")
        _stored_attribution()
    else:
        raise ValueError(f"no warm-up piece {piece}")
    return status


# An ETB capture in CoreSight formatter frames (memory mode): an ETMv4
# source (trace ID 0x10: sync, trace info, trace on, an address with
# context, atoms, a timestamp, an exception) and an STM one (0x20: a
# timestamped write ended by a FLAG), each cut in two runs.
CORESIGHT_FRAMES = bytes.fromhex(
    "2100000000000000000000008001000004850008400041fffefffefffefffef021ff0000feff30fbf602b4"
    "24941006551cf741ff0e0f300132506e000001003462f4010e000000000000000000000002"
)


def _coresight_listing(tmp: Path) -> int:
    """List the capture above as a snapshot (its frames too) and its
    software events, as ``hwtrace csdump`` does: the ETMv4 and STM packet
    decoders, the frame decoder, the listing's loops and the events'."""
    from ..hwevents.cssnapshot import Buffer, Device, Snapshot, write_snapshot
    from ..hwevents.etm4 import Etm4Config
    from . import csdump

    cfg = Etm4Config(trace_id=0x10)
    regs, offsets = cfg.to_regs()
    snap = Snapshot(
        devices=[Device("cpu_0", cfg.core_name, cls="core"),
                 Device("ETM_0", cfg.device_type, regs=regs, offsets=offsets),
                 Device("STM_0", "STM", regs={"STMTCSR": (0x20 << 16) | 7},
                        offsets={"STMTCSR": 0x3A0})],
        buffers=[Buffer("ETB_0", CORESIGHT_FRAMES, format="coresight", file="etb.bin")],
        source_buffers={"ETM_0": "ETB_0", "STM_0": "ETB_0"},
        core_trace_sources={"cpu_0": "ETM_0"},
    )  # fmt: skip
    write_snapshot(tmp / "snapshot", snap)
    status = csdump.main(["--snapshot", str(tmp / "snapshot"), "--raw-frames"])
    return status | csdump.main(["--snapshot", str(tmp / "snapshot"), "--events"])


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


def _until_decoder(image: Image, cfg: PtConfig, at_decoder) -> None:
    """Decode the loop's trace up to the flow decoder's call, then stop:
    ``at_decoder(args)`` gets the decoder's arguments.  Compiles the packet
    and timing loops on the way."""
    from .. import aot
    from ..pt import _flowloop as F

    original = aot.CompiledLoop.__call__

    def typed(loop, *args):
        if loop is not F.run:
            return original(loop, *args)
        at_decoder(args)
        raise _Typed

    aot.CompiledLoop.__call__ = typed  # type: ignore[method-assign]
    try:
        decode_trace(TRACE, image, cfg, keep_blocks=True)
    except _Typed:
        pass
    finally:
        aot.CompiledLoop.__call__ = original  # type: ignore[method-assign]


def _decoder_subtrees(image: Image, cfg: PtConfig) -> None:
    """Compile the callees of the flow decoder that compiling the decoder
    itself reaches last, for the arguments the decoder gets, so that the
    process compiling the decoder finds them in numba's cache."""
    from numba import typeof

    from ..pt import _flowloop as F

    def compile_callees(args) -> None:
        ds, pk, cf, ct, out = args[:5]  # (then the window opener's arguments, the code space)
        base = (typeof(ds), typeof(pk), typeof(cf), typeof(ct))
        for callee, sig in (
            (F._pending_after_postponed, base),
            (F._proceed_no_event, (*base, typeof(out))),
            (F._fast, (*base, typeof(out))),
            (F._proceed, (*base, typeof(out))),
        ):
            callee.dispatcher.compile(sig)

    _until_decoder(image, cfg, compile_callees)


def _attribution_args() -> tuple:
    """Rows, no context switches, a time conversion and the columns to
    attribute into, as a stream gives the attribution loops."""
    n = 4
    out = [np.zeros(n, t) for t in (np.uint64, np.int64, np.uint8, np.int64, np.int32, np.int64,
                                     np.int64, np.int64, np.int64)]  # fmt: skip
    return n, np.zeros(0, np.int64), np.zeros(4, np.uint64), out


def _attribution_loops() -> None:
    """Compile the loops that attribute a stream's blocks
    (:mod:`hwtrace.session._attribution`) for the arguments the stream
    gives them."""
    from ..session import _attribution as A

    n, z, conv, out = _attribution_args()
    A.attribute_rows(np.zeros(n, np.uint64), np.zeros(n, np.uint32), np.zeros(n, np.uint8),
                     np.zeros(n, np.uint64), np.zeros(1, np.int64), np.zeros(n, np.int32),
                     np.zeros(n, np.int64), 0, conv, 1, 1, z, z, z, *out)  # fmt: skip
    A.durations_of(out[6], np.zeros(n, np.int64), z, np.zeros(0, np.uint64), conv)
    # A batch's blocks to functions (a real batch's many: through the memo).
    from ..image.symbols import SymbolTable

    SymbolTable.from_symbols([(BASE, 16, "f", True)]).index_of(
        BASE + np.arange(1024, dtype=np.uint64)
    )


def _call_path_walk() -> None:
    """Compile the call-path walk (:mod:`hwtrace.analysis.latency`) for
    the arguments ``hwtrace report``'s profile gives it, on a few rows of
    no code table's code (it finds none of their instructions)."""
    from ..analysis.latency import LatencyProfiler
    from ..analysis.patterns import AtomTable, PatternSet

    n = 4
    profiler = LatencyProfiler(PatternSet(), keep=False, calls=False, profile=True,
                               group=lambda stream, key: 0)  # fmt: skip
    stream = profiler.stream()
    profiler.add(stream, CodeTable(Image(), capacity=16), AtomTable(profiler.patterns, None),
                 BASE + np.arange(n, dtype=np.uint64), np.ones(n, np.uint32),
                 np.full(n, 64, np.uint8), np.full(n, -1, np.int32), np.arange(n, dtype=np.int64),
                 1, 0, np.zeros(n, np.bool_))  # fmt: skip
    profiler.gap(stream)
    # (a real program's paths outgrow the first tables: they are interned
    # again into larger ones)
    profiler.reserve_paths(1 << 16)


class _Code:
    """A stand-in for a code table (the listing keeps text by a weak reference to it)."""


def _listing_loops() -> None:
    """Compile ``hwtrace script``'s listing loop
    (:mod:`hwtrace.textout.perfscript`) and perf's instruction times
    (:mod:`hwtrace.session.perftime`) for the arguments the command gives
    them, on a few made-up rows and no packets."""
    from ..session import perftime
    from ..textout.perfscript import ListingWriter

    n = 4
    ip = BASE + np.arange(n, dtype=np.uint64)
    index = np.zeros(n, np.int64)
    writer = ListingWriter(io.BytesIO())
    code = _Code()  # (the rows' code table: only its identity is used)
    for ninsn, code_row in ((None, index), (np.ones(n, np.int64), None)):
        for _ in writer.views(["warm"], index, index, index, ip, ["warm_loop"], ["warm"], index,
                              index, ninsn, None, None, None, code_row, code):  # fmt: skip
            pass
    none = np.zeros(0, np.int64)
    clock = perftime.PerfClock(np.zeros(0, np.uint8), 3, (4, 1), 8)
    out = np.zeros(n, np.int64)
    perftime._run(none, none, none, 0, clock.state, clock.fstate, *clock.params, ip,
                  np.zeros(n, np.uint8), ip, out, 0)  # fmt: skip
    perftime._monotonic_ns(out, 0, 0, np.uint64(1), np.uint64(0))


def _stored_attribution() -> None:
    """Compile the attribution of the rows a compact stream's block store
    holds (``hwtrace decode``'s stream, whose batches come from there)."""
    from ..pt.blocks import BlockStore
    from ..session import _attribution as A

    n, z, conv, out = _attribution_args()
    store = BlockStore(16)
    store.append(np.arange(n, dtype=np.uint64), np.ones(n, np.uint32), np.full(n, 64, np.uint8),
                 np.zeros(n, np.int64), np.zeros(n, np.uint64))  # fmt: skip
    t = store.table()
    # (a batch's keys are two bytes while the store's table fits them, else
    # four: its own and the rows written out keyed into them)
    for kind in (np.uint16, np.uint32):
        keys = store.key_column(out=np.zeros(n, kind))
        store.row_keys(t["ip"], t["ninsn"], t["mode"], t["image"], np.zeros(n, kind))
        A.attribute_stored(keys, t["ip"], t["ninsn"], t["mode"], t["image"],
                           *store.offset_steps(), *store.time_changes(), 0, conv, 1, 1, z, z, z,
                           *out)  # fmt: skip
    # (a store drained into the columns a stream gathers, its keys two
    # bytes; and one whose table outgrew them: a real program's hundred
    # thousand blocks)
    narrow = BlockStore(16)
    narrow.append(np.arange(n, dtype=np.uint64), np.ones(n, np.uint32), np.full(n, 64, np.uint8),
                  np.zeros(n, np.int64), np.zeros(n, np.uint64))  # fmt: skip
    narrow.drain(np.zeros(n, np.uint64), np.zeros(n, np.uint32), np.zeros(n, np.uint8),
                 np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.uint64))  # fmt: skip
    wide = BlockStore(16)
    m = (1 << 16) + 16
    wide.append(np.arange(m, dtype=np.uint64), np.ones(m, np.uint32), np.full(m, 64, np.uint8),
                np.zeros(m, np.int64), np.zeros(m, np.uint64))  # fmt: skip
    # (rows the decoder wrote out, keyed into a store it has outgrown: the
    # batch that passes that store's rows on)
    wide.row_keys(np.arange(m, dtype=np.uint64), np.ones(m, np.uint32), np.full(m, 64, np.uint8),
                  np.zeros(m, np.int64), np.zeros(m, np.uint32))  # fmt: skip
    wide.drain(np.zeros(m, np.uint64), np.zeros(m, np.uint32), np.zeros(m, np.uint8),
               np.zeros(m, np.int64), np.zeros(m, np.int64), np.zeros(m, np.uint64))  # fmt: skip
    # (a per-thread queue's times and durations as runs: a held row, the
    # store's time points, rows written out after them, a stop)
    starts, ns = A.time_runs(np.zeros(1, np.int64), *store.time_changes(), 1,
                             np.zeros(2, np.int64), n + 1, conv)  # fmt: skip
    A.duration_runs(starts, ns, n + 3, np.zeros(1, np.int64), np.ones(1, np.uint64), conv)


def _writer_loops(path: Path) -> None:
    """Compile the Parquet writer's loops the loop's dataset does not reach:
    a dictionary of many values (its table grows), a boolean column that
    is not of one value (a flow with gaps), and columns given as runs (a
    time with runs of nulls, a duration) however often the loop's times
    change."""
    import pyarrow as pa

    from ..export import _parquet_pages as pp
    from ..export.parquet_file import ParquetFileWriter, Runs, column_specs

    n = 2000
    schema = pa.schema([("ip", pa.uint64()), ("gap", pa.bool_()), ("time", pa.int64()),
                        ("duration", pa.int64())])  # fmt: skip
    specs = column_specs(schema, {"dictionary": ["ip", "duration"], "delta": ["time", "duration"]},
                         {"time": pp.NULL_IF_NEGATIVE})  # fmt: skip
    time = np.repeat(np.arange(n // 50, dtype=np.int64) * 1000, 50)
    time[:100] = -1
    w = ParquetFileWriter(path, schema, specs)
    w.write_row_group([({"ip": np.arange(n, dtype=np.uint64), "gap": np.arange(n) % 3 == 0,
                         "time": Runs.of(time), "duration": Runs.of(time % 3000)}, n)])  # fmt: skip
    w.close()
    # Keyed columns, by keys of either width a stream gives them, and kept
    # in sequences (a stream to Parquet's).
    from ..columns import Keyed, SequencedKeys
    from ..pt.blocks import SEQ_TOP

    schema = pa.schema([("ip", pa.uint64()), ("instructions", pa.int64()),
                        ("symbol", pa.int64())])  # fmt: skip
    specs = column_specs(schema, {"dictionary": ["ip", "instructions", "symbol"]},
                         {"symbol": pp.NULL_IF_ZERO})  # fmt: skip
    # (a column of fewer values than keys: of at most 256 values, their
    # indices are bytes; of more, two bytes; a column with nulls, int32)
    for size, values in ((8, 3), (600, 300)):
        table = np.arange(size, dtype=np.uint64)
        ninsn = np.arange(size, dtype=np.int64) % values
        symbol = np.arange(size, dtype=np.int64) % 5
        for kind in (np.uint16, np.uint32, SequencedKeys):
            keys = (np.arange(n) % size).astype(np.uint32 if kind is np.uint32 else np.uint16)
            if kind is SequencedKeys:
                # (every other row in a sequence of two, of the keys 0, 1;
                # the rows between name the other keys: as many values as
                # the arrays' keys, two-byte indices too)
                e = np.arange(n // 2)
                entries = np.where(e % 2 == 0, SEQ_TOP, 2 + (e // 2) % (size - 2)).astype(np.uint16)
                pool = np.array([0, 1], np.uint16)
                start, length = np.zeros(1, np.int64), np.full(1, 2, np.int64)
                keys = SequencedKeys(int(entries.shape[0] // 2 * 3), entries, SEQ_TOP, SEQ_TOP,
                                     start, length, pool, lambda: None)  # fmt: skip
            # (keys not counted first, then counted: their first-seen order known)
            for counted in (False, True):
                total = pp.named_keys(keys, ninsn)[1] if counted else None
                w = ParquetFileWriter(path, schema, specs)
                w.write_row_group([({"ip": Keyed(keys, table, 0),
                                     "instructions": Keyed(keys, ninsn, 0, total),
                                     "symbol": Keyed(keys, symbol, 0)}, len(keys))])  # fmt: skip
                w.close()


def _record_loops(tmp: Path) -> None:
    """Record a short program (``/bin/true``, its calls to ``exit``) with
    the backend this machine records with, in a process of its own: the
    loops that backend compiles are then cached for a first ``hwtrace
    record``.  Where recording cannot be done here (no ptrace, no such
    program), nothing is warmed and nothing fails: a recording is not
    what the warm-up is for."""
    true = "/bin/true"
    if not os.path.exists(true):
        return
    env = {**os.environ, "HWTRACE_AOT_AUTOBUILD": "0"}  # (the warm-up builds the library)
    command = [sys.executable, "-m", "hwtrace.cli.main", "record", "-o", str(tmp / "true.data"),
               "-f", "exit", "--", true]  # fmt: skip
    try:
        subprocess.run(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        pass


def _wrapped(tmp: Path, trace: Path, cfg) -> Path:
    """The trace wrapped as a perf.data (made once)."""
    from ..perf.wrap import wrap_raw_trace

    data = tmp / "loop.data"
    if not data.exists():
        elf = tmp / "warm"
        _write_elf(elf)
        wrap_raw_trace(trace, data, elf=[(elf, None)], config=cfg, comm="warm")
    return data


__all__ = ["warm"]
