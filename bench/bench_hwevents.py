"""Decode throughput of the hardware-carried event formats, against the
peers on this machine, in one run.

Each format gets a generated stream of about --mb MB (a few MB encoded
once and repeated; every copy starts at a sync point, so the whole stream
is valid), decoded by hwtrace (best of R, MB/s of input) and by the peer:

* PTW (Intel PT with PTWRITE events): ``hwtrace.hwevents.ptw.decode_events``
  (packets, time model and event assembly) against libipt's packet loop
  (``pt_pkt_next``, packets only);
* BTS records: ``decode_bts`` + ``events_at`` (no peer decodes raw BTS);
* STPv2 (CoreSight STM): ``decode_stp`` (+ ``stp_events``) against
  OpenCSD's STM packet processor (bench/hwevents/ocsd_packets.c, a sink
  that only counts);
* formatter frames carrying STM: ``deformat`` + ``decode_stp`` against
  OpenCSD's deformatter + STM packet processor;
* ETMv4: ``decode_etm4`` (+ ``trace_on_events``) against OpenCSD's ETMv4
  packet processor.

    python bench/bench_hwevents.py [--mb N] [--repeat R]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import common
import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "hwevents"
sys.path.insert(0, str(HERE.parent / "src"))

from hwtrace.hwevents import bts, ptw  # noqa: E402
from hwtrace.hwevents.csframes import deformat, format_frames  # noqa: E402
from hwtrace.hwevents.etm4 import (  # noqa: E402  # noqa: E402
    Etm4Config,
    Etm4Kind,
    Etm4Packet,
    decode_etm4,
    encode_etm4,
    trace_on_events,
)
from hwtrace.hwevents.stp import StpKind, StpPacket, decode_stp, encode_stp, stp_events  # noqa: E402

FOO = 0xFFFF_0000_0040_1000


def best(fn, repeat: int) -> float:
    t = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def tile(block: bytes, mb: float) -> bytes:
    return block * max(1, int(mb * 1e6 // len(block)))


def gen_ptw(mb: float) -> bytes:
    rng = np.random.default_rng(1)
    n = 20_000
    ids = rng.integers(1, 50, n).astype(np.uint64)
    nw = rng.integers(0, 4, n)
    words = rng.integers(0, 1 << 40, (n, ptw.MAX_WORDS)).astype(np.uint64)
    times = 1000 + np.cumsum(rng.integers(1, 500, n))
    return tile(
        ptw.encode_events(ids, words, nw, times, ips=0x401000 + 4 * (ids.astype(np.int64))), mb
    )


def gen_bts(mb: float) -> bytes:
    rng = np.random.default_rng(2)
    n = 100_000
    src = 0x401000 + 4 * rng.integers(0, 4096, n)
    return tile(bts.encode_bts(src.astype(np.uint64), (src + 64).astype(np.uint64)), mb)


def gen_stp(mb: float) -> bytes:
    """Linux-style messages (a timestamped first write, data, a FLAG) on
    several channels."""
    S = StpKind
    pk = [StpPacket(S.ASYNC), StpPacket(S.VERSION, 3), StpPacket(S.M8, 1)]
    ts = 100
    for k in range(40_000):
        ts += 7 + k % 13
        pk += [StpPacket(S.C8, k % 8), StpPacket(S.D32, k, ts=ts), StpPacket(S.D32, 3 * k),
               StpPacket(S.D16, k & 0xFFFF), StpPacket(S.FLAG)]  # fmt: skip
    return tile(encode_stp(pk), mb)


def gen_etm4(mb: float, cfg: Etm4Config) -> bytes:
    K, P = Etm4Kind, Etm4Packet
    rng = np.random.default_rng(3)
    pk = [P(K.ASYNC), P(K.TRACE_INFO), P(K.CTXT, el=0, context=4242, vmid=1)]
    t = 1000
    for _ in range(20_000):
        t += int(rng.integers(1, 5000))
        pk += [P(K.TRACE_ON), P(K.ADDR, FOO), P(K.ATOMS, atoms=int(rng.integers(0, 1 << 20)), natoms=20),
               P(K.TIMESTAMP, ts=t)]  # fmt: skip
        other = FOO + 0x1000 + 4 * int(rng.integers(0, 1000))
        pk += [P(K.TRACE_ON), P(K.ADDR, other), P(K.ATOMS, atoms=5, natoms=3)]
    return tile(encode_etm4(pk, cfg), mb)


def ocsd_peer(proto: str, path: Path, repeat: int, *args: str) -> tuple[float, int] | None:
    exe = OUT / "ocsd_packets"
    if not exe.exists():
        if shutil.which("gcc") is None or not Path("/usr/include/opencsd").exists():
            return None
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(HERE / "hwevents" / "ocsd_packets.c"),
                        "-lopencsd_c_api", "-lopencsd"], check=True)  # fmt: skip
    got = subprocess.run([str(exe), proto, str(path), str(repeat), *args], capture_output=True,
                         text=True, check=True).stdout.split()  # fmt: skip
    return float(got[1]), int(got[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, ...]] = []

    def row(name: str, data: bytes, hw: float, packets: int, peer_name: str, peer) -> None:
        mb = len(data) / 1e6
        cells = [name, f"{mb:.1f}", f"{packets:,}", f"{mb / hw:.1f}"]
        if peer is None:
            cells += [peer_name, "-", "-"]
        else:
            t, n = peer
            cells += [peer_name, f"{mb / t:.1f}", f"{t / hw:.2f}"]
            if n != packets:
                cells[4] += f" ({n:,} packets)"
        rows.append(tuple(cells))

    data = gen_ptw(a.mb)
    path = OUT / "ptw.pt"
    path.write_bytes(data)
    ptw.decode_events(data[:100_000])  # compile
    t = best(lambda: ptw.decode_events(data), a.repeat)
    n = len(ptw.decode_events(data))
    oracle = common.load_oracle()
    peer = None
    if oracle.skip_reason is None:
        r = oracle.loop_bench(path, a.repeat)
        peer = (r["best_seconds"], int(r["packets"]))
    row("PTW events", data, t, n, "libipt pt_pkt_next", peer)
    rows[-1] = rows[-1][:2] + (f"{n:,} events",) + rows[-1][3:]

    data = gen_bts(a.mb)
    sites = {0x401000 + 4 * k: k for k in range(0, 4096, 64)}
    t = best(lambda: bts.events_at(bts.decode_bts(data), sites), a.repeat)
    row("BTS records + events", data, t, len(data) // 24, "(none)", None)

    data = gen_stp(a.mb)
    path = OUT / "stm.bin"
    path.write_bytes(data)
    decode_stp(data[:100_000])
    t = best(lambda: decode_stp(data), a.repeat)
    pk = decode_stp(data)
    row("STPv2 packets", data, t, len(pk), "OpenCSD STM", ocsd_peer("stm", path, a.repeat))
    stp_events(pk)
    t = best(lambda: stp_events(decode_stp(data)), a.repeat)
    row("STPv2 + messages", data, t, len(pk), "OpenCSD STM", ocsd_peer("stm", path, a.repeat))

    stm = data[: len(data) // 2]
    framed = format_frames((0x20, stm[i : i + 64]) for i in range(0, len(stm), 64))
    path = OUT / "stm_frames.bin"
    path.write_bytes(framed)

    def frames_then_stp():
        return decode_stp(deformat(framed).streams[0x20])

    t = best(frames_then_stp, a.repeat)
    peer = ocsd_peer("stm", path, a.repeat, "formatted", f"tcsr={(0x20 << 16) | 7:#x}")
    row("frames + STPv2", framed, t, len(frames_then_stp()), "OpenCSD deformat + STM", peer)

    cfg = Etm4Config()
    data = gen_etm4(a.mb, cfg)
    path = OUT / "etm4.bin"
    path.write_bytes(data)
    decode_etm4(data[:100_000], cfg)
    t = best(lambda: decode_etm4(data, cfg), a.repeat)
    pk = decode_etm4(data, cfg)
    regs, _ = cfg.to_regs()
    args = [f"{k[3:].lower()}={v:#x}" for k, v in regs.items() if k.startswith("TRCIDR")]
    args += [f"configr={regs['TRCCONFIGR']:#x}", f"traceidr={regs['TRCTRACEIDR']:#x}"]
    peer = ocsd_peer("etm4", path, a.repeat, *args)
    row("ETMv4 packets", data, t, len(pk), "OpenCSD ETMv4", peer)
    t = best(lambda: trace_on_events(decode_etm4(data, cfg), {FOO: "foo"}), a.repeat)
    row("ETMv4 + trace-on events", data, t, len(pk), "OpenCSD ETMv4", peer)

    common.print_table(
        "Decode throughput (MB/s of input; peer time / hwtrace time)",
        ("format", "MB", "packets", "hwtrace MB/s", "peer", "peer MB/s", "ratio"),
        rows,
        width=140,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
