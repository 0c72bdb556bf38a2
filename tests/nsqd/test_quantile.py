"""The e2e latency stream (Go's ``internal/quantile`` semantics): what ``count`` covers, the
half-window rotation, the reported values, the topic aggregate, bounded memory."""

from __future__ import annotations

import random

import pytest

from nsqpy.nsqd import quantile
from nsqpy.nsqd.quantile import NO_RESULT, Quantile, aggregate_result

pytestmark = pytest.mark.timeout(30)

S = 1_000_000_000  # one second in ns
T0 = 1_700_000_000 * S


def insert_latencies(q: Quantile, latencies, now: int) -> None:
    for lat in latencies:
        q.insert(now - lat, now)


def test_empty_stream_reports_zero_for_each_percentile_in_order():
    q = Quantile(600, [0.99, 0.5], T0)
    assert q.result(T0) == {
        "count": 0,
        "percentiles": [{"quantile": 0.99, "value": 0}, {"quantile": 0.5, "value": 0}],
    }


def test_whole_quantile_prints_like_go():
    # Go's map[string]float64 encodes 1.0 as 1
    assert Quantile(600, [1.0], T0).result(T0)["percentiles"] == [{"quantile": 1, "value": 0}]


def test_small_set_is_exact_nearest_rank():
    q = Quantile(600, [1.0, 0.99, 0.5, 0.1], T0)
    insert_latencies(q, range(1, 101), T0)  # 1..100 ns: below the exact-bucket limit
    r = q.result(T0)
    assert r["count"] == 100
    assert [p["value"] for p in r["percentiles"]] == [100, 99, 50, 10]


def test_values_within_bucket_resolution_and_max_exact():
    rng = random.Random(7)
    lats = [int(rng.lognormvariate(15, 1.2)) for _ in range(50_000)]
    q = Quantile(600, [1.0, 0.999, 0.99, 0.5], T0)
    insert_latencies(q, lats, T0)
    r = q.result(T0)
    assert r["count"] == len(lats)
    lats.sort()
    got = [p["value"] for p in r["percentiles"]]
    assert got[0] == lats[-1]
    for value, p in zip(got[1:], (0.999, 0.99, 0.5), strict=True):
        exact = lats[-(-int(p * len(lats) * 1000) // 1000) - 1]
        assert abs(value - exact) <= exact / 100, (p, value, exact)


def test_window_rotates_every_half_window():
    q = Quantile(10, [0.5], T0)  # window 10s: streams swap every 5s
    insert_latencies(q, [1000] * 3, T0 + 1 * S)
    assert q.count(T0 + 4 * S) == 3
    # first move at T0+5s: the values are in the previous stream, still counted
    insert_latencies(q, [2000] * 2, T0 + 6 * S)
    assert q.count(T0 + 9 * S) == 5
    # second move at T0+10s clears the stream that held the first three
    assert q.count(T0 + 11 * S) == 2
    assert q.result(T0 + 11 * S)["percentiles"] == [{"quantile": 0.5, "value": 2000}]
    # idle for a whole window or more: everything is gone
    assert q.result(T0 + 30 * S) == {"count": 0, "percentiles": [{"quantile": 0.5, "value": 0}]}


def test_buffered_values_count_before_the_window_moves():
    q = Quantile(10, [0.5], T0)
    insert_latencies(q, [5] * 10, T0 + 1 * S)  # fewer than BATCH: still in the buffer
    assert q.count(T0 + 6 * S) == 10  # moved once: kept (previous half)
    assert q.count(T0 + 11 * S) == 0  # moved twice: gone


def test_negative_latency_counts_as_zero():
    q = Quantile(600, [1.0], T0)
    q.insert(T0 + 5 * S, T0)  # published "after" the FIN (a clock step)
    assert q.result(T0) == {"count": 1, "percentiles": [{"quantile": 1, "value": 0}]}


def test_topic_aggregate_merges_channels():
    a = Quantile(600, [1.0, 0.5], T0)
    b = Quantile(600, [1.0, 0.5], T0)
    insert_latencies(a, [10] * 3, T0)
    insert_latencies(b, [20] * 5, T0)
    r = aggregate_result([a, None, b], [1.0, 0.5], T0)
    assert r == {
        "count": 8,
        "percentiles": [{"quantile": 1, "value": 20}, {"quantile": 0.5, "value": 20}],
    }


def test_topic_without_streams_is_go_nil():
    assert aggregate_result([], [0.99], T0) == NO_RESULT == {"count": 0, "percentiles": None}
    assert aggregate_result([None, None], [0.99], T0) == NO_RESULT


def test_memory_is_bounded_by_value_range_not_rate():
    rng = random.Random(1)
    q = Quantile(600, [0.99], T0)
    for _ in range(20):
        insert_latencies(q, (rng.randrange(1, 3600 * S) for _ in range(10_000)), T0)
    snap = q.snapshot(T0)
    assert snap.n == 200_000
    # 1ns..1h spans 42 powers of two, 64 buckets each at most
    assert len(snap.counts) <= 42 * 64 + quantile._EXACT_BELOW
    assert len(q._buf) < quantile.BATCH
