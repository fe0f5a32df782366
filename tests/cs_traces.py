"""Generated CoreSight traces the tests share: the paper's one-point ETM
tracer (tracing turns on at &foo, and elsewhere between)."""

from __future__ import annotations

import numpy as np

from hwtrace.hwevents.etm4 import Etm4Config, Etm4Kind, Etm4Packet

K, P = Etm4Kind, Etm4Packet
FOO = 0xFFFF_0000_0040_1000


def one_point_trace(
    cfg: Etm4Config,
    n: int,
    rng: np.random.Generator,
    *,
    foo: int = FOO,
    t0: int = 1000,
    atoms: int = 20,
    context: int = 4242,
    resync_every: int = 0,
) -> tuple[list[Etm4Packet], list[int], int]:
    """From sync: ``n`` trace-ons at ``foo`` (an address packet, ``atoms``
    atoms, a timestamp), each followed by a trace-on at another address;
    an A-sync again every ``resync_every`` (0: never).  Returns the
    packets, the times of the trace-ons at ``foo`` and the last time."""
    head = [P(K.ASYNC), P(K.TRACE_INFO, info=int(cfg.cycle_counting)),
            P(K.CTXT, el=0, context=context, vmid=1)]  # fmt: skip
    pk = list(head)
    times, t = [], t0
    for k in range(n):
        if resync_every and k % resync_every == resync_every - 1:
            pk += head
        t += int(rng.integers(1, 5000))
        pk += [P(K.TRACE_ON), P(K.ADDR, foo),
               P(K.ATOMS, atoms=int(rng.integers(0, 1 << atoms)), natoms=atoms), P(K.TIMESTAMP, ts=t)]  # fmt: skip
        times.append(t)
        t += int(rng.integers(1, 5000))
        other = foo + 0x1000 + 4 * int(rng.integers(0, 1000))
        pk += [P(K.TRACE_ON), P(K.ADDR, other), P(K.ATOMS, atoms=5, natoms=3), P(K.TIMESTAMP, ts=t)]
    return pk, times, t
