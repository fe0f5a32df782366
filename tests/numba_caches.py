"""The numba caches of hwtrace's sources, kept only while they match them.

numba's cache notices edits to a compiled function's own file only, so the
tests drop the caches of every module that depends on a changed file
(:func:`drop_stale`), against the source digests of the last run.
`make` records the digests right after compiling the kernels
(``python tests/numba_caches.py``), so that a fresh checkout's first test
run keeps what the venv's warm-up compiled.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "hwtrace"
STAMP = ROOT / ".pytest_cache" / "numba-source-hashes.json"


def _digests() -> tuple[list[Path], dict[str, str]]:
    files = sorted(SRC.rglob("*.py"))
    return files, {
        str(f.relative_to(SRC)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files
    }


def record() -> None:
    """The caches now match the sources."""
    STAMP.parent.mkdir(exist_ok=True)
    STAMP.write_text(json.dumps(_digests()[1]))


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


def drop_stale() -> None:
    """numba's cache notices edits to a compiled function's own file only,
    not to the files of functions it calls (e.g. filter/native.py's helpers
    inlined into an interpreter): drop the caches of every module that
    imports, directly or not, a source file changed since the last run (or
    since `make` compiled them: :func:`record`)."""
    files, digests = _digests()
    try:
        before = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        before = {}
    src = SRC
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
    record()


if __name__ == "__main__":
    record()
