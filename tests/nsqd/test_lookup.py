"""nsqd registering with nsqlookupd, checked against a minimal fake lookupd that speaks the
V1 wire protocol from the format facts (so it also pins what the Go nsqlookupd receives)."""

from __future__ import annotations

import asyncio
import json
import struct

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from conftest import make_options
from support import RawClient, wait_for

from nsqpy.nsqd import lookup
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(30)


class FakeLookupd:
    """Accepts nsqd peers, records their commands, answers like nsqlookupd."""

    def __init__(self, http_port: int = 4161, broadcast_address: str = "fake") -> None:
        self.commands: list[str] = []
        self.identify: list[dict] = []
        self.conns: list[asyncio.StreamWriter] = []
        self.server: asyncio.AbstractServer | None = None
        #: what IDENTIFY answers: where nsqd asks for a new topic's channels
        self.http_port = http_port
        self.broadcast_address = broadcast_address

    @property
    def address(self) -> str:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def start(self, port: int = 0) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", port)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.conns:
            w.close()
        await self.server.wait_closed()

    def drop_connections(self) -> None:
        for w in self.conns:
            w.transport.abort()
        self.conns.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.conns.append(writer)

        def reply(data: bytes) -> None:
            writer.write(struct.pack(">i", len(data)) + data)

        try:
            assert await reader.readexactly(4) == b"  V1"
            while True:
                line = (await reader.readline()).rstrip(b"\n").decode()
                if not line:
                    return
                self.commands.append(line)
                if line == "IDENTIFY":
                    (n,) = struct.unpack(">i", await reader.readexactly(4))
                    self.identify.append(json.loads(await reader.readexactly(n)))
                    reply(
                        json.dumps(
                            {
                                "tcp_port": 4160,
                                "http_port": self.http_port,
                                "version": "1.3.0",
                                "broadcast_address": self.broadcast_address,
                                "hostname": "fake",
                            }
                        ).encode()
                    )
                else:
                    reply(b"OK")
        except (asyncio.IncompleteReadError, ConnectionError):
            return


@pytest_asyncio.fixture
async def fake():
    f = FakeLookupd()
    await f.start()
    yield f
    await f.stop()


async def test_identify_and_register_as_topics_come_and_go(tmp_path, fake):
    opts = make_options(tmp_path, nsqlookupd_tcp_addresses=[fake.address], broadcast_address="node1")
    async with NSQD(opts) as d:
        await wait_for(lambda: fake.identify)
        ident = fake.identify[0]
        assert ident["broadcast_address"] == "node1"
        assert ident["tcp_port"] == d.tcp_port and ident["http_port"] == d.http_port
        assert ident["version"] == "1.3.0" and ident["hostname"]
        await wait_for(lambda: d.lookup_peers.peers[fake.address].connected)
        topic = d.get_topic("t")
        await wait_for(lambda: "REGISTER t" in fake.commands)
        topic.get_channel("c")
        await wait_for(lambda: "REGISTER t c" in fake.commands)
        topic.delete_channel("c")
        await wait_for(lambda: "UNREGISTER t c" in fake.commands)
        d.delete_topic("t")
        await wait_for(lambda: "UNREGISTER t" in fake.commands)


async def test_broadcast_ports_override(tmp_path, fake):
    opts = make_options(
        tmp_path, nsqlookupd_tcp_addresses=[fake.address], broadcast_tcp_port=5150, broadcast_http_port=5151
    )
    async with NSQD(opts):
        await wait_for(lambda: fake.identify)
        assert (fake.identify[0]["tcp_port"], fake.identify[0]["http_port"]) == (5150, 5151)


async def test_registers_everything_on_connect_and_after_reconnect(tmp_path, fake):
    opts = make_options(tmp_path)
    async with NSQD(opts) as d:
        d.get_topic("lonely")
        d.get_topic("t").get_channel("a")
        d.get_topic("t").get_channel("b")
        async with aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{d.http_port}/config/nsqlookupd_tcp_addresses"
            async with s.put(url, data=json.dumps([fake.address])) as r:
                assert r.status == 200
        expect = {"REGISTER lonely", "REGISTER t a", "REGISTER t b"}
        await wait_for(lambda: expect <= set(fake.commands))
        assert "REGISTER t" not in fake.commands  # a topic with channels registers its pairs
        fake.commands.clear()
        fake.drop_connections()  # as if lookupd restarted
        await wait_for(lambda: expect <= set(fake.commands), timeout=10)
        assert fake.commands[0] == "IDENTIFY"


async def test_backoff_restarts_after_each_successful_connection(tmp_path, fake, monkeypatch):
    """Every lost connection is retried after MIN_BACKOFF, however many came before: the
    doubling backoff is for failed attempts only (it used to carry over from one lost
    connection to the next, so a lookupd restarted a few times waited up to MAX_BACKOFF)."""
    monkeypatch.setattr(lookup, "MIN_BACKOFF", 0.02)
    monkeypatch.setattr(lookup, "MAX_BACKOFF", 5.0)
    async with NSQD(make_options(tmp_path, nsqlookupd_tcp_addresses=[fake.address])):
        await wait_for(lambda: len(fake.identify) == 1)
        for n in range(2, 10):  # without the reset, the 8th waits 0.02 * 2**7 s > 2 s
            await wait_for(lambda: fake.conns)
            fake.drop_connections()
            await wait_for(lambda n=n: len(fake.identify) == n, timeout=2)


async def test_pings_every_interval(tmp_path, fake, monkeypatch):
    monkeypatch.setattr(lookup, "PING_INTERVAL", 0.2)
    async with NSQD(make_options(tmp_path, nsqlookupd_tcp_addresses=[fake.address])):
        await wait_for(lambda: fake.commands.count("PING") >= 2, timeout=5)


async def test_unreachable_lookupd_does_not_block_nsqd(tmp_path):
    async with NSQD(make_options(tmp_path, nsqlookupd_tcp_addresses=["127.0.0.1:1"])) as d:
        d.get_topic("t").get_channel("c")
        assert not d.lookup_peers.peers["127.0.0.1:1"].connected


async def test_cancel_is_never_lost_when_lookupd_closes_at_the_same_moment() -> None:
    """nsqd's shutdown cancels a peer just as lookupd (stopped too) closes the connection:
    the cancel must end the peer, whatever loop turn it lands on (it once hung stop())."""
    for turns in range(8):
        peer = lookup.LookupPeer(None, "127.0.0.1:1")  # type: ignore[arg-type]
        reader = asyncio.StreamReader()
        task = asyncio.ensure_future(peer._next_command(reader, 10.0))
        await asyncio.sleep(0)
        reader.feed_eof()  # lookupd went away
        for _ in range(turns):
            await asyncio.sleep(0)
        cancelled = task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            assert cancelled
        except ConnectionError:
            assert not cancelled, f"cancel after {turns} turns was swallowed"
        else:
            pytest.fail(f"after {turns} turns the peer neither ended by the cancel nor saw EOF")


@pytest.mark.parametrize("via", ["tcp", "http"])
@pytest.mark.parametrize("strict", [False, True], ids=["memory", "crash-safe"])
async def test_publish_to_a_new_topic_is_answered_after_its_channels_exist(tmp_path, via, strict):
    """Go's GetTopic asks nsqlookupd for the topic's channels and creates them before the
    publish that made the topic is answered. Here nsqlookupd answers /channels slowly: the
    OK comes after it, with the channel holding the message."""
    release = asyncio.Event()

    async def channels(request: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({"channels": ["archive"]})

    app = web.Application()
    app.router.add_get("/channels", channels)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    http_port = site._server.sockets[0].getsockname()[1]
    fake = FakeLookupd(http_port=http_port, broadcast_address="127.0.0.1")
    await fake.start()
    extra = {"mem_queue_size": 0, "sync_every": 1} if strict else {}
    opts = make_options(tmp_path, nsqlookupd_tcp_addresses=[fake.address], **extra)
    try:
        async with NSQD(opts) as d:
            await wait_for(lambda: d.lookup_peers.http_addresses())
            if via == "tcp":
                c = await RawClient.connect(d.tcp_port)
                c.send(commands.pub("orders", b"first"))
                answer = asyncio.ensure_future(c.read_frame(timeout=10))
            else:
                session = aiohttp.ClientSession()
                url = f"http://127.0.0.1:{d.http_port}/pub?topic=orders"
                answer = asyncio.ensure_future(session.post(url, data=b"first"))
            await wait_for(lambda: "orders" in d.topics)
            await asyncio.sleep(0.3)
            assert not answer.done(), "answered before nsqlookupd named the channels"
            release.set()
            result = await answer
            if via == "tcp":
                assert result == (0, b"OK")
                await c.close()
            else:
                assert result.status == 200
                result.close()
                await session.close()
            ch = d.topics["orders"].channels.get("archive")
            assert ch is not None and ch.depth == 1
    finally:
        await fake.stop()
        await runner.cleanup()
