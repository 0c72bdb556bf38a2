"""Queue settings through nsqadmin (an nsqpy addition): /api/config/topics/:topic[/:channel]
reads each nsqd's settings and (admins) sets them on every nsqd that has the topic, with each
node's error; the counters reach /api/topics… (tables) and /api/series… (live charts); a Go
nsqd (no /stats counters) shows none."""

from __future__ import annotations

import json

import aiohttp
import pytest
from admin_helpers import Cluster, Recorder, cluster_fixture, running_admin  # noqa: F401
from support import wait_for

from nsqpy.nsqadmin.types import ChannelStats, TopicStats

pytestmark = pytest.mark.timeout(60)

TOPIC_DEFAULTS = {"max_depth": None, "max_bytes": None, "overflow": "reject", "max_age": None}
CHANNEL_DEFAULTS = {**TOPIC_DEFAULTS, "max_attempts": None, "dead_letter_topic": None, "max_rate": None}


async def nsqd_get(nsqd, path: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.get(f"http://{nsqd.http_addr_str}{path}") as r:
        return r.status, await r.json()


async def orders(cluster: Cluster, channel_on: tuple[int, ...] = (0, 1)) -> None:
    for i, nsqd in enumerate(cluster.nsqds):
        t = nsqd.get_topic("orders")
        if i in channel_on:
            t.get_channel("archive")
    await cluster.registered("orders", len(cluster.nsqds))


async def test_read_and_set_on_every_node(cluster):
    await orders(cluster)
    nodes = sorted(n.http_addr_str for n in cluster.nsqds)
    async with (
        Recorder() as endpoint,
        running_admin(
            nsqlookupd_http_addresses=[cluster.lookupd_http],
            notification_http_endpoint=f"http://{endpoint.address}/",
        ) as (_, http),
    ):
        doc = await http.json("/api/config/topics/orders")
        assert doc["message"] == ""
        assert sorted(n["node"] for n in doc["nodes"]) == nodes
        assert all(n["config"] == TOPIC_DEFAULTS for n in doc["nodes"])
        assert all(n["hostname"] for n in doc["nodes"])
        doc = await http.json("/api/config/topics/orders/archive")
        assert all(n["config"] == CHANNEL_DEFAULTS for n in doc["nodes"])

        want = {"max_age": "1h", "max_attempts": 3, "dead_letter_topic": "orders_dlq", "max_rate": 50}
        status, doc = await http.post_json("/api/config/topics/orders/archive", want)
        assert status == 200, doc
        assert doc["message"] == ""
        assert len(doc["nodes"]) == 2
        effective = {**CHANNEL_DEFAULTS, **want, "max_age": "1h0m0s"}  # Go's duration format
        for n in doc["nodes"]:
            assert n["config"] == effective
        for nsqd in cluster.nsqds:
            assert await nsqd_get(nsqd, "/channel/config?topic=orders&channel=archive") == (200, effective)
        # null unsets; the topic's own settings
        status, doc = await http.post_json("/api/config/topics/orders/archive", {"max_rate": None})
        assert status == 200 and all(n["config"]["max_rate"] is None for n in doc["nodes"])
        status, doc = await http.post_json(
            "/api/config/topics/orders", {"max_depth": 1000, "overflow": "drop_oldest"}
        )
        assert status == 200, doc
        for nsqd in cluster.nsqds:
            _, cfg = await nsqd_get(nsqd, "/topic/config?topic=orders")
            assert cfg == {**TOPIC_DEFAULTS, "max_depth": 1000, "overflow": "drop_oldest"}
        notes = [json.loads(r["body"]) for r in await endpoint.wait_requests(3)]
        assert [(d["action"], d["topic"], d.get("channel")) for d in notes] == [
            ("config_channel", "orders", "archive"),
            ("config_channel", "orders", "archive"),
            ("config_topic", "orders", None),
        ]


async def test_errors_are_per_node_and_change_nothing(cluster):
    await orders(cluster, channel_on=(0,))
    n0, n1 = cluster.nsqds
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http]) as (_, http):
        # a bad value: every node refuses it, naming it; nothing is changed
        status, doc = await http.post_json("/api/config/topics/orders", {"max_age": "soon"})
        assert status == 200
        assert {n["node"]: n["error"] for n in doc["nodes"]} == {
            n.http_addr_str: 'invalid max_age "soon": a duration such as "90s" or "1h", or null'
            for n in cluster.nsqds
        }
        assert doc["message"].startswith("WARNING: failed on ")
        assert "invalid max_age" in doc["message"]
        status, doc = await http.post_json("/api/config/topics/orders", {"colour": "red"})
        assert all(n["error"].startswith('unknown key "colour"') for n in doc["nodes"])
        for nsqd in cluster.nsqds:
            assert (await nsqd_get(nsqd, "/topic/config?topic=orders"))[1] == TOPIC_DEFAULTS

        # the channel exists on one node only: the other answers its error, the first takes it
        status, doc = await http.post_json("/api/config/topics/orders/archive", {"max_depth": 5})
        assert status == 200
        by_node = {n["node"]: n for n in doc["nodes"]}
        assert by_node[n0.http_addr_str]["config"]["max_depth"] == 5
        assert by_node[n1.http_addr_str]["error"] == 'unknown channel "orders:archive"'
        assert "config" not in by_node[n1.http_addr_str]
        assert n1.http_addr_str in doc["message"]

        # a body that is not a JSON object
        for body in (b"[1]", b"nope", b'"x"'):
            status, _, raw = await http.post("/api/config/topics/orders", body)
            assert (status, json.loads(raw)) == (400, {"message": "INVALID_BODY"})
        # an unknown topic: no nodes, a lookup error
        status, doc = await http.post_json("/api/config/topics/ghost", {"max_depth": 1})
        assert status == 502 and doc["message"].startswith("UPSTREAM_ERROR: failed to query any nsqlookupd")


async def test_only_admins_set(cluster):
    await orders(cluster)
    async with running_admin(
        nsqlookupd_http_addresses=[cluster.lookupd_http],
        admin_users=["alice"],
        acl_http_header="X-Auth-User",
    ) as (_, http):
        for headers in ({}, {"X-Auth-User": "bob"}):
            status, doc = await http.post_json(
                "/api/config/topics/orders/archive", {"max_depth": 1}, headers=headers
            )
            assert (status, doc) == (403, {"message": "FORBIDDEN"})
            assert len((await http.json("/api/config/topics/orders/archive"))["nodes"]) == 2
        for nsqd in cluster.nsqds:
            _, cfg = await nsqd_get(nsqd, "/channel/config?topic=orders&channel=archive")
            assert cfg["max_depth"] is None
        status, doc = await http.post_json(
            "/api/config/topics/orders/archive", {"max_depth": 1}, headers={"X-Auth-User": "alice"}
        )
        assert status == 200 and all(n["config"]["max_depth"] == 1 for n in doc["nodes"])


async def test_counters_in_tables_and_series(cluster):
    await orders(cluster)
    n0, n1 = cluster.nsqds
    async with running_admin(
        nsqlookupd_http_addresses=[cluster.lookupd_http],
        stats_sample_interval=0.05,
        stats_retention=60.0,
    ) as (_, http):
        # no settings: no policy anywhere (the JSON is Go's)
        doc = await http.json("/api/topics/orders")
        assert "policy" not in doc and all("policy" not in c for c in doc["channels"])
        series = await http.json("/api/series/topics/orders/archive")
        assert "dropped_count" not in series

        status, doc = await http.post_json(
            "/api/config/topics/orders/archive", {"max_depth": 2, "overflow": "drop_oldest"}
        )
        assert status == 200 and all("config" in n for n in doc["nodes"])
        await cluster.publish(n0, "orders", [b"m"] * 5)
        await cluster.publish(n1, "orders", [b"m"] * 4)

        channel = await http.json("/api/topics/orders/archive")
        assert channel["depth"] == 4
        assert channel["policy"] == {
            "config": None,
            "expired_count": 0,
            "dropped_count": 5,
            "dead_letter_count": 0,
        }
        per_node = {n["node"]: n["policy"] for n in channel["nodes"]}
        assert per_node[n0.http_addr_str]["dropped_count"] == 3
        assert per_node[n1.http_addr_str]["dropped_count"] == 2
        assert per_node[n0.http_addr_str]["config"]["max_depth"] == 2
        topic = await http.json("/api/topics/orders")
        assert "policy" not in topic  # the topic itself has no settings
        [archive] = topic["channels"]
        assert archive["policy"]["dropped_count"] == 5

        async def sampled():
            doc = await http.json("/api/series/topics/orders/archive")
            values = doc.get("dropped_count") or []
            return doc if values and values[-1] == 5 else None

        doc = await wait_for(sampled)
        assert len(doc["dropped_rate"]) == len(doc["timestamps"])
        assert len(doc["expired_count"]) == len(doc["timestamps"])
        topic_series = await http.json("/api/series/topics/orders")
        assert topic_series["channels"]["archive"]["dropped_count"][-1] == 5
        assert "dropped_count" not in topic_series


def test_stats_types_without_policy_are_gos():
    """A Go nsqd's /stats row has no counters: no policy key in nsqadmin's JSON."""
    go_channel = {"channel_name": "c", "depth": 1, "clients": []}
    assert "policy" not in ChannelStats.from_json(go_channel).to_json()
    ours = {
        **go_channel,
        "expired_count": 2,
        "dropped_count": 0,
        "dead_letter_count": 1,
        "config": {"max_age": "1s"},
    }
    total = ChannelStats.from_json(go_channel)
    total.add(ChannelStats.from_json(ours))
    total.add(ChannelStats.from_json(go_channel))
    assert total.to_json()["policy"] == {
        "config": None,
        "expired_count": 2,
        "dropped_count": 0,
        "dead_letter_count": 1,
    }
    go_topic = {"topic_name": "t", "depth": 0, "channels": []}
    assert "policy" not in TopicStats.from_json(go_topic).to_json()
