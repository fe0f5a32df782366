"""``hwtrace probe``: fast dynamic tracepoints in a running (or launched)
process, counting hits or recording events, until ``^C``, a duration, or
the process's exit; every tracepoint is taken out again on the way out."""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections.abc import Sequence

from .common import Parser, command_parser, output_file, process_id, seconds

HELP_COMMANDS = """commands (one per line on standard input with --control):
  list                 the tracepoints, their kind and hits
  add LOCATION [--returns]  place one more (--returns: an entry/exit tracepoint)
  disable N | enable N take tracepoint N's patch out / put it back
  remove N             remove tracepoint N
  quit                 remove everything and stop
"""


def main(argv: Sequence[str]) -> int:
    """Insert fast tracepoints into a live x86-64 process: jumps made safe by embedded traps, an
    int3 trap where no jump fits. Counts hits and, with -o or --record, records events (time,
    CPU, thread, registers) through shared memory."""
    p = command_parser(
        "hwtrace probe",
        main,
        epilog="LOCATION: FUNC, FUNC+OFF, MODULE!FUNC, 0xADDRESS, or FILE:LINE.",
    )
    p.add_argument("locations", nargs="*", metavar="LOCATION", help="where to put tracepoints")
    p.add_argument("-p", "--pid", type=process_id, help="the running process")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="record events into PATH: JSON lines for *.jsonl, perf.data for "
                   "*.data, else a CTF trace directory (babeltrace2 reads it)")  # fmt: skip
    p.add_argument("--record", action="store_true", help="record events (implied by -o)")
    p.add_argument("--regs", default="rdi,rsi,rdx,rcx", metavar="R1,R2,...",
                   help="registers an event records, up to four (default: the first four "
                   "integer arguments)")  # fmt: skip
    p.add_argument("--trap", action="store_true", help="int3 trap tracepoints, no jumps")
    p.add_argument("--uprobe", action="store_true",
                   help="kernel uprobes (tracefs), counted for this process only")  # fmt: skip
    p.add_argument("-r", "--returns", action="store_true",
                   help="entry/exit tracepoints: at a function's entry, also catch each "
                   "return (counted apart; recorded with the return value in rax)")  # fmt: skip
    p.add_argument("-d", "--duration", type=seconds, metavar="SECONDS", help="stop after this long")
    p.add_argument("-i", "--interval", type=seconds, metavar="SECONDS",
                   help="print the hit counts this often")  # fmt: skip
    p.add_argument("--control", action="store_true",
                   help="read commands from standard input (see --help-commands)")  # fmt: skip
    p.add_argument("--help-commands", action="store_true", help="list the --control commands")
    p.add_argument(
        "--json", type=output_file, metavar="FILE", help="write the tracepoints and counts as JSON"
    )
    args, command = _split_command(p, argv)
    if args.help_commands:
        sys.stdout.write(HELP_COMMANDS)
        return 0
    if (args.pid is None) == (not command):
        p.error("give either -p PID or -- COMMAND")
    if not args.locations and not args.control:
        p.error("no tracepoint location given")
    regs = tuple(r.strip() for r in args.regs.split(",") if r.strip())
    record = args.record or args.output is not None
    return _run(args, command, regs, record)


def _split_command(p: Parser, argv: Sequence[str]):
    argv = list(argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    return p.parse_intermixed_args(argv), command


class _Stop(Exception):
    pass


def _run(args, command: list[str], regs: tuple[str, ...], record: bool) -> int:
    from ..probes import ProbeError, ProbeSession
    from ..probes.output import ProbeInfo, open_output
    from ..probes.ptrace import PtraceError, launch_stopped

    proc = None
    if command:
        try:
            proc = launch_stopped(command)
        except PtraceError as e:
            sys.stderr.write(f"hwtrace probe: {e}\n")
            return 1
        pid = proc.pid
    else:
        pid = args.pid

    def stop(signum, frame):  # SIGTERM and SIGHUP end the session like ^C
        raise _Stop

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    # ^C must take the tracepoints out even when hwtrace was started with
    # SIGINT ignored (a background job of a script, some CI runners).
    old[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    session = None
    out = None
    status = 0
    try:
        session = ProbeSession(pid)
        tps = []
        for loc in args.locations:
            tp = session.add(loc, kind=_kind(args), record=record, regs=regs,
                             returns=args.returns)  # fmt: skip
            tps.append(tp)
            _describe(tp)
        if record and args.output:
            infos = [ProbeInfo(tp.id, tp.site.function or f"{tp.address:#x}", regs, tp.address)
                     for tp in tps]  # fmt: skip
            if any(tp.kind == "uprobe" for tp in tps):
                sys.stderr.write("hwtrace probe: kernel uprobe tracepoints count hits but "
                                 "write no events\n")  # fmt: skip
            out = open_output(args.output, infos, pid)
        if proc is not None:
            os.kill(pid, signal.SIGCONT)
        _loop(session, args, out, proc, regs, record)
        if proc is None and not _alive(pid, proc):
            status = _report_end(pid)
    except ProbeError as e:
        sys.stderr.write(f"hwtrace probe: {e}\n")
        status = 1
    except (KeyboardInterrupt, _Stop):
        status = 130
    except ValueError as e:
        sys.stderr.write(f"hwtrace probe: {e}\n")
        status = 2
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if session is not None:
            _finish(session, out, args)
        if proc is not None:
            if proc.poll() is None and status:
                proc.kill()
            proc.wait()
    if proc is not None and status == 0:
        if proc.returncode < 0:
            sys.stderr.write(f"hwtrace probe: process {pid} was killed by "
                             f"{signal.Signals(-proc.returncode).name}\n")  # fmt: skip
            return 128 - proc.returncode
        return proc.returncode
    return status


def _report_end(pid: int) -> int:
    """Say how the process ended while probed (-p); 1 if it was killed by a
    signal, for a crash must not look like success."""
    from ..probes.ptrace import end_of

    end = end_of(pid)
    sys.stderr.write(f"hwtrace probe: process {pid} {end}\n")
    return 1 if end.startswith("was killed") else 0


def _kind(args) -> str | None:
    return "uprobe" if args.uprobe else "trap" if args.trap else None


def _describe(tp) -> None:
    what = tp.site.function or "-"
    line = f"tracepoint {tp.id}: {tp.spec} at {tp.address:#x} ({what}): {tp.kind}"
    if tp.kind == "jump" and len(tp.starts) > 1:
        line += f", covering {len(tp.starts)} instructions"
    if tp.returns:
        line += ", with its returns"
    if tp.note:
        line += f" ({tp.note})"
    sys.stderr.write(line + "\n")


def _alive(pid: int, proc) -> bool:
    from ..probes.ptrace import process_alive

    if proc is not None:
        return proc.poll() is None
    return process_alive(pid)


def _loop(session, args, out, proc, regs, record) -> None:
    start = time.monotonic()
    next_print = start + args.interval if args.interval else None
    while _alive(session.pid, proc):
        now = time.monotonic()
        if args.duration is not None and now - start >= args.duration:
            return
        timeout = 0.05
        if args.control:
            ready, _, _ = select.select([sys.stdin], [], [], timeout)
            if ready:
                line = sys.stdin.readline()
                if not line or _command(session, line.split(), record, regs, out) == "quit":
                    return
        else:
            time.sleep(timeout)
        if out is not None:
            out.write(session.drain(), session.rings.clock, session.lost)
        if next_print is not None and now >= next_print:
            _print_counts(session)
            next_print += args.interval


def _command(session, words: list[str], record: bool, regs, out) -> str:
    from ..probes import ProbeError

    if not words:
        return ""
    cmd, rest = words[0], words[1:]
    try:
        if cmd == "quit":
            return "quit"
        if cmd == "list":
            _print_counts(session)
        elif cmd == "add" and rest:
            tp = session.add(rest[0], record=record, regs=regs, returns="--returns" in rest[1:])
            if out is not None:
                from ..probes.output import ProbeInfo

                out.add_probe(ProbeInfo(tp.id, tp.site.function, regs, tp.address))
            _describe(tp)
        elif cmd in ("enable", "disable", "remove") and rest:
            tp = session.tracepoints.get(int(rest[0]))
            if tp is None:
                sys.stderr.write(f"no tracepoint {rest[0]}\n")
            elif cmd == "remove":
                sys.stderr.write(f"tracepoint {tp.id} removed, {session.remove(tp)} hits\n")
            else:
                getattr(session, cmd)(tp)
                sys.stderr.write(f"tracepoint {tp.id} {cmd}d\n")
        else:
            sys.stderr.write(f"unknown command: {' '.join(words)}\n{HELP_COMMANDS}")
    except (ProbeError, ValueError) as e:
        sys.stderr.write(f"hwtrace probe: {e}\n")
    sys.stderr.flush()
    return ""


def _print_counts(session) -> None:
    lines = []
    for tp in session.tracepoints.values():
        state = "" if tp.enabled else " (disabled)"
        returns = f" ({session.returns(tp)} returns)" if tp.returns else ""
        lines.append(f"{tp.id:>4} {tp.kind:<6} {session.hits(tp):>14} {tp.spec}{returns}{state}")
    traps = session.trap_counts()[0]
    sys.stdout.write("\n".join(["  id kind             hits location", *lines,
                                f"traps redirected: {traps}"]) + "\n")  # fmt: skip
    sys.stdout.flush()


def _finish(session, out, args) -> None:
    """Drain, take every tracepoint out, report; runs on every way out."""
    import json

    from ..probes.ptrace import process_alive

    counts = []
    alive = process_alive(session.pid)
    try:
        # Take the patches out first, then drain what was written meanwhile.
        for tp in list(session.tracepoints.values()) if alive else ():
            session.disable(tp)
        for tp in list(session.tracepoints.values()):
            counts.append(
                {
                    "id": tp.id,
                    "location": tp.spec,
                    "address": tp.address,
                    "function": tp.site.function,
                    "kind": tp.kind,
                    "hits": session.hits(tp),
                    "returns": session.returns(tp) if tp.returns else None,
                    "note": tp.note,
                }
            )
        if out is not None and session.rings is not None:
            session.rings.clock.mark()
            out.write(session.drain(final=True), session.rings.clock, session.lost)
        session.close()
    except Exception as e:  # the target may have died meanwhile
        sys.stderr.write(f"hwtrace probe: while removing tracepoints: {e}\n")
    finally:
        if out is not None:
            out.close()
    for c in counts:
        returns = f" ({c['returns']} returns)" if c["returns"] is not None else ""
        sys.stdout.write(f"{c['id']:>4} {c['kind']:<6} {c['hits']:>14} {c['location']}{returns}\n")
    if out is not None:
        lost = session.lost
        sys.stderr.write(f"{out.count} events written to {args.output}"
                         + (f", {lost} lost (buffers overwritten)" if lost else "") + "\n")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pid": session.pid, "tracepoints": counts,
                       "events": out.count if out else 0, "lost": session.lost}, f, indent=1)  # fmt: skip
