"""Kernel code for decoding perf.data: a ``--kcore`` directory, a vmlinux,
kallsyms; and what the user hears when none is given.

The kernel here is the ground-truth program seen at a kernel address (the
"-O2-high" build): its path is known exactly, so decoding against kernel
code from each source must give it back, named by the kernel's symbols.
"""

from __future__ import annotations

import struct
from pathlib import Path

import groundtruth as gt
import numpy as np
import pytest
from elftools.elf.elffile import ELFFile

from hwtrace.cli.main import main
from hwtrace.image import Image
from hwtrace.image.kernelcode import KernelCodeError, from_kcore, from_vmlinux, load_kernel
from hwtrace.perf.data import read_perf_data
from hwtrace.perf.intelpt import sideband_of
from hwtrace.perf.records import Comm, ItraceStart, Mmap, SampleId
from hwtrace.perf.sideband import BinaryLocator
from hwtrace.perf.writer import INTEL_PT_CONFIG_BITS, PerfDataWriter
from hwtrace.pt.encode import encode_path
from hwtrace.session.perfflow import decode_perf

pytestmark = pytest.mark.skipif(gt.skip_reason is not None, reason=str(gt.skip_reason))

PID = 777
MISC_KERNEL = 1


def _exec_segments(elf: Path) -> list[tuple[int, bytes]]:
    with open(elf, "rb") as f:
        return [
            (s["p_vaddr"], s.data())
            for s in ELFFile(f).iter_segments()
            if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1
        ]


def write_kcore(path: Path, segments: list[tuple[int, bytes]]) -> None:
    """An ELF64 core file like /proc/kcore's copy: one PT_LOAD per segment."""
    ehsize, phentsize = 64, 56
    offset = ehsize + phentsize * len(segments)
    headers, blobs = b"", b""
    for vaddr, data in segments:
        headers += struct.pack(
            "<IIQQQQQQ", 1, 5, offset + len(blobs), vaddr, 0, len(data), len(data), 0x1000
        )
        blobs += data
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header = ident + struct.pack(
        "<HHIQQQIHHHHHH", 4, 62, 1, 0, ehsize, 0, 0, ehsize, phentsize, len(segments), 64, 0, 0
    )
    path.write_bytes(header + headers + blobs)


@pytest.fixture(scope="module")
def kernel_run():
    """fib seen at a kernel address: (run, encoded PT, text address)."""
    run = gt.case("fib", "-O2-high")
    image = Image()
    image.add_elf(run.elf, run.load_address)
    enc = encode_path(run.ips, image, end_ip=run.end_ip)
    text = min(v for v, _ in _exec_segments(run.elf)) + run.bias
    return run, enc, text


def _write(path: Path, run: gt.Run, pt: bytes, text: int) -> None:
    """A per-thread recording of kernel code: the kernel MMAP perf writes
    (``[kernel.kallsyms]_text``, pgoff = where _text is), the thread, the PT."""
    bits = INTEL_PT_CONFIG_BITS
    with PerfDataWriter(path) as w:
        w.set_intel_pt(config=bits["pt"] | bits["branch"])
        sid = SampleId(pid=PID, tid=PID)
        w.add_record(
            Mmap(-1, 0, text, 0x200000, text, "[kernel.kallsyms]_text"),
            misc=MISC_KERNEL,
            sample_id=SampleId(pid=-1, tid=0),
        )
        w.add_record(Comm(PID, PID, "kworker"), sample_id=sid)
        w.finished_init()
        w.add_record(ItraceStart(PID, PID), sample_id=sid)
        w.add_auxtrace(pt, tid=PID)
        w.finished_round()


def _kcore_dir(d: Path, run: gt.Run) -> Path:
    d.mkdir(parents=True)
    write_kcore(d / "kcore", [(v + run.bias, data) for v, data in _exec_segments(run.elf)])
    names = sorted((a + run.bias, n) for n, a in gt.symbols(run.elf).items())
    (d / "kallsyms").write_text("".join(f"{a:016x} T {n}\n" for a, n in names))
    return d


def test_kcore_directory(tmp_path, kernel_run):
    run, enc, text = kernel_run
    top = tmp_path / "perf.data"  # perf record --kcore writes a directory
    top.mkdir()
    _write(top / "data", run, enc.data, text)
    _kcore_dir(top / "kcore_dir", run)

    data = read_perf_data(top)
    assert data.kcore_dir == str(top / "kcore_dir")
    kernel = from_kcore(data.kcore_dir)
    flow = decode_perf(data, BinaryLocator(buildid_dirs=()), kernel=kernel)
    assert flow.n_gaps == 0 and not flow.problems, flow.problems
    (q,) = flow.queues
    np.testing.assert_array_equal(q.instructions(), enc.expected)
    blocks = flow.blocks()
    names = flow.symbol_names()
    assert set(blocks["pid"].tolist()) == {PID}
    assert "[kernel.kallsyms]!fib" in names, names


def test_script_finds_the_kcore_dir_itself(tmp_path, kernel_run, capsys):
    run, enc, text = kernel_run
    top = tmp_path / "perf.data"
    top.mkdir()
    _write(top / "data", run, enc.data, text)
    _kcore_dir(top / "kcore_dir", run)
    assert main(["script", "-i", str(top)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(enc.expected)
    assert "kworker" in lines[0] and "fib+0x0 ([kernel.kallsyms])" in lines[0], lines[0]


def test_vmlinux_moved_by_kaslr(tmp_path, kernel_run):
    """The vmlinux is linked low; the MMAP's pgoff says where _text ran."""
    run, enc, text = kernel_run
    path = tmp_path / "pt.data"
    _write(path, run, enc.data, text)
    data = read_perf_data(path)
    at = sideband_of(data).kernel_text_address()
    assert at == text
    kernel = from_vmlinux(run.elf, at)
    flow = decode_perf(data, BinaryLocator(buildid_dirs=()), kernel=kernel)
    assert flow.n_gaps == 0, [str(g) for q in flow.queues for g in q.flow.gaps]
    np.testing.assert_array_equal(flow.queues[0].instructions(), enc.expected)
    flow.blocks()
    assert any(n.endswith("fib") for n in flow.symbol_names())


def test_without_kernel_code(tmp_path, kernel_run, capsys):
    run, enc, text = kernel_run
    path = tmp_path / "pt.data"
    _write(path, run, enc.data, text)
    flow = decode_perf(read_perf_data(path), BinaryLocator(buildid_dirs=()))
    assert flow.n_gaps > 0
    assert any("no kernel code" in p and "--kcore" in p for p in flow.problems), flow.problems

    # kallsyms alone: names, no bytes: still gaps, and said so.
    d = _kcore_dir(tmp_path / "k", run)
    kernel = load_kernel(kallsyms=d / "kallsyms")
    assert kernel is not None and len(kernel.symbols) and not len(kernel.image)
    flow = decode_perf(read_perf_data(path), BinaryLocator(buildid_dirs=()), kernel=kernel)
    assert flow.n_gaps > 0
    assert any("no kernel code" in p for p in flow.problems)

    assert main(["report", "-i", str(path)]) == 0
    out = capsys.readouterr().out
    assert "no kernel code" in out and "gap" in out


def test_bad_kernel_sources(tmp_path, capsys):
    with pytest.raises(KernelCodeError, match="no kcore file"):
        from_kcore(tmp_path)
    junk = tmp_path / "vmlinux"
    junk.write_bytes(b"not an elf")
    with pytest.raises(KernelCodeError, match="vmlinux"):
        from_vmlinux(junk)
    path = tmp_path / "x.data"
    with PerfDataWriter(path) as w:
        w.set_intel_pt(config=INTEL_PT_CONFIG_BITS["pt"])
    assert main(["report", "-i", str(path), "--vmlinux", str(junk)]) == 1
    err = capsys.readouterr().err
    assert "vmlinux" in err and "Traceback" not in err
    # kallsyms copies that name nothing: made without the right to see the
    # addresses (all 0), not kallsyms at all, or with a line past 64 bits
    # (it was a traceback); the good lines of the last still count.
    zeros, text = tmp_path / "zeros", tmp_path / "text"
    zeros.write_text("0000000000000000 T _text\n0000000000000000 t fib\n")
    text.write_text("hello world\n")
    for bad, message in ((zeros, "every address is 0"), (text, "not a kallsyms copy")):
        with pytest.raises(KernelCodeError, match=message):
            load_kernel(kallsyms=bad)
        assert main(["report", "-i", str(path), "--kallsyms", str(bad)]) == 1
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    wide = tmp_path / "wide"
    wide.write_text("1ffffffffffffffff T big\nffffffff81000000 T _text\nffffffff81000000 tT x\n")
    kernel = load_kernel(kallsyms=wide)
    assert kernel is not None and len(kernel.symbols) == 1
