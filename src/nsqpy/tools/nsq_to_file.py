"""``nsq_to_file``: archive topics to files, as NSQ 1.3's ``apps/nsq_to_file``.

The same flags, ``--help`` text and defaults as Go's. One consumer and one
:class:`~nsqpy.tools.nsq_to_file_logger.FileLogger` per topic: the ``--topic`` list, or
(without it) every topic that nsqlookupd lists, asked every ``--topic-refresh``; either way
filtered by ``--topic-pattern`` (a regular expression searched in the name, like Go's
``regexp.MatchString``). File names, rotation, gzip members, sync and FIN follow Go's rules
(see the logger module). SIGHUP closes every file (the next message opens a new one);
SIGINT/SIGTERM sync, close and move every file, then exit 0 after a one-line summary.

Differences from Go, each where Go's behaviour loses data or hides an error:

* an I/O error (full disk, unwritable directory) is logged and the messages concerned are
  requeued (not FINished) while the tool keeps running, where Go exits 1 (see the logger);
* messages are never given up after ``max_attempts`` deliveries unless
  ``--consumer-opt=max_attempts,N`` is given (go-nsq's default of 5 would FIN a message
  that is delivered a 6th time without writing it);
* a ``--filename-format`` without ``<REV>`` where one is needed, or an invalid
  ``--topic-pattern``, is a fatal error at start, and so is ending up with no topic to log
  when the ``--topic`` list is fixed (Go logs one error per topic and idles forever);
* with ``--topic-pattern`` and no ``--topic``, nsqlookupd is asked at once, then every
  ``--topic-refresh`` (Go waits one interval first);
* ``--help`` says ``Usage of nsq_to_file:`` (Go's names its flag set ``nsqd``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import aiohttp

from nsqpy.client import ConnectionConfig, Consumer, NSQError
from nsqpy.client.http import ACCEPT_V1
from nsqpy.daemon import LEVELS, setup_logging, stop_on_signals
from nsqpy.goflags import BOOL, DURATION, INT, STRING, FlagSet
from nsqpy.goflags import flag_nocfg as _f

from .common import (
    GO_OPTIONS,
    STRING_ARRAY,
    client_config,
    fatal,
    parse_flags_known,
    run_main,
    version_line,
)
from .nsq_to_file_logger import FileLogger, FileOptions, compute_filename_format

APP: Final = "nsq_to_file"
log = logging.getLogger(APP)


@dataclass(slots=True)
class Options:
    """nsq_to_file's flags (Go's ``Options`` fields)."""

    version: bool = False
    log_level: str = "info"
    log_prefix: str = "[nsq_to_file] "
    channel: str = "nsq_to_file"
    max_in_flight: int = 200
    output_dir: str = "/tmp"
    work_dir: str = ""
    datetime_format: str = "%Y-%m-%d_%H"
    filename_format: str = "<TOPIC>.<HOST><REV>.<DATETIME>.log"
    host_identifier: str = ""
    gzip_level: int = 6
    gzip: bool = False
    skip_empty_files: bool = False
    topic_refresh: float = 60.0
    topic_pattern: str = ""
    rotate_size: int = 0
    rotate_interval: float = 0.0
    sync_interval: float = 30.0
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    nsqd_tcp_address: list[str] = field(default_factory=list)
    lookupd_http_address: list[str] = field(default_factory=list)
    topic: list[str] = field(default_factory=list)
    consumer_opt: list[str] = field(default_factory=list, repr=False)  # may hold auth_secret
    explicit: set[str] = field(default_factory=set, repr=False, compare=False)


#: Go's ``fs.Int64("rotate-size", 0, "… `rotate-size` bytes")``: the back-quoted word is the
#: value's name in ``-help``.
ROTATE_SIZE: Final = dataclasses.replace(INT, usage_type="rotate-size")

FLAGS: Final = (
    _f("version", BOOL, "print version string"),
    _f("log-level", STRING, "set log verbosity: debug, info, warn, error, or fatal"),
    _f("log-prefix", STRING, "log message prefix"),
    _f("channel", STRING, "nsq channel"),
    _f("max-in-flight", INT, "max number of messages to allow in flight"),
    _f("output-dir", STRING, "directory to write output files to"),
    _f("work-dir", STRING, "directory for in-progress files before moving to output-dir"),
    _f("datetime-format", STRING, "strftime compatible format for <DATETIME> in filename format"),
    _f(
        "filename-format",
        STRING,
        "output filename format (<TOPIC>, <HOST>, <PID>, <DATETIME>, <REV> are replaced. "
        "<REV> is increased when file already exists)",
    ),
    _f(
        "host-identifier",
        STRING,
        "value to output in log filename in place of hostname. <SHORT_HOST> and <HOSTNAME> "
        "are valid replacement tokens",
    ),
    _f("gzip-level", INT, "gzip compression level (1-9, 1=BestSpeed, 9=BestCompression)"),
    _f("gzip", BOOL, "gzip output files."),
    _f("skip-empty-files", BOOL, "skip writing empty files"),
    _f("topic-refresh", DURATION, "how frequently the topic list should be refreshed"),
    _f("topic-pattern", STRING, "only log topics matching the following pattern"),
    _f("rotate-size", ROTATE_SIZE, "rotate the file when it grows bigger than rotate-size bytes"),
    _f("rotate-interval", DURATION, "rotate the file every duration"),
    _f("sync-interval", DURATION, "sync file to disk every duration"),
    _f("http-client-connect-timeout", DURATION, "timeout for HTTP connect"),
    _f("http-client-request-timeout", DURATION, "timeout for HTTP request"),
    _f("nsqd-tcp-address", STRING_ARRAY, "nsqd TCP address (may be given multiple times)"),
    _f("lookupd-http-address", STRING_ARRAY, "lookupd HTTP address (may be given multiple times)"),
    _f("topic", STRING_ARRAY, "nsq topic (may be given multiple times)"),
    _f(
        "consumer-opt",
        GO_OPTIONS,
        "option to passthrough to nsq.Consumer (may be given multiple times, "
        "http://godoc.org/github.com/nsqio/go-nsq#Config)",
    ),
)
FLAGSET: Final = FlagSet(APP, FLAGS, Options)


def _explicit_max_attempts(items: Sequence[str]) -> bool:
    return any(i.partition(",")[0].strip().replace("-", "_") == "max_attempts" for i in items)


def file_options(opts: Options) -> FileOptions:
    return FileOptions(
        channel=opts.channel,
        output_dir=opts.output_dir,
        work_dir=opts.work_dir,
        datetime_format=opts.datetime_format,
        filename_format=opts.filename_format,
        host_identifier=opts.host_identifier,
        gzip=opts.gzip,
        gzip_level=opts.gzip_level,
        skip_empty_files=opts.skip_empty_files,
        rotate_size=opts.rotate_size,
        rotate_interval=opts.rotate_interval,
        max_in_flight=opts.max_in_flight,
    )


class TopicLogger:
    """A topic's consumer, its FileLogger, and the tasks and ticker between them."""

    def __init__(self, opts: Options, cfg: ConnectionConfig, topic: str) -> None:
        self.topic = topic
        self.opts = opts
        fopts = file_options(opts)
        max_attempts = None if _explicit_max_attempts(opts.consumer_opt) else 0
        self.consumer = Consumer(
            topic,
            opts.channel,
            nsqd_tcp_addresses=opts.nsqd_tcp_address,
            lookupd_http_addresses=opts.lookupd_http_address,
            config=cfg,
            max_attempts=max_attempts,
        )
        self.logger = FileLogger(fopts, topic, compute_filename_format(fopts, topic), self.consumer)
        self._tasks: list[asyncio.Task[None]] = []
        self._ticker: asyncio.TimerHandle | None = None
        self._next_tick = 0.0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await self.consumer.start()
        self._tasks = [
            asyncio.create_task(self._pump(), name=f"{APP}-pump-{self.topic}"),
            asyncio.create_task(self.logger.run(), name=f"{APP}-writer-{self.topic}"),
        ]
        self._next_tick = loop.time() + self.opts.sync_interval
        self._ticker = loop.call_at(self._next_tick, self._tick)

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        self.logger.tick()
        self._next_tick = max(self._next_tick + self.opts.sync_interval, loop.time())
        self._ticker = loop.call_at(self._next_tick, self._tick)

    async def _pump(self) -> None:
        put = self.logger.put
        async for msg in self.consumer:
            put(msg)

    async def wait_connected(self, addresses: list[str], timeout: float) -> str | None:
        """None once subscribed on every nsqd; else why not (Go's ``ConnectToNSQDs`` fails
        at once when it cannot connect)."""
        try:
            await self.consumer.wait_connected(len(addresses), timeout)
        except (TimeoutError, NSQError):
            missing = [a for a in addresses if a not in self.consumer.connections]
            errs = self.consumer.errors
            why = "; ".join(f"{a}: {errs[a]}" for a in missing if a in errs)
            return f"failed to connect to nsqd {', '.join(missing)}" + (f" - {why}" if why else "")
        return None

    async def stop(self) -> None:
        """Sync what is written, close the consumer (its held messages answered), then
        close and move the file."""
        if self._ticker is not None:
            self._ticker.cancel()
        self.logger.begin_stop()
        await self.consumer.close()
        pump, writer = self._tasks or (None, None)
        if pump is not None:
            await asyncio.gather(pump, return_exceptions=True)
        self.logger.finish()
        if writer is not None:
            await writer


class Discoverer:
    """Go's ``TopicDiscoverer``: one TopicLogger per allowed topic, new ones from nsqlookupd."""

    def __init__(self, opts: Options, cfg: ConnectionConfig, pattern: re.Pattern[str] | None) -> None:
        self.opts = opts
        self.cfg = cfg
        self.pattern = pattern
        self.topics: dict[str, TopicLogger] = {}
        self.failed = 0

    def allowed(self, topic: str) -> bool:
        return self.pattern is None or self.pattern.search(topic) is not None

    async def update(self, topics: Sequence[str]) -> None:
        new: list[TopicLogger] = []
        for topic in topics:
            if topic in self.topics or any(t.topic == topic for t in new):
                continue
            if not self.allowed(topic):
                log.debug("skipping topic %s (doesn't match pattern %s)", topic, self.opts.topic_pattern)
                continue
            try:
                new.append(TopicLogger(self.opts, self.cfg, topic))
            except (NSQError, ValueError) as e:
                self.failed += 1
                log.error("couldn't create logger for new topic %s: %s", topic, e)
        for t in new:
            await t.start()
        if self.opts.nsqd_tcp_address and new:
            timeout = self.cfg.dial_timeout + 2.0
            errors = await asyncio.gather(
                *(t.wait_connected(self.opts.nsqd_tcp_address, timeout) for t in new)
            )
            for t, err in zip(new, errors, strict=True):
                if err is not None:
                    self.failed += 1
                    log.error("couldn't create logger for new topic %s: %s", t.topic, err)
                    await t.stop()
            new = [t for t, err in zip(new, errors, strict=True) if err is None]
        for t in new:
            self.topics[t.topic] = t

    async def lookupd_topics(self, session: aiohttp.ClientSession) -> list[str]:
        """Go's ``GetLookupdTopics``: the sorted union of ``/topics`` of every nsqlookupd;
        an error if any of them failed."""
        addrs = self.opts.lookupd_http_address

        async def one(addr: str) -> list[str]:
            url = addr if "://" in addr else f"http://{addr}"
            async with session.get(url.rstrip("/") + "/topics", headers={"Accept": ACCEPT_V1}) as r:
                if r.status != 200:
                    raise RuntimeError(f"got response {r.status} {r.reason} from {url}/topics")
                doc = await r.json(content_type=None)
            if isinstance(doc, dict) and isinstance(doc.get("data"), dict):
                doc = doc["data"]
            topics = doc.get("topics") if isinstance(doc, dict) else None
            return [t for t in topics or [] if isinstance(t, str)]

        results = await asyncio.gather(*(one(a) for a in addrs), return_exceptions=True)
        errs = [f"{a}: {r}" for a, r in zip(addrs, results, strict=True) if isinstance(r, BaseException)]
        if errs:
            what = "any" if len(errs) == len(addrs) else "some"
            raise RuntimeError(f"Failed to query {what} nsqlookupd: {'; '.join(errs)}")
        found: set[str] = set()
        for r in results:
            assert isinstance(r, list)
            found.update(r)
        return sorted(found)

    async def watch(self, stop: asyncio.Event) -> None:
        """Refresh the topic list from nsqlookupd until ``stop``."""
        o = self.opts
        timeout = aiohttp.ClientTimeout(
            total=o.http_client_request_timeout, sock_connect=o.http_client_connect_timeout
        )
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not stop.is_set():
                try:
                    topics = await self.lookupd_topics(session)
                except Exception as e:  # noqa: BLE001 - logged, tried again next time
                    log.error("could not retrieve topic list: %s", e)
                else:
                    await self.update(topics)
                if o.topic_refresh <= 0:  # Go's time.Tick(0) never ticks
                    break
                try:
                    await asyncio.wait_for(stop.wait(), o.topic_refresh)
                except TimeoutError:
                    pass

    def hup(self) -> None:
        for t in self.topics.values():
            t.logger.hup()

    async def stop(self) -> None:
        await asyncio.gather(*(t.stop() for t in self.topics.values()))


async def run(opts: Options, cfg: ConnectionConfig, pattern: re.Pattern[str] | None) -> int:
    stop = stop_on_signals()
    loop = asyncio.get_running_loop()
    disc = Discoverer(opts, cfg, pattern)
    loop.add_signal_handler(signal.SIGHUP, disc.hup)
    watcher: asyncio.Task[None] | None = None
    code = 0
    try:
        await disc.update(opts.topic)
        if opts.topic:
            if not disc.topics:
                return fatal("no topic to log: every --topic failed (see above)")
        else:
            watcher = asyncio.create_task(disc.watch(stop), name=f"{APP}-discoverer")
        await stop.wait()
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        before = sum(t.logger.errors for t in disc.topics.values())
        await disc.stop()
        loggers = [t.logger for t in disc.topics.values()]
        errors = sum(lg.errors for lg in loggers)
        if errors > before:
            code = 1
        log.info(
            "exiting: %d topics, %d messages written, %d requeued, %d files written, %d rotations, %d errors",
            len(loggers),
            sum(lg.messages_written for lg in loggers),
            sum(lg.messages_requeued for lg in loggers),
            sum(lg.files_written for lg in loggers),
            sum(lg.rotations for lg in loggers),
            errors,
        )
        for lg in loggers:
            for path in lg.unfinished_files:
                log.warning("%s left unfinished: %s", lg.tag, path)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    parsed = parse_flags_known(FLAGSET, args)
    if isinstance(parsed, int):
        return parsed
    opts, rest = parsed
    if rest:
        setup_logging("", "info")
        return fatal(f"unknown arguments: [{' '.join(rest)}]")
    if opts.log_level.lower() not in LEVELS or opts.log_level.lower() == "warning":
        setup_logging("", "info")
        return fatal("--log-level is invalid")
    setup_logging(opts.log_prefix, opts.log_level)
    if opts.version:
        print(version_line(APP))
        return 0
    if opts.channel == "":
        return fatal("--channel is required")
    if opts.http_client_connect_timeout <= 0:
        return fatal("--http-client-connect-timeout should be positive")
    if opts.http_client_request_timeout <= 0:
        return fatal("--http-client-request-timeout should be positive")
    if not opts.nsqd_tcp_address and not opts.lookupd_http_address:
        return fatal("--nsqd-tcp-address or --lookupd-http-address required.")
    if opts.nsqd_tcp_address and opts.lookupd_http_address:
        return fatal("use --nsqd-tcp-address or --lookupd-http-address not both")
    if opts.gzip_level < 1 or opts.gzip_level > 9:
        return fatal(f"invalid --gzip-level value ({opts.gzip_level}), should be 1-9")
    if not opts.topic and not opts.topic_pattern:
        return fatal("--topic or --topic-pattern required")
    if not opts.topic and not opts.lookupd_http_address:
        return fatal("--lookupd-http-address must be specified when no --topic specified")
    if opts.work_dir == "":
        opts.work_dir = opts.output_dir
    if opts.sync_interval <= 0:  # Go's time.NewTicker panics
        return fatal("--sync-interval should be positive")
    try:
        compute_filename_format(file_options(opts), "topic")
    except ValueError as e:
        return fatal(str(e))
    pattern: re.Pattern[str] | None = None
    if opts.topic_pattern:
        try:
            pattern = re.compile(opts.topic_pattern)
        except re.error as e:
            return fatal(f"invalid --topic-pattern {opts.topic_pattern!r}: {e}")
    try:
        cfg = client_config(APP, opts.consumer_opt, max_in_flight=opts.max_in_flight)
    except ValueError as e:
        return fatal(str(e))
    return run_main(run(opts, cfg, pattern))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
