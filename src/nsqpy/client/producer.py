"""Producer: awaitable PUB / MPUB / DPUB to one or many nsqd.

Each nsqd address has a slot that keeps a :class:`~nsqpy.client.conn.Connection` open,
reconnecting with exponential backoff. A publish picks a connected slot by the strategy
(``round_robin``, ``failover`` — the first address that is up — or ``random``), waits for a
connection while none is up (start-up, restarts) instead of failing, and is retried on another
connection if its own closed before the answer or the nsqd refused it with ``E_*PUB_FAILED``.
Answers arrive in command order per connection, so each call gets its own OK or typed error.

TLS, compression and AUTH come from the :class:`~nsqpy.client.config.ConnectionConfig`.
When no connection is up and every nsqd refused the last attempt for good (AUTH refused,
TLS verification failed…), a publish raises that typed error at once instead of waiting for
its timeout; the slots keep retrying in the background. As in go-nsq, a publish refused
because the authorization expired (``E_AUTH_FAILED``/``E_UNAUTHORIZED`` after the TTL) raises
that error, nsqd closes the connection, and the next connection AUTHs again.
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
    AuthError,
    BadMessageError,
    BadTopicError,
    ConnectionClosedError,
    DPubFailedError,
    HandshakeError,
    MPubFailedError,
    NoConnectionsError,
    PubFailedError,
    TLSError,
)

log = logging.getLogger("nsqpy.client")

Strategy = Literal["round_robin", "failover", "random"]

#: Errors after which the same command may be sent again, to another nsqd.
RETRYABLE = (ConnectionClosedError, PubFailedError, MPubFailedError, DPubFailedError)

#: Connection failures that retrying with the same configuration will not cure by itself.
PERMANENT_ERRORS = (AuthError, TLSError, HandshakeError)


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
                p._update_connected()  # waiting publishes look at the error
                level = logging.WARNING if isinstance(e, PERMANENT_ERRORS) else logging.INFO
                log.log(level, "producer: cannot connect to %s: %s (retry in %.1fs)", self.address, e, delay)
                await asyncio.sleep(delay * (0.5 + random.random() / 2))
                delay = min(delay * 2, p.max_reconnect_interval)
                continue
            delay = p.reconnect_interval
            self.last_error = None
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
        """Wait until one (or ``all``) of the nsqd are connected. Raises the typed error
        (AuthError, TLSError…) at once when it cannot happen without a change elsewhere,
        NoConnectionsError after ``timeout``."""
        await self.start()

        async def cond() -> None:
            while True:
                up = [s for s in self._slots if s.conn is not None]
                if up and (not all or len(up) == len(self._slots)):
                    return
                err = self._permanent_error(any_slot=all)
                if err is not None:
                    raise err.with_traceback(None)
                await self._changed()

        try:
            await asyncio.wait_for(cond(), timeout)
        except TimeoutError:
            raise NoConnectionsError(self._why()) from None

    async def close(self) -> None:
        """Close every connection (answers already on their way are awaited first)."""
        self.closing = True
        for slot in self._slots:
            conn = slot.conn
            if conn is not None and conn.pending:
                try:
                    await asyncio.wait_for(conn.drain(), self.timeout)
                except TimeoutError:
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

    @property
    def connections(self) -> dict[str, Connection]:
        """The connections up now, by nsqd address (what each negotiated: ``tls_version``,
        ``compression``, ``auth``, ``server_settings``)."""
        return {s.address: s.conn for s in self._slots if s.conn is not None}

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

    def _permanent_error(self, any_slot: bool = False) -> BaseException | None:
        """The error of the first slot down with a permanent one, if every slot is down
        with one (``any_slot``: if any slot is)."""
        down = [s.last_error for s in self._slots if s.conn is None]
        perm = [e for e in down if isinstance(e, PERMANENT_ERRORS)]
        if not perm:
            return None
        if any_slot or len(perm) == len(self._slots):
            return perm[0]
        return None

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
                err = self._permanent_error()
                if err is not None:
                    raise err.with_traceback(None)
                if remaining <= 0:
                    raise NoConnectionsError(self._why())
                try:
                    await asyncio.wait_for(self._changed(), remaining)
                except TimeoutError:
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
