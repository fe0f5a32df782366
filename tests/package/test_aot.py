"""The native loop library (hwtrace.aot): built from numba's code,
called through ctypes, and giving exactly numba's results."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from hwtrace import aot

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None,
    reason="no C compiler to link the library with",
)


def _exercise():
    import aot_samples as ks

    buf = np.frombuffer(bytes(range(256)) * 4, np.uint8)  # read-only
    state = (np.zeros(2, np.int64), np.zeros(3, np.uint64))
    out = (np.zeros(1, np.int64), np.zeros((3, 5), np.uint64))
    a = np.zeros(4, np.int64)
    results = [
        ks.total(buf, 3, 900),
        ks.fill(state, out, np.uint64(1 << 63), 1.5, True),
        ks.fill(state, out, np.uint64(5), 2.25, False),
        out[1].copy(),
        state[0].copy(),
        ks.nothing(a),
        a.copy(),
        ks.checked(np.array([0, 3], np.int64), 1),
        ks.calls_loop(buf),
        ks.allocates(10),
    ]
    with pytest.raises(IndexError, match="past the end"):
        ks.checked(np.array([0, 3], np.int64), 5)
    return results


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y and type(x) is type(y), (x, y)


def test_native_library_matches_numba(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parents[1]))
    import aot_samples as ks

    aot.use_library(None)
    try:
        expected = _exercise()  # through numba: compiles the specialisations
        manifest = aot.build(tmp_path, modules=("aot_samples",))
        assert manifest is not None
        info = json.loads(manifest.read_text())
        native = {e["loop"].split(":")[1] for e in info["entries"]}
        assert {"total", "fill", "nothing", "checked", "calls_loop"} <= native
        assert "allocates" not in native  # numba's runtime: left to numba
        assert aot.use_library(manifest)
        aot._fallbacks.clear()
        got = _exercise()
        _same(expected, got)
        # Only the allocating loop went through numba this time.
        assert aot.fallbacks() == {f"{ks.__name__}:allocates"}
        # The library's loops take their arguments as one array of words.
        entries = aot._load_library().entries(f"{ks.__name__}:fill")
        assert entries and all(e.packed is not None for e in entries.values())
        _threads_keep_their_own_words(ks)
        _prepared_calls_use_their_arguments(ks)
        _index_stands_for_the_manifest(manifest, f"{ks.__name__}:fill")
        # A changed source file retires the library.
        src = __import__("pathlib").Path(ks.__file__)
        stamp = src.stat()
        import os

        os.utime(src, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1_000_000_000))
        try:
            assert not aot.use_library(manifest)
        finally:
            os.utime(src, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    finally:
        aot.use_library(None)
        aot._library = False  # look for the real one again


def _threads_keep_their_own_words(ks) -> None:
    """Threads calling one loop at once, each with arguments of its own
    (some the very objects of its last call, some new), get their own
    results: a thread's words are its own."""
    from concurrent.futures import ThreadPoolExecutor

    bufs = [np.frombuffer(bytes([k]) * 4096, np.uint8) for k in range(1, 5)]

    def work(k: int) -> list[int]:
        buf = bufs[k]
        return [int(ks.total(buf, 0, 1 + (i * 37 + k) % 4000)) for i in range(300)]

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(work, range(4)))
    for k in range(4):
        assert got[k] == [(k + 1) * (1 + (i * 37 + k) % 4000) for i in range(300)]


def _prepared_calls_use_their_arguments(ks) -> None:
    """A prepared call is the library's, and calls the loop with its very
    arguments (their contents as they are at the call); another loop's call
    in between does not disturb it; arguments the library has no entry for
    go through numba."""
    state = (np.zeros(2, np.int64), np.zeros(3, np.uint64))  # (the types _exercise built)
    out = (np.zeros(1, np.int64), np.zeros((2, 3), np.uint64))
    call = ks.fill.prepare(state, out, np.uint64(5), 1.5, True)
    assert call.holds(state, out, np.uint64(5), 1.5, True) is False  # (another uint64)
    assert call.holds(*call.args)
    assert call._entry is not None
    assert call() == (6, 3.0, True)
    out[1][...] = 0
    buf = np.arange(10, dtype=np.uint8)
    assert int(ks.total(buf, 0, 10)) == 45
    assert call() == (6, 3.0, True)
    assert state[0][0] == 2 and out[1][1, 2] == 10
    odd = ks.nothing.prepare([1, 2])  # a list: no native layout
    assert odd._entry is None


def _index_stands_for_the_manifest(manifest, loop: str) -> None:
    """The build's index of the manifest (what commands load) gives the
    manifest's entries; without it, damaged, or of an older manifest, the
    manifest is read (and the index written again)."""
    import os

    index = __import__("pathlib").Path(aot._index_path(manifest))
    assert index.exists() and aot._read_index(manifest) is not None
    by_index = aot._load_library().entries(loop)
    assert by_index
    names = {k: e.name for k, e in by_index.items()}
    for spoil in ("gone", "damaged", "older"):
        if spoil == "gone":
            index.unlink()
        elif spoil == "damaged":
            index.write_bytes(b"\x00 not marshal")
        else:
            st = manifest.stat()
            os.utime(manifest, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        assert aot._read_index(manifest) is None
        assert aot.use_library(manifest)
        assert {k: e.name for k, e in aot._load_library().entries(loop).items()} == names
        assert aot._read_index(manifest) is not None  # written again


def test_a_build_adds_to_the_library_of_the_same_sources(tmp_path, monkeypatch):
    """A build whose numba cache lost what the library holds (another
    process compiled only one new specialisation) keeps the library's
    entries and adds the new one in a library of its own."""
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parents[1]))
    import aot_samples as ks

    aot.use_library(None)
    try:
        _exercise()
        first = json.loads(aot.build(tmp_path, modules=("aot_samples",)).read_text())
        ks.nothing(np.zeros(3, np.int16))  # a specialisation the first build lacks
        monkeypatch.setattr(aot, "_cached_signatures", lambda disp: [])
        manifest = aot.build(tmp_path, modules=("aot_samples",))
        second = json.loads(manifest.read_text())
        assert second["libraries"][:-1] == first["libraries"] and len(second["libraries"]) == 2
        assert second["entries"][: len(first["entries"])] == first["entries"]
        added = second["entries"][len(first["entries"]) :]
        assert [e["loop"].split(":")[1] for e in added] == ["nothing"]
        assert added[0]["library"] == second["libraries"][-1]
        # Nothing new: the same library.
        assert json.loads(aot.build(tmp_path, modules=("aot_samples",)).read_text()) == second
        assert aot.use_library(manifest)
        aot._fallbacks.clear()
        a16, a64 = np.zeros(3, np.int16), np.zeros(4, np.int64)
        ks.nothing(a16)
        ks.nothing(a64)
        assert ks.total(np.frombuffer(bytes(range(256)) * 4, np.uint8), 3, 900) is not None
        assert aot.fallbacks() == set()
    finally:
        aot.use_library(None)
        aot._library = False


def test_argument_keys_follow_numba_typeof():
    from numba import typeof

    values = [
        np.zeros(3, np.uint8),
        np.frombuffer(b"abc", np.uint8),
        np.zeros((2, 3), np.int64),
        np.zeros((2, 3), np.int64)[:, 1],
        np.zeros((2, 3), np.int64).T,
        5,
        -(1 << 63),
        (1 << 64) - 1,
        2.5,
        True,
        np.uint64(3),
        np.int8(-1),
        (np.zeros(2, np.int32), (7, np.zeros(1, np.bool_))),
        np.zeros(3, np.dtype([("a", np.int64), ("b", np.uint8)])),
        np.zeros(3, np.dtype([("a", np.int64), ("b", np.uint8)], align=True)),
    ]
    for v in values:
        assert aot._value_key(v) == aot._numba_key(typeof(v)), v


def test_ptxed_through_the_native_library(tmp_path, monkeypatch):
    """hwtrace ptxed prints the same bytes with the decoder's loops
    called from the real library as through numba, on Intel's cases."""
    from test_ptxed_compiled import CORE, RUN, ptxed_output, with_options

    if not CORE:
        pytest.skip("conformance suite not found")
    from conftest import CONFORMANCE, copy_of_built_loops

    runs = []
    for case in CORE[:40]:
        for f in (case["pt"], case["bin"]):
            shutil.copy(CONFORMANCE / "cases" / f, tmp_path)
        argv = next(iter(RUN.command_lines(case, "ptxed", ["ptxed"])))[1:]
        for extra in ([], ["INST", "--time", "--offset"], ["--block:show-blocks", "--stat"]):
            runs.append(with_options(argv, extra))
    monkeypatch.chdir(tmp_path)
    aot.use_library(None)
    try:
        want = [ptxed_output(a, reference=False) for a in runs]
        manifest = aot.build(copy_of_built_loops(tmp_path / "lib"))
        assert manifest is not None
        assert aot.use_library(manifest)
        aot._fallbacks.clear()
        got = [ptxed_output(a, reference=False) for a in runs]
        assert "hwtrace.pt._flowloop:run" not in aot.fallbacks()
        assert got == want
    finally:
        aot.use_library(None)
        aot._library = False


def test_numba_extensions_registered_after_a_spec_lookup():
    """Looking numba up without importing it (importlib.util.find_spec)
    must not cost the loops their numba extensions: a fresh process
    looks numba up, then compiles plain numba code using textout's
    put_text."""
    import subprocess
    import sys

    code = (
        "import importlib.util, numpy as np\n"
        "from hwtrace import textout, aot\n"
        "assert importlib.util.find_spec('numba') is not None\n"
        "import numba\n"
        "@numba.njit\n"  # plain numba code: no CompiledLoop to set numba up
        "def hello(out):\n"
        "    return textout.put_text(out, 0, 'hi')\n"
        "out = np.zeros(4, np.uint8)\n"
        "assert hello(out) == 2 and bytes(out[:2]) == b'hi'\n"
    )
    env = {**__import__("os").environ, "HWTRACE_AOT": "numba"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=600)


def test_aot_commands(capsys, monkeypatch, tmp_path):
    """``hwtrace aot status`` reports the library in use; warming, which
    runs the commands, is a command-line sub-command: ``python -m
    hwtrace.aot warm`` says where it went instead of importing the
    commands from below them."""
    from hwtrace.cli.main import main

    monkeypatch.setenv("HWTRACE_AOT", "numba")
    monkeypatch.setattr(aot, "_library", False)
    assert main(["aot", "status"]) == 0
    assert capsys.readouterr().out == "no library (numba only)\n"
    assert aot.main(["warm"]) == 2
    assert "hwtrace aot warm" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["aot", "bogus"])


def test_every_warm_up_part_decodes(capsys, tmp_path):
    """``hwtrace aot warm`` runs its parts in processes of their own and
    ``make venv`` does not stop on its failure: each part must decode its
    trace (the perf.data part through ``report`` and ``script`` on the
    trace wrapped as a perf.data) without error, in this process; the
    trace it keeps as bytes is what the encoder makes of its loop."""
    from elftools.elf.elffile import ELFFile

    from hwtrace.cli.warmup import (
        AFTER,
        BASE,
        CHAINS,
        CODE,
        CONFIG,
        PIECES,
        TRACE,
        _path,
        _write_elf,
        warm_parts,
    )  # fmt: skip
    from hwtrace.image import Image
    from hwtrace.pt.encode import encode_path

    pieces = [p for chain in CHAINS for p in chain]
    assert sorted(pieces) == sorted(p for part in PIECES.values() for p in part)
    # (a piece waits for one another chain runs before it)
    for piece, before in AFTER.items():
        assert any(before in chain and piece not in chain for chain in CHAINS)
    image = Image()
    code = tmp_path / "code.bin"
    code.write_bytes(CODE)
    image.add_raw(code, address=BASE)
    enc = encode_path(_path(), image, end_ip=0x100E, tsc=1 << 32, mtc_freq=3, cyc=True,
                      psb_period=64)  # fmt: skip
    assert bytes(enc.data) == TRACE and enc.config == CONFIG
    # The perf.data part's program: the loop's code, with its functions.
    _write_elf(tmp_path / "warm")
    elf_image = Image()
    elf_image.add_elf(tmp_path / "warm")
    assert elf_image.read(BASE, len(CODE)) == CODE
    with open(tmp_path / "warm", "rb") as f:
        symbols = ELFFile(f).get_section_by_name(".symtab").iter_symbols()
        assert {(s.name, s["st_value"]) for s in symbols if s.name} == {
            ("warm_loop", BASE),
            ("warm_callee", BASE + 0x10),
        }
    warm_parts(("packets", "subtrees", *(p for p in pieces if p not in ("packets", "subtrees"))))
    assert "Traceback" not in capsys.readouterr().err


def test_early_warm_up_pieces_compile_what_the_commands_call(monkeypatch):
    """The pieces that compile the report's walk and the script's listing
    loops before the decoder is compiled ("walks", "listing") call them
    with the argument types the commands' own pieces do: else the early
    compilation is wasted and the commands compile theirs anyway."""
    from hwtrace.cli.warmup import warm_parts

    loops = {"hwtrace.analysis.latency:walk", "hwtrace.textout.perfscript:_render",
             "hwtrace.session.perftime:_run", "hwtrace.session.perftime:_monotonic_ns"}  # fmt: skip
    seen: dict[str, set] = {}
    layout = aot.CompiledLoop._layout

    def recording(loop, args):
        keys, parts = layout(loop, args)
        if loop.name in loops:
            seen[loop.name].add(keys)
        return keys, parts

    monkeypatch.setattr(aot.CompiledLoop, "_layout", recording)
    calls = []
    for pieces in (("walks", "listing"), ("perfread", "report", "script")):
        seen = {name: set() for name in loops}
        warm_parts(pieces)
        calls.append(seen)
    early, commands = calls
    for name in loops:
        assert commands[name], name
        assert commands[name] <= early[name], name


def test_python_calls_numba_code_without_wrappers(tmp_path):
    """Without the library, Python calls numba's native code through
    ctypes, also when numba loads it from its cache (a second process):
    only a loop returning an array gets wrapped code, cached apart."""
    import subprocess
    import sys

    (tmp_path / "loops_mod.py").write_text(
        "import numpy as np\n"
        "from hwtrace import aot\n\n"
        "@aot.njit(cache=True)\n"
        "def alloc(n):\n    return np.arange(n)\n\n"
        "@aot.njit(cache=True)\n"
        "def add(a, b):\n    return a[0] + b\n"
    )
    code = (
        "import numpy as np, loops_mod\n"
        "print(loops_mod.alloc(3).tolist(), loops_mod.add(np.array([2.5]), 3))\n"
    )
    env = {**__import__("os").environ, "HWTRACE_AOT": "numba",
           "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path)}  # fmt: skip
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "[0, 1, 2] 5.5"
    indexes = sorted(p.name.split("-")[0] for p in (tmp_path / "cache").rglob("*.nbi"))
    assert indexes == ["loops_mod.add", "loops_mod.alloc", "loops_mod.alloc_python"]


def test_cached_loops_follow_the_loops_they_call(tmp_path):
    """A loop numba cached is compiled again when a loop it calls from
    another module changes (numba stamps a cache with its own file only:
    the caller kept the callee's old code)."""
    import os
    import subprocess
    import sys

    package = tmp_path / "stamped_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "callee.py").write_text(
        "from hwtrace import aot\n\n@aot.njit(cache=True)\ndef g(x):\n    return x + 1\n"
    )
    (package / "caller.py").write_text(
        "from hwtrace import aot\nfrom .callee import g\n\n"
        "@aot.njit(cache=True)\ndef f(x):\n    return g(x) * 2\n"
    )
    code = (
        "from stamped_pkg import caller\n"
        "r = caller.f(3)\n"
        "print(r, sum(caller.f.dispatcher.stats.cache_hits.values()))\n"
    )
    env = {**os.environ, "HWTRACE_AOT": "numba", "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(tmp_path)}  # fmt: skip

    def run() -> list[str]:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert run() == ["8", "0"]
    assert run() == ["8", "1"]  # from the cache
    (package / "callee.py").write_text(
        "from hwtrace import aot\n\n@aot.njit(cache=True)\ndef g(x):\n    return x + 10\n"
    )
    assert run() == ["26", "0"]  # compiled again, with the new callee
    assert run() == ["26", "1"]


def test_internal_loops_are_linked_not_emitted(tmp_path):
    """A loop only other loops call (not in its module's ``AOT_ENTRIES``)
    is compiled to bitcode its callers link, without machine code of its
    own: not when compiled, not when numba's cache loads it in another
    process; machine code is made when Python asks for it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import numpy as np, aot_internal_samples as m\n"
        "from numba import types\n"
        "a = np.arange(5, dtype=np.int64)\n"
        "r = m.outer(a)\n"
        "disp = m.inner.dispatcher\n"
        "sig = (types.Array(types.int64, 1, 'C'), types.int64)\n"
        "disp.compile(sig)\n"
        "lib = disp.overloads[sig].library\n"
        "before = lib._emitted\n"
        "print(r, before, m.inner(a, 2), lib._emitted, sum(disp.stats.cache_hits.values()))\n"
    )
    env = {**os.environ, "HWTRACE_AOT": "numba", "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(Path(__file__).parents[1])}  # fmt: skip
    outs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr
        outs.append(out.stdout.split())
    assert outs[0] == ["31", "False", "20", "True", "0"]
    assert outs[1] == ["31", "False", "20", "True", "1"]


def test_warm_up_writes_the_packages_bytecode():
    """``hwtrace aot warm`` writes the bytecode of every module (an
    editable install, or PYTHONDONTWRITEBYTECODE, leaves none), so that
    commands import without compiling sources."""
    import importlib.util
    import os

    import hwtrace.cli.warmup as warmup
    import hwtrace.pt.flowdec as flowdec

    if not os.access(os.path.dirname(flowdec.__file__), os.W_OK):
        pytest.skip("the package is not writable here")
    cached = Path(importlib.util.cache_from_source(flowdec.__file__))
    cached.unlink(missing_ok=True)
    warmup._byte_compile()
    assert cached.is_file()


def test_warm_up_stops_the_other_chain_when_one_fails():
    """A chain's process that fails ends the warm-up: the other may be
    waiting for a piece the failed one was to make, so it is stopped."""
    import subprocess
    import sys

    from hwtrace.cli.warmup import _wait_all

    failing = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    sleeper = (f"from hwtrace.cli.warmup import die_with_parent; die_with_parent({os.getpid()})\n"
               "import time; time.sleep(600)")  # fmt: skip
    waiting = subprocess.Popen([sys.executable, "-c", sleeper])
    assert _wait_all([waiting, failing]) is True
    assert waiting.returncode is not None and failing.returncode == 3
    done = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(2)]
    assert _wait_all(done) is False


def test_warm_up_worker_ends_with_its_parent(tmp_path):
    """A warm-up worker does not outlive the warm-up, however that ends: a
    parent killed at once (SIGKILL, no cleanup of its own) takes its
    worker with it."""
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "worker.pid"
    (tmp_path / "worker.py").write_text(
        "import os, sys, time\n"
        "from hwtrace.cli.warmup import die_with_parent\n"
        "die_with_parent(int(sys.argv[1]))\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    (tmp_path / "parent.py").write_text(
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, {str(tmp_path / 'worker.py')!r}, str(os.getpid())])\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py")])
    worker = None
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline and parent.poll() is None
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 30
        while Path(f"/proc/{worker}").exists() and "zombie" not in _state(worker):
            assert time.monotonic() < deadline, "the worker outlived its parent"
            time.sleep(0.05)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if worker is not None and Path(f"/proc/{worker}").exists():
            os.kill(worker, signal.SIGKILL)  # (the test failed: no sleeper left behind)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]
    except (OSError, IndexError):
        return "zombie"


def test_argument_types_from_one_print_of_the_function_type():
    """The build reads a function's argument types from one print of its
    type: the same strings as printing each argument's type."""
    import llvmlite.binding as ll

    from hwtrace.aot import _argument_types

    mod = ll.parse_assembly(
        "define i32 @f(ptr %a, i64 %b, double %c, { i64, i8 } %d, [2 x i32] %e, "
        "<4 x float> %v, { ptr, { i32, i8 } } %n, i1 %z) { ret i32 0 }\n"
        "define void @g() { ret void }\n"
    )
    for name in ("f", "g"):
        fn = mod.get_function(name)
        assert _argument_types(fn) == [str(a.type) for a in fn.arguments]
    assert len(_argument_types(mod.get_function("f"))) == 8


def test_the_library_drops_arguments_its_inner_functions_never_read():
    """Made internal, a callee loses the arguments it does not read (the
    flow decoder's step functions take hundreds of words of state, of
    which they read a few), and its callers stop passing them; the entry
    keeps its own."""
    import llvmlite.binding as ll

    from hwtrace.aot import _argument_types, _internalize

    ll.initialize_native_target()
    ll.initialize_native_asmprinter()
    mod = ll.parse_assembly(
        "define i64 @inner(i64 %used, i64 %unused1, ptr %unused2) noinline {\n"
        "  %r = add i64 %used, 1\n  ret i64 %r\n}\n"
        "define i64 @entry(i64 %a, i64 %b, ptr %p) {\n"
        "  %r = call i64 @inner(i64 %a, i64 %b, ptr %p)\n  ret i64 %r\n}\n"
    )
    _internalize(mod, {"entry"}, ll)
    assert len(_argument_types(mod.get_function("inner"))) == 1
    assert len(_argument_types(mod.get_function("entry"))) == 3
    assert "call i64 @inner(i64 %a)" in str(mod)


def test_a_child_process_emits_inline_assembly(tmp_path):
    """The library's parts are emitted by child processes too: inline
    assembly (the stepping recorder's ``syscall``) needs LLVM's assembly
    parser there as well."""
    import subprocess
    import sys

    import llvmlite.binding as ll

    ll.initialize_native_target()
    ll.initialize_native_asmprinter()
    mod = ll.parse_assembly(
        "define i64 @ticks() {\n"
        '  %r = call i64 asm sideeffect "rdtsc; shl $$32, %rdx; or %rdx, %rax", '
        '"={rax},~{rdx}"()\n'
        "  ret i64 %r\n"
        "}\n"
    )
    bitcode, obj = tmp_path / "part.bc", tmp_path / "part.o"
    bitcode.write_bytes(mod.as_bitcode())
    code = "import sys; from hwtrace.aot import _emit_main; _emit_main(sys.argv[1], sys.argv[2])"
    run = subprocess.run([sys.executable, "-c", code, str(bitcode), str(obj)],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr[-500:]
    assert obj.stat().st_size > 0


def test_an_array_going_while_the_interpreter_exits_is_forgotten_quietly(monkeypatch):
    """An array laid out for a compiled call and kept in a script's global
    goes while the interpreter exits, after hwtrace.aot's globals are
    cleared: forgetting its laid-out part must not fail ("Exception
    ignored" on stderr, once per array)."""
    import gc
    import sys

    a = np.zeros(4)
    aot._array_part(a)
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    monkeypatch.setattr(aot, "_array_parts", None)  # (as the exit leaves it)
    del a
    gc.collect()
    assert unraisable == []
