"""Unit tests that walk the RDY/backoff state machine (nsqpy.client.rdy): no I/O, no clock."""

from __future__ import annotations

import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nsqpy.client.rdy import (
    ExponentialBackoff,
    FullJitterBackoff,
    RdyController,
    Signal,
    backoff_policy,
)

pytestmark = pytest.mark.timeout(60)


def ctl(mif: int, **kw: object) -> RdyController:
    kw.setdefault("rng", random.Random(1))
    return RdyController(mif, **kw)  # type: ignore[arg-type]


def rdys(c: RdyController) -> dict[object, int]:
    return {k: s.rdy for k, s in c.conns.items()}


def test_single_connection_gets_max_in_flight() -> None:
    c = ctl(100)
    assert c.add_conn("a", 2500, 0.0) == [("a", 100)]
    assert c.total_rdy == 100


def test_never_above_max_rdy_count() -> None:
    c = ctl(5000)
    assert c.add_conn("a", 2500, 0.0) == [("a", 2500)]
    c.add_conn("b", 100, 0.0)
    assert rdys(c) == {"a": 2500, "b": 100}


def test_spread_over_connections_lowering_first() -> None:
    c = ctl(10)
    c.add_conn("a", 2500, 0.0)
    out = c.add_conn("b", 2500, 0.0)
    # a is lowered before b is raised, so the total never exceeds 10 on the wire.
    assert out == [("a", 5), ("b", 5)]
    out = c.add_conn("c", 2500, 0.0)
    assert out == [("a", 3), ("b", 3), ("c", 3)]
    assert c.total_rdy == 9
    assert c.remove_conn("c", 1.0) == [("a", 5), ("b", 5)]


def test_in_flight_limits_new_share() -> None:
    c = ctl(4)
    c.add_conn("a", 2500, 0.0)
    for _ in range(4):
        c.on_message("a", 0.1)
    # a holds 4 in flight: lowering its RDY to 2 frees nothing yet.
    out = c.add_conn("b", 2500, 0.2)
    assert out == [("a", 2)]
    assert c.conns["b"].rdy == 0
    # As a's messages finish, b gets its share, never exceeding 4 committed in total.
    assert c.on_finished("a", Signal.SUCCESS, 0.3) == [("b", 1)]
    assert c.on_finished("a", Signal.SUCCESS, 0.3) == [("b", 2)]
    assert c.on_finished("a", Signal.SUCCESS, 0.3) == []


def test_rdy_refresh_threshold() -> None:
    c = ctl(8)
    c.add_conn("a", 2500, 0.0)
    sent = []
    for i in range(8):
        sent += c.on_message("a", float(i))
        c.on_finished("a", Signal.SUCCESS, float(i))
    # remaining 1 (< 25% of 8 is < 2) → refresh after the 7th message, then count again.
    assert sent == [("a", 8)]


def test_max_in_flight_less_than_connections_redistributes() -> None:
    c = ctl(1, low_rdy_idle_timeout=10.0, rdy_redistribute_interval=5.0)
    c.add_conn("a", 2500, 0.0)
    c.add_conn("b", 2500, 0.0)
    c.add_conn("c", 2500, 0.0)
    assert c.total_rdy == 1 and rdys(c)["a"] == 1
    assert c.next_deadline() == 5.0
    assert c.tick(5.0) == []  # a is not idle yet
    # a stays idle past low_rdy_idle_timeout: its RDY moves to another connection.
    out = c.tick(10.5)
    assert out[0] == ("a", 0) and len(out) == 2 and out[1][1] == 1 and out[1][0] in ("b", "c")
    assert c.total_rdy == 1
    holder = out[1][0]
    # the new holder gets messages: it keeps its RDY on the next ticks.
    c.on_message(holder, 12.0)
    c.on_finished(holder, Signal.SUCCESS, 12.0)
    assert c.tick(15.5) == []
    assert c.total_rdy == 1


def test_redistribution_never_gives_rdy_to_conn_with_in_flight() -> None:
    c = ctl(1)
    c.add_conn("a", 2500, 0.0)
    c.on_message("a", 0.0)  # a holds the one in-flight message for a long time
    c.add_conn("b", 2500, 0.0)
    c.tick(5.0)
    c.tick(20.0)
    # a is zeroed (idle), but b cannot get RDY while a's message is still in flight.
    assert rdys(c) == {"a": 0, "b": 0}
    out = c.on_finished("a", Signal.SUCCESS, 21.0)
    assert c.total_rdy <= 1
    c.tick(25.0)
    assert c.total_rdy == 1, out


def test_low_rdy_timeout_moves_busy_rdy() -> None:
    c = ctl(1, low_rdy_timeout=30.0)
    c.add_conn("a", 2500, 0.0)
    c.add_conn("b", 2500, 0.0)
    for t in range(1, 35):
        c.on_message("a", float(t))
        c.on_finished("a", Signal.SUCCESS, float(t))
        c.tick(float(t) + 0.5)
    assert rdys(c) == {"a": 0, "b": 1}


def test_backoff_exponential_walk() -> None:
    c = ctl(10, backoff=ExponentialBackoff(1.0), max_backoff_duration=16.0)
    c.add_conn("a", 2500, 0.0)
    c.add_conn("b", 2500, 0.0)
    for k in ("a", "b"):
        c.on_message(k, 0.0)
    # failure → level 1: RDY 0 everywhere for 2 s
    assert c.on_finished("a", Signal.FAILURE, 1.0) == [("a", 0), ("b", 0)]
    assert c.mode == "backoff" and c.backoff_level == 1 and c.next_deadline() == 3.0
    # results during the timeout are ignored
    assert c.on_finished("b", Signal.FAILURE, 1.5) == []
    assert c.backoff_level == 1
    # timeout ends: RDY 1 on one connection only (test the waters)
    out = c.tick(3.0)
    assert len(out) == 1 and out[0][1] == 1 and c.mode == "probe"
    probe = out[0][0]
    c.on_message(probe, 3.1)
    # the probe fails → level 2: 4 s
    assert c.on_finished(probe, Signal.FAILURE, 3.2) == [(probe, 0)]
    assert c.backoff_level == 2 and c.backoff_until == pytest.approx(7.2)
    out = c.tick(7.2)
    probe = out[0][0]
    c.on_message(probe, 7.3)
    # success → level 1, still backing off (2 s)
    assert c.on_finished(probe, Signal.SUCCESS, 7.4) == [(probe, 0)]
    assert c.backoff_level == 1 and c.backoff_until == pytest.approx(9.4)
    out = c.tick(9.4)
    probe = out[0][0]
    c.on_message(probe, 9.5)
    # success → level 0: full flow again
    out = c.on_finished(probe, Signal.SUCCESS, 9.6)
    assert c.mode == "normal" and rdys(c) == {"a": 5, "b": 5}
    assert sorted(out) == sorted([(k, 5) for k in ("a", "b")])


def test_backoff_level_capped_by_max_duration() -> None:
    c = ctl(1, max_backoff_duration=8.0)
    c.add_conn("a", 2500, 0.0)
    t = 0.0
    for _ in range(10):
        c.on_message("a", t)
        c.on_finished("a", Signal.FAILURE, t)
        t = c.backoff_until or t
        c.tick(t)
    assert c.backoff_level == 3  # 2^3 = 8 ≤ 8, 2^4 > 8


def test_backoff_disabled_with_zero_max() -> None:
    c = ctl(4, max_backoff_duration=0.0)
    c.add_conn("a", 2500, 0.0)
    c.on_message("a", 0.0)
    assert c.on_finished("a", Signal.FAILURE, 0.0) == []
    assert c.mode == "normal" and c.total_rdy == 4


def test_continue_signal_keeps_level() -> None:
    c = ctl(2)
    c.add_conn("a", 2500, 0.0)
    c.on_message("a", 0.0)
    c.on_finished("a", Signal.FAILURE, 0.0)
    c.tick(2.0)
    c.on_message("a", 2.0)
    c.on_finished("a", Signal.CONTINUE, 2.1)
    assert c.backoff_level == 1 and c.mode == "backoff"
    # CONTINUE in normal mode does nothing
    d = ctl(2)
    d.add_conn("a", 2500, 0.0)
    d.on_message("a", 0.0)
    assert d.on_finished("a", Signal.CONTINUE, 0.0) == [] and d.mode == "normal"


def test_full_jitter_within_bounds() -> None:
    p = FullJitterBackoff(1.0)
    rng = random.Random(3)
    ds = [p.duration(3, rng) for _ in range(200)]
    assert all(0 <= d < 8 for d in ds) and len(set(ds)) > 100
    c = ctl(1, backoff=backoff_policy("full_jitter", 1.0))
    c.add_conn("a", 2500, 0.0)
    c.on_message("a", 0.0)
    c.on_finished("a", Signal.FAILURE, 0.0)
    assert c.backoff_until is not None and 0 <= c.backoff_until < 2


def test_probe_waits_for_capacity() -> None:
    c = ctl(2)
    c.add_conn("a", 2500, 0.0)
    c.add_conn("b", 2500, 0.0)
    c.on_message("a", 0.0)  # a's handler is slow
    c.on_message("b", 0.0)
    c.on_finished("b", Signal.FAILURE, 0.1)
    out = c.tick(2.1)
    # probe mode allows 1 in flight, and a still holds one: no room for the probe yet
    assert out == [] and c.mode == "probe"
    out = c.on_finished("a", Signal.SUCCESS, 2.2)
    # that success counts (the timeout is over): level 0 → normal flow
    assert c.mode == "normal" and sorted(out) == [("a", 1), ("b", 1)]


def test_set_max_in_flight() -> None:
    c = ctl(10)
    c.add_conn("a", 2500, 0.0)
    c.add_conn("b", 2500, 0.0)
    assert c.set_max_in_flight(100, 1.0) == [("a", 50), ("b", 50)]
    assert c.set_max_in_flight(0, 2.0) == [("a", 0), ("b", 0)]  # pause
    assert c.set_max_in_flight(1, 3.0) == [("a", 1)]
    assert c.next_deadline() is not None  # redistribution pending
    with pytest.raises(ValueError):
        c.set_max_in_flight(-1, 0.0)


def test_is_starved() -> None:
    c = ctl(10)
    c.add_conn("a", 2500, 0.0)
    for _ in range(8):
        c.on_message("a", 0.0)
    assert not c.is_starved()
    c.on_message("a", 0.0)
    assert c.is_starved()


def test_backoff_without_connections_waits() -> None:
    c = ctl(1)
    c.add_conn("a", 2500, 0.0)
    c.on_message("a", 0.0)
    c.on_finished("a", Signal.FAILURE, 0.0)
    c.remove_conn("a", 0.5)
    assert c.tick(2.0) == [] and c.backoff_until == 3.0
    c.add_conn("b", 2500, 2.5)
    assert c.tick(3.0) == [("b", 1)]


@settings(max_examples=500, deadline=None)
@example(mif=2, ops=[("add", 1, 0), ("msg", 1, 0), ("add", 0, 0), ("mif", 0, 1)])
@given(
    mif=st.integers(0, 12),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["add", "remove", "msg", "fin", "req", "reqnb", "tick", "mif"]),
            st.integers(0, 5),
            st.integers(0, 12),
        ),
        max_size=80,
    ),
)
def test_invariants_hold_under_any_sequence(mif: int, ops: list[tuple[str, int, int]]) -> None:
    """Committed capacity (max(rdy, in_flight) summed) never exceeds max_in_flight because of us,
    and no RDY is ever above max_rdy_count."""
    c = ctl(mif, max_backoff_duration=8.0)
    now = 0.0
    wire: dict[int, int] = {}  # RDY as the server sees it
    in_flight: dict[int, int] = {}
    for op, k, n in ops:
        now += 1.0
        out: list[tuple[object, int]] = []
        if op == "add" and k not in c.conns:
            out = c.add_conn(k, 3 + k, now)
            in_flight[k] = 0
            wire[k] = 0
        elif op == "remove" and k in c.conns:
            out = c.remove_conn(k, now)
            del wire[k], in_flight[k]
        elif op == "msg" and k in c.conns and in_flight[k] < wire[k]:
            # nsqd only sends while in_flight < RDY
            in_flight[k] += 1
            out = c.on_message(k, now)
        elif op in ("fin", "req", "reqnb") and k in c.conns and in_flight[k] > 0:
            in_flight[k] -= 1
            sig = {"fin": Signal.SUCCESS, "req": Signal.FAILURE, "reqnb": Signal.CONTINUE}[op]
            out = c.on_finished(k, sig, now)
        elif op == "tick":
            now += n
            out = c.tick(now)
        elif op == "mif":
            out = c.set_max_in_flight(n, now)
        for key, count in out:
            assert isinstance(key, int)
            assert 0 <= count <= c.conns[key].max_rdy
            wire[key] = count
        for key, s in c.conns.items():
            assert s.rdy == wire[key] and s.in_flight == in_flight[key]
        limit = c.max_in_flight
        # sum over connections of what each may hold
        committed = sum(max(wire[k2], in_flight[k2]) for k2 in wire)
        # set_max_in_flight lowering below what is already in flight cannot be undone
        assert committed <= max(limit, sum(in_flight.values()))
