"""Client commands of protocol V2: an incremental server-side parser and client-side encoders.

Commands are text lines (``\\n``, optional ``\\r``) with parameters split on single spaces;
``IDENTIFY``, ``AUTH``, ``PUB``, ``MPUB`` and ``DPUB`` are followed by a body
``[int32 BE size][bytes]``. The parser is sans-I/O: feed it bytes, take commands.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .._speedups import compiled
from .errors import ProtocolError
from .frames import MSG_ID_LENGTH

if compiled:
    from .._speedups._hot import decode_mpub as _c_decode_mpub
    from .._speedups._hot import fin_run as _c_fin_run
    from .._speedups._hot import parse_line as _c_parse_line

#: Commands followed by a ``[size][body]``.
BODY_COMMANDS = frozenset({b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB"})

#: Longest command line accepted (the Go daemon's read buffer is 16 KiB).
MAX_LINE_LENGTH = 16 * 1024

#: ``validate(name, params, size)``: called once when a body command's line is parsed
#: (``size`` is ``None``) and again when its size prefix has arrived; raises
#: :class:`ProtocolError` to reject the command before its body is buffered.
Validator = Callable[[bytes, list[bytes], "int | None"], None]

#: a command's body: bytes, but an MPUB body received in place
#: (:meth:`CommandParser.get_buffer`) is the bytearray it was received into
Body = bytes | bytearray | None
#: (name, params, body)
Command = tuple[bytes, list[bytes], Body]

_INT32 = struct.Struct(">i")
#: a body this long is copied out of the buffer through a memoryview
_COPY_ONCE = 1 << 12
#: a body this long, not yet received whole, is received into a buffer of its own, in
#: place (:meth:`CommandParser.get_buffer`)
RECEIVE_IN_PLACE = 1 << 16
#: the size of the buffer other bytes are received into before they join the parser's
_RECEIVE_CHUNK = 1 << 18


class LineTooLong(ProtocolError):
    """A command line longer than :data:`MAX_LINE_LENGTH` before its ``\n``, however it
    arrived (whole or cut by TCP); the connection is dropped."""

    def __init__(self) -> None:
        super().__init__("E_INVALID", "command line too long")


_scratch: list[memoryview] = []


def receive_scratch() -> memoryview:
    """A buffer to receive into whose bytes are copied elsewhere at once (one per process:
    the event loop thread receives for one connection at a time)."""
    if not _scratch:
        _scratch.append(memoryview(bytearray(_RECEIVE_CHUNK)))
    return _scratch[0]


class CommandParser:
    """Incremental parser: ``feed(data)`` then call ``next(validate)`` until it returns None.

    Or, under an ``asyncio.BufferedProtocol``: receive into :meth:`get_buffer`, then call
    :meth:`received`. A large body is then received straight into a buffer of its own (no
    copy on the way: an MPUB's messages are cut from it as they are)."""

    __slots__ = ("_body", "_body_len", "_buf", "_pending_name", "_pending_params", "_pending_size", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._pending_name: bytes | None = None
        self._pending_params: list[bytes] = []
        self._pending_size = -1
        #: the pending body being received in place, and how much of it has arrived
        self._body: bytearray | None = None
        self._body_len = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        body = self._body
        if body is not None:
            take = min(len(data), len(body) - self._body_len)
            body[self._body_len : self._body_len + take] = data[:take]
            self._body_len += take
            data = data[take:]
            if not data:
                return
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def get_buffer(self) -> memoryview:
        """Where the next bytes received should go (``BufferedProtocol.get_buffer``): the
        rest of a body of RECEIVE_IN_PLACE bytes or more being waited for, in a bytearray of
        its exact size (what was buffered of it moves there), or else a scratch buffer.
        Call :meth:`received` with the count of bytes written there."""
        size = self._pending_size
        if size >= RECEIVE_IN_PLACE and self._pending_name is not None:
            body = self._body
            if body is None:
                buf = self._buf
                have = len(buf) - self._pos
                if have < size:
                    body = self._body = bytearray(size)
                    if have:
                        body[:have] = memoryview(buf)[self._pos :]
                    self._body_len = have
                    self._buf = bytearray()
                    self._pos = 0
            if body is not None:
                return memoryview(body)[self._body_len :]
        return receive_scratch()

    def received(self, n: int) -> None:
        """``n`` bytes were written into the buffer :meth:`get_buffer` gave."""
        if self._body is not None:
            self._body_len += n
        else:
            self.feed(receive_scratch()[:n])

    @property
    def buffered(self) -> int:
        """Bytes received but not yet consumed."""
        return len(self._buf) - self._pos + self._body_len

    def take_buffered(self) -> bytes:
        """Remove and return the bytes received but not consumed (a connection upgrade: they
        belong to the layer below the commands now). Only between commands."""
        if self._pending_name is not None:
            raise RuntimeError("take_buffered() in the middle of a command")
        data = bytes(self._buf[self._pos :])
        self._buf = bytearray()
        self._pos = 0
        return data

    def next(self, validate: Validator | None = None) -> Command | None:
        """The next complete command, or None if more bytes are needed.

        Raises :class:`ProtocolError` (from ``validate``) or :class:`LineTooLong`; after an
        error the parser should be discarded along with the connection.
        """
        buf = self._buf
        pos = self._pos
        name = self._pending_name
        if name is None:
            if compiled:
                line = _c_parse_line(buf, pos)
                if line is None:
                    if len(buf) - pos > MAX_LINE_LENGTH:
                        raise LineTooLong()
                    return None
                params, end = line
                if end - pos > MAX_LINE_LENGTH + 1:  # the line before its '\n' is too long
                    raise LineTooLong()
                pos = end
            else:
                nl = buf.find(b"\n", pos)
                if nl < 0:
                    if len(buf) - pos > MAX_LINE_LENGTH:
                        raise LineTooLong()
                    return None
                if nl - pos > MAX_LINE_LENGTH:  # too long, even when it arrived whole
                    raise LineTooLong()
                end = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl
                params = bytes(buf[pos:end]).split(b" ")
                pos = nl + 1
            self._pos = pos
            name = params[0]
            if name not in BODY_COMMANDS:
                return name, params, None
            if validate is not None:
                validate(name, params, None)
            self._pending_name = name
            self._pending_params = params
            self._pending_size = -1
        size = self._pending_size
        received = self._body
        if received is not None:  # a body received in place (get_buffer)
            if self._body_len < size:
                return None
            self._body = None
            self._body_len = 0
            params = self._pending_params
            self._pending_name = None
            self._pending_params = []
            self._pending_size = -1
            return name, params, received if name == b"MPUB" else bytes(received)
        if size < 0:
            if len(buf) - pos < 4:
                return None
            size = _INT32.unpack_from(buf, pos)[0]
            self._pos = pos = pos + 4
            if validate is not None:
                validate(name, self._pending_params, size)
            if size < 0:
                raise ProtocolError("E_BAD_BODY", f"invalid body size {size}")
            self._pending_size = size
        if len(buf) - pos < size:
            return None
        if size < _COPY_ONCE:
            body = bytes(buf[pos : pos + size])
        else:
            with memoryview(buf) as view:  # one copy (a bytearray slice would be a second)
                body = view[pos : pos + size].tobytes()
        self._pos = pos + size
        params = self._pending_params
        self._pending_name = None
        self._pending_params = []
        self._pending_size = -1
        return name, params, body

    def apply_fins(self, in_flight: dict[bytes, Any], owner: object) -> int:
        """Consume the run of ``FIN <id>`` commands at the head of the buffer whose message
        is in ``in_flight`` with ``client`` ``owner`` (nsqd's hot consumer path): each is
        removed from ``in_flight`` and its ``client`` cleared. Stops before anything else (a
        FIN that fails, another form or command: :meth:`next` takes it). Returns how many."""
        if self._pending_name is not None:
            return 0
        n, self._pos = fin_run(self._buf, self._pos, in_flight, owner)
        return n


def fin_run_py(buf: bytearray, pos: int, in_flight: dict[bytes, Any], owner: object) -> tuple[int, int]:
    """The reference of :meth:`CommandParser.apply_fins` on ``buf`` from ``pos``: (FINs
    applied, position after them). A line qualifies when the parser would read it as
    ``[b"FIN", id]`` with a 16-byte id whose message is in flight to ``owner``."""
    last = buf.rfind(b"\n")
    if last < pos:
        return 0, pos
    n = 0
    get = in_flight.get
    for raw in bytes(buf[pos:last]).split(b"\n"):
        line = raw[:-1] if raw[-1:] == b"\r" else raw
        if len(line) != _FIN_LINE or not line.startswith(b"FIN "):
            break
        msg_id = line[4:]
        if b" " in msg_id:
            break
        msg = get(msg_id)
        if msg is None or msg.client is not owner:
            break
        del in_flight[msg_id]
        msg.client = None
        n += 1
        pos += len(raw) + 1
    return n, pos


_FIN_LINE = 4 + MSG_ID_LENGTH


#: :func:`fin_run_py`, compiled when available
fin_run = _c_fin_run if compiled else fin_run_py


def decode_mpub(body: bytes | bytearray, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """Split an MPUB body ``[int32 num]([int32 size][bytes])*`` with NSQ's checks and errors
    (each message body copied out of it once)."""
    if compiled:
        out = _c_decode_mpub(body, max_msg_size, max_body_size)
        if out is not None:
            return out
    if not isinstance(body, bytes):
        body = bytes(body)  # the reference's slices must be bytes
    return decode_mpub_py(body, max_msg_size, max_body_size)


def decode_mpub_py(body: bytes, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """The reference of :func:`decode_mpub` (the compiled one returns None where this raises)."""
    blen = len(body)
    if blen < 4:
        raise ProtocolError("E_BAD_BODY", "MPUB failed to read message count")
    num = _INT32.unpack_from(body, 0)[0]
    max_messages = (max_body_size - 4) // 5
    if num <= 0 or num > max_messages:
        raise ProtocolError("E_BAD_BODY", f"MPUB invalid message count {num}")
    out: list[bytes] = []
    append = out.append
    pos = 4
    unpack = _INT32.unpack_from
    for i in range(num):
        if pos + 4 > blen:
            raise ProtocolError("E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
        size = unpack(body, pos)[0]
        pos += 4
        if size <= 0:
            raise ProtocolError("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {size}")
        if size > max_msg_size:
            raise ProtocolError("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg_size}")
        end = pos + size
        if end > blen:
            raise ProtocolError("E_BAD_MESSAGE", "MPUB failed to read message body")
        append(body[pos:end])
        pos = end
    return out


# --- client-side encoders -------------------------------------------------------------


def _with_body(line: bytes, body: bytes) -> bytes:
    return line + _INT32.pack(len(body)) + body


def identify(data: Mapping[str, Any]) -> bytes:
    return _with_body(b"IDENTIFY\n", json.dumps(dict(data)).encode())


def auth(secret: bytes | str) -> bytes:
    return _with_body(b"AUTH\n", secret.encode() if isinstance(secret, str) else secret)


def sub(topic: str, channel: str) -> bytes:
    return f"SUB {topic} {channel}\n".encode()


def pub(topic: str, body: bytes) -> bytes:
    return _with_body(f"PUB {topic}\n".encode(), body)


def dpub(topic: str, defer_ms: int, body: bytes) -> bytes:
    return _with_body(f"DPUB {topic} {int(defer_ms)}\n".encode(), body)


def encode_mpub_body(bodies: Iterable[bytes]) -> bytes:
    items = list(bodies)
    parts = [_INT32.pack(len(items))]
    for b in items:
        parts.append(_INT32.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def mpub(topic: str, bodies: Iterable[bytes]) -> bytes:
    return _with_body(f"MPUB {topic}\n".encode(), encode_mpub_body(bodies))


def rdy(count: int) -> bytes:
    return b"RDY %d\n" % count


def fin(msg_id: bytes) -> bytes:
    return b"FIN " + msg_id + b"\n"


def req(msg_id: bytes, delay_ms: int) -> bytes:
    return b"REQ " + msg_id + b" %d\n" % delay_ms


def touch(msg_id: bytes) -> bytes:
    return b"TOUCH " + msg_id + b"\n"


NOP = b"NOP\n"
CLS = b"CLS\n"
