"""Message IDs: NSQ's snowflake-style 64-bit GUIDs, hex-encoded to 16 ASCII bytes.

``id = ((ns_time >> 20) - TWEPOCH) << 22 | node_id << 12 | sequence`` (as ``nsqd/guid.go``).
One factory per daemon, so ids are unique per nsqd (Go keeps one per topic). When the
12-bit sequence runs out within one time unit the factory borrows the next unit instead
of sleeping, which keeps ids unique and increasing.
"""

from __future__ import annotations

import time

TWEPOCH = 1288834974657
NODE_ID_BITS = 10
SEQUENCE_BITS = 12
SEQUENCE_MASK = (1 << SEQUENCE_BITS) - 1
MAX_NODE_ID = 1 << NODE_ID_BITS


class GUIDFactory:
    __slots__ = ("_last_ts", "_node", "_seq")

    def __init__(self, node_id: int) -> None:
        if not 0 <= node_id < MAX_NODE_ID:
            raise ValueError(f"node-id must be in [0,{MAX_NODE_ID})")
        self._node = node_id << SEQUENCE_BITS
        self._last_ts = 0
        self._seq = -1

    @property
    def node(self) -> int:
        """The node id, shifted to its place in an id."""
        return self._node

    def reserve(self, count: int) -> tuple[int, int]:
        """Take ``count`` (> 0) ids at once: returns ``(ts, seq)``, from which
        :func:`ids_from` makes them (the k-th is sequence number ``seq + k`` counted from
        time unit ``ts``, the sequence carrying into the time unit)."""
        ts = time.time_ns() >> 20
        if ts <= self._last_ts:
            ts = self._last_ts
            seq = self._seq + 1
        else:
            seq = 0
        last = seq + count - 1
        self._last_ts = ts + (last >> SEQUENCE_BITS)
        self._seq = last & SEQUENCE_MASK
        return ts, seq

    def new_ids(self, count: int) -> list[bytes]:
        """``count`` fresh ids, in increasing order."""
        if count <= 0:
            return []
        ts, seq = self.reserve(count)
        return ids_from(ts, seq, count, self._node)

    def new_id(self) -> bytes:
        return self.new_ids(1)[0]


def ids_from(ts: int, seq: int, count: int, node: int, twepoch: int = TWEPOCH) -> list[bytes]:
    """The ``count`` ids reserved as ``(ts, seq)`` by :meth:`GUIDFactory.reserve` on node
    ``node`` (shifted: :attr:`GUIDFactory.node`)."""
    return [
        b"%016x" % (((ts + (s >> SEQUENCE_BITS) - twepoch) << 22) | node | (s & SEQUENCE_MASK))
        for s in range(seq, seq + count)
    ]
