"""A channel's in-flight deadlines for one consumer (the role of Go's ``in_flight_pqueue.go``).

A consumer's ``msg_timeout`` is fixed, so the deadlines of the messages it is sent only grow:
they go into a deque in order. A TOUCHed message gets a later deadline that may come before
others': it goes into a small heap instead. FIN, REQ and TOUCH do not search either
structure: an entry is stale when its message is no longer in flight to this consumer with
this deadline, and stale entries are dropped when they reach the front (lazy deletion), the
deque being compacted when they dominate. The channel keeps one per consumer.
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any

from .._speedups import compiled

if TYPE_CHECKING:
    from .message import Message

if compiled:
    from .._speedups._hot import expire_front as _c_expire_front

#: Stale entries tolerated beyond twice the live ones before the deque is compacted.
COMPACT_SLACK = 1024


class InFlightTimers:
    __slots__ = ("heap", "queue")

    def __init__(self) -> None:
        #: (deadline, message) in send order: the hot path appends to it directly
        self.queue: deque[tuple[float, Message]] = deque()
        self.heap: list[tuple[float, int, Message]] = []

    def track(self, msg: Message, deadline: float) -> None:
        """(Re)set a message's deadline (a TOUCH)."""
        msg.deadline = deadline
        q = self.queue
        if not q or q[-1][0] <= deadline:
            q.append((deadline, msg))
        else:
            heappush(self.heap, (deadline, id(msg), msg))

    def expired(self, now: float, owner: Any, in_flight: dict[bytes, Message]) -> list[Message]:
        """The messages in flight to ``owner`` whose deadline has passed (``in_flight``: the
        channel's index, to tell live entries from stale ones)."""
        q = self.queue
        out = expire_front(q, now, owner, in_flight)
        if len(q) > 2 * owner.in_flight_count + COMPACT_SLACK:
            self.queue = deque(e for e in q if e[1].client is owner and e[1].deadline == e[0])
        h = self.heap
        while h and h[0][0] <= now:
            deadline, _, msg = heappop(h)
            if msg.client is owner and msg.deadline == deadline and in_flight.get(msg.id) is msg:
                out.append(msg)
        return out

    def owned(self, owner: Any) -> list[Message]:
        """Every message still in flight to ``owner`` (it is leaving); the timers are cleared."""
        seen: dict[int, Message] = {}
        for _, msg in self.queue:
            if msg.client is owner:
                seen[id(msg)] = msg
        for _, _, msg in self.heap:
            if msg.client is owner:
                seen[id(msg)] = msg
        self.clear()
        return list(seen.values())

    def clear(self) -> None:
        self.queue.clear()
        self.heap.clear()

    def __len__(self) -> int:
        return len(self.queue) + len(self.heap)


class TimersByClient(dict[int, InFlightTimers]):
    """A channel's :class:`InFlightTimers` by client id, each made when first asked for
    (``timers[id]``, as the first message goes in flight); ``get`` does not make one."""

    __slots__ = ()

    def __missing__(self, client_id: int) -> InFlightTimers:
        t = self[client_id] = InFlightTimers()
        return t


def expire_front_py(
    q: deque[tuple[float, Message]], now: float, owner: Any, in_flight: dict[bytes, Message]
) -> list[Message]:
    """Pop the entries at the front of ``q`` that are stale (no longer in flight to
    ``owner`` with that deadline) or due (deadline <= ``now``); returns the due messages
    still in ``in_flight``. Stops at the first live entry not yet due."""
    out: list[Message] = []
    while q:
        deadline, msg = q[0]
        live = msg.client is owner and msg.deadline == deadline
        if live and deadline > now:
            break
        q.popleft()
        if live and in_flight.get(msg.id) is msg:
            out.append(msg)
    return out


#: :func:`expire_front_py`, compiled when available
expire_front = _c_expire_front if compiled else expire_front_py
