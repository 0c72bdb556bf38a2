"""RDY flow control and backoff for a consumer, as pure code: state in, RDY updates out.

No I/O and no clock reads: every method takes ``now`` (monotonic seconds) and returns the
``RDY`` commands to send as ``(connection key, count)`` pairs. The consumer sends them and
calls :meth:`RdyController.tick` at :meth:`RdyController.next_deadline`.

Rules (NSQ's "building client libraries" guide and go-nsq):

* ``max_in_flight`` is spread evenly (``max_in_flight // connections``, at least 1) and never
  above a connection's ``max_rdy_count``. The total is never exceeded: a connection counts
  as ``max(rdy, in_flight)`` because nsqd (1.x) sends while ``in_flight < rdy``, so lowering a
  connection's RDY frees capacity only as its in-flight messages finish.
* With fewer ``max_in_flight`` than connections, RDY 1 goes to as many connections as fit;
  every ``rdy_redistribute_interval`` the ones idle for ``low_rdy_idle_timeout`` (or holding
  RDY longer than ``low_rdy_timeout``) give it up to ones that had none.
* RDY is refreshed when what is left of the last value drops to 1 or below 25 % of it.
* A failure (``Signal.FAILURE``) raises the backoff level: RDY 0 everywhere for the backoff
  duration; then RDY 1 on one connection tests the waters; each success lowers the level,
  level 0 restores full flow. Results that arrive during a backoff timeout are ignored.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

RdyUpdate = tuple[Hashable, int]


class Signal(enum.Enum):
    """What a finished message tells the backoff logic."""

    SUCCESS = "success"  # FIN: lower the backoff level
    FAILURE = "failure"  # REQ with backoff: raise the backoff level
    CONTINUE = "continue"  # REQ without backoff: keep the level


# Enum member lookups cost a descriptor call; the hot paths compare with these.
_SUCCESS = Signal.SUCCESS
_FAILURE = Signal.FAILURE


class BackoffPolicy(Protocol):
    def ceiling(self, level: int) -> float:
        """The largest duration this policy can give for ``level`` (decides the max level)."""

    def duration(self, level: int, rng: random.Random) -> float:
        """The backoff duration for ``level`` (≥ 1)."""


@dataclass(frozen=True)
class ExponentialBackoff:
    """go-nsq's ``exponential``: ``multiplier × 2^level``."""

    multiplier: float = 1.0

    def ceiling(self, level: int) -> float:
        return self.multiplier * 2.0**level

    def duration(self, level: int, rng: random.Random) -> float:
        return self.ceiling(level)


@dataclass(frozen=True)
class FullJitterBackoff:
    """go-nsq's ``full_jitter``: uniform in ``[0, multiplier × 2^level)``."""

    multiplier: float = 1.0

    def ceiling(self, level: int) -> float:
        return self.multiplier * 2.0**level

    def duration(self, level: int, rng: random.Random) -> float:
        return rng.random() * self.ceiling(level)


def backoff_policy(strategy: str, multiplier: float) -> BackoffPolicy:
    """The policy named by go-nsq's ``backoff_strategy`` option."""
    if strategy == "exponential":
        return ExponentialBackoff(multiplier)
    if strategy == "full_jitter":
        return FullJitterBackoff(multiplier)
    raise ValueError(f"unknown backoff strategy {strategy!r}")


class ConnState:
    """What the controller knows about one connection."""

    __slots__ = ("granted_at", "in_flight", "key", "last_msg", "last_rdy", "max_rdy", "rdy", "received")

    def __init__(self, key: Hashable, max_rdy: int, now: float) -> None:
        self.key = key
        self.max_rdy = max_rdy
        self.rdy = 0  # last RDY sent
        self.in_flight = 0
        self.received = 0  # messages since the last RDY
        self.last_msg = now
        self.last_rdy = now
        self.granted_at = now  # when RDY last went from 0 to > 0

    @property
    def committed(self) -> int:
        """How many messages this connection may hold at most without further RDY."""
        return self.rdy if self.rdy > self.in_flight else self.in_flight

    def __repr__(self) -> str:
        return f"<ConnState {self.key!r} rdy={self.rdy} in_flight={self.in_flight}>"


class RdyController:
    """RDY distribution and backoff for one consumer (see the module docstring)."""

    def __init__(
        self,
        max_in_flight: int,
        *,
        backoff: BackoffPolicy | None = None,
        max_backoff_duration: float = 120.0,
        low_rdy_idle_timeout: float = 10.0,
        low_rdy_timeout: float = 30.0,
        rdy_redistribute_interval: float = 5.0,
        rng: random.Random | None = None,
    ) -> None:
        if max_in_flight < 0:
            raise ValueError("max_in_flight must be >= 0")
        self.max_in_flight = max_in_flight
        self.backoff = backoff or ExponentialBackoff()
        self.max_backoff_duration = max_backoff_duration
        self.low_rdy_idle_timeout = low_rdy_idle_timeout
        self.low_rdy_timeout = low_rdy_timeout
        self.rdy_redistribute_interval = rdy_redistribute_interval
        self.rng = rng or random.Random()
        self.conns: dict[Hashable, ConnState] = {}
        #: Backoff level (0: not backing off).
        self.backoff_level = 0
        #: End of the current backoff timeout (None: not in a timeout).
        self.backoff_until: float | None = None
        self._next_redistribute: float | None = None
        self._starving = False  # some connection got less than its share
        #: Bumped whenever :meth:`next_deadline` may have changed.
        self.version = 0

    # --- queries ----------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """``normal``, ``backoff`` (RDY 0 until the timeout) or ``probe`` (RDY 1 once)."""
        if self.backoff_until is not None:
            return "backoff"
        return "probe" if self.backoff_level > 0 else "normal"

    @property
    def effective_max_in_flight(self) -> int:
        mode = self.mode
        if mode == "backoff":
            return 0
        if mode == "probe":
            return min(1, self.max_in_flight)
        return self.max_in_flight

    @property
    def total_rdy(self) -> int:
        return sum(c.rdy for c in self.conns.values())

    @property
    def total_in_flight(self) -> int:
        return sum(c.in_flight for c in self.conns.values())

    def target(self, c: ConnState) -> int:
        """The even share of ``max_in_flight`` for a connection (normal mode)."""
        n = len(self.conns)
        if self.max_in_flight == 0 or n == 0:
            return 0
        return min(max(1, self.max_in_flight // n), c.max_rdy)

    def is_starved(self) -> bool:
        """True when some connection holds ≥ 85 % of its RDY in flight (time to flush a batch)."""
        return any(c.in_flight > 0 and c.in_flight >= c.rdy * 0.85 for c in self.conns.values())

    def next_deadline(self) -> float | None:
        """When :meth:`tick` should next be called (None: no timer needed)."""
        deadlines: list[float] = []
        if self.backoff_until is not None:
            deadlines.append(self.backoff_until)
        elif self.conns and self._next_redistribute is not None and self._needs_redistribution():
            deadlines.append(self._next_redistribute)
        return min(deadlines) if deadlines else None

    def _needs_redistribution(self) -> bool:
        n = len(self.conns)
        mode = self.mode
        return (mode == "normal" and n > self.max_in_flight > 0) or (mode == "probe" and n > 1)

    # --- events -----------------------------------------------------------------------

    def add_conn(self, key: Hashable, max_rdy_count: int, now: float) -> list[RdyUpdate]:
        """A connection subscribed: give it its share (lowering the others' first)."""
        if key in self.conns:
            raise KeyError(f"connection {key!r} already added")
        self.conns[key] = ConnState(key, max_rdy_count, now)
        if self._next_redistribute is None:
            self._next_redistribute = now + self.rdy_redistribute_interval
        self.version += 1
        out: list[RdyUpdate] = []
        self._rebalance(now, out)
        return out

    def remove_conn(self, key: Hashable, now: float) -> list[RdyUpdate]:
        """A connection closed: its in-flight messages are gone; share its RDY out."""
        if self.conns.pop(key, None) is None:
            return []
        self.version += 1
        out: list[RdyUpdate] = []
        self._rebalance(now, out)
        return out

    def on_message(self, key: Hashable, now: float, count: int = 1) -> list[RdyUpdate]:
        """``count`` messages arrived on ``key`` (one read's worth at a time is fine)."""
        c = self.conns.get(key)
        if c is None:
            return []
        c.in_flight += count
        c.received += count
        c.last_msg = now
        if self.backoff_level or self.backoff_until is not None:
            return []
        # Shares only shrink on add/remove/set_max_in_flight, which lower RDY at once; here
        # only the refresh rule applies.
        remaining = c.rdy - c.received
        if c.rdy > 0 and (remaining <= 1 or remaining * 4 < c.rdy):
            # Refresh (needed by servers that count RDY down; harmless for nsqd 1.x).
            c.received = 0
            c.last_rdy = now
            return [(c.key, c.rdy)]
        return []

    def on_finished(self, key: Hashable, signal: Signal, now: float) -> list[RdyUpdate]:
        """A message of ``key`` was FINed (SUCCESS) or REQed (FAILURE/CONTINUE)."""
        out: list[RdyUpdate] = []
        c = self.conns.get(key)
        if c is not None and c.in_flight > 0:
            c.in_flight -= 1
        if not self._signal(signal, now, out) and self._starving:
            self._rebalance(now, out)
        return out

    def on_fin(self, key: Hashable) -> bool:
        """The hot path of :meth:`on_finished` for a SUCCESS or CONTINUE: when it cannot
        change any RDY (backoff level 0, so no backoff timeout either, and no connection
        starving), record it and return True; otherwise record nothing and return False
        (then call :meth:`on_finished`)."""
        if self.backoff_level or self._starving:
            return False
        c = self.conns.get(key)
        if c is not None and c.in_flight > 0:
            c.in_flight -= 1
        return True

    def set_max_in_flight(self, n: int, now: float) -> list[RdyUpdate]:
        if n < 0:
            raise ValueError("max_in_flight must be >= 0")
        self.max_in_flight = n
        self.version += 1
        out: list[RdyUpdate] = []
        self._rebalance(now, out)
        return out

    def tick(self, now: float) -> list[RdyUpdate]:
        """Timers: end of a backoff timeout, and periodic RDY redistribution."""
        out: list[RdyUpdate] = []
        if self.backoff_until is not None and now >= self.backoff_until:
            self.version += 1
            if self.conns:
                self.backoff_until = None
                self._rebalance(now, out)  # probe: RDY 1 on one connection
            else:
                self.backoff_until = now + 1.0  # nobody to test the waters with: wait
        if self._next_redistribute is not None and now >= self._next_redistribute:
            self._next_redistribute = now + self.rdy_redistribute_interval
            self.version += 1
            if self.backoff_until is None and self._needs_redistribution():
                self._redistribute(now, out)
        return out

    # --- internals --------------------------------------------------------------------

    def _set(self, c: ConnState, n: int, now: float, out: list[RdyUpdate]) -> None:
        if n == c.rdy:
            return
        if c.rdy == 0:
            c.granted_at = now
        c.rdy = n
        c.received = 0
        c.last_rdy = now
        out.append((c.key, n))

    def _capacity(self, c: ConnState) -> int:
        """How high ``c``'s RDY may go without letting the total exceed the limit."""
        others = sum(d.committed for d in self.conns.values() if d is not c)
        return self.effective_max_in_flight - others

    def _grant(self, c: ConnState, want: int, now: float, out: list[RdyUpdate]) -> bool:
        want = min(want, c.max_rdy)
        n = max(0, min(want, self._capacity(c)))
        if n > c.rdy:
            self._set(c, n, now, out)
        return c.rdy >= want

    def _signal(self, signal: Signal, now: float, out: list[RdyUpdate]) -> bool:
        """Apply a backoff signal; True if it changed RDY state itself."""
        if self.backoff_until is not None:
            return False  # one result per timeout: ignore the rest
        updated = False
        level = self.backoff_level
        if signal is _SUCCESS:
            if level > 0:
                level -= 1
                updated = True
        elif signal is _FAILURE and self.backoff.ceiling(level + 1) <= self.max_backoff_duration:
            level += 1
            updated = True
        self.backoff_level = level
        if level == 0 and updated:
            self.version += 1
            self._rebalance(now, out)  # back to full flow
            return True
        if level > 0:
            duration = min(self.backoff.duration(level, self.rng), self.max_backoff_duration)
            self.backoff_until = now + duration
            self.version += 1
            self._rebalance(now, out)  # RDY 0 everywhere
            return True
        return False

    def _rebalance(self, now: float, out: list[RdyUpdate]) -> None:
        self._starving = False
        conns = list(self.conns.values())
        if not conns:
            return
        mode = self.mode
        eff = self.effective_max_in_flight
        if mode == "backoff" or eff == 0:
            for c in conns:
                self._set(c, 0, now, out)
            return
        if mode == "probe":
            holders = [c for c in conns if c.rdy > 0]
            for c in holders[1:]:
                self._set(c, 0, now, out)
            if holders:
                self._set(holders[0], 1, now, out)
            else:
                # Test the waters on a connection that can take a message right now.
                free = [c for c in conns if c.in_flight == 0 and self._capacity(c) > 0]
                if free:
                    self._set(self.rng.choice(free), 1, now, out)
                else:
                    self._starving = True
            return
        if len(conns) <= eff:
            for c in conns:
                t = self.target(c)
                if c.rdy > t:
                    self._set(c, t, now, out)
            self._trim(conns, eff, now, out)
            for c in conns:
                if c.rdy < self.target(c) and not self._grant(c, self.target(c), now, out):
                    self._starving = True
            return
        # Fewer max_in_flight than connections: at most RDY 1 each, as many as fit.
        for c in conns:
            if c.rdy > 1:
                self._set(c, 1, now, out)
        self._trim(conns, eff, now, out)
        for c in conns:
            if c.rdy == 0 and c.in_flight == 0 and self._capacity(c) > 0:
                self._set(c, 1, now, out)

    def _trim(self, conns: list[ConnState], eff: int, now: float, out: list[RdyUpdate]) -> None:
        """Lower RDY (least recently active first) until the committed total fits in ``eff``,
        as far as RDY can: messages already in flight stay counted until they finish."""
        excess = sum(c.committed for c in conns) - eff
        if excess <= 0:
            return
        for c in sorted(conns, key=lambda c: max(c.last_msg, c.granted_at)):
            if c.rdy > c.in_flight:
                before = c.committed
                self._set(c, max(0, c.rdy - excess), now, out)
                excess -= before - c.committed
                if excess <= 0:
                    return

    def _redistribute(self, now: float, out: list[RdyUpdate]) -> None:
        eff = self.effective_max_in_flight
        zeroed: list[ConnState] = []
        for c in self.conns.values():
            if c.rdy > 0 and (
                now - max(c.last_msg, c.granted_at) > self.low_rdy_idle_timeout
                or now - c.granted_at > self.low_rdy_timeout
            ):
                self._set(c, 0, now, out)
                zeroed.append(c)
        available = eff - sum(c.committed for c in self.conns.values())
        fresh = [c for c in self.conns.values() if c.rdy == 0 and c.in_flight == 0 and c not in zeroed]
        self.rng.shuffle(fresh)
        self.rng.shuffle(zeroed)
        for c in fresh + [z for z in zeroed if z.in_flight == 0]:
            if available <= 0:
                break
            self._set(c, 1, now, out)
            available -= 1
