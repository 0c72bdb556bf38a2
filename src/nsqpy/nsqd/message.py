"""The in-memory message: one object per channel copy, sharing the topic's body bytes.

A topic with several channels queues one object per message in all of them, marked
:data:`SHARED` (:func:`share_messages`): a queued copy costs a channel one reference, and a
channel makes its own copy only as it sends the message (``send_batch``), the first moment
it needs state of its own (attempts, client, deadline)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .._speedups import compiled
from .guid import ids_from

if TYPE_CHECKING:
    from .client_v2 import ClientV2


#: The ``deadline`` of a queued message shared by a topic's channels (a real one, in flight,
#: is a loop time, never negative): whoever sends it sends a :meth:`Message.copy` instead.
SHARED = -1.0


class Message:
    __slots__ = ("attempts", "body", "client", "deadline", "defer", "delivery_ts", "id", "timestamp")

    def __init__(self, msg_id: bytes, body: bytes, timestamp: int, attempts: int = 0) -> None:
        self.id = msg_id
        self.body = body
        #: Publish time, ns since the epoch (the frame's timestamp).
        self.timestamp = timestamp
        #: Delivery attempts so far (incremented as it is sent to a client).
        self.attempts = attempts
        #: The client this message is in flight to, else None.
        self.client: ClientV2 | None = None
        #: In-flight deadline (loop clock) while in flight; SHARED while queued in several
        #: channels at once.
        self.deadline = 0.0
        #: When it was last sent (loop clock), to cap TOUCH at --max-msg-timeout.
        self.delivery_ts = 0.0
        #: Seconds to defer on arrival at a channel (DPUB), 0 for none.
        self.defer = 0.0

    def copy(self) -> Message:
        m = Message(self.id, self.body, self.timestamp, self.attempts)
        m.defer = self.defer
        return m

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Message({self.id!r}, attempts={self.attempts}, body={self.body[:32]!r})"


def new_messages_py(
    bodies: list[bytes], ts: int, seq: int, node: int, twepoch: int, timestamp: int, defer: float
) -> list[Message]:
    """A message per body, published at ``timestamp`` (ns), with the ids reserved as
    ``(ts, seq)`` by :meth:`~nsqpy.nsqd.guid.GUIDFactory.reserve` on ``node``."""
    ids = ids_from(ts, seq, len(bodies), node, twepoch)
    msgs = [Message(i, b, timestamp) for i, b in zip(ids, bodies, strict=True)]
    if defer:
        for m in msgs:
            m.defer = defer
    return msgs


def share_messages(msgs: list[Message]) -> list[Message]:
    """Mark a topic's new messages SHARED, for every channel to queue the same objects."""
    for m in msgs:
        m.deadline = SHARED
    return msgs


def copy_messages_py(msgs: list[Message]) -> list[Message]:
    """Every message's :meth:`~Message.copy` (a topic's messages, for another channel)."""
    return [m.copy() for m in msgs]


copy_messages: Callable[[list[Message]], list[Message]]

if compiled:
    from .._speedups import _hot

    # the compiled functions build and fill this class's instances through its slots
    _hot.set_message_type(Message)
    copy_messages = _hot.copy_messages

    def new_messages(
        bodies: list[bytes], ts: int, seq: int, node: int, twepoch: int, timestamp: int, defer: float
    ) -> list[Message]:
        """:func:`new_messages_py`, compiled."""
        msgs = _hot.new_messages(bodies, ts, seq, node, twepoch, timestamp, defer)
        if msgs is None:  # an id the C code does not make (a clock before the epoch)
            return new_messages_py(bodies, ts, seq, node, twepoch, timestamp, defer)
        return msgs
else:
    copy_messages = copy_messages_py
    new_messages = new_messages_py
