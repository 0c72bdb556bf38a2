"""Looking inside a queue without consuming it, and acting on one message (an nsqpy
addition, answering nsqio/nsq #848, #375, #1311, #1342, #1412, #1482).

- :func:`peek_channel` / :func:`peek_topic`: what a channel (or a topic's channel-less
  backlog) holds, in the order it would be delivered: the memory queue, then the DiskQueue
  read ahead of its reader without moving it (:meth:`DiskQueue.scan`), then the deferred and
  in-flight messages. Nothing changes: depth, order, attempts and timers are as before.
- :func:`remove` / :func:`requeue`: one queued or deferred message deleted, one deferred
  message made due now. A record on disk cannot leave the middle of its file: it is marked
  finished in the channel's journal (skipped when read, as a FIN'd one after a crash), or
  given a due time of now.
- :func:`redrive`: messages of a (dead-letter) topic's backlog or of one of its channels
  published again to another topic, as new messages with the same bodies. The copies are
  written before the originals leave: a kill -9 may leave a message in both, never in neither.

The channel and topic keep no state for any of this; the hot paths pay nothing.
"""

from __future__ import annotations

import asyncio
import base64
import heapq
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .channel import decode_records
from .channel import log as channel_log
from .diskqueue import DiskQueue
from .journal import Ledger

if TYPE_CHECKING:
    from .channel import Channel
    from .message import Message
    from .nsqd import NSQD
    from .topic import Topic

#: ``n`` when a peek names none, and the most it may name
DEFAULT_PEEK = 10
MAX_PEEK = 1000
#: characters of a body shown as text
PREVIEW_CHARS = 200
#: records read from a DiskQueue per step of a scan
SCAN_STEP = 256
#: messages published per step of a redrive
REDRIVE_STEP = 1024


class NotHeldError(LookupError):
    """The queue holds no message with that id (404)."""


class ConflictError(Exception):
    """The message is there, but not in a state the action applies to (409)."""


def message_json(m: Message, attempts: int | None = None) -> dict[str, Any]:
    body = m.body
    return {
        "id": m.id.decode("ascii", "replace"),
        "timestamp": m.timestamp,
        "attempts": m.attempts if attempts is None else attempts,
        "body_base64": base64.b64encode(body).decode("ascii"),
        "body_preview": body[: PREVIEW_CHARS * 4].decode("utf-8", "replace")[:PREVIEW_CHARS],
    }


def _due_json(m: Message, due_ns: int, now_ns: int) -> dict[str, Any]:
    out = message_json(m)
    out["due"] = due_ns
    out["due_in_ms"] = max((due_ns - now_ns) // 1_000_000, 0)
    return out


# --- the disk part ----------------------------------------------------------------------------


def _disk_messages(
    dq: DiskQueue, ledger: Ledger | None, where: str, now_ns: int
) -> Iterable[tuple[int, Message, int | None]]:
    """The messages a DiskQueue holds ahead of its reader, as the reader would take them:
    (position, message with its journaled attempts, due time ns or None), leaving out the
    records the ledger says are finished or are copies of a message already in memory."""
    at: int | None = None
    while True:
        positions: list[int] = []
        records = dq.scan(SCAN_STEP, positions, at)
        if not records:
            return
        msgs = decode_records(records, where)
        if len(msgs) != len(records):
            return  # cannot happen (the DiskQueue checks sizes)
        for pos, m in zip(positions, msgs, strict=True):
            due = None
            if ledger is not None:
                mid = m.id
                if ledger.skip.get(pos) == mid or ledger.adopt.get(pos) == mid:
                    continue
                if ledger.tracking and mid in ledger.anchors:
                    continue
                a = ledger.attempts.get(pos)
                if a is not None and a[0] == mid and a[1] > m.attempts:
                    m.attempts = min(a[1], 65535)
                d = ledger.dues.get(pos)
                if d is not None and d[0] == mid and d[1] > now_ns:
                    due = d[1]
            yield pos, m, due
        last = len(records[-1])
        at = positions[-1] + 4 + last


# --- peek ---------------------------------------------------------------------------------------


def peek_channel(ch: Channel, n: int) -> dict[str, Any]:
    """Up to ``n`` queued messages in delivery order, and up to ``n`` each of the deferred
    (soonest first) and in-flight ones (earliest deadline first)."""
    now_ns = time.time_ns()
    loop_now = ch.nsqd.loop.time()
    queued: list[dict[str, Any]] = []
    deferred: list[dict[str, Any]] = []
    for m in ch.queue:
        if len(queued) >= n:
            break
        queued.append(message_json(m))
    disk_deferred: list[tuple[int, Message]] = []
    if len(queued) < n and ch.backend.depth and isinstance(ch.backend, DiskQueue):
        for _, m, due in _disk_messages(ch.backend, ch.ledger, f"CHANNEL({ch.backend_name})", now_ns):
            if due is not None:
                if len(disk_deferred) < n:
                    disk_deferred.append((due, m))
                continue
            queued.append(message_json(m))
            if len(queued) >= n:
                break
    soonest = heapq.nsmallest(n, ch.deferred)
    later = [(now_ns + int(max(when - loop_now, 0) * 1e9), m) for when, _, m in soonest]
    for due, m in sorted(later + disk_deferred, key=lambda e: e[0])[:n]:
        deferred.append(_due_json(m, due, now_ns))
    flying = sorted(ch.in_flight.values(), key=lambda m: m.deadline)[:n]
    in_flight = []
    for m in flying:
        out = message_json(m)
        client = m.client
        out["client_id"] = getattr(client, "client_id", "")
        out["remote_address"] = getattr(client, "remote_address", "")
        out["deadline"] = now_ns + int((m.deadline - loop_now) * 1e9)
        out["timeout_ms"] = max(int((m.deadline - loop_now) * 1000), 0)
        in_flight.append(out)
    return {
        "topic": ch.topic.name,
        "channel": ch.name,
        "depth": ch.depth,
        "deferred_count": ch.deferred_count,  # as /stats: one deferred on disk is in the depth
        "in_flight_count": len(ch.in_flight),
        "messages": queued,
        "deferred": deferred,
        "in_flight": in_flight,
    }


def peek_topic(topic: Topic, n: int) -> dict[str, Any]:
    """What the topic holds that no channel has taken yet: its memory queue, then its
    DiskQueue; DPUB'd ones in ``deferred`` (a held message's delay starts when a channel
    takes it: ``delay_ms``; one on disk has its due time)."""
    now_ns = time.time_ns()
    queued: list[dict[str, Any]] = []
    deferred: list[dict[str, Any]] = []
    for m in topic.queue:
        if m.defer:
            if len(deferred) < n:
                out = message_json(m)
                out["delay_ms"] = int(m.defer * 1000)
                deferred.append(out)
            continue
        if len(queued) >= n:
            break
        queued.append(message_json(m))
    b = topic.backend
    if len(queued) < n and b.depth and isinstance(b, DiskQueue):
        for _, m, due in _disk_messages(b, topic.dues, f"TOPIC({topic.name})", now_ns):
            if due is not None:
                if len(deferred) < n:
                    deferred.append(_due_json(m, due, now_ns))
                continue
            queued.append(message_json(m))
            if len(queued) >= n:
                break
    return {
        "topic": topic.name,
        "depth": topic.depth,
        "messages": queued,
        "deferred": deferred,
        "in_flight": [],
    }


# --- acting on one message ----------------------------------------------------------------------


def _find_on_disk(ch: Channel, msg_id: bytes) -> tuple[int, Message, int | None] | None:
    b = ch.backend
    if not b.depth or not isinstance(b, DiskQueue):
        return None
    for pos, m, due in _disk_messages(b, ch.ledger, f"CHANNEL({ch.backend_name})", time.time_ns()):
        if m.id == msg_id:
            return pos, m, due
    return None


def _ledger(ch: Channel) -> Ledger:
    """The channel's ledger, made (without tracking) to hold what is said of a record ahead
    of the reader: its journal keeps it across a restart."""
    ledger = ch.ledger
    if ledger is None:
        assert isinstance(ch.backend, DiskQueue)
        ledger = ch.ledger = Ledger(ch.backend, False, channel_log, ch.live)
    return ledger


def remove(ch: Channel, msg_id: bytes) -> None:
    """Delete one queued or deferred message (as if a consumer had FINished it, counted in
    no statistic). Raises :class:`ConflictError` for one in flight, :class:`NotHeldError`."""
    if msg_id in ch.in_flight:
        raise ConflictError("MESSAGE_IN_FLIGHT")
    q = ch.queue
    for i, m in enumerate(q):
        if m.id == msg_id:
            del q[i]
            if ch.qbytes is not None:
                ch.qbytes -= len(m.body)
            ledger = ch.ledger
            if ledger is not None:
                if i < ledger.queued:
                    ledger.queued -= 1  # it had the journal record of its next attempt
                ledger.finished(m)
            return
    for k, (_, _, m) in enumerate(ch.deferred):
        if m.id == msg_id:
            ch.deferred[k] = ch.deferred[-1]
            ch.deferred.pop()
            heapq.heapify(ch.deferred)
            if ch.ledger is not None:
                ch.ledger.finished(m)
            return
    found = _find_on_disk(ch, msg_id)
    if found is None:
        raise NotHeldError("MESSAGE_NOT_FOUND")
    pos, m, _ = found
    _ledger(ch).finished_ahead(pos, msg_id)


def requeue(ch: Channel, msg_id: bytes) -> None:
    """Make one deferred message due now. Raises :class:`ConflictError` for one that is
    queued or in flight (it is not deferred), :class:`NotHeldError`."""
    for k, (_, _, m) in enumerate(ch.deferred):
        if m.id == msg_id:
            ch.deferred[k] = ch.deferred[-1]
            ch.deferred.pop()
            heapq.heapify(ch.deferred)
            ledger = ch.ledger
            if ledger is not None and ledger.tracking:
                ledger.deferred(m, time.time_ns())  # a crash does not put the delay back
            ch.requeue_now(m)
            return
    if msg_id in ch.in_flight:
        raise ConflictError("MESSAGE_IN_FLIGHT")
    if any(m.id == msg_id for m in ch.queue):
        raise ConflictError("MESSAGE_NOT_DEFERRED")
    found = _find_on_disk(ch, msg_id)
    if found is None:
        raise NotHeldError("MESSAGE_NOT_FOUND")
    pos, _, due = found
    if due is None:
        raise ConflictError("MESSAGE_NOT_DEFERRED")
    _ledger(ch).due_ahead(pos, msg_id, time.time_ns())


# --- redrive --------------------------------------------------------------------------------------


async def redrive(nsqd: NSQD, source: Topic, channel: Channel | None, dest: Topic, n: int | None) -> int:
    """Publish up to ``n`` (None: all, as many as it holds now) of the messages the topic
    holds (or ``channel`` holds queued) to ``dest``, as new messages with the same bodies,
    oldest first; then they leave the source. Returns how many moved. Raises what a publish
    to ``dest`` raises (a bound, a full disk) when nothing moved; after some moved, stops
    there and returns their count."""
    limit = (source.depth if channel is None else channel.depth) if n is None else n
    moved = 0
    pending: list[Message] = []  # a channel's messages published and not yet finished
    error: BaseException | None = None
    while moved < limit:
        want = min(REDRIVE_STEP, limit - moved)
        try:
            got = (
                _redrive_topic_step(source, dest, want)
                if channel is None
                else _redrive_channel_step(channel, dest, want, pending)
            )
        except Exception as e:  # noqa: BLE001 - reported to the caller below
            error = e
            break
        if not got:
            break
        moved += got
        await asyncio.sleep(0)  # let the loop breathe between chunks
    if moved:
        await nsqd.sync_all()  # the copies are on disk before the originals are finished
    if channel is not None and pending and not channel.exiting:
        ledger = channel.ledger
        if ledger is not None:
            for m in pending:
                ledger.finished(m)
    if error is not None and not moved:
        raise error
    return moved


def _redrive_topic_step(source: Topic, dest: Topic, want: int) -> int:
    """Up to ``want`` messages of the topic's backlog (memory, then disk) to ``dest``. A
    record leaves the DiskQueue only once ``dest`` took its copy (a sync round fsyncs every
    queue's data before any read position)."""
    q = source.queue
    if q:
        msgs = [q[i] for i in range(min(want, len(q)))]
        dest.put_bodies([m.body for m in msgs])
        for _ in msgs:
            m = q.popleft()
            if source.qbytes is not None:
                source.qbytes -= len(m.body)
        return len(msgs)
    b = source.backend
    if not b.depth:
        return 0
    positions: list[int] = []

    def sink(records: list[bytes]) -> None:
        msgs = decode_records(records, f"TOPIC({source.name})")
        dest.put_bodies([m.body for m in msgs])

    got = b.read_into(want, sink, positions)
    if source.dues is not None:
        source.dues.forget(positions)
        if source.dues.spent:
            source.dues.delete()
            source.dues = None
    return got


def _redrive_channel_step(ch: Channel, dest: Topic, want: int, pending: list[Message]) -> int:
    """Up to ``want`` queued messages of the channel (memory, then disk) to ``dest``; they
    are finished for the channel once ``dest`` has them on disk (:func:`redrive`)."""
    q = ch.queue
    ledger = ch.ledger
    if not q and ch.backend.depth:
        if ledger is None:
            msgs = decode_records(ch.backend.read(want), f"CHANNEL({ch.backend_name})")
        else:
            msgs, later = ledger.read(want, decode_records, time.time_ns())
            now_ns = time.time_ns()
            for m, due in later:
                ch.start_deferred(m, (due - now_ns) / 1e9)  # deferred ones stay
        ch._queue(msgs)
    if not q:
        return 0
    take = min(want, len(q))
    msgs = [q[i] for i in range(take)]
    dest.put_bodies([m.body for m in msgs])
    for _ in range(take):
        m = q.popleft()
        if ch.qbytes is not None:
            ch.qbytes -= len(m.body)
    if ledger is not None:
        ledger.queued = max(ledger.queued - take, 0)
    pending.extend(msgs)
    return take
