"""Shared fixtures for the Spark tests: ONE SparkSession for the whole run (it takes 10-20 s
to start), an nsqd, and helpers to publish to and read from it.

tests/spark is a package (``__init__.py``), so this conftest is imported as
``spark.conftest`` and does not shadow the root ``conftest`` module that other tests
import by name (``from conftest import make_options``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from e2e.proc import NsqdProcess, NsqlookupdProcess
from support import find_stats, free_port, nsqd_stats, read_bodies, wait_until

from nsqpy.client.sync import SyncProducer


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


# --- a Spark standalone cluster -----------------------------------------------------------------


class SparkCluster:
    """A standalone master and two workers (one core each), each its own JVM started with the
    installed pyspark's ``bin/spark-class`` on 127.0.0.1. The workers run with a SPARK_HOME
    without pyspark's zip (symbolic links to the real one), so that their executors' Python
    workers import the installed, compiled pyspark (as ``make_session`` arranges locally)."""

    WORKERS = 2

    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = free_port()
        self.ui_port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.worker_dirs = [base / f"worker{i}" for i in range(self.WORKERS)]

    def _start(self, name: str, env: dict[str, str], *args: str) -> None:
        from pyspark.find_spark_home import _find_spark_home

        spark_class = os.path.join(_find_spark_home(), "bin", "spark-class")
        with open(self.base / f"{name}.log", "wb") as log:
            self.procs.append(
                subprocess.Popen(
                    [spark_class, *args],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def start(self) -> SparkCluster:
        from pyspark.find_spark_home import _find_spark_home

        from nsqpy.spark.session import spark_home_without_zips

        home = _find_spark_home()
        env = {
            **os.environ,
            "SPARK_HOME": home,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_NO_DAEMONIZE": "1",
            "PYSPARK_PYTHON": sys.executable,
        }
        self._start(
            "master",
            env,
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        worker_home = spark_home_without_zips(home, str(self.base)) or home
        for i, work in enumerate(self.worker_dirs):
            work.mkdir()
            self._start(
                f"worker{i}",
                {**env, "SPARK_HOME": worker_home},
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "2g",
                "--webui-port",
                str(free_port()),
                "--work-dir",
                str(work),
                self.url,
            )
        wait_until(
            lambda: self.alive_workers() == self.WORKERS or self.dead(),
            120,
            "the master and both workers",
            interval=0.2,
        )
        assert not self.dead(), self.describe()
        return self

    def state(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
                doc: dict[str, Any] = json.loads(r.read())
                return doc
        except OSError:
            return {}

    def alive_workers(self) -> int:
        return sum(w.get("state") == "ALIVE" for w in self.state().get("workers", []))

    def dead(self) -> bool:
        return any(p.poll() is not None for p in self.procs)

    def executor_dirs(self, app_name: str) -> list[Path]:
        """The executors' work directories of the applications named ``app_name`` (one per
        worker that ran an executor for it)."""
        ids = {
            a["id"]
            for a in self.state().get("completedapps", []) + self.state().get("activeapps", [])
            if a.get("name") == app_name
        }
        return [d for w in self.worker_dirs for d in w.iterdir() if d.name in ids]

    def describe(self) -> str:
        return "\n".join(
            f"--- {p.name}:\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.base.glob("*.log"))
        )

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()
