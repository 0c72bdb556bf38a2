"""Stack: a client and a server wired back to back in memory, through every combination NSQ
negotiates (snappy, deflate, TLS, TLS+snappy, TLS+deflate), with the byte stream cut anywhere."""

from __future__ import annotations

import importlib.util
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.protocol.frames import encode_response
from nsqpy.transport import DeflateLayer, Layer, SnappyLayer, Stack, TLSLayer, TransportError
from transport.pairs import random_pieces, receive_all, split, tls_pair

HAVE_CRAMJAM = importlib.util.find_spec("cramjam") is not None
needs_cramjam = pytest.mark.skipif(not HAVE_CRAMJAM, reason="cramjam is not installed")

COMPRESSIONS = [
    pytest.param("snappy", marks=needs_cramjam),
    "deflate-1",
    "deflate-6",
    "deflate-9",
]

payload_lists = st.lists(
    st.binary(max_size=2000) | st.sampled_from([b"\x00" * 70_000, b"frame " * 12_000]), max_size=6
)


def compression_layer(name: str) -> Layer:
    if name == "snappy":
        return SnappyLayer()
    return DeflateLayer(int(name.split("-")[1]))


def upgrade(client: Stack, server: Stack, compression: str | None) -> None:
    if compression is not None:
        client.push(compression_layer(compression))
        server.push(compression_layer(compression))


def check_both_ways(
    client: Stack, server: Stack, up: list[bytes], down: list[bytes], data: st.DataObject
) -> None:
    """Everything sent one way arrives, whatever the cuts in the byte stream."""
    for sender, receiver, payloads in ((client, server, up), (server, client, down)):
        wire = b"".join(sender.send(p) for p in payloads)
        cuts = data.draw(st.lists(st.integers(0, max(len(wire), 1)), max_size=30))
        assert receive_all(receiver, split(wire, cuts), peer=sender) == b"".join(payloads)
        assert sender.output() == b"" and receiver.output() == b""


@pytest.mark.parametrize("compression", COMPRESSIONS)
@settings(max_examples=50, deadline=None)
@given(up=payload_lists, down=payload_lists, data=st.data())
def test_compression_round_trip(compression, up, down, data):
    client, server = Stack(), Stack()
    upgrade(client, server, compression)
    assert client.compression == server.compression == compression.split("-")[0]
    assert client.tls is None
    check_both_ways(client, server, up, down, data)


@pytest.mark.parametrize("compression", [None, *COMPRESSIONS])
@settings(max_examples=30, deadline=None)
@given(up=payload_lists, down=payload_lists, data=st.data())
def test_tls_round_trip(server_ctx, client_ctx, compression, up, down, data):
    client, server = tls_pair(server_ctx, client_ctx)
    upgrade(client, server, compression)
    assert isinstance(server.tls, TLSLayer)
    assert server.compression == (None if compression is None else compression.split("-")[0])
    check_both_ways(client, server, up, down, data)


@pytest.mark.parametrize("compression", [None, *COMPRESSIONS])
def test_large_payloads_and_many_small_writes(server_ctx, client_ctx, compression):
    rng = random.Random(42)
    client, server = tls_pair(server_ctx, client_ctx)
    upgrade(client, server, compression)
    big = rng.randbytes(300_000) + b"message body " * 80_000
    small = [encode_response(rng.randbytes(rng.randint(0, 60))) for _ in range(2000)]
    for sender, receiver in ((client, server), (server, client)):
        wire = sender.send(big) + b"".join(sender.send(s) for s in small)
        assert receive_all(receiver, random_pieces(wire, rng, 3000), peer=sender) == big + b"".join(small)


@pytest.mark.parametrize("compression", [None, *COMPRESSIONS])
def test_pyopenssl_backend_round_trip(pki, compression):
    """The ``require`` policy's backend carries the same traffic."""
    pytest.importorskip("OpenSSL")
    from nsqpy.transport import client_tls_context, server_tls_context

    server_ctx = server_tls_context(pki.server_cert, pki.server_key, "require")
    client_ctx = client_tls_context(
        root_ca_file=pki.ca_cert, cert_file=pki.self_signed_cert, key_file=pki.self_signed_key
    )
    rng = random.Random(9)
    client, server = tls_pair(server_ctx, client_ctx)
    upgrade(client, server, compression)
    payloads = [rng.randbytes(100_000), b"frame" * 30_000] + [rng.randbytes(50) for _ in range(500)]
    for sender, receiver in ((client, server), (server, client)):
        wire = b"".join(sender.send(p) for p in payloads)
        assert receive_all(receiver, random_pieces(wire, rng, 2500), peer=sender) == b"".join(payloads)


def test_plain_stack_is_a_pass_through():
    stack = Stack()
    data = b"PUB topic\n\x00\x00\x00\x02hi"
    assert stack.receive(data) is data
    assert stack.send(data) is data
    assert stack.output() == b""
    assert stack.tls is None and stack.compression is None and not stack.closed


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_leftover_bytes_handed_to_the_new_layer(compression):
    """The server sends OK through the old stack, upgrades, sends OK compressed; the client
    reads both in one segment and hands the bytes after the first frame to push()."""
    client, server = Stack(), Stack()
    ok = encode_response(b"OK")
    wire = server.send(ok)
    server.push(compression_layer(compression))
    wire += server.send(ok)

    received = client.receive(wire)
    assert received.startswith(ok)
    leftover = received[len(ok) :]
    assert client.push(compression_layer(compression), pending=leftover) == ok
    # and the client's first compressed command reaches the server, also with leftovers
    command = b"SUB topic channel\n"
    assert server.receive(client.send(command)) == command


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_server_side_leftover_after_identify(compression):
    """A client that pipelines its first compressed command right after IDENTIFY."""
    client, server = Stack(), Stack()
    identify = b"IDENTIFY\n\x00\x00\x00\x02{}"
    wire = client.send(identify)
    client.push(compression_layer(compression))
    wire += client.send(b"NOP\n")
    got = server.receive(wire)
    assert got.startswith(identify)
    assert server.push(compression_layer(compression), pending=got[len(identify) :]) == b"NOP\n"


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_nsq_upgrade_sequence_tls_then_compression(server_ctx, client_ctx, compression):
    """IDENTIFY response in clear, TLS handshake, OK over TLS, compression, OK compressed."""
    client, server = Stack(), Stack()
    ok = encode_response(b"OK")
    identify_response = encode_response(b'{"tls_v1":true}')
    assert client.receive(server.send(identify_response)) == identify_response
    server.push(TLSLayer(server_ctx, server_side=True))
    assert client.push(TLSLayer(client_ctx, server_hostname="localhost")) == b""

    wire_to_client = b""
    for _ in range(10):  # the handshake; the server answers OK as soon as it is done
        to_server = client.output()
        if to_server:
            assert server.receive(to_server) == b""
        assert server.tls is not None
        if server.tls.handshake_done and not wire_to_client:
            wire_to_client = server.send(ok)  # + its session tickets, in order
            server.push(compression_layer(compression))
            wire_to_client += server.send(ok)
            break
        to_client = server.output()
        if to_client:
            client.receive(to_client)
    assert wire_to_client

    received = client.receive(wire_to_client)
    assert client.tls is not None and client.tls.handshake_done
    assert received.startswith(ok)
    assert client.push(compression_layer(compression), pending=received[len(ok) :]) == ok
    assert client.output() == b""

    assert server.receive(client.send(b"RDY 1\n")) == b"RDY 1\n"
    assert client.receive(server.send(b"message")) == b"message"


def test_push_enforces_nsq_order(server_ctx):
    stack = Stack()
    stack.push(DeflateLayer(6))
    with pytest.raises(ValueError):
        stack.push(TLSLayer(server_ctx, server_side=True))
    with pytest.raises(ValueError):
        stack.push(DeflateLayer(1))
    if HAVE_CRAMJAM:
        with pytest.raises(ValueError):
            stack.push(SnappyLayer())


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_garbage_after_a_compression_upgrade(compression):
    stack = Stack()
    stack.push(compression_layer(compression))
    with pytest.raises(TransportError):
        stack.receive(b"\xff\xfePUB topic\n\x00\x00\x00\x05hello")


def test_garbage_after_a_tls_upgrade(server_ctx):
    stack = Stack()
    with pytest.raises(TransportError, match=r"^TLS handshake failed"):
        stack.push(TLSLayer(server_ctx, server_side=True), pending=b"PUB topic\n\x00\x00\x00\x05hello")


def test_closed_follows_close_notify(server_ctx, client_ctx):
    client, server = tls_pair(server_ctx, client_ctx)
    upgrade(client, server, "deflate-6")
    assert client.tls is not None
    wire = client.send(b"CLS\n")
    client.tls.close()
    wire += client.output()
    assert server.receive(wire) == b"CLS\n"
    assert server.closed
