"""``hwtrace ptdump``: Intel's ptdump, same options and same output.

Options are parsed the way ptdump parses them (the trace file comes last) so
that scripts written for Intel's tool work unchanged.  Problems with the input
go to standard error as one line naming the file and offset; exit status 2
means nothing could be decoded.
"""

from __future__ import annotations

import io
import os
import stat
import sys
from typing import TYPE_CHECKING, BinaryIO

from .common import (
    CONFIG_UINTS,
    UsageError,
    config_help,
    help_or_version,
    open_range,
    parse_uint,
    range_end,
)
from .sbopts import SbOptions, sideband_help

if TYPE_CHECKING:
    from ..pt.config import PtConfig
    from ..pt.dumpplain import DumpOptions

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
{CONFIG}  --json                    one JSON object a line instead of ptdump's text.
  --human                   a readable listing instead of ptdump's text: named
                            fields, TNT bits as T/N, colour on a terminal.
{SB}  <ptfile>[:<from>[-<to>]]  load the processor trace data from <ptfile>;
                            an optional offset or range selects part of it.

Sideband records (--pevent) are printed when the trace's time reaches them,
before the timing packet that got there, and the rest after the last packet.
""".replace("{SB}", sideband_help("ptdump", 28)).replace("{CONFIG}", config_help(28))

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


def main(argv: list[str]) -> int:
    from ..pt.config import Cpu, PtConfig
    from ..pt.dumpplain import DumpOptions

    opts = DumpOptions()
    config = PtConfig()
    no_sync = False
    style = "ptdump"
    cpu: Cpu | None = None
    ptfile = None
    sb: SbOptions | None = None  # made at the first sideband option (it imports perf)
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
            if help_or_version(arg, HELP, "ptdump"):
                return 0
            if arg in _FLAGS:
                name = _FLAGS[arg]
                if name == "no_sync":
                    no_sync = True
                else:
                    setattr(opts, name, True)
                if name == "quiet" and sb is not None:
                    sb.flags = 0
            elif arg.startswith(("--sb", "--pevent")) and (sb := sb or SbOptions()).parse(
                arg, take, ptxed=False
            ):
                pass
            elif arg == "--no-offset":
                opts.show_offset = False
            elif arg in ("--json", "--human"):
                style = arg[2:]
            elif arg in ("--time", "--tcal"):
                if (arg == "--time" and opts.tcal) or (arg == "--tcal" and opts.time):
                    raise UsageError("specify either --time or --tcal")
                setattr(opts, arg[2:], True)
            elif arg in CONFIG_UINTS:
                name, limit = CONFIG_UINTS[arg]
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
    if sb is not None and sb.active:
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

    source = open_trace(PROG, ptfile)
    if source is None:
        return 2
    name, reader = source
    with reader:
        if session is not None:
            session.init_decoders()
            sys.stdout.buffer.write(_flush_sideband(session, []))
        return dump(
            name,
            reader,
            opts,
            config,
            no_sync=no_sync,
            style=style,
            session=session,
            sb_flags=sb.flags if sb is not None else 0,
        )


class _Range(io.RawIOBase):
    """At most ``size`` bytes of a file from where it stands (-1: to its
    end); ``known``: how many bytes that is, when known (not of a pipe)."""

    def __init__(self, f: BinaryIO, size: int, known: int | None = None) -> None:
        self.f = f
        self.left = size
        self.known = known

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        view = memoryview(b).cast("B")
        if self.left >= 0:
            view = view[: self.left]
        got = self.f.readinto(view) or 0
        if self.left >= 0:
            self.left -= got
        return got

    def close(self) -> None:
        self.f.close()
        super().close()


def open_trace(prog: str, arg: str) -> tuple[str, _Range] | None:
    """Open ``file[:from[-to]]`` for reading in chunks.  Prints one clear
    message and returns None when the file or range cannot be used."""
    opened = open_range(prog, arg, lambda path: open(path, "rb", buffering=0))
    if opened is None:
        return None
    path, offset, size, f = opened
    known = None
    try:
        st = os.fstat(f.fileno()) if f.seekable() else None
        total = st.st_size if st is not None else -1
        if total >= 0 and (offset or size):
            end = range_end(prog, path, offset, size, total)
            if end is None:
                f.close()
                return None
            f.seek(offset)
            known = end - offset
        elif st is not None and stat.S_ISREG(st.st_mode):
            known = total
        elif offset:
            # A pipe: skip to the range's start.
            skip = offset
            while skip:
                got = len(f.read(min(skip, 1 << 20)))
                if not got:
                    sys.stderr.write(f"{prog}: {path}: offset {offset:#x} is beyond the end\n")
                    f.close()
                    return None
                skip -= got
    except OSError as exc:
        f.close()
        sys.stderr.write(f"{prog}: cannot read {path}: {exc.strerror or exc}\n")
        return None
    return path, _Range(f, size if size else -1, known)


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
    name: str,
    reader: BinaryIO,
    opts: DumpOptions,
    config: PtConfig,
    *,
    no_sync: bool,
    style: str,
    session=None,
    sb_flags: int = 0,
) -> int:
    """Dump the trace ``reader`` reads; messages name it ``name``."""
    from ..pt.kinds import ERROR_TEXT

    inserts = None
    sideband = session is not None and style == "ptdump"
    if sideband:

        def inserts(table, times):
            return _sideband_inserts(session, table, times, opts, sb_flags)

    out = sys.stdout.buffer
    try:
        summary = None
        if style == "ptdump" and not sideband:
            from ..pt.dumpplain import dump_plain

            # (without numpy's import, when the native library has the loops)
            summary = dump_plain(reader, out.write, opts, config, sync=not no_sync,
                                 size_hint=getattr(reader, "known", None))  # fmt: skip
        if summary is None:
            from ..pt.ptdump import dump_stream

            summary = dump_stream(
                reader,
                out.write,
                opts,
                config,
                sync=not no_sync,
                style=style,
                color=style == "human" and sys.stdout.isatty(),
                # Sideband needs the time (Intel's ptdump tracks it then),
                # with its diagnostics, whether or not it is shown.
                need_time=sideband,
                inserts=inserts,
            )
        if summary.bytes and summary.synced and sideband:
            out.write(_flush_sideband(session, session.dump((1 << 64) - 1, sb_flags)))
        out.flush()
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as exc:
        sys.stderr.write(f"{PROG}: cannot read {name}: {exc.strerror or exc}\n")
        return 2
    if summary.bytes == 0:
        sys.stderr.write(f"{PROG}: {name}: the file is empty, nothing to decode\n")
        return 2
    if not summary.synced:
        sys.stderr.write(
            f"{PROG}: {name}: no PSB packet in {summary.bytes} bytes: not an Intel PT "
            "stream, or one that never synchronises (try --no-sync)\n"
        )
        return 2
    if summary.truncated_at is not None:
        sys.stderr.write(
            f"{PROG}: {name}: offset {summary.truncated_at:#x}: truncated packet: the stream "
            f"ends inside a packet ({summary.bytes - summary.truncated_at} bytes left)\n"
        )
    if summary.first_error is not None:
        offset, why = summary.first_error
        sys.stderr.write(
            f"{PROG}: {name}: {summary.error_count} decode error(s), the first at offset "
            f"{offset:#x}: {ERROR_TEXT[why]}; decoding resumed at the next PSB\n"
        )
    return 0 if summary.packets else 2
