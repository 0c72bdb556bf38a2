"""A topic: receives published messages and gives every channel its own copy.

While a topic has no channels, or is paused, messages wait in its own memory queue (at most
--mem-queue-size) and beyond that in its DiskQueue; they flow to the channels when the first
channel appears or on unpause, the backlog from disk in chunks so the loop stays responsive.

A disk write that fails loses nothing: a publish is refused (the publisher is told), and a
chunk of the backlog stays in the topic's DiskQueue until every channel has taken it (it is
retried every DRAIN_RETRY seconds, each channel skipping what it already took).

DPUB messages held in the DiskQueue keep their due time in the topic's journal (its
:class:`~nsqpy.nsqd.journal.Ledger`; NSQ delivers them at once when they reach a channel).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..protocol.frames import MESSAGE_BODY_OFFSET
from ..protocol.names import is_ephemeral
from .backend import BackendQueue, Queued
from .channel import (
    Channel,
    PumpTurn,
    body_bytes,
    decode_split,
    defer_of,
    disk_records,
    joined_pieces,
    record_sizes,
)
from .diskqueue import DiskQueue, DiskQueueError, DiskQueueWriteError, Tails
from .guid import TWEPOCH
from .journal import Ledger
from .message import Message, copy_messages, new_messages, share_messages
from .policy import Policy, PolicyRejectedError
from .quantile import aggregate_result

if TYPE_CHECKING:
    from .nsqd import NSQD

log = logging.getLogger("nsqd")

#: Messages moved from a topic's DiskQueue to its channels per event-loop turn, and the most
#: bytes of records (at least one): large messages move a few at a time, between the
#: channels' deliveries, and never pile up in memory.
DRAIN_CHUNK = 5000
DRAIN_BYTES = 1 << 20

#: Seconds before moving the backlog to the channels again after a disk write failed.
DRAIN_RETRY = 1.0


class TopicExitingError(Exception):
    def __str__(self) -> str:
        return "exiting"


class Topic(Queued):
    __slots__ = (
        "_drain_at",
        "_drain_done",
        "_drain_keep",
        "_draining",
        "_on_started",
        "backend",
        "channels",
        "dropped_count",
        "dues",
        "ephemeral",
        "exiting",
        "expired_count",
        "guarded",
        "message_bytes",
        "message_count",
        "name",
        "nsqd",
        "paused",
        "policy",
        "qbytes",
        "queue",
        "starting",
        "turn",
    )

    def __init__(self, name: str, nsqd: NSQD) -> None:
        self.name = name
        self.nsqd = nsqd
        self.ephemeral = is_ephemeral(name)
        self.channels: dict[str, Channel] = {}
        self.queue: deque[Message] = deque()
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0
        self.backend: BackendQueue = nsqd.make_backend(name)
        #: the due times of DPUB messages in the DiskQueue (made with the first such message,
        #: or from a journal an earlier run left; gone once none is left)
        self.dues: Ledger | None = (
            Ledger.open(self.backend, False, log) if isinstance(self.backend, DiskQueue) else None
        )
        self._draining = False
        #: a backlog chunk whose move failed: its position, and how many of its messages
        #: each channel (by name) already took
        self._drain_at: tuple[int, int] | None = None
        self._drain_done: dict[str, int] = {}
        #: which of that chunk's messages are young enough for max_age (by index)
        self._drain_keep: set[int] | None = None
        #: channels known to nsqlookupd are being created: hold messages until then
        self.starting = False
        #: called once it has started (publishes are answered only then, as Go's GetTopic)
        self._on_started: list[Callable[[], None]] = []
        #: the topic's settings (max_age, bounds), None without
        self.policy: Policy | None = None
        #: bytes of the bodies in ``queue``, counted while a max_bytes bound needs them
        self.qbytes: int | None = None
        #: the topic or one of its channels has a bound that refuses publishes
        self.guarded = False
        self.expired_count = 0
        self.dropped_count = 0
        #: what its channels may still send in this event-loop turn
        self.turn = PumpTurn(nsqd)

    # --- publishing -------------------------------------------------------------------------

    def put_bodies(self, bodies: list[bytes], defer: float = 0.0) -> None:
        """Publish raw bodies (PUB/MPUB/DPUB, HTTP /pub and /mpub), all or nothing.

        Raises :class:`TopicExitingError`, or :class:`DiskQueueWriteError` (Go's text) if a
        disk write failed: the publish is refused, though a channel may already hold a copy.
        (Whether the publisher must wait for an fsync is the Syncer's to say.)
        """
        if self.exiting:
            raise TopicExitingError()
        n = len(bodies)
        if not n:
            return
        nbytes = sum(map(len, bodies))
        if self.guarded:
            self._admit(n, nbytes)
        nsqd = self.nsqd
        guid = nsqd.guid
        ts, seq = guid.reserve(n)
        msgs = new_messages(bodies, ts, seq, guid.node, TWEPOCH, nsqd.now_ns(), defer)
        self.message_bytes += nbytes
        if self.paused or self.starting or not self.channels:
            self._hold(msgs)
        else:
            self._distribute(msgs)
        self.message_count += n

    def _admit(self, n: int, nbytes: int) -> None:
        """A publish of ``n`` messages (``nbytes`` of bodies) that would take the topic (while
        it holds them) or one of its channels past a bound set to reject is refused whole:
        raises :class:`PolicyRejectedError` naming the queue and the bound."""
        p = self.policy
        if p is not None and p.rejects and (self.paused or self.starting or not self.channels):
            depth, held = self.depth + n, self.depth_bytes + nbytes
            if p.over(depth, held):
                raise PolicyRejectedError(f"topic {self.name} is full ({p.bound_text(depth, held)})")
        for ch in self.channels.values():
            cp = ch.policy
            if cp is not None and cp.rejects:
                depth, held = ch.depth + n, ch.depth_bytes + nbytes
                if cp.over(depth, held):
                    raise PolicyRejectedError(
                        f"channel {self.name}:{ch.name} is full ({cp.bound_text(depth, held)})"
                    )

    @property
    def depth_bytes(self) -> int:
        """Bytes of the bodies the topic holds (the memory part counted only while a
        max_bytes bound needs it)."""
        return (self.qbytes or 0) + self.backend.held_bytes

    def set_policy(self, policy: Policy | None) -> None:
        """New settings (None: none); a drop_oldest bound applies at once."""
        self.policy = policy
        tracked = policy is not None and policy.max_bytes is not None
        if tracked and self.qbytes is None:
            self.qbytes = body_bytes(self.queue)
        elif not tracked:
            self.qbytes = None
        self.policies_changed()
        self._bound()

    def policies_changed(self) -> None:
        """The topic's or a channel's settings changed (or a channel came or went)."""
        self.guarded = (self.policy is not None and self.policy.rejects) or any(
            ch.policy is not None and ch.policy.rejects for ch in self.channels.values()
        )

    def _bound(self) -> None:
        """drop_oldest: the oldest messages the topic holds go, counted, until it is within
        its bounds."""
        p = self.policy
        if p is None or not p.drops_oldest or not p.over(self.depth, self.depth_bytes):
            return
        q = self.queue
        dropped = 0
        while q and p.over(self.depth, self.depth_bytes):
            m = q.popleft()
            if self.qbytes is not None:
                self.qbytes -= len(m.body)
            dropped += 1
        b = self.backend
        while b.depth and p.over(self.depth, self.depth_bytes):
            k = 1
            if p.max_depth is not None and self.depth > p.max_depth:
                k = self.depth - p.max_depth
            positions: list[int] = []
            got = len(b.read(k, positions))
            if not got:
                break
            if self.dues is not None:
                self.dues.forget(positions)
            dropped += got
        self.dropped_count += dropped

    def _expired(self, msgs: list[Message]) -> list[Message]:
        """The messages young enough for the topic's max_age (the others counted)."""
        p = self.policy
        if p is None or p.max_age_ns is None:
            return msgs
        cutoff = time.time_ns() - p.max_age_ns
        keep = [m for m in msgs if m.timestamp >= cutoff]
        self.expired_count += len(msgs) - len(keep)
        return keep

    def _hold(self, msgs: list[Message]) -> None:
        free = self.nsqd.options.mem_queue_size - len(self.queue)
        if free >= len(msgs):
            self._queue(msgs)
        else:
            keep = max(free, 0)
            try:
                if self.backend.durable:  # else ephemeral: NSQ drops the overflow
                    self._write(msgs[keep:])
            finally:
                if keep:  # kept even when the overflow failed: the publisher is told anyway
                    self._queue(msgs[:keep])
        if self.policy is not None:
            self._bound()

    def _queue(self, msgs: list[Message]) -> None:
        self.queue.extend(msgs)
        if self.qbytes is not None:
            self.qbytes += body_bytes(msgs)

    def _write(self, msgs: list[Message]) -> None:
        """Messages to the DiskQueue, a deferred one's due time to the journal (first: a
        record is never there without its own)."""
        records, heads = disk_records(msgs)
        b = self.backend
        if any(map(defer_of, msgs)) and isinstance(b, DiskQueue):
            if self.dues is None:
                self.dues = Ledger(b, False, log)
            try:
                self.dues.wrote(msgs, b.next_positions(record_sizes(records, heads)), time.time_ns())
            except OSError as e:
                raise DiskQueueWriteError(str(e), 0) from e
        b.put_many(records, None, heads)

    def _distribute(self, msgs: list[Message], done: dict[str, int] | None = None) -> None:
        """Give every channel its copy; the first write failure is raised.

        ``done`` (a failed backlog move being retried) says how many leading messages each
        channel already took: it skips those, and on failure the dict is updated.
        """
        chans = list(self.channels.values())
        deferred = any(map(defer_of, msgs))
        shared = len(chans) > 1 and not deferred
        if shared:  # one object per message, queued by every channel (copied as it is sent)
            share_messages(msgs)
        first = True
        for ch in chans:
            skip = done.get(ch.name, 0) if done is not None else 0
            part = msgs[skip:] if skip else msgs
            if not part:
                continue
            if not first and not shared:
                part = copy_messages(part)
            first = False
            try:
                ch.put_messages(part, deferred)
            except DiskQueueWriteError as e:
                if done is not None:
                    done[ch.name] = skip + e.written
                raise
            if done is not None:
                done[ch.name] = len(msgs)

    def when_started(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the channels nsqlookupd knows exist (now, if they do)."""
        if self.starting:
            self._on_started.append(callback)
        else:
            callback()

    def started(self) -> None:
        """The channels nsqlookupd knows were created (or that failed): let messages flow
        and answer the publishes that waited."""
        self.starting = False
        if not self.exiting:
            self.flow()
        callbacks, self._on_started = self._on_started, []
        for cb in callbacks:
            try:
                cb()
            except Exception:
                log.exception("TOPIC(%s): start callback failed", self.name)

    def flow(self) -> None:
        """Move held messages to the channels (first channel created, unpause, start-up)."""
        if not self.channels or self.paused or self.starting:
            return
        if self.queue:
            msgs = list(self.queue)
            self.queue.clear()
            if self.qbytes is not None:
                self.qbytes = 0
            if self.policy is not None:
                msgs = self._expired(msgs)
            self._flow_held(msgs)
        if self.backend.depth and not self._draining:
            self._draining = True
            self.nsqd.loop.call_soon(self._drain_backend)

    def _flow_held(self, msgs: list[Message]) -> None:
        """The messages held in memory to every channel; what a channel's full disk refuses
        stays in its memory (it was only in memory before)."""
        chans = list(self.channels.values())
        deferred = any(map(defer_of, msgs))
        shared = len(chans) > 1 and not deferred
        if shared:
            share_messages(msgs)
        first = True
        for ch in chans:
            part = msgs if first or shared else copy_messages(msgs)
            first = False
            try:
                ch.put_messages(part, deferred)
            except DiskQueueWriteError as e:
                log.error(
                    "TOPIC(%s): CHANNEL(%s) kept %d message(s) in memory - %s",
                    self.name,
                    ch.name,
                    len(part) - e.written,
                    e,
                )
                ch.put_in_memory(part[e.written :])

    def _drain_backend(self) -> None:
        """Move one chunk of the topic's disk backlog to its channels, then schedule the
        next; the chunk leaves the topic's DiskQueue only once every channel has it."""
        self._draining = False
        b = self.backend
        if self.exiting or self.paused or self.starting or not self.channels or not b.depth:
            return
        # large records come in two pieces, their bodies read straight into their own bytes
        tails = Tails(MESSAGE_BODY_OFFSET)
        try:
            if self.dues is None:
                b.read_into(
                    DRAIN_CHUNK,
                    lambda records: self._move_chunk(records, None, tails),
                    None,
                    DRAIN_BYTES,
                    tails,
                )
            else:
                positions: list[int] = []
                b.read_into(
                    DRAIN_CHUNK,
                    lambda records: self._move_chunk(records, positions, tails),
                    positions,
                    DRAIN_BYTES,
                    tails,
                )
        except DiskQueueError as e:
            log.error(
                "TOPIC(%s): failed to move messages to its channels - %s (retrying in %gs)",
                self.name,
                e,
                DRAIN_RETRY,
            )
            self._draining = True
            self.nsqd.loop.call_later(DRAIN_RETRY, self._drain_backend)
            return
        self._drain_at = None
        self._drain_done = {}
        self._drain_keep = None
        if b.depth:
            self._draining = True
            self.nsqd.loop.call_soon(self._drain_backend)

    def _move_chunk(self, records: list[bytes], positions: list[int] | None, tails: Tails) -> None:
        """Give every channel the chunk read (``records``, large ones in two pieces: see
        :class:`Tails`), at the ``positions`` read when the topic has DPUB due times."""
        b = self.backend
        at = b.read_position
        if self._drain_at != at:
            self._drain_at = at
            self._drain_done = {}
            self._drain_keep = None
        done = self._drain_done
        dues = self.dues
        delays = None
        if dues is not None and positions is not None:
            delays = dues.delays(records, positions, time.time_ns())
        chans = list(self.channels.values())
        only = chans[0] if len(chans) == 1 else None
        if (
            delays is None
            and (self.policy is None or self.policy.max_age_ns is None)
            and only is not None
            and only.backend.durable
            and len(only.queue) >= self.nsqd.options.mem_queue_size
        ):
            # no need to decode what goes back to disk as is
            skip = done.get(only.name, 0)
            parts, heads = joined_pieces(records, tails)
            try:
                if skip:
                    only.put_records(parts[skip:], None if heads is None else heads[skip:])
                else:
                    only.put_records(parts, heads)
            except DiskQueueWriteError as e:
                done[only.name] = skip + e.written
                raise
            done[only.name] = len(records)
        else:
            msgs = decode_split(records, tails, f"TOPIC({self.name})")
            if len(msgs) != len(records):
                done.clear()  # cannot happen (the DiskQueue checks sizes); stay safe
            elif delays is not None:
                for m, d in zip(msgs, delays, strict=True):
                    m.defer = d
            age = self.policy.max_age_ns if self.policy is not None else None
            if age is not None:
                keep = self._drain_keep
                if keep is None:  # decided once per chunk: a retry skips the same ones
                    cutoff = time.time_ns() - age
                    keep = self._drain_keep = {i for i, m in enumerate(msgs) if m.timestamp >= cutoff}
                    self.expired_count += len(msgs) - len(keep)
                msgs = [m for i, m in enumerate(msgs) if i in keep]
            self._distribute(msgs, done)
        if dues is not None and positions is not None:
            dues.forget(positions)  # every channel has them now
            if dues.spent:
                dues.delete()
                self.dues = None

    # --- channels ---------------------------------------------------------------------------

    def get_channel(self, name: str) -> Channel:
        ch = self.channels.get(name)
        if ch is None:
            ch = self.channels[name] = Channel(self, name, self.nsqd)
            log.info("TOPIC(%s): new channel(%s)", self.name, name)
            self.nsqd.on_channel_created(self, ch)
            if not self.nsqd.loading:
                self.flow()
        return ch

    def delete_channel(self, name: str) -> bool:
        ch = self.channels.pop(name, None)
        if ch is None:
            return False
        log.info("TOPIC(%s): deleting channel %s", self.name, name)
        ch.close()
        if ch.policy is not None:
            self.policies_changed()
        self.nsqd.on_channel_deleted(self, ch)
        if self.ephemeral and not self.channels and not self.exiting:
            self.nsqd.delete_topic(self.name)
        return True

    # --- admin ------------------------------------------------------------------------------

    def e2e_processing_latency(self, now_ns: int) -> dict[str, Any]:
        """Go's ``AggregateChannelE2eProcessingLatency().Result()``: the channels' latency
        streams merged (``{"count": 0, "percentiles": null}`` when there is none)."""
        return aggregate_result(
            (ch.e2e for ch in self.channels.values()),
            self.nsqd.options.e2e_processing_latency_percentiles,
            now_ns,
        )

    def pause(self) -> None:
        self.paused = True
        self.nsqd.on_metadata_changed()

    def unpause(self) -> None:
        self.paused = False
        self.nsqd.on_metadata_changed()
        self.flow()

    def empty(self) -> None:
        self.queue.clear()
        if self.qbytes is not None:
            self.qbytes = 0
        self.backend.empty()
        if self.dues is not None:
            self.dues.delete()
            self.dues = None

    def close(self) -> None:
        """Topic deleted: close every channel (disconnecting their clients), drop its files."""
        self.exiting = True
        for ch in list(self.channels.values()):
            ch.close()
        self.channels.clear()
        self.queue.clear()
        if self.dues is not None:
            self.dues.delete()  # before the queue's files: a journal never outlives them
            self.dues = None
        self.backend.delete()

    def flush(self) -> list[str]:
        """Clean shutdown: held messages to the backend, then every channel's. Returns what
        could not be written (each error logged)."""
        errors = []
        if self.backend.durable and self.queue:
            n = len(self.queue)
            held = list(self.queue)
            try:
                self._write(held)
                log.info("TOPIC(%s): flushed %d message(s) to disk", self.name, n)
            except DiskQueueError as e:
                lost = n - getattr(e, "written", 0)
                errors.append(
                    f"TOPIC({self.name}): failed to flush {lost} of {n} message(s) to disk, "
                    f"they are lost - {e}"
                )
                log.error("%s", errors[-1])
        self.queue.clear()
        for ch in self.channels.values():
            errors += ch.flush()
        return errors
