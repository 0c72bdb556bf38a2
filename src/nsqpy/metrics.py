"""Prometheus metrics (``GET /metrics``) for nsqd and nsqlookupd: an nsqpy addition, NSQ
itself has none.

Collectors read the daemon's state when Prometheus scrapes, so nothing is counted per
message; each daemon object gets its own registry (daemons running in one process do not
mix), with the process, platform and GC series of prometheus_client's standard collectors
(``process_*``, ``python_info``, ``python_gc_*``). The body is the Prometheus text format
(0.0.4), or OpenMetrics when the scraper asks for it (``Accept``), written here byte for
byte as prometheus_client writes them: importing that library (with its HTTP server, WSGI,
gzip and snappy modules) cost an nsqd 2.7 MiB (issue 31); tests compare the two.

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

import gc
import math
import os
import platform
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from . import NSQ_VERSION

if TYPE_CHECKING:
    from .nsqd.nsqd import NSQD
    from .nsqlookupd.nsqlookupd import NSQLookupd

__all__ = [
    "Collector",
    "LookupdCollector",
    "MetricFamily",
    "NsqdCollector",
    "Registry",
    "choose_format",
    "gc_metrics",
    "lookupd_registry",
    "nsqd_registry",
    "openmetrics_text",
    "platform_metrics",
    "process_metrics",
    "prometheus_text",
    "render",
]

_T = ["topic"]
_TC = ["topic", "channel"]

#: the Content-Types prometheus_client answers with
TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
TEXT_1_0_0 = "text/plain; version=1.0.0; charset=utf-8"
OPENMETRICS_1_0_0 = "application/openmetrics-text; version=1.0.0; charset=utf-8"
_ESCAPINGS = ("allow-utf-8", "underscores", "dots", "values")


class MetricFamily:
    """A metric and its samples (prometheus_client's ``GaugeMetricFamily`` and
    ``CounterMetricFamily``: a counter's samples get ``_total``)."""

    __slots__ = ("documentation", "labels", "name", "samples", "type")

    def __init__(
        self, name: str, documentation: str, typ: str, labels: Iterable[str] = (), value: float | None = None
    ) -> None:
        if typ == "counter" and name.endswith("_total"):
            name = name[:-6]
        self.name = name
        self.documentation = documentation
        self.type = typ
        self.labels = list(labels)
        #: (sample name, sorted (label, value) pairs, value)
        self.samples: list[tuple[str, list[tuple[str, str]], float]] = []
        if value is not None:
            self.add_metric([], value)

    def add_metric(self, values: list[str], value: float) -> None:
        name = self.name + "_total" if self.type == "counter" else self.name
        self.samples.append((name, sorted(zip(self.labels, values, strict=True)), value))


def _gauge(name: str, doc: str, labels: Iterable[str] = (), value: float | None = None) -> MetricFamily:
    return MetricFamily(name, doc, "gauge", labels, value)


def _counter(name: str, doc: str, labels: Iterable[str] = (), value: float | None = None) -> MetricFamily:
    return MetricFamily(name, doc, "counter", labels, value)


def _add_latency(
    values: MetricFamily, samples: MetricFamily, labels: list[str], result: dict[str, Any]
) -> None:
    pcts = result.get("percentiles")
    if pcts is None:
        return
    samples.add_metric(labels, result["count"])
    for item in pcts:
        values.add_metric([*labels, repr(float(item["quantile"]))], item["value"] / 1e9)


Collector = Callable[[], Iterable[MetricFamily]]


class NsqdCollector:
    """nsqd's topics, channels and health, read at scrape time."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd

    def __call__(self) -> Iterator[MetricFamily]:
        nsqd = self.nsqd
        info = _gauge("nsq_info", "nsqd version (always 1)", ["version"])
        info.add_metric([NSQ_VERSION], 1)
        yield info
        yield _gauge(
            "nsq_health",
            "1 while nsqd is healthy (/ping answers OK), else 0",
            value=1 if nsqd.is_healthy() else 0,
        )
        yield _gauge("nsq_start_time_seconds", "when nsqd started (unix seconds)", value=nsqd.start_time)
        yield _gauge(
            "nsq_clients", "TCP clients connected (consumers and producers)", value=len(nsqd.clients)
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


class LookupdCollector:
    """nsqlookupd's registry, read at scrape time."""

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd

    def __call__(self) -> Iterator[MetricFamily]:
        lookupd = self.lookupd
        db = lookupd.db
        opts = lookupd.options
        now = lookupd.now_ns()
        info = _gauge("nsq_lookupd_info", "nsqlookupd version (always 1)", ["version"])
        info.add_metric([NSQ_VERSION], 1)
        yield info
        nodes = db.nodes(opts.inactive_producer_timeout, opts.tombstone_lifetime, now)
        yield _gauge("nsq_lookupd_producers", "nsqd nodes connected and identified", value=len(nodes))
        topics = sorted(db.topics())
        per_topic_channels = {t: db.channels(t) for t in topics}
        yield _gauge("nsq_lookupd_topics", "topics registered", value=len(topics))
        yield _gauge(
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


# --- prometheus_client's standard collectors ----------------------------------------------------


def _boot_time() -> float:
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


_BTIME = _boot_time()


def process_metrics() -> list[MetricFamily]:
    """prometheus_client's ``ProcessCollector`` (Linux ``/proc``; nothing elsewhere)."""
    if not _BTIME:
        return []
    ticks = os.sysconf("SC_CLK_TCK")
    out: list[MetricFamily] = []
    try:
        with open("/proc/self/stat", "rb") as f:
            parts = f.read().split(b")")[-1].split()
        out += [
            _gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", value=float(parts[20])),
            _gauge(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                value=float(parts[21]) * os.sysconf("SC_PAGE_SIZE"),
            ),
            _gauge(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                value=float(parts[19]) / ticks + _BTIME,
            ),
            _counter(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds.",
                value=float(parts[11]) / ticks + float(parts[12]) / ticks,
            ),
        ]
    except OSError:
        pass
    try:
        max_fds = None
        with open("/proc/self/limits", "rb") as f:
            for line in f:
                if line.startswith(b"Max open file"):
                    max_fds = _gauge(
                        "process_max_fds",
                        "Maximum number of open file descriptors.",
                        value=float(line.split()[3]),
                    )
                    break
        open_fds = _gauge(
            "process_open_fds", "Number of open file descriptors.", value=len(os.listdir("/proc/self/fd"))
        )
        if max_fds is not None:
            out += [open_fds, max_fds]
    except OSError:
        pass
    return out


def platform_metrics() -> list[MetricFamily]:
    """prometheus_client's ``PlatformCollector``: ``python_info``."""
    major, minor, patchlevel = platform.python_version_tuple()
    info = {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "major": major,
        "minor": minor,
        "patchlevel": patchlevel,
    }
    g = _gauge("python_info", "Python platform information", info.keys())
    g.add_metric(list(info.values()), 1)
    return [g]


def gc_metrics() -> list[MetricFamily]:
    """prometheus_client's ``GCCollector`` (CPython)."""
    if platform.python_implementation() != "CPython":
        return []
    collected = _counter("python_gc_objects_collected", "Objects collected during gc", ["generation"])
    uncollectable = _counter(
        "python_gc_objects_uncollectable", "Uncollectable objects found during GC", ["generation"]
    )
    collections = _counter(
        "python_gc_collections", "Number of times this generation was collected", ["generation"]
    )
    for gen, stat in enumerate(gc.get_stats()):
        generation = str(gen)
        collected.add_metric([generation], stat["collected"])
        uncollectable.add_metric([generation], stat["uncollectable"])
        collections.add_metric([generation], stat["collections"])
    return [collected, uncollectable, collections]


class Registry:
    """The collectors of one daemon, in order (prometheus_client's ``CollectorRegistry``)."""

    def __init__(self, *collectors: Collector) -> None:
        self.collectors = list(collectors)

    def collect(self) -> Iterator[MetricFamily]:
        for c in self.collectors:
            yield from c()


def _registry(collector: Collector) -> Registry:
    _platform = platform_metrics()  # fixed for the process, as PlatformCollector's
    return Registry(collector, process_metrics, lambda: _platform, gc_metrics)


def nsqd_registry(nsqd: NSQD) -> Registry:
    """nsqd's metrics plus the process, platform and GC series."""
    return _registry(NsqdCollector(nsqd))


def lookupd_registry(lookupd: NSQLookupd) -> Registry:
    """nsqlookupd's metrics plus the process, platform and GC series."""
    return _registry(LookupdCollector(lookupd))


# --- the exposition formats ----------------------------------------------------------------------


def _go_float(v: float) -> str:
    """prometheus_client's ``floatToGoString``."""
    d = float(v)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _label_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escaped(name: str, escaping: str) -> str:
    """A metric or label name under the ``escaping`` asked for: every name here is a legacy
    Prometheus name, which only ``dots`` changes (``_`` doubled)."""
    return name.replace("_", "__") if escaping == "dots" else name


def _sample_lines(family: MetricFamily, out: list[str], escaping: str) -> None:
    for name, labels, value in family.samples:
        name = _escaped(name, escaping)
        if labels:
            text = ",".join(f'{_escaped(k, escaping)}="{_label_value(v)}"' for k, v in labels)
            out.append(f"{name}{{{text}}} {_go_float(value)}\n")
        else:
            out.append(f"{name} {_go_float(value)}\n")


def prometheus_text(registry: Registry, escaping: str = "underscores") -> bytes:
    """The Prometheus text format 0.0.4 (prometheus_client's ``generate_latest``)."""
    out: list[str] = []
    for f in registry.collect():
        name = _escaped(f.name + "_total" if f.type == "counter" else f.name, escaping)
        doc = f.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {f.type}\n")
        _sample_lines(f, out, escaping)
    return "".join(out).encode()


def openmetrics_text(registry: Registry, escaping: str = "underscores") -> bytes:
    """OpenMetrics 1.0 (prometheus_client's ``openmetrics.exposition.generate_latest``)."""
    out: list[str] = []
    for f in registry.collect():
        name = _escaped(f.name, escaping)
        out.append(f"# HELP {name} {_label_value(f.documentation)}\n# TYPE {name} {f.type}\n")
        _sample_lines(f, out, escaping)
    out.append("# EOF\n")
    return "".join(out).encode()


def _version_at_least_1(version: str) -> bool:
    parts: list[int | str] = []
    for p in version.split("."):
        try:
            parts.append(int(p))
        except ValueError:
            parts.append(p)
    try:
        return tuple(parts) >= (1, 0, 0)
    except TypeError:
        return False


def _param(toks: list[str], key: str) -> str | None:
    for tok in toks:
        if "=" in tok:
            k, v = tok.strip().split("=", 1)
            if k == key:
                return v
    return None


def choose_format(accept: str) -> tuple[Callable[[Registry], bytes], str]:
    """prometheus_client's ``choose_encoder``: the writer and Content-Type the ``Accept``
    header asks for."""
    for accepted in (accept or "").split(","):
        toks = accepted.split(";")
        media = toks[0].strip()
        if media not in ("application/openmetrics-text", "text/plain"):
            continue
        version = _param(toks, "version") or ""
        escaping = _param(toks, "escaping")
        escaping = escaping if escaping in _ESCAPINGS else "underscores"
        if media == "application/openmetrics-text":
            if not version:
                return openmetrics_text, OPENMETRICS_1_0_0
            if _version_at_least_1(version):
                return (
                    partial(openmetrics_text, escaping=escaping),
                    f"application/openmetrics-text; version={version}; charset=utf-8; escaping={escaping}",
                )
        elif version and _version_at_least_1(version):
            return partial(prometheus_text, escaping=escaping), f"{TEXT_1_0_0}; escaping={escaping}"
    return prometheus_text, TEXT_0_0_4


def render(registry: Registry, accept: str = "") -> tuple[bytes, str]:
    """(body, Content-Type) of one scrape, in the format the ``Accept`` header prefers."""
    write, content_type = choose_format(accept)
    return write(registry), content_type
