"""``--e2e-processing-latency-percentile``: FIN latencies in ``/stats`` (JSON and text) per
channel and aggregated per topic, as Go's ``Channel.FinishMessage`` records them."""

from __future__ import annotations

import json
import re
import time

import aiohttp
import pytest
from conftest import make_options
from support import RawClient, wait_for

from nsqpy.nsqd.nsqd import NSQD
from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(30)

MS = 1_000_000


async def get(port: int, query: str) -> bytes:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/stats?{query}") as r:
        assert r.status == 200
        return await r.read()


async def consumers(nsqd: NSQD, topic: str, channels: list[str], n: int, rdy: int = 100):
    """One consumer per channel, each with the same ``n`` messages (published over TCP once
    every channel exists) in flight."""
    cs = []
    for name in channels:
        c = await RawClient.connect(nsqd.tcp_port)
        await c.sub(topic, name, rdy)
        cs.append(c)
    p = await RawClient.connect(nsqd.tcp_port)
    p.send(commands.mpub(topic, [b"m%d" % i for i in range(n)]))
    assert await p.read_frame() == (0, b"OK")
    got = [await c.read_messages(n) for c in cs]
    await p.close()
    return cs, got


async def delivered(nsqd: NSQD, topic: str, channel: str, n: int, rdy: int = 100):
    (c,), (msgs,) = await consumers(nsqd, topic, [channel], n, rdy)
    return c, msgs


def finish_on_server(nsqd: NSQD, topic: str, channel: str, msg_id: bytes) -> None:
    """FIN through ``Channel.finish``, the checked path (as an E_FIN_FAILED-free FIN)."""
    ch = nsqd.topics[topic].channels[channel]
    msg = ch.in_flight[msg_id]
    assert ch.finish(msg.client, msg_id) is None


async def test_channel_and_topic_latency_json(tmp_path):
    opts = make_options(tmp_path, e2e_processing_latency_percentiles=[1.0, 0.5])
    async with NSQD(opts) as nsqd:
        await nsqd_http_create(nsqd, "empty")
        (c1, c2), (m1, m2) = await consumers(nsqd, "t", ["a", "b"], 2)
        before = time.time_ns()
        ts = nsqd.topics["t"].channels["a"].in_flight[m1[0].id].timestamp
        for msg in m1:
            finish_on_server(nsqd, "t", "a", msg.id)
        finish_on_server(nsqd, "t", "b", m2[0].id)
        longest = time.time_ns() - ts
        assert before - ts > 0

        raw = await get(nsqd.http_port, "format=json")
        doc = json.loads(raw)
        topics = {t["topic_name"]: t for t in doc["topics"]}
        # a topic without channels has no stream: Go's nil quantile
        assert topics["empty"]["e2e_processing_latency"] == {"count": 0, "percentiles": None}
        a, b = topics["t"]["channels"]
        assert a["e2e_processing_latency"]["count"] == 2
        assert b["e2e_processing_latency"]["count"] == 1
        assert [p["quantile"] for p in a["e2e_processing_latency"]["percentiles"]] == [1, 0.5]
        pa = {p["quantile"]: p["value"] for p in a["e2e_processing_latency"]["percentiles"]}
        pb = {p["quantile"]: p["value"] for p in b["e2e_processing_latency"]["percentiles"]}
        for v in (*pa.values(), *pb.values()):
            assert before - ts - 1 <= v <= longest
        tl = topics["t"]["e2e_processing_latency"]
        assert tl["count"] == 3  # the channels merged
        assert tl["percentiles"][0] == {"quantile": 1, "value": max(pa[1], pb[1])}
        # Go's bytes: map keys sorted, a whole float without ".0", values integral
        assert re.search(
            rb'"e2e_processing_latency":\{"count":1,"percentiles":\[\{"quantile":1,'
            rb'"value":\d+\},\{"quantile":0\.5,"value":\d+\}\]\}\}',
            raw,
        ), raw
        # a channel filter still aggregates all of the topic's channels
        doc = json.loads(await get(nsqd.http_port, "format=json&topic=t&channel=a"))
        assert doc["topics"][0]["e2e_processing_latency"]["count"] == 3
        for c in (c1, c2):
            await c.close()


async def test_reported_values(tmp_path):
    opts = make_options(tmp_path, e2e_processing_latency_percentiles=[1.0, 0.5])
    async with NSQD(opts) as nsqd:
        (c,), _ = await consumers(nsqd, "t", ["a"], 1)
        ch = nsqd.topics["t"].channels["a"]
        now = time.time_ns()
        for ms in (10, 20, 30, 40):
            ch.record_latency(now - ms * MS, now)
        doc = json.loads(await get(nsqd.http_port, "format=json"))
        lat = doc["topics"][0]["channels"][0]["e2e_processing_latency"]
        assert lat["count"] == 4
        one, half = (p["value"] for p in lat["percentiles"])
        assert one == 40 * MS  # the largest is exact
        assert abs(half - 20 * MS) <= 20 * MS / 100  # nearest rank, within 1%
        await c.close()


async def nsqd_http_create(nsqd: NSQD, topic: str) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{nsqd.http_port}/topic/create?topic={topic}") as r,
    ):
        assert r.status == 200


async def test_configured_but_no_fin_yet(tmp_path):
    opts = make_options(tmp_path, e2e_processing_latency_percentiles=[0.99])
    async with NSQD(opts) as nsqd:
        c, _ = await delivered(nsqd, "t", "c", 1)
        doc = json.loads(await get(nsqd.http_port, "format=json"))
        t = doc["topics"][0]
        zero = {"count": 0, "percentiles": [{"quantile": 0.99, "value": 0}]}
        assert t["e2e_processing_latency"] == zero
        assert t["channels"][0]["e2e_processing_latency"] == zero
        await c.close()


async def test_text_report_e2e_columns(tmp_path):
    opts = make_options(tmp_path, e2e_processing_latency_percentiles=[0.99, 0.5])
    async with NSQD(opts) as nsqd:
        c, msgs = await delivered(nsqd, "t", "c", 1)
        ch = nsqd.topics["t"].channels["c"]
        ts = ch.in_flight[msgs[0].id].timestamp
        ch.record_latency(ts, ts + 2 * 1_000_000_000 + 500 * MS)  # 2.5s
        text = (await get(nsqd.http_port, "")).decode()
        # Go: "e2e%: " then NanoSecondToHuman of each percentile, ", "-separated
        assert re.search(r"\[t\s*\] depth: .* msgs: 1\s+e2e%: 2\.5s, 2\.5s\n", text), text
        assert re.search(r"\[c\s*\] depth: .* msgs: 1\s+e2e%: 2\.5s, 2\.5s\n", text), text
        await c.close()


async def test_off_by_default(nsqd):
    c, _msgs = await delivered(nsqd, "t", "c", 1)
    ch = nsqd.topics["t"].channels["c"]
    assert ch.e2e is None
    ch.record_latency(0)  # a no-op
    doc = json.loads(await get(nsqd.http_port, "format=json"))
    assert doc["topics"][0]["channels"][0]["e2e_processing_latency"] == {
        "count": 0,
        "percentiles": None,
    }
    text = (await get(nsqd.http_port, "")).decode()
    assert re.search(r"msgs: 1\s+e2e%: \n", text), text
    await c.close()


async def test_tcp_fin_records_latency(tmp_path):
    opts = make_options(tmp_path, e2e_processing_latency_percentiles=[1.0])
    async with NSQD(opts) as nsqd:
        c, msgs = await delivered(nsqd, "t", "c", 3)
        before = time.time_ns()
        for m in msgs:
            c.send(commands.fin(m.id))

        async def counted():
            doc = json.loads(await get(nsqd.http_port, "format=json"))
            return doc["topics"][0]["channels"][0]["e2e_processing_latency"]["count"] == 3

        await wait_for(counted, timeout=3)
        lat = nsqd.topics["t"].channels["c"].e2e.result(time.time_ns())["percentiles"][0]
        assert 0 < lat["value"] < time.time_ns() - before + 5_000 * MS
        await c.close()
