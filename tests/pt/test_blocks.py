"""The block store (hwtrace.pt.blocks) gives back the rows it was given."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.pt.blocks import (
    OFF_BYTES,
    OFF_ROWS,
    S_ENT,
    S_NSEQ,
    S_ROWS,
    S_SEQ_GEN,
    S_SEQ_POOL,
    SEQ_TOP,
    T_ROWS,
    T_TICKS,
    BlockStore,
    CompactBlocks,
    StoredKeys,
    store_sequence,
)


@st.composite
def block_rows(draw):
    """Rows of a few distinct blocks whose offsets and times change now and
    then, by steps small and large: beyond a point's reach in bytes
    (backwards too) and in rows (OFF_ROWS and more at one offset)."""
    n = draw(st.integers(1, 12000))  # (beyond the store's first 4,096 points)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ip = rng.choice(np.array([0x1000, 0x1040, 0x2000, 0x7F0000001000], np.uint64), n)
    ninsn = (ip & np.uint64(0xFF)).astype(np.uint32) + 1
    steps = rng.choice(np.array([0, 0, 0, 1, 7, OFF_BYTES - 1, OFF_BYTES, 3 << 20, -9], np.int64),
                       n)  # fmt: skip
    offset = np.int64(draw(st.integers(0, 2**40))) + np.cumsum(steps)
    # Times step by little, back a little (an estimate corrected), and
    # beyond a time point's step (a gap): far points.
    t_steps = rng.choice(np.array([0, 0, 0, 5, -3, T_TICKS - 1, T_TICKS, 1 << 40],
                                  np.int64), n)  # fmt: skip
    time = (np.int64(1 << 41) + np.cumsum(t_steps)).astype(np.uint64)
    return ip, ninsn, offset, time


def _store(ip, ninsn, offset, time, pieces: int) -> BlockStore:
    store = BlockStore(expect_rows=16)
    for part in np.array_split(np.arange(ip.shape[0]), pieces):
        store.append(ip[part], ninsn[part], np.full(part.shape[0], 64, np.uint8), offset[part],
                     time[part])  # fmt: skip
    return store


def _stored(ip, ninsn, offset, time, pieces: int) -> CompactBlocks:
    return CompactBlocks([_store(ip, ninsn, offset, time, pieces)])


@settings(max_examples=60, deadline=None)
@given(rows=block_rows(), pieces=st.integers(1, 5))
def test_rows_come_back(rows, pieces):
    ip, ninsn, offset, time = rows
    store = _store(ip, ninsn, offset, time, pieces)
    blocks = CompactBlocks([store])
    assert blocks.n == ip.shape[0]
    assert np.array_equal(blocks.column("ip"), ip)
    assert np.array_equal(blocks.column("ninsn"), ninsn)
    assert np.array_equal(blocks.column("offset"), offset)
    assert np.array_equal(blocks.column("time"), time)

    # The last row's offset, kept as the rows are stored.
    assert store.last_offset() == int(offset[-1])


def test_long_runs_at_one_offset_and_far_jumps():
    """More rows at one offset than a point's row step holds, then a jump
    of many GiB: far points, the same columns."""
    n = 3 * OFF_ROWS + 10
    ip = np.full(n, 0x1000, np.uint64)
    ninsn = np.ones(n, np.uint32)
    offset = np.full(n, 5 << 33, np.int64)
    offset[-3:] += 7 * OFF_BYTES
    offset[-1] += 5 << 30  # (a gap: 5 GiB on)
    time = np.zeros(n, np.uint64)
    blocks = _stored(ip, ninsn, offset, time, 2)
    assert np.array_equal(blocks.column("offset"), offset)
    rows, values = blocks.offset_changes()
    assert rows.tolist() == [0, n - 3, n - 1] and values[-1] == offset[-1]
    # Two stores joined: the second's rows follow the first's.
    a, b = BlockStore(16), BlockStore(16)
    a.append(ip[:5], ninsn[:5], np.full(5, 64, np.uint8), offset[:5], time[:5])
    b.append(ip[-4:], ninsn[-4:], np.full(4, 64, np.uint8), offset[-4:], time[-4:])
    joined = CompactBlocks([a, b])
    assert np.array_equal(joined.column("offset"), np.concatenate([offset[:5], offset[-4:]]))


def test_time_points_far_apart():
    """More rows at one time than a time point's row step holds, between
    times far apart, forwards and back: the same time column, from either
    of two stores joined."""
    n = 2 * T_ROWS + 10
    ip = np.full(n, 0x1000, np.uint64)
    ninsn = np.ones(n, np.uint32)
    offset = np.zeros(n, np.int64)
    # (Steps just within a point's reach and just beyond it, each way.)
    changes = [0, T_ROWS - 1, T_ROWS + 1, 2 * T_ROWS + 2, n - 3, n - 2, n - 1]
    steps = [1 << 45, -1, T_TICKS - 1, 1, T_TICKS, T_TICKS - 1, -(1 << 44)]
    t_step = np.zeros(n, np.int64)
    t_step[changes] = steps
    time = np.cumsum(t_step).astype(np.uint64)
    for pieces in (1, 3):
        blocks = _stored(ip, ninsn, offset, time, pieces)
        assert np.array_equal(blocks.column("time"), time)
        rows, values = blocks.time_changes()
        assert rows.tolist() == changes
        assert values.tolist() == time[rows].tolist()
    a, b = _store(ip, ninsn, offset, time, 2), _store(ip[:9], ninsn[:9], offset[:9], time[:9], 1)
    assert np.array_equal(CompactBlocks([a, b]).column("time"), np.concatenate([time, time[:9]]))


@settings(max_examples=40, deadline=None)
@given(rows=block_rows(), cuts=st.lists(st.integers(0, 12000), max_size=3))
def test_stores_joined(rows, cuts):
    """The stores of several decoding threads, joined: the rows of each in
    order, one table without a block twice, the first store's keys kept."""
    ip, ninsn, offset, time = rows
    bounds = [0, *sorted(min(c, ip.shape[0]) for c in cuts), ip.shape[0]]
    stores = []
    for lo, hi in itertools.pairwise(bounds):
        s = BlockStore(16)
        mode = np.full(hi - lo, 64, np.uint8)
        # (every other store's blocks in another image: blocks of the same
        # address and size that are not the same block)
        s.append(ip[lo:hi], ninsn[lo:hi], mode, offset[lo:hi], time[lo:hi], image=len(stores) % 2)
        stores.append(s)
    joined = CompactBlocks(stores)
    assert joined.n == ip.shape[0]
    # (counted from the stores' entries, before any row has its key)
    assert joined.n_insn() == int(ninsn.astype(np.uint64).sum()) and joined.nbytes > 0
    assert np.array_equal(joined.column("ip"), ip)
    assert np.array_equal(joined.column("ninsn"), ninsn)
    assert np.array_equal(joined.column("offset"), offset)
    assert np.array_equal(joined.column("time"), time)
    want_image = np.concatenate(
        [np.full(hi - lo, k % 2, np.uint16) for k, (lo, hi) in
         enumerate(itertools.pairwise(bounds))]
    )  # fmt: skip
    assert np.array_equal(joined.column("image"), want_image)
    table = set(zip(joined.ip.tolist(), joined.ninsn.tolist(), joined.image.tolist(), strict=True))
    assert len(table) == joined.ip.shape[0]
    first = stores[0].key_column()
    assert np.array_equal(joined.keys[: first.shape[0]], first)


def test_rows_named_by_the_keys_of_stored_rows():
    """row_keys names rows by the store's keys without storing them: a
    block stored before gets its key, a new one a key added to the table
    (the table growing, and the key column widening past 65,535 blocks, as
    storing them would)."""
    store = BlockStore(expect_rows=16)
    mode64 = np.full(3, 64, np.uint8)
    ip = np.array([0x1000, 0x2000, 0x1000], np.uint64)
    store.append(ip, np.array([3, 4, 3], np.uint32), mode64, np.zeros(3, np.int64),
                 np.zeros(3, np.uint64))  # fmt: skip
    out = np.zeros(4, np.uint32)
    store.row_keys(np.array([0x2000, 0x1000, 0x3000, 0x1000], np.uint64),
                   np.array([4, 3, 1, 5], np.uint32), np.full(4, 64, np.uint8), np.int64(0),
                   out)  # fmt: skip
    assert out.tolist()[:2] == store.key_column()[1::-1].tolist()
    assert len(set(out.tolist())) == 4 and len(store) == 3
    t = store.table()
    assert t["ip"][out].tolist() == [0x2000, 0x1000, 0x3000, 0x1000]
    assert t["ninsn"][out].tolist() == [4, 3, 1, 5]
    # Past what a 2-byte key names.
    n = 70_000
    many = np.arange(n, dtype=np.uint64) * np.uint64(16) + np.uint64(0x100000)
    out = np.zeros(n, np.uint32)
    store.row_keys(many, np.ones(n, np.uint32), np.full(n, 64, np.uint8),
                   np.zeros(n, np.int64), out)  # fmt: skip
    assert not store.live and store.n_keys == 4 + n
    assert np.array_equal(store.table()["ip"][out], many)
    assert store.key_column().tolist() == [0, 1, 0]


def test_sequences_stand_for_rows():
    """A stretch the decoder replays is kept once as a sequence and each
    replay stores one entry naming it: every reader gets the rows back,
    and a key column widened past 65,535 blocks holds them row by row."""
    store = BlockStore(expect_rows=16)
    ip = np.array([0x1000, 0x2000, 0x3000], np.uint64)
    ninsn = np.array([3, 4, 5], np.uint32)
    store.append(ip, ninsn, np.full(3, 64, np.uint8), np.array([10, 10, 12], np.int64),
                 np.array([7, 7, 9], np.uint64))  # fmt: skip
    cols, state = store.kernel_store()[2], store.state
    assert store_sequence(cols, state, np.array([1, 2, 0], np.uint16), 0, 1, 3) == -1  # one row
    seq = store_sequence(cols, state, np.array([5, 1, 2, 0], np.uint16), 1, 3, 3)
    assert seq == SEQ_TOP and state[S_NSEQ] == 1
    for _ in range(2):  # as the replay chain stores a replay
        store.keys[state[S_ENT]] = seq
        state[S_ENT] += 1
        state[S_ROWS] += 3
    want = [0, 1, 2, 1, 2, 0, 1, 2, 0]
    assert len(store) == 9 and store.entries().shape[0] == 5
    assert store.key_column().tolist() == want
    assert store.n_insn() == int(ninsn[want].sum())
    blocks = CompactBlocks([store])
    assert blocks.n_insn() == int(ninsn[want].sum())
    assert blocks.column("ip").tolist() == ip[want].tolist()
    assert blocks.column("offset").tolist() == [10, 10] + [12] * 7
    joined = CompactBlocks([store, store])
    assert joined.column("ninsn").tolist() == ninsn[want + want].tolist()
    # No key for a block may reach the sequences': past that the column
    # widens, the sequences expanded into it.
    n = 70_000
    many = np.arange(n, dtype=np.uint64) * np.uint64(16) + np.uint64(0x100000)
    out = np.zeros(n, np.uint32)
    store.row_keys(many, np.ones(n, np.uint32), np.full(n, 64, np.uint8), np.zeros(n, np.int64),
                   out)  # fmt: skip
    assert not store.live and state[S_NSEQ] == 0
    assert store.key_column().tolist() == want and store.entries().shape[0] == 9
    assert np.array_equal(store.table()["ip"][out], many)


def test_stored_keys_give_the_rows_once_the_store_moved_on():
    """A copy of the key column as stored (entries, the sequences they
    name) gives the rows' keys, and the last row's, after the store was
    cleared and stored into again; with no sequence named too."""
    store = BlockStore(expect_rows=16)
    ip = np.array([0x1000, 0x2000, 0x3000], np.uint64)
    store.append(ip, np.array([3, 4, 5], np.uint32), np.full(3, 64, np.uint8),
                 np.zeros(3, np.int64), np.zeros(3, np.uint64))  # fmt: skip
    plain = StoredKeys(store)
    cols, state = store.kernel_store()[2], store.state
    seq = store_sequence(cols, state, np.array([5, 1, 2, 0], np.uint16), 1, 3, 3)
    store.keys[state[S_ENT]] = seq
    state[S_ENT] += 1
    state[S_ROWS] += 3
    copy = StoredKeys(store)
    want = store.key_column().tolist()
    assert want == [0, 1, 2, 1, 2, 0] and copy.entries.tolist()[-1] == seq
    store.clear()
    store.append(ip[::-1], np.array([5, 4, 3], np.uint32), np.full(3, 64, np.uint8),
                 np.zeros(3, np.int64), np.zeros(3, np.uint64))  # fmt: skip
    seq2 = store_sequence(cols, state, np.array([2, 2, 1], np.uint16), 0, 3, 3)
    store.keys[state[S_ENT]] = seq2
    state[S_ENT] += 1
    state[S_ROWS] += 3
    for stored, rows in ((copy, want), (plain, [0, 1, 2])):
        out = np.full(len(rows), 9, np.uint16)
        stored.into(out)
        assert out.tolist() == rows and stored.last() == rows[-1]
    assert store.key_column().tolist() == [2, 1, 0, 2, 2, 1]


def test_sequences_go_with_the_rows_once_half_full():
    """A stream's store (rows taken and cleared batch by batch) keeps its
    sequences, until they fill half their room: then they go with the rows
    and a new generation starts (the decoder's replay cache follows it)."""
    store = BlockStore(expect_rows=16)
    cols, state = store.kernel_store()[2], store.state
    src = np.arange(4, dtype=np.uint16)
    assert store_sequence(cols, state, src, 0, 4, 4) == SEQ_TOP
    store.clear()
    assert state[S_NSEQ] == 1 and state[S_SEQ_GEN] == 0
    state[S_NSEQ] = store.seq_start.shape[0] // 2
    store.clear()
    assert state[S_NSEQ] == 0 and state[S_SEQ_POOL] == 0 and state[S_SEQ_GEN] == 1
    assert store_sequence(cols, state, src, 0, 3, 4) == SEQ_TOP


def test_dense_columns_start_on_a_huge_page():
    """The store's densely written columns start on a 2 MiB boundary once
    they span one (the 4 KiB pages before it would each fault), hold what
    is written, and are plain arrays otherwise; the sparse far points are
    left where the allocator puts them."""
    from hwtrace.columns import HUGE_PAGE, dense_empty

    store = BlockStore(1 << 24)  # (offset points of a byte: 4 MiB)
    for column in (store.keys, store.off_pts, store.time_pts):
        assert column.ctypes.data % HUGE_PAGE == 0, column.dtype
    a = dense_empty((HUGE_PAGE // 88 + 5, 11), np.uint64)
    assert a.shape == (HUGE_PAGE // 88 + 5, 11) and a.dtype == np.uint64 and a.flags.c_contiguous
    assert a.ctypes.data % HUGE_PAGE == 0
    a[...] = np.arange(a.size, dtype=np.uint64).reshape(a.shape)
    assert int(a[-1, -1]) == a.size - 1 and a.base is not None
    small = dense_empty(1000, np.int64)
    assert small.shape == (1000,) and small.base is None


def test_replay_cache_lies_on_huge_pages():
    """A replay cache of 512 KiB and more (its entries are looked up
    anywhere in it) starts on a 2 MiB boundary, zeroed; a small table stays
    a plain array."""
    from hwtrace.columns import HUGE_PAGE, random_access_zeros
    from hwtrace.image import Image
    from hwtrace.pt.codetable import CodeTable

    table = CodeTable(Image())
    table.reserve_replay(16 << 20)
    for column in (table.x_words, table.x_key):
        assert column.nbytes >= HUGE_PAGE // 4 and column.ctypes.data % HUGE_PAGE == 0
        assert not column.any()
    a = random_access_zeros((HUGE_PAGE // 16, 3), np.int32)
    assert a.shape == (HUGE_PAGE // 16, 3) and a.dtype == np.int32 and not a.any()
    assert a.ctypes.data % HUGE_PAGE == 0
    small = random_access_zeros(1000, np.int64)
    assert small.base is None and not small.any()
