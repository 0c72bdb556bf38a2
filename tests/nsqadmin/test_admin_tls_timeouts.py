"""The HTTP client options: an nsqd that requires TLS (403 ``TLS_REQUIRED`` on plain HTTP,
retried on its HTTPS port as Go's client does) read with ``--http-client-tls-root-ca-file``
and client certificates; and ``--http-client-request-timeout`` against a node that never
answers."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from admin_helpers import running_admin
from transport.certs import make_pki

from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options as NsqdOptions

pytestmark = pytest.mark.timeout(60)


def tls_nsqd(tmp_path, pki, **kw) -> NSQD:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return NSQD(
        NsqdOptions(
            tcp_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            https_address="127.0.0.1:0",
            data_path=str(tmp_path),
            broadcast_address="127.0.0.1",
            tls_cert=pki.server_cert,
            tls_key=pki.server_key,
            tls_required="true",
            **kw,
        )
    )


async def test_tls_required_nsqd(tmp_path):
    pki = make_pki(tmp_path / "pki")
    async with tls_nsqd(tmp_path / "d", pki) as nsqd:
        nsqd.get_topic("secure")
        addr = nsqd.http_addr_str
        async with running_admin(nsqd_http_addresses=[addr], http_client_tls_root_ca_file=pki.ca_cert) as (
            _,
            http,
        ):
            assert await http.json("/api/topics") == {"topics": ["secure"], "message": ""}
            status, body = await http.post_json("/api/topics/secure", {"action": "pause"})
            assert (status, body) == (200, {"message": ""})
            assert nsqd.get_topic("secure").paused
        # the system roots do not know our CA
        async with running_admin(nsqd_http_addresses=[addr]) as (_, http):
            doc = await http.json("/api/topics", 502)
            assert doc["message"].startswith(
                f'UPSTREAM_ERROR: failed to query any nsqd: Get "https://127.0.0.1:'
                f'{nsqd.https_port}/stats?format=json": tls: failed to verify certificate'
            )
        async with running_admin(nsqd_http_addresses=[addr], http_client_tls_insecure_skip_verify=True) as (
            _,
            http,
        ):
            assert (await http.json("/api/topics"))["topics"] == ["secure"]


async def test_client_certificate(tmp_path):
    pki = make_pki(tmp_path / "pki")
    async with tls_nsqd(
        tmp_path / "d", pki, tls_client_auth_policy="require-verify", tls_root_ca_file=pki.ca_cert
    ) as nsqd:
        nsqd.get_topic("secure")
        addr = nsqd.http_addr_str
        async with running_admin(
            nsqd_http_addresses=[addr],
            http_client_tls_root_ca_file=pki.ca_cert,
            http_client_tls_cert=pki.client_cert,
            http_client_tls_key=pki.client_key,
        ) as (_, http):
            assert (await http.json("/api/topics"))["topics"] == ["secure"]
        async with running_admin(nsqd_http_addresses=[addr], http_client_tls_root_ca_file=pki.ca_cert) as (
            _,
            http,
        ):
            assert (await http.get("/api/topics"))[0] == 502


@contextlib.asynccontextmanager
async def silent_server():
    """Accepts connections and never answers."""
    writers = []

    async def hold(reader, writer):
        writers.append(writer)
        with contextlib.suppress(ConnectionError):
            await reader.read()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for w in writers:
            w.close()
        server.close()
        await server.wait_closed()


async def test_request_timeout(tmp_path):
    async with (
        silent_server() as port,
        running_admin(nsqd_http_addresses=[f"127.0.0.1:{port}"], http_client_request_timeout=0.3) as (
            _,
            http,
        ),
    ):
        loop = asyncio.get_running_loop()
        start = loop.time()
        doc = await http.json("/api/topics", 502)
        assert loop.time() - start < 3
        assert doc == {
            "message": f'UPSTREAM_ERROR: failed to query any nsqd: Get "http://127.0.0.1:{port}'
            '/stats?format=json": context deadline exceeded (Client.Timeout exceeded while '
            "awaiting headers)"
        }
