"""Peek, requeue, remove and redrive (nsqd/peek.py, an nsqpy addition): through the real
HTTP API and protocol of an in-process nsqd, in every queue mode (memory, memory then disk,
disk, crash-safe). Kills during a redrive are tests/e2e/test_peek_script.py's."""

from __future__ import annotations

import asyncio
import base64
import json
import os

import aiohttp
import pytest
from conftest import make_options
from support import RawClient, wait_for

from nsqpy.adminauth import AdminTokenError
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(60)

MODES = {
    "memory": {"mem_queue_size": 10000},
    "mixed": {"mem_queue_size": 4},
    "disk": {"mem_queue_size": 0},
    "crash-safe": {"mem_queue_size": 0, "sync_every": 1},
}


class Api:
    def __init__(self, d: NSQD, session: aiohttp.ClientSession, headers: dict | None = None) -> None:
        self.base = f"http://127.0.0.1:{d.http_port}"
        self.session = session
        self.headers = headers or {}

    async def call(self, method: str, path: str, body: bytes | None = None, **headers) -> tuple[int, object]:
        async with self.session.request(
            method, self.base + path, data=body, headers={**self.headers, **headers}
        ) as r:
            text = await r.text()
            try:
                return r.status, json.loads(text)
            except ValueError:
                return r.status, text

    async def peek(self, n: int = 1000, topic: str = "t", channel: str | None = "c") -> dict:
        path = f"/topic/peek?topic={topic}&n={n}"
        if channel is not None:
            path = f"/channel/peek?topic={topic}&channel={channel}&n={n}"
        status, doc = await self.call("GET", path)
        assert status == 200, doc
        assert isinstance(doc, dict)
        return doc


async def publish(d: NSQD, bodies: list[bytes], topic: str = "t") -> None:
    p = await RawClient.connect(d.tcp_port)
    for i in range(0, len(bodies), 100):
        p.send(commands.mpub(topic, bodies[i : i + 100]))
        assert await p.read_frame() == (0, b"OK")
    await p.close()


async def dpub(d: NSQD, body: bytes, ms: int, topic: str = "t") -> None:
    p = await RawClient.connect(d.tcp_port)
    p.send(commands.dpub(topic, ms, body))
    assert await p.read_frame() == (0, b"OK")
    await p.close()


def bodies_of(entries: list) -> list[bytes]:
    return [base64.b64decode(m["body_base64"]) for m in entries]


def counts(d: NSQD, topic: str = "t", channel: str = "c") -> tuple:
    ch = d.topics[topic].channels[channel]
    return ch.depth, len(ch.in_flight), ch.deferred_count, ch.backend.depth, ch.requeue_count


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s


# ---------------------------------------------------------------- peek


@pytest.mark.parametrize("mode", MODES)
async def test_peek_shows_what_the_next_consumer_receives_and_changes_nothing(tmp_path, session, mode):
    async with NSQD(make_options(tmp_path, **MODES[mode])) as d:
        api = Api(d, session)
        d.get_topic("t").get_channel("c")
        await publish(d, [b"m%02d" % i for i in range(12)])
        await dpub(d, b"later", 60_000)
        # one in flight, one REQ'd with a delay, one REQ'd at once (to the back of the queue)
        c = await RawClient.connect(d.tcp_port)
        await c.sub("t", "c", rdy=3)
        got = await c.read_messages(3)
        c.send(commands.rdy(0))
        c.send(commands.req(got[1].id, 30_000))
        c.send(commands.req(got[2].id, 0))
        await wait_for(lambda: d.topics["t"].channels["c"].requeue_count == 2)
        await c.expect_silence(0.2)
        before = counts(d)
        doc = await api.peek()
        assert counts(d) == before  # peeking changed nothing
        again = await api.peek()
        for key in ("messages", "deferred", "in_flight"):
            assert [m["id"] for m in again[key]] == [m["id"] for m in doc[key]]
        queued = doc["messages"]
        # the crash-safe mode's DPUB waits on disk until the reader reaches it: in the depth
        assert doc["depth"] == before[0] == len(queued) + (mode == "crash-safe")
        assert bodies_of(doc["in_flight"]) == [b"m00"]
        flying = doc["in_flight"][0]
        assert flying["id"] == got[0].id.decode() and flying["attempts"] == 1
        assert 0 < flying["timeout_ms"] <= 60_000 and flying["client_id"]
        assert bodies_of(doc["deferred"]) == [b"m01", b"later"]
        assert 29_000 < doc["deferred"][0]["due_in_ms"] <= 30_000
        assert doc["deferred"][0]["attempts"] == 1
        m = queued[0]
        assert set(m) == {"id", "timestamp", "attempts", "body_base64", "body_preview"}
        # REQ 0 puts m02 back in memory: behind what is in memory, before what is on disk
        assert m["body_preview"] == ("m02" if mode in ("disk", "crash-safe") else "m03")
        assert sorted(bodies_of(queued)) == [b"m%02d" % i for i in range(2, 12)]
        # the next consumer receives exactly those, in that order, with those attempts
        c2 = await RawClient.connect(d.tcp_port)
        await c2.sub("t", "c", rdy=len(queued))
        received = await c2.read_messages(len(queued))
        assert [r.id.decode() for r in received] == [m["id"] for m in queued]
        assert [r.body for r in received] == bodies_of(queued)
        assert [r.attempts for r in received] == [m["attempts"] + 1 for m in queued]
        await c.close()
        await c2.close()


async def test_peek_n_and_previews(tmp_path, session):
    async with NSQD(make_options(tmp_path, mem_queue_size=3)) as d:
        api = Api(d, session)
        d.get_topic("t").get_channel("c")
        await publish(d, [b"\xff\xfe bytes", "é".encode() * 300, b"x"] + [b"%d" % i for i in range(20)])
        doc = await api.peek(n=5)
        assert len(doc["messages"]) == 5 and doc["depth"] == 23
        assert doc["messages"][0]["body_preview"] == "\ufffd\ufffd bytes"
        assert doc["messages"][1]["body_preview"] == "é" * 200
        assert base64.b64decode(doc["messages"][1]["body_base64"]) == "é".encode() * 300
        status, doc = await api.call("GET", "/channel/peek?topic=t&channel=c")
        assert status == 200 and len(doc["messages"]) == 10  # the default
        for bad in ("0", "-1", "1001", "x", "1.5", "%C2%B2"):
            assert await api.call("GET", f"/channel/peek?topic=t&channel=c&n={bad}") == (
                400,
                {"message": "INVALID_N"},
            )
        assert (await api.call("GET", "/channel/peek?topic=t&channel=c&n=1000"))[0] == 200
        assert await api.call("GET", "/channel/peek?topic=nope&channel=c") == (
            404,
            {"message": "TOPIC_NOT_FOUND"},
        )
        assert await api.call("GET", "/channel/peek?topic=t&channel=nope") == (
            404,
            {"message": "CHANNEL_NOT_FOUND"},
        )
        assert await api.call("GET", "/topic/peek?topic=nope") == (404, {"message": "TOPIC_NOT_FOUND"})
        assert await api.call("GET", "/channel/peek?topic=t") == (400, {"message": "MISSING_ARG_CHANNEL"})
        assert await api.call("GET", "/topic/peek") == (400, {"message": "MISSING_ARG_TOPIC"})


@pytest.mark.parametrize("mode", ["memory", "mixed", "disk"])
async def test_topic_peek_shows_the_channel_less_backlog(tmp_path, session, mode):
    async with NSQD(make_options(tmp_path, **MODES[mode])) as d:
        api = Api(d, session)
        await publish(d, [b"h%02d" % i for i in range(10)])
        await dpub(d, b"later", 60_000)
        before = d.topics["t"].depth
        doc = await api.peek(channel=None)
        assert d.topics["t"].depth == before == doc["depth"]
        assert bodies_of(doc["messages"]) == [b"h%02d" % i for i in range(10)]
        (later,) = doc["deferred"]
        assert base64.b64decode(later["body_base64"]) == b"later"
        assert later.get("delay_ms") == 60_000 or 59_000 < later["due_in_ms"] <= 60_000
        # a channel then takes them all, in that order
        d.topics["t"].get_channel("c")
        c = await RawClient.connect(d.tcp_port)
        await c.sub("t", "c", rdy=20)
        got = await c.read_messages(10)
        assert [m.body for m in got] == bodies_of(doc["messages"])
        await c.close()


async def test_peek_of_a_large_disk_queue_reads_only_its_head(tmp_path, session):
    async with NSQD(make_options(tmp_path, mem_queue_size=0, max_bytes_per_file=4096)) as d:
        api = Api(d, session)
        ch = d.get_topic("t").get_channel("c")
        await publish(d, [b"%05d" % i + b"." * 100 for i in range(2000)])
        ch.backend.read(1000)  # the reader is in a later segment than the first
        calls = []
        scan = type(ch.backend).scan

        def counting(self, *a, **kw):
            out = scan(self, *a, **kw)
            calls.append(len(out))
            return out

        type(ch.backend).scan = counting
        try:
            doc = await api.peek(n=3)
        finally:
            type(ch.backend).scan = scan
        assert bodies_of(doc["messages"]) == [b"%05d" % i + b"." * 100 for i in (1000, 1001, 1002)]
        assert calls == [3] or sum(calls) <= 256


# ---------------------------------------------------------------- remove and requeue


@pytest.mark.parametrize("mode", MODES)
async def test_remove_a_queued_or_deferred_message(tmp_path, session, mode):
    async with NSQD(make_options(tmp_path, **MODES[mode])) as d:
        api = Api(d, session)
        d.get_topic("t").get_channel("c")
        await publish(d, [b"m%02d" % i for i in range(10)])
        await dpub(d, b"later", 60_000)
        doc = await api.peek()
        ids = [m["id"] for m in doc["messages"]]
        later_id = doc["deferred"][0]["id"]
        for victim in (ids[0], ids[6], later_id):
            assert await api.call("POST", f"/channel/remove?topic=t&channel=c&id={victim}") == (200, "")
            assert await api.call("POST", f"/channel/remove?topic=t&channel=c&id={victim}") == (
                404,
                {"message": "MESSAGE_NOT_FOUND"},
            )
        doc = await api.peek()
        assert [m["id"] for m in doc["messages"]] == [i for i in ids if i not in (ids[0], ids[6])]
        assert doc["deferred"] == [] and doc["depth"] == 8
        # in flight: 409, and it stays
        c = await RawClient.connect(d.tcp_port)
        await c.sub("t", "c", rdy=1)
        (m,) = await c.read_messages(1)
        assert await api.call("POST", f"/channel/remove?topic=t&channel=c&id={m.id.decode()}") == (
            409,
            {"message": "MESSAGE_IN_FLIGHT"},
        )
        c.send(commands.fin(m.id))
        c.send(commands.rdy(20))
        rest = await c.read_messages(7)
        assert [r.body for r in [m, *rest]] == [b"m%02d" % i for i in range(1, 10) if i != 6]
        await c.expect_silence(0.2)
        await c.close()
        for bad, status, msg in (
            ("", 400, "INVALID_MESSAGE_ID"),
            ("abc", 400, "INVALID_MESSAGE_ID"),
            ("0123456789abcdef", 404, "MESSAGE_NOT_FOUND"),
        ):
            assert await api.call("POST", f"/channel/remove?topic=t&channel=c&id={bad}") == (
                status,
                {"message": msg},
            )
        assert await api.call("POST", "/channel/remove?topic=t&channel=c") == (
            400,
            {"message": "MISSING_ARG_ID"},
        )


@pytest.mark.parametrize("mode", ["mixed", "disk", "crash-safe"])
async def test_a_removed_disk_message_stays_removed_after_a_restart(tmp_path, session, mode):
    opts = make_options(tmp_path, **MODES[mode])
    async with NSQD(opts) as d:
        d.get_topic("t").get_channel("c")
        await publish(d, [b"m%02d" % i for i in range(10)])
        api = Api(d, session)
        ids = [m["id"] for m in (await api.peek())["messages"]]
        assert (await api.call("POST", f"/channel/remove?topic=t&channel=c&id={ids[8]}"))[0] == 200
    async with NSQD(opts) as d:
        api = Api(d, session)
        doc = await api.peek()
        # (a clean shutdown writes what was in memory after what was on disk)
        assert sorted(m["id"] for m in doc["messages"]) == sorted(ids[:8] + ids[9:])
        assert doc["depth"] == 9
        c = await RawClient.connect(d.tcp_port)
        await c.sub("t", "c", rdy=20)
        got = await c.read_messages(9)
        assert [m.id.decode() for m in got] == [m["id"] for m in doc["messages"]]
        assert sorted(m.body for m in got) == [b"m%02d" % i for i in range(10) if i != 8]
        await c.expect_silence(0.2)
        await c.close()


@pytest.mark.parametrize("mode", MODES)
async def test_requeue_makes_a_deferred_message_due_now(tmp_path, session, mode):
    async with NSQD(make_options(tmp_path, **MODES[mode])) as d:
        api = Api(d, session)
        d.get_topic("t").get_channel("c")
        await publish(d, [b"now"])
        await dpub(d, b"later", 60_000)
        await dpub(d, b"much later", 120_000)
        doc = await api.peek()
        now_id = doc["messages"][0]["id"]
        later_id = doc["deferred"][0]["id"]
        assert await api.call("POST", f"/channel/requeue?topic=t&channel=c&id={now_id}") == (
            409,
            {"message": "MESSAGE_NOT_DEFERRED"},
        )
        assert await api.call("POST", f"/channel/requeue?topic=t&channel=c&id={later_id}") == (200, "")
        assert await api.call("POST", "/channel/requeue?topic=t&channel=c&id=0123456789abcdef") == (
            404,
            {"message": "MESSAGE_NOT_FOUND"},
        )
        doc = await api.peek()
        assert sorted(bodies_of(doc["messages"])) == [b"later", b"now"]
        assert bodies_of(doc["deferred"]) == [b"much later"]
        c = await RawClient.connect(d.tcp_port)
        await c.sub("t", "c", rdy=5)
        got = await c.read_messages(2)
        assert [m.body for m in got] == bodies_of(doc["messages"])
        assert await api.call("POST", f"/channel/requeue?topic=t&channel=c&id={later_id}") == (
            409,
            {"message": "MESSAGE_IN_FLIGHT"},
        )
        await c.expect_silence(0.2)
        await c.close()


async def test_a_requeue_in_the_crash_safe_mode_is_journaled(tmp_path, session):
    """The due time of now is on disk: a restart does not put the delay back."""
    opts = make_options(tmp_path, **MODES["crash-safe"])
    async with NSQD(opts) as d:
        d.get_topic("t").get_channel("c")
        await dpub(d, b"later", 600_000)
        api = Api(d, session)
        (entry,) = (await api.peek())["deferred"]
        assert (await api.call("POST", f"/channel/requeue?topic=t&channel=c&id={entry['id']}"))[0] == 200
    async with NSQD(opts) as d:
        doc = await Api(d, session).peek()
        assert bodies_of(doc["messages"]) == [b"later"] and doc["deferred"] == []


# ---------------------------------------------------------------- redrive


@pytest.mark.parametrize("mode", MODES)
async def test_redrive_a_topic_backlog(tmp_path, session, mode):
    async with NSQD(make_options(tmp_path, **MODES[mode])) as d:
        api = Api(d, session)
        await publish(d, [b"dead-%03d" % i for i in range(30)], topic="t.dlq")
        d.get_topic("work").get_channel("c")
        assert await api.call("POST", "/topic/redrive?topic=t.dlq&destination=work&n=10") == (
            200,
            {"moved": 10},
        )
        assert d.topics["t.dlq"].depth == 20
        assert await api.call("POST", "/topic/redrive?topic=t.dlq&destination=work") == (200, {"moved": 20})
        assert d.topics["t.dlq"].depth == 0
        assert await api.call("POST", "/topic/redrive?topic=t.dlq&destination=work") == (200, {"moved": 0})
        c = await RawClient.connect(d.tcp_port)
        await c.sub("work", "c", rdy=40)
        got = await c.read_messages(30)
        assert [m.body for m in got] == [b"dead-%03d" % i for i in range(30)]
        assert all(m.attempts == 1 for m in got)  # new messages
        await c.expect_silence(0.2)
        await c.close()


@pytest.mark.parametrize("mode", MODES)
async def test_redrive_from_a_channel(tmp_path, session, mode):
    async with NSQD(make_options(tmp_path, **MODES[mode])) as d:
        api = Api(d, session)
        d.get_topic("t.dlq").get_channel("inspect")
        await publish(d, [b"dead-%03d" % i for i in range(25)], topic="t.dlq")
        status, doc = await api.call(
            "POST", "/topic/redrive?topic=t.dlq&channel=inspect&destination=work&n=5"
        )
        assert (status, doc) == (200, {"moved": 5})
        assert d.topics["t.dlq"].channels["inspect"].depth == 20
        assert d.topics["work"].depth == 5
        doc = await api.peek(topic="work", channel=None)
        assert bodies_of(doc["messages"]) == [b"dead-%03d" % i for i in range(5)]
        assert await api.call("POST", "/topic/redrive?topic=t.dlq&channel=inspect&destination=work") == (
            200,
            {"moved": 20},
        )
        assert d.topics["t.dlq"].channels["inspect"].depth == 0
        # to the same topic from a channel: each of its channels gets them again (once)
        await publish(d, [b"again"], topic="t.dlq")
        assert await api.call("POST", "/topic/redrive?topic=t.dlq&channel=inspect&destination=t.dlq") == (
            200,
            {"moved": 1},
        )
        assert d.topics["t.dlq"].channels["inspect"].depth == 1


async def test_redrive_bad_input_and_refusals(tmp_path, session):
    async with NSQD(make_options(tmp_path)) as d:
        api = Api(d, session)
        await publish(d, [b"x"] * 5, topic="t.dlq")
        for query, status, msg in (
            ("destination=w", 400, "MISSING_ARG_TOPIC"),
            ("topic=t.dlq", 400, "MISSING_ARG_DESTINATION"),
            ("topic=t.dlq&destination=bad!name", 400, "INVALID_DESTINATION"),
            ("topic=t.dlq&destination=t.dlq", 400, "DESTINATION_IS_TOPIC"),
            ("topic=t.dlq&destination=w&n=0", 400, "INVALID_N"),
            ("topic=nope&destination=w", 404, "TOPIC_NOT_FOUND"),
            ("topic=t.dlq&channel=nope&destination=w", 404, "CHANNEL_NOT_FOUND"),
        ):
            assert await api.call("POST", f"/topic/redrive?{query}") == (status, {"message": msg}), query
        assert d.topics["t.dlq"].depth == 5
        # a destination that refuses (a bound set to reject): nothing moves, 503 names it
        d.get_topic("w").get_channel("c")
        await api.call("POST", "/channel/config?topic=w&channel=c", json.dumps({"max_depth": 3}).encode())
        full = (503, {"message": "channel w:c is full (max_depth 3)"})
        assert await api.call("POST", "/topic/redrive?topic=t.dlq&destination=w") == full
        assert d.topics["t.dlq"].depth == 5 and d.topics["w"].channels["c"].depth == 0
        assert await api.call("POST", "/topic/redrive?topic=t.dlq&destination=w&n=3") == (200, {"moved": 3})
        assert await api.call("POST", "/topic/redrive?topic=t.dlq&destination=w") == full
        assert d.topics["t.dlq"].depth == 2 and d.topics["w"].channels["c"].depth == 3


# ---------------------------------------------------------------- who may peek


def token_file(tmp_path, text: str = "# ops\ns3cret\n\nother-token\n", mode: int = 0o600):
    p = tmp_path / "tokens"
    p.write_text(text)
    os.chmod(p, mode)
    return str(p)


async def test_admin_tokens_guard_peek_and_its_actions(tmp_path, session):
    opts = make_options(tmp_path, admin_token_file=token_file(tmp_path))
    async with NSQD(opts) as d:
        d.get_topic("t").get_channel("c")
        await publish(d, [b"secret body"])
        paths = [
            ("GET", "/channel/peek?topic=t&channel=c"),
            ("GET", "/topic/peek?topic=t"),
            ("POST", "/channel/requeue?topic=t&channel=c&id=0123456789abcdef"),
            ("POST", "/channel/remove?topic=t&channel=c&id=0123456789abcdef"),
            ("POST", "/topic/redrive?topic=t&destination=w"),
        ]
        api = Api(d, session)
        for method, path in paths:
            async with session.request(method, api.base + path) as r:
                assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
                assert json.loads(await r.text()) == {"message": "UNAUTHORIZED"}
            assert await api.call(method, path, Authorization="Bearer wrong") == (
                403,
                {"message": "FORBIDDEN"},
            )
            assert await api.call(method, path, Authorization="Basic czNjcmV0") == (
                401,
                {"message": "UNAUTHORIZED"},
            )
        for token in ("s3cret", "other-token"):
            status, doc = await api.call("GET", paths[0][1], Authorization=f"Bearer {token}")
            assert status == 200 and bodies_of(doc["messages"]) == [b"secret body"]
        # what shows no bodies stays open
        assert (await api.call("GET", "/stats?format=json"))[0] == 200
        # SIGHUP's reload: the new file's tokens only; a bad file keeps them
        token_file(tmp_path, "rotated\n")
        d.admin_auth.reload()
        assert (await api.call("GET", paths[0][1], Authorization="Bearer s3cret"))[0] == 403
        assert (await api.call("GET", paths[0][1], Authorization="Bearer rotated"))[0] == 200
        token_file(tmp_path, "\n")
        d.admin_auth.reload()
        assert (await api.call("GET", paths[0][1], Authorization="Bearer rotated"))[0] == 200


def test_a_token_file_others_can_read_or_without_tokens_is_refused(tmp_path):
    with pytest.raises(AdminTokenError, match="readable by other users"):
        NSQD(make_options(tmp_path, admin_token_file=token_file(tmp_path, mode=0o644)))
    with pytest.raises(AdminTokenError, match="holds no token"):
        NSQD(make_options(tmp_path, admin_token_file=token_file(tmp_path, "# none\n\n")))
    with pytest.raises(AdminTokenError, match="cannot open"):
        NSQD(make_options(tmp_path, admin_token_file=str(tmp_path / "missing")))


async def test_with_auth_and_no_tokens_peek_is_refused(tmp_path, session):
    """Bodies are sensitive: an nsqd that checks its clients with an auth server shows them
    to nobody without a token file."""
    async with NSQD(make_options(tmp_path, auth_http_addresses=["127.0.0.1:1"])) as d:
        d.get_topic("t").get_channel("c")
        api = Api(d, session)
        assert await api.call("GET", "/channel/peek?topic=t&channel=c") == (403, {"message": "FORBIDDEN"})
        assert await api.call("POST", "/topic/redrive?topic=t&destination=w") == (
            403,
            {"message": "FORBIDDEN"},
        )
        assert (await api.call("GET", "/stats?format=json"))[0] == 200


async def test_peek_leaves_a_busy_channel_consistent(tmp_path, session):
    """Peeks between publishes and consumption (mixed memory and disk) never lose or repeat a
    message."""
    async with NSQD(make_options(tmp_path, mem_queue_size=50)) as d:
        api = Api(d, session)
        d.get_topic("t").get_channel("c")
        c = await RawClient.connect(d.tcp_port)
        await c.sub("t", "c", rdy=10)
        received: list[bytes] = []

        async def consume():
            while len(received) < 500:
                m = await c.read_message(timeout=10)
                received.append(m.body)
                c.send(commands.fin(m.id))

        task = asyncio.create_task(consume())
        for i in range(0, 500, 50):
            await publish(d, [b"%03d" % j for j in range(i, i + 50)])
            await api.peek(n=20)
        await asyncio.wait_for(task, 20)
        # (past --mem-queue-size, NSQ's order is memory first: not the publish order)
        assert sorted(received) == [b"%03d" % j for j in range(500)]
        await c.close()
