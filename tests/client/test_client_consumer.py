"""Consumer against the in-process nsqd (and a fake lookupd)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from client_helpers import channel_stats, opts
from support import free_port, wait_for

from nsqpy.client import ConnectionConfig, Consumer, ExponentialBackoff, Message, Producer, RequeueMessage
from nsqpy.nsqd.nsqd import NSQD

pytestmark = pytest.mark.timeout(60)


def addr(d: NSQD) -> str:
    return f"127.0.0.1:{d.tcp_port}"


async def publish(d: NSQD, topic: str, bodies: list[bytes]) -> None:
    async with Producer(addr(d)) as p:
        await p.publish_many(topic, bodies)


async def test_consume_exact_bodies(nsqd: NSQD) -> None:
    bodies = [b"msg-%d" % i for i in range(200)]
    await publish(nsqd, "t", bodies)
    got: list[bytes] = []
    async with Consumer("t", "c", nsqd_tcp_addresses=[addr(nsqd)], max_in_flight=16) as c:
        async for msg in c:
            assert isinstance(msg, Message) and msg.attempts == 1
            got.append(msg.body)
            await msg.fin()
            if len(got) == len(bodies):
                break
    assert sorted(got) == sorted(bodies)
    ch = await channel_stats(nsqd.http_port, "t", "c")
    assert ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0
    assert ch["message_count"] == 200


async def test_run_handler_with_concurrency(nsqd: NSQD) -> None:
    bodies = [b"%d" % i for i in range(100)]
    await publish(nsqd, "h", bodies)
    got: list[bytes] = []
    active = 0
    peak = 0
    c = Consumer("h", "c", nsqd_tcp_addresses=[addr(nsqd)], max_in_flight=10)

    async def handler(msg: Message) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0)
        got.append(msg.body)
        active -= 1
        if len(got) == len(bodies):
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(c.close()))

    await c.run(handler, concurrency=4)
    assert sorted(got) == sorted(bodies)
    assert peak <= 4
    ch = await channel_stats(nsqd.http_port, "h", "c")
    assert ch is not None and ch["depth"] == 0 and ch["message_count"] == 100


async def test_max_in_flight_respected(nsqd: NSQD) -> None:
    await publish(nsqd, "m", [b"x"] * 50)
    held: list[Message] = []
    async with Consumer("m", "c", nsqd_tcp_addresses=[addr(nsqd)], max_in_flight=7) as c:

        async def take() -> None:
            async for msg in c:
                held.append(msg)
                if len(held) == 7:
                    return

        await asyncio.wait_for(take(), 10)
        ch = await channel_stats(nsqd.http_port, "m", "c")
        assert ch is not None
        (client,) = ch["clients"]
        assert client["ready_count"] == 7 and client["in_flight_count"] == 7
        assert c.is_starved()
        # lower max_in_flight at runtime: the server sees it
        await c.set_max_in_flight(3)
        await wait_for(lambda: _rdy_is(nsqd, "m", 3))
        for m in held:
            await m.fin()
        await wait_for(lambda: _in_flight_is(nsqd, "m", 3))


async def _rdy_is(d: NSQD, topic: str, n: int) -> bool:
    ch = await channel_stats(d.http_port, topic, "c")
    return ch is not None and [cl["ready_count"] for cl in ch["clients"]] == [n]


async def _in_flight_is(d: NSQD, topic: str, n: int) -> bool:
    ch = await channel_stats(d.http_port, topic, "c")
    return ch is not None and [cl["in_flight_count"] for cl in ch["clients"]] == [n]


async def test_max_in_flight_spread_over_nsqd(tmp_path) -> None:
    async with NSQD(opts(tmp_path, "a")) as a, NSQD(opts(tmp_path, "b")) as b:
        for d in (a, b):
            await publish(d, "s", [b"x"] * 20)
        async with Consumer("s", "c", nsqd_tcp_addresses=[addr(a), addr(b)], max_in_flight=10) as c:
            await c.wait_connected(2)
            await wait_for(lambda: _rdy_is(a, "s", 5))
            await wait_for(lambda: _rdy_is(b, "s", 5))


async def test_backoff_engages_and_recovers(nsqd: NSQD) -> None:
    await publish(nsqd, "b", [b"%d" % i for i in range(6)])
    fail = True
    seen_rdy0 = False
    async with Consumer(
        "b",
        "c",
        nsqd_tcp_addresses=[addr(nsqd)],
        max_in_flight=5,
        backoff=ExponentialBackoff(0.05),
        max_backoff_duration=1.0,
    ) as c:
        async for msg in c:
            if fail:
                fail = False
                await msg.req(0)  # failure → backoff
                assert c.rdy.mode == "backoff" and c.rdy.backoff_level == 1
                seen_rdy0 = await _rdy_is(nsqd, "b", 0) or await wait_for(lambda: _rdy_is(nsqd, "b", 0))
                continue
            # after the timeout: RDY 1 tests the waters, then full flow after a success
            await msg.fin()
            if c.stats().messages_finished == 6:
                break
        assert seen_rdy0
        assert c.rdy.mode == "normal" and c.rdy.backoff_level == 0
        await wait_for(lambda: _rdy_is(nsqd, "b", 5))


async def test_requeue_attempts_and_giving_up(nsqd: NSQD) -> None:
    await publish(nsqd, "g", [b"poison"])
    given_up: list[Message] = []
    attempts: list[int] = []

    async def hook(m: Message) -> None:
        given_up.append(m)

    async with Consumer(
        "g", "c", nsqd_tcp_addresses=[addr(nsqd)], max_attempts=3, on_giving_up=hook, max_backoff_duration=0
    ) as c:

        async def consume() -> None:
            async for msg in c:
                attempts.append(msg.attempts)
                async with msg.process():
                    raise RequeueMessage(0)

        task = asyncio.create_task(consume())
        await wait_for(lambda: given_up, timeout=10)
        task.cancel()
    assert attempts == [1, 2, 3]
    assert given_up[0].attempts == 4 and given_up[0].body == b"poison"
    await wait_for(lambda: _channel_empty(nsqd, "g"))


async def _channel_empty(d: NSQD, topic: str) -> bool:
    ch = await channel_stats(d.http_port, topic, "c")
    return ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0 and ch["deferred_count"] == 0


def test_automatic_requeue_delay() -> None:
    c = Consumer(
        "t", "c", nsqd_tcp_addresses=["127.0.0.1:1"], default_requeue_delay=90, max_requeue_delay=900
    )
    assert c.requeue_delay(1) == 90 and c.requeue_delay(3) == 270 and c.requeue_delay(50) == 900


async def test_automatic_requeue_delay_on_wire(nsqd: NSQD) -> None:
    await publish(nsqd, "d", [b"x"])
    async with Consumer(
        "d", "c", nsqd_tcp_addresses=[addr(nsqd)], default_requeue_delay=30, max_backoff_duration=0
    ) as c:
        async for msg in c:
            async with msg.process():
                raise ValueError("boom")  # → REQ with 30 s × 1 attempt
            break
        await wait_for(lambda: _deferred(nsqd, "d"))


async def _deferred(d: NSQD, topic: str) -> bool:
    ch = await channel_stats(d.http_port, topic, "c")
    return ch is not None and ch["deferred_count"] == 1 and ch["requeue_count"] == 1


async def test_graceful_close_waits_for_in_flight(nsqd: NSQD) -> None:
    await publish(nsqd, "gc", [b"a", b"b", b"c"])
    c = Consumer("gc", "c", nsqd_tcp_addresses=[addr(nsqd)], max_in_flight=3)
    await c.start()
    it = aiter(c)
    msg = await anext(it)
    closer = asyncio.create_task(c.close(drain_timeout=10))
    # close() sends CLS and requeues the two messages not handed out, then waits for ours
    await wait_for(lambda: c.stats().messages_requeued == 2)
    assert not closer.done()
    await msg.fin()
    await asyncio.wait_for(closer, 5)
    with pytest.raises(StopAsyncIteration):
        await anext(it)
    # one FINed; the others were requeued and are available again
    await wait_for(lambda: _depth_is(nsqd, "gc", 2))


async def _depth_is(d: NSQD, topic: str, n: int) -> bool:
    ch = await channel_stats(d.http_port, topic, "c")
    return ch is not None and ch["depth"] + ch["deferred_count"] == n and not ch["clients"]


async def test_consumer_reconnects_after_nsqd_restart(tmp_path) -> None:
    port = free_port()
    o = opts(tmp_path, "d", tcp_address=f"127.0.0.1:{port}")
    d = NSQD(o)
    await d.start()
    got: list[bytes] = []
    try:
        await publish(d, "r", [b"before"])
        async with Consumer("r", "c", nsqd_tcp_addresses=[f"127.0.0.1:{port}"], reconnect_interval=0.05) as c:

            async def consume() -> None:
                async for msg in c:
                    got.append(msg.body)
                    await msg.fin()

            task = asyncio.create_task(consume())
            await wait_for(lambda: got == [b"before"])
            await d.stop()
            await wait_for(lambda: not c.connections)
            d = NSQD(opts(tmp_path, "d", tcp_address=f"127.0.0.1:{port}"))
            await d.start()
            await c.wait_connected(1, timeout=10)
            await publish(d, "r", [b"after"])
            await wait_for(lambda: got == [b"before", b"after"], timeout=10)
            task.cancel()
    finally:
        await d.stop()


async def fake_lookupd(producers: dict[str, list[dict[str, object]]]) -> tuple[web.AppRunner, int]:
    async def lookup(request: web.Request) -> web.Response:
        topic = request.query.get("topic", "")
        if topic not in producers:
            return web.json_response({"message": "TOPIC_NOT_FOUND"}, status=404)
        return web.json_response({"channels": [], "producers": producers[topic]})

    app = web.Application()
    app.router.add_get("/lookup", lookup)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port


def producer(d: NSQD) -> dict[str, object]:
    return {
        "broadcast_address": "127.0.0.1",
        "hostname": "h",
        "tcp_port": d.tcp_port,
        "http_port": d.http_port,
        "version": "1.3.0",
    }


async def test_discovery_through_lookupds(tmp_path) -> None:
    async with (
        NSQD(opts(tmp_path, "a")) as a,
        NSQD(opts(tmp_path, "b")) as b,
        NSQD(opts(tmp_path, "c")) as cc,
    ):
        for i, d in enumerate((a, b, cc)):
            await publish(d, "disc", [b"from-%d" % i])
        # two lookupds that know overlapping sets: the union is used, each nsqd once
        r1, p1 = await fake_lookupd({"disc": [producer(a), producer(b)]})
        r2, p2 = await fake_lookupd({"disc": [producer(b), producer(cc)]})
        try:
            got: list[bytes] = []
            async with Consumer(
                "disc",
                "c",
                lookupd_http_addresses=[f"127.0.0.1:{p1}", f"http://127.0.0.1:{p2}"],
                max_in_flight=10,
                lookupd_poll_interval=0.05,
            ) as c:
                async for msg in c:
                    got.append(msg.body)
                    await msg.fin()
                    if len(got) == 3:
                        break
                assert len(c.connections) == 3
            assert sorted(got) == [b"from-0", b"from-1", b"from-2"]
        finally:
            await r1.cleanup()
            await r2.cleanup()


async def test_discovered_nsqd_reconnects_via_lookupd(tmp_path) -> None:
    port = free_port()
    d = NSQD(opts(tmp_path, "d", tcp_address=f"127.0.0.1:{port}"))
    await d.start()
    prods: dict[str, list[dict[str, object]]] = {"x": [producer(d)]}
    runner, lport = await fake_lookupd(prods)
    try:
        async with Consumer(
            "x", "c", lookupd_http_addresses=[f"127.0.0.1:{lport}"], lookupd_poll_interval=0.05
        ) as c:
            await c.wait_connected(1)
            prods["x"] = []  # the nsqd goes away from lookupd as well
            await d.stop()
            await wait_for(lambda: not c.connections)
            d = NSQD(opts(tmp_path, "d", tcp_address=f"127.0.0.1:{port}"))
            await d.start()
            prods["x"] = [producer(d)]
            await c.wait_connected(1, timeout=10)
            await publish(d, "x", [b"again"])
            async for msg in c:
                assert msg.body == b"again"
                await msg.fin()
                break
    finally:
        await runner.cleanup()
        await d.stop()


async def test_max_in_flight_below_connections(tmp_path) -> None:
    async with NSQD(opts(tmp_path, "a")) as a, NSQD(opts(tmp_path, "b")) as b:
        await publish(b, "low", [b"only-on-b"])
        await publish(a, "low", [b"x"])
        async with NSQD(opts(tmp_path, "c")) as cc:
            await publish(cc, "low", [b"y"])
            got: list[bytes] = []
            async with Consumer(
                "low",
                "c",
                nsqd_tcp_addresses=[addr(a), addr(b), addr(cc)],
                max_in_flight=1,
                low_rdy_idle_timeout=1.0,
                rdy_redistribute_interval=0.05,
            ) as c:
                await c.wait_connected(3)
                async for msg in c:
                    # never more than one RDY in total across the three nsqd
                    assert c.rdy.total_rdy <= 1
                    got.append(msg.body)
                    await msg.fin()
                    if len(got) == 3:
                        break
            assert sorted(got) == [b"only-on-b", b"x", b"y"]


def test_config_defaults_used() -> None:
    cfg = ConnectionConfig(max_in_flight=42, max_attempts=9)
    c = Consumer("t", "c", nsqd_tcp_addresses="127.0.0.1:1", config=cfg)
    assert c.max_in_flight == 42 and c.max_attempts == 9
    c3 = Consumer("t", "c", nsqd_tcp_addresses="127.0.0.1:1", config=cfg, max_in_flight=3)
    assert c3.max_in_flight == 3


async def test_discovery_through_real_nsqlookupd(tmp_path) -> None:
    from nsqpy.nsqlookupd import NSQLookupd
    from nsqpy.nsqlookupd import Options as LookupdOptions

    async with NSQLookupd(LookupdOptions(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0")) as lk:
        reg = [f"127.0.0.1:{lk.tcp_port}"]
        nsqds = [
            NSQD(opts(tmp_path, n, nsqlookupd_tcp_addresses=reg, broadcast_address="127.0.0.1"))
            for n in ("a", "b", "c")
        ]
        for d in nsqds:
            await d.start()
        try:
            for i, d in enumerate(nsqds):
                await publish(d, "real", [b"n%d" % i])
            got: list[bytes] = []
            async with Consumer(
                "real",
                "c",
                lookupd_http_addresses=[f"127.0.0.1:{lk.http_port}"],
                max_in_flight=30,
                lookupd_poll_interval=0.05,
            ) as c:
                async for msg in c:
                    got.append(msg.body)
                    await msg.fin()
                    if len(got) == 3:
                        break
                assert len(c.connections) == 3
            assert sorted(got) == [b"n0", b"n1", b"n2"]
        finally:
            for d in nsqds:
                await d.stop()


@pytest.mark.timeout(30)
def test_roundtrip_on_uvloop(tmp_path) -> None:
    uvloop = pytest.importorskip("uvloop")

    async def main() -> list[bytes]:
        async with NSQD(opts(tmp_path, "u")) as d:
            async with Producer(addr(d)) as p:
                await p.publish_many("uv", [b"1", b"2", b"3"])
            got: list[bytes] = []
            async with Consumer("uv", "c", nsqd_tcp_addresses=[addr(d)], max_in_flight=3) as c:
                async for msg in c:
                    got.append(msg.body)
                    await msg.fin()
                    if len(got) == 3:
                        break
            return got

    assert sorted(uvloop.run(main())) == [b"1", b"2", b"3"]


async def test_auto_touch_keeps_message(nsqd: NSQD) -> None:
    await publish(nsqd, "touch", [b"slow"])
    cfg = ConnectionConfig(msg_timeout=1.0)
    async with Consumer("touch", "c", nsqd_tcp_addresses=[addr(nsqd)], config=cfg) as c:
        async for msg in c:
            async with msg.auto_touch(every=0.2):
                # the work outlasts msg_timeout (1 s); TOUCH keeps the message ours
                await asyncio.sleep(1.5)
            await msg.fin()
            break
        await wait_for(lambda: _channel_empty(nsqd, "touch"))
        ch = await channel_stats(nsqd.http_port, "touch", "c")
        assert ch is not None and ch["timeout_count"] == 0 and ch["requeue_count"] == 0
