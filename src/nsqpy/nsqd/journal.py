"""Crash-safe delivery: what a queue did with the records it read, kept beside its DiskQueue.

An nsqpy addition. NSQ keeps what it has taken off its disk queue in memory only, so a crash
loses messages in flight, requeued, deferred or read ahead even with ``--mem-queue-size=0
--sync-every=1`` (nsqio/nsq #510, #625, #1107). In that mode (the *crash-safe mode*) every
message of a channel is in the channel's DiskQueue, and the channel reads ahead without
letting go of what it read: the read position the queue's metadata records is the **floor**,
the oldest record not yet finished, and segments are deleted only once the floor has passed
them (:class:`Window`). The journal beside the queue, ``<queue>.diskqueue.journal.dat``,
records what became of the records above the floor (:class:`Ledger`):

- ``F`` the record is finished (FIN, sampled out, emptied, or moved: see below): skip it;
- ``D`` the record was handed out: its attempts so far (written before the message is sent);
- ``T`` the record is deferred until a due time (REQ with a delay, DPUB).

After a crash (or a clean stop) the channel reads again from the floor and the journal says
which records to skip, what attempts the others had and which wait. A record is named by its
position in the queue *and* its message id, both checked, so a stale journal never hides a
message. A message that pins the floor far behind the reader (deferred for an hour, held by a
slow consumer) is **moved**: a copy is appended to the queue and fsynced, then the original
is journaled as finished (a crash in between leaves both: the second one read is dropped).
A topic's ledger only keeps the ``T`` records of the DPUB messages it holds while it has
no channel (or is paused).

The Go nsqd ignores the journal. On a directory written in this mode it starts from the
floor and delivers everything above it again (finished messages too, deferred ones at once):
more than once, never less.

File format: the 8 bytes ``NSQPYJ01``, then frames ``[uint32 length][uint32 CRC-32][records]``
(big endian), each record ``[kind:1][position:int64][id:16][value:int64]``, a position being
``segment number << 40 | offset``. One frame per write: replay stops at the first frame that
is short or fails its checksum (a torn write), and the file is cut there.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import zlib
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Protocol

from ..protocol.frames import MESSAGE_BODY_OFFSET as BODY_AT
from ..protocol.frames import MESSAGE_ID_OFFSET as ID_AT
from .diskqueue import DiskQueueError, position
from .fileio import path_error, remove_quietly, temp_name

if TYPE_CHECKING:
    from .diskqueue import DiskQueue
    from .message import Message

__all__ = [
    "JOURNAL_SUFFIX",
    "Journal",
    "Ledger",
    "Window",
]

#: ``<queue name>`` + this is the journal's file name in the data path
JOURNAL_SUFFIX = ".diskqueue.journal.dat"

MAGIC = b"NSQPYJ01"
FINISHED = b"F"
DELIVERED = b"D"
DUE = b"T"

_FRAME = struct.Struct(">II")
_RECORD = struct.Struct(">cq16sq")
RECORD_SIZE = _RECORD.size
_pack_record = _RECORD.pack

#: a journal is rewritten as its state once it is this big and 4x what that state takes
COMPACT_MIN_BYTES = 4 << 20
#: the floor is moved (pinning messages copied to the tail) once this many records are read
#: above it and they are RELOCATE_FACTOR times the messages still unfinished
RELOCATE_MIN_SPAN = 65536
RELOCATE_FACTOR = 4
#: finished entries dropped from the front of a window once there are this many
_WINDOW_COMPACT = 4096


class Floor(Protocol):
    """What a DiskQueue asks of the records it has read but may not let go of yet."""

    @property
    def span(self) -> int: ...

    def floor(self) -> int | None: ...


class Window:
    """The records read from a queue since the floor, in order: their positions, ids and
    whether each is finished. Sequence numbers count every record the window ever took."""

    __slots__ = ("base", "done", "head", "ids", "pos")

    def __init__(self) -> None:
        self.pos = array("q")
        self.ids = bytearray()
        self.done = bytearray()
        #: index of the first unfinished entry (the floor), len(pos) if none
        self.head = 0
        #: sequence number of index 0
        self.base = 0

    @property
    def span(self) -> int:
        """Entries from the floor on (finished or not): records read above the floor."""
        return len(self.pos) - self.head

    def floor(self) -> int | None:
        """The position of the oldest unfinished record, None when every one is finished."""
        return self.pos[self.head] if self.head < len(self.pos) else None

    def add(self, pos: int, msg_id: bytes, done: bool = False) -> int:
        """One record read; returns its sequence number."""
        seq = self.base + len(self.pos)
        self.pos.append(pos)
        self.ids += msg_id
        self.done.append(done)
        if done and self.head == seq - self.base:
            self._advance()
        return seq

    def extend(self, positions: Sequence[int], ids: Iterable[bytes]) -> int:
        """Unfinished records read in a row; returns the first one's sequence number."""
        seq = self.base + len(self.pos)
        self.pos.extend(positions)
        self.ids += b"".join(ids)
        self.done += bytes(len(positions))
        return seq

    def position_of(self, seq: int) -> int:
        return self.pos[seq - self.base]

    def finish(self, seq: int) -> int:
        """Mark a record finished (the floor moves on when it was the oldest); returns its
        position."""
        i = seq - self.base
        pos = self.pos[i]
        self.done[i] = 1
        if i == self.head:
            self._advance()
        return pos

    def _advance(self) -> None:
        h = self.done.find(0, self.head)
        self.head = len(self.done) if h < 0 else h
        if self.head >= _WINDOW_COMPACT and 2 * self.head >= len(self.done):
            h = self.head
            del self.pos[:h]
            del self.ids[: 16 * h]
            del self.done[:h]
            self.base += h
            self.head = 0

    def finished_entries(self) -> Iterable[tuple[int, bytes]]:
        """(position, id) of the finished entries above the floor."""
        done = self.done
        pos = self.pos
        ids = self.ids
        i = self.head
        while True:
            i = done.find(1, i)
            if i < 0:
                return
            yield pos[i], bytes(ids[16 * i : 16 * i + 16])
            i += 1

    def reset(self) -> None:
        self.base += len(self.pos)
        self.pos = array("q")
        self.ids = bytearray()
        self.done = bytearray()
        self.head = 0


class Journal:
    """The journal file: records buffered in memory, appended one frame per :meth:`flush`."""

    __slots__ = ("_fd", "buf", "dirty", "log", "path", "size")

    def __init__(self, path: str, log: logging.Logger) -> None:
        self.path = path
        self.log = log
        self._fd: int | None = None
        #: records not yet written
        self.buf = bytearray()
        #: bytes in the file
        self.size = 0
        #: written since the last :meth:`sync_fd`
        self.dirty = False

    def add(self, kind: bytes, pos: int, msg_id: bytes, value: int) -> None:
        self.buf += _pack_record(kind, pos, msg_id, value)

    def replay(self) -> list[tuple[bytes, int, bytes, int]]:
        """The records in the file, up to a torn or corrupt frame (the file is cut there).
        A file without the magic is set aside (``.bad``) and nothing is returned."""
        remove_quietly(temp_name(self.path, "rewrite"))  # a rewrite a crash cut short
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return []
        except OSError as e:
            self.log.error("JOURNAL(%s): failed to read - %s (ignored)", self.path, e)
            return []
        if raw[: len(MAGIC)] != MAGIC:
            if raw:
                self.log.error("JOURNAL(%s): not a journal, saved as .bad", self.path)
                try:
                    os.replace(self.path, self.path + ".bad")
                except OSError as e:
                    self.log.error("JOURNAL(%s): failed to set aside - %s", self.path, e)
            else:
                remove_quietly(self.path)
            return []
        out: list[tuple[bytes, int, bytes, int]] = []
        at = len(MAGIC)
        end = len(raw)
        while at + _FRAME.size <= end:
            n, crc = _FRAME.unpack_from(raw, at)
            body = at + _FRAME.size
            if n % RECORD_SIZE or body + n > end:
                break
            payload = raw[body : body + n]
            if zlib.crc32(payload) != crc:
                break
            out.extend(_RECORD.iter_unpack(payload))
            at = body + n
        if at < end:
            self.log.warning(
                "JOURNAL(%s): cutting a torn or corrupt tail at %d of %d bytes", self.path, at, end
            )
            try:
                os.truncate(self.path, at)
            except OSError as e:
                self.log.error("JOURNAL(%s): failed to truncate - %s", self.path, e)
        self.size = at
        return out

    def _open(self) -> int:
        fd = self._fd
        if fd is None:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                if os.fstat(fd).st_size == 0:
                    self._write(fd, MAGIC)
                    self.size = len(MAGIC)
            except OSError as e:
                if fd is not None:
                    os.close(fd)
                raise path_error("open", self.path, e) from None
            self._fd = fd
        return fd

    @staticmethod
    def _write(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            if n <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = view[n:]

    def flush(self) -> None:
        """Append the buffered records as one frame. Raises a PathError (``write <file>:
        …``); the records stay buffered, to be tried again."""
        buf = self.buf
        if not buf:
            return
        fd = self._open()
        payload = bytes(buf)
        frame = _FRAME.pack(len(payload), zlib.crc32(payload)) + payload
        try:
            self._write(fd, frame)
        except OSError as e:
            # a partial frame fails its checksum at replay; cut it off now all the same
            try:
                os.ftruncate(fd, self.size)
            except OSError:
                pass
            raise path_error("write", self.path, e) from None
        del buf[: len(payload)]
        self.size += len(frame)
        self.dirty = True

    def sync_fd(self) -> tuple[int, str] | None:
        """A descriptor to fsync (a duplicate, the caller closes it) if written since the
        last call."""
        if not self.dirty or self._fd is None:
            return None
        self.dirty = False
        return os.dup(self._fd), self.path

    def rewrite(self, records: bytes) -> None:
        """Replace the file by one frame of ``records`` (temp file, fsync, rename): the
        buffered records are dropped (``records`` says what is true now). Raises PathError."""
        self.buf.clear()
        self.close()
        if not records:
            self.delete()
            return
        tmp = temp_name(self.path, "rewrite")
        data = MAGIC + _FRAME.pack(len(records), zlib.crc32(records)) + records
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                self._write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as e:
            remove_quietly(tmp)
            raise path_error("write", tmp, e) from None
        self.size = len(data)
        self.dirty = True

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def delete(self) -> None:
        """Remove the file (the queue is gone, or the journal says nothing any more)."""
        self.buf.clear()
        self.close()
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
        except OSError as e:
            self.log.error("JOURNAL(%s): failed to remove - %s", self.path, e)
        self.size = 0
        self.dirty = False


def journal_path(dq: DiskQueue) -> str:
    return os.path.join(dq.data_path, dq.name + JOURNAL_SUFFIX)


def _reader_position(dq: DiskQueue) -> int:
    return position(dq.read_file_num, dq.read_pos)


class Ledger:
    """A channel's records read from its DiskQueue: which message each is (by id), what
    became of it, and what a journal left by an earlier run says about the records still
    ahead of the reader. A topic's only knows when its DPUB records are due.

    With ``tracking`` (the crash-safe mode) it keeps the floor and writes the journal;
    without, it only applies an earlier run's journal to the records it names, and is done
    (:attr:`spent`) once the reader has passed them. ``live`` gives the channel's messages
    in memory (queued, in flight, deferred): what is moved, and whose attempts a compacted
    journal keeps.
    """

    __slots__ = (
        "adopt",
        "anchors",
        "attempts",
        "dq",
        "dues",
        "journal",
        "live",
        "log",
        "moved",
        "queued",
        "skip",
        "tracking",
        "where",
        "window",
    )

    def __init__(
        self,
        dq: DiskQueue,
        tracking: bool,
        log: logging.Logger,
        live: Callable[[], Iterable[Message]] = tuple,
    ) -> None:
        self.dq = dq
        self.tracking = tracking
        self.log = log
        self.live = live
        self.where = f"CHANNEL({dq.name})"
        self.journal = Journal(journal_path(dq), log)
        self.window = Window()
        #: id of a message in memory -> its record's sequence number in the window
        self.anchors: dict[bytes, int] = {}
        #: moved messages whose copy the reader has not reached: id -> copy's position
        self.moved: dict[bytes, int] = {}
        #: the reverse: copy's position -> id
        self.adopt: dict[int, bytes] = {}
        #: from the journal, for records ahead of the reader: position -> id of a finished
        #: one, (id, attempts) of one handed out, (id, due ns) of a deferred one
        self.skip: dict[int, bytes] = {}
        self.attempts: dict[int, tuple[bytes, int]] = {}
        self.dues: dict[int, tuple[bytes, int]] = {}
        #: how many messages at the head of the channel's queue have the D record of the
        #: attempt they are about to make
        self.queued = 0
        self._replay()
        dq.journal = self.journal  # fsynced with the queue's data
        if tracking:
            dq.acks = self.window

    @classmethod
    def open(
        cls,
        dq: DiskQueue,
        tracking: bool,
        log: logging.Logger,
        live: Callable[[], Iterable[Message]] = tuple,
    ) -> Ledger | None:
        """The ledger of a channel's queue: always in the crash-safe mode, else only while an
        earlier run's journal has something to say."""
        if not tracking and not os.path.exists(journal_path(dq)):
            return None
        ledger = cls(dq, tracking, log, live)
        if not tracking and ledger.spent:
            ledger.journal.delete()
            return None
        return ledger

    # --- replay ---------------------------------------------------------------------------

    def _replay(self) -> None:
        floor = _reader_position(self.dq)
        skip = self.skip
        attempts = self.attempts
        dues = self.dues
        n = 0
        for kind, pos, msg_id, value in self.journal.replay():
            if pos < floor:
                continue  # the floor has passed it
            n += 1
            done = skip.get(pos)
            if done is not None:
                if done == msg_id:
                    continue  # finished: nothing more to say about it
                del skip[pos]  # the position holds another message now (a queue made anew)
            if kind == FINISHED:
                skip[pos] = msg_id
                attempts.pop(pos, None)
                dues.pop(pos, None)
            elif kind == DELIVERED:
                a = attempts.get(pos)
                if a is None or a[0] != msg_id or a[1] < value:
                    attempts[pos] = (msg_id, value)
            elif kind == DUE:
                dues[pos] = (msg_id, value)
        if n:
            self.log.info(
                "%s: journal: %d finished, %d handed out, %d deferred record(s) ahead",
                self.where,
                len(skip),
                len(attempts),
                len(dues),
            )
        if self.tracking or not self.spent:
            self._rewrite()  # the file holds what is still true, and nothing older

    @property
    def spent(self) -> bool:
        """Nothing left to apply and nothing to track: the journal can go."""
        return not self.tracking and not (self.skip or self.attempts or self.dues)

    # --- reading ----------------------------------------------------------------------------

    def read(
        self,
        want: int,
        decode: Callable[[list[bytes], str], list[Message]],
        now_ns: int,
        max_bytes: int = 0,
    ) -> tuple[list[Message], list[tuple[Message, int]]]:
        """Up to ``want`` records from the queue (spanning at most ``max_bytes``, beyond the
        first, with a bound), as messages: those to queue now, and the deferred ones with
        their due time (ns). ``decode`` turns records into messages
        (:func:`~nsqpy.nsqd.channel.decode_records`)."""
        positions: list[int] = []
        records = self.dq.read(want, positions, max_bytes)
        if not records:
            return [], []
        msgs = decode(records, self.where)
        n = len(msgs)
        if n == len(records) and not (self.skip or self.attempts or self.dues or self.adopt):
            if not self.tracking:
                return msgs, []
            ids = [m.id for m in msgs]
            fresh = set(ids)
            # a message already in memory (its original and a moved copy, both left by a
            # crash) takes the slow path, which keeps one of them
            if len(fresh) == n and fresh.isdisjoint(self.anchors):
                seq = self.window.extend(positions, ids)
                self.anchors.update(zip(ids, range(seq, seq + n), strict=True))
                return msgs, []
        return self._read_slow(records, positions, msgs, now_ns)

    def _read_slow(
        self, records: list[bytes], positions: list[int], decoded: list[Message], now_ns: int
    ) -> tuple[list[Message], list[tuple[Message, int]]]:
        if len(decoded) != len(records):  # cannot happen (the DiskQueue checks sizes)
            decoded = [m for r in records for m in decode_one(r, self.where)]
        skip = self.skip
        adopt = self.adopt
        attempts = self.attempts
        dues = self.dues
        anchors = self.anchors
        tracking = self.tracking
        window = self.window
        now: list[Message] = []
        later: list[tuple[Message, int]] = []
        for pos, msg in zip(positions, decoded, strict=True):
            msg_id = msg.id
            if skip and skip.pop(pos, None) == msg_id:
                attempts.pop(pos, None)
                dues.pop(pos, None)
                if tracking:
                    window.add(pos, msg_id, done=True)
                continue
            if adopt and adopt.get(pos) == msg_id:
                # the copy of a moved message: the message in memory is anchored to it now
                del adopt[pos]
                self.moved.pop(msg_id, None)
                anchors[msg_id] = window.add(pos, msg_id)
                continue
            if tracking and msg_id in anchors:
                # a second record of a message in memory (a crash kept both the original
                # and its copy): the later one is its record now, the earlier is finished
                old = window.finish(anchors[msg_id])
                self.journal.add(FINISHED, old, msg_id, 0)
                anchors[msg_id] = window.add(pos, msg_id)
                attempts.pop(pos, None)
                dues.pop(pos, None)
                continue
            a = attempts.pop(pos, None) if attempts else None
            if a is not None and a[0] == msg_id and a[1] > msg.attempts:
                msg.attempts = min(a[1], 65535)
            if tracking:
                anchors[msg_id] = window.add(pos, msg_id)
            d = dues.pop(pos, None) if dues else None
            if d is not None and d[0] == msg_id and d[1] > now_ns:
                later.append((msg, d[1]))
            else:
                now.append(msg)
        if not tracking and (skip or attempts or dues):
            reader = _reader_position(self.dq)
            for table in (skip, attempts, dues):
                stale = [p for p in table if p < reader]
                for p in stale:
                    del table[p]  # passed without its record (a torn or skipped segment)
        return now, later

    # --- what becomes of messages ---------------------------------------------------------------

    def position_of(self, msg_id: bytes) -> int | None:
        """Where the record of a message in memory is (None: not one of the queue's)."""
        seq = self.anchors.get(msg_id)
        if seq is not None:
            return self.window.position_of(seq)
        return self.moved.get(msg_id)

    def delivering(self, queue: deque[Message], n: int) -> None:
        """The channel is about to send the first ``n`` messages of ``queue``: journal the
        attempt each will make, and write the journal out (before any of them reaches a
        socket). :meth:`sent` then says how many left the queue."""
        self.flush()  # a compaction first: it would drop the records written below
        if self.queued < n:
            add = self.journal.add
            where = self.position_of
            for m in islice(queue, self.queued, n):
                pos = where(m.id)
                if pos is not None:
                    add(DELIVERED, pos, m.id, m.attempts + 1)
            self.queued = n
            self.flush(compact=False)

    def sent(self, n: int) -> None:
        """``n`` messages left the head of the channel's queue (sent, or sampled out)."""
        self.queued = max(self.queued - n, 0)

    def finished(self, msg: Message) -> None:
        """FIN (or sampled out): the record is done."""
        if not self.journal.buf:
            self.dq.mark_dirty()  # the floor and the journal go to disk with the next round
        msg_id = msg.id
        seq = self.anchors.pop(msg_id, None)
        if seq is not None:
            pos = self.window.finish(seq)
        else:
            moved = self.moved.pop(msg_id, None)
            if moved is None:
                return  # not one of the queue's records
            pos = moved
            self.adopt.pop(pos, None)
            self.skip[pos] = msg_id
        self.journal.add(FINISHED, pos, msg_id, 0)

    def deferred(self, msg: Message, due_ns: int) -> None:
        """REQ with a delay: the message waits until ``due_ns`` (ns since the epoch). Written
        at once: a REQ nsqd has acted on keeps its delay whatever comes next."""
        pos = self.position_of(msg.id)
        if pos is not None:
            self.dq.mark_dirty()
            self.journal.add(DUE, pos, msg.id, due_ns)
            self.flush(compact=False)

    def finished_ahead(self, pos: int, msg_id: bytes) -> None:
        """The record at ``pos``, ahead of the reader, is finished (an operator removed it):
        it is skipped when read, after a restart too."""
        self.skip[pos] = msg_id
        self.attempts.pop(pos, None)
        self.dues.pop(pos, None)
        self.dq.mark_dirty()
        self.journal.add(FINISHED, pos, msg_id, 0)
        self.flush(compact=False)

    def due_ahead(self, pos: int, msg_id: bytes, due_ns: int) -> None:
        """The deferred record at ``pos``, ahead of the reader, is due at ``due_ns``."""
        self.dues[pos] = (msg_id, due_ns)
        self.dq.mark_dirty()
        self.journal.add(DUE, pos, msg_id, due_ns)
        self.flush(compact=False)

    def wrote(self, msgs: Sequence[Message], positions: Sequence[int], now_ns: int) -> None:
        """``msgs`` are about to be appended to the queue at ``positions``: the deferred
        ones (DPUB) wait until due. Raises PathError if the journal cannot say so (then
        they must not be written)."""
        add = self.journal.add
        dues = self.dues
        any_due = False
        for m, pos in zip(msgs, positions, strict=True):
            if m.defer:
                due = now_ns + int(m.defer * 1e9)
                dues[pos] = (m.id, due)
                add(DUE, pos, m.id, due)
                any_due = True
        if any_due:
            self.journal.flush()

    def delays(self, records: Sequence[bytes], positions: Sequence[int], now_ns: int) -> list[float] | None:
        """For records leaving a topic's queue for its channels: the seconds each still has
        to wait (0 for most), None when none does (:meth:`forget` them once they are gone)."""
        dues = self.dues
        if not dues:
            return None
        out: list[float] | None = None
        for i, (r, pos) in enumerate(zip(records, positions, strict=True)):
            d = dues.get(pos)
            if d is not None and d[0] == r[ID_AT:BODY_AT] and d[1] > now_ns:
                if out is None:
                    out = [0.0] * len(records)
                out[i] = (d[1] - now_ns) / 1e9
        return out

    def forget(self, positions: Iterable[int]) -> None:
        """These records left the queue (a topic's, for its channels): what the journal says
        of them is spent."""
        dues = self.dues
        if dues:
            for pos in positions:
                dues.pop(pos, None)
        j = self.journal
        if j.size > COMPACT_MIN_BYTES and j.size > 4 * RECORD_SIZE * self._state_size():
            self._rewrite()

    def flush(self, compact: bool = True) -> None:
        """Write the buffered records (errors are logged: what is lost is a redelivery or an
        attempt uncounted after a crash), compacting the journal when it has grown."""
        j = self.journal
        if j.buf:
            try:
                j.flush()
            except OSError as e:
                self.log.error("%s: failed to write the journal - %s", self.where, e)
                if len(j.buf) > COMPACT_MIN_BYTES:
                    j.buf.clear()  # give up rather than grow without bound
                return
        if compact and j.size > COMPACT_MIN_BYTES and j.size > 4 * RECORD_SIZE * self._state_size():
            self.compact()

    # --- moving the floor -------------------------------------------------------------------------

    def relocate(self, due_times: Callable[[], dict[Message, int]]) -> int:
        """When the floor is pinned far behind the reader by a few messages, append copies of
        those in the older half of the window to the queue (with their attempts, and the due
        time ``due_times()`` gives a deferred one) and let the floor pass their originals.
        Returns how many moved."""
        w = self.window
        span = w.span
        anchors = self.anchors
        if span < RELOCATE_MIN_SPAN or span < RELOCATE_FACTOR * len(anchors):
            return 0
        cutoff = w.base + w.head + span // 2
        victims = [m for m in self.live() if anchors.get(m.id, cutoff) < cutoff]
        if not victims:
            return 0
        from .channel import encode_messages

        due_of = due_times()
        records = encode_messages(victims)
        # the copies' due times go first: a copy is never on disk without its own
        add = self.journal.add
        for m, pos in zip(victims, self.dq.next_positions(map(len, records)), strict=True):
            due = due_of.get(m)
            if due is not None:
                add(DUE, pos, m.id, due)
        try:
            self.journal.flush()
        except OSError as e:
            self.log.error("%s: failed to write the journal - %s", self.where, e)
            return 0
        positions: list[int] = []
        try:
            self.dq.put_many(records, positions)
            # the copies are on the disk before their originals are finished (a rare, small
            # fsync on the loop: moving happens once per RELOCATE_FACTOR x live records)
            self.dq.sync()
        except (DiskQueueError, OSError) as e:
            self.log.error("%s: failed to move %d message(s) - %s", self.where, len(victims), e)
            return 0  # the copies written, if any, are read as duplicates and dropped
        for m, pos in zip(victims, positions, strict=True):
            add(FINISHED, w.finish(anchors.pop(m.id)), m.id, 0)
            self.moved[m.id] = pos
            self.adopt[pos] = m.id
        self.log.info(
            "%s: moved %d message(s) holding the floor %d record(s) back", self.where, len(victims), span
        )
        self.flush()
        return len(victims)

    # --- compaction, emptying ----------------------------------------------------------------------

    def _state_size(self) -> int:
        return (
            self.window.span
            + len(self.anchors)
            + len(self.moved)
            + len(self.skip)
            + len(self.attempts)
            + len(self.dues)
        )

    def compact(self, due_of: dict[Message, int] | None = None) -> None:
        """Rewrite the journal as what it says now (``due_of``: the deferred messages' due
        times, else the journal's own). The floor is persisted first: the rewritten journal
        says nothing of the records below it. Errors are logged."""
        if self.tracking:
            try:
                self.dq.sync()
            except OSError as e:
                self.log.error("%s: failed to sync before compacting the journal - %s", self.where, e)
                return
        self._rewrite(due_of)

    def _rewrite(self, due_of: dict[Message, int] | None = None) -> None:
        try:
            self.save(due_of)
        except OSError as e:
            self.log.error("%s: failed to compact the journal - %s", self.where, e)

    def save(self, due_of: dict[Message, int] | None = None) -> None:
        """Replace the journal by what it says now (no file when that is nothing). Raises
        PathError."""
        reader = _reader_position(self.dq)
        for table in (self.skip, self.attempts, self.dues):
            for p in [p for p in table if p < reader]:
                del table[p]  # the reader passed them (a torn or skipped segment)
        out = bytearray()
        add = out.extend
        for pos, msg_id in self.window.finished_entries():
            add(_pack_record(FINISHED, pos, msg_id, 0))
        for pos, msg_id in self.skip.items():
            add(_pack_record(FINISHED, pos, msg_id, 0))
        for pos, (msg_id, n) in self.attempts.items():
            add(_pack_record(DELIVERED, pos, msg_id, n))
        for pos, (msg_id, due) in self.dues.items():
            add(_pack_record(DUE, pos, msg_id, due))
        where = self.position_of
        for m in self.live():
            if m.attempts:
                at = where(m.id)
                if at is not None:
                    add(_pack_record(DELIVERED, at, m.id, m.attempts))
        if due_of:
            for m, due in due_of.items():
                at = where(m.id)
                if at is not None:
                    add(_pack_record(DUE, at, m.id, due))
        self.journal.rewrite(bytes(out))
        self.queued = 0  # the queued messages' next attempts are journaled again

    def empty(self) -> None:
        """The queue was emptied: nothing is left to track or skip."""
        self.window.reset()
        self.anchors.clear()
        self.moved.clear()
        self.adopt.clear()
        self.skip.clear()
        self.attempts.clear()
        self.dues.clear()
        self.queued = 0
        self.journal.delete()

    def delete(self) -> None:
        """The queue is deleted: so is the journal."""
        self.empty()
        self.dq.acks = None
        self.dq.journal = None


def decode_one(record: bytes, where: str) -> list[Message]:
    """One record as a message (none if it is too short to hold a header)."""
    from .channel import decode_records_py

    return decode_records_py([record], where)
