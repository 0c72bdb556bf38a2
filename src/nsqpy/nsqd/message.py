"""The in-memory message: one object per channel copy, sharing the topic's body bytes."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .client_v2 import ClientV2


class Message:
    __slots__ = ("id", "body", "timestamp", "attempts", "client", "deadline", "delivery_ts", "defer")

    def __init__(self, msg_id: bytes, body: bytes, timestamp: int, attempts: int = 0) -> None:
        self.id = msg_id
        self.body = body
        #: Publish time, ns since the epoch (the frame's timestamp).
        self.timestamp = timestamp
        #: Delivery attempts so far (incremented as it is sent to a client).
        self.attempts = attempts
        #: The client this message is in flight to, else None.
        self.client: ClientV2 | None = None
        #: In-flight deadline (loop clock) while in flight.
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

