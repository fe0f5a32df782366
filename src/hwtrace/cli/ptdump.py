"""``hwtrace ptdump``: Intel's ptdump, same options and same output.

Options are parsed the way ptdump parses them (the trace file comes last) so
that scripts written for Intel's tool work unchanged.  Problems with the input
go to standard error as one line naming the file and offset; exit status 2
means nothing could be decoded.
"""

from __future__ import annotations

import os
import sys

from .common import UsageError, load_trace, parse_uint, write_blocks
from .sbopts import SbOptions, sideband_help

PROG = "hwtrace ptdump"

HELP = """usage: hwtrace ptdump [<options>] <ptfile>[:<from>[-<to>]]

Dump the packets of an Intel Processor Trace stream, as Intel's ptdump does.

options:
  --help|-h                 this text.
  --version                 display version information and exit.
  --no-sync                 don't try to sync to the first PSB, assume a valid
                            sync point at the beginning of the trace.
  --quiet                   don't print anything but errors.
  --no-pad                  don't show PAD packets.
  --no-timing               don't show timing packets.
  --no-cyc                  don't show CYC packets and ignore them when tracking time.
  --no-offset               don't show the offset as the first column.
  --raw                     show raw packet bytes.
  --lastip                  show last IP updates on packets with IP payloads.
  --exec-mode               show the current execution mode on mode.exec packets.
  --time                    show the estimated TSC on timing packets.
  --tcal                    show time calibration information.
  --time-delta              show timing information as delta.
  --no-tcal                 skip timing calibration.
                            this will result in errors when CYC packets are encountered.
  --no-wall-clock           suppress the no-time error and print relative time.
  --keep-tcal-on-ovf        keep time calibration on overflow.
  --cpu none|f/m[/s]        set cpu to the given value and decode according to:
                              none     spec (default)
                              f/m[/s]  family/model[/stepping]
  --mtc-freq <n>            set the MTC frequency (IA32_RTIT_CTL[17:14]) to <n>.
  --nom-freq <n>            set the nominal frequency (MSR_PLATFORM_INFO[15:8]) to <n>.
  --cpuid-0x15.eax          set the value of cpuid[0x15].eax.
  --cpuid-0x15.ebx          set the value of cpuid[0x15].ebx.
  --json                    one JSON object a line instead of ptdump's text.
  --human                   a readable listing instead of ptdump's text: named
                            fields, TNT bits as T/N, colour on a terminal.
{SB}  <ptfile>[:<from>[-<to>]]  load the processor trace data from <ptfile>;
                            an optional offset or range selects part of it.

Sideband records (--pevent) are printed when the trace's time reaches them,
before the timing packet that got there, and the rest after the last packet.
""".replace("{SB}", sideband_help("ptdump", 28))

_FLAGS = {
    "--no-sync": "no_sync",
    "--quiet": "quiet",
    "--no-pad": "no_pad",
    "--no-timing": "no_timing",
    "--no-cyc": "no_cyc",
    "--raw": "raw",
    "--lastip": "lastip",
    "--exec-mode": "exec_mode",
    "--time-delta": "time_delta",
    "--no-tcal": "no_tcal",
    "--no-wall-clock": "no_wall_clock",
    "--keep-tcal-on-ovf": "keep_tcal_on_ovf",
}
_UINTS = {
    "--mtc-freq": ("mtc_freq", 0xFF),
    "--nom-freq": ("nom_freq", 0xFF),
    "--cpuid-0x15.eax": ("cpuid_0x15_eax", 0xFFFFFFFF),
    "--cpuid-0x15.ebx": ("cpuid_0x15_ebx", 0xFFFFFFFF),
}


def main(argv: list[str]) -> int:
    from ..pt.config import Cpu, PtConfig
    from ..pt.ptdump import DumpOptions

    opts = DumpOptions()
    config = PtConfig()
    no_sync = False
    style = "ptdump"
    cpu: Cpu | None = None
    ptfile = None
    sb = SbOptions()
    try:
        i = 0
        while i < len(argv):
            arg = argv[i]

            def take(name: str = arg) -> str:
                nonlocal i
                i += 1
                if i >= len(argv):
                    raise UsageError(f"{name}: missing argument")
                return argv[i]

            if not arg.startswith("-"):
                if i != len(argv) - 1:
                    raise UsageError(f"unexpected argument after the trace file: {argv[i + 1]}")
                ptfile = arg
                break
            if arg in ("-h", "--help"):
                sys.stdout.write(HELP)
                return 0
            if arg == "--version":
                from .. import __version__

                print(f"hwtrace-ptdump-{__version__}")
                return 0
            if arg in _FLAGS:
                name = _FLAGS[arg]
                if name == "no_sync":
                    no_sync = True
                else:
                    setattr(opts, name, True)
                if name == "quiet":
                    sb.flags = 0
            elif sb.parse(arg, take, ptxed=False):
                pass
            elif arg == "--no-offset":
                opts.show_offset = False
            elif arg in ("--json", "--human"):
                style = arg[2:]
            elif arg in ("--time", "--tcal"):
                if (arg == "--time" and opts.tcal) or (arg == "--tcal" and opts.time):
                    raise UsageError("specify either --time or --tcal")
                setattr(opts, arg[2:], True)
            elif arg in _UINTS:
                name, limit = _UINTS[arg]
                i += 1
                setattr(config, name, parse_uint(arg, argv[i] if i < len(argv) else None, limit))
            elif arg == "--cpu":
                i += 1
                if i >= len(argv):
                    raise UsageError("--cpu: missing argument")
                if argv[i] != "none":
                    try:
                        cpu = Cpu.parse(argv[i])
                    except ValueError as exc:
                        raise UsageError(str(exc)) from None
            else:
                raise UsageError(f"unknown option: {arg}")
            i += 1
        if ptfile is None:
            raise UsageError("no processor trace file specified")
    except UsageError as exc:
        sys.stderr.write(f"{PROG}: {exc}.\nUse --help for help.\n")
        return 2

    if cpu is not None and not config.set_cpu(cpu):
        # Intel's ptdump reports this on its output and goes on without errata.
        sys.stdout.write("[0: failed to determine errata: unknown cpu]\n")
        sys.stdout.flush()

    session = None
    if sb.active:
        from ..perf.sbsession import report_text

        def report(code: int, filename: str, offset: int) -> None:
            if code < 0 or sb.warn:
                sb_pending.append(report_text(code, filename, offset, ptdump=True))

        sb_pending: list[str] = []
        try:
            session = sb.session(report)
        except UsageError as exc:
            sys.stderr.write(f"{PROG}: {exc}.\n")
            return 2
        session.pending = sb_pending

    trace = load_trace(PROG, ptfile)
    if trace is None:
        return 2
    name, buf = trace
    if session is not None:
        session.init_decoders()
        sys.stdout.buffer.write(_flush_sideband(session, []))
    return dump(
        name, buf, opts, config, no_sync=no_sync, style=style, session=session, sb_flags=sb.flags
    )


def _flush_sideband(session, lines: list[str]) -> bytes:
    """Records plus the warnings met reading them, as text; the session's
    notes (problems Intel's tools pass over silently) go to standard error."""
    lines = session.pending + lines if session.pending else lines
    session.pending.clear()
    for note in session.notes:
        sys.stderr.write(f"{PROG}: {note}\n")
    session.notes.clear()
    if not lines:
        return b""
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def _sideband_inserts(session, table, times, opts, flags: int) -> dict[int, bytes]:
    """Where the sideband records go: libipt-sb is asked for records at each
    timing packet, with the time after it.  Records are few; packets are not,
    so this looks for the next packet that reaches each record's time."""
    import numpy as np

    from ..pt.kinds import Kind

    kinds = [Kind.TSC, Kind.CBR, Kind.TMA, Kind.MTC] + ([] if opts.no_cyc else [Kind.CYC])
    idx = np.flatnonzero(np.isin(table.kind, np.array([int(k) for k in kinds])))
    tsc = np.asarray(times.tsc, dtype=np.uint64)[idx]
    top = np.maximum.accumulate(tsc) if len(tsc) else tsc
    inserts: dict[int, bytes] = {}
    p = 0
    while p < len(idx):
        due = session.next_tsc()
        if due is None:
            break
        want = np.uint64(due)
        k = p + int(np.searchsorted(top[p:], want, "left"))
        if k < len(idx) and tsc[k] < want:
            hits = np.flatnonzero(tsc[p:] >= want)
            k = p + int(hits[0]) if len(hits) else len(idx)
        if k >= len(idx):
            break
        text = _flush_sideband(session, session.dump(int(tsc[k]), flags))
        if text:
            at = int(idx[k])
            inserts[at] = inserts.get(at, b"") + text
        p = k + 1
    return inserts


def dump(
    name, buf, opts, config, *, no_sync: bool, style: str, session=None, sb_flags: int = 0
) -> int:
    from ..pt.kinds import DecodeError
    from ..pt.packets import decode
    from ..pt.ptdump import ptdump_lines
    from ..pt.render import human_lines, json_lines

    if buf.shape[0] == 0:
        sys.stderr.write(f"{PROG}: {name}: the file is empty, nothing to decode\n")
        return 2
    table = decode(buf, sync=not no_sync, config=config)
    if not table.synced:
        sys.stderr.write(
            f"{PROG}: {name}: no PSB packet in {buf.shape[0]} bytes: not an Intel PT "
            "stream, or one that never synchronises (try --no-sync)\n"
        )
        return 2
    try:
        if style != "ptdump":
            times = opts.estimate_time(table, config) if opts.track_time else None
            if style == "json":
                write_blocks(json_lines(table, times))
            else:
                write_blocks(human_lines(table, times, color=sys.stdout.isatty()))
        elif session is not None:
            # Sideband needs the time (Intel's ptdump tracks it then), with
            # its diagnostics, whether or not it is shown.
            times = opts.estimate_time(table, config)
            inserts = _sideband_inserts(session, table, times, opts, sb_flags)
            write_blocks(ptdump_lines(table, buf, opts, config, times, inserts))
            tail = _flush_sideband(session, session.dump((1 << 64) - 1, sb_flags))
            write_blocks([tail])
        else:
            write_blocks(ptdump_lines(table, buf, opts, config))
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    for issue in table.errors:
        if issue.code == DecodeError.TRUNCATED:
            sys.stderr.write(
                f"{PROG}: {name}: offset {issue.offset:#x}: truncated packet: the stream "
                f"ends inside a packet ({buf.shape[0] - issue.offset} bytes left)\n"
            )
    bad = [e for e in table.errors if e.code != DecodeError.TRUNCATED]
    if bad:
        first = bad[0]
        sys.stderr.write(
            f"{PROG}: {name}: {len(bad)} decode error(s), the first at offset "
            f"{first.offset:#x}: {first.message}; decoding resumed at the next PSB\n"
        )
    return 0 if len(table) else 2
