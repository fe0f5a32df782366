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
from ..pt.decode import decode_trace
from ..pt.encode import encode_path
from . import ptdump as ptdump_cli
from . import ptxed as ptxed_cli

BASE = 0x1000
# A counted loop with a call in it, then the end:
#   1000: mov ecx, 40        1005: call 1010         100a: dec ecx
#   100c: jnz 1005           100e: nop               1010: ret
CODE = bytes.fromhex("b928000000e806000000ffc975f79090c3")
LOOPS = 40


def _path() -> np.ndarray:
    """The loop's executed instructions."""
    ips = [BASE]
    for _ in range(LOOPS):
        ips += [0x1005, 0x1010, 0x100A, 0x100C]
    return np.array(ips, np.uint64)


# The parts, in two chains that compile little in common: the library
# decoder and then the perf.data commands (which call it), and ptxed's own
# instruction flow and then ptdump.
PARTS = ("library", "perf", "ptxed", "ptdump")
CHAINS = (("library", "perf"), ("ptxed", "ptdump"))


def warm(jobs: int | None = None) -> None:
    """Decode the loop's trace the ways the commands do (output dropped),
    the chains of parts in processes of their own when ``jobs`` (default:
    the CPUs this process may use) allows."""
    jobs = jobs or len(os.sched_getaffinity(0))
    if jobs <= 1:
        warm_parts(PARTS)
        return
    procs = [
        subprocess.Popen([sys.executable, "-c", _WORKER, json.dumps(chain)]) for chain in CHAINS
    ]
    failed = [p for p in procs if p.wait() != 0]
    if failed:
        raise RuntimeError("decoding the warm-up trace failed")


_WORKER = "import json, sys\nfrom hwtrace.cli.warmup import warm_parts\nwarm_parts(json.loads(sys.argv[1]))"


def warm_parts(parts) -> None:
    """Run the warm-up ``parts`` (names of :data:`PARTS`) in this process."""
    with tempfile.TemporaryDirectory(prefix="hwtrace-warm-") as tmp:
        code = Path(tmp) / "code.bin"
        code.write_bytes(CODE)
        image = Image()
        image.add_raw(code, address=BASE)
        enc = encode_path(_path(), image, end_ip=0x100E, tsc=1 << 32, mtc_freq=3, cyc=True,
                          psb_period=64)  # fmt: skip
        trace = Path(tmp) / "loop.pt"
        trace.write_bytes(enc.data)
        cfg = enc.config
        timing = ["--mtc-freq", str(cfg.mtc_freq), "--nom-freq", str(cfg.nom_freq),
                  "--cpuid-0x15.eax", str(cfg.cpuid_0x15_eax),
                  "--cpuid-0x15.ebx", str(cfg.cpuid_0x15_ebx)]  # fmt: skip
        status = 0
        if "library" in parts:
            for keep in (True, False):
                decode_trace(enc.data, image, cfg, keep_blocks=keep)
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
                status |= _perf_commands(Path(tmp), trace, code, cfg)
        if status:
            raise RuntimeError("decoding the warm-up trace failed")


def _perf_commands(tmp: Path, trace: Path, code: Path, cfg) -> int:
    """The perf.data commands on the trace wrapped as a perf.data."""
    from ..perf.wrap import wrap_raw_trace
    from . import perfcmds

    data = tmp / "loop.data"
    size = len(CODE)
    wrap_raw_trace(trace, data, raw=[(code, 0, size, BASE)], config=cfg, comm="warm")
    status = 0
    for args in (["-i", str(data)], ["-i", str(data), "--blocks"]):
        status |= perfcmds.script_main(args)
    status |= perfcmds.report_main(["-i", str(data)])
    return status


__all__ = ["warm"]
