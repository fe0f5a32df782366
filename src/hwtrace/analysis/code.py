"""What each executed instruction is, for walking decoded blocks.

A decoder's blocks (:class:`~hwtrace.pt.decode.FlowResult`, the batches of
:class:`~hwtrace.pt.flowdec.FlowDecoder`) give a start address and an
instruction count: the instructions in between follow without trace, each
to the next instruction or, for a direct jump or call, to its target.
:class:`CodeIndex` keeps, per execution mode, a sorted table of the
instructions seen so far with where each goes that way (its successor),
its fall-through address and its kind (call, return, other), each decoded
once with iced-x86 (:class:`~hwtrace.isa.x86.InsnCache`).  Blocks are
expanded into instruction addresses by a compiled walk over that table
(:meth:`CodeIndex.expand`), and instruction addresses classified for call
paths (:meth:`CodeIndex.classify`); only addresses never seen before are
decoded, in Python, once each, so a flow of any length can be walked batch
by batch.

The successor rule is the decoder's (:mod:`hwtrace.pt.decode`): a direct
JMP or CALL (not JMPABS, whose target is absolute) goes to its target,
everything else falls through; a block ends at any other transfer.
"""

from __future__ import annotations

from collections.abc import Callable

import numba as nb
import numpy as np

from ..isa.x86 import IClass, InsnCache, Special

# What an instruction does to the call stack: nothing, push its return
# address, pop one, or jump anywhere (an indirect jump: a longjmp unwinds).
K_OTHER, K_CALL, K_RET, K_IJUMP = 0, 1, 2, 3

Reader = Callable[[int, int], bytes]


@nb.njit(cache=True)
def _expand(bip, bn, keys, succ, out, missing):
    """Each block's instructions into ``out``; a block that reaches an
    address not in ``keys`` is listed in ``missing`` (its rest left as is).
    Returns how many blocks were missing."""
    j = 0
    nmiss = 0
    for i in range(bip.shape[0]):
        ip = bip[i]
        end = j + bn[i]
        while j < end:
            out[j] = ip
            k = np.searchsorted(keys, ip)
            if k >= keys.shape[0] or keys[k] != ip:
                if j + 1 < end:  # the last instruction's successor is not needed
                    missing[nmiss] = i
                    nmiss += 1
                    j = end
                    break
            else:
                ip = succ[k]
            j += 1
    return nmiss


class _ModeTable:
    """The instructions of one execution mode, sorted by address."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, np.uint64)
        self.succ = np.zeros(0, np.uint64)
        self.fall = np.zeros(0, np.uint64)
        self.kind = np.zeros(0, np.uint8)
        self.new: list[tuple[int, int, int, int]] = []  # (ip, succ, fall, kind) not merged yet

    def merge(self) -> None:
        if not self.new:
            return
        add = np.array(self.new, np.uint64)
        self.new = []
        keys = np.concatenate([self.keys, add[:, 0]])
        keys, first = np.unique(keys, return_index=True)
        self.keys = keys
        self.succ = np.concatenate([self.succ, add[:, 1]])[first]
        self.fall = np.concatenate([self.fall, add[:, 2]])[first]
        self.kind = np.concatenate([self.kind, add[:, 3].astype(np.uint8)])[first]


class CodeIndex:
    """The instructions of one address space (``read(address, size)`` gives
    its bytes, as :meth:`hwtrace.image.Image.read`), decoded once each as
    blocks and addresses ask for them (see the module doc)."""

    def __init__(self, read: Reader) -> None:
        self.cache = InsnCache(read)
        self._tables: dict[int, _ModeTable] = {}

    def _table(self, mode: int) -> _ModeTable:
        t = self._tables.get(mode)
        if t is None:
            t = self._tables[mode] = _ModeTable()
        return t

    def _learn(self, table: _ModeTable, ip: int, mode: int) -> int | None:
        """Decode the instruction at ``ip`` into ``table``; its successor
        (None where no instruction can be decoded)."""
        insn = self.cache.get(ip, mode)
        if isinstance(insn, int):
            return None
        kind = K_OTHER
        if insn.iclass in (IClass.CALL, IClass.FAR_CALL):
            kind = K_CALL
        elif insn.iclass in (IClass.RETURN, IClass.FAR_RETURN):
            kind = K_RET
        elif insn.iclass in (IClass.JUMP, IClass.FAR_JUMP) and not insn.is_direct:
            kind = K_IJUMP
        succ = insn.next_ip
        direct = insn.is_direct and insn.iclass in (IClass.JUMP, IClass.CALL)
        if direct and insn.special != Special.JMPABS:
            succ = (insn.next_ip + insn.displacement) & 0xFFFFFFFFFFFFFFFF
        table.new.append((ip, succ, insn.next_ip, kind))
        return succ

    def expand(
        self, block_ip: np.ndarray, block_ninsn: np.ndarray, mode: int | np.ndarray = 64
    ) -> np.ndarray:
        """The address of every instruction of the blocks, in order
        (``mode``: one execution mode, or one per block).  Raises ValueError
        when a block runs into bytes that are no instruction."""
        bip = np.ascontiguousarray(block_ip, np.uint64)
        bn = np.ascontiguousarray(block_ninsn, np.int64)
        modes = np.broadcast_to(np.asarray(mode), bip.shape)
        kinds = np.unique(modes)
        if kinds.shape[0] <= 1:
            return self._expand_mode(bip, bn, int(kinds[0]) if kinds.shape[0] else 64)
        out = np.empty(int(bn.sum()), np.uint64)
        per_block = np.repeat(modes, bn)
        for m in kinds.tolist():
            sel = modes == m
            out[per_block == m] = self._expand_mode(bip[sel], bn[sel], int(m))
        return out

    def _expand_mode(self, bip: np.ndarray, bn: np.ndarray, mode: int) -> np.ndarray:
        table = self._table(mode)
        out = np.empty(int(bn.sum()), np.uint64)
        missing = np.empty(bip.shape[0], np.int64)
        while True:
            table.merge()
            nmiss = _expand(bip, bn, table.keys, table.succ, out, missing)
            if nmiss == 0:
                return out
            # Walk each block that ran into unknown code (once per distinct
            # block), decoding what is new.
            blocks = {(int(bip[i]), int(bn[i])) for i in missing[:nmiss].tolist()}
            known = table.keys
            for ip, n in blocks:
                for _ in range(n - 1):
                    k = int(np.searchsorted(known, ip))
                    if k < known.shape[0] and int(known[k]) == ip:
                        ip = int(table.succ[k])
                        continue
                    succ = self._learn(table, ip, mode)
                    if succ is None:
                        raise ValueError(
                            f"a block runs into bytes that are no instruction at {ip:#x}"
                        )
                    ip = succ

    def classify(self, ips: np.ndarray, mode: int = 64) -> tuple[np.ndarray, np.ndarray]:
        """Kind (:data:`K_OTHER`, :data:`K_CALL`, :data:`K_RET`, :data:`K_IJUMP`) and
        fall-through address of each of ``ips`` (0 where no instruction can
        be decoded), decoding each new address once."""
        kinds, falls, _ = self.transfers(ips, mode)
        return kinds, falls

    def transfers(
        self, ips: np.ndarray, mode: int = 64
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`classify`, and where each instruction goes without trace
        (its successor: a direct jump's or call's target, else the
        fall-through address)."""
        ips = np.ascontiguousarray(ips, np.uint64)
        table = self._table(mode)
        table.merge()
        uniq, inverse = np.unique(ips, return_inverse=True)
        k = np.searchsorted(table.keys, uniq)
        found = k < table.keys.shape[0]
        found[found] = table.keys[k[found]] == uniq[found]
        if not found.all():
            for ip in uniq[~found].tolist():
                self._learn(table, ip, mode)  # undecodable ones stay unknown: kind other, 0
            table.merge()
            k = np.searchsorted(table.keys, uniq)
            found = k < table.keys.shape[0]
            found[found] = table.keys[k[found]] == uniq[found]
        kinds = np.zeros(uniq.shape[0], np.uint8)
        falls = np.zeros(uniq.shape[0], np.uint64)
        succs = np.zeros(uniq.shape[0], np.uint64)
        kinds[found] = table.kind[k[found]]
        falls[found] = table.fall[k[found]]
        succs[found] = table.succ[k[found]]
        inverse = inverse.reshape(-1)
        return kinds[inverse], falls[inverse], succs[inverse]
