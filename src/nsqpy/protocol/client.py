"""The client side of protocol V2 on one connection, sans-I/O (bytes in, events out, bytes to
send out), shared by every client: the asyncio library, the Spark source's blocking I/O
threads and the tools.

A connection goes through NSQ's handshake, as go-nsq does it:

1. the magic and ``IDENTIFY`` (always with ``feature_negotiation``);
2. if the server agreed to ``tls_v1``: the TLS handshake, then an ``OK`` over TLS;
3. if it agreed to ``snappy`` or ``deflate``: that layer, then an ``OK`` through it;
4. if it said ``auth_required``: ``AUTH <secret>`` and its JSON answer;

after which :attr:`ClientProtocol.ready` is True and :class:`Ready` is returned. Then every
response or error frame answers the oldest command sent with ``expect_response`` (a FIFO of
caller tokens), heartbeats are answered with ``NOP`` here, and message frames come out as
lists (one list per run of consecutive messages of one read, built by ``message_factory``).

Usage (any I/O)::

    p = ClientProtocol(identify_fields, tls_context=ctx, auth_secret=b"...")
    p.start()
    sock.sendall(p.data_to_send())
    while True:
        for event in p.receive(sock.recv(65536)):
            ...                      # Ready, Answer, ServerError, or a list of messages
        out = p.data_to_send()
        if out:
            sock.sendall(out)

Handshake failures raise: :class:`TransportError` (TLS, corrupt compression), the
server's error frame (``error_factory``, e.g. ``E_AUTH_FAILED``), or
:class:`HandshakeError` (a server that answers something else than NSQ's sequence).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from ..transport import DeflateLayer, SnappyLayer, Stack, TLSContext, TLSLayer, TransportError
from . import commands
from .errors import NSQError, ProtocolError
from .frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    DecodedMessage,
    FrameReader,
)

__all__ = [
    "Answer",
    "ClientProtocol",
    "HandshakeError",
    "Ready",
    "ServerError",
    "TransportError",
]

M = TypeVar("M")

_FRAME_HEAD_SIZE = 8


class HandshakeError(NSQError):
    """The server did not follow NSQ's IDENTIFY/upgrade/AUTH sequence (or agreed to
    something this client cannot do)."""


class Ready:
    """The handshake is complete: ``settings`` is the server's IDENTIFY answer (empty if it
    did not negotiate), ``auth`` the AUTH answer (identity, identity_url,
    permission_count) or None."""

    __slots__ = ("auth", "settings")

    def __init__(self, settings: dict[str, Any], auth: dict[str, Any] | None) -> None:
        self.settings = settings
        self.auth = auth

    def __repr__(self) -> str:
        return f"Ready({self.settings!r}, auth={self.auth!r})"


class Answer:
    """The answer to the command sent with ``token``: ``data`` or ``error`` (an error frame,
    fatal or not, that the server sent for it)."""

    __slots__ = ("data", "error", "token")

    def __init__(self, token: Any, data: bytes | None, error: ProtocolError | None) -> None:
        self.token = token
        self.data = data
        self.error = error

    def __repr__(self) -> str:
        return f"Answer({self.token!r}, {self.data!r}, {self.error!r})"


class ServerError:
    """An error frame no pending command owns: a non-fatal one (``E_FIN_FAILED``,
    ``E_REQ_FAILED``, ``E_TOUCH_FAILED``), or a fatal one with nothing pending."""

    __slots__ = ("error",)

    def __init__(self, error: ProtocolError) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"ServerError({self.error!r})"


def _decoded(msg_id: bytes, body: bytes, timestamp: int, attempts: int) -> Any:
    return DecodedMessage(timestamp, attempts, msg_id, body)


# handshake steps
_IDENTIFY = "identify"
_TLS = "tls"
_TLS_OK = "tls-ok"
_COMPRESSION_OK = "compression-ok"
_AUTH = "auth"
_READY = "ready"


class ClientProtocol(Generic[M]):
    """One connection's client protocol state. Not thread-safe; no I/O."""

    def __init__(
        self,
        identify: Mapping[str, Any],
        *,
        tls_context: TLSContext | None = None,
        server_hostname: str | None = None,
        auth_secret: bytes | str | None = None,
        message_factory: Callable[[bytes, bytes, int, int], M] = _decoded,
        error_factory: Callable[[bytes], ProtocolError] = ProtocolError.from_frame,
        deflate_level: int = 6,
    ) -> None:
        """``identify``: the IDENTIFY fields (``tls_v1``, ``snappy``, ``deflate`` are set
        from the other arguments' presence by the caller); ``tls_context`` is required when
        ``tls_v1`` is asked; ``auth_secret`` is sent if the server requires AUTH."""
        fields = dict(identify)
        fields["feature_negotiation"] = True
        if fields.get("tls_v1") and tls_context is None:
            raise ValueError("tls_v1 needs a TLS context")
        self._identify = fields
        self._tls_context = tls_context
        self._server_hostname = server_hostname
        self._auth_secret = auth_secret.encode() if isinstance(auth_secret, str) else auth_secret
        self._make_message = message_factory
        self._error = error_factory
        self._deflate_level = deflate_level
        self.stack = Stack()
        self.frames = FrameReader()
        self._hbuf = bytearray()  # handshake: decoded bytes, parsed one frame at a time
        self._out: list[bytes] = []
        self._pending: deque[Any] = deque()
        self._step = ""
        #: the server's IDENTIFY answer
        self.settings: dict[str, Any] = {}
        #: the AUTH answer, if AUTH was done
        self.auth: dict[str, Any] | None = None
        self.ready = False
        #: heartbeats received (each answered with NOP)
        self.heartbeats = 0

    # --- output ---------------------------------------------------------------------------

    def start(self) -> None:
        """Queue the magic and IDENTIFY."""
        if self._step:
            raise RuntimeError("already started")
        self._step = _IDENTIFY
        self._out.append(MAGIC_V2 + commands.identify(self._identify))

    def send(self, data: bytes) -> None:
        """Queue command bytes that get no response (RDY, FIN, REQ, TOUCH, NOP)."""
        stack = self.stack
        self._out.append(stack.send(data) if stack.layers else data)

    def send_request(self, data: bytes, token: Any = None) -> None:
        """Queue a command that gets a response (PUB, MPUB, DPUB, SUB, CLS); its
        :class:`Answer` will carry ``token``."""
        self._pending.append(token)
        self.send(data)

    def expect(self, token: Any) -> None:
        """Register ``token`` for a command the caller queues itself with :meth:`send` (a
        shell that coalesces a loop turn's commands into one ``send``, so they go through
        TLS/compression once): tokens and commands must be queued in the same order."""
        self._pending.append(token)

    def data_to_send(self) -> bytes:
        """Everything to write to the socket now (commands, NOPs, TLS records), in order."""
        out = self._out
        extra = self.stack.output() if self.stack.layers else b""
        if not out:
            return extra
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        return data + extra if extra else data

    @property
    def pending(self) -> int:
        """Commands sent that still wait for their answer."""
        return len(self._pending)

    def fail_pending(self) -> list[Any]:
        """The tokens of every command still waiting (the connection is gone)."""
        tokens = list(self._pending)
        self._pending.clear()
        return tokens

    # --- input ----------------------------------------------------------------------------

    def receive(self, data: bytes) -> list[Any]:
        """Bytes from the socket; returns the events they complete: :class:`Ready`,
        :class:`Answer`, :class:`ServerError`, and lists of messages. Raises
        :class:`TransportError` (TLS, corrupt compression), ValueError (a corrupt frame
        stream) and, during the handshake, the server's error or :class:`HandshakeError`."""
        stack = self.stack
        if stack.layers:
            data = stack.receive(data)
            if not data:
                return []
        if not self.ready:
            return self._handshake(data)
        return self.frames_received(self.frames.feed_batched(data, self._make_message))

    def frames_received(self, items: list[Any]) -> list[Any]:
        """Events of frames a caller parsed itself (``FrameReader.feed_batched``'s output: lists
        of messages and ``(type, payload)`` tuples), e.g. a consumer decoding the stream
        straight into columns: heartbeats are answered, responses and errors matched."""
        out = items
        for i, item in enumerate(items):
            if type(item) is list:
                continue
            ftype, payload = item
            if ftype == FRAME_TYPE_RESPONSE:
                if payload == HEARTBEAT:
                    self.heartbeats += 1
                    self.send(commands.NOP)
                    out[i] = None
                    continue
                token = self._pending.popleft() if self._pending else None
                out[i] = Answer(token, payload, None)
            elif ftype == FRAME_TYPE_ERROR:
                err = self._error(payload)
                if err.fatal and self._pending:
                    out[i] = Answer(self._pending.popleft(), None, err)
                else:
                    out[i] = ServerError(err)
            else:
                raise ValueError(f"unknown frame type {ftype}")
        if None in out:
            out = [e for e in out if e is not None]
        return out

    # --- the handshake ----------------------------------------------------------------------

    def _next_frame(self) -> tuple[int, bytes] | None:
        buf = self._hbuf
        if len(buf) < _FRAME_HEAD_SIZE:
            return None
        size = int.from_bytes(buf[:4], "big")
        if size < 4 or size > self.frames.max_frame_size:
            raise ValueError(f"invalid frame size {size}")
        if len(buf) < 4 + size:
            return None
        ftype = int.from_bytes(buf[4:8], "big", signed=True)
        payload = bytes(buf[8 : 4 + size])
        del buf[: 4 + size]
        return ftype, payload

    def _push(self, layer: Any) -> None:
        """An upgrade: the bytes received after the frame that announced it belong to the
        new layer."""
        pending = bytes(self._hbuf)
        self._hbuf.clear()
        self._hbuf += self.stack.push(layer, pending)

    def _handshake(self, data: bytes) -> list[Any]:
        self._hbuf += data
        while not self.ready:
            if self._step == _TLS:
                tls = self.stack.tls
                assert tls is not None
                if not tls.handshake_done:
                    return []
                self._step = _TLS_OK
            frame = self._next_frame()
            if frame is None:
                return []
            ftype, payload = frame
            if ftype == FRAME_TYPE_RESPONSE and payload == HEARTBEAT:
                self.heartbeats += 1
                self.send(commands.NOP)
                continue
            if ftype == FRAME_TYPE_ERROR:
                raise self._error(payload)
            if ftype != FRAME_TYPE_RESPONSE:
                raise HandshakeError(f"unexpected frame type {ftype} during the handshake")
            self._step_done(payload)
        # ready: what follows the handshake goes to the batched frame path
        rest = bytes(self._hbuf)
        self._hbuf = bytearray()
        events: list[Any] = [Ready(self.settings, self.auth)]
        if rest:
            events += self.frames_received(self.frames.feed_batched(rest, self._make_message))
        return events

    def _step_done(self, payload: bytes) -> None:
        step = self._step
        if step == _IDENTIFY:
            if payload != b"OK":
                try:
                    settings = json.loads(payload)
                except (ValueError, RecursionError):  # RecursionError: nested too deep
                    raise HandshakeError(f"bad IDENTIFY response {payload[:100]!r}") from None
                if not isinstance(settings, dict):
                    raise HandshakeError(f"bad IDENTIFY response {payload[:100]!r}")
                self.settings = settings
            self._after_identify()
        elif step in (_TLS_OK, _COMPRESSION_OK):
            if payload != b"OK":
                raise HandshakeError(f"expected OK after the upgrade, got {payload[:100]!r}")
            if step == _TLS_OK:
                self._compression()
            else:
                self._auth()
        elif step == _AUTH:
            try:
                auth = json.loads(payload)
            except (ValueError, RecursionError):  # RecursionError: nested too deep
                raise HandshakeError(f"bad AUTH response {payload[:100]!r}") from None
            self.auth = auth if isinstance(auth, dict) else {}
            self._ready()
        else:  # pragma: no cover - every step is handled above
            raise HandshakeError(f"unexpected response {payload[:100]!r}")

    def _after_identify(self) -> None:
        s = self.settings
        for feature in ("tls_v1", "snappy", "deflate"):
            if s.get(feature) and not self._identify.get(feature):
                raise HandshakeError(f"the server enabled {feature}, which was not requested")
        if s.get("tls_v1"):
            assert self._tls_context is not None
            self._step = _TLS
            self._push(TLSLayer(self._tls_context, server_side=False, server_hostname=self._server_hostname))
            return
        self._compression()

    def _compression(self) -> None:
        s = self.settings
        if s.get("snappy"):
            self._push(SnappyLayer())
        elif s.get("deflate"):
            level = s.get("deflate_level", self._deflate_level)
            self._push(DeflateLayer(level if isinstance(level, int) else self._deflate_level))
        else:
            self._auth()
            return
        self._step = _COMPRESSION_OK

    def _auth(self) -> None:
        if not self.settings.get("auth_required"):
            self._ready()
            return
        if not self._auth_secret:
            raise HandshakeError("the server requires AUTH but no auth_secret is configured")
        self._step = _AUTH
        self.send(commands.auth(self._auth_secret))

    def _ready(self) -> None:
        self._step = _READY
        self.ready = True
