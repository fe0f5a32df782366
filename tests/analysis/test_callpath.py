"""Call paths from real compiled code: the calling-context tree of fib."""

import groundtruth as gt
import numpy as np
import pytest

from hwtrace.analysis.callpath import call_tree
from hwtrace.image import Image

pytestmark = pytest.mark.skipif(gt.skip_reason is not None, reason=str(gt.skip_reason))


def _fib_calls(n: int) -> int:
    return 1 if n < 2 else 1 + _fib_calls(n - 1) + _fib_calls(n - 2)


def test_fib_call_tree_has_its_recursion_depth_and_every_instruction():
    run = gt.case("fib", "-O0")  # -O0: every call is a real call
    image = Image()
    image.add_elf(run.elf, run.load_address)
    table = image.symbols.functions
    index, _ = table.lookup(run.ips)
    names = [table.name(i) for i in range(len(table))]
    tree = call_tree(run.ips, index, names, image.read, np.full(len(run.ips), 3.0))
    assert int(tree.self_insn.sum()) == len(run.ips)
    assert int(tree.self_time.sum()) == 3 * len(run.ips)
    folded = tree.folded(root="prog")
    depths = [line.split()[0].count("fib") for line in folded]
    # fib(seed, 9) recurses down to n = 1: nine fib frames at the deepest.
    assert max(depths) == 9
    assert all(line.startswith("prog;fib") for line in folded)
    # Each fib frame starts with its entry instruction: count the entries.
    entry = run.entry
    assert int((run.ips == entry).sum()) == _fib_calls(9)
