"""End to end: the ``nsqd`` console script pushing to a statsd UDP socket the test binds
(``--statsd-address``, ``--statsd-interval=1s``): metric names, types and values as Go's
``nsqd/statsd.go`` sends them, in datagrams of at most ``--statsd-udp-packet-size`` bytes."""

from __future__ import annotations

import asyncio
import itertools
import re
import socket
import time

import pytest
from e2e.proc import nsqd_fixture
from support import RawClient, wait_for

from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(60)

LINE = re.compile(r"^(?P<key>[^:]+):(?P<value>-?\d+)\|(?P<type>[cg])$")
MEM_GAUGES = [
    "heap_objects",
    "heap_idle_bytes",
    "heap_in_use_bytes",
    "heap_released_bytes",
    "gc_pause_usec_100",
    "gc_pause_usec_99",
    "gc_pause_usec_95",
    "next_gc_bytes",
]


class Statsd(asyncio.DatagramProtocol):
    """A statsd server that keeps every datagram, with its arrival time."""

    def __init__(self) -> None:
        self.packets: list[tuple[float, bytes]] = []

    def datagram_received(self, data: bytes, addr) -> None:
        self.packets.append((time.monotonic(), data))

    def lines(self) -> list[tuple[str, int, str]]:
        out = []
        for _, packet in self.packets:
            for line in packet.decode().splitlines():
                m = LINE.match(line)
                assert m, f"not a statsd line: {line!r}"
                out.append((m["key"], int(m["value"]), m["type"]))
        return out

    def totals(self) -> tuple[dict[str, int], dict[str, int], dict[str, str]]:
        """(counter sums, last gauge values, type of every key)."""
        sums: dict[str, int] = {}
        gauges: dict[str, int] = {}
        types: dict[str, str] = {}
        for key, value, typ in self.lines():
            assert types.setdefault(key, typ) == typ, key
            if typ == "c":
                sums[key] = sums.get(key, 0) + value
            else:
                gauges[key] = value
        return sums, gauges, types


@pytest.fixture
async def statsd():
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_datagram_endpoint(
        Statsd, local_addr=("127.0.0.1", 0), family=socket.AF_INET
    )
    proto.port = transport.get_extra_info("sockname")[1]
    yield proto
    transport.close()


@pytest.fixture
def nsqd_statsd(tmp_path, statsd):
    yield from nsqd_fixture(
        tmp_path,
        f"--statsd-address=127.0.0.1:{statsd.port}",
        "--statsd-interval=1s",
        "--broadcast-address=statsd-e2e.example",
        "--statsd-udp-packet-size=256",
        "--e2e-processing-latency-percentile=0.99,0.5",
    )


async def test_pushes_go_metric_names_types_and_values(nsqd_statsd, statsd):
    p = nsqd_statsd
    prefix = f"nsq.statsd-e2e_example_{p.http_port}."
    bodies = [b"msg-%02d" % i for i in range(20)]
    consumer = await RawClient.connect(p.tcp_port)
    await consumer.sub("st", "c", 50)
    producer = await RawClient.connect(p.tcp_port)
    producer.send(commands.mpub("st", bodies))
    assert await producer.read_frame() == (0, b"OK")
    msgs = await consumer.read_messages(20)
    consumer.send(commands.req(msgs[0].id, 0))
    again = await consumer.read_message()
    assert again.id == msgs[0].id
    for m in msgs:
        consumer.send(commands.fin(m.id))

    t = prefix + "topic.st."
    c = t + "channel.c."

    def settled():
        sums, gauges, _ = statsd.totals()
        return (
            sums.get(c + "message_count") == 20
            and sums.get(c + "requeue_count") == 1
            and gauges.get(c + "in_flight_count") == 0
        )

    await wait_for(settled, timeout=15)
    sums, gauges, types = statsd.totals()
    # counters: deltas since the previous push, so they add up to the totals
    assert sums[t + "message_count"] == 20
    assert sums[t + "message_bytes"] == sum(map(len, bodies))
    assert sums[c + "timeout_count"] == 0
    assert gauges[t + "depth"] == 0 and gauges[t + "backend_depth"] == 0
    assert gauges[c + "depth"] == 0 and gauges[c + "backend_depth"] == 0
    assert gauges[c + "deferred_count"] == 0
    assert gauges[c + "clients"] == 1
    for q in ("99", "50"):
        assert gauges[t + f"e2e_processing_latency_{q}"] >= 0
        assert gauges[c + f"e2e_processing_latency_{q}"] >= 0
    for name in MEM_GAUGES:
        assert types[prefix + "mem." + name] == "g"
    assert gauges[prefix + "mem.heap_objects"] > 0
    assert gauges[prefix + "mem.heap_in_use_bytes"] > 0
    assert types[prefix + "mem.gc_runs"] == "c"
    # exactly Go's key set, nothing else
    topic_keys = {
        "message_count",
        "message_bytes",
        "depth",
        "backend_depth",
        "e2e_processing_latency_99",
        "e2e_processing_latency_50",
    }
    channel_keys = {
        "message_count",
        "depth",
        "backend_depth",
        "in_flight_count",
        "deferred_count",
        "requeue_count",
        "timeout_count",
        "clients",
        "e2e_processing_latency_99",
        "e2e_processing_latency_50",
    }
    expected = (
        {t + k for k in topic_keys}
        | {c + k for k in channel_keys}
        | {prefix + "mem." + k for k in [*MEM_GAUGES, "gc_runs"]}
    )
    assert set(types) == expected
    assert {k for k, v in types.items() if v == "c"} == {
        t + "message_count",
        t + "message_bytes",
        c + "message_count",
        c + "requeue_count",
        c + "timeout_count",
        prefix + "mem.gc_runs",
    }
    # datagrams: whole lines, at most --statsd-udp-packet-size bytes
    for _, packet in statsd.packets:
        assert len(packet) <= 256 and packet.endswith(b"\n"), packet
    assert max(len(packet) for _, packet in statsd.packets) > 128  # lines were packed

    # one push per interval: a push starts with the topic's message_count line
    await wait_for(lambda: len(push_times(statsd, t)) >= 3, timeout=10)
    times = push_times(statsd, t)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(0.5 < g < 2.5 for g in gaps), gaps
    await consumer.close()
    await producer.close()


def push_times(statsd: Statsd, topic_prefix: str) -> list[float]:
    return [
        at for at, packet in statsd.packets if packet.startswith((topic_prefix + "message_count:").encode())
    ]


@pytest.fixture
def nsqd_statsd_quiet(tmp_path, statsd):
    yield from nsqd_fixture(
        tmp_path,
        f"--statsd-address=127.0.0.1:{statsd.port}",
        "--statsd-interval=1s",
        "--statsd-prefix=custom.stats",
        "--statsd-mem-stats=false",
        "--statsd-exclude-ephemeral",
    )


async def test_prefix_mem_stats_off_and_ephemeral_excluded(nsqd_statsd_quiet, statsd):
    p = nsqd_statsd_quiet
    for path in (
        "/topic/create?topic=x",
        "/channel/create?topic=x&channel=d",
        "/channel/create?topic=x&channel=e%23ephemeral",
        "/topic/create?topic=y%23ephemeral",
    ):
        assert p.http_post(path)[0] == 200
    assert p.http_post("/pub?topic=x", b"hello")[0] == 200

    def pushed():
        # a push is several UDP packets: wait for its first stat counted and its last one seen
        sums, _, types = statsd.totals()
        return (
            sums.get("custom.stats.topic.x.channel.d.message_count") == 1
            and "custom.stats.topic.x.channel.d.clients" in types
        )

    await wait_for(pushed, timeout=10)
    _, _, types = statsd.totals()
    assert set(types) == {
        "custom.stats.topic.x." + k for k in ("message_count", "message_bytes", "depth", "backend_depth")
    } | {
        "custom.stats.topic.x.channel.d." + k
        for k in (
            "message_count",
            "depth",
            "backend_depth",
            "in_flight_count",
            "deferred_count",
            "requeue_count",
            "timeout_count",
            "clients",
        )
    }
