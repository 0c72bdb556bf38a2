"""``/stats`` in JSON and text (NSQ 1.3.0 field names, order, filters and layout), and the
Go-format helpers behind it."""

from __future__ import annotations

import gc
import json
import re
import time

import aiohttp
import pytest
import pytest_asyncio
import yarl
from conftest import make_options
from support import RawClient, wait_for

from nsqpy.httpapi import go_json
from nsqpy.nsqd import stats
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(30)

TOPIC_KEYS = [
    "topic_name",
    "channels",
    "depth",
    "backend_depth",
    "message_count",
    "message_bytes",
    "paused",
    "e2e_processing_latency",
]
CHANNEL_KEYS = [
    "channel_name",
    "depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "message_count",
    "requeue_count",
    "timeout_count",
    "client_count",
    "clients",
    "paused",
    "e2e_processing_latency",
]
CLIENT_KEYS = [
    "client_id",
    "hostname",
    "version",
    "remote_address",
    "state",
    "ready_count",
    "in_flight_count",
    "message_count",
    "finish_count",
    "requeue_count",
    "connect_ts",
    "sample_rate",
    "deflate",
    "snappy",
    "user_agent",
    "tls",
    "tls_cipher_suite",
    "tls_version",
    "tls_negotiated_protocol",
    "tls_negotiated_protocol_is_mutual",
]
MEM_KEYS = [
    "heap_objects",
    "heap_idle_bytes",
    "heap_in_use_bytes",
    "heap_released_bytes",
    "gc_pause_usec_100",
    "gc_pause_usec_99",
    "gc_pause_usec_95",
    "next_gc_bytes",
    "gc_total_runs",
]
NO_LATENCY = {"count": 0, "percentiles": None}


class Stats:
    def __init__(self, session: aiohttp.ClientSession, port: int) -> None:
        self.session = session
        self.base = f"http://127.0.0.1:{port}"

    async def raw(self, query=""):
        url = yarl.URL(f"{self.base}/stats{'?' + query if query else ''}", encoded=True)
        async with self.session.get(url) as r:
            return r.status, r.headers, await r.read()

    async def json(self, query=""):
        status, headers, body = await self.raw("format=json" + ("&" + query if query else ""))
        assert status == 200, body
        assert headers["Content-Type"] == "application/json; charset=utf-8"
        assert headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
        return json.loads(body)

    async def text(self, query=""):
        status, headers, body = await self.raw(query)
        assert status == 200, body
        assert headers["Content-Type"].startswith("text/plain")
        assert headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
        return body.decode()

    async def post(self, path, data=b""):
        async with self.session.post(self.base + path, data=data) as r:
            assert r.status == 200, await r.read()


@pytest_asyncio.fixture
async def st(nsqd):
    async with aiohttp.ClientSession() as s:
        yield Stats(s, nsqd.http_port)


async def consumer(nsqd, topic, channel, rdy=None, **identify):
    c = await RawClient.connect(nsqd.tcp_port)
    if identify:
        await c.identify(**identify)
    await c.sub(topic, channel, rdy)
    return c


def local_address(c: RawClient) -> str:
    host, port = c.writer.get_extra_info("sockname")[:2]
    return f"{host}:{port}"


# --- JSON document ------------------------------------------------------------------------------


async def test_empty_daemon_document(nsqd, st):
    doc = await st.json()
    assert list(doc) == ["version", "health", "start_time", "topics", "memory", "producers"]
    assert doc["version"] == "1.3.0"
    assert doc["health"] == "OK"
    assert doc["start_time"] == nsqd.start_time
    assert doc["topics"] == []
    assert doc["producers"] is None  # Go's nil slice
    assert list(doc["memory"]) == MEM_KEYS
    assert all(isinstance(v, int) and v >= 0 for v in doc["memory"].values())
    assert doc["memory"]["heap_objects"] > 0 and doc["memory"]["heap_in_use_bytes"] > 0


async def test_topics_and_channels_sorted_with_go_field_order(nsqd, st):
    for t in ("b", "a", "c"):
        await st.post(f"/topic/create?topic={t}")
    for c in ("z", "y", "x%23ephemeral"):  # "#" must be escaped in a URL
        await st.post(f"/channel/create?topic=b&channel={c}")
    doc = await st.json()
    assert [t["topic_name"] for t in doc["topics"]] == ["a", "b", "c"]
    b = doc["topics"][1]
    assert list(b) == TOPIC_KEYS
    assert [c["channel_name"] for c in b["channels"]] == ["x#ephemeral", "y", "z"]
    for c in b["channels"]:
        assert list(c) == CHANNEL_KEYS
        assert c["clients"] == [] and c["client_count"] == 0
        assert c["e2e_processing_latency"] == NO_LATENCY
    assert b["e2e_processing_latency"] == NO_LATENCY
    assert doc["topics"][0]["channels"] == []


async def test_channel_and_client_counters(nsqd, st):
    await st.post("/mpub?topic=t", b"m1\nm2\nm3")
    c = await consumer(nsqd, "t", "c", rdy=1, client_id="cid", hostname="h.example", user_agent="test/1.0")
    m1 = await c.read_message()
    c.send(commands.fin(m1.id))
    m2 = await c.read_message()
    c.send(commands.req(m2.id, 60_000))  # deferred for a minute
    m3 = await c.read_message()
    assert (m1.body, m2.body, m3.body) == (b"m1", b"m2", b"m3")

    doc = await st.json()
    t = doc["topics"][0]
    assert (t["message_count"], t["message_bytes"], t["depth"]) == (3, 6, 0)
    ch = t["channels"][0]
    assert {k: ch[k] for k in CHANNEL_KEYS if k not in ("clients", "e2e_processing_latency")} == {
        "channel_name": "c",
        "depth": 0,
        "backend_depth": 0,
        "in_flight_count": 1,
        "deferred_count": 1,
        "message_count": 3,
        "requeue_count": 1,
        "timeout_count": 0,
        "client_count": 1,
        "paused": False,
    }
    (cl,) = ch["clients"]
    assert list(cl) == CLIENT_KEYS  # no pub_counts/authed: omitempty
    assert cl["client_id"] == "cid" and cl["hostname"] == "h.example"
    assert cl["user_agent"] == "test/1.0" and cl["version"] == "V2"
    assert cl["remote_address"] == local_address(c)
    assert (cl["state"], cl["ready_count"], cl["in_flight_count"]) == (3, 1, 1)
    assert (cl["message_count"], cl["finish_count"], cl["requeue_count"]) == (3, 1, 1)
    assert abs(cl["connect_ts"] - time.time()) < 60
    assert cl["tls"] is False and cl["deflate"] is False and cl["snappy"] is False
    assert doc["producers"] is None  # HTTP publishers are not clients
    await c.close()


async def test_timeout_count(nsqd, st):
    c = await consumer(nsqd, "t", "c", rdy=1, msg_timeout=1000)
    await st.post("/pub?topic=t", b"x")
    await c.read_message()

    async def timed_out():
        ch = (await st.json("topic=t"))["topics"][0]["channels"][0]
        return ch["timeout_count"] == 1 and ch

    ch = await wait_for(timed_out, timeout=10)
    assert ch["requeue_count"] == 0
    await c.close()


async def test_producers_and_pub_counts(nsqd, st):
    p1 = await RawClient.connect(nsqd.tcp_port)
    p1.send(commands.pub("a", b"1"))
    p1.send(commands.pub("a", b"2"))
    p1.send(commands.mpub("b", [b"3", b"4", b"5"]))
    for _ in range(3):
        assert await p1.read_frame() == (0, b"OK")
    p2 = await RawClient.connect(nsqd.tcp_port)
    assert await p2.pub("b", b"6") == (0, b"OK")
    idle = await RawClient.connect(nsqd.tcp_port)  # never published: not a producer
    await idle.identify(client_id="idle")

    doc = await st.json()
    prods = {p["remote_address"]: p for p in doc["producers"]}
    assert set(prods) == {local_address(p1), local_address(p2)}
    one = prods[local_address(p1)]
    assert list(one) == [*CLIENT_KEYS[:15], "pub_counts", *CLIENT_KEYS[15:]]
    assert one["pub_counts"] == [{"topic": "a", "count": 2}, {"topic": "b", "count": 3}]
    assert prods[local_address(p2)]["pub_counts"] == [{"topic": "b", "count": 1}]

    # a topic filter narrows pub_counts; a producer of other topics stays, without them
    prods = {p["remote_address"]: p for p in (await st.json("topic=a"))["producers"]}
    assert prods[local_address(p1)]["pub_counts"] == [{"topic": "a", "count": 2}]
    assert "pub_counts" not in prods[local_address(p2)]
    for c in (p1, p2, idle):
        await c.close()


async def test_topic_and_channel_filters(nsqd, st):
    for t, chans in (("a", ["c", "d"]), ("b", ["d"]), ("e", [])):
        await st.post(f"/topic/create?topic={t}")
        for ch in chans:
            await st.post(f"/channel/create?topic={t}&channel={ch}")

    def names(doc):
        return [(t["topic_name"], [c["channel_name"] for c in t["channels"]]) for t in doc["topics"]]

    assert names(await st.json("topic=a")) == [("a", ["c", "d"])]
    assert names(await st.json("topic=a&channel=d")) == [("a", ["d"])]
    # a channel filter alone keeps only topics that have that channel
    assert names(await st.json("channel=d")) == [("a", ["d"]), ("b", ["d"])]
    assert names(await st.json("topic=b&channel=c")) == []
    assert names(await st.json("topic=&channel=")) == [("a", ["c", "d"]), ("b", ["d"]), ("e", [])]
    # an unknown topic: Go returns before building anything, so both lists are null
    missing = await st.json("topic=nope")
    assert missing["topics"] is None and missing["producers"] is None


async def test_include_clients_and_include_mem(nsqd, st):
    c = await consumer(nsqd, "t", "c")
    p = await RawClient.connect(nsqd.tcp_port)
    assert await p.pub("t", b"x") == (0, b"OK")
    for value in ("false", "0"):
        doc = await st.json(f"include_clients={value}")
        ch = doc["topics"][0]["channels"][0]
        assert ch["clients"] is None and ch["client_count"] == 1
        assert doc["producers"] is None
    for value in ("true", "1", "yes", ""):
        doc = await st.json(f"include_clients={value}")
        assert len(doc["topics"][0]["channels"][0]["clients"]) == 1
        assert len(doc["producers"]) == 1
    for value in ("false", "0"):
        assert "memory" not in await st.json(f"include_mem={value}")
    assert "memory" in await st.json("include_mem=nonsense")
    await c.close()
    await p.close()


async def test_paused_flags(nsqd, st):
    await st.post("/topic/create?topic=t")
    await st.post("/channel/create?topic=t&channel=c")
    await st.post("/topic/pause?topic=t")
    await st.post("/channel/pause?topic=t&channel=c")
    t = (await st.json())["topics"][0]
    assert t["paused"] is True and t["channels"][0]["paused"] is True


async def test_stats_bad_query_is_invalid_request(st):
    assert (await st.raw("topic=%zz"))[::2] == (400, b'{"message":"INVALID_REQUEST"}')


# --- text report --------------------------------------------------------------------------------

HEADER = re.compile(
    r"nsqd v1\.3\.0 .*\n"
    r"start_time \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)\n"
    r"uptime (\d+h)?(\d+m)?[\d.]+(ns|µs|ms|s)\n"
    r"\n"
    r"Health: OK\n"
)


async def test_text_empty_daemon(nsqd, st):
    text = await st.text()
    m = HEADER.match(text)
    assert m, text
    rest = text[m.end() :]
    mem = "".join(f"   {k:<25}\t\\d+\n" for k in MEM_KEYS)
    assert re.fullmatch("\nMemory:\n" + mem + "\nTopics: None\n\nProducers: None\n", rest), rest
    # any format other than json is text
    assert HEADER.match(await st.text("format=text"))


async def test_text_without_memory(nsqd, st):
    text = await st.text("include_mem=false")
    rest = text[HEADER.match(text).end() :]
    assert rest == "\nTopics: None\n\nProducers: None\n"


async def test_text_layout(nsqd, st):
    await st.post("/topic/create?topic=a")
    c = await consumer(nsqd, "a", "c1", rdy=1, hostname="host1", user_agent="ua/2")
    await st.post("/mpub?topic=a", b"1\n2")
    await c.read_message()
    await st.post("/topic/pause?topic=a")
    await st.post("/topic/create?topic=b")
    await st.post("/channel/create?topic=b&channel=c2")
    await st.post("/channel/pause?topic=b&channel=c2")
    p = await RawClient.connect(nsqd.tcp_port)
    await p.identify(hostname="prod", user_agent="pub/1")
    assert await p.pub("zz", b"x") == (0, b"OK")
    assert await p.pub("zz", b"y") == (0, b"OK")

    text = await st.text("include_mem=0")
    rest = text[HEADER.match(text).end() :]
    lines = rest.split("\n")
    c_port = local_address(c).rpartition(":")[2]
    p_port = local_address(p).rpartition(":")[2]
    assert lines[0:2] == ["", "Topics:"]
    assert lines[2] == "*P [a              ] depth: 0     be-depth: 0     msgs: 2        e2e%: "
    assert lines[3] == (
        "      [c1                       ] depth: 1     be-depth: 0     inflt: 1    def: 0    "
        "re-q: 0     timeout: 0     msgs: 2        e2e%: "
    )
    ident = f"host1:{c_port} ua/2"
    assert re.fullmatch(
        re.escape(
            f"        [V2 {ident:<21}] state: 3 inflt: 1    rdy: 1    fin: 0        "
            f"re-q: 0        msgs: 1        connected: "
        )
        + r"\d+s",
        lines[4],
    ), lines[4]
    assert lines[5] == ""
    assert lines[6] == "   [b              ] depth: 0     be-depth: 0     msgs: 0        e2e%: "
    assert lines[7] == (
        "   *P [c2                       ] depth: 0     be-depth: 0     inflt: 0    def: 0    "
        "re-q: 0     timeout: 0     msgs: 0        e2e%: "
    )
    assert lines[8] == ""
    assert lines[9] == "   [zz             ] depth: 2     be-depth: 0     msgs: 2        e2e%: "
    assert lines[10:12] == ["", "Producers:"]
    ident = f"prod:{p_port} pub/1"
    assert re.fullmatch(
        re.escape(f"   [V2 {ident:<21}] msgs: 2        topics: zz=2 connected: ") + r"\d+s",
        lines[12],
    ), lines[12]
    assert lines[13:] == [""]
    # include_clients=false drops client lines and producers
    text = await st.text("include_mem=0&include_clients=false")
    assert "[V2 " not in text and text.endswith("\nProducers: None\n")
    await c.close()
    await p.close()


async def test_text_filters(nsqd, st):
    for t in ("a", "b"):
        await st.post(f"/topic/create?topic={t}")
    text = await st.text("topic=b&include_mem=false")
    assert "[a " not in text and "[b " in text
    text = await st.text("topic=nope&include_mem=false")
    assert text.endswith("\nTopics: None\n\nProducers: None\n")


# --- helpers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ns,text",
    [
        (0, "0s"),
        (1, "1ns"),
        (999, "999ns"),
        (1500, "1.5µs"),
        (1_500_000, "1.5ms"),
        (999_999_999, "999.999999ms"),
        (1_000_000_000, "1s"),
        (61_500_000_000, "1m1.5s"),
        (3_600_000_000_000, "1h0m0s"),
        (3_723_000_000_001, "1h2m3.000000001s"),
        (-1_500_000, "-1.5ms"),
    ],
)
def test_go_duration(ns, text):
    assert stats.go_duration(ns) == text


@pytest.mark.parametrize(
    "tz,text",
    [
        ("UTC0", "1970-01-01T00:00:00Z"),
        ("XYZ-05:30", "1970-01-01T05:30:00+05:30"),
        ("ABC+03", "1969-12-31T21:00:00-03:00"),
    ],
)
def test_rfc3339_local_time(monkeypatch, tz, text):
    monkeypatch.setenv("TZ", tz)
    time.tzset()
    try:
        assert stats.rfc3339(0) == text
    finally:
        monkeypatch.undo()
        time.tzset()


def test_go_json_escapes_html_like_go():
    assert go_json({"a": "<b>&é\u2028", "n": None, "l": [1, True]}) == (
        '{"a":"\\u003cb\\u003e\\u0026é\\u2028","n":null,"l":[1,true]}'.encode()
    )


def test_nanoseconds_to_human():
    assert [stats.nanoseconds_to_human(v) for v in (500, 1500, 2_000_001, 3e9)] == [
        "500.0ns",
        "1.5us",
        "2.0ms",
        "3.0s",
    ]


def test_percentile_is_nsq_nearest_rank():
    arr = list(range(1, 101))
    assert stats._percentile(100.0, arr) == 100
    assert stats._percentile(99.0, arr) == 100
    assert stats._percentile(95.0, arr) == 96
    assert stats._percentile(99.0, []) == 0


def test_gc_tracker_records_pauses_and_runs():
    stats.install_gc_tracker()
    stats.install_gc_tracker()  # idempotent
    assert gc.callbacks.count(stats._gc_callback) == 1
    before = stats.mem_stats()["gc_total_runs"]
    n = len(stats._gc_pauses)
    gc.collect()
    after = stats.mem_stats()
    assert after["gc_total_runs"] > before
    assert len(stats._gc_pauses) > n or len(stats._gc_pauses) == 256
    assert after["gc_pause_usec_100"] >= after["gc_pause_usec_99"] >= after["gc_pause_usec_95"]


async def test_deferred_count_from_dpub(tmp_path):
    async with NSQD(make_options(tmp_path)) as d:
        p = await RawClient.connect(d.tcp_port)
        await p.sub("t", "c")  # the channel exists before the DPUB arrives
        p2 = await RawClient.connect(d.tcp_port)
        p2.send(commands.dpub("t", 60_000, b"x"))
        assert await p2.read_frame() == (0, b"OK")
        doc = stats.stats_document(d)
        assert doc["topics"][0]["channels"][0]["deferred_count"] == 1
        await p.close()
        await p2.close()
