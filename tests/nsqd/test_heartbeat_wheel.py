"""Heartbeats of many connections share a few timers (nsqd's HeartbeatWheel): every client
still gets its own on time, one that closes is let go, and one with a different interval
keeps it."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import pytest
from support import RawClient, wait_for

from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(60)


async def heartbeat(c: RawClient, timeout: float = 3.0) -> bool:
    """The next frame is a heartbeat (answered with NOP, as a client must)."""
    f = await c.read_frame(timeout=timeout, skip_heartbeats=False)
    c.send(commands.NOP)
    return f == (0, b"_heartbeat_")


async def test_every_client_gets_its_heartbeats_and_a_closed_one_is_let_go(nsqd):
    clients = []
    for _ in range(40):
        c = await RawClient.connect(nsqd.tcp_port)
        await c.identify(heartbeat_interval=1000)
        await c.sub("t", "c", 1)
        clients.append(c)
    await wait_for(lambda: len(nsqd.clients) == 40)
    start = time.monotonic()
    assert all(await asyncio.gather(*(heartbeat(c) for c in clients)))
    assert time.monotonic() - start < 2.5

    # half of them leave: the daemon keeps no reference to them (their timers neither)
    refs = [weakref.ref(p) for p in nsqd.clients.values()]
    for c in clients[:20]:
        await c.close()
    stayed = clients[20:]
    await wait_for(lambda: len(nsqd.clients) == 20)
    for _ in range(3):
        gc.collect()
    assert sum(ref() is not None for ref in refs) == 20

    # the others still get theirs, twice over
    for _ in range(2):
        assert all(await asyncio.gather(*(heartbeat(c) for c in stayed)))
    for c in stayed:
        await c.close()


async def test_identify_changes_the_interval_of_one_client_only(nsqd):
    slow = await RawClient.connect(nsqd.tcp_port)
    await slow.identify(heartbeat_interval=5000)
    fast = await RawClient.connect(nsqd.tcp_port)
    await fast.identify(heartbeat_interval=1000)
    for _ in range(2):
        assert await heartbeat(fast)
    # ~2 s on: the slow one has had none (its first is due at 5 s)
    with pytest.raises(TimeoutError):
        await slow.read_frame(timeout=0.5, skip_heartbeats=False)
    assert await heartbeat(slow, timeout=6)
    await slow.close()
    await fast.close()
