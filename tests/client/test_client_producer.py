"""Producer and Connection against the in-process nsqd."""

from __future__ import annotations

import asyncio
import json

import pytest
from client_helpers import opts, topic_depth
from support import RawClient, free_port, wait_for

from nsqpy.client import (
    BadMessageError,
    BadTopicError,
    ConnectionConfig,
    NoConnectionsError,
    Producer,
    UnsupportedFeatureError,
)
from nsqpy.client.conn import Connection
from nsqpy.client.errors import (
    ErrorFrame,
    FinFailedError,
    PubFailedError,
    PublishError,
    error_from_frame,
    make_error,
)
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(30)


def test_error_classes() -> None:
    e = make_error("E_PUB_FAILED", "exiting")
    assert isinstance(e, PubFailedError) and isinstance(e, PublishError) and e.fatal
    assert str(e) == "E_PUB_FAILED exiting"
    f = error_from_frame(b"E_FIN_FAILED FIN abc failed")
    assert isinstance(f, FinFailedError) and not f.fatal and f.description == "FIN abc failed"
    u = make_error("E_SOMETHING_NEW", "x")
    assert type(u) is ErrorFrame and u.fatal
    assert isinstance(make_error("E_BAD_MESSAGE"), PublishError)


def test_config_from_go_options() -> None:
    c = ConnectionConfig.from_go_options(
        {
            "max_in_flight": "200",
            "read-timeout": "45s",
            "backoff_strategy": "full_jitter",
            "lookupd_poll_jitter": "0.5",
            "snappy": "false",
            "msg_timeout": "1m30s",
        }
    )
    assert c.max_in_flight == 200 and c.read_timeout == 45.0 and c.backoff_strategy == "full_jitter"
    assert c.lookupd_poll_jitter == 0.5 and c.msg_timeout == 90.0 and c.snappy is False
    c2 = ConnectionConfig.from_go_options(["heartbeat_interval,5s", "max_attempts,0"], base=c)
    assert c2.heartbeat_interval == 5.0 and c2.max_attempts == 0 and c2.max_in_flight == 200
    with pytest.raises(ValueError, match="invalid option"):
        ConnectionConfig.from_go_options({"nope": "1"})
    with pytest.raises(ValueError):
        ConnectionConfig.from_go_options({"sample_rate": "100"})
    with pytest.raises(ValueError):
        ConnectionConfig.from_go_options({"read_timeout": "5"})  # missing unit
    with pytest.raises(ValueError):
        ConnectionConfig(heartbeat_interval=60, read_timeout=60)
    assert c.identify()["output_buffer_timeout"] == 250


def test_tls_files_that_cannot_be_loaded_are_refused_at_once(tmp_path) -> None:
    missing = str(tmp_path / "missing-ca.pem")
    cfg = ConnectionConfig(tls_v1=True, tls_root_ca_file=missing)
    with pytest.raises(UnsupportedFeatureError, match="tls_root_ca_file="):
        Producer("127.0.0.1:1", config=cfg)
    with pytest.raises(UnsupportedFeatureError, match=r"missing-ca\.pem"):
        Connection("127.0.0.1:1", cfg)
    # TLS and compression themselves are supported now
    Connection("127.0.0.1:1", ConnectionConfig(tls_v1=True, tls_insecure_skip_verify=True, snappy=True))


async def test_connection_identify_and_heartbeat(nsqd: NSQD) -> None:
    conn = Connection(
        f"127.0.0.1:{nsqd.tcp_port}", ConnectionConfig(heartbeat_interval=1.0, read_timeout=1.5)
    )
    await conn.connect()
    assert conn.max_rdy_count == 2500
    assert conn.server_settings["max_msg_timeout"] == 900000
    # Heartbeats arrive every second and are answered; the connection survives several read
    # timeouts' worth of time only because heartbeats keep it alive.
    start = conn.last_recv
    await wait_for(lambda: conn.last_recv > start + 2.0, timeout=5)
    assert not conn.closed
    assert await conn.request(commands.pub("hb", b"x")) == b"OK"
    conn.close()
    await conn.wait_closed()


async def test_publish_results_in_order(nsqd: NSQD) -> None:
    async with Producer(f"127.0.0.1:{nsqd.tcp_port}") as p:
        await asyncio.gather(*(p.publish("t1", b"m%d" % i) for i in range(50)))
        await p.publish_many("t1", [b"a", b"b", b"c"])
        await p.publish("t1", b"later", defer=0.01)
        with pytest.raises(BadTopicError):
            await p.publish("bad topic", b"x")
        with pytest.raises(BadMessageError):
            await p.publish("t1", b"")
        # A server-side error (message too big) is a typed error for that call only.
        big = b"x" * (nsqd.options.max_msg_size + 1)
        results = await asyncio.gather(p.publish("t1", b"ok1"), p.publish("t1", big), return_exceptions=True)
        assert results[0] is None
        assert isinstance(results[1], BadMessageError), results
        await p.publish("t1", b"after")
    # 50 + 3 + 1 deferred + ok1 + after
    await wait_for(lambda: topic_depth(nsqd.http_port, "t1"), timeout=5)
    assert await topic_depth(nsqd.http_port, "t1") == 56


async def test_publish_waits_for_startup(tmp_path) -> None:
    # Reserve a port, start publishing before nsqd listens there, then start nsqd.
    port = free_port()
    async with Producer(f"127.0.0.1:{port}", reconnect_interval=0.05) as p:
        task = asyncio.create_task(p.publish("t", b"hello", timeout=10))
        await asyncio.sleep(0)
        assert not task.done()
        async with NSQD(opts(tmp_path, "b", tcp_address=f"127.0.0.1:{port}")) as d:
            await task
            assert await topic_depth(d.http_port, "t") == 1


async def test_publish_timeout_no_connection() -> None:
    async with Producer("127.0.0.1:1", reconnect_interval=0.01) as p:
        with pytest.raises(NoConnectionsError):
            await p.publish("t", b"x", timeout=0.2)


async def test_producer_failover(tmp_path) -> None:
    a = NSQD(opts(tmp_path, "a"))
    b = NSQD(opts(tmp_path, "b"))
    await a.start()
    await b.start()
    try:
        addrs = [f"127.0.0.1:{a.tcp_port}", f"127.0.0.1:{b.tcp_port}"]
        async with Producer(addrs, strategy="failover", reconnect_interval=0.05) as p:
            await p.wait_connected(5, all=True)
            for i in range(10):
                await p.publish("f", b"%d" % i)
            assert await topic_depth(a.http_port, "f") == 10
            await a.stop()
            for i in range(10):
                await p.publish("f", b"%d" % i)
            assert await topic_depth(b.http_port, "f") == 10
    finally:
        await a.stop()
        await b.stop()


async def test_round_robin_spreads(tmp_path) -> None:
    async with NSQD(opts(tmp_path, "a")) as a, NSQD(opts(tmp_path, "b")) as b:
        addrs = [f"127.0.0.1:{a.tcp_port}", f"127.0.0.1:{b.tcp_port}"]
        async with Producer(addrs) as p:
            await p.wait_connected(5, all=True)
            for _ in range(10):
                await p.publish("rr", b"x")
        assert await topic_depth(a.http_port, "rr") == 5
        assert await topic_depth(b.http_port, "rr") == 5


async def test_identify_json_negotiated(nsqd: NSQD) -> None:
    raw = await RawClient.connect(nsqd.tcp_port)
    info = await raw.identify(feature_negotiation=True)
    await raw.close()
    conn = await Connection(f"127.0.0.1:{nsqd.tcp_port}").connect()
    assert conn.server_settings["max_rdy_count"] == info["max_rdy_count"]
    assert json.dumps(conn.server_settings)
    conn.close()
