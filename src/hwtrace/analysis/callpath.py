"""Call paths from an instruction flow: a calling-context tree and folded stacks.

The flow is walked once by a compiled kernel that follows CALL and RET
instructions: each instruction is counted (and weighted by the time until
the next one) in the node of its calling context.  A call whose next traced
instruction is its own return address went out of the traced ranges and came
back (an address filter shows calls to libraries that way): it opens no
frame.  A change of function without CALL or RET (a tail call, a jump, a
trace gap) replaces the innermost frame.  Results are flame-graph "folded
stacks": ``root;caller;callee count``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np
from numba import types
from numba.typed import Dict

from ..isa.x86 import IClass, InsnCache

K_OTHER, K_CALL, K_RET = 0, 1, 2


@nb.njit(cache=True, inline="always")
def _child(children, parent, node_sym, base, s, n_nodes):
    """The node for function ``s`` called from ``base`` (made if new)."""
    key = base * (1 << 24) + s + 1
    if key in children:
        return children[key], n_nodes
    parent[n_nodes] = base
    node_sym[n_nodes] = s
    children[key] = n_nodes
    return n_nodes, n_nodes + 1


@nb.njit(cache=True)
def _walk_contexts(ips, kind, next_ip, sym, weight, parent, node_sym, counts, times):
    """Count each instruction in its calling-context node.  ``parent`` and
    ``node_sym`` are filled in place (node 0 is the root); returns the number
    of nodes."""
    children = Dict.empty(key_type=types.int64, value_type=types.int64)
    n_nodes = 1
    node = 0
    n = ips.shape[0]
    for i in range(n):
        s = sym[i]
        if node == 0 or node_sym[node] != s:
            # In another function without a call: replace the frame.
            base = parent[node] if node != 0 else 0
            node, n_nodes = _child(children, parent, node_sym, base, s, n_nodes)
        counts[node] += 1
        times[node] += weight[i]
        if i + 1 >= n:
            break
        if kind[i] == K_CALL and ips[i + 1] != next_ip[i]:
            node, n_nodes = _child(children, parent, node_sym, node, sym[i + 1], n_nodes)
        elif kind[i] == K_RET and node != 0 and parent[node] != 0:
            node = parent[node]
    return n_nodes


@dataclass
class CallTree:
    """A calling-context tree: per node its parent, function name, the
    instructions counted in it (``self_insn``) and their time (``self_time``)."""

    parent: np.ndarray
    function: list[str]
    self_insn: np.ndarray
    self_time: np.ndarray

    def path(self, node: int) -> list[str]:
        out = []
        while node > 0:
            out.append(self.function[node])
            node = int(self.parent[node])
        return out[::-1]

    def folded(self, root: str = "", by: str = "insn") -> list[str]:
        """Folded stacks, one line per calling context: ``a;b;c count``
        (``by`` ``"insn"`` or ``"time"``)."""
        values = self.self_insn if by == "insn" else self.self_time
        lines = []
        for node in np.flatnonzero(values).tolist():
            frames = self.path(node)
            if root:
                frames = [root, *frames]
            lines.append(f"{';'.join(frames)} {int(values[node])}")
        return sorted(lines)


def classify(ips: np.ndarray, read, mode: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Kind (other/call/ret) and next instruction address of each of ``ips``,
    decoding each distinct address once."""
    uniq, inverse = np.unique(ips, return_inverse=True)
    cache = InsnCache(read)
    kinds = np.zeros(uniq.shape[0], np.uint8)
    nexts = np.zeros(uniq.shape[0], np.uint64)
    for j, ip in enumerate(uniq.tolist()):
        insn = cache.get(ip, mode)
        if isinstance(insn, int):
            continue
        nexts[j] = insn.next_ip
        if insn.iclass in (IClass.CALL, IClass.FAR_CALL):
            kinds[j] = K_CALL
        elif insn.iclass in (IClass.RETURN, IClass.FAR_RETURN):
            kinds[j] = K_RET
    return kinds[inverse], nexts[inverse]


def call_tree(
    ips: np.ndarray,
    functions: np.ndarray,
    names: list[str],
    read,
    weights: np.ndarray | None = None,
) -> CallTree:
    """The calling-context tree of an instruction flow.

    ``functions[i]`` is the function index (into ``names``; -1 unknown) of
    instruction ``ips[i]``; ``read`` reads code (an image's ``read``);
    ``weights`` (optional, per instruction, e.g. its share of its block's
    time) are summed per context as ``self_time``.
    """
    ips = np.ascontiguousarray(ips, np.uint64)
    kind, next_ip = classify(ips, read)
    sym = np.where(functions < 0, len(names), functions).astype(np.int64)
    if weights is None:
        weight = np.zeros(ips.shape[0], np.float64)
    else:
        weight = np.asarray(weights, np.float64)
    cap = ips.shape[0] + 1
    parent = np.zeros(cap, np.int64)
    node_sym = np.full(cap, -1, np.int64)
    counts = np.zeros(cap, np.int64)
    tsum = np.zeros(cap, np.float64)
    n = _walk_contexts(ips, kind, next_ip, sym, weight, parent, node_sym, counts, tsum)
    labels = [*names, "[unknown]"]
    function = [""] + [labels[int(s)] for s in node_sym[1:n]]
    return CallTree(parent[:n], function, counts[:n], tsum[:n])
