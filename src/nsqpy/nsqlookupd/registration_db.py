"""nsqlookupd's registration database, as a pure data structure (no I/O, no clock reads).

As Go's ``nsqlookupd/registration_db.go``: a map from :class:`Registration` (category
``"client"``, ``"topic"`` or ``"channel"``; key; subkey) to the producers registered under
it, keyed by the peer id (the nsqd connection's remote address). A producer wraps the
peer's :class:`PeerInfo` and carries its own tombstone, so a node tombstoned for one topic
stays listed for the others. Registrations outlive their producers (a topic stays known
after its last nsqd leaves) unless removed through the HTTP API, or they are ``#ephemeral``
and their last producer leaves (UNREGISTER, or its connection drops).

``find_*`` take ``"*"`` for key or subkey as a wildcard, exactly like Go (so ``"*"`` can
never be looked up literally). Times are integer nanoseconds since the epoch (``now`` is
passed in); durations are float seconds, as in the daemon's options.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..protocol.names import is_ephemeral

__all__ = [
    "GO_ZERO_TIME_UNIX_NANO",
    "PeerInfo",
    "Producer",
    "Registration",
    "RegistrationDB",
    "filter_by_active",
    "filter_registrations",
    "keys",
    "subkeys",
]

#: ``time.Time{}.UnixNano()`` in Go (int64 overflow of year 1): ``/debug``'s
#: ``tombstoned_at`` of a producer never tombstoned.
GO_ZERO_TIME_UNIX_NANO = -6795364578871345152

CLIENT = "client"
TOPIC = "topic"
CHANNEL = "channel"


def _ns(seconds: float) -> int:
    return round(seconds * 1_000_000_000)


class Registration(NamedTuple):
    category: str
    key: str
    subkey: str

    def is_match(self, category: str, key: str, subkey: str) -> bool:
        """Go's ``Registration.IsMatch``: ``"*"`` matches any key or subkey."""
        if category != self.category:
            return False
        if key != "*" and self.key != key:
            return False
        return subkey == "*" or self.subkey == subkey


@dataclass(slots=True, eq=False)
class PeerInfo:
    """One identified nsqd connection (Go's ``PeerInfo``)."""

    id: str
    remote_address: str = ""
    hostname: str = ""
    broadcast_address: str = ""
    tcp_port: int = 0
    http_port: int = 0
    version: str = ""
    #: wall-clock ns of the IDENTIFY or the last PING
    last_update: int = 0

    def to_json(self) -> dict[str, Any]:
        """The PeerInfo JSON of ``/lookup`` (Go's field order)."""
        return {
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
        }


@dataclass(slots=True, eq=False)
class Producer:
    """A peer registered under one registration, with that registration's tombstone."""

    peer_info: PeerInfo
    tombstoned: bool = False
    tombstoned_at: int = GO_ZERO_TIME_UNIX_NANO

    def tombstone(self, now: int) -> None:
        self.tombstoned = True
        self.tombstoned_at = now

    def is_tombstoned(self, lifetime: float, now: int) -> bool:
        """Tombstoned less than ``lifetime`` seconds ago."""
        return self.tombstoned and now - self.tombstoned_at < _ns(lifetime)

    def __repr__(self) -> str:
        p = self.peer_info
        return f"{p.broadcast_address} [{p.tcp_port}, {p.http_port}]"


def _leaves_with_last_producer(k: Registration) -> bool:
    """An ``#ephemeral`` channel, or an ``#ephemeral`` topic's own key: removed when its last
    producer goes. On UNREGISTER this is Go's rule; on a dropped connection Go 1.3 keeps the
    empty registration (listed by ``/channels`` and ``/lookup`` until an HTTP delete), we
    apply the same rule so an ephemeral channel never outlives its last nsqd."""
    if k.category == CHANNEL:
        return is_ephemeral(k.subkey)
    return k.category == TOPIC and is_ephemeral(k.key)


def filter_by_active(
    producers: Iterable[Producer], inactivity_timeout: float, tombstone_lifetime: float, now: int
) -> list[Producer]:
    """Go's ``Producers.FilterByActive``: drop producers whose peer has not PINGed for more
    than ``inactivity_timeout`` seconds, and those tombstoned within ``tombstone_lifetime``."""
    timeout = _ns(inactivity_timeout)
    return [
        p
        for p in producers
        if not (now - p.peer_info.last_update > timeout or p.is_tombstoned(tombstone_lifetime, now))
    ]


def filter_registrations(
    regs: Iterable[Registration], category: str, key: str, subkey: str
) -> list[Registration]:
    return [r for r in regs if r.is_match(category, key, subkey)]


def keys(regs: Iterable[Registration]) -> list[str]:
    return [r.key for r in regs]


def subkeys(regs: Iterable[Registration]) -> list[str]:
    return [r.subkey for r in regs]


class RegistrationDB:
    """Registration → {peer id → Producer}."""

    __slots__ = ("_map",)

    def __init__(self) -> None:
        self._map: dict[Registration, dict[str, Producer]] = {}

    # --- Go's primitives ------------------------------------------------------------------

    def add_registration(self, k: Registration) -> None:
        """Make ``k`` known (with no producers if it was not)."""
        self._map.setdefault(k, {})

    def add_producer(self, k: Registration, p: Producer) -> bool:
        """Add ``p`` under ``k`` unless its peer is already there; True if added."""
        producers = self._map.setdefault(k, {})
        pid = p.peer_info.id
        if pid in producers:
            return False
        producers[pid] = p
        return True

    def remove_producer(self, k: Registration, peer_id: str) -> tuple[bool, int]:
        """Remove the peer's producer from ``k``: (whether it was there, producers left).
        The registration itself stays, even when empty."""
        producers = self._map.get(k)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        return removed, len(producers)

    def remove_registration(self, k: Registration) -> None:
        """Forget ``k`` and all its producers."""
        self._map.pop(k, None)

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        if key != "*" and subkey != "*":
            k = Registration(category, key, subkey)
            return [k] if k in self._map else []
        return [k for k in self._map if k.is_match(category, key, subkey)]

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        """Producers under the matching registrations, one per peer (the first found)."""
        if key != "*" and subkey != "*":
            return list(self._map.get(Registration(category, key, subkey), {}).values())
        seen: set[str] = set()
        out: list[Producer] = []
        for k, producers in self._map.items():
            if not k.is_match(category, key, subkey):
                continue
            for pid, p in producers.items():
                if pid not in seen:
                    seen.add(pid)
                    out.append(p)
        return out

    def lookup_registrations(self, peer_id: str) -> list[Registration]:
        """Every registration the peer is a producer of."""
        return [k for k, producers in self._map.items() if peer_id in producers]

    def items(self) -> Iterator[tuple[Registration, list[Producer]]]:
        """Every registration with its producers (for ``/debug``)."""
        for k, producers in self._map.items():
            yield k, list(producers.values())

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, k: object) -> bool:
        return k in self._map

    # --- what the TCP protocol does -------------------------------------------------------

    def identify(self, peer: PeerInfo) -> bool:
        """IDENTIFY: the peer becomes a producer of the ``client`` registration."""
        return self.add_producer(Registration(CLIENT, "", ""), Producer(peer))

    def register(self, peer: PeerInfo, topic: str, channel: str = "") -> list[Registration]:
        """REGISTER: the topic, and the channel if given; returns the registrations that
        gained this producer."""
        added = []
        if channel:
            k = Registration(CHANNEL, topic, channel)
            if self.add_producer(k, Producer(peer)):
                added.append(k)
        k = Registration(TOPIC, topic, "")
        if self.add_producer(k, Producer(peer)):
            added.append(k)
        return added

    def unregister(
        self, peer: PeerInfo, topic: str, channel: str = ""
    ) -> tuple[list[Registration], list[Registration]]:
        """UNREGISTER a channel, or a topic with all its channels.

        A ``#ephemeral`` channel (or topic, for a topic UNREGISTER) left without producers is
        removed. Returns (registrations this producer left, of which the channel ones were
        unexpected for a topic UNREGISTER — Go warns about those).
        """
        removed: list[Registration] = []
        unexpected: list[Registration] = []
        if channel:
            k = Registration(CHANNEL, topic, channel)
            was, left = self.remove_producer(k, peer.id)
            if was:
                removed.append(k)
            if left == 0 and is_ephemeral(channel):
                self.remove_registration(k)
            return removed, unexpected
        for k in self.find_registrations(CHANNEL, topic, "*"):
            was, _ = self.remove_producer(k, peer.id)
            if was:
                removed.append(k)
                unexpected.append(k)
        k = Registration(TOPIC, topic, "")
        was, left = self.remove_producer(k, peer.id)
        if was:
            removed.append(k)
        if left == 0 and is_ephemeral(topic):
            self.remove_registration(k)
        return removed, unexpected

    def remove_peer(self, peer_id: str) -> list[Registration]:
        """The connection closed: remove the peer from every registration. Durable ones stay;
        an ``#ephemeral`` channel or topic this peer was the last producer of is removed, as
        UNREGISTER does (Go 1.3 keeps those, empty, until an HTTP delete: see
        ``_leaves_with_last_producer``). Returns the registrations the peer left."""
        out = []
        for k in self.lookup_registrations(peer_id):
            was, left = self.remove_producer(k, peer_id)
            if was:
                out.append(k)
            if left == 0 and _leaves_with_last_producer(k):
                self.remove_registration(k)
        return out

    # --- what the HTTP API does ---------------------------------------------------------

    def topics(self) -> list[str]:
        """``/topics``."""
        return keys(self.find_registrations(TOPIC, "*", ""))

    def channels(self, topic: str) -> list[str]:
        """``/channels?topic=``."""
        return subkeys(self.find_registrations(CHANNEL, topic, "*"))

    def lookup(
        self, topic: str, inactivity_timeout: float, tombstone_lifetime: float, now: int
    ) -> tuple[list[str], list[PeerInfo]] | None:
        """``/lookup?topic=``: (channels, active non-tombstoned producers), None if the topic
        is not registered."""
        if not self.find_registrations(TOPIC, topic, ""):
            return None
        producers = filter_by_active(
            self.find_producers(TOPIC, topic, ""), inactivity_timeout, tombstone_lifetime, now
        )
        return self.channels(topic), [p.peer_info for p in producers]

    def create_topic(self, topic: str) -> None:
        self.add_registration(Registration(TOPIC, topic, ""))

    def delete_topic(self, topic: str) -> list[Registration]:
        """Remove the topic's channel registrations, then the topic's; returns them."""
        regs = self.find_registrations(CHANNEL, topic, "*")
        regs += self.find_registrations(TOPIC, topic, "")
        for k in regs:
            self.remove_registration(k)
        return regs

    def create_channel(self, topic: str, channel: str) -> None:
        self.add_registration(Registration(CHANNEL, topic, channel))
        self.add_registration(Registration(TOPIC, topic, ""))

    def delete_channel(self, topic: str, channel: str) -> bool:
        """False if the channel is not registered (HTTP 404 ``CHANNEL_NOT_FOUND``)."""
        regs = self.find_registrations(CHANNEL, topic, channel)
        for k in regs:
            self.remove_registration(k)
        return bool(regs)

    def tombstone_topic_producer(self, topic: str, node: str, now: int) -> int:
        """Tombstone the topic's producers whose ``broadcast_address:http_port`` is ``node``;
        returns how many."""
        n = 0
        for p in self.find_producers(TOPIC, topic, ""):
            info = p.peer_info
            if f"{info.broadcast_address}:{info.http_port}" == node:
                p.tombstone(now)
                n += 1
        return n

    def nodes(self, inactivity_timeout: float, tombstone_lifetime: float, now: int) -> list[dict[str, Any]]:
        """``/nodes``: every active identified peer with its topics and, per topic, whether
        its producer is tombstoned (tombstoned peers are listed too)."""
        out = []
        for p in filter_by_active(self.find_producers(CLIENT, "", ""), inactivity_timeout, 0, now):
            info = p.peer_info
            topics = keys(filter_registrations(self.lookup_registrations(info.id), TOPIC, "*", ""))
            tombstones = []
            for t in topics:
                flag = False
                for tp in self.find_producers(TOPIC, t, ""):
                    if tp.peer_info is info:
                        flag = tp.is_tombstoned(tombstone_lifetime, now)
                tombstones.append(flag)
            node = info.to_json()
            node["tombstones"] = tombstones
            node["topics"] = topics
            out.append(node)
        return out

    def debug(self) -> dict[str, list[dict[str, Any]]]:
        """``/debug``: ``category:key:subkey`` → producers (registrations without producers
        are left out), keys sorted as Go's JSON encoding of a map does."""
        data: dict[str, list[dict[str, Any]]] = {}
        for k, producers in self._map.items():
            if not producers:
                continue
            entries = data.setdefault(f"{k.category}:{k.key}:{k.subkey}", [])
            for p in producers.values():
                info = p.peer_info
                entries.append(
                    {
                        "broadcast_address": info.broadcast_address,
                        "hostname": info.hostname,
                        "http_port": info.http_port,
                        "id": info.id,
                        "last_update": info.last_update,
                        "tcp_port": info.tcp_port,
                        "tombstoned": p.tombstoned,
                        "tombstoned_at": p.tombstoned_at,
                        "version": info.version,
                    }
                )
        return dict(sorted(data.items()))
