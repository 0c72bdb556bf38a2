"""ConnectionConfig's connection features under go-nsq's option names (TLS, compression,
AUTH, sampling, output buffering…), the secret kept out of repr, and lookupd queries that
carry ``Authorization: Bearer <auth_secret>`` (a fake lookupd records the headers; the
producers it returns are a TLS + AUTH nsqd the consumer then reads from)."""

from __future__ import annotations

import ssl
from typing import Any

import pytest
from aiohttp import web
from client_helpers import opts
from support import AuthServer, wait_for
from transport.certs import make_pki

from nsqpy.client import ConnectionConfig, Consumer, Producer
from nsqpy.nsqd.nsqd import NSQD

pytestmark = pytest.mark.timeout(60)


def test_go_option_names_for_the_connection_features(tmp_path) -> None:
    c = ConnectionConfig.from_go_options(
        [
            "tls_v1,true",
            "tls_insecure_skip_verify,true",
            "tls_root_ca_file,ca.pem",
            "tls_cert,client.crt",
            "tls_key,client.key",
            "tls_min_version,tls1.2",
            "snappy,true",
            "auth_secret,s3cr3t",
            "sample_rate,25",
            "output_buffer_size,-1",
            "output_buffer_timeout,100ms",
            "heartbeat_interval,10s",
            "msg_timeout,2m",
            "user_agent,my-app/1.0",
            "deflate_level,3",
            "skip_lookupd_authorization,false",
        ]
    )
    assert (c.tls_v1, c.tls_insecure_skip_verify, c.tls_root_ca_file) == (True, True, "ca.pem")
    assert (c.tls_cert, c.tls_key, c.tls_min_version) == ("client.crt", "client.key", "tls1.2")
    assert (c.snappy, c.deflate, c.deflate_level) == (True, False, 3)
    assert c.auth_secret == "s3cr3t" and not c.skip_lookupd_authorization
    ident = c.identify()
    assert ident["tls_v1"] is True and ident["snappy"] is True and ident["sample_rate"] == 25
    assert ident["output_buffer_size"] == -1 and ident["output_buffer_timeout"] == 100
    assert ident["heartbeat_interval"] == 10000 and ident["msg_timeout"] == 120000
    assert ident["user_agent"] == "my-app/1.0"
    assert "auth_secret" not in ident and "s3cr3t" not in repr(ident)
    # "-" for "_", as go-nsq's Config.Set
    assert ConnectionConfig.from_go_options({"tls-v1": "1", "deflate": "true"}).deflate
    with pytest.raises(ValueError, match="invalid option tls_context"):
        ConnectionConfig.from_go_options(["tls_context,x"])


def test_the_secret_stays_out_of_repr() -> None:
    c = ConnectionConfig(auth_secret="s3cr3t")
    assert "s3cr3t" not in repr(c) and "s3cr3t" not in str(c)
    assert "auth_secret" not in repr(c)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"tls_min_version": "ssl3.0"}, "invalid tls_min_version"),
        ({"tls_cert": "c.pem"}, "tls_cert and tls_key must be given together"),
        ({"tls_key": "k.pem"}, "tls_cert and tls_key must be given together"),
        ({"snappy": True, "deflate": True}, "both deflate and snappy"),
        ({"deflate_level": 10}, "deflate_level"),
        ({"sample_rate": 100}, "sample_rate"),
        (
            {"tls_context": ssl.create_default_context(), "tls_root_ca_file": "ca.pem"},
            "tls_context replaces tls_root_ca_file",
        ),
        (
            {"tls_context": ssl.create_default_context(), "tls_insecure_skip_verify": True},
            "tls_context replaces tls_insecure_skip_verify",
        ),
    ],
)
def test_invalid_combinations(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        ConnectionConfig(**kwargs)


def test_tls_context_implies_tls_and_is_used_as_is() -> None:
    ctx = ssl.create_default_context()
    c = ConnectionConfig(tls_context=ctx)
    assert c.tls_v1 and c.identify()["tls_v1"] is True
    assert c.ssl_context() is ctx
    assert c.replace(snappy=True).ssl_context() is ctx
    # built from the file options once per configuration
    files = ConnectionConfig(tls_v1=True, tls_insecure_skip_verify=True)
    assert files.ssl_context() is files.ssl_context()
    assert files.ssl_context().verify_mode == ssl.CERT_NONE


# --- lookupd's Authorization header ------------------------------------------------------------


class FakeLookupd:
    """/lookup answering with one producer, recording each request's headers."""

    def __init__(self, producer: dict[str, Any]) -> None:
        self.producer = producer
        self.headers: list[dict[str, str]] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> FakeLookupd:
        async def lookup(request: web.Request) -> web.Response:
            self.headers.append(dict(request.headers))
            return web.json_response({"channels": [], "producers": [self.producer]})

        app = web.Application()
        app.router.add_get("/lookup", lookup)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


async def test_lookupd_queries_carry_the_bearer_secret(tmp_path) -> None:
    pki = make_pki(tmp_path / "pki")
    authd = await AuthServer().start()
    o = opts(
        tmp_path,
        "d",
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
        https_address="127.0.0.1:0",
        auth_http_addresses=[authd.address],
    )
    try:
        async with NSQD(o) as d:
            lookupd = await FakeLookupd(
                {
                    "broadcast_address": "127.0.0.1",
                    "hostname": "h",
                    "tcp_port": d.tcp_port,
                    "http_port": d.http_port,
                    "version": "1.3.0",
                }
            ).start()
            try:
                cfg = ConnectionConfig(
                    tls_v1=True, tls_root_ca_file=pki.ca_cert, snappy=True, auth_secret="good"
                )
                async with Producer(f"127.0.0.1:{d.tcp_port}", config=cfg) as p:
                    await p.publish("orders", b"found through lookupd")
                async with Consumer(
                    "orders",
                    "c",
                    lookupd_http_addresses=f"127.0.0.1:{lookupd.port}",
                    config=cfg,
                    lookupd_poll_interval=0.1,
                ) as c:
                    msg = await anext(aiter(c))
                    assert msg.body == b"found through lookupd"
                    msg.finish()
                h = lookupd.headers[0]
                assert h["Authorization"] == "Bearer good"
                assert h["Accept"] == "application/vnd.nsq; version=1.0"

                # go-nsq's skip_lookupd_authorization=false (it means "don't send it"), or no
                # secret at all: no header
                for quiet in (cfg.replace(skip_lookupd_authorization=False), ConnectionConfig()):
                    lookupd.headers.clear()
                    c = Consumer(
                        "orders",
                        "c2",
                        lookupd_http_addresses=f"127.0.0.1:{lookupd.port}",
                        config=quiet,
                        lookupd_poll_interval=0.1,
                    )
                    async with c:
                        await wait_for(lambda: lookupd.headers, timeout=5)
                    assert "Authorization" not in lookupd.headers[0]
            finally:
                await lookupd.stop()
    finally:
        await authd.stop()
