"""Pure pieces of nsqadmin: Go's aggregation arithmetic (``clusterinfo/types.go``,
``quantile/aggregate.go``), the body decoder, the pattern router and the page rendering."""

from __future__ import annotations

import json
import logging

import pytest

from nsqpy.httpapi import PLAIN
from nsqpy.nsqadmin.http import decode_body, join_base, render_index
from nsqpy.nsqadmin.router import PatternRouter
from nsqpy.nsqadmin.types import ChannelStats, E2eAggregate, Producer, TopicStats, semver

pytestmark = pytest.mark.timeout(30)


def node_topic(node: str, hostname: str, depth: int, channels: dict[str, int]) -> TopicStats:
    t = TopicStats.from_json(
        {
            "topic_name": "t",
            "depth": depth,
            "backend_depth": 0,
            "message_count": depth,
            "paused": node == "b",
            "channels": [
                {
                    "channel_name": c,
                    "depth": d,
                    "message_count": d,
                    "clients": [],
                    "e2e_processing_latency": {"count": 0, "percentiles": None},
                }
                for c, d in channels.items()
            ],
            "e2e_processing_latency": {"count": 0, "percentiles": None},
        }
    )
    t.node = node
    t.hostname = hostname
    for c in t.channels or ():
        c.node, c.hostname, c.topic_name = node, hostname, "t"
    return t


def test_topic_add_is_gos():
    a = node_topic("a", "h2", 5, {"x": 1, "y": 2})
    b = node_topic("b", "h1", 7, {"y": 10, "z": 3})
    total = TopicStats("t")
    total.add(a)
    total.add(b)
    doc = total.to_json()
    assert (doc["node"], doc["depth"], doc["message_count"], doc["paused"]) == ("*", 12, 12, True)
    assert [n["node"] for n in doc["nodes"]] == ["b", "a"]  # sorted by hostname
    assert [(c["channel_name"], c["depth"]) for c in doc["channels"]] == [
        ("x", 1),
        ("y", 12),
        ("z", 3),
    ]
    # as in Go, the first node's channel object is the one the others were added to
    y = doc["channels"][1]
    assert y["node"] == "*" and [n["node"] for n in y["nodes"]] == ["b"]
    assert doc["nodes"][1]["channels"][1]["depth"] == 12
    assert doc["e2e_processing_latency"] == {
        "count": 0,
        "percentiles": None,
        "topic": "t",
        "channel": "",
        "host": "*",
    }
    # node a's empty client list (nsqd's []) stays []; a fresh sum of empty lists is Go's nil
    assert y["clients"] == []
    fresh = ChannelStats("a", "t", "y")
    fresh.add(b.channels[0])
    assert fresh.to_json()["clients"] is None


def test_e2e_add_is_gos():
    def node(count, values):
        return E2eAggregate.from_json(
            {"count": count, "percentiles": [{"quantile": q, "value": v} for q, v in values]}
        )

    a = node(3, [(0.99, 900.0), (0.5, 100.0)])
    b = node(1, [(0.99, 500.0), (1.0, 50.0)])
    agg = E2eAggregate("t", "c", "*")
    agg.add(a)
    agg.add(b)
    doc = agg.to_json()
    assert doc["count"] == 4 and doc["host"] == "*"
    assert doc["percentiles"] == [
        {"average": 800, "count": 4, "max": 900, "min": 0, "quantile": 0.99},
        {"average": 100, "count": 3, "max": 100, "min": 0, "quantile": 0.5},
        {"average": 50, "count": 1, "max": 50, "min": 0, "quantile": 1},
    ]
    assert json.dumps(doc["percentiles"][0]) == (
        '{"average": 800, "count": 4, "max": 900, "min": 0, "quantile": 0.99}'
    )


def test_channel_add_sums_and_sorts_clients():
    def channel(node, host, clients):
        c = ChannelStats.from_json(
            {
                "channel_name": "c",
                "depth": 1,
                "in_flight_count": 2,
                "client_count": len(clients),
                "clients": [{"hostname": h, "connect_ts": 0} for h in clients],
            }
        )
        c.node, c.hostname = node, host
        for cl in c.clients or ():
            cl.node = node
        return c

    total = ChannelStats("a", "t", "c")
    total.add(channel("a", "hb", ["w2", "w9"]))
    total.add(channel("b", "ha", ["w1"]))
    doc = total.to_json()
    assert (doc["depth"], doc["in_flight_count"], doc["client_count"]) == (2, 4, 3)
    assert [c["hostname"] for c in doc["clients"]] == ["w1", "w2", "w9"]
    assert [n["hostname"] for n in doc["nodes"]] == ["ha", "hb"]


def test_producer_and_semver():
    p = Producer.from_lookupd_json(
        {
            "remote_address": "10.0.0.1:5555",
            "hostname": "h",
            "broadcast_address": "::1",
            "tcp_port": 4150,
            "http_port": 4151,
            "version": "1.2.1",
            "topics": ["b", "a"],
            "tombstones": [False, True],
        }
    )
    assert p.http_address() == "[::1]:4151" and p.tcp_address() == "[::1]:4150"
    assert [(t.topic, t.tombstoned) for t in p.topics] == [("b", False), ("a", True)]
    assert semver("1.3.0") > semver("1.3.0-rc.1") > semver("1.2.10") > semver("1.2.9")
    assert semver("garbage") == semver("0.0.0")
    assert Producer().address() == "N/A"


def test_decode_body_is_gos_decoder():
    fields = ("topic", "channel")
    assert decode_body(b' {"Topic": "t", "extra": 1} junk', fields) == {"topic": "t", "channel": ""}
    assert decode_body(b'{"topic": null}', fields) == {"topic": "", "channel": ""}
    for data, message in (
        (b"", "EOF"),
        (b"  \n", "EOF"),
        (
            b"[1]",
            "json: cannot unmarshal array into Go value of type struct { Topic string "
            '"json:\\"topic\\""; Channel string "json:\\"channel\\"" }',
        ),
        (b'{"channel": true}', "json: cannot unmarshal bool into Go struct field .channel of type string"),
        (b"{'topic': 1}", "invalid character '\\'' looking for beginning of object key string"),
    ):
        with pytest.raises(ValueError) as e:
            decode_body(data, fields)
        assert str(e.value) == message


async def _h(request, params):
    return params


def test_pattern_router():
    r = PatternRouter(logging.getLogger("test"))
    r.route("GET", "/api/topics", _h)
    r.route("GET", "/api/topics/:topic", _h)
    r.route("GET", "/api/topics/:topic/:channel", _h)
    r.route("DELETE", "/api/topics/:topic/:channel", _h)
    r.route("GET", "/static/*asset", _h, PLAIN)
    table, params = r._lookup("/api/topics/t/c")
    assert set(table) == {"GET", "DELETE"} and params == {"topic": "t", "channel": "c"}
    assert r._lookup("/api/topics/t")[1] == {"topic": "t"}
    assert r._lookup("/api/topics//c") == (None, {})
    assert r._lookup("/static/js/app.js")[1] == {"asset": "js/app.js"}
    assert r._lookup("/static/") == (None, {})
    assert r._allowed("/api/topics/t/c", "PUT") == "DELETE, GET, OPTIONS"
    assert r._fixed_path("/API/Topics/MyTopic", "GET") == "/api/topics/MyTopic"
    assert r._fixed_path("/api/topics/t/", "GET") == "/api/topics/t"
    assert r._fixed_path("/STATIC/a/B.js", "GET") == "/static/a/B.js"


def test_join_base_and_render_index():
    assert join_base("/", "/") == "/"
    assert join_base("/admin", "/") == "/admin"
    assert join_base("/admin", "/static/x.js") == "/admin/static/x.js"
    values = {
        "version": "1.3.0",
        "base_path": "/nsq",
        "is_admin": False,
        "user": "",
        "proxy_graphite": False,
        "graph_enabled": True,
        "graphite_url": "http://g'<x>",
        "page_graphite_url": "http://g'<x>",
        "statsd_interval": 60,
        "statsd_counter_format": "c.%s",
        "statsd_gauge_format": "g.%s",
        "statsd_prefix": "p",
        "nsqlookupd": ["a:1"],
        "nsqd": [],
        "series": {"enabled": True},
    }
    html = render_index(
        '<html><head><link href="{{basePath "/static/a.css"}}"></head>'
        "<body>{{.Version}} {{.IsAdmin}} {{.GraphiteURL}}</body></html>",
        values,
        "/nsq",
    )
    assert '<link href="/nsq/static/a.css">' in html
    assert "<body>1.3.0 false http://g\\u0027\\u003cx\\u003e</body>" in html
    head = html.split("</head>")[0]
    assert "var IS_ADMIN = false;" in head and "var BASE_PATH = '/nsq';" in head
    assert "var GRAPHITE_URL = 'http://g\\u0027\\u003cx\\u003e';" in head
    config = json.loads(head.split("var NSQADMIN = ", 1)[1].split(";</script>")[0])
    assert config == values
