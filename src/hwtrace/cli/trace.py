"""``hwtrace trace``: live kernel events filtered in the kernel, and the
co-operative system call latency tracker.

    hwtrace trace EVENT[,EVENT...] [--filter EXPR] [-o PATH] [-p PID | -- COMMAND]
    hwtrace trace --latency [--threshold [CALL=]TIME ...] [-o PATH] (-p PID | -- COMMAND)
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Sequence

from .common import Parser, checked, command_parser, process_id, seconds

_UNITS = {"": 1, "ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


def _max_string(value: str) -> int:
    # (a tracepoint record, and so a __data_loc string, is at most 8 KiB)
    return checked(value, int, "a number of bytes", lambda n: 1 <= n < 8192, "1 to 8191 bytes")


def parse_time(text: str) -> int:
    """``250us``, ``10ms``, ``1.5s``, ``800`` (ns) as nanoseconds; -1 never."""
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(ns|us|ms|s)?\s*", text)
    if m is None:
        raise ValueError(f"bad time {text!r}: a number with ns, us, ms or s")
    return round(float(m.group(1)) * _UNITS[m.group(2) or ""])


def _parser() -> Parser:
    p = command_parser(
        "hwtrace trace",
        main,
        epilog="EVENT: SYSTEM:EVENT as in /sys/kernel/tracing/events (globs allowed), e.g. "
        "sched:sched_switch,raw_syscalls:sys_enter.  TIME: 800 (ns), 250us, 10ms, 1.5s.",
    )
    p.add_argument("events", nargs="?", metavar="EVENT[,EVENT...]", help="tracepoints to trace")
    p.add_argument("-f", "--filter", metavar="EXPR", help="keep the events EXPR accepts")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="write events to PATH: perf.data for *.data, JSON lines for *.jsonl, "
                   "else a CTF trace directory (default: a line per event on stdout)")  # fmt: skip
    p.add_argument("-p", "--pid", type=process_id, action="append", metavar="PID",
                   help="only this process and the children it forks (repeatable)")  # fmt: skip
    p.add_argument("-d", "--duration", type=seconds, metavar="SECONDS",
                   help="stop after this long")  # fmt: skip
    p.add_argument("--max-string", type=_max_string, default=256, metavar="BYTES",
                   help="bound of the kernel's compares of __data_loc strings and of the "
                   "strings char * fields point to (default 256)")  # fmt: skip
    p.add_argument("--buffer-size", type=int, default=4096, metavar="KIB",
                   help="ring buffer size (a power of two, default 4096 KiB)")  # fmt: skip
    p.add_argument("--latency", action="store_true",
                   help="the system call latency tracker (no EVENT)")  # fmt: skip
    p.add_argument("--threshold", action="append", default=[], metavar="[CALL=]TIME",
                   help="with --latency: record calls (a name or number; default any) at "
                   "least this slow, for every thread until the application sets its own")  # fmt: skip
    p.add_argument("--rows", type=int, default=256,
                   help="with --latency: threads with thresholds of their own (default 256)")  # fmt: skip
    p.add_argument("--pin", metavar="PATH",
                   help="with --latency: pin the shared map at PATH in a BPF filesystem, for "
                   "applications hwtrace did not start (HWTRACE_COOP_PIN=PATH); removed at the "
                   "end, left if hwtrace is killed")  # fmt: skip
    p.add_argument("--stats", action="store_true",
                   help="the kernel's run time of each filter program (BPF_ENABLE_STATS)")  # fmt: skip
    p.add_argument("-l", "--list", nargs="?", const="*:*", metavar="PATTERN",
                   help="list the tracepoints matching PATTERN (default all) and exit")  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="no counts at the end")
    return p


def main(argv: Sequence[str]) -> int:
    """Trace kernel tracepoints with an LTTng filter expression run in the kernel as eBPF, or
    (--latency) time the system calls of a process and record those slower than thresholds the
    application sets in shared memory."""
    p = _parser()
    argv = list(argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    args = p.parse_args(argv)
    if args.list is not None:
        return _list(args.list)
    if args.pin and not args.latency:
        p.error("--pin is for --latency (the shared map)")
    if args.latency:
        if args.events or args.filter:
            p.error("--latency traces system calls: give no EVENT or --filter")
        if not args.pid and not command:
            p.error("--latency needs -p PID or -- COMMAND")
    elif not args.events:
        p.error("no EVENT given (e.g. sched:sched_switch)")
    if args.pid and command:
        p.error("give -p PID or -- COMMAND, not both")
    if args.buffer_size <= 0 or args.buffer_size & (args.buffer_size - 1) or args.buffer_size < 4:
        p.error(f"--buffer-size {args.buffer_size}: a power of two of at least 4 KiB")
    for pid in args.pid or []:
        if not os.path.isdir(f"/proc/{pid}"):
            sys.stderr.write(f"hwtrace trace: no process with pid {pid}\n")
            return 1
    if os.geteuid() != 0:
        sys.stderr.write("hwtrace trace: needs root (BPF programs on kernel tracepoints)\n")
        return 1
    session = _Session(args, command)
    return session.run()


def _list(pattern: str) -> int:
    from ..kernel.tracepoint import TracepointError, expand_events

    if ":" not in pattern:
        pattern = f"{pattern}:*" if pattern else "*:*"
    try:
        for system, event in expand_events([pattern]):
            sys.stdout.write(f"{system}:{event}\n")
    except TracepointError as e:
        sys.stderr.write(f"hwtrace trace: {e}\n")
        return 1
    return 0


class _Stop(Exception):
    pass


class _Session:
    def __init__(self, args, command: list[str]) -> None:
        self.args = args
        self.command = command
        self.child = None

    def _launch(self) -> int:
        """Start COMMAND held before exec until tracing is on (its process
        exists, so it can be tracked, but runs nothing of its own yet)."""
        from ..ktrace.workload import HeldCommand

        fd = getattr(self, "coop_fd", None)
        env = dict(os.environ)
        if fd is not None:
            env["HWTRACE_COOP_FD"] = str(fd)
        self.child = HeldCommand(self.command, env=env, pass_fd=fd, prog="hwtrace trace")
        return self.child.pid

    def _release(self) -> None:
        if self.child is not None:
            self.child.release()

    def run(self) -> int:
        def stop(signum, frame):
            # While events flow, a signal only asks the loop to stop: raised
            # in the middle of a read or a write, it would lose the batch
            # in hand (read from the ring buffer, counted as passed).
            if self.recording:
                self.stopping = signum
                return
            raise KeyboardInterrupt if signum == signal.SIGINT else _Stop

        self.recording = False
        self.stopping = 0
        old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        status = 0
        try:
            if self.args.latency:
                status = self._latency()
            else:
                status = self._events()
            if self.stopping:
                status = 130
        except _Failed as e:
            sys.stderr.write(f"hwtrace trace: {e}\n")
            status = 1
        except (KeyboardInterrupt, _Stop):
            status = 130
        finally:
            self.recording = False
            for s, h in old.items():
                signal.signal(s, h)
            if self.child is not None:  # never released: do not let it run untraced
                self.child.close()
            if self.stopping and self.child is not None and self.child.poll() is None:
                self.child.terminate()  # as perf record ends its workload
            if self.child is not None:
                try:
                    code = self.child.wait()
                except KeyboardInterrupt:
                    self.child.kill()
                    code = self.child.wait()
                if status == 0 and code:
                    status = code if code > 0 else 128 - code
        return status

    def _until_done(self, wait, drain) -> None:
        """Until the command ends, the -p processes all exit (as perf record
        -p), -d runs out, or ^C."""
        from ..ktrace.workload import alive

        # (-d 0: stop at once, not never)
        deadline = None if self.args.duration is None else time.monotonic() + self.args.duration
        while not self.stopping:
            wait(0.1)
            drain()
            if self.child is not None and self.child.poll() is not None:
                break
            if self.args.pid and not any(alive(p) for p in self.args.pid):
                break
            if deadline is not None and time.monotonic() >= deadline:
                break

    # -- filtered events ---------------------------------------------------------------

    def _events(self) -> int:
        from ..filter.errors import FilterError
        from ..kernel.bpf import BpfError
        from ..ktrace.trace import KernelTrace, TraceError

        a = self.args
        names = [n.strip() for n in a.events.split(",") if n.strip()]
        pids = list(a.pid or [])
        try:
            trace = KernelTrace(names, a.filter, max_string=a.max_string,
                                ringbuf_size=a.buffer_size * 1024,
                                pids=pids if (pids or self.command) else None)  # fmt: skip
        except FilterError as e:
            if e.expression is None:
                e.expression = a.filter
            raise _Failed(str(e)) from None
        except (TraceError, BpfError, ValueError) as e:
            raise _Failed(str(e)) from None
        out = None
        try:
            if self.command:
                trace.track(self._launch())
            out = self._open_output(trace)
            if a.stats:
                from ..kernel.bpf import enable_stats

                self._stats = enable_stats()
            self.recording = True  # from here a signal stops the loop (see run)
            trace.start()
            self._release()

            def drain() -> None:
                b = trace.read()
                if len(b):
                    out.write(b)

            self._until_done(trace.wait, drain)
            # Detached, nothing more comes: everything passed is read now,
            # whatever the read size, before the counts are taken.
            trace.stop()
            while len(b := trace.read()):
                out.write(b)
        finally:
            self.recording = False
            counts = trace.counts() if trace.scratch is not None else {}
            if out is not None:
                out.close(counts)
            if getattr(self, "_stats", None) is not None:
                for e, info in zip(trace.events, trace.program_info(), strict=True):
                    per = info["run_time_ns"] / info["run_cnt"] if info["run_cnt"] else 0.0
                    sys.stderr.write(f"hwtrace trace: {e.name}: {info['run_cnt']} runs, "
                                     f"{per:.1f} ns each, {info['jited_prog_len']} bytes of "
                                     "machine code\n")  # fmt: skip
                self._stats.close()
            trace.close()
            if counts and not a.quiet:
                sys.stderr.write(
                    f"hwtrace trace: {counts['seen']} events seen, {counts['passed']} passed, "
                    f"{counts['lost']} lost\n"
                )
        return 0

    def _open_output(self, trace):
        from ..ktrace.output import OutputError, TextOutput, open_trace_output

        cmdline = ["hwtrace", "trace", *sys.argv[2:]]
        if self.args.output is None:
            return TextOutput(sys.stdout, trace.events)
        try:
            return open_trace_output(self.args.output, trace.events, cmdline=cmdline)
        except OutputError as e:
            raise _Failed(str(e)) from None

    # -- the latency tracker -----------------------------------------------------------

    def _latency(self) -> int:
        from ..kernel.bpf import BpfError
        from ..kernel.syscalls import syscall_number
        from ..kernel.tracepoint import TracepointError
        from ..ktrace.syscall_latency import ANY, LatencyTracker

        a = self.args
        defaults: list[tuple[int, int]] = []
        try:
            for t in a.threshold:
                call, sep, when = t.rpartition("=")
                defaults.append((syscall_number(call) if sep else ANY, parse_time(when)))
        except ValueError as e:
            raise _Failed(f"--threshold: {e}") from None
        try:
            tracker = LatencyTracker(rows=a.rows, ringbuf_size=a.buffer_size * 1024)
        except (BpfError, TracepointError, ValueError) as e:
            raise _Failed(str(e)) from None
        from ..ktrace.report import LatencyOutput

        out = None
        try:
            for nr, ns in defaults:
                tracker.coop.set_threshold(ns, nr)
            if a.pin:
                try:
                    tracker.pin(a.pin)
                except BpfError as e:
                    raise _Failed(str(e)) from None
            self.coop_fd = tracker.coop_fd
            for pid in a.pid or []:
                tracker.track(pid)
            if self.command:
                tracker.track(self._launch())
            out = LatencyOutput(a.output)
            self.recording = True
            tracker.start()
            self._release()

            def drain() -> None:
                r = tracker.read()
                if r.size:
                    out.write(r)

            self._until_done(tracker.ring.wait, drain)
            tracker.stop()
            while (r := tracker.read()).size:
                out.write(r)
        except OSError as e:
            raise _Failed(str(e)) from None
        finally:
            self.recording = False
            if out is not None:
                out.close(tracker.coop, quiet=a.quiet)
            tracker.close()
        return 0


class _Failed(Exception):
    pass
