"""A topic: receives published messages and gives every channel its own copy.

While a topic has no channels, or is paused, messages wait in its own memory queue (at most
--mem-queue-size) and beyond that in its DiskQueue; they flow to the channels when the first
channel appears or on unpause, the backlog from disk in chunks so the loop stays responsive.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from ..protocol.names import is_ephemeral
from .channel import Channel, decode_records, encode_messages
from .message import Message

if TYPE_CHECKING:
    from .diskqueue import DiskQueue
    from .nsqd import NSQD

log = logging.getLogger("nsqd")

#: Messages moved from a topic's DiskQueue to its channels per event-loop turn.
DRAIN_CHUNK = 5000


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
        "backend",
        "_draining",
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
        self.backend: DiskQueue | None = None if self.ephemeral else nsqd.make_backend(name)
        self._draining = False

    # --- publishing -------------------------------------------------------------------------

    def put_bodies(self, bodies: list[bytes], defer: float = 0.0) -> bool:
        """Publish raw bodies (PUB/MPUB/DPUB, HTTP /pub and /mpub), all or nothing.

        Returns True when the messages went to a DiskQueue whose --sync-every was reached:
        the publisher must then wait for the fsync before acknowledging. Raises
        :class:`TopicExitingError`, or an OSError if the disk write failed.
        """
        if self.exiting:
            raise TopicExitingError()
        n = len(bodies)
        if not n:
            return False
        nsqd = self.nsqd
        ids = nsqd.guid.new_ids(n)
        ts = nsqd.now_ns()
        msgs = [Message(i, b, ts) for i, b in zip(ids, bodies, strict=True)]
        if defer:
            for m in msgs:
                m.defer = defer
        self.message_count += n
        self.message_bytes += sum(map(len, bodies))
        if self.paused or not self.channels:
            return self._hold(msgs)
        return self._distribute(msgs)

    def _hold(self, msgs: list[Message]) -> bool:
        free = self.nsqd.options.mem_queue_size - len(self.queue)
        if free >= len(msgs):
            self.queue.extend(msgs)
            return False
        keep = max(free, 0)
        if keep:
            self.queue.extend(msgs[:keep])
        if self.backend is None:  # ephemeral: NSQ drops the overflow
            return False
        return self.nsqd.write_backend(self.backend, encode_messages(msgs[keep:]))

    def _distribute(self, msgs: list[Message]) -> bool:
        must_sync = False
        first = True
        for ch in list(self.channels.values()):
            if first:
                must_sync |= ch.put_messages(msgs)
                first = False
            else:
                must_sync |= ch.put_messages([m.copy() for m in msgs])
        return must_sync

    def flow(self) -> None:
        """Move held messages to the channels (first channel created, unpause, start-up)."""
        if not self.channels or self.paused:
            return
        if self.queue:
            msgs = list(self.queue)
            self.queue.clear()
            self._distribute(msgs)
        if self.backend is not None and self.backend.depth and not self._draining:
            self._draining = True
            self.nsqd.loop.call_soon(self._drain_backend)

    def _drain_backend(self) -> None:
        self._draining = False
        b = self.backend
        if b is None or self.exiting or self.paused or not self.channels or not b.depth:
            return
        records = b.read(DRAIN_CHUNK)
        self.nsqd.note_backend_read(b)
        chans = list(self.channels.values())
        only = chans[0] if len(chans) == 1 else None
        if (
            only is not None
            and only.backend is not None
            and len(only.queue) >= self.nsqd.options.mem_queue_size
        ):
            only.put_records(records)  # no need to decode what goes back to disk as is
        else:
            self._distribute(decode_records(records, f"TOPIC({self.name})"))
        if b.depth:
            self._draining = True
            self.nsqd.loop.call_soon(self._drain_backend)

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
        self.nsqd.on_channel_deleted(self, ch)
        if self.ephemeral and not self.channels and not self.exiting:
            self.nsqd.delete_topic(self.name)
        return True

    # --- admin ------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Messages held (memory + backend), as NSQ's Depth()."""
        b = self.backend
        return len(self.queue) + (b.depth if b is not None else 0)

    @property
    def backend_depth(self) -> int:
        b = self.backend
        return b.depth if b is not None else 0

    def pause(self) -> None:
        self.paused = True
        self.nsqd.on_metadata_changed()

    def unpause(self) -> None:
        self.paused = False
        self.nsqd.on_metadata_changed()
        self.flow()

    def empty(self) -> None:
        self.queue.clear()
        if self.backend is not None:
            self.backend.empty()

    def close(self) -> None:
        """Topic deleted: close every channel (disconnecting their clients), drop its files."""
        self.exiting = True
        for ch in list(self.channels.values()):
            ch.close()
        self.channels.clear()
        self.queue.clear()
        if self.backend is not None:
            self.nsqd.drop_backend(self.backend)
            self.backend.delete()
            self.backend = None

    def flush(self) -> None:
        """Clean shutdown: held messages to the backend, then every channel's."""
        if self.backend is not None and self.queue:
            self.backend.put_many(encode_messages(list(self.queue)))
            log.info("TOPIC(%s): flushed %d message(s) to disk", self.name, len(self.queue))
        self.queue.clear()
        for ch in self.channels.values():
            ch.flush()
