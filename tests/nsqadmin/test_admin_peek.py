"""Messages through nsqadmin (an nsqpy addition): /api/peek/topics/:topic[/:channel] reads
each nsqd's peek of a topic's backlog or a channel (queued, deferred, in flight) labelled by
node, or the node's error; admins requeue or remove one message on one nsqd and redrive a
topic's backlog (or a channel's queue) to another topic on every nsqd, each announced."""

from __future__ import annotations

import base64
import json
import os

import aiohttp
import pytest
from admin_helpers import Cluster, Recorder, cluster_fixture, running_admin  # noqa: F401
from aiohttp import web
from support import RawClient

from nsqpy.nsqadmin.httpclient import HTTPClientError

pytestmark = pytest.mark.timeout(60)


async def nsqd_call(nsqd, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, f"http://{nsqd.http_addr_str}{path}", data=body) as r,
    ):
        return r.status, await r.read()


async def nsqd_peek(nsqd, topic: str, channel: str = "") -> dict:
    path = f"/channel/peek?topic={topic}&channel={channel}" if channel else f"/topic/peek?topic={topic}"
    status, body = await nsqd_call(nsqd, "GET", path + "&n=100")
    assert status == 200, body
    return json.loads(body)


async def publish(nsqd, topic: str, body: bytes, defer_ms: int = 0) -> None:
    q = f"&defer={defer_ms}" if defer_ms else ""
    status, text = await nsqd_call(nsqd, "POST", f"/pub?topic={topic}{q}", body)
    assert status == 200, text


async def orders(cluster: Cluster, channel_on: tuple[int, ...] = (0, 1), topic: str = "orders") -> None:
    for i, nsqd in enumerate(cluster.nsqds):
        t = nsqd.get_topic(topic)
        if i in channel_on:
            t.get_channel("archive")
    await cluster.registered(topic, len(cluster.nsqds))


def by_node(doc: dict) -> dict[str, dict]:
    return {n["node"]: n for n in doc["nodes"]}


async def test_peek_across_nodes(cluster):
    await orders(cluster)
    n0, n1 = cluster.nsqds
    await publish(n0, "orders", b'{"sku": "A1", "qty": 2}')
    await publish(n0, "orders", b"<script>alert(1)</script>")
    await publish(n0, "orders", b"later", defer_ms=60_000)
    await publish(n1, "orders", b"flying")
    await publish(n1, "orders", b"\x00\xffbinary")
    consumer = await RawClient.connect(n1.tcp_port)
    try:
        await consumer.identify(client_id="worker-7")
        await consumer.sub("orders", "archive", rdy=1)
        flying = await consumer.read_message()  # the oldest on nsqd 1 is in flight
        async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http]) as (_, http):
            doc = await http.json("/api/peek/topics/orders/archive")
            assert doc["message"] == ""
            nodes = by_node(doc)
            assert sorted(nodes) == sorted(n.http_addr_str for n in cluster.nsqds)
            assert all(n["hostname"] and "error" not in n for n in nodes.values())

            p0 = nodes[n0.http_addr_str]["peek"]
            assert (p0["topic"], p0["channel"], p0["depth"]) == ("orders", "archive", 2)
            assert p0["deferred_count"] == 1
            assert [base64.b64decode(m["body_base64"]) for m in p0["messages"]] == [
                b'{"sku": "A1", "qty": 2}',
                b"<script>alert(1)</script>",
            ]
            assert p0["messages"][1]["body_preview"] == "<script>alert(1)</script>"
            assert all(
                len(m["id"]) == 16 and m["attempts"] == 0 and m["timestamp"] > 0 for m in p0["messages"]
            )
            [later] = p0["deferred"]
            assert later["body_preview"] == "later" and 0 < later["due_in_ms"] <= 60_000
            assert later["due"] > later["timestamp"]
            assert p0["in_flight"] == []

            p1 = nodes[n1.http_addr_str]["peek"]
            assert p1["in_flight_count"] == 1
            [queued] = p1["messages"]
            assert base64.b64decode(queued["body_base64"]) == b"\x00\xffbinary"
            assert queued["body_preview"] == "\x00\ufffdbinary"
            [inflight] = p1["in_flight"]
            assert inflight["id"] == flying.id.decode()
            assert inflight["client_id"] == "worker-7" and inflight["attempts"] == 1
            assert inflight["remote_address"].startswith("127.0.0.1:")
            assert 0 < inflight["timeout_ms"] <= 60_000 and inflight["deadline"] > 0

            # ?n= bounds each node's lists; nothing was consumed by any of this
            doc = await http.json("/api/peek/topics/orders/archive?n=1")
            assert [len(n["peek"]["messages"]) for n in doc["nodes"]] == [1, 1]
            for bad in ("0", "1001", "x", "-1", "%C2%B2", "1e2"):
                assert await http.json(f"/api/peek/topics/orders/archive?n={bad}", 400) == {
                    "message": "INVALID_N"
                }
            assert (await nsqd_peek(n0, "orders", "archive"))["depth"] == 2
    finally:
        await consumer.close()


async def test_peek_a_topics_backlog(cluster):
    """A topic without channels holds what is published: its peek shows that, a DPUB'd one
    with its delay (it starts when a channel takes the message)."""
    for nsqd in cluster.nsqds:
        nsqd.get_topic("held")
    await cluster.registered("held", 2)
    n0, n1 = cluster.nsqds
    await cluster.publish(n0, "held", [b"one", b"two"])
    await publish(n1, "held", b"soon", defer_ms=5_000)
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http]) as (_, http):
        nodes = by_node(await http.json("/api/peek/topics/held?n=50"))
        p0 = nodes[n0.http_addr_str]["peek"]
        assert [m["body_preview"] for m in p0["messages"]] == ["one", "two"]
        assert p0["depth"] == 2 and "channel" not in p0
        p1 = nodes[n1.http_addr_str]["peek"]
        assert p1["messages"] == []
        [soon] = p1["deferred"]
        assert soon["body_preview"] == "soon" and soon["delay_ms"] == 5_000


async def test_node_errors(cluster, tmp_path):
    """A node without the channel, one that wants an admin token, one that refuses bodies
    (AUTH and no token), and a Go nsqd (no peek at all) each show their own error."""
    await orders(cluster, channel_on=(0,))
    n0, n1 = cluster.nsqds
    await publish(n0, "orders", b"hello")
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http]) as (_, http):
        doc = await http.json("/api/peek/topics/orders/archive")
        nodes = by_node(doc)
        assert nodes[n1.http_addr_str]["error"] == "CHANNEL_NOT_FOUND"
        assert "peek" not in nodes[n1.http_addr_str]
        assert nodes[n0.http_addr_str]["peek"]["messages"][0]["body_preview"] == "hello"
        assert doc["message"] == f"WARNING: failed on {n1.http_addr_str}: CHANNEL_NOT_FOUND"
        # an unknown topic: no nsqd to ask
        status, _, body = await http.get("/api/peek/topics/ghost")
        assert status == 502 and json.loads(body)["message"].startswith("UPSTREAM_ERROR: failed to query any")

    tokens = tmp_path / "tokens"
    tokens.write_text("s3cret\n")
    os.chmod(tokens, 0o600)
    cluster.nsqd_options = {"admin_token_file": str(tokens)}
    locked = await cluster.add_nsqd(2)
    cluster.nsqd_options = {"auth_http_addresses": ["127.0.0.1:1"]}
    gated = await cluster.add_nsqd(3)
    for nsqd in (locked, gated):
        nsqd.get_topic("orders").get_channel("archive")
    await cluster.registered("orders", 4)
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http]) as (_, http):
        nodes = by_node(await http.json("/api/peek/topics/orders/archive"))
        assert nodes[locked.http_addr_str]["error"] == (
            "UNAUTHORIZED (this nsqd wants an admin token: check nsqadmin's --admin-token-file)"
        )
        assert nodes[gated.http_addr_str]["error"] == (
            "FORBIDDEN (this nsqd refuses nsqadmin: a token it does not list (check nsqadmin's "
            "--admin-token-file), or no token where it shows no message bodies without one)"
        )
        assert "peek" in nodes[n0.http_addr_str]
        status, doc = await http.post_json(
            "/api/peek/topics/orders/archive",
            {"action": "remove", "node": locked.http_addr_str, "id": "0" * 16},
        )
        assert status == 200 and doc["nodes"][0]["error"].startswith("UNAUTHORIZED (")

    # a Go nsqd (here a stand-in answering /info and /stats) has no peek: 404 NOT_FOUND
    go_stats = {"version": "1.3.0", "health": "OK", "start_time": 0, "topics": [{"topic_name": "orders"}]}
    go_info = {"version": "1.3.0", "broadcast_address": "127.0.0.1", "hostname": "gohost", "http_port": 0}
    async with Recorder() as go:

        def answer(request: web.Request) -> web.Response:
            if request.path == "/stats":
                return web.json_response(go_stats)
            if request.path == "/info":
                return web.json_response({**go_info, "http_port": go.port, "tcp_port": go.port})
            return web.json_response({"message": "NOT_FOUND"}, status=404)

        go.answer = answer
        async with running_admin(nsqd_http_addresses=[n0.http_addr_str, go.address]) as (_, http):
            nodes = by_node(await http.json("/api/peek/topics/orders/archive"))
            no_api = "NOT_FOUND (this nsqd has no message API: a Go nsqd, or an older nsqpy)"
            assert nodes[go.address]["error"] == no_api
            assert nodes[go.address]["hostname"] == "gohost"
            assert nodes[n0.http_addr_str]["peek"]["depth"] == 1


async def test_requeue_and_remove(cluster):
    await orders(cluster)
    n0, n1 = cluster.nsqds
    await publish(n0, "orders", b"keep")
    await publish(n0, "orders", b"drop me")
    await publish(n0, "orders", b"wait", defer_ms=600_000)
    await publish(n1, "orders", b"other node")
    async with (
        Recorder() as endpoint,
        running_admin(
            nsqlookupd_http_addresses=[cluster.lookupd_http],
            notification_http_endpoint=f"http://{endpoint.address}/",
        ) as (_, http),
    ):
        p0 = by_node(await http.json("/api/peek/topics/orders/archive"))[n0.http_addr_str]["peek"]
        keep, drop = p0["messages"]
        [wait] = p0["deferred"]
        node = n0.http_addr_str
        api = "/api/peek/topics/orders/archive"

        status, doc = await http.post_json(api, {"action": "remove", "node": node, "id": drop["id"]})
        assert (status, doc) == (
            200,
            {"nodes": [{"node": node, "hostname": doc["nodes"][0]["hostname"], "done": True}], "message": ""},
        )
        status, doc = await http.post_json(api, {"action": "requeue", "node": node, "id": wait["id"]})
        assert status == 200 and doc["nodes"][0]["done"] is True
        after = await nsqd_peek(n0, "orders", "archive")
        assert [m["body_preview"] for m in after["messages"]] == ["keep", "wait"]
        assert after["deferred"] == [] and after["depth"] == 2
        assert (await nsqd_peek(n1, "orders", "archive"))["depth"] == 1  # the other node: untouched

        # nsqd's refusals are the node's error; the answer warns
        status, doc = await http.post_json(api, {"action": "requeue", "node": node, "id": keep["id"]})
        assert status == 200 and doc["nodes"][0]["error"] == "MESSAGE_NOT_DEFERRED"
        assert doc["message"] == f"WARNING: failed on {node}: MESSAGE_NOT_DEFERRED"
        status, doc = await http.post_json(api, {"action": "remove", "node": node, "id": drop["id"]})
        assert doc["nodes"][0]["error"] == "MESSAGE_NOT_FOUND"
        consumer = await RawClient.connect(n0.tcp_port)
        try:
            await consumer.sub("orders", "archive", rdy=1)
            flying = await consumer.read_message()
            status, doc = await http.post_json(
                api, {"action": "remove", "node": node, "id": flying.id.decode()}
            )
            assert doc["nodes"][0]["error"] == "MESSAGE_IN_FLIGHT"
        finally:
            await consumer.close()
        # a node that does not have the topic is not asked
        status, doc = await http.post_json(api, {"action": "remove", "node": "127.0.0.1:1", "id": keep["id"]})
        assert (status, doc) == (404, {"message": "NODE_NOT_FOUND"})

        notes = [json.loads(r["body"]) for r in await endpoint.wait_requests(5)]
        assert [(d["action"], d["topic"], d["channel"], d["node"]) for d in notes] == [
            ("remove_message", "orders", "archive", node),
            ("requeue_message", "orders", "archive", node),
            ("requeue_message", "orders", "archive", node),
            ("remove_message", "orders", "archive", node),
            ("remove_message", "orders", "archive", node),
        ]


async def test_redrive(cluster):
    for nsqd in cluster.nsqds:
        nsqd.get_topic("orders_dlq")
        nsqd.get_topic("orders").get_channel("archive")
    await cluster.registered("orders_dlq", 2)
    n0, n1 = cluster.nsqds
    await cluster.publish(n0, "orders_dlq", [b"a", b"b", b"c"])
    await cluster.publish(n1, "orders_dlq", [b"d", b"e"])
    async with (
        Recorder() as endpoint,
        running_admin(
            nsqlookupd_http_addresses=[cluster.lookupd_http],
            notification_http_endpoint=f"http://{endpoint.address}/",
        ) as (_, http),
    ):
        api = "/api/peek/topics/orders_dlq"
        # at most n in all: the nodes in turn
        status, doc = await http.post_json(api, {"action": "redrive", "destination": "orders", "n": 4})
        assert status == 200 and doc["message"] == "" and doc["moved"] == 4
        moved = {n["node"]: n["moved"] for n in doc["nodes"]}
        assert sorted(moved) == sorted(n.http_addr_str for n in cluster.nsqds)
        first = doc["nodes"][0]["node"]
        assert moved[first] == (3 if first == n0.http_addr_str else 2)
        # the rest (n: null is all of it)
        status, doc = await http.post_json(api, {"action": "redrive", "destination": "orders", "n": None})
        assert status == 200 and doc["moved"] == 1
        archived = [await nsqd_peek(n, "orders", "archive") for n in cluster.nsqds]
        assert sorted(m["body_preview"] for p in archived for m in p["messages"]) == ["a", "b", "c", "d", "e"]
        assert [(await nsqd_peek(n, "orders_dlq"))["depth"] for n in cluster.nsqds] == [0, 0]

        # a channel's queue; the same topic is a fine destination then
        status, doc = await http.post_json(
            "/api/peek/topics/orders",
            {"action": "redrive", "destination": "orders_dlq", "channel": "archive"},
        )
        assert status == 200 and doc["moved"] == 5
        assert [(await nsqd_peek(n, "orders", "archive"))["depth"] for n in cluster.nsqds] == [0, 0]
        assert [(await nsqd_peek(n, "orders_dlq"))["depth"] for n in cluster.nsqds] == [3, 2]
        # a channel no node has: each node's error
        status, doc = await http.post_json(
            "/api/peek/topics/orders", {"action": "redrive", "destination": "x", "channel": "nope"}
        )
        assert status == 200 and doc["moved"] == 0
        assert [n["error"] for n in doc["nodes"]] == ["CHANNEL_NOT_FOUND", "CHANNEL_NOT_FOUND"]
        assert doc["message"].startswith("WARNING: failed on ")

        notes = [json.loads(r["body"]) for r in await endpoint.wait_requests(4)]
        assert [(d["action"], d["topic"], d.get("channel")) for d in notes] == [
            ("redrive_topic", "orders_dlq", None),
            ("redrive_topic", "orders_dlq", None),
            ("redrive_topic", "orders", "archive"),
            ("redrive_topic", "orders", "nope"),
        ]


async def test_only_admins_act(cluster):
    await orders(cluster)
    n0 = cluster.nsqds[0]
    await publish(n0, "orders", b"x")
    async with (
        Recorder() as endpoint,
        running_admin(
            nsqlookupd_http_addresses=[cluster.lookupd_http],
            admin_users=["alice"],
            acl_http_header="X-Auth-User",
            notification_http_endpoint=f"http://{endpoint.address}/",
        ) as (_, http),
    ):
        [msg] = (await nsqd_peek(n0, "orders", "archive"))["messages"]
        remove = {"action": "remove", "node": n0.http_addr_str, "id": msg["id"]}
        redrive = {"action": "redrive", "destination": "elsewhere"}
        alice = {"X-Auth-User": "alice"}
        status, _, body = await http.get("/api/peek/topics/orders/archive", headers=alice)
        assert status == 200 and len(json.loads(body)["nodes"]) == 2
        for headers in ({}, {"X-Auth-User": "bob"}):
            # bodies can be sensitive: only admins look
            status, _, body = await http.get("/api/peek/topics/orders/archive", headers=headers)
            assert (status, json.loads(body)) == (403, {"message": "FORBIDDEN"})
            for path, doc in (
                ("/api/peek/topics/orders/archive", remove),
                ("/api/peek/topics/orders", redrive),
            ):
                status, answer = await http.post_json(path, doc, headers=headers)
                assert (status, answer) == (403, {"message": "FORBIDDEN"})
        assert (await nsqd_peek(n0, "orders", "archive"))["depth"] == 1
        assert n0.get_existing_topic("elsewhere") is None
        status, doc = await http.post_json(
            "/api/peek/topics/orders/archive", remove, headers={"X-Auth-User": "alice"}
        )
        assert status == 200 and doc["nodes"][0]["done"] is True
        notes = await endpoint.wait_requests(1)
        assert [json.loads(r["body"])["action"] for r in notes] == ["remove_message"]


async def test_bad_input(cluster):
    await orders(cluster)
    node = cluster.nsqds[0].http_addr_str
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http]) as (_, http):
        channel_api, topic_api = "/api/peek/topics/orders/archive", "/api/peek/topics/orders"
        ok_id = "0123456789abcdef"
        for path in (channel_api, topic_api):
            for body in (b"", b"nope", b"[1]", b'"x"', b"{"):
                status, _, raw = await http.post(path, body)
                assert (status, json.loads(raw)) == (400, {"message": "INVALID_BODY"}), (path, body)
        cases = [
            (channel_api, {"action": "destroy", "node": node, "id": ok_id}, "INVALID_ACTION"),
            (channel_api, {"action": "redrive", "destination": "x"}, "INVALID_ACTION"),
            (channel_api, {"node": node, "id": ok_id}, "INVALID_ACTION"),
            (channel_api, {"action": "remove", "id": ok_id}, "MISSING_ARG_NODE"),
            (channel_api, {"action": "remove", "node": 7, "id": ok_id}, "INVALID_NODE"),
            (channel_api, {"action": "remove", "node": node}, "MISSING_ARG_ID"),
            (channel_api, {"action": "requeue", "node": node, "id": ""}, "MISSING_ARG_ID"),
            (channel_api, {"action": "requeue", "node": node, "id": "short"}, "INVALID_MESSAGE_ID"),
            (channel_api, {"action": "requeue", "node": node, "id": 12345}, "INVALID_MESSAGE_ID"),
            (topic_api, {"action": "remove", "node": node, "id": ok_id}, "INVALID_ACTION"),
            (topic_api, {"action": "redrive"}, "MISSING_ARG_DESTINATION"),
            (topic_api, {"action": "redrive", "destination": "bad topic!"}, "INVALID_DESTINATION"),
            (topic_api, {"action": "redrive", "destination": ["x"]}, "INVALID_DESTINATION"),
            (topic_api, {"action": "redrive", "destination": "x", "n": 0}, "INVALID_N"),
            (topic_api, {"action": "redrive", "destination": "x", "n": "5"}, "INVALID_N"),
            (topic_api, {"action": "redrive", "destination": "x", "n": True}, "INVALID_N"),
            (topic_api, {"action": "redrive", "destination": "x", "n": 2.5}, "INVALID_N"),
            (topic_api, {"action": "redrive", "destination": "x", "channel": "a b"}, "INVALID_CHANNEL"),
            (topic_api, {"action": "redrive", "destination": "x", "channel": 3}, "INVALID_CHANNEL"),
            (topic_api, {"action": "redrive", "destination": "orders"}, "DESTINATION_IS_TOPIC"),
        ]
        for path, doc, code in cases:
            status, answer = await http.post_json(path, doc)
            assert (status, answer) == (400, {"message": code}), (path, doc)
        # nothing reached an nsqd
        for nsqd in cluster.nsqds:
            assert nsqd.get_existing_topic("x") is None


async def test_a_403_without_https_port_is_not_retried():
    """The client retries a 403 on HTTPS for nsqd's TLS_REQUIRED only (its body names the
    https_port: test_admin_tls_timeouts); another 403 is the answer, as nsqd gave it."""
    async with Recorder() as fake:
        fake.answer = lambda r: web.json_response({"message": "FORBIDDEN"}, status=403)
        async with running_admin(nsqd_http_addresses=[fake.address]) as (admin, _):
            with pytest.raises(HTTPClientError) as e:
                await admin.client.get_v1(f"http://{fake.address}/topic/peek?topic=t")
            assert str(e.value) == 'got response 403 Forbidden "{\\"message\\": \\"FORBIDDEN\\"}"'
            assert e.value.message == "FORBIDDEN"
            assert len(fake.requests) == 1
