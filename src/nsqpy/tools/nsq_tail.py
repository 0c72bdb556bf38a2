"""``nsq_tail``: print the messages of one or more topics to stdout, like ``tail -f``.

As NSQ 1.3's ``apps/nsq_tail``: one consumer per ``--topic`` on a shared channel (by default
``tail<6 digits>#ephemeral``, so it vanishes when nsq_tail leaves); each message body is
written followed by ``\\n`` (``<topic> | `` before it with ``--print-topic``); ``-n N``
exits 0 after N messages; logs go to stderr; SIGINT/SIGTERM stop it cleanly (exit 0).

A message is FINished only once its line has been written to stdout (the output is flushed
once per burst of messages, then the burst is FINished). ``-n`` counts messages over all
topics; messages that arrive past the N-th are requeued, not printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, Final

from nsqpy.client import ConnectionConfig, Consumer, Message, NSQError
from nsqpy.daemon import stop_on_signals
from nsqpy.goflags import BOOL, INT, STRING, FlagSet
from nsqpy.goflags import flag_nocfg as _f

from .common import (
    GO_OPTIONS,
    STRING_ARRAY,
    client_config,
    fatal,
    run_main,
    start,
)

APP: Final = "nsq_tail"
log = logging.getLogger(APP)


@dataclass(slots=True)
class Options:
    """nsq_tail's flags (names as in Go)."""

    version: bool = False
    channel: str = ""
    max_in_flight: int = 200
    n: int = 0
    print_topic: bool = False
    nsqd_tcp_address: list[str] = field(default_factory=list)
    lookupd_http_address: list[str] = field(default_factory=list)
    topic: list[str] = field(default_factory=list)
    consumer_opt: list[str] = field(default_factory=list, repr=False)  # may hold auth_secret
    explicit: set[str] = field(default_factory=set, repr=False, compare=False)


FLAGS: Final = (
    _f("version", BOOL, "print version string"),
    _f("channel", STRING, "NSQ channel"),
    _f("max-in-flight", INT, "max number of messages to allow in flight"),
    _f("n", INT, "total messages to show (will wait if starved)"),
    _f("print-topic", BOOL, "print topic name where message was received"),
    _f("nsqd-tcp-address", STRING_ARRAY, "nsqd TCP address (may be given multiple times)"),
    _f("lookupd-http-address", STRING_ARRAY, "lookupd HTTP address (may be given multiple times)"),
    _f("topic", STRING_ARRAY, "NSQ topic (may be given multiple times)"),
    _f(
        "consumer-opt",
        GO_OPTIONS,
        "option to passthrough to nsq.Consumer (may be given multiple times, "
        "http://godoc.org/github.com/nsqio/go-nsq#Config)",
    ),
)
FLAGSET: Final = FlagSet(APP, FLAGS, Options)


def default_channel(rng: random.Random | None = None) -> str:
    """Go's ``fmt.Sprintf("tail%06d#ephemeral", rand.Int()%999999)``."""
    return f"tail{(rng or random.Random()).randrange(999999):06d}#ephemeral"


class Tail:
    """Writes messages to ``out`` and FINs them once written; stops after ``total`` (0: never)."""

    def __init__(self, out: BinaryIO, total: int, print_topic: bool) -> None:
        self.out = out
        self.total = total
        self.print_topic = print_topic
        self.shown = 0
        self.done = asyncio.Event()
        self.error: str | None = None
        self._unflushed: list[Message] = []
        self._flush_handle: asyncio.Handle | None = None

    async def pump(self, consumer: Consumer) -> None:
        """Print every message ``consumer`` yields until it closes."""
        prefix = consumer.topic.encode() + b" | " if self.print_topic else b""
        write = self.out.write
        loop = asyncio.get_running_loop()
        async for msg in consumer:
            if self.done.is_set():
                msg.requeue(0, backoff=False)
                continue
            try:
                if prefix:
                    write(prefix)
                write(msg.body)
                write(b"\n")
            except OSError as e:
                self._unflushed.append(msg)
                self._fail(e)
                continue
            self._unflushed.append(msg)
            self.shown += 1
            if self.total and self.shown >= self.total:
                self.flush()
                self.done.set()
            elif self._flush_handle is None:
                self._flush_handle = loop.call_soon(self.flush)

    def flush(self) -> None:
        """Flush stdout, then FIN what it carried."""
        self._flush_handle = None
        batch, self._unflushed = self._unflushed, []
        try:
            self.out.flush()
        except OSError as e:
            self._unflushed = batch
            self._fail(e)
            return
        for msg in batch:
            msg.finish()

    def close(self) -> None:
        """Flush (and FIN) what was written but not flushed yet."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        if self._unflushed:
            self.flush()

    def _fail(self, e: OSError) -> None:
        if self.error is None:
            self.error = f"ERROR: failed to write to os.Stdout - {e}"
        for msg in self._unflushed:
            msg.requeue(0, backoff=False)
        self._unflushed = []
        self.done.set()


async def wait_nsqd(consumer: Consumer, addresses: list[str], timeout: float) -> str | None:
    """Wait until ``consumer`` is subscribed on every nsqd of ``addresses``; else the error
    (Go's ``ConnectToNSQD`` fails at once when it cannot connect)."""
    try:
        await consumer.wait_connected(len(addresses), timeout)
    except (TimeoutError, NSQError):
        missing = [a for a in addresses if a not in consumer.connections]
        why = "; ".join(f"{a}: {consumer.errors[a]}" for a in missing if a in consumer.errors)
        return f"failed to connect to nsqd {', '.join(missing)} (topic {consumer.topic})" + (
            f" - {why}" if why else ""
        )
    return None


async def run(opts: Options, cfg: ConnectionConfig, out: BinaryIO) -> int:
    stop = stop_on_signals()
    tail = Tail(out, opts.n, opts.print_topic)
    consumers: list[Consumer] = []
    pumps: list[asyncio.Task[None]] = []
    code = 0
    try:
        for topic in opts.topic:
            log.info("Adding consumer for topic: %s", topic)
            c = Consumer(
                topic,
                opts.channel,
                nsqd_tcp_addresses=opts.nsqd_tcp_address,
                lookupd_http_addresses=opts.lookupd_http_address,
                config=cfg,
            )
            consumers.append(c)
            await c.start()
            pumps.append(asyncio.create_task(tail.pump(c), name=f"{APP}-{topic}"))
        if opts.nsqd_tcp_address:
            timeout = cfg.dial_timeout + 2.0
            errors = await asyncio.gather(*(wait_nsqd(c, opts.nsqd_tcp_address, timeout) for c in consumers))
            failed = [e for e in errors if e is not None]
            if failed:
                return fatal(failed[0])
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(tail.done.wait())]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
        if tail.error is not None:
            code = fatal(tail.error)
    except NSQError as e:
        return fatal(str(e))
    finally:
        tail.close()
        await asyncio.gather(*(c.close() for c in consumers), return_exceptions=True)
        for p in pumps:
            p.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    opts = start(FLAGSET, argv, APP)
    if isinstance(opts, int):
        return opts
    if not opts.channel:
        opts.channel = default_channel()
    if not opts.nsqd_tcp_address and not opts.lookupd_http_address:
        return fatal("--nsqd-tcp-address or --lookupd-http-address required")
    if opts.nsqd_tcp_address and opts.lookupd_http_address:
        return fatal("use --nsqd-tcp-address or --lookupd-http-address not both")
    if not opts.topic:
        return fatal("--topic required")
    # don't ask for more messages than we want
    max_in_flight = opts.max_in_flight
    if 0 < opts.n < max_in_flight:
        max_in_flight = opts.n
    try:
        cfg = client_config(APP, opts.consumer_opt, max_in_flight=max_in_flight)
    except ValueError as e:
        return fatal(str(e))
    out = sys.stdout.buffer
    code = run_main(run(opts, cfg, out))
    if code != 0:
        # stdout may be a closed pipe: don't let the interpreter's final flush fail again
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
