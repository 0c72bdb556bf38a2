"""Shared fixtures for the Spark tests: ONE SparkSession for the whole run (it takes 10-20 s
to start), an nsqd, and helpers to publish to and read from it.

tests/spark is a package (``__init__.py``), so this conftest is imported as
``spark.conftest`` and does not shadow the root ``conftest`` module that other tests
import by name (``from conftest import make_options``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from e2e.proc import NsqdProcess, NsqlookupdProcess  # noqa: E402
from support import read_bodies, wait_until  # noqa: E402

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
    q = f"/stats?format=json&topic={topic}" + (f"&channel={channel}" if channel else "")
    status, body = nsqd.http_get(q)
    assert status == 200, body
    for t in json.loads(body).get("topics") or []:
        if t["topic_name"] != topic:
            continue
        if channel is None:
            return t
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return c
    return None


def consume(nsqd: NsqdProcess, topic: str, channel: str, n: int, timeout: float = 30.0) -> list[bytes]:
    """Read (and FIN) exactly ``n`` messages; then check nothing more arrives shortly."""
    return read_bodies(nsqd.tcp_address, topic, channel, n, timeout, quiet=0.5)
