"""The ``bpf()`` system call from Python: maps, programs, statistics.

Only what hwtrace needs, with the layouts of ``include/uapi/linux/bpf.h``
(``union bpf_attr`` is zero-filled past the fields a command uses, as the
kernel requires).  Every object is a file descriptor owned by a Python
object: closing it (or the process ending, however it ends) frees the
kernel object unless it was pinned, which happens only when asked.  All
descriptors are close-on-exec (the kernel creates them so), so a command
hwtrace starts inherits only what it is handed on purpose.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

__all__ = [
    "BpfError",
    "Map",
    "Program",
    "RunStats",
    "enable_stats",
    "map_ids",
    "prog_ids",
]

SYS_BPF = 321

# Commands.
MAP_CREATE, MAP_LOOKUP_ELEM, MAP_UPDATE_ELEM, MAP_DELETE_ELEM = 0, 1, 2, 3
PROG_LOAD, OBJ_PIN, OBJ_GET = 5, 6, 7
PROG_GET_NEXT_ID, MAP_GET_NEXT_ID, PROG_GET_FD_BY_ID = 11, 12, 13
PROG_TEST_RUN = 10
OBJ_GET_INFO_BY_FD = 15
ENABLE_STATS = 32

# Map types and flags.
MAP_HASH, MAP_ARRAY, MAP_PERCPU_ARRAY, MAP_RINGBUF = 1, 2, 6, 27
F_MMAPABLE = 1 << 10

PROG_SOCKET_FILTER = 1
PROG_TRACEPOINT = 5
STATS_RUN_TIME = 0

# Helpers (enum bpf_func_id).
FN_MAP_LOOKUP_ELEM = 1
FN_KTIME_GET_NS = 5
FN_GET_SMP_PROCESSOR_ID = 8
FN_GET_CURRENT_PID_TGID = 14
FN_GET_CURRENT_UID_GID = 15
FN_GET_CURRENT_COMM = 16
FN_PROBE_READ_KERNEL = 113
FN_PROBE_READ_USER_STR = 114
FN_PROBE_READ_KERNEL_STR = 115
FN_RINGBUF_OUTPUT = 130

PSEUDO_MAP_FD = 1  # ld_imm64 src: imm is a map's file descriptor
ATTR_SIZE = 144  # bytes of union bpf_attr passed (the commands used fit)
LOG_SIZE = 1 << 22

# Refusals the verifier's log cannot explain (it is never reached).
_NOT_THE_VERIFIER = (errno.EPERM, errno.ENOSYS)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class BpfError(Exception):
    """The kernel refused a ``bpf()`` command: ``errno`` and, for a program
    the verifier rejected, its ``log``."""

    def __init__(self, message: str, err: int = 0, log: str = "") -> None:
        super().__init__(message)
        self.errno = err
        self.log = log


def _explain(what: str, err: int) -> str:
    if err == errno.EPERM:
        return f"{what}: not permitted (BPF needs root or CAP_BPF with CAP_PERFMON)"
    if err == errno.ENOSYS:
        return f"{what}: this kernel has no bpf() system call (CONFIG_BPF_SYSCALL)"
    return f"{what}: {os.strerror(err)}"


def sys_bpf(cmd: int, attr: ctypes.Array, what: str) -> int:
    """``bpf(cmd, attr, sizeof attr)``; raises :class:`BpfError` on failure."""
    r = _libc.syscall(SYS_BPF, cmd, attr, ctypes.c_uint(len(attr)))
    if r < 0:
        err = ctypes.get_errno()
        raise BpfError(_explain(what, err), err)
    return int(r)


def _key_present(cmd: int, attr: ctypes.Array, what: str) -> bool:
    """Run the map command ``cmd`` on a key: False when the map has no such
    key (ENOENT), True when it ran."""
    try:
        sys_bpf(cmd, attr, what)
    except BpfError as e:
        if e.errno == errno.ENOENT:
            return False
        raise
    return True


def _attr(*fields: tuple[int, str, int]) -> ctypes.Array:
    """A zeroed bpf_attr with ``(offset, struct format, value)`` fields set."""
    buf = (ctypes.c_uint8 * ATTR_SIZE)()
    for off, fmt, value in fields:
        struct.pack_into("<" + fmt, buf, off, value)
    return buf


def _name(text: str) -> bytes:
    """An object name as the kernel accepts it: 15 bytes of [A-Za-z0-9_.]."""
    keep = "".join(c if c.isalnum() or c in "_." else "_" for c in text)
    return keep.encode()[:15]


class _Fd:
    fd: int = -1

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            finally:
                self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass

    def pin(self, path: str) -> None:
        """Pin the object at ``path`` in a BPF filesystem (it then outlives
        hwtrace; remove the file to free it)."""
        p = ctypes.create_string_buffer(os.fsencode(path))
        try:
            sys_bpf(OBJ_PIN, _attr((0, "Q", ctypes.addressof(p)), (8, "I", self.fd)), f"pin {path}")
        except BpfError as e:
            if e.errno in (errno.ENOENT, errno.EPERM, errno.EINVAL):
                raise BpfError(
                    f"pin {path}: not in a BPF filesystem (mount -t bpf bpf /sys/fs/bpf), or "
                    f"the directory does not exist ({os.strerror(e.errno)})",
                    e.errno,
                ) from None
            raise

    @property
    def id(self) -> int:
        return self.info()["id"]

    def info(self) -> dict[str, int]:
        raise NotImplementedError


def _obj_info(fd: int, size: int) -> bytearray:
    buf = (ctypes.c_uint8 * size)()
    attr = _attr((0, "I", fd), (4, "I", size), (8, "Q", ctypes.addressof(buf)))
    sys_bpf(OBJ_GET_INFO_BY_FD, attr, "BPF_OBJ_GET_INFO_BY_FD")
    return bytearray(buf)


class Map(_Fd):
    """A BPF map: ``map_type``, ``key_size``, ``value_size``,
    ``max_entries``, ``flags``."""

    def __init__(
        self,
        map_type: int,
        key_size: int,
        value_size: int,
        max_entries: int,
        *,
        flags: int = 0,
        name: str = "",
    ) -> None:
        attr = _attr(
            (0, "I", map_type),
            (4, "I", key_size),
            (8, "I", value_size),
            (12, "I", max_entries),
            (16, "I", flags),
        )
        nm = _name(name)
        ctypes.memmove(ctypes.byref(attr, 28), nm, len(nm))
        self.map_type, self.key_size, self.value_size = map_type, key_size, value_size
        self.max_entries, self.flags, self.name = max_entries, flags, name
        self.fd = sys_bpf(MAP_CREATE, attr, f"create map {name or map_type}")

    @property
    def percpu(self) -> bool:
        return self.map_type == MAP_PERCPU_ARRAY

    def _value_bytes(self) -> int:
        if self.percpu:
            return ((self.value_size + 7) // 8 * 8) * possible_cpus()
        return self.value_size

    def lookup(self, key: bytes) -> bytes | None:
        """The value at ``key`` (every CPU's, one after another, for a
        per-CPU map), or None when absent."""
        k = ctypes.create_string_buffer(key, len(key))
        v = ctypes.create_string_buffer(self._value_bytes())
        attr = _attr(
            (0, "I", self.fd), (8, "Q", ctypes.addressof(k)), (16, "Q", ctypes.addressof(v))
        )
        found = _key_present(MAP_LOOKUP_ELEM, attr, f"lookup in map {self.name}")
        return v.raw if found else None

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        k = ctypes.create_string_buffer(key, len(key))
        v = ctypes.create_string_buffer(value, len(value))
        attr = _attr(
            (0, "I", self.fd),
            (8, "Q", ctypes.addressof(k)),
            (16, "Q", ctypes.addressof(v)),
            (24, "Q", flags),
        )
        sys_bpf(MAP_UPDATE_ELEM, attr, f"update map {self.name}")

    def delete(self, key: bytes) -> bool:
        k = ctypes.create_string_buffer(key, len(key))
        attr = _attr((0, "I", self.fd), (8, "Q", ctypes.addressof(k)))
        return _key_present(MAP_DELETE_ELEM, attr, f"delete from map {self.name}")

    def info(self) -> dict[str, int]:
        b = _obj_info(self.fd, 88)
        t, ident, ks, vs, n, fl = struct.unpack_from("<6I", b, 0)
        return {"type": t, "id": ident, "key_size": ks, "value_size": vs,
                "max_entries": n, "flags": fl}  # fmt: skip

    def mmap(self, length: int | None = None) -> mmap.mmap:
        """The values of a ``BPF_F_MMAPABLE`` array, mapped shared and
        writable (plain loads and stores, no system call)."""
        size = length or _page_round(self.value_size_rounded * self.max_entries)
        return mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    @property
    def value_size_rounded(self) -> int:
        return (self.value_size + 7) // 8 * 8


def _page_round(n: int) -> int:
    return (n + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE


_possible: int | None = None


def possible_cpus() -> int:
    """CPUs per-CPU maps hold values for (``/sys/devices/system/cpu/possible``)."""
    global _possible
    if _possible is None:
        n = 0
        try:
            text = open("/sys/devices/system/cpu/possible").read().strip()
            for part in text.split(","):
                lo, _, hi = part.partition("-")
                n = max(n, int(hi or lo) + 1)
        except (OSError, ValueError):
            n = os.cpu_count() or 1
        _possible = n
    return _possible


@dataclass(frozen=True)
class RunStats:
    """A program's run count and total run time (with statistics on)."""

    run_cnt: int
    run_time_ns: int

    @property
    def ns_per_run(self) -> float:
        return self.run_time_ns / self.run_cnt if self.run_cnt else 0.0


@dataclass(frozen=True)
class JitedImage:
    """A loaded program's JIT image: its functions' kernel addresses and
    lengths, laid out one after another in ``code``, and the name the
    kernel lists them under (``bpf_prog_TAG_NAME`` in /proc/kallsyms)."""

    id: int
    name: str
    tag: bytes
    code: bytes
    addresses: list[int]
    lengths: list[int]

    @property
    def symbol(self) -> str:
        return (
            f"bpf_prog_{self.tag.hex()}_{self.name}" if self.name else f"bpf_prog_{self.tag.hex()}"
        )

    def functions(self) -> list[tuple[int, bytes]]:
        """(address, bytes) of each function."""
        out, at = [], 0
        for addr, n in zip(self.addresses, self.lengths, strict=False):
            out.append((addr, self.code[at : at + n]))
            at += n
        return out


def add_images(store, images: list[JitedImage], time: int) -> int:
    """Each image's functions as code revisions from ``time`` (source
    ``bpf``, named as /proc/kallsyms names them) in a
    :class:`~hwtrace.image.revisions.CodeRevisions`; returns how many."""
    n = 0
    for im in images:
        for k, (addr, code) in enumerate(im.functions()):
            name = im.symbol if k == 0 else f"{im.symbol}_F{k}"
            if code and store.add(addr, code, time, "bpf", name=name) is not None:
                n += 1
    return n


def loaded_images() -> list[JitedImage]:
    """The JIT images of every BPF program loaded now (root only); programs
    unloaded meanwhile are skipped."""
    out = []
    for pid in prog_ids():
        try:
            p = Program.from_id(pid)
        except BpfError:
            continue
        try:
            out.append(p.jited_image())
        except BpfError:
            pass
        finally:
            p.close()
    return out


class Program(_Fd):
    """A loaded BPF program.  ``insns`` is an eBPF instruction array
    (:data:`hwtrace.filter.abi.INSN`); a rejected program raises
    :class:`BpfError` with the verifier's log."""

    def __init__(
        self,
        prog_type: int,
        insns: np.ndarray,
        *,
        name: str = "",
        license: str = "GPL",
        log_level: int = 0,
    ) -> None:
        code = np.ascontiguousarray(insns)
        lic = ctypes.create_string_buffer(license.encode())
        self.name = name
        self.insn_count = len(code)
        self.log = ""
        for level in (log_level, 1) if log_level == 0 else (log_level,):
            logbuf = ctypes.create_string_buffer(LOG_SIZE if level else 1)
            attr = _attr(
                (0, "I", prog_type),
                (4, "I", len(code)),
                (8, "Q", code.ctypes.data),
                (16, "Q", ctypes.addressof(lic)),
                (24, "I", level),
                (28, "I", LOG_SIZE if level else 0),
                (32, "Q", ctypes.addressof(logbuf) if level else 0),
            )
            nm = _name(name)
            ctypes.memmove(ctypes.byref(attr, 48), nm, len(nm))
            r = _libc.syscall(SYS_BPF, PROG_LOAD, attr, ctypes.c_uint(ATTR_SIZE))
            if r >= 0:
                self.fd = int(r)
                self.log = logbuf.value.decode("utf-8", "replace") if level else ""
                return
            err = ctypes.get_errno()
            if err in _NOT_THE_VERIFIER or level:
                log = logbuf.value.decode("utf-8", "replace") if level else ""
                raise BpfError(_explain(f"load program {name}", err), err, log)
            # Rejected: load again with the verifier's log to say why.  Not
            # only EACCES and EINVAL: a verifier that gives up returns what
            # its failing step returned (EFAULT when its stack of pending
            # branches overflows, E2BIG, ENOSPC, ENOMEM), the reason in
            # the log alone.

    def info(self) -> dict[str, int]:
        b = _obj_info(self.fd, 232)
        t, ident = struct.unpack_from("<II", b, 0)
        jited, xlated = struct.unpack_from("<II", b, 16)
        run_time, run_cnt = struct.unpack_from("<QQ", b, 192)
        (verified,) = struct.unpack_from("<I", b, 216)
        return {"type": t, "id": ident, "jited_prog_len": jited, "xlated_prog_len": xlated,
                "run_time_ns": run_time, "run_cnt": run_cnt, "verified_insns": verified}  # fmt: skip

    def stats(self) -> RunStats:
        i = self.info()
        return RunStats(i["run_cnt"], i["run_time_ns"])

    @classmethod
    def from_id(cls, prog_id: int) -> Program:
        """A descriptor of loaded program ``prog_id`` (root only)."""
        self = cls.__new__(cls)
        self.name, self.insn_count, self.log = "", 0, ""
        self.fd = sys_bpf(
            PROG_GET_FD_BY_ID, _attr((0, "I", prog_id)), f"open BPF program {prog_id}"
        )
        return self

    def test_run(self, data: bytes, repeat: int = 1) -> tuple[int, int]:
        """Run the program in the kernel on ``data`` (``BPF_PROG_TEST_RUN``,
        e.g. a socket filter on a packet): its return value and the mean
        run time in ns."""
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        attr = _attr(
            (0, "I", self.fd),
            (8, "I", len(data)),
            (16, "Q", ctypes.addressof(buf)),
            (32, "I", repeat),
        )
        sys_bpf(PROG_TEST_RUN, attr, "BPF_PROG_TEST_RUN")
        retval, _, _, _, _, _, duration = struct.unpack_from("<IIIQQII", attr, 4)
        return retval, duration

    def jited_image(self) -> JitedImage:
        """The program's machine code and where the kernel put it: one
        address and length per function (subprograms are functions too)."""
        head = _obj_info(self.fd, 232)
        n_insns = struct.unpack_from("<I", head, 16)[0]
        n_ksyms, n_lens = struct.unpack_from("<II", head, 104)
        tag = bytes(head[8:16])
        name = bytes(head[64:80]).split(b"\0")[0].decode("utf-8", "replace")
        code = (ctypes.c_uint8 * max(n_insns, 1))()
        ksyms = (ctypes.c_uint64 * max(n_ksyms, 1))()
        lens = (ctypes.c_uint32 * max(n_lens, 1))()
        info = (ctypes.c_uint8 * 232)()
        struct.pack_into("<I", info, 16, n_insns)
        struct.pack_into("<Q", info, 24, ctypes.addressof(code))
        struct.pack_into("<II", info, 104, n_ksyms, n_lens)
        struct.pack_into("<QQ", info, 112, ctypes.addressof(ksyms), ctypes.addressof(lens))
        attr = _attr((0, "I", self.fd), (4, "I", 232), (8, "Q", ctypes.addressof(info)))
        sys_bpf(OBJ_GET_INFO_BY_FD, attr, "BPF_OBJ_GET_INFO_BY_FD")
        ident = struct.unpack_from("<I", info, 4)[0]
        data = bytes(code)[:n_insns]
        addresses = [int(ksyms[i]) for i in range(n_ksyms)]
        lengths = [int(lens[i]) for i in range(n_lens)] or [len(data)]
        return JitedImage(ident, name, tag, data, addresses, lengths)

    def jited_bytes(self) -> bytes:
        """The program's machine code as the kernel's JIT wrote it."""
        n = self.info()["jited_prog_len"]
        buf = (ctypes.c_uint8 * max(n, 1))()
        info = (ctypes.c_uint8 * 232)()
        struct.pack_into("<I", info, 16, n)
        struct.pack_into("<Q", info, 24, ctypes.addressof(buf))
        attr = _attr((0, "I", self.fd), (4, "I", 232), (8, "Q", ctypes.addressof(info)))
        sys_bpf(OBJ_GET_INFO_BY_FD, attr, "BPF_OBJ_GET_INFO_BY_FD")
        return bytes(buf)[:n]


class _StatsFd(_Fd):
    def __init__(self) -> None:
        self.fd = sys_bpf(ENABLE_STATS, _attr((0, "I", STATS_RUN_TIME)), "BPF_ENABLE_STATS")


def enable_stats() -> _StatsFd:
    """Turn on run-time statistics (``run_cnt``, ``run_time_ns``) of every
    program while the returned object is open (``with enable_stats(): …``)."""
    return _StatsFd()


def obj_get(path: str) -> int:
    """A descriptor of the object pinned at ``path``."""
    p = ctypes.create_string_buffer(os.fsencode(path))
    return sys_bpf(OBJ_GET, _attr((0, "Q", ctypes.addressof(p))), f"open pinned {path}")


def _ids(cmd: int) -> list[int]:
    out, current = [], 0
    while True:
        attr = _attr((0, "I", current))
        r = _libc.syscall(SYS_BPF, cmd, attr, ctypes.c_uint(ATTR_SIZE))
        if r < 0:
            err = ctypes.get_errno()
            if err == errno.ENOENT:
                return out
            raise BpfError(_explain("list BPF objects", err), err)
        current = struct.unpack_from("<I", attr, 4)[0]
        out.append(current)


def prog_ids() -> list[int]:
    """IDs of every BPF program loaded in the kernel."""
    return _ids(PROG_GET_NEXT_ID)


def map_ids() -> list[int]:
    """IDs of every BPF map in the kernel."""
    return _ids(MAP_GET_NEXT_ID)
