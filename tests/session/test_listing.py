"""hwtrace script's compiled listing equals the plain Python formatting."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.textout.perfscript import ListingWriter, render_lines


class _Table:
    """A stand-in for a code table (the writer keeps its text by a weak
    reference to the table)."""


def _python(comms, comm, tid, ns, ip, names, modules, sym, off, ninsn, plain, usec=False):
    """perf script's ``%16s %5d %5lu.%09llu:  %16lx sym+0xoff (dso)``
    (``usec``: ``%5lu.%06lu``, perf's without --ns)."""
    lines = []
    for j in range(ip.shape[0]):
        if usec:
            stamp = (
                f"{ns[j] // 10**9:5d}.{ns[j] % 10**9 // 1000:06d}" if ns[j] >= 0 else f"{'-':>12}"
            )
        else:
            stamp = f"{ns[j] // 10**9:5d}.{ns[j] % 10**9:09d}" if ns[j] >= 0 else f"{'-':>15}"
        s = sym[j]
        if s < 0:
            label = "[unknown] ([unknown])"
        else:
            plus = "" if plain[s] else f"+{int(off[j]):#x}"
            label = f"{names[s]}{plus} ({modules[s]})"
        extra = f" {int(ninsn[j])} insns" if ninsn is not None else ""
        lines.append(
            f"{comms[comm[j]][:16]:>16} {int(tid[j]):5d} {stamp}:  {int(ip[j]):16x} {label}{extra}\n"
        )
    return "".join(lines)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 40),
    blocks=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    chunk=st.sampled_from([1, 200, 1 << 22]),
    usec=st.booleans(),
)
def test_listing_matches_python(n, blocks, seed, chunk, usec):
    rng = np.random.default_rng(seed)
    comms = ["demo", "a-very-long-command-name", "?", ""]
    names = ["main", "checksum", "_ZN3foo3barEv", "x" * 70]
    modules = ["demo", "libc.so.6", "[kernel.kallsyms]", "m"]
    comm = rng.integers(0, len(comms), n)
    tid = rng.choice([-1, 0, 7, 1234567, 99999999], n)
    ns = rng.choice([-1, 0, 5, 10**9, 1321504164994, 1321504999999, 2**62], n)
    ip = rng.choice(np.array([0, 0x401000, 0xFFFFFFFF81000000, 2**64 - 1], np.uint64), n)
    sym = rng.integers(-1, len(names), n)
    off = rng.choice([0, 1, 0x17, 0xFFFF], n)
    ninsn = rng.integers(1, 5000, n) if blocks else None
    plain = rng.integers(0, 2, len(names)).astype(np.uint8)
    got = b"".join(
        render_lines(
            comms,
            comm,
            tid,
            ns,
            ip,
            names,
            modules,
            sym,
            off,
            ninsn,
            plain=plain,
            chunk=chunk,
            usec=usec,
        )
    ).decode()
    assert got == _python(comms, comm, tid, ns, ip, names, modules, sym, off, ninsn, plain, usec)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 300),
    seed=st.integers(0, 2**32 - 1),
    pool=st.sampled_from([0, 300, 600, 1 << 16]),
)
def test_lines_by_code_row_are_the_lines(n, seed, pool):
    """With each line's code-table row given, an instruction's address and
    name are formatted once per row and copied after (until the row text's
    pool is full, then formatted again): the same text, also across calls."""
    rng = np.random.default_rng(seed)
    rows = 12
    names = ["main", "checksum", "y" * 90]
    modules = ["demo", "/usr/lib/x86_64-linux-gnu/libc.so.6", "[vdso]"]
    plain = np.array([0, 1, 0], np.uint8)
    row_ip = rng.choice(np.array([0x401000, 0xFFFFFFFF81000000, 7], np.uint64), rows)
    row_sym = rng.integers(-1, len(names), rows)
    row_off = rng.choice([0, 0x17, 0xFFFF], rows)
    code_row = rng.integers(0, rows, n)
    comm = np.zeros(n, np.int64)
    tid = np.full(n, 42)
    ns = np.sort(rng.choice([-1, 5, 10**9 + 7], n))
    cols = (["demo"], comm, tid, ns, row_ip[code_row], names, modules, row_sym[code_row],
            row_off[code_row])  # fmt: skip
    want = b"".join(render_lines(*cols, plain=plain)).decode()
    writer = ListingWriter(None, chunk=97, row_text_bytes=pool)  # type: ignore[arg-type]
    code = _Table()  # the table the rows are of
    half = n // 2
    got = []
    for lo, hi in ((0, half), (half, n)):
        part = tuple(c[lo:hi] if isinstance(c, np.ndarray) else c for c in cols)
        got += [bytes(v) for v in writer.views(*part, None, None, None, plain, code_row[lo:hi],
                                               code)]  # fmt: skip
    assert b"".join(got).decode() == want
