"""A message received by a :class:`~nsqpy.client.consumer.Consumer`, and how to answer it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from .errors import GiveUp, RequeueMessage

if TYPE_CHECKING:
    from .conn import Connection
    from .consumer import Consumer

log = logging.getLogger("nsqpy.client")


class Message:
    """One delivery of a message: answer it exactly once with :meth:`fin` or :meth:`req`.

    ``id`` is the 16-byte hex id, ``timestamp`` is in nanoseconds, ``attempts`` counts
    deliveries (1 the first time) and ``nsqd_address`` says which nsqd sent it.
    """

    # Built once per message received: keep the slots few and __init__ plain.
    __slots__ = ("_conn", "_consumer", "_delivered", "_responded", "attempts", "body", "id", "timestamp")

    def __init__(
        self, consumer: Consumer, conn: Connection, msg_id: bytes, body: bytes, timestamp: int, attempts: int
    ) -> None:
        self.id = msg_id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self._consumer = consumer
        self._conn = conn
        self._responded = False
        self._delivered = False  # handed to the application

    def __repr__(self) -> str:
        return f"<Message {self.id.decode()} attempts={self.attempts} from {self.nsqd_address}>"

    @property
    def nsqd_address(self) -> str:
        return self._conn.address

    @property
    def has_responded(self) -> bool:
        return self._responded

    # The synchronous forms do the work (they only buffer bytes); the async ones are the API.

    def finish(self) -> None:
        """FIN: the message is done (also lowers the consumer's backoff level)."""
        if not self._responded:
            self._responded = True
            self._consumer._fin(self)

    def requeue(self, delay: float | None = None, *, backoff: bool = True) -> None:
        """REQ after ``delay`` seconds (default: default_requeue_delay × attempts, capped)."""
        if not self._responded:
            self._responded = True
            if delay is None:
                delay = self._consumer.requeue_delay(self.attempts)
            ms = max(0, round(delay * 1000))
            self._consumer._finished(self, b"REQ " + self.id + b" %d\n" % ms, backoff)

    def touch_now(self) -> None:
        """TOUCH: reset the server's timeout for this message."""
        if not self._responded:
            self._consumer._send(self._conn, b"TOUCH " + self.id + b"\n")

    def _handler_failed(self, exc: BaseException) -> None:
        """Answer for a handler that raised ``exc`` (see :meth:`process`); other
        BaseExceptions than CancelledError leave the message unanswered."""
        if isinstance(exc, RequeueMessage):
            self.requeue(exc.delay, backoff=exc.backoff)
        elif isinstance(exc, GiveUp):
            self.finish()
        elif isinstance(exc, asyncio.CancelledError):
            self.requeue(0, backoff=False)
        elif isinstance(exc, Exception):
            log.warning("handler failed for %r; requeueing", self, exc_info=exc)
            self.requeue()

    async def fin(self) -> None:
        self.finish()

    async def req(self, delay: float | None = None, *, backoff: bool = True) -> None:
        self.requeue(delay, backoff=backoff)

    async def touch(self) -> None:
        self.touch_now()

    @contextlib.asynccontextmanager
    async def process(self) -> AsyncIterator[Message]:
        """FIN on a clean exit; REQ on an exception (``RequeueMessage`` sets delay/backoff,
        ``GiveUp`` FINs). Exceptions are logged and swallowed so a consuming loop goes on."""
        try:
            yield self
        except BaseException as e:
            self._handler_failed(e)
            if not isinstance(e, Exception):
                raise
        else:
            self.finish()

    @contextlib.asynccontextmanager
    async def auto_touch(self, every: float | None = None) -> AsyncIterator[None]:
        """TOUCH every ``every`` seconds (default: half the negotiated msg_timeout) meanwhile."""
        if every is None:
            every = self._conn.server_settings.get("msg_timeout", 60000) / 2000.0

        async def toucher() -> None:
            while not self._responded:
                await asyncio.sleep(every)
                self.touch_now()

        task = asyncio.create_task(toucher())
        try:
            yield
        finally:
            task.cancel()
