"""Each call of chosen functions, with everything it runs until it returns,
cut from a decoded flow.

``hwtrace record --call FUNC`` on the software backend traces only the
calls' extents, cut where the stack pointer rises above its value at the
function's entry.  A hardware trace cannot be cut that way when it is
recorded (an address filter traces a function's own range, not what it
calls), so the whole address space is recorded and the flow is cut when it
is decoded, here.  Intel PT carries no stack pointer: the cut follows the
stack through the instructions instead, as a shadow stack of return
addresses per thread (as Linux perf's ``thread-stack.c`` does for call
graphs from PT):

* a CALL pushes its return address, unless the next instruction traced
  is that address (the call went out of the traced code, a library an
  address filter leaves out or code the recorder does not trace, and came
  back: no frame is seen, as the call-path walk has it);
* a RET pops down to the frame of the address it went to, wherever that is
  on the stack (a return past frames skipped);
* a transfer no instruction explains (the next instruction is neither the
  last one's fall-through nor its direct target: a signal handler entered
  by the kernel, or the flow resuming after one) either returns to where
  an earlier such transfer left (``rt_sigreturn``: the handler's frame and
  anything above it are gone) or pushes a mark for the handler; the
  handler's RET into the signal trampoline, an address on no frame,
  returns from the function entered at the mark;
* an indirect jump into the middle of another function (not to its start,
  which is a tail call) unwinds to the innermost frame of that function,
  when one is on the stack (``longjmp``: it jumps to where a call to
  ``setjmp`` returned to, which is no longer on the stack, but its
  function's frame is; a function a signal interrupted counts, for a
  ``longjmp`` out of the handler; with more than ``STACK_DEPTH`` frames on
  the stack it finds only the kept ones);
* an extent opens at the function's entry (reached by a call, a jump from a
  PLT stub or a tail call) and ends with the instruction after which the
  frame the function was entered in has been popped: its RET, its tail
  callee's RET, or the jump of a ``longjmp`` out of it.  Recursion and
  calls of other chosen functions inside stay in the one extent.

The software recorder, which sees the stack pointer, ends a ``longjmp``
out of a call where the stack pointer is restored, a few instructions
before the jump that ends it here; otherwise the two cut the same
instructions.  The state is per trace queue and thread: a flow decoded per
CPU with a thread that migrates in the middle of a call loses the part on
the other CPU.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .. import aot
from ..columns import distinct
from ..pt.codeindex import K_CALL, K_IJUMP, K_RET, CodeIndex

# Return addresses kept per thread; deeper frames are counted, not kept
# (a return into one of them pops one frame).
STACK_DEPTH = 1 << 10


# ``stack_func`` of a mark pushed at an asynchronous transfer is at most
# this: ``_MARK - 1 - f`` for an interruption of function ``f`` (-1:
# unknown).  Its return addresses are where the interrupted instruction may
# go on (fall-through, target), where the flow resumes when the handler is
# done; the function is the one a ``longjmp`` out of the handler may go
# back into.
_MARK = -2


@aot.njit(cache=True, inline="always")
def _frame_func(v):
    """The function a frame returns into (a mark: the one interrupted)."""
    return _MARK - 1 - v if v <= _MARK else v


@aot.njit(cache=True)
def _walk(ips, kinds, falls, succs, funcs, starts, entry, slot, stack, stack_alt, stack_func, sp,
          base, pend, keep):  # fmt: skip
    """Mark in ``keep`` the instructions inside an extent.  Per thread slot:
    the shadow stack (``stack``: return addresses, ``stack_func``: the
    function each returns into, ``stack_alt``: a mark's second address;
    ``sp`` entries, more than its width when frames were only counted), the
    stack depth its extent opened at (``base``, -1: none open) and its last
    instruction's kind, fall-through, function and successor (``pend``: the
    transition it makes is known once the next instruction is).  ``funcs``:
    each instruction's function (-1: none known); ``starts``: whether it is
    the first instruction of its function."""
    width = stack.shape[1]
    for j in range(ips.shape[0]):
        s = slot[j]
        ip = ips[j]
        top = sp[s]
        k = pend[s, 0]
        fall = np.uint64(pend[s, 1])
        if k == K_CALL and ip == fall:
            pass  # went out of the traced code and came back: no frame seen
        elif k == K_CALL:
            if top < width:
                stack[s, top] = fall
                stack_func[s, top] = pend[s, 2]
            top += 1
        elif k == K_RET and top > width:
            top -= 1  # into a frame that was only counted
        elif k == K_RET:
            d = top - 1
            while d >= 0 and (stack[s, d] != ip or stack_func[s, d] <= _MARK):
                d -= 1
            if d >= 0:
                top = d
            elif top > 0 and stack_func[s, top - 1] <= _MARK and base[s] == top:
                base[s] = -1  # the extent's function, entered at the mark, returned
        elif k == K_IJUMP and funcs[j] >= 0 and funcs[j] != pend[s, 2] and not starts[j]:
            d = min(top, width) - 1
            while d >= 0 and _frame_func(stack_func[s, d]) != funcs[j]:
                d -= 1
            if d >= 0:
                top = d
        elif k != K_IJUMP and k >= 0 and ip != fall and ip != np.uint64(pend[s, 3]):
            d = min(top, width) - 1
            while d >= 0 and not (
                stack_func[s, d] <= _MARK and (stack[s, d] == ip or stack_alt[s, d] == ip)
            ):
                d -= 1
            if d >= 0:
                top = d  # back where the handler interrupted
            else:
                if top < width:
                    stack[s, top] = fall
                    stack_alt[s, top] = np.uint64(pend[s, 3])
                    stack_func[s, top] = _MARK - 1 - pend[s, 2]
                top += 1
        sp[s] = top
        if base[s] >= 0 and top < base[s]:
            base[s] = -1  # the frame the call was entered in is gone
        if base[s] < 0 and entry[j]:
            base[s] = top
        keep[j] = base[s] >= 0
        pend[s, 0] = kinds[j]
        pend[s, 1] = np.int64(falls[j])
        pend[s, 2] = funcs[j]
        pend[s, 3] = np.int64(succs[j])


class CallCut:
    """Cuts a flow, given in order piece by piece, to the extents of calls
    of the functions at ``entries`` (the module docstring says how).
    Threads are told apart by a key per instruction (:meth:`keep`)."""

    def __init__(self, depth: int = STACK_DEPTH) -> None:
        self.depth = depth
        self.slots: dict[object, int] = {}
        self.stack = np.zeros((0, depth), np.uint64)
        self.stack_alt = np.zeros((0, depth), np.uint64)
        self.stack_func = np.zeros((0, depth), np.int64)
        self.sp = np.zeros(0, np.int64)
        self.base = np.zeros(0, np.int64)
        # The last instruction's kind (-1: none yet), fall-through, function
        # and successor.
        self.pend = np.zeros((0, 4), np.int64)

    def _slots(self, keys: Iterable[object]) -> list[int]:
        out = []
        for key in keys:
            slot = self.slots.get(key)
            if slot is None:
                slot = self.slots[key] = len(self.slots)
            out.append(slot)
        n = len(self.slots)
        if n > self.sp.shape[0]:
            grow = n - self.sp.shape[0]
            self.stack = np.concatenate([self.stack, np.zeros((grow, self.depth), np.uint64)])
            self.stack_alt = np.concatenate(
                [self.stack_alt, np.zeros((grow, self.depth), np.uint64)]
            )
            self.stack_func = np.concatenate(
                [self.stack_func, np.zeros((grow, self.depth), np.int64)]
            )
            self.sp = np.concatenate([self.sp, np.zeros(grow, np.int64)])
            self.base = np.concatenate([self.base, np.full(grow, -1, np.int64)])
            pend = np.zeros((grow, 4), np.int64)
            pend[:, 0] = -1
            self.pend = np.concatenate([self.pend, pend])
        return out

    def keep(
        self,
        ips: np.ndarray,
        kinds: np.ndarray,
        falls: np.ndarray,
        succs: np.ndarray,
        funcs: np.ndarray,
        starts: np.ndarray,
        entry: np.ndarray,
        thread: np.ndarray,
        thread_keys: list[object],
    ) -> np.ndarray:
        """Which of the instructions ``ips`` (the next piece of the flow,
        with their kinds, fall-through addresses and successors from
        :meth:`~hwtrace.pt.codeindex.CodeIndex.transfers`, the function each
        is in (any number naming it; -1: unknown), whether each starts its
        function, and whether it is a chosen function's entry) run inside
        an extent.  ``thread[j]``
        indexes ``thread_keys``, which name the threads."""
        slots = np.asarray(self._slots(thread_keys), np.int64)
        keep = np.zeros(ips.shape[0], np.bool_)
        if ips.shape[0]:
            _walk(
                np.ascontiguousarray(ips, np.uint64), np.ascontiguousarray(kinds, np.uint8),
                np.ascontiguousarray(falls, np.uint64), np.ascontiguousarray(succs, np.uint64),
                np.ascontiguousarray(funcs, np.int64), np.ascontiguousarray(starts, np.bool_),
                np.ascontiguousarray(entry, np.bool_),
                slots[thread], self.stack, self.stack_alt, self.stack_func, self.sp, self.base,
                self.pend, keep,
            )  # fmt: skip
        return keep


def kept_blocks(ninsn: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stretches of kept instructions of blocks of ``ninsn``
    instructions (``keep``: one flag per instruction, in order): for each
    stretch its block, its first instruction's index and its length.  A
    stretch never spans two blocks."""
    block = np.repeat(np.arange(ninsn.shape[0]), ninsn.astype(np.int64))
    kept = np.flatnonzero(keep)
    if kept.shape[0] == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    starts = np.ones(kept.shape[0], np.bool_)
    starts[1:] = (np.diff(kept) != 1) | (np.diff(block[kept]) != 0)
    first = kept[starts]
    length = np.diff(np.append(np.flatnonzero(starts), kept.shape[0]))
    return block[first], first, length


def entry_flags(ips: np.ndarray, entries: np.ndarray) -> np.ndarray:
    """Whether each address is one of ``entries`` (sorted)."""
    if entries.shape[0] == 0:
        return np.zeros(ips.shape[0], np.bool_)
    k = np.minimum(np.searchsorted(entries, ips), entries.shape[0] - 1)
    return entries[k] == ips


def transfers(
    code: CodeIndex, ips: np.ndarray, mode: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Kind, fall-through address and successor of each instruction
    (``mode``: each one's execution mode)."""
    modes = distinct(mode)
    if modes.shape[0] <= 1:
        return code.transfers(ips, int(modes[0]) if modes.shape[0] else 64)
    kinds = np.zeros(ips.shape[0], np.uint8)
    falls = np.zeros(ips.shape[0], np.uint64)
    succs = np.zeros(ips.shape[0], np.uint64)
    for m in modes.tolist():
        sel = mode == m
        kinds[sel], falls[sel], succs[sel] = code.transfers(ips[sel], int(m))
    return kinds, falls, succs


__all__ = ["STACK_DEPTH", "CallCut", "entry_flags", "kept_blocks", "transfers"]
