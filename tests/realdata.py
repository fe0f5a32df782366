"""Real inputs nobody here made: hardware Intel PT recordings, CoreSight
captures from real boards, and the like.

They are public data of other projects, kept in ``tests/data/real`` with
their projects' licenses so that every checkout runs the tests on them:
the Intel PT recordings (1.3 MB) as they are, of OpenCSD's CoreSight
snapshots the ETMv4, ETE and STM ones without the captured programs'
memory images (3 MB of 40; listing packets does not read them).  A test
asks for one by name (:func:`real_input`); it is looked for, in order:

1. ``$HWTRACE_REAL_DATA/<name>`` (a directory laid out as below, by hand);
2. ``tests/data/real/<name>`` in the checkout;
3. ``../shared/real-data/<name>`` beside the checkout;
4. a local git mirror of the public repository that holds it
   (``$HWTRACE_MIRRORS/<owner>+<repo>/repo``, default ``/work/.mirror``),
   from which the pinned commit's files are extracted once into the user's
   cache directory.

Where none has it, the test skips and says which input and where it looked.
The outputs of the reference tools on these inputs (Intel's ptdump/ptxed
built with XED, whose build is not part of this project) are kept in the
tests as golden files; tools available as Debian packages (OpenCSD's
``trc_pkt_lister``, perf) are run live instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class RealInput:
    """Where a real input comes from: a public repository, a commit of it
    and a path (a file or a directory) in that commit."""

    repos: tuple[str, ...]  # owner/name of the repository and of its forks
    commit: str
    path: str
    licence: str


# Each entry names the data as its project publishes it; licences let the
# data be redistributed, but it is still looked up, not copied in.
REAL_INPUTS: dict[str, RealInput] = {
    # DynamoRIO's drpt2trace test: a raw Intel PT AUX stream of a static
    # "hello" recorded on Skylake-SP with perf sideband (BSD licence).
    "drpt2trace-simple": RealInput(
        ("DynamoRIO/dynamorio",),
        "05e316505beb69586142243af1647449945772b7",
        "clients/drcachesim/drpt2trace/test_simple.raw",
        "BSD-3-Clause",
    ),
    # Earlier versions of the same test, each a different recording: the
    # first one published (one sideband file, a longer trace of a larger
    # static "hello": glibc's start-up and stdio) ...
    "drpt2trace-simple-tracedir": RealInput(
        ("DynamoRIO/dynamorio",),
        "841a2b040095afc113401ace35a9de76d148369b",
        "clients/drcachesim/drpt2trace/test_simple.tracedir",
        "BSD-3-Clause",
    ),
    # ... and the one in the primary/secondary sideband layout before the
    # current one (a longer recording of an earlier build of "hello").
    "drpt2trace-simple-2022": RealInput(
        ("DynamoRIO/dynamorio",),
        "409c4739d9d1d4d06c80c75039f6a16a197b136a",
        "clients/drcachesim/drpt2trace/test_simple.raw",
        "BSD-3-Clause",
    ),
    # quipper's perf.data files recorded with intel_pt by perf 4.14, in file
    # and in pipe mode (BSD licence).
    "quipper-intel_pt": RealInput(
        ("google/perf_data_converter",),
        "e2c2da7494e1c6cb8bb343c1bb3023ee3f37ab38",
        "src/quipper/testdata/perf.data.intel_pt-4.14",
        "BSD-3-Clause",
    ),
    "quipper-intel_pt-piped": RealInput(
        ("google/perf_data_converter",),
        "e2c2da7494e1c6cb8bb343c1bb3023ee3f37ab38",
        "src/quipper/testdata/perf.data.piped.intel_pt-4.14",
        "BSD-3-Clause",
    ),
    # OpenCSD's snapshots captured by DS-5 and other probes on real boards
    # (BSD licence); forks carry the same files.
    "opencsd-snapshots": RealInput(
        ("Linaro/OpenCSD", "awmorgan/OpenCSD"),
        "97f02f9612569d895662114a131a7fdba16e6995",
        "decoder/tests/snapshots",
        "BSD-3-Clause",
    ),
    "opencsd-snapshots-ete": RealInput(
        ("Linaro/OpenCSD", "awmorgan/OpenCSD"),
        "97f02f9612569d895662114a131a7fdba16e6995",
        "decoder/tests/snapshots-ete",
        "BSD-3-Clause",
    ),
}


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hwtrace" / "real-data"


def _mirror_dirs(source: RealInput) -> list[Path]:
    root = Path(os.environ.get("HWTRACE_MIRRORS", "/work/.mirror"))
    return [root / (repo.replace("/", "+")) / "repo" for repo in source.repos]


def _extract(git_dir: Path, source: RealInput, dest: Path) -> bool:
    """The pinned files of ``source`` from ``git_dir`` into ``dest``;
    whether the mirror had them.  Blobs a mirror lacks (some keep no large
    files) are left out: the memory images of a capture are not needed to
    list its packets."""
    listing = subprocess.run(
        ["git", "--git-dir", str(git_dir), "ls-tree", "-r", "-z", source.commit, source.path],
        capture_output=True,
    )
    entries = [e for e in listing.stdout.split(b"\0") if e]
    if listing.returncode != 0 or not entries:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        for entry in entries:
            meta, name = entry.split(b"\t", 1)
            mode, kind, obj = meta.split()
            if kind != b"blob":
                continue
            blob = subprocess.run(
                ["git", "--git-dir", str(git_dir), "cat-file", "blob", obj.decode()],
                capture_output=True,
            )
            if blob.returncode != 0:
                continue
            out = Path(tmp, name.decode())
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(blob.stdout)
            if mode == b"100755":
                out.chmod(0o755)
        Path(tmp, source.path).rename(dest)
    return True


def locate(name: str) -> tuple[Path | None, list[str]]:
    """Where the real input ``name`` is (None if nowhere) and the places
    looked at."""
    source = REAL_INPUTS[name]
    looked: list[str] = []
    explicit = os.environ.get("HWTRACE_REAL_DATA")
    candidates = [Path(explicit) / name] if explicit else []
    candidates.append(ROOT / "tests" / "data" / "real" / name)
    candidates.append(ROOT.parent / "shared" / "real-data" / name)
    for path in candidates:
        looked.append(str(path))
        if path.exists():
            return path, looked
    cached = _cache_root() / f"{name}-{source.commit[:12]}"
    if cached.exists():
        return cached, looked
    for git_dir in _mirror_dirs(source):
        looked.append(f"{git_dir} at {source.commit[:12]}")
        if git_dir.is_dir() and _extract(git_dir, source, cached):
            return cached, looked
    return None, looked


def real_input(name: str) -> Path:
    """The real input ``name`` (a file or a directory); skips the test
    when it is not available here."""
    path, looked = locate(name)
    if path is None:
        source = REAL_INPUTS[name]
        pytest.skip(
            f"real input {name!r} ({source.repos[0]}:{source.path}) not available; "
            f"looked in {', '.join(looked)}"
        )
    return path


def is_elf(path: str) -> bool:
    """Whether ``path`` is a readable ELF file."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def system_binaries(*candidates: str) -> list[str]:
    """The installed ELF files among ``candidates`` (and the running
    Python), each once by its real path: the distribution's own builds,
    which nobody here compiled."""
    paths = dict.fromkeys(os.path.realpath(c) for c in (*candidates, sys.executable))
    return [p for p in paths if is_elf(p)]
