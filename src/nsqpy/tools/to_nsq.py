"""``to_nsq``: publish stdin, split on a delimiter byte, to a topic on every given nsqd.

As NSQ 1.3's ``apps/to_nsq``: each non-empty piece between delimiters is one message,
published to **every** ``--nsqd-tcp-address``; ``--rate`` throttles to N messages a second.
Unlike Go, which sends one PUB and waits for its OK before reading on, messages are sent as
pipelined MPUB batches (several in flight per nsqd, each answer checked), and a last piece
without a trailing delimiter is published whole (Go drops its last byte). The exit code is
0 only when every message read was acknowledged by every nsqd.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sys
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from nsqpy.client import BadMessageError, ConnectionConfig, Producer
from nsqpy.client.errors import BadBodyError
from nsqpy.daemon import stop_on_signals
from nsqpy.goflags import BOOL, INT, STRING, FlagSet
from nsqpy.goflags import flag_nocfg as _f
from nsqpy.protocol.names import is_valid_topic_name

from .common import (
    GO_OPTIONS,
    STRING_ARRAY,
    client_config,
    fatal,
    first_of,
    run_main,
    start,
)

APP: Final = "to_nsq"
log = logging.getLogger(APP)

#: Bytes asked of stdin per read.
READ_SIZE: Final = 256 * 1024
#: An MPUB carries at most this many body bytes (well under nsqd's default 5 MB
#: --max-body-size) and this many messages; a bigger message goes alone as a PUB.
BATCH_BYTES: Final = 256 * 1024
BATCH_COUNT: Final = 2000
#: MPUB/PUB commands awaiting their answer, per nsqd.
WINDOW: Final = 8


@dataclass(slots=True)
class Options:
    """to_nsq's flags (names as in Go)."""

    topic: str = ""
    delimiter: str = "\n"
    nsqd_tcp_address: list[str] = field(default_factory=list)
    producer_opt: list[str] = field(default_factory=list, repr=False)  # may hold auth_secret
    rate: int = 0
    version: bool = False
    explicit: set[str] = field(default_factory=set, repr=False, compare=False)


FLAGS: Final = (
    _f("topic", STRING, "NSQ topic to publish to"),
    _f("delimiter", STRING, "character to split input from stdin"),
    _f("nsqd-tcp-address", STRING_ARRAY, "destination nsqd TCP address (may be given multiple times)"),
    _f(
        "producer-opt",
        GO_OPTIONS,
        "option to passthrough to nsq.Producer (may be given multiple times, "
        "http://godoc.org/github.com/nsqio/go-nsq#Config)",
    ),
    _f("rate", INT, "Throttle messages to n/second. 0 to disable"),
    _f("version", BOOL, "print version string"),
)
FLAGSET: Final = FlagSet(APP, FLAGS, Options)


class Throttle:
    """At most ``rate`` messages a second: message *i* of a busy stretch goes out no earlier
    than its start + *i*/``rate``. Idle time (waiting for input) earns no burst credit;
    lateness of our own timers is caught up."""

    def __init__(self, rate: int) -> None:
        self.interval = 1.0 / rate
        self.next_at: float | None = None

    def idle(self, now: float) -> None:
        """New input after waiting for it: the schedule restarts at ``now`` if it is behind."""
        if self.next_at is None or self.next_at < now:
            self.next_at = now

    def allowance(self, now: float) -> int:
        """How many messages may go out at ``now``."""
        if self.next_at is None:
            self.next_at = now
        if now < self.next_at:
            return 0
        return int((now - self.next_at) / self.interval) + 1

    def take(self, n: int) -> None:
        assert self.next_at is not None
        self.next_at += n * self.interval

    def delay(self, now: float) -> float:
        """Seconds until the next message may go out."""
        return 0.0 if self.next_at is None else max(0.0, self.next_at - now)


class Splitter:
    """Cut a byte stream into the non-empty pieces between ``delim`` bytes."""

    def __init__(self, delim: bytes) -> None:
        self.delim = delim
        self._partial: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        if self.delim not in chunk:
            if chunk:
                self._partial.append(chunk)
            return []
        if self._partial:
            self._partial.append(chunk)
            chunk = b"".join(self._partial)
            self._partial = []
        pieces = chunk.split(self.delim)
        tail = pieces.pop()
        if tail:
            self._partial.append(tail)
        return [p for p in pieces if p]

    def finish(self) -> list[bytes]:
        """At end of input: the last piece, which had no delimiter after it."""
        last = b"".join(self._partial)
        self._partial = []
        return [last] if last else []

    @property
    def pending_bytes(self) -> int:
        return sum(map(len, self._partial))


class FdReader:
    """Reads a file descriptor in a daemon thread, one chunk per :meth:`read`, so a read
    blocked on an idle pipe or terminal never holds up the loop or the process exit."""

    def __init__(self, fd: int, size: int = READ_SIZE) -> None:
        self.fd = fd
        self.size = size
        self._loop = asyncio.get_running_loop()
        self._requests: queue.SimpleQueue[asyncio.Future[bytes]] = queue.SimpleQueue()
        self._current: asyncio.Future[bytes] | None = None
        threading.Thread(target=self._run, name=f"{APP}-stdin", daemon=True).start()

    def _run(self) -> None:
        while True:
            fut = self._requests.get()
            try:
                data = os.read(self.fd, self.size)
            except OSError as e:
                self._deliver(fut, e)
                continue
            self._deliver(fut, data)

    def _deliver(self, fut: asyncio.Future[bytes], result: bytes | OSError) -> None:
        def settle() -> None:
            if fut.done():
                return
            if isinstance(result, OSError):
                fut.set_exception(result)
            else:
                fut.set_result(result)

        try:
            self._loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop is closed: the process is exiting
            pass

    def read(self) -> asyncio.Future[bytes]:
        """The next chunk (b"" at end of input); a read still pending is reused, not repeated."""
        if self._current is None or self._current.done():
            self._current = self._loop.create_future()
            self._requests.put(self._current)
        return self._current


class Publisher:
    """Publish batches to every nsqd, several commands in flight per nsqd; the first failure
    stops everything (``error``)."""

    def __init__(self, producers: dict[str, Producer], topic: str, connect_timeout: float) -> None:
        self.producers = producers
        self.topic = topic
        self.connect_timeout = connect_timeout
        self.window: deque[asyncio.Task[None]] = deque()
        self.error: str | None = None
        #: messages each nsqd acknowledged
        self.acked = dict.fromkeys(producers, 0)
        self._connected = False

    async def _connect(self) -> None:
        """Before the first message: every nsqd must be reachable (as Go, whose first
        publish fails when it cannot connect), not retried in the background for long."""
        self._connected = True
        results = await asyncio.gather(
            *(p.wait_connected(self.connect_timeout) for p in self.producers.values()),
            return_exceptions=True,
        )
        for addr, r in zip(self.producers, results, strict=True):
            if isinstance(r, BaseException) and self.error is None:
                self.error = f"failed to connect to nsqd {addr} - {r}"

    async def submit(self, batch: list[bytes]) -> bool:
        """Queue ``batch`` for every nsqd; False once a publish has failed."""
        if not self._connected:
            await self._connect()
        for addr, producer in self.producers.items():
            while len(self.window) >= WINDOW * len(self.producers):
                await self._reap_oldest()
            if self.error is not None:
                return False
            self.window.append(asyncio.create_task(self._publish(addr, producer, batch)))
        return self.error is None

    async def _reap_oldest(self) -> None:
        await asyncio.wait([self.window[0]])
        self.window.popleft()

    async def drain(self) -> None:
        """Wait for every answer."""
        while self.window:
            await self._reap_oldest()

    async def _publish(self, addr: str, producer: Producer, batch: list[bytes]) -> None:
        if self.error is not None:
            return
        try:
            try:
                if len(batch) == 1:
                    await producer.publish(self.topic, batch[0])
                else:
                    await producer.publish_many(self.topic, batch)
                self.acked[addr] += len(batch)
            except (BadMessageError, BadBodyError):
                if len(batch) == 1:
                    raise
                # MPUB is all or nothing (and may be too big for this nsqd): one PUB each,
                # up to the message that is refused, if any
                for body in batch:
                    if self.error is not None:
                        return
                    await producer.publish(self.topic, body)
                    self.acked[addr] += 1
        except Exception as e:  # noqa: BLE001 - whatever it is, it is reported and fails the run
            if self.error is None:
                self.error = f"failed to publish to {addr} - {e}"


def batches(pending: deque[bytes], limit: int) -> list[bytes]:
    """Take up to ``limit`` messages off ``pending`` for one command (at least one)."""
    batch = [pending.popleft()]
    size = len(batch[0])
    while pending and len(batch) < limit and size + len(pending[0]) <= BATCH_BYTES:
        body = pending.popleft()
        size += len(body)
        batch.append(body)
    return batch


async def publish_stream(
    reader: FdReader,
    producers: dict[str, Producer],
    topic: str,
    delim: bytes,
    rate: int,
    stop: asyncio.Event,
    connect_timeout: float = 2.0,
) -> int:
    """Read until end of input (or ``stop``), publish everything read, wait for every
    answer; return the exit code."""
    loop = asyncio.get_running_loop()
    pub = Publisher(producers, topic, connect_timeout)
    splitter = Splitter(delim)
    throttle = Throttle(rate) if rate > 0 else None
    pending: deque[bytes] = deque()
    read_err: str | None = None
    eof = False
    read = 0  # messages read from stdin
    while not eof and pub.error is None and not stop.is_set():
        try:
            chunk = await first_of(stop, reader.read())
        except OSError as e:
            read_err = f"failed to read stdin - {e}"
            break
        if chunk is None:
            break
        if chunk:
            pieces = splitter.feed(chunk)
        else:
            eof = True
            pieces = splitter.finish()
        read += len(pieces)
        pending.extend(pieces)
        if throttle is not None:
            throttle.idle(loop.time())
        while pending and pub.error is None and not stop.is_set():
            limit = BATCH_COUNT
            if throttle is not None:
                now = loop.time()
                allowed = throttle.allowance(now)
                if allowed == 0:
                    nap = asyncio.ensure_future(asyncio.sleep(throttle.delay(now)))
                    await first_of(stop, nap)
                    nap.cancel()
                    continue
                limit = min(limit, allowed)
            batch = batches(pending, limit)
            if throttle is not None:
                throttle.take(len(batch))
            await pub.submit(batch)
    await pub.drain()
    if pub.error is not None:
        missed = read - min(pub.acked.values())
        return fatal(
            f"{pub.error} ({missed} of {read} messages read from stdin were not published"
            + (" to every nsqd)" if len(producers) > 1 else ")")
        )
    if read_err is not None:
        return fatal(read_err)
    unsent = len(pending)
    partial = splitter.pending_bytes
    if unsent or partial:
        return fatal(
            f"interrupted: {unsent} messages and {partial} bytes of an unterminated one, "
            "read from stdin, were not published"
        )
    return 0


async def run(opts: Options, cfg: ConnectionConfig, delim: bytes) -> int:
    stop = stop_on_signals()
    # one producer per distinct address: every message goes to each of them
    # (they connect when the first message is ready, as Go's do)
    producers = {addr: Producer(addr, config=cfg) for addr in dict.fromkeys(opts.nsqd_tcp_address)}
    try:
        if opts.rate > 0:
            log.info("Throttling messages rate to max:%d/second", opts.rate)
        return await publish_stream(
            FdReader(sys.stdin.fileno()),
            producers,
            opts.topic,
            delim,
            opts.rate,
            stop,
            connect_timeout=cfg.dial_timeout + 1.0,
        )
    finally:
        for p in producers.values():
            await p.close()


def main(argv: Sequence[str] | None = None) -> int:
    opts = start(FLAGSET, argv, APP)
    if isinstance(opts, int):
        return opts
    if not opts.topic:
        return fatal("--topic required")
    delim = os.fsencode(opts.delimiter)
    if len(delim) != 1:
        return fatal("--delimiter must be a single byte")
    if not opts.nsqd_tcp_address:
        return fatal("--nsqd-tcp-address required")
    if not is_valid_topic_name(opts.topic):
        return fatal(f"invalid topic name {opts.topic!r}")
    try:
        cfg = client_config(APP, opts.producer_opt)
    except ValueError as e:
        return fatal(f"failed to create nsq.Producer - {e}")
    return run_main(run(opts, cfg, delim))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
