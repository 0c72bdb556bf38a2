"""The cluster view nsqadmin aggregates, as NSQ 1.3.0's ``internal/clusterinfo/types.go`` and
``internal/quantile/aggregate.go``: :class:`Producer`, :class:`TopicStats`,
:class:`ChannelStats`, :class:`ClientStats` and :class:`E2eAggregate`.

Each class reads the JSON that nsqd and nsqlookupd serve (``from_json``) and writes the JSON
nsqadmin serves (``to_json``): Go's field names and order, ``null`` where Go has a nil slice
or pointer, numbers as Go's encoder prints them. The ``add`` methods are Go's ``Add``: they
sum another node's figures into this object (and, as in Go, the object added keeps being
referenced, so aggregating a topic also folds the other nodes' channels into the first node's
channel objects: ``/api/topics/:topic`` shows what Go shows).
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

__all__ = [
    "ChannelStats",
    "ClientStats",
    "E2eAggregate",
    "Producer",
    "ProducerTopic",
    "TopicStats",
    "go_append",
    "go_number",
    "join_host_port",
    "semver",
    "sort_by_hostname",
]


def join_host_port(host: str, port: int) -> str:
    """Go's ``net.JoinHostPort``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def go_number(v: float) -> float | int:
    """A float64 as Go's JSON encoder prints it: integral values without ``.0``."""
    if isinstance(v, float) and math.isfinite(v) and v.is_integer() and abs(v) < 1e21:
        return int(v)
    return v


def go_append(lst: list[Any] | None, items: list[Any] | None) -> list[Any] | None:
    """Go's ``append(lst, items...)``: appending nothing to a nil slice keeps it nil."""
    if not items:
        return lst
    return [*(lst or ()), *items]


def sort_by_hostname(items: list[Any] | None) -> None:
    """Go's ``sort.Sort(…ByHost{…})`` (stable here; Go's is for the short lists it sorts)."""
    if items:
        items.sort(key=lambda x: x.hostname)


def _int(d: dict[str, Any], key: str) -> int:
    v = d.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return 0
    return int(v)


def _str(d: dict[str, Any], key: str) -> str:
    v = d.get(key, "")
    return v if isinstance(v, str) else ""


def _bool(d: dict[str, Any], key: str) -> bool:
    return d.get(key) is True


_SEMVER = re.compile(
    r"^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"
)


def semver(version: str) -> tuple[Any, ...]:
    """A sortable key of a semantic version (``blang/semver``); 0.0.0 when unparseable."""
    m = _SEMVER.match(version)
    if m is None:
        return (0, 0, 0, 1, ())
    major, minor, patch, pre = m.groups()
    if not pre:
        return (int(major), int(minor), int(patch), 1, ())
    ids = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return (int(major), int(minor), int(patch), 0, ids)


# --- e2e processing latency ---------------------------------------------------------------------


class E2eAggregate:
    """Go's ``quantile.E2eProcessingLatencyAggregate``: a count, and percentile maps with
    ``quantile``, ``min``, ``max``, ``average`` and ``count`` (plus nsqd's ``value`` on a
    node's own figures)."""

    __slots__ = ("addr", "channel", "count", "percentiles", "topic")

    def __init__(self, topic: str = "", channel: str = "", addr: str = "") -> None:
        self.count = 0
        self.percentiles: list[dict[str, float]] | None = None
        self.topic = topic
        self.channel = channel
        self.addr = addr

    @classmethod
    def from_json(cls, d: Any) -> E2eAggregate | None:
        if not isinstance(d, dict):
            return None
        e = cls(_str(d, "topic"), _str(d, "channel"), _str(d, "host"))
        e.count = _int(d, "count")
        raw = d.get("percentiles")
        if isinstance(raw, list):
            e.percentiles = []
            for p in raw:
                m = {k: float(v) for k, v in (p or {}).items() if isinstance(v, int | float)}
                value = m.get("value", 0.0)
                m["min"] = value
                m["max"] = value
                m["average"] = value
                m["count"] = float(e.count)
                e.percentiles.append(m)
        return e

    def add(self, other: E2eAggregate | None) -> None:
        """Go's ``Add`` (a new quantile starts from zeros, so its ``min`` stays 0, as in Go)."""
        self.addr = "*"
        if other is None:
            return
        self.count += other.count
        for value in other.percentiles or ():
            p = self.percentiles
            found = None
            for v in p or ():
                if v.get("quantile", 0.0) == value.get("quantile", 0.0):
                    found = v
                    break
            if found is None:
                found = {"quantile": value.get("quantile", 0.0)}
                self.percentiles = [*(p or ()), found]
            found["max"] = max(value.get("max", 0.0), found.get("max", 0.0))
            found["min"] = min(value.get("min", 0.0), found.get("min", 0.0))
            found["count"] = found.get("count", 0.0) + value.get("count", 0.0)
            if found["count"] == 0:
                found["average"] = 0.0
                continue
            avg = found.get("average", 0.0)
            found["average"] = (
                avg + (value.get("average", 0.0) - avg) * value.get("count", 0.0) / found["count"]
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "percentiles": None
            if self.percentiles is None
            else [{k: go_number(p[k]) for k in sorted(p)} for p in self.percentiles],
            "topic": self.topic,
            "channel": self.channel,
            "host": self.addr,
        }


def _e2e_json(e: E2eAggregate | None) -> dict[str, Any] | None:
    return None if e is None else e.to_json()


# --- producers ----------------------------------------------------------------------------------


class ProducerTopic:
    __slots__ = ("tombstoned", "topic")

    def __init__(self, topic: str, tombstoned: bool = False) -> None:
        self.topic = topic
        self.tombstoned = tombstoned

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "tombstoned": self.tombstoned}


class Producer:
    """One nsqd as nsqlookupd (``/nodes``, ``/lookup``) or nsqd itself (``/info``) describes
    it; ``remote_addresses`` lists ``<lookupd>/<remote address>`` per lookupd that knows it."""

    __slots__ = (
        "broadcast_address",
        "hostname",
        "http_port",
        "out_of_date",
        "remote_address",
        "remote_addresses",
        "tcp_port",
        "topics",
        "version",
        "version_key",
    )

    def __init__(
        self,
        *,
        remote_address: str = "",
        hostname: str = "",
        broadcast_address: str = "",
        tcp_port: int = 0,
        http_port: int = 0,
        version: str = "",
        topics: list[ProducerTopic] | None = None,
    ) -> None:
        self.remote_addresses: list[str] | None = None
        self.remote_address = remote_address
        self.hostname = hostname
        self.broadcast_address = broadcast_address
        self.tcp_port = tcp_port
        self.http_port = http_port
        self.version = version
        self.version_key = semver(version)
        self.topics = topics
        self.out_of_date = False

    @classmethod
    def from_lookupd_json(cls, d: dict[str, Any]) -> Producer:
        """Go's ``Producer.UnmarshalJSON``: ``topics`` paired with ``tombstones``."""
        names = d.get("topics")
        tombs = d.get("tombstones") or []
        topics: list[ProducerTopic] | None = None
        if isinstance(names, list) and names:
            topics = [
                ProducerTopic(str(t), bool(tombs[i]) if i < len(tombs) else False)
                for i, t in enumerate(names)
            ]
        return cls(
            remote_address=_str(d, "remote_address"),
            hostname=_str(d, "hostname"),
            broadcast_address=_str(d, "broadcast_address"),
            tcp_port=_int(d, "tcp_port"),
            http_port=_int(d, "http_port"),
            version=_str(d, "version"),
            topics=topics,
        )

    def address(self) -> str:
        return self.remote_address or "N/A"

    def http_address(self) -> str:
        return join_host_port(self.broadcast_address, self.http_port)

    def tcp_address(self) -> str:
        return join_host_port(self.broadcast_address, self.tcp_port)

    def to_json(self) -> dict[str, Any]:
        return {
            "remote_addresses": self.remote_addresses,
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
            "topics": None if self.topics is None else [t.to_json() for t in self.topics],
            "out_of_date": self.out_of_date,
        }


# --- clients, channels, topics ------------------------------------------------------------------


_CLIENT_FIELDS: tuple[tuple[str, str], ...] = (
    ("remote_address", "s"),
    ("version", "s"),
    ("client_id", "s"),
    ("hostname", "s"),
    ("user_agent", "s"),
    ("connect_ts", "i"),
    ("in_flight_count", "i"),
    ("ready_count", "i"),
    ("finish_count", "i"),
    ("requeue_count", "i"),
    ("message_count", "i"),
    ("sample_rate", "i"),
    ("deflate", "b"),
    ("snappy", "b"),
    ("authed", "b"),
    ("auth_identity", "s"),
    ("auth_identity_url", "s"),
    ("tls", "b"),
    ("tls_cipher_suite", "s"),
    ("tls_version", "s"),
    ("tls_negotiated_protocol", "s"),
    ("tls_negotiated_protocol_is_mutual", "b"),
)
_READERS = {"s": _str, "i": _int, "b": _bool}


class ClientStats:
    """One consumer connection (nsqd's ``ClientV2Stats``) plus the node it is connected to
    and ``connected``, the nanoseconds since ``connect_ts`` (Go's ``time.Duration``)."""

    __slots__ = ("connected", "node", "values")

    def __init__(self, node: str = "", values: dict[str, Any] | None = None) -> None:
        self.node = node
        self.values = values or {}
        now = int(time.time())
        self.connected = (now - int(self.values.get("connect_ts", 0))) * 1_000_000_000

    @property
    def hostname(self) -> str:
        return str(self.values.get("hostname", ""))

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClientStats:
        return cls("", {k: _READERS[t](d, k) for k, t in _CLIENT_FIELDS})

    def to_json(self) -> dict[str, Any]:
        v = self.values
        out: dict[str, Any] = {"node": self.node}
        for key, _ in _CLIENT_FIELDS[:6]:
            out[key] = v[key]
        out["connected"] = self.connected
        for key, _ in _CLIENT_FIELDS[6:]:
            out[key] = v[key]
        return out


def _list(d: dict[str, Any], key: str) -> list[Any] | None:
    v = d.get(key)
    return v if isinstance(v, list) else None


#: a queue's policy counters in nsqd's /stats (an nsqpy addition, where it has settings)
POLICY_COUNTS = ("expired_count", "dropped_count", "dead_letter_count")


def _policy(d: dict[str, Any]) -> dict[str, Any] | None:
    """A node's queue settings and counts, None when its /stats has none (Go's nsqd)."""
    if "expired_count" not in d:
        return None
    cfg = d.get("config")
    out: dict[str, Any] = {"config": cfg if isinstance(cfg, dict) else None}
    for key in POLICY_COUNTS:
        out[key] = _int(d, key)
    return out


def _add_policy(total: dict[str, Any] | None, a: dict[str, Any] | None) -> dict[str, Any] | None:
    """Sum ``a``'s counts into ``total`` (the settings are each node's own: not summed)."""
    if a is None:
        return total
    if total is None:
        total = {"config": None, **dict.fromkeys(POLICY_COUNTS, 0)}
    for key in POLICY_COUNTS:
        total[key] += a[key]
    return total


class ChannelStats:
    """Go's ``clusterinfo.ChannelStats``: one node's channel, or (``node == "*"``) the sum
    of several, with the per-node rows in ``nodes`` and every node's clients."""

    __slots__ = (
        "backend_depth",
        "channel_name",
        "client_count",
        "clients",
        "deferred_count",
        "depth",
        "e2e",
        "hostname",
        "in_flight_count",
        "memory_depth",
        "message_count",
        "node",
        "node_stats",
        "paused",
        "policy",
        "requeue_count",
        "timeout_count",
        "topic_name",
    )

    def __init__(self, node: str = "", topic_name: str = "", channel_name: str = "") -> None:
        self.node = node
        self.hostname = ""
        self.topic_name = topic_name
        self.channel_name = channel_name
        self.depth = 0
        self.memory_depth = 0
        self.backend_depth = 0
        self.in_flight_count = 0
        self.deferred_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.message_count = 0
        self.client_count = 0
        self.node_stats: list[ChannelStats] | None = None
        self.clients: list[ClientStats] | None = None
        self.paused = False
        self.e2e: E2eAggregate | None = None
        #: settings and counts (an nsqpy addition), None without
        self.policy: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ChannelStats:
        c = cls(channel_name=_str(d, "channel_name"))
        c.topic_name = _str(d, "topic_name")
        for key in (
            "depth",
            "memory_depth",
            "backend_depth",
            "in_flight_count",
            "deferred_count",
            "requeue_count",
            "timeout_count",
            "message_count",
            "client_count",
        ):
            setattr(c, key, _int(d, key))
        clients = _list(d, "clients")
        if clients is not None:
            c.clients = [ClientStats.from_json(x) for x in clients if isinstance(x, dict)]
        c.paused = _bool(d, "paused")
        c.e2e = E2eAggregate.from_json(d.get("e2e_processing_latency"))
        c.policy = _policy(d)
        return c

    def add(self, a: ChannelStats) -> None:
        """Go's ``ChannelStats.Add``."""
        self.node = "*"
        self.depth += a.depth
        self.memory_depth += a.memory_depth
        self.backend_depth += a.backend_depth
        self.in_flight_count += a.in_flight_count
        self.deferred_count += a.deferred_count
        self.requeue_count += a.requeue_count
        self.timeout_count += a.timeout_count
        self.message_count += a.message_count
        self.client_count += a.client_count
        self.policy = _add_policy(self.policy, a.policy)
        if a.paused:
            self.paused = True
        self.node_stats = [*(self.node_stats or ()), a]
        sort_by_hostname(self.node_stats)
        if self.e2e is None:
            self.e2e = E2eAggregate(self.topic_name, self.channel_name, self.node)
        self.e2e.add(a.e2e)
        self.clients = go_append(self.clients, a.clients)
        sort_by_hostname(self.clients)

    def to_json(self) -> dict[str, Any]:
        out = {
            "node": self.node,
            "hostname": self.hostname,
            "topic_name": self.topic_name,
            "channel_name": self.channel_name,
            "depth": self.depth,
            "memory_depth": self.memory_depth,
            "backend_depth": self.backend_depth,
            "in_flight_count": self.in_flight_count,
            "deferred_count": self.deferred_count,
            "requeue_count": self.requeue_count,
            "timeout_count": self.timeout_count,
            "message_count": self.message_count,
            "client_count": self.client_count,
            "nodes": None if self.node_stats is None else [c.to_json() for c in self.node_stats],
            "clients": None if self.clients is None else [c.to_json() for c in self.clients],
            "paused": self.paused,
            "e2e_processing_latency": _e2e_json(self.e2e),
        }
        if self.policy is not None:
            out["policy"] = self.policy
        return out


class TopicStats:
    """Go's ``clusterinfo.TopicStats``: one node's topic, or (``node == "*"``) the sum of
    several with the per-node rows in ``nodes`` and the channels summed across nodes."""

    __slots__ = (
        "backend_depth",
        "channels",
        "depth",
        "e2e",
        "hostname",
        "memory_depth",
        "message_count",
        "node",
        "node_stats",
        "paused",
        "policy",
        "topic_name",
    )

    def __init__(self, topic_name: str = "") -> None:
        self.node = ""
        self.hostname = ""
        self.topic_name = topic_name
        self.depth = 0
        self.memory_depth = 0
        self.backend_depth = 0
        self.message_count = 0
        self.node_stats: list[TopicStats] | None = None
        self.channels: list[ChannelStats] | None = None
        self.paused = False
        self.e2e: E2eAggregate | None = None
        #: settings and counts (an nsqpy addition), None without
        self.policy: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TopicStats:
        t = cls(_str(d, "topic_name"))
        t.depth = _int(d, "depth")
        t.memory_depth = _int(d, "memory_depth")
        t.backend_depth = _int(d, "backend_depth")
        t.message_count = _int(d, "message_count")
        channels = _list(d, "channels")
        if channels is not None:
            t.channels = [ChannelStats.from_json(c) for c in channels if isinstance(c, dict)]
        t.paused = _bool(d, "paused")
        t.e2e = E2eAggregate.from_json(d.get("e2e_processing_latency"))
        t.policy = _policy(d)
        return t

    def add(self, a: TopicStats) -> None:
        """Go's ``TopicStats.Add``."""
        self.node = "*"
        self.depth += a.depth
        self.memory_depth += a.memory_depth
        self.backend_depth += a.backend_depth
        self.message_count += a.message_count
        self.policy = _add_policy(self.policy, a.policy)
        if a.paused:
            self.paused = True
        for a_channel in a.channels or ():
            found = False
            for channel in self.channels or ():
                if a_channel.channel_name == channel.channel_name:
                    found = True
                    channel.add(a_channel)
            if not found:
                self.channels = [*(self.channels or ()), a_channel]
        self.node_stats = [*(self.node_stats or ()), a]
        sort_by_hostname(self.node_stats)
        if self.e2e is None:
            self.e2e = E2eAggregate(self.topic_name, "", self.node)
        self.e2e.add(a.e2e)

    def to_json(self) -> dict[str, Any]:
        out = {
            "node": self.node,
            "hostname": self.hostname,
            "topic_name": self.topic_name,
            "depth": self.depth,
            "memory_depth": self.memory_depth,
            "backend_depth": self.backend_depth,
            "message_count": self.message_count,
            "nodes": None if self.node_stats is None else [t.to_json() for t in self.node_stats],
            "channels": None if self.channels is None else [c.to_json() for c in self.channels],
            "paused": self.paused,
            "e2e_processing_latency": _e2e_json(self.e2e),
        }
        if self.policy is not None:
            out["policy"] = self.policy
        return out
