"""Frame encoding and decoding for protocol V2.

Server frames are ``[uint32 size][int32 type][data]`` where size counts the type and data.
A message frame's data is ``[int64 timestamp ns][uint16 attempts][16-byte hex id][body]``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple, TypeVar

MAGIC_V2 = b"  V2"

FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2

MSG_ID_LENGTH = 16
#: Bytes of a message frame before the body: type + timestamp + attempts + id.
MESSAGE_HEADER_SIZE = 4 + 8 + 2 + MSG_ID_LENGTH

#: A stored message (the frame's data, and a DiskQueue record) is
#: ``[int64 timestamp][uint16 attempts][16-byte id][body]``: where its id and body start.
MESSAGE_ID_OFFSET = 8 + 2
MESSAGE_BODY_OFFSET = MESSAGE_ID_OFFSET + MSG_ID_LENGTH

#: ``[uint32 size][int32 type]``
FRAME_HEADER = struct.Struct(">Ii")
#: a message frame up to its id: size, type, timestamp, attempts
MESSAGE_FRAME_PREFIX = struct.Struct(">IiqH")
#: a stored message's timestamp and attempts
MESSAGE_FIELDS = struct.Struct(">qH")
#: A message frame's header up to the body: size, type, timestamp, attempts, id.
MESSAGE_FRAME_HEADER = struct.Struct(">IiqH16s")

#: the size prefix of frames and bodies
unpack_int32_from = struct.Struct(">i").unpack_from

_FRAME_HEADER = FRAME_HEADER
_MESSAGE_PREFIX = MESSAGE_FRAME_PREFIX
_MESSAGE_FIELDS = MESSAGE_FIELDS
_MESSAGE_FRAME_HEADER = MESSAGE_FRAME_HEADER


def encode_frame(frame_type: int, data: bytes) -> bytes:
    return _FRAME_HEADER.pack(len(data) + 4, frame_type) + data


def encode_response(data: bytes) -> bytes:
    return _FRAME_HEADER.pack(len(data) + 4, FRAME_TYPE_RESPONSE) + data


def encode_error(data: bytes) -> bytes:
    return _FRAME_HEADER.pack(len(data) + 4, FRAME_TYPE_ERROR) + data


def encode_message_frame(timestamp: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """One complete message frame (header + body)."""
    return (
        _MESSAGE_PREFIX.pack(MESSAGE_HEADER_SIZE + len(body), FRAME_TYPE_MESSAGE, timestamp, attempts)
        + msg_id
        + body
    )


#: Pre-built frames for the hot path.
OK_FRAME = encode_response(b"OK")
HEARTBEAT_FRAME = encode_response(b"_heartbeat_")
CLOSE_WAIT_FRAME = encode_response(b"CLOSE_WAIT")
HEARTBEAT = b"_heartbeat_"


def encode_message(timestamp: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """A message as stored on disk and inside a frame: ``[ts][attempts][id][body]``."""
    return _MESSAGE_FIELDS.pack(timestamp, attempts) + msg_id + body


class DecodedMessage(NamedTuple):
    timestamp: int
    attempts: int
    id: bytes
    body: bytes


def decode_message(data: bytes | memoryview) -> DecodedMessage:
    """Decode ``[ts][attempts][id][body]`` (the payload of a message frame)."""
    if len(data) < MESSAGE_HEADER_SIZE - 4:
        raise ValueError(f"invalid message buffer size ({len(data)})")
    ts, attempts = _MESSAGE_FIELDS.unpack_from(data, 0)
    return DecodedMessage(
        ts, attempts, bytes(data[MESSAGE_ID_OFFSET:MESSAGE_BODY_OFFSET]), bytes(data[MESSAGE_BODY_OFFSET:])
    )


M = TypeVar("M")


class FrameReader:
    """Incremental decoder of server frames (client side): feed bytes, take ``(type, data)``."""

    __slots__ = ("_buf", "_need", "max_frame_size")

    def __init__(self, max_frame_size: int = 64 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self._need = 0  # bytes _buf must hold before feed_batched tries to parse it
        self.max_frame_size = max_frame_size

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._need = 0
        buf = self._buf
        buf += data
        frames: list[tuple[int, bytes]] = []
        pos = 0
        end = len(buf)
        while end - pos >= 8:
            size, ftype = _FRAME_HEADER.unpack_from(buf, pos)
            if size < 4 or size > self.max_frame_size:
                raise ValueError(f"invalid frame size {size}")
            if end - pos - 4 < size:
                break
            frames.append((ftype, bytes(buf[pos + 8 : pos + 4 + size])))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return frames

    def feed_batched(
        self, data: bytes, make_message: Callable[[bytes, bytes, int, int], M]
    ) -> list[list[M] | tuple[int, bytes]]:
        """Like :meth:`feed`, shaped for a consumer's hot path: each run of consecutive
        message frames comes out as one list of ``make_message(id, body, timestamp,
        attempts)``, every other frame as ``(type, data)``, in order.

        A frame's fields are sliced straight from ``data`` (one copy each); only a frame
        split across reads is buffered. Raises ValueError on a bad frame or message size.
        """
        data = self.take(data)
        if not data:
            return []
        unpack_message = _MESSAGE_FRAME_HEADER.unpack_from
        unpack_frame = _FRAME_HEADER.unpack_from
        max_size = self.max_frame_size
        out: list[list[M] | tuple[int, bytes]] = []
        run: list[M] = []
        pos = 0
        end = len(data)
        while True:
            avail = end - pos
            if avail >= 4 + MESSAGE_HEADER_SIZE:
                size, ftype, ts, attempts, msg_id = unpack_message(data, pos)
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
                run.append(make_message(msg_id, data[pos + 4 + MESSAGE_HEADER_SIZE : nxt], ts, attempts))
            else:
                if run:
                    out.append(run)
                    run = []
                out.append((ftype, data[pos + 8 : nxt]))
            pos = nxt
        if run:
            out.append(run)
        self.keep(data, pos)
        return out

    def take(self, data: bytes) -> bytes:
        """For a decoder walking frames itself: ``data`` preceded by the start of a frame
        kept from earlier reads, or b"" while that frame is still incomplete."""
        buf = self._buf
        if not buf:
            return data
        buf += data
        if len(buf) < self._need:
            return b""
        data = bytes(buf)
        buf.clear()
        return data

    def keep(self, data: bytes, pos: int) -> None:
        """Keep ``data[pos:]`` (the start of a frame) for the next :meth:`take`."""
        if pos < len(data):
            buf = self._buf
            buf += memoryview(data)[pos:]
            self._need = 4 + _FRAME_HEADER.unpack_from(buf, 0)[0] if len(buf) >= 8 else 8
