"""statsd pushes (Go's ``nsqd/statsd.go``): key prefix, metric lines, counter deltas, packing
into datagrams, and the loop inside an in-process nsqd."""

from __future__ import annotations

import asyncio
import re
import socket

import pytest
from conftest import make_options
from support import RawClient, wait_for

from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.statsd import host_key, pack_lines, statsd_lines, statsd_prefix
from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(30)

LINE = re.compile(rb"^(?P<key>[^:]+):(?P<value>-?\d+)\|(?P<type>[cg])$")


# --- prefix -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "host", "port", "prefix"),
    [
        ("nsq.%s", "host.example.com", 4151, "nsq.host_example_com_4151."),
        ("nsq.%s.", "10.0.0.1", 80, "nsq.10_0_0_1_80."),
        ("%s.nsqd.%s", "h", 1, "h_1.nsqd.h_1."),
        ("fixed", "h", 1, "fixed."),
        ("nsq.%s", "::1", 4151, "nsq.[__1]_4151."),  # net.JoinHostPort brackets IPv6
        ("", "h", 1, ""),
    ],
)
def test_prefix(template, host, port, prefix):
    assert statsd_prefix(template, host, port) == prefix


def test_host_key():
    assert host_key("a.b:c") == "a_b_c"


# --- lines ------------------------------------------------------------------------------------


def topic(name, channels=(), mc=0, mb=0, depth=0, bdepth=0, e2e=None):
    return {
        "topic_name": name,
        "channels": list(channels),
        "depth": depth,
        "backend_depth": bdepth,
        "message_count": mc,
        "message_bytes": mb,
        "paused": False,
        "e2e_processing_latency": e2e or {"count": 0, "percentiles": None},
    }


def channel(name, mc=0, rq=0, to=0, e2e=None, **gauges):
    c = {
        "channel_name": name,
        "depth": 0,
        "backend_depth": 0,
        "in_flight_count": 0,
        "deferred_count": 0,
        "message_count": mc,
        "requeue_count": rq,
        "timeout_count": to,
        "client_count": 0,
        "clients": None,
        "paused": False,
        "e2e_processing_latency": e2e or {"count": 0, "percentiles": None},
    }
    c.update(gauges)
    return c


MEM = {
    "heap_objects": 11,
    "heap_idle_bytes": 0,
    "heap_in_use_bytes": 33,
    "heap_released_bytes": 0,
    "gc_pause_usec_100": 5,
    "gc_pause_usec_99": 4,
    "gc_pause_usec_95": 3,
    "next_gc_bytes": 0,
    "gc_total_runs": 70,
}


def test_lines_in_go_order_with_types():
    lat = {"count": 3, "percentiles": [{"quantile": 1, "value": 2500.0}, {"quantile": 0.995, "value": 7}]}
    topics = [
        topic(
            "t",
            [
                channel(
                    "c",
                    mc=5,
                    rq=1,
                    to=2,
                    depth=3,
                    backend_depth=1,
                    in_flight_count=4,
                    deferred_count=6,
                    client_count=2,
                    e2e=lat,
                )
            ],
            mc=5,
            mb=50,
            depth=7,
            bdepth=2,
            e2e=lat,
        )
    ]
    lines, last = statsd_lines("p.", topics, {}, MEM, 60)
    assert [line.decode() for line in lines] == [
        "p.topic.t.message_count:5|c\n",
        "p.topic.t.message_bytes:50|c\n",
        "p.topic.t.depth:7|g\n",
        "p.topic.t.backend_depth:2|g\n",
        "p.topic.t.e2e_processing_latency_100:2500|g\n",
        "p.topic.t.e2e_processing_latency_100:7|g\n",  # Go's %.0f of 99.5 rounds to even
        "p.topic.t.channel.c.message_count:5|c\n",
        "p.topic.t.channel.c.depth:3|g\n",
        "p.topic.t.channel.c.backend_depth:1|g\n",
        "p.topic.t.channel.c.in_flight_count:4|g\n",
        "p.topic.t.channel.c.deferred_count:6|g\n",
        "p.topic.t.channel.c.requeue_count:1|c\n",
        "p.topic.t.channel.c.timeout_count:2|c\n",
        "p.topic.t.channel.c.clients:2|g\n",
        "p.topic.t.channel.c.e2e_processing_latency_100:2500|g\n",
        "p.topic.t.channel.c.e2e_processing_latency_100:7|g\n",
        "p.mem.heap_objects:11|g\n",
        "p.mem.heap_idle_bytes:0|g\n",
        "p.mem.heap_in_use_bytes:33|g\n",
        "p.mem.heap_released_bytes:0|g\n",
        "p.mem.gc_pause_usec_100:5|g\n",
        "p.mem.gc_pause_usec_99:4|g\n",
        "p.mem.gc_pause_usec_95:3|g\n",
        "p.mem.next_gc_bytes:0|g\n",
        "p.mem.gc_runs:10|c\n",
    ]
    # the next push sends the counters' increase only
    topics = [topic("t", [channel("c", mc=8, rq=1, to=2)], mc=9, mb=90)]
    lines, _ = statsd_lines("p.", topics, last, None, 0)
    text = b"".join(lines).decode()
    assert "p.topic.t.message_count:4|c\n" in text
    assert "p.topic.t.message_bytes:40|c\n" in text
    assert "p.topic.t.channel.c.message_count:3|c\n" in text
    assert "p.topic.t.channel.c.requeue_count:0|c\n" in text
    assert "mem." not in text


def test_recreated_topic_sends_a_negative_delta():
    _, last = statsd_lines("", [topic("t", mc=10)], {}, None, 0)
    lines, _ = statsd_lines("", [topic("t", mc=3)], last, None, 0)
    assert lines[0] == b"topic.t.message_count:-7|c\n"


def test_exclude_ephemeral():
    topics = [
        topic("a#ephemeral", [channel("c")]),
        topic("b", [channel("c#ephemeral"), channel("d")]),
    ]
    text = b"".join(statsd_lines("", topics, {}, None, 0, exclude_ephemeral=True)[0]).decode()
    assert "a#ephemeral" not in text and "c#ephemeral" not in text
    assert "topic.b.channel.d.depth:0|g" in text
    text = b"".join(statsd_lines("", topics, {}, None, 0)[0]).decode()
    assert "topic.a#ephemeral.channel.c.depth:0|g" in text
    assert "topic.b.channel.c#ephemeral.depth:0|g" in text


# --- packets ----------------------------------------------------------------------------------


def test_pack_lines_whole_lines_up_to_size():
    lines = [b"a" * 9 + b"\n", b"b" * 4 + b"\n", b"c" * 4 + b"\n", b"d" * 30 + b"\n", b"e\n"]
    assert pack_lines(lines, 20) == [
        b"a" * 9 + b"\n" + b"b" * 4 + b"\n" + b"c" * 4 + b"\n",  # exactly 20 bytes
        b"d" * 30 + b"\n",  # longer than a packet: alone
        b"e\n",
    ]
    assert pack_lines([], 508) == []
    # Go's bufio falls back to 4096 bytes for a size <= 0
    assert pack_lines([b"x" * 99 + b"\n"] * 41, 0) == [(b"x" * 99 + b"\n") * 40, b"x" * 99 + b"\n"]


# --- the loop in a daemon ---------------------------------------------------------------------


class Collector(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.packets: list[bytes] = []

    def datagram_received(self, data: bytes, addr) -> None:
        self.packets.append(data)


async def test_pushes_from_a_daemon(tmp_path):
    loop = asyncio.get_running_loop()
    transport, udp = await loop.create_datagram_endpoint(
        Collector, local_addr=("127.0.0.1", 0), family=socket.AF_INET
    )
    port = transport.get_extra_info("sockname")[1]
    opts = make_options(
        tmp_path,
        statsd_address=f"127.0.0.1:{port}",
        statsd_interval=0.2,
        statsd_prefix="test.%s",
        broadcast_address="h.local",
        statsd_udp_packet_size=100,
        e2e_processing_latency_percentiles=[0.5],
    )
    try:
        async with NSQD(opts) as nsqd:
            prefix = f"test.h_local_{nsqd.http_port}."
            c = await RawClient.connect(nsqd.tcp_port)
            await c.sub("t", "c", 10)
            p = await RawClient.connect(nsqd.tcp_port)
            p.send(commands.mpub("t", [b"x", b"yy", b"zzz"]))
            assert await p.read_frame() == (0, b"OK")
            for m in await c.read_messages(3):
                c.send(commands.fin(m.id))

            def totals():
                sums: dict[str, int] = {}
                gauges: dict[str, int] = {}
                for packet in udp.packets:
                    assert len(packet) <= 100 and packet.endswith(b"\n"), packet
                    for line in packet.splitlines():
                        m = LINE.match(line)
                        assert m, line
                        key = m["key"].decode()
                        assert key.startswith(prefix), key
                        if m["type"] == b"c":
                            sums[key] = sums.get(key, 0) + int(m["value"])
                        else:
                            gauges[key] = int(m["value"])
                return sums, gauges

            def done():
                sums, gauges = totals()
                return (
                    sums.get(prefix + "topic.t.channel.c.message_count") == 3
                    and gauges.get(prefix + "topic.t.channel.c.in_flight_count") == 0
                )

            await wait_for(done, timeout=10)
            sums, gauges = totals()
            assert sums[prefix + "topic.t.message_count"] == 3
            assert sums[prefix + "topic.t.message_bytes"] == 6
            assert gauges[prefix + "topic.t.channel.c.clients"] == 1
            assert prefix + "topic.t.e2e_processing_latency_50" in gauges
            assert prefix + "topic.t.channel.c.e2e_processing_latency_50" in gauges
            assert gauges[prefix + "mem.heap_objects"] > 0
            assert prefix + "mem.gc_runs" in sums
            await c.close()
            await p.close()
        # stopped: no more pushes
        n = len(udp.packets)
        await asyncio.sleep(0.5)
        assert len(udp.packets) == n
    finally:
        transport.close()


async def test_unreachable_statsd_does_not_hurt(tmp_path):
    # nothing listens there: sends fail (ICMP port unreachable) and are ignored
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    opts = make_options(tmp_path, statsd_address=f"127.0.0.1:{port}", statsd_interval=0.05)
    async with NSQD(opts) as nsqd:
        p = await RawClient.connect(nsqd.tcp_port)
        for _ in range(5):
            assert await p.pub("t", b"x") == (0, b"OK")
            await asyncio.sleep(0.06)
        await p.close()


async def test_unresolvable_address_logs_and_goes_on(tmp_path, caplog):
    opts = make_options(tmp_path, statsd_address="no-such-host.invalid:8125", statsd_interval=0.05)
    async with NSQD(opts):
        await wait_for(
            lambda: "failed to create UDP socket to statsd(no-such-host.invalid:8125)" in caplog.text,
            timeout=10,
        )
