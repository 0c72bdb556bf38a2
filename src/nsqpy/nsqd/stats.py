"""nsqd statistics: the ``/stats`` JSON documents and text report, and memory/GC numbers.

Shapes follow NSQ 1.3.0 (``nsqd/stats.go``, ``doStats``/``printStats`` in ``nsqd/http.go``):
field names and their order, topics and channels sorted by name, the filters, and where Go
emits ``null`` rather than ``[]``. The same functions serve ``/stats``, statsd
(:mod:`nsqpy.nsqd.statsd`) and the Prometheus collector (:mod:`nsqpy.metrics`).

Memory figures are cheap Python stand-ins for Go's ``runtime.MemStats`` (see
:func:`mem_stats`); GC pauses are measured by a ``gc.callbacks`` hook installed once per
process by :func:`install_gc_tracker` (two clock reads per collection, nothing per message).
"""

from __future__ import annotations

import gc
import math
import os
import sys
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from .. import NSQ_VERSION
from ..goflags import format_duration_ns
from .policy import CHANNEL_KEYS, TOPIC_KEYS, Policy
from .quantile import NO_RESULT

if TYPE_CHECKING:
    from .channel import Channel, Consumer
    from .nsqd import NSQD
    from .quantile import Quantile
    from .topic import Topic

#: ``ClientV2Stats`` JSON keys in Go's struct order (NSQ 1.3.0).
CLIENT_KEYS = (
    "client_id",
    "hostname",
    "version",
    "remote_address",
    "state",
    "ready_count",
    "in_flight_count",
    "message_count",
    "finish_count",
    "requeue_count",
    "connect_ts",
    "sample_rate",
    "deflate",
    "snappy",
    "user_agent",
    "authed",
    "auth_identity",
    "auth_identity_url",
    "pub_counts",
    "tls",
    "tls_cipher_suite",
    "tls_version",
    "tls_negotiated_protocol",
    "tls_negotiated_protocol_is_mutual",
)
_CLIENT_KEY_SET = frozenset(CLIENT_KEYS)
#: Keys tagged ``omitempty`` in Go: dropped when false/empty.
_CLIENT_OMITEMPTY = frozenset({"authed", "auth_identity", "auth_identity_url", "pub_counts"})

#: ``memStats`` JSON keys in Go's order.
MEM_KEYS = (
    "heap_objects",
    "heap_idle_bytes",
    "heap_in_use_bytes",
    "heap_released_bytes",
    "gc_pause_usec_100",
    "gc_pause_usec_99",
    "gc_pause_usec_95",
    "next_gc_bytes",
    "gc_total_runs",
)

#: Values accepted by Go's ``boolParams`` (``include_clients``, ``include_mem``, ``binary``).
BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}


# --- Go encodings -------------------------------------------------------------------------------


#: Go's ``time.Duration.String()`` of nanoseconds (``"1h2m3.5s"``, ``"1.5ms"``, ``"0s"``).
go_duration = format_duration_ns


def rfc3339(ts: float) -> str:
    """Go's ``time.Time.Format(time.RFC3339)`` in local time (``Z`` when the offset is 0)."""
    t = time.localtime(math.floor(ts))
    secs = t.tm_gmtoff or 0
    if secs == 0:
        zone = "Z"
    else:
        sign = "+" if secs > 0 else "-"
        hh, mm = divmod(abs(secs) // 60, 60)
        zone = f"{sign}{hh:02d}:{mm:02d}"
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + zone


def nanoseconds_to_human(v: float) -> str:
    """NSQ's ``stringy.NanoSecondToHuman`` (used for e2e percentiles in the text report)."""
    if v > 1e9:
        v, suffix = v / 1e9, "s"
    elif v > 1e6:
        v, suffix = v / 1e6, "ms"
    elif v > 1e3:
        v, suffix = v / 1e3, "us"
    else:
        suffix = "ns"
    return f"{v:0.1f}{suffix}"


# --- e2e processing latency -------------------------------------------------------------------


def e2e_result(stream: Quantile | None = None, now_ns: int | None = None) -> dict[str, Any]:
    """A channel's ``quantile.Result`` JSON (see :mod:`nsqpy.nsqd.quantile`). Without
    ``--e2e-processing-latency-percentile`` Go's stream is nil and its ``Result()`` is the
    zero value, ``{"count": 0, "percentiles": null}``."""
    if stream is None:
        return dict(NO_RESULT)
    return stream.result(time.time_ns() if now_ns is None else now_ns)


def _e2e_text(result: dict[str, Any]) -> str:
    pcts = result.get("percentiles") or ()
    return ", ".join(nanoseconds_to_human(p["value"]) for p in pcts)


# --- topics, channels, clients ----------------------------------------------------------------


def client_stats(client: Consumer, topic_filter: str = "") -> dict[str, Any]:
    """A client's ``ClientV2Stats`` in Go's key order, ``omitempty`` applied.

    With a topic filter, ``pub_counts`` keeps only that topic (as Go's ``Stats(topic)``).
    Unlike Go 1.3.0, which stops after the first map entry, every topic is listed.
    """
    raw = client.stats()
    pcs = raw.get("pub_counts") or []
    if topic_filter:
        pcs = [p for p in pcs if p["topic"] == topic_filter]
    raw["pub_counts"] = pcs
    out: dict[str, Any] = {}
    for key in CLIENT_KEYS:
        if key in raw:
            v = raw[key]
            if key in _CLIENT_OMITEMPTY and not v:
                continue
            out[key] = v
    for key, v in raw.items():  # fields added later (e.g. topology) keep coming through
        if key not in _CLIENT_KEY_SET:
            out[key] = v
    return out


def channel_stats(
    channel: Channel,
    include_clients: bool = True,
    topic_filter: str = "",
    now_ns: int | None = None,
) -> dict[str, Any]:
    clients = channel.clients
    out = {
        "channel_name": channel.name,
        "depth": channel.depth,
        "backend_depth": channel.backend_depth,
        "in_flight_count": len(channel.in_flight),
        "deferred_count": channel.deferred_count,
        "message_count": channel.message_count,
        "requeue_count": channel.requeue_count,
        "timeout_count": channel.timeout_count,
        "client_count": len(clients),
        "clients": (
            [client_stats(c, topic_filter) for c in list(clients.values())] if include_clients else None
        ),
        "paused": channel.paused,
        "e2e_processing_latency": e2e_result(channel.e2e, now_ns),
    }
    if (
        channel.policy is not None
        or channel.expired_count
        or channel.dropped_count
        or channel.dead_letter_count
    ):
        out["config"] = (channel.policy or Policy()).to_json(CHANNEL_KEYS)
        out["expired_count"] = channel.expired_count
        out["dropped_count"] = channel.dropped_count
        out["dead_letter_count"] = channel.dead_letter_count
    return out


def topic_stats(topic: Topic, channels: list[dict[str, Any]], now_ns: int | None = None) -> dict[str, Any]:
    out = {
        "topic_name": topic.name,
        "channels": channels,
        "depth": topic.depth,
        "backend_depth": topic.backend_depth,
        "message_count": topic.message_count,
        "message_bytes": topic.message_bytes,
        "paused": topic.paused,
        # Go aggregates all the topic's channels' streams (whatever the channel filter);
        # without any it is nil
        "e2e_processing_latency": topic.e2e_processing_latency(time.time_ns() if now_ns is None else now_ns),
    }
    # a queue's settings and what they did (an nsqpy addition), only where it has any
    if topic.policy is not None or topic.expired_count or topic.dropped_count:
        out["config"] = (topic.policy or Policy()).to_json(TOPIC_KEYS)
        out["expired_count"] = topic.expired_count
        out["dropped_count"] = topic.dropped_count
    return out


def get_stats(
    nsqd: NSQD, topic: str = "", channel: str = "", include_clients: bool = True
) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]:
    """``(topics, producers)`` as Go's ``NSQD.GetStats``.

    - topics sorted by name; a ``topic`` filter naming no topic gives ``(None, None)``;
    - a ``channel`` filter drops topics that lack that channel;
    - ``producers`` is None without ``include_clients`` or when there are none (Go's nil
      slice, JSON ``null``); ``clients`` is None without ``include_clients``.
    """
    if topic:
        t = nsqd.topics.get(topic)
        if t is None:
            return None, None
        topics = [t]
    else:
        topics = sorted(nsqd.topics.values(), key=lambda t: t.name)
    out = []
    now_ns = time.time_ns()
    for t in topics:
        if channel:
            c = t.channels.get(channel)
            if c is None:
                continue
            chans = [c]
        else:
            chans = sorted(t.channels.values(), key=lambda c: c.name)
        out.append(topic_stats(t, [channel_stats(c, include_clients, topic, now_ns) for c in chans], now_ns))
    producers = None
    if include_clients:
        found = [client_stats(c, topic) for c in list(nsqd.clients.values()) if c.pub_counts]
        producers = found or None
    return out, producers


def stats_document(
    nsqd: NSQD,
    topic: str = "",
    channel: str = "",
    include_clients: bool = True,
    include_mem: bool = True,
) -> dict[str, Any]:
    """The ``/stats?format=json`` document, keys in Go's order."""
    topics, producers = get_stats(nsqd, topic, channel, include_clients)
    doc: dict[str, Any] = {
        "version": NSQ_VERSION,
        "health": nsqd.health(),
        "start_time": nsqd.start_time,
        "topics": topics,
    }
    if include_mem:
        doc["memory"] = mem_stats()
    doc["producers"] = producers
    return doc


# --- text report ------------------------------------------------------------------------------


def _client_line(s: dict[str, Any], now: float) -> str:
    """Go's ``ClientV2Stats.String()``."""
    connected = go_duration(max(int(now - s["connect_ts"]), 0) * 1_000_000_000)
    addr = s.get("remote_address", "")
    port = addr.rpartition(":")[2] if ":" in addr else ""
    ident = f"{s.get('hostname', '')}:{port} {s.get('user_agent', '')}"
    pcs = s.get("pub_counts")
    if pcs:
        total = sum(p["count"] for p in pcs)
        topics = ",".join(f"{p['topic']}={p['count']}" for p in pcs)
        return f"[{s['version']} {ident:<21}] msgs: {total:<8d} topics: {topics} connected: {connected}"
    return (
        f"[{s['version']} {ident:<21}] state: {s['state']} inflt: {s['in_flight_count']:<4d} "
        f"rdy: {s['ready_count']:<4d} fin: {s['finish_count']:<8d} "
        f"re-q: {s['requeue_count']:<8d} msgs: {s['message_count']:<8d} connected: {connected}"
    )


def _policy_line(s: dict[str, Any]) -> str:
    """A queue's settings and counters (an nsqpy addition to Go's report)."""
    settings = " ".join(f"{k}={v}" for k, v in s["config"].items() if v is not None)
    counts = f"expired: {s['expired_count']} dropped: {s['dropped_count']}"
    if "dead_letter_count" in s:
        counts += f" dead-letters: {s['dead_letter_count']}"
    return f"policy: {settings or '-'} {counts}"


def stats_text(
    nsqd: NSQD,
    topic: str = "",
    channel: str = "",
    include_clients: bool = True,
    include_mem: bool = True,
) -> str:
    """The plain-text ``/stats`` report, laid out as Go's ``printStats``."""
    from ..daemon import version_string

    topics, producers = get_stats(nsqd, topic, channel, include_clients)
    now = time.time()
    w: list[str] = []
    w.append(f"{version_string('nsqd')}\n")
    w.append(f"start_time {rfc3339(nsqd.start_time)}\n")
    w.append(f"uptime {go_duration(max(time.time_ns() - nsqd.start_time_ns, 0))}\n")
    w.append(f"\nHealth: {nsqd.health()}\n")
    if include_mem:
        w.append("\nMemory:\n")
        for key, value in mem_stats().items():
            w.append(f"   {key:<25}\t{value}\n")
    if not topics:
        w.append("\nTopics: None\n")
    else:
        w.append("\nTopics:")
    for t in topics or ():
        prefix = "*P " if t["paused"] else "   "
        w.append(
            f"\n{prefix}[{t['topic_name']:<15}] depth: {t['depth']:<5d} "
            f"be-depth: {t['backend_depth']:<5d} msgs: {t['message_count']:<8d} "
            f"e2e%: {_e2e_text(t['e2e_processing_latency'])}\n"
        )
        if "config" in t:
            w.append(f"      {_policy_line(t)}\n")
        for c in t["channels"]:
            prefix = "   *P " if c["paused"] else "      "
            w.append(
                f"{prefix}[{c['channel_name']:<25}] depth: {c['depth']:<5d} "
                f"be-depth: {c['backend_depth']:<5d} inflt: {c['in_flight_count']:<4d} "
                f"def: {c['deferred_count']:<4d} re-q: {c['requeue_count']:<5d} "
                f"timeout: {c['timeout_count']:<5d} msgs: {c['message_count']:<8d} "
                f"e2e%: {_e2e_text(c['e2e_processing_latency'])}\n"
            )
            if "config" in c:
                w.append(f"         {_policy_line(c)}\n")
            for cl in c["clients"] or ():
                w.append(f"        {_client_line(cl, now)}\n")
    if not producers:
        w.append("\nProducers: None\n")
    else:
        w.append("\nProducers:\n")
        for p in producers:
            w.append(f"   {_client_line(p, now)}\n")
    return "".join(w)


# --- memory and GC ------------------------------------------------------------------------------

#: The last 256 GC pauses in ns (Go's ``MemStats.PauseNs`` ring is 256 long too).
_gc_pauses: deque[int] = deque(maxlen=256)
_gc_started = 0
_gc_tracker_installed = False


def _gc_callback(phase: str, info: dict[str, int]) -> None:
    global _gc_started
    if phase == "start":
        _gc_started = time.perf_counter_ns()
    elif _gc_started:
        _gc_pauses.append(time.perf_counter_ns() - _gc_started)
        _gc_started = 0


def install_gc_tracker() -> None:
    """Start recording GC pause times for the ``gc_pause_usec_*`` stats (idempotent)."""
    global _gc_tracker_installed
    if not _gc_tracker_installed:
        gc.callbacks.append(_gc_callback)
        _gc_tracker_installed = True


def _percentile(perc: float, arr: list[int]) -> int:
    """NSQ's ``percentile``: nearest rank over an ascending slice, 0 when empty."""
    n = len(arr)
    if n == 0:
        return 0
    i = math.floor(perc / 100.0 * n + 0.5)
    return arr[min(i, n - 1)]


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss_bytes() -> int:
    """Resident set size: ``/proc/self/statm`` on Linux, else peak RSS from getrusage."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        try:
            import resource

            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return rss if sys.platform == "darwin" else rss * 1024
        except (ImportError, OSError):  # pragma: no cover
            return 0


def mem_stats() -> dict[str, int]:
    """Go's ``memStats`` with cheap Python equivalents (all O(1)-ish, no heap walk):

    - ``heap_objects``: ``sys.getallocatedblocks()`` (live pymalloc blocks);
    - ``heap_in_use_bytes``: the process RSS;
    - ``heap_idle_bytes``, ``heap_released_bytes``, ``next_gc_bytes``: 0 (no equivalent:
      CPython neither reports idle heap spans nor triggers GC by heap size);
    - ``gc_pause_usec_100/99/95``: percentiles of the last 256 collection pauses, in µs;
    - ``gc_total_runs``: collections of all generations (``gc.get_stats()``).
    """
    pauses = sorted(_gc_pauses)
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": 0,
        "heap_in_use_bytes": _rss_bytes(),
        "heap_released_bytes": 0,
        "gc_pause_usec_100": _percentile(100.0, pauses) // 1000,
        "gc_pause_usec_99": _percentile(99.0, pauses) // 1000,
        "gc_pause_usec_95": _percentile(95.0, pauses) // 1000,
        "next_gc_bytes": 0,
        "gc_total_runs": sum(s.get("collections", 0) for s in gc.get_stats()),
    }
