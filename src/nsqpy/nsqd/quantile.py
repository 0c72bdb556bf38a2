"""End-to-end processing latency quantiles, as NSQ's ``internal/quantile``.

What Go does (and this module reproduces):

- A :class:`Quantile` covers a sliding window (``--e2e-processing-latency-window-time``, 10m)
  with two streams, each holding half a window: the *current* one takes new values and
  every ``window/2`` the roles swap and the new current stream is cleared. So a result
  covers between half a window and a whole window of FINs.
- The window moves lazily, when a value is inserted or a result is asked for; an idle
  channel's old values disappear when its stats are next read.
- ``count`` is the number of values in both streams (the FINs of the last ½–1 window); each
  percentile's ``value`` is the latency (ns) at that quantile of those values; with no value
  at all it is 0. Percentiles are listed in the configured order.
- A topic's latency aggregates its channels': their streams merged into one (count = sum of
  the channels' counts; quantiles of the union). A topic without channels, like a daemon
  without ``--e2e-processing-latency-percentile``, has no stream at all: Go's nil
  ``*Quantile`` whose ``Result()`` is ``{"count": 0, "percentiles": null}``.

How it differs: Go keeps a targeted-quantile summary (``bmizerany/perks``, ε = 1 % of the
rank); here each half-window is a log-linear histogram with 64 buckets per power of two,
so a reported value is within 0.8 % of the latency at the exact (nearest) rank, and the
largest value (quantile 1.0) is exact. Memory is bounded by the value range (at most a few
thousand buckets per stream), whatever the message rate.

Insert cost is what matters (a FIN is the hottest consumer path): :meth:`Quantile.insert`
compares one clock value and appends to a list; every :data:`BATCH` values the list is
sorted (C) and folded into the histogram one bucket run at a time (bisect), not one value
at a time. Times are wall-clock nanoseconds (the message timestamp's clock), for both the
latency and the window.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["BATCH", "NO_RESULT", "Quantile", "aggregate_result", "result_json"]

#: Values buffered before they are folded into the histogram.
BATCH = 1024

#: Significant bits kept per value: buckets are 2**(SUB_BITS-1) = 64 per power of two.
SUB_BITS = 7
_EXACT_BELOW = 1 << SUB_BITS

#: Go's ``(*Quantile)(nil).Result()``: no stream (no percentiles configured, or a topic
#: without channels).
NO_RESULT: dict[str, Any] = {"count": 0, "percentiles": None}


def _fold(counts: dict[int, int], values: list[int]) -> tuple[int, int]:
    """Add ``values`` (sorted here, in place) to the histogram; returns their (min, max).

    Buckets are keyed by their lower bound: exact below 128, else the value with all but its
    top :data:`SUB_BITS` bits cleared. Negative latencies (clock steps) count as 0.
    """
    values.sort()
    n = len(values)
    i = 0
    get = counts.get
    while i < n:
        v = values[i]
        if v < _EXACT_BELOW:
            if v < 0:
                key, upper = 0, 0
            else:
                key, upper = v, v + 1
        else:
            shift = v.bit_length() - SUB_BITS
            key = (v >> shift) << shift
            upper = key + (1 << shift)
        j = bisect_left(values, upper, i + 1)
        counts[key] = get(key, 0) + j - i
        i = j
    return max(values[0], 0), max(values[-1], 0)


def _representative(key: int) -> int:
    """The value reported for a bucket: its midpoint (exact buckets are themselves)."""
    if key < _EXACT_BELOW:
        return key
    return key + (1 << (key.bit_length() - SUB_BITS - 1))


def _query(counts: dict[int, int], n: int, lo: int, hi: int, percentiles: Sequence[float]) -> list[int]:
    """Nearest-rank value of each percentile (0 when there is no value)."""
    if n == 0:
        return [0] * len(percentiles)
    keys = sorted(counts)
    # ranks in ascending order, walked once over the cumulative counts
    wanted = sorted((max(1, math.ceil(p * n - 1e-7 * max(n, 1))), i) for i, p in enumerate(percentiles))
    out = [0] * len(percentiles)
    k = 0
    cum = 0
    for rank, idx in wanted:
        if rank >= n:
            out[idx] = hi
            continue
        while cum < rank:
            cum += counts[keys[k]]
            k += 1
        v = _representative(keys[k - 1])
        out[idx] = lo if v < lo else hi if v > hi else v
    return out


def result_json(count: int, percentiles: Sequence[float], values: Sequence[int]) -> dict[str, Any]:
    """Go's ``quantile.Result`` JSON: ``{"count", "percentiles": [{"quantile", "value"}]}``
    (a map in Go, so its keys come sorted; a whole float prints without ``.0``)."""
    return {
        "count": count,
        "percentiles": [
            {"quantile": int(p) if float(p).is_integer() else p, "value": v}
            for p, v in zip(percentiles, values, strict=True)
        ],
    }


class _Stream:
    """Half a window: histogram, value count, smallest and largest value."""

    __slots__ = ("counts", "hi", "lo", "n")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0
        self.lo = 0
        self.hi = 0

    def reset(self) -> None:
        self.counts = {}
        self.n = 0
        self.lo = 0
        self.hi = 0

    def add(self, values: list[int]) -> None:
        lo, hi = _fold(self.counts, values)
        if self.n == 0:
            self.lo, self.hi = lo, hi
        else:
            if lo < self.lo:
                self.lo = lo
            if hi > self.hi:
                self.hi = hi
        self.n += len(values)


class _Merged:
    """Histograms summed (a result over several streams)."""

    __slots__ = ("counts", "hi", "lo", "n")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0
        self.lo = 0
        self.hi = 0

    def add(self, s: _Stream | _Merged) -> None:
        if not s.n:
            return
        if self.n == 0:
            self.lo, self.hi = s.lo, s.hi
        else:
            self.lo = min(self.lo, s.lo)
            self.hi = max(self.hi, s.hi)
        self.n += s.n
        counts = self.counts
        get = counts.get
        for k, c in s.counts.items():
            counts[k] = get(k, 0) + c

    def result(self, percentiles: Sequence[float]) -> dict[str, Any]:
        return result_json(self.n, percentiles, _query(self.counts, self.n, self.lo, self.hi, percentiles))


class Quantile:
    """One channel's latency stream: two half-window histograms rotated every window/2."""

    __slots__ = ("_buf", "_cur", "_last_move", "_prev", "_stale_at", "move_ns", "percentiles")

    def __init__(self, window_seconds: float, percentiles: Sequence[float], now_ns: int) -> None:
        self.percentiles = tuple(percentiles)
        #: Go's MoveWindowTime: half the window (at least 1 ns)
        self.move_ns = max(int(window_seconds * 1e9) // 2, 1)
        self._last_move = now_ns
        self._stale_at = now_ns + self.move_ns
        self._buf: list[int] = []
        self._cur = _Stream()
        self._prev = _Stream()

    def insert(self, msg_timestamp_ns: int, now_ns: int) -> None:
        """Record one FIN: ``now_ns - msg_timestamp_ns`` (Go's ``Insert(msg.Timestamp)``)."""
        if now_ns > self._stale_at:
            self._move_window(now_ns)
        buf = self._buf
        buf.append(now_ns - msg_timestamp_ns)
        if len(buf) >= BATCH:
            self._cur.add(buf)
            buf.clear()

    def _move_window(self, now_ns: int) -> None:
        """Go's ``for IsDataStale(now) { moveWindow() }``: swap and clear, as many times as
        whole half-windows went by (twice or more clears both)."""
        buf = self._buf
        if buf:  # those values came before the move
            self._cur.add(buf)
            buf.clear()
        moves = -(-(now_ns - self._last_move) // self.move_ns) - 1
        if moves == 1:
            self._cur, self._prev = self._prev, self._cur
            self._cur.reset()
        else:
            self._cur.reset()
            self._prev.reset()
        self._last_move += moves * self.move_ns
        self._stale_at = self._last_move + self.move_ns

    def snapshot(self, now_ns: int) -> _Merged:
        """Both halves merged, after moving the window (Go's ``QueryHandler``)."""
        if now_ns > self._stale_at:
            self._move_window(now_ns)
        buf = self._buf
        if buf:
            self._cur.add(buf)
            buf.clear()
        m = _Merged()
        m.add(self._cur)
        m.add(self._prev)
        return m

    def count(self, now_ns: int) -> int:
        return self.snapshot(now_ns).n

    def result(self, now_ns: int) -> dict[str, Any]:
        """Go's ``Result()``: count and the configured percentiles."""
        return self.snapshot(now_ns).result(self.percentiles)


def aggregate_result(
    streams: Iterable[Quantile | None], percentiles: Sequence[float], now_ns: int
) -> dict[str, Any]:
    """A topic's latency: its channels' streams merged (Go's
    ``AggregateChannelE2eProcessingLatency().Result()``); without any stream, Go's nil."""
    merged: _Merged | None = None
    for q in streams:
        if q is None:
            continue
        if merged is None:
            merged = _Merged()
        merged.add(q.snapshot(now_ns))
    if merged is None:
        return dict(NO_RESULT)
    return merged.result(percentiles)
