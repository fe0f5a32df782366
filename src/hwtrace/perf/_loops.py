"""Compiled walks over perf.data's data section (numba, in hwtrace.aot's library).

* :func:`index_records` walks the records (header only) into columns,
  following AUXTRACE's and HEADER_TRACING_DATA's out-of-header payloads,
  and resynchronises after a record it cannot read.
* :func:`sample_ids` fills each record's attr and sample_id fields as perf
  resolves them (``evlist__event2evsel``).
* :func:`decode_samples` decodes SAMPLE records of one sample_type into a
  matrix of :data:`SAMPLE_COLUMNS`.
"""

from __future__ import annotations

import numpy as np

from .. import aot
from .records import RecordType, SampleType

# A record type is known when it is a kernel type (1..21) or a perf-tool type (64..82).
T_SAMPLE = int(RecordType.SAMPLE)
T_HEADER_TRACING_DATA = int(RecordType.HEADER_TRACING_DATA)
T_AUXTRACE = int(RecordType.AUXTRACE)
T_COMPRESSED = int(RecordType.COMPRESSED)

# PERF_SAMPLE_* bits (records.SampleType) as plain ints, constants to numba.
S_IP = int(SampleType.IP)
S_TID = int(SampleType.TID)
S_TIME = int(SampleType.TIME)
S_ADDR = int(SampleType.ADDR)
S_READ = int(SampleType.READ)
S_CALLCHAIN = int(SampleType.CALLCHAIN)
S_ID = int(SampleType.ID)
S_CPU = int(SampleType.CPU)
S_PERIOD = int(SampleType.PERIOD)
S_STREAM_ID = int(SampleType.STREAM_ID)
S_RAW = int(SampleType.RAW)
S_BRANCH_STACK = int(SampleType.BRANCH_STACK)
S_REGS_USER = int(SampleType.REGS_USER)
S_STACK_USER = int(SampleType.STACK_USER)
S_WEIGHT = int(SampleType.WEIGHT)
S_DATA_SRC = int(SampleType.DATA_SRC)
S_IDENTIFIER = int(SampleType.IDENTIFIER)
S_TRANSACTION = int(SampleType.TRANSACTION)
S_REGS_INTR = int(SampleType.REGS_INTR)
S_PHYS_ADDR = int(SampleType.PHYS_ADDR)
S_AUX = int(SampleType.AUX)
S_CGROUP = int(SampleType.CGROUP)
S_DATA_PAGE_SIZE = int(SampleType.DATA_PAGE_SIZE)
S_CODE_PAGE_SIZE = int(SampleType.CODE_PAGE_SIZE)
S_WEIGHT_STRUCT = int(SampleType.WEIGHT_STRUCT)

# Gap reasons
GAP_SIZE = 1  # size below the 8-byte header
GAP_BEYOND = 2  # record (or its payload) goes beyond the end of the data
GAP_TRUNCATED_HEADER = 3  # fewer than 8 bytes left
# an AUXTRACE record's trace cut short by the end (kept: the gap is what is missing)
GAP_AUX_CUT = 4


@aot.njit(cache=True)
def _u16(b, p):
    return np.uint32(b[p]) | (np.uint32(b[p + 1]) << 8)


@aot.njit(cache=True)
def _u32(b, p):
    return (
        np.uint32(b[p])
        | (np.uint32(b[p + 1]) << 8)
        | (np.uint32(b[p + 2]) << 16)
        | (np.uint32(b[p + 3]) << 24)
    )


@aot.njit(cache=True)
def _u64(b, p):
    v = np.uint64(0)
    for i in range(8):
        v |= np.uint64(b[p + i]) << np.uint64(8 * i)
    return v


@aot.njit(cache=True)
def _known(t):
    return (1 <= t <= 21) or (64 <= t <= 82)


@aot.njit(cache=True)
def _extent(b, p, end):
    """Bytes taken by the record at p (header plus any trailing payload), or
    -GAP_* when it cannot be read."""
    if end - p < 8:
        return -GAP_TRUNCATED_HEADER
    t = _u32(b, p)
    size = np.int64(_u16(b, p + 6))
    if size < 8:
        return -GAP_SIZE
    if p + size > end:
        return -GAP_BEYOND
    extra = np.int64(0)
    if t == T_AUXTRACE:
        if size < 16:
            return -GAP_SIZE
        pay = _u64(b, p + 8)
        if pay > np.uint64(end - p - size):
            return -GAP_BEYOND
        extra = np.int64(pay)
    elif t == T_HEADER_TRACING_DATA:
        if size < 12:
            return -GAP_SIZE
        extra = (np.int64(_u32(b, p + 8)) + 7) // 8 * 8
        if extra > end - p - size:
            return -GAP_BEYOND
    return size + extra


@aot.njit(cache=True)
def _plausible(b, p, end, depth):
    """A record that looks genuine at p: known type, aligned size, reserved misc
    bits clear, and followed by ``depth`` more such records (or the end)."""
    for _ in range(depth + 1):
        if p == end:
            return True
        if end - p < 8:
            return False
        t = _u32(b, p)
        if not _known(t) or t == T_COMPRESSED:
            return False
        size = _u16(b, p + 6)
        if size % 8 != 0:
            return False
        n = _extent(b, p, end)
        if n <= 0:
            return False
        p += n
    return True


@aot.njit(cache=True)
def index_records(b, pos, end, off, typ, misc, size, payload, gaps, ngaps, step):
    """Walk records from ``pos`` to ``end`` into the output columns.

    Returns (records written, gaps written, position reached); stops early
    when an output is full (call again from the position reached).  A record
    that cannot be read starts a gap: the walk looks, ``step`` bytes at a
    time, for the next plausible record and records (offset, length, reason)
    in ``gaps``."""
    n = 0
    g = ngaps
    cap = off.shape[0]
    gcap = gaps.shape[0]
    while pos < end:
        if n >= cap:
            break
        ext = _extent(b, pos, end)
        cut = np.int64(0)
        if ext == -GAP_BEYOND and _u32(b, pos) == T_AUXTRACE:
            head = np.int64(_u16(b, pos + 6))
            pay = _u64(b, pos + 8)
            if pos + head <= end and pay < np.uint64(1 << 62):
                # The last record of a recording cut short (perf killed, a
                # disk full): its trace up to the end is kept, the rest is
                # a gap.
                cut = np.int64(pay) - (end - pos - head)
                ext = end - pos
        if ext > 0:
            if cut > 0:
                if g >= gcap:
                    break
                gaps[g, 0] = pos
                gaps[g, 1] = cut
                gaps[g, 2] = GAP_AUX_CUT
                g += 1
            off[n] = pos
            typ[n] = _u32(b, pos)
            misc[n] = _u16(b, pos + 4)
            size[n] = _u16(b, pos + 6)
            payload[n] = ext - size[n]
            n += 1
            pos += ext
            continue
        if g >= gcap:
            break
        q = pos + step
        while q < end and not _plausible(b, q, end, 2):
            q += step
        if q > end:
            q = end
        gaps[g, 0] = pos
        gaps[g, 1] = q - pos
        gaps[g, 2] = -ext
        g += 1
        pos = q
    return n, g, pos


@aot.njit(cache=True)
def sample_ids(
    b, off, typ, size, st_attr, sid_all, id_sorted, id_attr, id_pos, is_pos,
    attr, time, pid, tid, cpu, eid,
):  # fmt: skip
    """Each record's attr (index, -1 when its ID matches none) and sample_id
    fields (time -1, pid/tid/cpu -1, id 0 when absent), as perf resolves them:
    one attr takes all; else the ID (at ``id_pos`` in SAMPLEs, ``is_pos`` u64s
    from the end of others, when the first attr has ``sample_id_all``);
    ID 0 (synthesized records) means the first attr."""
    nattr = st_attr.shape[0]
    for i in range(off.shape[0]):
        attr[i] = -1
        time[i] = -1
        pid[i] = -1
        tid[i] = -1
        cpu[i] = -1
        eid[i] = 0
        t = typ[i]
        if t >= 64 or nattr == 0:
            continue
        p = off[i]
        e = p + size[i]
        a = -1
        the_id = np.uint64(0)
        have_id = False
        if t == T_SAMPLE:
            if id_pos >= 0 and p + 8 + 8 * id_pos + 8 <= e:
                the_id = _u64(b, p + 8 + 8 * id_pos)
                have_id = True
        elif sid_all[0]:
            if is_pos > 0 and e - 8 * is_pos >= p + 8:
                the_id = _u64(b, e - 8 * is_pos)
                have_id = True
        if nattr == 1:
            a = 0
        elif t != T_SAMPLE and not sid_all[0]:
            a = 0
        elif not have_id:
            a = -1
        elif the_id == 0:
            a = 0
        else:
            k = np.searchsorted(id_sorted, the_id)
            if k < id_sorted.shape[0] and id_sorted[k] == the_id:
                a = id_attr[k]
        attr[i] = a
        if a < 0:
            continue
        st = st_attr[a]
        if t == T_SAMPLE:
            q = p + 8
            if st & S_IDENTIFIER:
                q += 8
            if st & S_IP:
                q += 8
            if st & S_TID:
                if q + 8 <= e:
                    pid[i] = np.int32(_u32(b, q))
                    tid[i] = np.int32(_u32(b, q + 4))
                q += 8
            if st & S_TIME:
                if q + 8 <= e:
                    time[i] = np.int64(_u64(b, q))
                q += 8
            if st & S_ADDR:
                q += 8
            if st & S_ID:
                if q + 8 <= e:
                    eid[i] = _u64(b, q)
                q += 8
            elif st & S_IDENTIFIER:
                if p + 16 <= e:
                    eid[i] = _u64(b, p + 8)
            if st & S_STREAM_ID:
                q += 8
            if st & S_CPU:
                if q + 8 <= e:
                    cpu[i] = np.int32(_u32(b, q))
            continue
        if not sid_all[a]:
            continue
        n = 0
        for bit in (S_TID, S_TIME, S_ID, S_STREAM_ID, S_CPU, S_IDENTIFIER):
            if st & bit:
                n += 8
        q = e - n
        if q < p + 8:
            continue
        if st & S_TID:
            pid[i] = np.int32(_u32(b, q))
            tid[i] = np.int32(_u32(b, q + 4))
            q += 8
        if st & S_TIME:
            time[i] = np.int64(_u64(b, q))
            q += 8
        if st & S_ID:
            eid[i] = _u64(b, q)
            q += 8
        if st & S_STREAM_ID:
            q += 8
        if st & S_CPU:
            cpu[i] = np.int32(_u32(b, q))
            q += 8
        if st & S_IDENTIFIER and not st & S_ID:
            eid[i] = _u64(b, q)


SAMPLE_COLUMNS = (
    "identifier", "ip", "pid", "tid", "time", "addr", "id", "stream_id", "cpu", "period",
    "read_value", "read_time_enabled", "read_time_running", "read_id", "read_lost",
    "read_offset", "read_nr",
    "callchain_offset", "callchain_nr", "raw_offset", "raw_size",
    "branch_offset", "branch_nr", "branch_hw_idx",
    "regs_user_abi", "regs_user_offset", "stack_user_offset", "stack_user_size",
    "stack_user_dyn_size", "weight", "data_src", "transaction",
    "regs_intr_abi", "regs_intr_offset", "phys_addr", "cgroup",
    "data_page_size", "code_page_size", "aux_offset", "aux_size", "bad",
)  # fmt: skip
_C = {name: i for i, name in enumerate(SAMPLE_COLUMNS)}
C_IDENTIFIER, C_IP, C_PID, C_TID, C_TIME, C_ADDR, C_ID, C_STREAM_ID, C_CPU, C_PERIOD = range(10)
C_RVAL, C_RENA, C_RRUN, C_RID, C_RLOST, C_ROFF, C_RNR = range(10, 17)
C_CC_OFF, C_CC_NR, C_RAW_OFF, C_RAW_SIZE, C_BR_OFF, C_BR_NR, C_BR_HW = range(17, 24)
C_RU_ABI, C_RU_OFF, C_SU_OFF, C_SU_SIZE, C_SU_DYN, C_WEIGHT, C_DSRC, C_TXN = range(24, 32)
C_RI_ABI, C_RI_OFF, C_PHYS, C_CGROUP, C_DPS, C_CPS, C_AUX_OFF, C_AUX_SIZE, C_BAD = range(32, 41)
NCOL = len(SAMPLE_COLUMNS)


@aot.njit(cache=True)
def _regs_field(b, p, q, e, row, c_abi, c_off, nregs):
    """A REGS_USER/REGS_INTR block (u64 abi, then ``nregs`` u64 when abi is
    not 0): its abi and offset into ``row``; where the next field begins,
    and whether the block fitted before ``e``."""
    if q + 8 > e:
        return q, False
    abi = _u64(b, q)
    row[c_abi] = abi
    q += 8
    row[c_off] = q - p
    if abi != 0:
        q += 8 * nregs
    return q, q <= e


@aot.njit(cache=True)
def _u64_field(b, q, e, row, col):
    """A u64 field at ``q`` into ``row[col]``: where the next field begins,
    and whether it fitted before ``e``."""
    if q + 8 > e:
        return q, False
    row[col] = _u64(b, q)
    return q + 8, True


@aot.njit(cache=True)
def _sized_field(b, p, q, e, row, c_size, c_off):
    """A u64 size and that many bytes (STACK_USER, AUX): the size and the
    bytes' offset into ``row``; where the next field begins, and whether
    the bytes fitted before ``e``."""
    if q + 8 > e:
        return q, False
    n = _u64(b, q)
    q += 8
    if n > np.uint64(max(e - q, 0)):
        return q, False
    row[c_size] = n
    row[c_off] = q - p
    return q + np.int64(n), True


@aot.njit(cache=True)
def decode_samples(b, off, size, st, rf, hw_idx, nregs_user, nregs_intr, out):
    """Decode the SAMPLE records at ``off`` written with sample_type ``st``,
    read_format ``rf`` into ``out`` (one row each, columns SAMPLE_COLUMNS).
    Offsets are file offsets.  A record too short for its fields gets
    ``bad`` = the byte position (relative to the record) where it ran out."""
    for i in range(off.shape[0]):
        p = off[i]
        e = p + size[i]
        q = p + 8
        row = out[i]
        row[:] = 0
        ok = True
        if st & S_IDENTIFIER:
            if q + 8 > e:
                ok = False
            else:
                row[C_IDENTIFIER] = _u64(b, q)
            q += 8
        for bit, col in ((S_IP, C_IP), (S_TID, -1), (S_TIME, C_TIME), (S_ADDR, C_ADDR),
                         (S_ID, C_ID), (S_STREAM_ID, C_STREAM_ID), (S_CPU, -2),
                         (S_PERIOD, C_PERIOD)):  # fmt: skip
            if ok and st & bit:
                if q + 8 > e:
                    ok = False
                    break
                if col == -1:
                    row[C_PID] = _u32(b, q)
                    row[C_TID] = _u32(b, q + 4)
                elif col == -2:
                    row[C_CPU] = _u32(b, q)
                else:
                    row[col] = _u64(b, q)
                q += 8
        if ok and st & S_READ:
            row[C_ROFF] = q - p
            if rf & 8:  # GROUP: nr, [enabled], [running], nr * {value, [id], [lost]}
                if q + 8 > e:
                    ok = False
                else:
                    nr = _u64(b, q)
                    row[C_RNR] = nr
                    q += 8
                    if rf & 1:
                        if q + 8 <= e:
                            row[C_RENA] = _u64(b, q)
                        q += 8
                    if rf & 2:
                        if q + 8 <= e:
                            row[C_RRUN] = _u64(b, q)
                        q += 8
                    per = 8 + (8 if rf & 4 else 0) + (8 if rf & 16 else 0)
                    if nr > np.uint64(max(e - q, 0) // per):
                        ok = False
                    else:
                        q += np.int64(nr) * per
            else:
                for bit, col in ((0, C_RVAL), (1, C_RENA), (2, C_RRUN), (4, C_RID),
                                 (16, C_RLOST)):  # fmt: skip
                    if bit == 0 or rf & bit:
                        if q + 8 > e:
                            ok = False
                            break
                        row[col] = _u64(b, q)
                        q += 8
            if q > e:
                ok = False
        if ok and st & S_CALLCHAIN:
            if q + 8 > e:
                ok = False
            else:
                nr = _u64(b, q)
                if nr > np.uint64((e - q - 8) // 8):
                    ok = False
                else:
                    row[C_CC_NR] = nr
                    row[C_CC_OFF] = q + 8 - p
                    q += 8 + 8 * np.int64(nr)
        if ok and st & S_RAW:  # u32 size, data; the whole padded to u64
            if q + 4 > e:
                ok = False
            else:
                n = np.int64(_u32(b, q))
                if q + 4 + n > e:
                    ok = False
                else:
                    row[C_RAW_SIZE] = n
                    row[C_RAW_OFF] = q + 4 - p
                    q += (4 + n + 7) // 8 * 8
        if ok and st & S_BRANCH_STACK:  # BRANCH_STACK
            if q + 8 > e:
                ok = False
            else:
                nr = _u64(b, q)
                q += 8
                if hw_idx:
                    if q + 8 > e:
                        ok = False
                    else:
                        row[C_BR_HW] = _u64(b, q)
                    q += 8
                if ok and nr > np.uint64(max(e - q, 0) // 24):
                    ok = False
                elif ok:
                    row[C_BR_NR] = nr
                    row[C_BR_OFF] = q - p
                    q += 24 * np.int64(nr)
        if ok and st & S_REGS_USER:
            q, ok = _regs_field(b, p, q, e, row, C_RU_ABI, C_RU_OFF, nregs_user)
        if ok and st & S_STACK_USER:
            q, ok = _sized_field(b, p, q, e, row, C_SU_SIZE, C_SU_OFF)
            if ok and row[C_SU_SIZE] != 0:
                # The dynamic size (what of the copy is stack) follows the bytes.
                ok = q + 8 <= e
                if ok:
                    row[C_SU_DYN] = _u64(b, q)
                q += 8
        for bit, col in ((S_WEIGHT | S_WEIGHT_STRUCT, C_WEIGHT), (S_DATA_SRC, C_DSRC),
                         (S_TRANSACTION, C_TXN)):  # fmt: skip
            if ok and st & bit:
                q, ok = _u64_field(b, q, e, row, col)
        if ok and st & S_REGS_INTR:
            q, ok = _regs_field(b, p, q, e, row, C_RI_ABI, C_RI_OFF, nregs_intr)
        for bit, col in ((S_PHYS_ADDR, C_PHYS), (S_CGROUP, C_CGROUP),
                         (S_DATA_PAGE_SIZE, C_DPS), (S_CODE_PAGE_SIZE, C_CPS)):  # fmt: skip
            if ok and st & bit:
                q, ok = _u64_field(b, q, e, row, col)
        if ok and st & S_AUX:
            q, ok = _sized_field(b, p, q, e, row, C_AUX_SIZE, C_AUX_OFF)
        if not ok:
            row[C_BAD] = max(q - p, 1)
