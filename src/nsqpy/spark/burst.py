"""nsqd's frame stream → Arrow columns, for the source's hot path.

:func:`scan_frames` walks the frame headers (size, type, timestamp, attempts): compiled
(``nsqpy._speedups``) when built, else :func:`scan_frames_py`, its pure-Python reference
(one ``struct`` call per frame). Each run of consecutive message frames becomes one Arrow
binary array over the received bytes without a copy (the frames are contiguous, so their
start positions are the array's offsets), and ids and bodies are cut out of it by Arrow
kernels; timestamps and attempts arrive as native integer buffers, and the burst's FIN
command (``FIN <id>\n`` per message: :data:`FIN_LINE` bytes each, so a part of the burst is
a slice of it) is built by the same scan.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from nsqpy._speedups import compiled
from nsqpy.protocol.frames import FRAME_TYPE_MESSAGE, MESSAGE_HEADER_SIZE, MSG_ID_LENGTH, FrameReader

_HEADER = struct.Struct(">IiqH")  # size, frame type, timestamp (ns), attempts
_FRAME = struct.Struct(">Ii")  # size, frame type
#: where a message's id and body start in its frame (after the 4-byte size)
ID_AT = 4 + 4 + 8 + 2
BODY_AT = ID_AT + MSG_ID_LENGTH
_END = 2**31 - 1
#: The length of one message's ``FIN <id>\n``.
FIN_LINE = len(b"FIN ") + MSG_ID_LENGTH + 1


class Burst:
    """The messages received since the last cut, as columns."""

    def __init__(self) -> None:
        self.runs: list[pa.Array] = []  # whole message frames, binary
        #: native int64 timestamps (ns) and int32 attempts, and the FIN lines, one buffer
        #: per feed
        self.ts_parts: list[Any] = []
        self.att_parts: list[Any] = []
        self.fin_parts: list[bytes] = []
        self.n = 0
        #: messages delivered before (attempts > 1): only those can be redeliveries
        self.again = 0

    def __len__(self) -> int:
        return self.n

    def columns(self) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
        """``(id string, timestamp us UTC, attempts int32, body binary)`` of the messages."""
        frames = self.runs[0] if len(self.runs) == 1 else pa.concat_arrays(self.runs)
        ids = pc.binary_slice(frames, ID_AT, BODY_AT).cast(pa.string())
        bodies = pc.binary_slice(frames, BODY_AT, _END)
        ts = pa.Array.from_buffers(_TS_NS, self.n, [None, _joined(self.ts_parts)])
        ts = ts.cast(_TS_US, safe=False)
        attempts = pa.Array.from_buffers(pa.int32(), self.n, [None, _joined(self.att_parts)])
        return ids, ts, attempts, bodies

    def fins(self) -> bytes:
        """``FIN <id>\n`` for every message, in order (FIN_LINE bytes each)."""
        return self.fin_parts[0] if len(self.fin_parts) == 1 else b"".join(self.fin_parts)


_TS_NS = pa.timestamp("ns", tz="UTC")
_TS_US = pa.timestamp("us", tz="UTC")


def _joined(parts: list[Any]) -> pa.Buffer:
    return pa.py_buffer(parts[0] if len(parts) == 1 else b"".join(parts))


# Arrow scalars made once: a Python bytes argument is converted on every call, and that
# conversion looks for the optional dateutil module each time (an import attempt: ~0.1 ms)
_FIN = pa.scalar(b"FIN ", pa.binary())
_REQ = pa.scalar(b"REQ ", pa.binary())
_NL = pa.scalar(b"\n", pa.binary())
_REQ_NOW = pa.scalar(b" 0\n", pa.binary())
_NO_SEP = pa.scalar(b"", pa.binary())


def _per_id(prefix: pa.Scalar, ids: pa.Array, suffix: pa.Scalar) -> bytes:
    """``<prefix><id><suffix>`` for every id, as one write."""
    joined = pc.binary_join_element_wise(prefix, ids.cast(pa.binary()), suffix, _NO_SEP)
    _, offsets, data = joined.buffers()
    first = struct.unpack_from("<i", offsets, 4 * joined.offset)[0]
    last = struct.unpack_from("<i", offsets, 4 * (joined.offset + len(joined)))[0]
    out: bytes = data.slice(first, last - first).to_pybytes()
    return out


def fin_command(ids: pa.Array) -> bytes:
    """``FIN <id>\n`` for every id, as one write."""
    return _per_id(_FIN, ids, _NL)


def req_command(ids: pa.Array) -> bytes:
    """``REQ <id> 0\n`` for every id (back to the queue now), as one write."""
    return _per_id(_REQ, ids, _REQ_NOW)


class BurstReader:
    """Splits a connection's application bytes (after TLS and decompression: what
    :meth:`.nsqconn.BlockingConnection.recv` returns) into the burst's message columns and
    the other frames, which go back to the protocol (:meth:`.nsqconn.BlockingConnection.
    frames_received`). A frame split across reads waits for its rest in ``pending``: the
    protocol's own frame reader, with what it received but did not parse, when the burst
    reader takes over after the handshake."""

    def __init__(self, pending: FrameReader | None = None) -> None:
        self._pending = pending if pending is not None else FrameReader()

    def feed(self, data: bytes, burst: Burst) -> list[tuple[int, bytes]]:
        """Append ``data``'s messages to ``burst``; return its other frames as
        ``(type, payload)``. Raises ValueError on a bad frame or message size."""
        data = self._pending.take(data)
        if not data:
            return []
        max_size = self._pending.max_frame_size
        scanned = scan_frames(data, max_size)
        if scanned is None:  # the compiled scan found a bad frame: the reference says which
            scanned = scan_frames_py(data, max_size)
        pos, runs, ts, attempts, fins, again, others = scanned
        if runs:
            buf = pa.py_buffer(data)
            for offsets in runs:
                n = len(offsets) // 4 - 1
                burst.runs.append(pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), buf]))
            burst.ts_parts.append(ts)
            burst.att_parts.append(attempts)
            burst.fin_parts.append(fins)
            burst.n += len(attempts) // 4
            burst.again += again
        self._pending.keep(data, pos)
        return others


Scanned = tuple[int, list[bytes], bytes, bytes, bytes, int, list[tuple[int, bytes]]]


def scan_frames_py(data: bytes, max_size: int) -> Scanned:
    """``(pos, runs, timestamps, attempts, fins, again, others)`` of the complete frames in
    ``data``: per run of consecutive message frames, its int32 offsets into ``data`` (each
    frame's start, then the run's end); native int64 timestamps (ns) and int32 attempts per
    message; ``FIN <id>\n`` per message; how many messages have attempts > 1; the other
    frames as ``(type, payload)``; ``pos``: where the first incomplete frame starts. Raises
    ValueError on a bad frame or message size. The reference of the compiled
    ``scan_frames``."""
    unpack_header = _HEADER.unpack_from
    unpack_frame = _FRAME.unpack_from
    runs: list[bytes] = []
    ts_out = array("q")
    att_out = array("i")
    ts_append = ts_out.append
    att_append = att_out.append
    others: list[tuple[int, bytes]] = []
    fins = bytearray()
    again = 0
    starts = array("i")
    pos = 0
    end = len(data)
    while True:
        avail = end - pos
        if avail >= 18:
            size, ftype, ts, attempts = unpack_header(data, pos)
        elif avail >= 8:
            size, ftype = unpack_frame(data, pos)
        else:
            break
        if size < 4 or size > max_size:
            raise ValueError(f"invalid frame size {size}")
        nxt = pos + 4 + size
        if nxt > end:
            break
        if ftype == FRAME_TYPE_MESSAGE:
            if size < MESSAGE_HEADER_SIZE:
                raise ValueError(f"invalid message buffer size ({size - 4})")
            starts.append(pos)
            ts_append(ts)
            att_append(attempts)
            fins += b"FIN " + data[pos + ID_AT : pos + BODY_AT] + b"\n"
            again += attempts > 1
        else:
            if starts:
                starts.append(pos)
                runs.append(starts.tobytes())
                starts = array("i")
            others.append((ftype, data[pos + 8 : nxt]))
        pos = nxt
    if starts:
        starts.append(pos)
        runs.append(starts.tobytes())
    return pos, runs, ts_out.tobytes(), att_out.tobytes(), bytes(fins), again, others


#: The compiled scan when built (it returns None on a bad frame, and
#: :func:`scan_frames_py` then raises the error), else the reference.
scan_frames: Callable[[bytes, int], Scanned | None] = scan_frames_py
if compiled:
    from nsqpy._speedups import _hot

    scan_frames = _hot.scan_frames
