"""Build the ptdump kernels' native library (see :mod:`hwtrace.pt._native`).

Each kernel gets a C entry point, a numba ``cfunc`` that takes every array
as an address and a length and calls the kernel: the machine code is
numba's, for the same kernels the numba path runs.  The cfuncs' LLVM
modules (each already holds everything its kernel calls) are linked into
one, everything but the two entry points made internal, and emitted by
llvmlite as position-independent code for this CPU; the C compiler links
that object into a shared library (the steps :mod:`hwtrace.kernels` takes for
the other kernels, whose helpers this module uses).

The kernels raise nothing and allocate nothing, so the numba runtime
functions their error paths name are never called; they are defined as
traps so that the library needs nothing from numba (the Python C API
functions those paths also name come from the Python process that loads
the library).

    python -m hwtrace.pt._native_build [--force]    # build for this machine
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ._native import DECODE_SYMBOL, FORMAT_SYMBOL, library_path

# What the generated code may take from the C library.
_LIBC = {"memcpy", "memmove", "memset", "memcmp"}


def _cfuncs():
    """The C entry points, compiled by numba."""
    from numba import carray, cfunc, from_dtype, types

    from . import _kernels as K
    from . import _ptdump_kernel as P
    from ._state import DECODER_STATE, FORMAT_STATE

    def ptr(t):
        return types.CPointer(t)

    u8, u32, i8, i64, b1 = types.uint8, types.uint32, types.int8, types.int64, types.boolean
    u64 = types.uint64
    dec_t = ptr(from_dtype(DECODER_STATE))
    fmt_t = ptr(from_dtype(FORMAT_STATE))
    rows_t = (ptr(i64), ptr(u8), ptr(u8), ptr(u64), ptr(u32), ptr(u8), i64)

    decode_sig = i64(ptr(u8), i64, i64, dec_t, *rows_t, ptr(i64), ptr(i8), ptr(i64), i64, i64)

    @cfunc(decode_sig, nopython=True)
    def decode(
        bufp, nbuf, avail, statep, op, kp, sp, ap, bp, cp, nrows, eop, ecp, eip, nerr, store
    ):
        buf = carray(bufp, (nbuf,))
        rows = (
            carray(op, (nrows,)), carray(kp, (nrows,)), carray(sp, (nrows,)),
            carray(ap, (nrows,)), carray(bp, (nrows,)), carray(cp, (nrows,)),
        )  # fmt: skip
        errs = (carray(eop, (nerr,)), carray(ecp, (nerr,)), carray(eip, (nerr,)))
        return K.decode_stream(buf, avail, carray(statep, (1,)), rows, errs, store != 0)

    format_sig = i64(
        *rows_t,
        ptr(i64), ptr(i64), ptr(i8), i64,
        ptr(i64), ptr(b1), ptr(i64), ptr(b1), i64, ptr(i64), ptr(i8), ptr(i8), i64,
        ptr(u8), i64, fmt_t, ptr(u8), i64,
    )  # fmt: skip

    @cfunc(format_sig, nopython=True)
    def format_(
        op, kp, sp, ap, bp, cp, nrows, atp, eop, ecp, nerr,
        tp, htp, fp, hfp, ntimes, dap, dkp, dep, ndiag,
        rawp, nraw, statep, outp, nout,
    ):  # fmt: skip
        rows = (
            carray(op, (nrows,)), carray(kp, (nrows,)), carray(sp, (nrows,)),
            carray(ap, (nrows,)), carray(bp, (nrows,)), carray(cp, (nrows,)),
        )  # fmt: skip
        errs = (carray(atp, (nerr,)), carray(eop, (nerr,)), carray(ecp, (nerr,)))
        times = (
            carray(tp, (ntimes,)), carray(htp, (ntimes,)), carray(fp, (ntimes,)),
            carray(hfp, (ntimes,)), carray(dap, (ndiag,)), carray(dkp, (ndiag,)),
            carray(dep, (ndiag,)),
        )  # fmt: skip
        return P.format_kernel(
            rows, errs, times, carray(rawp, (nraw,)), carray(statep, (1,)), carray(outp, (nout,))
        )

    return {DECODE_SYMBOL: decode, FORMAT_SYMBOL: format_}


def emit_object() -> bytes:
    """The kernels' entry points as one relocatable object file."""
    import llvmlite.binding as ll

    ll.initialize_native_target()
    ll.initialize_native_asmprinter()
    from ..kernels import _internalize, _target_machine

    entries = _cfuncs()
    module = None
    for symbol, fn in entries.items():
        mod = ll.parse_assembly(str(fn._library._final_module))
        mod.get_function(fn.native_name).name = symbol
        if module is None:
            module = mod
        else:
            module.link_in(mod)
    assert module is not None
    _internalize(module, set(entries), ll)
    traps = [
        f.name
        for f in module.functions
        if f.is_declaration and (f.name.startswith("numba_") or f.name.startswith("NRT_"))
    ]
    if traps:
        # Only on the paths of an exception, which these kernels never raise.
        stub = ll.parse_assembly(
            "".join(
                f"define void @{name}() {{\n  call void @llvm.trap()\n  unreachable\n}}\n"
                for name in traps
            )
            + "declare void @llvm.trap()\n"
        )
        stub.triple, stub.data_layout = module.triple, module.data_layout
        module.link_in(stub)
        for name in traps:
            module.get_function(name).linkage = "internal"
    module.verify()
    outside = sorted(
        f.name
        for f in module.functions
        if f.is_declaration
        and not f.name.startswith("llvm.")
        and not f.name.startswith("Py")
        and f.name not in _LIBC
    )
    if outside:
        raise RuntimeError(f"the kernels need functions no library provides: {outside}")
    return _target_machine(ll).emit_object(module)


def compiler() -> str:
    """The C compiler that links the library: ``$CC``, else cc or gcc."""
    wanted = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc"]
    for name in wanted:
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(f"no C compiler ({' or '.join(wanted)}) to link the kernels' library")


def build(path: Path) -> Path:
    """Build the library at ``path`` (written under another name, then
    renamed: a process never sees half a library)."""
    cc = compiler()
    obj = emit_object()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        o_path = Path(tmp) / "kernels.o"
        o_path.write_bytes(obj)
        so = Path(tmp) / path.name
        proc = subprocess.run(
            [cc, "-shared", "-o", str(so), str(o_path)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"linking the kernels failed: {proc.stderr.strip()}")
        os.replace(so, path)
    return path


def build_if_missing(path: Path) -> None:
    """Build the library unless it exists; when another process is building
    it, return at once (the caller uses numba meanwhile)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return
        if not path.is_file():
            build(path)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    path = library_path()
    if "--force" in argv or not path.is_file():
        path.with_suffix(".failed").unlink(missing_ok=True)
        try:
            build(path)
        except Exception as exc:
            sys.stderr.write(f"hwtrace: ptdump kernels not built ({exc}); numba will be used\n")
            return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
