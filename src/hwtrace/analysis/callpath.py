"""Call paths from an instruction flow: a calling-context tree and folded stacks.

The flow is walked by a compiled loop that follows CALL and RET
instructions: each instruction is counted (and weighted by the time until
the next one) in the node of its calling context.  A call whose next traced
instruction is its own return address went out of the traced ranges and came
back (an address filter shows calls to libraries that way): it opens no
frame.  A change of function without CALL or RET (a tail call, a jump, a
trace gap) replaces the innermost frame.  Results are flame-graph "folded
stacks" (Brendan Gregg's FlameGraph ``stackcollapse`` format):
``root;caller;callee count``.

:class:`CallTreeBuilder` takes the flow in pieces, in order (the walk's
state and the last instruction, whose successor decides its transition,
carry over), so a flow of any length is walked in bounded memory;
:func:`call_tree` is the one-piece form.  :class:`ThreadCallPaths` keeps one
tree per thread, trace queue and address space, as ``hwtrace report
--folded`` writes them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np

from .. import aot
from ..image.symbols import SymbolTable
from ..pt.codeindex import K_CALL, K_OTHER, K_RET, CodeIndex, Reader

__all__ = [
    "K_CALL",
    "K_OTHER",
    "K_RET",
    "CallTree",
    "CallTreeBuilder",
    "ThreadCallPaths",
    "call_tree",
    "classify",
]


@aot.njit(cache=True, inline="always")
def _slot(keys, key):
    """Where ``key`` is in the children table, or the empty slot it goes
    to (open addressing, linear probing; 0 marks an empty slot)."""
    mask = keys.shape[0] - 1
    h = (np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)
    i = np.int64(h) & mask
    while keys[i] != 0 and keys[i] != key:
        i = (i + 1) & mask
    return i


@aot.njit(cache=True, inline="always")
def _child(keys, vals, parent, node_sym, base, s, n_nodes):
    """The node for function ``s`` called from ``base`` (made if new)."""
    key = base * (1 << 24) + s + 1
    i = _slot(keys, key)
    if keys[i] == key:
        return vals[i], n_nodes
    parent[n_nodes] = base
    node_sym[n_nodes] = s
    keys[i] = key
    vals[i] = n_nodes
    return n_nodes, n_nodes + 1


@aot.njit(cache=True)
def _index_children(parent, node_sym, n_nodes, keys, vals):
    """Fill an empty children table from the nodes made so far."""
    for node in range(1, n_nodes):
        key = parent[node] * (1 << 24) + node_sym[node] + 1
        i = _slot(keys, key)
        keys[i] = key
        vals[i] = node


@aot.njit(cache=True)
def _walk_contexts(
    ips, kind, next_ip, sym, weight, final, parent, node_sym, counts, times, keys, vals, state
):
    """Count each instruction in its calling-context node.  ``parent`` and
    ``node_sym`` are filled in place (node 0 is the root); ``state`` holds
    the current node and the number of nodes between calls; ``keys`` and
    ``vals`` map (caller node, function) to the child node, with room for
    every node ``parent`` has room for.  The last
    instruction is left for the next call (its transition depends on the
    instruction after it) unless ``final``; returns the instructions walked."""
    node = state[0]
    n_nodes = state[1]
    n = ips.shape[0]
    stop = n if final else n - 1
    for i in range(stop):
        s = sym[i]
        if node == 0 or node_sym[node] != s:
            # In another function without a call: replace the frame.
            base = parent[node] if node != 0 else 0
            node, n_nodes = _child(keys, vals, parent, node_sym, base, s, n_nodes)
        counts[node] += 1
        times[node] += weight[i]
        if i + 1 >= n:
            break
        if kind[i] == K_CALL and ips[i + 1] != next_ip[i]:
            node, n_nodes = _child(keys, vals, parent, node_sym, node, sym[i + 1], n_nodes)
        elif kind[i] == K_RET and node != 0 and parent[node] != 0:
            node = parent[node]
    state[0] = node
    state[1] = n_nodes
    return max(stop, 0)


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


def classify(ips: np.ndarray, read: Reader, mode: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Kind (other/call/ret) and next instruction address of each of ``ips``,
    decoding each distinct address once."""
    return CodeIndex(read).classify(ips, mode)


class CallTreeBuilder:
    """A calling-context tree built from an instruction flow given in pieces,
    in order (see the module doc).

    ``names`` are the functions :meth:`add`'s ``functions`` index;
    ``code`` reads and classifies the instructions (one
    :class:`~hwtrace.pt.codeindex.CodeIndex` per address space, shared
    between builders of the same code)."""

    def __init__(self, names: list[str], code: CodeIndex) -> None:
        self.names = names
        self.code = code
        self._state = np.array([0, 1], np.int64)  # current node, nodes used
        cap = 1 << 10
        self._parent = np.zeros(cap, np.int64)
        self._node_sym = np.full(cap, -1, np.int64)
        self._counts = np.zeros(cap, np.int64)
        self._times = np.zeros(cap, np.float64)
        # (caller node, function) -> node: a table at most half full
        self._keys = np.zeros(2 * cap, np.int64)
        self._vals = np.zeros(2 * cap, np.int64)
        self._held: tuple[np.ndarray, ...] | None = None  # the last instruction, not walked yet

    def _room(self, more: int) -> None:
        need = int(self._state[1]) + more + 1
        cap = self._parent.shape[0]
        if need <= cap:
            return
        while cap < need:
            cap *= 2
        for name, fill in (("_parent", 0), ("_node_sym", -1), ("_counts", 0), ("_times", 0)):
            old = getattr(self, name)
            new = np.full(cap, fill, old.dtype)
            new[: old.shape[0]] = old
            setattr(self, name, new)
        self._keys = np.zeros(2 * cap, np.int64)
        self._vals = np.zeros(2 * cap, np.int64)
        _index_children(self._parent, self._node_sym, self._state[1], self._keys, self._vals)

    def add(
        self, ips: np.ndarray, functions: np.ndarray, weights: np.ndarray | None = None
    ) -> None:
        """The next ``ips`` of the flow, ``functions[i]`` the index (into
        ``names``; -1 unknown) of instruction ``i``'s function, ``weights``
        (optional) what each adds to its context's ``self_time``."""
        ips = np.ascontiguousarray(ips, np.uint64)
        kind, next_ip = self.code.classify(ips)
        sym = np.where(functions < 0, len(self.names), functions).astype(np.int64)
        weight = (
            np.zeros(ips.shape[0], np.float64)
            if weights is None
            else np.asarray(weights, np.float64)
        )
        self._walk((ips, kind, next_ip, sym, weight), final=False)

    def _walk(self, cols: tuple[np.ndarray, ...], final: bool) -> None:
        if self._held is not None:
            cols = tuple(np.concatenate([h, c]) for h, c in zip(self._held, cols, strict=True))
            self._held = None
        if cols[0].shape[0] == 0:
            return
        self._room(cols[0].shape[0])
        done = _walk_contexts(
            *cols, final, self._parent, self._node_sym, self._counts, self._times,
            self._keys, self._vals, self._state,
        )  # fmt: skip
        if done < cols[0].shape[0]:
            self._held = tuple(c[done:].copy() for c in cols)

    def finish(self) -> CallTree:
        """The tree of everything added (the builder takes no more)."""
        if self._held is not None:
            self._walk(tuple(c[:0] for c in self._held), final=True)
        n = int(self._state[1])
        labels = [*self.names, "[unknown]"]
        function = [""] + [labels[int(s)] for s in self._node_sym[1:n]]
        return CallTree(self._parent[:n], function, self._counts[:n], self._times[:n])


def call_tree(
    ips: np.ndarray,
    functions: np.ndarray,
    names: list[str],
    read: Reader,
    weights: np.ndarray | None = None,
) -> CallTree:
    """The calling-context tree of an instruction flow.

    ``functions[i]`` is the function index (into ``names``; -1 unknown) of
    instruction ``ips[i]``; ``read`` reads code (an image's ``read``);
    ``weights`` (optional, per instruction, e.g. its share of its block's
    time) are summed per context as ``self_time``.
    """
    builder = CallTreeBuilder(names, CodeIndex(read))
    builder.add(ips, functions, weights)
    return builder.finish()


@dataclass
class _Space:
    """One address space's functions, as the trees of its threads name them."""

    table: SymbolTable
    names: list[str]
    code: CodeIndex


@dataclass
class ThreadCallPaths:
    """Calling-context trees per thread, fed a flow in pieces.

    Each piece is instructions of one address space (``space``, any
    hashable key, e.g. a trace queue and an image number), with the thread
    each ran in; one tree is kept per (thread, space), as the flow of a
    thread in different address spaces (or different trace queues) does not
    continue one call stack.  :meth:`folded` gives the stacks per thread in
    thread order, then in space order."""

    _spaces: dict[Hashable, _Space] = field(default_factory=dict)
    _trees: dict[tuple[int, Hashable], CallTreeBuilder] = field(default_factory=dict)

    def add(
        self,
        space: Hashable,
        symbols: SymbolTable,
        code: CodeIndex,
        ips: np.ndarray,
        tid: np.ndarray,
        weights: np.ndarray | None = None,
    ) -> None:
        """Instructions ``ips`` of address space ``space`` (whose symbols
        and code are ``symbols`` and ``code``), ``tid[i]`` the thread that
        ran ``ips[i]``, ``weights`` their time (optional)."""
        sp = self._spaces.get(space)
        if sp is None:
            table = symbols.functions
            names = [table.qualified_name(i) for i in range(len(table))]
            sp = self._spaces[space] = _Space(table, names, code)
        index, _ = sp.table.lookup(ips)
        threads = np.unique(tid)
        for t in threads.tolist():
            sel = np.flatnonzero(tid == t) if threads.shape[0] > 1 else slice(None)
            tree = self._trees.get((t, space))
            if tree is None:
                tree = self._trees[(t, space)] = CallTreeBuilder(sp.names, sp.code)
            tree.add(ips[sel], index[sel], None if weights is None else weights[sel])

    def folded(self, root: Callable[[int], str], by: str = "insn") -> list[str]:
        """Folded stacks of every tree, ``root(tid)`` the first frame of
        each thread's (its comm); threads in ascending order, each thread's
        trees in the order their spaces sort."""
        out: list[str] = []
        for t, space in sorted(self._trees):
            out += self._trees[(t, space)].finish().folded(root=root(t), by=by)
        return out
