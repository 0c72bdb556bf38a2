"""Queue policies end to end: the nsqd console script, its HTTP settings API, and real
clients — the official pynsq (in its own process, tests/interop/pynsq_policy_driver.py) and
our own asyncio client — through the dead-letter path, bounds, the rate and a restart."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest
from e2e.proc import NsqdProcess, nsqd_fixture
from interop_helpers import drive, make_bodies

from nsqpy.client import Consumer, Producer
from nsqpy.client.errors import MPubFailedError, PubFailedError

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def nsqd_proc(tmp_path):
    yield from nsqd_fixture(tmp_path)


def http(p: NsqdProcess, method: str, path: str, body: object = None) -> tuple[int, object]:
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{p.http_address}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def channel(p: NsqdProcess, topic: str, name: str, settings: dict) -> None:
    assert http(p, "POST", f"/topic/create?topic={topic}")[0] == 200
    assert http(p, "POST", f"/channel/create?topic={topic}&channel={name}")[0] == 200
    status, doc = http(p, "POST", f"/channel/config?topic={topic}&channel={name}", settings)
    assert status == 200, doc


def test_pynsq_poison_messages_reach_the_dead_letter_topic(nsqd_proc):
    """pynsq's Reader REQs three poison messages every time: after max_attempts (3) nsqd
    publishes them to the dead-letter topic, where another pynsq Reader gets them."""
    channel(nsqd_proc, "orders", "billing", {"max_attempts": 3, "dead_letter_topic": "orders.dlq"})
    bodies = make_bodies("order", 10, 7)
    poison = bodies[2:5]
    spec = {
        "nsqd": nsqd_proc.tcp_address,
        "topic": "orders",
        "channel": "billing",
        "dead_letter_topic": "orders.dlq",
        "pub": [b.hex() for b in bodies],
        "poison": [b.hex() for b in poison],
        "expect": 3,
        "deadline": 30,
    }
    result = drive("pynsq_policy_driver.py", spec, timeout=45)
    assert result["status"] == "ok", result["error"] + result["_stderr"][-3000:]
    assert all(r["ok"] for r in result["pub_results"]), result["pub_results"]
    tries: dict[str, list[int]] = {}
    for d in result["deliveries"]:
        tries.setdefault(d["body"], []).append(d["attempts"])
    for b in bodies:
        assert sorted(tries[b.hex()]) == ([1, 2, 3] if b in poison else [1]), (b, tries[b.hex()])
    assert sorted(d["body"] for d in result["dead_letters"]) == sorted(b.hex() for b in poison)
    assert all(d["attempts"] == 1 for d in result["dead_letters"])  # a new message there
    _, doc = http(nsqd_proc, "GET", "/stats?format=json&topic=orders")
    (c,) = doc["topics"][0]["channels"]
    assert (c["dead_letter_count"], c["dropped_count"], c["expired_count"]) == (3, 0, 0)


def test_pynsq_stale_messages_are_dead_lettered_not_delivered(nsqd_proc):
    """Messages older than max_age when a consumer comes are not delivered: they go to the
    dead-letter topic; a fresh one is delivered."""
    channel(nsqd_proc, "events", "late", {"max_age": "500ms", "dead_letter_topic": "events.expired"})
    stale = make_bodies("stale", 5, 3)
    for b in stale:
        assert http(nsqd_proc, "POST", "/pub?topic=events", b)[0] == 200
    time.sleep(0.7)  # older than max_age by the time pynsq subscribes
    fresh = make_bodies("fresh", 2, 4)
    spec = {
        "nsqd": nsqd_proc.tcp_address,
        "topic": "events",
        "channel": "late",
        "dead_letter_topic": "events.expired",
        "pub": [b.hex() for b in fresh],
        "expect": 5,
        "deadline": 30,
    }
    result = drive("pynsq_policy_driver.py", spec, timeout=45)
    assert result["status"] == "ok", result["error"] + result["_stderr"][-3000:]
    assert sorted(d["body"] for d in result["deliveries"]) == sorted(b.hex() for b in fresh)
    assert sorted(d["body"] for d in result["dead_letters"]) == sorted(b.hex() for b in stale)


async def test_our_client_bounds_dead_letters_rate_and_a_restart(tmp_path):
    """Our Producer is refused past a reject bound (nothing of the MPUB stored), a
    drop_oldest channel keeps the newest, a failing handler's messages reach the dead-letter
    topic, max_rate paces our Consumer, and every setting survives a restart."""
    p = NsqdProcess(tmp_path / "nsqd").start()
    try:
        addr = p.tcp_address
        channel(p, "jobs", "bounded", {"max_depth": 5})
        channel(p, "jobs", "recent", {"max_depth": 3, "overflow": "drop_oldest"})
        async with Producer(addr) as prod:
            await prod.publish_many("jobs", [b"j%d" % i for i in range(5)])
            with pytest.raises(MPubFailedError, match=r"channel jobs:bounded is full \(max_depth 5\)"):
                await prod.publish_many("jobs", [b"x", b"y"])
        async with Producer(addr) as prod:
            with pytest.raises(PubFailedError, match="is full"):
                await prod.publish("jobs", b"z")
        _, doc = http(p, "GET", "/stats?format=json&topic=jobs")
        depths = {c["channel_name"]: c["depth"] for c in doc["topics"][0]["channels"]}
        assert depths == {"bounded": 5, "recent": 3}
        # settings survive a restart
        assert p.stop() == 0
        p = NsqdProcess(tmp_path / "nsqd").start()
        addr = p.tcp_address
        assert http(p, "GET", "/channel/config?topic=jobs&channel=recent")[1]["overflow"] == "drop_oldest"
        async with Consumer("jobs", "recent", nsqd_tcp_addresses=addr, max_in_flight=10) as c:
            got = []
            async for msg in c:
                msg.finish()
                got.append(msg.body)
                if len(got) == 3:
                    break
        assert sorted(got) == [b"j2", b"j3", b"j4"]
        # a handler that fails every time: after 2 attempts the message is a dead letter
        channel(p, "jobs", "failing", {"max_attempts": 2, "dead_letter_topic": "jobs.failed"})
        assert http(p, "POST", "/channel/config?topic=jobs&channel=bounded", {"max_depth": None})[0] == 200
        async with Producer(addr) as prod:
            await prod.publish("jobs", b"boom")
        async with (
            Consumer("jobs", "failing", nsqd_tcp_addresses=addr, default_requeue_delay=0) as c,
            Consumer("jobs.failed", "ops", nsqd_tcp_addresses=addr) as dead,
        ):
            attempts = []

            async def fail() -> None:
                async for msg in c:
                    attempts.append(msg.attempts)
                    msg.requeue(0, backoff=False)

            failing = asyncio.create_task(fail())
            msg = await asyncio.wait_for(dead.__anext__(), 20)
            msg.finish()
            failing.cancel()
        assert msg.body == b"boom" and attempts == [1, 2]
        # max_rate: 30 messages at 10 a second (a full bucket of 10 first)
        channel(p, "paced", "slow", {"max_rate": 10})
        async with Producer(addr) as prod:
            await prod.publish_many("paced", [b"p%02d" % i for i in range(30)])
        start = time.monotonic()
        async with Consumer("paced", "slow", nsqd_tcp_addresses=addr, max_in_flight=50) as c:
            n = 0
            async for msg in c:
                msg.finish()
                n += 1
                if n == 30:
                    break
        assert time.monotonic() - start >= 1.5
    finally:
        assert p.stop() == 0
    assert "Traceback" not in p.stderr(), p.describe()
