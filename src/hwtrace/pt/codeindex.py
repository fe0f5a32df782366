"""What each executed instruction is, for walking decoded blocks.

A decoder's blocks (:class:`~hwtrace.pt.decode.FlowResult`, the batches of
:class:`~hwtrace.pt.flowdec.FlowDecoder`) give a start address and an
instruction count: the instructions in between follow without trace, each
to the next instruction or, for a direct jump or call, to its target.
:class:`CodeIndex` keeps the instructions of one address space in a code
table (:class:`~hwtrace.pt.flowrows.CodeTable`, the flow decoder's own
format), each decoded once with iced-x86, as blocks and addresses ask for
them.  Blocks are expanded into instruction addresses by the code table's
compiled walk (:func:`~hwtrace.pt.flowrows.instructions_of`), and
instruction addresses classified for call paths (:meth:`CodeIndex.classify`);
only addresses never seen before are decoded, in Python, so a flow of any
length can be walked batch by batch.

The successor rule is the decoder's
(:func:`~hwtrace.pt.flowrows.insn_successor`): a direct JMP or CALL (not
JMPABS, whose target is absolute) goes to its target, everything else falls
through; a block ends at any other transfer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .. import aot
from ..columns import distinct
from ..isa.x86 import IClass, InsnCache, Special
from .codetable import T_I_CLASS, T_I_ERR, T_I_FLAGS, T_I_IP, T_I_SIZE, T_I_SPECIAL, T_I_TARGET
from .flowrows import I_DIRECT, CodeTable, find_insn, instructions_of

if TYPE_CHECKING:
    from ..image import Image

# What an instruction does to the call stack: nothing, push its return
# address, pop one, or jump anywhere (an indirect jump: a longjmp unwinds).
K_OTHER, K_CALL, K_RET, K_IJUMP = 0, 1, 2, 3

Reader = Callable[[int, int], bytes]


_C_CALL, _C_FAR_CALL = int(IClass.CALL), int(IClass.FAR_CALL)
_C_RET, _C_FAR_RET = int(IClass.RETURN), int(IClass.FAR_RETURN)
_C_JUMP, _C_FAR_JUMP, _C_COND = int(IClass.JUMP), int(IClass.FAR_JUMP), int(IClass.COND_JUMP)
_JMPABS = int(Special.JMPABS)


@aot.njit(cache=True)
def _transfers_of(ct, ips, mode, kinds, falls, succs, missing):
    """Kind, fall-through address and successor (see
    :meth:`CodeIndex.transfers`) of each of ``ips`` the table holds, into
    ``kinds``, ``falls``, ``succs`` (0 where no instruction could be
    decoded); the positions of those not decoded yet go to ``missing``,
    whose number it returns."""
    i_ip, i_size, i_class = ct[T_I_IP], ct[T_I_SIZE], ct[T_I_CLASS]
    i_special, i_flags, i_target, i_err = (
        ct[T_I_SPECIAL],
        ct[T_I_FLAGS],
        ct[T_I_TARGET],
        ct[T_I_ERR],
    )
    nm = 0
    for j in range(ips.shape[0]):
        k = find_insn(ct, ips[j], mode)
        if k < 0:
            missing[nm] = j
            nm += 1
            continue
        kind = K_OTHER
        fall = succ = np.uint64(0)
        if i_err[k] == 0:
            c = i_class[k]
            direct = (i_flags[k] & I_DIRECT) != 0
            fall = i_ip[k] + np.uint64(i_size[k])
            succ = fall
            if c == _C_CALL or c == _C_FAR_CALL:
                kind = K_CALL
            elif c == _C_RET or c == _C_FAR_RET:
                kind = K_RET
            elif (c == _C_JUMP or c == _C_FAR_JUMP) and not direct:
                kind = K_IJUMP
            if (
                direct and (c == _C_JUMP or c == _C_CALL or c == _C_COND)
                and i_special[k] != _JMPABS
            ):  # fmt: skip
                succ = i_target[k]
        kinds[j] = kind
        falls[j] = fall
        succs[j] = succ
    return nm


class _Unmapped:
    """An address space known only by its bytes (``read``): the code table
    needs no sections to walk blocks."""

    def __init__(self, read: Reader) -> None:
        self.read = read

    def find(self, ip: int) -> None:
        return None


class CodeIndex:
    """The instructions of one address space (``read(address, size)`` gives
    its bytes, as :meth:`hwtrace.image.Image.read`, or an image whose
    sections the table may decode in compiled code, a run at a time),
    decoded once each as blocks and addresses ask for them (see the module
    doc)."""

    def __init__(self, read: Reader | Image) -> None:
        if callable(read):
            self.cache = InsnCache(read)
            self.table = CodeTable(_Unmapped(read), cache=self.cache)
        else:
            self.cache = InsnCache(read.read)
            self.table = CodeTable(read, cache=self.cache)

    def expand(
        self, block_ip: np.ndarray, block_ninsn: np.ndarray, mode: int | np.ndarray = 64
    ) -> np.ndarray:
        """The address of every instruction of the blocks, in order
        (``mode``: one execution mode, or one per block).  Raises ValueError
        when a block runs into bytes that are no instruction."""
        return instructions_of([self.table], block_ip, block_ninsn, mode, decode_missing=True)

    def classify(self, ips: np.ndarray, mode: int = 64) -> tuple[np.ndarray, np.ndarray]:
        """Kind (:data:`K_OTHER`, :data:`K_CALL`, :data:`K_RET`, :data:`K_IJUMP`) and
        fall-through address of each of ``ips`` (0 where no instruction can
        be decoded), decoding each new address once."""
        kinds, falls, _ = self.transfers(ips, mode)
        return kinds, falls

    def transfers(
        self, ips: np.ndarray, mode: int = 64
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`classify`, and where each instruction goes besides its
        fall-through (its successor: a direct jump's or call's target, a
        conditional jump's when taken, else the fall-through address)."""
        ips = np.ascontiguousarray(ips, np.uint64)
        t = self.table
        n = ips.shape[0]
        kinds, falls, succs = np.empty(n, np.uint8), np.empty(n, np.uint64), np.empty(n, np.uint64)
        missing = np.empty(n, np.int64)
        nm = _transfers_of(t.tuple, ips, np.uint8(mode), kinds, falls, succs, missing)
        if nm:
            # Addresses not decoded yet: each decoded once, then looked up
            # again (an address no instruction can be decoded at stays 0).
            at = missing[:nm]
            for ip in distinct(ips[at]).tolist():
                if t.lookup(ip, mode) < 0:
                    t.fill(ip, mode)
            again = ips[at]
            k, f, g = np.empty(nm, np.uint8), np.empty(nm, np.uint64), np.empty(nm, np.uint64)
            left = np.empty(nm, np.int64)
            n_left = _transfers_of(t.tuple, again, np.uint8(mode), k, f, g, left)
            k[left[:n_left]], f[left[:n_left]], g[left[:n_left]] = 0, 0, 0
            kinds[at], falls[at], succs[at] = k, f, g
        return kinds, falls, succs
