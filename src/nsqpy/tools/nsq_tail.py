"""``nsq_tail``: print the messages of one or more topics to stdout, like ``tail -f``.

As NSQ 1.3's ``apps/nsq_tail``: one consumer per ``--topic`` on a shared channel (by default
``tail<6 digits>#ephemeral``, so it vanishes when nsq_tail leaves); each message body is
written followed by ``\\n`` (``<topic> | `` before it with ``--print-topic``); ``-n N``
exits 0 after N messages; logs go to stderr; SIGINT/SIGTERM stop it cleanly (exit 0).

``--peek N`` (an nsqpy addition) prints the next N messages of ``--channel`` without
consuming them, then exits: it asks each nsqd's ``GET /channel/peek`` (nsqpy's nsqd only; a
Go nsqd has no such endpoint), node by node, N at most in all. The nsqd come from
``--nsqd-http-address`` or from ``--lookupd-http-address`` (the producers' HTTP ports in
``/lookup``); ``--admin-token`` (or ``$NSQ_ADMIN_TOKEN``) is sent as ``Authorization: Bearer``
for an nsqd started with ``--admin-token-file``.

A message is FINished only once its line has been written to stdout (the output is flushed
once per burst of messages, then the burst is FINished). ``-n`` counts messages over all
topics; messages that arrive past the N-th are requeued, not printed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Final

import aiohttp

from nsqpy.client import ConnectionConfig, Consumer, Message, NSQError
from nsqpy.daemon import stop_on_signals
from nsqpy.goflags import BOOL, INT, STRING, FlagSet
from nsqpy.goflags import flag_nocfg as _f
from nsqpy.protocol.discovery import lookup_headers, lookup_url, producers
from nsqpy.protocol.names import is_valid_channel_name, is_valid_topic_name

from .common import (
    GO_OPTIONS,
    STRING_ARRAY,
    client_config,
    fatal,
    run_main,
    start,
)

APP: Final = "nsq_tail"
#: the most messages ``--peek`` may ask for (nsqd's limit per request)
MAX_PEEK: Final = 1000
#: where ``--admin-token`` comes from when the flag is not given
ADMIN_TOKEN_ENV: Final = "NSQ_ADMIN_TOKEN"
#: total time for one HTTP request of ``--peek`` (lookupd or nsqd)
PEEK_HTTP_TIMEOUT: Final = 30.0
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
    peek: int = 0
    nsqd_http_address: list[str] = field(default_factory=list)
    admin_token: str = field(default="", repr=False)
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
    _f(
        "peek",
        INT,
        "print the next N queued messages of --channel without consuming them, then exit "
        f"(1-{MAX_PEEK}; nsqpy's nsqd only: GET /channel/peek)",
    ),
    _f(
        "nsqd-http-address",
        STRING_ARRAY,
        "with --peek: nsqd HTTP address (may be given multiple times)",
    ),
    _f(
        "admin-token",
        STRING,
        "with --peek: token sent as Authorization: Bearer, for an nsqd with --admin-token-file "
        f"(default ${ADMIN_TOKEN_ENV})",
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


# --- --peek ----------------------------------------------------------------------------------


class PeekError(Exception):
    """``--peek`` cannot go on (the text says why)."""


def _http_base(address: str) -> str:
    """``host:port`` → ``http://host:port``; a URL keeps its scheme (``https://…``)."""
    return address.rstrip("/") if "://" in address else "http://" + address


def _error_text(body: bytes) -> str:
    """The ``message`` of an NSQ JSON error, else the body's text."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict) and doc.get("message"):
        return str(doc["message"])
    return body.decode("utf-8", "replace").strip()[:200]


async def peek_nodes(
    session: aiohttp.ClientSession, opts: Options, cfg: ConnectionConfig, topic: str
) -> list[str]:
    """The HTTP addresses of the nsqd to ask about ``topic``: ``--nsqd-http-address`` as
    given, or the producers of ``topic`` every lookupd lists (their ``http_port``), in the
    order the lookupd list them, each once."""
    if opts.nsqd_http_address:
        return list(dict.fromkeys(opts.nsqd_http_address))  # each once, in the order given
    # the header the consumers send to nsqlookupd (go-nsq's auth secret, when configured)
    headers = lookup_headers(cfg.auth_secret if cfg.skip_lookupd_authorization else None)
    found: list[str] = []
    errors: list[str] = []
    for addr in opts.lookupd_http_address:
        try:
            async with session.get(lookup_url(addr, topic), headers=headers) as resp:
                body = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as e:
            errors.append(f"lookupd {addr}: query failed - {e or type(e).__name__}")
            continue
        if status == 404:  # TOPIC_NOT_FOUND: no producer of the topic
            continue
        try:
            if status != 200:
                raise ValueError(f"{status} {_error_text(body)}")
            doc = json.loads(body)
        except (ValueError, RecursionError) as e:
            errors.append(f"lookupd {addr}: bad /lookup answer - {e}")
            continue
        for p in producers(doc):
            if not p.http:
                log.warning("lookupd %s lists nsqd %s without an HTTP port: skipped", addr, p.tcp)
            elif p.http not in found:
                found.append(p.http)
    if errors:
        if len(errors) == len(opts.lookupd_http_address):
            raise PeekError(errors[0])
        for err in errors:
            log.warning("%s", err)
    return found


async def peek_node(
    session: aiohttp.ClientSession, address: str, topic: str, channel: str, n: int, token: str
) -> dict[str, Any] | None:
    """nsqd's ``GET /channel/peek`` answer (None when it has not that topic or channel).
    Raises :class:`PeekError` for any other refusal: a Go nsqd's 404, the admin token."""
    headers = {"Accept": "application/vnd.nsq; version=1.0"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = _http_base(address) + "/channel/peek"
    params = {"topic": topic, "channel": channel, "n": str(n)}
    try:
        async with session.get(url, params=params, headers=headers) as resp:
            body = await resp.read()
            status = resp.status
    except (aiohttp.ClientError, TimeoutError) as e:
        raise PeekError(f"nsqd {address}: GET /channel/peek failed - {e or type(e).__name__}") from None
    text = "" if status == 200 else _error_text(body)
    if status == 404 and text in ("TOPIC_NOT_FOUND", "CHANNEL_NOT_FOUND"):
        return None
    if status == 404:
        raise PeekError(f"nsqd {address}: this nsqd has no peek (not nsqpy?) - 404 {text}")
    if status == 401:
        raise PeekError(
            f"nsqd {address}: 401 {text} - peek needs this nsqd's admin token "
            f"(--admin-token or ${ADMIN_TOKEN_ENV})"
        )
    if status == 403:
        why = "the admin token was refused" if token else "this nsqd shows no message bodies without a token"
        raise PeekError(f"nsqd {address}: 403 {text} - {why}")
    if status != 200:
        raise PeekError(f"nsqd {address}: GET /channel/peek answered {status} {text}")
    try:
        doc = json.loads(body)
        if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
            raise ValueError("no messages list")
    except (ValueError, RecursionError) as e:
        raise PeekError(f"nsqd {address}: bad /channel/peek answer - {e}") from None
    return doc


async def run_peek(opts: Options, cfg: ConnectionConfig, out: BinaryIO) -> int:
    """Print up to ``--peek`` queued messages of ``--channel``, topic by topic, node by node;
    nothing is consumed."""
    left = opts.peek
    timeout = aiohttp.ClientTimeout(total=PEEK_HTTP_TIMEOUT, connect=cfg.dial_timeout)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for topic in opts.topic:
                if left <= 0:
                    break
                nodes = await peek_nodes(session, opts, cfg, topic)
                if not nodes:
                    where = ", ".join(opts.lookupd_http_address)
                    raise PeekError(f"no nsqd has topic {topic} (lookupd {where})")
                prefix = topic.encode() + b" | " if opts.print_topic else b""
                seen = False
                for node in nodes:
                    if left <= 0:
                        break
                    doc = await peek_node(session, node, topic, opts.channel, left, opts.admin_token)
                    if doc is None:
                        log.info("nsqd %s: no channel %s of topic %s", node, opts.channel, topic)
                        continue
                    seen = True
                    msgs = doc["messages"][:left]
                    log.info(
                        "nsqd %s: topic %s channel %s: %d of depth %s (deferred %s, in flight %s)",
                        node,
                        topic,
                        opts.channel,
                        len(msgs),
                        doc.get("depth"),
                        doc.get("deferred_count"),
                        doc.get("in_flight_count"),
                    )
                    try:
                        bodies = [base64.b64decode(m["body_base64"], validate=True) for m in msgs]
                    except (KeyError, TypeError, ValueError) as e:
                        raise PeekError(f"nsqd {node}: bad message in /channel/peek answer - {e}") from None
                    try:
                        for body in bodies:
                            out.write(prefix + body + b"\n")
                    except OSError as e:
                        return fatal(f"ERROR: failed to write to os.Stdout - {e}")
                    left -= len(bodies)
                if not seen:
                    raise PeekError(
                        f"channel {opts.channel} of topic {topic} not found on nsqd {', '.join(nodes)}"
                    )
        try:
            out.flush()
        except OSError as e:
            return fatal(f"ERROR: failed to write to os.Stdout - {e}")
    except PeekError as e:
        with contextlib.suppress(OSError):
            out.flush()  # what was printed before stays printed
        return fatal(str(e))
    return 0


def check_peek(opts: Options) -> str | None:
    """What is wrong with a ``--peek`` command line, if anything."""
    if not 1 <= opts.peek <= MAX_PEEK:
        return f"--peek must be between 1 and {MAX_PEEK} (got {opts.peek})"
    if not opts.channel:
        return "--channel required with --peek (the channel whose messages to show)"
    if not opts.topic:
        return "--topic required"
    if opts.n:
        return "use --peek or -n not both"
    if opts.nsqd_tcp_address:
        return (
            "--peek asks nsqd's HTTP API: use --nsqd-http-address or --lookupd-http-address, "
            "not --nsqd-tcp-address"
        )
    if not opts.nsqd_http_address and not opts.lookupd_http_address:
        return "--nsqd-http-address or --lookupd-http-address required"
    if opts.nsqd_http_address and opts.lookupd_http_address:
        return "use --nsqd-http-address or --lookupd-http-address not both"
    for topic in opts.topic:
        if not is_valid_topic_name(topic):
            return f"invalid topic name {topic!r}"
    if not is_valid_channel_name(opts.channel):
        return f"invalid channel name {opts.channel!r}"
    return None


def main_peek(opts: Options) -> int:
    """``nsq_tail --peek N``."""
    error = check_peek(opts)
    if error is not None:
        return fatal(error)
    if "admin_token" not in opts.explicit:
        opts.admin_token = os.environ.get(ADMIN_TOKEN_ENV, "")
    try:
        cfg = client_config(APP, opts.consumer_opt)
    except ValueError as e:
        return fatal(str(e))
    out = sys.stdout.buffer
    code = run_main(run_peek(opts, cfg, out))
    if code != 0:
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
    return code


def main(argv: Sequence[str] | None = None) -> int:
    opts = start(FLAGSET, argv, APP)
    if isinstance(opts, int):
        return opts
    if "peek" in opts.explicit:
        return main_peek(opts)
    if opts.nsqd_http_address:
        return fatal("--nsqd-http-address is for --peek (consumers use --nsqd-tcp-address)")
    if "admin_token" in opts.explicit:
        return fatal("--admin-token is for --peek")
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
