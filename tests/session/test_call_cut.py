"""The decode-time cut of a flow to calls of a function
(:mod:`hwtrace.session.callcut`) against the stack pointer's rule.

Executions of a small model program are generated with the stack pointer
of every instruction: calls, returns, recursion, tail calls through PLT-like
jumps, signal handlers entered without a call and left through a
trampoline, and ``longjmp`` back into a function with a frame on the stack.
The software recorder's rule cuts a call's extent where the stack pointer
rises above its value at the function's entry; the cut, which sees only
the instructions, must keep exactly those instructions, fed in pieces of
any size, with several threads interleaved.
"""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hwtrace.pt.codeindex import K_CALL, K_IJUMP, K_OTHER, K_RET
from hwtrace.session.callcut import CallCut, kept_blocks

# Functions at 0x1000 * (f + 1), 0x100 bytes each; instructions 4 bytes.
N_FUNCS = 5
# Frames the cut keeps (deeper ones are counted): small, to count some.
DEPTH = 8
TRAMPOLINE = 0x9000  # the signal trampoline: not called, not a function


def entry(f: int) -> int:
    return 0x1000 * (f + 1)


def func_of(ip: int) -> int:
    f = ip // 0x1000 - 1
    return f if 0 <= f < N_FUNCS else -1


def execution(choices: list[int]) -> tuple[list[tuple[int, int, int, int]], list[int]]:
    """A run of the model program driven by ``choices``: per instruction
    ``(ip, kind, fall-through, successor)``, and the stack pointer before
    each."""
    insns: list[tuple[int, int, int, int]] = []
    rsps: list[int] = []
    ip, rsp = entry(0), 0x8000
    frames: list[tuple[int, int, int]] = []  # (return address, rsp after it, caller)
    saved: list[tuple[int, int, int]] = []  # signal: (resume ip, rsp, frames depth)
    setjmps: list[tuple[int, int, int]] = []  # (resume ip, rsp, frames depth)

    def step(kind: int, succ: int | None = None) -> None:
        insns.append((ip, kind, ip + 4, ip + 4 if succ is None else succ))
        rsps.append(rsp)

    for c in choices:
        f = func_of(ip)
        op = c % 9
        arg = (c // 9) % N_FUNCS
        if (op == 0 and f + 1 < N_FUNCS) or (op == 1 and f >= 0):  # call a function
            callee = f + 1 if op == 0 else arg
            step(K_CALL, entry(callee))
            frames.append((ip + 4, rsp, f))
            rsp -= 8
            ip = entry(callee)
            if op == 1 and c % 2:
                setjmps.append((ip + 8, rsp, len(frames)))  # a setjmp point in the callee
        elif op == 2 and frames:  # return
            step(K_RET)
            ip, rsp, _ = frames.pop()
            setjmps = [j for j in setjmps if j[2] <= len(frames)]
        elif op == 3 and f >= 0 and not saved:  # a signal: its handler, called by no one
            step(K_OTHER)
            saved.append((ip + 4, rsp, len(frames)))
            rsp -= 256
            frames.append((TRAMPOLINE, rsp + 8, f))  # (a longjmp may go back into f)
            ip = entry(arg)
        elif op == 4 and ip == TRAMPOLINE:  # rt_sigreturn
            step(K_OTHER)
            ip, rsp, depth = saved.pop()
            del frames[depth:]
            setjmps = [j for j in setjmps if j[2] <= len(frames)]
        elif (op == 5 and setjmps and f >= 0 and f != func_of(setjmps[-1][0])
              and len(frames) < DEPTH):  # fmt: skip
            # (Deeper, the frames the cut would search are only counted.)
            # longjmp back into a function with a frame on the stack (and no
            # later run of it above that one, or it would go to the innermost:
            # frames[depth] is the one the setjmp's run pushed).
            target, to_rsp, depth = setjmps.pop()
            if any(caller == func_of(target) for _, _, caller in frames[depth + 1 :]):
                step(K_OTHER)
                ip += 4
                continue
            step(K_IJUMP)
            ip, rsp = target, to_rsp
            del frames[depth:]
        elif op == 6 and f >= 0:  # a tail call through a jump
            # The callee takes the frame over: a setjmp point in it is gone
            # (longjmp to it is undefined, as after a return).
            setjmps = [j for j in setjmps if j[2] < len(frames)]
            to = entry(arg)
            step(K_IJUMP) if c % 2 else step(K_OTHER, to)
            ip = to
        elif ip == TRAMPOLINE:  # waits for rt_sigreturn
            step(K_OTHER, ip)
        elif (ip + 4) % 0x1000 >= 0x100:  # a jump back to the function's start
            step(K_OTHER, entry(f))
            ip = entry(f)
        else:
            step(K_OTHER)
            ip += 4
    return insns, rsps


def by_stack_pointer(insns, rsps, chosen: int) -> np.ndarray:
    """The software recorder's rule: from the chosen function's entry until
    the stack pointer rises above its value there."""
    keep = np.zeros(len(insns), np.bool_)
    top = None
    for j, ((ip, _, _, _), rsp) in enumerate(zip(insns, rsps, strict=True)):
        if top is not None and rsp > top:
            top = None
        if top is None and ip == entry(chosen):
            top = rsp
        keep[j] = top is not None
    return keep


@settings(max_examples=300, deadline=None)
@given(
    runs=st.lists(
        st.lists(st.integers(0, 10_000), min_size=1, max_size=300), min_size=1, max_size=3
    ),
    chosen=st.integers(1, N_FUNCS - 1),
    pieces=st.lists(st.integers(1, 50), min_size=1, max_size=20),
)
# A longjmp out of a signal handler (the chosen function, entered by the
# kernel inside a call of it) back into the function the signal interrupted.
@example(runs=[[0, 1, 192, 698, 0]], chosen=1, pieces=[1])
def test_cut_keeps_what_the_stack_pointer_says(runs, chosen, pieces):
    threads = [execution(choices) for choices in runs]
    want = [by_stack_pointer(insns, rsps, chosen) for insns, rsps in threads]
    # The threads' instructions interleaved round robin, fed in pieces.
    order = [(t, j) for j in range(max(len(i) for i, _ in threads)) for t in range(len(threads))
             if j < len(threads[t][0])]  # fmt: skip
    ips = np.array([threads[t][0][j][0] for t, j in order], np.uint64)
    kinds = np.array([threads[t][0][j][1] for t, j in order], np.uint8)
    falls = np.array([threads[t][0][j][2] for t, j in order], np.uint64)
    succs = np.array([threads[t][0][j][3] for t, j in order], np.uint64)
    funcs = np.array([func_of(int(ip)) for ip in ips], np.int64)
    starts = ips % 0x1000 == 0
    thread = np.array([t for t, _ in order], np.int64)
    entry_flag = ips == entry(chosen)
    cut = CallCut(depth=DEPTH)
    got = np.zeros(len(order), np.bool_)
    at, k = 0, 0
    while at < len(order):
        n = pieces[k % len(pieces)]
        k += 1
        sl = slice(at, at + n)
        got[sl] = cut.keep(ips[sl], kinds[sl], falls[sl], succs[sl], funcs[sl], starts[sl],
                           entry_flag[sl], thread[sl], list(range(len(threads))))  # fmt: skip
        at += n
    for t in range(len(threads)):
        assert np.array_equal(got[thread == t], want[t]), t


def test_kept_stretches_never_span_blocks():
    ninsn = np.array([3, 2, 4], np.int64)
    keep = np.array([0, 1, 1, 1, 1, 1, 0, 0, 1], np.bool_)
    block, first, length = kept_blocks(ninsn, keep)
    assert block.tolist() == [0, 1, 2, 2]
    assert first.tolist() == [1, 3, 5, 8]
    assert length.tolist() == [2, 2, 1, 1]
