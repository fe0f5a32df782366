"""Compile the decoders' loops before a first real use.

A loop runs from the native library (:mod:`hwtrace.aot`) once numba
has compiled it for the argument types a command passes; until then a
command pays for numba's import and compilation.  ``hwtrace aot warm``
(which ``make venv`` runs) decodes a small trace of
a loop, encoded here, the ways the commands do (``ptdump`` in its forms,
``ptxed`` with and without disassembly, the library decoder keeping and
counting its results), so that numba compiles each of those loops, and
then builds the library: a user's first ``hwtrace ptdump`` or ``ptxed``
starts in a fraction of a second.  Loops other commands need are added
to the library after their first use.
"""

from __future__ import annotations

import contextlib
import io
import os
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


def warm() -> None:
    """Decode the loop's trace the ways the commands do (output dropped)."""
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
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            for extra in ([], ["--quiet"], ["--time", "--lastip"], ["--tcal"]):
                status |= ptdump_cli.main([*extra, *timing, str(trace)])
        raw = ["--raw", f"{code}:{BASE:#x}"]
        for extra in ([], ["--no-inst"], ["--quiet"]):
            status |= ptxed_cli.main([*timing, *raw, *extra, "--pt", str(trace)], io.BytesIO())
        if status:
            raise RuntimeError("decoding the warm-up trace failed")
        for keep in (True, False):
            decode_trace(enc.data, image, cfg, keep_blocks=keep)


__all__ = ["warm"]
