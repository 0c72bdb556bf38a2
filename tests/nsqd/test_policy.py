"""Queue policies (nsqd/policy.py, an nsqpy addition): the HTTP settings API and what each
key does, through the real protocol and HTTP API of an in-process nsqd."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from conftest import make_options
from support import RawClient

from nsqpy.nsqd.nsqd import NSQD
from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(60)

TOPIC_DEFAULTS = {"max_depth": None, "max_bytes": None, "overflow": "reject", "max_age": None}
CHANNEL_DEFAULTS = {**TOPIC_DEFAULTS, "max_attempts": None, "dead_letter_topic": None, "max_rate": None}


class Api:
    def __init__(self, d: NSQD, session: aiohttp.ClientSession) -> None:
        self.base = f"http://127.0.0.1:{d.http_port}"
        self.session = session

    async def call(self, method: str, path: str, body: bytes | str | None = None) -> tuple[int, object]:
        async with self.session.request(method, self.base + path, data=body) as r:
            text = await r.text()
            try:
                return r.status, json.loads(text)
            except ValueError:
                return r.status, text

    async def config(self, path: str, settings: object) -> tuple[int, object]:
        return await self.call("POST", path, json.dumps(settings))


@pytest.fixture
async def api(nsqd):
    async with aiohttp.ClientSession() as s:
        a = Api(nsqd, s)
        assert (await a.call("POST", "/topic/create?topic=t"))[0] == 200
        assert (await a.call("POST", "/channel/create?topic=t&channel=c"))[0] == 200
        yield a


async def publish(d: NSQD, bodies: list[bytes], topic: str = "t") -> None:
    p = await RawClient.connect(d.tcp_port)
    p.send(commands.mpub(topic, bodies))
    assert await p.read_frame() == (0, b"OK")
    await p.close()


# ---------------------------------------------------------------- the API


async def test_get_answers_every_key(api):
    assert await api.call("GET", "/topic/config?topic=t") == (200, TOPIC_DEFAULTS)
    assert await api.call("GET", "/channel/config?topic=t&channel=c") == (200, CHANNEL_DEFAULTS)


async def test_post_sets_the_named_keys_and_null_unsets(api, nsqd):
    status, doc = await api.config("/channel/config?topic=t&channel=c", {"max_depth": 5, "max_age": "90s"})
    assert status == 200 and doc == {**CHANNEL_DEFAULTS, "max_depth": 5, "max_age": "1m30s"}
    status, doc = await api.config("/channel/config?topic=t&channel=c", {"max_rate": 2.5, "max_depth": None})
    assert doc == {**CHANNEL_DEFAULTS, "max_age": "1m30s", "max_rate": 2.5}
    assert await api.call("GET", "/channel/config?topic=t&channel=c") == (200, doc)
    status, doc = await api.config(
        "/topic/config?topic=t", {"max_bytes": 1000, "overflow": "drop_oldest", "max_age": "1h"}
    )
    assert doc == {"max_depth": None, "max_bytes": 1000, "overflow": "drop_oldest", "max_age": "1h0m0s"}
    # every key unset: the queue has no policy again
    await api.config("/channel/config?topic=t&channel=c", {"max_age": None, "max_rate": None})
    assert nsqd.topics["t"].channels["c"].policy is None


@pytest.mark.parametrize(
    ("path", "body", "names"),
    [
        ("/topic/config?topic=t", {"max_attempts": 3}, '"max_attempts"'),
        ("/channel/config?topic=t&channel=c", {"color": "red"}, '"color"'),
        ("/channel/config?topic=t&channel=c", {"max_depth": 0}, "max_depth 0"),
        ("/channel/config?topic=t&channel=c", {"max_depth": "10"}, 'max_depth "10"'),
        ("/channel/config?topic=t&channel=c", {"max_bytes": 1.5}, "max_bytes 1.5"),
        ("/channel/config?topic=t&channel=c", {"max_depth": True}, "max_depth true"),
        ("/channel/config?topic=t&channel=c", {"overflow": "block"}, 'overflow "block"'),
        ("/channel/config?topic=t&channel=c", {"max_age": "10"}, 'max_age "10"'),
        ("/channel/config?topic=t&channel=c", {"max_age": "-1s"}, 'max_age "-1s"'),
        ("/channel/config?topic=t&channel=c", {"max_age": 10}, "max_age 10"),
        ("/channel/config?topic=t&channel=c", {"max_attempts": 70000}, "max_attempts 70000"),
        ("/channel/config?topic=t&channel=c", {"dead_letter_topic": "no good"}, '"no good"'),
        ("/channel/config?topic=t&channel=c", {"dead_letter_topic": "t"}, "own topic"),
        ("/channel/config?topic=t&channel=c", {"max_rate": 0}, "max_rate 0"),
        ("/channel/config?topic=t&channel=c", [1, 2], "JSON object"),
    ],
)
async def test_bad_input_is_400_naming_it_and_changes_nothing(api, nsqd, path, body, names):
    await api.config("/channel/config?topic=t&channel=c", {"max_depth": 7})
    before = dict((await api.call("GET", path))[1])
    status, doc = await api.config(path, {"max_age": "1h", **body} if isinstance(body, dict) else body)
    assert status == 400 and names in doc["message"], doc
    assert (await api.call("GET", path))[1] == before  # not even the good key of the body


async def test_unknown_queues_and_malformed_requests(api):
    status, doc = await api.call("GET", "/topic/config?topic=nope")
    assert status == 400 and doc["message"] == 'unknown topic "nope"'
    status, doc = await api.config("/channel/config?topic=t&channel=nope", {"max_depth": 1})
    assert status == 400 and doc["message"] == 'unknown channel "t:nope"'
    status, doc = await api.call("POST", "/channel/config?topic=t&channel=c", "{not json")
    assert status == 400 and doc["message"].startswith("the body is not JSON")
    assert (await api.call("GET", "/topic/config"))[0] == 400  # MISSING_ARG_TOPIC
    assert (await api.call("GET", "/channel/config?topic=t"))[0] == 400
    assert (await api.call("PUT", "/topic/config?topic=t", "{}"))[0] == 405


async def test_settings_are_kept_in_nsqd_dat_and_survive_a_restart(tmp_path):
    async with NSQD(make_options(tmp_path)) as d, aiohttp.ClientSession() as s:
        api = Api(d, s)
        await api.call("POST", "/topic/create?topic=t")
        await api.call("POST", "/channel/create?topic=t&channel=c")
        await api.config("/topic/config?topic=t", {"max_depth": 100})
        await api.config(
            "/channel/config?topic=t&channel=c", {"max_attempts": 3, "dead_letter_topic": "t.dlq"}
        )
        meta = json.loads((tmp_path / "nsqd.dat").read_text())  # written before the answer
        (t,) = meta["topics"]
        assert t["config"] == {"max_depth": 100}
        assert t["channels"] == [
            {"name": "c", "paused": False, "config": {"max_attempts": 3, "dead_letter_topic": "t.dlq"}}
        ]
    async with NSQD(make_options(tmp_path)) as d, aiohttp.ClientSession() as s:
        api = Api(d, s)
        assert (await api.call("GET", "/topic/config?topic=t"))[1]["max_depth"] == 100
        doc = (await api.call("GET", "/channel/config?topic=t&channel=c"))[1]
        assert doc["max_attempts"] == 3 and doc["dead_letter_topic"] == "t.dlq"


# ---------------------------------------------------------------- bounds


@pytest.mark.parametrize("mem", [10000, 2], ids=["memory", "disk"])
async def test_reject_refuses_a_publish_whole(tmp_path, mem):
    async with NSQD(make_options(tmp_path, mem_queue_size=mem)) as d, aiohttp.ClientSession() as s:
        api = Api(d, s)
        await api.call("POST", "/topic/create?topic=t")
        await api.call("POST", "/channel/create?topic=t&channel=c")
        await api.config("/channel/config?topic=t&channel=c", {"max_depth": 5})
        await publish(d, [b"a", b"b", b"c"])
        ch = d.topics["t"].channels["c"]
        p = await RawClient.connect(d.tcp_port)
        p.send(commands.mpub("t", [b"d", b"e", b"f"]))  # 6 > 5: none of it
        assert await p.read_frame() == (1, b"E_MPUB_FAILED MPUB failed channel t:c is full (max_depth 5)")
        assert ch.depth == 3
        # not a broken connection: the same one publishes what fits
        p.send(commands.mpub("t", [b"d", b"e"]))
        assert await p.read_frame() == (0, b"OK")
        await p.close()
        d.topics["t"].channels["c"].empty()
        await publish(d, [b"a", b"b", b"c"])
        status, doc = await api.call("POST", "/pub?topic=t", b"x" * 10)
        assert (status, doc) == (200, "OK")
        status, doc = await api.call("POST", "/mpub?topic=t", b"y\nz")
        assert status == 503 and doc == {"message": "channel t:c is full (max_depth 5)"}
        assert ch.depth == 4
        # bytes of bodies: 4 held (a, b, c and ten x's: 13 bytes)
        await api.config("/channel/config?topic=t&channel=c", {"max_depth": None, "max_bytes": 15})
        status, doc = await api.call("POST", "/pub?topic=t", b"123")
        assert status == 503 and doc == {"message": "channel t:c is full (max_bytes 15)"}
        assert (await api.call("POST", "/pub?topic=t", b"12"))[0] == 200
        assert ch.depth == 5 and ch.depth_bytes == 15


async def test_a_topic_bound_counts_what_the_topic_holds(api, nsqd):
    await api.call("POST", "/topic/create?topic=held")
    await api.config("/topic/config?topic=held", {"max_depth": 2})
    await publish(nsqd, [b"1", b"2"], topic="held")
    status, doc = await api.call("POST", "/pub?topic=held", b"3")
    assert status == 503 and doc["message"] == "topic held is full (max_depth 2)"
    # once a channel takes them, the topic holds nothing
    c = await RawClient.connect(nsqd.tcp_port)
    await c.sub("held", "c", rdy=10)
    assert sorted(m.body for m in await c.read_messages(2)) == [b"1", b"2"]
    assert (await api.call("POST", "/pub?topic=held", b"3"))[0] == 200
    await c.close()


@pytest.mark.parametrize("mem", [10000, 3], ids=["memory", "disk"])
async def test_drop_oldest_keeps_the_newest(tmp_path, mem):
    async with NSQD(make_options(tmp_path, mem_queue_size=mem)) as d, aiohttp.ClientSession() as s:
        api = Api(d, s)
        await api.call("POST", "/topic/create?topic=t")
        await api.call("POST", "/channel/create?topic=t&channel=c")
        await api.config("/channel/config?topic=t&channel=c", {"max_depth": 4, "overflow": "drop_oldest"})
        await publish(d, [b"m%d" % i for i in range(10)])
        ch = d.topics["t"].channels["c"]
        assert ch.depth == 4 and ch.dropped_count == 6
        c = await RawClient.connect(d.tcp_port)
        await c.sub("t", "c", rdy=10)
        got = await c.read_messages(4)
        assert sorted(m.body for m in got) == [b"m6", b"m7", b"m8", b"m9"]
        for m in got:
            c.send(commands.fin(m.id))
        await c.expect_silence(0.2)
        await c.close()
        # a bytes bound, set on a full queue, applies at once
        await publish(d, [b"aaaa", b"bb", b"cc"])
        await api.config("/channel/config?topic=t&channel=c", {"max_depth": None, "max_bytes": 4})
        assert ch.depth == 2 and ch.depth_bytes == 4 and ch.dropped_count == 7


# ---------------------------------------------------------------- delivery: age, attempts, rate


async def test_max_age_drops_or_dead_letters_what_is_too_old(api, nsqd):
    await publish(nsqd, [b"old-1", b"old-2"])
    await asyncio.sleep(0.3)
    await api.config("/channel/config?topic=t&channel=c", {"max_age": "200ms"})
    await publish(nsqd, [b"fresh"])
    c = await RawClient.connect(nsqd.tcp_port)
    await c.sub("t", "c", rdy=10)
    assert (await c.read_message()).body == b"fresh"
    await c.expect_silence(0.2)
    ch = nsqd.topics["t"].channels["c"]
    assert ch.expired_count == 2 and ch.depth == 0
    # with a dead-letter topic they go there, to be read like any message
    await api.config("/channel/config?topic=t&channel=c", {"dead_letter_topic": "t.dlq"})
    c.send(commands.rdy(0))
    await publish(nsqd, [b"stale"])
    await asyncio.sleep(0.3)
    dlq = await RawClient.connect(nsqd.tcp_port)
    await dlq.sub("t.dlq", "inspect", rdy=10)
    c.send(commands.rdy(10))
    m = await dlq.read_message()
    assert m.body == b"stale" and m.attempts == 1
    assert ch.expired_count == 3 and ch.dead_letter_count == 1
    await c.close()
    await dlq.close()


@pytest.mark.parametrize("dlq", [True, False], ids=["dead-letter", "drop"])
async def test_max_attempts(api, nsqd, dlq):
    settings: dict = {"max_attempts": 2}
    if dlq:
        settings["dead_letter_topic"] = "poison"
    await api.config("/channel/config?topic=t&channel=c", settings)
    await publish(nsqd, [b"bad", b"good"])
    c = await RawClient.connect(nsqd.tcp_port)
    await c.sub("t", "c", rdy=10)
    seen = []
    for _ in range(4):  # bad and good twice each: REQ'd
        m = await c.read_message()
        seen.append((m.body, m.attempts))
        c.send(commands.req(m.id, 0) if m.body == b"bad" or m.attempts == 1 else commands.fin(m.id))
    await c.expect_silence(0.3)  # a third attempt of bad is not made
    assert sorted(seen) == [(b"bad", 1), (b"bad", 2), (b"good", 1), (b"good", 2)]
    ch = nsqd.topics["t"].channels["c"]
    if dlq:
        assert ch.dead_letter_count == 1 and ch.dropped_count == 0
        p = await RawClient.connect(nsqd.tcp_port)
        await p.sub("poison", "c", rdy=1)
        assert (await p.read_message()).body == b"bad"
        await p.close()
    else:
        assert ch.dropped_count == 1 and "poison" not in nsqd.topics
    await c.close()


async def test_max_rate_paces_delivery_over_all_consumers(api, nsqd):
    await api.config("/channel/config?topic=t&channel=c", {"max_rate": 20})
    await publish(nsqd, [b"r%02d" % i for i in range(40)])
    consumers = [await RawClient.connect(nsqd.tcp_port) for _ in range(2)]
    start = time.monotonic()
    for c in consumers:
        await c.sub("t", "c", rdy=100)
    got = []

    async def read(c: RawClient) -> None:
        while len(got) < 40:
            try:
                m = await c.read_message(timeout=0.2)
            except TimeoutError:
                continue
            got.append(m.body)
            c.send(commands.fin(m.id))

    await asyncio.wait_for(asyncio.gather(*(read(c) for c in consumers)), 10)
    # a full bucket (20) at once, then 20 a second: the last ones come after ~1 s
    assert time.monotonic() - start >= 0.8
    assert sorted(got) == [b"r%02d" % i for i in range(40)]
    for c in consumers:
        await c.close()


# ---------------------------------------------------------------- what shows


async def test_stats_and_metrics_show_settings_and_counts(api, nsqd):
    _, doc = await api.call("GET", "/stats?format=json&topic=t")
    (t,) = doc["topics"]
    assert "config" not in t and "config" not in t["channels"][0]  # none: Go's document
    await api.config("/channel/config?topic=t&channel=c", {"max_depth": 2, "overflow": "drop_oldest"})
    await publish(nsqd, [b"1", b"2", b"3"])
    _, doc = await api.call("GET", "/stats?format=json&topic=t")
    (c,) = doc["topics"][0]["channels"]
    assert c["config"] == {**CHANNEL_DEFAULTS, "max_depth": 2, "overflow": "drop_oldest"}
    assert (c["expired_count"], c["dropped_count"], c["dead_letter_count"]) == (0, 1, 0)
    _, text = await api.call("GET", "/stats?topic=t")
    assert "policy: max_depth=2 overflow=drop_oldest expired: 0 dropped: 1 dead-letters: 0" in text
    _, text = await api.call("GET", "/metrics")
    assert 'nsq_channel_dropped_total{channel="c",topic="t"} 1.0' in text
    assert 'nsq_channel_dead_letter_total{channel="c",topic="t"} 0.0' in text
