"""nsqpy.metrics writes the Prometheus text format and OpenMetrics byte for byte as
prometheus_client does (the daemons no longer import it: issue 31), with the same process,
platform and GC series, and picks the format from ``Accept`` as its ``choose_encoder``."""

from __future__ import annotations

import gc

import pytest
from prometheus_client import GCCollector, PlatformCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.exposition import generate_latest as prom_text
from prometheus_client.openmetrics.exposition import generate_latest as prom_openmetrics
from prometheus_client.registry import CollectorRegistry

from nsqpy import metrics
from nsqpy.metrics import MetricFamily, Registry

# (name, type, doc, label names, samples: (label values, value))
FAMILIES = [
    ("nsq_info", "gauge", "nsqd version (always 1)", ["version"], [(["1.3.0"], 1)]),
    ("nsq_health", "gauge", "1 while healthy", [], [([], 0)]),
    ("nsq_start_time_seconds", "gauge", "when", [], [([], 1795892331)]),
    ("nsq_empty", "gauge", "no samples \\ at all\nreally", ["topic"], []),
    (
        "nsq_topic_message_count",
        "counter",
        "messages",
        ["topic"],
        [(["a"], 3), (['we"ird\\na\nme'], 12345678901234), (["é"], 0.5)],
    ),
    (
        "nsq_channel_e2e_processing_latency_seconds",
        "gauge",
        "quantiles",
        ["topic", "channel", "quantile"],
        [(["t", "c", "0.99"], 1.5e-05), (["t", "c", "0.5"], float("inf")), (["t", "c", "0.9"], float("nan"))],
    ),
    ("process_cpu_seconds_total", "counter", "Total CPU", [], [([], 0.13)]),
    ("nsq_negative", "gauge", "below zero", [], [([], -1234567.25)]),
]


@pytest.fixture(autouse=True)
def _no_collections():
    """The GC series count collections: one between writing ours and theirs would differ."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


class _Fixed:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def both_registries() -> tuple[CollectorRegistry, Registry]:
    theirs, ours = [], []
    for name, typ, doc, labels, samples in FAMILIES:
        cls = GaugeMetricFamily if typ == "gauge" else CounterMetricFamily
        t = cls(name, doc, labels=labels) if labels or not samples else cls(name, doc, value=samples[0][1])
        o = (
            MetricFamily(name, doc, typ, labels)
            if labels or not samples
            else MetricFamily(name, doc, typ, value=samples[0][1])
        )
        if labels:
            for values, v in samples:
                t.add_metric(values, v)
                o.add_metric(values, v)
        theirs.append(t)
        ours.append(o)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Fixed(theirs))
    PlatformCollector(registry=reg)
    GCCollector(registry=reg)
    return reg, Registry(lambda: ours, metrics.platform_metrics, metrics.gc_metrics)


def test_text_format_as_prometheus_client():
    theirs, ours = both_registries()
    assert metrics.prometheus_text(ours) == prom_text(theirs)


def test_openmetrics_as_prometheus_client():
    theirs, ours = both_registries()
    assert metrics.openmetrics_text(ours) == prom_openmetrics(theirs)


@pytest.mark.parametrize(
    "accept",
    [
        "",
        "*/*",
        "text/plain",
        "text/plain; version=0.0.4",
        "text/plain;version=1.0.0",
        "text/plain; version=1.0.0; escaping=allow-utf-8",
        "application/openmetrics-text",
        "application/openmetrics-text; version=1.0.0",
        "application/openmetrics-text; version=0.0.1,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        "application/openmetrics-text;version=1.0.0;escaping=dots;q=0.9, text/plain;q=0.5",
        "application/openmetrics-text; version=2.0.0; escaping=bogus",
    ],
)
def test_the_format_accept_asks_for(accept):
    theirs, ours = both_registries()
    encoder, content_type = choose_encoder(accept)
    body, ct = metrics.render(ours, accept)
    assert ct == content_type
    assert body == encoder(theirs)


def test_process_series_as_prometheus_client():
    names = [(f.name, f.type, f.documentation, [s[0] for s in f.samples]) for f in metrics.process_metrics()]
    assert names == [
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            ["process_virtual_memory_bytes"],
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            ["process_resident_memory_bytes"],
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            ["process_start_time_seconds"],
        ),
        (
            "process_cpu_seconds",
            "counter",
            "Total user and system CPU time spent in seconds.",
            ["process_cpu_seconds_total"],
        ),
        ("process_open_fds", "gauge", "Number of open file descriptors.", ["process_open_fds"]),
        ("process_max_fds", "gauge", "Maximum number of open file descriptors.", ["process_max_fds"]),
    ]
