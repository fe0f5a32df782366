"""Zstandard streams as ``perf record -z`` writes them, through the system's
libzstd (the library perf itself links for ``-z``).

perf compresses the records of its ring buffers as one zstd stream,
flushed at the end of each PERF_RECORD_COMPRESSED (perf's
``zstd_compress_stream_to_records``): a record's body continues the stream
of the one before, and a decompressed record may begin in one body and end
in the next.  :class:`ZstdDecompressor` carries that state from body to
body; :class:`ZstdCompressor` writes such bodies (perf.data written by
hwtrace with ``compress=N``, zstd's level).
"""

from __future__ import annotations

import ctypes

__all__ = ["ZstdCompressor", "ZstdDecompressor", "ZstdError", "zstd_available"]


class ZstdError(Exception):
    """libzstd is missing, or a stream is not zstd's."""


class _Buffer(ctypes.Structure):
    # ZSTD_inBuffer and ZSTD_outBuffer: pointer, size, position.
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t), ("pos", ctypes.c_size_t)]


_LIB: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        try:
            lib = ctypes.CDLL("libzstd.so.1")
        except OSError:
            from ctypes.util import find_library  # (runs ldconfig: only if needed)

            name = find_library("zstd")
            try:
                lib = ctypes.CDLL(name or "libzstd.so")
            except OSError:
                raise ZstdError(
                    "zstd-compressed records (perf record -z) need libzstd (Debian: libzstd1)"
                ) from None
        vp, sz, buf = ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(_Buffer)
        for fn, res, args in (
            ("ZSTD_createDStream", vp, []),
            ("ZSTD_freeDStream", sz, [vp]),
            ("ZSTD_initDStream", sz, [vp]),
            ("ZSTD_decompressStream", sz, [vp, buf, buf]),
            ("ZSTD_createCStream", vp, []),
            ("ZSTD_freeCStream", sz, [vp]),
            ("ZSTD_initCStream", sz, [vp, ctypes.c_int]),
            ("ZSTD_compressStream", sz, [vp, buf, buf]),
            ("ZSTD_flushStream", sz, [vp, buf]),
            ("ZSTD_isError", ctypes.c_uint, [sz]),
            ("ZSTD_getErrorName", ctypes.c_char_p, [sz]),
            ("ZSTD_DStreamOutSize", sz, []),
            ("ZSTD_compressBound", sz, [sz]),
        ):
            f = getattr(lib, fn)
            f.restype, f.argtypes = res, args
        _LIB = lib
    return _LIB


def zstd_available() -> bool:
    """Whether libzstd can be loaded here."""
    try:
        _lib()
    except ZstdError:
        return False
    return True


def _check(lib: ctypes.CDLL, code: int, what: str) -> int:
    if lib.ZSTD_isError(code):
        raise ZstdError(f"{what}: {lib.ZSTD_getErrorName(code).decode()}")
    return code


class ZstdDecompressor:
    """One zstd stream, fed a piece at a time (:meth:`feed`)."""

    def __init__(self) -> None:
        lib = self._lib = _lib()
        self._stream = lib.ZSTD_createDStream()
        if not self._stream:
            raise ZstdError("cannot create a zstd stream")
        _check(lib, lib.ZSTD_initDStream(self._stream), "zstd stream")
        self._chunk = max(int(lib.ZSTD_DStreamOutSize()), 1 << 16)

    def feed(self, piece: bytes, limit: int | None = None) -> bytes:
        """The bytes ``piece`` (the stream's next bytes) completes; more
        than ``limit`` of them is an error (a stream that decompresses to
        far more than it is would otherwise take all memory)."""
        lib = self._lib
        src = ctypes.create_string_buffer(piece, len(piece))
        inb = _Buffer(ctypes.cast(src, ctypes.c_void_p), len(piece), 0)
        out = []
        got = 0
        dst = ctypes.create_string_buffer(self._chunk)
        while True:
            outb = _Buffer(ctypes.cast(dst, ctypes.c_void_p), self._chunk, 0)
            _check(lib, lib.ZSTD_decompressStream(self._stream, outb, inb), "zstd stream")
            got += outb.pos
            if limit is not None and got > limit:
                raise ZstdError(f"decompresses to more than {limit:,} bytes")
            out.append(dst.raw[: outb.pos])
            # (done when the input is used up and the output had room to spare)
            if inb.pos >= inb.size and outb.pos < outb.size:
                return b"".join(out)

    def __del__(self) -> None:
        if getattr(self, "_stream", None):
            self._lib.ZSTD_freeDStream(self._stream)
            self._stream = None


class ZstdCompressor:
    """One zstd stream written a piece at a time, each piece flushed (as
    perf's record bodies are)."""

    def __init__(self, level: int = 1) -> None:
        lib = self._lib = _lib()
        self._stream = lib.ZSTD_createCStream()
        if not self._stream:
            raise ZstdError("cannot create a zstd stream")
        _check(lib, lib.ZSTD_initCStream(self._stream, level), "zstd stream")

    def flushed(self, piece: bytes) -> bytes:
        """``piece`` compressed, the stream flushed after it."""
        lib = self._lib
        cap = int(lib.ZSTD_compressBound(len(piece))) + 64
        src = ctypes.create_string_buffer(piece, len(piece))
        dst = ctypes.create_string_buffer(cap)
        inb = _Buffer(ctypes.cast(src, ctypes.c_void_p), len(piece), 0)
        outb = _Buffer(ctypes.cast(dst, ctypes.c_void_p), cap, 0)
        while inb.pos < inb.size:
            _check(lib, lib.ZSTD_compressStream(self._stream, outb, inb), "zstd stream")
        while _check(lib, lib.ZSTD_flushStream(self._stream, outb), "zstd stream"):
            pass
        return dst.raw[: outb.pos]

    def __del__(self) -> None:
        if getattr(self, "_stream", None):
            self._lib.ZSTD_freeCStream(self._stream)
            self._stream = None
