"""The Python examples of docs/guides/library.md, run as written on a
recording of the demo program: each gives what its command gives."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "guides" / "library.md"


def examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)


@pytest.fixture(scope="module")
def workdir(recorded, tmp_path_factory):
    _, data, _ = recorded
    d = tmp_path_factory.mktemp("api")
    (d / "perf.data").symlink_to(data)
    return d


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from test_perf_cli import recorded as record

    return record.__wrapped__(tmp_path_factory)


def run_example(code: str, cwd: Path) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def hwtrace(*args: str, cwd: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "hwtrace.cli.main", *args], cwd=cwd,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_page_has_the_three_examples():
    assert len(examples()) == 3


def test_listing_example_prints_what_script_prints(workdir):
    got = run_example(examples()[0], workdir)
    assert got == hwtrace("script", "-i", "perf.data", cwd=workdir)
    assert len(got.splitlines()) > 100


def test_profile_example_counts_what_report_counts(workdir):
    got = run_example(examples()[1], workdir).splitlines()
    report = hwtrace("report", "-i", "perf.data", cwd=workdir)
    total = re.search(r"([\d,]+) instructions decoded", report).group(1)
    assert got[0].endswith(f": {total} instructions")
    functions = [line.split()[0] for line in got[1:-1]]
    assert "demo!digest" in functions and all(f in report for f in functions)
    assert got[-1] == "0 gap(s)"


def test_parquet_example_writes_every_instruction(workdir):
    got = run_example(examples()[2], workdir).splitlines()
    report = hwtrace("report", "-i", "perf.data", cwd=workdir)
    total = int(re.search(r"([\d,]+) instructions decoded", report).group(1).replace(",", ""))
    assert f"'instructions': {total}" in got[0]
    assert got[1] == f"[({total},)]"
