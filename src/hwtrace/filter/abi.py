"""The contract every filter tier keeps: how a compiled filter is called,
what eBPF programs see, and the helpers they may call.

A compiled filter is ``int64 filter(const void *event, const void *context)``
(the System V ABI: ``event`` in rdi, ``context`` in rsi, verdict in rax):
nonzero records the event.  ``event`` points at a record laid out as the
event's :class:`~.schema.Schema` says, ``context`` at one laid out as the
context schema (``$ctx.*``, ``$app.*``) says.

eBPF programs (the standard instruction set, 8-byte slots, :data:`INSN`)
start with R1 = event, R2 = context, R10 = frame pointer of a 512-byte
stack, and return the verdict in R0.  Two ``ld_imm64`` pseudo sources give
them addresses the verifier knows:

* ``src = PSEUDO_RODATA`` (the kernel's ``BPF_PSEUDO_MAP_VALUE``): the
  program's read-only data (string literals) + the second slot's ``imm``;
* ``src = PSEUDO_FIELD_PATH``: field path number ``imm`` of the program's
  linked paths (:class:`~.schema.FieldPath`); only helpers take it.

Helpers are called with ``call imm`` (``imm`` one of the ``HELPER_*``
numbers), arguments in R1-R5, result in R0; R1-R5 are clobbered.  The
string and path helpers return -1 when the field is missing (a null
pointer, an index past a dynamic length): generated code then returns
false for the whole expression, LTTng's rule.
"""

from __future__ import annotations

import numpy as np

#: One eBPF instruction: opcode, dst (low nibble) and src (high nibble)
#: registers, signed 16-bit offset, signed 32-bit immediate.
INSN = np.dtype([("code", "u1"), ("regs", "u1"), ("off", "<i2"), ("imm", "<i4")])

MAX_INSNS = 4096  # the kernel's classic limit, as in Sharma and Dagenais (JCST 2016)
STACK_SIZE = 512

PSEUDO_RODATA = 2
PSEUDO_FIELD_PATH = 7

# Helpers: number -> (name, arguments).  Argument kinds for the verifier:
# "event" / "context": R1 / R2 as received; "path": a PSEUDO_FIELD_PATH
# register; "rodata": a pointer into rodata, with the next "size" argument
# a constant that keeps it in bounds; "scalar": any initialised value.
HELPER_FIELD_ADDR = 1  # (event, context, path) -> address of the leaf's slot, or 0 if missing
HELPER_STR_EQ = 2  # (event, context, path, rodata, size) -> 1 equal, 0 not, -1 missing
HELPER_STR_GLOB = (
    3  # (event, context, path, rodata, size) -> 1, 0, -1; pattern: * wildcard, \* \\ escapes
)
HELPER_STR_FIELDS_EQ = 4  # (event, context, path, path) -> 1, 0, -1
HELPER_GET_THRESHOLD = 5  # (key) -> value of the shared threshold table
HELPER_SET_THRESHOLD = 6  # (key, value) -> 0, or -1 when key is out of range
HELPER_GET_PID = 7  # () -> the calling process's pid
HELPER_GET_TID = 8  # () -> the calling thread's tid
HELPER_GET_CPU = 9  # () -> the CPU it runs on
HELPER_KTIME_NS = 10  # () -> CLOCK_MONOTONIC in ns
# eBPF has no floating point: doubles travel as their IEEE bits.
HELPER_DOUBLE_CMP = 11  # (a bits, b bits, DOUBLE_*) -> 1 or 0, as C compares doubles
HELPER_S64_TO_DOUBLE = 12  # (s64) -> bits of the nearest double
HELPER_F32_TO_DOUBLE = 13  # (bits of a float in the low 32) -> bits of the double

DOUBLE_EQ, DOUBLE_NE, DOUBLE_LT, DOUBLE_LE, DOUBLE_GT, DOUBLE_GE = range(6)

HELPERS: dict[int, tuple[str, tuple[str, ...]]] = {
    HELPER_FIELD_ADDR: ("field_addr", ("event", "context", "path")),
    HELPER_STR_EQ: ("str_eq", ("event", "context", "path", "rodata", "size")),
    HELPER_STR_GLOB: ("str_glob", ("event", "context", "path", "rodata", "size")),
    HELPER_STR_FIELDS_EQ: ("str_fields_eq", ("event", "context", "path", "path")),
    HELPER_GET_THRESHOLD: ("get_threshold", ("scalar",)),
    HELPER_SET_THRESHOLD: ("set_threshold", ("scalar", "scalar")),
    HELPER_GET_PID: ("get_pid", ()),
    HELPER_GET_TID: ("get_tid", ()),
    HELPER_GET_CPU: ("get_cpu", ()),
    HELPER_KTIME_NS: ("ktime_ns", ()),
    HELPER_DOUBLE_CMP: ("double_cmp", ("scalar", "scalar", "scalar")),
    HELPER_S64_TO_DOUBLE: ("s64_to_double", ("scalar",)),
    HELPER_F32_TO_DOUBLE: ("f32_to_double", ("scalar",)),
}

THRESHOLD_SLOTS = 4096  # entries of the shared int64 threshold table
