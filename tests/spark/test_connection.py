"""The source's and sink's connections without Spark: the connection options, the blocking
shell over the client protocol against a fake nsqd (a socket pair: the CLS answer, heartbeats
and errors among messages, a partial frame at the burst reader's takeover), and the source's
I/O threads and the sink's publisher against a real nsqd that requires TLS and AUTH."""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from nsqpy.protocol.errors import ProtocolError
from nsqpy.protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, MAGIC_V2
from nsqpy.spark.burst import Burst, BurstReader
from nsqpy.spark.connopts import ConnectionOptions, from_go_options
from nsqpy.spark.consumer import Consumer, Runtime
from nsqpy.spark.nsqconn import BlockingConnection
from nsqpy.spark.sink import SinkOptions, publish_batches
from nsqpy.spark.source import SourceOptions
from nsqpy.spark.spool import list_chunks, read_chunk

from .conftest import SECRET, secure_options, stats

pytestmark = pytest.mark.timeout(120)


def _frame(ftype: int, data: bytes) -> bytes:
    return struct.pack(">Ii", len(data) + 4, ftype) + data


def _message(i: int, body: bytes) -> bytes:
    payload = struct.pack(">qH", 1_700_000_000_000_000_000 + i, 1) + b"%016x" % i + body
    return _frame(FRAME_TYPE_MESSAGE, payload)


def _sent(peer: socket.socket) -> bytes:
    """Everything the client has written so far (a socket pair delivers at once)."""
    peer.setblocking(False)
    out = b""
    try:
        while True:
            data = peer.recv(65536)
            if not data:
                break
            out += data
    except BlockingIOError:
        pass
    return out


# --- options ----------------------------------------------------------------------------------


def test_connection_options_parse_and_hide_the_secret(pki: Any) -> None:
    o = ConnectionOptions.parse({}, "nsq source", consumer=True)
    assert (o.tls, o.snappy, o.deflate, o.auth_secret, o.sample_rate) == (False, False, False, "", 0)
    assert o.tls_context() is None
    ident = o.identify(heartbeat_interval=15000)
    assert ident["heartbeat_interval"] == 15000 and ident["user_agent"].startswith("nsqpy-spark/")
    assert not {"tls_v1", "snappy", "deflate", "sample_rate"} & set(ident)

    opts = {
        k.lower(): v
        for k, v in {
            **secure_options(pki),
            "deflate": "true",
            "deflateLevel": "3",
            "sampleRate": "50",
            "heartbeatIntervalMs": "1000",
            "outputBufferSize": "-1",
            "outputBufferTimeoutMs": "10",
            "userAgent": "me/1",
            "tlsMinVersion": "TLS1.2",
        }.items()
    }
    o = ConnectionOptions.parse(opts, "nsq source", consumer=True)
    assert o.tls_context() is not None and o.tls_min_version == "tls1.2"
    assert o.identify(heartbeat_interval=15000, msg_timeout=60000) | {"client_id": "", "hostname": ""} == {
        "client_id": "",
        "hostname": "",
        "user_agent": "me/1",
        "tls_v1": True,
        "deflate": True,
        "deflate_level": 3,
        "heartbeat_interval": 1000,
        "output_buffer_size": -1,
        "output_buffer_timeout": 10,
        "sample_rate": 50,
        "msg_timeout": 60000,
    }
    assert SECRET not in repr(o) and o.auth_secret == SECRET
    src = SourceOptions.parse(
        {"topic": "t", "nsqdTcpAddresses": "127.0.0.1:4150", "spoolPath": "/tmp/x", **opts}
    )
    assert SECRET not in repr(src) and SECRET not in str(src)

    bad = [
        ({"snappy": "true", "deflate": "true"}, "'snappy' and 'deflate' cannot both"),
        ({"tlsRootCaFile": pki.ca_cert}, "'tlsRootCaFile' needs option 'tls'"),
        ({"tls": "true", "tlsRootCaFile": "/no/such/ca.pem"}, "no such file"),
        ({"tls": "true", "tlsMinVersion": "ssl2"}, "'tlsMinVersion' must be one of"),
        ({"tls": "maybe"}, "'tls' must be true or false"),
        ({"deflate": "true", "deflateLevel": "10"}, "'deflateLevel' must be between 1 and 9"),
        ({"sampleRate": "100"}, "'sampleRate' must be between 0 and 99"),
        ({"heartbeatIntervalMs": "x"}, "'heartbeatIntervalMs' must be an integer"),
        ({"tls": "true", "tlsRootCaFile": pki.server_key}, "the TLS options do not load"),
    ]
    for given, needle in bad:
        with pytest.raises(ValueError, match=needle):
            ConnectionOptions.parse({k.lower(): v for k, v in given.items()}, "nsq source", consumer=True)
    with pytest.raises(ValueError, match="nsq sink: option 'sampleRate' applies to reading only"):
        SinkOptions.parse({"topic": "t", "nsqdTcpAddresses": "127.0.0.1:4150", "sampleRate": "5"})


def test_go_option_names_map_onto_the_data_source_options(pki: Any) -> None:
    got = from_go_options(
        [
            "tls_v1,true",
            f"tls_root_ca_file,{pki.ca_cert}",
            "snappy",
            "auth_secret,a,b=c",
            "heartbeat_interval,2s",
            "output_buffer_timeout,250ms",
            "max_in_flight,100",
            "msg_timeout,1m30s",
            "sample_rate,10",
            "tls_min_version,tls1.2",
        ],
        consumer=True,
    )
    assert got == {
        "tls": "true",
        "tlsRootCaFile": pki.ca_cert,
        "snappy": "true",
        "authSecret": "a,b=c",
        "heartbeatIntervalMs": "2000",
        "outputBufferTimeoutMs": "250",
        "maxInFlight": "100",
        "msgTimeoutMs": "90000",
        "sampleRate": "10",
        "tlsMinVersion": "tls1.2",
    }
    assert from_go_options(["deflate,1", "deflate_level,9", "user_agent,x/1"], consumer=False) == {
        "deflate": "true",
        "deflateLevel": "9",
        "userAgent": "x/1",
    }
    for items, consumer, needle in [
        (["max_attempts,5"], True, "--consumer-opt 'max_attempts': not an option nsq_spark supports"),
        (["sample_rate,5"], False, "--producer-opt 'sample_rate': applies to consumers only"),
        (["snappy,perhaps"], True, "--consumer-opt snappy: invalid value 'perhaps'"),
        (["heartbeat_interval,5"], True, "missing unit"),
        (["deflate_level,12"], False, "deflate_level must be between 1 and 9"),
        (["tls_root_ca_file,/x"], True, "tls_root_ca_file needs tls_v1"),
    ]:
        with pytest.raises(ValueError, match=needle):
            from_go_options(items, consumer)


# --- the blocking shell against a fake nsqd ---------------------------------------------------


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[tuple[Consumer, socket.socket]]:
    """A source connection thread's state, connected (IDENTIFY answered, subscribed) to a
    fake nsqd: the other end of a socket pair, which the test writes nsqd's bytes to."""
    opts = SourceOptions.parse(
        {"topic": "t", "nsqdTcpAddresses": "127.0.0.1:4150", "spoolPath": str(tmp_path)}
    )
    rt = Runtime(opts, 0, False)
    c = Consumer(rt, "127.0.0.1:4150", None)
    mine, peer = socket.socketpair()
    c.conn = BlockingConnection("127.0.0.1:4150", opts.conn.identify(), sock=mine)
    peer.sendall(_frame(FRAME_TYPE_RESPONSE, json.dumps({"max_rdy_count": 2500}).encode()))
    c.conn.handshake(5)
    sent = _sent(peer)
    assert sent.startswith(MAGIC_V2 + b"IDENTIFY\n")
    c.conn.request(b"SUB t nsq_spark\n", "SUB")
    peer.sendall(_frame(FRAME_TYPE_RESPONSE, b"OK"))
    assert c.conn.answer(5).data == b"OK"
    c._frames = BurstReader(c.conn.frame_reader())
    assert _sent(peer) == b"SUB t nsq_spark\n"
    try:
        yield c, peer
    finally:
        c.conn.close()
        peer.close()


def test_a_body_saying_close_wait_does_not_end_the_close_wait(fake: tuple[Consumer, socket.socket]) -> None:
    c, nsqd = fake
    nsqd.sendall(_message(1, b"status: CLOSE_WAIT") + _message(2, b"CLOSE_WAIT"))
    t0 = time.monotonic()
    assert c._close_cleanly(timeout=0.5) is False  # waited for the real answer, in vain
    assert time.monotonic() - t0 >= 0.5
    assert _sent(nsqd) == b"CLS\n"
    assert len(c._burst) == 2  # the messages were read as messages (and are not FIN'd)


def test_the_answer_to_cls_ends_the_close_wait(fake: tuple[Consumer, socket.socket]) -> None:
    c, nsqd = fake
    nsqd.sendall(
        _message(1, b"CLOSE_WAIT")
        + _frame(FRAME_TYPE_RESPONSE, b"_heartbeat_")
        + _frame(FRAME_TYPE_RESPONSE, b"CLOSE_WAIT")
        + _message(2, b"late")
    )
    t0 = time.monotonic()
    assert c._close_cleanly(timeout=30) is True
    assert time.monotonic() - t0 < 10
    assert c._cls_answer is not None and c._cls_answer.data == b"CLOSE_WAIT"
    assert _sent(nsqd) == b"CLS\nNOP\n"


def test_heartbeats_and_errors_among_messages_go_through_the_protocol(
    fake: tuple[Consumer, socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    c, nsqd = fake
    assert c.conn is not None
    nsqd.sendall(
        _message(1, b"one")
        + _frame(FRAME_TYPE_RESPONSE, b"_heartbeat_")
        + _message(2, b"two")
        + _frame(FRAME_TYPE_ERROR, b"E_FIN_FAILED FIN 0000000000000001 failed")
        + _message(3, b"three")
    )
    while len(c._burst) < 3:
        data = c.conn.recv(5)
        assert data is not None
        c._parse(data)
    assert c.conn.proto.heartbeats == 1
    assert _sent(nsqd) == b"NOP\n"
    assert "E_FIN_FAILED" in caplog.text  # non-fatal: logged, the connection goes on
    _ids, _, _, bodies = c._burst.columns()
    assert bodies.to_pylist() == [b"one", b"two", b"three"]
    # a fatal error with no request waiting ends the session with that error
    nsqd.sendall(_frame(FRAME_TYPE_ERROR, b"E_INVALID cannot FIN in current state"))
    with pytest.raises(ProtocolError, match="E_INVALID"):
        data = c.conn.recv(5)
        assert data is not None
        c._parse(data)


def test_the_burst_reader_takes_over_a_partial_frame_after_the_sub_answer(tmp_path: Path) -> None:
    mine, nsqd = socket.socketpair()
    with mine, nsqd:
        conn = BlockingConnection("127.0.0.1:4150", {"client_id": "t"}, sock=mine)
        nsqd.sendall(_frame(FRAME_TYPE_RESPONSE, b"OK"))  # IDENTIFY answered without negotiation
        assert conn.handshake(5).settings == {}
        conn.request(b"SUB t c\n", "SUB")
        msg = _message(7, b"split body")
        nsqd.sendall(_frame(FRAME_TYPE_RESPONSE, b"OK") + msg[:13])  # inside the message header
        assert conn.answer(5).data == b"OK"
        reader, burst = BurstReader(conn.frame_reader()), Burst()
        nsqd.sendall(msg[13:])
        while not len(burst):
            data = conn.recv(5)
            assert data is not None
            reader.feed(data, burst)
        ids, _, _, bodies = burst.columns()
        assert (ids.to_pylist(), bodies.to_pylist()) == (["%016x" % 7], [b"split body"])


# --- lookupd discovery ------------------------------------------------------------------------


def test_lookup_sends_the_bearer_token_and_reads_broadcast_addresses(tmp_path: Path) -> None:
    seen: list[dict[str, str]] = []

    class Lookupd(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({"path": self.path, "auth": self.headers.get("Authorization", "")})
            body = json.dumps(
                {
                    "channels": [],
                    "producers": [
                        {
                            "broadcast_address": "10.0.0.1",
                            "hostname": "h1",
                            "tcp_port": 4150,
                            "http_port": 4151,
                        },
                        {"hostname": "h2", "tcp_port": 4150, "http_port": 4151},  # no broadcast_address
                    ],
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Lookupd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        addr = f"127.0.0.1:{server.server_address[1]}"
        opts = SourceOptions.parse(
            {
                "topic": "t#ephemeral",
                "nsqlookupdHttpAddresses": addr,
                "spoolPath": str(tmp_path),
                "authSecret": SECRET,
            }
        )
        assert Runtime(opts, 0, False).lookup() == {"10.0.0.1:4150": "10.0.0.1:4151"}
        assert seen == [{"path": "/lookup?topic=t%23ephemeral", "auth": f"Bearer {SECRET}"}]
    finally:
        server.shutdown()
        server.server_close()


# --- against nsqd with TLS and AUTH (no Spark) ------------------------------------------------


def _bodies(prefix: bytes, n: int) -> list[bytes]:
    return [prefix + b"-%05d-" % i + bytes([i % 256]) for i in range(n)]


def _publish(nsqd: Any, topic: str, bodies: list[bytes], **conn: str) -> None:
    opts = SinkOptions.parse({"topic": topic, "nsqdTcpAddresses": nsqd.tcp_address, **conn})
    publish_batches(opts, iter([pa.record_batch([pa.array(bodies, pa.binary())], names=["body"])]), 0)


def _drain(opts: SourceOptions) -> list[bytes]:
    """Run the source's threads (availableNow) until drained; the spooled bodies."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    rt = Runtime(opts, 0, True)
    try:
        rt.start()
        end = 0
        while rt.target is None or end < rt.target:
            end = rt.latest(end, ReadAllAvailable())
    finally:
        rt.stop()
    return [
        b
        for c in list_chunks(opts.spool_path)
        for batch in read_chunk(c.path)
        for b in batch.column("body").to_pylist()
    ]


@pytest.mark.parametrize(
    "extra",
    [{}, {"snappy": "true"}, {"deflate": "true", "deflateLevel": "1"}],
    ids=["tls", "tls+snappy", "tls+deflate"],
)
def test_sink_and_source_threads_through_tls_and_auth(
    secure_nsqd: Any, pki: Any, unique_topic: str, tmp_path: Path, extra: dict[str, str]
) -> None:
    conn = secure_options(pki, **extra)
    bodies = _bodies(b"x", 3000)
    _publish(secure_nsqd, unique_topic, bodies, **conn)
    opts = SourceOptions.parse(
        {
            "topic": unique_topic,
            "nsqdTcpAddresses": secure_nsqd.tcp_address,
            "nsqdHttpAddresses": secure_nsqd.http_address,
            "spoolPath": str(tmp_path / "spool"),
            **conn,
        }
    )
    assert sorted(_drain(opts)) == sorted(bodies)
    ch = stats(secure_nsqd, unique_topic, "nsq_spark")
    assert ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0 and ch["client_count"] == 0


def test_refusals_fail_the_source_and_the_sink_and_the_secret_stays_out_of_logs(
    secure_nsqd: Any, pki: Any, unique_topic: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    caplog.set_level(logging.DEBUG)
    wrong = "wrong-secret-9c1e7d"
    addr = secure_nsqd.tcp_address
    base = {"topic": unique_topic, "nsqdTcpAddresses": addr, "spoolPath": str(tmp_path / "spool")}
    cases = [
        (
            secure_options(pki, wrong),
            f"nsq source: nsqd {addr} refused the subscription: E_AUTH_FAILED AUTH failed",
        ),
        (
            {"tls": "true", "tlsRootCaFile": pki.ca_cert},
            f"nsq source: nsqd {addr}: the server requires AUTH but no auth_secret is configured",
        ),
        (
            {"tls": "true", "authSecret": SECRET},
            f"nsq source: nsqd {addr}: TLS handshake failed - certificate verify failed",
        ),
    ]
    for conn, message in cases:
        rt = Runtime(SourceOptions.parse({**base, **conn}), 0, True)
        try:
            rt.start()
            with pytest.raises(RuntimeError) as info:
                while True:
                    rt.latest(0, ReadAllAvailable())
            assert str(info.value).startswith(message)
            assert "\n" not in str(info.value)
        finally:
            rt.stop()
    with pytest.raises(RuntimeError, match=f"nsq sink: nsqd {addr} refused the connection: E_AUTH_FAILED"):
        _publish(secure_nsqd, unique_topic, [b"x"], **secure_options(pki, wrong))
    assert wrong not in caplog.text and SECRET not in caplog.text
