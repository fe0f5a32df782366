import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFORMANCE = ROOT.parent / "shared" / "conformance" / "libipt"
TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
# The tests are grouped by the package they test (tests/pt, tests/perf, ...);
# some share fixtures and helpers across groups (``from test_record_threads
# import stepped``): every group's directory is on the path, whichever runs.
for _group in sorted(TESTS.iterdir()):
    if _group.is_dir() and any(_group.glob("test_*.py")):
        sys.path.insert(1, str(_group))
import numba_caches  # noqa: E402 (found through the path just set)

# Commands run by the tests never build the native loop library on their
# own (tests/package/test_aot.py builds one where it checks it).
os.environ.setdefault("HWTRACE_AOT_AUTOBUILD", "0")


# The files whose tests take longest, with their seconds in a CI run on two
# workers (pytest --durations): pytest-xdist hands out whole files (the
# Makefile's --dist loadfile, without its reordering by test count) in
# collection order, so these go first, longest first, and none of them
# runs alone on one worker at the end of the run.  (An estimate: a file
# missing here only starts later.)
LONG_FILES = {
    "record/test_record_patch.py": 118,
    "pt/test_ptdump_stream.py": 100,
    "hwevents/test_csdump_real.py": 73,
    "analysis/test_vm.py": 52,
    "ktrace/test_kernel_filter.py": 46,
    "package/test_aot.py": 46,
    "filter/test_filter_lttng.py": 46,
    "export/test_views.py": 33,
    "filter/test_ebpf_jit.py": 32,
    "package/test_docs.py": 31,
    "pt/test_ptxed_compiled.py": 29,
    "probes/test_probe_signals.py": 29,
    "cluster/test_cluster.py": 27,
    "filter/test_filter_frontend.py": 25,
    "pt/test_conformance.py": 24,
}


def pytest_collection_modifyitems(items: list) -> None:
    """The long files' tests first (see :data:`LONG_FILES`), each file's
    in its order."""

    def seconds(item) -> int:
        path = Path(str(item.path))
        rel = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else ""
        return -LONG_FILES.get(rel, 0)

    items.sort(key=seconds)


def run_captured(argv: list[str]) -> bytes:
    """``hwtrace ARGV`` in this process; its standard output's bytes
    (captured at the file descriptor, where the compiled writers write)."""
    import tempfile

    from hwtrace.cli.main import main as hwtrace_main

    sys.stdout.flush()
    saved_fd = os.dup(1)
    saved_stdout = sys.stdout
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 1)
        sys.stdout = open(1, "w", closefd=False)
        try:
            try:
                hwtrace_main(argv)
            except SystemExit:
                pass
            sys.stdout.flush()
        finally:
            sys.stdout = saved_stdout
            os.dup2(saved_fd, 1)
            os.close(saved_fd)
        capture.seek(0)
        return capture.read()


@pytest.fixture(scope="session")
def conformance_dir() -> Path:
    if not (CONFORMANCE / "run.py").exists():
        pytest.skip(f"conformance suite not found at {CONFORMANCE}")
    return CONFORMANCE


def copy_of_built_loops(directory: Path) -> Path:
    """``directory`` with a copy of the loop library `make` built, when
    it is up to date, so that a test's ``aot.build(directory)`` adds
    only what it lacks instead of compiling every loop again."""
    import json
    import shutil

    from hwtrace import aot

    directory.mkdir(parents=True, exist_ok=True)
    installed = Path(aot._manifest_path())
    try:
        names = aot._libraries(json.loads(installed.read_text()))
        for name in [installed.name, *names]:
            shutil.copy(installed.parent / name, directory)
    except (OSError, ValueError, KeyError):
        pass  # none yet: built whole
    return directory


# Once per run: by pytest-xdist's controller, before its workers start.
if "PYTEST_XDIST_WORKER" not in os.environ:
    numba_caches.drop_stale()


def pytest_configure(config) -> None:
    """perf's build-id cache in a directory of the run's own (perf's
    ``buildid.dir``, set through a configuration file ``$PERF_CONFIG``
    names, which perf and hwtrace read): the perf runs of the tests copy
    every binary they sample into it (the interpreter's libllvmlite, 170
    MB, in each checkout), which would otherwise fill the user's
    ``~/.debug`` run after run.  Removed at the end."""
    import atexit
    import shutil
    import tempfile

    if os.environ.get("HWTRACE_TEST_BUILDID_DIR"):
        return  # (a worker: the controller's, inherited)
    d = Path(tempfile.mkdtemp(prefix="hwtrace-buildid-"))
    (d / "perfconfig").write_text(f"[buildid]\n\tdir = {d / 'cache'}\n")
    os.environ["PERF_CONFIG"] = str(d / "perfconfig")
    os.environ["HWTRACE_TEST_BUILDID_DIR"] = str(d)
    atexit.register(shutil.rmtree, d, ignore_errors=True)


_WATCHED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGCHLD", "SIGPIPE")


@pytest.fixture(autouse=True)
def _signals_left_as_found():
    """Every test leaves the worker's signal mask and handlers as it found
    them: a child started later inherits both (a SIGINT left blocked or
    ignored outlives the test that did it, in whatever program the next
    test starts)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    handlers = {name: signal.getsignal(getattr(signal, name)) for name in _WATCHED_SIGNALS}
    yield
    changed = []
    after = signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if after != mask:
        changed.append(
            f"signal mask {sorted(s.name for s in mask)} -> {sorted(s.name for s in after)}"
        )
    for name, handler in handlers.items():
        now = signal.getsignal(getattr(signal, name))
        if now is not handler and now != handler:
            changed.append(f"{name} handler {handler!r} -> {now!r}")
            signal.signal(getattr(signal, name), handler)
    if changed:
        pytest.fail("the test changed this process's signals: " + "; ".join(changed))
