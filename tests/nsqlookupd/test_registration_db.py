"""The registration DB as a pure data structure (Go's ``nsqlookupd/registration_db.go`` and
what ``lookup_protocol_v1.go``/``http.go`` do with it), with explicit ``now`` values."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from nsqpy.nsqlookupd.registration_db import (
    GO_ZERO_TIME_UNIX_NANO,
    PeerInfo,
    Producer,
    Registration,
    RegistrationDB,
    filter_by_active,
    filter_registrations,
    keys,
    subkeys,
)

pytestmark = pytest.mark.timeout(60)

S = 1_000_000_000
NOW = 1_700_000_000 * S


def peer(n: int, last_update: int = NOW, **kw) -> PeerInfo:
    fields = dict(broadcast_address=f"host{n}", tcp_port=4150 + n, http_port=5150 + n, version="1.3.0")
    fields.update(kw)
    return PeerInfo(id=f"127.0.0.1:{1000 + n}", last_update=last_update, **fields)


# --- Go's primitives ------------------------------------------------------------------------


def test_add_producer_once_per_peer_and_remove():
    db = RegistrationDB()
    k = Registration("topic", "t", "")
    a, b = peer(1), peer(2)
    assert db.add_producer(k, Producer(a)) is True
    assert db.add_producer(k, Producer(a)) is False  # same peer id: kept, not replaced
    assert db.add_producer(k, Producer(b)) is True
    assert [p.peer_info for p in db.find_producers("topic", "t", "")] == [a, b]
    assert db.remove_producer(k, a.id) == (True, 1)
    assert db.remove_producer(k, a.id) == (False, 1)
    assert db.remove_producer(k, b.id) == (True, 0)
    # the registration outlives its producers
    assert db.find_registrations("topic", "t", "") == [k]
    assert db.remove_producer(Registration("topic", "nope", ""), a.id) == (False, 0)


def test_add_producer_keeps_the_existing_producer_and_its_tombstone():
    db = RegistrationDB()
    k = Registration("topic", "t", "")
    a = peer(1)
    first = Producer(a)
    db.add_producer(k, first)
    first.tombstone(NOW)
    db.add_producer(k, Producer(a))
    assert db.find_producers("topic", "t", "") == [first]
    assert first.is_tombstoned(45, NOW + S)


def test_add_and_remove_registration():
    db = RegistrationDB()
    k = Registration("channel", "t", "c")
    db.add_registration(k)
    db.add_registration(k)
    assert k in db and len(db) == 1
    assert db.find_producers("channel", "t", "c") == []
    db.add_producer(k, Producer(peer(1)))
    db.add_registration(k)  # does not drop producers
    assert len(db.find_producers("channel", "t", "c")) == 1
    db.remove_registration(k)
    db.remove_registration(k)
    assert k not in db and len(db) == 0


def test_find_registrations_wildcards_like_go():
    db = RegistrationDB()
    regs = [
        Registration("topic", "a", ""),
        Registration("topic", "b", ""),
        Registration("channel", "a", "x"),
        Registration("channel", "a", "y"),
        Registration("channel", "b", "x"),
    ]
    for r in regs:
        db.add_registration(r)
    assert db.find_registrations("topic", "*", "") == regs[:2]
    assert db.find_registrations("channel", "a", "*") == regs[2:4]
    assert db.find_registrations("channel", "*", "x") == [regs[2], regs[4]]
    assert db.find_registrations("channel", "*", "*") == regs[2:]
    assert db.find_registrations("channel", "a", "x") == [regs[2]]
    assert db.find_registrations("channel", "a", "z") == []
    assert db.find_registrations("topic", "a", "*") == [regs[0]]  # subkey "" matches *
    assert db.find_registrations("nope", "*", "*") == []


def test_find_producers_dedups_peers_across_registrations():
    db = RegistrationDB()
    a, b = peer(1), peer(2)
    db.add_producer(Registration("channel", "t", "x"), Producer(a))
    db.add_producer(Registration("channel", "t", "y"), Producer(a))
    db.add_producer(Registration("channel", "t", "y"), Producer(b))
    found = db.find_producers("channel", "t", "*")
    assert [p.peer_info for p in found] == [a, b]
    assert db.find_producers("channel", "t", "z") == []


def test_lookup_registrations_of_a_peer():
    db = RegistrationDB()
    a, b = peer(1), peer(2)
    db.identify(a)
    db.register(a, "t", "c")
    db.register(b, "u")
    assert db.lookup_registrations(a.id) == [
        Registration("client", "", ""),
        Registration("channel", "t", "c"),
        Registration("topic", "t", ""),
    ]
    assert db.lookup_registrations("nobody") == []


def test_registrations_helpers():
    regs = [Registration("topic", "a", ""), Registration("channel", "a", "x")]
    assert filter_registrations(regs, "topic", "*", "") == regs[:1]
    assert keys(regs) == ["a", "a"]
    assert subkeys(regs) == ["", "x"]
    assert Registration("channel", "a", "x").is_match("channel", "*", "*")
    assert not Registration("channel", "a", "x").is_match("topic", "*", "*")


# --- activity and tombstones ------------------------------------------------------------------


def test_filter_by_active_inactivity_timeout():
    fresh = Producer(peer(1, last_update=NOW - 300 * S))
    stale = Producer(peer(2, last_update=NOW - 300 * S - 1))
    assert filter_by_active([fresh, stale], 300, 45, NOW) == [fresh]
    assert filter_by_active([fresh, stale], 0.5, 45, NOW - 300 * S + S // 2) == [fresh]
    assert filter_by_active([fresh, stale], 1, 45, NOW - 300 * S + S // 2) == [fresh, stale]


def test_tombstone_lifetime():
    p = Producer(peer(1))
    assert not p.is_tombstoned(45, NOW)
    assert p.tombstoned_at == GO_ZERO_TIME_UNIX_NANO
    p.tombstone(NOW)
    assert p.tombstoned and p.tombstoned_at == NOW
    assert p.is_tombstoned(45, NOW + 45 * S - 1)
    assert not p.is_tombstoned(45, NOW + 45 * S)
    assert not p.is_tombstoned(0, NOW)
    assert filter_by_active([p], 300, 45, NOW + S) == []
    assert filter_by_active([p], 300, 45, NOW + 46 * S) == [p]
    assert repr(p) == "host1 [4151, 5151]"


# --- protocol operations ------------------------------------------------------------------------


def test_register_topic_and_channel():
    db = RegistrationDB()
    a = peer(1)
    assert db.identify(a) is True
    assert db.identify(a) is False
    assert db.register(a, "t", "c") == [Registration("channel", "t", "c"), Registration("topic", "t", "")]
    assert db.register(a, "t", "c") == []
    assert db.register(a, "t") == []
    assert db.register(a, "u") == [Registration("topic", "u", "")]
    assert db.topics() == ["t", "u"]
    assert db.channels("t") == ["c"]


def test_unregister_channel_keeps_topic_and_channel_registration():
    db = RegistrationDB()
    a = peer(1)
    db.register(a, "t", "c")
    removed, unexpected = db.unregister(a, "t", "c")
    assert removed == [Registration("channel", "t", "c")] and unexpected == []
    assert db.channels("t") == ["c"]  # a durable channel stays known
    assert [p.peer_info for p in db.find_producers("topic", "t", "")] == [a]
    assert db.unregister(a, "t", "c") == ([], [])


def test_unregister_topic_removes_its_channels_producers_with_a_warning():
    db = RegistrationDB()
    a, b = peer(1), peer(2)
    db.register(a, "t", "c1")
    db.register(a, "t", "c2")
    db.register(b, "t", "c1")
    removed, unexpected = db.unregister(a, "t")
    assert set(unexpected) == {Registration("channel", "t", "c1"), Registration("channel", "t", "c2")}
    assert set(removed) == set(unexpected) | {Registration("topic", "t", "")}
    assert db.find_producers("channel", "t", "*") == db.find_producers("channel", "t", "c1")
    assert [p.peer_info for p in db.find_producers("topic", "t", "")] == [b]
    assert db.topics() == ["t"]


def test_ephemeral_channel_leaves_with_its_last_producer():
    db = RegistrationDB()
    a, b = peer(1), peer(2)
    db.register(a, "t", "c#ephemeral")
    db.register(b, "t", "c#ephemeral")
    db.unregister(a, "t", "c#ephemeral")
    assert db.channels("t") == ["c#ephemeral"]
    db.unregister(b, "t", "c#ephemeral")
    assert db.channels("t") == []
    assert db.topics() == ["t"]


def test_ephemeral_channel_unregistered_when_never_registered_is_removed():
    # Go: RemoveProducer on a missing key reports 0 left, so the key is removed (no-op)
    db = RegistrationDB()
    db.unregister(peer(1), "t", "x#ephemeral")
    assert len(db) == 0


def test_ephemeral_topic_leaves_with_its_last_producer():
    db = RegistrationDB()
    a, b = peer(1), peer(2)
    db.register(a, "t#ephemeral", "c")
    db.register(b, "t#ephemeral")
    db.unregister(a, "t#ephemeral")
    assert db.topics() == ["t#ephemeral"]
    db.unregister(b, "t#ephemeral")
    assert db.topics() == []
    assert db.channels("t#ephemeral") == ["c"]  # as in Go: only the topic key goes


def test_durable_topic_stays_after_its_last_producer():
    db = RegistrationDB()
    a = peer(1)
    db.register(a, "t")
    db.unregister(a, "t")
    assert db.topics() == ["t"]
    assert db.lookup("t", 300, 45, NOW) == ([], [])


def test_remove_peer_leaves_every_registration_and_keeps_durable_ones():
    db = RegistrationDB()
    a, b = peer(1), peer(2)
    for p in (a, b):
        db.identify(p)
    db.register(a, "t", "c")
    db.register(b, "t")
    left = db.remove_peer(a.id)
    assert set(left) == {
        Registration("client", "", ""),
        Registration("channel", "t", "c"),
        Registration("topic", "t", ""),
    }
    assert db.lookup_registrations(a.id) == []
    assert db.channels("t") == ["c"]  # durable: outlives its last producer, as in Go
    assert [p.peer_info for p in db.find_producers("client", "", "")] == [b]
    assert db.remove_peer(a.id) == []
    db.remove_peer(b.id)
    assert db.topics() == ["t"] and db.channels("t") == ["c"]


def test_remove_peer_drops_ephemeral_registrations_with_their_last_producer():
    """A dropped connection treats #ephemeral channels and topics like UNREGISTER does:
    they go with their last producer (Go 1.3 would keep them, empty)."""
    db = RegistrationDB()
    a, b = peer(1), peer(2)
    for p in (a, b):
        db.identify(p)
    db.register(a, "t", "c#ephemeral")
    db.register(b, "t", "c#ephemeral")
    db.register(a, "t", "d#ephemeral")
    db.register(a, "e#ephemeral", "c")
    db.create_channel("t", "h#ephemeral")  # made over HTTP: no producer ever
    db.remove_peer(a.id)
    assert sorted(db.channels("t")) == ["c#ephemeral", "h#ephemeral"]  # b still produces c
    assert db.topics() == ["t"]
    assert db.channels("e#ephemeral") == ["c"]  # as UNREGISTER: only the topic key goes
    db.remove_peer(b.id)
    assert db.channels("t") == ["h#ephemeral"]  # this peer never was one of its producers
    assert db.topics() == ["t"]
    assert db.lookup("t", 300, 45, NOW) == (["h#ephemeral"], [])


# --- HTTP operations ----------------------------------------------------------------------------


def test_lookup_filters_inactive_and_tombstoned():
    db = RegistrationDB()
    a, b, c = peer(1), peer(2, last_update=NOW - 301 * S), peer(3)
    for p in (a, b, c):
        db.register(p, "t", "ch")
    assert db.lookup("nope", 300, 45, NOW) is None
    assert db.tombstone_topic_producer("t", "host3:5153", NOW) == 1
    assert db.tombstone_topic_producer("t", "host3:4153", NOW) == 0
    assert db.lookup("t", 300, 45, NOW) == (["ch"], [a])
    # 45 s later c's tombstone has expired; b stays inactive
    assert db.lookup("t", 300, 45, NOW + 45 * S) == (["ch"], [a, c])


def test_lookup_wildcard_topic_like_go():
    db = RegistrationDB()
    a, b = peer(1), peer(2)
    db.register(a, "t1", "x")
    db.register(b, "t2", "y")
    db.register(a, "t2")
    channels, producers = db.lookup("*", 300, 45, NOW)
    assert channels == ["x", "y"] and producers == [a, b]


def test_create_and_delete_topic_and_channel():
    db = RegistrationDB()
    db.create_topic("t")
    assert db.topics() == ["t"] and db.find_producers("topic", "t", "") == []
    db.create_channel("u", "c")
    db.create_channel("u", "d")
    assert db.topics() == ["t", "u"] and db.channels("u") == ["c", "d"]
    assert db.delete_channel("u", "c") is True
    assert db.delete_channel("u", "c") is False
    assert db.channels("u") == ["d"]
    removed = db.delete_topic("u")
    assert removed == [Registration("channel", "u", "d"), Registration("topic", "u", "")]
    assert db.topics() == ["t"]
    assert db.delete_topic("nope") == []


def test_delete_topic_removes_registrations_with_their_producers():
    db = RegistrationDB()
    a = peer(1)
    db.register(a, "t", "c")
    db.delete_topic("t")
    assert db.topics() == [] and db.channels("t") == []
    assert db.lookup_registrations(a.id) == []


def test_tombstone_is_per_topic():
    db = RegistrationDB()
    a = peer(1)
    db.register(a, "t")
    db.register(a, "u")
    db.tombstone_topic_producer("t", "host1:5151", NOW)
    assert db.lookup("t", 300, 45, NOW)[1] == []
    assert db.lookup("u", 300, 45, NOW)[1] == [a]


def test_nodes():
    db = RegistrationDB()
    a, b, stale = peer(1), peer(2), peer(3, last_update=NOW - 400 * S)
    for p in (a, b, stale):
        db.identify(p)
    db.register(a, "t", "c")
    db.register(a, "u")
    db.register(b, "u")
    db.tombstone_topic_producer("u", "host1:5151", NOW)
    nodes = db.nodes(300, 45, NOW)
    assert [n["broadcast_address"] for n in nodes] == ["host1", "host2"]
    assert nodes[0] == {
        "remote_address": "",
        "hostname": "",
        "broadcast_address": "host1",
        "tcp_port": 4151,
        "http_port": 5151,
        "version": "1.3.0",
        "tombstones": [False, True],
        "topics": ["t", "u"],
    }
    assert nodes[1]["topics"] == ["u"] and nodes[1]["tombstones"] == [False]
    later = db.nodes(300, 45, NOW + 50 * S)
    assert later[0]["tombstones"] == [False, False]


def test_nodes_lists_only_identified_peers():
    db = RegistrationDB()
    db.register(peer(1), "t")  # REGISTER without IDENTIFY cannot happen over TCP
    assert db.nodes(300, 45, NOW) == []


def test_debug_dump():
    db = RegistrationDB()
    a = peer(1, hostname="h1")
    db.identify(a)
    db.register(a, "t", "c")
    db.create_topic("empty")
    db.tombstone_topic_producer("t", "host1:5151", NOW + 1)
    dump = db.debug()
    assert list(dump) == ["channel:t:c", "client::", "topic:t:"]  # sorted, empty ones omitted
    entry = {
        "broadcast_address": "host1",
        "hostname": "h1",
        "http_port": 5151,
        "id": a.id,
        "last_update": NOW,
        "tcp_port": 4151,
        "tombstoned": False,
        "tombstoned_at": GO_ZERO_TIME_UNIX_NANO,
        "version": "1.3.0",
    }
    assert dump["client::"] == [entry]
    assert dump["channel:t:c"] == [entry]
    assert dump["topic:t:"] == [{**entry, "tombstoned": True, "tombstoned_at": NOW + 1}]
    assert list(entry) == sorted(entry)


def test_peer_info_json_field_order():
    assert list(peer(1).to_json()) == [
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
    ]


# --- a model of the whole protocol ------------------------------------------------------------

PEERS = [peer(n) for n in range(3)]
TOPICS = ["t", "u#ephemeral"]
CHANNELS = ["", "c", "d#ephemeral"]


class RegistryMachine(RuleBasedStateMachine):
    """REGISTER/UNREGISTER/disconnect in any order keep the DB equal to a simple model of
    Go's rules."""

    def __init__(self) -> None:
        super().__init__()
        self.db = RegistrationDB()
        self.connected: set[int] = set()
        #: registrations known (model) and who produces each
        self.model: dict[tuple[str, str, str], set[int]] = {}

    def _prod(self, k: tuple[str, str, str]) -> set[int]:
        return self.model.setdefault(k, set())

    @rule(n=st.integers(0, 2))
    def identify(self, n: int) -> None:
        if n in self.connected:
            return
        self.connected.add(n)
        self.db.identify(PEERS[n])
        self._prod(("client", "", "")).add(n)

    @rule(n=st.integers(0, 2), topic=st.sampled_from(TOPICS), channel=st.sampled_from(CHANNELS))
    def register(self, n: int, topic: str, channel: str) -> None:
        if n not in self.connected:
            return
        self.db.register(PEERS[n], topic, channel)
        if channel:
            self._prod(("channel", topic, channel)).add(n)
        self._prod(("topic", topic, "")).add(n)

    @rule(n=st.integers(0, 2), topic=st.sampled_from(TOPICS), channel=st.sampled_from(CHANNELS))
    def unregister(self, n: int, topic: str, channel: str) -> None:
        if n not in self.connected:
            return
        self.db.unregister(PEERS[n], topic, channel)
        if channel:
            k = ("channel", topic, channel)
            if k in self.model:
                self.model[k].discard(n)
            if not self.model.get(k) and channel.endswith("#ephemeral"):
                self.model.pop(k, None)
            return
        for k in list(self.model):
            if k[0] == "channel" and k[1] == topic:
                self.model[k].discard(n)
        k = ("topic", topic, "")
        if k in self.model:
            self.model[k].discard(n)
        if not self.model.get(k) and topic.endswith("#ephemeral"):
            self.model.pop(k, None)

    @rule(n=st.integers(0, 2))
    def disconnect(self, n: int) -> None:
        if n not in self.connected:
            return
        self.connected.discard(n)
        self.db.remove_peer(PEERS[n].id)
        for k, producers in list(self.model.items()):
            if n not in producers:
                continue
            producers.discard(n)
            ephemeral = k[2] if k[0] == "channel" else k[1] if k[0] == "topic" else ""
            if not producers and ephemeral.endswith("#ephemeral"):
                del self.model[k]

    @invariant()
    def db_matches_model(self) -> None:
        got = {tuple(k): {PEERS.index(p.peer_info) for p in producers} for k, producers in self.db.items()}
        assert got == self.model
        for topic in TOPICS:
            found = self.db.lookup(topic, 300, 45, NOW)
            k = ("topic", topic, "")
            if k not in self.model:
                assert found is None
            else:
                channels, producers = found
                assert {PEERS.index(p) for p in producers} == self.model[k]
                assert set(channels) == {c for (cat, t, c) in self.model if cat == "channel" and t == topic}


TestRegistryMachine = RegistryMachine.TestCase
TestRegistryMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
