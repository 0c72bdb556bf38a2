"""Channel's rules (as Go's channel_test.go): delivery within RDY, the in-flight index and each
consumer's deadlines, FIN/REQ/TOUCH and their errors, timeouts and deferred messages from the
periodic scan, a leaving consumer's messages, empty, ephemeral channels, consumer limits,
depth. The channel is driven directly, with a consumer double speaking its Consumer
interface."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_options
from support import wait_for

from nsqpy.nsqd.channel import Channel
from nsqpy.nsqd.message import Message
from nsqpy.nsqd.nsqd import NSQD

pytestmark = pytest.mark.timeout(30)


class FakeConsumer:
    """Takes messages into flight as a client does (ClientV2.send_messages' bookkeeping)."""

    _ids = iter(range(10_000, 100_000))

    def __init__(self, rdy: int = 100, msg_timeout: float = 60.0) -> None:
        self.id = next(self._ids)
        self.ready_count = rdy
        self.in_flight_count = 0
        self.msg_timeout = msg_timeout
        self.received: list[Message] = []
        self.timed_out = 0
        self.closed = False

    def can_receive(self) -> bool:
        return self.in_flight_count < self.ready_count and not self.closed

    def send_messages(self, channel: Channel, n: int, now: float | None = None) -> None:
        n = min(n, self.ready_count - self.in_flight_count)
        loop_now = channel.nsqd.loop.time() if now is None else now
        timers = channel.timers[self.id]
        while n > 0 and channel.queue:
            msg = channel.queue.popleft()
            if msg.deadline < 0:  # queued by several channels (SHARED): this one's copy
                msg = msg.copy()
            msg.attempts += 1
            msg.client = self
            msg.deadline = loop_now + self.msg_timeout
            msg.delivery_ts = loop_now
            channel.in_flight[msg.id] = msg
            timers.queue.append((msg.deadline, msg))
            self.received.append(msg)
            self.in_flight_count += 1
            n -= 1

    def timed_out_message(self) -> None:
        self.in_flight_count -= 1
        self.timed_out += 1

    def emptied(self) -> None:
        self.in_flight_count = 0

    def close(self) -> None:
        self.closed = True

    def stats(self) -> dict[str, Any]:
        return {}

    def finish(self, channel: Channel, msg: Message) -> str | None:
        err = channel.finish(self, msg.id)
        if err is None:
            self.in_flight_count -= 1
        return err


def publish(nsqd: NSQD, topic: str, bodies: list[bytes]) -> None:
    nsqd.get_topic(topic).put_bodies(bodies)


@pytest.fixture
async def nsqd(tmp_path):
    async with NSQD(make_options(tmp_path, mem_queue_size=100)) as d:
        yield d


async def test_delivery_stays_within_rdy_and_fin_frees_it(nsqd):
    ch = nsqd.get_topic("t").get_channel("c")
    c = FakeConsumer(rdy=3)
    assert ch.add_client(c)
    publish(nsqd, "t", [b"m%d" % i for i in range(5)])
    await wait_for(lambda: len(c.received) == 3)
    assert len(ch.in_flight) == 3 and len(ch.queue) == 2 and ch.depth == 2
    assert c.finish(ch, c.received[0]) is None
    await wait_for(lambda: len(c.received) == 4)
    assert [m.body for m in c.received] == [b"m0", b"m1", b"m2", b"m3"]


async def test_fin_errors(nsqd):
    ch = nsqd.get_topic("t").get_channel("c")
    a, b = FakeConsumer(rdy=1), FakeConsumer(rdy=0)
    ch.add_client(a)
    ch.add_client(b)
    publish(nsqd, "t", [b"x"])
    await wait_for(lambda: a.received)
    msg = a.received[0]
    assert ch.finish(b, msg.id) == "client does not own message"
    assert ch.finish(a, b"0" * 16) == "ID not in flight"
    assert ch.finish(a, msg.id) is None
    assert ch.finish(a, msg.id) == "ID not in flight"
    assert ch.touch(a, msg.id) == "ID not in flight"
    assert ch.requeue(a, msg.id, 0) == "ID not in flight"


async def test_requeue_now_and_deferred(nsqd):
    ch = nsqd.get_topic("t").get_channel("c")
    c = FakeConsumer(rdy=10)
    ch.add_client(c)
    publish(nsqd, "t", [b"a", b"b"])
    await wait_for(lambda: len(c.received) == 2)
    a, b = c.received
    assert ch.requeue(c, a.id, 0) is None
    c.in_flight_count -= 1
    assert ch.requeue(c, b.id, 0.2) is None  # deferred 200 ms
    c.in_flight_count -= 1
    assert ch.requeue_count == 2 and ch.deferred_count == 1
    await wait_for(lambda: len(c.received) == 3)
    assert c.received[2] is a and a.attempts == 2
    # the deferred one comes back from the periodic scan once due
    await wait_for(lambda: len(c.received) == 4, timeout=3)
    assert c.received[3] is b and b.attempts == 2 and ch.deferred_count == 0


async def test_timeout_requeues_and_touch_extends(nsqd):
    ch = nsqd.get_topic("t").get_channel("c")
    c = FakeConsumer(rdy=2, msg_timeout=0.3)
    ch.add_client(c)
    publish(nsqd, "t", [b"timeout", b"touched"])
    await wait_for(lambda: len(c.received) == 2)
    timed, touched = c.received
    c.msg_timeout = 5.0  # the TOUCH resets the deadline to msg_timeout from now
    assert ch.touch(c, touched.id) is None
    await wait_for(lambda: ch.timeout_count == 1, timeout=3)
    assert c.timed_out == 1
    await wait_for(lambda: len(c.received) == 3)  # the timed-out one, redelivered
    assert c.received[2] is timed and timed.attempts == 2
    assert ch.in_flight[touched.id] is touched and touched.attempts == 1


async def test_a_leaving_consumers_messages_go_back(nsqd):
    ch = nsqd.get_topic("t").get_channel("c")
    a, b = FakeConsumer(rdy=5), FakeConsumer(rdy=0)
    ch.add_client(a)
    ch.add_client(b)
    publish(nsqd, "t", [b"1", b"2", b"3"])
    await wait_for(lambda: len(a.received) == 3)
    ch.remove_client(a)
    assert not ch.in_flight and len(ch.queue) == 3 and a.id not in ch.timers
    b.ready_count = 5
    ch.schedule_pump()
    await wait_for(lambda: len(b.received) == 3)
    assert sorted(m.body for m in b.received) == [b"1", b"2", b"3"]


async def test_empty_drops_everything(nsqd):
    ch = nsqd.get_topic("t").get_channel("c")
    c = FakeConsumer(rdy=2)
    ch.add_client(c)
    publish(nsqd, "t", [b"%d" % i for i in range(300)])  # past mem-queue-size: disk too
    await wait_for(lambda: len(c.received) == 2)
    assert ch.backend_depth > 0 and ch.depth == 298
    ch.empty()
    assert ch.depth == 0 and not ch.in_flight and c.in_flight_count == 0
    assert ch.finish(c, c.received[0].id) == "ID not in flight"


async def test_ephemeral_channel_drops_overflow_and_goes_with_its_last_client(nsqd):
    topic = nsqd.get_topic("t")
    ch = topic.get_channel("tail#ephemeral")
    assert not ch.backend.durable
    c = FakeConsumer(rdy=0)
    ch.add_client(c)
    publish(nsqd, "t", [b"%d" % i for i in range(150)])
    assert ch.depth == 100 and ch.backend_depth == 0  # the overflow is gone, as in NSQ
    assert ch.message_count == 150
    ch.remove_client(c)
    assert "tail#ephemeral" not in topic.channels


async def test_max_channel_consumers(tmp_path):
    async with NSQD(make_options(tmp_path, max_channel_consumers=2)) as d:
        ch = d.get_topic("t").get_channel("c")
        assert ch.add_client(FakeConsumer()) and ch.add_client(FakeConsumer())
        assert not ch.add_client(FakeConsumer())


async def test_depth_is_memory_plus_backend(nsqd):
    ch = nsqd.get_topic("t").get_channel("c")
    publish(nsqd, "t", [b"%d" % i for i in range(250)])
    assert len(ch.queue) == 100 and ch.backend_depth == 150 and ch.depth == 250


async def test_the_scan_times_out_one_busy_consumer_among_idle_ones(nsqd):
    """The periodic scan looks only at consumers the pump sent to: thousands of idle ones
    cost it nothing, and a busy one's messages still time out."""
    ch = nsqd.get_topic("t").get_channel("c")
    idle = [FakeConsumer(rdy=0) for _ in range(50)]
    for c in idle:
        ch.add_client(c)
    busy = FakeConsumer(rdy=5, msg_timeout=30.0)
    ch.add_client(busy)
    publish(nsqd, "t", [b"a", b"b"])
    await wait_for(lambda: len(busy.received) == 2)
    assert ch.timed == {busy.id}
    ch.scan(nsqd.loop.time())  # nothing due yet
    assert ch.timeout_count == 0 and ch.timed == {busy.id}
    ch.scan(nsqd.loop.time() + 31)
    assert ch.timeout_count == 2 and busy.timed_out == 2 and not ch.in_flight
    await wait_for(lambda: len(busy.received) == 4)  # redelivered
    assert all(c.id not in ch.timed for c in idle)
    ch.remove_client(busy)
    assert busy.id not in ch.timed


async def test_a_topics_channels_share_a_budget_per_loop_turn(tmp_path):
    """Many channels ready for a backlog send at most PUMP_TURN (plus the pump that crossed
    it) in one event-loop turn, so a publisher's command on the same loop is not kept waiting
    behind every channel's delivery; every channel still gets every message once, as a copy of
    its own (attempts, deadline and client are per channel)."""
    import asyncio

    from nsqpy.nsqd.channel import PUMP_TURN

    async with NSQD(make_options(tmp_path, mem_queue_size=100_000)) as d:
        topic = d.get_topic("t")
        chans = [topic.get_channel(f"c{i}") for i in range(4)]
        cons = [FakeConsumer(rdy=0) for _ in chans]
        for ch, c in zip(chans, cons, strict=True):
            assert ch.add_client(c)
        per = PUMP_TURN * 3 // 4
        topic.put_bodies([b"m%d" % i for i in range(per)])
        for ch, c in zip(chans, cons, strict=True):
            c.ready_count = per
            ch.schedule_pump()

        def total() -> int:
            return sum(len(c.received) for c in cons)

        sent_per_turn = []
        while total() < per * len(chans):
            before = total()
            await asyncio.sleep(0)  # one turn of the loop
            sent_per_turn.append(total() - before)
        assert max(sent_per_turn) <= PUMP_TURN + per < per * len(chans)
        ids = [m.id for m in cons[0].received]
        assert all([m.id for m in c.received] == ids for c in cons)
        assert len({id(m) for c in cons for m in c.received}) == per * len(chans)
        assert all(m.attempts == 1 for c in cons for m in c.received)
