"""A topic: receives published messages and gives every channel its own copy.

While a topic has no channels, or is paused, messages wait in its own queue (bounded by
--mem-queue-size); they flow to the channels when the first channel appears or on unpause.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from ..protocol.names import is_ephemeral
from .channel import Channel, QueueFullError
from .message import Message

if TYPE_CHECKING:
    from .nsqd import NSQD

log = logging.getLogger("nsqd")


class TopicExitingError(Exception):
    def __str__(self) -> str:
        return "exiting"


class Topic:
    __slots__ = (
        "name",
        "nsqd",
        "ephemeral",
        "channels",
        "queue",
        "paused",
        "exiting",
        "message_count",
        "message_bytes",
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

    # --- publishing -------------------------------------------------------------------------

    def put_bodies(self, bodies: list[bytes], defer: float = 0.0) -> None:
        """Publish raw bodies (PUB/MPUB/DPUB, HTTP /pub and /mpub), all or nothing.

        Raises :class:`TopicExitingError` or :class:`QueueFullError`.
        """
        if self.exiting:
            raise TopicExitingError()
        n = len(bodies)
        if not n:
            return
        self._check_room(n)
        nsqd = self.nsqd
        ids = nsqd.guid.new_ids(n)
        ts = nsqd.now_ns()
        msgs = [Message(i, b, ts) for i, b in zip(ids, bodies)]
        if defer:
            for m in msgs:
                m.defer = defer
        self.message_count += n
        self.message_bytes += sum(map(len, bodies))
        if self.paused or not self.channels:
            if self.ephemeral:
                free = nsqd.options.mem_queue_size - len(self.queue)
                msgs = msgs[: max(free, 0)]
            self.queue.extend(msgs)
        else:
            self._distribute(msgs)

    def _check_room(self, n: int) -> None:
        mem = self.nsqd.options.mem_queue_size
        if self.paused or not self.channels:
            if not self.ephemeral and len(self.queue) + n > mem:
                raise QueueFullError(f"topic {self.name} memory queue is full ({mem})")
            return
        for ch in self.channels.values():
            if ch.room() < n:
                raise QueueFullError(f"channel {self.name}:{ch.name} memory queue is full ({mem})")

    def _distribute(self, msgs: list[Message]) -> None:
        first = True
        for ch in list(self.channels.values()):
            if first:
                ch.put_messages(msgs)
                first = False
            else:
                ch.put_messages([m.copy() for m in msgs])

    def _flush_queue(self) -> None:
        """Move held messages to the channels (first channel created, or unpause)."""
        if self.queue and self.channels and not self.paused:
            msgs = list(self.queue)
            self.queue.clear()
            self._distribute(msgs)

    # --- channels ---------------------------------------------------------------------------

    def get_channel(self, name: str) -> Channel:
        ch = self.channels.get(name)
        if ch is None:
            ch = self.channels[name] = Channel(self, name, self.nsqd)
            log.info("TOPIC(%s): new channel(%s)", self.name, name)
            self.nsqd.on_channel_created(self, ch)
            self._flush_queue()
        return ch

    def delete_channel(self, name: str) -> bool:
        ch = self.channels.pop(name, None)
        if ch is None:
            return False
        log.info("TOPIC(%s): deleting channel %s", self.name, name)
        ch.close()
        self.nsqd.on_channel_deleted(self, ch)
        if self.ephemeral and not self.channels and not self.exiting:
            self.nsqd.delete_topic(self.name)
        return True

    # --- admin ------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return len(self.queue)

    def pause(self) -> None:
        self.paused = True
        self.nsqd.on_metadata_changed()

    def unpause(self) -> None:
        self.paused = False
        self.nsqd.on_metadata_changed()
        self._flush_queue()

    def empty(self) -> None:
        self.queue.clear()

    def close(self) -> None:
        """Topic deleted: close every channel (disconnecting their clients)."""
        self.exiting = True
        for ch in list(self.channels.values()):
            ch.close()
        self.channels.clear()
        self.queue.clear()
