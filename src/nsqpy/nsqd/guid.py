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
    __slots__ = ("_node", "_last_ts", "_seq")

    def __init__(self, node_id: int) -> None:
        if not 0 <= node_id < MAX_NODE_ID:
            raise ValueError(f"node-id must be in [0,{MAX_NODE_ID})")
        self._node = node_id << SEQUENCE_BITS
        self._last_ts = 0
        self._seq = -1

    def new_ids(self, count: int) -> list[bytes]:
        """``count`` fresh ids, in increasing order."""
        ts = time.time_ns() >> 20
        if ts <= self._last_ts:
            ts = self._last_ts
            seq = self._seq
        else:
            seq = -1
        node = self._node
        out: list[bytes] = []
        append = out.append
        for _ in range(count):
            seq += 1
            if seq > SEQUENCE_MASK:
                ts += 1
                seq = 0
            append(b"%016x" % (((ts - TWEPOCH) << 22) | node | seq))
        self._last_ts = ts
        self._seq = seq
        return out

    def new_id(self) -> bytes:
        return self.new_ids(1)[0]
