"""The ``hwtrace`` command."""

from __future__ import annotations

import gc
import importlib
import os
import sys

USAGE = """usage: hwtrace <command> [<options>]

commands:
  ptdump    dump Intel PT packets (a drop-in for Intel's ptdump)
  ptxed     reconstruct the instruction flow (a drop-in for Intel's ptxed)
  record    record a program as Intel PT into perf.data (perf, or ptrace stepping)
  report    summarise a perf.data's decoded Intel PT per process and thread
  script    list a perf.data's decoded Intel PT per instruction or block
  decode    write a perf.data's decoded flow as Parquet datasets (blocks, events, gaps, symbols)
  query     SQL (DuckDB) over a decode directory; ready views: functions, threads, calls
  latency   time and instructions between marker instructions (delta profiling)
  funclatency  time and instructions of every call of a function
  diff      compare the call paths of two recordings of a program
  events    place LTTng, perf or ftrace events on the decoded flow
  characterize  trace size and time resolution of PT settings on a recorded path
  perf-dump print a perf.data's header and records (like perf report -D)
  filter    keep the recorded events an LTTng filter expression accepts
  filter-compile  compile a filter expression to an object or library for C tracers
  probe     fast dynamic tracepoints in a running process (counts, events)
  trace     kernel tracepoints filtered in the kernel (eBPF); system call latency
  vm        vCPUs, VM exits and guest processes from a KVM host's Intel PT (HAVAna)
  ptwrite   typed software events from PTWRITE packets (or the software channel)
  bts       branches of an Intel BTS perf.data, events at registered branch sites
  csdump    list ARM CoreSight trace packets (STM, ETMv4, ETE), raw, framed or a snapshot
  aot       the native library of compiled loops: warm (compile and build), build, status

Run 'hwtrace <command> --help' for a command's options, 'hwtrace --version'
for the version.
"""


def _build_aot_library() -> None:
    """After a command, build the native library of compiled loops if any had to
    go through numba (see hwtrace.aot)."""
    aot_module = sys.modules.get("hwtrace.aot")
    if aot_module is not None:
        aot_module.note_fallback()


def main(argv: list[str] | None = None) -> int:
    # hwtrace does no linear algebra, but numpy's OpenBLAS starts a thread
    # per CPU at import that spins for a while: on a small machine, CPU
    # taken from the decoder and ptxed's formatting thread.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    process = argv is None  # the command line's own (the hwtrace script)
    argv = list(sys.argv[1:] if argv is None else argv)
    if process and argv and argv[0] in _KEEP_FREED_MEMORY:
        _keep_freed_memory()
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    if argv[0] == "--version":
        from .. import version

        sys.stdout.write(f"hwtrace {version()}\n")
        return 0
    interrupted = False
    try:
        return _run(argv[0], argv[1:])
    except BrokenPipeError:
        # Output cut short (| head): not an error.  stdout goes to /dev/null
        # so that flushing it at exit does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as e:
        # A file the command could not read or write (one its checks did
        # not foresee): one line naming it, not a traceback.
        what = f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e)
        sys.stderr.write(f"hwtrace {argv[0]}: {what}\n")
        return 1
    except KeyboardInterrupt:
        # ^C: what the command started is undone by its own finally blocks;
        # no traceback, the shell's status for SIGINT, and no library build.
        interrupted = True
        sys.stderr.write(f"hwtrace {argv[0]}: interrupted\n")
        return 130
    finally:
        # The aot command builds the library itself.
        if not interrupted and argv[0] != "aot":
            _build_aot_library()
        if process:
            _before_exit()


# Commands whose freed memory is kept for their next batches (see below).
_KEEP_FREED_MEMORY = {"trace"}


def _keep_freed_memory() -> None:
    """glibc's malloc gives blocks of a few MB their own mappings and
    returns them, and the top of its heap, to the kernel when freed: each
    batch's arrays are fresh pages again, faulted in and cleared.  A live
    trace reads a batch every few milliseconds; kept (blocks up to 32 MB
    from the heap, the heap not trimmed below 1 GiB of free space) they
    cost no page faults after the first.  At two million events a second
    ``hwtrace trace`` lost 55-64% of them with glibc's defaults, 20% so.
    (The decoders' batches showed no difference: left as they were.)"""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return  # not glibc
    mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (glibc's largest on 64-bit)


def _before_exit() -> None:
    """The process ends next: the interpreter's last collections need not
    look at what is alive now (everything, at exit).  Its finalisation
    otherwise traverses every object the command's modules made: 20-30 ms
    after ``report`` or ``script``, 60 ms after ``decode``.  Only for the
    process's own command (a caller of :func:`main` goes on living, and
    frozen objects are never collected)."""
    gc.freeze()


# Command -> (module of hwtrace.cli, its entry point); imported only when
# run, so that a command loads nothing the others need.
_ENTRY_POINTS = {
    "ptdump": ("ptdump", "main"),
    "ptxed": ("ptxed", "main"),
    "perf-dump": ("perfdump", "main"),
    "record": ("recordcmd", "record_main"),
    "report": ("perfcmds", "report_main"),
    "script": ("perfcmds", "script_main"),
    "decode": ("decode", "main"),
    "query": ("query", "main"),
    "diff": ("diff", "main"),
    "characterize": ("characterize", "main"),
    "events": ("events", "main"),
    "latency": ("latency", "latency_main"),
    "funclatency": ("latency", "funclatency_main"),
    "filter": ("filtercmd", "main"),
    "filter-compile": ("filtercompile", "main"),
    "trace": ("trace", "main"),
    "ptwrite": ("ptwrite", "main"),
    "bts": ("bts", "main"),
    "csdump": ("csdump", "main"),
    "vm": ("vm", "main"),
    "probe": ("probe", "main"),
    "aot": ("aotcmd", "main"),
}


def _run(cmd: str, rest: list[str]) -> int:
    entry = _ENTRY_POINTS.get(cmd)
    if entry is None:
        sys.stderr.write(f"hwtrace: unknown command '{cmd}'\n{USAGE}")
        return 2
    module, function = entry
    from .dataclass_code import cache_file, install

    install(cache_file(cmd))
    return getattr(importlib.import_module(f"hwtrace.cli.{module}"), function)(rest)


if __name__ == "__main__":
    sys.exit(main())
