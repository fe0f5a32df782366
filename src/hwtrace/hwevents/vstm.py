"""The consumer side of hwtrace's virtual STM + ETB (``hwtrace_stm.h``), and
a model of the ETB's loss and stall behaviour.

Vergé et al., "Hardware-assisted software event tracing" (2017), trace
software events with a CoreSight STM: the producer stores its payload into
its own STM channel, the hardware timestamps it and sends MIPI STPv2
packets into a small fixed-size Embedded Trace Buffer (ETB), which a
consumer drains, decodes and stores.  When the ETB fills, their STM design
makes the producer stop and yield to the consumer (a shared usage counter
and semaphores); ETM + ETB instead lost events (above about 1e5 events/s).

:class:`VirtualStm` is that ETB in software: a shared-memory file (a header
page, then a byte ring of ``size`` bytes, 4 KiB by default like real ETBs)
that C programs including ``hwtrace_stm.h`` find through ``HWTRACE_STM``
(:meth:`~VirtualStm.env`).  They write the STPv2 packets an STM would
(ARM CoreSight STM-500 TRM; MIPI STP v2.x spec: M8 per process, C8/C16
per thread, D8..D64 per value, the last one marked and timestamped), with
policy ``"stall"`` (wait for the consumer, nothing lost) or ``"drop"``
(drop the event whole and count it).  :meth:`~VirtualStm.drain` takes the
committed bytes in stream order and frees the ring; the drained bytes
concatenate into one STPv2 stream (ASYNC and VERSION at its start, never
cut), decoded by :mod:`hwtrace.hwevents.stp` (:meth:`~VirtualStm.events`).

Header layout (little-endian; the C struct ``hwtrace_stm_header``):
magic at 0, size/policy (u32) at 8, slots/header_size at 16, masters at
24, claimed slots at 32, channel_base/closed at 40, the stream state
(position (40 bits) | channel << 40 | master << 56; last timestamp) at 64,
commit at 128, tail at 192, futex words wake/waiters/full/csleep at
200..212; per-thread slots of 64 bytes from 512 (events, dropped, stalls,
stall_ns, tid, pid, master/channel).  Positions count bytes modulo 2^40.

:func:`simulate_etb` models the same ring event by event (numba) to
explain the measured loss and stall as the rate and ETB size vary.
"""

from __future__ import annotations

import ctypes
import struct
import threading
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from hwtrace.hwevents._shm import SharedFile
from hwtrace.hwevents.stp import StpEvents, decode_stp, stp_events

__all__ = ["ASYNC_VERSION", "VirtualStm", "decode_events", "header_path", "simulate_etb"]

MAGIC = 0x314D545352545748  # "HWTRSTM1"
POS_MASK = (1 << 40) - 1
# ASYNC (21 F nibbles then 0), VERSION 3 (F 0 0 3): the stream's start.
ASYNC_VERSION = b"\xff" * 10 + b"\x0f" + b"\x0f\x30"
_POLICIES = {"stall": 0, "drop": 1}
_SLOT = 64
_SLOTS_AT = 512
_SYS_FUTEX = 202  # x86-64
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1


def header_path() -> Path:
    """Where ``hwtrace_stm.h`` is (for ``-I``)."""
    return Path(str(resources.files(__package__).joinpath("hwtrace_stm.h")))


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class VirtualStm(SharedFile):
    """An ETB of ``size`` bytes (a power of two, at least 256) with policy
    ``"stall"`` or ``"drop"``, for up to ``slots`` threads (channels
    ``channel_base`` + their order of arrival), in a file under
    ``directory`` (/dev/shm when there is one), removed by :meth:`close`.
    Drained bytes are kept in :attr:`stream` unless ``keep`` is false."""

    def __init__(self, size: int = 4096, policy: str = "stall", *, slots: int = 64,
                 channel_base: int = 0, keep: bool = True, directory: str | None = None) -> None:  # fmt: skip
        if size < 256 or size & (size - 1) or size > 1 << 32:
            raise ValueError("size: a power of two from 256 bytes to 4 GiB")
        if policy not in _POLICIES:
            raise ValueError(f"policy: one of {sorted(_POLICIES)}")
        if not 1 <= slots <= 4096 or not 0 <= channel_base <= 0xFFFF:
            raise ValueError("slots: 1..4096; channel_base: 0..65535")
        self.size, self.policy, self.slots, self.keep = size, policy, slots, keep
        self.header_size = -(-(_SLOTS_AT + _SLOT * slots) // 4096) * 4096
        super().__init__(self.header_size + size, "hwtrace-stm-", directory)
        m = self.map
        struct.pack_into("<QIIII", m, 0, MAGIC, size, _POLICIES[policy], slots, self.header_size)
        struct.pack_into("<I", m, 40, channel_base)
        start = len(ASYNC_VERSION)
        m[self.header_size : self.header_size + start] = ASYNC_VERSION
        struct.pack_into(
            "<QQ", m, 64, start, 0
        )  # position, master 0 channel 0 (after VERSION), ts 0
        struct.pack_into("<Q", m, 128, start)  # committed
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(m))
        self._ring = memoryview(m)[self.header_size :]
        self._tail = 0
        self._seq = 0
        self._stall = policy == "stall"
        self.stream = bytearray()
        self.drained = 0  # bytes taken so far
        self.drains = 0  # drain calls that took bytes
        self.drain_s = 0.0  # time spent in those calls
        self.sleeps: list[float] = []  # the consumer thread's full sleeps
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # -- producer side, as the header sees it --------------------------------
    def env(self) -> dict[str, str]:
        """The environment a producer needs."""
        return {"HWTRACE_STM": self.path}

    def _u64(self, off: int) -> int:
        return struct.unpack_from("<Q", self.map, off)[0]

    def _u32(self, off: int) -> int:
        return struct.unpack_from("<I", self.map, off)[0]

    @property
    def claimed(self) -> int:
        return min(self._u64(32), self.slots)

    def threads(self) -> dict[int, dict[str, int]]:
        """Per channel: tid, pid, master and the thread's counters."""
        out = {}
        for k in range(self.claimed):
            at = _SLOTS_AT + _SLOT * k
            ev, dr, st, sn, tid, pid, master, chan = struct.unpack_from("<6Q2I", self.map, at)
            out[chan] = {"tid": tid, "pid": pid, "master": master, "events": ev, "dropped": dr,
                         "stalls": st, "stall_ns": sn}  # fmt: skip
        return out

    def _total(self, key: str) -> int:
        return sum(t[key] for t in self.threads().values())

    @property
    def written(self) -> int:
        """Events written into the ETB (``counters()["events"]``)."""
        return self._total("events")

    @property
    def dropped(self) -> int:
        """Events dropped because the ETB was full (drop policy)."""
        return self._total("dropped")

    @property
    def stalls(self) -> int:
        """Events whose producer had to wait for room (stall policy)."""
        return self._total("stalls")

    @property
    def stall_ns(self) -> int:
        """Nanoseconds producers spent waiting for room."""
        return self._total("stall_ns")

    def used(self) -> int:
        """Bytes committed and not yet drained."""
        return (self._u64(128) - self._tail) & POS_MASK

    # -- consumer --------------------------------------------------------------
    def drain(self, sink: Any = None) -> bytes:
        """Take every committed byte, in stream order, and free the ring;
        returns them (also appended to :attr:`stream` when kept, and given
        to ``sink(bytes)`` if there is one).  Wakes producers waiting for
        room."""
        t0 = time.perf_counter()
        self._seq = self._u32(208)  # stall signals seen so far (for wait)
        commit = self._u64(128)
        n = (commit - self._tail) & POS_MASK
        if not n:
            return b""
        at = self._tail & (self.size - 1)
        if at + n <= self.size:
            data = bytes(self._ring[at : at + n])
        else:
            data = bytes(self._ring[at:]) + bytes(self._ring[: at + n - self.size])
        self._tail = commit
        struct.pack_into("<Q", self.map, 192, commit)  # free the bytes
        if self._stall:
            # Wake producers waiting for room.  Unconditional: the futex
            # call orders this store before any waiter's check (a waiter
            # that read the old word is woken or sees the new one).
            struct.pack_into("<I", self.map, 200, (self._u32(200) + 1) & 0xFFFFFFFF)
            _syscall(
                _SYS_FUTEX,
                ctypes.c_void_p(self._base + 200),
                _FUTEX_WAKE,
                0x7FFFFFFF,
                None,
                None,
                0,
            )
        if self.keep:
            self.stream += data
        if sink is not None:
            sink(data)
        self.drained += n
        self.drains += 1
        self.drain_s += time.perf_counter() - t0
        return data

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, or until a producer finds the ETB
        full (stall policy: the producer yields to the consumer), counting
        from the last :meth:`drain`'s start: a producer that stalled since
        then makes this return at once.  True if a producer asked."""
        seq = self._seq
        struct.pack_into("<I", self.map, 212, 1)
        ts = _Timespec(int(timeout), int((timeout % 1) * 1e9))
        _syscall(
            _SYS_FUTEX,
            ctypes.c_void_p(self._base + 208),
            _FUTEX_WAIT,
            seq,
            ctypes.byref(ts),
            None,
            0,
        )
        struct.pack_into("<I", self.map, 212, 0)
        return self._u32(208) != seq

    def start(self, period_s: float = 1e-3, sink: Any = None) -> None:
        """Drain in a thread: every ``period_s`` seconds, and at once when a
        stalled producer asks; :meth:`stop` ends it (after a last drain).
        The sleeps that ran their course, as long as they really took, are
        kept in :attr:`sleeps` (seconds)."""
        if self._thread is not None:
            raise RuntimeError("the consumer is already running")
        self._stop.clear()

        def loop() -> None:
            clock = time.perf_counter
            while not self._stop.is_set():
                self.drain(sink)
                t = clock()
                asked = self.wait(period_s)
                if not asked:
                    self.sleeps.append(clock() - t)
            self.drain(sink)

        self._thread = threading.Thread(target=loop, name="hwtrace-vstm", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def events(self):
        """The kept stream decoded: events per master and channel, with
        their timestamps and payloads (:func:`hwtrace.hwevents.stp.stp_events`;
        an event ends at its marked, timestamped last packet)."""
        return decode_events(bytes(self.stream))

    def counters(self) -> dict[str, int]:
        return {"events": self.written, "dropped": self.dropped, "stalls": self.stalls,
                "stall_ns": self.stall_ns, "bytes": self.drained, "drains": self.drains}  # fmt: skip

    def close(self) -> None:
        """Stop the consumer, tell producers (STALL ones then drop), remove
        the file."""
        self.stop()
        if self.map.closed:
            return
        struct.pack_into("<I", self.map, 44, 1)
        struct.pack_into("<I", self.map, 200, (self._u32(200) + 1) & 0xFFFFFFFF)
        _syscall(
            _SYS_FUTEX, ctypes.c_void_p(self._base + 200), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0
        )
        self._ring.release()
        self._base = 0
        super().close()


def decode_events(data: bytes) -> StpEvents:
    """Events of a stream written through ``hwtrace_stm.h``: each ends at
    its marked, timestamped last data packet."""
    return stp_events(decode_stp(data), convention="marker")


# -- the model ---------------------------------------------------------------


@njit(cache=True)
def _simulate(n, period, eb, size, sleeps, drain_rate, drain_overhead, stall, wake_on_full,
              wake_latency, event_cost):  # fmt: skip
    fill = 0.0  # bytes in the ETB
    t = 0.0  # the producer's clock
    ns = sleeps.shape[0]
    ks = 1
    next_wake = sleeps[0]  # the consumer sleeps until then
    copying = False
    copy_end = 0.0
    taking = 0.0  # bytes the running drain frees at copy_end
    written = 0
    dropped = 0
    stalls = 0
    stall_s = 0.0
    drains = 0
    peak = 0.0
    for i in range(n):
        sched = i * period
        if t < sched:
            t = sched  # paced: wait for the event's time, or go at once when late
        waited = False
        t_stall = t
        while True:
            # the consumer, up to the producer's time
            while True:
                if copying:
                    if copy_end <= t:
                        fill -= taking
                        copying = False
                        next_wake = copy_end + sleeps[ks % ns]
                        ks += 1
                        continue
                    break
                if next_wake <= t:
                    if fill > 0:
                        taking = fill
                        copying = True
                        copy_end = next_wake + drain_overhead + fill / drain_rate
                        drains += 1
                    else:
                        next_wake += sleeps[ks % ns]
                        ks += 1
                    continue
                break
            if fill + eb <= size:
                break
            if not stall:
                dropped += 1
                break
            # stall: wait for the next byte to be freed
            if not waited:
                waited = True
                stalls += 1
                if wake_on_full and not copying and next_wake > t + wake_latency:
                    next_wake = t + wake_latency
            t = copy_end if copying else next_wake
        if fill + eb <= size:
            fill += eb
            written += 1
            if fill > peak:
                peak = fill
            t += event_cost
        if waited:
            stall_s += t - event_cost - t_stall
    return written, dropped, stalls, stall_s, drains, t, peak


def simulate_etb(rate_hz: float, event_bytes: float, etb_size: int, drain_period_s: float,
                 drain_rate_Bps: float, policy: str = "stall", duration_s: float = 0.1, *,
                 drain_overhead_s: float = 0.0, wake_on_full: bool = True,
                 wake_latency_s: float = 50e-6, event_cost_s: float = 0.0,
                 sleeps: Sequence[float] | np.ndarray | None = None) -> dict[str, float]:  # fmt: skip
    """The ETB, event by event.

    A producer attempts ``rate_hz * duration_s`` events of ``event_bytes``
    bytes, paced: event i is due at i / rate_hz and goes at once if the
    producer is late; each written event costs it ``event_cost_s``.  The
    ETB holds ``etb_size`` bytes.  The consumer sleeps ``drain_period_s``,
    wakes, takes everything in the ETB (the fill F at that moment), which
    takes ``drain_overhead_s + F / drain_rate_Bps`` seconds and frees the F
    bytes at the end (as :meth:`VirtualStm.drain` does: one tail update per
    drain), then sleeps again.  An event that does not fit is dropped
    (``"drop"``: the producer goes on at its pace) or waits (``"stall"``:
    the producer blocks until a drain frees room; with ``wake_on_full`` a
    blocked producer wakes a sleeping consumer after ``wake_latency_s``, the
    paper's producer yielding to the consumer; the producer then runs
    behind its schedule and catches up at full speed).  ``sleeps``, if
    given, are the consumer's sleeps to use in turn instead of a fixed
    ``drain_period_s`` (e.g. a real consumer's, measured: a loaded machine
    wakes it late, and one long sleep overflows a small ETB).

    Loss happens when the bytes produced during one consumer cycle (period
    plus drain) exceed the ETB: roughly when ``rate * event_bytes *
    (period + drain time) > etb_size``; stalls under the same condition.
    Returns attempted, written, dropped, loss (fraction), stalls, stall_s,
    stall_fraction (of the producer's elapsed time), elapsed_s, drains and
    peak_fill (bytes).
    """
    if policy not in _POLICIES:
        raise ValueError(f"policy: one of {sorted(_POLICIES)}")
    if rate_hz <= 0 or event_bytes <= 0 or etb_size < event_bytes or drain_rate_Bps <= 0:
        raise ValueError(
            "rate, event size and drain rate must be positive, the ETB at least one event"
        )
    n = round(rate_hz * duration_s)
    sl = np.array([drain_period_s] if sleeps is None or len(sleeps) == 0 else sleeps, np.float64)
    if not (sl > 0).all():
        raise ValueError("the consumer's sleeps must be positive")
    w, d, st, st_s, dr, t, peak = _simulate(
        n, 1.0 / rate_hz, float(event_bytes), float(etb_size), sl, float(drain_rate_Bps),
        float(drain_overhead_s), policy == "stall", wake_on_full, float(wake_latency_s), float(event_cost_s),
    )  # fmt: skip
    elapsed = max(t, n / rate_hz)
    return {"attempted": n, "written": int(w), "dropped": int(d), "loss": d / n if n else 0.0,
            "stalls": int(st), "stall_s": float(st_s), "stall_fraction": st_s / elapsed if elapsed else 0.0,
            "elapsed_s": float(elapsed), "drains": int(dr), "peak_fill": float(peak)}  # fmt: skip
