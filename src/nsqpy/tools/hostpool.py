"""Destination selection for the tools' ``--mode`` (``nsq_to_http``, ``nsq_to_nsq``).

The rules of the Go tools, which pick among their destinations with ``bitly/go-hostpool``
(``hostpool`` and ``epsilon-greedy``) or a shared counter (``round-robin``):

* :class:`RoundRobin`: the *n*-th pick (from 1) is ``hosts[n % len(hosts)]``, so the first
  message goes to the second host, as Go's ``atomic.AddUint64(&counter, 1) % len``.
* :class:`HostPool` (``hostpool.New``): round robin over the hosts that are not dead; a
  failed :meth:`HostPoolResponse.mark` makes a host dead for 30 s, then it gets one try,
  and each try that finds it still dead doubles the wait (at most 15 min); a success
  revives it. When every host is dead all are revived and the first one is used.
* :class:`EpsilonGreedyHostPool` (``hostpool.NewEpsilonGreedy`` with the linear value
  calculator): explore (plain :class:`HostPool` choice) with probability epsilon (0.3,
  ×0.9 per exploration, at least 0.01); otherwise a weighted random choice among the
  live hosts, each weighted by 1 / (its weighted average response time in whole ms over
  the last 5 minutes, 120 buckets). Hosts without a measured time (never used, or
  faster than 1 ms) are not candidates; without candidates the choice is round robin.

Every selector's :meth:`get` returns a :class:`HostPoolResponse`; call ``mark(err)`` (None
for success) once the work with that host is done. Pure code: the clock and the random
source are injectable.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Final

__all__ = [
    "EPSILON_GREEDY",
    "HOSTPOOL",
    "ROUND_ROBIN",
    "EpsilonGreedyHostPool",
    "HostPool",
    "HostPoolResponse",
    "RoundRobin",
    "Selector",
    "new_selector",
]

log = logging.getLogger("nsqpy.tools.hostpool")

ROUND_ROBIN: Final = "round-robin"
HOSTPOOL: Final = "hostpool"
EPSILON_GREEDY: Final = "epsilon-greedy"

#: go-hostpool's constants
INITIAL_RETRY_DELAY: Final = 30.0
MAX_RETRY_INTERVAL: Final = 900.0
EPSILON_BUCKETS: Final = 120
EPSILON_DECAY: Final = 0.90
MIN_EPSILON: Final = 0.01
INITIAL_EPSILON: Final = 0.3
DEFAULT_DECAY_DURATION: Final = 300.0

Clock = Callable[[], float]


class HostPoolResponse:
    """One pick: :attr:`host`, and :meth:`mark` to report how it went (only the first
    call counts)."""

    __slots__ = ("_marked", "_pool", "host", "started")

    def __init__(self, host: str, pool: _Markable | None, started: float = 0.0) -> None:
        self.host = host
        self.started = started
        self._pool = pool
        self._marked = False

    def mark(self, err: object = None) -> None:
        """``err`` None is a success; anything else (an exception, a message) a failure."""
        if self._marked:
            return
        self._marked = True
        if self._pool is not None:
            self._pool._mark(self, err is None)


class _Markable:
    def _mark(self, resp: HostPoolResponse, ok: bool) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class Selector:
    """What every ``--mode`` offers."""

    hosts: list[str]

    def get(self) -> HostPoolResponse:  # pragma: no cover - interface
        raise NotImplementedError


class RoundRobin(Selector):
    """The Go tools' ``round-robin``: a counter, no failure tracking."""

    def __init__(self, hosts: Sequence[str]) -> None:
        if not hosts:
            raise ValueError("no hosts")
        self.hosts = list(hosts)
        self.counter = 0

    def get(self) -> HostPoolResponse:
        self.counter += 1
        return HostPoolResponse(self.hosts[self.counter % len(self.hosts)], None)


class _Entry:
    __slots__ = (
        "counts",
        "dead",
        "host",
        "index",
        "next_retry",
        "percentage",
        "retry_count",
        "retry_delay",
        "value",
        "values",
    )

    def __init__(self, host: str, retry_delay: float) -> None:
        self.host = host
        self.dead = False
        self.next_retry = 0.0
        self.retry_count = 0
        self.retry_delay = retry_delay
        # epsilon-greedy: requests and summed whole milliseconds per decay bucket
        self.counts: list[int] = []
        self.values: list[int] = []
        self.index = 0
        self.value = 0.0
        self.percentage = 0.0

    def can_try(self, now: float) -> bool:
        return not self.dead or self.next_retry < now

    def will_retry(self, now: float, max_interval: float) -> None:
        self.retry_count += 1
        self.retry_delay = min(self.retry_delay * 2, max_interval)
        self.next_retry = now + self.retry_delay


class HostPool(Selector, _Markable):
    """go-hostpool's standard pool (``hostpool.New``)."""

    def __init__(
        self,
        hosts: Sequence[str],
        *,
        initial_retry_delay: float = INITIAL_RETRY_DELAY,
        max_retry_interval: float = MAX_RETRY_INTERVAL,
        clock: Clock = time.monotonic,
    ) -> None:
        if not hosts:
            raise ValueError("no hosts")
        self.hosts = list(hosts)
        self.initial_retry_delay = initial_retry_delay
        self.max_retry_interval = max_retry_interval
        self.clock = clock
        self._list = [_Entry(h, initial_retry_delay) for h in hosts]
        # as Go's map: a repeated host is looked up as its last entry
        self._by_host = {e.host: e for e in self._list}
        self._next = 0

    def get(self) -> HostPoolResponse:
        return HostPoolResponse(self._round_robin(), self)

    def is_dead(self, host: str) -> bool:
        return self._by_host[host].dead

    def reset_all(self) -> None:
        for e in self._by_host.values():
            e.dead = False

    def _round_robin(self) -> str:
        now = self.clock()
        n = len(self._list)
        for i in range(n):
            idx = (i + self._next) % n
            e = self._list[idx]
            if not e.dead:
                self._next = idx + 1
                return e.host
            if e.next_retry < now:
                e.will_retry(now, self.max_retry_interval)
                self._next = idx + 1
                return e.host
        # every host is down: revive them all
        self.reset_all()
        self._next = 0
        return self._list[0].host

    def _mark(self, resp: HostPoolResponse, ok: bool) -> None:
        e = self._by_host[resp.host]
        if ok:
            e.dead = False
        elif not e.dead:
            e.dead = True
            e.retry_count = 0
            e.retry_delay = self.initial_retry_delay
            e.next_retry = self.clock() + e.retry_delay


class EpsilonGreedyHostPool(HostPool):
    """go-hostpool's epsilon-greedy pool with ``LinearEpsilonValueCalculator`` (1/ms)."""

    def __init__(
        self,
        hosts: Sequence[str],
        decay_duration: float = 0.0,
        *,
        value: Callable[[float], float] = lambda ms: 1.0 / ms,
        rng: random.Random | None = None,
        clock: Clock = time.monotonic,
        initial_retry_delay: float = INITIAL_RETRY_DELAY,
        max_retry_interval: float = MAX_RETRY_INTERVAL,
    ) -> None:
        super().__init__(
            hosts, initial_retry_delay=initial_retry_delay, max_retry_interval=max_retry_interval, clock=clock
        )
        self.decay_duration = decay_duration if decay_duration > 0 else DEFAULT_DECAY_DURATION
        self.epsilon = INITIAL_EPSILON
        self.value = value
        self.rng = rng or random.Random()
        for e in self._list:
            e.counts = [0] * EPSILON_BUCKETS
            e.values = [0] * EPSILON_BUCKETS
        self._bucket_seconds = self.decay_duration / EPSILON_BUCKETS
        self._decayed_at = clock()

    def get(self) -> HostPoolResponse:
        self._decay()
        host = self._epsilon_greedy()
        return HostPoolResponse(host, self, self.clock())

    def _decay(self) -> None:
        """Go rotates one bucket per tick in a goroutine; here the ticks due are caught up."""
        now = self.clock()
        steps = int((now - self._decayed_at) / self._bucket_seconds)
        if steps <= 0:
            return
        self._decayed_at += steps * self._bucket_seconds
        for _ in range(min(steps, EPSILON_BUCKETS)):
            for e in self._list:
                e.index = (e.index + 1) % EPSILON_BUCKETS
                e.counts[e.index] = 0
                e.values[e.index] = 0

    def _epsilon_greedy(self) -> str:
        if self.rng.random() < self.epsilon:  # exploration
            self.epsilon = max(self.epsilon * EPSILON_DECAY, MIN_EPSILON)
            return self._round_robin()
        now = self.clock()
        candidates: list[_Entry] = []
        total = 0.0
        for e in self._list:
            if e.can_try(now):
                avg = _weighted_average_ms(e)
                if avg > 0:
                    e.value = self.value(avg)
                    total += e.value
                    candidates.append(e)
        chosen: _Entry | None = None
        if candidates:
            for e in candidates:
                e.percentage = e.value / total
            ceiling = 0.0
            pick = self.rng.random()
            for e in candidates:
                ceiling += e.percentage
                if pick <= ceiling:
                    chosen = e
                    break
        if chosen is None:
            return self._round_robin()
        if chosen.dead:
            chosen.will_retry(now, self.max_retry_interval)
        return chosen.host

    def _mark(self, resp: HostPoolResponse, ok: bool) -> None:
        super()._mark(resp, ok)
        if ok:
            self._decay()
            e = self._by_host[resp.host]
            e.counts[e.index] += 1
            # Go adds int64(duration.Seconds() * 1000): whole milliseconds, truncated
            e.values[e.index] += int((self.clock() - resp.started) * 1000)


def _weighted_average_ms(e: _Entry) -> float:
    """Recent buckets weigh more; an empty bucket repeats the last average seen."""
    value = 0.0
    last = 0.0
    for i in range(1, EPSILON_BUCKETS + 1):
        pos = (e.index + i) % EPSILON_BUCKETS
        count = e.counts[pos]
        weight = i / EPSILON_BUCKETS
        if count > 0:
            last = e.values[pos] / count
        value += last * weight
    return value


def new_selector(
    mode: str, hosts: Sequence[str], *, rng: random.Random | None = None, clock: Clock = time.monotonic
) -> Selector:
    """The selector for a ``--mode`` value (``round-robin``, ``hostpool``, ``epsilon-greedy``);
    ValueError for anything else (each tool decides what Go does with other values)."""
    if mode == ROUND_ROBIN:
        return RoundRobin(hosts)
    if mode == HOSTPOOL:
        return HostPool(hosts, clock=clock)
    if mode == EPSILON_GREEDY:
        return EpsilonGreedyHostPool(hosts, rng=rng, clock=clock)
    raise ValueError(f"unknown mode {mode!r}")
