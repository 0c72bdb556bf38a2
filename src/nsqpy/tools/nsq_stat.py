"""``nsq_stat``: poll ``/stats`` of every nsqd that has a topic and print one channel's
aggregate numbers, as NSQ 1.3's ``apps/nsq_stat``.

The nsqd come from ``--lookupd-http-address`` (``/lookup``) or ``--nsqd-http-address``; their
channel stats are summed by :mod:`nsqpy.nsqadmin.clusterinfo` (Go's ``clusterinfo``, which
nsq_stat uses too). Every ``--interval`` one line: the ingress and egress rates (messages a
second since the previous poll, counted over the nominal interval as Go does: ingress from
``message_count``, egress from it less the change in ``depth``), the depths (total, memory,
disk, in flight, deferred) and the metadata (requeued, timed out, messages, clients). The
first poll only sets the baseline; the two header lines come first and then before every
25th poll. ``--count N`` stops after N lines (exit 0); any failed query, a partial one
included, ends it with exit 1 as Go's ``log.Fatalf``; SIGINT, SIGTERM and SIGHUP exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TextIO

from nsqpy.daemon import stop_on_signals
from nsqpy.goflags import BOOL, DURATION, STRING, FlagSet, Kind, NumError, parse_int
from nsqpy.goflags import flag_nocfg as _f
from nsqpy.nsqadmin.clusterinfo import ClusterInfo
from nsqpy.nsqadmin.httpclient import Client
from nsqpy.nsqadmin.types import ChannelStats

from .common import STRING_ARRAY, fatal, run_main, start

APP: Final = "nsq_stat"
log = logging.getLogger(APP)


def _parse_count(text: str, current: Any) -> int:
    """nsq_stat's ``numValue.Set``: ``strconv.ParseInt(s, 10, 32)``, its error as is."""
    value = parse_int(text, base0=False)
    if not -(1 << 31) <= value < 1 << 31:
        raise NumError("ParseInt", text, True)
    return value


#: ``--count``: a ``flag.Var`` whose value prints as "N" (so ``-help`` shows no default).
COUNT: Final = Kind("count", "value", _parse_count)


@dataclass(slots=True)
class Options:
    """nsq_stat's flags (names as in Go)."""

    version: bool = False
    topic: str = ""
    channel: str = ""
    interval: float = 2.0
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    count: int | None = None
    nsqd_http_address: list[str] = field(default_factory=list)
    lookupd_http_address: list[str] = field(default_factory=list)
    explicit: set[str] = field(default_factory=set, repr=False, compare=False)


FLAGS: Final = (
    _f("version", BOOL, "print version"),
    _f("topic", STRING, "NSQ topic"),
    _f("channel", STRING, "NSQ channel"),
    _f("interval", DURATION, "duration of time between polling/printing output"),
    _f("http-client-connect-timeout", DURATION, "timeout for HTTP connect"),
    _f("http-client-request-timeout", DURATION, "timeout for HTTP request"),
    _f("nsqd-http-address", STRING_ARRAY, "nsqd HTTP address (may be given multiple times)"),
    _f("lookupd-http-address", STRING_ARRAY, "lookupd HTTP address (may be given multiple times)"),
    _f("count", COUNT, "number of reports"),
)
FLAGSET: Final = FlagSet(APP, FLAGS, Options)

HEADER: Final = (
    "------rate------+----------------depth----------------+--------------metadata---------------\n"
    f"{'ingress':>7} {'egress':>7} | {'total':>7} {'mem':>7} {'disk':>7} {'inflt':>5} {'def':>5} | "
    f"{'req':>7} {'t-o':>7} {'msgs':>12} {'clients':>7}\n"
)


def report_line(prev: ChannelStats, cur: ChannelStats, interval: float) -> str:
    """One poll's line: rates since ``prev`` over the nominal ``interval`` (seconds)."""
    messages = cur.message_count - prev.message_count
    ingress = int(messages / interval)
    egress = int((messages - (cur.depth - prev.depth)) / interval)
    return (
        f"{ingress:7d} {egress:7d} | {cur.depth:7d} {cur.memory_depth:7d} "
        f"{cur.backend_depth:7d} {cur.in_flight_count:5d} {cur.deferred_count:5d} | "
        f"{cur.requeue_count:7d} {cur.timeout_count:7d} {cur.message_count:12d} "
        f"{cur.client_count:7d}\n"
    )


class Failure(Exception):
    """What Go's ``log.Fatalf`` would print."""


async def poll(ci: ClusterInfo, opts: Options) -> ChannelStats:
    """The channel's stats summed over every nsqd that has the topic."""
    if opts.lookupd_http_address:
        producers, err = await ci.get_lookupd_topic_producers(opts.topic, opts.lookupd_http_address)
    else:
        producers, err = await ci.get_nsqd_topic_producers(opts.topic, opts.nsqd_http_address)
    if err is not None:
        raise Failure(f"failed to get topic producers - {err}")
    _, channels, err = await ci.get_nsqd_stats(producers, opts.topic, opts.channel, include_clients=False)
    if err is not None:
        raise Failure(f"failed to get nsqd stats - {err}")
    c = (channels or {}).get(opts.channel)
    if c is None:
        raise Failure(f"failed to find channel({opts.channel}) in stats metadata for topic({opts.topic})")
    return c


async def stat_loop(opts: Options, out: TextIO) -> None:
    """Poll and print until ``--count`` lines were printed (forever without it)."""
    client = Client(None, opts.http_client_connect_timeout, opts.http_client_request_timeout)
    ci = ClusterInfo(client, log_level=logging.DEBUG)  # Go's nsq_stat gives clusterinfo no logger
    try:
        prev: ChannelStats | None = None
        i = 0
        while opts.count is None or i <= opts.count:
            cur = await poll(ci, opts)
            text = HEADER if i % 25 == 0 else ""
            if prev is not None:
                text += report_line(prev, cur, opts.interval)
            out.write(text)
            out.flush()
            prev = cur
            i += 1
            if opts.count is not None and i > opts.count:
                break  # (Go sleeps once more before it exits)
            await asyncio.sleep(opts.interval)
    finally:
        await client.close()


async def run(opts: Options, out: TextIO) -> int:
    stop = stop_on_signals()
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, stop.set)
    loop_task = asyncio.create_task(stat_loop(opts, out))
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait([loop_task, stopper], return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if not loop_task.done():
        loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop_task
        return 0
    try:
        loop_task.result()
    except Failure as e:
        return fatal(str(e))
    except OSError as e:
        return fatal(f"failed to write to os.Stdout - {e}")
    return 0


def _check_addrs(addrs: list[str]) -> str | None:
    if any(a.startswith("http") for a in addrs):
        return "address should not contain scheme"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    opts = start(FLAGSET, argv, APP)
    if isinstance(opts, int):
        return opts
    if not opts.topic or not opts.channel:
        return fatal("--topic and --channel are required")
    if opts.interval <= 0:
        return fatal("--interval should be positive")
    if opts.http_client_connect_timeout <= 0:
        return fatal("--http-client-connect-timeout should be positive")
    if opts.http_client_request_timeout <= 0:
        return fatal("--http-client-request-timeout should be positive")
    if opts.count is not None and opts.count <= 0:
        return fatal("--count should be positive")
    if not opts.nsqd_http_address and not opts.lookupd_http_address:
        return fatal("--nsqd-http-address or --lookupd-http-address required")
    if opts.nsqd_http_address and opts.lookupd_http_address:
        return fatal("use --nsqd-http-address or --lookupd-http-address not both")
    if (err := _check_addrs(opts.nsqd_http_address)) is not None:
        return fatal(f"--nsqd-http-address error - {err}")
    if (err := _check_addrs(opts.lookupd_http_address)) is not None:
        return fatal(f"--lookupd-http-address error - {err}")
    code = run_main(run(opts, sys.stdout))
    if code != 0:
        # stdout may be a closed pipe: don't let the interpreter's final flush fail again
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
