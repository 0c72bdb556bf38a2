"""End to end: ``GET /metrics`` (Prometheus) of the real ``nsqd`` and ``nsqlookupd``
console scripts, parsed with prometheus_client's own parser."""

from __future__ import annotations

import urllib.request

import pytest
from e2e.proc import NsqdProcess, nsqd_fixture, nsqlookupd_fixture
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from support import RawClient, wait_until

from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(60)


def scrape(address: str, accept: str | None = None) -> tuple[str, str]:
    req = urllib.request.Request(f"http://{address}/metrics")
    if accept:
        req.add_header("Accept", accept)
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200
        return resp.headers["Content-Type"], resp.read().decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value; also checks family types."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def families(text: str) -> dict[str, str]:
    return {fam.name: fam.type for fam in text_string_to_metric_families(text)}


@pytest.fixture
def nsqd_proc(tmp_path):
    yield from nsqd_fixture(tmp_path, "--e2e-processing-latency-percentile=0.99,0.5")


async def test_nsqd_metrics(nsqd_proc: NsqdProcess):
    p = nsqd_proc
    consumer = await RawClient.connect(p.tcp_port)
    await consumer.sub("t", "c", 10)
    producer = await RawClient.connect(p.tcp_port)
    producer.send(commands.mpub("t", [b"a", b"bb", b"ccc"]))
    assert await producer.read_frame() == (0, b"OK")
    msgs = await consumer.read_messages(3)
    consumer.send(commands.req(msgs[0].id, 60_000))  # deferred for a minute
    consumer.send(commands.fin(msgs[1].id))  # msgs[2] stays in flight
    assert p.http_post("/topic/create?topic=idle")[0] == 200
    assert p.http_post("/channel/create?topic=idle&channel=paused")[0] == 200
    assert p.http_post("/channel/pause?topic=idle&channel=paused")[0] == 200

    tc = (("channel", "c"), ("topic", "t"))

    def settled():
        text = scrape(p.http_address)[1]
        s = samples(text)
        return s.get(("nsq_channel_deferred_count", tc)) == 1 and (text, s)

    text, s = wait_until(settled, timeout=10)
    content_type = scrape(p.http_address)[0]
    assert content_type.startswith("text/plain; version=")
    t = (("topic", "t"),)
    assert s[("nsq_health", ())] == 1
    assert s[("nsq_info", (("version", "1.3.0"),))] == 1
    assert s[("nsq_clients", ())] == 2
    assert s[("nsq_topic_message_count_total", t)] == 3
    assert s[("nsq_topic_message_bytes_total", t)] == 6
    assert s[("nsq_topic_depth", t)] == 0
    assert s[("nsq_topic_backend_depth", t)] == 0
    assert s[("nsq_topic_paused", t)] == 0
    assert s[("nsq_channel_message_count_total", tc)] == 3
    assert s[("nsq_channel_requeue_count_total", tc)] == 1
    assert s[("nsq_channel_timeout_count_total", tc)] == 0
    assert s[("nsq_channel_in_flight_count", tc)] == 1
    assert s[("nsq_channel_depth", tc)] == 0
    assert s[("nsq_channel_backend_depth", tc)] == 0
    assert s[("nsq_channel_client_count", tc)] == 1
    assert s[("nsq_channel_paused", tc)] == 0
    assert s[("nsq_channel_paused", (("channel", "paused"), ("topic", "idle")))] == 1
    for q in ("0.99", "0.5"):
        assert s[("nsq_channel_e2e_processing_latency_seconds", (*tc[:1], ("quantile", q), tc[1]))] >= 0
        assert s[("nsq_topic_e2e_processing_latency_seconds", (("quantile", q), *t))] >= 0
    assert ("nsq_channel_e2e_processing_latency_samples", tc) in s
    fams = families(text)
    assert fams["nsq_topic_message_count"] == "counter"
    assert fams["nsq_channel_depth"] == "gauge"
    assert fams["nsq_channel_e2e_processing_latency_seconds"] == "gauge"
    # process, platform and GC collectors
    assert s[("process_resident_memory_bytes", ())] > 0
    assert ("python_info", ()) not in s  # labelled
    assert any(name == "python_info" for name, _ in s)
    assert any(name == "python_gc_collections_total" for name, _ in s)

    # OpenMetrics when asked for
    content_type, text = scrape(p.http_address, "application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert any(f.name == "nsq_channel_depth" for f in openmetrics_families(text))

    await consumer.close()
    await producer.close()


def test_nsqd_metrics_without_percentiles(tmp_path):
    with_fixture = nsqd_fixture(tmp_path)
    p = next(with_fixture)
    try:
        assert p.http_post("/topic/create?topic=t")[0] == 200
        assert p.http_post("/channel/create?topic=t&channel=c")[0] == 200
        s = samples(scrape(p.http_address)[1])
        assert s[("nsq_channel_depth", (("channel", "c"), ("topic", "t")))] == 0
        assert not any("e2e" in name for name, _ in s)
    finally:
        with pytest.raises(StopIteration):
            next(with_fixture)


@pytest.fixture
def lookupd_proc(tmp_path):
    yield from nsqlookupd_fixture(tmp_path)


def test_nsqlookupd_metrics(tmp_path, lookupd_proc):
    lk = lookupd_proc
    gen = nsqd_fixture(tmp_path / "n", f"--lookupd-tcp-address={lk.tcp_address}")
    p = next(gen)
    try:
        assert p.http_post("/topic/create?topic=a")[0] == 200
        assert p.http_post("/channel/create?topic=a&channel=c1")[0] == 200
        assert p.http_post("/channel/create?topic=a&channel=c2")[0] == 200
        assert lk.http_post("/topic/create?topic=only_in_lookupd")[0] == 200

        def registered():
            s = samples(scrape(lk.http_address)[1])
            return s.get(("nsq_lookupd_topic_channels", (("topic", "a"),))) == 2 and s

        s = wait_until(registered, timeout=10)
        assert s[("nsq_lookupd_info", (("version", "1.3.0"),))] == 1
        assert s[("nsq_lookupd_producers", ())] == 1
        assert s[("nsq_lookupd_topics", ())] == 2
        assert s[("nsq_lookupd_channels", ())] == 2
        assert s[("nsq_lookupd_topic_producers", (("topic", "a"),))] == 1
        assert s[("nsq_lookupd_topic_producers", (("topic", "only_in_lookupd"),))] == 0
        assert s[("process_resident_memory_bytes", ())] > 0
    finally:
        with pytest.raises(StopIteration):
            next(gen)

    def gone():
        s = samples(scrape(lk.http_address)[1])
        return s[("nsq_lookupd_producers", ())] == 0 and s

    s = wait_until(gone, timeout=10)
    assert s[("nsq_lookupd_topic_producers", (("topic", "a"),))] == 0
