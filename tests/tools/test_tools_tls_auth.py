"""``to_nsq --producer-opt`` and ``nsq_tail --consumer-opt`` with go-nsq's TLS, compression
and AUTH options, as real console scripts against our nsqd (in-process, TLS required, a
test auth server, certificates made at test time); refused secrets and certificates end
the tools with the typed error's text, and the secret is never printed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from e2e.proc import script
from support import AuthServer
from transport.certs import make_pki

from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options

pytestmark = pytest.mark.timeout(120)

TOPIC = "orders"  # the test auth server grants publish/subscribe on ^orders$


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest_asyncio.fixture
async def authd():
    a = await AuthServer().start()
    yield a
    await a.stop()


@pytest_asyncio.fixture
async def nsqd(tmp_path, pki, authd):
    """TLS required on TCP: a tool that did not upgrade could not even IDENTIFY."""
    o = Options(
        tcp_address="127.0.0.1:0",
        http_address="127.0.0.1:0",
        https_address="127.0.0.1:0",
        data_path=str(tmp_path),
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
        tls_required="true",
        auth_http_addresses=[authd.address],
    )
    async with NSQD(o) as d:
        yield d


async def run(name: str, *args: str, input: bytes = b"", timeout: float = 40.0) -> tuple[int, bytes, str]:
    """Run a console script to completion; killed by its PID on timeout."""
    proc = await asyncio.create_subprocess_exec(
        script(name),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(input), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out, err.decode(errors="replace")


def tls_opts(flag: str, pki: Any, secret: str = "good", *extra: str) -> list[str]:
    return [
        f"--{flag}=tls_v1,true",
        f"--{flag}=tls_root_ca_file,{pki.ca_cert}",
        f"--{flag}=auth_secret,{secret}",
        *(f"--{flag}={e}" for e in extra),
    ]


@pytest.mark.parametrize(
    "compression", [["snappy,true"], ["deflate,true", "deflate_level,3"]], ids=["snappy", "deflate"]
)
async def test_to_nsq_and_nsq_tail_over_tls_with_auth(nsqd, pki, authd, compression) -> None:
    address = f"127.0.0.1:{nsqd.tcp_port}"
    bodies = [b"line %d" % i for i in range(200)]
    # nsq_tail first (its ephemeral channel must exist before the messages arrive)
    tail = asyncio.ensure_future(
        run(
            "nsq_tail",
            f"--topic={TOPIC}",
            f"--nsqd-tcp-address={address}",
            "-n",
            "200",
            *tls_opts("consumer-opt", pki, "good", *compression),
        )
    )

    async def subscribed() -> bool:
        for t in nsqd.topics.values():
            for ch in t.channels.values():
                if ch.clients:
                    return True
        return False

    deadline = asyncio.get_running_loop().time() + 30
    while not await subscribed():
        assert not tail.done(), tail.result()
        assert asyncio.get_running_loop().time() < deadline, "nsq_tail never subscribed"
        await asyncio.sleep(0.05)

    code, _, err = await run(
        "to_nsq",
        f"--topic={TOPIC}",
        f"--nsqd-tcp-address={address}",
        *tls_opts("producer-opt", pki, "good", *compression),
        input=b"\n".join(bodies) + b"\n",
    )
    assert code == 0, err
    code, out, err = await tail
    assert code == 0, err
    assert out.split(b"\n")[:-1] == bodies
    # both tools AUTHed over TLS
    assert [(r["secret"], r["tls"]) for r in authd.requests] == [("good", "true")] * 2
    assert "good" not in err


async def test_nsq_tail_through_lookupd_sends_the_bearer_secret(nsqd, pki) -> None:
    seen: list[dict[str, str]] = []

    async def lookup(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response(
            {
                "channels": [],
                "producers": [
                    {
                        "broadcast_address": "127.0.0.1",
                        "hostname": "h",
                        "tcp_port": nsqd.tcp_port,
                        "http_port": nsqd.http_port,
                        "version": "1.3.0",
                    }
                ],
            }
        )

    app = web.Application()
    app.router.add_get("/lookup", lookup)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        nsqd.get_topic(TOPIC).put_bodies([b"via lookupd"], 0)
        code, out, err = await run(
            "nsq_tail",
            f"--topic={TOPIC}",
            f"--lookupd-http-address=127.0.0.1:{runner.addresses[0][1]}",
            "-n",
            "1",
            "--channel=archive",
            *tls_opts("consumer-opt", pki),
        )
        assert code == 0, err
        assert out == b"via lookupd\n"
        assert seen and seen[0]["Authorization"] == "Bearer good"
    finally:
        await runner.cleanup()


async def test_refused_secret_and_certificate(nsqd, pki, tmp_path) -> None:
    address = f"127.0.0.1:{nsqd.tcp_port}"
    code, _, err = await run(
        "to_nsq",
        f"--topic={TOPIC}",
        f"--nsqd-tcp-address={address}",
        *tls_opts("producer-opt", pki, "n0t-the-s3cret"),
        input=b"x\n",
    )
    assert code == 1
    assert f"failed to connect to nsqd {address} - E_AUTH_FAILED AUTH failed" in err
    assert "n0t-the-s3cret" not in err

    code, _, err = await run(
        "nsq_tail",
        f"--topic={TOPIC}",
        f"--nsqd-tcp-address={address}",
        *tls_opts("consumer-opt", pki, "n0t-the-s3cret"),
    )
    assert code == 1
    assert f"failed to connect to nsqd {address} (topic {TOPIC}) - {address}: E_AUTH_FAILED" in err
    assert "n0t-the-s3cret" not in err

    other = make_pki(tmp_path / "other")
    code, _, err = await run(
        "to_nsq",
        f"--topic={TOPIC}",
        f"--nsqd-tcp-address={address}",
        "--producer-opt=tls_v1",
        f"--producer-opt=tls_root_ca_file,{other.ca_cert}",
        "--producer-opt=auth_secret,good",
        input=b"x\n",
    )
    assert code == 1
    assert "TLS handshake failed - certificate verify failed" in err

    # without tls_v1, nsqd (--tls-required) refuses the plain connection
    code, _, err = await run(
        "to_nsq",
        f"--topic={TOPIC}",
        f"--nsqd-tcp-address={address}",
        "--producer-opt=auth_secret,good",
        input=b"x\n",
    )
    assert code == 1
    assert "E_INVALID cannot AUTH in current state (TLS required)" in err
