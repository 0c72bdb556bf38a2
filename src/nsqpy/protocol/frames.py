"""Frame encoding and decoding for protocol V2.

Server frames are ``[uint32 size][int32 type][data]`` where size counts the type and data.
A message frame's data is ``[int64 timestamp ns][uint16 attempts][16-byte hex id][body]``.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

MAGIC_V2 = b"  V2"

FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2

MSG_ID_LENGTH = 16
#: Bytes of a message frame before the body: type + timestamp + attempts + id.
MESSAGE_HEADER_SIZE = 4 + 8 + 2 + MSG_ID_LENGTH

_FRAME_HEADER = struct.Struct(">Ii")
_MESSAGE_PREFIX = struct.Struct(">IiqH")
_MESSAGE_FIELDS = struct.Struct(">qH")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")

pack_int32 = _INT32.pack
unpack_int32_from = _INT32.unpack_from


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
    return DecodedMessage(ts, attempts, bytes(data[10:26]), bytes(data[26:]))


class FrameReader:
    """Incremental decoder of server frames (client side): feed bytes, take ``(type, data)``."""

    __slots__ = ("_buf", "max_frame_size")

    def __init__(self, max_frame_size: int = 64 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self.max_frame_size = max_frame_size

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
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
