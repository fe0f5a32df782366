"""Recording with perf and the code capture agent together (``hwtrace record
--jit``).

perf records the trace; :class:`~hwtrace.record.jitcapture.CodeCapture`
captures the code the program writes at run time.  The order matters, so
no instruction runs untraced or uncaptured:

1. the agent launches the program (held at its exec) or attaches to it;
2. ``perf record -p PID -D -1 --control fd:CTL,ACK`` opens its events
   disabled; hwtrace sends ``enable`` and waits for perf's ``ack``;
3. the agent lets the program run and captures until it exits (perf ends
   with it, as ``perf record -p`` does);
4. the revisions go into the perf.data as ``PERF_RECORD_TEXT_POKE`` records
   of user code (:func:`add_code_revisions`), in time order, which
   ``hwtrace report``/``script`` decode through and perf itself skips (it
   applies the kernel's only; ``perf script --show-text-poke-events`` lists
   them).

Times: the agent reads the TSC; a record's perf time comes from the file's
TIME_CONV (perf writes one with Intel PT), or, for a file recorded with
``-k CLOCK_MONOTONIC``, from the TSC/CLOCK_MONOTONIC pairs the agent read.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from ..perf.data import PerfDataError, read_perf_data
from ..perf.records import SampleId, TextPoke, pack_record
from ..perf.rewrite import insert_records
from ..perf.sideband import TscConversion
from .jitcapture import CaptureResult, code_capture
from .stepper import RecordError

__all__ = ["add_code_revisions", "record_perf_with_capture"]

_MISC_USER = 2
_CLOCK_MONOTONIC = 1


def record_perf_with_capture(
    perf_argv: Sequence[str],
    target: Sequence[str] | int,
    output: str | os.PathLike[str],
    *,
    anonymous_only: bool = True,
    ready_timeout: float = 30.0,
    agent: str = "auto",
) -> tuple[int, CaptureResult]:
    """Run ``perf_argv`` (``perf record …`` with its events and ``-o
    output``, no target) on ``target`` (argv to launch, or a pid) with the
    capture agent, then add the revisions to ``output``.  Returns perf's
    exit status and what the agent captured (``agent``: see
    :func:`~hwtrace.record.jitcapture.code_capture`)."""
    cap = code_capture(target, agent, anonymous_only=anonymous_only, hold=True)
    ctl_r, ctl_w = os.pipe()
    ack_r, ack_w = os.pipe()
    argv = [*perf_argv, "-D", "-1", "--control", f"fd:{ctl_r},{ack_w}", "-p", str(cap.pid)]
    proc: subprocess.Popen | None = None
    result: CaptureResult | None = None
    try:
        proc = subprocess.Popen(argv, pass_fds=(ctl_r, ack_w))
        os.close(ctl_r)
        os.close(ack_w)
        ctl_r = ack_w = -1
        _enable(proc, ctl_w, ack_r, ready_timeout)
        result = cap.run()
        status = proc.wait()
        proc = None
    finally:
        if proc is not None:  # interrupted, or perf never got ready
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        cap.close()
        for fd in (ctl_r, ctl_w, ack_r, ack_w):
            if fd >= 0:
                os.close(fd)
    if status == 0 and result.revisions and Path(output).exists():
        add_code_revisions(output, result)
    return status, result


def _enable(proc: subprocess.Popen, ctl: int, ack: int, timeout: float) -> None:
    """Have perf enable its events and wait for its ``ack``."""
    os.write(ctl, b"enable\n")
    deadline = time.monotonic() + timeout
    got = b""
    while b"\n" not in got:  # perf writes "ack\n\0"
        left = deadline - time.monotonic()
        if proc.poll() is not None:
            raise RecordError(f"perf record exited ({proc.returncode}) before it was ready")
        if left <= 0:
            raise RecordError(f"perf record did not enable its events within {timeout:g} s")
        ready, _, _ = select.select([ack], [], [], min(left, 0.2))
        if ready:
            chunk = os.read(ack, 64)
            if not chunk:
                raise RecordError("perf record closed its control pipe before it was ready")
            got += chunk
    if not got.startswith(b"ack"):
        raise RecordError(f"perf record answered {got.decode(errors='replace').strip()!r}")


def add_code_revisions(path: str | os.PathLike[str], result: CaptureResult) -> int:
    """Add ``result``'s revisions to the perf.data at ``path`` as
    TEXT_POKE records of user code (old bytes empty, new bytes the page),
    each at the perf time the agent read it.  Returns how many were added.

    Raises :class:`RecordError` when the file's times cannot be related to
    the TSC (no TIME_CONV and a perf clock other than CLOCK_MONOTONIC)."""
    path = os.fspath(path)
    try:
        data = read_perf_data(path)
    except PerfDataError as e:
        raise RecordError(str(e)) from None
    if not data.attrs:
        raise RecordError(f"{path}: no events to attach the code revisions to")
    to_ns = _perf_clock(data, result, path)
    ea = data.attrs[0]
    st = ea.attr.sample_type
    ident = ea.ids[0] if ea.ids else None
    records = []
    for c in result.revisions:
        t = to_ns(c.time)
        sid = SampleId(pid=result.pid, tid=c.tid, time=t, cpu=max(c.cpu, 0), id=ident,
                       identifier=ident, stream_id=ident)  # fmt: skip
        raw = pack_record(TextPoke(c.address, b"", c.data), st, misc=_MISC_USER, sample_id=sid,
                          sample_id_all=bool(ea.attr.sample_id_all))  # fmt: skip
        records.append((t, raw))
    tmp = f"{path}.jit-{os.getpid()}"
    try:
        insert_records(data, tmp, records)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return len(records)


def _perf_clock(data, result: CaptureResult, path: str):
    """TSC -> perf time for this file."""
    conv = data.time_conv
    if conv is not None and conv.time_mult:
        tsc = TscConversion(conv.time_shift, conv.time_mult, conv.time_zero)
        return lambda t: int(tsc.to_ns(t))
    a = data.attrs[0].attr
    if a.use_clockid and a.clockid == _CLOCK_MONOTONIC and len(result.clock_pairs) >= 2:
        return result.tsc_to_monotonic
    raise RecordError(
        f"{path}: no TIME_CONV and perf's clock is not CLOCK_MONOTONIC: the code "
        "revisions cannot be placed in the trace's time (record with Intel PT, or -k monotonic)"
    )
