"""The event buffers a traced process shares with hwtrace, read on
hwtrace's side (no process needed: the slots are written here as a
trampoline writes them)."""

from __future__ import annotations

from hwtrace.probes.rings import Rings


def _commit(rings: Rings, buffer: int, tscs: list[int], tid: int) -> None:
    """Slots committed in ``buffer`` in this order, as writers leave them."""
    ring, head = rings.slots[buffer], rings.heads[buffer]
    for tsc in tscs:
        n = int(head[0])
        slot = ring[n & (rings.geometry.slots - 1)]
        slot["tsc"], slot["tid"], slot["seq"] = tsc, tid, n + 1
        head[0] = n + 1


def test_drain_orders_a_buffer_a_preempted_writer_left_out_of_order():
    """A writer preempted between its rdtscp and its slot's reservation
    commits after a later time: one buffer alone (the other CPUs' empty)
    comes out in TSC order, as several do."""
    rings = Rings(cpus=2, slots=8)
    try:
        _commit(rings, 0, [100, 300, 200, 400], tid=7)
        ev = rings.drain()
        assert ev["tsc"].tolist() == [100, 200, 300, 400]
        assert ev["seq"].tolist() == [1, 3, 2, 4]
        _commit(rings, 0, [500, 700], tid=7)
        _commit(rings, 1, [600, 550], tid=8)
        ev = rings.drain()
        assert ev["tsc"].tolist() == [500, 550, 600, 700]
        assert rings.lost == 0
    finally:
        rings.close()
