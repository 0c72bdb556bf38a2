"""Consumer: subscribe to a topic/channel on many nsqd, with discovery, RDY flow control and backoff.

Connections come from fixed nsqd addresses and/or nsqlookupd HTTP addresses polled with
jitter (producers merged on ``broadcast_address:tcp_port``; the query carries
``Authorization: Bearer <auth_secret>`` as go-nsq's does). As the seeds prescribe, a fixed
nsqd is reconnected with exponential backoff, a discovered one only when a lookupd poll still
lists it (as go-nsq, a discovered connection that closes triggers an early poll). Every
reconnection goes through the whole handshake again, AUTH included: that is how a consumer
whose authorization expired (nsqd closes it with ``E_AUTH_FAILED``/``E_UNAUTHORIZED``) gets
authorized again, as go-nsq's does. RDY values come from
:class:`~nsqpy.client.rdy.RdyController`.

The delivery path is batch-shaped: a connection hands over the messages of one read as a
list (one RDY bookkeeping call for all), they wait in a deque, and a waiting iterator is
woken once per batch; FINs are buffered by the connection and written once per loop turn.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Self

import aiohttp

from nsqpy.protocol import commands
from nsqpy.protocol.discovery import lookup_headers, lookup_url, producers
from nsqpy.protocol.names import is_valid_channel_name, is_valid_topic_name

from .config import ConnectionConfig
from .conn import Connection
from .errors import (
    AuthError,
    BadChannelError,
    BadTopicError,
    ConnectionClosedError,
    ErrorFrame,
    HandshakeError,
    TLSError,
)
from .message import Message
from .rdy import BackoffPolicy, RdyController, RdyUpdate, Signal, backoff_policy

log = logging.getLogger("nsqpy.client")

GivingUpHook = Callable[[Message], "Awaitable[None] | None"]
Handler = Callable[[Message], Awaitable[Any]]


@dataclass(frozen=True)
class ConsumerStats:
    connections: int
    messages_received: int
    messages_finished: int
    messages_requeued: int
    messages_given_up: int
    backoff_level: int
    total_rdy: int
    in_flight: int


#: Connection failures that retrying with the same configuration will not cure by itself
#: (refused AUTH, failed TLS verification, a handshake nsqd does not agree with).
PERMANENT_ERRORS = (AuthError, TLSError, HandshakeError)


class Consumer:
    """Consume ``topic``/``channel``. Use ``async with`` and ``async for``, or :meth:`run`."""

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        nsqd_tcp_addresses: str | Sequence[str] = (),
        lookupd_http_addresses: str | Sequence[str] = (),
        max_in_flight: int | None = None,
        max_attempts: int | None = None,
        backoff: BackoffPolicy | None = None,
        max_backoff_duration: float | None = None,
        default_requeue_delay: float | None = None,
        max_requeue_delay: float | None = None,
        lookupd_poll_interval: float | None = None,
        lookupd_poll_jitter: float | None = None,
        low_rdy_idle_timeout: float | None = None,
        rdy_redistribute_interval: float | None = None,
        on_giving_up: GivingUpHook | None = None,
        config: ConnectionConfig | None = None,
        drain_timeout: float = 30.0,
        reconnect_interval: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        if not is_valid_topic_name(topic):
            raise BadTopicError(description=f"invalid topic name {topic!r}")
        if not is_valid_channel_name(channel):
            raise BadChannelError(description=f"invalid channel name {channel!r}")
        cfg = config or ConnectionConfig()
        cfg.check_supported()
        self.topic = topic
        self.channel = channel
        self.config = cfg
        self.nsqd_tcp_addresses = _as_list(nsqd_tcp_addresses)
        self.lookupd_http_addresses = _as_list(lookupd_http_addresses)
        if not self.nsqd_tcp_addresses and not self.lookupd_http_addresses:
            raise ValueError("Consumer needs nsqd_tcp_addresses and/or lookupd_http_addresses")
        self.max_in_flight = cfg.max_in_flight if max_in_flight is None else max_in_flight
        self.max_attempts = cfg.max_attempts if max_attempts is None else max_attempts
        self.default_requeue_delay = _pick(default_requeue_delay, cfg.default_requeue_delay)
        self.max_requeue_delay = _pick(max_requeue_delay, cfg.max_requeue_delay)
        self.lookupd_poll_interval = _pick(lookupd_poll_interval, cfg.lookupd_poll_interval)
        self.lookupd_poll_jitter = _pick(lookupd_poll_jitter, cfg.lookupd_poll_jitter)
        self.on_giving_up = on_giving_up
        self.drain_timeout = drain_timeout
        self.reconnect_interval = reconnect_interval
        self._rng = rng or random.Random()
        self.rdy = RdyController(
            self.max_in_flight,
            backoff=backoff or backoff_policy(cfg.backoff_strategy, cfg.backoff_multiplier),
            max_backoff_duration=_pick(max_backoff_duration, cfg.max_backoff_duration),
            low_rdy_idle_timeout=_pick(low_rdy_idle_timeout, cfg.low_rdy_idle_timeout),
            low_rdy_timeout=cfg.low_rdy_timeout,
            rdy_redistribute_interval=_pick(rdy_redistribute_interval, cfg.rdy_redistribute_interval),
            rng=self._rng,
        )
        self.closing = False
        self._started = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conns: dict[str, Connection] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._poll_task: asyncio.Task[None] | None = None
        self._ready: deque[Message] = deque()  # received, not handed out yet
        self._waiters: deque[asyncio.Future[None]] = deque()  # idle iterators
        self._make_message = functools.partial(Message, self)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._rdy_version = -1
        self._held = 0  # messages handed to the application, not yet answered
        self._changed = asyncio.Event()
        self._stop = asyncio.Event()
        self._recheck = asyncio.Event()  # poll lookupd now (a discovered connection closed)
        self._received = self._finished_count = self._requeued = self._given_up = 0
        #: the last connection failure of each nsqd address (cleared once connected)
        self.errors: dict[str, BaseException] = {}

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Connect to the fixed nsqd and start polling lookupd (both in the background)."""
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        for addr in self.nsqd_tcp_addresses:
            self._spawn_conn(addr)
        if self.lookupd_http_addresses:
            self._poll_task = asyncio.create_task(self._poll_lookupd(), name="nsqpy-lookupd-poll")

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, drain_timeout: float | None = None) -> None:
        """CLS everywhere, requeue messages not handed out yet, wait (up to ``drain_timeout``)
        for those handed out to be answered, then close the connections."""
        if self.closing:
            return
        self.closing = True
        self._stop.set()
        if self._poll_task is not None:
            self._poll_task.cancel()
        for conn in list(self._conns.values()):
            try:
                conn.send_request(commands.CLS)
            except ConnectionClosedError:
                pass
        ready = self._ready
        while ready:
            ready.popleft().requeue(0, backoff=False)
        self._wake(len(self._waiters))  # ends every iterator
        timeout = self.drain_timeout if drain_timeout is None else drain_timeout
        if self._held:
            try:
                await asyncio.wait_for(self._wait_drained(), timeout)
            except TimeoutError:
                log.warning("consumer: %d messages still in flight after %.1fs", self._held, timeout)
        for conn in list(self._conns.values()):
            conn.close()
        for conn in list(self._conns.values()):
            await conn.wait_closed()
        for task in [*self._tasks.values(), *self._background]:
            task.cancel()
        tasks = [*self._tasks.values(), *self._background]
        if self._poll_task is not None:
            tasks.append(self._poll_task)
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._timer is not None:
            self._timer.cancel()

    async def _wait_drained(self) -> None:
        while self._held:
            await self._wait_change()

    async def _wait_change(self) -> None:
        ev = self._changed
        await ev.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_connected(self, n: int = 1, timeout: float | None = 10.0) -> None:
        """Wait until at least ``n`` connections are subscribed. Raises the typed error
        (AuthError, TLSError…) at once when every nsqd not connected failed with one, else
        asyncio.TimeoutError after ``timeout``."""
        await self.start()

        async def cond() -> None:
            while len(self._conns) < n:
                err = self._permanent_error()
                if err is not None:
                    raise err.with_traceback(None)
                await self._wait_change()

        await asyncio.wait_for(cond(), timeout)

    def _permanent_error(self) -> BaseException | None:
        """The first address's error if no nsqd is connected and every nsqd known failed
        its last attempt with a permanent error (None while lookupd may find others)."""
        if self._conns or not self.errors:
            return None
        known = [*self.nsqd_tcp_addresses, *(a for a in self.errors if a not in self.nsqd_tcp_addresses)]
        errs = [self.errors.get(a) for a in known]
        if all(isinstance(e, PERMANENT_ERRORS) for e in errs):
            return errs[0]
        return None

    # --- public state -----------------------------------------------------------------

    @property
    def connections(self) -> dict[str, Connection]:
        return dict(self._conns)

    def is_starved(self) -> bool:
        """True when some connection is close to its RDY limit (a good moment to flush a batch)."""
        return self.rdy.is_starved()

    async def set_max_in_flight(self, n: int) -> None:
        """Change max_in_flight at runtime (0 pauses the flow)."""
        self.max_in_flight = n
        self._apply(self.rdy.set_max_in_flight(n, self._now()))

    def stats(self) -> ConsumerStats:
        return ConsumerStats(
            connections=len(self._conns),
            messages_received=self._received,
            messages_finished=self._finished_count,
            messages_requeued=self._requeued,
            messages_given_up=self._given_up,
            backoff_level=self.rdy.backoff_level,
            total_rdy=self.rdy.total_rdy,
            in_flight=self.rdy.total_in_flight,
        )

    def requeue_delay(self, attempts: int) -> float:
        """The automatic REQ delay: default_requeue_delay × attempts, at most max_requeue_delay."""
        return min(self.default_requeue_delay * attempts, self.max_requeue_delay)

    # --- consuming --------------------------------------------------------------------

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Message:
        if not self._started:
            await self.start()
        ready = self._ready
        while True:
            if ready:
                msg = ready.popleft()
                if msg._conn.closed:
                    # nsqd requeued it when the connection closed; skip the stale copy
                    msg._responded = True
                    continue
                msg._delivered = True
                self._held += 1
                return msg
            if self.closing:
                raise StopAsyncIteration
            await self._wait_ready()
            # Woken for a batch: if it is bigger than one message, wake up to two more
            # iterators (they get going while this one handles its message; with
            # handlers that await, every message soon has one; with handlers that
            # don't, this one drains the batch and the others find nothing).
            if len(ready) > 1 and self._waiters:
                self._wake(2)

    async def _wait_ready(self) -> None:
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if not fut.cancelled():
                self._wake(1)  # woken, then cancelled: pass the wake-up on to another
            elif fut in self._waiters:
                self._waiters.remove(fut)  # don't pile up (e.g. anext() under wait_for)
            raise

    def _wake(self, n: int) -> None:
        """Wake up to ``n`` idle iterators."""
        waiters = self._waiters
        while n > 0 and waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                n -= 1

    async def run(self, handler: Handler, *, concurrency: int | None = None) -> None:
        """Call ``handler`` for each message with up to ``concurrency`` at once (default:
        max_in_flight): FIN on return, REQ on exception. Returns when the consumer closes."""
        await self.start()
        n = concurrency or max(1, self.max_in_flight)

        async def worker() -> None:
            async for msg in self:
                try:  # what msg.process() does, without a context manager per message
                    await handler(msg)
                except BaseException as e:
                    msg._handler_failed(e)
                    if not isinstance(e, Exception):
                        raise
                else:
                    msg.finish()

        workers = [asyncio.create_task(worker()) for _ in range(n)]
        try:
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()

    # --- internals: messages ------------------------------------------------------------

    def _now(self) -> float:
        loop = self._loop
        assert loop is not None
        return loop.time()

    def _send(self, conn: Connection, data: bytes) -> None:
        if not conn.closed:
            try:
                conn.send(data)
            except ConnectionClosedError:
                pass

    def _apply(self, updates: list[RdyUpdate]) -> None:
        for key, count in updates:
            assert isinstance(key, Connection)
            self._send(key, commands.rdy(count))
        if self.rdy.version != self._rdy_version:
            self._rdy_version = self.rdy.version
            self._reschedule()

    def _reschedule(self) -> None:
        at = self.rdy.next_deadline()
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at is not None and self._loop is not None and not self.closing:
            self._timer = self._loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._apply(self.rdy.tick(self._now()))
        self._reschedule()

    def _on_messages(self, conn: Connection, msgs: list[Message]) -> None:
        """The messages of one read on ``conn`` (built by ``_make_message``)."""
        self._received += len(msgs)
        updates = self.rdy.on_message(conn, self._now(), len(msgs))
        if updates:
            self._apply(updates)
        limit = self.max_attempts
        if limit:
            for m in msgs:
                if m.attempts > limit:
                    msgs = self._give_up_some(msgs, limit)
                    break
        if self.closing:
            for m in msgs:
                m.requeue(0, backoff=False)
            return
        self._ready.extend(msgs)
        if self._waiters:
            self._wake(1)

    def _give_up_some(self, msgs: list[Message], limit: int) -> list[Message]:
        """Hand the messages over ``limit`` attempts to the giving-up hook; return the rest."""
        keep: list[Message] = []
        for m in msgs:
            if m.attempts <= limit:
                keep.append(m)
                continue
            self._given_up += 1
            t = asyncio.ensure_future(self._give_up(m))
            self._background.add(t)
            t.add_done_callback(self._background.discard)
        return keep

    async def _give_up(self, msg: Message) -> None:
        log.warning("consumer: giving up on %r after %d attempts", msg, msg.attempts)
        try:
            if self.on_giving_up is not None:
                r = self.on_giving_up(msg)
                if inspect.isawaitable(r):
                    await r
        except Exception:
            log.exception("consumer: giving-up hook failed")
        msg.finish()

    def _fin(self, msg: Message) -> None:
        """FIN ``msg`` (the hot path of :meth:`_finished`)."""
        conn = msg._conn
        if not conn.closed:
            conn.fin(msg.id)
        self._finished_count += 1
        if msg._delivered:
            self._held -= 1
            if self.closing:
                self._notify()
        if not self.rdy.on_fin(conn):
            # nsqd requeued it already if the connection closed: no verdict on the message
            signal = Signal.CONTINUE if conn.closed else Signal.SUCCESS
            self._apply(self.rdy.on_finished(conn, signal, self._now()))

    def _finished(self, msg: Message, cmd: bytes, backoff: bool | None) -> None:
        """A message was answered: ``backoff`` None for FIN, else REQ with/without backoff."""
        self._send(msg._conn, cmd)
        if backoff is None:
            self._finished_count += 1
            signal = Signal.SUCCESS
        else:
            self._requeued += 1
            signal = Signal.FAILURE if backoff else Signal.CONTINUE
        if msg._delivered:
            self._held -= 1
            if self.closing:
                self._notify()
        if msg._conn.closed:
            signal = Signal.CONTINUE if signal is Signal.SUCCESS else signal
        self._apply(self.rdy.on_finished(msg._conn, signal, self._now()))

    # --- internals: connections ---------------------------------------------------------

    def _spawn_conn(self, addr: str) -> None:
        if addr in self._tasks or self.closing:
            return
        task = asyncio.create_task(self._conn_loop(addr), name=f"nsqpy-consumer-{addr}")
        self._tasks[addr] = task

    async def _conn_loop(self, addr: str) -> None:
        delay = self.reconnect_interval
        max_delay = max(self.reconnect_interval, self.lookupd_poll_interval)
        try:
            while not self.closing:
                fixed = addr in self.nsqd_tcp_addresses
                try:
                    conn = await self._open(addr)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - any failure: retry or re-discover
                    self.errors[addr] = e
                    self._notify()
                    level = logging.WARNING if isinstance(e, PERMANENT_ERRORS) else logging.INFO
                    if not fixed:
                        log.log(level, "consumer: cannot connect to %s (%s); waiting for lookupd", addr, e)
                        return
                    wait = delay * (0.5 + self._rng.random() / 2)
                    log.log(level, "consumer: cannot connect to %s (%s); retry in %.1fs", addr, e, wait)
                    await self._sleep(wait)
                    delay = min(delay * 2, max_delay)
                    continue
                self.errors.pop(addr, None)
                delay = self.reconnect_interval
                await conn.wait_closed()
                if not fixed:
                    # reconnect when lookupd lists it again: ask now, as go-nsq does
                    if not self.closing:
                        self._recheck.set()
                    return
                if not self.closing:
                    await self._sleep(delay * self._rng.random())
        finally:
            if self._tasks.get(addr) is asyncio.current_task():
                del self._tasks[addr]

    async def _sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except TimeoutError:
            pass

    async def _open(self, addr: str) -> Connection:
        conn = Connection(
            addr,
            self.config,
            on_messages=self._on_messages,
            message_factory=self._make_message,
            on_error=self._on_error,
            on_close=self._on_close,
        )
        await conn.connect()
        try:
            await conn.request(commands.sub(self.topic, self.channel), timeout=self.config.read_timeout)
        except BaseException:
            conn.abort()
            raise
        if self.closing:
            conn.close()
            raise ConnectionClosedError("consumer closing")
        old = self._conns.get(addr)
        if old is not None:
            old.close()
        self._conns[addr] = conn
        log.info("consumer: subscribed to %s/%s on %s", self.topic, self.channel, addr)
        self._apply(self.rdy.add_conn(conn, conn.max_rdy_count, self._now()))
        self._notify()
        return conn

    def _on_error(self, conn: Connection, err: ErrorFrame) -> None:
        log.warning("consumer: %s from %s", err, conn.address)

    def _on_close(self, conn: Connection, exc: BaseException | None) -> None:
        if self._conns.get(conn.address) is conn:
            del self._conns[conn.address]
        if self._loop is not None and conn in self.rdy.conns:
            self._apply(self.rdy.remove_conn(conn, self._now()))
        if not self.closing:
            log.info("consumer: connection to %s closed (%s)", conn.address, exc)
        self._notify()

    # --- internals: discovery -----------------------------------------------------------

    async def _poll_lookupd(self) -> None:
        cfg = self.config
        timeout = aiohttp.ClientTimeout(total=cfg.lookupd_poll_timeout)
        # go-nsq's option is named skip_lookupd_authorization but means "send it" (default)
        headers = lookup_headers(cfg.auth_secret if cfg.skip_lookupd_authorization else None)
        loop = asyncio.get_running_loop()
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
            while not self.closing:
                polled = loop.time()
                self._recheck.clear()
                await self.query_lookupd(session)
                interval = self.lookupd_poll_interval
                await self._wait_poll(interval * (1 - self.lookupd_poll_jitter * self._rng.random()))
                if self._recheck.is_set():  # an early poll, but not a storm of them
                    await self._sleep(polled + min(self.reconnect_interval, interval) - loop.time())

    async def _wait_poll(self, seconds: float) -> None:
        """Until the next poll is due, a recheck is asked for, or the consumer closes."""
        waits = [asyncio.ensure_future(self._stop.wait()), asyncio.ensure_future(self._recheck.wait())]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def query_lookupd(self, session: aiohttp.ClientSession) -> set[str]:
        """Query every lookupd once; connect to producers not connected yet; return them all."""
        results = await asyncio.gather(
            *(self._lookup(session, a) for a in self.lookupd_http_addresses), return_exceptions=True
        )
        found: set[str] = set()
        for addr, r in zip(self.lookupd_http_addresses, results, strict=True):
            if isinstance(r, BaseException):
                log.warning("consumer: lookupd %s query failed: %s", addr, r)
                continue
            found |= r
        for p in sorted(found):
            self._spawn_conn(p)
        return found

    async def _lookup(self, session: aiohttp.ClientSession, address: str) -> set[str]:
        async with session.get(lookup_url(address, self.topic)) as resp:
            if resp.status == 404:  # TOPIC_NOT_FOUND: nobody publishes it yet
                return set()
            resp.raise_for_status()
            doc = await resp.json(content_type=None)
        return {p.tcp for p in producers(doc)}


def _as_list(v: str | Sequence[str]) -> list[str]:
    return [v] if isinstance(v, str) else list(v)


def _pick(v: float | None, default: float) -> float:
    return default if v is None else v
