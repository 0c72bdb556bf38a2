"""nsqlookupd's HTTP API against an in-process daemon: every endpoint, its JSON shape,
errors, methods and redirects (NSQ 1.3.0 ``nsqlookupd/http.go``)."""

from __future__ import annotations

import json

import pytest
from lookupd_helpers import (  # noqa: F401  (fixtures)
    JSON_CT,
    V1,
    clients_fixture,
    err,
    http_fixture,
    lookupd_fixture,
)

pytestmark = pytest.mark.timeout(30)


async def registered(clients, topic, channel="", **fields):
    """A connected, identified producer that registered ``topic`` (and ``channel``)."""
    c = await clients()
    await c.identify(**fields)
    assert await c.register(topic, channel) == b"OK"
    return c


# --- basics -----------------------------------------------------------------------------------


async def test_ping(http):
    status, headers, body = await http.get("/ping")
    assert (status, body) == (200, b"OK")
    assert headers["Content-Type"].startswith("text/plain")
    assert "X-NSQ-Content-Type" not in headers


async def test_info(http):
    status, headers, body = await http.get("/info")
    assert (status, body) == (200, b'{"version":"1.3.0"}')
    assert headers["Content-Type"] == JSON_CT
    assert headers["X-NSQ-Content-Type"] == V1


async def test_empty_registry(http):
    assert await http.json("/topics") == {"topics": []}
    assert await http.json("/channels?topic=t") == {"channels": []}
    assert await http.json("/nodes") == {"producers": []}
    assert await http.json("/debug") == {}
    assert (await http.get("/lookup?topic=t"))[::2] == err(404, "TOPIC_NOT_FOUND")


# --- queries ----------------------------------------------------------------------------------


async def test_lookup(http, clients):
    a = await registered(clients, "t", "c1", broadcast_address="a", tcp_port=1, http_port=2)
    await registered(clients, "t", "c2", broadcast_address="b", hostname="hb")
    status, headers, body = await http.get("/lookup?topic=t")
    assert status == 200 and headers["X-NSQ-Content-Type"] == V1
    doc = json.loads(body)
    assert doc["channels"] == ["c1", "c2"]
    assert doc["producers"][0] == {
        "remote_address": a.local_address,
        "hostname": "nsqd-hostname",
        "broadcast_address": "a",
        "tcp_port": 1,
        "http_port": 2,
        "version": "1.3.0",
    }
    assert [p["broadcast_address"] for p in doc["producers"]] == ["a", "b"]
    assert list(json.loads(body)) == ["channels", "producers"]


@pytest.mark.parametrize("path", ["/lookup", "/channels"])
async def test_topic_parameter_errors(http, path):
    assert (await http.get(path))[::2] == err(400, "MISSING_ARG_TOPIC")
    assert (await http.get(path + "?channel=x"))[::2] == err(400, "MISSING_ARG_TOPIC")
    assert (await http.get(path + "?topic=%zz"))[::2] == err(400, "INVALID_REQUEST")
    assert (await http.get(path + "?topic=a;b"))[::2] == err(400, "INVALID_REQUEST")


async def test_lookup_of_an_empty_topic_name(http, lookupd):
    # Go only checks presence: "" is looked up (and never registered)
    assert (await http.get("/lookup?topic="))[::2] == err(404, "TOPIC_NOT_FOUND")
    assert await http.json("/channels?topic=") == {"channels": []}


async def test_topics_and_channels(http, clients):
    await registered(clients, "t", "c")
    await registered(clients, "u")
    assert await http.json("/topics") == {"topics": ["t", "u"]}
    assert await http.json("/channels?topic=t") == {"channels": ["c"]}
    assert await http.json("/channels?topic=u") == {"channels": []}
    assert await http.json("/channels?topic=t+x") == {"channels": []}  # + is a space


async def test_nodes(http, clients):
    a = await registered(clients, "t", "c", broadcast_address="a")
    await a.register("u")
    await registered(clients, "u", broadcast_address="b")
    idle = await clients()
    await idle.identify(broadcast_address="idle")
    doc = await http.json("/nodes")
    nodes = {n["broadcast_address"]: n for n in doc["producers"]}
    assert set(nodes) == {"a", "b", "idle"}
    assert nodes["a"] == {
        "remote_address": a.local_address,
        "hostname": "nsqd-hostname",
        "broadcast_address": "a",
        "tcp_port": 4150,
        "http_port": 4151,
        "version": "1.3.0",
        "tombstones": [False, False],
        "topics": ["t", "u"],
    }
    assert list(nodes["a"]) == [
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
        "tombstones",
        "topics",
    ]
    assert nodes["idle"]["topics"] == [] and nodes["idle"]["tombstones"] == []


async def test_debug(http, clients, lookupd):
    c = await registered(clients, "t", "c", broadcast_address="a")
    await http.post("/topic/create?topic=empty")
    status, headers, body = await http.get("/debug")
    assert status == 200 and headers["X-NSQ-Content-Type"] == V1
    doc = json.loads(body)
    assert list(doc) == ["channel:t:c", "client::", "topic:t:"]
    [entry] = doc["topic:t:"]
    assert list(entry) == sorted(entry)
    assert entry["id"] == c.local_address
    assert entry["broadcast_address"] == "a"
    assert entry["tombstoned"] is False
    assert entry["tombstoned_at"] == -6795364578871345152  # Go's zero time.Time UnixNano
    assert abs(entry["last_update"] - lookupd.now_ns()) < 60 * 10**9


# --- changes ----------------------------------------------------------------------------------


async def test_topic_create(http):
    assert (await http.post("/topic/create"))[::2] == err(400, "MISSING_ARG_TOPIC")
    assert (await http.post("/topic/create?topic=a!"))[::2] == err(400, "INVALID_ARG_TOPIC")
    assert (await http.post("/topic/create?topic="))[::2] == err(400, "INVALID_ARG_TOPIC")
    assert (await http.post("/topic/create?topic=%zz"))[::2] == err(400, "INVALID_REQUEST")
    status, headers, body = await http.post("/topic/create?topic=t")
    assert (status, body) == (200, b"")
    assert headers["X-NSQ-Content-Type"] == V1
    assert await http.json("/topics") == {"topics": ["t"]}
    assert await http.json("/lookup?topic=t") == {"channels": [], "producers": []}
    assert (await http.post("/topic/create?topic=t"))[::2] == (200, b"")
    assert await http.json("/topics") == {"topics": ["t"]}


async def test_topic_delete(http, clients):
    c = await registered(clients, "t", "c")
    await http.post("/channel/create?topic=t&channel=d")
    await http.post("/topic/create?topic=u")
    assert (await http.post("/topic/delete"))[::2] == err(400, "MISSING_ARG_TOPIC")
    assert (await http.post("/topic/delete?topic=t"))[::2] == (200, b"")
    assert await http.json("/topics") == {"topics": ["u"]}
    assert await http.json("/channels?topic=t") == {"channels": []}
    assert (await http.get("/lookup?topic=t"))[::2] == err(404, "TOPIC_NOT_FOUND")
    assert (await http.post("/topic/delete?topic=never"))[::2] == (200, b"")
    # the producer re-registering brings it back
    assert await c.register("t") == b"OK"
    assert len((await http.json("/lookup?topic=t"))["producers"]) == 1


async def test_channel_create_and_delete(http):
    for path in ("/channel/create", "/channel/delete"):
        assert (await http.post(path))[::2] == err(400, "MISSING_ARG_TOPIC")
        assert (await http.post(path + "?topic=a!"))[::2] == err(400, "INVALID_ARG_TOPIC")
        assert (await http.post(path + "?topic=t"))[::2] == err(400, "MISSING_ARG_CHANNEL")
        assert (await http.post(path + "?topic=t&channel=c!"))[::2] == err(400, "INVALID_ARG_CHANNEL")
        assert (await http.post(path + "?topic=t&channel=%"))[::2] == err(400, "INVALID_REQUEST")
    assert (await http.post("/channel/delete?topic=t&channel=c"))[::2] == err(404, "CHANNEL_NOT_FOUND")
    assert (await http.post("/channel/create?topic=t&channel=c"))[::2] == (200, b"")
    assert await http.json("/topics") == {"topics": ["t"]}
    assert await http.json("/channels?topic=t") == {"channels": ["c"]}
    assert await http.json("/lookup?topic=t") == {"channels": ["c"], "producers": []}
    assert (await http.post("/channel/delete?topic=t&channel=c"))[::2] == (200, b"")
    assert await http.json("/channels?topic=t") == {"channels": []}
    assert await http.json("/topics") == {"topics": ["t"]}


async def test_channel_delete_of_a_registered_channel(http, clients):
    c = await registered(clients, "t", "c")
    assert (await http.post("/channel/delete?topic=t&channel=c"))[::2] == (200, b"")
    assert await http.json("/channels?topic=t") == {"channels": []}
    assert len((await http.json("/lookup?topic=t"))["producers"]) == 1
    assert await c.register("t", "c") == b"OK"
    assert await http.json("/channels?topic=t") == {"channels": ["c"]}


async def test_topic_tombstone(http, clients):
    await registered(clients, "t", broadcast_address="a", http_port=1)
    await registered(clients, "t", broadcast_address="b", http_port=1)
    assert (await http.post("/topic/tombstone"))[::2] == err(400, "MISSING_ARG_TOPIC")
    assert (await http.post("/topic/tombstone?topic=t"))[::2] == err(400, "MISSING_ARG_NODE")
    # an unknown node or topic is not an error
    assert (await http.post("/topic/tombstone?topic=t&node=a:2"))[::2] == (200, b"")
    assert (await http.post("/topic/tombstone?topic=x&node=a:1"))[::2] == (200, b"")
    assert len((await http.json("/lookup?topic=t"))["producers"]) == 2
    assert (await http.post("/topic/tombstone?topic=t&node=a:1"))[::2] == (200, b"")
    doc = await http.json("/lookup?topic=t")
    assert [p["broadcast_address"] for p in doc["producers"]] == ["b"]
    nodes = {n["broadcast_address"]: n for n in (await http.json("/nodes"))["producers"]}
    assert nodes["a"]["tombstones"] == [True]  # /nodes still lists a tombstoned node
    debug = (await http.json("/debug"))["topic:t:"]
    assert [e["tombstoned"] for e in debug] == [True, False]


# --- routing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method,path,allow",
    [
        ("POST", "/ping", "GET, OPTIONS"),
        ("HEAD", "/ping", "GET, OPTIONS"),
        ("POST", "/lookup", "GET, OPTIONS"),
        ("PUT", "/topics", "GET, OPTIONS"),
        ("DELETE", "/nodes", "GET, OPTIONS"),
        ("POST", "/debug", "GET, OPTIONS"),
        ("GET", "/topic/create", "POST, OPTIONS"),
        ("GET", "/topic/delete", "POST, OPTIONS"),
        ("GET", "/channel/create", "POST, OPTIONS"),
        ("GET", "/channel/delete", "POST, OPTIONS"),
        ("GET", "/topic/tombstone", "POST, OPTIONS"),
    ],
)
async def test_wrong_method_is_405(http, method, path, allow):
    status, headers, body = await http.request(method, path)
    assert status == 405
    assert headers["Allow"] == allow
    if method != "HEAD":
        assert body == b'{"message":"METHOD_NOT_ALLOWED"}'


@pytest.mark.parametrize(
    "path",
    [
        "/nope",
        "/create_topic",
        "/delete_topic",
        "/create_channel",
        "/delete_channel",
        "/tombstone_topic_producer",
        "/debug/pprof/block",
        "/debug/pprof/symbol",
        "/stats",
    ],
)
async def test_unknown_and_removed_paths_are_404(http, path):
    assert (await http.get(path))[::2] == err(404, "NOT_FOUND")
    assert (await http.post(path))[::2] == err(404, "NOT_FOUND")


async def test_options_lists_allowed_methods(http):
    status, headers, body = await http.request("OPTIONS", "/lookup")
    assert (status, body, headers["Allow"]) == (200, b"", "GET, OPTIONS")
    status, headers, _ = await http.request("OPTIONS", "/topic/tombstone")
    assert headers["Allow"] == "POST, OPTIONS"


@pytest.mark.parametrize(
    "method,path,code,location",
    [
        ("GET", "/lookup/?topic=t", 301, "/lookup?topic=t"),
        ("GET", "/TOPICS", 301, "/topics"),
        ("GET", "/debug/", 301, "/debug"),
        ("GET", "/debug/pprof/", 301, "/debug/pprof"),
        ("POST", "/topic/create/?topic=t", 307, "/topic/create?topic=t"),
        ("POST", "/Topic/Tombstone?topic=t", 307, "/topic/tombstone?topic=t"),
    ],
)
async def test_redirects(http, method, path, code, location):
    status, headers, _ = await http.request(method, path)
    assert (status, headers["Location"]) == (code, location)


async def test_debug_pprof_equivalents(http):
    status, _, body = await http.get("/debug/pprof")
    assert status == 200 and b"/debug/pprof/profile" in body
    status, _, body = await http.get("/debug/pprof/cmdline")
    assert status == 200 and body
    status, _, body = await http.get("/debug/pprof/goroutine")
    assert status == 200 and b"asyncio tasks:" in body
    status, _, body = await http.get("/debug/pprof/heap")
    assert status == 200 and b"heap_objects" in body and b"start nsqlookupd" in body
    status, headers, body = await http.get("/debug/pprof/profile?seconds=0.01")
    assert status == 200 and b"function calls" in body
    assert headers["Content-Type"].startswith("text/plain")


async def test_handler_crash_is_500_internal_error(http, lookupd, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr("nsqpy.nsqlookupd.registration_db.RegistrationDB.topics", boom)
    assert (await http.get("/topics"))[::2] == err(500, "INTERNAL_ERROR")
    assert (await http.get("/ping"))[0] == 200
