"""``--status-every`` progress lines: Go's ``bitly/timer_metrics`` (used by nsq_to_http and
nsq_to_nsq; nothing here is specific to HTTP).

A :class:`TimerMetrics` keeps the last ``status_every`` durations in a ring; each time the
ring wraps (the ``status_every + 1``-th record, then every ``status_every`` more) it logs
``<prefix> finished <N> - 99th: 1.23ms - 95th: 1.01ms - avg: 0.87ms`` over the ring.
``status_every`` 0 disables it; below 100 a warning says percentiles will be rough.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

__all__ = ["Stats", "TimerMetrics", "percentile"]

log = logging.getLogger("nsqpy.tools")


def percentile(perc: float, ordered: list[float]) -> float:
    """timer_metrics' percentile of sorted durations (index ``ceil(p% × n + 0.5)``, capped)."""
    n = len(ordered)
    if n == 0:
        return 0.0
    idx = math.ceil(perc / 100.0 * n + 0.5)
    return ordered[min(idx, n - 1)]


@dataclass(frozen=True, slots=True)
class Stats:
    prefix: str
    count: int
    avg: float  # seconds
    p95: float
    p99: float

    def __str__(self) -> str:
        return (
            f"{self.prefix} finished {self.count} - 99th: {self.p99 * 1000:.2f}ms - "
            f"95th: {self.p95 * 1000:.2f}ms - avg: {self.avg * 1000:.2f}ms"
        )


class TimerMetrics:
    """Durations in seconds; :meth:`status_duration` logs at each wrap of the ring."""

    __slots__ = ("logger", "position", "prefix", "status_every", "timings")

    def __init__(self, status_every: int, prefix: str, logger: logging.Logger | None = None) -> None:
        self.status_every = status_every
        self.prefix = prefix
        self.timings: list[float] = []
        self.position = 0
        self.logger = logger or log
        if 0 < status_every < 100:
            self.logger.info(
                "Warning: use more than 100 status values for accurate percentiles (configured with %d)",
                status_every,
            )

    def stats(self) -> Stats:
        timings = self.timings
        ordered = sorted(timings)
        avg = sum(timings) / len(timings) if timings else 0.0
        return Stats(self.prefix, len(timings), avg, percentile(95.0, ordered), percentile(99.0, ordered))

    def status(self, started: float, now: float) -> None:
        """Record ``now - started`` (seconds)."""
        if self.status_every != 0:
            self.status_duration(now - started)

    def status_duration(self, duration: float) -> None:
        if self.status_every == 0:
            return
        self.position += 1
        looped = False
        if self.position > self.status_every:
            looped = True
            self.position = 1
        if self.position > len(self.timings):
            self.timings.append(duration)
        else:
            self.timings[self.position - 1] = duration
        if looped:
            self.logger.info("%s", self.stats())
