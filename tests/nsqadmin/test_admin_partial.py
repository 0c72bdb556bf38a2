"""Nodes that do not answer: what the others said is returned with Go's ``WARNING: …``
message (200), and 502 ``UPSTREAM_ERROR: …`` when nothing could be read."""

from __future__ import annotations

import json

import pytest
from admin_helpers import cluster_fixture, running_admin  # noqa: F401
from support import FakeNsqd, closed_port

pytestmark = pytest.mark.timeout(60)


def refused(url: str, port: int) -> str:
    return f'Get "{url}": dial tcp 127.0.0.1:{port}: connect: connection refused'


async def test_one_nsqd_down_in_nsqd_mode(cluster):
    n0 = cluster.nsqds[0]
    n0.get_topic("orders").get_channel("archive")
    await cluster.publish(n0, "orders", [b"a", b"b"])
    dead = closed_port()
    async with running_admin(nsqd_http_addresses=[n0.http_addr_str, f"127.0.0.1:{dead}"]) as (
        _,
        http,
    ):
        doc = await http.json("/api/topics")
        assert doc == {
            "topics": ["orders"],
            "message": "WARNING: " + refused(f"http://127.0.0.1:{dead}/stats?format=json", dead),
        }
        nodes = await http.json("/api/nodes")
        assert [n["http_port"] for n in nodes["nodes"]] == [n0.http_port]
        assert nodes["message"] == "WARNING: " + refused(f"http://127.0.0.1:{dead}/info", dead)

        topic = await http.json("/api/topics/orders")
        assert topic["message_count"] == 2
        assert [n["node"] for n in topic["nodes"]] == [n0.http_addr_str]
        assert topic["message"] == "WARNING: " + refused(
            f"http://127.0.0.1:{dead}/stats?format=json&topic=orders&include_clients=false", dead
        )
        channel = await http.json("/api/topics/orders/archive")
        assert channel["depth"] == 2 and channel["message"].startswith("WARNING: Get ")

        counter = await http.json("/api/counter")
        assert list(counter["stats"]) == [f"orders:archive:{n0.http_addr_str}"]
        assert counter["message"].startswith("WARNING: ")

        # actions reach the nsqd that answer and warn about the others
        status, body = await http.post_json("/api/topics/orders", {"action": "pause"})
        assert status == 200 and body["message"].startswith("WARNING: Get ")
        stats = await cluster.nsqd_stats(n0, "orders")
        assert stats["topics"][0]["paused"] is True


async def test_all_nsqd_down_is_502(cluster):
    a, b = closed_port(), closed_port()
    async with running_admin(nsqd_http_addresses=[f"127.0.0.1:{a}", f"127.0.0.1:{b}"]) as (
        _,
        http,
    ):
        status, _headers, body = await http.get("/api/topics")
        assert status == 502
        assert json.loads(body) == {
            "message": "UPSTREAM_ERROR: failed to query any nsqd: "
            + refused(f"http://127.0.0.1:{a}/stats?format=json", a)
            + "\n"
            + refused(f"http://127.0.0.1:{b}/stats?format=json", b)
        }
        for path in ("/api/nodes", "/api/counter", "/api/topics/x", "/api/topics/x/y"):
            status, _, body = await http.get(path)
            assert status == 502, path
            assert json.loads(body)["message"].startswith("UPSTREAM_ERROR: failed to query any nsqd: ")


async def test_unreachable_producer_in_lookupd_mode(cluster):
    n0, n1 = cluster.nsqds
    for nsqd in (n0, n1):
        nsqd.get_topic("orders").get_channel("archive")
    dead = closed_port()
    ghost = await FakeNsqd.register(cluster.lookupd.tcp_port, dead, "orders")
    try:
        await cluster.registered("orders", 3)
        async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http]) as (_, http):
            topic = await http.json("/api/topics/orders")
            assert sorted(n["node"] for n in topic["nodes"]) == sorted([n0.http_addr_str, n1.http_addr_str])
            assert topic["message"] == "WARNING: " + refused(
                f"http://127.0.0.1:{dead}/stats?format=json&topic=orders&include_clients=false",
                dead,
            )
            nodes = await http.json("/api/nodes")
            assert len(nodes["nodes"]) == 3 and nodes["message"] == ""
            # the node page of a node that does not answer: Go gives up (502)
            status, _, body = await http.get(f"/api/nodes/127.0.0.1:{dead}")
            assert status == 502
            assert json.loads(body)["message"].startswith("UPSTREAM_ERROR: failed to query any nsqd: Get ")
    finally:
        await ghost.close()


async def test_lookupd_down(cluster):
    dead = closed_port()
    cluster.nsqds[0].get_topic("orders")
    await cluster.registered("orders", 1)
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http, f"127.0.0.1:{dead}"]) as (
        _,
        http,
    ):
        doc = await http.json("/api/topics")
        assert doc == {
            "topics": ["orders"],
            "message": "WARNING: " + refused(f"http://127.0.0.1:{dead}/topics", dead),
        }
    async with running_admin(nsqlookupd_http_addresses=[f"127.0.0.1:{dead}"]) as (_, http):
        status, _, body = await http.get("/api/topics")
        assert (status, json.loads(body)) == (
            502,
            {
                "message": "UPSTREAM_ERROR: failed to query any nsqlookupd: "
                + refused(f"http://127.0.0.1:{dead}/topics", dead)
            },
        )
        # a lookupd that fails an action is a warning (Go's nsqlookupdPOST), not a 502
        status, body = await http.post_json("/api/topics", {"topic": "fresh"})
        assert status == 200
        assert body["message"] == "WARNING: " + refused(
            f"http://127.0.0.1:{dead}/topic/create?topic=fresh", dead
        ).replace("Get ", "Post ", 1)
