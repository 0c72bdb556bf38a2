"""The client library (Producer, Consumer, SyncProducer, SyncConsumer, Connection) over TLS,
snappy, deflate and AUTH against our nsqd in-process, with certificates made at test time
and a test auth server: every combination with AUTH, wrong or missing secrets (typed
errors), an authorization that expires, TLS verification failures, a client certificate
through a caller's ``ssl.SSLContext``, and a server that declines TLS or compression."""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

import pytest
import pytest_asyncio
from client_helpers import nsqd_stats, opts
from support import GRANT, AuthServer, wait_for
from transport.certs import make_pki

from nsqpy.client import (
    ConnectionConfig,
    Consumer,
    Producer,
    SyncConsumer,
    SyncProducer,
    TLSError,
)
from nsqpy.client.conn import Connection
from nsqpy.client.errors import (
    AuthError,
    AuthFailedError,
    AuthRequiredError,
    UnauthorizedError,
)
from nsqpy.nsqd.nsqd import NSQD

pytestmark = pytest.mark.timeout(90)

TOPIC = "orders"  # GRANT: publish and subscribe on ^orders$, any channel


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest_asyncio.fixture
async def authd():
    a = await AuthServer().start()
    yield a
    await a.stop()


def nsqd_options(tmp_path: Any, pki: Any, authd: AuthServer | None, name: str = "d", **kw: Any) -> Any:
    """nsqd with a certificate (so it agrees to TLS when asked) and AUTH through ``authd``."""
    base: dict[str, Any] = dict(tls_cert=pki.server_cert, tls_key=pki.server_key, https_address="127.0.0.1:0")
    if authd is not None:
        base["auth_http_addresses"] = [authd.address]
    base.update(kw)
    return opts(tmp_path, name, **base)


COMBOS = [
    pytest.param({}, id="plain"),
    pytest.param({"tls": True}, id="tls"),
    pytest.param({"snappy": True}, id="snappy"),
    pytest.param({"deflate": True}, id="deflate"),
    pytest.param({"tls": True, "snappy": True}, id="tls+snappy"),
    pytest.param({"tls": True, "deflate": True}, id="tls+deflate"),
]


def client_config(pki: Any, combo: dict[str, bool], secret: str = "good", **kw: Any) -> ConnectionConfig:
    tls = combo.get("tls", False)
    return ConnectionConfig(
        tls_v1=tls,
        tls_root_ca_file=pki.ca_cert if tls else "",
        snappy=combo.get("snappy", False),
        deflate=combo.get("deflate", False),
        auth_secret=secret,
        **kw,
    )


def addr(d: NSQD) -> str:
    return f"127.0.0.1:{d.tcp_port}"


def features(client: dict[str, Any]) -> dict[str, Any]:
    """What nsqd's /stats says a client negotiated."""
    return {k: client.get(k) for k in ("tls", "snappy", "deflate", "authed", "auth_identity")}


def expected_features(combo: dict[str, bool]) -> dict[str, Any]:
    return {
        "tls": combo.get("tls", False),
        "snappy": combo.get("snappy", False),
        "deflate": combo.get("deflate", False),
        "authed": True,
        "auth_identity": "ann",
    }


async def channel_clients(d: NSQD, channel: str) -> list[dict[str, Any]]:
    stats = await nsqd_stats(d.http_port, TOPIC)
    for t in stats["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return list(c["clients"])
    return []


async def consume(c: Consumer, n: int) -> list[bytes]:
    got: list[bytes] = []
    async for msg in c:
        got.append(msg.body)
        msg.finish()
        if len(got) == n:
            break
    return got


@pytest.mark.parametrize("combo", COMBOS)
async def test_every_combination_with_auth(tmp_path, pki, authd, combo) -> None:
    cfg = client_config(pki, combo, max_in_flight=100)
    bodies = [b"%d " % i + bytes(range(256)) * (i % 7) for i in range(300)]
    async with NSQD(nsqd_options(tmp_path, pki, authd)) as d:
        # --- Producer -----------------------------------------------------------------
        async with Producer(addr(d), config=cfg) as p:
            await p.publish(TOPIC, bodies[0])
            await p.publish_many(TOPIC, bodies[1:])
            (pconn,) = p.connections.values()
            assert pconn.compression == (
                "snappy" if combo.get("snappy") else "deflate" if combo.get("deflate") else None
            )
            assert pconn.tls_version.startswith("TLS1.") == combo.get("tls", False)
            assert pconn.auth is not None and pconn.auth["identity"] == "ann"
            stats = await nsqd_stats(d.http_port)
            assert [features(c) for c in stats["producers"]] == [expected_features(combo)]
        # --- Consumer -----------------------------------------------------------------
        async with Consumer(TOPIC, "c", nsqd_tcp_addresses=addr(d), config=cfg) as c:
            await c.wait_connected()
            got = await consume(c, len(bodies))
            assert sorted(got) == sorted(bodies)
            clients = await channel_clients(d, "c")
            assert [features(x) for x in clients] == [expected_features(combo)]
        # --- the sync facade (its own loop thread; nsqd runs on this one) ---------------

        def sync_roundtrip() -> list[bytes]:
            with SyncConsumer(TOPIC, "sync", nsqd_tcp_addresses=addr(d), config=cfg) as sc:
                sc.wait_connected(1, timeout=10)
                with SyncProducer(addr(d), config=cfg) as sp:
                    sp.publish(TOPIC, b"sync-0")
                    sp.publish_many(TOPIC, [b"sync-%d" % i for i in range(1, 50)])
                out = []
                while len(out) < 50:
                    m = sc.next(timeout=10)
                    out.append(m.body)
                    m.fin()
                return out

        got = await asyncio.to_thread(sync_roundtrip)
        assert sorted(got) == sorted(b"sync-%d" % i for i in range(50))
    # every connection (producer, consumer, sync producer, sync consumer) AUTHed, with the
    # right TLS flag sent to the auth server
    tls_flags = {r["tls"] for r in authd.requests}
    assert tls_flags == {"true" if combo.get("tls") else "false"}
    assert len(authd.requests) == 4


async def test_wrong_or_missing_secret_raises_typed_errors(tmp_path, pki, authd, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    authd.answers["nothing"] = dict(GRANT, authorizations=[])
    async with NSQD(nsqd_options(tmp_path, pki, authd)) as d:
        wrong = client_config(pki, {"tls": True}, secret="s3cr3t-wrong")
        assert "s3cr3t-wrong" not in repr(wrong)
        with pytest.raises(AuthFailedError) as e:
            await Connection(addr(d), wrong).connect()
        assert e.value.code == "E_AUTH_FAILED" and e.value.fatal
        with pytest.raises(AuthRequiredError, match="requires AUTH but no auth_secret"):
            await Connection(addr(d), client_config(pki, {}, secret="")).connect()
        with pytest.raises(UnauthorizedError, match="no authorizations"):
            await Connection(addr(d), client_config(pki, {}, secret="nothing")).connect()

        # Producer: the typed error at once, not NoConnectionsError after the timeout
        loop = asyncio.get_running_loop()
        async with Producer(addr(d), config=wrong, timeout=30) as p:
            t0 = loop.time()
            with pytest.raises(AuthFailedError):
                await p.publish(TOPIC, b"x")
            with pytest.raises(AuthFailedError):
                await p.wait_connected(30)
            assert loop.time() - t0 < 10
        # Consumer: wait_connected raises it; the consumer keeps retrying meanwhile
        async with Consumer(
            TOPIC, "c", nsqd_tcp_addresses=addr(d), config=wrong, reconnect_interval=0.05
        ) as c:
            with pytest.raises(AuthFailedError):
                await c.wait_connected(timeout=30)
            assert isinstance(c.errors[addr(d)], AuthFailedError)

        def sync_publish() -> None:
            with SyncProducer(addr(d), config=wrong) as sp:
                sp.publish(TOPIC, b"x")

        with pytest.raises(AuthFailedError):
            await asyncio.to_thread(sync_publish)

        # authorized, but not for this topic: that publish only is refused (typed)
        async with Producer(addr(d), config=client_config(pki, {})) as p:
            with pytest.raises(UnauthorizedError, match='PUB on "audit"'):
                await p.publish("audit", b"not allowed")
            await p.publish(TOPIC, b"allowed")  # a new connection, AUTHed again
    assert "s3cr3t-wrong" not in caplog.text
    assert any(r["secret"] == "s3cr3t-wrong" for r in authd.requests)  # it did go to auth


async def test_producer_reauthenticates_after_its_authorization_expired(tmp_path, pki, authd) -> None:
    """The grant lives 1 s. Once it expired, nsqd asks the auth server again at the next
    PUB: refused, the PUB fails with E_AUTH_FAILED and nsqd closes the connection; the
    producer reconnects and AUTHs again (refused as long as the auth server refuses, then
    accepted)."""
    authd.answers["short"] = dict(GRANT, ttl=1)
    async with NSQD(nsqd_options(tmp_path, pki, authd)) as d:
        cfg = client_config(pki, {"tls": True, "snappy": True}, secret="short")
        async with Producer(addr(d), config=cfg, reconnect_interval=0.05, max_reconnect_interval=0.2) as p:
            await p.publish(TOPIC, b"before")
            authd.answers["short"] = (403, b"revoked")

            async def refused() -> bool:
                try:
                    await p.publish(TOPIC, b"until it expires")
                except AuthFailedError:
                    return True
                await asyncio.sleep(0.05)
                return False

            await wait_for(refused, timeout=10)
            # while the auth server refuses, every reconnection is refused
            with pytest.raises(AuthError):
                await p.publish(TOPIC, b"still refused")
            asked = len(authd.requests)
            authd.answers["short"] = dict(GRANT, ttl=1)

            async def accepted() -> bool:
                try:
                    await p.publish(TOPIC, b"after")
                except AuthError:
                    await asyncio.sleep(0.05)
                    return False
                return True

            await wait_for(accepted, timeout=10)
            assert len(authd.requests) > asked  # AUTHed again on a new connection


async def test_consumer_reconnects_and_reauthenticates(tmp_path, pki, authd) -> None:
    """nsqd checks a consumer's authorization at SUB only (as Go's nsqd); when its
    connection closes (here: the channel is deleted) the consumer reconnects and goes through
    AUTH and SUB again: refused (a typed error, retried) while the grant no longer covers
    the topic, subscribed again once it does."""
    authd.answers["short"] = dict(GRANT, ttl=1)
    async with NSQD(nsqd_options(tmp_path, pki, authd)) as d:
        cfg = client_config(pki, {"tls": True, "deflate": True}, secret="short")
        async with (
            Producer(addr(d), config=client_config(pki, {})) as p,
            Consumer(
                TOPIC,
                "c",
                nsqd_tcp_addresses=addr(d),
                config=cfg,
                reconnect_interval=0.05,
                lookupd_poll_interval=0.2,
            ) as c,
        ):
            await c.wait_connected()
            await p.publish(TOPIC, b"one")
            assert await consume(c, 1) == [b"one"]
            first_auths = len(authd.requests)
            authd.answers["short"] = dict(GRANT, ttl=1, authorizations=[GRANT["authorizations"][1]])
            status, _ = await http_post(d, f"/channel/delete?topic={TOPIC}&channel=c")
            assert status == 200
            await wait_for(lambda: isinstance(c.errors.get(addr(d)), UnauthorizedError), timeout=10)
            assert not c.connections
            authd.answers["short"] = dict(GRANT, ttl=1)
            # (wait_connected would raise the last attempt's error: poll the retries instead)
            await wait_for(lambda: c.connections, timeout=10)
            await p.publish(TOPIC, b"two")
            assert await consume(c, 1) == [b"two"]
            assert len(authd.requests) >= first_auths + 2


async def http_post(d: NSQD, path: str) -> tuple[int, bytes]:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{d.http_port}{path}") as r:
        return r.status, await r.read()


async def test_tls_verification_failure(tmp_path, pki) -> None:
    other = make_pki(tmp_path / "other")  # a CA that did not sign nsqd's certificate
    async with NSQD(nsqd_options(tmp_path, pki, None)) as d:
        bad = ConnectionConfig(tls_v1=True, tls_root_ca_file=other.ca_cert)
        with pytest.raises(TLSError, match=rf"^{addr(d)}: TLS handshake failed - certificate verify failed"):
            await Connection(addr(d), bad).connect()
        async with Producer(addr(d), config=bad, timeout=30) as p:
            with pytest.raises(TLSError, match="certificate verify failed"):
                await p.publish(TOPIC, b"x")
        async with Consumer(TOPIC, "c", nsqd_tcp_addresses=addr(d), config=bad) as c:
            with pytest.raises(TLSError, match="certificate verify failed"):
                await c.wait_connected(timeout=30)
        # tls_insecure_skip_verify: no verification at all
        skip = ConnectionConfig(tls_v1=True, tls_insecure_skip_verify=True)
        conn = await Connection(addr(d), skip).connect()
        assert conn.tls_version
        conn.close()


async def test_tls_name_mismatch(tmp_path, pki) -> None:
    """The certificate is for 127.0.0.1, ::1 and localhost: an nsqd reached as 127.0.0.2
    fails verification (go-nsq checks the name of the host it dialled)."""
    async with NSQD(nsqd_options(tmp_path, pki, None, tcp_address="127.0.0.2:0")) as d:
        with pytest.raises(TLSError, match="certificate verify failed: IP address mismatch"):
            await Connection(
                f"127.0.0.2:{d.tcp_port}", ConnectionConfig(tls_v1=True, tls_root_ca_file=pki.ca_cert)
            ).connect()


async def test_client_certificate_through_options_and_tls_context(tmp_path, pki, authd) -> None:
    """nsqd requires a verified client certificate; its common name goes to the auth server.
    The certificate comes from tls_cert/tls_key, or from the caller's own SSLContext."""
    o = nsqd_options(
        tmp_path, pki, authd, tls_client_auth_policy="require-verify", tls_root_ca_file=pki.ca_cert
    )
    async with NSQD(o) as d:
        by_files = ConnectionConfig(
            tls_v1=True,
            tls_root_ca_file=pki.ca_cert,
            tls_cert=pki.client_cert,
            tls_key=pki.client_key,
            auth_secret="good",
        )
        ctx = ssl.create_default_context(cafile=pki.ca_cert)
        ctx.load_cert_chain(pki.client_cert, pki.client_key)
        by_context = ConnectionConfig(tls_context=ctx, auth_secret="good", snappy=True)
        assert by_context.tls_v1
        for cfg in (by_files, by_context):
            async with Producer(addr(d), config=cfg) as p:
                await p.publish(TOPIC, b"with a client certificate")
        assert [r["common_name"] for r in authd.requests] == ["client.nsqpy", "client.nsqpy"]
        # without a client certificate, nsqd refuses the handshake
        with pytest.raises((TLSError, ConnectionError)):
            await Connection(
                addr(d), ConnectionConfig(tls_v1=True, tls_root_ca_file=pki.ca_cert, auth_secret="good")
            ).connect()


async def test_server_that_declines_tls_and_compression(tmp_path, pki, caplog) -> None:
    """nsqd without a certificate and with --snappy=false/--deflate=false answers false to
    every upgrade: the connection carries on in plain text, as go-nsq's does."""
    caplog.set_level(logging.INFO, logger="nsqpy.client")
    o = opts(tmp_path, "plain", snappy=False, deflate=False)
    async with NSQD(o) as d:
        for combo in ({"tls": True, "snappy": True}, {"deflate": True}):
            cfg = client_config(pki, combo, secret="")
            async with Producer(addr(d), config=cfg) as p:
                await p.publish(TOPIC, b"plain")
                (conn,) = p.connections.values()
                assert conn.compression is None and conn.tls_version == ""
            stats = await nsqd_stats(d.http_port)
            assert all(
                not c["tls"] and not c["snappy"] and not c["deflate"] for c in stats["producers"] or []
            )
        async with Consumer(
            TOPIC,
            "c",
            nsqd_tcp_addresses=addr(d),
            config=client_config(pki, {"tls": True, "snappy": True}, secret=""),
        ) as c:
            assert await consume(c, 2) == [b"plain", b"plain"]
    assert "TLS was asked for but nsqd did not enable it" in caplog.text
    assert "declined snappy compression" in caplog.text
    assert "declined deflate compression" in caplog.text


class ReauthNsqd:
    """A fake nsqd that requires AUTH and, on the first connection only, closes it with a
    fatal E_AUTH_FAILED once the client is subscribed (what an nsqd does to a client whose
    re-authorization failed); later connections get one message. Records the secrets."""

    def __init__(self) -> None:
        self.secrets: list[bytes] = []
        self.connections = 0
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        from nsqpy.protocol import frames

        self.connections += 1
        first = self.connections == 1
        try:
            assert await r.readexactly(4) == frames.MAGIC_V2
            while line := await r.readline():
                cmd = line.split()
                if cmd[0] in (b"IDENTIFY", b"AUTH"):
                    (size,) = frames.unpack_int32_from(await r.readexactly(4))
                    body = await r.readexactly(size)
                    if cmd[0] == b"IDENTIFY":
                        w.write(frames.encode_response(b'{"auth_required": true, "max_rdy_count": 100}'))
                    else:
                        self.secrets.append(body)
                        w.write(frames.encode_response(b'{"identity": "ann", "permission_count": 1}'))
                elif cmd[0] == b"SUB":
                    w.write(frames.OK_FRAME)
                elif cmd[0] == b"RDY" and first:
                    w.write(frames.encode_error(b"E_AUTH_FAILED AUTH failed"))
                    await w.drain()
                    break
                elif cmd[0] == b"RDY":
                    w.write(frames.encode_message_frame(1, 1, b"0" * 16, b"after re-auth"))
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        w.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def test_consumer_closed_for_failed_reauthorization_reconnects_and_auths_again() -> None:
    fake = ReauthNsqd()
    address = await fake.start()
    try:
        cfg = ConnectionConfig(auth_secret="good")
        async with Consumer("t", "c", nsqd_tcp_addresses=address, config=cfg, reconnect_interval=0.05) as c:
            msg = await asyncio.wait_for(anext(aiter(c)), 10)
            assert msg.body == b"after re-auth"
            msg.finish()
        assert fake.secrets == [b"good", b"good"]
    finally:
        await fake.close()
