"""Live kernel events filtered in the kernel: the tracing session.

:class:`KernelTrace` compiles a filter expression (LTTng's language) once
per tracepoint against its tracefs ``format`` (:mod:`hwtrace.filter.ebpf.kernel`),
loads the programs with ``bpf()``, attaches them and reads what they emit
from a BPF ring buffer.  :meth:`KernelTrace.read` returns
:class:`EventBatch` es: the headers (time, CPU, pid, tid, comm, verdict)
and the raw records, which :meth:`EventBatch.source` turns into a
:class:`~hwtrace.filter.inputs.base.EventSource` the userspace tiers and
the writers take.  Closing (or the process ending, however) frees every
kernel object: nothing is pinned.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..columns import Columns
from ..filter.ast import field_refs
from ..filter.check import compile_check
from ..filter.ebpf.kernel import (
    COUNTERS,
    HEADER,
    LAYOUT,
    KernelProgram,
    generate_kernel,
)
from ..filter.errors import FilterError
from ..filter.inputs.base import EventSource, EventType, contexts
from ..filter.schema import Schema
from ..filter.sources import tracefs_schema
from ..kernel import bpf
from ..kernel.ringbuf import RingBuffer, gather_prefixes
from ..kernel.tracepoint import Attachment, TracepointError, expand_events, tracefs_root
from .follow import ProcessSet

__all__ = ["EventBatch", "KernelTrace", "TraceError", "TracedEvent", "verifier_message"]


class TraceError(Exception):
    """The session cannot be set up; the message says why (one line, or a
    verifier's message with the filter text and a caret)."""


@dataclass
class TracedEvent:
    name: str  # system:event
    schema: Schema  # the record's (what is listed)
    format_text: str
    tracepoint_id: int
    # What the filter sees: the record's, a char * a string read through it.
    filter_schema: Schema | None = None
    program: KernelProgram | None = None
    loaded: bpf.Program | None = None

    @property
    def filtered_schema(self) -> Schema:
        return self.filter_schema if self.filter_schema is not None else self.schema


_INSN_LINE = re.compile(r"^(\d+): \(")


def verifier_message(log: str) -> tuple[str, int | None]:
    """The verifier's complaint (its last meaningful line) and the index of
    the instruction it was at."""
    lines = [ln for ln in log.splitlines() if ln.strip()]
    index = None
    message = ""
    for ln in lines:
        m = _INSN_LINE.match(ln)
        if m:
            index = int(m.group(1))
    for ln in reversed(lines):
        if ln.startswith(("processed ", "verification time", "stack depth", "max_states")):
            continue
        if _INSN_LINE.match(ln) or re.match(r"^\d+: R\d", ln):
            continue
        message = ln.strip()
        break
    return message or "rejected", index


@dataclass
class EventBatch(Columns):
    """Events read from the ring buffer: ``header`` (:data:`HEADER` rows)
    and each raw record as ``buf[starts[i] : starts[i] + sizes[i]]``."""

    events: list[TracedEvent]
    header: np.ndarray
    buf: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray

    ROWS = "header"

    def record(self, i: int) -> bytes:
        s = int(self.starts[i])
        return self.buf[s : s + int(self.sizes[i])].tobytes()

    def source(self, path: str = "<kernel>") -> EventSource:
        """The batch as an event source (the model ``hwtrace filter``'s
        inputs fill), with each event's context from its header."""
        h = self.header
        n = h.shape[0]
        names, comm = (
            np.unique(h["comm"], return_inverse=True) if n else ([], np.zeros(0, np.int64))
        )
        comms = [bytes(c).decode("utf-8", "replace") for c in names]
        pid = h["pid"].astype(np.int64)
        tid = h["tid"].astype(np.int64)
        cpu = h["cpu"].astype(np.int64)
        ctx, ctx_rows = contexts(pid, tid, cpu, comm.astype(np.int64), comms,
                                 uid=h["uid"].astype(np.int64), gid=h["gid"].astype(np.int64))  # fmt: skip
        base = self.buf.ctypes.data
        types = []
        for k, e in enumerate(self.events):
            rows = np.flatnonzero(h["event"] == k)
            types.append(EventType(
                e.name, e.schema, rows, np.uint64(base) + self.starts[rows].astype(np.uint64),
                self.starts[rows], self.sizes[rows],
            ))  # fmt: skip
        src = EventSource("kernel", path, types, h["time"].astype(np.int64), cpu, tid,
                          comm.astype(np.int64), comms, ctx, buf=self.buf, keep=[self])  # fmt: skip
        src.context_rows = ctx_rows  # type: ignore[attr-defined]
        return src


class KernelTrace:
    """Tracepoints ``events`` (``SYSTEM:EVENT``, globs allowed) with
    ``expression`` (None: every event) run in the kernel.

    ``emit``: ``"passed"`` (the events that pass), ``"all"`` (every event,
    with its verdict: for checking the kernel's verdicts), ``"none"`` (only
    count).  ``max_string`` bounds the compares of ``__data_loc`` strings
    and of strings read through ``char *`` fields."""

    def __init__(
        self,
        events: list[str],
        expression: str | None = None,
        *,
        emit: str = "passed",
        max_string: int = 256,
        ringbuf_size: int = 1 << 22,
        tracefs: Path | None = None,
        pids: list[int] | None = None,
    ) -> None:
        self.expression = expression
        self.emit = emit
        self.attachments: list[Attachment] = []
        self.scratch: bpf.Map | None = None
        self.ring: RingBuffer | None = None
        self.pids = None  # a ProcessSet when only some processes are traced
        self.events: list[TracedEvent] = []
        try:
            root = tracefs or tracefs_root()
            for system, event in expand_events(events, root):
                fmt = root / "events" / system / event / "format"
                text = fmt.read_text()
                schema = tracefs_schema(system, event, str(root))
                strings = tracefs_schema(system, event, str(root), pointer_strings=True)
                tp = int((root / "events" / system / event / "id").read_text())
                self.events.append(TracedEvent(f"{system}:{event}", schema, text, tp, strings))
        except TracepointError as e:
            raise TraceError(str(e)) from None
        except FilterError as e:
            raise TraceError(str(e)) from None
        except OSError as e:
            raise TraceError(f"cannot read tracefs: {e}") from None
        if len(self.events) > 0xFFFF:
            raise TraceError(f"{len(self.events)} events: at most 65535 in one session")
        trees = self._check(expression, max_string)
        try:
            self.scratch = bpf.Map(bpf.MAP_PERCPU_ARRAY, 4, LAYOUT.size, 1, name="hwtrace_scratch")
            self.ring = RingBuffer(ringbuf_size)
            if pids is not None:
                self._follow(pids, root)
            for k, (e, tree) in enumerate(zip(self.events, trees, strict=True)):
                e.program = generate_kernel(
                    tree, e.filtered_schema, expression=expression or "", event_name=e.name,
                    event_index=k, tracepoint_id=e.tracepoint_id, scratch_fd=self.scratch.fd, ringbuf_fd=self.ring.fd,
                    emit=emit, max_string=max_string,
                    pids_fd=self.pids.fd if self.pids is not None else None,
                    user_strings=e.name.startswith("syscalls:"),
                )  # fmt: skip
                e.loaded = self._load(e)
        except BaseException:
            self.close()
            raise

    def _follow(self, pids: list[int], root: Path) -> None:
        """Only events of processes ``pids`` and of the children they fork."""
        self.pids = ProcessSet(root)
        for pid in pids:
            self.track(pid)

    def track(self, pid: int) -> None:
        """Add process ``pid`` to those traced (with ``pids`` given)."""
        if self.pids is None:
            raise ValueError("this session traces every process")
        self.pids.add(pid)

    def _check(self, expression: str | None, max_string: int) -> list:
        if expression is None:
            return [None] * len(self.events)
        trees, errors = [], []
        # With several events, a field some lack makes it false for them
        # (LTTng's rule); a field none has is an error.
        lenient = len(self.events) > 1
        for e in self.events:
            try:
                trees.append(
                    compile_check(
                        expression, e.filtered_schema, unknown="false" if lenient else "error"
                    )
                )
            except FilterError as err:
                err.expression = expression
                raise
        if lenient and all(_all_missing(t) for t in trees):
            for e in self.events:
                try:
                    compile_check(expression, e.filtered_schema)
                except FilterError as err:
                    err.expression = expression
                    errors.append(err)
            if errors:
                raise errors[0]
        return trees

    def _load(self, e: TracedEvent) -> bpf.Program:
        prog = e.program
        assert prog is not None
        try:
            return bpf.Program(bpf.PROG_TRACEPOINT, prog.insns, name=e.name.split(":")[1])
        except bpf.BpfError as err:
            if not err.log:
                raise TraceError(str(err)) from None
            message, index = verifier_message(err.log)
            if "jumps is too complex" in message:
                # BPF_COMPLEXITY_LIMIT_JMP_SEQ: branches pending on one path.
                message += " (too many branches for the verifier: fewer terms load)"
            column = prog.columns[index] if index is not None and index < len(prog.columns) else 0
            raise FilterError(
                f"the kernel verifier rejected the program for {e.name}: {message}",
                expression=self.expression if column else None,
                column=column or None,
                where=f"insn {index}" if index is not None else None,
            ) from None

    def start(self) -> None:
        """Attach every program: events flow from now on."""
        try:
            for e in self.events:
                system, name = e.name.split(":")
                assert e.loaded is not None
                self.attachments.append(Attachment(e.loaded, system, name))
            if self.pids is not None:
                self.pids.start()
        except (TracepointError, bpf.BpfError) as err:
            self.close()
            raise TraceError(str(err)) from None

    def stop(self) -> None:
        """Detach (events stop; what they wrote stays readable)."""
        if self.pids is not None:
            self.pids.stop()
        for a in self.attachments:
            a.close()
        self.attachments = []

    def wait(self, timeout: float) -> bool:
        assert self.ring is not None
        return self.ring.wait(timeout)

    def read(self) -> EventBatch:
        """The events written since the last read."""
        assert self.ring is not None
        buf, starts, lengths = self.ring.read()
        n = starts.shape[0]
        hs = HEADER.itemsize
        raw = np.empty((n, hs), np.uint8)
        if n:
            gather_prefixes(buf, starts, lengths, hs, raw)
        header = raw.view(HEADER).reshape(n)
        sizes = np.minimum(header["size"].astype(np.int64), lengths - hs) if n else lengths
        return EventBatch(self.events, header, buf, starts + hs, sizes)

    def counts(self) -> dict[str, int]:
        """Events seen, passed and lost (ring buffer full), summed over CPUs."""
        assert self.scratch is not None
        raw = self.scratch.lookup(b"\0\0\0\0") or b""
        stride = self.scratch.value_size_rounded
        out = dict.fromkeys(COUNTERS, 0)
        for cpu in range(len(raw) // stride):
            vals = struct.unpack_from("<3Q", raw, cpu * stride + LAYOUT.counters)
            for name, v in zip(COUNTERS, vals, strict=True):
                out[name] += v
        return out

    def program_info(self) -> list[dict[str, int]]:
        return [e.loaded.info() for e in self.events if e.loaded is not None]

    def close(self) -> None:
        self.stop()
        for e in self.events:
            if e.loaded is not None:
                e.loaded.close()
                e.loaded = None
        for name in ("ring", "pids", "scratch"):
            owned = getattr(self, name)
            if owned is not None:
                owned.close()
                setattr(self, name, None)

    def __enter__(self) -> KernelTrace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _all_missing(tree) -> bool:
    """Does the checked tree refer only to fields its event lacks?"""
    refs = field_refs(tree, "event")
    return bool(refs) and all(r.path is None for r in refs)
