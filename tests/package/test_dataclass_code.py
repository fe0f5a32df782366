"""The command's cache of dataclasses' compiled methods
(hwtrace.cli.dataclass_code): classes made with it behave as without it,
a second process compiles nothing, and a damaged or unwritable cache only
costs time.  Each case runs in a fresh process (the cache changes the
dataclasses module of the process it is installed in)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Defines a few kinds of dataclass and prints what they do, and how many
# sources the cache had to compile (compile() counted from here on).
PROGRAM = r"""
import builtins, json, sys
from pathlib import Path
from hwtrace.cli import dataclass_code
compiled = []
real_compile = builtins.compile
def counting(source, *a, **k):
    compiled.append(source)
    return real_compile(source, *a, **k)
builtins.compile = counting
dataclass_code.install(Path(sys.argv[1]))
import dataclasses

@dataclasses.dataclass(frozen=True, order=True)
class Point:
    x: int
    y: int = 2
    tags: tuple = ()

@dataclasses.dataclass
class Box:
    items: list = dataclasses.field(default_factory=list)
    name: str = "box"
    def add(self, v):
        self.items.append(v)

p, q = Point(1), Point(1, 3, ("a",))
b = Box()
b.add(p)
try:
    p.x = 5
    frozen = False
except dataclasses.FrozenInstanceError:
    frozen = True
# exec called the usual way still sees its caller's namespace.
scope = {}
exec("z = 41 + 1", scope)
print(json.dumps({
    "repr": [repr(p), repr(q), repr(b)], "eq": p == Point(1), "lt": p < q,
    "hash": hash(p) == hash(Point(1)), "frozen": frozen, "fields": [f.name for f in dataclasses.fields(q)],
    "default_factory": Box().items == [] and Box().items is not Box().items,
    "exec": scope["z"], "compiled": len(compiled),
}))
"""


def _run(cache: Path, **env: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(cache)],
        capture_output=True, text=True, timeout=120, env={**os.environ, **env},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_same_classes_and_nothing_compiled_the_second_time(tmp_path):
    cache = tmp_path / "code.marshal"
    plain = _run(cache, HWTRACE_NO_CODE_CACHE="1")
    assert not cache.exists()
    first = _run(cache)
    assert cache.exists()
    second = _run(cache)
    for result in (first, second):
        assert {k: v for k, v in result.items() if k != "compiled"} == {
            k: v for k, v in plain.items() if k != "compiled"
        }
    assert plain["repr"][0] == "Point(x=1, y=2, tags=())"
    assert plain["eq"] and plain["lt"] and plain["hash"] and plain["frozen"]
    assert plain["exec"] == 42
    # The first run compiles every method; the second takes them all from the file.
    assert first["compiled"] >= 8
    assert second["compiled"] == 0
    stamp = cache.stat().st_mtime_ns
    _run(cache)
    assert cache.stat().st_mtime_ns == stamp  # nothing new: not written again


def test_damaged_or_unwritable_cache_costs_only_time(tmp_path):
    cache = tmp_path / "code.marshal"
    cache.write_bytes(b"\x00not marshal at all")
    damaged = _run(cache)
    assert damaged["frozen"] and damaged["compiled"] >= 8
    assert _run(cache)["compiled"] == 0  # written again, whole
    blocked = tmp_path / "file" / "code.marshal"
    (tmp_path / "file").write_text("a file where the directory would be")
    assert _run(blocked)["frozen"]


def test_the_command_keeps_its_classes_code(tmp_path):
    env = {**os.environ, "HWTRACE_CACHE_DIR": str(tmp_path)}
    trace = tmp_path / "psb.pt"
    trace.write_bytes(b"\x02\x82" * 8 + b"\x02\x23")  # PSB, PSBEND
    command = [sys.executable, "-m", "hwtrace.cli.main", "ptdump", str(trace)]
    runs = [
        subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        for _ in range(2)
    ]
    assert runs[0].returncode == 0, runs[0].stderr
    assert runs[0].stdout == runs[1].stdout
    assert list(tmp_path.glob("dataclass-code/ptdump.*.marshal"))


def test_code_no_run_uses_ages_out(tmp_path, monkeypatch):
    """The file is written again only when a run compiled something new;
    an entry that no run used in the last KEEP_SAVES writes is dropped
    then (the code of a class that changed, of an older hwtrace), so a
    start does not load it for ever; a file of another form is ignored."""
    import marshal

    from hwtrace.cli import dataclass_code as dc

    path = tmp_path / "code.marshal"
    code = compile("x = 1", "<string>", "exec")
    path.write_bytes(marshal.dumps({"old form": code}))
    assert dc._load(path) == (0, {})
    saves, table = 0, {"kept": (code, 0), "stale": (code, 0)}
    for _ in range(dc.KEEP_SAVES):
        assert "stale" in table
        table[f"new {saves}"] = (code, saves)  # (a run that compiled something)
        dc._save(path, saves, table, {"kept", f"new {saves}"})
        saves, table = dc._load(path)
    assert saves == dc.KEEP_SAVES
    assert "stale" not in table and table["kept"] == (code, saves)
    assert all(f"new {k}" in table for k in range(dc.KEEP_SAVES))
    # Past MAX_ENTRIES the entries used longest ago go first.
    monkeypatch.setattr(dc, "MAX_ENTRIES", 3)
    dc._save(path, saves, table, {"kept"})
    assert set(dc._load(path)[1]) == {
        "kept",
        f"new {dc.KEEP_SAVES - 1}",
        f"new {dc.KEEP_SAVES - 2}",
    }
