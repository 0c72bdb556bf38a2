"""Topic's rules (as Go's topic_test.go): messages wait in the topic (memory, then disk) while
it has no channel or is paused; the first channel gets that backlog, later ones only what is
published after them; every channel gets its own copy; ephemeral topics drop overflow and go
with their last channel; deleting a topic removes its files; the counters."""

from __future__ import annotations

import os

import pytest
from conftest import make_options
from support import wait_for

from nsqpy.nsqd.nsqd import NSQD

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def nsqd(tmp_path):
    async with NSQD(make_options(tmp_path, mem_queue_size=100)) as d:
        yield d


def bodies(n: int, prefix: bytes = b"m") -> list[bytes]:
    return [prefix + b"%d" % i for i in range(n)]


async def test_messages_wait_in_the_topic_until_the_first_channel(nsqd):
    t = nsqd.get_topic("t")
    t.put_bodies(bodies(250))
    assert len(t.queue) == 100 and t.backend_depth == 150 and t.depth == 250
    first = t.get_channel("first")
    await wait_for(lambda: first.depth == 250 and t.depth == 0)
    t.put_bodies(bodies(10, b"new"))
    second = t.get_channel("second")
    t.put_bodies(bodies(5, b"newer"))
    assert first.depth == 265
    assert second.depth == 5  # only what was published after it existed


async def test_every_channel_gets_its_own_copy(nsqd):
    """Each channel queues every message (its attempts are its own: see
    test_protocol_v2's test_attempts_are_per_channel)."""
    t = nsqd.get_topic("t")
    a, b = t.get_channel("a"), t.get_channel("b")
    t.put_bodies([b"x", b"y"])
    ma, mb = list(a.queue), list(b.queue)
    assert [m.body for m in ma] == [m.body for m in mb] == [b"x", b"y"]
    assert [m.id for m in ma] == [m.id for m in mb]
    assert [m.attempts for m in ma + mb] == [0, 0, 0, 0]


async def test_a_paused_topic_holds_messages(nsqd):
    t = nsqd.get_topic("t")
    ch = t.get_channel("c")
    t.pause()
    t.put_bodies(bodies(3))
    assert t.depth == 3 and ch.depth == 0
    t.unpause()
    await wait_for(lambda: ch.depth == 3 and t.depth == 0)


async def test_ephemeral_topic(nsqd):
    t = nsqd.get_topic("tmp#ephemeral")
    assert not t.backend.durable
    t.put_bodies(bodies(150))
    assert t.depth == 100  # no disk: the overflow is dropped, as in NSQ
    ch = t.get_channel("c")
    assert not ch.backend.durable
    t.delete_channel("c")
    assert "tmp#ephemeral" not in nsqd.topics


async def test_delete_removes_the_files(nsqd, tmp_path):
    t = nsqd.get_topic("gone")
    t.get_channel("c").put_messages([])
    t.pause()
    t.put_bodies(bodies(300))
    assert any(f.startswith("gone.diskqueue") for f in os.listdir(tmp_path))
    assert nsqd.delete_topic("gone")
    assert not [f for f in os.listdir(tmp_path) if f.startswith("gone")]
    assert not nsqd.delete_topic("gone")


async def test_counters(nsqd):
    t = nsqd.get_topic("t")
    t.put_bodies([b"ab", b"cde"])
    t.put_bodies([])
    assert (t.message_count, t.message_bytes) == (2, 5)
