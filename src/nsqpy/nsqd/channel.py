"""A channel: its own copy of every topic message, delivered to its subscribed clients.

State lives on the event-loop thread only. Ready messages wait in ``queue`` (at most
--mem-queue-size published ones) and beyond that in the channel's backend (a DiskQueue, or
nothing for ephemeral channels); in-flight ones are indexed by id in ``in_flight``, with
each consumer's deadlines in its :class:`~nsqpy.nsqd.inflight.InFlightTimers`; deferred
ones sit in a heap until due. Delivery is a coalesced "pump" scheduled once per event-loop
turn, which refills the memory queue from the backend as consumers have room. The channel
sees its clients only through the small :class:`Consumer` interface (Go's ``Consumer``).

In the crash-safe mode (``--mem-queue-size=0 --sync-every=1``) every message is in the
DiskQueue and the channel's :class:`~nsqpy.nsqd.journal.Ledger` keeps what it read there
until it is finished (see :mod:`nsqpy.nsqd.journal`): ``ledger`` is None otherwise, and the
hot paths pay one attribute check.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import operator
import time
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any, Protocol

from .._speedups import compiled
from ..protocol.frames import MESSAGE_BODY_OFFSET as BODY_AT
from ..protocol.frames import MESSAGE_FIELDS, encode_message
from ..protocol.frames import MESSAGE_ID_OFFSET as ID_AT
from ..protocol.names import is_ephemeral
from .backend import BackendQueue, Queued
from .diskqueue import WRITEV_RECORD, DiskQueue, DiskQueueError, DiskQueueWriteError, Tails
from .inflight import InFlightTimers, TimersByClient
from .journal import Ledger
from .message import Message
from .policy import Policy
from .quantile import Quantile

if TYPE_CHECKING:
    from .nsqd import NSQD
    from .topic import Topic

if compiled:
    from .._speedups._hot import decode_records as _c_decode_records
    from .._speedups._hot import encode_messages as _c_encode_messages

log = logging.getLogger("nsqd")

_seq = itertools.count()

#: Seconds before a message a dead-letter topic would not take is tried again.
DEAD_LETTER_RETRY = 1.0
#: The most a pump reads from the DiskQueue at once, in bytes of records (at least one
#: record): large messages are read as the clients' connections take them, not all their
#: RDY's worth at once (a pump that stopped short runs again on the next loop turn).
REFILL_BYTES = 1 << 20
#: refills (of REFILL_BYTES) a pump may do in one event-loop turn
PUMP_ROUNDS = 16
#: Messages a topic's channels send in one event-loop turn: a pump that finds them spent
#: waits for the next turn (after the sockets: publishers, FINs), so a turn of a topic with
#: many channels stays short. A pump that starts sends all its clients are ready for.
#: 4096 (bench/README.md, issue 31): at 20 and 100 channels the publisher's p99 MPUB round
#: trip ~4 ms with 1.6-2.9x Go's deliveries; 8192 delivered more with a p99 near 7 ms.
PUMP_TURN = 4096
#: a message's DPUB delay (0 for none)
defer_of = operator.attrgetter("defer")
_body_of = operator.attrgetter("body")


def body_bytes(msgs: Iterable[Message]) -> int:
    """Bytes of the messages' bodies."""
    return sum(map(len, map(_body_of, msgs)))


def encode_messages_py(msgs: list[Message]) -> list[bytes]:
    """Messages as DiskQueue records (``[ts][attempts][id][body]``)."""
    return [encode_message(m.timestamp, m.attempts, m.id, m.body) for m in msgs]


_unpack_head = MESSAGE_FIELDS.unpack_from
_pack_head = MESSAGE_FIELDS.pack


def decode_records_py(records: list[bytes], where: str) -> list[Message]:
    """DiskQueue records back to messages (a record too short to hold a header is skipped)."""
    out: list[Message] = []
    append = out.append
    for r in records:
        if len(r) < BODY_AT:
            log.error("%s: failed to decode message - invalid message buffer size (%d)", where, len(r))
            continue
        ts, attempts = _unpack_head(r, 0)
        append(Message(r[ID_AT:BODY_AT], r[BODY_AT:], ts, attempts))
    return out


if compiled:

    def encode_messages(msgs: list[Message]) -> list[bytes]:
        """:func:`encode_messages_py`, compiled."""
        out = _c_encode_messages(msgs)
        return out if out is not None else encode_messages_py(msgs)

    def decode_records(records: list[bytes], where: str) -> list[Message]:
        """:func:`decode_records_py`, compiled."""
        out = _c_decode_records(records)
        return out if out is not None else decode_records_py(records, where)

else:
    encode_messages = encode_messages_py
    decode_records = decode_records_py


def disk_records(msgs: list[Message]) -> tuple[list[bytes], list[bytes] | None]:
    """Messages for :meth:`DiskQueue.put_many`: ``(records, None)``, or for large bodies
    ``(bodies, heads)``, the records' two pieces (``[ts][attempts][id]`` and the body),
    written as they are rather than copied into records first."""
    if msgs and len(msgs[0].body) >= WRITEV_RECORD:
        return [m.body for m in msgs], [_pack_head(m.timestamp, m.attempts) + m.id for m in msgs]
    return encode_messages(msgs), None


def decode_split(records: list[bytes], tails: Tails, where: str) -> list[Message]:
    """:func:`decode_records` of records read with ``tails`` (``Tails(BODY_AT)``): a large
    record's head decodes to its message, whose body is the tail as it was read."""
    msgs = decode_records(records, where)
    if tails:
        if len(msgs) != len(records):  # one was too short to decode (logged): whole records
            return decode_records([r + tails.get(i, b"") for i, r in enumerate(records)], where)
        for i, body in tails.items():
            msgs[i].body = body
    return msgs


def joined_pieces(records: list[bytes], tails: Tails) -> tuple[list[bytes], list[bytes] | None]:
    """Records read with ``tails`` for :meth:`DiskQueue.put_many`: ``(records, None)``, or
    ``(tails, heads)`` when some are in two pieces (written as they are)."""
    if not tails:
        return records, None
    return [tails.get(i, b"") for i in range(len(records))], records


def record_sizes(records: list[bytes], heads: list[bytes] | None) -> list[int]:
    """The sizes of the records :func:`disk_records` describes."""
    if heads is None:
        return list(map(len, records))
    return [BODY_AT + len(r) for r in records]


class PumpTurn:
    """What a topic's channels may still send in this event-loop turn (PUMP_TURN messages).
    A pump that finds it spent waits in line; the first send or wait of a turn schedules the
    next turn's start, which runs the pumps that waited, in order, before any other."""

    __slots__ = ("left", "next_turn", "nsqd", "waiting")

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        self.left = PUMP_TURN
        self.next_turn = False
        self.waiting: deque[Channel] = deque()

    def spend(self, n: int) -> None:
        if n > 0:
            self.left -= n
            self._schedule()

    def wait(self, channel: Channel) -> None:
        self.waiting.append(channel)
        self._schedule()

    def _schedule(self) -> None:
        if not self.next_turn:
            self.next_turn = True
            self.nsqd.loop.call_soon(self._start)

    def _start(self) -> None:
        self.next_turn = False
        self.left = PUMP_TURN
        waiting = self.waiting
        try:
            while waiting and self.left > 0:
                waiting.popleft()._pump()
        finally:
            if waiting:
                self._schedule()


class Consumer(Protocol):
    """What a channel needs of a subscribed client (Go's ``Consumer``)."""

    id: int
    ready_count: int
    in_flight_count: int
    msg_timeout: float

    def can_receive(self) -> bool: ...

    def send_messages(self, channel: Channel, n: int) -> None: ...

    def timed_out_message(self) -> None: ...

    def emptied(self) -> None: ...

    def close(self) -> None: ...

    def stats(self) -> dict[str, Any]: ...


class Channel(Queued):
    __slots__ = (
        "_pump_scheduled",
        "_rate_timer",
        "_rr",
        "backend",
        "clients",
        "dead_letter_count",
        "deferred",
        "dropped_count",
        "e2e",
        "ephemeral",
        "exiting",
        "expired_count",
        "filter",
        "in_flight",
        "ledger",
        "message_count",
        "name",
        "nsqd",
        "paused",
        "policy",
        "qbytes",
        "queue",
        "requeue_count",
        "timed",
        "timeout_count",
        "timers",
        "topic",
    )

    def __init__(self, topic: Topic, name: str, nsqd: NSQD) -> None:
        self.topic = topic
        self.name = name
        self.nsqd = nsqd
        self.ephemeral = is_ephemeral(name)
        self.queue: deque[Message] = deque()
        self.in_flight: dict[bytes, Message] = {}
        #: each consumer's in-flight deadlines, by client id, made with its first message in
        #: flight (``timers[id]``): an idle consumer costs no deque (~0.75 KiB)
        self.timers: dict[int, InFlightTimers] = TimersByClient()
        #: ids of the clients whose timers may hold entries (the scan looks at those only:
        #: thousands of idle consumers cost it nothing): added as the pump sends to them
        self.timed: set[int] = set()
        self.deferred: list[tuple[float, int, Message]] = []
        self.clients: dict[int, Consumer] = {}
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        #: the channel's settings (max_age, bounds, dead letters, rate), None without
        self.policy: Policy | None = None
        #: bytes of the bodies in ``queue``, counted while a max_bytes bound needs them
        self.qbytes: int | None = None
        #: while a pump sends under a policy: what send_messages filters out
        #: (published before, attempts made, where they go)
        self.filter: tuple[int, int, list[Message]] | None = None
        self._rate_timer: asyncio.TimerHandle | None = None
        self.expired_count = 0
        self.dropped_count = 0
        self.dead_letter_count = 0
        self._pump_scheduled = False
        self._rr = 0
        self.backend: BackendQueue = nsqd.make_backend(f"{topic.name}:{name}")
        #: what the channel read from its DiskQueue and what became of it: in the crash-safe
        #: mode, or while a journal an earlier run left names records still ahead
        self.ledger: Ledger | None = (
            Ledger.open(self.backend, nsqd.crash_safe, log, self.live)
            if isinstance(self.backend, DiskQueue)
            else None
        )
        #: FIN latencies (Go's e2eProcessingLatencyStream), None without
        #: --e2e-processing-latency-percentile: the FIN path tests it before calling
        #: :meth:`record_latency`
        opts = nsqd.options
        self.e2e: Quantile | None = (
            Quantile(
                opts.e2e_processing_latency_window_time,
                opts.e2e_processing_latency_percentiles,
                time.time_ns(),
            )
            if opts.e2e_processing_latency_percentiles
            else None
        )

    @property
    def backend_name(self) -> str:
        return f"{self.topic.name}:{self.name}"

    @property
    def depth(self) -> int:
        """Messages held (memory + backend), as NSQ's Depth(), less the records a journal
        says are finished (read again after a restart, then skipped)."""
        d = len(self.queue) + self.backend.depth
        ledger = self.ledger
        return d if ledger is None or not ledger.skip else max(d - len(ledger.skip), 0)

    @property
    def depth_bytes(self) -> int:
        """Bytes of the bodies held (memory + backend; the memory part is counted only while
        a max_bytes bound needs it)."""
        return (self.qbytes or 0) + self.backend.held_bytes

    # --- accepting messages -------------------------------------------------------------

    def put_messages(self, msgs: list[Message], deferred: bool = True) -> None:
        """Queue published messages: memory up to --mem-queue-size, the rest to the backend
        (ephemeral channels drop it, as NSQ does). ``deferred=False``: the caller knows none
        has a DPUB delay (a topic checks once for all its channels).

        A failed backend write raises :class:`DiskQueueWriteError` whose ``written`` counts
        the leading messages this channel kept (in memory or on disk) all the same.
        """
        ledger = self.ledger
        if ledger is not None and ledger.tracking:
            self._put_durable(msgs, ledger)
            return
        total = len(msgs)
        if deferred and any(map(defer_of, msgs)):
            now_msgs = []
            for m in msgs:
                if m.defer:
                    d = m.defer
                    m.defer = 0.0
                    self.start_deferred(m, d)
                else:
                    now_msgs.append(m)
            msgs = now_msgs
        if not msgs:
            self.message_count += total
            return
        free = self.nsqd.options.mem_queue_size - len(self.queue)
        if self.ephemeral and free < len(msgs):
            # as Go's unbuffered memory channel with --mem-queue-size=0: what consumers are
            # ready for now is handed over, the rest dropped
            free = max(free, self._room() - len(self.queue))
        if free < len(msgs):
            keep = max(free, 0)
            overflow = msgs[keep:]
            msgs = msgs[:keep]
            if self.backend.durable:
                try:
                    records, heads = disk_records(overflow)
                    self.backend.put_many(records, None, heads)
                except DiskQueueWriteError as e:
                    accepted = total - len(overflow) + e.written
                    self.message_count += accepted
                    if msgs:
                        self.queue.extend(msgs)
                        if self.qbytes is not None:
                            self.qbytes += body_bytes(msgs)
                        self.schedule_pump()
                    raise DiskQueueWriteError(str(e), accepted) from e
        self.message_count += total
        if msgs:
            self.queue.extend(msgs)
            if self.qbytes is not None:
                self.qbytes += body_bytes(msgs)
        if self.policy is not None:
            self._bound()
        self.schedule_pump()

    def _put_durable(self, msgs: list[Message], ledger: Ledger) -> None:
        """Crash-safe mode: every message goes to the DiskQueue, a deferred one (DPUB) with
        its due time in the journal (written first: a record is never there without it)."""
        records, heads = disk_records(msgs)
        if any(map(defer_of, msgs)):
            assert isinstance(self.backend, DiskQueue)
            planned = self.backend.next_positions(record_sizes(records, heads))
            try:
                ledger.wrote(msgs, planned, time.time_ns())
            except OSError as e:
                raise DiskQueueWriteError(str(e), 0) from e
        try:
            self.backend.put_many(records, None, heads)
        except DiskQueueWriteError as e:
            self.message_count += e.written
            raise
        self.message_count += len(msgs)
        if self.policy is not None:
            self._bound()
        self.schedule_pump()

    def put_in_memory(self, msgs: list[Message]) -> None:
        """Queue messages in memory even past --mem-queue-size: messages that were only in
        memory before (a topic's held messages) and that the backend would not take."""
        self.message_count += len(msgs)
        self._queue(msgs)
        if self.policy is not None:
            self._bound()
        self.schedule_pump()

    def _queue(self, msgs: Iterable[Message]) -> None:
        """Messages join the memory queue (their bytes counted while a bound needs them)."""
        if self.qbytes is None:
            self.queue.extend(msgs)
        else:
            msgs = list(msgs)
            self.queue.extend(msgs)
            self.qbytes += body_bytes(msgs)

    def put_records(self, records: list[bytes], heads: list[bytes] | None = None) -> None:
        """Take already-encoded messages straight onto the backend (a topic's disk backlog
        moving to its only channel, whose memory queue is full); with ``heads``, record
        ``i`` is ``heads[i] + records[i]``. Raises :class:`DiskQueueWriteError` as
        :meth:`put_messages` does."""
        if self.backend.durable:
            try:
                self.backend.put_many(records, None, heads)
            except DiskQueueWriteError as e:
                self.message_count += e.written
                raise
            self.message_count += len(records)
            if self.policy is not None:
                self._bound()
            self.schedule_pump()

    def requeue_now(self, msg: Message) -> None:
        """Put a message back for immediate redelivery (REQ 0, timeout, client gone)."""
        self.queue.append(msg)
        if self.qbytes is not None:
            self.qbytes += len(msg.body)
        self.schedule_pump()

    def start_deferred(self, msg: Message, delay: float) -> None:
        heapq.heappush(self.deferred, (self.nsqd.loop.time() + delay, next(_seq), msg))

    # --- delivery -------------------------------------------------------------------------

    def schedule_pump(self) -> None:
        if not self._pump_scheduled and self.clients and (self.queue or self.backend.depth):
            self._pump_scheduled = True
            self.nsqd.loop.call_soon(self._pump)

    def _pump(self) -> None:
        """Spread ready messages over the clients that have RDY capacity: again while a
        refill stopped at REFILL_BYTES and clients can still take more (their connections
        took what was sent), up to PUMP_ROUNDS times a turn."""
        self._pump_scheduled = False
        if self.paused:
            return
        turn = self.topic.turn
        if turn.left <= 0:  # the topic's channels sent their share of this turn: next one
            self._pump_scheduled = True
            turn.wait(self)
            return
        flying = len(self.in_flight)
        try:
            for _ in range(PUMP_ROUNDS):
                ready = [c for c in self.clients.values() if c.can_receive()]
                if not ready:
                    return
                policy = self.policy
                if not (self._pump_ready(ready) if policy is None else self._pump_policy(policy, ready)):
                    return
            self.schedule_pump()  # more on the next turn
        finally:
            turn.spend(len(self.in_flight) - flying)

    def _pump_ready(self, ready: list[Consumer]) -> bool:
        """One round of :meth:`_pump`; True if the refill stopped at REFILL_BYTES with more
        in the backend."""
        n = len(ready)
        more = False
        q = self.queue
        b = self.backend
        ledger = self.ledger
        if b.depth or ledger is not None:
            room = sum(c.ready_count - c.in_flight_count for c in ready)
            if b.depth and room > len(q):
                more = self._refill(b, room - len(q))
            if ledger is not None and ledger.tracking:
                # each attempt is journaled before it is sent: what this pump sends
                ledger.delivering(q, min(room, len(q)))
        if not q:
            return False
        if n > 1:
            start = self._rr % n
            self._rr += 1
            ready = ready[start:] + ready[:start]
        before = len(q)
        timed = self.timed
        while q and ready:
            share = -(-len(q) // len(ready))
            still = []
            for c in ready:
                c.send_messages(self, share)
                timed.add(c.id)  # it may have deadlines now: the scan looks at it
                if not q:
                    break
                if c.can_receive():
                    still.append(c)
            ready = still
        if ledger is not None:
            ledger.sent(before - len(q))
        return more

    def _pump_policy(self, policy: Policy, ready: list[Consumer]) -> bool:
        """:meth:`_pump` under a policy: at most ``max_rate`` messages a second, and the
        expired or out-of-attempts ones taken off the way (dead letters). True as
        :meth:`_pump_ready`."""
        q = self.queue
        b = self.backend
        ledger = self.ledger
        room = sum(c.ready_count - c.in_flight_count for c in ready)
        if policy.max_rate is not None:
            budget = int(policy.tokens(self.nsqd.loop.time()))
            if budget <= 0:
                self._rate_wait(policy)
                return False
            room = min(room, budget)
        more = False
        if b.depth and room > len(q):
            more = self._refill(b, room - len(q))
        filtering = policy.filters
        if ledger is not None and ledger.tracking:
            # a filtered message is not sent: the pump may send what comes after it
            ledger.delivering(q, len(q) if filtering else min(room, len(q)))
        if not q:
            return False
        if len(ready) > 1:
            start = self._rr % len(ready)
            self._rr += 1
            ready = ready[start:] + ready[:start]
        sizes = None
        if self.qbytes is not None:
            sizes = list(map(len, map(_body_of, q if filtering else islice(q, room))))
        rejected: list[Message] = []
        if filtering:
            age = policy.max_age_ns
            self.filter = (time.time_ns() - age if age else 0, policy.max_attempts or 0, rejected)
        before = len(q)
        budget = room
        timed = self.timed
        try:
            while q and ready and budget > 0:
                share = -(-min(len(q), budget) // len(ready))
                still = []
                for c in ready:
                    had = c.in_flight_count
                    c.send_messages(self, min(share, budget))
                    budget -= c.in_flight_count - had
                    timed.add(c.id)
                    if not q or budget <= 0:
                        break
                    if c.can_receive():
                        still.append(c)
                ready = still
        finally:
            self.filter = None
        popped = before - len(q)
        if ledger is not None:
            ledger.sent(popped)
        if sizes is not None and self.qbytes is not None:
            self.qbytes -= sum(sizes[:popped])
        if policy.max_rate is not None:
            policy.spend(room - budget)
            if budget <= 0 and (q or b.depth):
                self._rate_wait(policy)
        if rejected:
            self._reject(policy, rejected)
        return more and budget > 0

    def _rate_wait(self, policy: Policy) -> None:
        """Pump again once the rate has a token (one timer at a time)."""
        if self._rate_timer is None and policy.max_rate:
            self._rate_timer = self.nsqd.loop.call_later(1 / policy.max_rate, self._rate_ready)

    def _rate_ready(self) -> None:
        self._rate_timer = None
        self.schedule_pump()

    def _reject(self, policy: Policy, msgs: list[Message]) -> None:
        """Messages a policy took off the way to a consumer: too old (max_age) or out of
        attempts (max_attempts): published to the dead-letter topic, or dropped."""
        now_ns = time.time_ns()
        age = policy.max_age_ns
        expired = sum(1 for m in msgs if age is not None and m.timestamp < now_ns - age)
        self.expired_count += expired
        dlq = policy.dead_letter_topic
        if dlq is not None:
            try:
                self.nsqd.get_topic(dlq).put_bodies([m.body for m in msgs])
            except Exception as e:  # noqa: BLE001 - a full disk, a bound, nsqd exiting: kept
                log.error(
                    "CHANNEL(%s): failed to publish %d message(s) to dead-letter topic %s, kept "
                    "(again in %gs) - %s",
                    self.backend_name,
                    len(msgs),
                    dlq,
                    DEAD_LETTER_RETRY,
                    e,
                )
                for m in msgs:
                    self.start_deferred(m, DEAD_LETTER_RETRY)
                return
            self.dead_letter_count += len(msgs)
        else:
            self.dropped_count += len(msgs) - expired
        ledger = self.ledger
        if ledger is not None:
            for m in msgs:
                ledger.finished(m)

    def set_policy(self, policy: Policy | None) -> None:
        """New settings (None: none): a max_bytes bound counts the memory queue's bytes from
        now on, and a drop_oldest bound applies at once."""
        self.policy = policy
        tracked = policy is not None and policy.max_bytes is not None
        if tracked and self.qbytes is None:
            self.qbytes = body_bytes(self.queue)
        elif not tracked:
            self.qbytes = None
        if (policy is None or policy.max_rate is None) and self._rate_timer is not None:
            self._rate_timer.cancel()
            self._rate_timer = None
        if policy is not None:
            self._bound()
        self.topic.policies_changed()
        self.schedule_pump()

    def _bound(self) -> None:
        """drop_oldest: the oldest messages go, counted, until the channel is within bounds."""
        p = self.policy
        if p is None or not p.drops_oldest or not p.over(self.depth, self.depth_bytes):
            return
        q = self.queue
        ledger = self.ledger
        dropped = 0
        while q and p.over(self.depth, self.depth_bytes):
            m = q.popleft()
            if self.qbytes is not None:
                self.qbytes -= len(m.body)
            if ledger is not None:
                ledger.finished(m)
            dropped += 1
        b = self.backend
        while b.depth and p.over(self.depth, self.depth_bytes):
            before = b.depth
            k = 1
            if p.max_depth is not None and self.depth > p.max_depth:
                k = self.depth - p.max_depth
            if ledger is not None:
                now, later = ledger.read(k, decode_records, time.time_ns())
                for m in now:
                    ledger.finished(m)
                for m, _ in later:
                    ledger.finished(m)
            else:
                b.read(k)
            if b.depth == before:
                break
            dropped += before - b.depth
        self.dropped_count += dropped

    def _room(self) -> int:
        """Messages the clients are ready for (RDY less what they have in flight)."""
        return sum(c.ready_count - c.in_flight_count for c in self.clients.values() if c.can_receive())

    def _refill(self, b: BackendQueue, want: int) -> bool:
        """Move up to ``want`` messages (at most about REFILL_BYTES of them) from the backend
        to the memory queue. True if it stopped at that bound with more in the backend."""
        ledger = self.ledger
        if ledger is None:
            tails = Tails(BODY_AT)
            records = b.read(want, None, REFILL_BYTES, tails)
            self._queue(decode_split(records, tails, f"CHANNEL({self.backend_name})"))
            return 0 < len(records) < want and b.depth > 0
        now_ns = time.time_ns()
        depth = b.depth
        msgs, later = ledger.read(want, decode_records, now_ns, REFILL_BYTES)
        self._queue(msgs)
        for m, due in later:
            self.start_deferred(m, (due - now_ns) / 1e9)
        if ledger.spent:
            ledger.journal.delete()  # an earlier run's journal, applied in full
            self.ledger = None
        return 0 < depth - b.depth < want and b.depth > 0

    # --- acknowledgements -----------------------------------------------------------------

    def _pop_in_flight(self, client: Consumer, msg_id: bytes) -> Message | str:
        msg = self.in_flight.get(msg_id)
        if msg is None:
            return "ID not in flight"
        if msg.client is not client:
            return "client does not own message"
        del self.in_flight[msg_id]
        msg.client = None
        return msg

    def finish(self, client: Consumer, msg_id: bytes) -> str | None:
        """FIN (the hottest consumer path): NSQ's error text, or None on success."""
        msg = self.in_flight.get(msg_id)
        if msg is None:
            return "ID not in flight"
        if msg.client is not client:
            return "client does not own message"
        del self.in_flight[msg_id]
        msg.client = None
        if self.ledger is not None:
            self.ledger.finished(msg)
        if self.e2e is not None:
            self.record_latency(msg.timestamp)
        if not self._pump_scheduled:
            self.schedule_pump()
        return None

    def dropped(self, msgs: list[Message]) -> None:
        """Messages a client's sample rate left out: finished for this channel, as NSQ."""
        ledger = self.ledger
        if ledger is not None:
            for m in msgs:
                ledger.finished(m)

    def finished_many(self) -> None:
        """Messages were FINished straight from the in-flight index (the protocol's run of
        FINs, taken only while ``e2e`` is None): what :meth:`finish` does besides, once."""
        if not self._pump_scheduled:
            self.schedule_pump()

    def all_finished(self, client: Consumer) -> None:
        """Nothing is in flight to ``client`` any more: its deadline entries are all stale
        (dropping them now spares the periodic scan from popping them one by one)."""
        t = self.timers.get(client.id)
        if t is not None:
            t.clear()

    def record_latency(self, msg_timestamp_ns: int, now_ns: int | None = None) -> None:
        """A message published at ``msg_timestamp_ns`` was FINished (now, or at ``now_ns``):
        record its end-to-end latency, as Go's ``FinishMessage``. A no-op without
        --e2e-processing-latency-percentile; a hot FIN path tests ``self.e2e is not None``
        first and so pays one attribute check when latencies are off."""
        e2e = self.e2e
        if e2e is not None:
            e2e.insert(msg_timestamp_ns, time.time_ns() if now_ns is None else now_ns)

    def requeue(self, client: Consumer, msg_id: bytes, delay: float) -> str | None:
        msg = self._pop_in_flight(client, msg_id)
        if isinstance(msg, str):
            return msg
        self.requeue_count += 1
        if delay <= 0:
            self.requeue_now(msg)
        else:
            if self.ledger is not None:
                self.ledger.deferred(msg, time.time_ns() + int(delay * 1e9))
            self.start_deferred(msg, delay)
            self.schedule_pump()
        return None

    def touch(self, client: Consumer, msg_id: bytes) -> str | None:
        msg = self.in_flight.get(msg_id)
        if msg is None:
            return "ID not in flight"
        if msg.client is not client:
            return "client does not own message"
        now = self.nsqd.loop.time()
        deadline = now + client.msg_timeout
        cap = msg.delivery_ts + self.nsqd.options.max_msg_timeout
        if deadline > cap:
            deadline = cap
        self.timers[client.id].track(msg, deadline)
        self.timed.add(client.id)
        return None

    # --- periodic work ----------------------------------------------------------------------

    def scan(self, now: float) -> None:
        """Requeue timed-out in-flight messages and release due deferred ones."""
        in_flight = self.in_flight
        timed = self.timed
        clients = self.clients
        for cid in list(timed):
            client = clients.get(cid)
            t = self.timers.get(cid)
            if client is None or t is None:
                timed.discard(cid)
                continue
            for msg in t.expired(now, client, in_flight):
                del self.in_flight[msg.id]
                msg.client = None
                self.timeout_count += 1
                client.timed_out_message()
                self.requeue_now(msg)
            if not t:
                timed.discard(cid)
        d = self.deferred
        while d and d[0][0] <= now:
            self.requeue_now(heapq.heappop(d)[2])
        ledger = self.ledger
        if ledger is not None and ledger.tracking:
            ledger.relocate(self._due_times)  # when a few messages hold the floor far back
        self.schedule_pump()

    def live(self) -> Iterator[Message]:
        """Every message in memory: queued, in flight, deferred."""
        yield from self.queue
        yield from self.in_flight.values()
        for _, _, m in self.deferred:
            yield m

    def _due_times(self) -> dict[Message, int]:
        """Each deferred message's due time, ns since the epoch."""
        loop_now = self.nsqd.loop.time()
        now_ns = time.time_ns()
        return {m: now_ns + int(max(when - loop_now, 0) * 1e9) for when, _, m in self.deferred}

    # --- clients ----------------------------------------------------------------------------

    def add_client(self, client: Consumer) -> bool:
        limit = self.nsqd.options.max_channel_consumers
        if limit and client.id not in self.clients and len(self.clients) >= limit:
            return False
        self.clients[client.id] = client
        return True

    def remove_client(self, client: Consumer) -> None:
        """Drop a client; its in-flight messages go straight back to the queue."""
        if self.clients.pop(client.id, None) is None:
            return
        self.timed.discard(client.id)
        timers = self.timers.pop(client.id, None)
        for msg in timers.owned(client) if timers is not None else ():
            if self.in_flight.get(msg.id) is msg:
                del self.in_flight[msg.id]
                msg.client = None
                self.requeue_now(msg)
        self.schedule_pump()
        if self.ephemeral and not self.clients and not self.exiting:
            self.topic.delete_channel(self.name)

    # --- admin --------------------------------------------------------------------------------

    @property
    def deferred_count(self) -> int:
        return len(self.deferred)

    def pause(self) -> None:
        self.paused = True
        self.nsqd.on_metadata_changed()

    def unpause(self) -> None:
        self.paused = False
        self.nsqd.on_metadata_changed()
        self.schedule_pump()

    def empty(self) -> None:
        """Drop every queued, in-flight and deferred message (as NSQ's Channel.Empty)."""
        self.queue.clear()
        if self.qbytes is not None:
            self.qbytes = 0
        for msg in self.in_flight.values():
            msg.client = None
        self.in_flight.clear()
        self.deferred.clear()
        for t in self.timers.values():
            t.clear()
        for client in self.clients.values():
            client.emptied()
        self.backend.empty()
        if self.ledger is not None:
            self.ledger.empty()
            if not self.ledger.tracking:
                self.ledger = None

    def close(self) -> None:
        """Channel deleted: disconnect its clients, drop its messages and its files."""
        self.exiting = True
        for client in list(self.clients.values()):
            client.close()
        self.queue.clear()
        self.in_flight.clear()
        self.deferred.clear()
        self.timers.clear()
        if self.ledger is not None:
            self.ledger.delete()  # before the queue's files: a journal never outlives them
            self.ledger = None
        self.backend.delete()

    # --- persistence across restarts -----------------------------------------------------------

    def flush(self) -> list[str]:
        """Clean shutdown: write memory, in-flight and deferred messages to the backend
        (attempts preserved), their due times to the journal. In the crash-safe mode they
        are all there already: only the journal is brought up to date. Returns what could
        not be written (each error logged)."""
        if not self.backend.durable:
            return []
        ledger = self.ledger
        due_of = self._due_times()
        if ledger is not None and ledger.tracking:
            ledger.compact(due_of)
            self._forget_all()
            return []
        msgs = list(self.queue)
        msgs += self.in_flight.values()
        deferred = [m for _, _, m in sorted(self.deferred)]
        msgs += deferred
        self._forget_all()
        errors = []
        positions: list[int] = []
        if msgs:
            try:
                records, heads = disk_records(msgs)
                self.backend.put_many(records, positions, heads)
                log.info("CHANNEL(%s): flushed %d message(s) to disk", self.backend_name, len(msgs))
            except DiskQueueError as e:
                lost = len(msgs) - getattr(e, "written", 0)
                errors.append(
                    f"CHANNEL({self.backend_name}): failed to flush {lost} of {len(msgs)} "
                    f"message(s) to disk, they are lost - {e}"
                )
                log.error("%s", errors[-1])
        # the deferred ones keep their due time (NSQ loses it, nsqio/nsq#1107)
        start = len(msgs) - len(deferred)
        written = positions[start:]
        if ledger is None and written:
            assert isinstance(self.backend, DiskQueue)
            ledger = Ledger(self.backend, False, log)
        if ledger is not None:
            for m, pos in zip(deferred, written, strict=False):
                ledger.dues[pos] = (m.id, due_of[m])
            try:
                ledger.save()
            except OSError as e:
                errors.append(
                    f"CHANNEL({self.backend_name}): failed to save {len(written)} deferred due "
                    f"time(s) (the messages are on disk, due at once) - {e}"
                )
                log.error("%s", errors[-1])
        return errors

    def _forget_all(self) -> None:
        for m in self.in_flight.values():
            m.client = None
        self.queue.clear()
        if self.qbytes is not None:
            self.qbytes = 0
        self.in_flight.clear()
        self.deferred.clear()
