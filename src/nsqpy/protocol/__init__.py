"""Sans-I/O core of NSQ protocol V2, shared by the daemon and the client: bytes in, events out."""

from .errors import ERROR_CODES, NON_FATAL_CODES, NSQError, ProtocolError
from .frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    MAGIC_V2,
    FrameReader,
    decode_message,
    encode_frame,
    encode_message,
    encode_message_frame,
)
from .names import is_ephemeral, is_valid_channel_name, is_valid_topic_name

__all__ = [
    "ERROR_CODES",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "FRAME_TYPE_RESPONSE",
    "MAGIC_V2",
    "NON_FATAL_CODES",
    "FrameReader",
    "NSQError",
    "ProtocolError",
    "decode_message",
    "encode_frame",
    "encode_message",
    "encode_message_frame",
    "is_ephemeral",
    "is_valid_channel_name",
    "is_valid_topic_name",
]
