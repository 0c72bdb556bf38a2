"""Push nsqd's stats to statsd over UDP, as NSQ 1.3.0's ``nsqd/statsd.go``.

Every ``--statsd-interval`` the loop reads the same stats as ``/stats`` (without clients)
and sends, for each topic (sorted by name; ``#ephemeral`` ones skipped with
``--statsd-exclude-ephemeral``), with ``<prefix>`` from ``--statsd-prefix``:

- ``<prefix>topic.<T>.message_count`` and ``.message_bytes``: counters (``|c``) carrying the
  increase since the previous push (a topic deleted and recreated gives a negative delta,
  as Go's unsigned subtraction cast to int64 does);
- ``<prefix>topic.<T>.depth`` and ``.backend_depth``: gauges (``|g``);
- ``<prefix>topic.<T>.e2e_processing_latency_<P>`` (P = quantile × 100, ``%.0f``): gauges in
  nanoseconds, with ``--e2e-processing-latency-percentile`` only;
- per channel: ``<prefix>topic.<T>.channel.<C>.message_count`` (c), ``.depth``,
  ``.backend_depth``, ``.in_flight_count``, ``.deferred_count`` (g), ``.requeue_count``,
  ``.timeout_count`` (c), ``.clients`` (g) and its ``e2e_processing_latency_<P>`` gauges;
- with ``--statsd-mem-stats`` (default): ``<prefix>mem.heap_objects``, ``mem.heap_idle_bytes``,
  ``mem.heap_in_use_bytes``, ``mem.heap_released_bytes``, ``mem.gc_pause_usec_100``,
  ``mem.gc_pause_usec_99``, ``mem.gc_pause_usec_95``, ``mem.next_gc_bytes`` (g) and
  ``mem.gc_runs`` (c). Go reads them from ``runtime.MemStats``; the Python values are those of
  ``/stats``' ``memory`` block (:func:`nsqpy.nsqd.stats.mem_stats`): ``heap_objects`` = live
  pymalloc blocks (``sys.getallocatedblocks()``), ``heap_in_use_bytes`` = the process RSS,
  ``gc_pause_usec_*`` = percentiles of the last 256 cyclic-GC pauses (timed by a
  ``gc.callbacks`` hook), ``gc_runs`` = collections of all generations since the previous
  push (``gc.get_stats()``); ``heap_idle_bytes``, ``heap_released_bytes`` and
  ``next_gc_bytes`` have no CPython equivalent (CPython neither keeps idle heap spans nor
  collects by heap size) and are 0.

Lines are ``<key>:<value>|<type>\\n`` (Go's ``internal/statsd`` client) packed into datagrams
of at most ``--statsd-udp-packet-size`` bytes (whole lines only; a line longer than that goes
alone), Go's ``BoundaryBufferedWriter``. As Go's ``SpreadWriter``, the datagrams of one push
are spread evenly over ``interval - 1s``; with an interval of 1s or less they all go at once
(Go's nsqd panics there: ``time.NewTicker`` of a non-positive duration). A new UDP socket is
used for each push, send errors (no one listening) are ignored, and stopping the daemon
sends what is left of the current push at once, then ends the loop.

The prefix: ``%s`` in ``--statsd-prefix`` becomes ``<broadcast address>:<broadcast HTTP
port>`` (``net.JoinHostPort``, so ``[host]:port`` for IPv6) with ``.`` and ``:`` turned into
``_``, and a ``.`` is appended unless it ends with one; the default ``nsq.%s`` gives
``nsq.<host>_<port>.``. An empty prefix stays empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..protocol.address import format_address
from ..protocol.names import is_ephemeral
from .stats import get_stats, install_gc_tracker, mem_stats

if TYPE_CHECKING:
    from .nsqd import NSQD

__all__ = ["StatsdLoop", "host_key", "pack_lines", "statsd_lines", "statsd_prefix"]

log = logging.getLogger("nsqd")

#: bufio's default size, which Go uses for a packet size <= 0.
_DEFAULT_PACKET_SIZE = 4096

#: ``mem.*`` gauges in Go's order, with the ``memStats`` field each one reads.
_MEM_GAUGES = (
    ("mem.heap_objects", "heap_objects"),
    ("mem.heap_idle_bytes", "heap_idle_bytes"),
    ("mem.heap_in_use_bytes", "heap_in_use_bytes"),
    ("mem.heap_released_bytes", "heap_released_bytes"),
    ("mem.gc_pause_usec_100", "gc_pause_usec_100"),
    ("mem.gc_pause_usec_99", "gc_pause_usec_99"),
    ("mem.gc_pause_usec_95", "gc_pause_usec_95"),
    ("mem.next_gc_bytes", "next_gc_bytes"),
)


def host_key(h: str) -> str:
    """Go's ``statsd.HostKey``: ``.`` and ``:`` become ``_``."""
    return h.replace(".", "_").replace(":", "_")


def statsd_prefix(template: str, broadcast_address: str, broadcast_http_port: int) -> str:
    """The key prefix Go's ``nsqd.New`` derives from ``--statsd-prefix``."""
    if not template:
        return ""
    prefix = template.replace("%s", host_key(format_address(broadcast_address, broadcast_http_port)))
    if not prefix.endswith("."):
        prefix += "."
    return prefix


def _e2e_key(quantile: float) -> str:
    return f"e2e_processing_latency_{quantile * 100.0:.0f}"


@dataclass
class _Last:
    """What the previous push saw of a topic (for the counters' deltas)."""

    message_count: int = 0
    message_bytes: int = 0
    #: channel name -> (message_count, requeue_count, timeout_count)
    channels: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    #: queue policies' counters ("" for the topic, else the channel's name)
    policy: dict[str, tuple[int, int, int]] = field(default_factory=dict)


_POLICY_COUNTERS = ("expired_count", "dropped_count", "dead_letter_count")


def _policy_counts(s: dict[str, Any]) -> tuple[int, int, int]:
    return (s["expired_count"], s["dropped_count"], s.get("dead_letter_count", 0))


def _add_policy(add: Any, p: str, s: dict[str, Any], last: tuple[int, int, int]) -> None:
    """A queue's policy counters (only where /stats has them: an nsqpy addition)."""
    for key, value, before in zip(_POLICY_COUNTERS, _policy_counts(s), last, strict=True):
        if key in s:
            add(f"{p}{key}:{value - before}|c\n")


def statsd_lines(
    prefix: str,
    topics: list[dict[str, Any]],
    last: dict[str, _Last],
    mem: dict[str, int] | None,
    last_gc_runs: int,
    exclude_ephemeral: bool = False,
) -> tuple[list[bytes], dict[str, _Last]]:
    """One push's lines, in Go's order, from ``/stats`` topic dicts (``get_stats``) and the
    previous push's counters; returns them with the counters to remember."""
    out: list[str] = []
    add = out.append
    now: dict[str, _Last] = {}
    for t in topics:
        name = t["topic_name"]
        seen = _Last(
            t["message_count"],
            t["message_bytes"],
            {
                c["channel_name"]: (c["message_count"], c["requeue_count"], c["timeout_count"])
                for c in t["channels"]
            },
            {
                ("" if s is t else s["channel_name"]): _policy_counts(s)
                for s in (t, *t["channels"])
                if "expired_count" in s
            },
        )
        now[name] = seen  # Go remembers every topic, excluded or not
        if exclude_ephemeral and is_ephemeral(name):
            continue
        lt = last.get(name) or _Last()
        tp = f"{prefix}topic.{name}."
        add(f"{tp}message_count:{t['message_count'] - lt.message_count}|c\n")
        add(f"{tp}message_bytes:{t['message_bytes'] - lt.message_bytes}|c\n")
        add(f"{tp}depth:{t['depth']}|g\n")
        add(f"{tp}backend_depth:{t['backend_depth']}|g\n")
        if "expired_count" in t:
            _add_policy(add, tp, t, lt.policy.get("", (0, 0, 0)))
        for item in t["e2e_processing_latency"]["percentiles"] or ():
            add(f"{tp}{_e2e_key(item['quantile'])}:{int(item['value'])}|g\n")
        for c in t["channels"]:
            cname = c["channel_name"]
            if exclude_ephemeral and is_ephemeral(cname):
                continue
            lmc, lrq, lto = lt.channels.get(cname, (0, 0, 0))
            cp = f"{tp}channel.{cname}."
            add(f"{cp}message_count:{c['message_count'] - lmc}|c\n")
            add(f"{cp}depth:{c['depth']}|g\n")
            add(f"{cp}backend_depth:{c['backend_depth']}|g\n")
            add(f"{cp}in_flight_count:{c['in_flight_count']}|g\n")
            add(f"{cp}deferred_count:{c['deferred_count']}|g\n")
            add(f"{cp}requeue_count:{c['requeue_count'] - lrq}|c\n")
            add(f"{cp}timeout_count:{c['timeout_count'] - lto}|c\n")
            add(f"{cp}clients:{c['client_count']}|g\n")
            if "expired_count" in c:
                _add_policy(add, cp, c, lt.policy.get(cname, (0, 0, 0)))
            for item in c["e2e_processing_latency"]["percentiles"] or ():
                add(f"{cp}{_e2e_key(item['quantile'])}:{int(item['value'])}|g\n")
    if mem is not None:
        for key, attr in _MEM_GAUGES:
            add(f"{prefix}{key}:{mem[attr]}|g\n")
        add(f"{prefix}mem.gc_runs:{mem['gc_total_runs'] - last_gc_runs}|c\n")
    return [line.encode() for line in out], now


def pack_lines(lines: list[bytes], size: int) -> list[bytes]:
    """Go's ``BoundaryBufferedWriter`` over a ``bufio.Writer`` of ``size`` bytes: whole lines
    per datagram, at most ``size`` bytes unless one line alone is longer."""
    if size <= 0:
        size = _DEFAULT_PACKET_SIZE
    packets: list[bytes] = []
    buf = bytearray()
    for line in lines:
        if len(line) > size - len(buf) and buf:
            packets.append(bytes(buf))
            buf.clear()
        if len(line) > size:  # bufio writes it straight through
            packets.append(line)
        else:
            buf += line
    if buf:
        packets.append(bytes(buf))
    return packets


class StatsdLoop:
    """Go's ``statsdLoop``: one push per ``--statsd-interval`` until the daemon stops."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        opts = nsqd.options
        self.prefix = statsd_prefix(
            opts.statsd_prefix, opts.broadcast_address, max(nsqd.broadcast_http_port, 0)
        )
        self._last: dict[str, _Last] = {}
        self._last_gc_runs = 0
        self._exit = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        install_gc_tracker()
        self._task = self.nsqd.loop.create_task(self._run())

    async def stop(self) -> None:
        """Finish the current push without its pauses, then end the loop."""
        self._exit.set()
        task = self._task
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), 5.0)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        except Exception:
            log.exception("STATSD: loop failed")
        log.info("STATSD: closing")

    async def _sleep(self, seconds: float) -> bool:
        """Sleep, or return True at once when the daemon stops."""
        if self._exit.is_set():
            return True
        if seconds <= 0:
            return False
        try:
            await asyncio.wait_for(self._exit.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _run(self) -> None:
        loop = self.nsqd.loop
        interval = self.nsqd.options.statsd_interval
        due = loop.time() + interval
        while not await self._sleep(due - loop.time()):
            due += interval
            if due <= loop.time():  # a push overran: skip the missed ticks, as a Go ticker
                due = loop.time() + interval
            try:
                await self.push()
            except Exception:
                log.exception("STATSD: push failed")

    def collect(self) -> list[bytes]:
        """The lines of one push (and remember the counters for the next one)."""
        opts = self.nsqd.options
        topics, _ = get_stats(self.nsqd, include_clients=False)
        mem = mem_stats() if opts.statsd_mem_stats else None
        lines, self._last = statsd_lines(
            self.prefix,
            topics or [],
            self._last,
            mem,
            self._last_gc_runs,
            opts.statsd_exclude_ephemeral,
        )
        if mem is not None:
            self._last_gc_runs = mem["gc_total_runs"]
        return lines

    async def _connect(self, addr: str) -> socket.socket:
        host, sep, port = addr.rpartition(":")
        if not sep or not port.isdigit():
            raise OSError(f"missing port in address {addr}")
        host = host.strip("[]") or "localhost"
        infos = await self.nsqd.loop.getaddrinfo(host, int(port), type=socket.SOCK_DGRAM)
        if not infos:
            raise OSError(f"no address for {host}")
        family, type_, proto, _, sockaddr = infos[0]
        sock = socket.socket(family, type_, proto)
        try:
            sock.setblocking(False)
            sock.connect(sockaddr)
        except BaseException:
            sock.close()
            raise
        return sock

    async def push(self) -> None:
        """One push: read the stats, send the datagrams spread over ``interval - 1s``."""
        opts = self.nsqd.options
        addr = opts.statsd_address
        try:
            sock = await self._connect(addr)
        except (OSError, ValueError, UnicodeError):
            log.error("failed to create UDP socket to statsd(%s)", addr)
            return
        try:
            log.info("STATSD: pushing stats to %s", addr)
            packets = pack_lines(self.collect(), opts.statsd_udp_packet_size)
            pause = (opts.statsd_interval - 1.0) / len(packets) if packets else 0.0
            for i, packet in enumerate(packets):
                with contextlib.suppress(OSError):  # Go ignores write errors too
                    sock.send(packet)
                if pause > 0 and i + 1 < len(packets) and not self._exit.is_set():
                    await self._sleep(pause)
        finally:
            sock.close()
