import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFORMANCE = ROOT.parent / "shared" / "conformance" / "libipt"
sys.path.insert(0, str(Path(__file__).resolve().parent))
# Commands run by the tests never build the native kernel library on their
# own (tests/test_kernels.py builds one where it checks it).
os.environ.setdefault("HWTRACE_KERNELS_AUTOBUILD", "0")


@pytest.fixture(scope="session")
def conformance_dir() -> Path:
    if not (CONFORMANCE / "run.py").exists():
        pytest.skip(f"conformance suite not found at {CONFORMANCE}")
    return CONFORMANCE


def copy_of_built_kernels(directory: Path) -> Path:
    """``directory`` with a copy of the kernel library `make` built, when
    it is up to date, so that a test's ``kernels.build(directory)`` adds
    only what it lacks instead of compiling every kernel again."""
    import json
    import shutil

    from hwtrace import kernels

    directory.mkdir(parents=True, exist_ok=True)
    installed = kernels._manifest_path()
    try:
        names = kernels._libraries(json.loads(installed.read_text()))
        for name in [installed.name, *names]:
            shutil.copy(installed.parent / name, directory)
    except (OSError, ValueError, KeyError):
        pass  # none yet: built whole
    return directory


def _module_imports(path: Path, src: Path) -> set[Path]:
    """The hwtrace source files ``path`` imports (statically)."""
    import ast

    pkg = path.parent.relative_to(src.parent).parts  # ("hwtrace", "pt", ...)
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        names: list[tuple[str, ...]] = []
        if isinstance(node, ast.ImportFrom):
            base = pkg[: len(pkg) - node.level + 1] if node.level else ()
            mod = tuple(node.module.split(".")) if node.module else ()
            names = [base + mod + (a.name,) for a in node.names] + [base + mod]
        elif isinstance(node, ast.Import):
            names = [tuple(a.name.split(".")) for a in node.names]
        for parts in names:
            if parts[:1] != ("hwtrace",):
                continue
            target = src.parent.joinpath(*parts)
            for candidate in (target.with_suffix(".py"), target / "__init__.py"):
                if candidate.is_file():
                    found.add(candidate)
    return found


def _drop_stale_numba_caches() -> None:
    """numba's cache notices edits to a compiled function's own file only,
    not to the files of functions it calls (e.g. filter/native.py's helpers
    inlined into an interpreter): drop the caches of every module that
    imports, directly or not, a source file changed since the last run."""
    import hashlib
    import json

    src = ROOT / "src" / "hwtrace"
    files = sorted(src.rglob("*.py"))
    digests = {str(f.relative_to(src)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    stamp = ROOT / ".pytest_cache" / "numba-source-hashes.json"
    try:
        before = json.loads(stamp.read_text())
    except (OSError, ValueError):
        before = {}
    changed = {src / name for name, d in digests.items() if before.get(name) != d}
    if not changed:
        return
    imports = {f: _module_imports(f, src) for f in files}
    stale = set(changed)
    grew = True
    while grew:  # everything that imports a stale file is stale
        grew = False
        for f, deps in imports.items():
            if f not in stale and deps & stale:
                stale.add(f)
                grew = True
    for f in stale:
        for pattern in (f"{f.stem}.*.nbi", f"{f.stem}.*.nbc"):
            for cache in (f.parent / "__pycache__").glob(pattern):
                cache.unlink(missing_ok=True)
    stamp.parent.mkdir(exist_ok=True)
    stamp.write_text(json.dumps(digests))


_drop_stale_numba_caches()
