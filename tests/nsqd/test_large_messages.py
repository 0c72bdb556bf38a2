"""Large messages (issue 31): records bigger than the DiskQueue's read chunk, bodies received
in place, written with pwritev and sent without a copy, and read-ahead bounded in bytes.

The DiskQueue's size thresholds are patched small where a model test needs many large
records; the end-to-end tests move real 1 MiB messages through an in-process nsqd.
"""

from __future__ import annotations

import asyncio
import os
import random
import struct
import tempfile
from collections import deque
from unittest import mock

import pytest
from conftest import make_options
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import RawClient, load_hot, wait_for

import nsqpy.nsqd.diskqueue as dqmod
from nsqpy.nsqd import client_v2 as cvmod
from nsqpy.nsqd import topic as tmod
from nsqpy.nsqd.channel import decode_split, disk_records, joined_pieces
from nsqpy.nsqd.client_v2 import LARGE_BODY, send_batch_py
from nsqpy.nsqd.diskqueue import READ_CHUNK, DiskQueue, DiskQueueWriteError, Tails
from nsqpy.nsqd.message import Message
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.protocol import commands
from nsqpy.protocol.commands import RECEIVE_IN_PLACE, CommandParser
from nsqpy.protocol.frames import MESSAGE_BODY_OFFSET, encode_message, encode_message_frame

MiB = 1 << 20


def mk(path, name="q", **kw) -> DiskQueue:
    opts = dict(
        max_bytes_per_file=4 * MiB,
        min_msg_size=MESSAGE_BODY_OFFSET,
        max_msg_size=2 * MiB,
        sync_every=2500,
        sync_timeout=2.0,
    )
    opts.update(kw)
    return DiskQueue(name, str(path), **opts)


def record(i: int, size: int) -> bytes:
    head = struct.pack(">qH16s", 10**18 + i, 1, b"%016x" % i)
    return head + (bytes([i % 251]) * size)[: max(size - len(head), 0)]


def joined(records: list[bytes], tails: Tails | None) -> list[bytes]:
    return [r + (tails.get(i, b"") if tails is not None else b"") for i, r in enumerate(records)]


# --- the DiskQueue --------------------------------------------------------------------------


@pytest.mark.parametrize("tails", [False, True])
def test_large_records_across_segment_boundaries(tmp_path, tails):
    """1 MiB records, a segment holding three and a bit: each is read whole, in order, from
    a bytes object of its own (or two, with tails), segments are rolled and deleted."""
    dq = mk(tmp_path, max_bytes_per_file=3 * MiB + MiB // 2)
    data = [record(i, MiB - 7 * i) for i in range(10)]
    dq.put_many(data[:4])
    for r in data[4:7]:
        dq.put(r)
    dq.put_many(data[7:])
    assert dq.depth == 10 and dq.write_file_num >= 2
    out: list[bytes] = []
    while dq.depth:
        t = Tails(MESSAGE_BODY_OFFSET) if tails else None
        got = dq.read(3, None, 0, t)
        assert got
        if t is not None:
            assert sorted(t) == list(range(len(got)))  # every one is large: all in two pieces
            assert all(len(r) == MESSAGE_BODY_OFFSET for r in got)
        out += joined(got, t)
    assert out == data
    assert [f for f in os.listdir(tmp_path) if f.endswith(".dat") and "meta" not in f] == [
        "q.diskqueue.%06d.dat" % dq.write_file_num
    ]
    dq.close()


def test_read_max_bytes_bounds_what_is_read(tmp_path):
    dq = mk(tmp_path)
    dq.put_many([record(i, 300 * 1024) for i in range(8)])
    # at least one record, and none starting past the bound
    span = 4 + 300 * 1024  # each record's bytes in the file
    assert len(dq.read(100, None, 1)) == 1
    assert len(dq.read(100, None, 2 * span)) == 2  # the third starts at the bound: not taken
    assert len(dq.read(100, None, 2 * span + 1)) == 3  # it starts within the bound
    assert len(dq.read(100)) == 2
    small = mk(tmp_path, name="small", min_msg_size=1)
    small.put_many([b"x" * 10] * 100)
    assert len(small.read(1000, None, 140)) == 10  # 14 bytes each: 10 start within 140
    dq.close()
    small.close()


def test_read_into_max_bytes_and_tails_put_back_on_failure(tmp_path):
    dq = mk(tmp_path)
    data = [record(i, 200 * 1024) for i in range(6)]
    dq.put_many(data)
    t = Tails(MESSAGE_BODY_OFFSET)

    def fail(records):
        raise OSError("no")

    with pytest.raises(OSError):
        dq.read_into(10, fail, None, 500 * 1024, t)
    assert dq.depth == 6
    seen: list[bytes] = []
    t = Tails(MESSAGE_BODY_OFFSET)
    assert dq.read_into(10, lambda rs: seen.extend(joined(rs, t)), None, 500 * 1024, t) == 3
    assert seen == data[:3]
    assert dq.read(10) == data[3:]
    dq.close()


def test_reader_reads_while_writer_appends_large_records(tmp_path):
    """The read segment is the write segment: records appended (one by one and in batches)
    between reads are read whole, including one that spans more than a read chunk after a
    small one left in the read buffer."""
    dq = mk(tmp_path, max_bytes_per_file=64 * MiB)
    rnd = random.Random(5)
    model: deque[bytes] = deque()
    for i in range(60):
        size = rnd.choice([40, 100, READ_CHUNK - 10, READ_CHUNK + 1, 3 * READ_CHUNK, MiB])
        batch = [record(i * 10 + k, size) for k in range(rnd.randint(1, 3))]
        if len(batch) == 1:
            dq.put(batch[0])
        else:
            dq.put_many(batch)
        model.extend(batch)
        t = Tails(MESSAGE_BODY_OFFSET) if i % 2 else None
        got = joined(dq.read(rnd.randint(1, 4), None, rnd.choice([0, 1, MiB]), t), t)
        assert got == [model.popleft() for _ in got]
    assert dq.read(1000) == list(model)
    dq.close()


def test_put_many_with_heads_writes_the_joined_records(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    heads = [b"h%02d" % i for i in range(9)]
    bodies = [bytes([i]) * (READ_CHUNK + i) for i in range(9)]
    q1 = mk(a, max_bytes_per_file=200_000, min_msg_size=1)
    pos1: list[int] = []
    q1.put_many([h + x for h, x in zip(heads, bodies, strict=True)], pos1)
    q2 = mk(b, max_bytes_per_file=200_000, min_msg_size=1)
    pos2: list[int] = []
    q2.put_many(bodies, pos2, heads)
    for q in (q1, q2):
        q.sync()
    assert sorted(os.listdir(a)) == sorted(os.listdir(b))
    for f in os.listdir(a):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert pos1 == pos2 and len(pos2) == 9 and q2.write_file_num == 2
    assert q2.read(100) == [h + x for h, x in zip(heads, bodies, strict=True)]
    q1.close()
    q2.close()


def test_large_batches_use_pwritev_in_iov_max_pieces(tmp_path, monkeypatch):
    calls: list[int] = []
    real = dqmod._pwritev

    def counting(fd, parts, pos):
        calls.append(len(parts))
        return real(fd, parts, pos)

    monkeypatch.setattr(dqmod, "_pwritev", counting)
    monkeypatch.setattr(dqmod, "_IOV_MAX", 10)
    dq = mk(tmp_path, min_msg_size=1)
    data = [bytes([i]) * dqmod.WRITEV_RECORD for i in range(12)]
    dq.put_many(data)
    assert calls == [10, 10, 4]  # [len][record] pairs, 5 records a call
    calls.clear()
    dq.put_many([b"small"] * 3)  # small records: framed into one buffer, one pwrite
    assert calls == []
    assert dq.read(100) == [*data, b"small", b"small", b"small"]
    dq.close()


def test_failed_pwritev_leaves_nothing_past_write_pos(tmp_path, monkeypatch):
    real = dqmod._pwritev
    n = 0

    def second_fails(fd, parts, pos):
        nonlocal n
        n += 1
        if n == 2:
            raise OSError(28, "No space left on device")
        return real(fd, parts, pos)

    monkeypatch.setattr(dqmod, "_pwritev", second_fails)
    monkeypatch.setattr(dqmod, "_IOV_MAX", 4)
    dq = mk(tmp_path, min_msg_size=1)
    dq.put(b"first")
    with pytest.raises(DiskQueueWriteError) as e:
        dq.put_many([b"y" * dqmod.WRITEV_RECORD] * 5)
    assert e.value.written == 0
    assert os.path.getsize(dq.file_name(dq.write_file_num)) == dq.write_pos == 9
    assert dq.read(10) == [b"first"]
    dq.close()


_op = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 70)),
    st.tuples(st.just("put_many"), st.lists(st.integers(0, 70), max_size=8)),
    st.tuples(st.just("put_heads"), st.lists(st.integers(3, 70), max_size=8)),
    st.tuples(st.just("read"), st.tuples(st.integers(0, 9), st.integers(0, 90), st.booleans())),
    st.tuples(st.just("read_into"), st.tuples(st.integers(0, 9), st.integers(0, 90), st.booleans())),
    st.tuples(st.just("reopen"), st.none()),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, max_size=40), max_bytes=st.integers(min_value=8, max_value=300))
def test_model_with_large_records(ops, max_bytes):
    """go-diskqueue's FIFO, with a read chunk of 24 bytes and pwritev from 8: most records
    take the direct read (in one or two pieces) and the vectored write, under byte bounds,
    while reads and writes interleave in the same segment."""
    with (
        mock.patch.object(dqmod, "READ_CHUNK", 24),
        mock.patch.object(dqmod, "WRITEV_RECORD", 8),
        mock.patch.object(dqmod, "_IOV_MAX", 7),
        tempfile.TemporaryDirectory() as d,
    ):

        def open_q():
            return mk(d, max_bytes_per_file=max_bytes, min_msg_size=0, max_msg_size=70)

        def data(n: int) -> bytes:
            return bytes(random.randrange(256) for _ in range(n))

        dq = open_q()
        model: deque[bytes] = deque()
        for name, arg in ops:
            if name == "put":
                r = data(arg)
                dq.put(r)
                model.append(r)
            elif name == "put_many":
                rs = [data(n) for n in arg]
                dq.put_many(rs)
                model.extend(rs)
            elif name == "put_heads":
                rs = [data(n) for n in arg]
                dq.put_many([r[3:] for r in rs], None, [r[:3] for r in rs])
                model.extend(rs)
            elif name in ("read", "read_into"):
                count, nbytes, split = arg
                t = Tails(3) if split else None
                pos: list[int] = []
                if name == "read":
                    got = joined(dq.read(count, pos, nbytes, t), t)
                else:
                    seen: list[bytes] = []
                    dq.read_into(count, seen.extend, pos, nbytes, t)
                    got = joined(seen, t)
                assert got == list(model)[: len(got)]
                assert bool(got) == bool(count and model)
                if nbytes and len(got) > 1:  # records after the first start within the bound
                    assert sum(4 + len(r) for r in got[:-1]) < nbytes
                assert len(pos) == len(got)
                for _ in got:
                    model.popleft()
            else:
                state = (dq.depth, dq.read_file_num, dq.read_pos, dq.write_file_num, dq.write_pos)
                dq.close()
                dq = open_q()
                assert (dq.depth, dq.read_file_num, dq.read_pos, dq.write_file_num, dq.write_pos) == state
            assert dq.depth == len(model)
        rest: list[bytes] = []
        while True:
            got = dq.read(7)
            if not got:
                break
            rest += got
        assert rest == list(model)
        dq.close()


# --- records and messages -------------------------------------------------------------------


def test_disk_records_and_decode_split_round_trip(tmp_path):
    big = [Message(b"%016x" % i, bytes([i]) * (READ_CHUNK + i), 10**18 + i, i) for i in range(3)]
    records, heads = disk_records(big)
    assert heads is not None and records == [m.body for m in big]
    assert [h + r for h, r in zip(heads, records, strict=True)] == [
        encode_message(m.timestamp, m.attempts, m.id, m.body) for m in big
    ]
    small = [Message(b"%016x" % 9, b"tiny", 5, 1)]
    assert disk_records(small) == ([encode_message(5, 1, small[0].id, b"tiny")], None)
    dq = mk(tmp_path, min_msg_size=1)
    dq.put_many(records, None, heads)
    dq.put_many(*disk_records(small))
    t = Tails(MESSAGE_BODY_OFFSET)
    got = dq.read(10, None, 0, t)
    msgs = decode_split(got, t, "test")
    assert [(m.id, m.body, m.timestamp, m.attempts) for m in msgs] == [
        (m.id, m.body, m.timestamp, m.attempts) for m in [*big, *small]
    ]
    assert all(msgs[i].body is t[i] for i in range(3))  # the tail as read, not a copy
    parts, hs = joined_pieces(got, t)
    assert hs is got and [h + p for h, p in zip(hs, parts, strict=True)] == joined(got, t)
    dq.close()


# --- receiving in place ---------------------------------------------------------------------


def _receive(parser: CommandParser, data: bytes, cuts: list[int]) -> list:
    """Feed ``data`` to ``parser`` through get_buffer/received, in reads cut at ``cuts``."""
    out = []
    pos = 0
    for cut in [*sorted(cuts), len(data)]:
        while pos < cut:
            buf = parser.get_buffer()
            n = min(len(buf), cut - pos)
            buf[:n] = data[pos : pos + n]
            parser.received(n)
            pos += n
            while (cmd := parser.next()) is not None:
                out.append(cmd)
    return out


def _stream(bodies: list[bytes]) -> bytes:
    return (
        commands.pub("t", bodies[0])
        + b"NOP\n"
        + commands.mpub("t", bodies)
        + commands.identify({"client_id": "x" * (RECEIVE_IN_PLACE + 5)})
        + commands.dpub("t", 5, bodies[-1])
        + b"FIN 0123456789abcdef\n"
    )


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(
        st.sampled_from([1, 100, RECEIVE_IN_PLACE - 1, RECEIVE_IN_PLACE, 3 * RECEIVE_IN_PLACE]),
        min_size=1,
        max_size=4,
    ),
    cuts=st.lists(st.integers(0, 1 << 20), max_size=12),
)
def test_receiving_in_place_parses_as_feeding(sizes, cuts):
    bodies = [bytes([i + 1]) * n for i, n in enumerate(sizes)]
    data = _stream(bodies)
    cuts = [c % (len(data) + 1) for c in cuts]
    fed = CommandParser()
    fed.feed(data)
    expected = []
    while (cmd := fed.next()) is not None:
        expected.append(cmd)
    got = _receive(CommandParser(), data, cuts)
    assert [(n, p, None if b is None else bytes(b)) for n, p, b in got] == expected
    for name, _, body in got:  # only an MPUB body may stay the bytearray it was received into
        assert body is None or type(body) is bytes or (name == b"MPUB" and type(body) is bytearray)


def test_a_large_body_is_received_into_its_own_buffer():
    p = CommandParser()
    body = b"z" * (4 * RECEIVE_IN_PLACE)
    data = commands.mpub("t", [body, body])
    head = data[:100]
    _receive(p, head, [])
    buf = p.get_buffer()
    assert len(buf) == len(data) - 100  # exactly the rest of the body: nothing past it
    buf[:] = data[100:]
    p.received(len(buf))
    name, params, got = p.next()
    assert (name, params) == (b"MPUB", [b"MPUB", b"t"]) and type(got) is bytearray
    assert commands.decode_mpub(got, 1 << 30, 1 << 30) == [body, body]
    assert p.buffered == 0 and p.next() is None
    # after it, small reads go to the shared scratch buffer again
    assert p.get_buffer() is commands.receive_scratch()


# --- sending without a copy -------------------------------------------------------------------


class _Owner:
    pass


def _send(fn, msgs):
    out: list = []
    res = fn(deque(msgs), len(msgs), _Owner(), {}, deque(), 61.5, 1.5, out)
    return res, out


def test_send_batch_leaves_large_bodies_uncopied():
    hot = load_hot(Message)
    sizes = [5, LARGE_BODY, 7, 9, LARGE_BODY + 3, 2 * LARGE_BODY, 1]
    mk_msgs = lambda: [Message(b"%016x" % i, bytes([i + 1]) * n, 10**18 + i, 0) for i, n in enumerate(sizes)]  # noqa: E731
    a_msgs, b_msgs = mk_msgs(), mk_msgs()
    (sent_a, nbytes_a), out_a = _send(hot.send_batch, a_msgs)
    (sent_b, nbytes_b), out_b = _send(send_batch_py, b_msgs)
    wire = b"".join(encode_message_frame(m.timestamp, 1, m.id, m.body) for m in a_msgs)
    assert b"".join(out_a) == b"".join(out_b) == wire
    assert (sent_a, nbytes_a) == (sent_b, nbytes_b) == (len(sizes), len(wire))
    large = [m.body for m in a_msgs if len(m.body) >= LARGE_BODY]
    assert [x for x in out_a if len(x) >= LARGE_BODY] == large
    assert all(any(x is b for x in out_a) for b in large)  # the body objects themselves
    assert len(out_a) == 7  # runs: [0,1 hdr] body1 [2,3,4 hdr] body4 [5 hdr] body5 [6]


class _Transport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def write(self, data) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, parts) -> None:
        self.calls.append(("writelines", list(parts)))


def test_flush_writes_large_pieces_as_they_are():
    c = cvmod.ClientV2.__new__(cvmod.ClientV2)
    c._held = 0
    c._flush_timer = None
    c._stack = None
    c.transport = _Transport()  # type: ignore[assignment]
    big = b"b" * MiB
    c._out = [b"header", big]
    c._out_len = 6 + MiB
    c.flush()
    assert c.transport.calls == [("writelines", [b"header", big])]
    assert c.transport.calls[0][1][1] is big and c._out == [] and c._out_len == 0
    c.transport.calls.clear()
    c._out = [b"a" * 30, b"b" * 30, b"c" * 30]
    c._out_len = 90
    c.flush()
    assert c.transport.calls == [("write", b"a" * 30 + b"b" * 30 + b"c" * 30)]


# --- through nsqd -----------------------------------------------------------------------------


async def _consume(c: RawClient, n: int) -> list:
    out = []
    for _ in range(n):
        m = await c.read_message(timeout=20)
        c.send(commands.fin(m.id))
        out.append(m)
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mem", [0, 3])
async def test_one_mib_messages_through_nsqd(tmp_path, mem):
    """1 MiB messages (NSQ's default --max-msg-size) published while the topic has no
    channel, so they wait on disk in 1.5 MiB segments, then read back by a consumer with
    RDY 5 while more are published: every body intact, each delivered once."""
    opts = make_options(tmp_path, mem_queue_size=mem, max_bytes_per_file=3 * MiB // 2)
    bodies = [bytes([i]) * (MiB - i) for i in range(12)]
    async with NSQD(opts) as d:
        p = await RawClient.connect(d.tcp_port)
        for i in range(0, 8, 2):
            p.send(commands.mpub("big", bodies[i : i + 2]))
            assert await p.read_frame(timeout=20) == (0, b"OK")
        assert d.topics["big"].depth == 8
        c = await RawClient.connect(d.tcp_port)
        await c.sub("big", "ch", 5)
        got = await _consume(c, 4)
        for b in bodies[8:]:
            assert await p.pub("big", b) == (0, b"OK")
        got += await _consume(c, 8)
        assert sorted(m.body for m in got) == sorted(bodies)
        if mem == 0:
            assert [m.body for m in got] == bodies  # through the disk queues, in order
        ch = d.topics["big"].channels["ch"]
        await wait_for(lambda: not ch.in_flight and ch.depth == 0)
        await p.close()
        await c.close()


@pytest.mark.timeout(60)
async def test_read_ahead_is_bounded_in_bytes(tmp_path):
    """A consumer with RDY 40 that reads nothing: nsqd reads from disk what its connection
    takes (the socket's buffers, then a paused transport), not 40 MiB at once."""
    opts = make_options(tmp_path, mem_queue_size=0)
    async with NSQD(opts) as d:
        p = await RawClient.connect(d.tcp_port)
        body = b"r" * MiB
        for _ in range(20):
            p.send(commands.mpub("ra", [body, body]))
            assert await p.read_frame(timeout=20) == (0, b"OK")
        ch_topic = d.topics["ra"]
        c = await RawClient.connect(d.tcp_port)
        await c.sub("ra", "ch")
        ch = ch_topic.channels["ch"]
        await wait_for(lambda: ch_topic.depth == 0)
        c.send(commands.rdy(40))
        client = await wait_for(lambda: next(iter(ch.clients.values()), None))
        await wait_for(lambda: client._write_paused_at)  # its connection is full
        await asyncio.sleep(0.2)  # several pump turns: none may read on
        assert client._write_paused_at
        assert len(ch.in_flight) < 30, len(ch.in_flight)
        assert ch.backend.depth > 10
        got = await _consume(c, 40)
        assert all(m.body == body for m in got)
        await p.close()
        await c.close()


@pytest.mark.timeout(60)
async def test_topic_backlog_moves_to_a_channel_a_few_large_messages_a_turn(tmp_path):
    """A topic's disk backlog of 1 MiB messages reaches a new channel DRAIN_BYTES at a time
    (one record per turn here), never the whole segment at once."""
    opts = make_options(tmp_path, mem_queue_size=0)
    async with NSQD(opts) as d:
        p = await RawClient.connect(d.tcp_port)
        for i in range(3):
            p.send(commands.mpub("bl", [bytes([i]) * MiB, bytes([i]) * MiB]))
            assert await p.read_frame(timeout=20) == (0, b"OK")
        topic = d.topics["bl"]
        topic.pause()
        ch = topic.get_channel("ch")
        assert topic.backend.depth == 6 and ch.depth == 0
        topic.paused = False  # one turn of the drain, by hand
        topic._drain_backend()
        per_turn = -(-tmod.DRAIN_BYTES // (MiB + 4 + MESSAGE_BODY_OFFSET))
        assert topic.backend.depth == 6 - per_turn and ch.depth == per_turn
        topic.unpause()
        await wait_for(lambda: ch.depth == 6 and topic.depth == 0)
        await p.close()
