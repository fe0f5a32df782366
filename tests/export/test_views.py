"""The HTML views (hwtrace.export.html) in a real browser: each page opened
in headless Chromium with the network off renders (the script ran to its
end), draws what it should (histogram bars, flame-graph frames, sunburst
arcs, plot lines) and its screenshot is not blank; nothing in a page
refers to anything outside it.  The pages come from real profiles where
cheap (a ground-truth trace through the latency walk)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from hwtrace.export.html import (
    call_tree,
    callpath_page,
    diff_page,
    diff_tree,
    latency_page,
    plots_page,
    write_page,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (Debian: chromium)"
)
_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
    "--no-first-run", "--disable-extensions", "--disable-background-networking",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # the network off: no name resolves
    "--virtual-time-budget=3000", "--window-size=1280,900",
]  # fmt: skip


def browse(page: Path, tmp: Path, anchor: str = "") -> tuple[str, np.ndarray]:
    """The DOM after the page's scripts ran, and its screenshot (RGB)."""
    from PIL import Image

    url = page.resolve().as_uri() + anchor
    profile = ["--user-data-dir=" + str(tmp / "chromium-profile")]
    dom = subprocess.run([CHROMIUM, *_FLAGS, *profile, "--dump-dom", url], capture_output=True,
                         text=True, timeout=120, check=False)  # fmt: skip
    assert dom.returncode == 0, dom.stderr[-2000:]
    shot = tmp / (page.stem + anchor.strip("#") + ".png")
    got = subprocess.run([CHROMIUM, *_FLAGS, *profile, f"--screenshot={shot}", url],
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert got.returncode == 0 and shot.exists(), got.stderr[-2000:]
    return dom.stdout, np.asarray(Image.open(shot).convert("RGB"))


def not_blank(pixels: np.ndarray) -> None:
    """More than a background: many colours, and a good share of the page
    not the background's colour."""
    flat = pixels.reshape(-1, 3)
    colours = np.unique(flat, axis=0).shape[0]
    background = np.bincount(np.ravel_multi_index(flat.T, (256, 256, 256))).argmax()
    share = (np.ravel_multi_index(flat.T, (256, 256, 256)) != background).mean()
    assert colours > 50 and share > 0.05, (colours, share)


def self_contained(text: str) -> None:
    """No element loads anything: no src/href to a URL, no @import or url()."""
    refs = re.findall(r"""(?:src|href)\s*=\s*["']?([^"' >]+)""", text)
    assert not [r for r in refs if not r.startswith("#")], refs
    assert "@import" not in text and "url(" not in text
    assert "<link" not in text


def latency_profile() -> dict:
    """A real profile's JSON: a synthetic raw trace's cli/sti pairs through
    the compiled walk."""
    from hwtrace.analysis.latency import R_PAIR, profile_trace
    from hwtrace.analysis.latency_report import to_json
    from hwtrace.analysis.patterns import PatternSet, parse_sets
    from hwtrace.image import Image
    from hwtrace.pt.encode import encode_path

    # cli; N nops; sti; ret-less loop body, N varying: a spread of ΔIC.
    code, ips = bytearray(), []
    base = 0xFFFFFFFF81000000
    rng = np.random.default_rng(5)
    for n in rng.integers(1, 400, 60).tolist():
        for b in [b"\xfa"] + [b"\x90"] * n + [b"\xfb"]:
            ips.append(base + len(code))
            code += b
    image = Image()
    from hwtrace.image import Section

    image.add_section(Section.from_bytes(bytes(code) + b"\x90", base))
    path = np.array(ips, np.uint64)
    enc = encode_path(path, image, end_ip=base + len(code), tsc=1 << 30, mtc_freq=0,
                      cycles=rng.integers(1, 9, path.shape[0]), cyc=True)  # fmt: skip
    patterns = PatternSet()
    parse_sets(patterns, ["cli"], ["sti"])
    res = profile_trace(enc.data, image, patterns, enc.config, keep=True)
    assert len(res.intervals) == 60

    def name(addr: int) -> str:
        return f"{addr:#x}"

    return to_json(res, name, "TSC ticks", R_PAIR)


def paths() -> list[tuple[list[str], int]]:
    rng = np.random.default_rng(3)
    out = []
    for i in range(120):
        depth = int(rng.integers(1, 9))
        parts = ["prog"] + [f"f{int(rng.integers(0, 4))}_{d}" for d in range(depth)]
        out.append((parts, int(rng.integers(1, 10_000)) * (i % 7 + 1)))
    return out


def test_trees_sum_their_paths():
    rows = paths()
    tree = call_tree(rows)
    assert tree["v"] == sum(w for _, w in rows)

    def check(node):
        kids = sum(k["v"] for k in node["c"])
        assert node["v"] == kids + node["s"]
        for k in node["c"]:
            check(k)

    check(tree)
    d = diff_tree([(p, w, w * 2 if i % 3 else 0) for i, (p, w) in enumerate(rows)])
    assert d["a"] == tree["v"] and d["v"] == max(d["a"], d["b"])


@needs_chromium
def test_views_render_in_a_browser(tmp_path):
    pages = {
        "latency": latency_page(latency_profile(), "latency: cli to sti", "60 intervals"),
        "paths": callpath_page(paths(), "instructions", "report: call paths"),
        "diff": diff_page(
            [(p, w, w * 2 if i % 3 else 0) for i, (p, w) in enumerate(paths())],
            "instructions",
            "diff: A and B",
        ),
        "plots": plots_page(
            [
                {
                    "title": "trace size",
                    "x": "PSB period (bytes)",
                    "y": "bytes per instruction",
                    "logx": True,
                    "logy": False,
                    "series": [
                        {"name": "MTC 3", "points": [[256, 0.9], [1024, 0.5], [4096, 0.4]]},
                        {"name": "CYC", "points": [[256, 1.9], [1024, 1.5], [4096, 1.3]]},
                    ],
                },
                {  # a narrow range: its ticks need more digits to differ
                    "title": "resolution",
                    "x": "CYC threshold",
                    "y": "median Δt (ns)",
                    "logx": False,
                    "logy": True,
                    "series": [{"name": "Δt", "points": [[0, 10.8], [4, 10.8], [6, 12.3]]}],
                },
            ],
            "characterisation",
            facts=[["instructions", "1,000"]],
            table={"title": "settings", "columns": ["setting", "bytes"], "rows": [["a", "1"]]},
        ),
    }
    want = {
        "latency": [(r'class="bar"', 8)],
        "paths": [(r'class="frame', 100)],
        "diff": [(r'class="frame', 100)],
        "plots": [(r'class="series"', 2), (r'class="point"', 6)],
    }
    for name, text in pages.items():
        self_contained(text)
        page = tmp_path / f"{name}.html"
        write_page(page, text)
        dom, pixels = browse(page, tmp_path)
        assert re.search(r'<body[^>]*data-rendered="', dom), name
        for pattern, at_least in want[name]:
            assert len(re.findall(pattern, dom)) >= at_least, (name, pattern)
        not_blank(pixels)
        if name == "plots":
            ticks = re.findall(r'<text[^>]*class="lbl"[^>]*>([^<]*)</text>', dom)
            assert "10.8" in ticks and "12.3" in ticks, ticks
    for name in ("paths", "diff"):  # the sunburst tab, opened from the address
        dom, pixels = browse(tmp_path / f"{name}.html", tmp_path, "#sunburst")
        assert len(re.findall(r'class="arc"', dom)) >= 50, name
        not_blank(pixels)
