"""Slow and stalled consumers sharing a channel with healthy ones (the nsqd console script).

A *stalled* consumer subscribes with a large RDY and then never reads again: its TCP
window fills, nsqd's writes to it back up. A *slow* one reads and FINs a few messages a
second. Two healthy consumers FIN everything at once. Meanwhile a publisher sends a steady
stream of 4 KiB messages.

What must hold: nsqd's memory stays within the stalled consumer's in-flight bound (RDY x
message size) plus its output buffering, however long the stall lasts (messages that time
out are not written to it again while its writes are blocked); the messages it holds time
out (``--msg-timeout``) and reach the healthy consumers; the healthy consumers receive every
message; the figures (RSS, the healthy consumers' rate with and without the stalled one)
are printed for the report. Rates are measured, not asserted (this is a 2-core machine
shared with other work): the assertions are about memory and delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest
from e2e.proc import NsqdProcess
from support import RawClient, nsqd_stats

from nsqpy.protocol import commands
from nsqpy.protocol.frames import FRAME_TYPE_MESSAGE, decode_message

pytestmark = pytest.mark.timeout(180)

SIZE = 4096
STALLED_RDY = 500
RATE = 1500  # messages/s published
PHASE = 6.0  # seconds per phase
MSG_TIMEOUT = 1.0


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class Healthy:
    def __init__(self) -> None:
        self.got: set[bytes] = set()
        self.count = 0

    async def run(self, port: int, stop: asyncio.Event) -> None:
        c = await RawClient.connect(port)
        try:
            await c.sub("slow", "c", rdy=200)
            while not stop.is_set():
                try:
                    ftype, data = await c.read_frame(timeout=0.2)
                except TimeoutError:
                    continue
                if ftype == FRAME_TYPE_MESSAGE:
                    m = decode_message(data)
                    self.got.add(m.body[:16])
                    self.count += 1
                    c.send(commands.fin(m.id))
        finally:
            await c.close()


async def slow_consumer(port: int, stop: asyncio.Event, got: set[bytes], per_s: float = 5.0) -> int:
    c = await RawClient.connect(port)
    n = 0
    try:
        await c.sub("slow", "c", rdy=2)
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            t = loop.time()
            with contextlib.suppress(TimeoutError):
                ftype, data = await c.read_frame(timeout=0.5)
                if ftype == FRAME_TYPE_MESSAGE:  # (an E_FIN_FAILED: one that timed out meanwhile)
                    m = decode_message(data)
                    got.add(m.body[:16])
                    c.send(commands.fin(m.id))
                    n += 1
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, 1 / per_s - (loop.time() - t)))
    finally:
        await c.close()
    return n


def stalled_consumer(port: int) -> socket.socket:
    """Subscribe with RDY 500, then never read (a small receive buffer fills at once)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(
        b"  V2"
        + commands.identify({"client_id": "stalled"})
        + commands.sub("slow", "c")
        + commands.rdy(STALLED_RDY)
    )
    return s


async def publish(port: int, stop: asyncio.Event, sent: list[bytes]) -> None:
    c = await RawClient.connect(port)
    loop = asyncio.get_running_loop()
    batch = 50
    next_at = loop.time()
    try:
        while not stop.is_set():
            bodies = [b"%016d" % (len(sent) + i) + b"x" * (SIZE - 16) for i in range(batch)]
            c.send(commands.mpub("slow", bodies))
            assert await c.read_frame(timeout=10) == (0, b"OK")
            sent.extend(b[:16] for b in bodies)
            next_at += batch / RATE
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, next_at - loop.time()))
    finally:
        await c.close()


async def sample_rss(pid: int, stop: asyncio.Event, out: list[float]) -> None:
    while not stop.is_set():
        out.append(rss_mib(pid))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


async def test_stalled_and_slow_consumers_cost_bounded_memory_and_slow_no_one(tmp_path):
    p = NsqdProcess(
        tmp_path / "data",
        "--mem-queue-size=0",
        f"--msg-timeout={int(MSG_TIMEOUT * 1000)}ms",
        log_dir=tmp_path / "logs",
    ).start()
    try:
        assert p.http_post("/topic/create?topic=slow")[0] == 200
        assert p.http_post("/channel/create?topic=slow&channel=c")[0] == 200
        healthy = [Healthy(), Healthy()]
        sent: list[bytes] = []
        stop_all = asyncio.Event()
        consumers = [asyncio.create_task(h.run(p.tcp_port, stop_all)) for h in healthy]
        stop_pub = asyncio.Event()
        pub = asyncio.create_task(publish(p.tcp_port, stop_pub, sent))

        # phase 1: healthy consumers only (the baseline rate and RSS)
        base_rss: list[float] = []
        stop_sampling = asyncio.Event()
        sampler = asyncio.create_task(sample_rss(p.pid, stop_sampling, base_rss))
        n0 = sum(h.count for h in healthy)
        t0 = time.monotonic()
        await asyncio.sleep(PHASE)  # a measurement window, not a synchronisation
        rate_alone = (sum(h.count for h in healthy) - n0) / (time.monotonic() - t0)
        stop_sampling.set()
        await sampler

        # phase 2: a stalled and a slow consumer join for several message timeouts
        stalled = stalled_consumer(p.tcp_port)
        stop_slow = asyncio.Event()
        slow_got: set[bytes] = set()
        slow = asyncio.create_task(slow_consumer(p.tcp_port, stop_slow, slow_got))
        stall_rss: list[float] = []
        stop_sampling = asyncio.Event()
        sampler = asyncio.create_task(sample_rss(p.pid, stop_sampling, stall_rss))
        n1 = sum(h.count for h in healthy)
        t1 = time.monotonic()
        await asyncio.sleep(PHASE)  # a measurement window, not a synchronisation
        rate_stalled = (sum(h.count for h in healthy) - n1) / (time.monotonic() - t1)
        stop_sampling.set()
        await sampler
        doc = nsqd_stats(p.http_address, "slow", "c")
        ch = doc["topics"][0]["channels"][0]
        stalled_stats = [c for c in ch["clients"] if c["client_id"] == "stalled"]

        stop_pub.set()
        await pub
        # every message reaches the healthy consumers: those the stalled one holds time out
        deadline = time.monotonic() + 30

        def delivered() -> set[bytes]:
            return set().union(slow_got, *(h.got for h in healthy))

        while time.monotonic() < deadline and len(set(sent) - delivered()) > STALLED_RDY + 10:
            await asyncio.sleep(0.2)
        stalled.close()  # its in-flight messages go back to the channel at once
        while time.monotonic() < deadline and set(sent) - delivered():
            await asyncio.sleep(0.2)
        stop_slow.set()
        slow_n = await slow
        stop_all.set()
        await asyncio.gather(*consumers)
        missing = set(sent) - delivered()
    finally:
        code = p.stop()
    assert code == 0, p.describe()
    assert "Traceback" not in p.stderr(), p.describe(20000)

    base = max(base_rss)
    peak = max(stall_rss)
    bound = STALLED_RDY * (SIZE + 200) / 2**20 + 8  # in flight + output buffers + slack (MiB)
    print(
        f"healthy consumers: {rate_alone:.0f} msg/s alone, {rate_stalled:.0f} msg/s with a stalled "
        f"and a slow one ({slow_n} read by the slow one); nsqd RSS {base:.1f} MiB before, peak "
        f"{peak:.1f} MiB during the stall (bound +{bound:.1f}); stalled client: "
        f"{stalled_stats and stalled_stats[0]['in_flight_count']} in flight; channel timeouts "
        f"{ch['timeout_count']}; published {len(sent)}"
    )
    assert peak - base < bound, f"nsqd grew {peak - base:.1f} MiB with a stalled consumer (bound {bound:.1f})"
    assert not missing, f"{len(missing)} of {len(sent)} messages never reached the healthy or slow consumers"
    assert ch["timeout_count"] >= 1, "no message timed out from the stalled consumer"
    assert rate_stalled > 0
