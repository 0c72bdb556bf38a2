"""nsqpy's time series: the sampler over a live cluster (/api/series/...), and the store's
arithmetic (rates per node, missing nodes, counter resets, bounded memory) on synthetic
samples."""

from __future__ import annotations

import json
import math

import pytest
from admin_helpers import cluster_fixture, running_admin  # noqa: F401
from support import wait_for

from nsqpy.nsqadmin.series import METRICS, SeriesStore
from nsqpy.nsqadmin.types import ChannelStats, TopicStats

pytestmark = pytest.mark.timeout(60)

HEADER = ["interval", "retention", "timestamps"]


async def test_series_api(cluster):
    n0 = cluster.nsqds[0]
    n0.get_topic("orders").get_channel("archive")
    await cluster.registered("orders", 1)
    async with running_admin(
        nsqlookupd_http_addresses=[cluster.lookupd_http],
        stats_sample_interval=0.05,
        stats_retention=60.0,
    ) as (_, http):

        async def sampled():
            doc = await http.json("/api/series/topics/orders")
            return doc if doc["message_count"] and doc["message_count"][-1] == 0 else None

        await wait_for(sampled)
        await cluster.publish(n0, "orders", [b"m"] * 10)

        async def counted():
            doc = await http.json("/api/series/topics/orders")
            return doc if doc["message_count"][-1] == 10 else None

        doc = await wait_for(counted)
        assert list(doc) == [*HEADER, "topic_name", *METRICS, "channels", "message"]
        assert (doc["interval"], doc["retention"], doc["topic_name"]) == (0.05, 60, "orders")
        assert doc["message"] == ""
        ts = doc["timestamps"]
        assert ts == sorted(ts) and len(set(ts)) == len(ts)
        for name in METRICS:
            assert len(doc[name]) == len(ts), name
        # the rate integrates to the messages published
        total = sum(r * (ts[i] - ts[i - 1]) for i, r in enumerate(doc["message_rate"]) if i and r is not None)
        assert total == pytest.approx(10, abs=0.5)
        assert max(r for r in doc["message_rate"] if r is not None) > 0
        [name] = doc["channels"]
        assert name == "archive"
        channel = doc["channels"]["archive"]
        assert list(channel) == list(METRICS)
        assert channel["depth"][-1] == 10 and channel["message_count"][-1] == 10
        assert channel["client_count"][-1] == 0

        ch = await http.json("/api/series/topics/orders/archive")
        assert list(ch) == [*HEADER, "topic_name", "channel_name", *METRICS, "message"]
        assert (ch["topic_name"], ch["channel_name"]) == ("orders", "archive")

        summary = await http.json("/api/series/topics")
        assert list(summary) == [*HEADER, "topics", "message"]
        assert list(summary["topics"]) == ["orders"]
        assert list(summary["topics"]["orders"]) == list(METRICS)

        # window and since select the newest samples
        last = ts[-1]
        recent = await http.json("/api/series/topics/orders?window=0.12")
        assert 1 <= len(recent["timestamps"]) <= 4
        assert all(t >= recent["timestamps"][-1] - 0.12 for t in recent["timestamps"])
        newer = await http.json(f"/api/series/topics/orders?since={last}")
        assert all(t > last for t in newer["timestamps"])
        assert len(newer["depth"]) == len(newer["timestamps"])
        for bad, code in (
            ("window=x", "INVALID_ARG_WINDOW"),
            ("window=-1", "INVALID_ARG_WINDOW"),
            ("since=nan", "INVALID_ARG_SINCE"),
        ):
            assert await http.json(f"/api/series/topics?{bad}", 400) == {"message": code}

        # a topic the sampler never saw: nulls, aligned with the timestamps
        ghost = await http.json("/api/series/topics/ghost")
        assert ghost["channels"] == {}
        assert ghost["depth"] == [None] * len(ghost["timestamps"])
        ghost_ch = await http.json("/api/series/topics/orders/ghost")
        assert ghost_ch["message_rate"] == [None] * len(ghost_ch["timestamps"])


async def test_series_disabled(cluster):
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http], stats_sample_interval=0.0) as (
        admin,
        http,
    ):
        assert admin.sampler is None
        for path in ("/api/series/topics", "/api/series/topics/t", "/api/series/topics/t/c"):
            assert await http.json(path, 404) == {"message": "NOT_FOUND"}


async def test_series_records_failures(cluster):
    async with running_admin(nsqd_http_addresses=["127.0.0.1:1"], stats_sample_interval=0.05) as (_, http):

        async def failed():
            doc = await http.json("/api/series/topics")
            return doc if doc["timestamps"] else None

        doc = await wait_for(failed)
        assert doc["topics"] == {}
        assert doc["message"].startswith("ERROR: failed to get producers - failed to query any nsqd: Get ")


# --- the store on synthetic samples ----------------------------------------------------------------


def row(node: str, topic: str, messages: int, depth: int = 0, channels=()) -> TopicStats:
    t = TopicStats(topic)
    t.node = node
    t.message_count = messages
    t.depth = depth
    t.channels = []
    for name, msgs, requeued, clients in channels:
        c = ChannelStats(node, topic, name)
        c.message_count = msgs
        c.requeue_count = requeued
        c.client_count = clients
        c.depth = 1
        t.channels.append(c)
    return t


def values(store: SeriesStore, metric: str, topic: str, channel: str | None = None):
    numbers = store.samples()
    series = store.topics.get(topic) if channel is None else store.channels.get((topic, channel))
    return store.series_json(series, numbers)[metric]


def test_rates_per_node_survive_a_missing_node():
    store = SeriesStore(interval=2.0, retention=60.0)
    store.record(100.0, [row("a", "t", 10), row("b", "t", 5)])
    store.record(102.0, [row("a", "t", 20), row("b", "t", 9)])
    store.record(104.0, [row("a", "t", 30)], "WARNING: b did not answer")
    store.record(106.0, [row("a", "t", 40), row("b", "t", 13)])
    assert values(store, "message_count", "t") == [15, 29, 30, 53]
    # b's 4 messages over its own 4 s count as 1/s, not as a reset
    assert values(store, "message_rate", "t") == [None, 7, 5, 6]
    assert store.message == ""
    assert store.timestamps_json(store.samples()) == [100, 102, 104, 106]


def test_counter_reset_and_failed_sample():
    store = SeriesStore(interval=1.0, retention=60.0)
    store.record(0.0, [row("a", "t", 100, channels=[("c", 100, 4, 2)])])
    store.record(1.0, [row("a", "t", 103, channels=[("c", 103, 6, 2)])])
    store.record(2.0, None, "ERROR: nothing answered")
    store.record(3.0, [row("a", "t", 2, channels=[("c", 2, 0, 1)])])  # nsqd restarted
    assert values(store, "message_rate", "t") == [None, 3, None, 1]
    assert values(store, "requeue_rate", "t", "c") == [None, 2, None, 0]
    assert values(store, "requeue_count", "t") == [4, 6, None, 0]
    assert values(store, "client_count", "t", "c") == [2, 2, None, 1]
    assert values(store, "depth", "t", "c") == [1, 1, None, 1]
    assert store.message == ""


def test_memory_is_bounded():
    store = SeriesStore(interval=1.0, retention=3.0)
    assert store.capacity == 4
    for i in range(6):
        store.record(float(i), [row("a", "t", i)] + ([row("a", "old", 1)] if i == 0 else []))
    assert store.samples() == [2, 3, 4, 5]
    assert values(store, "message_count", "t") == [2, 3, 4, 5]
    assert "old" not in store.topics  # unseen for the whole retention: forgotten
    assert store.samples(window=1.0) == [4, 5]
    assert store.samples(since=3.0) == [4, 5]
    blank = store.series_json(None, [4, 5])
    assert all(v == [None, None] for v in blank.values())
    assert not any(math.isnan(v) for v in store.timestamps)


def test_series_json_numbers():
    store = SeriesStore(interval=0.5, retention=10.0)
    store.record(1.25, [row("a", "t", 1)])
    store.record(1.75, [row("a", "t", 2)])
    assert json.dumps(store.header(store.samples())) == (
        '{"interval": 0.5, "retention": 10, "timestamps": [1.25, 1.75]}'
    )
    assert values(store, "message_rate", "t") == [None, 2]
