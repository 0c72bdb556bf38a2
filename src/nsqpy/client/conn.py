"""One TCP connection to an nsqd, in asyncio: a thin shell over the sans-I/O client protocol.

:class:`~nsqpy.protocol.client.ClientProtocol` does the wire: the magic and IDENTIFY, the
TLS and snappy/deflate upgrades, AUTH, matching answers to commands in order, NOP for
heartbeats, message frames decoded in batches. :class:`Connection` moves bytes between it
and the socket, turns its events into futures and callbacks, and keeps the read timeout.

Writes are buffered and handed to the protocol (so through TLS/compression) once per
event-loop turn, as one block; FINs are buffered as bare ids and written as one block with
the next flush. With ``on_messages`` each run of messages of one read goes to the callback
as one list.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, cast

from nsqpy.protocol.address import split_address
from nsqpy.protocol.client import Answer, ClientProtocol, HandshakeError, Ready, ServerError
from nsqpy.protocol.frames import DecodedMessage
from nsqpy.transport import TransportError

from .config import ConnectionConfig
from .errors import (
    AuthRequiredError,
    ConnectionClosedError,
    ErrorFrame,
    NSQError,
    TLSError,
    error_from_frame,
)

log = logging.getLogger("nsqpy.client")

#: max_rdy_count assumed when the server does not negotiate features (the seeds' rule).
DEFAULT_MAX_RDY_COUNT = 2500
#: nsqd's TCP port, for an address given without one.
DEFAULT_TCP_PORT = 4150

MessageCallback = Callable[["Connection", DecodedMessage], None]
#: ``factory(conn, id, body, timestamp, attempts)`` builds what ``on_messages`` receives.
MessageFactory = Callable[["Connection", bytes, bytes, int, int], Any]
MessagesCallback = Callable[["Connection", list[Any]], None]
ErrorCallback = Callable[["Connection", ErrorFrame], None]
CloseCallback = Callable[["Connection", "BaseException | None"], None]


class Connection(asyncio.Protocol):
    """A connection to one nsqd. Create with :meth:`connect`; close with :meth:`close`."""

    def __init__(
        self,
        address: str,
        config: ConnectionConfig | None = None,
        *,
        on_message: MessageCallback | None = None,
        on_error: ErrorCallback | None = None,
        on_close: CloseCallback | None = None,
        on_messages: MessagesCallback | None = None,
        message_factory: MessageFactory | None = None,
    ) -> None:
        """Messages are built by ``message_factory(conn, id, body, timestamp, attempts)``
        (default: a :class:`DecodedMessage`). ``on_messages`` gets each run of consecutive
        messages of one read as one list, before any frame that follows them; without it,
        ``on_message`` gets them one by one."""
        self.address = address
        self.host, self.port = split_address(address, DEFAULT_TCP_PORT)
        cfg = config or ConnectionConfig()
        cfg.check_supported()
        self.config = cfg
        self.on_message = on_message
        self.on_messages = on_messages
        self.on_error = on_error
        self.on_close = on_close
        self._proto: ClientProtocol[Any] = ClientProtocol(
            cfg.identify(),
            tls_context=cfg.ssl_context() if cfg.tls_v1 else None,
            server_hostname=self.host,  # go-nsq verifies the name of the host dialled
            auth_secret=cfg.auth_secret or None,
            message_factory=functools.partial(message_factory or _decoded_message, self),
            error_factory=error_from_frame,
            deflate_level=cfg.deflate_level,
        )
        if cfg.max_msg_size > 0:
            self._proto.frames.max_frame_size = cfg.max_msg_size
        self._expect = self._proto.expect
        #: The server's IDENTIFY response (empty before IDENTIFY or without negotiation),
        #: with the AUTH answer under ``"auth"`` when AUTH was done.
        self.server_settings: dict[str, Any] = {}
        self.max_rdy_count = DEFAULT_MAX_RDY_COUNT
        self.closed = False
        self.close_wait = False  # CLS answered
        self.last_recv = 0.0
        self._transport: asyncio.Transport | None = None
        self._wbuf: list[bytes] = []
        self._fins: list[bytes] = []  # ids to FIN, written in order before the next command
        self._flush_handle: asyncio.Handle | None = None
        # the protocol may have bytes of its own to send after a read: always during the
        # handshake and with TLS/compression layers, else only NOPs (counted as heartbeats)
        self._own_output = True
        self._watchdog: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready_fut: asyncio.Future[None] | None = None
        self._closed_fut: asyncio.Future[None] | None = None
        self._close_exc: BaseException | None = None
        self._last_request: asyncio.Future[bytes] | None = None

    def __repr__(self) -> str:
        return f"<Connection {self.address}{' closed' if self.closed else ''}>"

    # --- what was negotiated ------------------------------------------------------------

    @property
    def tls_version(self) -> str:
        """The TLS version by Go's name (``TLS1.3``), "" without TLS."""
        tls = self._proto.stack.tls
        return tls.version() if tls is not None else ""

    @property
    def tls_cipher(self) -> str:
        tls = self._proto.stack.tls
        return tls.cipher() if tls is not None else ""

    @property
    def compression(self) -> str | None:
        """``snappy``, ``deflate`` or None."""
        return self._proto.stack.compression

    @property
    def auth(self) -> dict[str, Any] | None:
        """nsqd's AUTH answer (``identity``, ``identity_url``, ``permission_count``), or None."""
        return self._proto.auth

    # --- lifecycle --------------------------------------------------------------------

    async def connect(self) -> Connection:
        """Open the socket and do the handshake (IDENTIFY, upgrades, AUTH).

        Raises ConnectionClosedError (cannot connect, closed or silent during the
        handshake), TLSError, the typed error frame nsqd refused with (e.g.
        :class:`~nsqpy.client.errors.AuthFailedError`), AuthRequiredError or
        HandshakeError."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._closed_fut = loop.create_future()
        self._ready_fut = loop.create_future()
        local: tuple[str, int] | None = None
        if self.config.local_addr:
            local = split_address(self.config.local_addr, 0)
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: self, self.host, self.port, local_addr=local),
                self.config.dial_timeout or None,
            )
        except (TimeoutError, OSError) as e:
            self.closed = True
            raise ConnectionClosedError(f"cannot connect to {self.address}: {e!r}") from e
        try:
            await asyncio.wait_for(asyncio.shield(self._ready_fut), self.config.read_timeout or None)
        except TimeoutError:
            err = ConnectionClosedError(
                f"{self.address}: no answer to the handshake within {self.config.read_timeout}s"
            )
            self.abort(err)
            raise err from None
        except BaseException as e:
            self.abort(e)
            raise
        return self

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only duck-typed ones
        self._transport = cast(asyncio.Transport, transport)
        self.last_recv = time.monotonic()
        self._arm_watchdog()
        proto = self._proto
        proto.start()
        self._transport.write(proto.data_to_send())

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish_close(exc or self._close_exc)

    def _finish_close(self, exc: BaseException | None) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        already = self.closed and self._closed_fut is not None and self._closed_fut.done()
        self.closed = True
        ready = self._ready_fut
        if ready is not None and not ready.done():
            ready.set_exception(
                ConnectionClosedError(
                    f"connection to {self.address} closed during the handshake"
                    + (f": {exc!r}" if exc else "")
                )
            )
            ready.exception()
        err = ConnectionClosedError(f"connection to {self.address} closed" + (f": {exc!r}" if exc else ""))
        for fut in self._proto.fail_pending():
            if fut is not None and not fut.done():
                fut.set_exception(err)
                fut.exception()  # mark retrieved: nobody may be waiting any more
        if already:
            return
        if self._closed_fut is not None and not self._closed_fut.done():
            self._closed_fut.set_result(None)
        if self.on_close is not None:
            self.on_close(self, exc)

    def close(self) -> None:
        """Flush what is buffered and close the socket."""
        if self._transport is not None and not self._transport.is_closing():
            self._flush()
            self._transport.close()
        elif self._transport is None:
            self._finish_close(None)

    def abort(self, exc: BaseException | None = None) -> None:
        """Close at once, failing pending commands."""
        self._close_exc = exc
        if self._transport is not None:
            self._transport.abort()
        self._finish_close(exc)

    async def wait_closed(self) -> None:
        if self._closed_fut is not None:
            await asyncio.shield(self._closed_fut)

    def _arm_watchdog(self) -> None:
        rt = self.config.read_timeout
        if rt > 0 and self._loop is not None:
            self._watchdog = self._loop.call_later(rt, self._check_read_timeout)

    def _check_read_timeout(self) -> None:
        idle = time.monotonic() - self.last_recv
        if idle >= self.config.read_timeout:
            log.warning("%s: no data for %.1fs, closing", self.address, idle)
            self.abort(TimeoutError("read timeout"))
        else:
            assert self._loop is not None
            self._watchdog = self._loop.call_later(self.config.read_timeout - idle, self._check_read_timeout)

    # --- writing ----------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionClosedError(f"connection to {self.address} is closed")
        if self._fins:
            self._take_fins()
        self._wbuf.append(data)
        if self._flush_handle is None and self._loop is not None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def fin(self, msg_id: bytes) -> None:
        """Send ``FIN <msg_id>`` (buffered like :meth:`send`, without building the line yet)."""
        if self.closed:
            raise ConnectionClosedError(f"connection to {self.address} is closed")
        self._fins.append(msg_id)
        if self._flush_handle is None and self._loop is not None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _take_fins(self) -> None:
        fins = self._fins
        self._fins = []
        self._wbuf.append(b"FIN " + b"\nFIN ".join(fins) + b"\n")

    def _flush(self) -> None:
        """Hand the buffered commands to the protocol as one block; write what it has."""
        self._flush_handle = None
        if self._fins:
            self._take_fins()
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        proto = self._proto
        buf = self._wbuf
        try:
            if buf:
                self._wbuf = []
                proto.send(buf[0] if len(buf) == 1 else b"".join(buf))
            out = proto.data_to_send()
        except TransportError as e:
            self.abort(ConnectionClosedError(f"connection to {self.address} failed: {e}"))
            return
        if out:
            transport.write(out)

    def send(self, data: bytes) -> None:
        """Send a command that gets no response (RDY, FIN, REQ, TOUCH, NOP)."""
        self._write(data)

    def send_request(self, data: bytes) -> asyncio.Future[bytes]:
        """Send a command that gets a response; the future gets the response or error."""
        loop = self._loop
        assert loop is not None
        self._write(data)
        fut: asyncio.Future[bytes] = loop.create_future()
        self._expect(fut)
        self._last_request = fut
        return fut

    async def request(self, data: bytes, timeout: float | None = None) -> bytes:
        """Send a command and await its response (raises the typed error frame)."""
        fut = self.send_request(data)
        if timeout is None:
            return await fut
        return await asyncio.wait_for(asyncio.shield(fut), timeout)

    async def drain(self) -> None:
        """Wait until every command sent so far has its answer (or the connection closed)."""
        fut = self._last_request
        if fut is not None and not fut.done():  # answers come in order: the last one is last
            await asyncio.wait([fut])

    @property
    def pending(self) -> int:
        """Commands sent that still wait for a response."""
        return self._proto.pending

    # --- reading ----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self.last_recv = time.monotonic()
        proto = self._proto
        heartbeats = proto.heartbeats
        try:
            events = proto.receive(data)
        except Exception as e:  # noqa: BLE001 - the connection is unusable, whatever it was
            self._failed(e)
            return
        for ev in events:
            kind = type(ev)
            if kind is list:
                if self.on_messages is not None:
                    self.on_messages(self, ev)
                elif self.on_message is not None:
                    for m in ev:
                        self.on_message(self, m)
            elif kind is Answer:
                # the answer to the oldest command sent (its future is the token), even if
                # its caller stopped waiting (then the answer is dropped)
                fut = ev.token
                if ev.error is None:
                    if ev.data == b"CLOSE_WAIT":
                        self.close_wait = True
                    if fut is not None and not fut.done():
                        fut.set_result(ev.data)
                elif fut is not None and not fut.done():
                    fut.set_exception(ev.error)
                    fut.exception()  # the caller may have timed out: not "never retrieved"
            elif kind is ServerError:
                self._server_error(cast(ErrorFrame, ev.error))
            else:
                assert kind is Ready
                self._ready(ev)
            if self.closed:
                return
        if (self._own_output or proto.heartbeats != heartbeats) and self._flush_handle is None:
            loop = self._loop
            if loop is not None:
                self._flush_handle = loop.call_soon(self._flush)

    def _server_error(self, err: ErrorFrame) -> None:
        """A non-fatal error frame, or a fatal one no command owns (nsqd closes next)."""
        if self.on_error is not None:
            self.on_error(self, err)
        elif err.fatal:
            log.error("%s: %s", self.address, err)
        else:
            log.warning("%s: %s", self.address, err)

    def _ready(self, ev: Ready) -> None:
        proto = self._proto
        settings = dict(ev.settings)
        if ev.auth is not None:
            settings["auth"] = ev.auth
        self.server_settings = settings
        self.max_rdy_count = int(settings.get("max_rdy_count", DEFAULT_MAX_RDY_COUNT))
        self._own_output = bool(proto.stack.layers)
        cfg = self.config
        if cfg.tls_v1 and proto.stack.tls is None:
            log.warning(
                "%s: TLS was asked for but nsqd did not enable it (it has no "
                "certificate?): carrying on without TLS",
                self.address,
            )
        if (cfg.snappy or cfg.deflate) and proto.stack.compression is None:
            log.info(
                "%s: nsqd declined %s compression: carrying on without it",
                self.address,
                "snappy" if cfg.snappy else "deflate",
            )
        fut = self._ready_fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _failed(self, e: Exception) -> None:
        """The protocol raised: a handshake refused, a TLS or decoding failure, bad frames."""
        err = self._typed(e)
        fut = self._ready_fut
        if fut is not None and not fut.done():
            fut.set_exception(err)
            fut.exception()  # connect() raises it, unless it gave up already
        else:
            log.error("%s: %s", self.address, err)
        self.abort(err)

    def _typed(self, e: Exception) -> BaseException:
        proto = self._proto
        if isinstance(e, HandshakeError):
            if proto.settings.get("auth_required") and not self.config.auth_secret:
                return AuthRequiredError(
                    description=f"{self.address} requires AUTH but no auth_secret is configured"
                )
            return HandshakeError(f"{self.address}: {e}")
        if isinstance(e, NSQError):
            return e  # the typed error frame the server refused the handshake with
        if isinstance(e, TransportError):
            tls = proto.stack.tls
            if tls is not None and not tls.handshake_done:
                return TLSError(f"{self.address}: {e}")
            return ConnectionClosedError(f"connection to {self.address} failed: {e}")
        return NSQError(f"{self.address}: bad data from the server: {e}")


def _decoded_message(conn: Connection, msg_id: bytes, body: bytes, timestamp: int, attempts: int) -> Any:
    """The default ``message_factory``: what ``on_message`` receives."""
    return DecodedMessage(timestamp, attempts, msg_id, body)
