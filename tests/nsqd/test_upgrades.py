"""nsqd's connection upgrades as NSQ 1.3 does them: IDENTIFY (plain) → TLS handshake → OK
over TLS → snappy or deflate → OK through the compressor; --tls-required; client
certificate policies; bad input during and after an upgrade.

nsqd runs in-process; the client is tests/nsqd/upgrade_client.py over nsqpy.transport.
"""

from __future__ import annotations

import asyncio
import ssl

import pytest
from conftest import make_options
from support import RawClient, wait_for
from transport.certs import make_pki
from upgrade_client import UpgradedClient, UpgradeError

from nsqpy.nsqd import protocol_v2
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.protocol import commands
from nsqpy.transport import TransportError, client_tls_context

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_opts(pki, **kw):
    base = dict(tls_cert=pki.server_cert, tls_key=pki.server_key, https_address="127.0.0.1:0")
    base.update(kw)
    return base


def client_ctx(pki, cert=None, key=None):
    return client_tls_context(root_ca_file=pki.ca_cert, cert_file=cert or "", key_file=key or "")


async def start(tmp_path, **kw):
    tmp_path.mkdir(parents=True, exist_ok=True)
    d = NSQD(make_options(tmp_path, **kw))
    await d.start()
    return d


async def roundtrip(d: NSQD, c: UpgradedClient, topic: str = "t", n: int = 300) -> None:
    """PUB and MPUB, then SUB on the same upgraded connection: the bodies come back intact."""
    bodies = [b"msg-%d-" % i + bytes(range(256)) * 3 for i in range(n)]
    c.send(commands.pub(topic, bodies[0]))
    assert await c.expect_response() == b"OK"
    c.send(commands.mpub(topic, bodies[1:]))
    assert await c.expect_response() == b"OK"
    c.send(commands.sub(topic, "ch"))
    assert await c.expect_response() == b"OK"
    c.send(commands.rdy(100))
    got = []
    while len(got) < n:
        m = await c.read_message()
        got.append(m.body)
        c.send(commands.fin(m.id))
    assert got == bodies


@pytest.mark.parametrize("level,want", [(0, 6), (1, 1), (6, 6), (9, 6)])
async def test_deflate_level_negotiated_up_to_max(tmp_path, level, want):
    d = await start(tmp_path)
    try:
        c = await UpgradedClient.connect(d.tcp_port, deflate=True, deflate_level=level)
        assert c.negotiated["deflate"] is True and c.negotiated["deflate_level"] == want
        assert c.negotiated["max_deflate_level"] == 6 and c.negotiated["snappy"] is False
        await roundtrip(d, c)
        stats = d.clients[next(iter(d.clients))].stats()
        assert stats["deflate"] is True and stats["snappy"] is False
        await c.close()
    finally:
        await d.stop()


async def test_snappy_roundtrip_and_stats(tmp_path):
    d = await start(tmp_path)
    try:
        c = await UpgradedClient.connect(d.tcp_port, snappy=True)
        assert c.negotiated["snappy"] is True and c.negotiated["deflate"] is False
        await roundtrip(d, c, n=1000)
        (client,) = d.clients.values()
        assert client.stats()["snappy"] is True
        await c.close()
    finally:
        await d.stop()


async def test_snappy_and_deflate_together_are_refused(tmp_path):
    d = await start(tmp_path)
    try:
        with pytest.raises(UpgradeError) as e:
            await UpgradedClient.connect(d.tcp_port, snappy=True, deflate=True)
        assert e.value.text == "E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"
    finally:
        await d.stop()


async def test_disabled_compression_is_not_negotiated(tmp_path):
    d = await start(tmp_path, snappy=False, deflate=False, max_deflate_level=3)
    try:
        c = await UpgradedClient.connect(d.tcp_port, snappy=True)
        assert c.negotiated["snappy"] is False and c.negotiated["max_deflate_level"] == 3
        c2 = await UpgradedClient.connect(d.tcp_port, deflate=True, deflate_level=9)
        assert c2.negotiated["deflate"] is False and c2.negotiated["deflate_level"] == 3
        await roundtrip(d, c2)  # plain
        await c.close()
        await c2.close()
    finally:
        await d.stop()


@pytest.mark.parametrize("compression", [None, "snappy", "deflate"])
async def test_tls_then_compression(tmp_path, pki, compression):
    d = await start(tmp_path, **tls_opts(pki))
    try:
        c = await UpgradedClient.connect(
            d.tcp_port,
            tls=client_ctx(pki),
            snappy=compression == "snappy",
            deflate=compression == "deflate",
        )
        assert c.negotiated["tls_v1"] is True
        assert c.stack.tls is not None and c.stack.compression == compression
        await roundtrip(d, c)
        (client,) = d.clients.values()
        s = client.stats()
        assert s["tls"] is True and s["tls_version"].startswith("TLS1.")
        assert s["tls_cipher_suite"] and s["tls_negotiated_protocol_is_mutual"] is True
        assert s["snappy"] is (compression == "snappy")
        assert s["deflate"] is (compression == "deflate")
        await c.close()
    finally:
        await d.stop()


async def test_tls_not_offered_without_a_certificate(tmp_path, pki):
    d = await start(tmp_path)
    try:
        c = await UpgradedClient.connect(d.tcp_port, tls=client_ctx(pki))
        assert c.negotiated["tls_v1"] is False and c.stack.tls is None
        await roundtrip(d, c)
    finally:
        await d.stop()


async def test_tls_required_refuses_commands_before_the_upgrade(tmp_path, pki):
    d = await start(tmp_path, **tls_opts(pki, tls_required="true"))
    try:
        for cmd, name in (
            (commands.pub("t", b"x"), "PUB"),
            (commands.sub("t", "c"), "SUB"),
            (commands.NOP, "NOP"),
            (commands.mpub("t", [b"x"]), "MPUB"),
        ):
            c = await RawClient.connect(d.tcp_port)
            c.send(cmd)
            assert await c.read_error() == f"E_INVALID cannot {name} in current state (TLS required)"
            await c.expect_closed()
        # IDENTIFY is allowed, and after TLS everything is
        c = await UpgradedClient.connect(d.tcp_port, tls=client_ctx(pki))
        await roundtrip(d, c)
        await c.close()
    finally:
        await d.stop()


async def test_http_while_tls_is_required(tmp_path, pki):
    import aiohttp

    d = await start(tmp_path, **tls_opts(pki, tls_required="true"))
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{d.http_port}/ping") as r:
                assert r.status == 403
                assert await r.read() == (b'{"message": "TLS_REQUIRED", "https_port": %d}' % d.https_port)
            ctx = ssl.create_default_context(cafile=pki.ca_cert)
            async with s.post(
                f"https://127.0.0.1:{d.https_port}/pub?topic=h", data=b"over https", ssl=ctx
            ) as r:
                assert r.status == 200 and await r.read() == b"OK"
    finally:
        await d.stop()
    d = await start(tmp_path / "2", **tls_opts(pki, tls_required="tcp-https"))
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{d.http_port}/ping") as r:
            assert r.status == 200  # tcp-https: plain HTTP stays open
        c = await RawClient.connect(d.tcp_port)
        c.send(commands.pub("t", b"x"))
        assert await c.read_error() == "E_INVALID cannot PUB in current state (TLS required)"
    finally:
        await d.stop()


@pytest.mark.parametrize(
    "policy,cert,ok",
    [
        ("require", None, False),
        ("require", "self", True),  # Go's RequireAnyClientCert: any certificate will do
        ("require", "ca", True),
        ("require-verify", None, False),
        ("require-verify", "self", False),
        ("require-verify", "ca", True),
    ],
)
async def test_client_certificate_policies(tmp_path, pki, policy, cert, ok):
    d = await start(
        tmp_path,
        **tls_opts(pki, tls_client_auth_policy=policy, tls_root_ca_file=pki.ca_cert, tls_required="true"),
    )
    files = {
        "self": (pki.self_signed_cert, pki.self_signed_key),
        "ca": (pki.client_cert, pki.client_key),
        None: (None, None),
    }[cert]
    try:
        if ok:
            c = await UpgradedClient.connect(d.tcp_port, tls=client_ctx(pki, *files))
            await roundtrip(d, c)
            await c.close()
        else:
            # the server's refusal reaches the client as a TLS alert (or, in TLS 1.3, after
            # the client thinks the handshake is done) followed by Go's plain error frame
            with pytest.raises((UpgradeError, TransportError)):
                c = await UpgradedClient.connect(d.tcp_port, tls=client_ctx(pki, *files))
                c.send(commands.pub("t", b"x"))
                await c.expect_response()
            await wait_for(lambda: not d.clients)
        # a refused handshake harms nobody else
        good = await UpgradedClient.connect(d.tcp_port, tls=client_ctx(pki, pki.client_cert, pki.client_key))
        good.send(commands.pub("t", b"after"))
        assert await good.expect_response() == b"OK"
        await good.close()
    finally:
        await d.stop()


async def test_garbage_handshake_gets_identify_failed_in_plain_text(tmp_path, pki):
    d = await start(tmp_path, **tls_opts(pki))
    try:
        c = await RawClient.connect(d.tcp_port)
        resp = await c.identify(feature_negotiation=True, tls_v1=True)
        assert resp["tls_v1"] is True
        c.send(b"\x16\x03\x01\x00\x05hello, this is not a ClientHello" * 4)
        # a TLS alert, then Go's error frame in plain text, then the connection closes
        data = await asyncio.wait_for(c.reader.read(), 5)
        i = data.index(b"E_IDENTIFY_FAILED IDENTIFY failed TLS handshake failed")
        size = int.from_bytes(data[i - 8 : i - 4], "big")
        assert data[i - 4 : i] == b"\x00\x00\x00\x01" and len(data) == i - 4 + size
    finally:
        await d.stop()


async def test_handshake_timeout(tmp_path, pki, monkeypatch):
    monkeypatch.setattr(protocol_v2, "TLS_HANDSHAKE_TIMEOUT", 0.3)
    d = await start(tmp_path, **tls_opts(pki))
    try:
        c = await RawClient.connect(d.tcp_port)
        await c.identify(feature_negotiation=True, tls_v1=True)
        assert await c.read_error() == "E_IDENTIFY_FAILED IDENTIFY failed TLS handshake timeout"
        await c.expect_closed()
    finally:
        await d.stop()


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
async def test_garbage_after_compression_closes_only_that_connection(tmp_path, compression):
    d = await start(tmp_path)
    try:
        other = await UpgradedClient.connect(d.tcp_port, snappy=compression == "snappy")
        c = await UpgradedClient.connect(
            d.tcp_port, snappy=compression == "snappy", deflate=compression == "deflate"
        )
        c.send_raw(b"\xfe\xff garbage that is neither snappy nor deflate \x00\x01" * 10)
        await c.expect_closed()
        await wait_for(lambda: len(d.clients) == 1)
        other.send(commands.pub("t", b"still fine"))
        assert await other.expect_response() == b"OK"
        await other.close()
    finally:
        await d.stop()


async def test_identify_bools_must_be_bools(tmp_path):
    d = await start(tmp_path)
    try:
        c = await RawClient.connect(d.tcp_port)
        c.send(commands.identify({"feature_negotiation": True, "snappy": "yes"}))
        err = await c.read_error()
        assert err.startswith("E_BAD_BODY IDENTIFY failed to decode JSON body"), err
    finally:
        await d.stop()


async def test_upgrade_with_pipelined_commands(tmp_path):
    """Commands sent right behind the IDENTIFY, already through the new layer (a client
    that does not wait for the upgrade's OK), are not lost."""
    from nsqpy.transport import DeflateLayer

    d = await start(tmp_path)
    try:
        _r, w = await asyncio.open_connection("127.0.0.1", d.tcp_port)
        layer = DeflateLayer(6)
        w.write(
            b"  V2"
            + commands.identify({"feature_negotiation": True, "deflate": True})
            + layer.encode(commands.pub("p", b"pipelined"))
        )
        await wait_for(lambda: "p" in d.topics and d.topics["p"].message_count == 1)
        w.close()
    finally:
        await d.stop()


async def test_https_listener_only_with_cert(tmp_path, pki):
    d = await start(tmp_path)
    try:
        assert d.https_address is None and d.https_port == 0
    finally:
        await d.stop()
    d = await start(tmp_path / "2", **tls_opts(pki))
    try:
        assert d.https_port > 0
    finally:
        await d.stop()
