"""The compiled flow decoder: packets and code in, blocks and events out.

This is Intel's reference decoder (libipt's event decoder and block decoder,
as the test suite's oracles ``tests/oracles/events.py`` and
``tests/oracles/flow.py`` implement them in Python) written for numba, plus
a fast loop for the common case.  The tests hold this one to those, event
for event and instruction for instruction.

Shape of the code
-----------------
The Python decoders raise exceptions; here every function returns an int:
a non-negative result or ``-code`` with libipt's error code.  Two more
negative codes abort the current *step* (one ``next_block``, ``next_event``,
``start`` or ``resync`` of libipt's API): :data:`ABORT_MISS` when an
instruction is not decoded yet (Python decodes it with iced-x86, see
:mod:`hwtrace.pt.codetable`) and :data:`ABORT_WINDOW` when a step reads past
the packets it was given.  Each step starts by saving the decoder's state;
an abort restores it, output included, and returns to Python, which fixes
the cause and calls again: the step is redone from its start.

State lives in arrays (``SI``: integers, ``SU``: addresses and times,
``CUR``: the block decoder's current event, ``QE``/``QB``: the event queue
waiting for the packet each event binds to, ``RS``: the return stack) so a
call can stop anywhere between steps and the next call goes on.  An event is
a row of ``EW`` unsigned words; its payload words mean what ``E_*`` says for
its type.

The fast loop
-------------
Most of a trace is conditional branches (TNT bits), indirect targets (TIP)
and timing packets between them.  While nothing else is pending the driver
runs :func:`_fast`, which walks whole runs of code (see ``codetable``) per
hash lookup and keeps the state in registers; anything else makes it stop
at the start of a run and the step functions take over.

Output
------
Blocks are rows (first IP, instruction count, flags, mode, trace offset,
time); a libipt block may be split over several rows (``O_NEW`` marks the
first), since the fast loop emits a row per run.  Everything else (events,
errors, the "end of trace" and resync markers) is an event row with the
number of block rows before it, which places it in the flow.  The format is
public: :mod:`hwtrace.pt.flowrows` names its columns, flags and types.
"""

from __future__ import annotations

import numpy as np

from .. import aot
from ..isa.x86 import IClass, Special
from ._window import (
    WA_CONTINUE,
    WA_GROW,
    WA_LIMIT,
    WA_OPENED,
    WA_SAVED,
    WA_START,
    WA_TIME,
    WIN_READY,
    open_window,
)
from .blocks import (
    S_ENT,
    S_ID,
    S_KEYS,
    S_LAST_OFF,
    S_LAST_TIME,
    S_LIVE,
    S_OFF,
    S_OFF_AT,
    S_ROWS,
    S_SEQ_GEN,
    S_STARTED,
    S_TIME,
    _block_key,
    claim_run_keys,
    dummy_store,
    put_offset,
    put_row,
    put_time,
    store_key_limit,
    store_restore,
    store_rows,
    store_save,
    store_sequence,
)
from .codetable import (
    C_INDEX,
    C_MISS_IP,
    C_MISS_MODE,
    C_OFF_ON,
    C_PSB,
    C_RUNS,
    C_X_GEN,
    C_X_OWNER,
    C_X_POOL,
    C_X_PUSH,
    C_X_ROWS,
    I_DIRECT,
    I_NO_PUSH,
    I_TRUNCATED,
    RUN_CALL,
    RUN_COND,
    RUN_FALL,
    RUN_ICALL,
    RUN_IJUMP,
    RUN_JUMP,
    RUN_RET,
    RUN_STOP,
    T_COUNTS,
    T_R_IP,
    T_R_KEY,
    T_R_MODE,
    T_R_NEXT,
    T_R_RET,
    T_R_TAKEN,
    T_X_KEY,
    T_X_PIP,
    T_X_PRUN,
    T_X_TAB,
    X_FIELDS,
    build_run,
    fill_missing,
    hash_find,
)
from .errors import ABORT, ABORT_MISS, ABORT_WINDOW, PtError  # (aborts: see the module docstring)
from .flowrows import (  # the output format, shared with its readers
    E_ABORTED,
    E_AT,
    E_BASE,
    E_BITS,
    E_CR2,
    E_CR3,
    E_DEEPEST,
    E_EXT,
    E_FLAGS,
    E_HAS_CR2,
    E_HAS_VECTOR,
    E_HAS_VMXQ,
    E_HAS_VMXR,
    E_HINTS,
    E_HW,
    E_ICNT,
    E_IFLAG,
    E_IP,
    E_LAST,
    E_MODE,
    E_MULT,
    E_NR,
    E_P0,
    E_P1,
    E_PAYLOAD,
    E_RATIO,
    E_SIZE,
    E_SPEC,
    E_STATE,
    E_SUBSTATE,
    E_TRBV,
    E_TSC,
    E_TYPE,
    E_VECTOR,
    E_VMXQ,
    E_VMXR,
    E_WAKE_HW,
    E_WAKE_INT,
    E_WAKE_ST,
    ERR_DECODE,
    ERR_RESYNC,
    ERR_SYNC,
    EV_ASYNC_BRANCH,
    EV_ASYNC_DISABLED,
    EV_ASYNC_PAGING,
    EV_ASYNC_VMCS,
    EV_CBR,
    EV_DISABLED,
    EV_ENABLED,
    EV_EXEC_MODE,
    EV_EXSTOP,
    EV_IFLAGS,
    EV_IGNORE,
    EV_INIT,
    EV_INTERRUPT,
    EV_IRET,
    EV_MNT,
    EV_MWAIT,
    EV_OVERFLOW,
    EV_PAGING,
    EV_PTWRITE,
    EV_PWRE,
    EV_PWRX,
    EV_RSM,
    EV_SHUTDOWN,
    EV_SIPI,
    EV_SMI,
    EV_STOP,
    EV_SWINTR,
    EV_SYSCALL,
    EV_TICK,
    EV_TIP,
    EV_TNT,
    EV_TRIG,
    EV_TSX,
    EV_UINTR,
    EV_UIRET,
    EV_VMCS,
    EV_VMENTRY,
    EV_VMEXIT,
    EW,
    F_HAS_TSC,
    F_RESUMED,
    F_RETURNED,
    F_STARTED,
    F_STATUS,
    F_SUPP,
    O_NEW,
    O_SPEC,
    O_UNCACHED,
    X_END,
    X_ERROR,
    X_RESYNC_DISABLED,
)
from .kinds import TNT8_AFTER_CYC, Kind

# The loops Python calls; the others are built into them, internal (see
# hwtrace.aot: a call between them passes only what the callee reads).
AOT_ENTRIES = ("run", "keep_flow_events")

# ---------------------------------------------------------------------------
# Constants, named after the Python reference's.  Plain ints, not the IntEnum
# members the other loops use: with members (passed on as arguments, they
# make IntEnum specialisations) the native library built after a first
# compile ran this decoder 1.7x slower than one built from ints.

# Packet kinds.
K_PAD = int(Kind.PAD)
K_PSB = int(Kind.PSB)
K_PSBEND = int(Kind.PSBEND)
K_TNT8 = int(Kind.TNT8)
K_TNT64 = int(Kind.TNT64)
# (a CYC and the TNT-8 after it, in a window's one row: see kinds.TNT8_AFTER_CYC)
K_TNT8_CYC = TNT8_AFTER_CYC
_NBITS = np.uint32(0xFF)  # a TNT row's b: its number of bits (a folded CYC's above)
K_TIP = int(Kind.TIP)
K_TIP_PGE = int(Kind.TIP_PGE)
K_TIP_PGD = int(Kind.TIP_PGD)
K_FUP = int(Kind.FUP)
K_MODE_EXEC = int(Kind.MODE_EXEC)
K_MODE_TSX = int(Kind.MODE_TSX)
K_PIP = int(Kind.PIP)
K_VMCS = int(Kind.VMCS)
K_CBR = int(Kind.CBR)
K_TSC = int(Kind.TSC)
K_MTC = int(Kind.MTC)
K_TMA = int(Kind.TMA)
K_CYC = int(Kind.CYC)
K_OVF = int(Kind.OVF)
K_STOP = int(Kind.STOP)
K_MNT = int(Kind.MNT)
K_PTW = int(Kind.PTW)
K_EXSTOP = int(Kind.EXSTOP)
K_MWAIT = int(Kind.MWAIT)
K_PWRE = int(Kind.PWRE)
K_PWRX = int(Kind.PWRX)
K_CFE = int(Kind.CFE)
K_EVD = int(Kind.EVD)
K_TRIG = int(Kind.TRIG)
K_INVALID = int(Kind.INVALID)

# Event types (EV_*), output markers (X_*, ERR_*): hwtrace.pt.flowrows.

# Error codes.
E_INTERNAL = int(PtError.INTERNAL)
E_NOSYNC = int(PtError.NOSYNC)
E_BAD_OPC = int(PtError.BAD_OPC)
E_BAD_PACKET = int(PtError.BAD_PACKET)
E_BAD_CONTEXT = int(PtError.BAD_CONTEXT)
E_EOS = int(PtError.EOS)
E_BAD_QUERY = int(PtError.BAD_QUERY)
E_NOMEM = int(PtError.NOMEM)
E_NOIP = int(PtError.NOIP)
E_IP_SUPPRESSED = int(PtError.IP_SUPPRESSED)
E_BAD_INSN = int(PtError.BAD_INSN)
E_RETSTACK_EMPTY = int(PtError.RETSTACK_EMPTY)
E_BAD_RETCOMP = int(PtError.BAD_RETCOMP)
E_BAD_STATUS_UPDATE = int(PtError.BAD_STATUS_UPDATE)
E_NO_ENABLE = int(PtError.NO_ENABLE)
E_EVENT_IGNORED = int(PtError.EVENT_IGNORED)

# Instruction classes and kinds.
C_UNKNOWN = int(IClass.UNKNOWN)
C_OTHER = int(IClass.OTHER)
C_CALL = int(IClass.CALL)
C_RETURN = int(IClass.RETURN)
C_JUMP = int(IClass.JUMP)
C_COND = int(IClass.COND_JUMP)
C_FAR_CALL = int(IClass.FAR_CALL)
C_FAR_RETURN = int(IClass.FAR_RETURN)
C_FAR_JUMP = int(IClass.FAR_JUMP)
C_PTWRITE = int(IClass.PTWRITE)
S_MOV_CR3 = int(Special.MOV_CR3)
S_VMLAUNCH = int(Special.VMLAUNCH)
S_VMRESUME = int(Special.VMRESUME)
S_VMPTRLD = int(Special.VMPTRLD)
S_IRET = int(Special.IRET)
S_UIRET = int(Special.UIRET)
S_JMPABS = int(Special.JMPABS)

# Event rows (E_*, EW, F_*): hwtrace.pt.flowrows.

# Event-queue bindings (the packet an event waits for).
B_PSBEND, B_TIP, B_FUP, B_FUP_BOUND, B_EXSTOP, B_CFE = 1, 2, 4, 8, 16, 32
QMAX = 6  # libipt's queue: 8 slots, one kept free, and one more for safety

# Block-decoder status flags (libipt's pts_*).
ST_IP_SUPPRESSED, ST_EVENT_PENDING, ST_EOS = 1, 2, 4
RETSTACK_SIZE = 64
_RS_MASK = RETSTACK_SIZE - 1
MAX_NINSN = 0xFFFF
BDM64_MAX_STEPS = 0x100
NO_TRACE_LIMIT = 1 << 20

# Predicates an instruction walk stops at.
P_NEVER, P_CR3, P_PIP, P_VMCS, P_PTWRITE, P_IRET, P_VMENTRY, P_UIRET, P_SKL014 = range(9)

# SI: integer state.
(
    ES_POS, ES_STATUS, ES_ENABLED, ES_BOUND, ES_MEV, ES_IFLAG, ES_CSD, ES_CSL, ES_HAVE_IP,
    ES_SUPP, ES_QN,
    BS_MODE, BS_ENABLED, BS_SPEC, BS_STATUS, BS_HAS_TSC, BS_CBR, BS_ICNT, BS_HAS_ICNT,
    BS_PROC, BS_INSN, BS_BOUND, BS_RS_TOP, BS_RS_N, BS_LAST, BS_HAVE_CR3, BS_HAVE_VMCS,
    CB_OPEN, CB_NINSN, CB_ISID, CB_LAST, CB_ICLASS, CB_ROW, CB_MODE,
    DR_PHASE, DR_STATUS, DR_END, DR_SYNC, DR_SYNC_FAILED,
    O_NBLK, O_NEV, O_NINSN, O_NBLOCKS, O_VBLK,
    W_N, W_END_ERR, W_LIMIT, W_EXACT, W_PENDING,
) = range(49)  # fmt: skip
NSI = 50
# SU: addresses and times.
ES_LAST_IP, BS_IP, BS_TSC, BS_CR3, BS_VMCS, CB_IP, CB_END_IP, DR_NEXT, W_END_OFFSET = range(9)
# (Where a step stopped at the TNT of a CYC and TNT in one row, an error
# there: the end of that row, whose offset is the CYC's; see _offset.)
ES_TNT_END = 9
NSU = 10

# Driver phases.
PH_START, PH_RUN, PH_RESYNC, PH_DONE = 0, 1, 2, 3
# run() results.
R_DONE, R_MISS, R_GROW, R_FULL, R_MORE, R_WINDOW, R_EVENT = range(7)

# Config (CF, int64).
(
    CF_FAST, CF_TICK, CF_END_ON_CALL, CF_END_ON_JUMP, CF_IFLAGS, CF_RESYNC, CF_STOP_EVENTS,
    CF_KEEP_GOING, CF_ERRATA, CF_NFILTER, CF_DROP_EMPTY, CF_COUNT, CF_STOP_TSC, CF_REPLAY,
    CF_STATUS_EVENTS,
) = range(15)  # fmt: skip
NCF = 15
# Errata bits in CF[CF_ERRATA].
ER_BDM70, ER_BDM64, ER_SKD022, ER_SKD010, ER_SKL014, ER_APL11, ER_APL12 = (1 << i for i in range(7))
# Stop-after-event modes (CF[CF_STOP_EVENTS]).
STOP_NONE, STOP_ENABLED, STOP_ALL = 0, 1, 2
# Block row flags (O_*): hwtrace.pt.flowrows.

_MASK48 = np.uint64(0xFFFFFFFFFFFF)


# ---------------------------------------------------------------------------
# Small helpers.


# The one-line helpers below are left to LLVM to inline: numba's
# inline="always" would build their IR again at each of their ~200 call
# sites, which costs compile time and changes no instruction.
@aot.njit(cache=True, _nrt=False)
def _err(code):
    return -np.int64(code)


@aot.njit(cache=True, _nrt=False)
def _aborted(r):
    return r <= -ABORT


@aot.njit(cache=True, _nrt=False)
def _ev_init(ev, t):
    for j in range(EW):
        ev[j] = 0
    ev[E_TYPE] = t


@aot.njit(cache=True, _nrt=False)
def _ev_copy(dst, src):
    for j in range(EW):
        dst[j] = src[j]


@aot.njit(cache=True, _nrt=False)
def _supp(ev):
    return (ev[E_FLAGS] & F_SUPP) != 0


@aot.njit(cache=True, _nrt=False)
def _status_update(ev):
    return (ev[E_FLAGS] & F_STATUS) != 0


@aot.njit(cache=True, _nrt=False)
def _has_tsc(ev):
    return (ev[E_FLAGS] & F_HAS_TSC) != 0


@aot.njit(cache=True, inline="always", _nrt=False)
def exec_mode_of(bits):
    csl = bits & 1
    csd = bits & 2
    if csl:
        return 0 if csd else 64
    return 32 if csd else 16


# ---------------------------------------------------------------------------
# The event queue.


@aot.njit(cache=True, _nrt=False)
def _q_enqueue(SI, QE, QB, binding):
    """A fresh event waiting for ``binding``; its slot, or -NOMEM."""
    n = SI[ES_QN]
    if n >= QMAX:
        return _err(E_NOMEM)
    _ev_init(QE[n], EV_IGNORE)
    QB[n] = binding
    SI[ES_QN] = n + 1
    return n


@aot.njit(cache=True, _nrt=False)
def _q_enqueue_row(SI, QE, QB, binding, row):
    n = _q_enqueue(SI, QE, QB, binding)
    if n >= 0:
        _ev_copy(QE[n], row)
    return n


@aot.njit(cache=True, _nrt=False)
def _q_put(SI, QE, QB, binding, row):
    """Queue the event ``row`` for ``binding``: 0, or -NOMEM."""
    s = _q_enqueue_row(SI, QE, QB, binding, row)
    return s if s < 0 else 0


@aot.njit(cache=True, _nrt=False)
def _q_find(SI, QE, QB, mask, t):
    for i in range(SI[ES_QN]):
        if QB[i] & mask and QE[i, E_TYPE] == t:
            return i
    return -1


@aot.njit(cache=True, _nrt=False)
def _q_peek(SI, QB, mask):
    for i in range(SI[ES_QN]):
        if QB[i] & mask:
            return i
    return -1


@aot.njit(cache=True, _nrt=False)
def _q_remove(SI, QE, QB, slot):
    n = SI[ES_QN]
    for i in range(slot, n - 1):
        QB[i] = QB[i + 1]
        for j in range(EW):
            QE[i, j] = QE[i + 1, j]
    SI[ES_QN] = n - 1


@aot.njit(cache=True, _nrt=False)
def _q_take(SI, QE, QB, slot, out):
    """Move the event in ``slot`` out of the queue, to ``out``."""
    _ev_copy(out, QE[slot])
    _q_remove(SI, QE, QB, slot)


@aot.njit(cache=True, _nrt=False)
def _q_dequeue(SI, QE, QB, mask, out):
    """Move the first event waiting for ``mask`` to ``out``; False if none."""
    i = _q_peek(SI, QB, mask)
    if i < 0:
        return False
    _q_take(SI, QE, QB, i, out)
    return True


@aot.njit(cache=True, _nrt=False)
def _q_dequeue_event(SI, QE, QB, mask, out):
    """``_q_dequeue``, passing over the EV_IGNORE placeholders."""
    while _q_dequeue(SI, QE, QB, mask, out):
        if out[E_TYPE] != EV_IGNORE:
            return True
    return False


# ---------------------------------------------------------------------------
# The event decoder (the oracles' EventDecoder).


@aot.njit(cache=True, inline="always", _nrt=False)
def _end_error(SI):
    """What reading past the last packet means: the packet decoder's verdict
    (end of stream, or its error), or an abort when more packets follow."""
    return _err(SI[W_END_ERR])


@aot.njit(cache=True, _nrt=False)
def _offset(SI, SU, pk):
    off = pk[4]
    pos = SI[ES_POS]
    if pos < SI[W_N]:
        o = off[pos]
        if pk[0][pos] == K_TNT8_CYC and SU[ES_TNT_END] == np.uint64(o + pk[5][pos]):
            # Past the CYC, at the TNT (see _at_tnt).
            return o + pk[5][pos] - 1
        return o
    return np.int64(SU[W_END_OFFSET])


@aot.njit(cache=True, inline="always", _nrt=False)
def _at_tnt(SI, SU, pk, i):
    """A step stops at the TNT-8 of row ``i`` (an error there): where it is
    a CYC and that TNT in one row, the decoder stands at the TNT, past the
    CYC, as it would have passed a CYC row of its own."""
    if pk[0][i] == K_TNT8_CYC:
        SU[ES_TNT_END] = np.uint64(pk[4][i] + pk[5][i])


@aot.njit(cache=True, _nrt=False)
def _next_position(SI, SU, pk):
    off = pk[4]
    size = pk[5]
    pos = SI[ES_POS]
    if pos < SI[W_N]:
        return off[pos] + size[pos]
    return _offset(SI, SU, pk)


@aot.njit(cache=True, _nrt=False)
def _ev_time(SI, pk, ev, index):
    tsc = pk[6]
    have = pk[7]
    i = SI[ES_POS] if index < 0 else index
    if 0 <= i < SI[W_N] and have[i]:
        ev[E_FLAGS] |= F_HAS_TSC
        ev[E_TSC] = tsc[i]


@aot.njit(cache=True, inline="always", _nrt=False)
def _ip_from(ipc, payload, last):
    """An IP packet's IP after ``last`` (as _update_ip has it): ``(True,
    ip)``, or ``(False, 0)`` when it has none (suppressed, or a reserved
    compression)."""
    if ipc == 1:
        return True, (last & ~np.uint64(0xFFFF)) | (payload & np.uint64(0xFFFF))
    if ipc == 2:
        return True, (last & ~np.uint64(0xFFFFFFFF)) | (payload & np.uint64(0xFFFFFFFF))
    if ipc == 3:
        if payload & np.uint64(1 << 47):
            return True, payload | np.uint64(0xFFFF000000000000)
        return True, payload
    if ipc == 4:
        return True, (last & ~_MASK48) | (payload & _MASK48)
    if ipc == 6:
        return True, payload
    return False, np.uint64(0)


@aot.njit(cache=True, _nrt=False)
def _update_ip(SI, SU, pk, i):
    a = pk[1]
    b = pk[2]
    ipc = b[i]
    if ipc == 0:
        SI[ES_SUPP] = 1
        return 0
    ok, ip = _ip_from(ipc, a[i], SU[ES_LAST_IP])
    if not ok:
        return _err(E_BAD_PACKET)
    SU[ES_LAST_IP] = ip
    SI[ES_HAVE_IP] = 1
    SI[ES_SUPP] = 0
    return 0


@aot.njit(cache=True, _nrt=False)
def _event_ip(SI, SU, ev):
    if not SI[ES_HAVE_IP] or SI[ES_SUPP]:
        ev[E_FLAGS] |= F_SUPP
    else:
        ev[E_IP] = SU[ES_LAST_IP]


@aot.njit(cache=True, _nrt=False)
def _ev_fetch(SI, pk):
    """Advance to the next packet, skipping PAD."""
    kind = pk[0]
    n = SI[W_N]
    p = SI[ES_POS] + 1
    while p < n and kind[p] == K_PAD:
        p += 1
    SI[ES_POS] = p


@aot.njit(cache=True, _nrt=False)
def _deliver(SI, pk, ev):
    """A standalone event: time now, then move past the packet."""
    _ev_time(SI, pk, ev, -1)
    _ev_fetch(SI, pk)
    return 1


@aot.njit(cache=True, _nrt=False)
def _at_fup_or_now(SI, QE, QB, pk, out, binding):
    """An event that takes its IP from a FUP: queued for it (``binding``,
    B_FUP or B_FUP_BOUND), or with ``binding`` 0 delivered now, its IP
    suppressed."""
    if binding:
        return _q_put(SI, QE, QB, binding, out)
    out[E_FLAGS] |= F_SUPP
    return _deliver(SI, pk, out)


@aot.njit(cache=True, _nrt=False)
def _at_async_tip_or_now(SI, QE, QB, pk, out, async_type):
    """A PIP's or VMCS's event: during an asynchronous branch it becomes
    ``async_type`` and waits for the branch's TIP, else it comes now."""
    if _q_find(SI, QE, QB, B_TIP, EV_ASYNC_BRANCH) >= 0:
        out[E_TYPE] = async_type
        return _q_put(SI, QE, QB, B_TIP, out)
    return _deliver(SI, pk, out)


@aot.njit(cache=True, inline="always", _nrt=False)
def _set_tsx(ev, bits):
    """A MODE.TSX payload: bit 0 in a transaction, bit 1 aborted."""
    ev[E_SPEC] = bits & np.uint64(1)
    ev[E_ABORTED] = (bits >> np.uint64(1)) & np.uint64(1)


@aot.njit(cache=True, inline="always", _nrt=False)
def _is_tnt(k):
    """A TNT packet's row (a CYC and the TNT-8 after it included)."""
    return k == K_TNT8 or k == K_TNT64 or k == K_TNT8_CYC


@aot.njit(cache=True, inline="always", _nrt=False)
def _is_timing(k):
    return k == K_TSC or k == K_CBR or k == K_TMA or k == K_MTC or k == K_CYC


@aot.njit(cache=True, _nrt=False)
def _header_event(SI, QE, QB, t, status):
    slot = _q_enqueue(SI, QE, QB, B_PSBEND)
    if slot < 0:
        return slot
    QE[slot, E_TYPE] = t
    if status:
        QE[slot, E_FLAGS] |= F_STATUS
    return slot


@aot.njit(cache=True, _nrt=False)
def _bdm70_applies(SI, pk):
    kind = pk[0]
    n = SI[W_N]
    j = SI[ES_POS] + 1
    while j < n:
        k = kind[j]
        if k == K_TIP_PGE:
            return 1
        if not (
            k == K_PAD or k == K_TSC or k == K_CBR or k == K_PSBEND or k == K_PIP
            or k == K_MODE_EXEC or k == K_MODE_TSX or k == K_VMCS or k == K_TMA
            or k == K_MTC or k == K_CYC or k == K_MNT
        ):  # fmt: skip
            return 0
        j += 1
    if SI[W_END_ERR] == ABORT_WINDOW:
        return -ABORT_WINDOW
    return 0


@aot.njit(cache=True, _nrt=False)
def _decode_psb(SI, SU, QE, QB, pk, cf):
    kind = pk[0]
    a = pk[1]
    b = pk[2]
    CF = cf[0]
    if SI[ES_QN]:
        return _err(E_BAD_CONTEXT)
    SI[ES_HAVE_IP] = 0
    SI[ES_SUPP] = 0
    SU[ES_LAST_IP] = 0
    SI[ES_ENABLED] = 0
    status = _q_enqueue(SI, QE, QB, B_PSBEND)  # slot 0: the queue was empty
    QE[status, E_FLAGS] |= F_STATUS
    iflags = CF[CF_IFLAGS] != 0
    while True:
        _ev_fetch(SI, pk)
        i = SI[ES_POS]
        if i >= SI[W_N]:
            return _end_error(SI)
        k = kind[i]
        if k == K_FUP:
            enabled = b[i] != 0
            if CF[CF_ERRATA] & ER_BDM70:
                r = _bdm70_applies(SI, pk)
                if r < 0:
                    return r
                if r:
                    enabled = False
            SI[ES_ENABLED] = enabled
            if enabled:
                r = _update_ip(SI, SU, pk, i)
                if r < 0:
                    return r
        elif k == K_MODE_EXEC:
            bits = np.int64(a[i])
            iflag = (bits >> 2) & 1
            csd = (bits >> 1) & 1
            csl = bits & 1
            if SI[ES_MEV]:
                if iflags and SI[ES_IFLAG] != iflag:
                    return _err(E_BAD_STATUS_UPDATE)
                if SI[ES_CSD] != csd or SI[ES_CSL] != csl:
                    return _err(E_BAD_STATUS_UPDATE)
            else:
                SI[ES_MEV] = 1
                SI[ES_IFLAG] = iflag
                SI[ES_CSD] = csd
                SI[ES_CSL] = csl
            s = _header_event(SI, QE, QB, EV_EXEC_MODE, True)
            if s < 0:
                return s
            QE[s, E_MODE] = exec_mode_of(bits)
            if iflags:
                s = _header_event(SI, QE, QB, EV_IFLAGS, True)
                if s < 0:
                    return s
                QE[s, E_IFLAG] = iflag
        elif k == K_MODE_TSX:
            s = _header_event(SI, QE, QB, EV_TSX, True)
            if s < 0:
                return s
            _set_tsx(QE[s], a[i])
        elif k == K_PIP:
            s = _header_event(SI, QE, QB, EV_ASYNC_PAGING, True)
            if s < 0:
                return s
            QE[s, E_CR3] = a[i]
            QE[s, E_NR] = b[i]
        elif k == K_VMCS:
            s = _header_event(SI, QE, QB, EV_ASYNC_VMCS, True)
            if s < 0:
                return s
            QE[s, E_BASE] = a[i]
        elif k == K_MNT:
            s = _header_event(SI, QE, QB, EV_MNT, False)
            if s < 0:
                return s
            QE[s, E_PAYLOAD] = a[i]
        elif k == K_CBR:
            s = _header_event(SI, QE, QB, EV_CBR, True)
            if s < 0:
                return s
            QE[s, E_RATIO] = a[i]
        elif _is_timing(k) or k == K_PAD:
            pass
        elif k == K_PSBEND:
            if SI[ES_ENABLED]:
                QE[status, E_TYPE] = EV_ENABLED
            else:
                QE[status, E_TYPE] = EV_DISABLED
                QE[status, E_FLAGS] |= F_SUPP
            return 0
        elif k == K_OVF:
            if SI[ES_ENABLED]:
                QE[status, E_TYPE] = EV_ENABLED
            else:
                _q_remove(SI, QE, QB, status)
            return 0
        else:
            _at_tnt(SI, SU, pk, i)
            return _err(E_BAD_CONTEXT)


@aot.njit(cache=True, _nrt=False)
def _decode_psbend(SI, SU, QE, QB, pk, out):
    if not _q_dequeue(SI, QE, QB, B_PSBEND, out):
        return 0
    t = out[E_TYPE]
    if (
        t == EV_ENABLED or t == EV_EXEC_MODE or t == EV_IFLAGS or t == EV_TSX
        or t == EV_ASYNC_PAGING or t == EV_ASYNC_VMCS
    ):  # fmt: skip
        _event_ip(SI, SU, out)
    elif not (t == EV_DISABLED or t == EV_CBR or t == EV_MNT):
        return _err(E_BAD_CONTEXT)
    _ev_time(SI, pk, out, -1)
    return 1


@aot.njit(cache=True, _nrt=False)
def _decode_fup(SI, SU, QE, QB, pk, i, out):
    while True:
        r = _update_ip(SI, SU, pk, i)  # idempotent: one FUP may bind several events
        if r < 0:
            return r
        if _q_peek(SI, QB, B_FUP_BOUND) >= 0:
            SI[ES_BOUND] = 1
        if not _q_dequeue(SI, QE, QB, B_FUP | B_FUP_BOUND, out):
            if SI[ES_BOUND]:
                return 0
            if not SI[ES_HAVE_IP]:
                return _err(E_NOIP)
            if SI[ES_SUPP]:
                return _err(E_IP_SUPPRESSED)
            s = _q_enqueue(SI, QE, QB, B_TIP)
            if s < 0:
                return s
            QE[s, E_TYPE] = EV_ASYNC_BRANCH
            QE[s, E_AT] = SU[ES_LAST_IP]
            return 0
        t = out[E_TYPE]
        if t == EV_OVERFLOW:
            _event_ip(SI, SU, out)
            SI[ES_ENABLED] = 1
        elif t == EV_IGNORE:
            continue
        elif t == EV_RSM or t == EV_SIPI:
            _ev_time(SI, pk, out, -1)
            if not _supp(out):
                return _err(E_INTERNAL)
        elif (
            t == EV_TSX or t == EV_EXSTOP or t == EV_MWAIT or t == EV_PTWRITE
            or t == EV_EXEC_MODE or t == EV_IFLAGS or t == EV_INTERRUPT or t == EV_IRET
            or t == EV_SMI or t == EV_INIT or t == EV_VMENTRY or t == EV_VMEXIT
            or t == EV_SHUTDOWN or t == EV_UINTR or t == EV_UIRET or t == EV_TRIG
            or t == EV_SWINTR or t == EV_SYSCALL
        ):  # fmt: skip
            _ev_time(SI, pk, out, -1)
            _event_ip(SI, SU, out)
        else:
            return _err(E_BAD_CONTEXT)
        return 1


@aot.njit(cache=True, _nrt=False)
def _decode_tip(SI, SU, QE, QB, pk, i, out):
    if not SI[ES_ENABLED]:
        return _err(E_BAD_CONTEXT)
    if not SI[ES_BOUND]:
        r = _update_ip(SI, SU, pk, i)
        if r < 0:
            return r
        SI[ES_BOUND] = 1
        asyn = _q_find(SI, QE, QB, B_TIP, EV_ASYNC_BRANCH)
        if asyn >= 0:
            # The asynchronous branch goes first; the first event bound to
            # the TIP takes its place in the queue.
            first = _q_peek(SI, QB, B_TIP)
            _ev_copy(out, QE[asyn])
            if first != asyn:
                _ev_copy(QE[asyn], QE[first])
                QB[asyn] = B_TIP
                _q_remove(SI, QE, QB, first)
            else:
                _q_remove(SI, QE, QB, asyn)
            _event_ip(SI, SU, out)
            _ev_time(SI, pk, out, -1)
            return 1
        _ev_init(out, EV_TIP)
        _event_ip(SI, SU, out)
        _ev_time(SI, pk, out, -1)
        return 1
    if not _q_dequeue_event(SI, QE, QB, B_TIP, out):
        return 0
    t = out[E_TYPE]
    if t == EV_EXEC_MODE or t == EV_ASYNC_PAGING or t == EV_ASYNC_VMCS or t == EV_IFLAGS:
        _event_ip(SI, SU, out)
    elif t == EV_ASYNC_BRANCH:
        return _err(E_INTERNAL)
    else:
        return _err(E_BAD_CONTEXT)
    _ev_time(SI, pk, out, -1)
    return 1


@aot.njit(cache=True, _nrt=False)
def _decode_tip_pge(SI, SU, QE, QB, pk, i, out):
    if not SI[ES_BOUND]:
        r = _update_ip(SI, SU, pk, i)
        if r < 0:
            return r
        _ev_init(out, EV_ENABLED)
        _event_ip(SI, SU, out)
        SI[ES_ENABLED] = 1
        SI[ES_BOUND] = 1
        _ev_time(SI, pk, out, -1)
        return 1
    if not _q_dequeue_event(SI, QE, QB, B_TIP, out):
        return 0
    t = out[E_TYPE]
    if t == EV_EXEC_MODE or t == EV_IFLAGS:
        _event_ip(SI, SU, out)
    else:
        return _err(E_BAD_CONTEXT)
    _ev_time(SI, pk, out, -1)
    return 1


@aot.njit(cache=True, _nrt=False)
def _decode_tip_pgd(SI, SU, QE, QB, pk, i, out):
    while True:
        if not SI[ES_BOUND]:
            r = _update_ip(SI, SU, pk, i)
            if r < 0:
                return r
        if not _q_dequeue(SI, QE, QB, B_TIP, out):
            if SI[ES_BOUND]:
                return 0
            _ev_init(out, EV_DISABLED)
            _event_ip(SI, SU, out)
            _ev_time(SI, pk, out, -1)
            SI[ES_ENABLED] = 0
            _ev_fetch(SI, pk)
            return 1
        t = out[E_TYPE]
        if t == EV_ASYNC_BRANCH:
            out[E_TYPE] = EV_ASYNC_DISABLED
            _event_ip(SI, SU, out)
            SI[ES_ENABLED] = 0
            SI[ES_BOUND] = 1
        elif (
            t == EV_ASYNC_PAGING or t == EV_ASYNC_VMCS or t == EV_EXEC_MODE or t == EV_IFLAGS
            or t == EV_IGNORE
        ):  # fmt: skip
            if (t == EV_ASYNC_PAGING or t == EV_ASYNC_VMCS) and not SI[ES_BOUND]:
                return _err(E_INTERNAL)
            if t == EV_IGNORE:
                continue
            out[E_FLAGS] |= F_SUPP
        else:
            return _err(E_BAD_CONTEXT)
        _ev_time(SI, pk, out, -1)
        return 1


@aot.njit(cache=True, _nrt=False)
def _decode_mode_exec(SI, QE, QB, pk, cf, i):
    a = pk[1]
    iflags = cf[0][CF_IFLAGS] != 0
    bits = np.int64(a[i])
    iflag = (bits >> 2) & 1
    csd = (bits >> 1) & 1
    csl = bits & 1
    n = 0
    if not SI[ES_MEV] or SI[ES_CSL] != csl or SI[ES_CSD] != csd:
        s = _q_enqueue(SI, QE, QB, B_TIP | B_FUP_BOUND)
        if s < 0:
            return s
        QE[s, E_TYPE] = EV_EXEC_MODE
        QE[s, E_MODE] = exec_mode_of(bits)
        SI[ES_CSL] = csl
        SI[ES_CSD] = csd
        n += 1
    if iflags and (not SI[ES_MEV] or SI[ES_IFLAG] != iflag):
        s = _q_enqueue(SI, QE, QB, B_TIP | B_FUP_BOUND)
        if s < 0:
            return s
        QE[s, E_TYPE] = EV_IFLAGS
        QE[s, E_IFLAG] = iflag
        SI[ES_IFLAG] = iflag
        n += 1
    if not n:
        s = _q_enqueue(SI, QE, QB, B_TIP | B_FUP_BOUND)
        if s < 0:
            return s
        QE[s, E_TYPE] = EV_IGNORE
    SI[ES_MEV] = 1
    return 0


@aot.njit(cache=True, _nrt=False)
def _decode_mode_tsx(SI, QE, QB, pk, i, out):
    a = pk[1]
    _ev_init(out, EV_TSX)
    _set_tsx(out, a[i])
    binding = 0
    if SI[ES_ENABLED]:
        binding = B_FUP if out[E_ABORTED] else B_FUP_BOUND
    return _at_fup_or_now(SI, QE, QB, pk, out, binding)


@aot.njit(cache=True, _nrt=False)
def _decode_pip(SI, QE, QB, pk, i, out):
    a = pk[1]
    b = pk[2]
    _ev_init(out, EV_PAGING)
    out[E_CR3] = a[i]
    out[E_NR] = b[i]
    return _at_async_tip_or_now(SI, QE, QB, pk, out, EV_ASYNC_PAGING)


@aot.njit(cache=True, _nrt=False)
def _decode_vmcs(SI, QE, QB, pk, i, out):
    a = pk[1]
    paging = _q_find(SI, QE, QB, B_TIP, EV_ASYNC_PAGING)
    if paging >= 0:
        # VMCS goes before a PIP of the same asynchronous branch.
        s = _q_enqueue_row(SI, QE, QB, B_TIP, QE[paging])
        if s < 0:
            return s
        QE[paging, E_TYPE] = EV_ASYNC_VMCS
        QE[paging, E_BASE] = a[i]
        return 0
    _ev_init(out, EV_VMCS)
    out[E_BASE] = a[i]
    return _at_async_tip_or_now(SI, QE, QB, pk, out, EV_ASYNC_VMCS)


@aot.njit(cache=True, _nrt=False)
def _decode_exstop(SI, QE, QB, pk, i, out):
    c = pk[3]
    has_ip = c[i] != 0
    mwait = _q_find(SI, QE, QB, B_EXSTOP, EV_MWAIT)
    if mwait >= 0:
        _q_take(SI, QE, QB, mwait, out)
        if not has_ip:
            out[E_FLAGS] |= F_SUPP
            _ev_time(SI, pk, out, -1)
            return 1  # the EXSTOP itself comes on the next call
        s = _q_put(SI, QE, QB, B_FUP_BOUND, out)
        if s < 0:
            return s
    _ev_init(out, EV_EXSTOP)
    return _at_fup_or_now(SI, QE, QB, pk, out, B_FUP_BOUND if has_ip else 0)


@aot.njit(cache=True, _nrt=False)
def _decode_ptw(SI, QE, QB, pk, i, out):
    a = pk[1]
    b = pk[2]
    c = pk[3]
    plc = b[i]
    if plc > 1:
        return _err(E_BAD_PACKET)
    _ev_init(out, EV_PTWRITE)
    out[E_SIZE] = 4 << plc
    out[E_PAYLOAD] = a[i]
    return _at_fup_or_now(SI, QE, QB, pk, out, B_FUP_BOUND if c[i] else 0)


@aot.njit(cache=True, _nrt=False)
def _find_ovf_fup(SI, pk):
    """The FUP an OVF binds to: ``(0, index)``; ``(1, 0)`` when tracing
    resumed disabled; ``(2, code)`` when the stream contradicts."""
    kind = pk[0]
    n = SI[W_N]
    j = SI[ES_POS] + 1
    while j < n:
        k = kind[j]
        if k == K_FUP:
            return 0, j
        if _is_timing(k) or k == K_PAD or k == K_MNT or k == K_INVALID:
            j += 1
            continue
        if k == K_PSBEND or k == K_TIP or k == K_TIP_PGD or _is_tnt(k):
            return 2, np.int64(E_BAD_CONTEXT)
        return 1, np.int64(0)
    if SI[W_END_ERR] == ABORT_WINDOW:
        return 2, np.int64(ABORT_WINDOW)
    return 2, np.int64(E_EOS)


@aot.njit(cache=True, _nrt=False)
def _overflow_at(SI, SU, pk, ovf, resume, ip_index, out):
    """Resume at packet ``resume`` with an overflow event."""
    _ev_init(out, EV_OVERFLOW)
    _ev_time(SI, pk, out, ovf)
    if ip_index >= 0:
        r = _update_ip(SI, SU, pk, ip_index)
        if r < 0:
            return r
        SI[ES_ENABLED] = 1
        _event_ip(SI, SU, out)
    else:
        out[E_FLAGS] |= F_SUPP
    SI[ES_POS] = resume
    return 1


@aot.njit(cache=True, _nrt=False)
def _window_end(SI):
    # A look-ahead reached the last packet: past it is either more trace
    # (abort: the caller gets more) or the end.
    if SI[W_END_ERR] == ABORT_WINDOW:
        return -ABORT_WINDOW
    return 0


@aot.njit(cache=True, _nrt=False)
def _handle_skd010(SI, SU, QE, QB, pk, ovf, out):
    kind = pk[0]
    a = pk[1]
    c = pk[3]
    n = SI[W_N]
    have_tsx = False
    tsx = np.uint64(0)
    j = ovf + 1
    while j < n:
        k = kind[j]
        if k == K_TIP_PGE:
            return 0
        if k == K_TIP_PGD:
            r = _overflow_at(SI, SU, pk, ovf, j, -1, out)
            _ev_fetch(SI, pk)
            return r
        if _is_tnt(k) or k == K_OVF or k == K_STOP or k == K_MWAIT:
            return 0
        if k == K_INVALID:
            return 0
        if k == K_MODE_TSX:
            if have_tsx:
                return 0
            have_tsx = True
            tsx = a[j]
        elif k == K_FUP:
            if have_tsx:
                s = _q_enqueue(SI, QE, QB, B_FUP_BOUND)
                if s < 0:
                    return s
                QE[s, E_TYPE] = EV_TSX
                _set_tsx(QE[s], tsx)
            return _overflow_at(SI, SU, pk, ovf, j, j, out)
        elif k == K_TIP:
            r = _overflow_at(SI, SU, pk, ovf, j, j, out)
            if r < 0:
                return r
            _ev_fetch(SI, pk)
            return r
        elif k == K_PSB:
            m = j + 1
            while m < n:
                km = kind[m]
                if km == K_FUP:
                    return _overflow_at(SI, SU, pk, ovf, j, m, out)
                if km == K_PSBEND or km == K_OVF:
                    return 0
                if not (
                    _is_timing(km) or km == K_MODE_EXEC or km == K_MODE_TSX or km == K_PIP
                    or km == K_VMCS or km == K_MNT or km == K_PAD or km == K_INVALID
                ):  # fmt: skip
                    return _err(E_BAD_CONTEXT)
                m += 1
            return _window_end(SI)
        elif k == K_PSBEND:
            return _err(E_BAD_CONTEXT)
        elif k == K_EXSTOP and c[j]:
            return 0
        elif k == K_PTW and c[j]:
            return 0
        j += 1
    return _window_end(SI)


@aot.njit(cache=True, _nrt=False)
def _handle_apl11(SI, SU, pk, ovf, out):
    kind = pk[0]
    n = SI[W_N]
    j = ovf + 1
    while j < n:
        k = kind[j]
        if k == K_TIP_PGD:
            r = _overflow_at(SI, SU, pk, ovf, j, -1, out)
            _ev_fetch(SI, pk)
            return r
        if _is_timing(k) or k == K_PAD or k == K_MNT:
            j += 1
            continue
        return 0
    return _window_end(SI)


@aot.njit(cache=True, _nrt=False)
def _ovf_at_offset(SI, SU, pk, ovf, fup, out):
    r = _overflow_at(SI, SU, pk, ovf, fup, -1, out)
    _ev_fetch(SI, pk)
    return r


@aot.njit(cache=True, _nrt=False)
def _handle_apl12(SI, SU, pk, ovf, fup, out):
    kind = pk[0]
    n = SI[W_N]
    j = fup + 1
    while j < n:
        k = kind[j]
        if (
            _is_tnt(k) or k == K_TIP or k == K_TIP_PGD or k == K_PSBEND or k == K_OVF
        ):  # fmt: skip
            return 0
        if k == K_PSB:
            has_fup = False
            ended = False
            m = j + 1
            while m < n:
                km = kind[m]
                if km == K_FUP:
                    has_fup = True
                    ended = True
                    break
                if km == K_PSBEND or km == K_OVF:
                    ended = True
                    break
                m += 1
            if not ended and SI[W_END_ERR] == ABORT_WINDOW:
                return -ABORT_WINDOW
            if has_fup:
                return 0
            return _ovf_at_offset(SI, SU, pk, ovf, fup, out)
        if k == K_STOP or k == K_TIP_PGE:
            return _ovf_at_offset(SI, SU, pk, ovf, fup, out)
        if k == K_INVALID:
            return 0
        j += 1
    return _window_end(SI)


@aot.njit(cache=True, _nrt=False)
def _decode_ovf(SI, SU, QE, QB, pk, cf, out):
    r = _decode_psbend(SI, SU, QE, QB, pk, out)
    if r != 0:
        return r
    # Power events still waiting for their EXSTOP or FUP happened before the
    # overflow: report them first, in order, without an IP.
    for s in range(SI[ES_QN]):
        t = QE[s, E_TYPE]
        if t == EV_MWAIT or t == EV_EXSTOP or t == EV_PWRE:
            _q_take(SI, QE, QB, s, out)
            out[E_FLAGS] |= F_SUPP
            _ev_time(SI, pk, out, -1)
            return 1
    errata = cf[0][CF_ERRATA]
    ovf = SI[ES_POS]
    # Reset (the queue too).
    SI[ES_ENABLED] = 0
    SI[ES_BOUND] = 0
    SI[ES_MEV] = 0
    SI[ES_HAVE_IP] = 0
    SI[ES_SUPP] = 0
    SU[ES_LAST_IP] = 0
    SI[ES_QN] = 0
    found, fup = _find_ovf_fup(SI, pk)
    if found == 2 and fup == ABORT_WINDOW:
        return -ABORT_WINDOW
    if found != 0:
        if errata & ER_SKD010:
            r = _handle_skd010(SI, SU, QE, QB, pk, ovf, out)
            if r != 0:
                return r
        if errata & ER_APL11 and found == 2 and fup == E_BAD_CONTEXT:
            r = _handle_apl11(SI, SU, pk, ovf, out)
            if r != 0:
                return r
        if found == 2 and fup != E_EOS:
            return _err(fup)
        _ev_init(out, EV_OVERFLOW)
        out[E_FLAGS] |= F_SUPP
        return _deliver(SI, pk, out)
    if errata & ER_APL12:
        r = _handle_apl12(SI, SU, pk, ovf, fup, out)
        if r != 0:
            return r
    s = _q_enqueue(SI, QE, QB, B_FUP_BOUND)
    if s < 0:
        return s
    QE[s, E_TYPE] = EV_OVERFLOW
    _ev_time(SI, pk, QE[s], -1)
    return 0


# CFE types (a 5-bit field) whose event is the type alone (with the vector
# for uintr and swintr), and whether it waits for a FUP while tracing is
# enabled (iret, vmentry, shutdown and uiret never do).
_CFE_EVENT = np.full(32, -1, np.int64)
_CFE_TO_FUP = np.zeros(32, np.bool_)
for _t, _ev, _to_fup in (
    (2, EV_IRET, False), (3, EV_SMI, True), (6, EV_INIT, True), (7, EV_VMENTRY, False),
    (10, EV_SHUTDOWN, False), (12, EV_UINTR, True), (13, EV_UIRET, False),
    (14, EV_SWINTR, True), (15, EV_SYSCALL, True),
):  # fmt: skip
    _CFE_EVENT[_t] = _ev
    _CFE_TO_FUP[_t] = _to_fup


@aot.njit(cache=True, inline="always", _nrt=False)
def _cfe_binding(has_ip, to_fup):
    """A CFE's event waits for its own FUP, else (tracing enabled, see
    ``_CFE_TO_FUP``) for the next one, else none: it comes now."""
    if has_ip:
        return B_FUP_BOUND
    return B_FUP if to_fup else 0


@aot.njit(cache=True, _nrt=False)
def _decode_cfe(SI, QE, QB, pk, i, out):
    a = pk[1]
    b = pk[2]
    c = pk[3]
    t = np.int64(a[i])
    vector = np.uint64(b[i])
    has_ip = c[i] != 0
    enabled = SI[ES_ENABLED] != 0
    found = _q_dequeue(SI, QE, QB, B_CFE, out)
    if t == 1 or t == 8 or t == 9:  # interrupt, vmexit, vmexit_intr
        want = EV_INTERRUPT if t == 1 else EV_VMEXIT
        if not found:
            _ev_init(out, want)
        if out[E_TYPE] != want:
            return _err(E_BAD_CONTEXT)
        if t == 1:
            out[E_VECTOR] = vector
        elif t == 9:
            out[E_HAS_VECTOR] = 1
            out[E_VECTOR] = vector
        return _at_fup_or_now(SI, QE, QB, pk, out, _cfe_binding(has_ip, enabled))
    if found:
        return _err(E_BAD_CONTEXT)
    ev = _CFE_EVENT[t]
    if ev >= 0:
        _ev_init(out, ev)
        if t == 12 or t == 14:  # uintr, swintr
            out[E_VECTOR] = vector
        binding = _cfe_binding(has_ip, enabled and _CFE_TO_FUP[t])
        return _at_fup_or_now(SI, QE, QB, pk, out, binding)
    if t == 4 or t == 5:  # rsm, sipi
        if has_ip:
            return _err(E_BAD_PACKET)
        _ev_init(out, EV_RSM if t == 4 else EV_SIPI)
        out[E_FLAGS] |= F_SUPP
        if t == 5:
            out[E_VECTOR] = vector
        if enabled:
            return _q_put(SI, QE, QB, B_FUP, out)
        return _deliver(SI, pk, out)
    if has_ip:
        s = _q_enqueue(SI, QE, QB, B_FUP_BOUND)
        if s < 0:
            return s
        QE[s, E_TYPE] = EV_IGNORE
    return 0


@aot.njit(cache=True, _nrt=False)
def _decode_evd(SI, QE, QB, pk, i):
    a = pk[1]
    b = pk[2]
    t = b[i]
    payload = a[i]
    s = _q_peek(SI, QB, B_CFE)
    if t == 0:  # cr2
        if s >= 0:
            return _err(E_BAD_CONTEXT)
        s = _q_enqueue(SI, QE, QB, B_CFE)
        if s < 0:
            return s
        QE[s, E_TYPE] = EV_INTERRUPT
        QE[s, E_HAS_CR2] = 1
        QE[s, E_CR2] = payload
    elif t == 1 or t == 2:  # vmxq, vmxr
        if s < 0:
            s = _q_enqueue(SI, QE, QB, B_CFE)
            if s < 0:
                return s
            QE[s, E_TYPE] = EV_VMEXIT
        if QE[s, E_TYPE] != EV_VMEXIT:
            return _err(E_BAD_CONTEXT)
        if t == 1:
            if QE[s, E_HAS_VMXQ]:
                return _err(E_BAD_CONTEXT)
            QE[s, E_HAS_VMXQ] = 1
            QE[s, E_VMXQ] = payload
        else:
            if QE[s, E_HAS_VMXR]:
                return _err(E_BAD_CONTEXT)
            QE[s, E_HAS_VMXR] = 1
            QE[s, E_VMXR] = payload
    return 0


@aot.njit(cache=True, _nrt=False)
def _decode_trig(SI, QE, QB, pk, i, out):
    a = pk[1]
    b = pk[2]
    c = pk[3]
    trbv = a[i]
    icnt = b[i]
    flags = c[i]
    has_ip = flags & 1
    icntv = (flags >> 1) & 1
    mult = (flags >> 2) & 1
    if has_ip and (not icntv or icnt):
        return _err(E_BAD_PACKET)
    _ev_init(out, EV_TRIG)
    out[E_TRBV] = trbv
    out[E_MULT] = mult
    if has_ip:
        return _q_put(SI, QE, QB, B_FUP_BOUND, out)
    if icntv:
        if icnt and not SI[ES_ENABLED]:
            return _err(E_BAD_PACKET)
        out[E_ICNT] = icnt
    else:
        out[E_FLAGS] |= F_SUPP
    return _deliver(SI, pk, out)


@aot.njit(cache=True, _nrt=False)
def _decode_packet(SI, SU, QE, QB, pk, cf, out):
    """One packet: 1 with an event in ``out``, 0 when the next packet is
    needed, or -code."""
    kind = pk[0]
    a = pk[1]
    b = pk[2]
    c = pk[3]
    while True:
        i = SI[ES_POS]
        if i >= SI[W_N]:
            return _end_error(SI)
        k = kind[i]
        if _is_tnt(k):
            if not SI[ES_ENABLED]:
                _at_tnt(SI, SU, pk, i)
                return _err(E_BAD_CONTEXT)
            _ev_init(out, EV_TNT)
            out[E_BITS] = a[i]
            out[E_SIZE] = b[i] & _NBITS
            _ev_time(SI, pk, out, -1)
            _ev_fetch(SI, pk)
            return 1
        if _is_timing(k):
            if k == K_CBR:
                _ev_init(out, EV_CBR)
                out[E_RATIO] = a[i]
                return _deliver(SI, pk, out)
            return 0
        if k == K_PAD or k == K_INVALID:
            return 0
        if k == K_FUP:
            return _decode_fup(SI, SU, QE, QB, pk, i, out)
        if k == K_TIP:
            return _decode_tip(SI, SU, QE, QB, pk, i, out)
        if k == K_TIP_PGE:
            return _decode_tip_pge(SI, SU, QE, QB, pk, i, out)
        if k == K_TIP_PGD:
            return _decode_tip_pgd(SI, SU, QE, QB, pk, i, out)
        if k == K_MODE_EXEC:
            return _decode_mode_exec(SI, QE, QB, pk, cf, i)
        if k == K_MODE_TSX:
            return _decode_mode_tsx(SI, QE, QB, pk, i, out)
        if k == K_PIP:
            return _decode_pip(SI, QE, QB, pk, i, out)
        if k == K_VMCS:
            return _decode_vmcs(SI, QE, QB, pk, i, out)
        if k == K_PSB:
            r = _decode_psb(SI, SU, QE, QB, pk, cf)
            if r < 0:
                return r
            continue
        if k == K_PSBEND:
            return _decode_psbend(SI, SU, QE, QB, pk, out)
        if k == K_OVF:
            return _decode_ovf(SI, SU, QE, QB, pk, cf, out)
        if k == K_STOP:
            _ev_init(out, EV_STOP)
            return _deliver(SI, pk, out)
        if k == K_MNT:
            _ev_init(out, EV_MNT)
            out[E_PAYLOAD] = a[i]
            return _deliver(SI, pk, out)
        if k == K_EXSTOP:
            return _decode_exstop(SI, QE, QB, pk, i, out)
        if k == K_MWAIT:
            s = _q_enqueue(SI, QE, QB, B_EXSTOP)
            if s < 0:
                return s
            QE[s, E_TYPE] = EV_MWAIT
            QE[s, E_HINTS] = a[i]
            QE[s, E_EXT] = b[i]
            return 0
        if k == K_PWRE:
            # The C-state is entered after execution stops: the event waits
            # for the EXSTOP (and its FUP) and comes out at the PWRX or OVF.
            s = _q_enqueue(SI, QE, QB, B_EXSTOP)
            if s < 0:
                return s
            QE[s, E_TYPE] = EV_PWRE
            QE[s, E_STATE] = a[i]
            QE[s, E_SUBSTATE] = b[i]
            QE[s, E_HW] = c[i]
            return 0
        if k == K_PWRX:
            s = _q_find(SI, QE, QB, B_EXSTOP, EV_PWRE)
            if s >= 0:
                _q_take(SI, QE, QB, s, out)
                _ev_time(SI, pk, out, -1)
                return 1  # the PWRX itself comes on a later call
            _ev_init(out, EV_PWRX)
            out[E_LAST] = a[i]
            out[E_DEEPEST] = b[i]
            wake = c[i]
            out[E_WAKE_INT] = wake & 1
            out[E_WAKE_ST] = (wake >> 1) & 1
            out[E_WAKE_HW] = (wake >> 2) & 1
            return _deliver(SI, pk, out)
        if k == K_PTW:
            return _decode_ptw(SI, QE, QB, pk, i, out)
        if k == K_CFE:
            return _decode_cfe(SI, QE, QB, pk, i, out)
        if k == K_EVD:
            return _decode_evd(SI, QE, QB, pk, i)
        if k == K_TRIG:
            return _decode_trig(SI, QE, QB, pk, i, out)
        # BBP/BIP/BEP and unknown packets carry nothing for the flow.
        return 0


@aot.njit(cache=True, _nrt=False)
def ev_next(ds, pk, cf, out):
    """The next event into ``out`` (EventDecoder.next); 0 or -code."""
    SI, SU, QE, QB = ds[0], ds[1], ds[4], ds[5]
    if SI[ES_STATUS]:
        return _err(SI[ES_STATUS])
    kind = pk[0]
    while True:
        # Packets that carry nothing for the flow are passed over here: a
        # call to _decode_packet copies the decoder's state, and timing
        # packets come between most others.
        i = SI[ES_POS]
        if i < SI[W_N]:
            k = kind[i]
            if k == K_PAD or k == K_TSC or k == K_MTC or k == K_TMA or k == K_CYC:
                SI[ES_BOUND] = 0
                _ev_fetch(SI, pk)
                continue
        r = _decode_packet(SI, SU, QE, QB, pk, cf, out)
        if r < 0:
            if not _aborted(r):
                SI[ES_STATUS] = -r
            return r
        if r == 1:
            return 0
        SI[ES_BOUND] = 0
        _ev_fetch(SI, pk)


@aot.njit(cache=True, _nrt=False)
def ev_start(ds, pk, cf):
    """Process the initial PSB+ (EventDecoder.start)."""
    SI, SU, QE, QB = ds[0], ds[1], ds[4], ds[5]
    kind = pk[0]
    n = SI[W_N]
    p = SI[ES_POS]
    while p < n and kind[p] == K_PAD:
        p += 1
    SI[ES_POS] = p
    if p >= n:
        return _end_error(SI)
    if kind[p] != K_PSB:
        return _err(E_NOSYNC)
    return _decode_psb(SI, SU, QE, QB, pk, cf)


# ---------------------------------------------------------------------------
# Saving and restoring state (step rollback, look-ahead probes).


@aot.njit(cache=True, inline="always", _nrt=False)
def _copy_words(dst, src, n):
    """``dst[:n] = src[:n]``, four words loaded before four are stored:
    LLVM cannot tell the arrays apart, and word by word it copies them one
    at a time (a load and a store each); so it moves them in vectors."""
    j = 0
    while j + 4 <= n:
        a, b, c, d = src[j], src[j + 1], src[j + 2], src[j + 3]
        dst[j], dst[j + 1], dst[j + 2], dst[j + 3] = a, b, c, d
        j += 4
    while j < n:
        dst[j] = src[j]
        j += 1


@aot.njit(cache=True, inline="always", _nrt=False)
def save_state(ds, slot):
    SI, SU, CUR, QE, QB, RS = ds[0], ds[1], ds[2], ds[4], ds[5], ds[6]
    sSI, sSU, sCUR, sQE, sQB, sRS = ds[7], ds[8], ds[9], ds[10], ds[11], ds[12]
    _copy_words(sSI[slot], SI, NSI)
    _copy_words(sSU[slot], SU, NSU)
    _copy_words(sCUR[slot], CUR, EW)
    for q in range(SI[ES_QN]):
        sQB[slot, q] = QB[q]
        for j in range(EW):
            sQE[slot, q, j] = QE[q, j]
    sRSR, RSR = ds[15], ds[14]
    for j in range(RETSTACK_SIZE):
        sRS[slot, j] = RS[j]
        sRSR[slot, j] = RSR[j]


@aot.njit(cache=True, inline="always", _nrt=False)
def restore_state(ds, slot):
    SI, SU, CUR, QE, QB, RS = ds[0], ds[1], ds[2], ds[4], ds[5], ds[6]
    sSI, sSU, sCUR, sQE, sQB, sRS = ds[7], ds[8], ds[9], ds[10], ds[11], ds[12]
    _copy_words(SI, sSI[slot], NSI)
    _copy_words(SU, sSU[slot], NSU)
    _copy_words(CUR, sCUR[slot], EW)
    for q in range(SI[ES_QN]):
        QB[q] = sQB[slot, q]
        for j in range(EW):
            QE[q, j] = sQE[slot, q, j]
    sRSR, RSR = ds[15], ds[14]
    for j in range(RETSTACK_SIZE):
        RS[j] = sRS[slot, j]
        RSR[j] = sRSR[slot, j]


# ---------------------------------------------------------------------------
# Instructions.


@aot.njit(cache=True, _nrt=False)
def _insn(ct, ip, mode):
    """The instruction table index at ``(ip, mode)``; -ABORT_MISS (with the
    address noted) when it is not decoded yet."""
    k = hash_find(ct[0], ct[1], ct[2], ip, mode)
    if k < 0:
        counts = ct[24]
        counts[C_MISS_IP] = np.int64(ip)
        counts[C_MISS_MODE] = mode
        return -ABORT_MISS
    return k


@aot.njit(cache=True, inline="always", _nrt=False)
def _i_next(ct, k):
    return ct[3][k] + np.uint64(ct[4][k])


@aot.njit(cache=True, _nrt=False)
def _next_ip(ct, k):
    """Where execution continues after insn ``k`` without trace:
    ``(0, ip)``, or ``(-code, 0)`` (BAD_QUERY: trace is needed)."""
    c = ct[5][k]
    if c == C_OTHER or c == C_PTWRITE:
        return 0, _i_next(ct, k)
    if (c == C_JUMP or c == C_CALL) and ct[7][k] & I_DIRECT and ct[6][k] != S_JMPABS:
        return 0, ct[8][k]
    if c == C_UNKNOWN:
        return _err(E_BAD_INSN), np.uint64(0)
    return _err(E_BAD_QUERY), np.uint64(0)


@aot.njit(cache=True, inline="always", _nrt=False)
def _is_far(c):
    return c == C_FAR_CALL or c == C_FAR_RETURN or c == C_FAR_JUMP


@aot.njit(cache=True, _nrt=False)
def _pred(ct, k, pred):
    c = ct[5][k]
    sp = ct[6][k]
    if pred == P_NEVER:
        return False
    if pred == P_CR3:
        return sp == S_MOV_CR3
    if pred == P_PIP:
        return sp == S_MOV_CR3 or sp == S_VMLAUNCH or sp == S_VMRESUME or _is_far(c)
    if pred == P_VMCS:
        return sp == S_VMPTRLD or sp == S_VMLAUNCH or sp == S_VMRESUME or _is_far(c)
    if pred == P_PTWRITE:
        return c == C_PTWRITE
    if pred == P_IRET:
        return sp == S_IRET
    if pred == P_VMENTRY:
        return sp == S_VMLAUNCH or sp == S_VMRESUME
    if pred == P_UIRET:
        return sp == S_UIRET
    # P_SKL014: a direct near jump or call, or a MOV to CR3.
    if c == C_JUMP or c == C_CALL:
        return (ct[7][k] & I_DIRECT) != 0 and sp != S_JMPABS
    return c == C_OTHER and sp == S_MOV_CR3


@aot.njit(cache=True, inline="always", _nrt=False)
def _bind_pred(t):
    """The instruction (a ``_pred``) a PIP, VMCS, PTWRITE, IRET, VMENTRY or
    UIRET event binds to."""
    if t == EV_PAGING:
        return P_PIP
    if t == EV_VMCS:
        return P_VMCS
    if t == EV_PTWRITE:
        return P_PTWRITE
    if t == EV_IRET:
        return P_IRET
    if t == EV_VMENTRY:
        return P_VMENTRY
    return P_UIRET


@aot.njit(cache=True, inline="always", _nrt=False)
def _bound_bit(t):
    return np.int64(1) << np.int64(t)


# ---------------------------------------------------------------------------
# The block decoder (the oracles' BlockDecoder).


@aot.njit(cache=True, _nrt=False)
def _status(SI, flags):
    if not SI[BS_ENABLED]:
        flags |= ST_IP_SUPPRESSED
    if SI[BS_STATUS] == E_EOS:
        flags |= ST_EOS
    return flags


@aot.njit(cache=True, _nrt=False)
def _update_trig_anchor(SI, ev):
    t = ev[E_TYPE]
    if t == EV_DISABLED or t == EV_ASYNC_DISABLED:
        SI[BS_HAS_ICNT] = 0
        SI[BS_ICNT] = 0
    elif t == EV_OVERFLOW:
        SI[BS_HAS_ICNT] = 0 if _supp(ev) else 1
        SI[BS_ICNT] = 0
    elif t == EV_ENABLED or t == EV_ASYNC_BRANCH or t == EV_TIP or t == EV_TNT:
        SI[BS_HAS_ICNT] = 1
        SI[BS_ICNT] = 0
    elif (
        t == EV_EXEC_MODE or t == EV_TSX or t == EV_ASYNC_PAGING or t == EV_ASYNC_VMCS
        or t == EV_EXSTOP or t == EV_PTWRITE or t == EV_TICK or t == EV_IFLAGS
        or t == EV_INTERRUPT or t == EV_IRET or t == EV_SMI or t == EV_RSM or t == EV_INIT
        or t == EV_VMENTRY or t == EV_VMEXIT or t == EV_SHUTDOWN or t == EV_UINTR
        or t == EV_UIRET or t == EV_TRIG or t == EV_SWINTR or t == EV_SYSCALL
    ):  # fmt: skip
        if not _supp(ev):
            SI[BS_HAS_ICNT] = 1
            SI[BS_ICNT] = 0


@aot.njit(cache=True, _nrt=False)
def _fetch_event(ds, pk, cf):
    """Consume the current event (its time becomes the decoder's) and fetch
    the next one; a decoding error is kept as the decoder's status."""
    SI, SU, CUR = ds[0], ds[1], ds[2]
    SU[BS_TSC] = CUR[E_TSC]
    SI[BS_HAS_TSC] = 1 if _has_tsc(CUR) else 0
    _update_trig_anchor(SI, CUR)
    r = ev_next(ds, pk, cf, CUR)
    if r < 0:
        if _aborted(r):
            return r
        SI[BS_STATUS] = -r
        _ev_init(CUR, EV_IGNORE)
    return 0


@aot.njit(cache=True, _nrt=False)
def _tick(ds, pk, cf, ip):
    SU, CUR = ds[1], ds[2]
    if cf[0][CF_TICK]:
        if CUR[E_TSC] != SU[BS_TSC]:
            CUR[E_TYPE] = EV_TICK
            CUR[E_IP] = ip
            return 0
    return _fetch_event(ds, pk, cf)


@aot.njit(cache=True, _nrt=False)
def _proceed_indirect(ds, pk, cf):
    SI, SU, CUR, TMP = ds[0], ds[1], ds[2], ds[3]
    t = CUR[E_TYPE]
    if SI[BS_STATUS] == 0 and t == EV_TIP:
        if _supp(CUR):
            return _err(E_BAD_PACKET)
        ip = SU[BS_IP]
        SU[BS_IP] = CUR[E_IP]
        return _tick(ds, pk, cf, ip)
    if SI[BS_STATUS] == 0 and t == EV_TNT:
        # A deferred TIP may hide behind an in-progress TNT.
        save_state(ds, 1)
        r = ev_next(ds, pk, cf, TMP)
        if r < 0:
            if _aborted(r):
                return r
            restore_state(ds, 1)
            return _err(E_BAD_QUERY)
        if TMP[E_TYPE] != EV_TIP:
            restore_state(ds, 1)
            return _err(E_BAD_QUERY)
        SU[BS_IP] = TMP[E_IP]
        return 0
    return _err(E_BAD_QUERY)


@aot.njit(cache=True, _nrt=False)
def _cond_branch(SI, CUR):
    """The next TNT bit (0/1), or -code.  From the first bit on the TNT's
    time is the query time (libipt's query decoder takes it when it caches
    the TNT)."""
    if SI[BS_STATUS] != 0 or CUR[E_TYPE] != EV_TNT:
        return _err(E_BAD_QUERY)
    if CUR[E_SIZE] == 0:
        return _err(E_INTERNAL)
    CUR[E_FLAGS] |= F_STARTED
    CUR[E_SIZE] -= np.uint64(1)
    return np.int64((CUR[E_BITS] >> CUR[E_SIZE]) & np.uint64(1))


@aot.njit(cache=True, _nrt=False)
def _rs_push(SI, RS, RSR, address):
    top = (SI[BS_RS_TOP] + 1) & _RS_MASK
    RS[top] = address
    RSR[top] = -1  # the run returned to is looked up when needed
    SI[BS_RS_TOP] = top
    SI[BS_RS_N] = min(SI[BS_RS_N] + 1, RETSTACK_SIZE)


@aot.njit(cache=True, _nrt=False)
def _proceed_with_trace(ds, pk, cf, ct, k):
    SI, SU, CUR, RS = ds[0], ds[1], ds[2], ds[6]
    c = ct[5][k]
    if c == C_COND:
        ip = _i_next(ct, k)
        r = _cond_branch(SI, CUR)
        if r < 0:
            return r
        if r:
            ip = ct[8][k]
        SU[BS_IP] = ip
        return 0
    if c == C_RETURN:
        r = _cond_branch(SI, CUR)
        if r < 0:
            if r != -E_BAD_QUERY:
                return r
            return _proceed_indirect(ds, pk, cf)
        if not r:
            return _err(E_BAD_RETCOMP)
        if SI[BS_RS_N] == 0:
            return _err(E_RETSTACK_EMPTY)
        top = SI[BS_RS_TOP]
        SU[BS_IP] = RS[top]
        SI[BS_RS_TOP] = (top - 1) & _RS_MASK
        SI[BS_RS_N] -= 1
        return 0
    if (c == C_JUMP or c == C_CALL) and ct[7][k] & I_DIRECT and ct[6][k] != S_JMPABS:
        return _err(E_INTERNAL)
    if c == C_OTHER or c == C_PTWRITE:
        return _err(E_INTERNAL)
    if c == C_UNKNOWN:
        return _err(E_BAD_INSN)
    return _proceed_indirect(ds, pk, cf)


@aot.njit(cache=True, _nrt=False)
def _one_insn(ds, ct, out):
    """Add the instruction at the decoder's IP to the current block: its
    index + 1, 0 when the block is full, or -code."""
    SI, SU, RS = ds[0], ds[1], ds[6]
    o_ninsn = out[1]
    if SI[CB_NINSN] + 1 > MAX_NINSN:
        return 0
    if SI[CB_NINSN] and ct[7][SI[CB_LAST]] & I_TRUNCATED:
        return 0  # an instruction spanning sections ends its block
    k = _insn(ct, SU[BS_IP], SI[BS_MODE])
    if k < 0:
        return k
    if ct[10][k]:
        return _err(ct[10][k])
    isid = ct[9][k]
    if isid != SI[CB_ISID]:
        if SI[CB_NINSN]:
            return 0
        SI[CB_ISID] = isid
    c = ct[5][k]
    if c == C_CALL and not (ct[7][k] & I_NO_PUSH):
        _rs_push(SI, RS, ds[14], _i_next(ct, k))
    SI[CB_ICLASS] = c
    SU[CB_END_IP] = ct[3][k]
    SI[CB_NINSN] += 1
    SI[CB_LAST] = k
    o_ninsn[SI[CB_ROW]] += 1
    if SI[BS_HAS_ICNT]:
        SI[BS_ICNT] += 1
    SI[BS_LAST] = k
    return k + 1


@aot.njit(cache=True, _nrt=False)
def _ends_block(cf, ct, k):
    CF = cf[0]
    c = ct[5][k]
    return (CF[CF_END_ON_CALL] and c == C_CALL) or (CF[CF_END_ON_JUMP] and c == C_JUMP)


@aot.njit(cache=True, _nrt=False)
def _to_insn(ds, cf, ct, out, pred):
    SU = ds[1]
    while True:
        r = _one_insn(ds, ct, out)
        if r <= 0:
            return r
        k = r - 1
        if _pred(ct, k, pred):
            return 1
        e, ip = _next_ip(ct, k)
        if e < 0:
            return e
        SU[BS_IP] = ip
        if _ends_block(cf, ct, k):
            return 0


@aot.njit(cache=True, _nrt=False)
def _to_ip(ds, cf, ct, out, ip):
    SU = ds[1]
    while True:
        if SU[BS_IP] == ip:
            return 1
        r = _one_insn(ds, ct, out)
        if r <= 0:
            return r
        k = r - 1
        e, nip = _next_ip(ct, k)
        if e < 0:
            return e
        SU[BS_IP] = nip
        if _ends_block(cf, ct, k):
            return 1 if SU[BS_IP] == ip else 0


@aot.njit(cache=True, _nrt=False)
def _filter_check(cf, ip):
    """1 if tracing is enabled at ``ip`` under the address filters (libipt's
    pt_filter_addr_check), else 0."""
    CF, CFU = cf[0], cf[1]
    have_filter = False
    for r in range(CF[CF_NFILTER]):
        cfg = CFU[3 * r]
        a = CFU[3 * r + 1]
        b = CFU[3 * r + 2]
        if cfg == 1:
            have_filter = True
            if a <= ip <= b:
                return 1
        elif cfg == 2 and a <= ip <= b:
            return 0
    return 0 if have_filter else 1


@aot.njit(cache=True, _nrt=False)
def _filter_configured(cf):
    CF, CFU = cf[0], cf[1]
    for r in range(CF[CF_NFILTER]):
        if CFU[3 * r]:
            return True
    return False


@aot.njit(cache=True, _nrt=False)
def _skl014(ds, cf, ct, out):
    SI, SU = ds[0], ds[1]
    while True:
        status = _to_insn(ds, cf, ct, out, P_SKL014)
        if status <= 0:
            return status
        k = SI[BS_LAST]
        if ct[6][k] == S_MOV_CR3:
            return status
        e, ip = _next_ip(ct, k)
        if e < 0:
            return e
        if _filter_check(cf, ip) <= 0:
            return 1
        SU[BS_IP] = ip
        if _ends_block(cf, ct, k):
            return status


@aot.njit(cache=True, _nrt=False)
def _to_disabled(ds, cf, ct, out, ev):
    if _supp(ev):
        if _filter_configured(cf) and cf[0][CF_ERRATA] & ER_SKL014:
            return _skl014(ds, cf, ct, out)
        return _to_insn(ds, cf, ct, out, P_CR3)
    return _to_ip(ds, cf, ct, out, ev[E_IP])


@aot.njit(cache=True, _nrt=False)
def _set_disable_resume_ip(ds, ct, k):
    ds[1][BS_IP] = _disable_resume_ip(ct, k)


@aot.njit(cache=True, inline="always", _nrt=False)
def _disable_resume_ip(ct, k):
    """Where tracing disabled at the branch ``k`` takes it up again: after
    a call (it returns there), else nowhere known (0)."""
    if k >= 0 and (ct[5][k] == C_CALL or ct[5][k] == C_FAR_CALL):
        return _i_next(ct, k)
    return np.uint64(0)


@aot.njit(cache=True, _nrt=False)
def _to_bound_insn(ds, cf, ct, out, ev, pred):
    """PTWRITE, IRET, VM entry, UIRET events: reach the instruction and step
    past it."""
    if _supp(ev):
        return _to_insn(ds, cf, ct, out, pred)
    status = _to_ip(ds, cf, ct, out, ev[E_IP])
    if status <= 0:
        return status
    r = _one_insn(ds, ct, out)
    if r < 0:
        return r
    return 1 if r > 0 else 0


@aot.njit(cache=True, _nrt=False)
def _provide_trig_anchor(SI, SU, ev):
    if ev[E_IP]:
        return 0
    if not SI[BS_HAS_ICNT]:
        return _err(E_BAD_PACKET)
    if np.int64(ev[E_ICNT]) < SI[BS_ICNT]:
        return _err(E_BAD_PACKET)
    ev[E_ICNT] = np.uint64(np.int64(ev[E_ICNT]) - SI[BS_ICNT])
    ev[E_IP] = SU[BS_IP]
    return 0


@aot.njit(cache=True, _nrt=False)
def _to_trig(ds, cf, ct, out, ev):
    SI, SU = ds[0], ds[1]
    if _supp(ev):
        return 1
    r = _provide_trig_anchor(SI, SU, ev)
    if r < 0:
        return r
    if not SI[BS_ENABLED]:
        if not ev[E_ICNT]:
            return _err(E_INTERNAL)
        return 1
    status = _to_ip(ds, cf, ct, out, ev[E_IP])
    if status <= 0:
        return status
    while ev[E_ICNT]:
        r = _one_insn(ds, ct, out)
        if r <= 0:
            return r
        e, ip = _next_ip(ct, r - 1)
        if e < 0:
            return e
        SU[BS_IP] = ip
        ev[E_IP] = ip
        ev[E_ICNT] -= np.uint64(1)
    return 1


@aot.njit(cache=True, _nrt=False)
def _skd022(ds, ct, ev):
    SI = ds[0]
    k = _insn(ct, ev[E_AT], SI[BS_MODE])
    if k < 0:
        return k
    if ct[10][k]:
        return 0
    sp = ct[6][k]
    if sp == S_VMLAUNCH or sp == S_VMRESUME:
        ev[E_TYPE] = EV_DISABLED
        return 1
    return 0


@aot.njit(cache=True, _nrt=False)
def _postpone(SI, k):
    if SI[BS_PROC]:
        return _err(E_INTERNAL)
    SI[BS_PROC] = 1
    SI[BS_INSN] = k
    return _status(SI, ST_EVENT_PENDING)


@aot.njit(cache=True, _nrt=False)
def _clear_postponed(SI):
    SI[BS_PROC] = 0
    SI[BS_BOUND] = 0


# The step functions call one another with the decoder's state as tuples
# of arrays: the checks that mostly find nothing to do are inlined where
# they are called (``inline``), the work stays out of line.  In the native
# library a call passes only the words its callee reads (see hwtrace.aot),
# so the steps an event takes (next_event, _trailing, _proceed,
# _proceed_event) and the fast loop stay functions of their own too:
# inlined, they made ``run`` 150 KB of code, and an event's path through it
# cost more in instruction fetches than the calls do (syscalls-2k decoded
# 3% faster out of line, the plain workloads alike).


@aot.njit(cache=True, inline="always", _nrt=False)
def _proceed_postponed(ds, pk, cf, ct):
    SI = ds[0]
    if not SI[BS_PROC]:
        return 0
    if not SI[BS_ENABLED]:
        _clear_postponed(SI)
        return 0
    return _proceed_postponed_insn(ds, pk, cf, ct)


@aot.njit(cache=True, _nrt=False)
def _proceed_postponed_insn(ds, pk, cf, ct):
    """The postponed instruction, proceeded with (tracing enabled)."""
    SI, SU = ds[0], ds[1]
    k = SI[BS_INSN]
    e, ip = _next_ip(ct, k)
    if e < 0:
        if e != -E_BAD_QUERY:
            return e
        r = _proceed_with_trace(ds, pk, cf, ct, k)
        if r < 0:
            return r
    else:
        SU[BS_IP] = ip
    _clear_postponed(SI)
    return 0


@aot.njit(cache=True, inline="always", _nrt=False)
def _finish(ds, pk, cf, ct):
    r = _proceed_postponed(ds, pk, cf, ct)
    if r < 0:
        return r
    return _status(ds[0], 0)


@aot.njit(cache=True, inline="always", _nrt=False)
def _pending_after_postponed(ds, pk, cf, ct):
    r = _proceed_postponed(ds, pk, cf, ct)
    if r < 0:
        return r
    return _status(ds[0], ST_EVENT_PENDING)


@aot.njit(cache=True, _nrt=False)
def _proceed_event(ds, pk, cf, ct, out):
    SI, CUR = ds[0], ds[2]
    errata = cf[0][CF_ERRATA]
    while True:
        ev = CUR
        t = ev[E_TYPE]
        SI[BS_LAST] = -1
        if t == EV_DISABLED:
            if not _status_update(ev):
                r = _to_disabled(ds, cf, ct, out, ev)
                if r < 0:
                    if r != -E_BAD_QUERY:
                        return r
                    _set_disable_resume_ip(ds, ct, SI[BS_LAST])
                elif r == 0:
                    return 0
        elif t == EV_ASYNC_DISABLED:
            r = _to_ip(ds, cf, ct, out, ev[E_AT])
            if r <= 0:
                return r
            if errata & ER_SKD022:
                r = _skd022(ds, ct, ev)
                if r < 0:
                    return r
                if r:
                    continue
        elif t == EV_ASYNC_BRANCH:
            r = _to_ip(ds, cf, ct, out, ev[E_AT])
            if r <= 0:
                return r
        elif t == EV_PAGING or t == EV_VMCS:
            if SI[BS_ENABLED]:
                r = _to_insn(ds, cf, ct, out, _bind_pred(t))
                if r <= 0:
                    return r
                SI[BS_BOUND] |= _bound_bit(t)
                return _postpone(SI, SI[BS_LAST])
        elif t == EV_PTWRITE or t == EV_IRET or t == EV_VMENTRY or t == EV_UIRET:
            if SI[BS_ENABLED]:
                r = _to_bound_insn(ds, cf, ct, out, ev, _bind_pred(t))
                if r <= 0:
                    return r
                SI[BS_BOUND] |= _bound_bit(t)
                return _postpone(SI, SI[BS_LAST])
        elif t == EV_EXSTOP or t == EV_MWAIT:
            if SI[BS_ENABLED] and not _supp(ev):
                r = _to_ip(ds, cf, ct, out, ev[E_IP])
                if r <= 0:
                    return r
        elif (
            t == EV_ASYNC_PAGING or t == EV_ASYNC_VMCS or t == EV_EXEC_MODE or t == EV_TSX
            or t == EV_IFLAGS or t == EV_INTERRUPT or t == EV_SMI or t == EV_INIT
            or t == EV_VMEXIT or t == EV_SHUTDOWN or t == EV_UINTR or t == EV_SWINTR
            or t == EV_SYSCALL
        ):  # fmt: skip
            if not _supp(ev):
                r = _to_ip(ds, cf, ct, out, ev[E_IP])
                if r <= 0:
                    return r
        elif t == EV_TRIG:
            r = _to_trig(ds, cf, ct, out, ev)
            if r <= 0:
                return r
        elif t == EV_TIP or t == EV_TNT:
            return _err(E_INTERNAL)
        return _status(SI, ST_EVENT_PENDING)


@aot.njit(cache=True, _nrt=False)
def _proceed_no_event(ds, pk, cf, ct, out):
    SI = ds[0]
    SI[BS_LAST] = -1
    r = _to_insn(ds, cf, ct, out, P_NEVER)
    if r < 0:
        if r != -E_BAD_QUERY:
            return r
        if SI[BS_LAST] < 0:
            return _err(E_BAD_INSN)
        return _proceed_with_trace(ds, pk, cf, ct, SI[BS_LAST])
    return 0


@aot.njit(cache=True, _nrt=False)
def _bdm64(ds, ct, ev):
    SI, SU = ds[0], ds[1]
    if not ev[E_ABORTED] or not SI[CB_NINSN]:
        return 0
    k = _insn(ct, SU[CB_END_IP], SI[CB_MODE])
    if k < 0:
        return k
    c = ct[5][k]
    if ct[10][k] or c == C_OTHER or c == C_PTWRITE or c == C_UNKNOWN:
        return 0
    ip = SU[BS_IP]
    for _ in range(BDM64_MAX_STEPS):
        if ip == ev[E_IP]:
            return 1
        k = _insn(ct, ip, SI[BS_MODE])
        if k < 0:
            return k
        if ct[10][k]:
            break
        e, nip = _next_ip(ct, k)
        if e < 0:
            break
        ip = nip
    SU[BS_IP] = ev[E_IP]
    return 1


@aot.njit(cache=True, _nrt=False)
def _trailing(ds, pk, cf, ct, has_block):
    """Events that bind to the current IP (after a block or an event).
    (Every way out that finishes the block leaves the loop to one _finish:
    each call site of the postponed instruction's step passes the
    decoder's arrays, and 18 of them made this LLVM's slowest function to
    compile.)"""
    SI, SU, CUR = ds[0], ds[1], ds[2]
    CF = cf[0]
    errata = CF[CF_ERRATA]
    while True:
        if SI[BS_STATUS] != 0:
            r = _proceed_postponed(ds, pk, cf, ct)
            if r < 0:
                return r
            return _status(SI, 0 if SI[BS_STATUS] == E_EOS else ST_EVENT_PENDING)
        ev = CUR
        t = ev[E_TYPE]
        if t == EV_TNT:
            if not CF[CF_TICK] or not has_block or not _has_tsc(ev) or ev[E_TSC] == SU[BS_TSC]:
                if ev[E_SIZE]:
                    break
                r = _fetch_event(ds, pk, cf)
                if r < 0:
                    return r
                continue
            c = SI[CB_ICLASS]
            if c != C_COND and c != C_RETURN:
                break
            return _status(SI, ST_EVENT_PENDING)
        if t == EV_TIP:
            break
        if (
            t == EV_TICK or t == EV_ENABLED or t == EV_OVERFLOW or t == EV_STOP
            or t == EV_PWRE or t == EV_PWRX or t == EV_CBR or t == EV_MNT
        ):  # fmt: skip
            return _pending_after_postponed(ds, pk, cf, ct)
        if t == EV_DISABLED:
            if not SI[BS_PROC]:
                # libipt's pt_blk_proceed_trailing_event: a status update
                # (a PSB+ with tracing disabled) is an event of its own.
                if _status_update(ev):
                    return _status(SI, ST_EVENT_PENDING)
                break
            k = SI[BS_INSN]
            if _supp(ev) and ct[6][k] == S_MOV_CR3:
                return _status(SI, ST_EVENT_PENDING)
            e, nip = _next_ip(ct, k)
            if e < 0:
                if e != -E_BAD_QUERY:
                    return e
                _set_disable_resume_ip(ds, ct, k)
                return _status(SI, ST_EVENT_PENDING)
            SU[BS_IP] = nip
            _clear_postponed(SI)
            if not _supp(ev) and nip == ev[E_IP]:
                return _status(SI, ST_EVENT_PENDING)
            break
        if t == EV_ASYNC_DISABLED:
            r = _proceed_postponed(ds, pk, cf, ct)
            if r < 0:
                return r
            if SU[BS_IP] != ev[E_AT]:
                break
            if errata & ER_SKD022:
                r = _skd022(ds, ct, ev)
                if r < 0:
                    return r
                if r:
                    break
            return _status(SI, ST_EVENT_PENDING)
        if t == EV_ASYNC_BRANCH:
            r = _proceed_postponed(ds, pk, cf, ct)
            if r < 0:
                return r
            if SU[BS_IP] != ev[E_AT]:
                break
            return _status(SI, ST_EVENT_PENDING)
        if (
            t == EV_PAGING or t == EV_VMCS or t == EV_PTWRITE or t == EV_IRET
            or t == EV_VMENTRY or t == EV_UIRET
        ):  # fmt: skip
            if not SI[BS_ENABLED]:
                return _status(SI, ST_EVENT_PENDING)
            if not SI[BS_PROC] or SI[BS_BOUND] & _bound_bit(t):
                break
            # PIP and VMCS bind to the instruction; the others only when they
            # carry no IP (one with an IP binds by it).
            if not (t == EV_PAGING or t == EV_VMCS or _supp(ev)):
                break
            if not _pred(ct, SI[BS_INSN], _bind_pred(t)):
                break
            SI[BS_BOUND] |= _bound_bit(t)
            return _status(SI, ST_EVENT_PENDING)
        if t == EV_ASYNC_PAGING or t == EV_ASYNC_VMCS:
            r = _proceed_postponed(ds, pk, cf, ct)
            if r < 0:
                return r
            if not _supp(ev) and SU[BS_IP] != ev[E_IP]:
                break
            return _status(SI, ST_EVENT_PENDING)
        if t == EV_EXEC_MODE:
            r = _proceed_postponed(ds, pk, cf, ct)
            if r < 0:
                return r
            if not SI[BS_ENABLED]:
                return _status(SI, ST_EVENT_PENDING)
            if not _supp(ev) and SU[BS_IP] != ev[E_IP]:
                break
            return _status(SI, ST_EVENT_PENDING)
        if t == EV_TSX:
            r = _proceed_postponed(ds, pk, cf, ct)
            if r < 0:
                return r
            if not _supp(ev):
                if has_block and errata & ER_BDM64:
                    r = _bdm64(ds, ct, ev)
                    if r < 0:
                        return r
                if SU[BS_IP] != ev[E_IP]:
                    break
            return _status(SI, ST_EVENT_PENDING)
        if t == EV_EXSTOP or t == EV_MWAIT:
            r = _proceed_postponed(ds, pk, cf, ct)
            if r < 0:
                return r
            if not _supp(ev) and SI[BS_ENABLED] and SU[BS_IP] != ev[E_IP]:
                break
            return _status(SI, ST_EVENT_PENDING)
        if (
            t == EV_IFLAGS or t == EV_INTERRUPT or t == EV_SMI or t == EV_INIT
            or t == EV_VMEXIT or t == EV_SHUTDOWN or t == EV_UINTR or t == EV_SWINTR
            or t == EV_SYSCALL
        ):  # fmt: skip
            r = _proceed_postponed(ds, pk, cf, ct)
            if r < 0:
                return r
            if SI[BS_ENABLED] and not _supp(ev) and SU[BS_IP] != ev[E_IP]:
                break
            return _status(SI, ST_EVENT_PENDING)
        if t == EV_RSM or t == EV_SIPI:
            r = _proceed_postponed(ds, pk, cf, ct)
            if r < 0:
                return r
            if not _supp(ev):
                return _err(E_INTERNAL)
            return _status(SI, ST_EVENT_PENDING)
        if t == EV_TRIG:
            r = _proceed_postponed(ds, pk, cf, ct)
            if r < 0:
                return r
            if not SI[BS_ENABLED] or _supp(ev):
                return _status(SI, ST_EVENT_PENDING)
            r = _provide_trig_anchor(SI, SU, ev)
            if r < 0:
                return r
            if ev[E_ICNT]:
                break
            if ev[E_IP] != SU[BS_IP]:
                return _err(E_BAD_PACKET)
            return _status(SI, ST_EVENT_PENDING)
        break
    return _finish(ds, pk, cf, ct)


@aot.njit(cache=True, _nrt=False)
def _proceed(ds, pk, cf, ct, out):
    SI, CUR = ds[0], ds[2]
    if SI[BS_STATUS] != 0:
        if SI[BS_STATUS] != E_EOS:
            return _err(SI[BS_STATUS])
        if not SI[BS_ENABLED]:
            return _err(E_EOS)
        _row_walk(ds, pk, out, 0)
        r = _proceed_no_event(ds, pk, cf, ct, out)
        if r < 0:
            return r
        return ST_EOS
    t = CUR[E_TYPE]
    if t == EV_TNT or t == EV_TIP:
        if not SI[BS_ENABLED]:
            return _err(E_NO_ENABLE)
        _row_walk(ds, pk, out, 0)
        r = _proceed_no_event(ds, pk, cf, ct, out)
        if r < 0:
            return r
        return _trailing(ds, pk, cf, ct, True)
    _row_walk(ds, pk, out, O_UNCACHED)
    return _proceed_event(ds, pk, cf, ct, out)


@aot.njit(cache=True, _nrt=False)
def _row_walk(ds, pk, out, uncached):
    """Keep instructions walked to a pending event (``uncached``) and
    those walked without one in rows of their own."""
    SI = ds[0]
    if not SI[CB_OPEN]:
        return
    o_flags = out[2]
    row = SI[CB_ROW]
    if (o_flags[row] & O_UNCACHED) == uncached:
        return
    if out[1][row]:
        SI[O_NINSN] += out[1][row]  # _end_block counts the last row only
        row = _new_row(ds, pk, out, False)
    o_flags[row] = (o_flags[row] & ~np.uint8(O_UNCACHED)) | uncached


@aot.njit(cache=True, inline="always", _nrt=False)
def _returned_to(SI, RS, ip):
    """Whether tracing enabled at ``ip`` comes back at the return address
    on top of the return stack (see flowrows.F_RETURNED)."""
    return SI[BS_RS_N] > 0 and RS[SI[BS_RS_TOP]] == ip


@aot.njit(cache=True, _nrt=False)
def next_event(ds, pk, cf, ct, ev_out):
    """The pending event, applied (BlockDecoder.next_event): status flags
    with a copy of the event in ``ev_out``, or -code."""
    SI, SU, CUR = ds[0], ds[1], ds[2]
    CF = cf[0]
    if SI[BS_STATUS] != 0:
        return _err(SI[BS_STATUS])
    ev = CUR
    t = ev[E_TYPE]
    ip = SU[BS_IP]
    enabled = SI[BS_ENABLED] != 0
    supp = _supp(ev)
    if t == EV_TNT:
        if not CF[CF_TICK] or not _has_tsc(ev) or ev[E_TSC] == SU[BS_TSC]:
            return _err(E_BAD_QUERY)
        _ev_init(ev_out, EV_TICK)
        ev_out[E_FLAGS] |= F_HAS_TSC
        ev_out[E_TSC] = ev[E_TSC]
        ev_out[E_IP] = ip
        SI[BS_HAS_TSC] = 1
        SU[BS_TSC] = ev[E_TSC]
        if not ev[E_SIZE]:
            r = _fetch_event(ds, pk, cf)
            if r < 0:
                return r
        return _trailing(ds, pk, cf, ct, False)
    if t == EV_ENABLED:
        if ev[E_IP] == ip:
            ev[E_FLAGS] |= F_RESUMED
        elif _returned_to(SI, ds[6], ev[E_IP]):
            ev[E_FLAGS] |= F_RETURNED
        if _status_update(ev):
            if not enabled:
                return _err(E_BAD_STATUS_UPDATE)
        else:
            if supp:
                return _err(E_NOIP)
            if enabled:
                return _err(E_BAD_CONTEXT)
            SU[BS_IP] = ev[E_IP]
            SI[BS_ENABLED] = 1
    elif t == EV_ASYNC_DISABLED or t == EV_DISABLED:
        if t == EV_ASYNC_DISABLED and ip != ev[E_AT]:
            return _err(E_BAD_QUERY)
        if _status_update(ev):
            if enabled:
                return _err(E_BAD_STATUS_UPDATE)
        else:
            if not enabled:
                return _err(E_BAD_CONTEXT)
            SI[BS_ENABLED] = 0
            SI[BS_ICNT] = 0
    elif t == EV_ASYNC_BRANCH:
        if ip != ev[E_AT]:
            return _err(E_BAD_QUERY)
        if _status_update(ev) or not enabled:
            return _err(E_BAD_CONTEXT)
        SU[BS_IP] = ev[E_IP]
    elif t == EV_ASYNC_PAGING or t == EV_PAGING:
        if t == EV_ASYNC_PAGING and not supp and ip != ev[E_IP]:
            return _err(E_BAD_QUERY)
        SI[BS_HAVE_CR3] = 1
        SU[BS_CR3] = ev[E_CR3]
    elif t == EV_ASYNC_VMCS or t == EV_VMCS:
        if t == EV_ASYNC_VMCS and not supp and ip != ev[E_IP]:
            return _err(E_BAD_QUERY)
        SI[BS_HAVE_VMCS] = 1
        SU[BS_VMCS] = ev[E_BASE]
    elif t == EV_OVERFLOW:
        if _status_update(ev):
            return _err(E_BAD_CONTEXT)
        if supp:
            SI[BS_ENABLED] = 0
            SU[BS_IP] = 0
        else:
            SI[BS_ENABLED] = 1
            SU[BS_IP] = ev[E_IP]
        SI[BS_SPEC] = 0
    elif t == EV_EXEC_MODE:
        if enabled and not supp and ip != ev[E_IP]:
            return _err(E_BAD_QUERY)
        mode = np.int64(ev[E_MODE])
        if _status_update(ev) and enabled and SI[BS_MODE] != 0 and SI[BS_MODE] != mode:
            return _err(E_BAD_STATUS_UPDATE)
        SI[BS_MODE] = mode
    elif t == EV_TSX:
        if not supp and ip != ev[E_IP]:
            return _err(E_BAD_QUERY)
        SI[BS_SPEC] = 1 if ev[E_SPEC] else 0
    elif t == EV_STOP:
        if _status_update(ev) or enabled:
            return _err(E_BAD_CONTEXT)
    elif t == EV_EXSTOP or t == EV_MWAIT:
        if not supp and enabled and ip != ev[E_IP]:
            return _err(E_BAD_QUERY)
    elif t == EV_CBR:
        SI[BS_CBR] = np.int64(ev[E_RATIO])
    elif t == EV_TIP:
        return _err(E_BAD_QUERY)
    elif (
        t == EV_IFLAGS or t == EV_INTERRUPT or t == EV_SMI or t == EV_INIT or t == EV_VMEXIT
        or t == EV_SHUTDOWN or t == EV_UINTR or t == EV_SWINTR or t == EV_SYSCALL
        or t == EV_TRIG
    ):  # fmt: skip
        if enabled and not supp and ip != ev[E_IP]:
            return _err(E_BAD_QUERY)
    elif t == EV_RSM or t == EV_SIPI:
        if not supp:
            return _err(E_INTERNAL)
    _ev_copy(ev_out, ev)
    r = _fetch_event(ds, pk, cf)
    if r < 0:
        return r
    return _trailing(ds, pk, cf, ct, False)


@aot.njit(cache=True, _nrt=False)
def blk_start(ds, pk, cf, ct):
    """Synchronise on the segment's PSB+ (BlockDecoder.start)."""
    SI, SU, CUR, TMP = ds[0], ds[1], ds[2], ds[3]
    r = ev_start(ds, pk, cf)
    if r < 0:
        return r
    save_state(ds, 1)
    origin = SI[ES_POS]
    enabled = False
    ip = np.uint64(0)
    while SI[ES_POS] == origin:
        r = ev_next(ds, pk, cf, TMP)
        if r < 0:
            if _aborted(r):
                return r
            if r != -E_EOS:
                restore_state(ds, 1)
                return r
            break
        if not _status_update(TMP):
            break
        if TMP[E_TYPE] == EV_ENABLED:
            enabled = True
            ip = TMP[E_IP]
            break
    restore_state(ds, 1)
    if enabled:
        SI[BS_ENABLED] = 1
        SU[BS_IP] = ip
    r = ev_next(ds, pk, cf, CUR)
    if r < 0:
        if _aborted(r):
            return r
        SI[BS_STATUS] = -r
    return _trailing(ds, pk, cf, ct, False)


@aot.njit(cache=True, _nrt=False)
def blk_resync(ds, pk, cf, ct, ev_out):
    """Recover after an error without leaving the segment (libipt's
    pt_blk_resync).  -EVENT_IGNORED: the caller takes the current event
    with next_event and calls again."""
    SI, SU, CUR = ds[0], ds[1], ds[2]
    _clear_postponed(SI)
    while True:
        if SI[BS_STATUS] != 0:
            return _err(SI[BS_STATUS])
        ev = CUR
        t = ev[E_TYPE]
        if _status_update(ev):
            if t == EV_DISABLED:
                SI[BS_ENABLED] = 0
                return next_event(ds, pk, cf, ct, ev_out)
            with_ip = (
                t == EV_ENABLED or t == EV_EXEC_MODE or t == EV_IFLAGS or t == EV_TSX
                or t == EV_ASYNC_PAGING or t == EV_ASYNC_VMCS
            )  # fmt: skip
            if not _supp(ev) and with_ip:
                SU[BS_IP] = ev[E_IP]
                SI[BS_ENABLED] = 1
                return next_event(ds, pk, cf, ct, ev_out)
            return _err(E_EVENT_IGNORED)
        # As libipt's pt_blk_resync: events that tell where execution is end
        # the search (reported, or, for those reported after their
        # instruction, pending on it); the others, and those whose IP is
        # suppressed, are passed over silently (paging and VMCS applied).
        supp = _supp(ev)
        if t == EV_TIP:
            SU[BS_IP] = ev[E_IP]
            r = _fetch_event(ds, pk, cf)
            if r < 0:
                return r
            return _trailing(ds, pk, cf, ct, False)
        if t == EV_DISABLED:
            SI[BS_ENABLED] = 0
            SU[BS_IP] = 0
            r = _fetch_event(ds, pk, cf)
            if r < 0:
                return r
            return _trailing(ds, pk, cf, ct, False)
        if t == EV_ENABLED:
            SI[BS_ENABLED] = 0
            return _status(SI, ST_EVENT_PENDING)
        if t == EV_ASYNC_DISABLED:
            SU[BS_IP] = ev[E_AT]
            r = _skd022(ds, ct, ev) if cf[0][CF_ERRATA] & ER_SKD022 else 0
            if r < 0 and _aborted(r):
                return r
            if r == 0:
                return _status(SI, ST_EVENT_PENDING)
        elif t == EV_ASYNC_BRANCH:
            SU[BS_IP] = ev[E_AT]
            return _status(SI, ST_EVENT_PENDING)
        elif (t == EV_ASYNC_PAGING or t == EV_ASYNC_VMCS) and not supp:
            SU[BS_IP] = ev[E_IP]
            return _status(SI, ST_EVENT_PENDING)
        elif t == EV_PAGING or t == EV_ASYNC_PAGING:
            SI[BS_HAVE_CR3] = 1
            SU[BS_CR3] = ev[E_CR3]
        elif t == EV_VMCS or t == EV_ASYNC_VMCS:
            SI[BS_HAVE_VMCS] = 1
            SU[BS_VMCS] = ev[E_BASE]
        elif t == EV_OVERFLOW:
            return _status(SI, ST_EVENT_PENDING)
        elif t == EV_EXEC_MODE or t == EV_TSX or t == EV_IFLAGS or t == EV_INTERRUPT:
            if supp:
                SI[BS_ENABLED] = 0
            else:
                SI[BS_ENABLED] = 1
                SU[BS_IP] = ev[E_IP]
            return _status(SI, ST_EVENT_PENDING)
        elif t == EV_PTWRITE and supp:
            return _err(E_EVENT_IGNORED)
        elif (
            t == EV_PTWRITE or t == EV_VMENTRY or t == EV_UIRET
        ) and not supp:  # fmt: skip
            SU[BS_IP] = ev[E_IP]
            return _status(SI, 0)
        elif (
            t == EV_EXSTOP or t == EV_MWAIT or t == EV_TICK or t == EV_IRET or t == EV_SMI
            or t == EV_RSM or t == EV_INIT or t == EV_VMEXIT or t == EV_SHUTDOWN
            or t == EV_UINTR or t == EV_SWINTR or t == EV_SYSCALL
        ) and not supp:  # fmt: skip
            SU[BS_IP] = ev[E_IP]
            return _status(SI, ST_EVENT_PENDING)
        r = _fetch_event(ds, pk, cf)
        if r < 0:
            return r


# ---------------------------------------------------------------------------
# Output.


@aot.njit(cache=True, inline="always", _nrt=False)
def _query_time(ds):
    """The time of the last packet consumed (libipt's pt_blk_time): a
    started TNT's, else the last consumed event's."""
    SI, SU, CUR = ds[0], ds[1], ds[2]
    if SI[BS_STATUS] == 0 and CUR[E_TYPE] == EV_TNT and CUR[E_FLAGS] & F_STARTED:
        return CUR[E_TSC]
    return SU[BS_TSC]


@aot.njit(cache=True, _nrt=False)
def _new_row(ds, pk, out, new):
    """Start a block row at the decoder's IP (the current block's first row
    when ``new``, else a continuation).  Returns the row index."""
    SI, SU = ds[0], ds[1]
    o_ip, o_ninsn, o_flags, o_mode, o_off, o_time = out[0], out[1], out[2], out[3], out[4], out[5]
    i = SI[O_NBLK]
    o_ip[i] = SU[BS_IP]
    o_ninsn[i] = 0
    out[9][i] = -1
    flags = O_NEW if new else 0
    if SI[BS_SPEC]:
        flags |= O_SPEC
    o_flags[i] = flags
    o_mode[i] = SI[BS_MODE]
    o_off[i] = _offset(SI, SU, pk)
    o_time[i] = _query_time(ds)
    SI[O_NBLK] = i + 1
    SI[CB_ROW] = i
    return i


@aot.njit(cache=True, _nrt=False)
def _emit_event(ds, pk, out, ev, offset):
    SI = ds[0]
    e_row, e_off, e_blk = out[6], out[7], out[8]
    j = SI[O_NEV]
    _ev_copy(e_row[j], ev)
    e_off[j] = offset
    e_blk[j] = SI[O_NBLK] + SI[O_VBLK]
    SI[O_NEV] = j + 1


@aot.njit(cache=True, _nrt=False)
def _emit_marker(ds, out, t, offset, code, kind, ip, tsc):
    SI = ds[0]
    e_row, e_off, e_blk = out[6], out[7], out[8]
    j = SI[O_NEV]
    row = e_row[j]
    _ev_init(row, t)
    row[E_P0] = code
    row[E_P1] = kind
    row[E_IP] = ip
    row[E_TSC] = tsc
    e_off[j] = offset
    e_blk[j] = SI[O_NBLK] + SI[O_VBLK]
    SI[O_NEV] = j + 1


@aot.njit(cache=True, _nrt=False)
def error_ip(ds, ct, code):
    """Where Intel's ptxed reports an error: after the last block's last
    instruction (its branch target when it has a displacement), except for
    a query that does not match, which is the last instruction itself; the
    block's start when it has none."""
    SI, SU = ds[0], ds[1]
    if not SI[CB_NINSN]:
        return SU[CB_IP]
    k = SI[CB_LAST]
    if code == E_BAD_QUERY:
        return SU[CB_END_IP]
    if ct[7][k] & I_DIRECT:
        return ct[8][k]
    return _i_next(ct, k)


# ---------------------------------------------------------------------------
# The fast loop.


@aot.njit(cache=True, _nrt=False)
def _plain(ds, cf):
    """Can the fast loop take over?  (SegmentWalker._plain in the reference
    design: nothing pending but branch outcomes and targets.)"""
    SI, CUR = ds[0], ds[2]
    if SI[BS_STATUS] != 0 or not SI[BS_ENABLED] or SI[BS_PROC] or SI[ES_QN]:
        return False
    t = CUR[E_TYPE]
    if t == EV_TNT:
        return CUR[E_SIZE] > 0 and not SI[ES_BOUND]
    return t == EV_TIP and not _supp(CUR) and SI[ES_BOUND] != 0


@aot.njit(cache=True, inline="always", _nrt=False)
def _fast_fetch(kind, a, b, tsc, have_tsc, n, p, last_ip):
    """The next TNT or TIP from packet ``p`` on, skipping timing packets:
    ``(evt, pos, value, size, last_ip, tsc, has_tsc)``; ``evt`` 0 when the
    packet at ``pos`` is something else (the step functions take it).  After
    a TNT ``pos`` is past it (and the PADs behind it), after a TIP on it, as
    the event decoder leaves them.  (Unsigned indices: numba checks a
    signed one for a negative value.)"""
    while p < n:
        u = np.uint64(p)
        k = kind[u]
        if k == K_PAD or k == K_TSC or k == K_MTC or k == K_TMA or k == K_CYC:
            p += 1
            continue
        has = have_tsc[u]
        t = tsc[u] if has else np.uint64(0)
        if _is_tnt(k):
            nbits = b[u] & _NBITS
            if nbits == 0:
                break
            q = p + 1
            while q < n and kind[np.uint64(q)] == K_PAD:
                q += 1
            return EV_TNT, q, a[u], np.int64(nbits), last_ip, t, has
        if k == K_TIP:
            ipc = b[u]
            payload = a[u]
            if ipc == 1:
                ip = (last_ip & ~np.uint64(0xFFFF)) | (payload & np.uint64(0xFFFF))
            elif ipc == 2:
                ip = (last_ip & ~np.uint64(0xFFFFFFFF)) | (payload & np.uint64(0xFFFFFFFF))
            elif ipc == 3:
                if payload & np.uint64(1 << 47):
                    ip = payload | np.uint64(0xFFFF000000000000)
                else:
                    ip = payload
            elif ipc == 4:
                ip = (last_ip & ~_MASK48) | (payload & _MASK48)
            elif ipc == 6:
                ip = payload
            else:
                break
            return EV_TIP, p, ip, np.int64(0), ip, t, has
        break
    return 0, p, np.uint64(0), np.int64(0), last_ip, np.uint64(0), False


# Why the fast loop stopped.
FR_STOP, FR_FETCH, FR_FULL, FR_MISS, FR_GROW = 0, 1, 2, 3, 4
# Which learned-successor slot a run index found by lookup goes to.
LEARN_NONE, LEARN_SUCC, LEARN_TAKEN = 0, 1, 2

# The replay cache (libxdc's idea, on hwtrace's runs).  A *stretch* is the
# walk from a run, at the start of a block, driven by the next few TNT bits
# of one packet (up to X_BITS of them; when they are the packet's last and
# a TIP follows, and that TIP) or by one TIP: the runs it passes,
# what it does to the return stack and where it ends.  Its key is the run
# and the bits (XK_TIP for a TIP).  The fast loop records stretches as it
# walks them and, on meeting a key again, replays the stretch: the block
# store receives one key naming the runs' keys (kept in the store as a
# sequence, and with the stretch: the cache holds one store's keys; the
# keys themselves when the store has no room for another sequence), the
# counters their sums.  A stretch ends once
# its bits are consumed, or at a return to a call made before it (it pops
# the return stack: where it goes is the stack's, XS_POP), and is dropped
# at anything else that stops the walk, so a replay does exactly what the
# walk did.  Replays go on one after another in _replay_chain, which also
# walks the returns between stretches (a stretch does not start at one)
# and the runs that take a TIP themselves (their target the run they went
# to last, as a branch target buffer has it): on a plain trace nearly
# every block row comes from there.
X_BITS = 8
XK_TIP = X_BITS + 1
X_MAX_RUNS = 256  # runs in one stretch
X_MAX_DEPTH = 32  # calls a stretch makes and does not return from
# Fields of an entry (X_FIELDS words of x_words; see hwtrace.pt.codetable):
# the X_HOT a replay reads in one cache line in the first half of the words
# (entries 64 bytes apart: every set of the L1 cache holds some), the block
# state a chain leaves, read once after it, in the second half.
# (Every stretch ends with trace consumed: after it the block is closed,
# the instruction count and the no-trace count start again.)
(XE_KEY, XE_GEN, XE_START, XE_SHAPE, XE_COUNT, XE_END_BLK, XE_END_IP, XE_PSTART,
 XE_CB_NINSN, XE_CB_ISID, XE_CB_IP, XE_CB_RUN) = range(12)  # fmt: skip
# XE_START: where the stretch's keys start in the pool, and above bit 32
# the block store's key for the sequence they are there (plus one; 0: none).
# XE_SHAPE packs the stretch's small numbers: its rows (m), the row of its
# first consumed bit (j1) and of the TIP it goes on to (j2), the bits it
# consumes, the deepest and the final number of its calls not returned
# from, and whether it ends popping the return stack.  XE_COUNT: its
# instructions, and libipt's blocks above bit XC_BLOCKS (so the chain sums
# both in one add: its sums stay below 2**40 instructions and 2**23 blocks,
# a window's).
XS_M, XS_J1, XS_J2, XS_CONS, XS_DMAX, XS_NPUSH, XS_POP = 0, 10, 20, 30, 36, 43, 50
_XS_10, _XS_6, _XS_7 = np.int64(0x3FF), np.int64(0x3F), np.int64(0x7F)
XC_BLOCKS = 40
_XC_ONE_BLOCK, _XC_NINSN = np.int64(1 << XC_BLOCKS), np.int64((1 << XC_BLOCKS) - 1)
# A key's bit for a stretch that goes on after its packet's last TNT bit
# to the TIP that follows (its rows from j2 on are at the TIP's offset).
XK_THEN_TIP = 1 << 12


@aot.njit(cache=True, inline="always", _nrt=False)
def _x_slot(xkey, mask):
    return np.int64((np.uint64(xkey) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)) & mask


@aot.njit(cache=True, inline="always", _nrt=False)
def _row_points(o_cols, t_cols, state, row, o, t, n_off, last_off, off_at, n_t, last_t):
    """The points a row at ``row`` of offset ``o`` and time ``t`` needs, as
    put_row stores them (room known; the offset and time points' arrays
    ``o_cols``, ``t_cols``); returns the store's offset and time counters
    after them."""
    if o != last_off:
        n_off = put_offset(o_cols[0], o_cols[1], o_cols[2], state, n_off, row, row - off_at,
                           o - last_off, o)  # fmt: skip
        last_off = o
        off_at = row
    if t != last_t:
        n_t = put_time(t_cols[0], t_cols[1], t_cols[2], state, n_t, row, t, last_t)
        last_t = t
    return n_off, last_off, off_at, n_t, last_t


@aot.njit(cache=True, inline="always", _nrt=False)
def _x_keys(x_key, start, s_keys, row0, m):
    """Keep the block-store keys of a recorded stretch's rows."""
    for j in range(m):
        x_key[start + j] = s_keys[row0 + j]


@aot.njit(cache=True, _nrt=False)
def _x_put(x_words, counts, slot, key, gen, start, m, ninsn, j1, cons, end_blk, end_ip, nblk,
           cb_ninsn, cb_isid, cb_ip, cb_run, pstart, npush, dmax, j2, pops, seq):  # fmt: skip
    """Keep a recorded stretch (its runs and pushes are in the pools; its
    rows' keys also as the block store's sequence ``seq``, -1: none)."""
    at = _x_at(slot)
    e = x_words[at : at + np.uint64(X_HOT)]
    e[XE_KEY], e[XE_GEN], e[XE_PSTART] = key, gen, pstart
    e[XE_START] = np.int64(start) | ((np.int64(seq) + 1) << 32)
    e[XE_SHAPE] = (
        (np.int64(m) << XS_M) | (np.int64(j1) << XS_J1) | (np.int64(j2) << XS_J2)
        | (np.int64(cons) << XS_CONS) | (np.int64(dmax) << XS_DMAX)
        | (np.int64(npush) << XS_NPUSH) | (np.int64(pops) << XS_POP)
    )  # fmt: skip
    e[XE_COUNT] = np.int64(ninsn) | (np.int64(nblk) << XC_BLOCKS)
    e[XE_END_BLK], e[XE_END_IP] = end_blk, np.int64(end_ip)
    x_words[_x_cold(x_words, slot, XE_CB_NINSN)] = cb_ninsn
    x_words[_x_cold(x_words, slot, XE_CB_ISID)] = cb_isid
    x_words[_x_cold(x_words, slot, XE_CB_IP)] = np.int64(cb_ip)
    x_words[_x_cold(x_words, slot, XE_CB_RUN)] = cb_run
    counts[C_X_POOL] = start + m
    counts[C_X_PUSH] = pstart + npush


@aot.njit(cache=True, inline="always", _nrt=False)
def _stretch_key(kind, a, b, tsc, have_tsc, n_fetch, blk, evt, pos, size, bits, last_ip):
    """The replay key of a stretch from run ``blk`` at the current event:
    ``(key, nb, then_tip, peeked, fetched...)``: the bits it takes (XK_TIP
    for a TIP) and, when they are its packet's last, the next flow packet
    (``_fast_fetch``'s result, ``peeked``)."""
    one = np.uint64(1)
    then_tip = False
    peeked = False
    t_evt, t_pos, t_val, t_size, t_last_ip, t_tsc, t_has = (
        0, pos, np.uint64(0), np.int64(0), last_ip, np.uint64(0), False
    )  # fmt: skip
    if evt == EV_TNT:
        nb = min(size, X_BITS)
        chunk = np.int64((bits >> np.uint64(size - nb)) & ((one << np.uint64(nb)) - one))
        if nb == size:
            # The packet after these bits: a TIP is taken in the same
            # stretch; anything else is what to go on with.
            t_evt, t_pos, t_val, t_size, t_last_ip, t_tsc, t_has = _fast_fetch(
                kind, a, b, tsc, have_tsc, n_fetch, pos, last_ip
            )
            peeked = True
            then_tip = t_evt == EV_TIP
    else:
        nb = np.int64(XK_TIP)
        chunk = np.int64(0)
    xkey = (np.int64(blk) << 16) | (nb << 8) | chunk
    if then_tip:
        xkey |= XK_THEN_TIP
    return xkey, nb, then_tip, peeked, t_evt, t_pos, t_val, t_size, t_last_ip, t_tsc, t_has


# The chain's state (ds[16], ds[17]), passed in and out of _replay_chain.
# (XV_ROWS: the rows it gave, none when it stopped at once; XV_LAST: the
# entry it replayed last, or ~run: the run it walked last.)
(XV_BLK, XV_POS, XV_EVT, XV_SIZE, XV_EV_HAS, XV_HAS_TSC, XV_RS_TOP, XV_RS_N, XV_ROWS,
 XV_NBLOCKS, XV_NINSN, XV_LAST, XV_S_ROWS, XV_S_OFF, XV_S_T, XV_S_LAST_OFF,
 XV_S_STARTED, XV_S_OFF_AT, XV_S_ENT) = range(19)  # fmt: skip
NXV = 19
XU_IP, XU_BITS, XU_TIP, XU_EV_TSC, XU_LAST_IP, XU_CUR_TSC, XU_S_LAST_T = range(7)
NXU = 7
# Why _replay_chain stopped: at something the fast loop walks (a stretch
# not in the cache or not replayable here, a run to build, a return it
# cannot take itself), or at a packet that is not plain flow.
XC_WALK, XC_FETCH = 0, 1


_XE_KEY, _XE_GEN, _XE_START, _XE_SHAPE = (
    np.uint64(f) for f in (XE_KEY, XE_GEN, XE_START, XE_SHAPE)
)
_XE_COUNT, _XE_END_BLK, _XE_END_IP, _XE_PSTART = (
    np.uint64(f) for f in (XE_COUNT, XE_END_BLK, XE_END_IP, XE_PSTART)
)  # fmt: skip
X_HOT = 8
_X_SHIFT = np.uint64(X_HOT.bit_length() - 1)
_X_ALL_SHIFT = np.uint64(X_FIELDS.bit_length() - 1)
assert 1 << int(_X_SHIFT) == X_HOT and X_HOT == XE_CB_NINSN and 2 * X_HOT == X_FIELDS


@aot.njit(cache=True, inline="always", _nrt=False)
def _x_at(slot):
    """Where entry ``slot``'s words start among the replay cache's."""
    return np.uint64(slot) << _X_SHIFT


@aot.njit(cache=True, inline="always", _nrt=False)
def _x_cold(x_words, slot, field):
    """Where field ``field`` (XE_CB_*) of entry ``slot`` is: in the words'
    second half."""
    return (
        np.uint64(x_words.shape[0] >> 1) + (np.uint64(slot) << _X_SHIFT) + np.uint64(field - X_HOT)
    )


@aot.njit(cache=True, inline="always", _nrt=False)
def _x_slots(x_words):
    """The replay cache's entries."""
    return np.int64(x_words.shape[0] >> _X_ALL_SHIFT)


@aot.njit(cache=True, _nrt=False)
def _replay_chain(pk, ct, store, RS, RSR, V, U, n, n_fetch, end_offset, mode, direct, x_gen):
    """Replay stretches one after another while they are in the cache.

    The fast loop's state comes in and goes out in ``V``/``U``; the loop is
    apart from _fast so that its few live values stay in registers.  A
    replay does what walking the stretch did: the block store receives its
    sequence's key or its rows' keys (``direct``; else they are only
    counted), the offset and time points put_row would have stored, the
    return stack its pushes; the counters their sums."""
    kind, a, b = pk[0], pk[1], pk[2]
    offsets, tsc, have_tsc = pk[4], pk[6], pk[7]
    r_hip, r_hmode, r_hval, r_ninsn, r_kind = ct[12], ct[13], ct[14], ct[17], ct[18]
    r_key, r_ip, r_mode, r_next = ct[T_R_KEY], ct[T_R_IP], ct[T_R_MODE], ct[T_R_NEXT]
    r_taken, r_ret = ct[T_R_TAKEN], ct[T_R_RET]
    x_words, x_key, x_pip, x_prun = ct[T_X_TAB], ct[T_X_KEY], ct[T_X_PIP], ct[T_X_PRUN]
    x_mask = _x_slots(x_words) - 1
    s_keys, s_cols, s_state = store[0], store[2], store[3]
    o_cols = (s_cols[4], s_cols[5], s_cols[12])
    t_cols = (s_cols[6], s_cols[7], s_cols[11])
    blk, pos, evt, size = V[XV_BLK], V[XV_POS], V[XV_EVT], V[XV_SIZE]
    ev_has_tsc, has_tsc = V[XV_EV_HAS] != 0, V[XV_HAS_TSC] != 0
    rs_top, rs_n = V[XV_RS_TOP], V[XV_RS_N]
    s_rows, s_off, s_t = V[XV_S_ROWS], V[XV_S_OFF], V[XV_S_T]
    s_last_off, s_started, s_off_at = V[XV_S_LAST_OFF], V[XV_S_STARTED], V[XV_S_OFF_AT]
    s_ent = V[XV_S_ENT]
    ip, bits, tip, ev_tsc = U[XU_IP], U[XU_BITS], U[XU_TIP], U[XU_EV_TSC]
    last_ip, cur_tsc, s_last_t = U[XU_LAST_IP], U[XU_CUR_TSC], U[XU_S_LAST_T]
    # (Few values live across the loop, so that they stay in registers: the
    # rows given, the instructions and blocks in one sum, see XC_BLOCKS.)
    rows = count = np.int64(0)
    last = np.int64(-1)  # the entry replayed last, or ~run: the run walked last
    # The entry whose TIP target is being looked up (-1: none): a stretch
    # that ends at a TIP keeps the run of the target it went to last in its
    # end fields, which a stretch ending at a TIP has no other use for (an
    # indirect branch mostly goes where it went before, as a branch target
    # buffer has it).
    memo = np.int64(-1)
    # The indirect branch's run whose target is being looked up (-1: none):
    # a run taking a TIP keeps the run it went to last in r_taken, which
    # only a conditional branch's run has another use for.
    btb = np.int64(-1)
    # (The key column's room is counted in rows, not in the entries that
    # hold them: a stream's batches stay as long, whatever replays stored.)
    # The rows the store has room for, counted so that its offset and time
    # points have room too: each stretch or run replayed stores at least a
    # row and at most two offset and two time points (at its first row, and
    # at the TIP's rows or after the first consumed bit), so one check on
    # the rows is all a replay makes.  A store that holds no row yet takes
    # none from here (its first offset point is far, see put_row).
    row_limit = min(
        s_keys.shape[0],
        s_rows + (o_cols[0].shape[0] - s_off) // 2 - 1,
        s_rows + (t_cols[0].shape[0] - s_t) // 2 - 1,
    )
    if not s_started:
        row_limit = np.int64(-1)
    code = XC_WALK
    while True:
        if blk < 0:
            blk = hash_find(r_hip, r_hmode, r_hval, ip, mode)
            if blk < 0:
                break
            if memo >= 0:
                xe = _x_at(memo)
                x_words[xe + _XE_END_IP], x_words[xe + _XE_END_BLK] = np.int64(ip), blk
                memo = -1
            if btb >= 0:
                r_taken[np.uint64(btb)] = blk
                btb = -1
        rk = r_kind[np.uint64(blk)]
        if evt == EV_TIP and (rk == RUN_RET or rk == RUN_IJUMP or rk == RUN_ICALL):
            # A run that takes the TIP itself is walked here too, as _fast
            # walks it (one row, a new block, the TIP consumed): no stretch
            # to look up, and where it goes is most often where it went last.
            # (Apart from the walk of a return below, though the rows are
            # stored alike: one branch for both was 5-9% slower here.)
            if direct:
                key = np.int64(r_key[blk])
                if key < 0 or s_rows >= row_limit:
                    break
                o = offsets[np.uint64(pos)] if pos < n else end_offset
                s_keys[np.uint64(s_ent)] = key
                s_off, s_last_off, s_off_at, s_t, s_last_t = _row_points(
                    o_cols, t_cols, s_state, s_rows, o, cur_tsc, s_off, s_last_off, s_off_at, s_t,
                    s_last_t,
                )  # fmt: skip
                s_rows += 1
                s_ent += 1
            rows += 1
            count += _XC_ONE_BLOCK + r_ninsn[blk]
            last = ~blk
            cur_tsc = ev_tsc
            has_tsc = ev_has_tsc
            if rk == RUN_ICALL:
                rs_top = (rs_top + 1) & _RS_MASK
                RS[rs_top] = r_next[blk]
                RSR[rs_top] = r_ret[blk]
                rs_n = min(rs_n + 1, RETSTACK_SIZE)
            ip = tip
            to = np.int64(r_taken[blk])
            if to >= 0 and r_ip[np.uint64(to)] == tip and r_mode[np.uint64(to)] == mode:
                blk = to
            else:
                btb = blk
                blk = -1
            evt = 0  # consumed
            peeked = merged = False
            t_evt, t_pos, t_val, t_size, t_last_ip, t_tsc, t_has = (
                0, pos, np.uint64(0), np.int64(0), last_ip, np.uint64(0), False
            )  # fmt: skip
        elif evt == EV_TNT and rk == RUN_RET:
            # A stretch does not start at a return the stack decides: the
            # return is walked here, as _fast walks it (one row, a new
            # block, its bit consumed), unless it needs more than that.
            if ((bits >> np.uint64(size - 1)) & np.uint64(1)) == 0 or rs_n == 0:
                break
            if direct:
                key = np.int64(r_key[blk])
                if key < 0 or s_rows >= row_limit:
                    break
                # The row, as put_row stores it.
                o = offsets[np.uint64(pos)] if pos < n else end_offset
                s_keys[np.uint64(s_ent)] = key
                s_off, s_last_off, s_off_at, s_t, s_last_t = _row_points(
                    o_cols, t_cols, s_state, s_rows, o, cur_tsc, s_off, s_last_off, s_off_at, s_t,
                    s_last_t,
                )  # fmt: skip
                s_rows += 1
                s_ent += 1
            rows += 1
            count += _XC_ONE_BLOCK + r_ninsn[blk]
            last = ~blk
            cur_tsc = ev_tsc
            has_tsc = ev_has_tsc
            size -= 1
            ip = RS[rs_top]
            blk = RSR[rs_top]
            rs_top = (rs_top - 1) & _RS_MASK
            rs_n -= 1
            if size > 0:
                continue
            peeked = merged = False  # (the next packet is fetched below)
            t_evt, t_pos, t_val, t_size, t_last_ip, t_tsc, t_has = (
                0, pos, np.uint64(0), np.int64(0), last_ip, np.uint64(0), False
            )  # fmt: skip
        else:
            xkey, nb, then_tip, peeked, t_evt, t_pos, t_val, t_size, t_last_ip, t_tsc, t_has = (
                _stretch_key(kind, a, b, tsc, have_tsc, n_fetch, blk, evt, pos, size, bits, last_ip)
            )  # fmt: skip
            xs = _x_slot(xkey, x_mask)
            xe = _x_at(xs)
            if x_words[xe + _XE_KEY] != xkey or x_words[xe + _XE_GEN] != x_gen:
                break
            shape = x_words[xe + _XE_SHAPE]
            m = (shape >> XS_M) & _XS_10
            cons = (shape >> XS_CONS) & _XS_6
            dmax = (shape >> XS_DMAX) & _XS_7
            pops = ((shape >> XS_POP) & 1) != 0
            # (A stretch keyed to go on to the TIP may have ended at a return
            # before it.)
            merged = then_tip and not pops
            if pops and min(rs_n + dmax, RETSTACK_SIZE) - dmax <= 0:
                break  # nothing to return to: the walk says what that is
            if direct:
                # The rows, as put_row would have stored them one by one: one
                # offset (the packet's), the time before the first consumed
                # bit and the packet's time after it.
                o = offsets[np.uint64(pos)] if pos < n else end_offset
                j1 = (shape >> XS_J1) & _XS_10
                # (Two offset points at most: at the first row, and at the
                # TIP's rows; two time points likewise.)
                if s_rows + m > row_limit:
                    break
                # The rows' keys: their sequence's key, or each row's.
                # (Unsigned indices: numba checks a signed one for a negative
                # value.)
                start = x_words[xe + _XE_START]
                at = np.uint64(s_ent)
                if start >> 32:
                    s_keys[at] = (start >> 32) - 1
                    s_ent += 1
                else:
                    st = np.uint64(start)
                    for j in range(m):
                        s_keys[at + np.uint64(j)] = x_key[st + np.uint64(j)]
                    s_ent += m
                s_off, s_last_off, s_off_at, s_t, s_last_t = _row_points(
                    o_cols, t_cols, s_state, s_rows, o, cur_tsc, s_off, s_last_off, s_off_at, s_t,
                    s_last_t,
                )  # fmt: skip
                if j1 < m and ev_tsc != s_last_t:
                    s_t = put_time(
                        t_cols[0], t_cols[1], t_cols[2], s_state, s_t, s_rows + j1, ev_tsc, s_last_t,
                    )  # fmt: skip
                    s_last_t = ev_tsc
                if merged:
                    # The rows after the last bit: fetched at the TIP.
                    o2 = offsets[np.uint64(t_pos)]
                    if o2 != o:
                        at2 = s_rows + ((shape >> XS_J2) & _XS_10)
                        s_off = put_offset(o_cols[0], o_cols[1], o_cols[2], s_state, s_off, at2,
                                           at2 - s_off_at, o2 - o, o2)  # fmt: skip
                        s_last_off = o2
                        s_off_at = at2
                s_rows += m
            last = xs
            rows += m
            count += x_words[xe + _XE_COUNT]
            cur_tsc = ev_tsc
            has_tsc = ev_has_tsc
            npush = (shape >> XS_NPUSH) & _XS_7
            if npush:
                ps = x_words[xe + _XE_PSTART]
                for j in range(npush):
                    rs_top = (rs_top + 1) & _RS_MASK
                    RS[rs_top] = x_pip[np.uint64(ps + j)]
                    RSR[rs_top] = x_prun[np.uint64(ps + j)]
            # Calls returned from inside the stretch still pushed: when the
            # stack was full they dropped its oldest entries.
            rs_n = min(rs_n + dmax, RETSTACK_SIZE) - (dmax - npush)
            if pops:
                ip = RS[rs_top]
                blk = RSR[rs_top]
                rs_top = (rs_top - 1) & _RS_MASK
                rs_n -= 1
                size -= cons
                if size > 0:
                    continue
            elif nb == XK_TIP:
                ip = tip
                blk = (
                    x_words[xe + _XE_END_BLK]
                    if np.uint64(x_words[xe + _XE_END_IP]) == tip
                    else np.int64(-1)
                )
                memo = xs if blk < 0 else np.int64(-1)
                evt = 0  # consumed
            elif merged:
                # The TIP fetched and consumed too.
                ip = t_val
                blk = (
                    x_words[xe + _XE_END_BLK]
                    if np.uint64(x_words[xe + _XE_END_IP]) == t_val
                    else np.int64(-1)
                )
                memo = xs if blk < 0 else np.int64(-1)
                size = 0
                pos = t_pos
                last_ip = t_last_ip
                cur_tsc = t_tsc
                has_tsc = t_has
                evt = 0
            else:
                ip = np.uint64(x_words[xe + _XE_END_IP])
                blk = x_words[xe + _XE_END_BLK]
                size -= cons
                if size > 0:
                    continue
        if peeked and not merged:
            evt, pos, val, size, last_ip, ev_tsc, ev_has_tsc = (
                t_evt, t_pos, t_val, t_size, t_last_ip, t_tsc, t_has
            )  # fmt: skip
        else:
            p = pos if evt == EV_TNT else pos + 1
            evt, pos, val, size, last_ip, ev_tsc, ev_has_tsc = _fast_fetch(
                kind, a, b, tsc, have_tsc, n_fetch, p, last_ip
            )
        if evt == EV_TNT:
            bits = val
        elif evt == EV_TIP:
            tip = val
        else:
            code = XC_FETCH
            break
    V[XV_BLK], V[XV_POS], V[XV_EVT], V[XV_SIZE] = blk, pos, evt, size
    V[XV_EV_HAS], V[XV_HAS_TSC] = ev_has_tsc, has_tsc
    V[XV_RS_TOP], V[XV_RS_N] = rs_top, rs_n
    V[XV_ROWS], V[XV_NBLOCKS], V[XV_NINSN], V[XV_LAST] = (
        rows, count >> XC_BLOCKS, count & _XC_NINSN, last
    )  # fmt: skip
    V[XV_S_ROWS], V[XV_S_OFF], V[XV_S_T] = s_rows, s_off, s_t
    V[XV_S_LAST_OFF], V[XV_S_STARTED], V[XV_S_OFF_AT] = s_last_off, s_started, s_off_at
    V[XV_S_ENT] = s_ent
    U[XU_IP], U[XU_BITS], U[XU_TIP], U[XU_EV_TSC] = ip, bits, tip, ev_tsc
    U[XU_LAST_IP], U[XU_CUR_TSC], U[XU_S_LAST_T] = last_ip, cur_tsc, s_last_t
    return code


def cached_stretch_starts(table) -> np.ndarray:
    """The IPs of the runs a code table's replay cache has stretches from
    (its current generation's, each once): what the fast loop recorded."""
    hot = table.x_words[: table.x_words.shape[0] // 2].reshape(-1, X_HOT)
    keys = hot[hot[:, XE_GEN] == table.counts[C_X_GEN], XE_KEY]
    return np.unique(table.r_ip[keys >> 16])


@aot.njit(cache=True, _nrt=False)
def _fast(ds, pk, cf, ct, out):
    """Walk runs against TNT bits and TIPs while the trace is plain flow.

    A run's successors are learned as run indices (``r_succ``, ``r_taken``,
    and the run a call returns to, carried on the return stack), so most
    steps need no lookup.  Rows are emitted per run (or only counted); the
    block state (CB_*) follows libipt's blocks so the step functions can
    take over in the middle of one.  Tracing turned off and on again (a
    system call, an interrupt: _off_and_on) is applied here too, its row,
    events and state as the step functions leave them."""
    SI, SU, CUR, RS, RSR = ds[0], ds[1], ds[2], ds[6], ds[14]
    kind, a, b = pk[0], pk[1], pk[2]
    offsets, tsc, have_tsc = pk[4], pk[6], pk[7]
    o_ip, o_ninsn, o_flags, o_mode, o_off, o_time = out[0], out[1], out[2], out[3], out[4], out[5]
    o_run = out[9]
    r_hip, r_hmode, r_hval = ct[12], ct[13], ct[14]
    r_ninsn, r_kind, r_next, r_target, r_isid = ct[17], ct[18], ct[19], ct[20], ct[22]
    r_succ, r_taken, r_ret, r_lastk, r_lastc = ct[25], ct[26], ct[27], ct[28], ct[29]
    count_only = cf[0][CF_COUNT] != 0
    n = SI[W_N]
    # A window that ends where the code changes (W_EXACT) is not read past
    # its limit: the packet there is fetched in the next one.
    n_fetch = min(n, SI[W_LIMIT]) if SI[W_EXACT] and SI[W_LIMIT] >= 0 else n
    end_offset = np.int64(SU[W_END_OFFSET])
    cap = o_ip.shape[0] - 2
    nout = SI[O_NBLK]
    nvirt = SI[O_VBLK]
    # Rows go straight into the block store while it has room and no row
    # waits in the output before them (see hwtrace.pt.blocks).
    s_keys, s_tab, s_cols, s_state = out[10]
    live = s_state[S_LIVE] != 0 and not count_only
    direct = live and nout == 0
    counts, r_key = ct[T_COUNTS], ct[T_R_KEY]
    if live:
        claim_run_keys(counts, r_key, counts[C_RUNS], s_state)
    image = counts[C_INDEX]
    s_off_pts, s_off_far_row, s_off_far_val = s_cols[4], s_cols[5], s_cols[12]
    s_t_pts, s_t_far_row, s_t_far_val = s_cols[6], s_cols[7], s_cols[11]
    s_rows, s_nkeys, s_off, s_t = s_state[S_ROWS], s_state[S_KEYS], s_state[S_OFF], s_state[S_TIME]
    s_last_off, s_last_t = s_state[S_LAST_OFF], np.uint64(s_state[S_LAST_TIME])
    s_started = s_state[S_STARTED]
    s_off_at = s_state[S_OFF_AT]
    s_ent = s_state[S_ENT]
    key_limit = store_key_limit(s_keys, s_tab, s_cols, s_state)
    x_words, x_key, x_pip, x_prun = ct[T_X_TAB], ct[T_X_KEY], ct[T_X_PIP], ct[T_X_PRUN]
    # (The cache holds the store's keys and names its sequences: it is the
    # store's and its sequences' generation's.)
    x_owner = (s_state[S_ID] << 24) + s_state[S_SEQ_GEN] if live else (-2 if count_only else -3)
    if counts[C_X_OWNER] != x_owner:
        # Another store's keys (or none): start the cache again.
        counts[C_X_GEN] += 1
        counts[C_X_OWNER] = x_owner
        counts[C_X_POOL] = 0
        counts[C_X_PUSH] = 0
    x_gen = counts[C_X_GEN]
    replay = cf[0][CF_REPLAY] != 0
    x_rows = np.int64(0)  # rows replayed
    x_mask = _x_slots(x_words) - 1
    rec = False  # recording a stretch
    rec_key = rec_slot = rec_nb = rec_start = rec_pstart = np.int64(0)
    rec_m = rec_ninsn = rec_cons = rec_j1 = rec_nblk = np.int64(0)
    rec_depth = rec_dmax = rec_row0 = rec_j2 = np.int64(0)
    rec_then_tip = rec_pop = False
    mode = SI[BS_MODE]
    spec_flag = O_SPEC if SI[BS_SPEC] else 0
    ip = SU[BS_IP]
    pos = SI[ES_POS]
    t = CUR[E_TYPE]
    evt = EV_TNT if t == EV_TNT else EV_TIP
    size = np.int64(CUR[E_SIZE])
    bits = CUR[E_BITS]
    tip = CUR[E_IP]
    ev_tsc = CUR[E_TSC]
    ev_has_tsc = _has_tsc(CUR)
    last_ip = SU[ES_LAST_IP]
    cur_tsc = SU[BS_TSC]
    has_tsc = SI[BS_HAS_TSC] != 0
    icnt = SI[BS_ICNT]
    has_icnt = SI[BS_HAS_ICNT] != 0
    rs_top = SI[BS_RS_TOP]
    rs_n = SI[BS_RS_N]
    cb_open = SI[CB_OPEN] != 0
    cb_ninsn = SI[CB_NINSN]
    cb_isid = SI[CB_ISID]
    cb_ip = SU[CB_IP]
    cb_row = SI[CB_ROW]
    cb_run = -1
    n_blocks = SI[O_NBLOCKS]
    n_insn = SI[O_NINSN]
    quiet = 0
    one = np.uint64(1)
    why = FR_STOP
    blk = -1  # the run at ip, when known
    prev = -1  # the run that led here, and which of its slots learns blk
    learn = LEARN_NONE
    chained = False  # the replay chain was tried at this stretch start
    # At the run where tracing came back on (see _off_and_on below) no
    # stretch is looked up or recorded: an interrupt's return lands anywhere
    # in a run, so a stretch from there seldom comes again, and recording
    # every one filled the cache's pools and the block store's sequences
    # (one a system call), after which replays stored a key a row.  The run
    # is walked; the chain is tried again at the next.
    resumed = False
    V, U = ds[16], ds[17]
    # Tracing off and on again (_off_and_on) is applied here where the
    # step functions would take it an event and a pass of the driver's
    # loop at a time, with no events to stop at, the event decoder's state
    # plain and room for its row and events (the step functions take the
    # rest).
    CF = cf[0]
    off_on = (
        CF[CF_STOP_EVENTS] == STOP_NONE and SI[ES_STATUS] == 0 and SI[ES_ENABLED] != 0
        and SI[ES_MEV] != 0
    )  # fmt: skip
    # A PSB+ that only restates the state (_psb_plus) likewise, where
    # nobody keeps its status updates (the library drops them).
    psb_on = (
        off_on and CF[CF_STATUS_EVENTS] == 0 and SI[ES_QN] == 0 and CF[CF_IFLAGS] == 0
        and not CF[CF_ERRATA] & ER_BDM70
    )  # fmt: skip
    w_limit = SI[W_LIMIT]
    row_cap, ev_cap = o_ip.shape[0] - 4, out[7].shape[0] - 4  # (as _room has it)
    while True:
        while True:
            if not count_only and nout >= cap:
                why = FR_FULL
                break
            if blk < 0:
                blk = hash_find(r_hip, r_hmode, r_hval, ip, mode)
                if blk < 0:
                    blk = build_run(ct, ip, mode)
                    if blk == -1:
                        why = FR_MISS
                        break
                    if blk == -2:
                        why = FR_GROW
                        break
                if learn == LEARN_SUCC:
                    r_succ[prev] = blk
                elif learn == LEARN_TAKEN:
                    r_taken[prev] = blk
            learn = LEARN_NONE
            bk = r_kind[blk]
            ninsn = r_ninsn[blk]
            if rec:
                if bk == RUN_RET and evt == EV_TNT and rec_depth == 0:
                    # A return to a call made before the stretch: it ends the
                    # stretch, popping where to go from the return stack.
                    rec_pop = True
            elif (
                not cb_open
                and not resumed
                and replay
                and (direct or count_only)
                and (evt == EV_TIP or (evt == EV_TNT and bk != RUN_RET))
            ):
                if not chained:
                    chained = True
                    V[XV_BLK], V[XV_POS], V[XV_EVT], V[XV_SIZE] = blk, pos, evt, size
                    V[XV_EV_HAS], V[XV_HAS_TSC] = ev_has_tsc, has_tsc
                    V[XV_RS_TOP], V[XV_RS_N] = rs_top, rs_n
                    V[XV_S_ROWS], V[XV_S_OFF], V[XV_S_T] = s_rows, s_off, s_t
                    V[XV_S_LAST_OFF], V[XV_S_STARTED], V[XV_S_OFF_AT] = (
                        s_last_off, s_started, s_off_at
                    )  # fmt: skip
                    V[XV_S_ENT] = s_ent
                    U[XU_IP], U[XU_BITS], U[XU_TIP], U[XU_EV_TSC] = ip, bits, tip, ev_tsc
                    U[XU_LAST_IP], U[XU_CUR_TSC], U[XU_S_LAST_T] = last_ip, cur_tsc, s_last_t
                    code = _replay_chain(
                        pk, ct, out[10], RS, RSR, V, U, n, n_fetch, end_offset, mode, direct, x_gen
                    )
                    if V[XV_ROWS]:
                        blk, pos, evt, size = V[XV_BLK], V[XV_POS], V[XV_EVT], V[XV_SIZE]
                        ev_has_tsc, has_tsc = V[XV_EV_HAS] != 0, V[XV_HAS_TSC] != 0
                        rs_top, rs_n = V[XV_RS_TOP], V[XV_RS_N]
                        s_rows, s_off, s_t = V[XV_S_ROWS], V[XV_S_OFF], V[XV_S_T]
                        s_last_off, s_started, s_off_at = (
                            V[XV_S_LAST_OFF], V[XV_S_STARTED], V[XV_S_OFF_AT]
                        )  # fmt: skip
                        s_ent = V[XV_S_ENT]
                        ip, bits, tip, ev_tsc = U[XU_IP], U[XU_BITS], U[XU_TIP], U[XU_EV_TSC]
                        last_ip, cur_tsc, s_last_t = U[XU_LAST_IP], U[XU_CUR_TSC], U[XU_S_LAST_T]
                        x_rows += V[XV_ROWS]
                        nvirt += V[XV_ROWS]
                        n_blocks += V[XV_NBLOCKS]
                        n_insn += V[XV_NINSN]
                        icnt = 0
                        has_icnt = True
                        if V[XV_LAST] >= 0:
                            e = V[XV_LAST]
                            cb_ninsn = x_words[_x_cold(x_words, e, XE_CB_NINSN)]
                            cb_isid = x_words[_x_cold(x_words, e, XE_CB_ISID)]
                            cb_ip = np.uint64(x_words[_x_cold(x_words, e, XE_CB_IP)])
                            cb_run = x_words[_x_cold(x_words, e, XE_CB_RUN)]
                        else:  # a run walked (a return, a TIP)
                            cb_run = ~V[XV_LAST]
                            cb_ninsn, cb_isid = np.int64(r_ninsn[cb_run]), np.int64(r_isid[cb_run])
                            cb_ip = ct[T_R_IP][cb_run]
                        if code == XC_FETCH:
                            why = FR_FETCH
                            break
                        continue
                xkey, nb, then_tip = _stretch_key(
                    kind, a, b, tsc, have_tsc, n_fetch, blk, evt, pos, size, bits, last_ip
                )[:3]
                xs = _x_slot(xkey, x_mask)
                # Record the stretch from here.
                if (
                    counts[C_X_POOL] + X_MAX_RUNS > x_key.shape[0]
                    or counts[C_X_PUSH] + X_MAX_DEPTH > x_pip.shape[0]
                ):
                    x_gen += 1  # the pools are full: start the cache again
                    counts[C_X_GEN] = x_gen
                    counts[C_X_POOL] = 0
                    counts[C_X_PUSH] = 0
                rec = True
                rec_key, rec_slot, rec_nb, rec_then_tip = xkey, xs, nb, then_tip
                rec_start, rec_pstart = counts[C_X_POOL], counts[C_X_PUSH]
                rec_m = rec_ninsn = rec_cons = rec_j1 = rec_nblk = 0
                rec_depth = rec_dmax = 0
                rec_pop = False
                rec_row0 = s_ent
            chained = False
            resumed = False
            # The run's exit must be takeable before it is emitted, so a stop
            # leaves the state at the run's start.
            if bk == RUN_STOP:
                break
            if bk == RUN_COND:
                if evt != EV_TNT:
                    break
            elif bk == RUN_IJUMP or bk == RUN_ICALL:
                if evt != EV_TIP:
                    break
            elif bk == RUN_RET:
                if evt == EV_TNT:
                    if ((bits >> np.uint64(size - 1)) & one) == 0 or rs_n == 0:
                        break
                elif evt != EV_TIP:
                    break
            new = not cb_open or r_isid[blk] != cb_isid
            if not new and cb_ninsn + ninsn > MAX_NINSN:
                break  # the step functions split the block where libipt does
            stored = count_only
            if count_only:
                nvirt += 1
            elif direct:
                key = np.int64(r_key[blk])
                if key < 0:
                    key, s_nkeys = _block_key(
                        ip, ninsn, mode, image, s_tab, s_cols, s_nkeys, key_limit
                    )
                    if key >= 0:
                        r_key[blk] = key
                o = offsets[pos] if pos < n else end_offset
                full = np.int64(1)
                if key >= 0:
                    full, s_rows, s_off, s_t, s_last_off, s_last_t, s_off_at = put_row(
                        s_keys, s_off_pts, s_off_far_row, s_off_far_val, s_t_pts, s_t_far_row,
                        s_t_far_val, key, o, cur_tsc, s_rows, s_off, s_t, s_last_off, s_last_t,
                        s_started, s_off_at, s_state, s_ent,
                    )  # fmt: skip
                if full:
                    # The store is full: Python makes room (a stream passes its
                    # rows on, a collector grows it) and the decoder goes on
                    # storing, and replaying, from this run.
                    why = FR_FULL
                    break
                s_started = 1
                s_ent += 1
                nvirt += 1
                stored = True
            if not stored:
                o_ip[nout] = ip
                o_ninsn[nout] = ninsn
                o_run[nout] = blk
                o_flags[nout] = (O_NEW if new else 0) | spec_flag
                o_mode[nout] = mode
                o_off[nout] = offsets[pos] if pos < n else end_offset
                o_time[nout] = cur_tsc
                if new:
                    cb_row = nout
                nout += 1
            if rec:
                if not stored or rec_m >= X_MAX_RUNS:
                    rec = False
                else:
                    rec_m += 1
                    rec_ninsn += ninsn
                    if new:
                        rec_nblk += 1
            if new:
                cb_open = True
                cb_ninsn = 0
                cb_isid = r_isid[blk]
                cb_ip = ip
                n_blocks += 1
            n_insn += ninsn
            cb_ninsn += ninsn
            cb_run = blk
            if has_icnt:
                icnt += ninsn
            prev = blk
            if bk == RUN_CALL or bk == RUN_ICALL:
                # A call pushes where it returns to, and the run there.
                rs_top = (rs_top + 1) & _RS_MASK
                RS[rs_top] = r_next[blk]
                ret = r_ret[blk]
                if ret < 0:
                    ret = hash_find(r_hip, r_hmode, r_hval, r_next[blk], mode)
                    r_ret[blk] = ret
                RSR[rs_top] = ret
                rs_n = min(rs_n + 1, RETSTACK_SIZE)
                if rec:
                    if rec_depth >= X_MAX_DEPTH:
                        rec = False
                    else:
                        x_pip[rec_pstart + rec_depth] = RS[rs_top]
                        x_prun[rec_pstart + rec_depth] = ret
                        rec_depth += 1
                        rec_dmax = max(rec_dmax, rec_depth)
            if bk == RUN_FALL or bk == RUN_JUMP or bk == RUN_CALL:
                ip = r_next[blk] if bk == RUN_FALL else r_target[blk]
                blk = r_succ[prev]
                learn = LEARN_SUCC
            elif bk == RUN_COND:
                size -= 1
                if (bits >> np.uint64(size)) & one:
                    ip = r_target[blk]
                    blk = r_taken[prev]
                    learn = LEARN_TAKEN
                else:
                    ip = r_next[blk]
                    blk = r_succ[prev]
                    learn = LEARN_SUCC
            elif bk == RUN_RET and evt == EV_TNT:
                size -= 1
                ip = RS[rs_top]
                blk = RSR[rs_top]
                rs_top = (rs_top - 1) & _RS_MASK
                rs_n -= 1
                if rec and not rec_pop:
                    rec_depth -= 1  # a call the stretch made (see above)
            else:  # TIP: indirect jump or call, uncompressed return
                ip = tip
                blk = -1
                evt = 0  # consumed
            if bk == RUN_FALL or bk == RUN_JUMP or bk == RUN_CALL:
                # No trace consumed: the block goes on.
                quiet += 1
                if quiet > NO_TRACE_LIMIT:
                    break
                continue
            quiet = 0
            cb_open = False  # trace consumed: libipt's block ends here
            # The consumed event's time is the decoder's time from now on.
            cur_tsc = ev_tsc
            has_tsc = ev_has_tsc
            icnt = 0
            has_icnt = True
            if rec:
                rec_cons += 1
                if rec_cons == 1:
                    rec_j1 = rec_m
                if rec_then_tip and rec_cons == rec_nb and not rec_pop:
                    rec_j2 = rec_m  # on to the TIP
                elif rec_pop or rec_nb == XK_TIP or rec_cons == rec_nb + rec_then_tip:
                    seq = np.int64(-1)
                    if direct:
                        _x_keys(x_key, rec_start, s_keys, rec_row0, rec_m)
                        seq = store_sequence(s_cols, s_state, x_key, rec_start, rec_m, s_nkeys)
                        if seq >= 0:
                            key_limit = store_key_limit(s_keys, s_tab, s_cols, s_state)
                    _x_put(
                        x_words, counts, rec_slot, rec_key, x_gen, rec_start, rec_m, rec_ninsn, rec_j1,
                        rec_cons if rec_pop else rec_cons - rec_then_tip,
                        # (a stretch going on to a TIP: where it went is learnt
                        # when it is replayed)
                        -1 if rec_nb == XK_TIP or (rec_then_tip and not rec_pop) else blk,
                        ip, rec_nblk, cb_ninsn,
                        cb_isid, cb_ip, cb_run, rec_pstart, rec_depth, rec_dmax, rec_j2, rec_pop, seq,
                    )  # fmt: skip
                    rec = False
            if evt == EV_TNT and size > 0:
                continue
            p = pos if evt == EV_TNT else pos + 1
            evt, pos, val, size, last_ip, ev_tsc, ev_has_tsc = _fast_fetch(
                kind, a, b, tsc, have_tsc, n_fetch, p, last_ip
            )
            if evt == EV_TNT:
                bits = val
                continue
            if evt == EV_TIP:
                tip = val
                continue
            why = FR_FETCH
            break
        # The trace goes on with a packet other than a TNT or TIP: tracing
        # off and on again is taken here, anything else by the step
        # functions.
        if not (
            why == FR_FETCH and off_on and (w_limit < 0 or pos < w_limit) and nout < row_cap
            and SI[O_NEV] < ev_cap
        ):  # fmt: skip
            break
        psb = pos < n and kind[pos] == K_PSB
        if psb:
            if not psb_on:
                break
            sync = False
            ok, at, p1, p3, cbr = _psb_plus(SI, pk, pos, mode)
            p2, pge_ip = p1, at
        else:
            ok, sync, at, p1, p2, pge_ip, p3 = _off_and_on(SI, CF, pk, pos, last_ip)
            cbr = np.int64(-1)
        if not ok or p3 >= n_fetch or (sync and ip == at):
            break
        reach, wn, wlast, pushes = np.int64(1), np.int64(0), np.int64(-1), np.int64(0)
        if ip != at:
            reach, wn, wlast, pushes = _walk_to(cf, ct, ip, mode, at)
            if not (reach == 1 or (sync and reach == 2)):
                break
        if psb:
            # As the step functions have it: the status updates are taken
            # at the PSBEND, before the walk to the FUP's IP (the enable's
            # binds to no IP, the exec mode's to that one), so the walk's
            # row has their time.
            counts[C_PSB] += 1
            cur_tsc = tsc[p1] if have_tsc[p1] else np.uint64(0)
            has_tsc = have_tsc[p1] != 0
        else:
            counts[C_OFF_ON] += 1
        # As the step functions have it (_proceed_event, _to_ip): the
        # instructions to where tracing goes off (or the PSB+ says it is),
        # a row of their own, ...
        if wn:
            o = offsets[p1]
            stored = False
            if direct:
                key, s_nkeys = _block_key(
                    ip, wn, mode, image, s_tab, s_cols, s_nkeys, key_limit
                )  # fmt: skip
                if key >= 0:
                    full, s_rows, s_off, s_t, s_last_off, s_last_t, s_off_at = put_row(
                        s_keys, s_off_pts, s_off_far_row, s_off_far_val, s_t_pts,
                        s_t_far_row, s_t_far_val, key, o, cur_tsc, s_rows, s_off, s_t,
                        s_last_off, s_last_t, s_started, s_off_at, s_state, s_ent,
                    )  # fmt: skip
                    if not full:
                        s_started = 1
                        s_ent += 1
                        nvirt += 1
                        stored = True
                # (No room: this row and those after it wait in the
                # output, as the step functions leave them.)
                direct = direct and stored
            cb_row = nout
            if not stored:
                o_ip[nout] = ip
                o_ninsn[nout] = wn
                o_run[nout] = -1
                o_flags[nout] = O_NEW | O_UNCACHED | spec_flag
                o_mode[nout] = mode
                o_off[nout] = o
                o_time[nout] = cur_tsc
                nout += 1
            n_blocks += 1
            n_insn += wn
            cb_ninsn, cb_isid, cb_ip, cb_run = wn, np.int64(ct[9][wlast]), ip, -1
            SI[CB_LAST] = wlast
            SI[CB_ICLASS] = ct[5][wlast]
            SU[CB_END_IP] = ct[3][wlast]
            SI[BS_LAST] = wlast
            q = ip
            for _ in range(pushes and wn):
                # (The walk's calls push where they return to.)
                k = hash_find(ct[0], ct[1], ct[2], q, mode)
                if ct[5][k] == C_CALL and not (ct[7][k] & I_NO_PUSH):
                    rs_top = (rs_top + 1) & _RS_MASK
                    RS[rs_top] = _i_next(ct, k)
                    RSR[rs_top] = -1
                    rs_n = min(rs_n + 1, RETSTACK_SIZE)
                q = _next_ip(ct, k)[1]
            ip = at if reach == 1 else _disable_resume_ip(ct, wlast)
        if psb:
            if cbr >= 0:
                SI[BS_CBR] = cbr
        else:
            # ... the disable and the enable, ...
            flags = np.uint64(0)
            if pge_ip == ip:
                flags = np.uint64(F_RESUMED)
            elif rs_n > 0 and RS[rs_top] == pge_ip:
                flags = np.uint64(F_RETURNED)
            ev = out[6][
                _off_and_on_events(SI, pk, out, sync, at, pos, p1, p2, pge_ip, flags, nout + nvirt)
            ]
            _ev_copy(ds[13], ev)
            cur_tsc, has_tsc = ev[E_TSC], _has_tsc(ev)
        icnt = 0
        has_icnt = True
        SI[ES_HAVE_IP] = 1
        SI[ES_SUPP] = 0
        # ... and the TNT or TIP after them.
        ip = pge_ip
        blk = -1
        learn = LEARN_NONE
        rec = False
        resumed = True
        evt, pos, val, size, last_ip, ev_tsc, ev_has_tsc = _fast_fetch(
            kind, a, b, tsc, have_tsc, n_fetch, p3, pge_ip
        )
        if evt == EV_TNT:
            bits = val
        else:
            tip = val
        why = FR_STOP
    SU[BS_IP] = ip
    SI[ES_POS] = pos
    if last_ip != SU[ES_LAST_IP]:
        SU[ES_LAST_IP] = last_ip
        SI[ES_HAVE_IP] = 1
        SI[ES_SUPP] = 0
    SU[BS_TSC] = cur_tsc
    SI[BS_HAS_TSC] = has_tsc
    SI[BS_ICNT] = icnt
    SI[BS_HAS_ICNT] = has_icnt
    SI[BS_RS_TOP] = rs_top
    SI[BS_RS_N] = rs_n
    SI[CB_OPEN] = cb_open
    SI[CB_NINSN] = cb_ninsn
    SI[CB_ISID] = cb_isid
    if cb_run >= 0:
        SI[CB_LAST] = r_lastk[cb_run]
        SI[CB_ICLASS] = r_lastc[cb_run]
        SU[CB_END_IP] = ct[3][r_lastk[cb_run]]
    SU[CB_IP] = cb_ip
    SI[CB_ROW] = cb_row
    SI[CB_MODE] = mode
    SI[O_NBLK] = nout
    SI[O_VBLK] = nvirt
    counts[C_X_ROWS] += x_rows
    SI[O_NBLOCKS] = n_blocks
    SI[O_NINSN] = n_insn
    if live:
        s_state[S_ROWS], s_state[S_KEYS], s_state[S_OFF], s_state[S_TIME] = (
            s_rows, s_nkeys, s_off, s_t
        )  # fmt: skip
        s_state[S_LAST_OFF], s_state[S_LAST_TIME] = s_last_off, np.int64(s_last_t)
        s_state[S_STARTED] = s_started
        s_state[S_OFF_AT] = s_off_at
        s_state[S_ENT] = s_ent
    if why == FR_FETCH:
        return why
    # The current event, as the step functions expect it.
    if evt == EV_TNT:
        _ev_init(CUR, EV_TNT)
        CUR[E_BITS] = bits
        CUR[E_SIZE] = size
        SI[ES_BOUND] = 0
    else:
        _ev_init(CUR, EV_TIP)
        CUR[E_IP] = tip
        SI[ES_BOUND] = 1
    CUR[E_TSC] = ev_tsc
    if ev_has_tsc:
        CUR[E_FLAGS] |= F_HAS_TSC
    if evt == EV_TNT and cur_tsc == ev_tsc and has_tsc == ev_has_tsc:
        CUR[E_FLAGS] |= F_STARTED  # (or not started, at the same time)
    return why


# ---------------------------------------------------------------------------
# The driver: ptxed's decoding loop (and the library's) over one segment.


@aot.njit(cache=True, _nrt=False)
def _begin_block(ds, pk, out):
    """Start (or continue, after the fast loop) a libipt block at the IP."""
    SI, SU = ds[0], ds[1]
    if SI[CB_OPEN]:
        _new_row(ds, pk, out, False)
        # Offsets and the speculative flag stay the block's.
        return
    SU[CB_IP] = SU[BS_IP]
    SU[CB_END_IP] = 0
    SI[CB_NINSN] = 0
    SI[CB_ISID] = 0
    SI[CB_LAST] = -1
    SI[CB_ICLASS] = C_UNKNOWN
    SI[CB_MODE] = SI[BS_MODE]
    SI[CB_OPEN] = 1
    _new_row(ds, pk, out, True)
    SI[O_NBLOCKS] += 1


@aot.njit(cache=True, _nrt=False)
def _end_block(ds, cf, out):
    SI = ds[0]
    o_ninsn = out[1]
    row = SI[CB_ROW]
    SI[O_NINSN] += o_ninsn[row]
    if o_ninsn[row] == 0 and (SI[CB_NINSN] > 0 or cf[0][CF_DROP_EMPTY]):
        # An empty continuation row, or an empty block nobody counts.
        SI[O_NBLK] -= 1
    SI[CB_OPEN] = 0


@aot.njit(cache=True, _nrt=False)
def _handle_event(ds, pk, cf, ct, out):
    """ptxed's handle_one_event: next_event, with the event in the output."""
    SI, SU, EVO = ds[0], ds[1], ds[13]
    offset = _offset(SI, SU, pk)
    r = next_event(ds, pk, cf, ct, EVO)
    if r < 0:
        return r
    _emit_event(ds, pk, out, EVO, offset)
    return r


@aot.njit(cache=True, _nrt=False)
def _wants_stop(cf, ev):
    mode = cf[0][CF_STOP_EVENTS]
    if mode == STOP_ALL:
        return True
    if mode != STOP_ENABLED or ev[E_TYPE] != EV_ENABLED:
        return False
    # Only where the caller's context may have changed: at or past the
    # time it named (CF_STOP_TSC, 0 until it names one), or time unknown.
    return not _has_tsc(ev) or np.int64(ev[E_TSC]) >= cf[0][CF_STOP_TSC]


@aot.njit(cache=True, _nrt=False)
def _error(ds, pk, ct, out, code, kind):
    SI, SU = ds[0], ds[1]
    _emit_marker(
        ds, out, X_ERROR, _offset(SI, SU, pk), code, kind, error_ip(ds, ct, code), SU[BS_TSC]
    )


@aot.njit(cache=True, _nrt=False)
def _library_resume(ds, pk):
    """Where the library looks for the next PSB after an error: nothing
    after the gap may be lost.  The failing packet has not been used, and
    when the error came while taking a PSB+ (walking to the address it
    names), that PSB+ starts good trace of its own."""
    SI = ds[0]
    kind, off, size = pk[0], pk[4], pk[5]
    n = SI[W_N]
    pos = min(SI[ES_POS], n - 1) if n else 0
    sync = np.int64(SI[DR_SYNC])
    j = pos
    while j >= 0 and kind[j] != K_PSB:
        j -= 1
    if j >= 0:
        q = j
        while q < n and kind[q] != K_PSBEND:
            q += 1
        inside = q >= n or SI[ES_POS] <= q
        if inside and off[j] > sync:
            return off[j]
    if SI[ES_POS] < n:
        return off[SI[ES_POS]]
    if n:
        return off[n - 1] + size[n - 1]
    return sync


@aot.njit(cache=True, _nrt=False)
def _segment_end(ds, pk, cf, code):
    SI, SU = ds[0], ds[1]
    SI[DR_PHASE] = PH_DONE
    SI[DR_END] = code
    if cf[0][CF_KEEP_GOING] and code != E_EOS:
        SU[DR_NEXT] = np.uint64(_library_resume(ds, pk))
    else:
        SU[DR_NEXT] = np.uint64(_next_position(SI, SU, pk))


@aot.njit(cache=True, _nrt=False)
def _room(ds, out):
    SI = ds[0]
    return SI[O_NBLK] + 4 < out[0].shape[0] and SI[O_NEV] + 4 < out[7].shape[0]


@aot.njit(cache=True, _nrt=False)
def _tnt_left(ds):
    """Does the current TNT still hold bits?  (Their flow runs before the
    limit of a window that ends where the code changes.)"""
    CUR = ds[2]
    return CUR[E_TYPE] == EV_TNT and CUR[E_SIZE] > 0


@aot.njit(cache=True, inline="always", _nrt=False)
def _past_timing(kind, n, p):
    """The first packet from ``p`` on that ev_next does not pass over (PAD,
    TSC, MTC, TMA, CYC), or ``n``."""
    while p < n:
        k = kind[p]
        if not (k == K_PAD or k == K_TSC or k == K_MTC or k == K_TMA or k == K_CYC):
            break
        p += 1
    return p


@aot.njit(cache=True, _nrt=False)
def _walk_to(cf, ct, ip, mode, target):
    """What _to_ip does from ``ip`` in a new block, with no new code and no
    block split on the way: ``(reach, ninsn, last, pushes)``, ``reach`` 1 at
    ``target``, 2 stopped at an instruction that needs trace (BAD_QUERY; it
    is the block's last), 0 anything else; the block's instructions, the
    last one's index and how many of them push a return address.  (It
    changes nothing.)"""
    isid = np.int64(0)
    n = np.int64(0)
    last = np.int64(-1)
    pushes = np.int64(0)
    while ip != target:
        if n + 1 > MAX_NINSN or (n and ct[7][last] & I_TRUNCATED):
            return 0, n, last, pushes
        k = hash_find(ct[0], ct[1], ct[2], ip, mode)
        if k < 0 or ct[10][k]:
            return 0, n, last, pushes
        if ct[9][k] != isid:
            if n:
                return 0, n, last, pushes
            isid = ct[9][k]
        n += 1
        last = k
        if ct[5][k] == C_CALL and not (ct[7][k] & I_NO_PUSH):
            pushes += 1
        e, ip = _next_ip(ct, k)
        if e < 0:
            return (2 if e == -E_BAD_QUERY else 0), n, last, pushes
        if _ends_block(cf, ct, k) and ip != target:
            return 0, n, last, pushes
    return 1, n, last, pushes


@aot.njit(cache=True, inline="always", _nrt=False)
def _flow_after(kind, a, b, n, p, last_ip):
    """The TNT (with bits) or TIP (with an IP, against ``last_ip``) the flow
    goes on with after packet ``p``, timing packets between them; -1 when
    the next packet is another (or none)."""
    q = _past_timing(kind, n, p + 1)
    if q >= n:
        return np.int64(-1)
    k = kind[q]
    if _is_tnt(k):
        return q if b[q] & _NBITS else np.int64(-1)
    if k == K_TIP and _ip_from(b[q], a[q], last_ip)[0]:
        return q
    return np.int64(-1)


@aot.njit(cache=True, _nrt=False)
def _off_and_on(SI, CF, pk, p0, last_ip):
    """Tracing off and on again from packet ``p0``, as a user-space trace
    has it at every interrupt and system call: a FUP and a TIP.PGD without
    an IP (off where the FUP says), or a TIP.PGD with one (off at the branch
    it takes the place of); a MODE.EXEC that changes nothing; a TIP.PGE;
    then a TNT or TIP (timing packets between them), the PGE before the
    window's limit (the run loop would stop for the next window there).
    ``(ok, sync, at, p1, p2, pge_ip, p3)``: whether the packets are such a
    sequence, whether the disable is a TIP.PGD's, where tracing goes off
    (the FUP's IP, or the TIP.PGD's, which the PGE's is compressed against
    either way), where the step functions report the disable, the PGE and
    its IP, and the TNT or TIP."""
    kind, a, b = pk[0], pk[1], pk[2]
    n = SI[W_N]
    no = (False, False, np.uint64(0), np.int64(0), np.int64(0), np.uint64(0), np.int64(0))
    if p0 >= n:
        return no
    sync = kind[p0] == K_TIP_PGD
    if sync:
        ok, at = _ip_from(b[p0], a[p0], last_ip)
        p1 = p0 + 1
        while p1 < n and kind[p1] == K_PAD:
            p1 += 1
        q = p1
    else:
        if kind[p0] != K_FUP or CF[CF_ERRATA] & ER_SKD022:
            return no
        ok, at = _ip_from(b[p0], a[p0], last_ip)
        p1 = _past_timing(kind, n, p0 + 1)
        if p1 >= n or kind[p1] != K_TIP_PGD or b[p1] != 0:
            return no
        q = p1 + 1
    if not ok or p1 >= n:
        return no
    p2 = _past_timing(kind, n, q)
    if p2 < n and kind[p2] == K_MODE_EXEC:
        bits = np.int64(a[p2])
        if SI[ES_CSL] != bits & 1 or SI[ES_CSD] != (bits >> 1) & 1:
            return no
        if CF[CF_IFLAGS] and SI[ES_IFLAG] != (bits >> 2) & 1:
            return no
        p2 = _past_timing(kind, n, p2 + 1)
    if p2 >= n or kind[p2] != K_TIP_PGE or (SI[W_LIMIT] >= 0 and p2 >= SI[W_LIMIT]):
        return no
    ok, pge_ip = _ip_from(b[p2], a[p2], at)
    if not ok:
        return no
    p3 = _flow_after(kind, a, b, n, p2, pge_ip)
    if p3 < 0:
        return no
    return True, sync, at, p1, p2, pge_ip, p3


@aot.njit(cache=True, _nrt=False)
def _psb_plus(SI, pk, p0, mode):
    """A PSB+ at packet ``p0`` in the middle of the flow that only restates
    the state: the FUP's IP (tracing stays on), a MODE.EXEC that changes
    nothing, timing packets and a CBR; then a TNT or TIP (timing packets
    between them), the PSBEND before the window's limit.  ``(ok, ip,
    psbend, p3, cbr)``: whether it is one, the FUP's IP, where the PSBEND
    and the TNT or TIP are, and the CBR's ratio (-1: none).  It checks what
    _decode_psb and the exec mode's status update would (the caller: no
    queued event, no BDM70 erratum, no IF flags)."""
    kind, a, b = pk[0], pk[1], pk[2]
    n = SI[W_N]
    no = (False, np.uint64(0), np.int64(0), np.int64(0), np.int64(-1))
    fup = False
    exec_mode = False
    at = np.uint64(0)
    cbr = np.int64(-1)
    j = p0 + 1
    while j < n:
        k = kind[j]
        if k == K_PSBEND:
            break
        if k == K_FUP:
            if fup or b[j] == 0:
                return no
            # (The PSB reset the last IP.)
            ok, at = _ip_from(b[j], a[j], np.uint64(0))
            if not ok:
                return no
            fup = True
        elif k == K_MODE_EXEC:
            bits = np.int64(a[j])
            if SI[ES_CSL] != bits & 1 or SI[ES_CSD] != (bits >> 1) & 1:
                return no
            if exec_mode_of(bits) != mode:
                return no
            exec_mode = True
        elif k == K_CBR:
            cbr = np.int64(a[j])
        elif not (k == K_TSC or k == K_TMA or k == K_MTC or k == K_CYC or k == K_PAD):
            return no
        j += 1
    if j >= n or not fup or not exec_mode or (SI[W_LIMIT] >= 0 and j >= SI[W_LIMIT]):
        return no
    p3 = _flow_after(kind, a, b, n, j, at)
    if p3 < 0:
        return no
    return True, at, j, p3, cbr


@aot.njit(cache=True, _nrt=False)
def _off_and_on_events(SI, pk, out, sync, at, p0, p1, p2, pge_ip, flags, row):
    """The disable and the enable of _off_and_on's sequence into the
    output, as the event decoder gives them, after ``row`` block rows
    (``flags``: the enable's F_RESUMED or F_RETURNED); returns the enable's
    index in the event rows."""
    e_row, e_off, e_blk = out[6], out[7], out[8]
    offsets = pk[4]
    j = SI[O_NEV]
    ev = e_row[j]
    if sync:
        _ev_init(ev, EV_DISABLED)
        ev[E_IP] = at
        _ev_time(SI, pk, ev, p0)
    else:
        _ev_init(ev, EV_ASYNC_DISABLED)
        ev[E_AT] = at
        ev[E_FLAGS] |= F_SUPP
        _ev_time(SI, pk, ev, p1)
    ev = e_row[j + 1]
    _ev_init(ev, EV_ENABLED)
    ev[E_IP] = pge_ip
    _ev_time(SI, pk, ev, p2)
    ev[E_FLAGS] |= flags
    e_off[j], e_off[j + 1] = offsets[p1], offsets[p2]
    e_blk[j], e_blk[j + 1] = row, row
    SI[O_NEV] = j + 2
    return j + 1


@aot.njit(cache=True, _nrt=False)
def _next_window(ds, wo):
    """Open the window after this one (from its limit) into the same
    columns, as Python does at R_MORE, when Python need not see it (``wo``'s
    WA_CONTINUE: how many more windows it may open so) and this one was
    opened so (its limit's time state a row of ``wo``'s): True when opened.
    ``wo`` is open_window's arguments (see there)."""
    wargs = wo[1]
    if wargs[WA_CONTINUE] <= 0 or wargs[WA_SAVED] < 0:
        return False
    start, which = wargs[WA_START], wargs[WA_TIME]
    wargs[WA_START], wargs[WA_GROW], wargs[WA_TIME] = wargs[WA_LIMIT], -1, wargs[WA_SAVED]
    what, _, _, n, limit_index, end_error, end_offset = open_window(
        wo[0], wargs, wo[2], wo[3], wo[4], wo[5], wo[6], wo[7], wo[8], wo[9], wo[10], wo[11]
    )
    if what != WIN_READY:
        wargs[WA_START], wargs[WA_TIME] = start, which  # (Python opens it)
        return False
    SI, SU = ds[0], ds[1]
    SI[ES_POS] -= SI[W_LIMIT]
    SI[W_N], SI[W_END_ERR], SI[W_LIMIT], SI[W_EXACT] = n, end_error, limit_index, 0
    SU[W_END_OFFSET] = np.uint64(end_offset)
    wargs[WA_OPENED] += 1
    wargs[WA_CONTINUE] -= 1
    return True


@aot.njit(cache=True, nogil=True, _nrt=False)
def run(ds, pk, cf, ct, out, wo, cs):
    """Decode until the segment ends or Python is needed (R_*); the next
    window opened here when it can be (``wo``: see _next_window).  Code
    missing in a section of the code space ``cs`` is decoded here
    (:func:`~.codetable.fill_missing`): the step that missed it is then
    redone as after a return to Python for it."""
    while True:
        r = _run(ds, pk, cf, ct, out, wo)
        if r != R_MISS or not fill_missing(ct, cs):
            return r


@aot.njit(cache=True, nogil=True, _nrt=False)
def _run(ds, pk, cf, ct, out, wo):
    """:func:`run` but for code missing: R_MISS."""
    SI, SU = ds[0], ds[1]
    CF = cf[0]
    store = out[10][3]
    while True:
        phase = SI[DR_PHASE]
        if phase == PH_DONE:
            return R_DONE
        if store[S_LIVE] and SI[O_NBLK] and not CF[CF_COUNT]:
            _store_output(ds, ct, out)
            if SI[O_NBLK]:
                # No room in the store: Python takes the waiting rows and
                # makes room, so that rows are stored (and stretches
                # replayed) again, not written out until the output is full.
                return R_FULL
        if not _room(ds, out):
            return R_FULL
        if (
            phase != PH_START
            and SI[W_LIMIT] >= 0
            and SI[ES_POS] >= SI[W_LIMIT]
            and not (SI[W_EXACT] and _tnt_left(ds))
        ):
            if _next_window(ds, wo):
                continue
            return R_MORE
        save_state(ds, 0)
        store_save(store)
        if phase == PH_START:
            r = blk_start(ds, pk, cf, ct)
            if r < 0:
                if _aborted(r):
                    return _undo_step(ds, out, r)
                if r == -E_EOS:
                    _segment_end(ds, pk, cf, E_EOS)
                    SU[DR_NEXT] = np.uint64(0)
                    continue
                # The block is empty: the error is reported at its start, 0.
                _emit_marker(ds, out, X_ERROR, _offset(SI, SU, pk), -r, ERR_SYNC, 0, 0)
                SI[DR_SYNC_FAILED] = 1
                SI[DR_PHASE] = PH_DONE
                SI[DR_END] = -r
                SU[DR_NEXT] = np.uint64(_next_position(SI, SU, pk))
                continue
            SI[DR_STATUS] = r
            SI[DR_PHASE] = PH_RUN
            continue
        if phase == PH_RESYNC:
            r = blk_resync(ds, pk, cf, ct, ds[13])
            if r == -E_EVENT_IGNORED:
                r = _handle_event(ds, pk, cf, ct, out)
                if r >= 0:
                    if _wants_stop(cf, ds[13]):
                        return R_EVENT
                    continue
            if r < 0:
                if _aborted(r):
                    return _undo_step(ds, out, r)
                _error(ds, pk, ct, out, -r, ERR_RESYNC)
                _segment_end(ds, pk, cf, -r)
                continue
            if r & ST_IP_SUPPRESSED:
                _emit_marker(ds, out, X_RESYNC_DISABLED, _offset(SI, SU, pk), 0, 0, 0, 0)
            SI[DR_STATUS] = r
            SI[DR_PHASE] = PH_RUN
            continue
        # PH_RUN
        status = SI[DR_STATUS]
        if status & ST_EVENT_PENDING:
            r = _handle_event(ds, pk, cf, ct, out)
            if r < 0:
                if _aborted(r):
                    return _undo_step(ds, out, r)
                _fail(ds, pk, cf, ct, out, -r)
                continue
            SI[DR_STATUS] = r
            if _wants_stop(cf, ds[13]):
                return R_EVENT
            continue
        if status & ST_EOS:
            if not (status & ST_IP_SUPPRESSED):
                _emit_marker(ds, out, X_END, _offset(SI, SU, pk), 0, 0, 0, 0)
            _segment_end(ds, pk, cf, E_EOS)
            continue
        pending = SI[W_PENDING] != 0
        if pending or (CF[CF_FAST] and _plain(ds, cf)):
            why = FR_FETCH if pending else _fast(ds, pk, cf, ct, out)
            if why == FR_FETCH and not pending and SI[W_EXACT] and SI[ES_POS] >= SI[W_LIMIT] >= 0:
                # At the limit of a window that ends where the code changes:
                # fetch the packet there in the next window, with its code.
                SI[W_PENDING] = 1
                return R_MORE
            SI[W_PENDING] = 0
            if why == FR_FETCH:
                # Plain flow ended at a packet the event decoder must take.
                SI[ES_BOUND] = 0
                CUR = ds[2]
                r = ev_next(ds, pk, cf, CUR)
                if r < 0:
                    if _aborted(r):
                        # The fast loop's work is redone too.
                        return _undo_step(ds, out, r)
                    SI[BS_STATUS] = -r
                    _ev_init(CUR, EV_IGNORE)
                r = _trailing(ds, pk, cf, ct, False)
                if r < 0:
                    if _aborted(r):
                        return _undo_step(ds, out, r)
                    _fail(ds, pk, cf, ct, out, -r)
                    continue
                SI[DR_STATUS] = r
                continue
            if why == FR_FULL:
                return R_FULL
            if why == FR_MISS:
                return R_MISS
            if why == FR_GROW:
                return R_GROW
            # FR_STOP: the step functions go on from the run's start.
        _begin_block(ds, pk, out)
        r = _proceed(ds, pk, cf, ct, out)
        _end_block(ds, cf, out)
        if r < 0:
            if _aborted(r):
                return _undo_step(ds, out, r)
            _fail(ds, pk, cf, ct, out, -r)
            continue
        SI[DR_STATUS] = r


@aot.njit(cache=True, _nrt=False)
def _undo_step(ds, out, r):
    """An aborted step (``r``): back to the state at its start, rows stored
    since included; what Python must do before the step is redone (R_*)."""
    restore_state(ds, 0)
    store_restore(out[10][3])
    return R_MISS if r == -ABORT_MISS else R_WINDOW


@aot.njit(cache=True, _nrt=False)
def _store_output(ds, ct, out):
    """Move the rows waiting in the output into the block store, when it
    surely has room (they are counted as stored rows from then on)."""
    SI = ds[0]
    n = SI[O_NBLK]
    counts, r_key = ct[T_COUNTS], ct[T_R_KEY]
    claim_run_keys(counts, r_key, counts[C_RUNS], out[10][3])
    if store_rows(out[10], out[0], out[1], out[3], out[4], out[5], out[9], n, counts[C_INDEX],
                  r_key):  # fmt: skip
        SI[O_VBLK] += n
        SI[O_NBLK] = 0


@aot.njit(cache=True, _nrt=False)
def _fail(ds, pk, cf, ct, out, code):
    """An error in the segment: reported; then the segment ends, or, with
    resync-on-error, decoding goes on at the next IP the trace gives."""
    SI = ds[0]
    if code == E_EOS:
        _segment_end(ds, pk, cf, E_EOS)
        return
    _error(ds, pk, ct, out, code, ERR_DECODE)
    if cf[0][CF_RESYNC]:
        SI[DR_PHASE] = PH_RESYNC
        return
    _segment_end(ds, pk, cf, code)


def new_state() -> tuple:
    """Fresh decoder state arrays (see the module docstring)."""
    return (
        np.zeros(NSI, np.int64),  # 0 SI
        np.zeros(NSU, np.uint64),  # 1 SU
        np.zeros(EW, np.uint64),  # 2 CUR
        np.zeros(EW, np.uint64),  # 3 TMP
        np.zeros((QMAX, EW), np.uint64),  # 4 QE
        np.zeros(QMAX, np.int64),  # 5 QB
        np.zeros(RETSTACK_SIZE, np.uint64),  # 6 RS
        np.zeros((2, NSI), np.int64),  # 7.. saved copies: 0 step, 1 probe
        np.zeros((2, NSU), np.uint64),
        np.zeros((2, EW), np.uint64),
        np.zeros((2, QMAX, EW), np.uint64),
        np.zeros((2, QMAX), np.int64),
        np.zeros((2, RETSTACK_SIZE), np.uint64),
        np.zeros(EW, np.uint64),  # 13 the last event handled
        np.full(RETSTACK_SIZE, -1, np.int32),  # 14 RSR: the return stack's runs
        np.zeros((2, RETSTACK_SIZE), np.int32),  # 15 saved RSR
        np.zeros(NXV, np.int64),  # 16, 17: the replay chain's state (_replay_chain)
        np.zeros(NXU, np.uint64),
    )


@aot.njit(cache=True, _nrt=False)
def keep_flow_events(rows, offsets, blocks, n, m, base):
    """Keep, of the ``m`` event rows from row ``n`` as the decoder wrote
    them, the flow's events (:func:`hwtrace.pt.flowrows.flow_events`):
    moved down over the markers and status updates between them, in
    place and in order, their blocks moved by ``base``; returns how many."""
    k = n
    for i in range(n, n + m):
        if rows[i, E_TYPE] < np.uint64(X_ERROR) and (rows[i, E_FLAGS] & np.uint64(F_STATUS)) == 0:
            if k != i:
                for w in range(EW):
                    rows[k, w] = rows[i, w]
                offsets[k] = offsets[i]
            blocks[k] = blocks[i] + base
            k += 1
    return k - n


def new_output(blocks: int, events: int, store: tuple | None = None) -> tuple:
    """Output buffers for ``blocks`` block rows and ``events`` event rows;
    ``store``: a block store the decoder may store rows in itself
    (:meth:`hwtrace.pt.blocks.BlockStore.kernel_store`)."""
    return (
        np.zeros(blocks, np.uint64),  # 0 ip
        np.zeros(blocks, np.uint32),  # 1 ninsn
        np.zeros(blocks, np.uint8),  # 2 flags (O_NEW, O_SPEC)
        np.zeros(blocks, np.uint8),  # 3 mode
        np.zeros(blocks, np.int64),  # 4 trace offset
        np.zeros(blocks, np.uint64),  # 5 time
        np.zeros((events, EW), np.uint64),  # 6 event rows
        np.zeros(events, np.int64),  # 7 event offsets
        np.zeros(events, np.int64),  # 8 block rows before each event
        np.zeros(blocks, np.int32),  # 9 the code-table run a row is (-1: none)
        dummy_store() if store is None else store,  # 10 where rows may be stored directly
    )
