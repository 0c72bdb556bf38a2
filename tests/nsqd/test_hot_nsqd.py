"""nsqd's compiled hot paths (nsqpy._speedups._hot) against their pure-Python references,
on the same inputs: same results and the same state of every message, queue and index
afterwards, and None from the compiled one exactly where the reference would raise.

The C module is imported directly, whatever NSQPY_PURE_PYTHON says (the rest of tests/nsqd
runs once on each implementation: scripts/test.sh).
"""

import gc
import random
import struct
import time
from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import load_hot

from nsqpy.nsqd import guid as guid_mod
from nsqpy.nsqd.channel import decode_records_py, encode_messages_py
from nsqpy.nsqd.client_v2 import send_batch_py
from nsqpy.nsqd.diskqueue import frame_records_py, split_records_py
from nsqpy.nsqd.guid import SEQUENCE_MASK, TWEPOCH, GUIDFactory, ids_from
from nsqpy.nsqd.inflight import expire_front_py
from nsqpy.nsqd.message import Message, copy_messages_py, new_messages_py
from nsqpy.protocol.frames import (
    FrameReader,
    encode_message_frame,
)

hot = load_hot(Message)


def fields(m: Message) -> tuple:
    return (m.id, m.body, m.timestamp, m.attempts, m.client, m.deadline, m.delivery_ts, m.defer)


def make(n: int, attempts: int = 0, size: int = 3) -> list[Message]:
    out = []
    for i in range(n):
        m = Message(b"%016x" % (1000 + i), bytes([i % 256]) * (size + i % 4), 10**18 + i, attempts)
        m.defer = 0.0
        out.append(m)
    return out


def twin(msgs: list[Message]) -> list[Message]:
    """An independent copy of each message, every field equal."""
    out = []
    for m in msgs:
        c = Message(m.id, m.body, m.timestamp, m.attempts)
        c.client, c.deadline, c.delivery_ts, c.defer = m.client, m.deadline, m.delivery_ts, m.defer
        out.append(c)
    return out


# --- GUIDs -------------------------------------------------------------------------------


def original_new_ids(state: list[int], node: int, count: int, now: int) -> list[bytes]:
    """GUIDFactory.new_ids as it was before reserve(): the oracle ([last_ts, seq] in state)."""
    ts = now
    if ts <= state[0]:
        ts = state[0]
        seq = state[1]
    else:
        seq = -1
    out = []
    for _ in range(count):
        seq += 1
        if seq > SEQUENCE_MASK:
            ts += 1
            seq = 0
        out.append(b"%016x" % (((ts - TWEPOCH) << 22) | node | seq))
    state[0], state[1] = ts, seq
    return out


@given(st.lists(st.tuples(st.integers(1, 9000), st.integers(-2, 2)), min_size=1, max_size=12))
def test_reserve_makes_the_ids_the_old_loop_made(calls):
    f = GUIDFactory(613)
    state = [0, -1]
    now = [1_700_000_000_000]

    orig = guid_mod.time.time_ns
    try:
        guid_mod.time.time_ns = lambda: now[0] << 20  # the factory's clock, in its units
        for count, tick in calls:
            now[0] += tick  # the clock stands still, moves on, or goes back
            expected = original_new_ids(state, f.node, count, now[0])
            ts, seq = f.reserve(count)
            assert ids_from(ts, seq, count, f.node) == expected
            assert (f._last_ts, f._seq) == (state[0], state[1])
            # the compiled twin makes the same ids from the same reservation
            bodies = [b"b"] * count
            made = hot.new_messages(bodies, ts, seq, f.node, TWEPOCH, 5, 0.0)
            assert [m.id for m in made] == expected
    finally:
        guid_mod.time.time_ns = orig


def test_new_ids_still_increase_across_a_sequence_rollover():
    f = GUIDFactory(1)
    ids = f.new_ids(5000) + f.new_ids(5000)
    assert ids == sorted(ids) and len(set(ids)) == 10000


def test_new_messages_matches_the_reference():
    bodies = [b"x" * i for i in range(1, 300)]
    ts, seq = int(time.time_ns()) >> 20, 4000  # crosses a rollover
    for defer in (0.0, 2.5):
        fast = hot.new_messages(bodies, ts, seq, 5 << 12, TWEPOCH, 123456789, defer)
        ref = new_messages_py(bodies, ts, seq, 5 << 12, TWEPOCH, 123456789, defer)
        assert [fields(m) for m in fast] == [fields(m) for m in ref]
        assert all(type(m) is Message for m in fast)
        assert all(fast[i].body is bodies[i] for i in range(len(bodies)))  # shared, not copied
    assert hot.new_messages([], ts, 0, 0, TWEPOCH, 1, 0.0) == []


def test_new_messages_declines_ids_it_does_not_make():
    assert hot.new_messages([b"a"], TWEPOCH - 1, 0, 0, TWEPOCH, 1, 0.0) is None
    assert hot.new_messages([b"a"], TWEPOCH + (1 << 41), 0, 0, TWEPOCH, 1, 0.0) is None


def test_messages_are_outside_the_gc_until_in_flight():
    """Queued messages refer only to bytes and numbers: the cyclic GC need not walk them.
    Once in flight (their client refers back to them) they are tracked."""
    msgs = hot.new_messages([b"a", b"b"], int(time.time_ns()) >> 20, 0, 0, TWEPOCH, 1, 0.0)
    copies = hot.copy_messages(msgs)
    assert not any(gc.is_tracked(m) for m in msgs + copies)
    q = deque(copies)
    owner = object()
    assert hot.send_batch(q, 2, owner, {}, deque(), 1.0, 0.5, []) is not None
    assert all(gc.is_tracked(m) for m in copies)
    del q


# --- copy_messages -------------------------------------------------------------------------


def test_copy_messages_matches_the_reference():
    msgs = make(50, attempts=3)
    msgs[4].defer = 1.5
    msgs[7].client = object()  # a copy is never in flight
    msgs[7].deadline = 9.0
    fast = hot.copy_messages(msgs)
    ref = copy_messages_py(msgs)
    assert [fields(m) for m in fast] == [fields(m) for m in ref]
    assert all(a is not b for a, b in zip(fast, msgs, strict=True))

    class Sub(Message):
        __slots__ = ()

    odd = [Sub(b"%016x" % 1, b"z", 1)]  # not the registered class: its own copy()
    assert [fields(m) for m in hot.copy_messages(odd)] == [fields(m) for m in copy_messages_py(odd)]


# --- send_batch ----------------------------------------------------------------------------


class Owner:
    pass


def run_send(fn, msgs, n, sample=0, seed=0):
    owner = Owner()
    q = deque(msgs)
    in_flight: dict = {}
    entries: deque = deque()
    out: list = []
    deadline, now = 61.5, 1.5
    rnd = random.Random(seed)
    if fn is send_batch_py:
        if sample:
            random.seed(seed)
        res = fn(q, n, owner, in_flight, entries, deadline, now, out, sample)
    elif sample:
        res = fn(q, n, owner, in_flight, entries, deadline, now, out, sample, rnd.randrange)
    else:
        res = fn(q, n, owner, in_flight, entries, deadline, now, out)
    return res, owner, q, in_flight, entries, b"".join(out)


def same_world(a, b):
    res_a, owner_a, q_a, fl_a, ent_a, wire_a = a
    res_b, owner_b, q_b, fl_b, ent_b, wire_b = b
    assert res_a == res_b
    assert wire_a == wire_b
    assert res_a[1] == len(wire_a)
    assert [fields(m) for m in q_a] == [fields(m) for m in q_b]

    def norm(m, owner):
        f = list(fields(m))
        f[4] = "owner" if f[4] is owner else f[4]
        return tuple(f)

    assert {k: norm(m, owner_a) for k, m in fl_a.items()} == {k: norm(m, owner_b) for k, m in fl_b.items()}
    assert [(d, m.id) for d, m in ent_a] == [(d, m.id) for d, m in ent_b]
    assert all(fl_a[m.id] is m for _, m in ent_a)


@pytest.mark.parametrize("n,avail", [(1, 1), (5, 3), (3, 5), (2500, 2600), (0, 4), (4, 0)])
def test_send_batch_matches_the_reference(n, avail):
    msgs = make(avail, attempts=2)
    other = twin(msgs)
    a = run_send(hot.send_batch, msgs, n)
    b = run_send(send_batch_py, other, n)
    same_world(a, b)
    # and the frames are the ones protocol/frames.py encodes
    wire = a[5]
    sent = a[0][0]
    assert all(m.attempts == 3 for m in msgs[:sent])
    assert wire == b"".join(encode_message_frame(m.timestamp, m.attempts, m.id, m.body) for m in msgs[:sent])


def test_send_batch_frames_read_back():
    msgs = make(10)
    (_sent, _nbytes), _owner, _q, _fl, _ent, wire = run_send(hot.send_batch, msgs, 10)
    runs = FrameReader().feed_batched(wire, lambda i, b, ts, att: (i, bytes(b), ts, att))
    assert runs == [[(m.id, m.body, m.timestamp, 1) for m in msgs]]


def test_send_batch_samples_as_the_reference():
    msgs = make(200)
    other = twin(msgs)
    a = run_send(hot.send_batch, msgs, 150, sample=40, seed=7)
    b = run_send(send_batch_py, other, 150, sample=40, seed=7)
    same_world(a, b)
    assert 0 < a[0][0] < 150


@pytest.mark.parametrize("bad", ["attempts", "id", "body"])
def test_send_batch_declines_what_it_cannot_frame(bad):
    msgs = make(5)
    if bad == "attempts":
        msgs[3].attempts = 65535  # the reference fails on it (uint16)
    elif bad == "id":
        msgs[3].id = b"short"
    else:
        msgs[3].body = bytearray(b"not bytes")
    before = [fields(m) for m in msgs]
    q = deque(msgs)
    assert hot.send_batch(q, 5, Owner(), {}, deque(), 1.0, 0.5, []) is None
    assert list(q) == msgs and [fields(m) for m in msgs] == before  # nothing changed
    if bad == "attempts":
        with pytest.raises(struct.error):
            send_batch_py(q, 5, Owner(), {}, deque(), 1.0, 0.5, [])


# --- expire_front --------------------------------------------------------------------------


@given(
    st.lists(st.tuples(st.integers(0, 9), st.sampled_from(["live", "fin", "other", "touched"])), max_size=30),
    st.integers(0, 10),
)
def test_expire_front_matches_the_reference(spec, now):
    def world():
        owner = Owner()
        entries: deque = deque()
        in_flight = {}
        msgs = []
        for i, (deadline, state) in enumerate(sorted(spec)):
            m = Message(b"%016x" % i, b"b", 1)
            m.deadline = float(deadline)
            m.client = owner
            in_flight[m.id] = m
            if state == "fin":
                del in_flight[m.id]
                m.client = None
            elif state == "other":
                m.client = Owner()
            elif state == "touched":
                m.deadline = deadline + 100.0
            entries.append((float(deadline), m))
            msgs.append(m)
        return owner, entries, in_flight

    o1, e1, f1 = world()
    o2, e2, f2 = world()
    got1 = hot.expire_front(e1, float(now), o1, f1)
    got2 = expire_front_py(e2, float(now), o2, f2)
    assert [m.id for m in got1] == [m.id for m in got2]
    assert [(d, m.id) for d, m in e1] == [(d, m.id) for d, m in e2]


# --- DiskQueue records ----------------------------------------------------------------------


def test_encode_and_decode_records_match_the_reference():
    msgs = make(40, attempts=7)
    msgs[3].attempts = 65535
    msgs[4].timestamp = -(2**63)
    recs = hot.encode_messages(msgs)
    assert recs == encode_messages_py(msgs)
    back = hot.decode_records(recs)
    ref = decode_records_py(recs, "test")
    assert [fields(m) for m in back] == [fields(m) for m in ref]
    assert [(m.id, m.body, m.timestamp, m.attempts) for m in back] == [
        (m.id, m.body, m.timestamp, m.attempts) for m in msgs
    ]


def test_records_it_declines():
    msgs = make(3)
    msgs[1].attempts = 65536
    assert hot.encode_messages(msgs) is None
    with pytest.raises(struct.error):
        encode_messages_py(msgs)
    recs = encode_messages_py(make(3))
    recs[1] = recs[1][:20]  # too short to be a message: the reference logs and skips it
    assert hot.decode_records(recs) is None
    assert len(decode_records_py(recs, "test")) == 2


@given(st.lists(st.binary(max_size=40), max_size=20), st.data())
def test_frame_and_split_records_match_the_reference(records, data):
    start = data.draw(st.integers(0, len(records)))
    stop = data.draw(st.integers(start, len(records)))
    framed = hot.frame_records(records, start, stop)
    assert framed == frame_records_py(records, start, stop)
    buf = b"junk" + framed
    cut = data.draw(st.integers(4, len(buf)))
    buf = buf[:cut]
    pos0 = data.draw(st.integers(0, 1000))
    limit = pos0 + data.draw(st.integers(0, len(framed) + 10))
    want = data.draw(st.integers(0, 25))
    mn, mx = data.draw(st.integers(0, 5)), data.draw(st.integers(10, 50))
    out_c: list = []
    out_p: list = []
    got_c = hot.split_records(buf, 4, pos0, limit, want, mn, mx, out_c)
    got_p = split_records_py(buf, 4, pos0, limit, want, mn, mx, out_p)
    assert got_c == got_p
    assert out_c == out_p


def test_split_records_reports_a_negative_size():
    buf = struct.pack(">i", -3) + b"xyz"
    out: list = []
    assert hot.split_records(buf, 0, 0, 100, 5, 0, 10, out) == split_records_py(buf, 0, 0, 100, 5, 0, 10, [])
    assert hot.split_records(buf, 0, 0, 100, 5, 0, 10, out)[4] == -3
