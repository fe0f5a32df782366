"""What a tracepoint puts where: the pure part of placing one, with no
process involved, so that it can be checked in an emulator byte for byte.

:func:`choose_window` decides between a jump (covering the instructions
of at least 5 bytes at the site) and a trap (``int3`` over the first
instruction); :func:`lay_out` builds, for a trampoline address, the
trampoline's code, the bytes to patch at the site and the trap redirects.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import codegen as cg
from .alloc import CHUNK_CODE, constraint
from .relocate import RelocationError, Window, decode_window, relocate

__all__ = ["JUMP", "TRAP", "Layout", "choose_window", "counter_address", "data_reach",
           "lay_out", "trampoline_size"]  # fmt: skip

JUMP = "jump"
TRAP = "trap"


@dataclass(frozen=True)
class Layout:
    """One tracepoint's bytes: ``code`` at ``trampoline``; ``patched``
    replaces ``original`` at ``site``; a trap at each ``redirects`` source
    goes to its destination."""

    site: int
    kind: str
    window: Window
    trampoline: int
    code: bytes
    counter: int
    original: bytes
    patched: bytes
    redirects: tuple[tuple[int, int], ...]

    @property
    def starts(self) -> tuple[int, ...]:
        """Offsets from the site of the instruction starts the patch covers."""
        return tuple(self.window.starts) if self.kind == JUMP else (0,)


def choose_window(
    code: bytes, site: int, limit: int = 0, kind: str | None = None
) -> tuple[Window, str, str]:
    """``(window, kind, note)`` for a tracepoint at ``site`` whose bytes
    start ``code``; ``limit`` is where the jump must not run past (the end
    of the code), ``kind`` forces :data:`TRAP`.  ``note`` says why a jump
    was not possible.  Raises :class:`RelocationError` when not even the
    first instruction can be moved (an ``int3`` of someone else's there)."""
    note = ""
    if kind != TRAP:
        try:
            window = decode_window(code, site, 5)
            relocate(window, site)  # e.g. a branch into the middle of a covered instruction
        except RelocationError as e:
            note = str(e)
        else:
            if limit and site + window.length > limit:
                note = f"{site:#x}: a jump would run past the end of the code"
            else:
                return window, JUMP, ""
    return decode_window(code, site, 1), TRAP, note


def data_reach(window: Window) -> tuple[int, int]:
    """Where the trampoline may be for the window's RIP-relative data
    operands to stay within reach (a rel32 displacement) of their targets:
    ``[lo, hi)``, with a margin for the trampoline's own size."""
    lo, hi = 0, 1 << 64
    margin = 1 << 16
    for ins in window.instructions:
        if ins.is_ip_rel_memory_operand:
            target = ins.ip_rel_memory_address
            lo = max(lo, target - (1 << 31) + margin)
            hi = min(hi, target + (1 << 31) - margin)
    return lo, hi


def counter_address(trampoline: int) -> int:
    """The hit counter of the trampoline at ``trampoline``: 8-byte aligned
    (``lock inc`` must not split a cache line) in the chunk's data mirror."""
    return ((trampoline + 7) & ~7) + CHUNK_CODE


RETURNS_SIZE = 400  # the return hook and the exit stub's own code, an upper bound


def trampoline_size(
    window: Window, event: cg.EventSpec | None = None, returns: bool = False
) -> int:
    """Bytes to reserve for the trampoline of ``window``."""
    guess = relocate(window, window.address - (1 << 30))  # sizes barely depend on the place
    head = cg.EVENT_HEADER_SIZE if event else cg.HEADER_SIZE
    extra = RETURNS_SIZE + head if returns else 0
    return (head + len(guess.code) + 5 + 16 + extra + 7) & ~7


EXIT_REGS = ("rax", "rdx", "rsp", "rip")  # what an exit event records: the return value


def lay_out(
    window: Window,
    kind: str,
    trampoline: int,
    event: cg.EventSpec | None = None,
    returns: int = 0,
) -> Layout:
    """The bytes of a tracepoint with its trampoline at ``trampoline``
    (which must meet the window's constraint for a jump); ``event`` makes a
    hit write an event besides counting; ``returns`` (the thread table's
    address) makes it an entry tracepoint that also catches the function's
    return (counted at ``counter + 8``)."""
    site = window.address
    counter = counter_address(trampoline)
    if event is None:
        head = cg.counting_header(trampoline, counter)
    else:
        head = cg.event_header(trampoline, counter, event, site)
    if returns:
        # The hook's size does not depend on where the exit stub is.
        hook_len = len(cg.return_hook(trampoline + len(head), returns, trampoline))
        probe = relocate(window, trampoline + len(head) + hook_len)
        entry_len = len(head) + hook_len + len(probe.code) + (5 if probe.falls_through else 0)
        exit_at = (trampoline + entry_len + 7) & ~7
        head += cg.return_hook(trampoline + len(head), returns, exit_at)
    body = relocate(window, trampoline + len(head))
    back = site + window.length if body.falls_through else None
    code = cg.trampoline(trampoline, head, body, back)
    if returns:
        assert trampoline + len(code) <= exit_at
        code += b"\xcc" * (exit_at - trampoline - len(code))
        if event is None:
            exit_head = cg.counting_header(exit_at + 1, counter + cg.EXIT_COUNTER)
        else:
            spec = replace(event, kind=1, regs=EXIT_REGS)
            exit_head = cg.event_header(exit_at + 1, counter + cg.EXIT_COUNTER, spec, site)
        code += cg.exit_stub(exit_at, returns, exit_head)
    redirects = [(site, trampoline)]  # the site traps while it is being patched
    if kind == JUMP:
        mask, pat = constraint(window.starts)
        rel = (trampoline - (site + 5)) & 0xFFFFFFFF
        if rel & mask != pat or not -(1 << 31) <= trampoline - (site + 5) < 1 << 31:
            raise ValueError(f"{trampoline:#x} does not meet the constraint of {site:#x}")
        for p in window.starts[1:]:
            redirects.append((site + p, body.starts[site + p]))
        original = window.code[:5]
        patched = cg.jump_bytes(site, trampoline)
    else:
        original = window.code[:1]
        patched = b"\xcc"
    return Layout(site, kind, window, trampoline, code, counter, original, patched,
                  tuple(redirects))  # fmt: skip
