"""Software Intel PT recording: single-step a real process, write the PT it ran.

Where there is no Intel PT hardware, :func:`record_software` runs (or
attaches to) a process, single-steps its threads inside the chosen functions
or address ranges and the chosen calls (:mod:`hwtrace.record.stepper`) and
turns each thread's stepped instructions into the Intel PT a processor would
have written for it (:func:`hwtrace.pt.encode.encode_path`), with an address
filter on those ranges, or tracing the whole address space cut to the
calls' extents:

* tracing is on inside the ranges and off outside them: a branch, call or
  return leaving a range is a TIP.PGD, re-entry (at a range start or at the
  return address of a call that went outside) is MODE.Exec + TIP.PGE;
* a traced call is enabled at the function's entry (TIP.PGE) and disabled
  where it returns (TIP.PGD at the return address);
* a signal whose handler runs outside the ranges disables tracing at the
  interrupted instruction; one whose handler is inside is an interrupt
  (FUP + TIP);
* PSB+ every ``psb_period`` bytes; TSC (in PSB+), MTC and CYC come from the
  stepping clock: each instruction's cost is the clock time between the
  steps before and after it (so these are *stepping* times, the speed of a
  ptrace single-step loop, not the program's native speed);
* a ``rep`` string instruction, stepped once per iteration, is one
  instruction, as Intel PT counts it.  One interrupted between iterations
  (a signal, a fault in an iteration, the instruction limit) has not
  completed: the interrupt's (or the disable's) FUP is the REP's own IP,
  the iterations before it are no instruction, and the REP is listed once,
  where it runs on after the handler until it completes (as hwtrace's
  decoder and libipt read such a stream).

The result (:class:`SoftwareRecording`) holds a trace per thread
(:class:`ThreadTrace`: PT bytes and the stepped log), the decoder
configuration, and the sideband a ``perf.data`` writer needs (the processes'
mappings, the threads' and processes' creation, names and exits), as plain
fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import iced_x86 as iced
import numpy as np

from ..columns import distinct, member
from ..image import Image
from ..image.revisions import CodeRevisions
from ..isa.x86 import IClass, InsnCache
from ..perf.sideband import cache_vdso, elf_build_id
from ..pt.config import PtConfig
from ..pt.encode import EncodedTrace, encode_path, trace_points
from .sideband import (
    MmapRecord,
    TimeConversion,
    files_image,
    mmap_records,
    perf_filters,
    tsc_conversion,
)
from .stepper import (
    END_EXIT,
    END_LIMIT,
    END_SIGNAL,
    END_STOPPED,
    ProcessImage,
    RecordError,
    Segment,
    StepLog,
    StepRecording,
    TracedRange,
    step_threads,
)

__all__ = [
    "BACKEND",
    "TIMING_NOTE",
    "MmapRecord",
    "RecordError",
    "SoftwarePtOptions",
    "SoftwareRecording",
    "ThreadTrace",
    "TimeConversion",
    "encode_log",
    "files_image",
    "mmap_records",
    "record_software",
    "tsc_conversion",
]

BACKEND = "software: ptrace single-step"
TIMING_NOTE = (
    "times are stepping times: the clock read at each single-step stop of a "
    "ptrace loop, not the program's native execution speed"
)


class NothingTraced(RecordError):
    """A thread (or the whole recording) ran none of the traced code."""


@dataclass
class ThreadTrace:
    """One thread's trace (in one process image): its PT, the instructions
    it describes (``log.ips`` with each ``rep`` string instruction once, see
    :class:`SoftwareRecording`) and their times, and the stepped log."""

    pid: int
    tid: int
    comm: str
    cpu: int
    image: int  # index into SoftwareRecording.steps.images
    log: StepLog
    encoded: EncodedTrace
    instructions: np.ndarray  # uint64
    instruction_times: np.ndarray  # uint64

    @property
    def data(self) -> bytes:
        return self.encoded.data

    @property
    def stats(self) -> dict[str, int]:
        return dict(self.encoded.stats)


@dataclass
class SoftwareRecording:
    """A process recorded by single-stepping, as Intel PT.

    ``data`` is the PT stream, ``config`` what a decoder needs to read its
    timing (:func:`hwtrace.pt.decode.decode_trace`), ``settings`` the PT
    options used (``tsc``, ``mtc``, ``mtc_period``, ``cyc``, ``noretcomp``,
    ``psb_period``, ``ctc_ratio``, ``cbr``).  ``instructions`` are the
    executed instructions the stream describes, in order (``log.ips`` with
    each ``rep`` string instruction once, at the start of its last run of
    iterations, and without the iterations of one that had not completed
    when a signal handler ran or tracing stopped); decoding ``data`` gives
    exactly them.  ``log`` is everything the stepper saw (per-step ``ips``,
    ``times``, ``registers``).  These are the first traced thread's (the
    launched or attached one when it traced anything); ``threads`` has every
    thread's trace, that one first.  The rest is sideband: ``pid``, ``tid``,
    ``comm``, ``mmaps`` (from ``/proc/PID/maps`` when tracing began; each
    process image's in ``image_mmaps``), ``steps`` (the stepper's processes,
    images and thread events), ``time_conversion`` (stepping clock to ns),
    ``ranges`` (the address filter; ``filters`` in perf's syntax), ``calls``
    (the traced calls' functions), ``backend`` and ``timing_note``.
    """

    data: bytes
    config: PtConfig
    settings: dict[str, int | bool]
    instructions: np.ndarray  # uint64
    instruction_times: np.ndarray  # uint64, stepping clock before each one
    log: StepLog
    encoded: EncodedTrace
    pid: int
    tid: int
    comm: str
    argv: tuple[str, ...] | None
    mmaps: list[MmapRecord]
    time_conversion: TimeConversion
    ranges: list[TracedRange]
    filters: str
    exit_status: int | None
    backend: str = BACKEND
    timing_note: str = TIMING_NOTE
    stats: dict[str, int] = field(default_factory=dict)
    threads: list[ThreadTrace] = field(default_factory=list)
    steps: StepRecording | None = None
    image_mmaps: list[list[MmapRecord]] = field(default_factory=list)
    calls: list[TracedRange] = field(default_factory=list)

    @property
    def clock_error_ns(self) -> int:
        """How far the perf times of this recording (CLOCK_MONOTONIC, through
        ``time_conversion``) may be off: the clock pairs' read windows and
        the rounding of the conversion's rate over the recording."""
        if self.steps is None or self.steps.clock == "monotonic":
            return 0
        (c0, _), (c1, _) = self.steps.clock_pairs[0], self.steps.clock_pairs[-1]
        conv = self.time_conversion
        span = (c1 - c0) * conv.time_mult >> conv.time_shift  # ns the recording lasted
        return self.steps.clock_error_ns + span // (2 * conv.time_mult) + 1

    @property
    def first_tsc(self) -> int:
        return int(self.log.times[0]) if self.log.times.shape[0] else 0

    def image(self, index: int | None = None) -> Image:
        """An image of the ELF files mapped executable in process image
        ``index`` (default: the first traced thread's), at their load
        addresses (for decoding its threads' PT)."""
        if index is None:
            index = self.threads[0].image if self.threads else 0
        mmaps = self.image_mmaps[index] if self.image_mmaps else self.mmaps
        maps = self.steps.images[index].maps if self.steps is not None else self.log.maps
        return files_image(self.comm, mmaps, maps, self.vdso_file(index))

    def code_revisions(self, index: int | None = None) -> CodeRevisions:
        """The code process image ``index`` (default: the first traced
        thread's) ran that :meth:`image` does not hold: pages whose bytes
        differ from the files' when first stepped (JIT code, code patched
        before), from then on, and every later rewrite the stepper saw, from
        its first execution (times in the stepping clock, the trace's TSC).
        Decode with both to follow code that changed."""
        store = CodeRevisions()
        if self.steps is None:
            return store
        if index is None:
            index = self.threads[0].image if self.threads else 0
        img = self.steps.images[index]
        files = self.image(index)
        for address in sorted(img.code):
            data = img.code[address]
            if _files_hold(files, address, data):
                continue
            cap = img.captures.get(address)
            time, tid, cpu, ip = (cap.time, cap.tid, cap.cpu, cap.ip) if cap else (0, -1, -1, -1)
            store.add(address, data, time, "stepper", tid=tid, cpu=cpu, tsc=time, ip=ip)
        for c in img.changes:
            store.add(
                c.address, c.data, c.time, "stepper", tid=c.tid, cpu=c.cpu, tsc=c.time, ip=c.ip
            )
        return store

    def vdso_file(self, index: int | None = None, directory: Path | None = None) -> Path | None:
        """Process image ``index``'s vDSO, kept in perf's build-id cache
        (``directory``, default perf's ``buildid.dir``, ``~/.debug``; see
        :func:`hwtrace.perf.sideband.cache_vdso`), or None without one."""
        if self.steps is None:
            return None
        return _vdso_file(self.steps.images[index if index is not None else 0], directory)


def _vdso_file(img: ProcessImage, directory: Path | None = None) -> Path | None:
    bid = elf_build_id(img.vdso) if img.vdso else None
    if bid is None:
        return None
    return cache_vdso(img.vdso, bid, directory)


def _files_hold(files: Image, address: int, data: bytes) -> bool:
    """Do the files map bytes of this captured page, all equal to it?  (A
    page also holds what lies past a segment's end, which no section maps.)"""
    seen = False
    for section in files:
        lo, hi = max(section.address, address), min(section.end, address + len(data))
        if lo >= hi:
            continue
        seen = True
        if files.read_span(lo, hi - lo) != data[lo - address : hi - address]:
            return False
    return seen


# -- where code revisions begin -----------------------------------------------------


def place_revisions(steps: StepRecording, files: Sequence[Image]) -> list[list[int]]:
    """Move each code revision's time (a page first run with bytes no file
    holds, a page rewritten later: ``steps.images[k]``'s captures and
    changes, ``files[k]`` its files) back to just after the last instruction
    before its first run that took something from the trace (a conditional
    branch, an indirect branch, a return), where a decoder can switch code:
    halfway between that instruction's time and the next's.  The
    instructions in between ran bytes the two revisions share (else the
    time stays), so the flow is the same in either.  :func:`encode_log`
    puts a time anchor there, and a decoder then switches code exactly
    where it changed, whatever the timing packets.  Returns the times at
    which revisions begin, per process image."""
    begins: list[list[int]] = []
    for index, img in enumerate(steps.images):
        logs = {log.tid: log for log in steps.logs if log.image == index}
        placer = _Placer(logs)
        times = []
        for address, cap in list(img.captures.items()):
            if not _files_hold(files[index], address, img.code[address]):
                img.captures[address] = replace(cap, time=placer.time(cap.tid, cap.time))
                times.append(img.captures[address].time)
        pages = dict(img.code)
        for k, c in enumerate(img.changes):
            old = pages.get(c.address, b"")
            pages[c.address] = c.data
            img.changes[k] = replace(c, time=placer.time(c.tid, c.time, c.address, old, c.data))
            times.append(img.changes[k].time)
        begins.append(times)
    return begins


class _Placer:
    """Where in its thread's log a revision can begin (see place_revisions)."""

    def __init__(self, logs: dict[int, StepLog]) -> None:
        self.logs = logs
        self._points: dict[int, tuple[np.ndarray, InsnCache]] = {}

    def _of(self, log: StepLog) -> tuple[np.ndarray, InsnCache]:
        got = self._points.get(log.tid)
        if got is None:
            versions, readers = log.code_versions()
            points = trace_points(log.ips, readers, versions)
            got = self._points[log.tid] = (points, InsnCache(log.read_code))
        return got

    def time(self, tid: int, time: int, address: int = 0, old: bytes = b"",
             new: bytes = b"") -> int:  # fmt: skip
        log = self.logs.get(tid)
        if log is None or not log.times.shape[0]:
            return time
        times = log.times
        i = int(np.searchsorted(times, np.uint64(time), side="left"))
        if i >= times.shape[0] or int(times[i]) != time:
            return time
        seg = next((g for g in log.segments if g.start <= i < g.end), None)
        if seg is None or i == seg.start:
            return time
        points, cache = self._of(log)
        before = np.flatnonzero(points[seg.start : i])
        r = seg.start + int(before[-1]) + 1 if before.shape[0] else seg.start
        for row in range(r, i):
            ip = int(log.ips[row])
            if not address <= ip < address + len(old):
                continue
            insn = cache.get(ip, 64)
            size = 1 if isinstance(insn, int) else insn.size
            lo, hi = ip - address, min(ip - address + size, len(old))
            if old[lo:hi] != new[lo:hi]:
                return time  # it ran other bytes there: no earlier place is right
        if r == seg.start:
            return int(times[r])
        return (int(times[r - 1]) + int(times[r]) + 1) // 2


# -- sideband ----------------------------------------------------------------------


def _time_conversion(steps: StepRecording) -> TimeConversion:
    if steps.clock == "monotonic":
        return TimeConversion(0, 1, 0, 1e9)
    return tsc_conversion(steps.clock_pairs[0], steps.clock_pairs[-1])


# -- the path ------------------------------------------------------------------------


def _rep_rows(
    ips: np.ndarray, cache: InsnCache, segments: Sequence[Segment]
) -> tuple[np.ndarray, np.ndarray]:
    """Rows that are not an instruction of their own: ``(repeat, unfinished)``.

    ``repeat``: rows repeating the previous row's ``rep`` string instruction,
    its further iterations, each stepped on its own.  Only a string
    instruction with a REP/REPNE prefix repeats itself.  Another instruction
    at the previous row's address ran again: a branch to itself, or a signal
    handler whose first instruction ran and whose next one was interrupted by
    a signal to the same handler.  Nor is a row that starts a traced stretch
    or a handler (an interrupt) ever an iteration.

    ``unfinished``: every row of a ``rep`` string instruction that was
    interrupted before it completed, i.e. whose next IP (the next row, the
    interrupt's source, or where the traced stretch ended) is its own: a
    signal between iterations, a fault in one (the faulting iteration is no
    row), the instruction limit.  As in Intel PT, such an instruction has not
    completed: the interrupt's (or the disable's) FUP is its IP, and it
    completes, one instruction, when it runs on after the handler.
    """
    n = ips.shape[0]
    same = np.zeros(n, np.bool_)
    same[1:] = ips[1:] == ips[:-1]
    # Where each row went: the next row, unless an event comes between.
    after = np.empty(n, np.uint64)
    after[:-1] = ips[1:]
    if n:
        after[-1] = 0
    for seg in segments:
        if seg.start < n:
            same[seg.start] = False
        if 0 < seg.end <= n:
            after[seg.end - 1] = seg.end_ip
        for row, source, _sig in seg.interrupts:
            if row < n:
                same[row] = False
            if 0 < row <= n:
                after[row - 1] = source
    rep_ips = np.array([ip for ip in distinct(ips) if _is_rep_at(cache, int(ip))], np.uint64)
    is_rep = member(ips, rep_ips)
    same &= is_rep
    # Runs: a row that is no iteration starts one; an unfinished run is a rep
    # string instruction whose last row goes on at its own IP.
    run = np.cumsum(~same)
    last = np.ones(n, np.bool_)
    last[:-1] = ~same[1:]
    open_end = last & is_rep & (after == ips)
    unfinished = member(run, run[open_end]) & is_rep  # (run ascends)
    return same & ~unfinished, unfinished


# Ends of a traced stretch that are not a branch leaving the traced code: the
# thread stopped being traced between two instructions.
_ASYNC_ENDS = (END_SIGNAL, END_EXIT, END_LIMIT, END_STOPPED)
_NEAR_BRANCHES = (IClass.JUMP, IClass.CALL, IClass.COND_JUMP, IClass.RETURN)


def _stopped_after_branch(cache: InsnCache, log: StepLog, seg: Segment, keep: np.ndarray) -> bool:
    """Whether tracing stopped asynchronously (a signal handled outside, the
    thread killed, recording stopped) right after a near branch.  A TIP.PGD
    bound to the branch would read as the branch leaving the traced code:
    perf takes a jump into its address filter, or a Jcc whose taken target
    is in it, as not leaving it, and walks on.  Only FUP + TIP.PGD says it,
    so such a trace disables asynchronously throughout."""
    if seg.end_reason not in _ASYNC_ENDS or not seg.end_ip:
        return False
    insn = cache.get(int(log.ips[keep[-1]]), 64)
    return not isinstance(insn, int) and insn.iclass in _NEAR_BRANCHES


def _is_rep_at(cache: InsnCache, ip: int) -> bool:
    insn = cache.get(ip, 64)
    return not isinstance(insn, int) and _is_rep_string(insn.raw)


def _is_rep_string(raw: bytes) -> bool:
    """A string instruction (MOVS, STOS, CMPS ...) with a REP or REPNE prefix."""
    ins = iced.Decoder(64, raw).decode()
    return ins.is_string_instruction and (ins.has_rep_prefix or ins.has_repne_prefix)


@dataclass(frozen=True)
class SoftwarePtOptions:
    """The Intel PT options a stepped recording is encoded with, as
    :func:`record_software` documents them; checked when made (raises
    :class:`RecordError`)."""

    psb_period: int = 4096
    tsc: bool = True
    mtc_period: int | None = 3
    cyc: bool = False
    cyc_thresh: int = 0
    noretcomp: bool = False
    ctc_ratio: int = 2
    cbr: int = 8

    def __post_init__(self) -> None:
        if self.psb_period < 0:
            raise RecordError("psb_period must be >= 0")
        if self.mtc_period is not None and not 0 <= self.mtc_period <= 15:
            raise RecordError("mtc_period must be 0-15")
        if not 0 <= self.cyc_thresh <= 15:
            raise RecordError("cyc_thresh must be 0-15")
        if not 1 <= self.ctc_ratio <= 511:
            raise RecordError("ctc_ratio must be 1-511")
        if not 1 <= self.cbr <= 255:
            raise RecordError("cbr must be 1-255")

    def settings(self) -> dict[str, int | bool]:
        """The options as the recording's ``settings`` (perf's intel_pt
        config terms) state them."""
        return {
            "tsc": self.tsc,
            "mtc": self.tsc and self.mtc_period is not None,
            "mtc_period": int(self.mtc_period or 0),
            "cyc": self.cyc,
            "cyc_thresh": self.cyc_thresh,
            "noretcomp": self.noretcomp,
            "psb_period": self.psb_period,
            "ctc_ratio": self.ctc_ratio,
            "cbr": self.cbr,
        }


def encode_log(
    log: StepLog,
    options: SoftwarePtOptions | None = None,
    *,
    revision_times: Sequence[int] = (),
    **keywords: Any,
) -> tuple[EncodedTrace, np.ndarray, np.ndarray]:
    """The Intel PT of a stepped log; also the instructions it describes and
    their times.  ``options`` (default: :class:`SoftwarePtOptions`'s), any
    of them also as keywords (``psb_period=0``); ``revision_times``:
    where code revisions begin (stepping clock), each marked in the trace
    by a time anchor before the first instruction at or after it
    (:func:`~hwtrace.pt.encode.encode_path`'s ``anchors``)."""
    opt = replace(options or SoftwarePtOptions(), **keywords)
    if not log.segments:
        raise NothingTraced("nothing was traced: the process never ran inside the ranges")
    cache = InsnCache(log.read_code)
    repeat, unfinished = _rep_rows(log.ips, cache, log.segments)
    drop = repeat | unfinished
    # Traced stretches with something left to encode: a stretch that only
    # ran part of a rep string instruction (resumed after a signal, stopped
    # by another) describes no instruction; tracing stays off across it.
    stretches = []
    for seg in log.segments:
        rows = np.arange(seg.start, seg.end)
        keep = rows[~drop[seg.start : seg.end]]
        if keep.shape[0]:
            stretches.append((seg, keep))
    if not stretches:
        raise NothingTraced(
            "nothing was traced: no instruction inside the ranges completed "
            "(only part of a rep string instruction ran)"
        )
    versions, readers = log.code_versions()
    path: list[np.ndarray] = []
    vers: list[np.ndarray] = []
    cost: list[np.ndarray] = []
    off: list[tuple[int, int]] = []
    interrupts: list[tuple[int, int]] = []
    ptw_rows = np.array([r for r, _, _ in log.ptwrites], np.int64)
    ptwrites: list[tuple[int, int, int]] = []
    begin = distinct(np.searchsorted(log.times, np.array(revision_times, np.uint64)))
    anchors: list[int] = []
    pos = 0
    for k, (seg, keep) in enumerate(stretches):
        inside = begin[(begin >= keep[0]) & (begin <= keep[-1])]
        anchors += (pos + np.searchsorted(keep, inside)).tolist()
        if ptw_rows.shape[0]:
            j = np.searchsorted(keep, ptw_rows)
            hit = (j < keep.shape[0]) & (keep[np.minimum(j, keep.shape[0] - 1)] == ptw_rows)
            for w in np.flatnonzero(hit).tolist():
                _, payload, size = log.ptwrites[w]
                ptwrites.append((pos + int(j[w]), payload, size))
        t = log.times[keep].astype(np.int64)
        nxt = np.empty_like(t)
        nxt[:-1] = t[1:]
        nxt[-1] = max(int(seg.end_time), int(t[-1]) + 1)
        path.append(log.ips[keep])
        vers.append(versions[keep])
        cost.append(np.maximum(nxt - t, 1))
        for row, source, _sig in seg.interrupts:
            # The handler's first kept row (a repeated rep-string row is not).
            j = int(np.searchsorted(keep, row))
            if j >= keep.shape[0]:
                continue
            at = pos + j
            # A signal taken right where tracing (re)starts, or stacked on
            # another at the same stop: the enable, or the first interrupt,
            # already lands on the handler; the path is the same.
            if at == pos or (interrupts and interrupts[-1][0] == at):
                continue
            interrupts.append((at, source))
        pos += keep.shape[0]
        if k + 1 < len(stretches):
            # Where the process went while tracing was off: one untraced IP.
            path.append(np.array([seg.end_ip], np.uint64))
            vers.append(versions[keep[-1:]])
            gap = int(log.times[stretches[k + 1][1][0]]) - int(seg.end_time)
            cost.append(np.array([max(gap, 1)], np.int64))
            off.append((pos, pos + 1))
            pos += 1
    ips = np.concatenate(path)
    last = stretches[-1][0]
    end_ip: int | None = last.end_ip or None
    if end_ip is None and last.end_reason == END_EXIT:
        insn = cache.get(int(ips[-1]), 64)
        if not isinstance(insn, int):
            end_ip = insn.next_ip  # exit_group: a system call that never returned
    try:
        enc = encode_path(
            ips,
            readers,
            versions=np.concatenate(vers),
            end_ip=end_ip,
            ret_compression=not opt.noretcomp,
            psb_period=opt.psb_period,
            sync_disable=not any(
                _stopped_after_branch(cache, log, seg, keep) for seg, keep in stretches
            ),
            interrupts=interrupts,
            trace_off=off,
            tsc=int(log.times[0]) if opt.tsc else None,
            mtc_freq=opt.mtc_period if opt.tsc else None,
            cyc=opt.cyc,
            cyc_thresh=opt.cyc_thresh,
            ctc_ratio=opt.ctc_ratio,
            cbr=opt.cbr,
            cycles=np.concatenate(cost),
            ptwrites=ptwrites,
            anchors=anchors,
        )
    except ValueError as exc:
        raise RecordError(f"cannot encode the stepped path as Intel PT: {exc}") from None
    return enc, log.ips[~drop], log.times[~drop]


def record_software(
    target: Sequence[str] | int,
    *,
    functions: Sequence[str] = (),
    calls: Sequence[str] = (),
    ranges: Sequence[tuple[int, int]] = (),
    follow_fork: bool = False,
    psb_period: int = SoftwarePtOptions.psb_period,
    tsc: bool = SoftwarePtOptions.tsc,
    mtc_period: int | None = SoftwarePtOptions.mtc_period,
    cyc: bool = SoftwarePtOptions.cyc,
    cyc_thresh: int = SoftwarePtOptions.cyc_thresh,
    noretcomp: bool = SoftwarePtOptions.noretcomp,
    ctc_ratio: int = SoftwarePtOptions.ctc_ratio,
    cbr: int = SoftwarePtOptions.cbr,
    clock: str = "tsc",
    registers: str = "all",
    max_instructions: int | None = None,
) -> SoftwareRecording:
    """Record ``target`` (argv to launch, or a pid to attach to), every
    thread of it, inside ``functions`` (``name`` or ``module!name``) and
    ``ranges`` (``(start, end)``, end exclusive) and during each call of
    ``calls`` (the function with everything it calls until it returns) by
    single-stepping, as Intel PT.  ``follow_fork``: child processes too.

    PT options: ``psb_period`` (bytes between PSB+; 0: only the first),
    ``tsc`` (TSC packets in PSB+), ``mtc_period`` (MTC every 2**n crystal
    clock ticks, None: no MTC; needs ``tsc``), ``cyc`` (CYC packets;
    ``cyc_thresh``: each after at least 2**(n - 1) cycles, 0-15),
    ``noretcomp`` (no return compression), ``ctc_ratio`` (stepping-clock
    ticks per crystal clock tick, 1-511) and ``cbr`` (core:bus ratio in
    PSB+).  Stepping: ``clock`` (``"tsc"`` or ``"monotonic"``),
    ``registers`` (``"all"`` or ``"basic"``), ``max_instructions`` (over
    all threads).

    Raises :class:`RecordError` with a message for a process that cannot be
    started, attached or traced, unknown functions and bad options.
    """
    options = SoftwarePtOptions(psb_period, tsc, mtc_period, cyc, cyc_thresh, noretcomp,
                                ctc_ratio, cbr)  # fmt: skip
    try:
        steps = step_threads(
            target,
            functions=functions,
            calls=calls,
            ranges=ranges,
            follow_fork=follow_fork,
            clock=clock,
            registers=registers,
            max_instructions=max_instructions,
        )
    except OSError as exc:
        raise RecordError(f"cannot record: {exc}") from None
    build_ids: dict[str, bytes | None] = {}
    image_mmaps = [mmap_records(img.maps, build_ids, img.vdso) for img in steps.images]
    files = [
        files_image(img.comm, image_mmaps[k], img.maps, _vdso_file(img))
        for k, img in enumerate(steps.images)
    ]
    begins = place_revisions(steps, files)
    threads: list[ThreadTrace] = []
    nothing: NothingTraced | None = None
    for log in steps.logs:
        try:
            enc, insns, times = encode_log(log, options, revision_times=begins[log.image])
        except NothingTraced as exc:
            nothing = nothing or exc
            continue
        threads.append(
            ThreadTrace(log.pid, log.tid, log.comm, log.cpu, log.image, log, enc, insns, times)
        )
    if not threads:
        assert nothing is not None
        raise nothing
    settings: dict[str, int | bool] = {
        **options.settings(),
        "branch_enable": True,
        "user": True,
        "kernel": False,
        # PTWRITE carried out by the stepper: PTW packets with FUPs.
        "ptw": any(t.log.ptwrites for t in threads),
    }
    first = threads[0]
    main = steps.images[0]
    return SoftwareRecording(
        data=first.data,
        config=first.encoded.config,
        settings=settings,
        instructions=first.instructions,
        instruction_times=first.instruction_times,
        log=first.log,
        encoded=first.encoded,
        pid=steps.pid,
        tid=first.tid,
        comm=main.comm,
        argv=main.argv,
        mmaps=image_mmaps[0],
        time_conversion=_time_conversion(steps),
        ranges=main.ranges,
        # Calls run anywhere: as traced by hardware, the whole address space
        # (no filter), cut to the calls.
        filters=""
        if main.calls
        else perf_filters([(r.start, r.end) for r in main.ranges], main.maps),
        exit_status=steps.exit_status,
        stats=first.stats,
        threads=threads,
        steps=steps,
        image_mmaps=image_mmaps,
        calls=main.calls,
    )
