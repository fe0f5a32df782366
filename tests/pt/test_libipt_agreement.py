"""Agreement with Intel's decoder (libipt) on streams nobody wrote by hand.

libipt's encoder writes randomized valid streams; libipt's and our packet
decoders must then see identical packets.  Skips where libipt-dev and gcc are
not installed (`make test` installs them on Debian).
"""

import libipt_oracle as oracle
import pytest

from hwtrace.pt.kinds import KIND_NAMES
from hwtrace.pt.packets import decode

pytestmark = pytest.mark.skipif(oracle.skip_reason is not None, reason=str(oracle.skip_reason))

# Our payload columns as libipt's field names.
FIELDS = {
    "tip": {"ip": "a", "ipc": "b"},
    "tip.pge": {"ip": "a", "ipc": "b"},
    "tip.pgd": {"ip": "a", "ipc": "b"},
    "fup": {"ip": "a", "ipc": "b"},
    "tnt.8": {"payload": "a", "bit_size": "b"},
    "tnt.64": {"payload": "a", "bit_size": "b"},
    "mode.exec": {"csl": ("a", 1), "csd": ("a", 2)},
    "mode.tsx": {"intx": ("a", 1), "abrt": ("a", 2)},
    "pip": {"cr3": "a", "nr": "b"},
    "vmcs": {"base": "a"},
    "cbr": {"ratio": "a"},
    "tsc": {"tsc": "a"},
    "tma": {"ctc": "a", "fc": "b"},
    "mtc": {"ctc": "a"},
    "cyc": {"value": "a"},
    "mnt": {"payload": "a"},
    "exstop": {"ip": "c"},
    "mwait": {"hints": "a", "ext": "b"},
    "pwre": {"state": "a", "sub_state": "b", "hw": "c"},
    "pwrx": {
        "last": "a",
        "deepest": "b",
        "interrupt": ("c", 1),
        "store": ("c", 2),
        "autonomous": ("c", 4),
    },
    "ptw": {"plc": "b", "ip": "c", "payload": "a"},
}


def ours(table, i, spec):
    if isinstance(spec, tuple):
        col, bit = spec
        return int(bool(int(getattr(table, col)[i]) & bit))
    return int(getattr(table, spec)[i])


@pytest.mark.parametrize(
    "mix,seed", [("all", s) for s in range(1, 7)] + [("bench", 11), ("bench", 12)]
)
def test_same_packets_as_libipt(tmp_path, mix, seed):
    path = tmp_path / "s.pt"
    oracle.generate(path, 300_000, seed=seed, mix=mix)
    theirs = oracle.dump(path)
    table = decode(path.read_bytes())
    assert len(table) == len(theirs)
    checked = 0
    for i, row in enumerate(theirs):
        assert row["offset"] == int(table.offset[i])
        assert row["size"] == int(table.size[i])
        name = KIND_NAMES[int(table.kind[i])]
        assert row["type"] == name, (row, name)
        for field, spec in FIELDS.get(name, {}).items():
            assert row[field] == ours(table, i, spec), (row, field)
            checked += 1
    assert checked > 10_000


def _loop_stream(per_iteration, tsc_at, n):
    """A PSB+ at the loop head of ``test_decode_bad_input``'s loop code,
    then ``n`` iterations' packets (``per_iteration``: ``(kind, a, b)``
    rows), with a TSC of 2000 + k before iteration ``k`` for each ``k`` in
    ``tsc_at``."""
    import numpy as np
    from test_decode_bad_input import ORG

    from hwtrace.pt.kinds import Kind
    from hwtrace.pt.packets import encode_table

    rows = [(Kind.PSB, 0, 0), (Kind.TSC, 1000, 0), (Kind.FUP, ORG, 3), (Kind.MODE_EXEC, 1, 0),
            (Kind.PSBEND, 0, 0)]  # fmt: skip
    for k in range(n):
        if k in tsc_at:
            rows.append((Kind.TSC, 2000 + k, 0))
        rows += per_iteration
    columns = zip(*rows, strict=True)
    kinds, a, b = (
        np.array(col, dt) for col, dt in zip(columns, (np.uint8, np.uint64, np.uint32), strict=True)
    )
    return encode_table(kinds, a, b, np.zeros(len(rows), np.uint8))


@pytest.mark.parametrize("packets", ["tnt", "tip", "long-tnt"])
def test_times_are_libipt_s(tmp_path, packets):
    """The time each block gets (decode_trace, both walks) and ptxed
    --time prints is the one libipt's block decoder gives before it
    (pt_blk_time, which Intel's ptxed prints): the time of the last packet
    consumed, a TNT's from its first bit on."""
    import io

    import numpy as np
    from test_decode_bad_input import ORG, _loop_code

    from hwtrace.cli.ptxed import main as ptxed
    from hwtrace.image import Image
    from hwtrace.pt.decode import DecodeOptions, decode_trace
    from hwtrace.pt.kinds import Kind

    code = tmp_path / "code.bin"
    code.write_bytes(_loop_code())
    per = {
        # Two bits an iteration (the compressed return and the loop's jnz).
        "tnt": [(Kind.TNT8, 0b11, 2)],
        "tip": [(Kind.TIP, ORG + 5, 3), (Kind.TNT8, 1, 1)],  # the return as a TIP
        "long-tnt": [],
    }[packets]
    if packets == "long-tnt":  # 47 bits a packet: TSCs fall between iterations' bits
        data = _loop_stream([(Kind.TNT64, (1 << 47) - 1, 47)], {1, 2, 4}, 6)
    else:
        data = _loop_stream(per, {3, 7, 8, 20, 39}, 40)
    trace = tmp_path / "t.pt"
    trace.write_bytes(data)
    blocks, times = oracle.block_times(trace, raw=[(code, 0, code.stat().st_size, ORG)])
    want = np.repeat(np.array(times, np.uint64), [nb for _, _, nb in blocks])
    image = Image()
    image.add_raw_spec(f"{code}:{ORG:#x}")
    for fast in (True, False):
        got = decode_trace(data, image, options=DecodeOptions(fast=fast)).instruction_times()
        assert np.array_equal(got[: want.shape[0]], want), fast
    for mode in ("--block-decoder", "--insn-decoder"):
        out = io.BytesIO()
        ptxed([mode, "--time", "--raw", f"{code}:{ORG:#x}", "--pt", str(trace)], out)
        printed = [int(line.split()[0], 16) for line in out.getvalue().decode().splitlines()
                   if line and not line.startswith("[")]  # fmt: skip
        assert printed[: want.shape[0]] == want.tolist(), mode
    assert len(set(times)) > 3  # the TSCs moved the time
