"""Blocking facade for scripts: the asyncio client running on a private event-loop thread.

``SyncProducer`` and ``SyncConsumer`` own a daemon thread that runs their event loop; every
method submits a coroutine to it and waits for the result (like ``websockets.sync``). They
take the same arguments as :class:`~nsqpy.client.Producer` and
:class:`~nsqpy.client.Consumer`, TLS, compression and AUTH included (``config=``), and raise
the same typed errors.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from datetime import timedelta
from typing import Any, Self, TypeVar

from .config import ConnectionConfig
from .consumer import Consumer, ConsumerStats
from .message import Message
from .producer import Producer

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("blocking call from the client's own loop thread")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            if fut.cancel():  # nothing was taken: safe to give up
                raise
            return fut.result()

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class SyncProducer:
    """``with SyncProducer("127.0.0.1:4150") as p: p.publish("topic", b"body")``."""

    def __init__(
        self,
        nsqd_tcp_addresses: str | Sequence[str],
        *,
        config: ConnectionConfig | None = None,
        **kwargs: Any,
    ) -> None:
        """``kwargs``: :class:`~nsqpy.client.Producer`'s other keyword arguments."""
        self._lt = _LoopThread("nsqpy-sync-producer")

        async def make() -> Producer:
            p = Producer(nsqd_tcp_addresses, config=config, **kwargs)
            await p.start()
            return p

        try:
            self._producer = self._lt.call(make())
        except BaseException:
            self._lt.stop()
            raise

    def wait_connected(self, timeout: float | None = None, *, all: bool = False) -> None:
        self._lt.call(self._producer.wait_connected(timeout, all=all))

    def publish(
        self, topic: str, body: bytes, *, defer: float | timedelta | None = None, timeout: float | None = None
    ) -> None:
        self._lt.call(self._producer.publish(topic, body, defer=defer, timeout=timeout))

    def publish_many(self, topic: str, bodies: Iterable[bytes], *, timeout: float | None = None) -> None:
        self._lt.call(self._producer.publish_many(topic, list(bodies), timeout=timeout))

    def ping(self, timeout: float | None = None) -> None:
        self._lt.call(self._producer.ping(timeout))

    def close(self) -> None:
        if not self._lt.loop.is_closed():
            self._lt.call(self._producer.close())
            self._lt.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncMessage:
    """A :class:`~nsqpy.client.message.Message` with blocking fin/req/touch."""

    __slots__ = ("_lt", "_msg")

    def __init__(self, msg: Message, lt: _LoopThread) -> None:
        self._msg = msg
        self._lt = lt

    @property
    def id(self) -> bytes:
        return self._msg.id

    @property
    def body(self) -> bytes:
        return self._msg.body

    @property
    def timestamp(self) -> int:
        return self._msg.timestamp

    @property
    def attempts(self) -> int:
        return self._msg.attempts

    @property
    def nsqd_address(self) -> str:
        return self._msg.nsqd_address

    @property
    def has_responded(self) -> bool:
        return self._msg.has_responded

    def fin(self) -> None:
        self._lt.call(self._msg.fin())

    def req(self, delay: float | None = None, *, backoff: bool = True) -> None:
        self._lt.call(self._msg.req(delay, backoff=backoff))

    def touch(self) -> None:
        self._lt.call(self._msg.touch())

    def __repr__(self) -> str:
        return f"<Sync{self._msg!r}>"


class SyncConsumer:
    """``with SyncConsumer("t", "c", nsqd_tcp_addresses=[...]) as c: for msg in c: msg.fin()``."""

    def __init__(
        self, topic: str, channel: str, *, config: ConnectionConfig | None = None, **kwargs: Any
    ) -> None:
        """``kwargs``: :class:`~nsqpy.client.Consumer`'s other keyword arguments."""
        self._lt = _LoopThread("nsqpy-sync-consumer")

        async def make() -> Consumer:
            c = Consumer(topic, channel, config=config, **kwargs)
            await c.start()
            return c

        try:
            self._consumer = self._lt.call(make())
        except BaseException:
            self._lt.stop()
            raise

    def __iter__(self) -> Iterator[SyncMessage]:
        return self

    def __next__(self) -> SyncMessage:
        return self.next()

    def next(self, timeout: float | None = None) -> SyncMessage:
        """The next message (StopIteration once closed; TimeoutError after ``timeout``)."""

        async def get() -> Message | None:
            try:
                return await self._consumer.__anext__()
            except StopAsyncIteration:
                return None

        msg = self._lt.call(get(), timeout)
        if msg is None:
            raise StopIteration
        return SyncMessage(msg, self._lt)

    def wait_connected(self, n: int = 1, timeout: float | None = 10.0) -> None:
        self._lt.call(self._consumer.wait_connected(n, timeout))

    def set_max_in_flight(self, n: int) -> None:
        self._lt.call(self._consumer.set_max_in_flight(n))

    def is_starved(self) -> bool:
        async def q() -> bool:
            return self._consumer.is_starved()

        return self._lt.call(q())

    def stats(self) -> ConsumerStats:
        async def q() -> ConsumerStats:
            return self._consumer.stats()

        return self._lt.call(q())

    def close(self, drain_timeout: float | None = None) -> None:
        if not self._lt.loop.is_closed():
            self._lt.call(self._consumer.close(drain_timeout))
            self._lt.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
