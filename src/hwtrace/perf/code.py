"""Code changes a perf.data records, as code revisions and names.

``PERF_RECORD_TEXT_POKE`` (``perf record --kcore -e intel_pt//`` with
``text_poke`` in the attr) carries kernel text's old and new bytes at the
time of the change (jump labels, ftrace, BPF trampolines);
``PERF_RECORD_KSYMBOL`` names kernel code that appears and goes (BPF JIT
images, trampolines), and ``PERF_RECORD_BPF_EVENT`` the program behind
it.  :func:`add_text_pokes` puts the pokes in a
:class:`~hwtrace.image.revisions.CodeRevisions`; :func:`ksymbols` lists
the names with their lifetimes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..image.revisions import CodeRevisions
from .data import PerfData
from .features import Feature
from .records import RecordType

if TYPE_CHECKING:
    from ..kernel.bpf import JitedImage

__all__ = ["KernelSymbol", "add_bpf_images", "add_text_pokes", "bpf_images", "ksymbols"]

KSYM_TYPE_BPF = 1
KSYM_FLAG_UNREGISTER = 1


def _rows(data: PerfData, rtype: int) -> np.ndarray:
    r = data.records
    rows = np.flatnonzero(r["type"] == rtype)
    return rows[np.argsort(r["time"][rows], kind="stable")]


def add_text_pokes(data: PerfData, store: CodeRevisions) -> int:
    """Each TEXT_POKE as a revision of its new bytes from its time (source
    ``text_poke``), and its old bytes as the revision before it where the
    store knows nothing older.  Returns the pokes added."""
    n = 0
    times = data.records["time"]
    for i in _rows(data, RecordType.TEXT_POKE).tolist():
        body = data.record(i).body
        t = int(times[i])
        if body.old and store.at(body.addr, t - 1, size=len(body.old)) is None:
            store.add(body.addr, body.old, -1, "text_poke")
        if body.new:
            store.add(body.addr, body.new, t, "text_poke")
            n += 1
    return n


@dataclass(frozen=True)
class KernelSymbol:
    """Kernel code named from ``start`` (time) to ``end`` (None: still
    there at the end of the recording)."""

    name: str
    address: int
    size: int
    ksym_type: int
    start: int
    end: int | None


def ksymbols(data: PerfData) -> list[KernelSymbol]:
    """KSYMBOL registrations, each with the time it was unregistered."""
    open_: dict[tuple[int, str], tuple[int, int, int]] = {}
    out: list[KernelSymbol] = []
    times = data.records["time"]
    for i in _rows(data, RecordType.KSYMBOL).tolist():
        k = data.record(i).body
        t = int(times[i])
        key = (k.addr, k.name)
        if k.flags & KSYM_FLAG_UNREGISTER:
            started = open_.pop(key, None)
            if started is not None:
                out.append(KernelSymbol(k.name, k.addr, started[1], started[2], started[0], t))
        else:
            open_[key] = (t, k.len, k.ksym_type)
    for (addr, name), (t, size, ktype) in open_.items():
        out.append(KernelSymbol(name, addr, size, ktype, t, None))
    return sorted(out, key=lambda s: (s.start, s.address))


# perf's bpf_prog_info arrays (enum perf_bpil_array) hwtrace reads.
_BPIL_JITED_INSNS, _BPIL_JITED_KSYMS, _BPIL_JITED_FUNC_LENS = 0, 3, 4


def bpf_images(data: PerfData) -> list[JitedImage]:
    """The JIT images of the BPF programs perf saw load while it recorded
    (it reads each one's ``bpf_prog_info`` at its BPF_EVENT and keeps it
    in the BPF_PROG_INFO feature, the arrays' pointers made offsets into
    the data behind it)."""
    from ..kernel.bpf import JitedImage

    out = []
    for entry in data.features.get(Feature.BPF_PROG_INFO) or ():
        info, blob, arrays = entry["info"], entry["data"], entry["arrays"]
        need = (1 << _BPIL_JITED_INSNS) | (1 << _BPIL_JITED_KSYMS) | (1 << _BPIL_JITED_FUNC_LENS)
        if arrays & need != need or len(info) < 128:
            continue
        _, ident, tag, jited_len = struct.unpack_from("<II8sI", info, 0)
        (insns,) = struct.unpack_from("<Q", info, 24)
        name = info[64:80].split(b"\0", 1)[0].decode("utf-8", "replace")
        n_ksyms, n_lens, ksyms, lens = struct.unpack_from("<IIQQ", info, 104)
        if insns + jited_len > len(blob) or ksyms + 8 * n_ksyms > len(blob):
            continue
        if lens + 4 * n_lens > len(blob):
            continue
        out.append(
            JitedImage(
                ident, name, bytes(tag), bytes(blob[insns : insns + jited_len]),
                list(struct.unpack_from(f"<{n_ksyms}Q", blob, ksyms)),
                list(struct.unpack_from(f"<{n_lens}I", blob, lens)),
            )
        )  # fmt: skip
    return out


def add_bpf_images(data: PerfData, store: CodeRevisions) -> int:
    """The JIT images perf kept (:func:`bpf_images`) as code revisions
    (source ``bpf``) from the time each function's KSYMBOL registered it;
    returns how many were added."""
    when = {(k.address, k.name): k.start for k in ksymbols(data)}
    n = 0
    for im in bpf_images(data):
        for k, (addr, code) in enumerate(im.functions()):
            name = im.symbol if k == 0 else f"{im.symbol}_F{k}"
            t = when.get((addr, name))
            if t is not None and code and store.add(addr, code, t, "bpf", name=name):
                n += 1
    return n
