"""valgrind's callgrind as an oracle: self instruction counts (Ir) per
function of a whole run, written by a tool the project did not write.

:func:`callgrind_self_ir` runs a program under ``valgrind --tool=callgrind``
and reads the profile it writes (Callgrind Format, Version 1, valgrind's
"Callgrind Format Specification"): ``ob=`` names the ELF object and ``fn=``
the function whose self cost the following cost lines give; a ``calls=``
line (after ``cob=``/``cfi=``/``cfn=`` naming the callee) is followed by
one cost line that is the call's *inclusive* cost, which is not the
caller's self cost and is not added to it.  The sum of all self costs is
the ``totals:`` line.

The options are fixed, because they change the attribution:

- ``--separate-recs=1``: one entry per function (callgrind's default, 2,
  names a recursive function's deeper activations ``fib'2``);
- ``--skip-plt=yes`` (the default): see below;
- ``--demangle=no``: symbol names as the ELF tables hold them (C++ names
  mangled, as ``.rela.plt`` and hwtrace's tables have them);
- ``--dump-instr=no --compress-strings=no --compress-pos=no``: one cost
  line per source line, names in full (compressed names, ``(id) name``,
  and relative positions are still read).

What callgrind 3.19 does, observed on gcc 12 / binutils 2.40 / glibc 2.36
x86-64 builds (the checks are in ``test_callgrind_oracle.py``):

- A ``.plt`` stub's instructions are the *caller's* self cost; there is no
  ``name@plt`` or ``0x...`` entry for it, and the callee (``cfn=rand_r``,
  ``cob=.../libc.so.6``) is listed as called from the caller.  Bound
  (``-z now``): 1 instruction per call (the ``jmp *GOT``).  Lazy binding
  adds 4 on the first call (the stub's ``push`` and ``jmp`` and PLT0's
  ``push`` and ``jmp``), and ld.so's ``_dl_runtime_resolve_xsave`` is
  listed as called from the caller.  With ``-fno-plt`` there is no stub.
- Code outside the object's ``.text`` (valgrind's text range) is not
  attributed to the object: ``.plt.sec`` (IBT builds:
  ``-fcf-protection=full -z ibtplt``), ``.plt.got`` (e.g.
  ``__cxa_finalize`` from ``__do_global_dtors_aux``), ``.init`` (``_init``)
  and ``.fini`` (``_fini``) appear under ``ob=???`` as functions named
  ``0x`` + 16 hex digits of the *run-time* address (a PIE's ``.init`` at
  0x1000 is ``0x0000000000109000``: valgrind loads PIEs at 0x108000).  So
  with IBT the ``.plt.sec`` stub's ``endbr64`` and ``jmp`` are one
  ``ob=???`` function of their own (and the lazy ``.plt``/PLT0 instructions
  reached from it are that function's), not the caller's.
- A function without a usable symbol (stripped, or a symbol of size 0 such
  as crtstuff's ``frame_dummy``, ``deregister_tm_clones``,
  ``__do_global_dtors_aux`` or an assembly label without ``.size``) inside
  ``.text`` stays under its object (``ob=`` the file) and is named ``0x`` +
  16 hex digits of the address, *in the file* (the link-time address; a
  PIE's offset), of the block a call entered: ``0x0000000000001139``.  The
  blocks reached from there by jumps and returns are counted under that
  one name, so a stripped function has one entry with the same self Ir as
  when it had its symbol.  (callgrind's ``fn.c`` appends `` [PLT]``,
  `` [GOT]``, `` [Data]`` or `` [BSS]`` to such a name when the address is
  in one of those sections; not seen in these builds.)
- Versioned symbols keep their version (``__libc_start_main@@GLIBC_2.34``),
  and with valgrind's default ``--show-below-main=no`` ``_start`` and
  libc's ``__libc_start_call_main`` are both ``(below main)`` (one entry in
  each object).
- ``summary:`` leaves out the instructions run in signal handlers (and
  what they call); the self costs, and ``totals:``, include them.  Without
  signals the two are equal.
- Object paths are the files' absolute paths (``./prog`` is
  ``/dir/prog``); :meth:`CallgrindProfile.self_ir_in` compares them after
  :func:`os.path.realpath`.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# Object and function of a cost: (ob=, fn=) as callgrind writes them.
FunctionKey = tuple[str, str]

CALLGRIND_OPTIONS = (
    "--tool=callgrind",
    "--dump-instr=no",
    "--compress-strings=no",
    "--compress-pos=no",
    "--separate-recs=1",
    "--skip-plt=yes",
    "--demangle=no",
)


@dataclass
class CallgrindProfile:
    """One callgrind profile: self Ir per (object, function), call counts,
    the file's totals and the run's standard output."""

    self_ir: dict[FunctionKey, int]
    calls: dict[tuple[FunctionKey, FunctionKey], int]
    totals: int | None = None
    summary: int | None = None
    stdout: str = ""
    returncode: int = 0
    events: list[str] = field(default_factory=list)
    # Ir per (object, instruction address), with ``instructions=True``:
    # addresses in the object's file (its link-time addresses), except under
    # ``???`` (valgrind's run-time addresses); a REP string instruction's Ir
    # is its iterations.
    ir_at: dict[tuple[str, int], int] = field(default_factory=dict)

    def ir_at_in(self, obj: str | os.PathLike[str]) -> dict[int, int]:
        """Ir per instruction address (link-time) of object ``obj``."""
        want = os.path.realpath(obj)
        return {a: v for (ob, a), v in self.ir_at.items()
                if ob != "???" and os.path.realpath(ob) == want}  # fmt: skip

    def self_ir_of(self, function: str) -> int:
        """Self Ir of ``function`` summed over the objects that have one of
        that name."""
        return sum(v for (_, fn), v in self.self_ir.items() if fn == function)

    def self_ir_in(self, obj: str | os.PathLike[str]) -> dict[str, int]:
        """Self Ir per function of object ``obj`` (a path)."""
        want = os.path.realpath(obj)
        return {
            fn: v
            for (ob, fn), v in self.self_ir.items()
            if ob != "???" and os.path.realpath(ob) == want
        }

    def call_count(self, caller: str, callee: str) -> int:
        """How many calls from function ``caller`` to ``callee`` (by name,
        over all objects)."""
        return sum(n for ((_, a), (_, b)), n in self.calls.items() if a == caller and b == callee)


class _Names:
    """One name-compression table (callgrind keeps one per position kind)."""

    def __init__(self) -> None:
        self.by_id: dict[str, str] = {}

    def resolve(self, value: str) -> str:
        value = value.strip()
        if value.startswith("(") and ")" in value and value[1:2].isdigit():
            ident, _, rest = value[1:].partition(")")
            rest = rest.strip()
            if rest:
                self.by_id[ident] = rest
                return rest
            return self.by_id[ident]
        return value


def _ir_of(line: str, positions: int, ir_index: int) -> int:
    fields = line.split()
    at = positions + ir_index
    return int(fields[at], 0) if at < len(fields) else 0


def parse_callgrind_out(text: str) -> CallgrindProfile:
    """Self Ir per (ob, fn) and call counts of a callgrind output file's
    text (every part summed)."""
    self_ir: dict[FunctionKey, int] = defaultdict(int)
    calls: dict[tuple[FunctionKey, FunctionKey], int] = defaultdict(int)
    names = {k: _Names() for k in ("ob", "fl", "fn")}
    # cob shares ob's table, cfi/cfl fl's, cfn fn's.
    table_of = {"ob": "ob", "cob": "ob", "fl": "fl", "fi": "fl", "fe": "fl", "cfi": "fl",
                "cfl": "fl", "fn": "fn", "cfn": "fn"}  # fmt: skip
    ob, fn = "???", "???"
    called_ob: str | None = None
    called_fn: str | None = None
    positions = 1
    events: list[str] = []
    ir_index = 0
    totals: int | None = None
    summary: int | None = None
    inclusive_next = False
    ir_at: dict[tuple[str, int], int] = defaultdict(int)
    instr = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        head = line[0]
        if head.isdigit() or head in "+-*":
            if inclusive_next:
                # The cost line after calls=: inclusive, the callee's.
                inclusive_next = False
                continue
            ir = _ir_of(line, positions, ir_index)
            self_ir[(ob, fn)] += ir
            if instr:
                ir_at[(ob, int(line.split()[0], 0))] += ir
            continue
        key, eq, value = line.partition("=")
        if eq and key in table_of:
            name = names[table_of[key]].resolve(value)
            if key == "ob":
                ob = name
            elif key == "fn":
                fn = name
            elif key == "cob":
                called_ob = name
            elif key == "cfn":
                called_fn = name
            continue
        if eq and key == "calls":
            count = int(value.split()[0], 0)
            callee = (called_ob if called_ob is not None else ob, called_fn or "???")
            calls[((ob, fn), callee)] += count
            # cob=/cfn= name the target of the next call only.
            called_ob = called_fn = None
            inclusive_next = True
            continue
        if eq and key in ("jump", "jcnd"):
            continue  # followed by a position line without costs
        key, colon, value = line.partition(":")
        if not colon:
            raise ValueError(f"callgrind output: unexpected line {raw!r}")
        value = value.strip()
        if key == "positions":
            positions = len(value.split())
            instr = value.split()[0] == "instr"
        elif key == "events":
            events = value.split()
            ir_index = events.index("Ir") if "Ir" in events else 0
        elif key in ("totals", "summary"):
            ir = int(value.split()[ir_index], 0)
            if key == "totals":
                totals = (totals or 0) + ir
            else:
                summary = (summary or 0) + ir
    return CallgrindProfile(dict(self_ir), dict(calls), totals, summary, events=events,
                            ir_at=dict(ir_at))  # fmt: skip


def callgrind_self_ir(
    argv: list[str | os.PathLike[str]],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    instructions: bool = False,
) -> CallgrindProfile:
    """``argv`` run under callgrind: its profile (self Ir per object and
    function) and standard output.  Raises RuntimeError when valgrind
    fails or writes no profile."""
    with tempfile.TemporaryDirectory(prefix="hwtrace-callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out.%p"
        log = Path(tmp) / "valgrind.log"
        options = CALLGRIND_OPTIONS
        if instructions:  # costs per instruction address too (absolute, --compress-pos=no)
            options = tuple("--dump-instr=yes" if o == "--dump-instr=no" else o for o in options)
        cmd = [
            "valgrind",
            *options,
            f"--callgrind-out-file={out}",
            f"--log-file={log}",
            *map(str, argv),
        ]
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        stdout, stderr = proc.communicate(timeout=timeout)
        # valgrind runs the program in its own process: the profile of
        # that process, not of children it forked.
        written = Path(tmp) / f"callgrind.out.{proc.pid}"
        if not written.is_file():
            messages = log.read_text(errors="replace") if log.is_file() else ""
            raise RuntimeError(f"callgrind wrote no profile ({' '.join(cmd)}):\n{messages}{stderr}")
        profile = parse_callgrind_out(written.read_text(errors="replace"))
    profile.stdout = stdout
    profile.returncode = proc.returncode
    return profile


@functools.lru_cache(maxsize=1)
def skip_reason() -> str | None:
    """Why callgrind cannot be used here, or None."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return "valgrind is not installed"
    true = shutil.which("true")
    if true is None:
        return "no `true` program to check valgrind with"
    try:
        profile = callgrind_self_ir([true], timeout=60)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return f"valgrind --tool=callgrind does not run here: {e}"
    if not profile.totals:
        return "callgrind wrote an empty profile"
    return None
