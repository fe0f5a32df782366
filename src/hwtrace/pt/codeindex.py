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
from .flowrows import I_DIRECT, CodeTable, find_insn, instructions_of

if TYPE_CHECKING:
    from ..image import Image

# What an instruction does to the call stack: nothing, push its return
# address, pop one, or jump anywhere (an indirect jump: a longjmp unwinds).
K_OTHER, K_CALL, K_RET, K_IJUMP = 0, 1, 2, 3

Reader = Callable[[int, int], bytes]


@aot.njit(cache=True)
def _find_all(ct, ips, mode, out):
    """The table index of each of ``ips`` (-1: not decoded yet)."""
    for i in range(ips.shape[0]):
        out[i] = find_insn(ct, ips[i], mode)


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
        k = np.empty(ips.shape[0], np.int64)
        _find_all(t.tuple, ips, np.uint8(mode), k)
        missing = np.flatnonzero(k < 0)
        if missing.shape[0]:
            for ip in distinct(ips[missing]).tolist():
                if t.lookup(ip, mode) < 0:
                    t.fill(ip, mode)
            again = np.empty(missing.shape[0], np.int64)
            _find_all(t.tuple, ips[missing], np.uint8(mode), again)
            k[missing] = again
        # (each instruction's own row: a flow's ips repeat, but gathers
        # cost less than sorting them to look each up once)
        found = k >= 0
        found[found] = t.i_err[k[found]] == 0  # undecodable: kind other, 0
        kf = k[found]
        cls = t.i_class[kf]
        direct = (t.i_flags[kf] & I_DIRECT) != 0
        kind = np.full(kf.shape[0], K_OTHER, np.uint8)
        kind[(cls == int(IClass.CALL)) | (cls == int(IClass.FAR_CALL))] = K_CALL
        kind[(cls == int(IClass.RETURN)) | (cls == int(IClass.FAR_RETURN))] = K_RET
        kind[((cls == int(IClass.JUMP)) | (cls == int(IClass.FAR_JUMP))) & ~direct] = K_IJUMP
        fall = t.i_ip[kf] + t.i_size[kf].astype(np.uint64)
        jump = direct & (
            (cls == int(IClass.JUMP)) | (cls == int(IClass.CALL)) | (cls == int(IClass.COND_JUMP))
        )
        jump &= t.i_special[kf] != int(Special.JMPABS)
        kinds = np.zeros(ips.shape[0], np.uint8)
        falls = np.zeros(ips.shape[0], np.uint64)
        succs = np.zeros(ips.shape[0], np.uint64)
        kinds[found] = kind
        falls[found] = fall
        succs[found] = np.where(jump, t.i_target[kf], fall)
        return kinds, falls, succs
