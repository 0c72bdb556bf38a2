"""The batch-shaped consume path: frames of one read handed over in order, FINs buffered
into one write but kept in command order, run() reaching its concurrency."""

from __future__ import annotations

import asyncio
import random

import pytest
from client_helpers import channel_stats
from hypothesis import given, settings
from hypothesis import strategies as st
from support import wait_for

from nsqpy.client import Consumer, Message, Producer
from nsqpy.client.conn import Connection
from nsqpy.client.rdy import RdyController, Signal
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.protocol import frames

pytestmark = pytest.mark.timeout(60)


class FakeNsqd:
    """A TCP server that answers IDENTIFY with OK, records what it receives and sends
    whatever the test tells it to."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.writer: asyncio.StreamWriter | None = None
        self.connected = asyncio.Event()
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readexactly(4)  # magic
        await r.readline()  # IDENTIFY
        (size,) = frames.unpack_int32_from(await r.readexactly(4))
        await r.readexactly(size)
        w.write(frames.OK_FRAME)
        self.writer = w
        self.connected.set()
        while chunk := await r.read(65536):
            self.received += chunk
        w.close()

    def send(self, data: bytes) -> None:
        assert self.writer is not None
        self.writer.write(data)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def msg_frame(i: int, body: bytes = b"x") -> bytes:
    return frames.encode_message_frame(1_000 + i, 1, b"%016x" % i, body)


async def test_messages_and_responses_keep_their_order() -> None:
    fake = FakeNsqd()
    address = await fake.start()
    batches: list[tuple[list[bytes], bool]] = []  # (ids, was the request answered by then)
    fut: asyncio.Future[bytes] | None = None

    def on_messages(c: Connection, ms: list) -> None:
        assert fut is not None
        batches.append(([m.id for m in ms], fut.done()))

    conn = Connection(address, on_messages=on_messages)
    try:
        await conn.connect()
        fut = conn.send_request(b"PING-ish\n")
        # one write: two messages, the answer, a heartbeat, a message split over two writes
        tail = msg_frame(3, b"z" * 5000)
        fake.send(msg_frame(1) + msg_frame(2) + frames.OK_FRAME + frames.HEARTBEAT_FRAME + tail[:100])
        await wait_for(lambda: fut.done())
        fake.send(tail[100:])
        await wait_for(lambda: len(batches) == 2)
        assert fut.result() == b"OK"
        assert batches == [([b"%016x" % 1, b"%016x" % 2], False), ([b"%016x" % 3], True)]
        await wait_for(lambda: b"NOP\n" in fake.received)  # the heartbeat was answered
    finally:
        conn.close()
        await conn.wait_closed()
        await fake.close()


async def test_fins_are_one_write_in_command_order() -> None:
    fake = FakeNsqd()
    address = await fake.start()
    conn = Connection(address)
    try:
        await conn.connect()
        start = len(fake.received)  # the fake keeps the handshake to itself: 0
        conn.fin(b"a" * 16)
        conn.fin(b"b" * 16)
        conn.send(b"RDY 5\n")
        conn.fin(b"c" * 16)
        want = b"FIN " + b"a" * 16 + b"\nFIN " + b"b" * 16 + b"\nRDY 5\nFIN " + b"c" * 16 + b"\n"
        await wait_for(lambda: len(fake.received) - start >= len(want))
        assert bytes(fake.received[start:]) == want
    finally:
        conn.close()
        await conn.wait_closed()
        await fake.close()


async def test_bad_frame_closes_the_connection() -> None:
    fake = FakeNsqd()
    address = await fake.start()
    conn = Connection(address, on_messages=lambda c, ms: None)
    try:
        await conn.connect()
        fake.send(b"\x00\x00\x00\x02\x00\x00\x00\x00")  # size 2 < 4
        await asyncio.wait_for(conn.wait_closed(), 5)
        assert conn.closed
    finally:
        await fake.close()


async def test_run_reaches_its_concurrency(nsqd: NSQD) -> None:
    """A batch of messages is spread over idle workers when the handler awaits."""
    address = f"127.0.0.1:{nsqd.tcp_port}"
    async with Producer(address) as p:
        await p.publish_many("conc", [b"%d" % i for i in range(60)])
    active = peak = done = 0
    c = Consumer("conc", "c", nsqd_tcp_addresses=address, max_in_flight=60)

    async def handler(msg: Message) -> None:
        nonlocal active, peak, done
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.05)
        active -= 1
        done += 1
        if done == 60:
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(c.close()))

    await asyncio.wait_for(c.run(handler, concurrency=20), 20)
    assert done == 60
    assert peak == 20
    ch = await channel_stats(nsqd.http_port, "conc", "c")
    assert ch is not None and ch["depth"] == 0 and ch["message_count"] == 60


async def test_cancelled_iterator_passes_its_message_on(nsqd: NSQD) -> None:
    """Two idle iterators; the one woken for a message is cancelled before it runs: the
    other one gets the message."""
    address = f"127.0.0.1:{nsqd.tcp_port}"
    async with Consumer("pass", "c", nsqd_tcp_addresses=address, max_in_flight=5) as c:
        await c.wait_connected()
        first = asyncio.ensure_future(anext(aiter(c)))
        second = asyncio.ensure_future(anext(aiter(c)))
        await wait_for(lambda: len(c._waiters) == 2)  # both wait now
        woken = asyncio.Event()
        real_wake = c._wake

        def wake(n: int) -> None:  # cancel the first iterator right after its wake-up
            real_wake(n)
            if not woken.is_set():
                woken.set()
                first.cancel()

        c._wake = wake  # type: ignore[method-assign]
        async with Producer(address) as p:
            await p.publish("pass", b"only")
        msg = await asyncio.wait_for(second, 10)
        assert msg.body == b"only"
        assert first.cancelled()
        await msg.fin()


async def test_cancelled_waits_do_not_pile_up(nsqd: NSQD) -> None:
    address = f"127.0.0.1:{nsqd.tcp_port}"
    async with Consumer("idle", "c", nsqd_tcp_addresses=address, max_in_flight=5) as c:
        await c.wait_connected()
        for _ in range(20):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(anext(aiter(c)), 0.01)
        assert len(c._waiters) == 0


@settings(max_examples=300, deadline=None)
@given(
    mif=st.integers(1, 12),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["add", "remove", "msg", "fin", "req", "reqnb", "tick"]),
            st.integers(0, 3),
            st.integers(1, 6),
        ),
        max_size=80,
    ),
)
def test_on_fin_is_on_finished_when_it_says_so(mif: int, ops: list[tuple[str, int, int]]) -> None:
    """The consumer's FIN hot path (on_fin, else on_finished) leaves the controller exactly
    as on_finished alone would, and batched on_message counts as many messages."""
    a = RdyController(mif, rng=random.Random(1), max_backoff_duration=8.0)
    b = RdyController(mif, rng=random.Random(1), max_backoff_duration=8.0)
    now = 0.0
    for op, k, n in ops:
        now += 1.0
        if op == "add" and k not in a.conns:
            assert a.add_conn(k, 5, now) == b.add_conn(k, 5, now)
        elif op == "remove" and k in a.conns:
            assert a.remove_conn(k, now) == b.remove_conn(k, now)
        elif op == "msg" and k in a.conns:
            a.on_message(k, now, n)
            for _ in range(n):
                b.on_message(k, now)
            assert a.conns[k].in_flight == b.conns[k].in_flight
            # RDY refreshes differ (one per batch at most); keep the two in step
            a.conns[k].received = b.conns[k].received
            a.conns[k].last_rdy = b.conns[k].last_rdy
        elif op in ("fin", "reqnb") and k in a.conns:
            sig = Signal.SUCCESS if op == "fin" else Signal.CONTINUE
            out_a = [] if a.on_fin(k) else a.on_finished(k, sig, now)
            assert out_a == b.on_finished(k, sig, now)
        elif op == "req" and k in a.conns:
            assert a.on_finished(k, Signal.FAILURE, now) == b.on_finished(k, Signal.FAILURE, now)
        elif op == "tick":
            now += n
            assert a.tick(now) == b.tick(now)
        assert a.version == b.version
        assert (a.backoff_level, a.backoff_until) == (b.backoff_level, b.backoff_until)
        assert {key: (c.rdy, c.in_flight) for key, c in a.conns.items()} == {
            key: (c.rdy, c.in_flight) for key, c in b.conns.items()
        }
