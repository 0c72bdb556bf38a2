"""``nsq_to_nsq``: consume topics and republish their messages to other nsqd, as NSQ 1.3's
``apps/nsq_to_nsq``.

One consumer per ``--topic`` on ``--channel``; each message goes to ``--destination-topic``
(by default the topic it came from) on one of the ``--destination-nsqd-tcp-address``, chosen
per message by ``--mode`` (:mod:`.hostpool`, shared with nsq_to_http): ``round-robin``
(Go's counter: the first message goes to the second address), ``hostpool`` (go-hostpool:
round robin over the hosts not marked dead by a failed publish; a dead host is retried after
30 s, doubling up to 15 min) or ``epsilon-greedy`` (go-hostpool's: mostly the hosts with the
best recent response times); an unknown mode is round robin, as in Go. The JSON flags are applied first
(:mod:`nsqpy.tools.jsonfilter`: Go's rules and Go's bytes). A message is FINished once its
destination acknowledged it; a failed publish REQueues it with backoff (go-nsq's
``Requeue(-1)``: ``default_requeue_delay`` × attempts); a message that is not a JSON object,
or filtered out, is FINished unpublished.

Beyond Go, the hot path is batch-shaped: the messages of one read are filtered, grouped by
destination and published as one MPUB per destination (several MPUBs in flight), then
FINished or requeued together; an MPUB that nsqd refuses for one message (too big) is redone
as one PUB per message, so only that message is requeued. ``--status-every N`` logs
timer_metrics' line (:mod:`.timer_metrics`: ``[aggregate]: finished N - 99th: …ms -
95th: …ms - avg: …ms``, and one per destination when there are several) after every N
publishes, each message timed from its MPUB's send to the answer. SIGINT/SIGTERM stop
consuming, wait for the publishes in flight, log a one-line summary and exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from nsqpy.client import BadMessageError, ConnectionConfig, Consumer, Message, NSQError, Producer
from nsqpy.client.errors import BadBodyError
from nsqpy.daemon import stop_on_signals
from nsqpy.goflags import BOOL, INT, STRING, FlagSet
from nsqpy.goflags import flag_nocfg as _f
from nsqpy.protocol.names import is_valid_channel_name, is_valid_topic_name

from .common import (
    GO_OPTIONS,
    STRING_ARRAY,
    client_config,
    fatal,
    run_main,
    start,
)
from .hostpool import EPSILON_GREEDY, HOSTPOOL, ROUND_ROBIN, HostPoolResponse, RoundRobin, new_selector
from .jsonfilter import DROP, INVALID, JSONFilter
from .nsq_tail import wait_nsqd
from .timer_metrics import TimerMetrics

APP: Final = "nsq_to_nsq"
log = logging.getLogger(APP)

#: One MPUB carries at most this many body bytes and messages (a bigger message goes alone).
BATCH_BYTES: Final = 256 * 1024
BATCH_COUNT: Final = 2000


@dataclass(slots=True)
class Options:
    """nsq_to_nsq's flags (names as in Go)."""

    version: bool = False
    channel: str = "nsq_to_nsq"
    destination_topic: str = ""
    max_in_flight: int = 200
    status_every: int = 250
    mode: str = "hostpool"
    nsqd_tcp_address: list[str] = field(default_factory=list)
    lookupd_http_address: list[str] = field(default_factory=list)
    destination_nsqd_tcp_address: list[str] = field(default_factory=list)
    whitelist_json_field: list[str] = field(default_factory=list)
    topic: list[str] = field(default_factory=list)
    require_json_field: str = ""
    require_json_value: str = ""
    consumer_opt: list[str] = field(default_factory=list, repr=False)  # may hold auth_secret
    producer_opt: list[str] = field(default_factory=list, repr=False)
    explicit: set[str] = field(default_factory=set, repr=False, compare=False)


_GODOC: Final = "see http://godoc.org/github.com/nsqio/go-nsq#Config"

FLAGS: Final = (
    _f("version", BOOL, "print version string"),
    _f("channel", STRING, "nsq channel"),
    _f(
        "destination-topic",
        STRING,
        "use this destination topic for all consumed topics (default is consumed topic name)",
    ),
    _f("max-in-flight", INT, "max number of messages to allow in flight"),
    _f("status-every", INT, "the # of requests between logging status (per destination), 0 disables"),
    _f("mode", STRING, "the upstream request mode options: round-robin, hostpool (default), epsilon-greedy"),
    _f("nsqd-tcp-address", STRING_ARRAY, "nsqd TCP address (may be given multiple times)"),
    _f(
        "destination-nsqd-tcp-address",
        STRING_ARRAY,
        "destination nsqd TCP address (may be given multiple times)",
    ),
    _f("lookupd-http-address", STRING_ARRAY, "lookupd HTTP address (may be given multiple times)"),
    _f("topic", STRING_ARRAY, "nsq topic (may be given multiple times)"),
    _f(
        "whitelist-json-field",
        STRING_ARRAY,
        "for JSON messages: pass this field (may be given multiple times)",
    ),
    _f("require-json-field", STRING, "for JSON messages: only pass messages that contain this field"),
    _f(
        "require-json-value",
        STRING,
        "for JSON messages: only pass messages in which the required field has this value",
    ),
    _f(
        "consumer-opt",
        GO_OPTIONS,
        f"option to passthrough to nsq.Consumer (may be given multiple times, {_GODOC})",
    ),
    _f(
        "producer-opt",
        GO_OPTIONS,
        f"option to passthrough to nsq.Producer (may be given multiple times, {_GODOC})",
    ),
)
FLAGSET: Final = FlagSet(APP, FLAGS, Options)


# --- timer_metrics, fed a batch at a time ------------------------------------------------


class BatchTimerMetrics(TimerMetrics):
    """timer_metrics (:mod:`.timer_metrics`, the same lines as nsq_to_http's) with
    :meth:`record`: ``n`` equal durations at once, exactly as ``n`` ``status_duration``
    calls, without a call per message."""

    __slots__ = ()

    def record(self, duration: float, n: int) -> None:
        every = self.status_every
        if every == 0:
            return
        t = self.timings
        while n > 0:
            pos = self.position
            if pos >= every:  # this one wraps the ring around: it logs
                self.status_duration(duration)
                n -= 1
                continue
            k = min(n, every - pos)
            t[pos : pos + k] = [duration] * k
            self.position = pos + k
            n -= k


# --- republishing -------------------------------------------------------------------------


class Counters:
    __slots__ = ("filtered", "invalid", "published", "received", "requeued")

    def __init__(self) -> None:
        self.received = self.published = self.filtered = self.invalid = self.requeued = 0


class Republisher:
    """Publishes batches of consumed messages to the destinations and answers them."""

    def __init__(
        self,
        opts: Options,
        producers: dict[str, Producer],
        connect_timeout: float,
        rng: random.Random | None = None,
    ) -> None:
        self.addresses = list(opts.destination_nsqd_tcp_address)
        self.producers = producers
        self.connect_timeout = connect_timeout
        self.filter = JSONFilter(opts.require_json_field, opts.require_json_value, opts.whitelist_json_field)
        # Go: any other --mode is round robin
        mode = opts.mode if opts.mode in (HOSTPOOL, EPSILON_GREEDY) else ROUND_ROBIN
        self.selector = new_selector(mode, self.addresses, rng=rng)
        self.marks = not isinstance(self.selector, RoundRobin)  # the pools learn from answers
        if len(self.addresses) == 1:  # one address: no per-address lines
            self.per_address = {self.addresses[0]: BatchTimerMetrics(0, "", log)}
        else:
            self.per_address = {
                a: BatchTimerMetrics(opts.status_every, f"[{a}]:", log) for a in self.addresses
            }
        self.aggregate = BatchTimerMetrics(opts.status_every, "[aggregate]:", log)
        self.counts = Counters()
        self.tasks: set[asyncio.Task[None]] = set()

    # --- the consumed side ------------------------------------------------------------------

    def reject(self, msg: Message, verdict: int) -> None:
        """A message the JSON rules do not pass."""
        c = self.counts
        if verdict == DROP:
            c.filtered += 1
            msg.finish()
        elif verdict == INVALID:
            c.invalid += 1
            log.error("Unable to decode json: %s", msg.body.decode("utf-8", "replace"))
            msg.finish()
        else:  # BACKOFF
            c.requeued += 1
            log.error("missing field to check required value")
            msg.requeue()

    def submit(self, topic: str, msgs: list[Message], bodies: list[bytes]) -> None:
        """Publish ``bodies`` (of ``msgs``) to ``topic``, each on the destination ``--mode``
        picks for it (one pick per message, as Go)."""
        addrs = self.addresses
        if len(addrs) == 1:
            self._spawn(addrs[0], topic, msgs, bodies, None)
            return
        groups: dict[str, tuple[list[Message], list[bytes], list[HostPoolResponse]]] = {}
        get = self.selector.get
        for msg, body in zip(msgs, bodies, strict=True):
            pick = get()
            g = groups.get(pick.host)
            if g is None:
                groups[pick.host] = g = ([], [], [])
            g[0].append(msg)
            g[1].append(body)
            g[2].append(pick)
        for addr, (m, b, picks) in groups.items():
            self._spawn(addr, topic, m, b, picks if self.marks else None)

    def _spawn(
        self,
        addr: str,
        topic: str,
        msgs: list[Message],
        bodies: list[bytes],
        picks: list[HostPoolResponse] | None,
    ) -> None:
        task = asyncio.ensure_future(self._publish(addr, topic, msgs, bodies, picks))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def drain(self) -> None:
        """Wait for every publish in flight to be answered."""
        while self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)

    # --- the publishing side ----------------------------------------------------------------

    async def _publish(
        self,
        addr: str,
        topic: str,
        msgs: list[Message],
        bodies: list[bytes],
        picks: list[HostPoolResponse] | None,
    ) -> None:
        producer = self.producers[addr]
        start = time.monotonic()
        try:
            if not producer.connected_addresses:
                # go-nsq dials on publish; a destination that is down fails it at once
                await producer.wait_connected(self.connect_timeout)
            await self._send(producer, addr, topic, bodies)
        except (BadMessageError, BadBodyError) as e:
            if len(bodies) == 1:
                self._answered(addr, topic, msgs, picks, start, e)
                return
            # MPUB is all or nothing: one PUB each, so only a refused message comes back
            log.warning(
                "%s refused an MPUB of %d messages (%s); publishing them one by one", addr, len(bodies), e
            )
            for i, (msg, body) in enumerate(zip(msgs, bodies, strict=True)):
                pick = None if picks is None else picks[i : i + 1]
                t0 = time.monotonic()
                try:
                    await self._send(producer, addr, topic, [body])
                except Exception as e1:  # noqa: BLE001 - any failure requeues the message
                    self._answered(addr, topic, [msg], pick, t0, e1)
                else:
                    self._answered(addr, topic, [msg], pick, t0, None)
        except Exception as e:  # noqa: BLE001 - any failure requeues the batch
            self._answered(addr, topic, msgs, picks, start, e)
        else:
            self._answered(addr, topic, msgs, picks, start, None)

    async def _send(self, producer: Producer, addr: str, topic: str, bodies: list[bytes]) -> None:
        """PUB or MPUB. nsqd closes the connection after refusing a message or a body
        (fatal errors): the next command waits for that connection to go, so that it is
        not written into one being closed (and lost to its reset)."""
        conn = producer.connections.get(addr)
        try:
            if len(bodies) == 1:
                await producer.publish(topic, bodies[0])
            else:
                await producer.publish_many(topic, bodies)
        except (BadMessageError, BadBodyError):
            if conn is not None and not conn.closed:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(conn.wait_closed(), self.connect_timeout)
            raise

    def _answered(
        self,
        addr: str,
        topic: str,
        msgs: list[Message],
        picks: list[HostPoolResponse] | None,
        start: float,
        err: BaseException | None,
    ) -> None:
        """FIN (or REQ with backoff, on ``err``) ``msgs``; tell the host pool; record their
        time since ``start`` (Go's responder)."""
        elapsed = time.monotonic() - start
        n = len(msgs)
        if err is None:
            self.counts.published += n
            for msg in msgs:
                msg.finish()
        else:
            self.counts.requeued += n
            log.error(
                "failed to publish %d message%s to %s (topic %s) - %s; requeued",
                n,
                "" if n == 1 else "s",
                addr,
                topic,
                err,
            )
            for msg in msgs:
                msg.requeue()
        if picks is not None:
            for pick in picks:
                pick.mark(err)
        self.per_address[addr].record(elapsed, n)
        self.aggregate.record(elapsed, n)


class Relay:
    """One ``--topic``: its consumer's messages, filtered and batched, to ``dest_topic``."""

    def __init__(self, pub: Republisher, consumer: Consumer, dest_topic: str) -> None:
        self.pub = pub
        self.consumer = consumer
        self.dest_topic = dest_topic
        self._msgs: list[Message] = []
        self._bodies: list[bytes] = []
        self._size = 0
        self._handle: asyncio.Handle | None = None

    async def pump(self) -> None:
        """Until the consumer closes; a batch goes out when full or when the read's
        messages are all taken (the next loop turn)."""
        pub = self.pub
        counts = pub.counts
        apply = pub.filter.apply if pub.filter.active else None
        loop = asyncio.get_running_loop()
        try:
            async for msg in self.consumer:
                counts.received += 1
                body = msg.body
                if apply is not None:
                    verdict, body = apply(body)
                    if verdict:
                        pub.reject(msg, verdict)
                        continue
                size = len(body)
                if self._size + size > BATCH_BYTES and self._msgs:
                    self.flush()  # full: a message bigger than a batch goes on its own
                self._msgs.append(msg)
                self._bodies.append(body)
                self._size += size
                if len(self._msgs) >= BATCH_COUNT:
                    self.flush()
                elif self._handle is None:
                    self._handle = loop.call_soon(self.flush)
        finally:
            self.flush()

    def flush(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        msgs, bodies = self._msgs, self._bodies
        if not msgs:
            return
        self._msgs, self._bodies, self._size = [], [], 0
        self.pub.submit(self.dest_topic, msgs, bodies)


async def run(opts: Options, ccfg: ConnectionConfig, pcfg: ConnectionConfig) -> int:
    stop = stop_on_signals()
    # one producer per distinct destination (they connect in the background; go-nsq's
    # connect on the first publish)
    producers = {
        a: Producer(a, config=pcfg, retries=0, reconnect_interval=0.25, max_reconnect_interval=2.0)
        for a in dict.fromkeys(opts.destination_nsqd_tcp_address)
    }
    pub = Republisher(opts, producers, connect_timeout=pcfg.dial_timeout + 0.5)
    consumers: list[Consumer] = []
    pumps: list[asyncio.Task[None]] = []
    code = 0
    try:
        for p in producers.values():
            await p.start()
        for topic in opts.topic:
            c = Consumer(
                topic,
                opts.channel,
                nsqd_tcp_addresses=opts.nsqd_tcp_address,
                lookupd_http_addresses=opts.lookupd_http_address,
                config=ccfg,
            )
            consumers.append(c)
            relay = Relay(pub, c, opts.destination_topic or topic)
            pumps.append(asyncio.create_task(relay.pump(), name=f"{APP}-{topic}"))
        if opts.nsqd_tcp_address:
            timeout = ccfg.dial_timeout + 2.0
            errors = await asyncio.gather(*(wait_nsqd(c, opts.nsqd_tcp_address, timeout) for c in consumers))
            failed = [e for e in errors if e is not None]
            if failed:
                code = fatal(failed[0])
                return code
        await stop.wait()
    except NSQError as e:
        code = fatal(str(e))
        return code
    finally:
        # stop consuming (messages not handed out yet go back), publish what was taken,
        # answer everything, then close
        closing = [asyncio.ensure_future(c.close()) for c in consumers]
        await asyncio.gather(*pumps, return_exceptions=True)
        await pub.drain()
        await asyncio.gather(*closing, return_exceptions=True)
        await pub.drain()
        await asyncio.gather(*(p.close() for p in producers.values()), return_exceptions=True)
        if code == 0:
            n = pub.counts
            given_up = sum(cons.stats().messages_given_up for cons in consumers)
            log.info(
                "%s: %d messages received, %d published, %d filtered out, %d not JSON, "
                "%d requeued, %d given up",
                APP,
                n.received,
                n.published,
                n.filtered,
                n.invalid,
                n.requeued,
                given_up,
            )
    return code


def main(argv: Sequence[str] | None = None) -> int:
    opts = start(FLAGSET, argv, APP)
    if isinstance(opts, int):
        return opts
    if not opts.topic or not opts.channel:
        return fatal("--topic and --channel are required")
    if not all(is_valid_topic_name(t) for t in opts.topic):
        return fatal("--topic is invalid")
    if opts.destination_topic and not is_valid_topic_name(opts.destination_topic):
        return fatal("--destination-topic is invalid")
    if not is_valid_channel_name(opts.channel):
        return fatal("--channel is invalid")
    if not opts.nsqd_tcp_address and not opts.lookupd_http_address:
        return fatal("--nsqd-tcp-address or --lookupd-http-address required")
    if opts.nsqd_tcp_address and opts.lookupd_http_address:
        return fatal("use --nsqd-tcp-address or --lookupd-http-address not both")
    if not opts.destination_nsqd_tcp_address:
        return fatal("--destination-nsqd-tcp-address required")
    try:
        pcfg = client_config(APP, opts.producer_opt)
    except ValueError as e:
        return fatal(f"failed creating producer {e}")
    try:
        ccfg = client_config(APP, opts.consumer_opt, max_in_flight=opts.max_in_flight)
    except ValueError as e:
        return fatal(str(e))
    return run_main(run(opts, ccfg, pcfg))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
