"""Where the patch backend instruments a module's code.

A linear sweep (iced-x86) over the executable sections of one module
classifies every instruction by what Intel PT reports of it; basic-block
leaders (section and function starts, direct branch targets, the
instruction after every control transfer, and the targets of the jump
tables the compiler's ``lea table(%rip); movslq (table,i,4); add; jmp``
idiom reads) bound the *windows*: each instrumented instruction with the
instructions before it in its block, at least 5 bytes, so that a ``jmp
rel32`` can replace them.  Where the block holds too few bytes, the
instruction becomes a *trap* site (``int3``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import iced_x86 as iced
import numpy as np

from ...aot import user_cache_dir

__all__ = [
    "INSTRUMENTED",
    "K_BAD",
    "K_CALL",
    "K_COND",
    "K_FAR",
    "K_ICALL",
    "K_IJMP",
    "K_JMP",
    "K_OTHER",
    "K_RET",
    "K_SYSCALL",
    "CodeMap",
    "sweep",
    "sweep_file",
]

# What Intel PT reports of an instruction.
K_OTHER, K_COND, K_JMP, K_CALL, K_IJMP, K_ICALL, K_RET, K_SYSCALL, K_FAR, K_BAD = range(10)
INSTRUMENTED = (K_COND, K_IJMP, K_ICALL, K_RET, K_SYSCALL)

_STATUS = 0x3F  # iced's RflagsBits: OF, SF, ZF, AF, CF, PF
_F = iced.FlowControl
_M = iced.Mnemonic
_BY_FLOW = {
    _F.NEXT: K_OTHER,
    _F.CONDITIONAL_BRANCH: K_COND,
    _F.UNCONDITIONAL_BRANCH: K_JMP,
    _F.CALL: K_CALL,
    _F.INDIRECT_BRANCH: K_IJMP,
    _F.INDIRECT_CALL: K_ICALL,
    _F.RETURN: K_RET,
    _F.INTERRUPT: K_FAR,
    _F.EXCEPTION: K_FAR,
    _F.XBEGIN_XABORT_XEND: K_FAR,
}
_FAR_MNEMONICS = {_M.RETF, _M.IRET, _M.IRETD, _M.IRETQ, _M.SYSENTER, _M.SYSEXIT, _M.SYSRET,
                  _M.SYSRETQ, _M.HLT}  # fmt: skip


@dataclass
class CodeMap:
    """The instructions of one module's executable code, in address order:
    ``ips``, ``lens``, ``kinds`` (``K_*``), ``targets`` (a direct branch's
    target, else 0), ``rip_disp`` (offset of a RIP-relative displacement in
    the instruction, 0 if none), ``leaders`` (may be a jump target) and
    ``flags`` (which arithmetic flags it reads and writes)."""

    ips: np.ndarray  # uint64
    lens: np.ndarray  # uint8
    kinds: np.ndarray  # uint8
    targets: np.ndarray  # uint64
    rip_disp: np.ndarray  # uint8
    rip_targets: np.ndarray  # uint64: a RIP-relative operand's address, else 0
    leaders: np.ndarray  # bool
    # the arithmetic flags (iced's RflagsBits, OF..PF) read, low byte, and
    # written (set, cleared or left undefined), high byte
    flags: np.ndarray  # uint16

    def __len__(self) -> int:
        return int(self.ips.shape[0])


def sweep(read, sections: list[tuple[int, int]], functions: np.ndarray | None = None) -> CodeMap:
    """Sweep ``sections`` (``(start, end)`` addresses) of code read with
    ``read(address, size)``; ``functions``: addresses known to start
    functions (symbols, unwind tables)."""
    from ._loops import mark_jump_tables, mark_leaders

    ips, lens, kinds, targets, disp, riptgt, flags = [], [], [], [], [], [], []
    starts = []
    for lo, hi in sections:
        data = read(lo, hi - lo)
        starts.append(lo)
        dec = iced.Decoder(64, data, ip=lo)
        # One pass in iced's native decoder; Python sees each instruction
        # once, for the fields kept (cached per module by the caller).
        for ins in dec:
            ips.append(ins.ip)
            lens.append(ins.len)
            if ins.code == iced.Code.INVALID:
                kinds.append(K_BAD)
                targets.append(0)
                disp.append(0)
                riptgt.append(0)
                flags.append(_STATUS)
                continue
            k = _BY_FLOW[ins.flow_control]
            m = ins.mnemonic
            if m == _M.SYSCALL:
                k = K_SYSCALL
            elif (
                m in _FAR_MNEMONICS
                or ins.is_jmp_far
                or ins.is_call_far
                or ins.is_jmp_far_indirect
                or ins.is_call_far_indirect
            ):
                k = K_FAR
            kinds.append(k)
            flags.append((ins.rflags_read & _STATUS) | (ins.rflags_modified & _STATUS) << 8)
            targets.append(ins.near_branch_target if k in (K_COND, K_JMP, K_CALL) else 0)
            if ins.is_ip_rel_memory_operand:
                disp.append(dec.get_constant_offsets(ins).displacement_offset)
                riptgt.append(ins.ip_rel_memory_address)
            else:
                disp.append(0)
                riptgt.append(0)
    cm = CodeMap(
        np.array(ips, np.uint64),
        np.array(lens, np.uint8),
        np.array(kinds, np.uint8),
        np.array(targets, np.uint64),
        np.array(disp, np.uint8),
        np.array(riptgt, np.uint64),
        np.zeros(len(ips), np.bool_),
        np.array(flags, np.uint16),
    )
    extra = np.array(starts, np.uint64)
    if functions is not None and functions.shape[0]:
        extra = np.concatenate([extra, functions.astype(np.uint64)])
    mark_leaders(cm.ips, cm.lens, cm.kinds, cm.targets, np.sort(extra), cm.leaders)
    lo = np.array([s for s, _ in sections], np.uint64)
    hi = np.array([e for _, e in sections], np.uint64)
    mark_jump_tables(
        cm.ips, cm.kinds, cm.rip_targets, cm.leaders, lo, hi, _table_candidates(read, cm)
    )
    return cm


def _table_candidates(read, cm: CodeMap):
    """Reads 4-byte entries of candidate jump tables (RIP-relative ``lea``
    operands outside the code), as one array per candidate: ``(address,
    entries)`` packed into two arrays for the compiled marker."""
    cand = np.unique(cm.rip_targets[(cm.rip_targets != 0) & (cm.kinds == K_OTHER)])
    addrs, blobs = [], []
    for a in cand.tolist():
        raw = read(a, 4 * 512)
        if len(raw) >= 4:
            addrs.append(a)
            blobs.append(np.frombuffer(raw[: len(raw) // 4 * 4], np.int32))
    if not addrs:
        return np.zeros(0, np.uint64), np.zeros(1, np.int64), np.zeros(0, np.int32)
    bounds = np.zeros(len(blobs) + 1, np.int64)
    bounds[1:] = np.cumsum([b.shape[0] for b in blobs])
    return np.array(addrs, np.uint64), bounds, np.concatenate(blobs)


_FIELDS = ("ips", "lens", "kinds", "targets", "rip_disp", "rip_targets", "leaders", "flags")


def sweep_file(
    path: str,
    base: int,
    read,
    sections: list[tuple[int, int]],
    functions: np.ndarray | None,
    identity: str | None = None,
) -> CodeMap:
    """:func:`sweep` of a module mapped from file ``path`` at ``base`` (its
    lowest mapped address), kept in a cache by the file's identity (device,
    inode, size, modification time; or ``identity``, for code no file
    holds, such as the vDSO), the sections' and functions' offsets, this
    module's source and iced-x86's version, so a program's libraries are
    swept once."""
    if identity is None:
        try:
            st = os.stat(path)
        except OSError:
            return sweep(read, sections, functions)
        identity = repr((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    entries = b"" if functions is None else (functions - np.uint64(base)).tobytes()
    key = repr((SOURCE_DIGEST, path, identity, [(lo - base, hi - base) for lo, hi in sections],
                hashlib.sha256(entries).hexdigest()))  # fmt: skip
    name = (
        user_cache_dir() / "patch-sweeps" / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".npz")
    )
    try:
        with np.load(name) as z:
            cm = CodeMap(*(z[f] for f in _FIELDS))
            has_target = z["has_target"]
        cm.ips += np.uint64(base)
        # (Which have one is kept apart: an operand may be the module's
        # first byte, 0 relative to it.)
        cm.targets[has_target] += np.uint64(base)
        cm.rip_targets[cm.rip_disp != 0] += np.uint64(base)
        return cm
    except (OSError, KeyError, ValueError):
        pass
    cm = sweep(read, sections, functions)
    rel = {f: getattr(cm, f).copy() for f in _FIELDS}
    rel["ips"] -= np.uint64(base)
    rel["has_target"] = cm.targets != 0
    rel["targets"][rel["has_target"]] -= np.uint64(base)
    rel["rip_targets"][cm.rip_disp != 0] -= np.uint64(base)
    try:
        name.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=name.parent, suffix=".npz", delete=False) as f:
            np.savez(f, **rel)
        os.replace(f.name, name)
    except OSError:
        pass  # no cache: swept again next time
    return cm


# The sweeping code, its loops and the decoder: a cached sweep is theirs.
SOURCE_DIGEST = hashlib.sha256(
    Path(__file__).read_bytes()
    + (Path(__file__).parent / "_loops.py").read_bytes()
    + importlib.metadata.version("iced-x86").encode()
).hexdigest()[:16]
