"""Crash-safe delivery's state on disk (nsqd/journal.py): the floor a channel's DiskQueue
keeps, the journal beside it, and what a restart makes of them.

The state machine at the end drives a channel's DiskQueue and Ledger as the channel does
(publish, read ahead, deliver, FIN, REQ with and without a delay, move the floor, compact,
sync, empty) and kills the process in the middle of any write it makes — the torn prefix of
that write left on disk — or between two steps; each time, a new DiskQueue and Ledger are
opened on the files, and what they read back is compared with a model of what was promised:
no acknowledged message that was not finished is missing, attempts and due times are kept.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import tempfile
import zlib
from collections import deque

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nsqpy.nsqd import diskqueue, journal
from nsqpy.nsqd.channel import decode_records, encode_messages
from nsqpy.nsqd.diskqueue import DiskQueue, position
from nsqpy.nsqd.journal import (
    DELIVERED,
    DUE,
    FINISHED,
    MAGIC,
    Journal,
    Ledger,
    Window,
    journal_path,
)
from nsqpy.nsqd.message import Message

LOG = logging.getLogger("test.journal")
HOUR = 3600 * 10**9


def record(kind: bytes, pos: int, msg_id: bytes, value: int) -> bytes:
    return struct.pack(">cq16sq", kind, pos, msg_id, value)


def frame(payload: bytes) -> bytes:
    return struct.pack(">II", len(payload), zlib.crc32(payload)) + payload


def mid(n: int) -> bytes:
    return b"%016x" % n


# ---------------------------------------------------------------- the window


def test_window_floor_moves_past_finished_records_in_order():
    w = Window()
    assert w.floor() is None and w.span == 0
    first = w.extend([position(0, 0), position(0, 30), position(0, 60)], [mid(1), mid(2), mid(3)])
    assert first == 0
    assert w.floor() == position(0, 0) and w.span == 3
    assert w.finish(1) == position(0, 30)  # out of order: the floor stays
    assert w.floor() == position(0, 0)
    assert w.finish(0) == position(0, 0)  # the oldest: the floor jumps past both
    assert w.floor() == position(0, 60) and w.span == 1
    assert list(w.finished_entries()) == []
    seq = w.add(position(1, 0), mid(4), done=True)
    assert seq == 3 and list(w.finished_entries()) == [(position(1, 0), mid(4))]
    w.finish(2)
    assert w.floor() is None and w.span == 0


def test_window_drops_its_finished_front_and_keeps_sequence_numbers():
    w = Window()
    n = 20000
    w.extend([position(0, 10 * i) for i in range(n)], [mid(i) for i in range(n)])
    for seq in range(n - 1):
        w.finish(seq)
    assert w.base > 0 and len(w.pos) < n  # compacted
    assert w.floor() == position(0, 10 * (n - 1)) and w.span == 1
    assert w.position_of(n - 1) == position(0, 10 * (n - 1))
    assert w.finish(n - 1) == position(0, 10 * (n - 1))
    assert w.floor() is None


# ---------------------------------------------------------------- the journal file


def test_journal_replays_whole_frames_and_cuts_a_torn_tail(tmp_path):
    path = str(tmp_path / "q.diskqueue.journal.dat")
    good = [record(FINISHED, 5, mid(1), 0), record(DUE, 9, mid(2), 1234)]
    data = MAGIC + frame(good[0]) + frame(good[1])
    torn = frame(record(DELIVERED, 12, mid(3), 2))[:-5]
    with open(path, "wb") as f:
        f.write(data + torn)
    j = Journal(path, LOG)
    assert j.replay() == [(FINISHED, 5, mid(1), 0), (DUE, 9, mid(2), 1234)]
    assert os.path.getsize(path) == len(data)  # appends continue after the last whole frame
    j.add(DELIVERED, 12, mid(3), 2)
    j.flush()
    assert Journal(path, LOG).replay()[-1] == (DELIVERED, 12, mid(3), 2)


def test_journal_stops_at_a_frame_that_fails_its_checksum(tmp_path):
    path = str(tmp_path / "q.diskqueue.journal.dat")
    bad = bytearray(frame(record(FINISHED, 7, mid(7), 0)))
    bad[-1] ^= 0xFF
    with open(path, "wb") as f:
        f.write(
            MAGIC + frame(record(FINISHED, 5, mid(5), 0)) + bytes(bad) + frame(record(FINISHED, 9, mid(9), 0))
        )
    assert [r[1] for r in Journal(path, LOG).replay()] == [5]


def test_a_file_that_is_not_a_journal_is_set_aside(tmp_path):
    path = tmp_path / "q.diskqueue.journal.dat"
    path.write_bytes(b"something else entirely")
    assert Journal(str(path), LOG).replay() == []
    assert not path.exists() and (tmp_path / "q.diskqueue.journal.dat.bad").exists()


def test_rewrite_replaces_the_file_and_an_empty_state_removes_it(tmp_path):
    path = str(tmp_path / "q.diskqueue.journal.dat")
    j = Journal(path, LOG)
    j.add(FINISHED, 1, mid(1), 0)
    j.flush()
    j.rewrite(record(DUE, 2, mid(2), 5))
    assert Journal(path, LOG).replay() == [(DUE, 2, mid(2), 5)]
    j.add(FINISHED, 3, mid(3), 0)
    j.flush()  # appends to the rewritten file
    assert len(Journal(path, LOG).replay()) == 2
    j.rewrite(b"")
    assert not os.path.exists(path)


# ---------------------------------------------------------------- a channel's queue and ledger


class Node:
    """A channel's DiskQueue and Ledger, driven the way the Channel drives them (without the
    daemon), and the channel's messages in memory (``queue``, ``in_flight``, ``deferred``)."""

    def __init__(self, path: str, max_bytes: int = 1 << 20) -> None:
        self.queue: deque[Message] = deque()
        self.in_flight: dict[bytes, Message] = {}
        self.deferred: dict[Message, int] = {}
        self.dq = DiskQueue(
            "t:c",
            path,
            max_bytes_per_file=max_bytes,
            min_msg_size=26,
            max_msg_size=26 + 64,
            sync_every=1,
            sync_timeout=3600.0,
            log=LOG,
        )
        self.ledger = Ledger(self.dq, True, LOG, self.live)

    def live(self):
        yield from self.queue
        yield from self.in_flight.values()
        yield from self.deferred

    def publish(self, msgs: list[Message], now: int) -> None:
        records = encode_messages(msgs)
        if any(m.defer for m in msgs):
            self.ledger.wrote(msgs, self.dq.next_positions(map(len, records)), now)
        self.dq.put_many(records)

    def read(self, n: int, now: int) -> tuple[list[Message], list[tuple[Message, int]]]:
        return self.ledger.read(n, decode_records, now)

    def read_all(self, now: int) -> tuple[list[Message], list[tuple[Message, int]]]:
        now_msgs: list[Message] = []
        later: list[tuple[Message, int]] = []
        for _ in range(10000):
            a, b = self.read(100, now)
            if not a and not b and not self.dq.depth:
                return now_msgs, later
            now_msgs += a
            later += b
        raise AssertionError("the queue never ran dry")

    def sync(self, force_meta: bool = True) -> None:
        self.dq.prepare_sync(force_meta=force_meta).run()

    def abandon(self) -> None:
        """The process died: drop the descriptors, write nothing."""
        self.dq._closed = True
        self.dq._close_files()
        self.ledger.journal.close()


def msg(n: int, body: bytes = b"body", defer: float = 0.0) -> Message:
    m = Message(mid(n), body + b"-%d" % n, 1_700_000_000_000_000_000 + n)
    m.defer = defer
    return m


def test_a_restart_reads_from_the_floor_and_skips_what_was_finished(tmp_path):
    node = Node(str(tmp_path))
    node.publish([msg(i) for i in range(6)], 0)
    node.sync()
    got, _ = node.read(6, 0)
    assert [m.id for m in got] == [mid(i) for i in range(6)]
    node.ledger.delivering(deque(got), len(got))  # all six handed out (attempts 1)
    for m in got:
        m.attempts += 1
    for i in (1, 2, 4):
        node.ledger.finished(got[i])
    node.ledger.flush()
    node.sync()
    # the floor is the first unfinished record, and the depth counts from there
    assert node.dq.metadata_text().splitlines()[:2] == ["6", "0,0"]
    node.abandon()
    again = Node(str(tmp_path))
    back, later = again.read_all(0)
    assert later == []
    assert [(m.id, m.attempts) for m in back] == [(mid(0), 1), (mid(3), 1), (mid(5), 1)]


def test_deferred_records_keep_their_due_time_and_finished_ones_stay_finished(tmp_path):
    node = Node(str(tmp_path))
    node.publish([msg(1, defer=60.0), msg(2)], 1000)  # DPUB and PUB
    node.sync()
    now_msgs, later = node.read(2, 1000)
    assert [m.id for m in now_msgs] == [mid(2)]
    assert [(m.id, due) for m, due in later] == [(mid(1), 1000 + 60 * 10**9)]
    node.ledger.delivering(deque(now_msgs), 1)
    now_msgs[0].attempts = 1
    node.ledger.deferred(now_msgs[0], 5000 + HOUR)  # REQ with a delay
    node.ledger.flush()
    node.abandon()
    again = Node(str(tmp_path))
    now_msgs, later = again.read_all(2000)
    assert now_msgs == []
    assert sorted((m.id, due, m.attempts) for m, due in later) == [
        (mid(1), 1000 + 60 * 10**9, 0),
        (mid(2), 5000 + HOUR, 1),
    ]
    # once due, they are simply queued
    third = Node.__new__(Node)
    again.abandon()
    third.__init__(str(tmp_path))
    now_msgs, later = third.read_all(10 * HOUR)
    assert sorted(m.id for m in now_msgs) == [mid(1), mid(2)] and later == []


def test_segments_are_deleted_only_once_the_floor_has_passed_them(tmp_path):
    node = Node(str(tmp_path), max_bytes=200)  # a few records per segment
    node.publish([msg(i) for i in range(20)], 0)
    node.sync()
    got, _ = node.read(20, 0)
    segments = lambda: sorted(f for f in os.listdir(tmp_path) if f.startswith("t:c.diskqueue.0"))  # noqa: E731
    before = segments()
    assert len(before) > 3
    for m in got[1:]:
        node.ledger.finished(m)  # everything but the first
    node.sync()
    assert segments() == before  # the floor is still in the first segment
    node.ledger.finished(got[0])
    node.sync()
    assert segments() == before[-1:]  # only the write segment is left


def test_a_pinned_floor_moves_and_the_copy_is_adopted(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "RELOCATE_MIN_SPAN", 8)
    node = Node(str(tmp_path), max_bytes=300)
    node.publish([msg(i) for i in range(40)], 0)
    node.sync()
    got, _ = node.read(40, 0)
    node.ledger.delivering(deque(got), len(got))
    for m in got:
        m.attempts = 1
    held = got[0]
    node.deferred[held] = 7 * HOUR  # REQ'd with a long delay
    for m in got[1:]:
        node.ledger.finished(m)
    node.ledger.flush()
    assert node.ledger.window.span == 40  # one message holds the floor back
    assert node.ledger.relocate(lambda: dict(node.deferred)) == 1
    assert node.ledger.window.span == 0 and list(node.ledger.moved) == [held.id]
    # the reader reaches the copy: the message in memory is anchored to it, nothing new
    now_msgs, later = node.read(10, 0)
    assert now_msgs == [] and later == [] and list(node.ledger.anchors) == [held.id]
    node.abandon()
    again = Node(str(tmp_path))
    now_msgs, later = again.read_all(0)
    assert now_msgs == [] and [(m.id, due, m.attempts) for m, due in later] == [(held.id, 7 * HOUR, 1)]


def test_finishing_a_moved_message_before_its_copy_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "RELOCATE_MIN_SPAN", 4)
    node = Node(str(tmp_path))
    node.publish([msg(i) for i in range(10)], 0)
    node.sync()
    got, _ = node.read(10, 0)
    node.in_flight[got[0].id] = got[0]
    for m in got[1:]:
        node.ledger.finished(m)
    assert node.ledger.relocate(dict) == 1
    node.ledger.finished(got[0])  # FIN while the copy is ahead of the reader
    node.ledger.flush()
    node.sync()
    assert node.read(10, 0) == ([], [])  # the copy is skipped
    node.abandon()
    assert Node(str(tmp_path)).read_all(0) == ([], [])


def test_a_stale_journal_never_hides_a_different_message(tmp_path):
    """Positions are checked with ids: a journal left by an earlier queue of the same name
    (deleted by the Go nsqd, say) skips nothing of the new one."""
    node = Node(str(tmp_path))
    node.publish([msg(1)], 0)
    node.sync()
    got, _ = node.read(1, 0)
    node.ledger.finished(got[0])
    node.ledger.flush()
    path = journal_path(node.dq)
    kept = open(path, "rb").read()
    node.abandon()
    for f in os.listdir(tmp_path):
        os.remove(tmp_path / f)  # the queue is gone, recreated with a new message
    node = Node(str(tmp_path))
    node.publish([msg(2)], 0)
    node.sync()
    node.abandon()
    with open(path, "wb") as f:
        f.write(kept)  # the old journal: "finished at position 0"
    again = Node(str(tmp_path))
    assert [m.id for m in again.read_all(0)[0]] == [mid(2)]


def test_a_replay_only_ledger_applies_the_journal_then_goes(tmp_path):
    """A directory written in the crash-safe mode, started without it: the journal is
    applied to the records it names, then deleted."""
    node = Node(str(tmp_path))
    node.publish([msg(1), msg(2), msg(3)], 0)
    node.sync()
    got, _ = node.read(3, 0)
    node.ledger.finished(got[1])
    node.ledger.flush()
    node.sync()
    node.abandon()
    dq = DiskQueue(
        "t:c",
        str(tmp_path),
        max_bytes_per_file=1 << 20,
        min_msg_size=26,
        max_msg_size=90,
        sync_every=1,
        sync_timeout=1.0,
    )
    ledger = Ledger.open(dq, False, LOG)
    assert ledger is not None and not ledger.tracking
    now_msgs, _ = ledger.read(10, decode_records, 0)
    assert [m.id for m in now_msgs] == [mid(1), mid(3)]
    assert ledger.spent
    dq.close()


# ---------------------------------------------------------------- killed at any write


class Crash(BaseException):
    """kill -9: not an error any handler of the code under test would catch."""


class Writes:
    """The writes of the code under test (data, journal, metadata, renames, deletions). Armed
    with ``n``, the n-th next one puts a torn prefix of its bytes on disk and raises Crash."""

    def __init__(self) -> None:
        self.countdown: int | None = None
        self.tear = 0.0
        self.real = {
            "write": os.write,
            "pwrite": os.pwrite,
            "replace": os.replace,
            "remove": os.remove,
            "ftruncate": os.ftruncate,
        }

    def _hit(self) -> bool:
        if self.countdown is None:
            return False
        if self.countdown > 0:
            self.countdown -= 1
            return False
        self.countdown = None
        return True

    def write(self, fd, data):
        if self._hit():
            self.real["write"](fd, bytes(data)[: int(len(data) * self.tear)])
            raise Crash()
        return self.real["write"](fd, data)

    def pwrite(self, fd, data, pos):
        if self._hit():
            cut = int(len(data) * self.tear)
            if os.readlink(f"/proc/self/fd/{fd}").endswith(".meta.dat"):
                # the metadata's one small write at offset 0, in one sector: whole or not at
                # all (a kill -9 cannot cut a write short; a power loss keeps sectors whole)
                cut = len(data) if self.tear >= 0.5 else 0
            self.real["pwrite"](fd, bytes(data)[:cut], pos)
            raise Crash()
        return self.real["pwrite"](fd, data, pos)

    def replace(self, a, b):
        if self._hit():
            raise Crash()
        return self.real["replace"](a, b)

    def remove(self, p):
        if self._hit():
            raise Crash()
        return self.real["remove"](p)

    def ftruncate(self, fd, n):
        if self._hit():
            raise Crash()
        return self.real["ftruncate"](fd, n)

    def install(self) -> None:
        for name in self.real:
            setattr(os, name, getattr(self, name))
        diskqueue._pwrite = self.pwrite

    def uninstall(self) -> None:
        for name, fn in self.real.items():
            setattr(os, name, fn)
        diskqueue._pwrite = self.real["pwrite"]


class CrashSafeChannel(RuleBasedStateMachine):
    """The model: what was acknowledged (published, then synced), finished (FIN), handed out
    (attempts whose D record was written before the "send") and deferred (due times whose
    T record was written)."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="journal-sm-")
        self.writes = Writes()
        self.saved = (journal.RELOCATE_MIN_SPAN, journal.RELOCATE_FACTOR, journal.COMPACT_MIN_BYTES)
        journal.RELOCATE_MIN_SPAN = 4
        journal.RELOCATE_FACTOR = 1
        journal.COMPACT_MIN_BYTES = 2048
        self.writes.install()
        self.next_id = 0
        self.now = 10**12
        self.published: set[bytes] = set()
        self.acked: set[bytes] = set()
        self.finished: set[bytes] = set()
        self.attempts: dict[bytes, int] = {}
        self.due: dict[bytes, int] = {}
        self.unflushed_due: dict[bytes, int] = {}
        self.node: Node
        self.crashes = 0

    @initialize(max_bytes=st.integers(min_value=60, max_value=400))
    def start(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.node = Node(self.dir, max_bytes)

    def teardown(self) -> None:
        self.writes.uninstall()
        journal.RELOCATE_MIN_SPAN, journal.RELOCATE_FACTOR, journal.COMPACT_MIN_BYTES = self.saved
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def queue(self) -> deque[Message]:
        return self.node.queue

    @property
    def in_flight(self) -> dict[bytes, Message]:
        return self.node.in_flight

    @property
    def deferred(self) -> dict[Message, int]:
        return self.node.deferred

    # --- steps (each may be killed at a write) ------------------------------------------------

    def step(self, fn) -> None:
        try:
            fn()
        except Crash:
            event(f"killed in {fn.__qualname__.split('.')[1]}")
            self.recover()

    def flushed(self) -> None:
        """The journal's buffer reached the file: REQ due times are durable now."""
        self.due.update(self.unflushed_due)
        self.unflushed_due.clear()

    @rule(n=st.integers(min_value=1, max_value=8), deferred=st.booleans())
    def publish(self, n: int, deferred: bool) -> None:
        msgs = []
        for _ in range(n):
            self.next_id += 1
            msgs.append(msg(self.next_id, defer=3600.0 if deferred else 0.0))
        ids = [m.id for m in msgs]
        self.published.update(ids)

        def go() -> None:
            self.node.publish(msgs, self.now)
            self.node.sync(force_meta=False)
            self.acked.update(ids)  # the OK
            if deferred:
                for i in ids:
                    self.due[i] = self.now + HOUR

        self.step(go)

    @rule(n=st.integers(min_value=1, max_value=8))
    def read_ahead(self, n: int) -> None:
        now_msgs, later = self.node.read(n, self.now)
        self.queue.extend(now_msgs)
        for m, due in later:
            self.deferred[m] = due

    @rule(k=st.integers(min_value=1, max_value=5))
    def deliver(self, k: int) -> None:
        def go() -> None:
            n = min(k, len(self.queue))
            self.node.ledger.delivering(self.queue, n)
            self.flushed()
            for _ in range(n):
                m = self.queue.popleft()
                m.attempts += 1
                self.in_flight[m.id] = m
                self.attempts[m.id] = m.attempts  # sent
            self.node.ledger.sent(n)

        self.step(go)

    @precondition(lambda self: self.in_flight)
    @rule(i=st.integers(min_value=0), how=st.sampled_from(["fin", "fin", "req", "req-delay"]))
    def answer(self, i: int, how: str) -> None:
        m = list(self.in_flight.values())[i % len(self.in_flight)]
        del self.in_flight[m.id]
        if how == "fin":
            self.node.ledger.finished(m)
            self.finished.add(m.id)
        elif how == "req":
            self.queue.append(m)
        else:
            due = self.now + HOUR + self.next_id
            self.deferred[m] = due
            self.unflushed_due[m.id] = due

            def go() -> None:
                self.node.ledger.deferred(m, due)  # written at once
                self.flushed()

            self.step(go)

    @rule()
    def time_passes(self) -> None:
        self.now += 2 * HOUR
        for m in [m for m, due in self.deferred.items() if due <= self.now]:
            del self.deferred[m]
            self.queue.append(m)
        # due now: read or not, such a message is simply queued after a restart
        self.due = {i: d for i, d in self.due.items() if d > self.now}
        self.unflushed_due = {i: d for i, d in self.unflushed_due.items() if d > self.now}

    @rule()
    def flush(self) -> None:
        def go() -> None:
            self.node.ledger.flush()
            self.flushed()

        self.step(go)

    @rule(force_meta=st.booleans())
    def sync(self, force_meta: bool) -> None:
        def go() -> None:
            self.node.sync(force_meta)
            self.flushed()

        self.step(go)

    @rule()
    def move_the_floor(self) -> None:
        def go() -> None:
            moved = self.node.ledger.relocate(lambda: dict(self.deferred))
            event(f"moved {min(moved, 2)}+ message(s)")
            self.node.ledger.flush()
            self.flushed()

        self.step(go)

    @rule()
    def compact(self) -> None:
        def go() -> None:
            self.node.ledger.compact(dict(self.deferred))
            self.flushed()

        self.step(go)

    @rule(n=st.integers(min_value=0, max_value=12), tear=st.floats(min_value=0.0, max_value=1.0))
    def kill_at_a_write(self, n: int, tear: float) -> None:
        self.writes.countdown = n
        self.writes.tear = tear

    @rule()
    def kill_now(self) -> None:
        self.recover()

    @rule()
    def empty(self) -> None:
        """The channel is emptied: nothing it held is owed any more (even if the kill comes
        while the files go)."""
        self.acked.clear()
        self.attempts.clear()
        self.due.clear()
        self.unflushed_due.clear()
        self.queue.clear()
        self.in_flight.clear()
        self.deferred.clear()

        def go() -> None:
            self.node.dq.empty()
            self.node.ledger.empty()

        self.step(go)

    # --- the crash and what must survive it ----------------------------------------------------

    def recover(self) -> None:
        self.writes.countdown = None
        self.crashes += 1
        self.node.abandon()
        self.node = Node(self.dir, self.max_bytes)
        now_msgs, later = self.node.read_all(self.now)
        got: dict[bytes, list[tuple[int, int | None]]] = {}
        for m in now_msgs:
            got.setdefault(m.id, []).append((m.attempts, None))
        for m, due in later:
            got.setdefault(m.id, []).append((m.attempts, due))
        owed = self.acked - self.finished
        missing = owed - got.keys()
        assert not missing, f"acknowledged, never finished and lost: {sorted(missing)}"
        assert got.keys() <= self.published, "a message nobody published"
        for i, copies in got.items():
            if i not in self.acked:
                continue  # published without an OK, or emptied while the kill came
            attempts = max(a for a, _ in copies)
            sent = self.attempts.get(i, 0)
            assert sent <= attempts <= sent + 1, (i, sent, copies)
            if i in self.due and i not in self.finished:
                assert all(d == self.due[i] for _, d in copies), (i, self.due[i], copies)
        # the restarted channel holds what came back (a finished one may come back: again owed)
        for i, copies in got.items():
            self.attempts[i] = max(a for a, _ in copies)
        self.finished -= got.keys()
        self.acked |= got.keys()
        self.due = {i: d for i, d in self.due.items() if i in got}
        self.unflushed_due.clear()
        self.queue.extend(now_msgs)
        self.deferred.update(later)
        for m, due in later:
            self.due[m.id] = due

    @invariant()
    def depth_is_consistent(self) -> None:
        if hasattr(self, "node"):
            assert self.node.dq.depth >= 0


CrashSafeChannel.TestCase.settings = settings(
    max_examples=int(os.environ.get("NSQPY_JOURNAL_EXAMPLES", "300")),
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCrashSafeChannel = CrashSafeChannel.TestCase
pytestmark = pytest.mark.timeout(300)
