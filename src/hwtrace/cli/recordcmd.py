"""``hwtrace record``: a program's execution as Intel PT in perf.data.

Kept apart from the commands that read perf.data so that recording
imports none of the decoding stack before the program runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from .common import checked, command_parser, output_file, process_id


def _psb_period(value: str) -> int:
    """An argparse type for --psb-period: bytes, a positive number."""
    return checked(value, int, "a number of bytes", lambda n: n > 0,
                   "not a number of bytes between PSB+ (a positive number)")  # fmt: skip


def _zstd_level(value: str) -> int:
    level = int(value)
    if not 1 <= level <= 22:
        raise argparse.ArgumentTypeError(f"{value}: zstd's levels are 1 to 22")
    return level


def _four_bits(value: str) -> int:
    """An argparse type for the exponents Intel PT keeps in four bits of
    IA32_RTIT_CTL (MTC period, CYC threshold): 0 to 15."""
    return checked(value, int, "a number", lambda n: 0 <= n <= 15, "not 0 to 15")


def record_main(argv: Sequence[str]) -> int:
    """Record a program's execution as Intel PT into perf.data: with perf and PT hardware where
    the CPU has it, else by patching the program's branches (or single-stepping chosen code)."""
    p = command_parser("hwtrace record", record_main)
    p.add_argument("-o", "--output", type=output_file, default="perf.data",
                   help="output file (perf.data)")  # fmt: skip
    p.add_argument("-p", "--pid", type=process_id,
                   help="attach to this process instead of launching")  # fmt: skip
    p.add_argument(
        "-f", "--function", action="append", default=[], help="trace this function (repeatable)"
    )
    p.add_argument(
        "--range",
        action="append",
        default=[],
        metavar="START-END",
        help="trace this address range (hex, end exclusive; repeatable)",
    )
    p.add_argument(
        "--call",
        action="append",
        default=[],
        metavar="FUNCTION",
        help="trace each call of this function with everything it calls until it returns "
        "(repeatable; module!name too)",
    )
    p.add_argument(
        "--follow-fork",
        action="store_true",
        help="follow child processes too (fork, vfork, through exec)",
    )
    p.add_argument(
        "--jit",
        action="store_true",
        help="capture code written at run time (JITs, patching) at its first execution, for "
        "decoding (perf backend: a capture agent beside perf; the software backend always does)",
    )
    p.add_argument(
        "--backend",
        choices=("auto", "perf", "patch", "step", "software"),
        default="auto",
        help="perf: Intel PT hardware; patch: the program's branches patched to write PT "
        "(a launched program, or its -f/--range code or --call calls only); step: ptrace "
        "single-stepping of chosen code (software is its old name); auto: perf where the CPU "
        "has Intel PT, else patch (step with -p)",
    )
    p.add_argument("-N", "--no-buildid-cache", action="store_true",
                   help="do not put the vDSO into perf's build-id cache "
                        "(perf's buildid.dir, ~/.debug)")  # fmt: skip
    p.add_argument("-z", "--compression-level", type=_zstd_level, nargs="?", const=1, default=0,
                   metavar="N", help="compress the records but the trace's (zstd, level N: "
                   "1-22, default 1), as perf record -z does")  # fmt: skip
    p.add_argument("--psb-period", type=_psb_period, default=4096, help="bytes between PSB+")
    p.add_argument("--mtc-period", type=_four_bits, metavar="N",
                   help="MTC every 2**N CTC ticks (default 3; the patch backend writes such "
                   "time points as TSC packets only when this is given: each costs a rdtsc)")  # fmt: skip
    p.add_argument("--no-mtc", action="store_true", help="no MTC packets")
    p.add_argument("--no-tsc", action="store_true", help="no TSC packets")
    p.add_argument("--cyc", action="store_true", help="CYC packets")
    p.add_argument("--cyc-thresh", type=_four_bits, default=0, metavar="N",
                   help="a CYC only after at least 2**(N-1) cycles (0-15; default 0: at every "
                   "eligible packet)")  # fmt: skip
    p.add_argument("--noretcomp", action="store_true", help="no return compression")
    p.add_argument("--aslr", action="store_true",
                   help="patch backend: keep the program's address randomization (by default off, "
                   "as gdb and rr launch programs: repeat recordings reuse their patch plans)")  # fmt: skip
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")
    a = p.parse_args(list(argv))
    a.cmdline = ["hwtrace", "record", *argv]  # (for the perf.data's header, as perf keeps its own)
    command = [c for c in a.command if c != "--"] if a.command else []
    if command and a.pid is not None:
        p.error("give a command to launch (after --) or a --pid to attach to, not both")
    if not command and a.pid is None:
        p.error("give a command to launch (after --) or a --pid to attach to")
    from ..record.errors import RecordError
    from ..record.perf_pt import SettingsError, have_intel_pt

    backend = a.backend
    if backend == "auto":
        stepped = a.pid is not None or (a.call and (a.function or a.range))
        backend = "perf" if have_intel_pt() else ("step" if stepped else "patch")
    try:
        if backend == "perf":
            return _record_perf(a, command)
        if backend == "patch":
            return _record_patch(a, command)
        return _record_software(a, command)
    except (SettingsError, RecordError) as e:
        sys.stderr.write(f"hwtrace record: {e}\n")
        return 1


def _record_perf(a: argparse.Namespace, command: list[str]) -> int:
    from ..record.perf_pt import AddressFilter, PtSettings, record_with_perf

    dso = command[0] if command else None
    filters = tuple(AddressFilter(symbol=f, dso=dso) for f in a.function)
    for r in a.range:
        lo, hi = (int(x, 16) for x in r.split("-"))
        filters += (AddressFilter(start=lo, size=hi - lo, dso=dso),)
    if a.call:
        # A call's extent reaches any code (libraries, callbacks): the
        # hardware traces the whole address space, no address filter, and
        # script and report cut the flow to the calls.
        filters = ()
        sys.stderr.write(
            "hwtrace record: note: --call with the perf backend traces the whole user "
            "address space; hwtrace script and report cut it to the calls\n"
        )
    settings = PtSettings(
        psb_period=min(max(a.psb_period.bit_length() - 12, 0), 15),
        mtc=not a.no_mtc,
        mtc_period=None if a.no_mtc else _mtc_period(a),
        cyc=a.cyc,
        cyc_thresh=a.cyc_thresh if a.cyc else None,
        tsc=not a.no_tsc,
        noretcomp=a.noretcomp,
        filters=filters,
        compression=a.compression_level,
    )
    sys.stderr.write("hwtrace record: backend perf (Intel PT hardware)\n")

    def captured(result) -> None:
        s = result.stats
        sys.stderr.write(f"hwtrace record: {len(result.revisions)} code revisions captured "
                         "(TEXT_POKE records of user code)\n")  # fmt: skip
        if s.get("lost"):
            sys.stderr.write(f"hwtrace record: warning: {s['lost']} code snapshots lost "
                             "(the capture ring was full): their code decodes as a gap\n")  # fmt: skip

    status = record_with_perf(settings, a.output, command=command, pid=a.pid, jit=a.jit,
                              on_capture=captured)  # fmt: skip
    if a.call and Path(a.output).exists():
        from ..perf.notes import note_recording

        note_recording(a.output, calls=a.call)
    return status


def _mtc_period(a: argparse.Namespace) -> int:
    return 3 if a.mtc_period is None else a.mtc_period


def _record_patch(a: argparse.Namespace, command: list[str]) -> int:
    from ..record.patch import PatchError, PatchOptions
    from ..record.patch.output import record_patched_perf

    unsupported = [name for name, given in (("-p", a.pid is not None), ("--cyc", a.cyc),
                   ("--call with -f or --range", a.call and (a.function or a.range))) if given]  # fmt: skip
    if unsupported:
        sys.stderr.write(f"hwtrace record: the patch backend records a launched program, its "
                         f"functions, ranges or calls; {', '.join(unsupported)}: use --backend "
                         "step\n")  # fmt: skip
        return 2
    ranges = _parse_ranges(a.range)
    if ranges is None:
        return 2
    sys.stderr.write("hwtrace record: backend patch (the program's branches write Intel PT)\n")
    if a.mtc_period is None and not a.no_tsc:
        # (without MTC's time points a profile's time falls where the few
        # TSC packets are: say how to have more)
        sys.stderr.write("hwtrace record: times from TSC packets at PSB+ and system calls only; "
                         "--mtc-period 3 adds one every 320 ns (a rdtsc in each routine)\n")  # fmt: skip
    try:
        rec = record_patched_perf(
            command,
            a.output,
            PatchOptions(
                psb_period=a.psb_period,
                tsc=not a.no_tsc,
                noretcomp=a.noretcomp,
                mtc_period=None if a.no_mtc else a.mtc_period,  # None: not asked for
                aslr=a.aslr,
                follow_fork=a.follow_fork,
                functions=tuple(a.function),
                ranges=tuple(ranges),
                calls=tuple(a.call),
            ),
            buildid_cache=not a.no_buildid_cache,
            cmdline=a.cmdline,
            compression=a.compression_level,
        )
    except PatchError as e:
        sys.stderr.write(f"hwtrace record: {e}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("hwtrace record: interrupted while setting up; the program runs on "
                         "untraced, nothing written\n")  # fmt: skip
        return 130
    pt = sum(t.size for t in rec.threads)
    lost = sum(t.lost for t in rec.threads)
    sites = sum(m["sites"] for m in rec.modules.values())
    where = ""
    if rec.options.ranged:
        where = f" (tracing {len(rec.ranges)} address range(s) only, and system calls)"
    elif rec.options.calls:
        where = f" (tracing the calls of {len(rec.calls)} function(s) only)"
    sys.stderr.write(f"hwtrace record: {len(rec.threads)} thread(s), {pt} bytes of PT, "
                     f"{sites} branch sites patched in {len(rec.modules)} modules{where} "
                     f"({rec.setup_seconds:.2f} s), {rec.traps} traps; wrote {a.output}\n")  # fmt: skip
    if rec.unresolved:
        sys.stderr.write(f"hwtrace record: warning: {', '.join(rec.unresolved)}: the library was "
                         "never mapped, nothing traced there\n")  # fmt: skip
    if rec.execs:
        names = ", ".join(e.comm for e in rec.execs)
        sys.stderr.write(f"hwtrace record: followed the exec of {names}\n")
    if rec.exec_error:
        sys.stderr.write(f"hwtrace record: warning: the program exec'd another that could not "
                         f"be recorded ({rec.exec_error}): it runs on untraced\n")  # fmt: skip
    if rec.untraced:
        where = ", ".join(f"{m.start:#x}-{m.end:#x}{' ' + m.path if m.path else ''}"
                          for m in rec.untraced[:3])  # fmt: skip
        more = f" and {len(rec.untraced) - 3} more" if len(rec.untraced) > 3 else ""
        sys.stderr.write(f"hwtrace record: warning: executable memory outside the program's "
                         f"files (a JIT's?) is not traced: {where}{more}; where it ran, the trace "
                         "has a gap until the next PSB+\n")  # fmt: skip
    if rec.write_error:
        sys.stderr.write(f"hwtrace record: warning: writing {a.output} failed "
                         f"({rec.write_error}): the threads' traces end there\n")  # fmt: skip
    if lost:
        sys.stderr.write(f"hwtrace record: warning: {lost} packet groups dropped: hwtrace did "
                         "not copy the trace out fast enough (OVF packets mark the gaps)\n")  # fmt: skip
    if rec.stopped_by:
        name = signal.Signals(rec.stopped_by).name
        sys.stderr.write(f"hwtrace record: stopped by {name}: the program (pid {rec.pid}) "
                         "runs on untraced\n")  # fmt: skip
        return 128 + rec.stopped_by
    # The program's exit status, as perf record gives it (128 + a signal).
    code = os.waitstatus_to_exitcode(rec.exit_status)
    return code if code >= 0 else 128 - code


def _parse_ranges(given: list[str]) -> list[tuple[int, int]] | None:
    """``--range START-END`` values (hex); None (said why) when one is not."""
    ranges = []
    for r in given:
        try:
            lo, hi = (int(x, 16) for x in r.split("-"))
        except ValueError:
            sys.stderr.write(f"hwtrace record: --range {r}: expected START-END in hex\n")
            return None
        if hi <= lo:
            sys.stderr.write(f"hwtrace record: --range {r}: the range is empty\n")
            return None
        ranges.append((lo, hi))
    return ranges


def _record_software(a: argparse.Namespace, command: list[str]) -> int:
    from ..record import RecordError, record_software
    from ..record.perfdata import write_perf_data

    ranges = _parse_ranges(a.range)
    if ranges is None:
        return 2
    if not a.function and not ranges and not a.call:
        sys.stderr.write(
            "hwtrace record: the software backend steps chosen code: give -f FUNCTION, "
            "--call FUNCTION or --range START-END\n"
        )
        return 2

    # A kill (SIGTERM, SIGHUP) ends recording as ^C does: launched processes
    # are killed, attached ones let go with their code restored.
    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if a.jit:
        sys.stderr.write(
            "hwtrace record: note: the software backend captures the code it steps at each "
            "change (--jit is always on)\n"
        )
    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        rec = record_software(
            command if command else a.pid,
            functions=a.function,
            calls=a.call,
            ranges=ranges,
            follow_fork=a.follow_fork,
            psb_period=a.psb_period,
            tsc=not a.no_tsc,
            mtc_period=None if a.no_mtc or a.no_tsc else _mtc_period(a),
            cyc=a.cyc,
            cyc_thresh=a.cyc_thresh if a.cyc else 0,
            noretcomp=a.noretcomp,
        )
    except RecordError as e:
        sys.stderr.write(f"hwtrace record: {e}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("hwtrace record: interrupted; nothing written\n")
        return 130
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    write_perf_data(rec, a.output, buildid_cache=not a.no_buildid_cache, cmdline=a.cmdline,
                    compression=a.compression_level)  # fmt: skip
    size = Path(a.output).stat().st_size
    insns = sum(len(t.instructions) for t in rec.threads)
    pt = sum(len(t.data) for t in rec.threads)
    tids = {t.tid for t in rec.threads}
    pids = {t.pid for t in rec.threads}
    where = rec.filters or "the chosen ranges"
    if rec.calls:
        ranges = [r.name or f"{r.start:#x}-{r.end:#x}" for r in rec.ranges]
        where = ", ".join([f"calls of {c.name}" for c in rec.calls] + ranges)
    threads = f"{len(tids)} thread{'s' if len(tids) != 1 else ''}"
    if len(pids) > 1:
        threads += f" in {len(pids)} processes"
    sys.stderr.write(
        f"hwtrace record: backend {rec.backend}: {insns:,} instructions of pid {rec.pid} "
        f"({rec.comm}), {threads}, in {where}\n"
        f"hwtrace record: note: {rec.timing_note}\n"
    )
    steps = rec.steps
    for note in steps.notes if steps is not None else []:
        sys.stderr.write(f"hwtrace record: note: {note}\n")
    if steps is not None and steps.stopped_because:
        sys.stderr.write(f"hwtrace record: stopped tracing: {steps.stopped_because}\n")
    sys.stderr.write(f"hwtrace record: wrote {a.output} ({size:,} bytes, {pt:,} bytes of PT)\n")
    return 0
