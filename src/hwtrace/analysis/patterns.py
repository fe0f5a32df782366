"""Instruction patterns: what marks the ends of a latency interval.

A *marker* names something that happens at one instruction of the flow:

* an instruction by mnemonic (``cli``, ``sti``, ``popf``, ``syscall``,
  ``pause``; ``insn:NAME`` when the name could also be a symbol) or by
  class (``class:call``, ``class:ret``, ``class:jmp``, ``class:jcc``);
* an address: ``0x401000``, a symbol ``foo`` or ``foo+0x12``, in a module
  ``libc.so.6!malloc`` (``sym:NAME`` when the name is also a mnemonic);
* a function's entry, ``enter:foo`` (its first instruction), and its exit,
  ``exit:foo`` (the return that leaves the frame it was entered in, found
  on a per-thread stack of calls, so recursion and early returns pair
  correctly);
* a *super-instruction*: a short sequence of the above on consecutive
  instructions, optionally only inside functions whose name matches a glob,
  matched at its last instruction (Sharma's superCLI ``pushf; pop; cli
  in *irq_save*``).

Markers are defined on the command line (``NAME=SPEC`` or just the
specification) or in a TOML file::

    [markers]
    superCLI = "pushf; pop; cli in *irq_save*"
    superSTI = "popf in *irq_restore*"

    [interval]
    open = ["cli", "superCLI"]
    close = ["sti", "superSTI"]
    per = "cpu"          # or "thread" (the default)

Every marker reduces to *atoms*, tests on one instruction (its mnemonic,
class, address, function), evaluated once per distinct instruction in
Python (:func:`atom_bits`); the compiled walk (:mod:`hwtrace.analysis.latency`)
combines them.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..image.symbols import SymbolTable, address_number
from ..isa.x86 import IClass

MAX_ATOMS = 62  # (the walk keeps two flags in the top bits of an atom mask)
MAX_MARKERS = 64
MAX_SEQUENCE = 16


class PatternError(ValueError):
    """A pattern or marker definition that cannot be used; the message
    names it and says why."""


# Atom kinds.
A_MNEMONIC, A_CLASS, A_ADDRESS, A_ENTRY = range(4)
# Marker kinds.
M_ATOM, M_SEQUENCE, M_EXIT = range(3)

CLASSES = {
    "call": (IClass.CALL, IClass.FAR_CALL),
    "ret": (IClass.RETURN, IClass.FAR_RETURN),
    "jmp": (IClass.JUMP, IClass.FAR_JUMP),
    "jcc": (IClass.COND_JUMP,),
}


def _mnemonics() -> dict[str, int]:
    import iced_x86

    return {
        name.lower(): getattr(iced_x86.Mnemonic, name)
        for name in dir(iced_x86.Mnemonic)
        if not name.startswith("_")
    }


_MNEMONICS: dict[str, int] | None = None


def mnemonics() -> dict[str, int]:
    """iced-x86's mnemonics by lower-case name."""
    global _MNEMONICS
    if _MNEMONICS is None:
        _MNEMONICS = _mnemonics()
    return _MNEMONICS


# Names that stand for a family (the operand-size forms).
_FAMILIES = {
    "popf": ("popf", "popfd", "popfq"),
    "pushf": ("pushf", "pushfd", "pushfq"),
    "iret": ("iret", "iretd", "iretq"),
    "sysret": ("sysret", "sysretq"),
}


@dataclass(frozen=True)
class Atom:
    """A test on one instruction: ``kind`` and its value (mnemonic ids,
    class values, a symbol or address specification, a function name), and
    the glob its function's name must match (``scope``, "" for any)."""

    kind: int
    value: tuple
    scope: str = ""

    def describe(self) -> str:
        text = {
            A_MNEMONIC: lambda: self.value[0],
            A_CLASS: lambda: f"class:{self.value[0]}",
            A_ADDRESS: lambda: self.value[0],
            A_ENTRY: lambda: f"enter:{self.value[0]}",
        }[self.kind]()
        return f"{text} in {self.scope}" if self.scope else text


@dataclass
class Marker:
    """A named marker: one atom, a sequence of atoms, or a function's exit
    (``atoms[0]`` then is the function's entry)."""

    name: str
    kind: int
    atoms: list[int]  # indices into the atom table


@dataclass
class PatternSet:
    """The atoms and markers of an analysis, and the interval definition."""

    atoms: list[Atom] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    open: list[int] = field(default_factory=list)  # marker indices
    close: list[int] = field(default_factory=list)
    toggle: list[int] = field(default_factory=list)
    per: str = "thread"

    def atom(self, a: Atom) -> int:
        if a in self.atoms:
            return self.atoms.index(a)
        if len(self.atoms) >= MAX_ATOMS:
            raise PatternError(f"more than {MAX_ATOMS} distinct instruction tests")
        self.atoms.append(a)
        return len(self.atoms) - 1

    def marker_index(self, name: str) -> int | None:
        for i, m in enumerate(self.markers):
            if m.name == name:
                return i
        return None

    def add_marker(self, name: str, spec: str) -> int:
        """Define ``name`` as ``spec`` (see the module doc); returns its index."""
        if self.marker_index(name) is not None:
            raise PatternError(f"marker {name!r} is defined twice")
        if len(self.markers) >= MAX_MARKERS:
            raise PatternError(f"more than {MAX_MARKERS} markers")
        marker = self._parse(name, spec)
        self.markers.append(marker)
        return len(self.markers) - 1

    def use(self, spec: str) -> int:
        """The marker a set names: a defined marker's name, else a marker
        made from ``spec`` itself."""
        spec = spec.strip()
        found = self.marker_index(spec)
        if found is not None:
            return found
        return self.add_marker(spec, spec)

    def _parse(self, name: str, spec: str) -> Marker:
        text = spec.strip()
        if not text:
            raise PatternError(f"marker {name!r}: empty pattern")
        scope = ""
        m = re.match(r"^(.*\S)\s+in\s+(\S+)$", text)
        if m:
            text, scope = m.group(1), m.group(2)
        parts = [p.strip() for p in text.split(";")]
        if any(not p for p in parts):
            raise PatternError(f"marker {name!r}: empty step in {spec!r}")
        if len(parts) > MAX_SEQUENCE:
            raise PatternError(f"marker {name!r}: a sequence of at most {MAX_SEQUENCE} steps")
        if len(parts) == 1 and parts[0].startswith("exit:"):
            if scope:
                raise PatternError(f"marker {name!r}: exit: takes no 'in' scope")
            func = parts[0][5:].strip()
            if not func:
                raise PatternError(f"marker {name!r}: exit: needs a function")
            return Marker(name, M_EXIT, [self.atom(Atom(A_ENTRY, (func,)))])
        atoms = [self.atom(self._atom(name, p, scope)) for p in parts]
        return Marker(name, M_ATOM if len(atoms) == 1 else M_SEQUENCE, atoms)

    def _atom(self, name: str, text: str, scope: str) -> Atom:
        low = text.lower()
        if low.startswith("exit:"):
            raise PatternError(f"marker {name!r}: exit: cannot be a step of a sequence")
        if low.startswith("enter:"):
            func = text[6:].strip()
            if not func:
                raise PatternError(f"marker {name!r}: enter: needs a function")
            return Atom(A_ENTRY, (func,), scope)
        if low.startswith("class:"):
            cls = low[6:].strip()
            if cls not in CLASSES:
                raise PatternError(
                    f"marker {name!r}: unknown class {cls!r} (one of {', '.join(CLASSES)})"
                )
            return Atom(A_CLASS, (cls,), scope)
        if low.startswith("insn:"):
            return self._mnemonic(name, low[5:].strip(), scope)
        if low.startswith("sym:") or low.startswith("addr:"):
            return self._address(name, text.split(":", 1)[1].strip(), scope)
        if re.fullmatch(r"0x[0-9a-f]+", low):
            return self._address(name, low, scope)
        if low in _FAMILIES or low in mnemonics():
            return self._mnemonic(name, low, scope)
        if re.fullmatch(r"[\w.@$!-]+(\+(0x[0-9a-fA-F]+|\d+))?", text):
            return self._address(name, text, scope)
        raise PatternError(f"marker {name!r}: cannot read {text!r} as an instruction or symbol")

    @staticmethod
    def _address(name: str, spec: str, scope: str) -> Atom:
        """An address atom, its number or offset checked to fit 64 bits."""
        if not spec:
            raise PatternError(f"marker {name!r}: no address or symbol")
        m = re.fullmatch(r"(0x[0-9a-fA-F]+)|.+?\+(0x[0-9a-fA-F]+|\d+)", spec)
        number = m and (m.group(1) or m.group(2))
        if number and address_number(number) >> 64:
            raise PatternError(f"marker {name!r}: {number} does not fit in 64 bits")
        return Atom(A_ADDRESS, (spec,), scope)

    def _mnemonic(self, name: str, low: str, scope: str) -> Atom:
        table = mnemonics()
        names = _FAMILIES.get(low, (low,))
        ids = tuple(sorted(table[n] for n in names if n in table))
        if not ids:
            raise PatternError(f"marker {name!r}: unknown instruction {low!r}")
        return Atom(A_MNEMONIC, (low, *ids), scope)


def parse_sets(
    patterns: PatternSet,
    open_: list[str] = (),
    close: list[str] = (),
    toggle: list[str] = (),
) -> None:
    """Fill the open, close and toggle sets (comma-separated lists allowed)."""
    for specs, target in ((open_, patterns.open), (close, patterns.close),
                          (toggle, patterns.toggle)):  # fmt: skip
        for spec in specs:
            for one in _split(spec):
                target.append(patterns.use(one))
    if patterns.toggle and (patterns.open or patterns.close):
        raise PatternError("--toggle cannot be given with --open or --close")
    if not patterns.toggle and (not patterns.open or not patterns.close):
        raise PatternError("give --open and --close patterns (or --toggle)")


def _split(spec: str) -> list[str]:
    """``a,b`` names two markers unless the commas are inside a sequence."""
    if ";" in spec:
        return [spec]
    return [p for p in (x.strip() for x in spec.split(",")) if p]


def load_toml(path: str | os.PathLike[str], patterns: PatternSet) -> None:
    """Markers and interval sets from a TOML file (see the module doc);
    errors name the file and the entry."""
    import tomllib

    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise PatternError(f"{path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise PatternError(f"{path}: {e}") from None
    markers = doc.get("markers", {})
    if not isinstance(markers, dict):
        raise PatternError(f"{path}: [markers] must be a table of name = pattern")
    for name, spec in markers.items():
        if isinstance(spec, list):
            spec = "; ".join(str(s) for s in spec)
        if not isinstance(spec, str):
            raise PatternError(f"{path}: markers.{name}: a pattern string or list")
        try:
            patterns.add_marker(name, spec)
        except PatternError as e:
            raise PatternError(f"{path}: markers.{name}: {e}") from None
    interval = doc.get("interval", {})
    if not isinstance(interval, dict):
        raise PatternError(f"{path}: [interval] must be a table")
    for key in ("open", "close", "toggle"):
        value = interval.get(key, [])
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise PatternError(f"{path}: interval.{key}: a pattern or a list of them")
        target = getattr(patterns, key)
        for spec in value:
            try:
                target.append(patterns.use(str(spec)))
            except PatternError as e:
                raise PatternError(f"{path}: interval.{key}: {e}") from None
    per = interval.get("per")
    if per is not None:
        if per not in ("thread", "cpu"):
            raise PatternError(f"{path}: interval.per: 'thread' or 'cpu', not {per!r}")
        patterns.per = per


# -- evaluating atoms on instructions ------------------------------------------


def resolve_address(spec: str, symbols: SymbolTable) -> np.ndarray:
    """The addresses ``spec`` (``0x..``, ``name``, ``name+off``,
    ``module!name[+off]``) stands for in ``symbols``."""
    if re.fullmatch(r"0x[0-9a-fA-F]+", spec):
        return np.array([int(spec, 16)], np.uint64)
    m = re.fullmatch(r"(.+?)(?:\+(0x[0-9a-fA-F]+|\d+))?", spec)
    name, off = m.group(1), m.group(2)
    starts = symbols.function_entries(name)
    if off:
        starts = starts + np.uint64(address_number(off))
    return starts


class AtomTable:
    """The atoms' truth on instructions of one address space, as a bit mask
    per instruction (bit ``j``: atom ``j`` holds), cached by address."""

    def __init__(self, patterns: PatternSet, symbols: SymbolTable) -> None:
        self.patterns = patterns
        self.symbols = symbols.functions if symbols is not None else SymbolTable.empty()
        self.addresses: list[np.ndarray | None] = []
        self.missing: set[str] = set()  # symbol specifications found nowhere
        for a in patterns.atoms:
            if a.kind in (A_ADDRESS, A_ENTRY):
                got = resolve_address(a.value[0], self.symbols)
                if a.kind == A_ENTRY:
                    # An IFUNC's implementation is known only where its PLT
                    # stub goes: a call of it enters at the stub (the walk
                    # counts it from the stub's destination).
                    stubs = self.symbols.ifunc_stubs(a.value[0])
                    got = np.union1d(got, stubs) if stubs.shape[0] else got
                if got.shape[0] == 0:
                    self.missing.add(a.value[0])
                self.addresses.append(got)
            else:
                self.addresses.append(None)
        self._plt: np.ndarray | None = None

    def places(self, ips: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whether each address is in a PLT stub (``name@plt``) and whether
        it is the first instruction of a function."""
        if self._plt is None:
            t = self.symbols
            self._plt = np.array([n.endswith("@plt") for n in t.names], np.bool_)[t.name_index]
        index, offset = self.symbols.lookup(ips)
        found = index >= 0
        plt = found & self._plt[np.where(found, index, 0)] if self._plt.shape[0] else found
        return plt, found & (offset == 0)

    def bits_of(
        self,
        ips: np.ndarray,
        classes: np.ndarray,
        decoded: np.ndarray,
        insn_at: Callable[[int], object],
    ) -> np.ndarray:
        """The atoms that hold at each of the instructions at ``ips``, as a
        bit mask each (bit ``j``: atom ``j`` holds): ``classes`` are their
        :class:`~hwtrace.isa.x86.IClass`, ``decoded`` false where no
        instruction could be decoded; ``insn_at(i)`` gives the ``i``-th
        instruction (an :class:`~hwtrace.isa.x86.Insn`), asked for only
        when a mnemonic atom needs it."""
        n = ips.shape[0]
        out = np.zeros(n, np.uint64)
        functions: np.ndarray | None = None
        for j, a in enumerate(self.patterns.atoms):
            if a.kind == A_MNEMONIC:
                ok = np.zeros(n, np.bool_)
                for i in np.flatnonzero(decoded).tolist():
                    ok[i] = _mnemonic_of(insn_at(i)) in a.value[1:]
            elif a.kind == A_CLASS:
                ok = decoded & np.isin(classes, [int(c) for c in CLASSES[a.value[0]]])
            else:
                found = self.addresses[j]
                ok = np.isin(ips, found) if found.shape[0] else np.zeros(n, np.bool_)
            if a.scope and ok.any():
                if functions is None:
                    functions, _ = self.symbols.lookup(ips)
                ok &= self._in_scope(functions, a.scope)
            out[ok] |= np.uint64(1 << j)
        return out

    def _in_scope(self, functions: np.ndarray, scope: str) -> np.ndarray:
        """Whether the function of each row (a symbol index, -1: none, whose
        name is empty) matches the glob ``scope``."""
        names = self.symbols
        index = np.unique(functions)
        keep = [
            int(f) for f in index.tolist()
            if fnmatch.fnmatchcase(names.name(f) if f >= 0 else "", scope)
        ]  # fmt: skip
        return np.isin(functions, np.array(keep, functions.dtype))


def _mnemonic_of(insn) -> int:
    import iced_x86

    return iced_x86.Decoder(insn.mode, insn.raw, ip=insn.ip).decode().mnemonic


__all__ = [
    "A_ADDRESS",
    "A_CLASS",
    "A_ENTRY",
    "A_MNEMONIC",
    "M_ATOM",
    "M_EXIT",
    "M_SEQUENCE",
    "Atom",
    "AtomTable",
    "Marker",
    "PatternError",
    "PatternSet",
    "load_toml",
    "parse_sets",
    "resolve_address",
]
