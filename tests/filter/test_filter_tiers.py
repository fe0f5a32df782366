"""All filter tiers agree: with each other and with the reference semantics,
on generated schemas, events and expressions (error cases included)."""

from __future__ import annotations

import numpy as np
import pytest
from filter_strategies import balanced, events, expressions, schemas
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracles.filter import evaluate

from hwtrace.filter.compile import TIERS, compile_filter
from hwtrace.filter.errors import FilterError
from hwtrace.filter.packing import EventRecord, pack_many
from hwtrace.filter.schema import DEFAULT_CONTEXT, Schema

CTX = {"procname": b"lttng-sessiond", "cpu_id": 2, "pid": 42, "tid": 43, "prio": -5}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_tier_gives_the_reference_verdict(data):
    schema = data.draw(schemas())
    batch = data.draw(st.lists(events(schema), min_size=1, max_size=4))
    text = data.draw(expressions(schema, DEFAULT_CONTEXT))
    # LTTng's lenient mode too: a field the schema lacks is false when evaluated.
    unknown = data.draw(st.sampled_from(["error", "false"]))
    try:
        compile_filter(text, schema, "lttng", unknown=unknown)
    except FilterError as first:
        # An expression one tier rejects, all reject, with the same message.
        for tier in TIERS:
            with pytest.raises(FilterError) as e:
                compile_filter(text, schema, tier, unknown=unknown)
            assert str(e.value) == str(first)
        return
    cx = EventRecord(DEFAULT_CONTEXT, CTX)
    records = [EventRecord(schema, v) for v in batch]
    tree = compile_filter(text, schema, "lttng", unknown=unknown).tree
    want = [evaluate(tree, r.address, cx.address) for r in records]
    addresses = np.array([r.address for r in records], np.uint64)
    for tier in TIERS:
        f = compile_filter(text, schema, tier, unknown=unknown)
        got = [f(r.address, cx.address) for r in records]
        assert got == want, (tier, text)
        np.testing.assert_array_equal(f.run_many(addresses, cx.address), np.array(want))


def test_run_many_on_a_packed_batch():
    schema = Schema.declare("tp", [("var0", "string"), ("lyf", "s64")])
    rows = [{"var0": b"str0", "lyf": 42 + (i % 3 == 0)} for i in range(1000)]
    batch = pack_many(schema, rows)
    for tier in TIERS:
        f = compile_filter('var0 == "str0" && lyf == 42', schema, tier)
        got = f.run_many(batch.addresses)
        assert got.sum() == sum(1 for r in rows if r["lyf"] == 42), tier
        assert f.memory_bytes > 0


def test_too_big_for_ebpf_falls_back_and_says_so():
    schema = Schema.declare("ev", [("s", "string")])

    text = balanced(600, "||", lambda i: f's == "v{i}"')
    f = compile_filter(text, schema, "ebpf-jit")
    assert f.tier == "llvm" and "4096" in f.note and "llvm" in f.note
    f = compile_filter(text, schema, "ebpf")
    assert f.tier == "lttng" and "lttng tier instead" in f.note
    with pytest.raises(FilterError, match="limit of 4096"):
        compile_filter(text, schema, "ebpf", fallback=False)
    rec = EventRecord(schema, {"s": b"v599"})
    assert f(rec.address)


def test_unknown_tier():
    with pytest.raises(FilterError, match="unknown tier"):
        compile_filter("1", Schema.declare("e", [("a", "s64")]), "fast")  # type: ignore[arg-type]
