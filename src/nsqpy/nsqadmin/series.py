"""Live rates and history without Graphite (an nsqpy addition to nsqadmin).

The **sampler** reads the cluster's ``/stats`` (the producers from nsqlookupd, or the
``--nsqd-http-address`` list) every ``--stats-sample-interval`` (5s; 0 turns it off) and
keeps ``--stats-retention`` (1h) of samples in memory. Every sample has one timestamp shared
by all series, so the arrays of every series line up with ``timestamps``.

**Series.** One per topic and one per channel, summed over the nsqd that have it. Each holds,
per sample:

- gauges: ``depth``, ``memory_depth``, ``backend_depth``, ``in_flight_count``,
  ``deferred_count``, ``client_count``;
- counters (cumulative, as nsqd reports them): ``message_count``, ``requeue_count``,
  ``timeout_count``;
- rates (per second): ``message_rate``, ``requeue_rate``, ``timeout_rate``.

For a topic, ``message_count`` counts the messages published to it, ``depth`` its own queue
(not its channels'), and ``in_flight_count``, ``deferred_count``, ``requeue_count``,
``timeout_count`` and ``client_count`` are its channels' sums. A rate is computed per node
between its two last answers (so an nsqd missing from one sample does not read as a counter
reset) and summed over the nodes; a counter that went down (nsqd restarted, channel
re-created) counts from zero. A value is ``null`` where the series did not exist or the
sample failed; a rate is ``null`` on the first sample of a node. Series that have not been
seen for the whole retention are forgotten. Memory: 12 float64 per series per sample (about
70 kB per series for an hour at 5s).

**API** (``GET``, under ``--base-path``; 404 ``NOT_FOUND`` when the sampler is off).
Every answer has ``interval`` and ``retention`` (seconds), ``timestamps`` (unix seconds,
millisecond precision, oldest first) and ``message`` (``""``, or the last sample's
``WARNING: …``/``ERROR: …``, as nsqadmin's other answers word partial failures).
Query parameters: ``window=<seconds>`` (only the samples of the last N seconds) and
``since=<unix seconds>`` (only the samples taken after it, to append to what a page has).

- ``/api/series/topics``: ``{"interval", "retention", "timestamps", "topics": {name:
  SERIES}, "message"}``, every topic the sampler knows (names sorted);
- ``/api/series/topics/:topic``: ``{"interval", "retention", "timestamps", "topic_name",
  **SERIES, "channels": {name: SERIES}, "message"}``;
- ``/api/series/topics/:topic/:channel``: ``{"interval", "retention", "timestamps",
  "topic_name", "channel_name", **SERIES, "message"}``;

where ``SERIES`` is ``{"depth": [...], "memory_depth": [...], "backend_depth": [...],
"in_flight_count": [...], "deferred_count": [...], "client_count": [...],
"message_count": [...], "requeue_count": [...], "timeout_count": [...],
"message_rate": [...], "requeue_rate": [...], "timeout_rate": [...]}``, each array as long
as ``timestamps`` (integers, or floats with 3 decimals for rates, or ``null``). A topic or
channel the sampler has not seen answers 200 with ``null`` values (and no channels).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from array import array
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from .clusterinfo import ClusterInfo, is_partial
from .types import TopicStats, go_number

if TYPE_CHECKING:
    from .nsqadmin import NSQAdmin

__all__ = ["COUNTERS", "GAUGES", "METRICS", "RATES", "Sampler", "SeriesStore"]

log = logging.getLogger("nsqadmin")

GAUGES: Final = (
    "depth",
    "memory_depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "client_count",
)
COUNTERS: Final = ("message_count", "requeue_count", "timeout_count")
RATES: Final = ("message_rate", "requeue_rate", "timeout_rate")
METRICS: Final = GAUGES + COUNTERS + RATES
#: queue policies' counters and their rates (an nsqpy addition to nsqd's /stats): a series
#: has them once one of its nodes reports them
POLICY_COUNTERS: Final = ("expired_count", "dropped_count", "dead_letter_count")
POLICY_RATES: Final = ("expired_rate", "dropped_rate", "dead_letter_rate")
_INT_METRICS: Final = frozenset(GAUGES + COUNTERS + POLICY_COUNTERS)

NAN = math.nan


class Series:
    """The metrics of one topic or channel: one float64 ring per metric, indexed by the
    sample number modulo the capacity (NaN: no value)."""

    __slots__ = ("last_seen", "rings")

    def __init__(self, capacity: int) -> None:
        blank = array("d", [NAN]) * capacity
        self.rings: dict[str, array[float]] = {m: array("d", blank) for m in METRICS}
        self.last_seen = -1


class _Row:
    """One sample's figures for one series, summed over nodes."""

    __slots__ = ("policy_rated", "policy_rates", "policy_values", "rated", "rates", "values")

    def __init__(self) -> None:
        self.values = dict.fromkeys(GAUGES + COUNTERS, 0)
        self.rates = dict.fromkeys(RATES, 0.0)
        self.rated = False
        #: the policy counters (None: no node reported them) and their rates
        self.policy_values: dict[str, int] | None = None
        self.policy_rates = dict.fromkeys(POLICY_RATES, 0.0)
        self.policy_rated = False

    def add_policy(
        self, store: SeriesStore, key: tuple[str, str, str], now: float, policy: dict[str, Any]
    ) -> None:
        """A node's policy counts (and their rates since its last answer) into the row."""
        expired, dropped, dead = (int(policy.get(k, 0)) for k in POLICY_COUNTERS)
        counts = (expired, dropped, dead)
        values = self.policy_values
        if values is None:
            values = self.policy_values = dict.fromkeys(POLICY_COUNTERS, 0)
        for k, v in zip(POLICY_COUNTERS, counts, strict=True):
            values[k] += v
        prev = store._prev.get(key)
        store._prev[key] = (now, *counts)
        if prev is None or now <= prev[0]:
            return
        dt = now - prev[0]
        self.policy_rated = True
        for name, cur, old in zip(POLICY_RATES, counts, prev[1:], strict=True):
            self.policy_rates[name] += (cur - old if cur >= old else cur) / dt


class SeriesStore:
    """Aligned, bounded time series of every topic and channel (see the module docs)."""

    def __init__(self, interval: float, retention: float) -> None:
        self.interval = interval
        self.retention = retention
        self.capacity = max(2, math.ceil(retention / interval) + 1) if interval > 0 else 2
        self.timestamps = array("d", [NAN]) * self.capacity
        #: samples recorded so far; sample ``n`` lives at index ``n % capacity``
        self.count = 0
        self.topics: dict[str, Series] = {}
        self.channels: dict[tuple[str, str], Series] = {}
        #: (node, topic, channel) → (time, message_count, requeue_count, timeout_count)
        self._prev: dict[tuple[str, str, str], tuple[float, int, int, int]] = {}
        #: the last sample's warning or error ("" when it went fine)
        self.message = ""

    # --- recording ------------------------------------------------------------------------------

    def _rate(self, row: _Row, key: tuple[str, str, str], now: float, counts: tuple[int, int, int]) -> None:
        prev = self._prev.get(key)
        self._prev[key] = (now, *counts)
        if prev is None or now <= prev[0]:
            return
        dt = now - prev[0]
        row.rated = True
        for name, cur, old in zip(RATES, counts, prev[1:], strict=True):
            row.rates[name] += (cur - old if cur >= old else cur) / dt

    def record(self, now: float, node_topics: Iterable[TopicStats] | None, message: str = "") -> None:
        """Add one sample: ``node_topics`` are the per-node topic rows (with channels) of
        every nsqd that answered (None: the sample failed)."""
        topic_rows: dict[str, _Row] = {}
        channel_rows: dict[tuple[str, str], _Row] = {}
        for t in node_topics or ():
            trow = topic_rows.setdefault(t.topic_name, _Row())
            tv = trow.values
            tv["depth"] += t.depth
            tv["memory_depth"] += t.depth - t.backend_depth
            tv["backend_depth"] += t.backend_depth
            tv["message_count"] += t.message_count
            t_req = t_to = 0
            for c in t.channels or ():
                crow = channel_rows.setdefault((t.topic_name, c.channel_name), _Row())
                cv = crow.values
                cv["depth"] += c.depth
                cv["memory_depth"] += c.depth - c.backend_depth
                cv["backend_depth"] += c.backend_depth
                cv["in_flight_count"] += c.in_flight_count
                cv["deferred_count"] += c.deferred_count
                cv["client_count"] += c.client_count
                cv["message_count"] += c.message_count
                cv["requeue_count"] += c.requeue_count
                cv["timeout_count"] += c.timeout_count
                tv["in_flight_count"] += c.in_flight_count
                tv["deferred_count"] += c.deferred_count
                tv["client_count"] += c.client_count
                tv["requeue_count"] += c.requeue_count
                tv["timeout_count"] += c.timeout_count
                t_req += c.requeue_count
                t_to += c.timeout_count
                self._rate(
                    crow,
                    (t.node, t.topic_name, c.channel_name),
                    now,
                    (c.message_count, c.requeue_count, c.timeout_count),
                )
                if c.policy is not None:
                    crow.add_policy(self, (t.node, t.topic_name, c.channel_name + "\0policy"), now, c.policy)
            self._rate(trow, (t.node, t.topic_name, ""), now, (t.message_count, t_req, t_to))
            if t.policy is not None:
                trow.add_policy(self, (t.node, t.topic_name, "\0policy"), now, t.policy)

        n = self.count
        slot = n % self.capacity
        self.timestamps[slot] = round(now, 3)
        self._write(self.topics, topic_rows, n, slot)
        self._write(self.channels, channel_rows, n, slot)
        self.count = n + 1
        self.message = message
        # forget rate baselines nobody refreshed for a whole retention
        horizon = now - self.retention
        for key in [k for k, v in self._prev.items() if v[0] < horizon]:
            del self._prev[key]

    def _write(self, store: dict[Any, Series], rows: dict[Any, _Row], n: int, slot: int) -> None:
        for key, row in rows.items():
            series = store.get(key)
            if series is None:
                series = store[key] = Series(self.capacity)
            series.last_seen = n
            rings = series.rings
            for name, value in row.values.items():
                rings[name][slot] = value
            for name, rate in row.rates.items():
                rings[name][slot] = rate if row.rated else NAN
            if row.policy_values is not None:
                if POLICY_COUNTERS[0] not in rings:
                    blank = array("d", [NAN]) * self.capacity
                    for name in POLICY_COUNTERS + POLICY_RATES:
                        rings[name] = array("d", blank)
                for name, value in row.policy_values.items():
                    rings[name][slot] = value
                for name, rate in row.policy_rates.items():
                    rings[name][slot] = rate if row.policy_rated else NAN
            elif POLICY_COUNTERS[0] in rings:
                for name in POLICY_COUNTERS + POLICY_RATES:
                    rings[name][slot] = NAN
        for key in [k for k in store if k not in rows]:
            series = store[key]
            if n - series.last_seen >= self.capacity:
                del store[key]
                continue
            for ring in series.rings.values():
                ring[slot] = NAN

    # --- reading --------------------------------------------------------------------------------

    def samples(self, window: float | None = None, since: float | None = None) -> list[int]:
        """Sample numbers kept (oldest first), limited to the last ``window`` seconds and
        to those taken after ``since``."""
        numbers = range(max(0, self.count - self.capacity), self.count)
        if not numbers or (window is None and since is None):
            return list(numbers)
        cap = self.capacity
        low = -math.inf if window is None else self.timestamps[(self.count - 1) % cap] - window
        after = -math.inf if since is None else since
        return [n for n in numbers if self.timestamps[n % cap] >= low and self.timestamps[n % cap] > after]

    def timestamps_json(self, numbers: list[int]) -> list[float | int]:
        return [go_number(self.timestamps[n % self.capacity]) for n in numbers]

    def series_json(self, series: Series | None, numbers: list[int]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        cap = self.capacity
        names = METRICS if series is None else tuple(series.rings)
        for name in names:
            if series is None:
                out[name] = [None] * len(numbers)
                continue
            ring = series.rings[name]
            values: list[Any] = []
            as_int = name in _INT_METRICS
            for n in numbers:
                v = ring[n % cap]
                if math.isnan(v):
                    values.append(None)
                elif as_int:
                    values.append(int(v))
                else:
                    values.append(go_number(round(v, 3)))
            out[name] = values
        return out

    def header(self, numbers: list[int]) -> dict[str, Any]:
        return {
            "interval": go_number(float(self.interval)),
            "retention": go_number(float(self.retention)),
            "timestamps": self.timestamps_json(numbers),
        }


class Sampler:
    """Samples the cluster into a :class:`SeriesStore` every ``--stats-sample-interval``."""

    def __init__(self, admin: NSQAdmin, ci: ClusterInfo) -> None:
        self.admin = admin
        self.ci = ci
        opts = admin.options
        self.store = SeriesStore(opts.stats_sample_interval, opts.stats_retention)
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="nsqadmin-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def sample_once(self) -> None:
        """Read the cluster once and record the sample."""
        opts = self.admin.options
        now = time.time()
        producers, err = await self.ci.get_producers(opts.nsqlookupd_http_addresses, opts.nsqd_http_addresses)
        messages: list[str] = []
        if err is not None and not is_partial(err):
            self._failed(now, f"ERROR: failed to get producers - {err}")
            return
        if err is not None:
            messages.append(str(err))
        if not producers:
            self.store.record(now, [], _warning(messages))
            self._failing = False
            return
        topics, _, err = await self.ci.get_nsqd_stats(producers, "", "", include_clients=False)
        if err is not None and not is_partial(err):
            self._failed(now, f"ERROR: failed to get nsqd stats - {err}")
            return
        if err is not None:
            messages.append(str(err))
        self.store.record(now, topics, _warning(messages))
        self._failing = False

    def _failed(self, now: float, message: str) -> None:
        (log.debug if self._failing else log.warning)("series sampler: %s", message)
        self._failing = True
        self.store.record(now, None, message)

    async def _run(self) -> None:
        interval = self.store.interval
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            try:
                await self.sample_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a sampler bug must not stop the daemon
                log.exception("series sampler failed")
            due += interval
            now = loop.time()
            if due <= now:  # the sample took longer than the interval: skip the missed slots
                due = now + interval - (now - due) % interval
            await asyncio.sleep(due - now)


def _warning(messages: list[str]) -> str:
    return "WARNING: " + "; ".join(messages) if messages else ""
