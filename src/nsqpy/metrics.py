"""Prometheus metrics (``GET /metrics``) for nsqd and nsqlookupd: an nsqpy addition, NSQ
itself has none.

Custom collectors read the daemon's state when Prometheus scrapes, so nothing is counted per
message; each daemon object gets its own registry (daemons running in one process do not
mix), with prometheus_client's process, platform and GC collectors (``process_*``,
``python_info``, ``python_gc_*``). The body is the Prometheus text format, or OpenMetrics
when the scraper asks for it (``Accept``).

nsqd (labels ``topic``, ``channel``; counters get prometheus_client's ``_total`` suffix):

- ``nsq_info{version}`` 1; ``nsq_health`` 1 while healthy (``/ping`` OK), else 0;
  ``nsq_start_time_seconds``; ``nsq_clients`` (connected TCP clients, producers included)
- ``nsq_topic_depth``, ``nsq_topic_backend_depth``, ``nsq_topic_paused`` (gauges)
- ``nsq_topic_message_count_total``, ``nsq_topic_message_bytes_total`` (counters)
- ``nsq_channel_depth``, ``nsq_channel_backend_depth``, ``nsq_channel_in_flight_count``,
  ``nsq_channel_deferred_count``, ``nsq_channel_client_count``, ``nsq_channel_paused``
  (gauges)
- ``nsq_channel_message_count_total``, ``nsq_channel_requeue_count_total``,
  ``nsq_channel_timeout_count_total`` (counters)
- queue policies (an nsqpy addition; every queue, 0 without settings):
  ``nsq_topic_expired_total``, ``nsq_topic_dropped_total``, ``nsq_channel_expired_total``,
  ``nsq_channel_dropped_total``, ``nsq_channel_dead_letter_total`` (counters)
- with ``--e2e-processing-latency-percentile``: ``nsq_channel_e2e_processing_latency_seconds``
  and ``nsq_topic_e2e_processing_latency_seconds`` (gauges with a ``quantile`` label, in
  seconds where ``/stats`` gives nanoseconds), and ``..._e2e_processing_latency_samples``
  (the FINs in the window, ``/stats``' ``count``); see :mod:`nsqpy.nsqd.quantile`

nsqlookupd (what ``/nodes`` and ``/lookup`` would answer: inactive or tombstoned producers
are not counted):

- ``nsq_lookupd_info{version}`` 1
- ``nsq_lookupd_producers``: nsqd nodes connected and identified
- ``nsq_lookupd_topics``, ``nsq_lookupd_channels``: registrations (channels over all topics)
- ``nsq_lookupd_topic_producers{topic}``: nsqd nodes producing each topic
- ``nsq_lookupd_topic_channels{topic}``: channels registered for each topic
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry

from . import NSQ_VERSION

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from .nsqd.nsqd import NSQD
    from .nsqlookupd.nsqlookupd import NSQLookupd

__all__ = ["LookupdCollector", "NsqdCollector", "lookupd_registry", "nsqd_registry", "render"]

_T = ["topic"]
_TC = ["topic", "channel"]


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)


def _add_latency(
    values: GaugeMetricFamily, samples: GaugeMetricFamily, labels: list[str], result: dict[str, Any]
) -> None:
    pcts = result.get("percentiles")
    if pcts is None:
        return
    samples.add_metric(labels, result["count"])
    for item in pcts:
        values.add_metric([*labels, repr(float(item["quantile"]))], item["value"] / 1e9)


class NsqdCollector(Collector):
    """nsqd's topics, channels and health, read at scrape time."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd

    def collect(self) -> Iterator[Metric]:
        nsqd = self.nsqd
        info = GaugeMetricFamily("nsq_info", "nsqd version (always 1)", labels=["version"])
        info.add_metric([NSQ_VERSION], 1)
        yield info
        yield GaugeMetricFamily(
            "nsq_health",
            "1 while nsqd is healthy (/ping answers OK), else 0",
            value=1 if nsqd.is_healthy() else 0,
        )
        yield GaugeMetricFamily(
            "nsq_start_time_seconds", "when nsqd started (unix seconds)", value=nsqd.start_time
        )
        yield GaugeMetricFamily(
            "nsq_clients",
            "TCP clients connected (consumers and producers)",
            value=len(nsqd.clients),
        )

        t_depth = _gauge("nsq_topic_depth", "messages held by the topic (memory + disk)", _T)
        t_bdepth = _gauge("nsq_topic_backend_depth", "messages in the topic's disk queue", _T)
        t_paused = _gauge("nsq_topic_paused", "1 if the topic is paused", _T)
        t_msgs = _counter("nsq_topic_message_count", "messages published to the topic", _T)
        t_bytes = _counter("nsq_topic_message_bytes", "message body bytes published", _T)
        t_exp = _counter("nsq_topic_expired", "held messages older than the topic's max_age", _T)
        t_drop = _counter("nsq_topic_dropped", "held messages dropped by a drop_oldest bound", _T)
        t_lat = _gauge(
            "nsq_topic_e2e_processing_latency_seconds",
            "publish-to-FIN latency quantiles over the topic's channels",
            [*_T, "quantile"],
        )
        t_lat_n = _gauge(
            "nsq_topic_e2e_processing_latency_samples",
            "FINs in the latency window over the topic's channels",
            _T,
        )
        c_depth = _gauge("nsq_channel_depth", "messages waiting (memory + disk)", _TC)
        c_bdepth = _gauge("nsq_channel_backend_depth", "messages in the channel's disk queue", _TC)
        c_inflt = _gauge("nsq_channel_in_flight_count", "messages in flight", _TC)
        c_def = _gauge("nsq_channel_deferred_count", "deferred messages", _TC)
        c_clients = _gauge("nsq_channel_client_count", "consumers subscribed", _TC)
        c_paused = _gauge("nsq_channel_paused", "1 if the channel is paused", _TC)
        c_msgs = _counter("nsq_channel_message_count", "messages put on the channel", _TC)
        c_req = _counter("nsq_channel_requeue_count", "messages requeued (REQ)", _TC)
        c_to = _counter("nsq_channel_timeout_count", "in-flight messages timed out", _TC)
        c_exp = _counter("nsq_channel_expired", "messages older than max_age, not delivered", _TC)
        c_drop = _counter(
            "nsq_channel_dropped", "messages dropped (a drop_oldest bound, max_attempts alone)", _TC
        )
        c_dead = _counter("nsq_channel_dead_letter", "messages published to the dead-letter topic", _TC)
        c_lat = _gauge(
            "nsq_channel_e2e_processing_latency_seconds",
            "publish-to-FIN latency quantiles",
            [*_TC, "quantile"],
        )
        c_lat_n = _gauge("nsq_channel_e2e_processing_latency_samples", "FINs in the latency window", _TC)

        now_ns = time.time_ns()
        for topic in sorted(nsqd.topics.values(), key=lambda t: t.name):
            tl = [topic.name]
            t_depth.add_metric(tl, topic.depth)
            t_bdepth.add_metric(tl, topic.backend_depth)
            t_paused.add_metric(tl, 1 if topic.paused else 0)
            t_msgs.add_metric(tl, topic.message_count)
            t_bytes.add_metric(tl, topic.message_bytes)
            t_exp.add_metric(tl, topic.expired_count)
            t_drop.add_metric(tl, topic.dropped_count)
            _add_latency(t_lat, t_lat_n, tl, topic.e2e_processing_latency(now_ns))
            for ch in sorted(topic.channels.values(), key=lambda c: c.name):
                cl = [topic.name, ch.name]
                c_depth.add_metric(cl, ch.depth)
                c_bdepth.add_metric(cl, ch.backend_depth)
                c_inflt.add_metric(cl, len(ch.in_flight))
                c_def.add_metric(cl, ch.deferred_count)
                c_clients.add_metric(cl, len(ch.clients))
                c_paused.add_metric(cl, 1 if ch.paused else 0)
                c_msgs.add_metric(cl, ch.message_count)
                c_req.add_metric(cl, ch.requeue_count)
                c_to.add_metric(cl, ch.timeout_count)
                c_exp.add_metric(cl, ch.expired_count)
                c_drop.add_metric(cl, ch.dropped_count)
                c_dead.add_metric(cl, ch.dead_letter_count)
                if ch.e2e is not None:
                    _add_latency(c_lat, c_lat_n, cl, ch.e2e.result(now_ns))
        yield from (t_depth, t_bdepth, t_paused, t_msgs, t_bytes, t_exp, t_drop, t_lat, t_lat_n)
        yield from (c_depth, c_bdepth, c_inflt, c_def, c_clients, c_paused, c_msgs, c_req, c_to)
        yield from (c_exp, c_drop, c_dead)
        yield from (c_lat, c_lat_n)


class LookupdCollector(Collector):
    """nsqlookupd's registry, read at scrape time."""

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd

    def collect(self) -> Iterator[Metric]:
        lookupd = self.lookupd
        db = lookupd.db
        opts = lookupd.options
        now = lookupd.now_ns()
        info = GaugeMetricFamily("nsq_lookupd_info", "nsqlookupd version (always 1)", labels=["version"])
        info.add_metric([NSQ_VERSION], 1)
        yield info
        nodes = db.nodes(opts.inactive_producer_timeout, opts.tombstone_lifetime, now)
        yield GaugeMetricFamily(
            "nsq_lookupd_producers", "nsqd nodes connected and identified", value=len(nodes)
        )
        topics = sorted(db.topics())
        per_topic_channels = {t: db.channels(t) for t in topics}
        yield GaugeMetricFamily("nsq_lookupd_topics", "topics registered", value=len(topics))
        yield GaugeMetricFamily(
            "nsq_lookupd_channels",
            "channels registered (over all topics)",
            value=sum(len(c) for c in per_topic_channels.values()),
        )
        producers = _gauge("nsq_lookupd_topic_producers", "nsqd nodes producing the topic", _T)
        channels = _gauge("nsq_lookupd_topic_channels", "channels registered for the topic", _T)
        for t in topics:
            found = db.lookup(t, opts.inactive_producer_timeout, opts.tombstone_lifetime, now)
            producers.add_metric([t], len(found[1]) if found is not None else 0)
            channels.add_metric([t], len(per_topic_channels[t]))
        yield producers
        yield channels


def _registry(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def nsqd_registry(nsqd: NSQD) -> CollectorRegistry:
    """nsqd's metrics plus the process, platform and GC collectors."""
    return _registry(NsqdCollector(nsqd))


def lookupd_registry(lookupd: NSQLookupd) -> CollectorRegistry:
    """nsqlookupd's metrics plus the process, platform and GC collectors."""
    return _registry(LookupdCollector(lookupd))


def render(registry: CollectorRegistry, accept: str = "") -> tuple[bytes, str]:
    """(body, Content-Type) of one scrape, in the format the ``Accept`` header prefers."""
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type
