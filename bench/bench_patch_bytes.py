"""Trace bytes per instruction: the patch recorder against Intel PT itself.

Each workload of ``peers.py`` (small sizes: the decoded flow is held in
memory) is recorded with ``hwtrace record --backend patch``'s recorder;
every thread's trace is decoded and its instruction flow encoded again by
``hwtrace.pt.encode.encode_path`` with the recorder's settings (PSB+ every
4 KiB, TSC, return compression): once with short TNT packets only, as
Intel's processors write them, and once with TNT-64 as the recorder does.
System calls are left in the encoded path as plain instructions (user-only
PT would add a TIP.PGD/TIP.PGE pair around each: a few bytes), so the
ratio slightly favours the encoder.

    python bench/bench_patch_bytes.py [--scale 0.02] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import peers

from hwtrace.pt.config import PtConfig
from hwtrace.pt.decode import decode_trace
from hwtrace.pt.encode import encode_path
from hwtrace.record.patch import PatchOptions, record_patched
from hwtrace.record.patch.output import patch_image

# sqlite3's and python3's inputs do not scale: their flows (billions of
# instructions, 8 bytes each decoded) are left out past this much trace.
MAX_TRACE = 200 << 20


def measure(w: peers.Workload, options: PatchOptions) -> dict[str, float]:
    with open(w.stdin or "/dev/null", "rb") as stdin, tempfile.TemporaryDirectory() as tmp:
        rec = record_patched(list(w.argv), options, stdin=stdin, stdout=subprocess.DEVNULL)
        image = patch_image(rec, Path(tmp))
        insns = ours = short = long_ = 0
        if sum(len(t.data) for t in rec.threads) > MAX_TRACE:
            return {}  # the decoded flow would not fit in memory
        for t in rec.threads:
            ips = decode_trace(t.data, image, PtConfig()).instructions()
            if not ips.shape[0]:
                continue
            insns += ips.shape[0]
            ours += len(t.data)
            # The last instruction (exit_group's syscall) leaves the path:
            # the path ends where it would run.
            same = {"psb_period": options.psb_period, "tsc": 1, "ret_compression": True,
                    "end_ip": int(ips[-1])}  # fmt: skip
            ips = ips[:-1]
            short += len(encode_path(ips, image, long_tnt=False, **same).data)
            long_ += len(encode_path(ips, image, long_tnt=True, **same).data)
    return {"insns": insns, "patch": ours, "pt": short, "pt_long_tnt": long_}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.02, help="workload size (1: 0.3-1 s)")
    ap.add_argument("--only", action="append", default=[], help="workloads whose name has NAME")
    a = ap.parse_args()
    print(f"{'workload':10} {'insns':>12} {'patch B/insn':>13} {'PT B/insn':>10} "
          f"{'ratio':>6} {'PT(TNT-64)':>11} {'ratio':>6}")  # fmt: skip
    for w in peers.setup_workloads(a.scale, a.only):
        m = measure(w, PatchOptions())
        if not m:
            print(f"{w.name:10} left out: over {MAX_TRACE >> 20} MiB of trace", flush=True)
            continue
        n = max(m["insns"], 1)
        print(f"{w.name:10} {m['insns']:12,d} {m['patch'] / n:13.4f} {m['pt'] / n:10.4f} "
              f"{m['patch'] / max(m['pt'], 1):6.2f} {m['pt_long_tnt'] / n:11.4f} "
              f"{m['patch'] / max(m['pt_long_tnt'], 1):6.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
