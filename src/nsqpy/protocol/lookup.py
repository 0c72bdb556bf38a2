"""Sans-I/O core of the nsqlookupd TCP protocol V1 (what nsqd speaks to nsqlookupd).

The client sends the magic ``"  V1"``, then text lines: ``PING``, ``IDENTIFY`` (followed by
``[int32 BE size][JSON]``), ``REGISTER <topic> [<channel>]``, ``UNREGISTER <topic>
[<channel>]``. Every answer, including errors (``"E_<CODE> <description>"``), is
``[int32 BE size][data]`` with no frame type. Every error ends the connection.

Lines are handled as Go's ``lookup_protocol_v1.go`` does: ``strings.TrimSpace`` then split on
single spaces, so ``REGISTER a  b`` has an empty second parameter. Names travel as bytes;
they are decoded with ``surrogateescape`` so an error message can echo them byte for byte.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Final

from .errors import ProtocolError

__all__ = [
    "MAGIC_V1",
    "MAX_BODY_SIZE",
    "MAX_LINE_LENGTH",
    "PEER_INFO_FIELDS",
    "LookupParser",
    "decode_identify",
    "decode_text",
    "encode_response",
    "encode_text",
    "go_trim_space",
    "identify",
    "ping",
    "register",
    "unregister",
]

MAGIC_V1: Final = b"  V1"

#: Longest command line accepted (Go has no limit; a valid REGISTER line is under 150 bytes).
MAX_LINE_LENGTH: Final = 64 * 1024

#: Largest IDENTIFY body accepted (Go has no limit; a real one is a few hundred bytes).
MAX_BODY_SIZE: Final = 1024 * 1024

_INT32: Final = struct.Struct(">i")

#: Go's ``unicode.IsSpace`` (what ``strings.TrimSpace`` removes).
_GO_SPACE: Final = (
    " \t\n\v\f\r\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)


def decode_text(data: bytes) -> str:
    """Bytes of a command line as text; invalid UTF-8 survives as surrogate escapes."""
    return data.decode("utf-8", "surrogateescape")


def encode_text(text: str) -> bytes:
    """The inverse of :func:`decode_text` (exact bytes back)."""
    return text.encode("utf-8", "surrogateescape")


def go_trim_space(s: str) -> str:
    """Go's ``strings.TrimSpace``."""
    return s.strip(_GO_SPACE)


def encode_response(data: bytes) -> bytes:
    """Go's ``protocol.SendResponse``: ``[int32 BE size][data]``."""
    return _INT32.pack(len(data)) + data


class LookupParser:
    """Incremental V1 parser: ``feed`` bytes, then take ``next_line()`` commands; after an
    ``IDENTIFY`` line the caller decides whether to take its body with ``next_body()``."""

    __slots__ = ("_buf", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received but not yet consumed."""
        return len(self._buf) - self._pos

    def next_line(self) -> list[str] | None:
        """The next command's parameters (``params[0]`` is the command name), or None if
        the line is not complete yet. Raises ProtocolError for an over-long line."""
        buf = self._buf
        nl = buf.find(b"\n", self._pos)
        if nl < 0:
            if len(buf) - self._pos > MAX_LINE_LENGTH:
                raise ProtocolError("E_INVALID", "command line too long")
            return None
        if nl - self._pos > MAX_LINE_LENGTH:  # too long, even when it arrived whole
            raise ProtocolError("E_INVALID", "command line too long")
        line = decode_text(bytes(buf[self._pos : nl]))
        self._pos = nl + 1
        return go_trim_space(line).split(" ")

    def next_body(self, command: str = "IDENTIFY") -> bytes | None:
        """A ``[int32 size][body]`` body, or None if it is not complete yet.

        Raises ProtocolError ``E_BAD_BODY`` for a negative or oversized size (Go would
        panic or try to allocate it).
        """
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 4:
            return None
        (size,) = _INT32.unpack_from(buf, pos)
        if size < 0 or size > MAX_BODY_SIZE:
            raise ProtocolError("E_BAD_BODY", f"{command} failed to read body")
        if len(buf) - pos - 4 < size:
            return None
        body = bytes(buf[pos + 4 : pos + 4 + size])
        self._pos = pos + 4 + size
        return body


# --- IDENTIFY bodies (Go's json.Unmarshal into PeerInfo) ---------------------------------------

#: PeerInfo's JSON fields and whether each is an int (else a string), in Go's field order.
PEER_INFO_FIELDS: Final[dict[str, bool]] = {
    "remote_address": False,
    "hostname": False,
    "broadcast_address": False,
    "tcp_port": True,
    "http_port": True,
    "version": False,
}


class _IntLiteral(int):
    """An integer JSON literal (``parse_int``), as opposed to one written with . or e."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid character in JSON: {name}")


def decode_identify(body: bytes) -> dict[str, Any]:
    """Decode an IDENTIFY body the way Go's ``json.Unmarshal`` fills a ``PeerInfo``.

    Returns the :data:`PEER_INFO_FIELDS` with Go's zero values for missing ones. Keys match
    case-insensitively (an exact match wins), later duplicates override earlier ones, JSON
    ``null`` leaves a field alone, unknown keys are ignored. Raises ValueError for invalid
    JSON, a non-object top level, or a value of the wrong type (a string where an int goes,
    ``1.0`` or ``1e3`` for an int, an int outside int64, nesting deeper than the
    recursion limit).
    """
    out: dict[str, Any] = {k: 0 if is_int else "" for k, is_int in PEER_INFO_FIELDS.items()}
    text = body.decode("utf-8", "replace")
    pairs_list: list[list[tuple[str, Any]]] = []

    def keep_pairs(pairs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        pairs_list.append(pairs)
        return pairs

    try:
        doc = json.loads(
            text,
            object_pairs_hook=keep_pairs,
            parse_int=lambda s: _IntLiteral(int(s)),
            parse_constant=_reject_constant,
        )
    except RecursionError:
        # nested deeper than the interpreter's recursion limit: Go's decoder gives up too
        # (its limit is 10,000 levels), with an error, not a crash
        raise ValueError("json: exceeded max depth") from None
    if doc is None:
        return out
    if not isinstance(doc, list) or not pairs_list or doc is not pairs_list[-1]:
        raise ValueError("json: cannot unmarshal into Go value of type PeerInfo")
    error: ValueError | None = None
    for key, value in doc:
        name = key if key in PEER_INFO_FIELDS else _fold(key)
        if name is None or value is None:
            continue
        if PEER_INFO_FIELDS[name]:
            ok = isinstance(value, _IntLiteral) and -(1 << 63) <= value < 1 << 63
        else:
            ok = isinstance(value, str)
        if ok:
            out[name] = int(value) if PEER_INFO_FIELDS[name] else value
        elif error is None:
            # Go keeps decoding the other fields and reports the first type error
            error = ValueError(f"json: cannot unmarshal into Go struct field PeerInfo.{name}")
    if error is not None:
        raise error
    return out


def _fold(key: str) -> str | None:
    low = key.lower()
    for name in PEER_INFO_FIELDS:
        if name == low:
            return name
    return None


# --- client-side encoders -------------------------------------------------------------


def identify(info: dict[str, Any]) -> bytes:
    body = json.dumps(info, separators=(",", ":")).encode()
    return b"IDENTIFY\n" + _INT32.pack(len(body)) + body


def register(topic: str, channel: str = "") -> bytes:
    return f"REGISTER {topic} {channel}\n".encode() if channel else f"REGISTER {topic}\n".encode()


def unregister(topic: str, channel: str = "") -> bytes:
    return f"UNREGISTER {topic} {channel}\n".encode() if channel else f"UNREGISTER {topic}\n".encode()


def ping() -> bytes:
    return b"PING\n"
