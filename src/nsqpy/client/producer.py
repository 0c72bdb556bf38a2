"""Producer: awaitable PUB / MPUB / DPUB to one or many nsqd.

Each nsqd address has a slot that keeps a :class:`~nsqpy.client.conn.Connection` open,
reconnecting with exponential backoff. A publish picks a connected slot by the strategy
(``round_robin``, ``failover`` — the first address that is up — or ``random``), waits for a
connection while none is up (start-up, restarts) instead of failing, and is retried on another
connection if its own closed before the answer or the nsqd refused it with ``E_*PUB_FAILED``.
Answers arrive in command order per connection, so each call gets its own OK or typed error.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Literal, Self

from nsqpy.protocol import commands
from nsqpy.protocol.names import is_valid_topic_name

from .config import ConnectionConfig
from .conn import Connection
from .errors import (
    BadMessageError,
    BadTopicError,
    ConnectionClosedError,
    DPubFailedError,
    MPubFailedError,
    NoConnectionsError,
    PubFailedError,
)

log = logging.getLogger("nsqpy.client")

Strategy = Literal["round_robin", "failover", "random"]

#: Errors after which the same command may be sent again, to another nsqd.
RETRYABLE = (ConnectionClosedError, PubFailedError, MPubFailedError, DPubFailedError)


class _Slot:
    """One nsqd address: its current connection and the task that keeps it connected."""

    def __init__(self, producer: Producer, address: str) -> None:
        self.producer = producer
        self.address = address
        self.conn: Connection | None = None
        self.last_error: BaseException | None = None
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        p = self.producer
        delay = p.reconnect_interval
        while not p.closing:
            conn = Connection(self.address, p.config)
            try:
                await conn.connect()
            except Exception as e:  # noqa: BLE001 - any failure: retry later
                self.last_error = e
                log.info("producer: cannot connect to %s: %s (retry in %.1fs)", self.address, e, delay)
                await asyncio.sleep(delay * (0.5 + random.random() / 2))
                delay = min(delay * 2, p.max_reconnect_interval)
                continue
            delay = p.reconnect_interval
            if p.closing:
                # close() came while connecting and its cancel was lost (3.11's wait_for
                # drops a cancel that races with completion): don't keep this connection
                conn.close()
                return
            self.conn = conn
            p._update_connected()
            try:
                await conn.wait_closed()
            finally:
                self.conn = None
                p._update_connected()
            if not p.closing:
                log.info("producer: connection to %s closed; reconnecting", self.address)


class Producer:
    """Publish to nsqd; use as ``async with Producer(["127.0.0.1:4150"]) as p: await p.publish(...)``."""

    def __init__(
        self,
        nsqd_tcp_addresses: str | Sequence[str],
        *,
        config: ConnectionConfig | None = None,
        strategy: Strategy = "round_robin",
        retries: int = 2,
        timeout: float = 10.0,
        reconnect_interval: float = 0.5,
        max_reconnect_interval: float = 15.0,
    ) -> None:
        addrs = [nsqd_tcp_addresses] if isinstance(nsqd_tcp_addresses, str) else list(nsqd_tcp_addresses)
        if not addrs:
            raise ValueError("Producer needs at least one nsqd address")
        if strategy not in ("round_robin", "failover", "random"):
            raise ValueError(f"unknown strategy {strategy!r}")
        self.config = config or ConnectionConfig()
        self.config.check_supported()
        self.strategy: Strategy = strategy
        self.retries = retries
        self.timeout = timeout
        self.reconnect_interval = reconnect_interval
        self.max_reconnect_interval = max_reconnect_interval
        self.closing = False
        self._slots = [_Slot(self, a) for a in addrs]
        self._rr = 0
        self._connected: asyncio.Event | None = None
        self._started = False

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Start connecting to every nsqd (in the background; publish waits for them)."""
        if self._started:
            return
        self._started = True
        self._connected = asyncio.Event()
        for slot in self._slots:
            slot.task = asyncio.create_task(slot.run(), name=f"nsqpy-producer-{slot.address}")

    async def wait_connected(self, timeout: float | None = None, *, all: bool = False) -> None:
        """Wait until one (or ``all``) of the nsqd are connected."""
        await self.start()

        async def cond() -> None:
            while True:
                up = [s for s in self._slots if s.conn is not None]
                if up and (not all or len(up) == len(self._slots)):
                    return
                await self._changed()

        try:
            await asyncio.wait_for(cond(), timeout)
        except asyncio.TimeoutError:
            raise NoConnectionsError(self._why()) from None

    async def close(self) -> None:
        """Close every connection (answers already on their way are awaited first)."""
        self.closing = True
        for slot in self._slots:
            conn = slot.conn
            if conn is not None and conn.pending:
                try:
                    await asyncio.wait_for(conn.drain(), self.timeout)
                except asyncio.TimeoutError:
                    pass
            if conn is not None:
                conn.close()
            if slot.task is not None:
                slot.task.cancel()
        for slot in self._slots:
            if slot.task is not None:
                try:
                    await slot.task
                except (asyncio.CancelledError, Exception):  # noqa: BLE001
                    pass
        self._started = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- state ------------------------------------------------------------------------

    @property
    def connected_addresses(self) -> list[str]:
        return [s.address for s in self._slots if s.conn is not None]

    def _update_connected(self) -> None:
        ev = self._connected
        if ev is None:
            return
        # Wake every waiter on each change (set then re-arm): they re-check the state.
        ev.set()
        self._connected = asyncio.Event()

    async def _changed(self) -> None:
        assert self._connected is not None
        await self._connected.wait()

    def _why(self) -> str:
        errs = "; ".join(f"{s.address}: {s.last_error}" for s in self._slots if s.last_error)
        return "no nsqd connection available" + (f" ({errs})" if errs else "")

    def _pick(self) -> Connection | None:
        up = [s.conn for s in self._slots if s.conn is not None and not s.conn.closed]
        if not up:
            return None
        if self.strategy == "failover":
            return up[0]
        if self.strategy == "random":
            return random.choice(up)
        self._rr += 1
        return up[self._rr % len(up)]

    # --- publishing -------------------------------------------------------------------

    async def _send(self, cmd: bytes, timeout: float | None) -> None:
        await self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.timeout if timeout is None else timeout)
        failures = 0
        while True:
            if self.closing:
                raise ConnectionClosedError("producer is closed")
            remaining = deadline - loop.time()
            conn = self._pick()
            if conn is None:
                if remaining <= 0:
                    raise NoConnectionsError(self._why())
                try:
                    await asyncio.wait_for(self._changed(), remaining)
                except asyncio.TimeoutError:
                    raise NoConnectionsError(self._why()) from None
                continue
            if remaining <= 0:
                raise TimeoutError("publish timed out")
            try:
                await conn.request(cmd, timeout=remaining)
                return
            except RETRYABLE as e:
                failures += 1
                if failures > self.retries or self.closing:
                    raise
                log.info("producer: %s on %s; retrying", e, conn.address)

    async def publish(
        self,
        topic: str,
        body: bytes,
        *,
        defer: float | timedelta | None = None,
        timeout: float | None = None,
    ) -> None:
        """PUB (or DPUB when ``defer`` is given, in seconds); raises a typed error on failure."""
        _check_topic(topic)
        if not body:
            raise BadMessageError(description="message body is empty")
        if defer is None:
            await self._send(commands.pub(topic, body), timeout)
            return
        seconds = defer.total_seconds() if isinstance(defer, timedelta) else float(defer)
        if seconds < 0:
            raise ValueError("defer must be >= 0")
        await self._send(commands.dpub(topic, round(seconds * 1000), body), timeout)

    async def publish_many(
        self, topic: str, bodies: Iterable[bytes], *, timeout: float | None = None
    ) -> None:
        """MPUB: all of ``bodies`` or none of them."""
        _check_topic(topic)
        items = list(bodies)
        if not items:
            raise ValueError("publish_many needs at least one message")
        if not all(items):
            raise BadMessageError(description="message body is empty")
        await self._send(commands.mpub(topic, items), timeout)

    async def ping(self, timeout: float | None = None) -> None:
        """Wait until some nsqd is connected (raises NoConnectionsError after ``timeout``)."""
        await self.wait_connected(self.timeout if timeout is None else timeout)


def _check_topic(topic: str) -> None:
    if not is_valid_topic_name(topic):
        raise BadTopicError(description=f"invalid topic name {topic!r}")
