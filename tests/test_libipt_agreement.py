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
