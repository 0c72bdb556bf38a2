"""nsqadmin's read API against our nsqlookupd and two nsqd, in-process: /api/topics,
/api/topics/:topic, /api/topics/:topic/:channel, /api/nodes, /api/nodes/:node, /api/counter,
checked against what each nsqd's /stats says (NSQ 1.3.0 ``nsqadmin/http.go`` and
``internal/clusterinfo``)."""

from __future__ import annotations

import json
import time

import aiohttp
import pytest
from admin_helpers import JSON_CT, V1, Cluster, cluster_fixture, running_admin  # noqa: F401
from support import RawClient, wait_for

from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(60)

TOPIC_KEYS = [
    "node",
    "hostname",
    "topic_name",
    "depth",
    "memory_depth",
    "backend_depth",
    "message_count",
    "nodes",
    "channels",
    "paused",
    "e2e_processing_latency",
]
CHANNEL_KEYS = [
    "node",
    "hostname",
    "topic_name",
    "channel_name",
    "depth",
    "memory_depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "requeue_count",
    "timeout_count",
    "message_count",
    "client_count",
    "nodes",
    "clients",
    "paused",
    "e2e_processing_latency",
]
CLIENT_KEYS = [
    "node",
    "remote_address",
    "version",
    "client_id",
    "hostname",
    "user_agent",
    "connect_ts",
    "connected",
    "in_flight_count",
    "ready_count",
    "finish_count",
    "requeue_count",
    "message_count",
    "sample_rate",
    "deflate",
    "snappy",
    "authed",
    "auth_identity",
    "auth_identity_url",
    "tls",
    "tls_cipher_suite",
    "tls_version",
    "tls_negotiated_protocol",
    "tls_negotiated_protocol_is_mutual",
]
PRODUCER_KEYS = [
    "remote_addresses",
    "remote_address",
    "hostname",
    "broadcast_address",
    "tcp_port",
    "http_port",
    "version",
    "topics",
    "out_of_date",
]
E2E_KEYS = ["count", "percentiles", "topic", "channel", "host"]


async def setup_orders(cluster: Cluster, counts=(3, 2)) -> None:
    """Topic ``orders`` with channel ``archive`` on both nsqd, ``counts`` messages each."""
    for nsqd, n in zip(cluster.nsqds, counts, strict=True):
        nsqd.get_topic("orders").get_channel("archive")
        await cluster.publish(nsqd, "orders", [b"m%d" % i for i in range(n)])
    await cluster.registered("orders", len(cluster.nsqds))


async def test_topics_topic_channel_nodes_counter(cluster):
    await setup_orders(cluster)
    n0, n1 = cluster.nsqds
    addrs = sorted([n0.http_addr_str, n1.http_addr_str])
    consumer = await RawClient.connect(n0.tcp_port)
    try:
        await consumer.identify(hostname="worker-1", user_agent="test-agent/1.0")
        await consumer.sub("orders", "archive", rdy=1)
        await consumer.read_message()  # one message in flight on nsqd 0
        async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http]) as (_, http):
            status, headers, body = await http.get("/api/topics")
            assert status == 200
            assert headers["X-NSQ-Content-Type"] == V1
            assert headers["Content-Type"] == JSON_CT
            assert json.loads(body) == {"topics": ["orders"], "message": ""}

            # the topic: totals, one row per nsqd, channels summed across nodes
            topic = await http.json("/api/topics/orders")
            assert list(topic) == [*TOPIC_KEYS, "message"]
            assert topic["node"] == "*" and topic["hostname"] == ""
            assert topic["topic_name"] == "orders"
            assert topic["message_count"] == 5
            assert topic["message"] == ""
            assert sorted(n["node"] for n in topic["nodes"]) == addrs
            for row in topic["nodes"]:
                assert list(row) == TOPIC_KEYS
                stats = await cluster.nsqd_stats(n0 if row["node"] == n0.http_addr_str else n1)
                [raw] = stats["topics"]
                assert row["message_count"] == raw["message_count"]
                assert row["depth"] == raw["depth"]
                assert row["memory_depth"] == raw["depth"] - raw["backend_depth"]
                assert row["nodes"] is None
            [archive] = topic["channels"]
            assert list(archive) == CHANNEL_KEYS
            assert archive["channel_name"] == "archive"
            assert archive["message_count"] == 5
            assert archive["in_flight_count"] == 1
            assert archive["depth"] == 4
            assert archive["client_count"] == 1
            assert list(topic["e2e_processing_latency"]) == E2E_KEYS
            assert topic["e2e_processing_latency"]["host"] == "*"

            # the channel: totals, per-node rows and every client
            channel = await http.json("/api/topics/orders/archive")
            assert list(channel) == [*CHANNEL_KEYS, "message"]
            assert channel["node"] == "*"
            assert (channel["depth"], channel["in_flight_count"], channel["message_count"]) == (
                4,
                1,
                5,
            )
            assert sorted(n["node"] for n in channel["nodes"]) == addrs
            by_node = {n["node"]: n for n in channel["nodes"]}
            assert by_node[n0.http_addr_str]["in_flight_count"] == 1
            assert by_node[n1.http_addr_str]["depth"] == 2
            [client] = channel["clients"]
            assert list(client) == CLIENT_KEYS
            assert client["node"] == n0.http_addr_str
            assert client["hostname"] == "worker-1"
            assert client["user_agent"] == "test-agent/1.0"
            assert client["in_flight_count"] == 1 and client["ready_count"] == 1
            assert client["version"] == "V2"
            assert abs(client["connected"] / 1e9 - (time.time() - client["connect_ts"])) < 3
            e2e = channel["e2e_processing_latency"]
            assert (e2e["topic"], e2e["channel"], e2e["host"]) == ("orders", "archive", "*")

            # a channel no nsqd has: Go's nil embedded struct, only the message
            assert await http.json("/api/topics/orders/nosuch") == {"message": ""}

            nodes = await http.json("/api/nodes")
            assert nodes["message"] == ""
            assert sorted(f"127.0.0.1:{n['http_port']}" for n in nodes["nodes"]) == addrs
            for node in nodes["nodes"]:
                assert list(node) == PRODUCER_KEYS
                assert node["broadcast_address"] == "127.0.0.1"
                assert node["version"] == "1.3.0"
                assert node["out_of_date"] is False
                assert node["topics"] == [{"topic": "orders", "tombstoned": False}]
                [remote] = node["remote_addresses"]
                assert remote == f"{cluster.lookupd_http}/{node['remote_address']}"

            node = await http.json(f"/api/nodes/{n0.http_addr_str}")
            assert list(node) == ["node", "topics", "total_messages", "total_clients", "message"]
            assert node["node"] == n0.http_addr_str
            assert node["total_messages"] == 3
            assert node["total_clients"] == 1
            [ntopic] = node["topics"]
            assert ntopic["node"] == n0.http_addr_str
            assert ntopic["channels"][0]["clients"][0]["hostname"] == "worker-1"

            assert await http.json("/api/nodes/127.0.0.1:1", 404) == {"message": "NODE_NOT_FOUND"}

            counter = await http.json("/api/counter")
            assert counter == {
                "stats": {
                    f"orders:archive:{n.http_addr_str}": {
                        "node": n.http_addr_str,
                        "topic_name": "orders",
                        "channel_name": "archive",
                        "message_count": count,
                    }
                    for n, count in sorted(
                        [(n0, 3), (n1, 2)], key=lambda x: f"orders:archive:{x[0].http_addr_str}"
                    )
                },
                "message": "",
            }
    finally:
        await consumer.close()


async def test_e2e_percentiles_merged_across_nodes(tmp_path):
    async with Cluster(tmp_path, e2e_processing_latency_percentiles=[0.99, 0.5]) as cluster:
        await setup_orders(cluster, counts=(4, 2))
        for nsqd, n in zip(cluster.nsqds, (4, 2), strict=True):
            c = await RawClient.connect(nsqd.tcp_port)
            await c.sub("orders", "archive", rdy=10)
            for msg in await c.read_messages(n):
                c.send(commands.fin(msg.id))

            async def finished(nsqd=nsqd, n=n):
                stats = await cluster.nsqd_stats(nsqd, "orders")
                ch = stats["topics"][0]["channels"][0]
                return ch["e2e_processing_latency"]["count"] == n and ch["in_flight_count"] == 0

            await wait_for(finished)
            await c.close()
        raw = {}
        for nsqd in cluster.nsqds:
            stats = await cluster.nsqd_stats(nsqd, "orders")
            raw[nsqd.http_addr_str] = stats["topics"][0]["channels"][0]["e2e_processing_latency"]
        async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http]) as (_, http):
            channel = await http.json("/api/topics/orders/archive")
    e2e = channel["e2e_processing_latency"]
    assert e2e["count"] == 6
    assert [p["quantile"] for p in e2e["percentiles"]] == [0.99, 0.5]
    for i, p in enumerate(e2e["percentiles"]):
        assert list(p) == ["average", "count", "max", "min", "quantile"]
        values = [(r["percentiles"][i]["value"], r["count"]) for r in raw.values()]
        assert p["count"] == 6
        assert p["max"] == max(v for v, _ in values)
        assert p["min"] == 0  # Go starts a merged quantile from zeros
        assert p["average"] == pytest.approx(sum(v * c for v, c in values) / 6, rel=1e-9)
    # a node's own row keeps nsqd's value, with min = max = average = value
    for row in channel["nodes"]:
        r = raw[row["node"]]
        for mine, theirs in zip(row["e2e_processing_latency"]["percentiles"], r["percentiles"], strict=True):
            assert mine == {
                "average": theirs["value"],
                "count": r["count"],
                "max": theirs["value"],
                "min": theirs["value"],
                "quantile": theirs["quantile"],
                "value": theirs["value"],
            }


async def test_inactive_topics_and_empty_cluster(cluster):
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http]) as (_, http):
        # nothing registered: Go's nil slices are null
        assert await http.json("/api/topics") == {"topics": None, "message": ""}
        assert await http.json("/api/topics?inactive=true") == {"topics": {}, "message": ""}
        # no producer for the counter: Go's "failed to query any nsqd" with no error after it
        nodes = await http.json("/api/nodes")
        assert len(nodes["nodes"]) == 2  # the nsqd are registered even without topics
        async with aiohttp.ClientSession() as s:
            url = f"http://{cluster.lookupd_http}"
            async with s.post(f"{url}/topic/create?topic=dormant") as r:
                assert r.status == 200
            async with s.post(f"{url}/channel/create?topic=dormant&channel=later") as r:
                assert r.status == 200
        assert await http.json("/api/topics?inactive=true") == {
            "topics": {"dormant": ["later"]},
            "message": "",
        }
        # a topic lookupd knows without producers: no nsqd to ask is Go's upstream error
        status, _, body = await http.get("/api/topics/dormant")
        assert (status, json.loads(body)) == (
            502,
            {"message": "UPSTREAM_ERROR: failed to query any nsqd: "},
        )


async def test_nsqd_mode(cluster):
    await setup_orders(cluster)
    n0, n1 = cluster.nsqds
    async with running_admin(nsqd_http_addresses=[n0.http_addr_str, n1.http_addr_str]) as (
        _,
        http,
    ):
        assert await http.json("/api/topics") == {"topics": ["orders"], "message": ""}
        nodes = (await http.json("/api/nodes"))["nodes"]
        assert sorted(f"127.0.0.1:{n['http_port']}" for n in nodes) == sorted(
            [n0.http_addr_str, n1.http_addr_str]
        )
        for node in nodes:
            assert list(node) == PRODUCER_KEYS
            assert node["remote_addresses"] is None and node["remote_address"] == ""
            assert node["topics"] == [{"topic": "orders", "tombstoned": False}]
        topic = await http.json("/api/topics/orders")
        assert topic["message_count"] == 5 and len(topic["nodes"]) == 2
        channel = await http.json("/api/topics/orders/archive")
        assert channel["depth"] == 5
        node = await http.json(f"/api/nodes/{n1.http_addr_str}")
        assert node["total_messages"] == 2


async def test_pages_static_files_and_routing(cluster, tmp_path):
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http]) as (_, http):
        for path in ("/", "/topics", "/topics/t", "/topics/t/c", "/nodes", "/nodes/n", "/counter", "/lookup"):
            status, headers, body = await http.get(path)
            assert status == 200, path
            assert headers["Content-Type"] == "text/html"
            page = body.decode()
            assert "var IS_ADMIN = true;" in page
            assert "var BASE_PATH = '/';" in page
            assert f'var NSQLOOKUPD = ["{cluster.lookupd_http}"];' in page
            assert "{{" not in page
        status, headers, body = await http.get("/ping")
        assert (status, body) == (200, b"OK")
        status, headers, body = await http.get("/static/index.html")
        assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
        assert b"<html" in body
        for missing in ("/static/nope.js", "/static/..%2Fhttp.py", "/fonts/.hidden"):
            status, headers, body = await http.get(missing)
            assert (status, body) == (404, b"NOT_FOUND"), missing
        # the router: JSON 404/405, trailing-slash redirect, gzip
        assert await http.json("/api/nope", 404) == {"message": "NOT_FOUND"}
        status, headers, body = await http.put("/api/topics")
        assert (status, json.loads(body)) == (405, {"message": "METHOD_NOT_ALLOWED"})
        assert headers["Allow"] == "GET, POST, OPTIONS"
        status, headers, _ = await http.get("/api/topics/")
        assert (status, headers["Location"]) == (301, "/api/topics")
        status, headers, body = await http.get("/api/topics", headers={"Accept-Encoding": "gzip"})
        assert status == 200 and headers["Content-Encoding"] == "gzip"
        assert json.loads(body)["message"] == ""

    dev = tmp_path / "dev"
    (dev / "js").mkdir(parents=True)
    (dev / "index.html").write_text(
        '<html><head></head><body><script src="{{basePath "/static/js/app.js"}}"></script></body></html>'
    )
    (dev / "js" / "app.js").write_text("console.log(1)")
    async with running_admin(nsqlookupd_http_addresses=[cluster.lookupd_http], dev_static_dir=str(dev)) as (
        _,
        http,
    ):
        status, headers, body = await http.get("/static/js/app.js")
        assert (status, body) == (200, b"console.log(1)")
        assert headers["Content-Type"] == "text/javascript; charset=utf-8"
        status, _, body = await http.get("/")
        page = body.decode()
        assert '<script src="/static/js/app.js">' in page
        assert page.index("var NSQADMIN = ") < page.index("</head>")
        config = json.loads(page.split("var NSQADMIN = ", 1)[1].split(";</script>", 1)[0])
        assert config["is_admin"] is True
        assert config["series"] == {"enabled": False, "interval": 0, "retention": 3600}
