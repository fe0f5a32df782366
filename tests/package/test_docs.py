"""The documentation site builds in strict mode, and its command reference is
what the commands print for ``--help``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the docs tools are in the dev extra")
pytest.importorskip("material", reason="the docs tools are in the dev extra")
pytest.importorskip("mkdocstrings_handlers.python", reason="the docs tools are in the dev extra")

ROOT = Path(__file__).resolve().parents[2]


def _load_hook():
    spec = importlib.util.spec_from_file_location("docs_reference_hook",
                                                  ROOT / "docs/hooks/reference.py")  # fmt: skip
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _load_hook()
COMMANDS = [name for name, _ in reference.commands()]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(out)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_commands_are_the_ones_hwtrace_lists():
    assert {"ptdump", "ptxed", "record", "report", "script", "probe", "trace"} <= set(COMMANDS)
    assert len(COMMANDS) == len(set(COMMANDS))


@pytest.mark.parametrize("command", COMMANDS)
def test_command_reference_is_the_help_text(command):
    env = dict(os.environ, COLUMNS=reference.HELP_COLUMNS, PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([sys.executable, "-m", "hwtrace.cli.main", command, "--help"],
                          capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: hwtrace")
    assert reference.help_text(command) == done.stdout
    # ... and the page shows it line for line (in a block, maybe indented).
    page = reference.command_page(command, "summary").splitlines()
    lines = done.stdout.rstrip("\n").splitlines()
    for shown in (page, [line.removeprefix("    ") for line in page]):
        starts = [i for i, line in enumerate(shown) if line == lines[0]]
        if any(shown[i : i + len(lines)] == lines for i in starts):
            break
    else:
        pytest.fail(f"the {command} page does not show its --help text")


def test_argparse_pages_list_every_option():
    parser = reference.command_parser("record")
    assert parser is not None
    page = reference.command_page("record", "summary")
    for action in parser._actions:
        for option in action.option_strings:
            assert f"`{option}" in page or f", {option}" in page, option


def test_api_reference_walks_the_public_modules():
    modules = reference.api_modules()
    assert "hwtrace" in modules
    assert "hwtrace.pt.decode" in modules
    assert "hwtrace.cli.main" in modules
    assert not [m for m in modules if any(part.startswith("_") for part in m.split("."))]
    on_disk = {p.stem for p in (ROOT / "src/hwtrace/pt").glob("*.py") if not p.stem.startswith("_")}
    assert {m.split(".")[-1] for m in modules if m.startswith("hwtrace.pt.")} == on_disk


def test_sphinx_roles_become_code():
    spec = importlib.util.spec_from_file_location("docs_griffe_roles",
                                                  ROOT / "docs/hooks/griffe_roles.py")  # fmt: skip
    roles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roles)
    text = "See :func:`decode_trace` and :class:`~hwtrace.image.Image`, ``x``."
    assert roles.rewrite_roles(text) == "See `decode_trace` and `Image`, ``x``."


def test_site_has_the_reference_pages(site):
    record = (site / "reference/commands/record/index.html").read_text()
    assert "--psb-period" in record
    ptxed = (site / "reference/commands/ptxed/index.html").read_text()
    assert "--block:show-blocks" in ptxed
    api = (site / "reference/api/hwtrace.pt.decode/index.html").read_text()
    assert "decode_trace" in api and "FlowResult" in api
    assert ":func:" not in api and ":class:" not in api
    for command in COMMANDS:
        assert (site / f"reference/commands/{command}/index.html").exists(), command
