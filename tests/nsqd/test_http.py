"""nsqd's HTTP API against an in-process daemon: status codes, bodies, headers, and the
effect of each call seen over TCP or in /stats (NSQ 1.3.0 ``nsqd/http.go``)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct

import aiohttp
import pytest
import pytest_asyncio
import yarl
from conftest import make_options
from support import RawClient, wait_for

from nsqpy.nsqd.nsqd import NSQD
from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(30)

V1 = "nsq; version=1.0"
JSON_CT = "application/json; charset=utf-8"


class HTTP:
    """A tiny client: ``await http.post("/pub?topic=t", b"body")`` → (status, headers, body)."""

    def __init__(self, session: aiohttp.ClientSession, port: int) -> None:
        self.session = session
        self.base = f"http://127.0.0.1:{port}"

    async def request(self, method, path, data=None, **kw):
        url = yarl.URL(self.base + path, encoded=True)  # send the query bytes as written
        async with self.session.request(method, url, data=data, allow_redirects=False, **kw) as r:
            return r.status, r.headers, await r.read()

    async def get(self, path, **kw):
        return await self.request("GET", path, **kw)

    async def post(self, path, data=b"", **kw):
        return await self.request("POST", path, data=data, **kw)

    async def put(self, path, data=b"", **kw):
        return await self.request("PUT", path, data=data, **kw)

    async def json(self, path):
        status, _, body = await self.get(path)
        assert status == 200, body
        return json.loads(body)

    async def stats(self, query=""):
        return await self.json("/stats?format=json" + ("&" + query if query else ""))


@pytest_asyncio.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s


@pytest_asyncio.fixture
async def http(nsqd, session):
    return HTTP(session, nsqd.http_port)


def err(status, code):
    return status, json.dumps({"message": code}, separators=(",", ":")).encode()


async def chunked(data: bytes):
    """A body without Content-Length (aiohttp sends it chunked)."""
    yield data


async def consumer(nsqd, topic, channel, rdy=100):
    c = await RawClient.connect(nsqd.tcp_port)
    await c.sub(topic, channel, rdy)
    return c


# --- /ping and /info ---------------------------------------------------------------------------


async def test_ping_is_plain_text_ok(http):
    status, headers, body = await http.get("/ping")
    assert (status, body) == (200, b"OK")
    assert headers["Content-Type"].startswith("text/plain")
    assert "X-NSQ-Content-Type" not in headers  # /ping is PlainText, not V1


async def test_ping_unhealthy_is_500_with_health_text(nsqd, http, monkeypatch):
    monkeypatch.setattr(nsqd, "is_healthy", lambda: False)
    monkeypatch.setattr(nsqd, "health", lambda: "NOK - disk full")
    assert (await http.get("/ping"))[::2] == (500, b"NOK - disk full")


async def test_info_fields_in_go_order(nsqd, http):
    status, headers, body = await http.get("/info")
    assert status == 200
    assert headers["X-NSQ-Content-Type"] == V1
    assert headers["Content-Type"] == JSON_CT
    info = json.loads(body)
    assert list(info) == [
        "version",
        "broadcast_address",
        "hostname",
        "http_port",
        "tcp_port",
        "start_time",
        "max_heartbeat_interval",
        "max_output_buffer_size",
        "max_output_buffer_timeout",
        "max_deflate_level",
    ]
    assert info["version"] == "1.3.0"
    assert info["hostname"] == socket.gethostname()
    assert info["broadcast_address"] == nsqd.options.broadcast_address
    assert info["tcp_port"] == nsqd.tcp_port and info["http_port"] == nsqd.http_port
    assert info["start_time"] == nsqd.start_time
    assert info["max_heartbeat_interval"] == 60 * 10**9  # Go time.Duration: ns
    assert info["max_output_buffer_timeout"] == 30 * 10**9
    assert info["max_output_buffer_size"] == 65536
    assert info["max_deflate_level"] == 6


async def test_unix_socket_listener_reports_port_minus_one(tmp_path):
    sock_path = str(tmp_path / "http.sock")
    async with NSQD(make_options(tmp_path, http_address=sock_path)) as d:
        conn = aiohttp.UnixConnector(path=sock_path)
        async with aiohttp.ClientSession(connector=conn) as s, s.get("http://nsqd/info") as r:
            info = await r.json()
    assert info["http_port"] == -1
    assert info["tcp_port"] == d.tcp_port


# --- /pub ----------------------------------------------------------------------------------------


async def test_pub_over_http_is_consumed_over_tcp(nsqd, http):
    c = await consumer(nsqd, "t", "c")
    status, headers, body = await http.post("/pub?topic=t", b"hello world")
    assert (status, body) == (200, b"OK")
    assert headers["X-NSQ-Content-Type"] == V1
    msg = await c.read_message()
    assert msg.body == b"hello world" and msg.attempts == 1
    await c.close()


async def test_pub_creates_topic_and_holds_message_until_a_channel(nsqd, http):
    assert (await http.post("/pub?topic=held", b"m1"))[0] == 200
    assert "held" in nsqd.topics
    c = await consumer(nsqd, "held", "ch")
    assert (await c.read_message()).body == b"m1"
    await c.close()


async def test_pub_binary_body_round_trips(nsqd, http):
    c = await consumer(nsqd, "bin", "c")
    body = bytes(range(256)) + b"\n\r\x00"
    assert (await http.post("/pub?topic=bin", body))[0] == 200
    assert (await c.read_message()).body == body
    await c.close()


@pytest.mark.parametrize(
    "path,body,expected",
    [
        ("/pub", b"x", err(400, "MISSING_ARG_TOPIC")),
        ("/pub?channel=t", b"x", err(400, "MISSING_ARG_TOPIC")),
        ("/pub?topic=", b"x", err(400, "INVALID_TOPIC")),
        ("/pub?topic=bad!name", b"x", err(400, "INVALID_TOPIC")),
        ("/pub?topic=" + "a" * 65, b"x", err(400, "INVALID_TOPIC")),
        ("/pub?topic=t", b"", err(400, "MSG_EMPTY")),
        ("/pub", b"", err(400, "MSG_EMPTY")),  # the body is checked before the topic
        ("/pub?topic=%zz", b"x", err(400, "INVALID_REQUEST")),
        ("/pub?topic=t;x=1", b"x", err(400, "INVALID_REQUEST")),
        ("/pub?topic=t&defer=abc", b"x", err(400, "INVALID_DEFER")),
        ("/pub?topic=t&defer=", b"x", err(400, "INVALID_DEFER")),
        ("/pub?topic=t&defer=-1", b"x", err(400, "INVALID_DEFER")),
        ("/pub?topic=t&defer=1.5", b"x", err(400, "INVALID_DEFER")),
        ("/pub?topic=t&defer=3600001", b"x", err(400, "INVALID_DEFER")),
        ("/pub?topic=t&defer=99999999999999999999", b"x", err(400, "INVALID_DEFER")),
    ],
)
async def test_pub_errors(http, path, body, expected):
    status, headers, resp = await http.post(path, body)
    assert (status, resp) == expected
    assert headers["Content-Type"] == JSON_CT
    assert headers["X-NSQ-Content-Type"] == V1


async def test_pub_topic_param_is_url_decoded(nsqd, http):
    assert (await http.post("/pub?topic=a%2Eb", b"x"))[0] == 200
    assert "a.b" in nsqd.topics


async def test_pub_invalid_defer_still_creates_the_topic_as_go_does(nsqd, http):
    assert (await http.post("/pub?topic=made&defer=x", b"m"))[0] == 400
    assert "made" in nsqd.topics
    assert nsqd.topics["made"].message_count == 0


async def test_pub_size_limits(tmp_path, session):
    async with NSQD(make_options(tmp_path, max_msg_size=10)) as d:
        http = HTTP(session, d.http_port)
        assert (await http.post("/pub?topic=t", b"x" * 10))[0] == 200
        assert (await http.post("/pub?topic=t", b"x" * 11))[::2] == err(413, "MSG_TOO_BIG")
        # no Content-Length: caught while reading
        assert (await http.post("/pub?topic=t", chunked(b"x" * 11)))[::2] == err(413, "MSG_TOO_BIG")
        assert (await http.post("/pub?topic=t", chunked(b"x" * 10)))[0] == 200
        # the size check comes before the topic check
        assert (await http.post("/pub", b"x" * 11))[::2] == err(413, "MSG_TOO_BIG")
        assert d.topics["t"].message_count == 2


async def raw_http(port: int, request: bytes, body: bytes | None = None) -> list[bytes]:
    """Send a request head; if ``body`` is given, send it after reading the first response
    line. Returns every status line seen (interim ``100 Continue`` included)."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(request)
    lines = [await asyncio.wait_for(r.readline(), 5)]
    if body is not None:
        assert lines[0].startswith(b"HTTP/1.1 100")
        await r.readline()  # blank line after the interim response
        w.write(body)
        lines.append(await asyncio.wait_for(r.readline(), 5))
    w.close()
    return lines


async def test_expect_100_continue_is_sent_only_when_the_body_is_read(tmp_path):
    async with NSQD(make_options(tmp_path, max_msg_size=10)) as d:
        head = b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n"
        # too big by Content-Length: 413 at once, the client never uploads the body
        assert (await raw_http(d.http_port, head % 11))[0].startswith(b"HTTP/1.1 413")
        lines = await raw_http(d.http_port, head % 5, b"hello")
        assert lines[1].startswith(b"HTTP/1.1 200")
        assert d.topics["t"].message_count == 1


async def test_pub_defer_holds_the_message_in_deferred(nsqd, http):
    c = await consumer(nsqd, "d", "c")
    assert (await http.post("/pub?topic=d&defer=300", b"later"))[0] == 200
    # "+" in a query is a space, so an explicit sign must be escaped
    assert (await http.post("/pub?topic=d&defer=+0", b"now"))[0] == 400
    assert (await http.post("/pub?topic=d&defer=%2B0", b"now"))[0] == 200
    assert (await c.read_message()).body == b"now"
    ch = (await HTTP(http.session, nsqd.http_port).stats("topic=d"))["topics"][0]["channels"][0]
    assert ch["deferred_count"] == 1
    assert (await c.read_message(timeout=5)).body == b"later"
    await c.close()


async def test_pub_max_defer_is_accepted(nsqd, http):
    max_ms = int(nsqd.options.max_req_timeout * 1000)
    assert (await http.post(f"/pub?topic=t&defer={max_ms}", b"x"))[0] == 200


async def test_pub_past_mem_queue_size_goes_to_disk(tmp_path, session):
    async with NSQD(make_options(tmp_path, mem_queue_size=2)) as d:
        http = HTTP(session, d.http_port)
        for _ in range(5):
            assert (await http.post("/pub?topic=t", b"x"))[0] == 200
        t = (await http.stats("topic=t"))["topics"][0]
        assert (t["depth"], t["backend_depth"], t["message_count"]) == (5, 3, 5)


async def test_pub_while_exiting_is_503(nsqd, http):
    nsqd.exiting = True
    try:
        assert (await http.post("/pub?topic=t", b"x"))[::2] == err(503, "EXITING")
        assert (await http.post("/mpub?topic=t", b"x"))[::2] == err(503, "EXITING")
    finally:
        nsqd.exiting = False


async def test_http_and_tcp_publishes_count_the_same(nsqd, http):
    assert (await http.post("/pub?topic=t", b"abc"))[0] == 200
    assert (await http.post("/mpub?topic=t", b"de\nf"))[0] == 200
    p = await RawClient.connect(nsqd.tcp_port)
    assert await p.pub("t", b"ghij") == (0, b"OK")
    t = (await http.stats("topic=t"))["topics"][0]
    assert t["message_count"] == 4
    assert t["message_bytes"] == 3 + 2 + 1 + 4
    await p.close()


# --- /mpub ---------------------------------------------------------------------------------------


async def test_mpub_text_drops_empty_lines_and_keeps_order(nsqd, http):
    c = await consumer(nsqd, "m", "c")
    status, _, body = await http.post("/mpub?topic=m", b"one\n\ntwo\r\n\nthree\n")
    assert (status, body) == (200, b"OK")
    msgs = await c.read_messages(3)
    assert [m.body for m in msgs] == [b"one", b"two\r", b"three"]
    assert nsqd.topics["m"].message_count == 3
    await c.close()


@pytest.mark.parametrize("flag", ["binary=true", "binary=1", "binary=yes"])
async def test_mpub_binary(nsqd, http, flag):
    c = await consumer(nsqd, "mb", "c")
    bodies = [b"a\nb", b"\x00" * 5, b"z"]
    status, _, resp = await http.post(f"/mpub?topic=mb&{flag}", commands.encode_mpub_body(bodies))
    assert (status, resp) == (200, b"OK")
    assert [m.body for m in await c.read_messages(3)] == bodies
    await c.close()


@pytest.mark.parametrize("flag", ["binary=false", "binary=0"])
async def test_mpub_binary_false_means_text(nsqd, http, flag):
    assert (await http.post(f"/mpub?topic=mt&{flag}", b"x\ny"))[0] == 200
    assert nsqd.topics["mt"].message_count == 2


async def test_mpub_empty_text_body_is_ok_and_publishes_nothing(nsqd, http):
    assert (await http.post("/mpub?topic=e", b"\n\n"))[::2] == (200, b"OK")
    assert nsqd.topics["e"].message_count == 0


def _mpub_raw(num, *items):
    out = struct.pack(">i", num)
    for size, data in items:
        out += struct.pack(">i", size) + data
    return out


@pytest.mark.parametrize(
    "path,body,expected",
    [
        ("/mpub", b"a", err(400, "MISSING_ARG_TOPIC")),
        ("/mpub?topic=no/pe", b"a", err(400, "INVALID_TOPIC")),
        ("/mpub?topic=t&x=%", b"a", err(400, "INVALID_REQUEST")),
        ("/mpub?topic=t", b"ok\n" + b"x" * 11, err(413, "MSG_TOO_BIG")),
        ("/mpub?topic=t&binary=1", b"\x00\x00", err(413, "BAD_BODY")),
        ("/mpub?topic=t&binary=1", _mpub_raw(0), err(413, "BAD_BODY")),
        ("/mpub?topic=t&binary=1", _mpub_raw(-1), err(413, "BAD_BODY")),
        ("/mpub?topic=t&binary=1", _mpub_raw(100), err(413, "BAD_BODY")),  # > (max-4)/5
        ("/mpub?topic=t&binary=1", _mpub_raw(1, (0, b"")), err(413, "BAD_MESSAGE")),
        ("/mpub?topic=t&binary=1", _mpub_raw(1, (11, b"x" * 11)), err(413, "BAD_MESSAGE")),
        ("/mpub?topic=t&binary=1", _mpub_raw(2, (1, b"a")), err(413, "BAD_MESSAGE")),
        ("/mpub?topic=t&binary=1", _mpub_raw(1, (5, b"ab")), err(413, "BAD_MESSAGE")),
    ],
)
async def test_mpub_errors_publish_nothing(tmp_path, session, path, body, expected):
    async with NSQD(make_options(tmp_path, max_msg_size=10, max_body_size=200)) as d:
        http = HTTP(session, d.http_port)
        assert (await http.post(path, body))[::2] == expected
        assert sum(t.message_count for t in d.topics.values()) == 0


async def test_mpub_body_too_big(tmp_path, session):
    async with NSQD(make_options(tmp_path, max_msg_size=10, max_body_size=20)) as d:
        http = HTTP(session, d.http_port)
        ok = b"0123456789\n012345678"  # exactly 20 bytes
        assert (await http.post("/mpub?topic=t", ok))[0] == 200
        big = ok + b"9"
        assert (await http.post("/mpub?topic=t", big))[::2] == err(413, "BODY_TOO_BIG")
        assert (await http.post("/mpub?topic=t", chunked(big)))[::2] == err(413, "BODY_TOO_BIG")
        # the Content-Length check comes before the topic check
        assert (await http.post("/mpub", big))[::2] == err(413, "BODY_TOO_BIG")
        binary = commands.encode_mpub_body([b"x"] * 3)  # 4 + 3*5 = 19 bytes
        assert (await http.post("/mpub?topic=t&binary=1", binary))[0] == 200
        binary = commands.encode_mpub_body([b"xx"] * 4)
        assert (await http.post("/mpub?topic=t&binary=1", binary))[::2] == err(413, "BODY_TOO_BIG")
        assert d.topics["t"].message_count == 2 + 3


async def test_mpub_past_mem_queue_size_spills_to_disk(tmp_path, session):
    async with NSQD(make_options(tmp_path, mem_queue_size=3)) as d:
        http = HTTP(session, d.http_port)
        assert (await http.post("/mpub?topic=t", b"1\n2\n3\n4"))[0] == 200
        assert (d.topics["t"].depth, d.topics["t"].backend_depth) == (4, 1)


# --- topics -------------------------------------------------------------------------------------


async def test_topic_create_and_delete(nsqd, http):
    status, headers, body = await http.post("/topic/create?topic=new")
    assert (status, body) == (200, b"")
    assert headers["X-NSQ-Content-Type"] == V1
    assert "new" in nsqd.topics
    assert (await http.post("/topic/create?topic=new"))[0] == 200  # idempotent
    assert [t["topic_name"] for t in (await http.stats())["topics"]] == ["new"]
    assert (await http.post("/topic/delete?topic=new"))[::2] == (200, b"")
    assert "new" not in nsqd.topics
    assert (await http.post("/topic/delete?topic=new"))[::2] == err(404, "TOPIC_NOT_FOUND")


@pytest.mark.parametrize(
    "path,expected",
    [
        ("/topic/create", err(400, "MISSING_ARG_TOPIC")),
        ("/topic/create?topic=a:b", err(400, "INVALID_TOPIC")),
        ("/topic/create?topic=%", err(400, "INVALID_REQUEST")),
        ("/topic/delete", err(400, "MISSING_ARG_TOPIC")),
        ("/topic/delete?topic=bad!", err(404, "TOPIC_NOT_FOUND")),  # Go does not validate
        ("/topic/empty", err(400, "MISSING_ARG_TOPIC")),
        ("/topic/empty?topic=bad!", err(400, "INVALID_TOPIC")),
        ("/topic/empty?topic=none", err(404, "TOPIC_NOT_FOUND")),
        ("/topic/pause", err(400, "MISSING_ARG_TOPIC")),
        ("/topic/pause?topic=none", err(404, "TOPIC_NOT_FOUND")),
        ("/topic/pause?topic=bad!", err(404, "TOPIC_NOT_FOUND")),
        ("/topic/unpause?topic=none", err(404, "TOPIC_NOT_FOUND")),
    ],
)
async def test_topic_errors(nsqd, http, path, expected):
    assert (await http.post(path))[::2] == expected
    assert not nsqd.topics


async def test_topic_delete_disconnects_its_consumers(nsqd, http):
    c = await consumer(nsqd, "gone", "c")
    assert (await http.post("/topic/delete?topic=gone"))[0] == 200
    await c.expect_closed()


async def test_topic_empty_drops_queued_messages(nsqd, http):
    assert (await http.post("/mpub?topic=t", b"1\n2\n3"))[0] == 200
    assert (await http.stats())["topics"][0]["depth"] == 3
    assert (await http.post("/topic/empty?topic=t"))[::2] == (200, b"")
    t = (await http.stats())["topics"][0]
    assert t["depth"] == 0 and t["message_count"] == 3


async def test_topic_pause_holds_messages_until_unpause(nsqd, http):
    c = await consumer(nsqd, "p", "c")
    assert (await http.post("/topic/pause?topic=p"))[::2] == (200, b"")
    assert (await http.stats())["topics"][0]["paused"] is True
    assert (await http.post("/pub?topic=p", b"held"))[0] == 200
    t = (await http.stats())["topics"][0]
    assert t["depth"] == 1 and t["channels"][0]["depth"] == 0
    await c.expect_silence(0.2)
    assert (await http.post("/topic/unpause?topic=p"))[::2] == (200, b"")
    assert (await c.read_message()).body == b"held"
    assert (await http.stats())["topics"][0]["paused"] is False
    await c.close()


# --- channels -----------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["create", "delete", "empty", "pause", "unpause"])
@pytest.mark.parametrize(
    "query,expected",
    [
        ("", err(400, "MISSING_ARG_TOPIC")),
        ("?channel=c", err(400, "MISSING_ARG_TOPIC")),
        ("?topic=b@d&channel=c", err(400, "INVALID_ARG_TOPIC")),
        ("?topic=t", err(400, "MISSING_ARG_CHANNEL")),
        ("?topic=t&channel=", err(400, "INVALID_ARG_CHANNEL")),
        ("?topic=t&channel=b@d", err(400, "INVALID_ARG_CHANNEL")),
        ("?topic=none&channel=c", err(404, "TOPIC_NOT_FOUND")),
        ("?topic=t&channel=c&%", err(400, "INVALID_REQUEST")),
    ],
)
async def test_channel_argument_errors(nsqd, http, action, query, expected):
    nsqd.get_topic("t")
    assert (await http.post(f"/channel/{action}{query}"))[::2] == expected
    assert not nsqd.topics["t"].channels


@pytest.mark.parametrize("action", ["delete", "empty", "pause", "unpause"])
async def test_channel_not_found(nsqd, http, action):
    nsqd.get_topic("t")
    assert (await http.post(f"/channel/{action}?topic=t&channel=c"))[::2] == err(404, "CHANNEL_NOT_FOUND")


async def test_channel_create_needs_the_topic_and_receives_messages(nsqd, http):
    assert (await http.post("/channel/create?topic=t&channel=c"))[::2] == err(404, "TOPIC_NOT_FOUND")
    assert (await http.post("/topic/create?topic=t"))[0] == 200
    assert (await http.post("/channel/create?topic=t&channel=c"))[::2] == (200, b"")
    assert (await http.post("/pub?topic=t", b"x"))[0] == 200
    ch = (await http.stats())["topics"][0]["channels"]
    assert [(c["channel_name"], c["depth"]) for c in ch] == [("c", 1)]


async def test_channel_delete_disconnects_consumers(nsqd, http):
    c = await consumer(nsqd, "t", "c")
    assert (await http.post("/channel/delete?topic=t&channel=c"))[::2] == (200, b"")
    await c.expect_closed()
    assert "c" not in nsqd.topics["t"].channels


async def test_channel_empty_drops_queued_and_in_flight(nsqd, http):
    c = await consumer(nsqd, "t", "c", rdy=1)
    assert (await http.post("/mpub?topic=t", b"1\n2\n3"))[0] == 200
    assert (await c.read_message()).body == b"1"
    ch = (await http.stats())["topics"][0]["channels"][0]
    assert (ch["depth"], ch["in_flight_count"]) == (2, 1)
    assert (await http.post("/channel/empty?topic=t&channel=c"))[::2] == (200, b"")
    ch = (await http.stats())["topics"][0]["channels"][0]
    assert (ch["depth"], ch["in_flight_count"]) == (0, 0)
    await c.close()


async def test_channel_pause_and_unpause(nsqd, http, monkeypatch):
    persisted = []
    monkeypatch.setattr(nsqd, "on_metadata_changed", lambda: persisted.append(1))
    c = await consumer(nsqd, "t", "c")
    assert (await http.post("/channel/pause?topic=t&channel=c"))[::2] == (200, b"")
    assert persisted
    assert (await http.post("/pub?topic=t", b"x"))[0] == 200
    ch = (await http.stats())["topics"][0]["channels"][0]
    assert ch["paused"] is True and ch["depth"] == 1
    await c.expect_silence(0.2)
    assert (await http.post("/channel/unpause?topic=t&channel=c"))[::2] == (200, b"")
    assert (await c.read_message()).body == b"x"
    assert (await http.stats())["topics"][0]["channels"][0]["paused"] is False
    await c.close()


# --- /config ------------------------------------------------------------------------------------


async def test_config_get(nsqd, http):
    status, headers, body = await http.get("/config/mem_queue_size")
    assert (status, body) == (200, b"10000")
    assert headers["Content-Type"] == JSON_CT
    assert (await http.get("/config/msg_timeout"))[2] == b"60000000000"
    assert (await http.get("/config/nsqlookupd_tcp_addresses"))[2] == b"[]"
    assert (await http.get("/config/snappy"))[2] == b"true"
    # Go's RespondV1 sends a string value as the bare text
    status, headers, body = await http.get("/config/broadcast_address")
    assert body == nsqd.options.broadcast_address.encode()
    assert headers["Content-Type"].startswith("text/plain")
    assert (await http.get("/config/nope"))[::2] == err(400, "INVALID_OPTION")
    assert (await http.get("/config/mem-queue-size"))[::2] == err(400, "INVALID_OPTION")


async def test_config_put_lookupd_addresses(nsqd, http):
    addrs = ["127.0.0.1:4160", "lookupd:4160"]
    status, _, body = await http.put("/config/nsqlookupd_tcp_addresses", json.dumps(addrs))
    assert (status, json.loads(body)) == (200, addrs)
    assert nsqd.options.nsqlookupd_tcp_addresses == addrs
    assert json.loads((await http.get("/config/nsqlookupd_tcp_addresses"))[2]) == addrs
    bad = await http.put("/config/nsqlookupd_tcp_addresses", b"[not json")
    assert bad[::2] == err(400, "INVALID_VALUE")
    assert nsqd.options.nsqlookupd_tcp_addresses == addrs


async def test_config_put_log_level(nsqd, http):
    nsqd_log = logging.getLogger("nsqd")
    before = nsqd_log.level
    try:
        assert (await http.put("/config/log_level", b"warn"))[::2] == (200, b"3")
        assert nsqd.options.log_level == "warn"
        assert nsqd_log.level == logging.WARNING
        assert (await http.get("/config/log_level"))[2] == b"3"
        assert (await http.put("/config/log_level", b"loud"))[::2] == err(400, "INVALID_VALUE")
    finally:
        nsqd_log.setLevel(before)


async def test_config_put_errors(tmp_path, session):
    async with NSQD(make_options(tmp_path, max_msg_size=16)) as d:
        http = HTTP(session, d.http_port)
        assert (await http.put("/config/log_level", b""))[::2] == err(413, "INVALID_VALUE")
        big = b'["' + b"a" * 20 + b'"]'
        assert (await http.put("/config/nsqlookupd_tcp_addresses", big))[::2] == err(413, "INVALID_VALUE")
        assert (await http.put("/config/mem_queue_size", b"5"))[::2] == err(400, "INVALID_OPTION")
        assert (await http.put("/config/nope", b"5"))[::2] == err(400, "INVALID_OPTION")
        assert d.options.mem_queue_size == 10000


async def test_config_put_notifies_the_daemon(nsqd, http, monkeypatch):
    seen = []
    monkeypatch.setattr(nsqd, "on_options_changed", seen.append, raising=False)
    assert (await http.put("/config/nsqlookupd_tcp_addresses", b'["h:1"]'))[0] == 200
    assert seen == ["nsqlookupd_tcp_addresses"]


# --- routing ------------------------------------------------------------------------------------


async def test_unknown_path_is_404_not_found(http):
    status, headers, body = await http.get("/nope")
    assert (status, body) == err(404, "NOT_FOUND")
    assert headers["X-NSQ-Content-Type"] == V1
    assert (await http.get("/config/a/b"))[::2] == err(404, "NOT_FOUND")


@pytest.mark.parametrize(
    "path",
    ["/put", "/mput", "/create_topic", "/delete_channel", "/empty_topic", "/debug/pprof/block"],
)
async def test_removed_pre_1_0_and_unsupported_debug_paths_are_404(http, path):
    assert (await http.get(path))[::2] == err(404, "NOT_FOUND")
    assert (await http.post(path))[::2] == err(404, "NOT_FOUND")


@pytest.mark.parametrize(
    "method,path,allow",
    [
        ("GET", "/pub", "POST, OPTIONS"),
        ("PUT", "/mpub", "POST, OPTIONS"),
        ("GET", "/topic/create", "POST, OPTIONS"),
        ("POST", "/channel/delete", None),
        ("POST", "/stats", "GET, OPTIONS"),
        ("POST", "/ping", "GET, OPTIONS"),
        ("HEAD", "/ping", "GET, OPTIONS"),
        ("DELETE", "/config/log_level", "GET, PUT, OPTIONS"),
        ("GET", "/debug/freememory", "POST, OPTIONS"),
        ("GET", "/debug/setblockrate", "PUT, OPTIONS"),
    ],
)
async def test_wrong_method_is_405(http, method, path, allow):
    status, headers, body = await http.request(method, path)
    if allow is None:  # POST is the right method: just proves the route exists
        assert status != 405
        return
    assert status == 405
    assert headers["Allow"] == allow
    if method != "HEAD":
        assert body == b'{"message":"METHOD_NOT_ALLOWED"}'


async def test_options_lists_allowed_methods(http):
    status, headers, body = await http.request("OPTIONS", "/pub")
    assert (status, body, headers["Allow"]) == (200, b"", "POST, OPTIONS")
    assert (await http.request("OPTIONS", "/nope"))[::2] == err(404, "NOT_FOUND")


async def test_trailing_slash_and_case_redirects(nsqd, http):
    status, headers, _ = await http.get("/stats/?format=json")
    assert (status, headers["Location"]) == (301, "/stats?format=json")
    status, headers, _ = await http.get("/PING")
    assert (status, headers["Location"]) == (301, "/ping")
    status, headers, _ = await http.post("/pub/?topic=t", b"x")
    assert (status, headers["Location"]) == (307, "/pub?topic=t")
    assert "t" not in nsqd.topics
    # aiohttp follows the 307 with the same method and body
    async with http.session.post(http.base + "/PUB?topic=t", data=b"x") as r:
        assert (r.status, await r.read()) == (200, b"OK")
    assert nsqd.topics["t"].message_count == 1


async def test_tls_required_refuses_plain_http(tmp_path, session):
    async with NSQD(make_options(tmp_path, tls_required="true")) as d:
        status, headers, body = await HTTP(session, d.http_port).get("/ping")
    assert status == 403
    assert body == b'{"message": "TLS_REQUIRED", "https_port": 0}'
    assert headers["X-NSQ-Content-Type"] == V1


async def test_tls_required_tcp_https_allows_plain_http(tmp_path, session):
    async with NSQD(make_options(tmp_path, tls_required="tcp-https")) as d:
        assert (await HTTP(session, d.http_port).get("/ping"))[::2] == (200, b"OK")


async def test_handler_crash_is_500_internal_error(nsqd, http, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr("nsqpy.nsqd.http.stats_document", boom)
    assert (await http.get("/stats?format=json"))[::2] == err(500, "INTERNAL_ERROR")
    assert (await http.get("/ping"))[0] == 200


async def test_keepalive_connection_serves_many_requests(nsqd, http):
    for i in range(50):
        assert (await http.post("/pub?topic=ka", b"%d" % i))[0] == 200
    assert nsqd.topics["ka"].message_count == 50


# --- /debug -------------------------------------------------------------------------------------


async def test_debug_pprof_equivalents(http):
    status, _headers, body = await http.get("/debug/pprof/")
    assert status == 200 and b"/debug/pprof/profile" in body
    status, _, body = await http.get("/debug/pprof/cmdline")
    assert status == 200 and body  # argv joined by NUL
    status, _, body = await http.get("/debug/pprof/goroutine")
    assert status == 200 and b"asyncio tasks:" in body and b"thread MainThread" in body
    status, _, body = await http.get("/debug/pprof/heap")
    assert status == 200 and b"heap_objects" in body
    for path in ("/debug/pprof/symbol", "/debug/pprof/threadcreate"):
        assert (await http.get(path))[::2] == err(404, "NOT_FOUND")


async def test_debug_profile_runs_cprofile_once_at_a_time(http):
    first = asyncio.ensure_future(http.get("/debug/pprof/profile?seconds=1"))

    async def profiling():  # the goroutine dump shows every task's await chain
        _, _, body = await http.get("/debug/pprof/goroutine")
        return b"in pprof_profile" in body

    await wait_for(profiling, timeout=5)
    status, _, body = await http.get("/debug/pprof/profile?seconds=0.01")
    assert status == 500 and b"cpu profiling already in use" in body
    status, headers, body = await first
    assert status == 200 and b"function calls" in body
    assert headers["Content-Type"].startswith("text/plain")


async def test_debug_setblockrate_and_freememory(http):
    assert (await http.put("/debug/setblockrate?rate=1"))[::2] == (200, b"")
    status, headers, body = await http.put("/debug/setblockrate?rate=x")
    assert status == 400
    assert body == b'invalid block rate : strconv.Atoi: parsing "x": invalid syntax'
    assert headers["Content-Type"].startswith("text/plain")
    assert (await http.post("/debug/freememory"))[::2] == (200, b"")
