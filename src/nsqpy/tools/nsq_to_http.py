"""``nsq_to_http``: consume a topic/channel and make an HTTP request (GET or POST) per message.

As NSQ 1.3's ``apps/nsq_to_http``: ``-n`` handlers (100) each take a message and make its
request(s) (what the requests look like: :mod:`nsqpy.tools.nsq_to_http_client`); the
message is FINished when they succeed and requeued otherwise (a non-2xx POST, a non-200
GET, a timeout, a refused connection…) with go-nsq's ``Requeue(-1)``: a delay of
``default_requeue_delay`` × attempts (at most ``max_requeue_delay``) and backoff, and given
up (FINished, logged) past ``max_attempts``. ``--sample`` FINishes a share of the messages
without any request.

Several ``--post``/``--get`` destinations are used by ``--mode`` (:mod:`.hostpool`):
``hostpool`` (default), ``epsilon-greedy``, ``round-robin``; as in Go, any other mode value
sends every message to every destination in turn (the old ``multicast``). ``--status-every``
logs Go's timer_metrics lines (``[aggregate]:`` and, with several destinations, one per
destination); a one-line summary is logged on exit.

SIGINT/SIGTERM stop it cleanly: no new messages are taken (those received but not started
are requeued), the requests in flight are finished (up to 30 s, as go-nsq's ``Stop``) and
their messages FINished or requeued, then it exits 0. A second signal cuts that short: the
requests in flight are abandoned and their messages requeued at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from nsqpy.client import ConnectionConfig, Consumer, Message, NSQError
from nsqpy.daemon import stop_on_signals
from nsqpy.goflags import BOOL, DURATION, INT, STRING, FlagSet, FlagValueError, Kind, go_float_v
from nsqpy.goflags import flag_nocfg as _f
from nsqpy.govalues import NumError, parse_float

from .common import (
    GO_OPTIONS,
    STRING_ARRAY,
    client_config,
    fatal,
    run_main,
    start,
    version_line,
)
from .hostpool import EPSILON_GREEDY, HOSTPOOL, ROUND_ROBIN, Selector, new_selector
from .nsq_tail import wait_nsqd
from .nsq_to_http_client import HTTPClient, PublishError, go_sprintf, parse_custom_headers
from .timer_metrics import TimerMetrics

APP: Final = "nsq_to_http"
log = logging.getLogger(APP)

#: How long a stop waits for the requests in flight (go-nsq's Stop gives handlers 30 s).
DRAIN_TIMEOUT: Final = 30.0

#: The modes Go names; any other value is Go's ModeAll (every destination in turn).
MULTICAST: Final = "multicast"


def _parse_float_flag(text: str, current: Any) -> float:
    try:
        return parse_float(text)
    except NumError as e:
        raise FlagValueError(e.flag_reason) from None


#: Go's ``flag.Float64``.
FLOAT: Final = Kind("float", "float", _parse_float_flag, default_text=lambda v: go_float_v(v) if v else "")


@dataclass(slots=True)
class Options:
    """nsq_to_http's flags (names as in Go)."""

    version: bool = False
    topic: str = ""
    channel: str = "nsq_to_http"
    max_in_flight: int = 200
    n: int = 100
    mode: str = HOSTPOOL
    sample: float = 1.0
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 20.0
    status_every: int = 250
    content_type: str = "application/octet-stream"
    post: list[str] = field(default_factory=list)
    header: list[str] = field(default_factory=list, repr=False)  # may hold credentials
    get: list[str] = field(default_factory=list)
    nsqd_tcp_address: list[str] = field(default_factory=list)
    lookupd_http_address: list[str] = field(default_factory=list)
    consumer_opt: list[str] = field(default_factory=list, repr=False)  # may hold auth_secret
    explicit: set[str] = field(default_factory=set, repr=False, compare=False)


DEFAULT_CONTENT_TYPE: Final = Options().content_type

FLAGS: Final = (
    _f("version", BOOL, "print version string"),
    _f("topic", STRING, "nsq topic"),
    _f("channel", STRING, "nsq channel"),
    _f("max-in-flight", INT, "max number of messages to allow in flight"),
    _f("n", INT, "number of concurrent publishers"),
    _f("mode", STRING, "the upstream request mode options: round-robin, hostpool (default), epsilon-greedy"),
    _f("sample", FLOAT, "% of messages to publish (float b/w 0 -> 1)"),
    _f("http-client-connect-timeout", DURATION, "timeout for HTTP connect"),
    _f("http-client-request-timeout", DURATION, "timeout for HTTP request"),
    _f("status-every", INT, "the # of requests between logging status (per handler), 0 disables"),
    _f("content-type", STRING, "the Content-Type used for POST requests"),
    _f(
        "post",
        STRING_ARRAY,
        "HTTP address to make a POST request to.  data will be in the body (may be given multiple times)",
    ),
    _f("header", STRING_ARRAY, "Custom header for HTTP requests (may be given multiple times)"),
    _f(
        "get",
        STRING_ARRAY,
        "HTTP address to make a GET request to. '%s' will be printf replaced with data "
        "(may be given multiple times)",
    ),
    _f("nsqd-tcp-address", STRING_ARRAY, "nsqd TCP address (may be given multiple times)"),
    _f("lookupd-http-address", STRING_ARRAY, "lookupd HTTP address (may be given multiple times)"),
    _f(
        "consumer-opt",
        GO_OPTIONS,
        "option to passthrough to nsq.Consumer (may be given multiple times, "
        "http://godoc.org/github.com/nsqio/go-nsq#Config)",
    ),
)
FLAGSET: Final = FlagSet(APP, FLAGS, Options)


class PublishHandler:
    """Go's ``PublishHandler``: the request(s) for one message, by mode, with the timings."""

    def __init__(
        self,
        client: HTTPClient,
        method: str,
        addresses: list[str],
        mode: str,
        sample: float,
        status_every: int,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.publish = client.post if method == "POST" else client.get
        self.addresses = addresses
        self.mode = mode
        self.sample = sample
        self.rng = rng or random.Random()
        self.selector: Selector | None = (
            new_selector(mode, addresses, rng=self.rng) if mode != MULTICAST else None
        )
        # Go: one address: its metrics are off; several: one line per address
        if len(addresses) == 1:
            self.per_address = {addresses[0]: TimerMetrics(0, "", log)}
        else:
            self.per_address = {a: TimerMetrics(status_every, f"[{a}]:", log) for a in addresses}
        self.aggregate = TimerMetrics(status_every, "[aggregate]:", log)
        # counters for the summary
        self.handled = self.published = self.sampled_out = self.failed = 0
        self.requests_ok = self.requests_failed = 0

    async def work(self, consumer: Consumer) -> None:
        """One of Go's concurrent handlers."""
        async for msg in consumer:
            await self.handle(msg)

    async def handle(self, msg: Message) -> None:
        self.handled += 1
        if self.sample < 1.0 and self.rng.random() > self.sample:
            self.sampled_out += 1
            msg.finish()
            return
        try:
            await self.dispatch(msg.body)
        except PublishError as e:
            self.failed += 1
            log.error("Handler returned error (%s) for msg %s", e, msg.id.decode())
            msg.requeue()  # go-nsq's Requeue(-1): default_requeue_delay × attempts, with backoff
        except asyncio.CancelledError:
            msg.requeue(0, backoff=False)  # abandoned by a second signal
            raise
        else:
            self.published += 1
            msg.finish()

    async def _one(self, addr: str, body: bytes) -> None:
        try:
            await self.publish(addr, body)
        except PublishError:
            self.requests_failed += 1
            raise
        self.requests_ok += 1

    async def dispatch(self, body: bytes) -> None:
        now = time.perf_counter  # the loop's clock may count whole milliseconds (uvloop)
        start = now()
        if self.selector is None:  # Go's ModeAll: each address in turn, the first error ends it
            for addr in self.addresses:
                st = now()
                await self._one(addr, body)
                self.per_address[addr].status(st, now())
        else:
            pick = self.selector.get()
            addr = pick.host
            try:
                await self._one(addr, body)
            except PublishError as e:
                pick.mark(e)
                raise
            pick.mark(None)
            self.per_address[addr].status(start, now())
        self.aggregate.status(start, now())

    def summary(self, given_up: int) -> str:
        return (
            f"summary: messages: {self.handled} handled, {self.published} published, "
            f"{self.sampled_out} skipped by --sample, {self.failed} requeued after a failed request, "
            f"{given_up} given up after max_attempts; requests: {self.requests_ok} OK, "
            f"{self.requests_failed} failed"
        )


async def run(
    opts: Options, cfg: ConnectionConfig, method: str, addresses: list[str], headers: dict[str, str]
) -> int:
    stop = stop_on_signals()
    loop = asyncio.get_running_loop()
    client = HTTPClient(
        user_agent=version_line(APP),
        content_type=opts.content_type,
        custom_headers=headers,
        connect_timeout=opts.http_client_connect_timeout,
        request_timeout=opts.http_client_request_timeout,
    )
    handler = PublishHandler(client, method, addresses, opts.mode, opts.sample, opts.status_every)
    consumer: Consumer | None = None
    workers: list[asyncio.Task[None]] = []
    try:
        consumer = Consumer(
            opts.topic,
            opts.channel,
            nsqd_tcp_addresses=opts.nsqd_tcp_address,
            lookupd_http_addresses=opts.lookupd_http_address,
            config=cfg,
            drain_timeout=DRAIN_TIMEOUT,
        )
        if opts.n <= 0:
            return fatal("no handlers")  # go-nsq's ConnectToNSQD(s) without a handler
        workers = [
            asyncio.create_task(handler.work(consumer), name=f"{APP}-handler-{i}") for i in range(opts.n)
        ]
        await consumer.start()
        if opts.nsqd_tcp_address:
            err = await wait_nsqd(consumer, opts.nsqd_tcp_address, cfg.dial_timeout + 2.0)
            if err is not None:
                return fatal(err)
        await stop.wait()
        log.info("stopping: waiting for the requests in flight")
        # a second signal: stop waiting for them
        abort = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, abort.set)
        closing = asyncio.create_task(consumer.close())
        aborted = asyncio.create_task(abort.wait())
        await asyncio.wait([closing, aborted], return_when=asyncio.FIRST_COMPLETED)
        if abort.is_set() and not closing.done():
            log.info("stopping now: requeueing the messages whose requests are in flight")
            for w in workers:
                w.cancel()
        aborted.cancel()
        await closing
        log.info("%s", handler.summary(consumer.stats().messages_given_up))
        return 0
    except (NSQError, ValueError) as e:
        return fatal(str(e))
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if consumer is not None:
            await consumer.close(drain_timeout=0)
        await client.close()


def main(argv: Sequence[str] | None = None) -> int:
    opts = start(FLAGSET, argv, APP)
    if isinstance(opts, int):
        return opts
    headers: dict[str, str] = {}
    if opts.header:
        try:
            headers = parse_custom_headers(opts.header)
        except ValueError:
            return fatal("--header value format should be 'key=value'")
    if not opts.topic or not opts.channel:
        return fatal("--topic and --channel are required")
    if opts.content_type != DEFAULT_CONTENT_TYPE:
        if not opts.post:
            return fatal("--content-type only used with --post")
        if not opts.content_type:
            return fatal("--content-type requires a value when used")
    if not opts.nsqd_tcp_address and not opts.lookupd_http_address:
        return fatal("--nsqd-tcp-address or --lookupd-http-address required")
    if opts.nsqd_tcp_address and opts.lookupd_http_address:
        return fatal("use --nsqd-tcp-address or --lookupd-http-address not both")
    if not opts.get and not opts.post:
        return fatal("--get or --post required")
    if opts.get and opts.post:
        return fatal("use --get or --post not both")
    if any(g.count("%s") != 1 for g in opts.get):
        return fatal("invalid GET address - must be a printf string")
    if opts.mode not in (ROUND_ROBIN, HOSTPOOL, EPSILON_GREEDY):
        opts.mode = MULTICAST  # Go's ModeAll, the zero value its mode switch leaves
    if opts.sample > 1.0 or opts.sample < 0.0:  # as Go's test (NaN passes, and samples nothing out)
        return fatal("ERROR: --sample must be between 0.0 and 1.0")
    for g in opts.get:
        if "%" in re.sub("%[s%]", "", g):  # Go formats it all the same; say what it makes
            log.warning(
                "--get %s: a %% other than %%s or %%%% is a printf verb, as in Go: the URL becomes %s",
                g,
                go_sprintf(g, "<MESSAGE>"),
            )
    method, addresses = ("POST", opts.post) if opts.post else ("GET", opts.get)
    try:
        cfg = client_config(APP, opts.consumer_opt, max_in_flight=opts.max_in_flight)
    except ValueError as e:
        return fatal(str(e))
    return run_main(run(opts, cfg, method, addresses, headers))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
