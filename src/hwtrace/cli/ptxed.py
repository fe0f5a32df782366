"""``hwtrace ptxed``: Intel's ptxed, same options and same output.

Reconstructs the instruction flow of an Intel PT trace over a memory image
and prints one line per instruction and one bracketed line per event, as
Intel's ``ptxed`` does.  Unlike ptxed it needs no XED: without ``--no-inst``
instructions are disassembled with iced-x86.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from ..pt.ptxedstyle import PtxedStyle
from .common import CONFIG_UINTS, UsageError, config_help, help_or_version, parse_uint
from .sbopts import SbOptions, sideband_help

PROG = "hwtrace ptxed"

HELP = """usage: hwtrace ptxed <options>

Reconstruct the instruction flow of an Intel PT trace, as Intel's ptxed does.

options:
  --help|-h                     this text.
  --version                     display version information and exit.
  --att                         print instructions in att format.
  --no-inst                     do not print instructions (only addresses).
  --quiet|-q                    do not print anything (except errors).
  --offset                      print the offset into the trace file.
  --time                        print the current timestamp.
  --raw-insn                    print the raw bytes of each instruction.
  --check                       perform checks (expensive).
  --stat                        print statistics (even when quiet).
  --stat:insn                   print number of instructions.
  --stat:blocks                 print number of blocks.
  --event:time                  print the tsc for events if available.
  --event:ip                    print the ip of events if available.
  --event:tick                  request tick events.
  --event:iflags                request interrupt flag events.
  --filter:addr<n>_cfg <cfg>    set IA32_RTIT_CTL.ADDRn_CFG to <cfg>.
  --filter:addr<n>_a <base>     set IA32_RTIT_ADDRn_A to <base>.
  --filter:addr<n>_b <limit>    set IA32_RTIT_ADDRn_B to <limit>.
  --verbose|-v                  print various information (even when quiet).
  --pt <file>[:<from>[-<to>]]   load the processor trace data from <file>.
  --raw <file>[:<from>[-<to>]]:<base>
                                load a raw binary from <file> at address <base>.
  --elf <file>[:<base>]         load an ELF from <file> at address <base>.
{CONFIG}  --insn-decoder                use the instruction flow decoder.
  --block-decoder               use the block decoder (default).
  --block:show-blocks           show blocks in the output.
  --block:end-on-call           set the end-on-call block decoder flag.
  --block:end-on-jump           set the end-on-jump block decoder flag.
  --block:keep-tcal-on-ovf      set the keep-tcal-on-ovf block decoder flag.
  --insn:keep-tcal-on-ovf       set the keep-tcal-on-ovf instruction decoder flag.
  --resync-on-error             after an error, resynchronise at the next packet that
                                tells the ip (default: at the next PSB).
{SB}
You must specify exactly one processor trace file (--pt).

With --pevent sideband, records are applied when the trace's time reaches
them: MMAPs add to the process's image, COMM.EXEC starts a new image,
ITRACE_START and context switches change the image decoded with (switches
wait until the flow is, or likely is, in the kernel: see --pevent:kernel-start).
""".replace("{SB}", sideband_help("ptxed", 32)).replace("{CONFIG}", config_help(32))


# What decodes a trace and prints it (see decode).
Decoder = Callable[..., None]


@dataclass
class Options(PtxedStyle):
    """ptxed's options: the text's style, and how to decode."""

    att: bool = False
    check: bool = False
    resync_on_error: bool = False
    insn_decoder: bool = False
    stat_flags: set[str] = field(default_factory=set)


# Options that only switch on one of Options' fields.
_SWITCHES = {
    "--att": "att",
    "--no-inst": "no_inst",
    "--quiet": "quiet",
    "-q": "quiet",
    "--offset": "offset",
    "--time": "time",
    "--raw-insn": "raw_insn",
    "--check": "check",
    "--stat": "stats",
    "--event:time": "event_time",
    "--event:ip": "event_ip",
    "--resync-on-error": "resync_on_error",
    "--block:show-blocks": "show_blocks",
}


def main(argv: list[str], stdout=None, *, decoder: Decoder | None = None) -> int:
    """Run ptxed with ``argv``; text goes to ``stdout`` (a binary stream,
    default standard output).  ``decoder`` decodes and prints in place of
    :func:`decode` (called with its arguments): the test suite's reference
    decoders go there."""
    from ..image import Image, ImageError, parse_elf_spec
    from ..pt.config import Cpu, PtConfig
    from ..pt.options import AddrFilter, BlockFlags

    opts = Options()
    config = PtConfig()
    flags = BlockFlags()
    iflags = False
    keep_tcal = False
    filters: dict[int, list[int]] = {}
    image = Image()
    ptfile: str | None = None
    cpu_error = None
    cpu: Cpu | None = None
    sb = SbOptions()
    try:
        i = 0
        while i < len(argv):
            arg = argv[i]
            i += 1

            def value(name: str = arg) -> str:
                nonlocal i
                if i >= len(argv):
                    raise UsageError(f"{name}: missing argument")
                i += 1
                return argv[i - 1]

            if help_or_version(arg, HELP, "ptxed"):
                return 0
            if arg == "--pt":
                if ptfile is not None:
                    raise UsageError(f"duplicate pt sources: {argv[i]}")
                ptfile = value()
                if cpu is not None and not config.set_cpu(cpu):
                    cpu_error = "unknown cpu"
            elif arg in ("--raw", "--elf"):
                spec = value()
                try:
                    if arg == "--raw":
                        image.add_raw_spec(spec)
                    else:
                        image.add_elf(*parse_elf_spec(spec))
                except ImageError as exc:
                    raise UsageError(f"{arg}: {exc}") from None
            elif arg in _SWITCHES:
                setattr(opts, _SWITCHES[arg], True)
            elif arg in ("--stat:insn", "--stat:blocks"):
                opts.stats = True
                opts.stat_flags.add(arg[len("--stat:") :])
            elif arg == "--event:tick":
                flags.tick_events = True
            elif arg == "--event:iflags":
                iflags = True
            elif arg.startswith("--filter:addr") and arg[13:14].isdigit():
                n = int(arg[13])
                what = arg[14:]
                if ptfile is not None:
                    raise UsageError(f"please specify {arg} before --pt")
                slot = filters.setdefault(n, [0, 0, 0])
                if what == "_cfg":
                    slot[0] = parse_uint(arg, value(), 15)
                elif what == "_a":
                    slot[1] = parse_uint(arg, value(), (1 << 64) - 1)
                elif what == "_b":
                    slot[2] = parse_uint(arg, value(), (1 << 64) - 1)
                else:
                    raise UsageError(f"unknown option: {arg}")
            elif arg == "--cpu":
                if ptfile is not None:
                    raise UsageError("please specify cpu before the pt source file")
                text = value()
                if text == "none":
                    cpu = None
                else:
                    try:
                        cpu = Cpu.parse(text)
                    except ValueError:
                        raise UsageError("cpu must be specified as f/m[/s]") from None
            elif arg in CONFIG_UINTS:
                name, limit = CONFIG_UINTS[arg]
                setattr(config, name, parse_uint(arg, value(), limit))
            elif arg in ("--verbose", "-v"):
                pass
            elif sb.parse(arg, value, ptxed=True):
                pass
            elif arg in ("--insn-decoder", "--block-decoder"):
                # One flow for both: the instruction decoder is the block
                # decoder's blocks one instruction at a time.
                opts.insn_decoder = arg == "--insn-decoder"
            elif arg == "--block:end-on-call":
                flags.end_on_call = True
            elif arg == "--block:end-on-jump":
                flags.end_on_jump = True
            elif arg in ("--block:keep-tcal-on-ovf", "--insn:keep-tcal-on-ovf"):
                keep_tcal = True
            else:
                raise UsageError(f"unknown option: {arg}")
        if ptfile is None:
            raise UsageError("no pt file")
        # Intel's ptxed shows blocks only from its block decoder.
        opts.show_blocks = opts.show_blocks and not opts.insn_decoder
    except UsageError as exc:
        sys.stderr.write(f"{PROG}: {exc}.\n")
        return 1

    from .common import load_trace

    trace = load_trace(PROG, ptfile)
    if trace is None:
        return 1
    _, buf = trace
    addr_filter = AddrFilter([tuple(filters[n]) for n in sorted(filters)])
    out = _Printer(stdout)
    if cpu_error:
        out.line(f"[0, 0: config error: {cpu_error}]")
    sideband = None
    if sb.active:
        sideband = _start_sideband(sb, out)
        if sideband is None:
            return 1
    run = decoder if decoder is not None else decode
    try:
        run(buf, image, config, flags, addr_filter, iflags, keep_tcal, opts, out, sideband)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    out.flush()
    return 0


def _start_sideband(sb: SbOptions, out: _Printer):
    """The sideband session, its first records fetched; None (after one
    message) when a file cannot be loaded."""
    from ..perf.sbsession import report_text

    def report(code: int, filename: str, offset: int) -> None:
        if code < 0 or sb.warn:
            out.line(report_text(code, filename, offset, ptdump=False))

    def on_switch(ctx) -> None:
        out.line(f"[context: {ctx.image.name}]")

    try:
        session = sb.session(report, on_switch if sb.switch else None)
    except UsageError as exc:
        sys.stderr.write(f"{PROG}: {exc}.\n")
        return None
    session.init_decoders()
    _sideband_notes(session)
    return session, sb.flags


def _sideband_notes(session) -> None:
    for note in session.notes:
        sys.stderr.write(f"{PROG}: {note}\n")
    session.notes.clear()


class _Printer:
    """ptxed's standard output: text lines from Python and byte buffers from
    the compiled formatter, in order."""

    def __init__(self, stream=None) -> None:
        self.lines: list[str] = []
        self.stream = stream if stream is not None else sys.stdout.buffer

    def line(self, text: str) -> None:
        self.lines.append(text)
        if len(self.lines) >= 4096:
            self._lines_out()

    def write(self, data) -> None:
        self._lines_out()
        self.stream.write(data)

    def _lines_out(self) -> None:
        if self.lines:
            self.stream.write(("\n".join(self.lines) + "\n").encode())
            self.lines.clear()

    def flush(self) -> None:
        self._lines_out()
        self.stream.flush()


def decode(
    buf, image, config, flags, addr_filter, iflags, keep_tcal, opts, out, sideband=None
) -> None:
    """Decode with the compiled flow decoder and print as Intel's ptxed."""
    from ..pt.flowdec import FlowDecoder, FlowOptions
    from ..pt.options import EventOptions
    from ..pt.ptxed import PtxedWriter

    block_cache = _replays_block_cache(opts)
    options = FlowOptions(
        flags=flags,
        addr_filter=addr_filter,
        events=EventOptions(iflags=iflags, keep_tcal_on_ovf=keep_tcal),
        resync_on_error=opts.resync_on_error,
        count_only=opts.quiet and not block_cache,
    )
    # Sideband prints its own lines between the formatter's: one thread then.
    writer = PtxedWriter(
        opts, out.write, att=opts.att, pipelined=sideband is None, block_cache=block_cache
    )
    hook = None
    if sideband is not None:
        from ..pt.flowrows import CodeTable, event_object

        session, sb_flags = sideband

        def hook(row, offset: int) -> None:
            # Records due by the event's time are printed and applied; the
            # image may change (a context switch, or sections mapped into it).
            ctx = session.event(event_object(row), sb_flags, out.line)
            if session.notes:
                _sideband_notes(session)
            if ctx is not None:
                if ctx.cache is None:
                    ctx.cache = CodeTable(ctx.image)
                dec.use_table(ctx.cache)

    dec = FlowDecoder(image, config, options, on_event=hook, stop_at="all")
    try:
        dec.decode(buf, writer)
    finally:
        writer.finish()
    _print_stats(opts, writer.n_insn, writer.n_blocks, out)


def _replays_block_cache(opts: Options) -> bool:
    """libipt's block cache ends blocks early: replay it where that shows
    (block lines and counts, per-block offsets and times), nowhere else."""
    return not opts.insn_decoder and (opts.show_blocks or opts.stats or opts.offset or opts.time)


def _print_stats(opts: Options, n_insn: int, n_blocks: int, out: _Printer) -> None:
    if opts.stats:
        default = {"insn"} if opts.insn_decoder else {"insn", "blocks"}
        wanted = opts.stat_flags or default
        if "insn" in wanted:
            out.line(f"insn: {n_insn}.")
        if "blocks" in wanted:
            out.line(f"blocks:\t{n_blocks}.")
