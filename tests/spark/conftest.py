"""Shared fixtures for the Spark tests: ONE SparkSession for the whole run (it takes 10-20 s
to start), an nsqd, and helpers to publish to and read from it.

tests/spark is a package (``__init__.py``), so this conftest is imported as
``spark.conftest`` and does not shadow the root ``conftest`` module that other tests
import by name (``from conftest import make_options``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from e2e.proc import NsqdProcess, NsqlookupdProcess  # noqa: E402
from support import find_stats, nsqd_stats, read_bodies, wait_until  # noqa: E402

from nsqpy.client.sync import SyncProducer  # noqa: E402


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The session-wide SparkSession (local[2], loopback only, ``nsq`` format registered)."""
    from nsqpy.spark.session import make_session

    session = make_session("local[2]", app_name="nsqpy-tests")
    try:
        yield session
    finally:
        session.stop()


def _start_nsqd(path: Path, *args: str) -> NsqdProcess:
    return NsqdProcess(path, "--mem-queue-size=100000", *args).start()


@pytest.fixture(scope="session")
def nsqd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NsqdProcess]:
    """One nsqd (console script) for the session; tests use topics of their own."""
    p = _start_nsqd(tmp_path_factory.mktemp("nsqd"))
    try:
        yield p
        assert p.is_running(), f"nsqd died during the tests\n{p.describe()}"
    finally:
        p.stop()


@pytest.fixture(scope="session")
def lookupd_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[NsqlookupdProcess, list[NsqdProcess]]]:
    """nsqlookupd and two nsqd registered with it."""
    base = tmp_path_factory.mktemp("cluster")
    lookupd = NsqlookupdProcess(base / "lookupd").start()
    nsqds: list[NsqdProcess] = []
    try:
        for i in range(2):
            nsqds.append(
                _start_nsqd(
                    base / f"nsqd{i}",
                    f"--lookupd-tcp-address={lookupd.tcp_address}",
                    "--broadcast-address=127.0.0.1",
                )
            )
        yield lookupd, nsqds
    finally:
        for p in nsqds:
            p.stop()
        lookupd.stop()


@pytest.fixture
def unique_topic(request: pytest.FixtureRequest) -> str:
    name = request.node.name.replace("[", "_").replace("]", "").replace("-", "_")
    return f"{name[:40]}_{time.monotonic_ns() % 10**9}"


def publish(nsqd: NsqdProcess, topic: str, bodies: list[bytes]) -> None:
    with SyncProducer(nsqd.tcp_address) as p:
        for i in range(0, len(bodies), 1000):
            p.publish_many(topic, bodies[i : i + 1000], timeout=30)


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    return wait_until(cond, timeout, what, interval=0.05)


def stats(nsqd: NsqdProcess, topic: str, channel: str | None = None) -> dict[str, Any] | None:
    """The topic's (or channel's) /stats entry, None if absent."""
    found: dict[str, Any] | None = find_stats(nsqd_stats(nsqd.http_address, topic, channel), topic, channel)
    return found


def consume(nsqd: NsqdProcess, topic: str, channel: str, n: int, timeout: float = 30.0) -> list[bytes]:
    """Read (and FIN) exactly ``n`` messages; then check nothing more arrives shortly."""
    return read_bodies(nsqd.tcp_address, topic, channel, n, timeout, quiet=0.5)


# --- TLS and AUTH -----------------------------------------------------------------------------

#: The secret the test auth server grants everything for (identity "spark").
SECRET = "spark-test-secret-4f9b2c"
SPARK_GRANT = {
    "ttl": 3600,
    "identity": "spark",
    "identity_url": "http://people.example/spark",
    "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}],
}


class ThreadedAuthServer:
    """tests/support's AuthServer on an event loop of its own thread, so that it answers
    nsqd whatever the test does (a Spark job, blocking calls) until the session ends."""

    def __init__(self) -> None:
        import asyncio
        import threading

        from support import AuthServer

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="auth-server", daemon=True)
        self.server = AuthServer()

    def start(self) -> ThreadedAuthServer:
        import asyncio

        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        return self

    @property
    def address(self) -> str:
        return self.server.address

    def stop(self) -> None:
        import asyncio

        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A CA, a server certificate for 127.0.0.1 it signed, and client certificates."""
    from transport.certs import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def auth_server() -> Iterator[ThreadedAuthServer]:
    server = ThreadedAuthServer().start()
    server.server.answers[SECRET] = SPARK_GRANT
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def secure_nsqd(
    tmp_path_factory: pytest.TempPathFactory, pki: Any, auth_server: ThreadedAuthServer
) -> Iterator[NsqdProcess]:
    """An nsqd whose TCP clients must use TLS (``--tls-required=tcp-https``: plain HTTP
    stays open for /stats) and AUTH against the test auth server."""
    p = _start_nsqd(
        tmp_path_factory.mktemp("secure-nsqd"),
        f"--tls-cert={pki.server_cert}",
        f"--tls-key={pki.server_key}",
        "--https-address=127.0.0.1:0",  # a certificate starts HTTPS too (default :4152)
        "--tls-required=tcp-https",
        f"--auth-http-address={auth_server.address}",
    )
    try:
        yield p
        assert p.is_running(), f"nsqd died during the tests\n{p.describe()}"
    finally:
        p.stop()


def secure_options(pki: Any, secret: str = SECRET, **extra: str) -> dict[str, str]:
    """The ``nsq`` source/sink options for :func:`secure_nsqd`."""
    return {"tls": "true", "tlsRootCaFile": pki.ca_cert, "authSecret": secret, **extra}
