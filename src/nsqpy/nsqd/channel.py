"""A channel: its own copy of every topic message, delivered to its subscribed clients.

State lives on the event-loop thread only. Ready messages wait in ``queue`` (bounded by
--mem-queue-size for publishes); in-flight ones are indexed by id in ``in_flight`` with a
per-client deadline deque (see :class:`~nsqpy.nsqd.protocol_v2.ClientV2`); deferred ones sit
in a heap until due. Delivery is a coalesced "pump" scheduled once per event-loop turn.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import deque
from typing import TYPE_CHECKING

from ..protocol.names import is_ephemeral

if TYPE_CHECKING:
    from .message import Message
    from .nsqd import NSQD
    from .protocol_v2 import ClientV2
    from .topic import Topic

log = logging.getLogger("nsqd")

_seq = itertools.count()


class QueueFullError(Exception):
    """A publish would take a memory queue past --mem-queue-size."""


class Channel:
    __slots__ = (
        "topic",
        "name",
        "nsqd",
        "ephemeral",
        "queue",
        "in_flight",
        "deferred",
        "clients",
        "paused",
        "exiting",
        "message_count",
        "requeue_count",
        "timeout_count",
        "_pump_scheduled",
        "_rr",
    )

    def __init__(self, topic: Topic, name: str, nsqd: NSQD) -> None:
        self.topic = topic
        self.name = name
        self.nsqd = nsqd
        self.ephemeral = is_ephemeral(name)
        self.queue: deque[Message] = deque()
        self.in_flight: dict[bytes, Message] = {}
        self.deferred: list[tuple[float, int, Message]] = []
        self.clients: dict[int, ClientV2] = {}
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self._pump_scheduled = False
        self._rr = 0

    # --- accepting messages -------------------------------------------------------------

    def room(self) -> int:
        """How many more published messages the memory queue takes (ephemerals: unbounded,
        their overflow is dropped instead)."""
        if self.ephemeral:
            return 1 << 62
        return self.nsqd.options.mem_queue_size - len(self.queue)

    def put_messages(self, msgs: list[Message]) -> None:
        """Queue published messages (the caller checked :meth:`room`)."""
        self.message_count += len(msgs)
        if self.ephemeral:
            free = self.nsqd.options.mem_queue_size - len(self.queue)
            if free < len(msgs):
                # NSQ's ephemeral backend discards overflow
                msgs = msgs[: max(free, 0)]
        now_msgs = msgs
        if any(m.defer for m in msgs):
            now_msgs = []
            for m in msgs:
                if m.defer:
                    d = m.defer
                    m.defer = 0.0
                    self.start_deferred(m, d)
                else:
                    now_msgs.append(m)
        if now_msgs:
            self.queue.extend(now_msgs)
            self.schedule_pump()

    def requeue_now(self, msg: Message) -> None:
        """Put a message back for immediate redelivery (REQ 0, timeout, client gone)."""
        self.queue.append(msg)
        self.schedule_pump()

    def start_deferred(self, msg: Message, delay: float) -> None:
        heapq.heappush(self.deferred, (self.nsqd.loop.time() + delay, next(_seq), msg))

    # --- delivery -------------------------------------------------------------------------

    def schedule_pump(self) -> None:
        if not self._pump_scheduled and self.queue and self.clients:
            self._pump_scheduled = True
            self.nsqd.loop.call_soon(self._pump)

    def _pump(self) -> None:
        """Spread ready messages over the clients that have RDY capacity."""
        self._pump_scheduled = False
        q = self.queue
        if not q or self.paused:
            return
        ready = [c for c in self.clients.values() if c.can_receive()]
        n = len(ready)
        if not n:
            return
        if n > 1:
            start = self._rr % n
            self._rr += 1
            ready = ready[start:] + ready[:start]
        while q and ready:
            share = -(-len(q) // len(ready))
            still = []
            for c in ready:
                c.send_messages(self, share)
                if not q:
                    break
                if c.can_receive():
                    still.append(c)
            ready = still

    # --- acknowledgements -----------------------------------------------------------------

    def _pop_in_flight(self, client: ClientV2, msg_id: bytes) -> Message | str:
        msg = self.in_flight.get(msg_id)
        if msg is None:
            return "ID not in flight"
        if msg.client is not client:
            return "client does not own message"
        del self.in_flight[msg_id]
        msg.client = None
        return msg

    def finish(self, client: ClientV2, msg_id: bytes) -> str | None:
        """FIN: returns NSQ's error text, or None on success."""
        msg = self._pop_in_flight(client, msg_id)
        if isinstance(msg, str):
            return msg
        return None

    def requeue(self, client: ClientV2, msg_id: bytes, delay: float) -> str | None:
        msg = self._pop_in_flight(client, msg_id)
        if isinstance(msg, str):
            return msg
        self.requeue_count += 1
        if delay <= 0:
            self.requeue_now(msg)
        else:
            self.start_deferred(msg, delay)
        return None

    def touch(self, client: ClientV2, msg_id: bytes) -> str | None:
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
        client.track_in_flight(msg, deadline)
        return None

    # --- periodic work ----------------------------------------------------------------------

    def scan(self, now: float) -> None:
        """Requeue timed-out in-flight messages and release due deferred ones."""
        for client in list(self.clients.values()):
            for msg in client.expired_in_flight(now):
                del self.in_flight[msg.id]
                msg.client = None
                self.timeout_count += 1
                client.timed_out_message()
                self.queue.append(msg)
        d = self.deferred
        while d and d[0][0] <= now:
            self.queue.append(heapq.heappop(d)[2])
        self.schedule_pump()

    # --- clients ----------------------------------------------------------------------------

    def add_client(self, client: ClientV2) -> bool:
        limit = self.nsqd.options.max_channel_consumers
        if limit and client.id not in self.clients and len(self.clients) >= limit:
            return False
        self.clients[client.id] = client
        return True

    def remove_client(self, client: ClientV2) -> None:
        """Drop a client; its in-flight messages go straight back to the queue."""
        if self.clients.pop(client.id, None) is None:
            return
        for msg in client.owned_in_flight():
            if self.in_flight.get(msg.id) is msg:
                del self.in_flight[msg.id]
                msg.client = None
                self.queue.append(msg)
        self.schedule_pump()
        if self.ephemeral and not self.clients and not self.exiting:
            self.topic.delete_channel(self.name)

    # --- admin --------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return len(self.queue)

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
        for msg in self.in_flight.values():
            msg.client = None
        self.in_flight.clear()
        self.deferred.clear()
        for client in self.clients.values():
            client.emptied()

    def close(self) -> None:
        """Channel deleted: disconnect its clients and drop its messages."""
        self.exiting = True
        for client in list(self.clients.values()):
            client.close()
        self.queue.clear()
        self.in_flight.clear()
        self.deferred.clear()
