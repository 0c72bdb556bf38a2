"""AUTH as NSQ 1.3 does it, against a small auth server run by the test (aiohttp): the
auth-server request, the responses and error codes nsqd sends, TTL expiry, regex
permissions, AUTH with TLS (the client certificate's common name), slow/down/broken auth
servers harming no other client, and the auth fields of /stats."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import aiohttp
import pytest
from conftest import make_options
from support import GRANT, AuthServer, RawClient
from transport.certs import make_pki
from upgrade_client import UpgradedClient

from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.stats import client_stats
from nsqpy.protocol import commands
from nsqpy.transport import client_tls_context

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def authd():
    s = await AuthServer().start()
    yield s
    await s.stop()


@pytest.fixture
async def nsqd_auth(tmp_path, authd):
    async with NSQD(make_options(tmp_path, auth_http_addresses=[authd.address])) as d:
        yield d


async def authed_client(d: NSQD, secret: bytes = b"good") -> tuple[RawClient, dict]:
    c = await RawClient.connect(d.tcp_port)
    resp = await c.identify(feature_negotiation=True)
    assert resp["auth_required"] is True
    c.send(commands.auth(secret))
    ftype, data = await c.read_frame()
    assert ftype == 0, data
    return c, json.loads(data)


async def test_auth_then_publish_and_subscribe_within_permissions(nsqd_auth, authd):
    c, resp = await authed_client(nsqd_auth)
    assert resp == {"identity": "ann", "identity_url": "http://people.example/ann", "permission_count": 2}
    (req,) = authd.requests
    assert req["_path"] == "/auth" and req["_method"] == "GET"
    assert {k: req[k] for k in ("remote_ip", "tls", "secret", "common_name")} == {
        "remote_ip": "127.0.0.1",
        "tls": "false",
        "secret": "good",
        "common_name": "",
    }
    assert await c.pub("orders", b"one") == (0, b"OK")
    c.send(commands.mpub("orders", [b"two", b"three"]))
    assert await c.read_frame() == (0, b"OK")
    c.send(commands.dpub("orders", 10, b"four"))
    assert await c.read_frame() == (0, b"OK")

    s, _ = await authed_client(nsqd_auth)
    await s.sub("orders", "anything")
    s2, _ = await authed_client(nsqd_auth)
    await s2.sub("audit.2024", "archive")

    stats = [client_stats(cl) for cl in nsqd_auth.clients.values()]
    assert all(
        st["authed"] is True
        and st["auth_identity"] == "ann"
        and st["auth_identity_url"] == "http://people.example/ann"
        for st in stats
    )
    assert len(authd.requests) == 3  # one per AUTH, the TTL is long


@pytest.mark.parametrize(
    "send,error",
    [
        (commands.pub("forbidden", b"x"), 'E_UNAUTHORIZED AUTH failed for PUB on "forbidden" ""'),
        (commands.mpub("forbidden", [b"x"]), 'E_UNAUTHORIZED AUTH failed for MPUB on "forbidden" ""'),
        (commands.dpub("forbidden", 5, b"x"), 'E_UNAUTHORIZED AUTH failed for DPUB on "forbidden" ""'),
        (commands.sub("audit.x", "other"), 'E_UNAUTHORIZED AUTH failed for SUB on "audit.x" "other"'),
        (commands.pub("audit.x", b"x"), 'E_UNAUTHORIZED AUTH failed for PUB on "audit.x" ""'),
    ],
)
async def test_outside_the_permissions(nsqd_auth, send, error):
    c, _ = await authed_client(nsqd_auth)
    c.send(send)
    assert await c.read_error() == error
    await c.expect_closed()


@pytest.mark.parametrize(
    "send,cmd",
    [
        (commands.pub("orders", b"x"), "PUB"),
        (commands.sub("orders", "c"), "SUB"),
        (commands.dpub("orders", 1, b"x"), "DPUB"),
        (commands.mpub("orders", [b"x"]), "MPUB"),
    ],
)
async def test_auth_first(nsqd_auth, send, cmd):
    c = await RawClient.connect(nsqd_auth.tcp_port)
    c.send(send)
    assert await c.read_error() == f"E_AUTH_FIRST AUTH required before {cmd}"


async def test_mpub_authorization_is_checked_before_its_body(nsqd_auth):
    c = await RawClient.connect(nsqd_auth.tcp_port)
    c.send(b"MPUB orders\n" + (10**9).to_bytes(4, "big"))  # a body nsqd would refuse
    assert await c.read_error() == "E_AUTH_FIRST AUTH required before MPUB"


@pytest.mark.parametrize(
    "answer",
    [
        (403, b"forbidden"),
        (200, b"not json"),
        (200, b'{"ttl": 0, "authorizations": []}'),
        (200, b'{"ttl": 60, "authorizations": [{"topic": "(", "channels": [], "permissions": []}]}'),
        (200, b'{"ttl": 60, "authorizations": [{"topic": ".", "channels": [], "permissions": ["own"]}]}'),
        (500, b"boom"),
    ],
    ids=["403", "non-json", "ttl-0", "bad-regex", "bad-permission", "500"],
)
async def test_auth_server_refusals_are_auth_failed(nsqd_auth, authd, answer, caplog):
    authd.answers["bad"] = answer
    c = await RawClient.connect(nsqd_auth.tcp_port)
    c.send(commands.auth(b"bad"))
    assert await c.read_error() == "E_AUTH_FAILED AUTH failed"
    await c.expect_closed()
    # the auth server's answer is logged once, never sent to the client
    assert sum("AUTH failed failed to auth against" in r.getMessage() for r in caplog.records) == 1


async def test_no_authorizations_is_unauthorized(nsqd_auth, authd):
    authd.answers["empty"] = {"ttl": 60, "identity": "x", "authorizations": []}
    c = await RawClient.connect(nsqd_auth.tcp_port)
    c.send(commands.auth(b"empty"))
    assert await c.read_error() == "E_UNAUTHORIZED AUTH no authorizations found"


async def test_second_auth_is_invalid(nsqd_auth):
    c, _ = await authed_client(nsqd_auth)
    c.send(commands.auth(b"good"))
    assert await c.read_error() == "E_INVALID AUTH already set"


async def test_auth_disabled(tmp_path):
    async with NSQD(make_options(tmp_path)) as d:
        c = await RawClient.connect(d.tcp_port)
        resp = await c.identify(feature_negotiation=True)
        assert resp["auth_required"] is False
        c.send(commands.auth(b"x"))
        assert await c.read_error() == "E_AUTH_DISABLED AUTH disabled"


async def test_ttl_expiry_asks_again_and_honours_the_new_answer(nsqd_auth, authd):
    authd.answers["short"] = dict(GRANT, ttl=1)
    c, _ = await authed_client(nsqd_auth, b"short")
    assert await c.pub("orders", b"a") == (0, b"OK")
    assert len(authd.requests) == 1
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and len(authd.requests) == 1:
        await asyncio.sleep(0.2)  # the TTL is wall-clock seconds; nothing to poll before it
        assert await c.pub("orders", b"b") == (0, b"OK")
    assert len(authd.requests) == 2, "nsqd did not ask again after the TTL"
    authd.answers["short"] = dict(GRANT, ttl=1, authorizations=[])
    deadline = time.monotonic() + 3
    while True:
        await asyncio.sleep(0.2)
        c.send(commands.pub("orders", b"c"))
        f = await c.read_frame()
        if f != (0, b"OK"):
            break
        assert time.monotonic() < deadline
    assert f == (1, b'E_UNAUTHORIZED AUTH failed for PUB on "orders" ""')


async def test_slow_and_down_auth_servers_block_nobody_else(tmp_path, authd):
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_addr = "127.0.0.1:%d" % dead.getsockname()[1]
    dead.close()  # nothing listens there
    authd.answers["slow"] = 3.0
    opts = make_options(tmp_path, auth_http_addresses=[authd.address], http_client_request_timeout=0.5)
    async with NSQD(opts) as d:
        slow = await RawClient.connect(d.tcp_port)
        slow.send(commands.auth(b"slow"))
        # meanwhile another client authenticates and publishes
        t0 = time.monotonic()
        c, _ = await authed_client(d)
        assert await c.pub("orders", b"x") == (0, b"OK")
        assert time.monotonic() - t0 < 0.5
        assert await slow.read_error(timeout=3) == "E_AUTH_FAILED AUTH failed"
    (tmp_path / "b").mkdir()
    async with NSQD(make_options(tmp_path / "b", auth_http_addresses=[dead_addr])) as d:
        c = await RawClient.connect(d.tcp_port)
        c.send(commands.auth(b"good"))
        assert await c.read_error() == "E_AUTH_FAILED AUTH failed"
    # one server down, one up: tried in random order until one answers
    (tmp_path / "c").mkdir()
    async with NSQD(make_options(tmp_path / "c", auth_http_addresses=[dead_addr, authd.address])) as d:
        for _ in range(4):
            c, resp = await authed_client(d)
            assert resp["identity"] == "ann"


async def test_full_url_and_post_method(tmp_path, authd):
    opts = make_options(
        tmp_path,
        auth_http_addresses=[f"http://{authd.address}/custom/check"],
        auth_http_request_method="post",
    )
    async with NSQD(opts) as d:
        await authed_client(d)
    (req,) = authd.requests
    assert req["_path"] == "/custom/check" and req["_method"] == "POST"
    assert req["secret"] == "good" and req["tls"] == "false"


async def test_auth_over_tls_sends_the_client_certificate_common_name(tmp_path, authd):
    pki = make_pki(tmp_path / "pki")
    opts = make_options(
        tmp_path,
        auth_http_addresses=[authd.address],
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
        https_address="127.0.0.1:0",
        tls_client_auth_policy="require-verify",
        tls_root_ca_file=pki.ca_cert,
        tls_required="true",
    )
    async with NSQD(opts) as d:
        ctx = client_tls_context(root_ca_file=pki.ca_cert, cert_file=pki.client_cert, key_file=pki.client_key)
        c = await UpgradedClient.connect(d.tcp_port, tls=ctx)
        assert c.negotiated["auth_required"] is True
        c.send(commands.auth(b"good"))
        assert json.loads(await c.expect_response())["identity"] == "ann"
        c.send(commands.pub("orders", b"over tls"))
        assert await c.expect_response() == b"OK"
    (req,) = authd.requests
    assert req["tls"] == "true" and req["common_name"] == "client.nsqpy"


async def test_http_publishing_is_not_subject_to_auth(nsqd_auth, authd):
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{nsqd_auth.http_port}/pub?topic=anything", data=b"x") as r,
    ):
        assert r.status == 200
    assert authd.requests == []


# ---------------------------------------------------------------- --http-publish-auth


async def test_http_publish_auth_checks_the_bearer_secret_with_the_auth_server(tmp_path, authd):
    opts = make_options(tmp_path, auth_http_addresses=[authd.address], http_publish_auth=True)
    async with NSQD(opts) as d, aiohttp.ClientSession() as s:
        base = f"http://127.0.0.1:{d.http_port}"

        async def post(path: str, body: bytes, secret: str | None) -> tuple[int, object, dict]:
            headers = {"Authorization": f"Bearer {secret}"} if secret is not None else {}
            async with s.post(base + path, data=body, headers=headers) as r:
                text = await r.text()
                try:
                    return r.status, json.loads(text), dict(r.headers)
                except ValueError:
                    return r.status, text, dict(r.headers)

        status, doc, headers = await post("/pub?topic=orders", b"x", None)
        assert (status, doc) == (401, {"message": "UNAUTHORIZED"})
        assert headers["WWW-Authenticate"] == "Bearer"
        assert authd.requests == []  # nothing asked without a secret
        assert (await post("/pub?topic=orders", b"x", "bad"))[:2] == (403, {"message": "FORBIDDEN"})
        assert (await post("/pub?topic=orders", b"one", "good"))[:2] == (200, "OK")
        assert (await post("/mpub?topic=orders", b"two\nthree", "good"))[:2] == (200, "OK")
        # a secret without publish permission on that topic
        assert (await post("/pub?topic=audit.2024", b"x", "good"))[:2] == (403, {"message": "FORBIDDEN"})
        assert "audit.2024" not in d.topics  # refused before the topic is made
        asked = [r["secret"] for r in authd.requests]
        assert asked == ["bad", "good"]  # the answer is kept for its TTL
        assert authd.requests[-1]["remote_ip"] == "127.0.0.1" and authd.requests[-1]["tls"] == "false"
        assert d.topics["orders"].message_count == 3
        # bad arguments are still Go's answers
        assert (await post("/pub", b"x", "good"))[:2] == (400, {"message": "MISSING_ARG_TOPIC"})
        # an auth server that is down: refused, not published
        authd.answers["slow"] = (500, b"broken")
        assert (await post("/pub?topic=orders", b"x", "slow"))[:2] == (403, {"message": "FORBIDDEN"})
        assert d.topics["orders"].message_count == 3


async def test_http_publish_auth_expires_with_the_ttl(tmp_path, authd):
    authd.answers["short"] = {**GRANT, "ttl": 1}
    opts = make_options(tmp_path, auth_http_addresses=[authd.address], http_publish_auth=True)
    async with NSQD(opts) as d, aiohttp.ClientSession() as s:
        url = f"http://127.0.0.1:{d.http_port}/pub?topic=orders"
        for _ in range(2):
            async with s.post(url, data=b"x", headers={"Authorization": "Bearer short"}) as r:
                assert r.status == 200
        assert len(authd.requests) == 1
        await asyncio.sleep(1.1)
        authd.answers["short"] = (403, b"revoked")
        async with s.post(url, data=b"x", headers={"Authorization": "Bearer short"}) as r:
            assert r.status == 403
        assert len(authd.requests) == 2


async def test_http_publish_is_open_by_default_even_with_auth(nsqd_auth):
    """Go's behaviour, kept unless --http-publish-auth is given."""
    url = f"http://127.0.0.1:{nsqd_auth.http_port}/pub?topic=orders"
    async with aiohttp.ClientSession() as s, s.post(url, data=b"x") as r:
        assert r.status == 200


def test_http_publish_auth_needs_an_auth_server(tmp_path):
    from nsqpy.nsqd.options import OptionsError, validate

    with pytest.raises(OptionsError, match="--http-publish-auth needs --auth-http-address"):
        validate(make_options(tmp_path, http_publish_auth=True))
