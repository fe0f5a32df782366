"""The sideband model: which code ran where, and which thread ran when.

Intel PT says how control flowed, not in which process or over which
binaries.  perf's sideband records say that: mmaps build each process's
address space over time (exec starts a new one, fork copies the parent's),
context switches say which thread owned each stretch of a CPU's trace, and
KSYMBOL/BPF_EVENT/TEXT_POKE records say when code changed.  This module keeps
those facts in time order and answers the decoder's two questions: what is
the image of process P at time T, and which thread ran on CPU C at time T.

Times are perf clock nanoseconds; :class:`TscConversion` maps them to and
from the TSC values the trace carries, as perf does with the AUXTRACE_INFO
fields ``time_shift``, ``time_mult`` and ``time_zero``.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..image import Image
from ..image.elf import ElfFile, read_elf
from ..image.elfheaders import ElfHeaders
from ..image.jitdump import JitDump, is_jitdump_path, jit_symbols, read_mapped_jitdumps
from ..image.revisions import CodeRevisions
from ..image.sections import ImageError
from ..image.symbols import SymbolTable
from ..pt.timing import tsc_to_ns
from .perfconfig import buildid_dir

if TYPE_CHECKING:
    from ..image.kernelcode import KernelCode

_U64 = np.uint64


@dataclass(frozen=True)
class TscConversion:
    """perf's TSC <-> perf-clock conversion (``perf_event_mmap_page`` fields)."""

    time_shift: int
    time_mult: int
    time_zero: int

    def to_ns(self, tsc: np.ndarray | int) -> np.ndarray | int:
        """perf time (ns) of TSC values, as perf's ``tsc_to_perf_time``."""
        ns = tsc_to_ns(tsc, self.time_shift, self.time_mult, self.time_zero)
        return int(ns) if np.ndim(ns) == 0 else ns

    def to_tsc(self, ns: np.ndarray | int) -> np.ndarray | int:
        """TSC values of perf times, as perf's ``perf_time_to_tsc``."""
        t = np.asarray(ns, dtype=_U64)
        mult, shift = _U64(self.time_mult), _U64(self.time_shift)
        with np.errstate(over="ignore"):
            t = t - _U64(self.time_zero)
            tsc = ((t // mult) << shift) + (((t % mult) << shift) // mult)
        return int(tsc) if tsc.ndim == 0 else tsc


@dataclass(frozen=True)
class Mapping:
    """One executable file mapping: ``length`` bytes of ``path`` from ``pgoff``
    at ``start``, from perf time ``time`` on."""

    time: int
    start: int
    length: int
    pgoff: int
    path: str
    build_id: bytes | None = None

    @property
    def end(self) -> int:
        return self.start + self.length


def elf_build_id(source: str | os.PathLike[str] | bytes) -> bytes | None:
    """The GNU build id of an ELF file (a path, or its bytes), or None."""
    try:
        if isinstance(source, bytes):
            head = ElfHeaders("<bytes>", np.frombuffer(source, np.uint8))
        else:
            head = ElfHeaders(source)
        return head.build_id()
    except (ImageError, ValueError):
        return None


#: The problem of a binary the recording names and nothing here holds
#: (``"<path>: binary not found"``).
NOT_FOUND = "binary not found"


@dataclass
class BinaryLocator:
    """Finds the binaries a recording names: by build id in perf's build-id
    caches (``DIR/.build-id/xx/yyyy/elf``, or ``DIR/<path>/<build id>/elf``
    where the link is missing; ``DIR`` is perf's ``buildid.dir``, by
    default ``~/.debug``: :func:`~hwtrace.perf.perfconfig.buildid_dir`),
    then by path (under ``root``, a sysroot, when given).
    Whatever file is found, the recording's path names the module.

    Problems are kept, once per binary, in ``problems`` (path -> message):
    a binary not found, or one whose build id differs from the recorded one
    (it changed since recording).
    """

    root: Path | None = None
    buildid_dirs: tuple[Path, ...] = field(default_factory=lambda: (buildid_dir(),))
    problems: dict[str, str] = field(default_factory=dict)
    _found: dict[tuple[str, bytes | None], Path | None] = field(default_factory=dict)

    def find(self, path: str, build_id: bytes | None = None) -> Path | None:
        key = (path, build_id)
        if key not in self._found:
            self._found[key] = self._find(path, build_id)
        return self._found[key]

    def _find(self, path: str, build_id: bytes | None) -> Path | None:
        if build_id:
            hexid = build_id.hex()
            for d in self.buildid_dirs:
                for name in ("elf", "debug", "vdso"):
                    candidate = d / ".build-id" / hexid[:2] / hexid[2:] / name
                    if candidate.is_file():
                        return candidate
                if path.startswith("/") or path == "[vdso]":
                    name = "vdso" if path == "[vdso]" else "elf"
                    candidate = d / path.lstrip("/") / hexid / name
                    if candidate.is_file():
                        return candidate
        # A root is where the recorded system's files are (perf's --symfs):
        # only there, then.
        root = self.root
        candidates = [root / path.lstrip("/")] if root is not None else [Path(path)]
        for candidate in candidates:
            if candidate.is_file():
                if build_id:
                    actual = elf_build_id(candidate)
                    if actual is not None and actual[: len(build_id)] != build_id:
                        self.problems[path] = (
                            f"{path}: build id {actual.hex()} differs from the recorded "
                            f"{build_id.hex()}: the binary changed since recording"
                        )
                        return None
                return candidate
        # The vDSO is in no file: perf record keeps a copy in the build-id
        # cache (found above); a recording without one is decoded as perf
        # does, without it and without a warning.
        if path != "[vdso]":
            self.problems[path] = f"{path}: {NOT_FOUND}"
        return None


def cache_vdso(data: bytes, build_id: bytes, directory: Path | None = None) -> Path:
    """Keep a process's vDSO in perf's build-id cache, as ``perf record``
    does (``DIR/[vdso]/<build id>/vdso`` and the ``.build-id/xx/yyyy``
    link; ``DIR``: perf's ``buildid.dir``, ``~/.debug`` by default), so
    that perf and hwtrace decode the code run there; returns the file."""
    d = directory if directory is not None else buildid_dir()
    hexid = build_id.hex()
    home = d / "[vdso]" / hexid
    target = home / "vdso"
    if not target.is_file():
        home.mkdir(parents=True, exist_ok=True)
        tmp = home / f".vdso.{os.getpid()}"
        tmp.write_bytes(data)
        os.replace(tmp, target)
    link = d / ".build-id" / hexid[:2] / hexid[2:]
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        try:
            link.symlink_to(Path("..") / ".." / "[vdso]" / hexid)
        except FileExistsError:
            pass
    return target


@dataclass
class AddressSpace:
    """One process image generation (from a fork or exec to the next exec)."""

    pid: int
    since: int  # perf time of the exec or fork that made it
    mappings: list[Mapping] = field(default_factory=list)

    def mappings_at(self, time: int) -> list[Mapping]:
        """The mappings live at ``time``: later ones replace what they overlap."""
        return [m for m in self.mappings if m.time <= time]

    def image(
        self,
        locator: BinaryLocator,
        time: int | None = None,
        kernel: KernelCode | None = None,
        jitdumps: dict[str, JitDump] | None = None,
    ) -> tuple[Image, SymbolTable]:
        """The image at ``time`` (all mappings when None) and its symbols.

        ELF files are placed with the bias their mapping implies, so their
        symbols come along; other files are mapped as raw bytes.  JIT code
        is named from the process's perf map and jitdump files
        (``jitdumps``: those read already, by path).
        """
        image, parts, _ = self.grown_image(None, [], 0, locator, time, kernel, jitdumps)
        return image, SymbolTable.merge(parts)

    def grown_image(
        self,
        base: Image | None,
        base_tables: list[SymbolTable],
        base_live: int,
        locator: BinaryLocator,
        time: int | None = None,
        kernel: KernelCode | None = None,
        jitdumps: dict[str, JitDump] | None = None,
    ) -> tuple[Image, list[SymbolTable], list[SymbolTable]]:
        """:meth:`image`, made from ``base`` when given: the image of the
        first ``base_live`` of the mappings live at ``time`` (its symbol
        tables but the JIT code's: ``base_tables``).  The image is then a
        copy of it with the later mappings added, its sections the very
        objects of ``base`` where nothing replaced them (a decoder keeps
        what it decoded of those).  Gives the tables its symbols merge
        (:meth:`symbol_parts`) and its tables but the JIT code's."""
        if base is None:
            image = Image(f"pid {self.pid}")
            if kernel is not None:
                for section in kernel.image:
                    image.add_section(section)
            base_tables = [] if kernel is None else [kernel.symbols]
        else:
            image = base.copy(f"pid {self.pid}")
        maps = self.mappings if time is None else self.mappings_at(time)
        tables = base_tables + self.map_into(image, locator, maps[base_live:])
        return image, self.symbol_parts(locator, maps, tables, jitdumps), tables

    @staticmethod
    def map_into(image: Image, locator: BinaryLocator, maps: list[Mapping]) -> list[SymbolTable]:
        """Map ``maps`` into ``image``, in order (later ones replace what
        they overlap); the symbol tables of the ELF files among them."""
        tables = []
        for m in maps:
            found, elf, bias = _placement(locator, m)
            if found is None:
                continue
            # (named after the file the recording mapped, wherever its bytes
            # came from: a build-id cache's ``elf``, a --symfs copy)
            if elf is None or bias is None:
                image.add_raw(found, m.pgoff, m.length, m.start, mapped=m.path)
                continue
            try:
                loaded = image.add_elf(found, elf.min_vaddr + bias, executable_only=True,
                                       mapped=m.path)  # fmt: skip
            except ImageError:
                image.add_raw(found, m.pgoff, m.length, m.start, mapped=m.path)
                continue
            tables.append(loaded.symbols.relocate(0, m.path))
        return tables

    def symbol_parts(self, locator: BinaryLocator, maps: list[Mapping],
                     tables: list[SymbolTable],
                     jitdumps: dict[str, JitDump] | None) -> list[SymbolTable]:  # fmt: skip
        """The tables whose merge is the symbols of an image of ``maps``:
        ``tables`` (the kernel's and the files'), then the JIT code's, which
        is in no file: perf names it from the process's perf map and the
        jitdump it mapped.  (Merged when asked for: a process that maps
        its libraries one by one has an image for each step.)"""
        jit, problems = jit_symbols(self.pid, [m.path for m in maps], locator.root, jitdumps)
        for p in problems:
            locator.problems.setdefault(p.path, str(p))
        return [*tables, jit]

    def files_at(
        self, locator: BinaryLocator, time: int | None = None
    ) -> list[tuple[Mapping, Path | None, int | None]]:
        """The mappings live at ``time`` (all when None), each with the
        file found for it and the bias its ELF symbols move by (None: not
        found, or not an ELF with an executable segment there)."""
        maps = self.mappings if time is None else self.mappings_at(time)
        out = []
        for m in maps:
            found, _, bias = _placement(locator, m)
            out.append((m, found, bias))
        return out


def _placement(
    locator: BinaryLocator, m: Mapping
) -> tuple[Path | None, ElfFile | None, int | None]:
    """The file found for mapping ``m``, its ELF (None: not an ELF) and the
    bias that places the ELF's executable segment at the mapping (None: no
    executable segment holds the mapped offset)."""
    found = locator.find(m.path, m.build_id)
    if found is None:
        return None, None, None
    try:
        elf = read_elf(found)
    except ImageError:
        return found, None, None
    seg = next(
        (
            s
            for s in elf.segments
            if s.offset <= m.pgoff < s.offset + max(s.filesz, 1) and s.executable
        ),
        None,
    )
    if seg is None:
        return found, elf, None
    return found, elf, m.start - (seg.vaddr + (m.pgoff - seg.offset))


_INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class CodeRevision:
    """Code that changed at run time: a KSYMBOL (register/unregister), a
    BPF program load, or a TEXT_POKE (``old`` bytes replaced by ``new``).
    ``pid``: the process whose user code it is (-1: the kernel's)."""

    time: int
    kind: str  # "ksymbol", "ksymbol-unregister", "bpf", "text_poke", "bpf_image", "jitdump"
    address: int
    length: int
    name: str = ""
    old: bytes = b""
    new: bytes = b""
    pid: int = -1


class Sideband:
    """Processes, threads, CPU schedules and code revisions, in time order.

    Feed it in record order with the ``add_*`` methods (the perf.data
    reader's records map one to one), then ask it.
    """

    def __init__(self) -> None:
        self.spaces: dict[int, list[AddressSpace]] = {}
        self.thread_pid: dict[int, int] = {}
        self.comms: dict[int, list[tuple[int, str]]] = {}
        self.exits: dict[int, int] = {}
        self.kernel_mappings: list[Mapping] = []
        self.revisions: list[CodeRevision] = []
        # The source TEXT_POKE records of user code stand for (a recorder
        # that notes it may time them exactly, see hwtrace.session.calls).
        self.user_poke_source = "text_poke"
        self._stores: dict[tuple[int, int], CodeRevisions | None] = {}
        # Each process's jitdump files read so far, by path (add_jitdump_code).
        self.jitdumps: dict[int, dict[str, JitDump]] = {}
        self._switch: dict[int, tuple[list[int], list[int]]] = {}
        self._switch_arrays: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    # -- feeding -------------------------------------------------------------

    def _space(self, pid: int) -> AddressSpace:
        spaces = self.spaces.setdefault(pid, [])
        if not spaces:
            spaces.append(AddressSpace(pid, 0))
        return spaces[-1]

    def add_mmap(
        self,
        time: int,
        pid: int,
        start: int,
        length: int,
        pgoff: int,
        path: str,
        *,
        executable: bool = True,
        build_id: bytes | None = None,
        kernel: bool = False,
    ) -> None:
        """An mmap (perf only records executable ones unless --data)."""
        if not executable or length <= 0:
            return
        m = Mapping(time, start, length, pgoff, path, build_id)
        if kernel or pid == -1:
            self.kernel_mappings.append(m)
        else:
            self._space(pid).mappings.append(m)

    def add_comm(self, time: int, pid: int, tid: int, comm: str, *, exec: bool = False) -> None:
        self.thread_pid[tid] = pid
        self.comms.setdefault(tid, []).append((time, comm))
        if exec:
            # exec replaces the whole image: a new generation from here on.
            self.spaces.setdefault(pid, []).append(AddressSpace(pid, time))

    def add_fork(self, time: int, pid: int, ppid: int, tid: int, ptid: int) -> None:
        self.thread_pid[tid] = pid
        if tid not in self.comms and ptid in self.comms:
            # A child keeps its parent's name until it execs.
            self.comms[tid] = [(time, self.comms[ptid][-1][1])]
        if pid != ppid and pid not in self.spaces:
            parent = self.spaces.get(ppid)
            inherited = [] if not parent else [m for m in parent[-1].mappings if m.time <= time]
            self.spaces[pid] = [AddressSpace(pid, time, list(inherited))]

    def add_exit(self, time: int, pid: int, tid: int) -> None:
        self.exits[tid] = time

    def add_switch(self, time: int, cpu: int, tid: int) -> None:
        """From ``time`` on, ``tid`` runs on ``cpu`` (-1: unknown / idle)."""
        times, tids = self._switch.setdefault(cpu, ([], []))
        times.append(time)
        tids.append(tid)
        self._switch_arrays.pop(cpu, None)

    def set_user_poke_source(self, source: str) -> None:
        """Take TEXT_POKE records of user code as revisions of ``source``
        (see :data:`hwtrace.image.revisions.EXACT_SOURCES`)."""
        if source != self.user_poke_source:
            self.user_poke_source = source
            self._stores.clear()

    def add_revision(self, revision: CodeRevision) -> None:
        self.revisions.append(revision)
        self._stores.clear()

    def code_revisions(self, pid: int, conv: TscConversion | None) -> CodeRevisions | None:
        """The TEXT_POKE revisions of process ``pid``'s code and the
        kernel's, the BPF JIT images perf kept and the code of the jitdump
        files it mapped (:meth:`add_jitdump_code`), in TSC (through
        ``conv``; perf time without one), for the decoder (None: none)."""
        key = (pid, id(conv))
        if key not in self._stores:
            store = CodeRevisions()
            for r in self.revisions:
                if r.kind not in ("text_poke", "bpf_image", "jitdump") or not r.new:
                    continue
                if r.pid not in (-1, pid):
                    continue
                # A record without a time (a file recorded without them)
                # is no time in TSC either.
                t = int(conv.to_tsc(r.time)) if conv is not None and r.time > 0 else r.time
                t = min(t, _INT64_MAX)
                source = "bpf" if r.kind == "bpf_image" else r.kind
                if r.kind == "text_poke" and r.pid != -1:
                    source = self.user_poke_source
                store.add(r.address, r.new, t, source, name=r.name)
            self._stores[key] = store if len(store) else None
        return self._stores[key]

    def add_jitdump_code(self, locator: BinaryLocator, conv: TscConversion | None) -> list[str]:
        """The code each process's mapped jitdump files (``jit-PID.dump``,
        which JITs map so profilers see them) loaded, as revisions of its
        code from each load's time (the perf clock: record with ``-k mono``,
        as ``perf inject --jit`` needs; TSC times when the file says so).
        The files read are kept (:attr:`jitdumps`) for naming the code.
        Returns the problems met (one per missing, damaged or foreign file)."""
        problems: list[str] = []
        for pid, spaces in self.spaces.items():
            paths = [m.path for space in spaces for m in space.mappings]
            dumps = read_mapped_jitdumps(pid, paths, locator.root)
            self.jitdumps[pid] = dumps
            for path in dict.fromkeys(p for p in paths if is_jitdump_path(p)):
                if path not in dumps:
                    problems.append(f"{path}: jitdump file not found")
            for dump in dumps.values():
                problems += [str(p) for p in dump.problems]
                for c in dump.codes:
                    if not c.code:
                        continue
                    t = int(conv.to_ns(c.time)) if dump.tsc_timestamps and conv else c.time
                    self.add_revision(
                        CodeRevision(t, "jitdump", c.address, len(c.code), c.name, b"", c.code,
                                     pid)
                    )  # fmt: skip
        return problems

    def revision_conflicts(self) -> list[str]:
        """What the code revision stores made so far found: sources that
        disagree about the same bytes at the same time."""
        seen: dict[str, None] = {}
        for store in self._stores.values():
            for c in store.conflicts if store is not None else ():
                seen[str(c)] = None
        return list(seen)

    # -- asking --------------------------------------------------------------

    def pid_of(self, tid: int) -> int:
        return self.thread_pid.get(tid, tid)

    def comm_of(self, tid: int, time: int | None = None) -> str:
        history = self.comms.get(tid) or self.comms.get(self.pid_of(tid)) or []
        if not history:
            return ":" + str(tid)
        if time is None:
            return history[-1][1]
        i = bisect_right([t for t, _ in history], time) - 1
        return history[max(i, 0)][1]

    def space_at(self, pid: int, time: int) -> AddressSpace | None:
        spaces = self.spaces.get(pid)
        if not spaces:
            return None
        i = bisect_right([s.since for s in spaces], time) - 1
        return spaces[max(i, 0)]

    def threads_on(self, cpu: int, times: np.ndarray) -> np.ndarray:
        """The tid running on ``cpu`` at each of ``times`` (-1 where unknown)."""
        arrays = self._switch_arrays.get(cpu)
        if arrays is None:
            t, tids = self._switch.get(cpu, ([], []))
            order = np.argsort(np.asarray(t, dtype=np.int64), kind="stable")
            arrays = (
                np.asarray(t, dtype=np.int64)[order],
                np.asarray(tids, dtype=np.int64)[order],
            )
            self._switch_arrays[cpu] = arrays
        st, tids = arrays
        i = np.searchsorted(st, np.asarray(times, dtype=np.int64), side="right") - 1
        out = np.full(i.shape, -1, dtype=np.int64)
        ok = i >= 0
        out[ok] = tids[i[ok]]
        return out

    def switch_times(self, cpu: int) -> np.ndarray:
        self.threads_on(cpu, np.zeros(0, np.int64))
        return self._switch_arrays[cpu][0]

    def kernel_text_address(self) -> int | None:
        """Where the kernel's ``_text`` was (KASLR), from perf's kernel MMAP
        record (``[kernel.kallsyms]_text``, whose pgoff is that address)."""
        for m in self.kernel_mappings:
            if m.path.startswith("[kernel.kallsyms]") and m.pgoff:
                return m.pgoff
        return None

    def kernel_image(self, locator: BinaryLocator) -> KernelCode | None:
        """Kernel code from the kernel mappings that are files (modules, a
        vmlinux perf found), where the locator finds them."""
        from ..image.kernelcode import KernelCode

        files = [m for m in self.kernel_mappings if not m.path.startswith("[")]
        if not files:
            return None
        space = AddressSpace(-1, 0, files)
        image, symbols = space.image(locator)
        return KernelCode(image, symbols, "kernel mappings") if len(image) else None
