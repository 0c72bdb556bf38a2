"""TLSLayer: handshakes over memory buffers, nsqd's client-auth policies and minimum versions,
and interop with ordinary ``ssl`` sockets."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable

import pytest

from nsqpy.transport import Stack, TLSLayer, TransportError, client_tls_context, server_tls_context
from transport.pairs import tls_pair

IO_TIMEOUT = 10.0


def attempt(server_ctx, client_ctx, hostname: str = "127.0.0.1") -> tuple[Stack, Stack]:
    """Handshake, then one round trip each way (a TLS 1.3 client only learns of a rejected
    certificate from the alert that follows its Finished)."""
    client, server = tls_pair(server_ctx, client_ctx, hostname)
    assert server.receive(client.send(b"IDENTIFY")) == b"IDENTIFY"
    assert client.receive(server.send(b"OK")) == b"OK"
    return client, server


def rejected(server_ctx, client_ctx, hostname: str = "127.0.0.1") -> tuple[str, str]:
    """Run a handshake that must fail; returns the (client, server) error messages ("" if
    that side raised nothing). The failing side's alert is delivered to its peer."""
    client, server = Stack(), Stack()
    server.push(TLSLayer(server_ctx, server_side=True))
    client.push(TLSLayer(client_ctx, server_hostname=hostname))
    errors = {"client": "", "server": ""}
    sides = {"client": (client, server), "server": (server, client)}
    for _ in range(10):
        moved = False
        for name in ("client", "server"):
            me, peer = sides[name]
            peer_name = "server" if name == "client" else "client"
            out = me.output()
            if out and not errors[peer_name]:
                moved = True
                try:
                    peer.receive(out)
                except TransportError as e:
                    errors[peer_name] = str(e)
        if not moved:
            break
        if errors["client"] and errors["server"]:
            break
    if not (errors["client"] or errors["server"]):
        # both handshakes done: a TLS 1.3 server may still refuse on the first data
        try:
            server.receive(client.send(b"IDENTIFY"))
        except TransportError as e:
            errors["server"] = str(e)
            try:
                client.receive(server.output())
            except TransportError as e2:
                errors["client"] = str(e2)
    assert errors["client"] or errors["server"], "the handshake should have failed"
    return errors["client"], errors["server"]


def client_with(pki, which: str, **kw) -> ssl.SSLContext:
    cert, key = {
        "none": ("", ""),
        "ca-signed": (pki.client_cert, pki.client_key),
        "self-signed": (pki.self_signed_cert, pki.self_signed_key),
    }[which]
    return client_tls_context(root_ca_file=pki.ca_cert, cert_file=cert, key_file=key, **kw)


# --- handshake and connection facts -------------------------------------------------------


def test_handshake_and_connection_state(server_ctx, client_ctx):
    client, server = attempt(server_ctx, client_ctx)
    for stack in (client, server):
        tls = stack.tls
        assert tls is not None
        assert tls.version() == "TLS1.3"
        assert tls.cipher() in {
            "TLS_AES_128_GCM_SHA256",
            "TLS_AES_256_GCM_SHA384",
            "TLS_CHACHA20_POLY1305_SHA256",
        }
        assert tls.negotiated_protocol() == ""
        assert not tls.closed
    assert server.tls is not None and client.tls is not None
    assert server.tls.peer_certificate() is None  # no client-auth policy: none asked
    assert server.tls.peer_common_name() == ""
    assert client.tls.peer_common_name() == "localhost"  # the server's certificate
    assert client.tls.peer_certificate_der() is not None


def test_tls12_version_and_go_cipher_name(pki, server_ctx):
    client, server = attempt(server_ctx, client_with(pki, "none", max_version="tls1.2"))
    assert server.tls is not None and client.tls is not None
    assert server.tls.version() == client.tls.version() == "TLS1.2"
    assert server.tls.cipher().startswith("TLS_ECDHE_ECDSA_WITH_")  # Go's name, not OpenSSL's


def test_client_hello_is_ready_at_once_and_server_waits(client_ctx, server_ctx):
    client_layer = TLSLayer(client_ctx, server_hostname="localhost")
    hello = client_layer.output()
    assert hello[:1] == b"\x16"  # a handshake record
    server_layer = TLSLayer(server_ctx, server_side=True)
    assert server_layer.output() == b""
    assert not client_layer.handshake_done and not server_layer.handshake_done
    assert client_layer.version() == client_layer.cipher() == ""
    # the ClientHello one byte at a time
    for i in range(len(hello)):
        assert server_layer.decode(hello[i : i + 1]) == b""
    assert server_layer.output()  # ServerHello ... Finished


def test_bytes_encoded_before_the_handshake_are_sent_after_it(server_ctx, client_ctx):
    client, server = Stack(), Stack()
    server.push(TLSLayer(server_ctx, server_side=True))
    client.push(TLSLayer(client_ctx, server_hostname="127.0.0.1"))
    early = client.send(b"SUB topic channel\n")  # only the ClientHello so far
    got = server.receive(early)
    assert got == b""
    received = []
    for _ in range(10):
        to_server, to_client = client.output(), server.output()
        if to_server:
            received.append(server.receive(to_server))
        if to_client:
            received.append(client.receive(to_client))
        if not to_server and not to_client:
            break
    assert b"".join(received) == b"SUB topic channel\n"


def test_hostname_mismatch_and_unknown_ca_fail(pki, server_ctx):
    client_error, _ = rejected(server_ctx, client_tls_context(root_ca_file=pki.ca_cert), "nsqd.example.com")
    assert client_error.startswith("TLS handshake failed - certificate verify failed")
    unknown_ca = client_tls_context(root_ca_file=pki.self_signed_cert)
    client_error, _ = rejected(server_ctx, unknown_ca)
    assert "certificate verify failed" in client_error


def test_insecure_skip_verify(server_ctx):
    attempt(server_ctx, client_tls_context(insecure_skip_verify=True), "nsqd.example.com")


# --- nsqd's client-auth policies ----------------------------------------------------------


def test_policy_none_does_not_ask_for_a_certificate(pki, server_ctx):
    _, server = attempt(server_ctx, client_with(pki, "self-signed"))
    assert server.tls is not None and server.tls.peer_certificate() is None


@pytest.mark.parametrize("which", ["self-signed", "ca-signed"])
def test_require_accepts_any_client_certificate(pki, which):
    pytest.importorskip("OpenSSL")
    ctx = server_tls_context(pki.server_cert, pki.server_key, "require", pki.ca_cert)
    assert not isinstance(ctx, ssl.SSLContext)  # the pyOpenSSL backend
    _client, server = attempt(ctx, client_with(pki, which))
    tls = server.tls
    assert tls is not None
    expected = "rogue.nsqpy" if which == "self-signed" else "client.nsqpy"
    assert tls.peer_common_name() == expected
    cert = tls.peer_certificate()
    assert cert is not None and (("commonName", expected),) in cert["subject"]
    assert tls.peer_certificate_der() is not None
    assert tls.version() == "TLS1.3"
    assert tls.cipher().startswith("TLS_")
    assert tls.negotiated_protocol() == ""


@pytest.mark.parametrize("max_version", ["tls1.2", ""])
def test_require_rejects_a_client_without_certificate(pki, max_version):
    pytest.importorskip("OpenSSL")
    ctx = server_tls_context(pki.server_cert, pki.server_key, "require")
    client_error, server_error = rejected(ctx, client_with(pki, "none", max_version=max_version))
    assert server_error == "TLS handshake failed - peer did not return a certificate"
    assert client_error.startswith("TLS")  # the server's alert reached the client


def test_require_verify_accepts_a_ca_signed_certificate(pki):
    ctx = server_tls_context(pki.server_cert, pki.server_key, "require-verify", pki.ca_cert)
    _, server = attempt(ctx, client_with(pki, "ca-signed"))
    assert server.tls is not None
    assert server.tls.peer_common_name() == "client.nsqpy"


@pytest.mark.parametrize("which", ["self-signed", "none"])
def test_require_verify_rejects(pki, which):
    ctx = server_tls_context(pki.server_cert, pki.server_key, "require-verify", pki.ca_cert)
    client_error, server_error = rejected(ctx, client_with(pki, which))
    assert (
        server_error
        == {
            "self-signed": "TLS handshake failed - certificate verify failed: self-signed certificate",
            "none": "TLS handshake failed - peer did not return a certificate",
        }[which]
    )
    assert client_error.startswith("TLS")  # the server's alert reached the client


# --- minimum version ---------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["", "require", "require-verify"])
def test_min_version_tls13_refuses_a_tls12_client(pki, policy):
    if policy == "require":
        pytest.importorskip("OpenSSL")
    ctx = server_tls_context(pki.server_cert, pki.server_key, policy, pki.ca_cert, min_version="tls1.3")
    client_error, server_error = rejected(ctx, client_with(pki, "ca-signed", max_version="tls1.2"))
    assert server_error == "TLS handshake failed - unsupported protocol"
    assert client_error == "TLS handshake failed - tlsv1 alert protocol version"


@pytest.mark.parametrize("policy", ["", "require"])
def test_min_version_tls12_allows_tls12(pki, policy):
    if policy == "require":
        pytest.importorskip("OpenSSL")
    ctx = server_tls_context(pki.server_cert, pki.server_key, policy, min_version="tls1.2")
    _, server = attempt(ctx, client_with(pki, "ca-signed", max_version="tls1.2"))
    assert server.tls is not None and server.tls.version() == "TLS1.2"


def test_bad_options():
    with pytest.raises(ValueError):
        server_tls_context("c", "k", client_auth="optional")
    with pytest.raises(ValueError):
        server_tls_context("c", "k", min_version="ssl3.0")
    with pytest.raises(ValueError):
        client_tls_context(insecure_skip_verify=True, min_version="tls9")


# --- errors and close ----------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["", "require"])
def test_garbage_client_hello(pki, policy):
    if policy == "require":
        pytest.importorskip("OpenSSL")
    ctx = server_tls_context(pki.server_cert, pki.server_key, policy)
    layer = TLSLayer(ctx, server_side=True)
    with pytest.raises(TransportError, match=r"^TLS handshake failed - "):
        layer.decode(b"PUB topic\n\x00\x00\x00\x05hello, this is no ClientHello")


def test_garbage_after_the_handshake(server_ctx, client_ctx):
    _, server = tls_pair(server_ctx, client_ctx)
    with pytest.raises(TransportError, match=r"^TLS error - "):
        server.receive(b"\x17\x03\x03\x00\x20" + b"\x00" * 32)  # an undecryptable record


@pytest.mark.parametrize("policy", ["", "require"])
def test_close_notify(pki, policy):
    if policy == "require":
        pytest.importorskip("OpenSSL")
    ctx = server_tls_context(pki.server_cert, pki.server_key, policy)
    client, server = tls_pair(ctx, client_with(pki, "ca-signed"))
    assert client.tls is not None and server.tls is not None
    wire = client.send(b"last")
    client.tls.close()
    wire += client.output()
    assert server.receive(wire) == b"last"
    assert server.tls.closed and server.closed
    assert server.receive(b"anything after close") == b""
    server.tls.close()
    assert client.receive(server.output()) == b""
    assert client.closed


# --- interop with real ssl sockets -------------------------------------------------------


def _run_peer(target: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def _recv_exact(sock, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "peer closed early"
        data += chunk
    return bytes(data)


def _serve_with_layer(sock: socket.socket, stack: Stack, expect: int, reply: bytes) -> bytes:
    """Our side, blocking I/O: read ``expect`` application bytes, answer, close politely."""
    received = bytearray()
    while len(received) < expect:
        chunk = sock.recv(65536)
        assert chunk, "peer closed early"
        received += stack.receive(chunk)
        out = stack.output()
        if out:
            sock.sendall(out)
    sock.sendall(stack.send(reply))
    return bytes(received)


@pytest.mark.parametrize("policy", ["", "require", "require-verify"])
def test_layer_server_with_an_ssl_socket_client(pki, policy):
    if policy == "require":
        pytest.importorskip("OpenSSL")
    server_ctx = server_tls_context(pki.server_cert, pki.server_key, policy, pki.ca_cert)
    client_ctx = client_with(pki, "ca-signed")
    ours, theirs = socket.socketpair()
    ours.settimeout(IO_TIMEOUT)
    theirs.settimeout(IO_TIMEOUT)
    request = b"PUB topic\n" + b"m" * 100_000
    reply = b"OK" * 50_000
    got: list[bytes] = []

    def ssl_client() -> None:
        with client_ctx.wrap_socket(theirs, server_hostname="localhost") as tls_sock:
            tls_sock.sendall(request)
            got.append(_recv_exact(tls_sock, len(reply)))
            tls_sock.unwrap()  # close_notify both ways

    thread, errors = _run_peer(ssl_client)
    stack = Stack()
    stack.push(TLSLayer(server_ctx, server_side=True))
    assert _serve_with_layer(ours, stack, len(request), reply) == request
    assert stack.tls is not None
    # the client's close_notify, then ours
    while not stack.closed:
        chunk = ours.recv(65536)
        assert chunk
        assert stack.receive(chunk) == b""
    stack.tls.close()
    ours.sendall(stack.output())
    thread.join(IO_TIMEOUT)
    ours.close()
    assert not errors, errors
    assert got == [reply]
    if policy:
        assert stack.tls.peer_common_name() == "client.nsqpy"


def test_layer_client_with_an_ssl_socket_server(pki):
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(pki.server_cert, pki.server_key)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    server_ctx.load_verify_locations(pki.ca_cert)
    ours, theirs = socket.socketpair()
    ours.settimeout(IO_TIMEOUT)
    theirs.settimeout(IO_TIMEOUT)
    request = b"IDENTIFY\n" + b"{}" * 40_000
    reply = b"R" * 70_000
    seen: list[tuple[bytes, str]] = []

    def ssl_server() -> None:
        with server_ctx.wrap_socket(theirs, server_side=True) as tls_sock:
            data = _recv_exact(tls_sock, len(request))
            subject = dict(x[0] for x in tls_sock.getpeercert()["subject"])
            seen.append((data, subject["commonName"]))
            tls_sock.sendall(reply)

    thread, errors = _run_peer(ssl_server)
    stack = Stack()
    stack.push(TLSLayer(client_with(pki, "ca-signed"), server_hostname="localhost"))
    ours.sendall(stack.output())  # ClientHello
    ours.sendall(stack.send(request))  # held until the handshake completes
    received = bytearray()
    while len(received) < len(reply):
        chunk = ours.recv(65536)
        assert chunk, "server closed early"
        received += stack.receive(chunk)
        out = stack.output()
        if out:
            ours.sendall(out)
    thread.join(IO_TIMEOUT)
    ours.close()
    assert not errors, errors
    assert seen == [(request, "client.nsqpy")]
    assert received == reply
