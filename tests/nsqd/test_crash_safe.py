"""The crash-safe mode (``--mem-queue-size=0 --sync-every=1``) inside nsqd: the channel's
ledger through the real protocol (sampling, empty, delete, moving the floor, ephemeral
channels, a clean restart), with an in-process daemon. Kills are in tests/e2e and
tests/reliability; the on-disk state under every crash is tests/nsqd/test_journal.py's."""

from __future__ import annotations

import asyncio
import os

import pytest
from conftest import make_options
from support import RawClient, read_go_queue, wait_for

from nsqpy.nsqd import journal
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(60)


def strict(tmp_path, **kw):
    return make_options(tmp_path, mem_queue_size=0, sync_every=1, **kw)


async def publish(d: NSQD, bodies: list[bytes], topic: str = "t") -> None:
    p = await RawClient.connect(d.tcp_port)
    for i in range(0, len(bodies), 100):
        p.send(commands.mpub(topic, bodies[i : i + 100]))
        assert await p.read_frame() == (0, b"OK")
    await p.close()


async def drain(c: RawClient, n: int) -> list:
    got = await c.read_messages(n)
    for m in got:
        c.send(commands.fin(m.id))
    return got


def journal_file(tmp_path, name: str = "t:c"):
    return tmp_path / f"{name}.diskqueue.journal.dat"


async def test_a_clean_restart_brings_back_what_was_not_finished(tmp_path):
    async with NSQD(strict(tmp_path)) as d:
        d.get_topic("t").get_channel("c")
        await publish(d, [b"m%02d" % i for i in range(30)])
        c = await RawClient.connect(d.tcp_port)
        await c.sub("t", "c", rdy=30)
        got = await c.read_messages(30)
        for m in got[:10]:
            c.send(commands.fin(m.id))
        for m in got[10:20]:
            c.send(commands.req(m.id, 0))
        await wait_for(lambda: d.topics["t"].channels["c"].requeue_count == 10)
    async with NSQD(strict(tmp_path)) as d:
        ch = d.topics["t"].channels["c"]
        assert ch.depth == 20
        c = await RawClient.connect(d.tcp_port)
        await c.sub("t", "c", rdy=50)
        back = await drain(c, 20)
        assert sorted(m.body for m in back) == sorted(m.body for m in got[10:])
        await c.expect_silence(0.3)
        await c.close()
        await wait_for(lambda: not ch.in_flight)
    async with NSQD(strict(tmp_path)) as d:
        assert d.topics["t"].channels["c"].depth == 0


async def test_messages_a_sample_rate_leaves_out_are_finished(tmp_path):
    async with NSQD(strict(tmp_path)) as d:
        ch = d.get_topic("t").get_channel("c")
        await publish(d, [b"s%03d" % i for i in range(200)])
        c = await RawClient.connect(d.tcp_port)
        await c.identify(sample_rate=30)
        await c.sub("t", "c", rdy=200)
        got = []
        while True:
            try:
                m = await c.read_message(timeout=0.5)
            except TimeoutError:
                break
            got.append(m)
            c.send(commands.fin(m.id))
        assert 0 < len(got) < 200
        await wait_for(lambda: ch.depth == 0 and not ch.in_flight)
        assert not ch.ledger.anchors and ch.ledger.window.floor() is None
        await c.close()
    async with NSQD(strict(tmp_path)) as d:
        assert d.topics["t"].channels["c"].depth == 0  # nothing left out comes back


async def test_empty_and_delete_take_the_journal_with_them(tmp_path):
    async with NSQD(strict(tmp_path)) as d:
        topic = d.get_topic("t")
        ch = topic.get_channel("c")
        await publish(d, [b"e%02d" % i for i in range(20)])
        c = await RawClient.connect(d.tcp_port)
        await c.sub("t", "c", rdy=5)
        m = (await c.read_messages(5))[0]
        c.send(commands.req(m.id, 60000))  # a due time in the journal
        await wait_for(lambda: journal_file(tmp_path).exists())
        ch.empty()
        assert ch.depth == 0 and not journal_file(tmp_path).exists()
        await publish(d, [b"after"])
        await c.close()
    async with NSQD(strict(tmp_path)) as d:
        ch = d.topics["t"].channels["c"]
        assert ch.depth == 1
        d.topics["t"].delete_channel("c")
        assert not any(f.startswith("t:c.") for f in os.listdir(tmp_path))


async def test_ephemeral_channels_stay_in_memory(tmp_path):
    """As Go's with --mem-queue-size=0: what a consumer is ready for is delivered, nothing
    goes to disk."""
    async with NSQD(strict(tmp_path)) as d:
        c = await RawClient.connect(d.tcp_port)
        await c.sub("t", "tail#ephemeral", rdy=10)
        await publish(d, [b"x", b"y"])
        assert [m.body for m in await drain(c, 2)] == [b"x", b"y"]
        assert d.topics["t"].channels["tail#ephemeral"].ledger is None
        assert not any("ephemeral" in f for f in os.listdir(tmp_path))
        await c.close()


async def test_a_long_deferred_message_does_not_hold_the_floor_back(tmp_path, monkeypatch):
    """A message REQ'd for an hour would keep every segment after it on disk (and in the
    journal): it is moved to the tail, the segments go, and it keeps its due time."""
    monkeypatch.setattr(journal, "RELOCATE_MIN_SPAN", 50)
    opts = strict(tmp_path, max_bytes_per_file=2000, queue_scan_interval=0.05)
    async with NSQD(opts) as d:
        ch = d.get_topic("t").get_channel("c")
        await publish(d, [b"first"])
        c = await RawClient.connect(d.tcp_port)
        await c.sub("t", "c", rdy=100)
        (first,) = await c.read_messages(1)
        c.send(commands.req(first.id, 3_600_000))
        for round_ in range(6):  # traffic that the deferred message would pin on disk
            await publish(d, [b"r%d-%03d" % (round_, i) for i in range(50)])
            await drain(c, 50)
        await wait_for(lambda: first.id in ch.ledger.anchors and ch.ledger.window.span < 50)
        await wait_for(lambda: len([f for f in os.listdir(tmp_path) if f.startswith("t:c.diskqueue.0")]) <= 2)
        assert ch.deferred_count == 1
        await c.close()
    # the floor is past the original: a reader by the Go rules finds the copy near the end
    records = read_go_queue(tmp_path, "t:c")
    assert [r[26:] for r in records].count(b"first") == 1 and len(records) < 50
    async with NSQD(opts) as d:
        ch = d.topics["t"].channels["c"]
        c = await RawClient.connect(d.tcp_port)
        await c.sub("t", "c", rdy=100)
        await c.expect_silence(0.5)  # still an hour to wait
        assert ch.deferred_count == 1 and ch.depth == 0  # deferred ones are not in the depth (NSQ)
        await c.close()


async def test_a_directory_left_in_the_crash_safe_mode_starts_without_it(tmp_path):
    """Started again with the default flags, nsqd still applies the journal (finished
    messages stay finished, due times are kept), then lets it go."""
    async with NSQD(strict(tmp_path)) as d:
        d.get_topic("t").get_channel("c")
        await publish(d, [b"a", b"b", b"c"])
        c = await RawClient.connect(d.tcp_port)
        await c.sub("t", "c", rdy=3)
        a, b, _ = await c.read_messages(3)
        c.send(commands.fin(a.id))
        c.send(commands.req(b.id, 1500))
        await wait_for(lambda: d.topics["t"].channels["c"].deferred_count == 1)
        await c.close()
    assert journal_file(tmp_path).exists()
    async with NSQD(make_options(tmp_path)) as d:
        ch = d.topics["t"].channels["c"]
        c = await RawClient.connect(d.tcp_port)
        await c.sub("t", "c", rdy=10)
        assert [m.body for m in await drain(c, 1)] == [b"c"]  # a is finished, b waits
        await asyncio.sleep(0.2)
        assert ch.ledger is None and not journal_file(tmp_path).exists()
        assert [m.body for m in await drain(c, 1)] == [b"b"]
        await c.close()
