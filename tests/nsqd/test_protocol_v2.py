"""Integration tests: the in-process nsqd over raw TCP protocol V2 sockets."""

from __future__ import annotations

import asyncio
import json
import re
import struct
import time

import pytest
import pytest_asyncio
from conftest import make_options
from support import RawClient, wait_for

from nsqpy.nsqd.nsqd import NSQD
from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(30)


async def client(nsqd, **identify):
    c = await RawClient.connect(nsqd.tcp_port)
    if identify:
        await c.identify(**identify)
    return c


async def consumer(nsqd, topic, channel, rdy=None, **identify):
    c = await client(nsqd, **identify)
    await c.sub(topic, channel, rdy)
    return c


def channel_of(nsqd, topic, channel):
    return nsqd.topics[topic].channels[channel]


# --- connection and IDENTIFY -----------------------------------------------------------------


async def test_bad_magic_gets_e_bad_protocol_and_close(nsqd):
    c = await RawClient.connect(nsqd.tcp_port, magic=False)
    c.send(b"  V9")
    assert await c.read_error() == "E_BAD_PROTOCOL"
    await c.expect_closed()


async def test_identify_plain_ok(nsqd):
    c = await client(nsqd)
    assert await c.identify(client_id="x") == b"OK"


async def test_identify_feature_negotiation_fields(nsqd):
    c = await client(nsqd)
    resp = await c.identify(
        feature_negotiation=True,
        msg_timeout=5000,
        output_buffer_size=4096,
        output_buffer_timeout=100,
        sample_rate=0,
        tls_v1=True,
    )
    assert set(resp) >= {
        "max_rdy_count",
        "version",
        "max_msg_timeout",
        "msg_timeout",
        "tls_v1",
        "deflate",
        "deflate_level",
        "max_deflate_level",
        "snappy",
        "sample_rate",
        "auth_required",
        "output_buffer_size",
        "output_buffer_timeout",
    }
    assert resp["max_rdy_count"] == 2500
    assert resp["version"] == "1.3.0"
    assert resp["max_msg_timeout"] == 15 * 60 * 1000
    assert resp["msg_timeout"] == 5000
    assert resp["output_buffer_size"] == 4096
    assert resp["output_buffer_timeout"] == 100
    # no --tls-cert: TLS is refused; nothing asked for compression
    assert resp["tls_v1"] is False and resp["snappy"] is False and resp["deflate"] is False
    assert resp["auth_required"] is False


@pytest.mark.parametrize(
    "field,value,text",
    [
        ("heartbeat_interval", 999, "E_BAD_BODY IDENTIFY heartbeat interval (999) is invalid"),
        ("heartbeat_interval", 60001, "E_BAD_BODY IDENTIFY heartbeat interval (60001) is invalid"),
        ("output_buffer_size", 63, "E_BAD_BODY IDENTIFY output buffer size (63) is invalid"),
        ("output_buffer_timeout", 10, "E_BAD_BODY IDENTIFY output buffer timeout (10) is invalid"),
        ("sample_rate", 100, "E_BAD_BODY IDENTIFY sample rate (100) is invalid"),
        ("msg_timeout", 999, "E_BAD_BODY IDENTIFY msg timeout (999) is invalid"),
    ],
)
async def test_identify_range_errors_are_fatal(nsqd, field, value, text):
    c = await client(nsqd)
    c.send(commands.identify({field: value}))
    assert await c.read_error() == text
    await c.expect_closed()


async def test_identify_bad_json(nsqd):
    c = await client(nsqd)
    c.send(b"IDENTIFY\n" + struct.pack(">i", 3) + b"{x}")
    assert await c.read_error() == "E_BAD_BODY IDENTIFY failed to decode JSON body"
    await c.expect_closed()


async def test_identify_body_size_limits(nsqd):
    c = await client(nsqd)
    c.send(b"IDENTIFY\n" + struct.pack(">i", 10 * 1024 * 1024))
    assert await c.read_error() == "E_BAD_BODY IDENTIFY body too big 10485760 > 5242880"
    await c.expect_closed()


async def test_invalid_command_is_fatal(nsqd):
    c = await client(nsqd)
    c.send(b"BOGUS x\n")
    assert await c.read_error() == "E_INVALID invalid command BOGUS"
    await c.expect_closed()


async def test_nop_has_no_response(nsqd):
    c = await client(nsqd)
    c.send(b"NOP\n")
    ftype, data = await c.pub("t", b"x")
    assert (ftype, data) == (0, b"OK")


# --- publish ---------------------------------------------------------------------------------


async def test_pub_then_sub_delivers_exact_frame(nsqd):
    p = await client(nsqd)
    before = time.time_ns()
    assert await p.pub("t", b"hello") == (0, b"OK")
    c = await consumer(nsqd, "t", "c", rdy=1)
    msg = await c.read_message()
    assert msg.body == b"hello"
    assert msg.attempts == 1
    assert re.fullmatch(rb"[0-9a-f]{16}", msg.id)
    assert before - 10**9 < msg.timestamp <= time.time_ns()


async def test_ids_unique_and_built_from_node_id(tmp_path):
    async with NSQD(make_options(tmp_path, node_id=513)) as d:
        p = await client(d)
        p.send(commands.mpub("a", [b"x"] * 500))
        assert await p.read_frame() == (0, b"OK")
        p.send(commands.mpub("b", [b"y"] * 500))
        assert await p.read_frame() == (0, b"OK")
        ids = [m.id for t in ("a", "b") for m in d.topics[t].queue]
        assert len(set(ids)) == 1000
        for i in ids:
            assert (int(i, 16) >> 12) & 0x3FF == 513


async def test_pub_errors(nsqd):
    c = await client(nsqd)
    c.send(b"PUB bad!name\n" + struct.pack(">i", 1) + b"x")
    assert await c.read_error() == 'E_BAD_TOPIC PUB topic name "bad!name" is not valid'
    await c.expect_closed()
    c = await client(nsqd)
    c.send(b"PUB t\n" + struct.pack(">i", 0))
    assert await c.read_error() == "E_BAD_MESSAGE PUB invalid message body size 0"
    c = await client(nsqd)
    c.send(b"PUB t\n" + struct.pack(">i", 1048577))
    assert await c.read_error() == "E_BAD_MESSAGE PUB message too big 1048577 > 1048576"
    c = await client(nsqd)
    c.send(b"PUB\n")
    assert await c.read_error() == "E_INVALID PUB insufficient number of parameters"


async def test_mpub_all_or_nothing(nsqd):
    c = await client(nsqd)
    good = commands.mpub("t", [b"a", b"b", b"c"])
    assert (c.send(good), await c.read_frame())[1] == (0, b"OK")
    assert nsqd.topics["t"].depth == 3
    bad_body = struct.pack(">ii", 3, 1) + b"a" + struct.pack(">i", 0)
    c.send(b"MPUB t\n" + struct.pack(">i", len(bad_body)) + bad_body)
    assert await c.read_error() == "E_BAD_MESSAGE MPUB invalid message(1) body size 0"
    await c.expect_closed()
    assert nsqd.topics["t"].depth == 3


async def test_mpub_bad_topic_text_matches_go(nsqd):
    c = await client(nsqd)
    c.send(commands.mpub("a!b", [b"x"]))
    assert await c.read_error() == 'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "a!b" is not valid'


async def test_mpub_body_too_big(nsqd):
    c = await client(nsqd)
    c.send(b"MPUB t\n" + struct.pack(">i", 5242881))
    assert await c.read_error() == "E_BAD_BODY MPUB body too big 5242881 > 5242880"


async def test_dpub_defers_and_range(nsqd):
    c = await client(nsqd)
    c.send(commands.dpub("t", 3600001, b"x"))
    assert await c.read_error() == "E_INVALID DPUB timeout 3600001 out of range 0-3600000"
    await c.expect_closed()
    sub = await consumer(nsqd, "t", "c", rdy=10)
    p = await client(nsqd)
    start = time.monotonic()
    p.send(commands.dpub("t", 600, b"later"))
    assert await p.read_frame() == (0, b"OK")
    await wait_for(lambda: channel_of(nsqd, "t", "c").deferred_count == 1)
    msg = await sub.read_message()
    assert msg.body == b"later"
    assert time.monotonic() - start >= 0.55


# --- subscribe and flow control --------------------------------------------------------------


async def test_sub_rules(nsqd):
    c = await client(nsqd)
    await c.sub("t", "c")
    c.send(commands.sub("t", "c"))
    assert await c.read_error() == "E_INVALID cannot SUB in current state"
    await c.expect_closed()
    c = await client(nsqd)
    c.send(commands.rdy(1))
    assert await c.read_error() == "E_INVALID cannot RDY in current state"
    c = await client(nsqd)
    c.send(b"SUB t bad/ch\n")
    assert await c.read_error() == 'E_BAD_CHANNEL SUB channel name "bad/ch" is not valid'
    c = await client(nsqd, heartbeat_interval=-1)
    c.send(commands.sub("t", "c"))
    assert await c.read_error() == "E_INVALID cannot SUB with heartbeats disabled"


async def test_rdy_over_max_is_fatal(nsqd):
    c = await consumer(nsqd, "t", "c")
    c.send(commands.rdy(2501))
    assert await c.read_error() == "E_INVALID RDY count 2501 out of range 0-2500"
    await c.expect_closed()


async def test_never_more_in_flight_than_rdy(nsqd):
    p = await client(nsqd)
    p.send(commands.mpub("t", [b"%d" % i for i in range(20)]))
    assert await p.read_frame() == (0, b"OK")
    c = await consumer(nsqd, "t", "c", rdy=5)
    msgs = await c.read_messages(5)
    await c.expect_silence(0.3)
    assert channel_of(nsqd, "t", "c").depth == 15
    c.send(commands.fin(msgs[0].id))
    (more,) = await c.read_messages(1)
    assert more.body == b"5"
    await c.expect_silence(0.2)


async def test_messages_spread_across_ready_clients(nsqd):
    a = await consumer(nsqd, "t", "c", rdy=100)
    b = await consumer(nsqd, "t", "c", rdy=100)
    p = await client(nsqd)
    for i in range(20):
        p.send(commands.pub("t", b"%d" % i))
    for _ in range(20):
        assert await p.read_frame() == (0, b"OK")
    ch = channel_of(nsqd, "t", "c")
    await wait_for(lambda: ch.depth == 0 and len(ch.in_flight) == 20)
    counts = [cl.in_flight_count for cl in ch.clients.values()]
    assert sum(counts) == 20 and min(counts) > 0
    await a.close()
    await b.close()


async def test_every_channel_gets_a_copy_and_topic_holds_without_channels(nsqd):
    p = await client(nsqd)
    p.send(commands.mpub("t", [b"1", b"2"]))
    assert await p.read_frame() == (0, b"OK")
    assert nsqd.topics["t"].depth == 2
    c1 = await consumer(nsqd, "t", "c1", rdy=10)
    assert sorted(m.body for m in await c1.read_messages(2)) == [b"1", b"2"]
    c2 = await consumer(nsqd, "t", "c2", rdy=10)
    assert await p.pub("t", b"3") == (0, b"OK")
    assert (await c1.read_message()).body == b"3"
    assert (await c2.read_message()).body == b"3"
    await c2.expect_silence(0.2)


async def test_attempts_are_per_channel(nsqd):
    """A message published to a topic with several channels is delivered, requeued and
    finished by each channel on its own: a REQ on one leaves the others' attempts alone."""
    c1 = await consumer(nsqd, "t", "c1", rdy=10)
    c2 = await consumer(nsqd, "t", "c2", rdy=10)
    c3 = await consumer(nsqd, "t", "c3", rdy=10)
    p = await client(nsqd)
    p.send(commands.mpub("t", [b"a", b"b"]))
    assert await p.read_frame() == (0, b"OK")
    first = await c1.read_messages(2)
    assert [(m.body, m.attempts) for m in first] == [(b"a", 1), (b"b", 1)]
    c1.send(commands.req(first[0].id, 0))
    again = await c1.read_message()
    assert (again.id, again.attempts) == (first[0].id, 2)
    got2 = await c2.read_messages(2)
    assert [(m.id, m.attempts) for m in got2] == [(m.id, 1) for m in first]
    for m in got2:
        c2.send(commands.fin(m.id))
    got3 = await c3.read_messages(2)
    assert [(m.body, m.attempts) for m in got3] == [(b"a", 1), (b"b", 1)]
    c3.send(commands.req(got3[1].id, 0))
    m = await c3.read_message()
    assert (m.body, m.attempts) == (b"b", 2)
    c1.send(commands.fin(again.id) + commands.fin(first[1].id))
    ch1, ch2, ch3 = (channel_of(nsqd, "t", c) for c in ("c1", "c2", "c3"))
    await wait_for(lambda: not ch1.in_flight and not ch2.in_flight)
    assert len(ch3.in_flight) == 2
    await c2.expect_silence(0.1)


# --- FIN / REQ / TOUCH / timeouts ------------------------------------------------------------


async def test_fin_unknown_is_non_fatal(nsqd):
    c = await consumer(nsqd, "t", "c", rdy=1)
    c.send(commands.fin(b"0123456789abcdef"))
    assert await c.read_error() == "E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight"
    p = await client(nsqd)
    await p.pub("t", b"still works")
    assert (await c.read_message()).body == b"still works"


async def test_fin_invalid_id_is_fatal(nsqd):
    c = await consumer(nsqd, "t", "c", rdy=1)
    c.send(b"FIN short\n")
    assert await c.read_error() == "E_INVALID Invalid Message ID"
    await c.expect_closed()


async def test_fin_by_other_client_fails(nsqd):
    a = await consumer(nsqd, "t", "c", rdy=1)
    b = await consumer(nsqd, "t", "c", rdy=1)
    p = await client(nsqd)
    await p.pub("t", b"x")
    msg = await a.read_message(timeout=2) if channel_of(nsqd, "t", "c").clients else None
    b.send(commands.fin(msg.id))
    assert await b.read_error() == f"E_FIN_FAILED FIN {msg.id.decode()} failed client does not own message"


async def test_req_redelivers_with_attempts(nsqd):
    c = await consumer(nsqd, "t", "c", rdy=1)
    p = await client(nsqd)
    await p.pub("t", b"x")
    m1 = await c.read_message()
    c.send(commands.req(m1.id, 0))
    m2 = await c.read_message()
    assert m2.id == m1.id and m2.attempts == 2
    ch = channel_of(nsqd, "t", "c")
    assert ch.requeue_count == 1


async def test_req_with_delay_defers_and_is_clamped(tmp_path):
    async with NSQD(make_options(tmp_path, max_req_timeout=1.0)) as d:
        c = await consumer(d, "t", "c", rdy=1)
        p = await client(d)
        await p.pub("t", b"x")
        m1 = await c.read_message()
        start = time.monotonic()
        c.send(commands.req(m1.id, 60_000))  # clamped to 1s
        await wait_for(lambda: channel_of(d, "t", "c").deferred_count == 1)
        m2 = await c.read_message(timeout=5)
        assert 0.9 <= time.monotonic() - start < 3
        assert m2.attempts == 2


async def test_msg_timeout_requeues_and_touch_resets(nsqd):
    c = await consumer(nsqd, "t", "c", rdy=2, msg_timeout=1000)
    p = await client(nsqd)
    await p.pub("t", b"x")
    m1 = await c.read_message()
    t0 = time.monotonic()
    # touch twice, every 0.6s: the message must not time out for ~1.2s + 1s
    for _ in range(2):
        await asyncio.sleep(0.6)
        c.send(commands.touch(m1.id))
    m2 = await c.read_message(timeout=5)
    elapsed = time.monotonic() - t0
    assert m2.id == m1.id and m2.attempts == 2
    assert elapsed >= 2.1
    assert channel_of(nsqd, "t", "c").timeout_count == 1


async def test_touch_unknown_is_non_fatal(nsqd):
    c = await consumer(nsqd, "t", "c", rdy=1)
    c.send(commands.touch(b"0123456789abcdef"))
    assert await c.read_error() == "E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight"
    c.send(commands.req(b"0123456789abcdef", 0))
    assert await c.read_error() == "E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight"


async def test_cls_gives_close_wait_and_stops_delivery(nsqd):
    c = await consumer(nsqd, "t", "c", rdy=10)
    c.send(commands.CLS)
    assert await c.read_frame() == (0, b"CLOSE_WAIT")
    p = await client(nsqd)
    await p.pub("t", b"x")
    await c.expect_silence(0.3)
    c.send(commands.rdy(5))  # ignored while closing
    await c.expect_silence(0.2)


async def test_heartbeats_and_missed_heartbeats_disconnect(nsqd):
    c = await client(nsqd, heartbeat_interval=1000)
    await c.sub("t", "c", rdy=1)
    p = await client(nsqd)
    await p.pub("t", b"x")
    m = await c.read_message()
    # a heartbeat arrives within the interval
    assert await c.read_frame(timeout=2, skip_heartbeats=False) == (0, b"_heartbeat_")
    # stop answering: within 2 intervals (+ tick slack) the server drops us
    start = time.monotonic()
    while True:
        try:
            await asyncio.wait_for(c.reader.read(65536), 5)
        except (TimeoutError, ConnectionError):
            break
        if c.reader.at_eof():
            break
    assert time.monotonic() - start < 4
    # the in-flight message went back to the channel and reaches another consumer
    c2 = await consumer(nsqd, "t", "c", rdy=1)
    m2 = await c2.read_message()
    assert m2.id == m.id and m2.attempts == 2


async def test_disconnect_requeues_in_flight_immediately(nsqd):
    c = await consumer(nsqd, "t", "c", rdy=5)
    p = await client(nsqd)
    p.send(commands.mpub("t", [b"a", b"b", b"c"]))
    await p.read_frame()
    await c.read_messages(3)
    await c.close()
    c2 = await consumer(nsqd, "t", "c", rdy=5)
    got = await c2.read_messages(3, timeout=3)
    assert sorted(m.body for m in got) == [b"a", b"b", b"c"]
    assert all(m.attempts == 2 for m in got)


# --- pause, ephemeral, limits ------------------------------------------------------------------


async def test_channel_pause_holds_clients(nsqd):
    c = await consumer(nsqd, "t", "c", rdy=10)
    ch = channel_of(nsqd, "t", "c")
    ch.pause()
    p = await client(nsqd)
    await p.pub("t", b"x")
    await c.expect_silence(0.3)
    ch.unpause()
    assert (await c.read_message()).body == b"x"


async def test_topic_pause_holds_messages_at_topic(nsqd):
    c = await consumer(nsqd, "t", "c", rdy=10)
    topic = nsqd.topics["t"]
    topic.pause()
    p = await client(nsqd)
    await p.pub("t", b"x")
    await c.expect_silence(0.3)
    assert topic.depth == 1
    topic.unpause()
    assert (await c.read_message()).body == b"x"


async def test_ephemeral_channel_vanishes_with_last_client(nsqd):
    c = await consumer(nsqd, "t", "e#ephemeral", rdy=1)
    assert "e#ephemeral" in nsqd.topics["t"].channels
    await c.close()
    await wait_for(lambda: "e#ephemeral" not in nsqd.topics["t"].channels)


async def test_ephemeral_topic_vanishes_with_last_channel(nsqd):
    c = await consumer(nsqd, "t#ephemeral", "e#ephemeral", rdy=1)
    await c.close()
    await wait_for(lambda: "t#ephemeral" not in nsqd.topics)


async def test_mem_queue_overflow_goes_to_disk_and_is_delivered(tmp_path):
    async with NSQD(make_options(tmp_path, mem_queue_size=3)) as d:
        p = await client(d)
        bodies = [b"%d" % i for i in range(10)]
        p.send(commands.mpub("t", bodies[:5]))
        assert await p.read_frame() == (0, b"OK")
        assert (d.topics["t"].depth, d.topics["t"].backend_depth) == (5, 2)
        c = await consumer(d, "t", "c", rdy=100)
        p.send(commands.mpub("t", bodies[5:]))
        assert await p.read_frame() == (0, b"OK")
        got = await c.read_messages(10)
        assert sorted(m.body for m in got) == sorted(bodies)
        assert d.topics["t"].depth == 0 and d.topics["t"].channels["c"].depth == 0


async def test_max_channel_consumers(tmp_path):
    async with NSQD(make_options(tmp_path, max_channel_consumers=1)) as d:
        first = await consumer(d, "t", "c")
        c = await client(d)
        c.send(commands.sub("t", "c"))
        err = await c.read_error()
        assert err == "E_TOO_MANY_CHANNEL_CONSUMERS channel consumers for t:c exceeds limit of 1"
        await first.close()


# --- robustness ------------------------------------------------------------------------------


async def test_garbage_and_huge_sizes_cost_only_that_connection(nsqd):
    good = await consumer(nsqd, "t", "c", rdy=10)
    bad1 = await client(nsqd)
    bad1.send(b"\x00\xff" * 20000)  # no newline: line too long
    await bad1.expect_closed()
    bad2 = await client(nsqd)
    bad2.send(b"PUB t\n" + struct.pack(">i", 2**31 - 1))
    assert (await bad2.read_error()).startswith("E_BAD_MESSAGE PUB message too big")
    await bad2.expect_closed()
    bad3 = await client(nsqd)
    bad3.send(b"PUB t\n\x00\x00")  # truncated, then hang up
    await bad3.close()
    p = await client(nsqd)
    await p.pub("t", b"ok")
    assert (await good.read_message()).body == b"ok"


async def test_client_that_stops_reading_does_not_block_others(nsqd):
    # a producer that never reads its OKs
    _lazy_r, lazy_w = await asyncio.open_connection("127.0.0.1", nsqd.tcp_port)
    lazy_w.write(b"  V2")
    frame = commands.pub("flood", b"x" * 1000)
    lazy_w.transport.pause_reading()
    for _ in range(3000):
        lazy_w.write(frame)
    c = await consumer(nsqd, "t", "c", rdy=1)
    p = await client(nsqd)
    await p.pub("t", b"y")
    assert (await c.read_message()).body == b"y"
    lazy_w.close()


async def test_many_messages_round_trip(nsqd):
    n = 5000
    c = await consumer(nsqd, "t", "c", rdy=500)
    p = await client(nsqd)
    bodies = [b"m%05d" % i for i in range(n)]
    for i in range(0, n, 100):
        p.send(commands.mpub("t", bodies[i : i + 100]))
    got = []
    while len(got) < n:
        m = await c.read_message()
        got.append(m.body)
        c.send(commands.fin(m.id))
    assert sorted(got) == bodies
    await wait_for(lambda: len(channel_of(nsqd, "t", "c").in_flight) == 0)
    for _ in range(n // 100):
        assert await p.read_frame() == (0, b"OK")


@pytest_asyncio.fixture
async def small_nsqd(tmp_path):
    async with NSQD(make_options(tmp_path, max_rdy_count=10)) as d:
        yield d


async def test_identify_reports_configured_max_rdy(small_nsqd):
    c = await client(small_nsqd)
    resp = await c.identify(feature_negotiation=True)
    assert resp["max_rdy_count"] == 10
    assert json.dumps(resp)
