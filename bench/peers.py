"""Workloads and peer runners for bench_overhead.py: the program alone and under other tracers.

A :class:`Workload` is an argv, an optional stdin file and the SHA-256 of
the stdout of a native run made when the workloads are set up
(:func:`setup_workloads`).  Every runner runs it ``repeat`` times (output to
a file, compared with that hash) and returns a :class:`RunResult`: the best
wall time, whether every run's output matched, and a note.

Peers, and what each records:

* :func:`native`: the program alone.
* :func:`valgrind` ``tool="lackey"``: ``--basic-counts=no --trace-superblocks=yes``.
  Lackey's default (``--basic-counts=yes``) only counts guest instructions,
  conditional jumps and calls, with a helper call per instruction; the
  superblock trace is the mode that records executed blocks (one ``SB addr``
  line per superblock entered), and turning the counts off drops their
  instrumentation.  Lackey writes each line with its own write(2): on a
  0.06 s collatz run that is 142 M lines, 1.7 GB and 600x the native time
  (35 s with the log on /dev/null, 99 s to a file).  The log goes to a pipe
  read by ``wc -l``: no disk, and the line count checks that it recorded.
* :func:`valgrind` ``tool="callgrind"``: its defaults (instruction counts per
  source line and call-graph edges, no cache simulation), out file in a
  temporary directory.
* :func:`frida_stalker`: Frida spawns the program, an agent
  (``overhead_workloads/stalker_agent.js``) has Stalker follow every thread
  with ``events: {compile: true}``, one event per basic block when Stalker
  first translates it: block coverage, what Frida's coverage tools record.
  ``block: true`` (an event per executed block) would be the execution
  trace, but on these workloads it is about 10^9 events of 32 bytes a
  second of native run; a 0.6 s collatz run had not finished after ten
  minutes.  ``events="block"`` still selects it.
* :func:`under_command`: any command prefix (``hwtrace record ... --``): how
  bench_overhead.py's ``extra_runners`` time hwtrace's own backends.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "overhead_workloads"
OUT = HERE / "out" / "overhead"


@dataclass(frozen=True)
class Workload:
    """A program to time: argv, optional stdin file, expected stdout hash."""

    name: str
    argv: tuple[str, ...]
    stdin: Path | None
    expected_sha256: str
    kind: str  # "micro" (our C sources) or "program" (a Debian program)


@dataclass
class RunResult:
    """Best wall seconds of a runner on a workload (None: no run finished)."""

    seconds: float | None
    matched: bool | None  # every run's stdout hashed as the native run's; None: not checked
    runs: list[float] = field(default_factory=list)
    note: str = ""
    available: bool = True
    details: dict = field(default_factory=dict)


class Unavailable(Exception):
    """A runner that cannot work on this machine, with the reason."""


# --- workloads ---------------------------------------------------------------


def _compile(src: Path, exe: Path) -> Path:
    compiler = "g++" if src.suffix == ".cpp" else "gcc"
    extra = ["-std=c++17"] if src.suffix == ".cpp" else []
    if not exe.is_file() or exe.stat().st_mtime < src.stat().st_mtime:
        subprocess.run([compiler, "-O2", *extra, "-o", str(exe), str(src)], check=True)
    return exe


def generated_text(path: Path, size: int) -> Path:
    """``size`` bytes of text-like input for xz and gzip, the same every time:
    words from a Zipf law over a generated vocabulary, numbers, line breaks
    (numpy's PCG64 with a fixed seed)."""
    if path.is_file() and path.stat().st_size == size:
        return path
    rng = np.random.Generator(np.random.PCG64(20240601))
    syllables = np.array(["ka", "lo", "mi", "ne", "su", "ta", "ro", "vi"] + ["ze", "qu", "an"])
    vocab_size = 8000
    lengths = rng.integers(1, 5, vocab_size)
    parts = syllables[rng.integers(0, len(syllables), (vocab_size, 4))]
    vocab = np.array(["".join(p[:n]) for p, n in zip(parts, lengths, strict=True)])
    n_words = size // 5 + 1000
    words = vocab[np.minimum(rng.zipf(1.3, n_words) - 1, vocab_size - 1)]
    numbers = rng.integers(0, 100000, n_words).astype(str)
    words = np.where(rng.random(n_words) < 0.1, numbers, words)
    seps = np.where(rng.random(n_words) < 0.08, "\n", " ")
    data = "".join(np.char.add(words, seps).tolist()).encode()
    if len(data) < size:
        raise ValueError(f"generated {len(data)} bytes, fewer than {size}")
    path.write_bytes(data[:size])
    return path


def _definitions(scale: float, build: Path) -> list[tuple[str, list[str], Path | None, str]]:
    """(name, argv, stdin, kind) of every workload at ``scale`` (1: 0.3-1 s natively)."""

    def n(x: float) -> str:
        return str(max(1, int(x * scale)))

    exe = {s.stem: _compile(s, build / s.stem) for s in sorted(SOURCES.glob("*.c*"))}
    text = generated_text(build / f"input-{n(3_000_000)}.txt", int(n(3_000_000)))
    fib_n = 39 if scale >= 1 else 37 if scale >= 0.25 else 33
    return [
        ("collatz", [str(exe["collatz"]), n(1_500_000)], None, "micro"),
        ("interp", [str(exe["interp"]), n(30_000_000)], None, "micro"),
        ("fib", [str(exe["fib"]), str(fib_n), n(2000 * scale**-0.5)], None, "micro"),
        ("stl-c++", [str(exe["stl"]), n(300_000)], None, "micro"),
        ("xz-9", ["/usr/bin/xz", "-9", "-c", str(text)], None, "program"),
        ("gzip-9", ["/bin/gzip", "-9", "-c", str(text)], None, "program"),
        ("sqlite3", ["/usr/bin/sqlite3", ":memory:"], SOURCES / "queries.sql", "program"),
        (
            "python3",
            ["/usr/bin/python3", str(SOURCES / "pywork.py"), "10", n(150_000)],
            None,
            "program",
        ),
    ]


def setup_workloads(scale: float = 1.0, only: Sequence[str] = ()) -> list[Workload]:
    """Build the workloads under bench/out/overhead and hash a native run's stdout."""
    build = OUT / "build"
    build.mkdir(parents=True, exist_ok=True)
    workloads = []
    for name, argv, stdin, kind in _definitions(scale, build):
        if only and not any(o in name for o in only):
            continue
        if not Path(argv[0]).is_file():
            raise FileNotFoundError(f"{name}: {argv[0]} is not installed")
        _, digest, status = _run_once(argv, stdin, timeout=120)
        if status != 0:
            raise RuntimeError(f"{name}: the native run exited with {status}")
        workloads.append(Workload(name, tuple(argv), stdin, digest, kind))
    return workloads


# --- running and timing ------------------------------------------------------


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _run_once(
    argv: Sequence[str],
    stdin: Path | None,
    *,
    timeout: float,
    pass_fds: Sequence[int] = (),
) -> tuple[float, str, int]:
    """Wall seconds, stdout SHA-256 and exit status of one run (output to a file)."""
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=OUT) as out:
        fin = open(stdin, "rb") if stdin else subprocess.DEVNULL
        try:
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                argv, stdin=fin, stdout=out, stderr=subprocess.DEVNULL, pass_fds=pass_fds
            )
            try:
                status = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise
            seconds = time.perf_counter() - t0
        finally:
            if stdin:
                fin.close()  # type: ignore[union-attr]
        out.seek(0)
        h = hashlib.sha256()
        while chunk := out.read(1 << 20):
            h.update(chunk)
    return seconds, h.hexdigest(), status


def _best_of(
    w: Workload, repeat: int, timeout: float, once: Callable[[], tuple[float, str, int]]
) -> RunResult:
    runs: list[float] = []
    matched = True
    for _ in range(repeat):
        try:
            seconds, digest, status = once()
        except subprocess.TimeoutExpired:
            return RunResult(min(runs) if runs else None, matched if runs else None, runs,
                             f"timeout: a run took more than {timeout:g} s")  # fmt: skip
        runs.append(seconds)
        matched = matched and digest == w.expected_sha256 and status == 0
    return RunResult(min(runs), matched, runs)


def native(w: Workload, *, repeat: int = 3, timeout: float = 120) -> RunResult:
    """The program alone."""
    return _best_of(w, repeat, timeout, lambda: _run_once(w.argv, w.stdin, timeout=timeout))


def under_command(
    prefix: Sequence[str], w: Workload, *, repeat: int = 3, timeout: float = 600
) -> RunResult:
    """The program run as ``prefix + argv`` (``hwtrace record -o F --``, ...):
    its stdout must still be the program's."""
    argv = [*prefix, *w.argv]
    return _best_of(w, repeat, timeout, lambda: _run_once(argv, w.stdin, timeout=timeout))


VALGRIND_OPTIONS = {
    "lackey": ["--basic-counts=no", "--trace-superblocks=yes"],
    "callgrind": [],
    "none": [],
}


def valgrind(w: Workload, tool: str, *, repeat: int = 3, timeout: float = 600) -> RunResult:
    """The program under ``valgrind --tool=TOOL`` (see the module's notes)."""
    exe = shutil.which("valgrind")
    if exe is None:
        return RunResult(None, None, note="unavailable: valgrind is not installed", available=False)
    lines: list[int] = []

    def once() -> tuple[float, str, int]:
        with tempfile.TemporaryDirectory(dir=OUT) as tmp:
            options = [f"--callgrind-out-file={tmp}/callgrind.out"] if tool == "callgrind" else []
            if tool != "lackey":
                argv = [exe, "-q", f"--tool={tool}", *options, *w.argv]
                return _run_once(argv, w.stdin, timeout=timeout)
            # The superblock trace goes to a pipe counted by wc -l.
            read_end, write_end = os.pipe()
            counter = subprocess.Popen(["wc", "-l"], stdin=read_end, stdout=subprocess.PIPE)
            os.close(read_end)
            try:
                argv = [exe, "-q", "--tool=lackey", *VALGRIND_OPTIONS["lackey"],
                        f"--log-fd={write_end}", *w.argv]  # fmt: skip
                result = _run_once(argv, w.stdin, timeout=timeout, pass_fds=(write_end,))
            finally:
                os.close(write_end)
                out, _ = counter.communicate()
            lines.append(int(out.split()[0]))
            return result

    result = _best_of(w, repeat, timeout, once)
    if tool == "lackey":
        result.details["superblock_lines"] = lines
        if lines and min(lines) == 0:
            result.note = "lackey wrote no superblock line"
            result.matched = False
        elif lines:
            result.note = f"{max(lines):,} superblocks"
    return result


def frida_available() -> str | None:
    """Why frida cannot run here (None: it can)."""
    try:
        import frida  # noqa: F401
    except ImportError as e:
        return f"the frida package is not installed ({e}); pip install -e '.[bench]'"
    return None


def frida_stalker(
    w: Workload, *, repeat: int = 3, timeout: float = 600, events: str = "compile"
) -> RunResult:
    """The program spawned by Frida, every thread followed by Stalker (see the
    module's notes).  Wall time from spawn to the process's end."""
    reason = frida_available()
    if reason is not None:
        return RunResult(None, None, note=f"unavailable: {reason}", available=False)
    import frida

    agent = (SOURCES / "stalker_agent.js").read_text().replace("%EVENT_KIND%", events)
    device = frida.get_local_device()
    tallies: list[dict] = []

    def once() -> tuple[float, str, int]:
        ended = threading.Event()
        tally: dict = {}
        with tempfile.TemporaryFile(dir=OUT) as out:
            fin = os.open(w.stdin, os.O_RDONLY) if w.stdin else os.open(os.devnull, os.O_RDONLY)
            # Frida spawns from this process: the child inherits fds 0 and 1
            # as they are during spawn() (frida's stdio="pipe" would carry the
            # output through its own channel, and has no end-of-input).
            saved = os.dup(0), os.dup(1)
            t0 = time.perf_counter()
            try:
                os.dup2(fin, 0)
                os.dup2(out.fileno(), 1)
                pid = device.spawn(list(w.argv))
            finally:
                os.dup2(saved[0], 0)
                os.dup2(saved[1], 1)
                for fd in (fin, *saved):
                    os.close(fd)
            try:
                session = device.attach(pid)
                session.on("detached", lambda *_: ended.set())
                script = session.create_script(agent)

                def on_message(message: dict, _data: bytes | None) -> None:
                    payload = message.get("payload") or {}
                    if message.get("type") == "error":
                        tally.setdefault("errors", []).append(message.get("description"))
                    elif payload.get("type") == "tally":
                        tally.update(payload)
                        script.post({"type": "ack"})

                script.on("message", on_message)
                script.load()
                device.resume(pid)
                script.exports_sync.follow_all()
            except frida.ProcessNotFoundError:
                pass  # exited before the follow: the tally says nothing came
            if not ended.wait(timeout):
                device.kill(pid)
                raise subprocess.TimeoutExpired(w.argv, timeout)
            seconds = time.perf_counter() - t0
            out.seek(0)
            digest = hashlib.sha256(out.read()).hexdigest()
        tallies.append(tally)
        # Frida reaps the child itself: the exit status is not seen here;
        # the output hash stands for it.
        return seconds, digest, 0

    try:
        result = _best_of(w, repeat, timeout, once)
    except (frida.NotSupportedError, frida.PermissionDeniedError) as e:
        return RunResult(None, None, note=f"unavailable: {e}", available=False)
    counts = [t.get("bytes", 0) // max(1, t.get("eventSize", 0) or 1) for t in tallies]
    result.details.update(events=events, event_counts=counts, tallies=tallies)
    if not tallies or min(counts) == 0:
        result.note = f"Stalker sent no {events} event"
        result.matched = False
    else:
        result.note = f"{min(counts):,}-{max(counts):,} {events} events"
    return result
