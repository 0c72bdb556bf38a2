"""nsqadmin's actions against our nsqlookupd and two nsqd, in-process: create, pause,
unpause, empty, delete, tombstone (their effect seen in each nsqd's /stats and in nsqlookupd),
Go's error answers, the ACL (--admin-user/--acl-http-header) and the notifications POSTed to
--notification-http-endpoint."""

from __future__ import annotations

import base64
import json
import socket
import time

import aiohttp
import pytest
from admin_helpers import Cluster, Recorder, cluster_fixture, running_admin  # noqa: F401
from support import wait_for

pytestmark = pytest.mark.timeout(60)


async def orders(cluster: Cluster, channel: str = "archive", messages: int = 0) -> None:
    for nsqd in cluster.nsqds:
        t = nsqd.get_topic("orders")
        if channel:
            t.get_channel(channel)
        if messages:
            await cluster.publish(nsqd, "orders", [b"x"] * messages)
    await cluster.registered("orders", len(cluster.nsqds))


async def topic_stats(cluster: Cluster) -> list[dict | None]:
    out = []
    for nsqd in cluster.nsqds:
        stats = await cluster.nsqd_stats(nsqd)
        out.append(next((t for t in stats["topics"] or () if t["topic_name"] == "orders"), None))
    return out


async def lookupd(cluster: Cluster, path: str):
    async with aiohttp.ClientSession() as s, s.get(f"http://{cluster.lookupd_http}{path}") as r:
        return r.status, await r.json()


async def test_create_topic_and_channel(cluster):
    await orders(cluster, channel="")
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http]) as (_, http):
        # topic only: registered in nsqlookupd (nsqd is not touched, as in Go)
        assert await http.post_json("/api/topics", {"topic": "fresh"}) == (200, {"message": ""})
        assert "fresh" in (await lookupd(cluster, "/topics"))[1]["topics"]
        # a channel of a topic with producers: created on lookupd and on every producer
        assert await http.post_json("/api/topics", {"topic": "orders", "channel": "audit"}) == (
            200,
            {"message": ""},
        )
        assert (await lookupd(cluster, "/channels?topic=orders"))[1]["channels"] == ["audit"]
        for t in await topic_stats(cluster):
            assert [c["channel_name"] for c in t["channels"]] == ["audit"]


async def test_pause_unpause_empty_delete(cluster):
    await orders(cluster, messages=3)
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http]) as (_, http):
        ok = (200, {"message": ""})
        assert await http.post_json("/api/topics/orders", {"action": "pause"}) == ok
        assert [t["paused"] for t in await topic_stats(cluster)] == [True, True]
        assert (await http.json("/api/topics/orders"))["paused"] is True
        assert await http.post_json("/api/topics/orders", {"action": "unpause"}) == ok
        assert [t["paused"] for t in await topic_stats(cluster)] == [False, False]

        assert await http.post_json("/api/topics/orders/archive", {"action": "pause"}) == ok
        assert [t["channels"][0]["paused"] for t in await topic_stats(cluster)] == [True, True]
        assert (await http.json("/api/topics/orders/archive"))["paused"] is True
        assert await http.post_json("/api/topics/orders/archive", {"action": "unpause"}) == ok
        assert [t["channels"][0]["paused"] for t in await topic_stats(cluster)] == [False, False]

        assert [t["channels"][0]["depth"] for t in await topic_stats(cluster)] == [3, 3]
        assert await http.post_json("/api/topics/orders/archive", {"action": "empty"}) == ok
        assert [t["channels"][0]["depth"] for t in await topic_stats(cluster)] == [0, 0]

        # a topic without channels keeps its messages: empty it
        for nsqd in cluster.nsqds:
            nsqd.get_topic("backlog")
            await cluster.publish(nsqd, "backlog", [b"y"] * 2)
        await cluster.registered("backlog", 2)
        assert await http.post_json("/api/topics/backlog", {"action": "empty"}) == ok
        for nsqd in cluster.nsqds:
            stats = await cluster.nsqd_stats(nsqd, "backlog")
            assert stats["topics"][0]["depth"] == 0

        status, _, body = await http.delete("/api/topics/orders/archive")
        assert (status, json.loads(body)) == ok
        assert [t["channels"] for t in await topic_stats(cluster)] == [[], []]

        status, _, body = await http.delete("/api/topics/orders")
        assert (status, json.loads(body)) == ok
        assert await topic_stats(cluster) == [None, None]
        assert "orders" not in ((await lookupd(cluster, "/topics"))[1]["topics"])


async def test_tombstone(cluster):
    await orders(cluster)
    n0, n1 = cluster.nsqds
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http]) as (_, http):
        status, body = await http.delete_json(f"/api/nodes/{n0.http_addr_str}", {"topic": "orders"})
        assert (status, body) == (200, {"message": ""})
        # the topic is deleted on that node and the node tombstoned in nsqlookupd
        stats = await cluster.nsqd_stats(n0)
        assert [t["topic_name"] for t in stats["topics"] or ()] == []

        async def only_n1():
            _, doc = await lookupd(cluster, "/lookup?topic=orders")
            return [p["http_port"] for p in doc["producers"]] == [n1.http_port]

        await wait_for(only_n1)


async def test_action_errors(cluster):
    await orders(cluster)
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http]) as (_, http):
        cases = [
            ("POST", "/api/topics", b"", "EOF"),
            ("POST", "/api/topics", b"xyz", "invalid character 'x' looking for beginning of value"),
            ("POST", "/api/topics", b'{"topic":', "unexpected EOF"),
            (
                "POST",
                "/api/topics",
                b'{"topic": 1}',
                "json: cannot unmarshal number into Go struct field .topic of type string",
            ),
            ("POST", "/api/topics", b'{"topic": "bad topic!"}', "INVALID_TOPIC"),
            ("POST", "/api/topics", b"null", "INVALID_TOPIC"),
            ("POST", "/api/topics", b'{"topic": "ok", "channel": "no/slash"}', "INVALID_CHANNEL"),
            ("POST", "/api/topics/orders", b'{"action": "explode"}', "INVALID_ACTION"),
            ("POST", "/api/topics/orders/archive", b"", "EOF"),
            ("DELETE", "/api/nodes/127.0.0.1:1", b"", "INVALID_BODY"),
            ("DELETE", "/api/nodes/127.0.0.1:1", b'{"topic": "bad topic!"}', "INVALID_TOPIC"),
        ]
        for method, path, data, message in cases:
            status, _, body = await http.request(method, path, data=data)
            assert (status, json.loads(body)) == (400, {"message": message}), (path, data)
        # Go's decoder: keys match case-insensitively, trailing data is not read
        status, body = await http.post_json("/api/topics/orders", {"ACTION": "pause"})
        assert status == 200
        status, _, body = await http.post("/api/topics/orders", b'{"action":"unpause"} trailing')
        assert status == 200

        # nsqlookupd does not know the topic: nothing to act on is an upstream error
        status, body = await http.post_json("/api/topics/ghost", {"action": "pause"})
        assert status == 502
        assert body["message"] == (
            "UPSTREAM_ERROR: failed to query any nsqlookupd: got response 404 Not Found "
            '"{\\"message\\":\\"TOPIC_NOT_FOUND\\"}"'
        )


async def test_acl_admin_users(cluster):
    await orders(cluster)
    async with running_admin(
        nsqlookupd_http_addresses=[cluster.lookupd_http],
        admin_users=["alice"],
        acl_http_header="X-Auth-User",
    ) as (_admin, http):
        forbidden = (403, {"message": "FORBIDDEN"})
        actions = [
            ("POST", "/api/topics", {"topic": "made"}),
            ("POST", "/api/topics/orders", {"action": "pause"}),
            ("POST", "/api/topics/orders/archive", {"action": "pause"}),
            ("DELETE", "/api/topics/orders/archive", None),
            ("DELETE", "/api/topics/orders", None),
            ("DELETE", f"/api/nodes/{cluster.nsqds[0].http_addr_str}", {"topic": "orders"}),
        ]
        for headers in ({}, {"X-Auth-User": "bob"}, {"X-Forwarded-User": "alice"}):
            for method, path, doc in actions:
                data = None if doc is None else json.dumps(doc).encode()
                status, _, body = await http.request(method, path, data=data, headers=headers)
                assert (status, json.loads(body)) == forbidden, (headers, path)
            # reads stay open, and the page says the user is not an admin
            assert (await http.json("/api/topics/orders"))["message"] == ""
            status, _, page = await http.get("/", headers=headers)
            assert b"var IS_ADMIN = false;" in page
        assert [t["paused"] for t in await topic_stats(cluster)] == [False, False]

        alice = {"X-Auth-User": "alice"}
        status, _, page = await http.get("/topics/orders", headers=alice)
        assert b"var IS_ADMIN = true;" in page
        status, body = await http.post_json("/api/topics/orders", {"action": "pause"}, headers=alice)
        assert (status, body) == (200, {"message": ""})
        assert [t["paused"] for t in await topic_stats(cluster)] == [True, True]


async def test_notifications(cluster):
    await orders(cluster)
    n0 = cluster.nsqds[0]
    async with (
        Recorder() as endpoint,
        running_admin(
            nsqlookupd_http_addresses=[cluster.lookupd_http],
            notification_http_endpoint=f"http://{endpoint.address}/notify?src=nsqadmin",
        ) as (admin, http),
    ):
        auth = "Basic " + base64.b64encode(b"ann:secret").decode()
        headers = {"Authorization": auth, "User-Agent": "ops-browser/2"}
        before = int(time.time())
        steps = [
            ("POST", "/api/topics", {"topic": "orders", "channel": "audit"}),
            ("POST", "/api/topics/orders/archive?from=ui", {"action": "pause"}),
            ("POST", "/api/topics/orders", {"action": "empty"}),
            ("DELETE", "/api/topics/orders/audit", None),
            ("DELETE", f"/api/nodes/{n0.http_addr_str}", {"topic": "orders"}),
            ("DELETE", "/api/topics/orders", None),
        ]
        for method, path, doc in steps:
            data = None if doc is None else json.dumps(doc).encode()
            status, _, body = await http.request(method, path, data=data, headers=headers)
            assert status == 200, (path, body)
        requests = await endpoint.wait_requests(7)
        after = int(time.time())
    host = f"127.0.0.1:{admin.http_port}"
    assert all(r["method"] == "POST" and r["path"] == "/notify" for r in requests)
    assert all(r["query"] == "src=nsqadmin" for r in requests)
    assert all(r["headers"]["Content-Type"] == "application/json" for r in requests)
    docs = [json.loads(r["body"]) for r in requests]
    assert [(d["action"], d["topic"], d.get("channel"), d.get("node")) for d in docs] == [
        ("create_topic", "orders", None, None),
        ("create_channel", "orders", "audit", None),
        ("pause_channel", "orders", "archive", None),
        ("empty_topic", "orders", None, None),
        ("delete_channel", "orders", "audit", None),
        ("tombstone_topic_producer", "orders", None, n0.http_addr_str),
        ("delete_topic", "orders", None, None),
    ]
    for d in docs:
        keys = [
            k
            for k in (
                "action",
                "topic",
                "channel",
                "node",
                "timestamp",
                "user",
                "remote_ip",
                "user_agent",
                "url",
                "via",
            )
            if k in d
        ]
        assert list(d) == keys
        assert before <= d["timestamp"] <= after
        assert d["user"] == "ann"
        assert d["remote_ip"].startswith("127.0.0.1:")
        assert d["user_agent"] == "ops-browser/2"
        assert d["via"] == socket.gethostname()
    assert docs[2]["url"] == f"http://{host}/api/topics/orders/archive?from=ui"
    assert docs[5]["url"] == f"http://{host}/api/nodes/{n0.http_addr_str}"


async def test_notification_failures_are_logged_not_fatal(cluster, caplog):
    await orders(cluster)
    async with Recorder() as endpoint:
        dead = endpoint.address
    async with running_admin(
        nsqlookupd_http_addresses=[cluster.lookupd_http],
        notification_http_endpoint=f"http://{dead}/",
    ) as (_, http):
        assert await http.post_json("/api/topics/orders", {"action": "pause"}) == (
            200,
            {"message": ""},
        )
        await wait_for(lambda: "failed to POST notification" in caplog.text)
        assert (await http.json("/api/topics/orders"))["paused"] is True
