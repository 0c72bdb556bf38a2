"""One TCP connection to an nsqd, in asyncio, over the sans-I/O frame codec.

:class:`Connection` sends the magic and IDENTIFY (feature negotiation; AUTH when the server
asks), answers heartbeats with ``NOP``, matches responses and error frames to the commands
that expect one, in order, and hands message frames to a callback. Writes are buffered and
flushed once per event-loop turn.

The read path is batch-shaped: every complete frame of one ``data_received`` is decoded at
once (:meth:`FrameReader.feed_batched`), and with ``on_messages`` each run of messages goes
to the callback as one list. FINs are buffered as bare ids and written as one block with the
next flush.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from nsqpy.protocol import commands
from nsqpy.protocol.frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    DecodedMessage,
    FrameReader,
)

from .config import ConnectionConfig
from .errors import (
    NON_FATAL_CODES,
    ConnectionClosedError,
    ErrorFrame,
    NSQError,
    error_from_frame,
)

log = logging.getLogger("nsqpy.client")

#: max_rdy_count assumed when the server does not negotiate features (the seeds' rule).
DEFAULT_MAX_RDY_COUNT = 2500

MessageCallback = Callable[["Connection", DecodedMessage], None]
#: ``factory(conn, id, body, timestamp, attempts)`` builds what ``on_messages`` receives.
MessageFactory = Callable[["Connection", bytes, bytes, int, int], Any]
MessagesCallback = Callable[["Connection", list[Any]], None]
ErrorCallback = Callable[["Connection", ErrorFrame], None]
CloseCallback = Callable[["Connection", "BaseException | None"], None]


def split_address(address: str, default_port: int = 4150) -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``, or a bare host) → ``(host, port)``."""
    host, sep, port = address.rpartition(":")
    if not sep or "]" in port:
        return address.strip("[]"), default_port
    return host.strip("[]"), int(port)


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
        self.host, self.port = split_address(address)
        self.config = config or ConnectionConfig()
        self.config.check_supported()
        self.on_message = on_message
        self.on_messages = on_messages
        self._make_message = functools.partial(message_factory or _decoded_message, self)
        self.on_error = on_error
        self.on_close = on_close
        #: The server's IDENTIFY response (empty before IDENTIFY or without negotiation).
        self.server_settings: dict[str, Any] = {}
        self.max_rdy_count = DEFAULT_MAX_RDY_COUNT
        self.closed = False
        self.close_wait = False  # CLS answered
        self.last_recv = 0.0
        self._transport: asyncio.Transport | None = None
        self._reader = FrameReader()
        self._pending: deque[asyncio.Future[bytes]] = deque()
        self._wbuf: list[bytes] = []
        self._fins: list[bytes] = []  # ids to FIN, written in order before the next command
        self._flush_handle: asyncio.Handle | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed_fut: asyncio.Future[None] | None = None
        self._close_exc: BaseException | None = None

    def __repr__(self) -> str:
        return f"<Connection {self.address}{' closed' if self.closed else ''}>"

    # --- lifecycle --------------------------------------------------------------------

    async def connect(self) -> Connection:
        """Open the socket, send the magic and IDENTIFY (and AUTH if required)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._closed_fut = loop.create_future()
        local: tuple[str, int] | None = None
        if self.config.local_addr:
            local = split_address(self.config.local_addr, 0)
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: self, self.host, self.port, local_addr=local),
                self.config.dial_timeout or None,
            )
        except (OSError, asyncio.TimeoutError) as e:
            self.closed = True
            raise ConnectionClosedError(f"cannot connect to {self.address}: {e!r}") from e
        try:
            self._write(MAGIC_V2)
            data = await self.request(commands.identify(self.config.identify()),
                                      timeout=self.config.read_timeout)
            if data != b"OK":
                self.server_settings = json.loads(data)
                self.max_rdy_count = int(self.server_settings.get("max_rdy_count", DEFAULT_MAX_RDY_COUNT))
            for feature in ("tls_v1", "snappy", "deflate"):
                if self.server_settings.get(feature):
                    raise NSQError(f"server enabled {feature}, which was not requested")
            if self.server_settings.get("auth_required"):
                if not self.config.auth_secret:
                    raise NSQError(f"{self.address} requires AUTH but no auth_secret is configured")
                resp = await self.request(commands.auth(self.config.auth_secret),
                                          timeout=self.config.read_timeout)
                self.server_settings["auth"] = json.loads(resp)
        except BaseException as e:
            self.abort(e)
            raise
        return self

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only duck-typed ones
        self._transport = cast(asyncio.Transport, transport)
        self.last_recv = time.monotonic()
        self._arm_watchdog()

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish_close(exc or self._close_exc)

    def _finish_close(self, exc: BaseException | None) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        already = self.closed and self._closed_fut is not None and self._closed_fut.done()
        self.closed = True
        err = ConnectionClosedError(f"connection to {self.address} closed" + (f": {exc!r}" if exc else ""))
        while self._pending:
            fut = self._pending.popleft()
            if not fut.done():
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
        self._flush_handle = None
        if self._fins:
            self._take_fins()
        if self._wbuf and self._transport is not None and not self._transport.is_closing():
            buf = self._wbuf
            self._wbuf = []
            self._transport.write(b"".join(buf) if len(buf) > 1 else buf[0])

    def send(self, data: bytes) -> None:
        """Send a command that gets no response (RDY, FIN, REQ, TOUCH, NOP)."""
        self._write(data)

    def send_request(self, data: bytes) -> asyncio.Future[bytes]:
        """Send a command that gets a response; the future gets the response or error."""
        assert self._loop is not None
        self._write(data)
        fut: asyncio.Future[bytes] = self._loop.create_future()
        self._pending.append(fut)
        return fut

    async def request(self, data: bytes, timeout: float | None = None) -> bytes:
        """Send a command and await its response (raises the typed error frame)."""
        fut = self.send_request(data)
        if timeout is None:
            return await fut
        return await asyncio.wait_for(asyncio.shield(fut), timeout)

    async def drain(self) -> None:
        """Wait until every command sent so far has its answer (or the connection closed)."""
        if self._pending:
            await asyncio.wait([self._pending[-1]])

    @property
    def pending(self) -> int:
        """Commands sent that still wait for a response."""
        return len(self._pending)

    # --- reading ----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self.last_recv = time.monotonic()
        try:
            items = self._reader.feed_batched(data, self._make_message)
        except ValueError as e:
            self.abort(e)
            return
        for item in items:
            if type(item) is list:
                if self.on_messages is not None:
                    self.on_messages(self, item)
                elif self.on_message is not None:
                    for m in item:
                        self.on_message(self, m)
            else:
                assert type(item) is tuple
                self._frame(*item)
            if self.closed:
                return

    def _frame(self, ftype: int, payload: bytes) -> None:
        """A response or error frame: heartbeat, answer to the oldest command, or error."""
        if ftype == FRAME_TYPE_RESPONSE:
            if payload == HEARTBEAT:
                self.send(commands.NOP)
                return
            if payload == b"CLOSE_WAIT":
                self.close_wait = True
            self._resolve(payload, None)
        elif ftype == FRAME_TYPE_ERROR:
            err = error_from_frame(payload)
            if err.code in NON_FATAL_CODES:
                if self.on_error is not None:
                    self.on_error(self, err)
                else:
                    log.warning("%s: %s", self.address, err)
                return
            if not self._resolve(None, err):
                if self.on_error is not None:
                    self.on_error(self, err)
                else:
                    log.error("%s: %s", self.address, err)
        else:
            self.abort(NSQError(f"unknown frame type {ftype}"))

    def _resolve(self, data: bytes | None, err: ErrorFrame | None) -> bool:
        # Frames answer commands strictly in order, so the oldest pending command owns this
        # frame even if its caller stopped waiting (then the answer is dropped).
        if not self._pending:
            return False
        fut = self._pending.popleft()
        if not fut.done():
            if err is not None:
                fut.set_exception(err)
                fut.exception()  # the caller may have timed out; don't log it as unretrieved
            else:
                assert data is not None
                fut.set_result(data)
        return True


def _decoded_message(conn: Connection, msg_id: bytes, body: bytes, timestamp: int, attempts: int) -> Any:
    """The default ``message_factory``: what ``on_message`` receives."""
    return DecodedMessage(timestamp, attempts, msg_id, body)
