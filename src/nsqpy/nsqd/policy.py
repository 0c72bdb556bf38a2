"""Queue policies: message TTL, bounded queues, dead-lettering and a delivery rate, as
settings of a topic or a channel (an nsqpy addition: nsqio/nsq #302, #1396, #549, #567,
#387, #974, #1309, #1518 — NSQ's answer is "do it in the consumer").

A queue without settings has ``policy`` None and pays one attribute check on its hot paths.
The settings are set over HTTP (``POST /topic/config``, ``/channel/config``), kept in
``nsqd.dat`` under a ``config`` key the Go nsqd ignores, and applied:

- ``max_depth`` / ``max_bytes`` (messages / bytes of bodies held: memory and disk) with
  ``overflow`` ``reject`` (a publish that would go past the bound of the topic, or of any of
  its channels set to reject, is refused whole) or ``drop_oldest`` (the oldest messages of
  that queue are dropped, counted);
- ``max_age``: a message older than that (from its publish time) is never delivered: counted,
  and published to the channel's ``dead_letter_topic`` when it has one;
- ``max_attempts``: a message about to be delivered for attempt ``max_attempts + 1`` goes to
  the ``dead_letter_topic`` instead (or is dropped, counted, without one);
- ``max_rate``: the channel sends at most that many messages a second over all its
  consumers (a token bucket holding one second's worth).
"""

from __future__ import annotations

import math
import time
from typing import Any

from ..govalues import format_duration_ns, parse_duration_ns
from ..protocol.names import is_valid_topic_name

__all__ = [
    "CHANNEL_KEYS",
    "OVERFLOW_MODES",
    "TOPIC_KEYS",
    "Policy",
    "PolicyError",
    "PolicyRejectedError",
]

TOPIC_KEYS = ("max_depth", "max_bytes", "overflow", "max_age")
CHANNEL_KEYS = (*TOPIC_KEYS, "max_attempts", "dead_letter_topic", "max_rate")
OVERFLOW_MODES = ("reject", "drop_oldest")

#: attempts are a uint16 on the wire
_MAX_ATTEMPTS = 65535


class PolicyError(ValueError):
    """A settings update nsqd refuses (HTTP 400): the message names the key or value."""


class PolicyRejectedError(Exception):
    """A publish refused by a bound (``overflow`` ``reject``): nothing of it was stored."""


class Policy:
    """The settings of one topic or channel, and the state that enforcing them needs (the
    rate's token bucket)."""

    __slots__ = (
        "_tokens",
        "_tokens_at",
        "dead_letter_topic",
        "max_age_ns",
        "max_attempts",
        "max_bytes",
        "max_depth",
        "max_rate",
        "overflow",
    )

    def __init__(self) -> None:
        self.max_depth: int | None = None
        self.max_bytes: int | None = None
        self.overflow: str | None = None
        self.max_age_ns: int | None = None
        self.max_attempts: int | None = None
        self.dead_letter_topic: str | None = None
        self.max_rate: float | None = None
        self._tokens = 0.0
        self._tokens_at = 0.0

    # --- what it takes --------------------------------------------------------------------------

    @property
    def bounded(self) -> bool:
        return self.max_depth is not None or self.max_bytes is not None

    @property
    def rejects(self) -> bool:
        """A bound that refuses publishes (``overflow`` reject, the default)."""
        return self.bounded and self.overflow != "drop_oldest"

    @property
    def drops_oldest(self) -> bool:
        return self.bounded and self.overflow == "drop_oldest"

    @property
    def filters(self) -> bool:
        """Messages may be taken off the way to a consumer (max_age, max_attempts)."""
        return self.max_age_ns is not None or self.max_attempts is not None

    @property
    def empty(self) -> bool:
        return all(getattr(self, k) is None for k in self.__slots__ if not k.startswith("_"))

    def over(self, depth: int, nbytes: int) -> bool:
        """A queue holding ``depth`` messages of ``nbytes`` bytes is past a bound."""
        return (self.max_depth is not None and depth > self.max_depth) or (
            self.max_bytes is not None and nbytes > self.max_bytes
        )

    def bound_text(self, depth: int, nbytes: int) -> str:
        """Which bound ``depth``/``nbytes`` would pass, for the refusal's message."""
        if self.max_depth is not None and depth > self.max_depth:
            return f"max_depth {self.max_depth}"
        return f"max_bytes {self.max_bytes}"

    # --- the rate ---------------------------------------------------------------------------------

    def tokens(self, now: float) -> float:
        """Messages the channel may send now (``max_rate`` set): the bucket refilled for the
        time since it was last drawn on, up to one second's worth."""
        rate = self.max_rate
        assert rate is not None
        t = min(self._tokens + (now - self._tokens_at) * rate, max(rate, 1.0))
        self._tokens = t
        self._tokens_at = now
        return t

    def spend(self, n: int) -> None:
        self._tokens -= n

    # --- JSON ---------------------------------------------------------------------------------------

    def to_json(self, keys: tuple[str, ...]) -> dict[str, Any]:
        """The effective settings: every key, null where unset (``overflow`` is ``reject``
        unless set)."""
        out: dict[str, Any] = {}
        for k in keys:
            if k == "overflow":
                out[k] = self.overflow or "reject"
            elif k == "max_age":
                out[k] = None if self.max_age_ns is None else format_duration_ns(self.max_age_ns)
            else:
                out[k] = getattr(self, k)
        return out

    def to_metadata(self, keys: tuple[str, ...]) -> dict[str, Any]:
        """The keys that are set, as ``nsqd.dat`` keeps them (durations in Go's syntax)."""
        out = self.to_json(keys)
        if self.overflow is None:
            del out["overflow"]
        return {k: v for k, v in out.items() if v is not None}

    def updated(self, body: Any, keys: tuple[str, ...], topic: str) -> Policy:
        """A copy with the keys ``body`` names set (``null`` unsets one). Raises PolicyError
        naming the first unknown key or bad value; ``topic`` is the queue's own (a channel's
        dead letters may not go back to it)."""
        if not isinstance(body, dict):
            raise PolicyError("the body must be a JSON object of settings")
        new = Policy()
        for k in self.__slots__:
            setattr(new, k, getattr(self, k))
        for key, value in body.items():
            if key not in keys:
                raise PolicyError(f"unknown key {_show(key)} (the keys are {', '.join(keys)})")
            new._set(key, value, topic)
        return new

    def _set(self, key: str, value: Any, topic: str) -> None:
        if key in ("max_depth", "max_bytes", "max_attempts"):
            ok = value is None or (type(value) is int and value >= 1)
            if key == "max_attempts" and ok and value is not None:
                ok = value <= _MAX_ATTEMPTS
            if not ok:
                limit = f" and <= {_MAX_ATTEMPTS}" if key == "max_attempts" else ""
                raise PolicyError(f"invalid {key} {_show(value)}: an integer >= 1{limit}, or null")
            setattr(self, key, value)
        elif key == "overflow":
            if value is not None and value not in OVERFLOW_MODES:
                raise PolicyError(f'invalid overflow {_show(value)}: "reject" or "drop_oldest", or null')
            self.overflow = value
        elif key == "max_age":
            if value is None:
                self.max_age_ns = None
                return
            ns = -1
            if isinstance(value, str):
                try:
                    ns = parse_duration_ns(value)
                except ValueError:
                    ns = -1
            if ns <= 0:
                raise PolicyError(
                    f'invalid max_age {_show(value)}: a duration such as "90s" or "1h", or null'
                )
            self.max_age_ns = ns
        elif key == "dead_letter_topic":
            if value is not None and not (isinstance(value, str) and is_valid_topic_name(value)):
                raise PolicyError(f"invalid dead_letter_topic {_show(value)}: a valid topic name, or null")
            if value == topic:
                raise PolicyError(f"invalid dead_letter_topic {_show(value)}: the channel's own topic")
            self.dead_letter_topic = value
        elif key == "max_rate":
            ok = value is None or (type(value) in (int, float) and math.isfinite(value) and value > 0)
            if not ok:
                raise PolicyError(f"invalid max_rate {_show(value)}: messages a second (> 0), or null")
            self.max_rate = value
            self._tokens = 0.0 if value is None else float(max(value, 1))  # a full bucket
            self._tokens_at = time.monotonic()

    @classmethod
    def from_metadata(cls, doc: Any, keys: tuple[str, ...], topic: str) -> Policy | None:
        """The settings ``nsqd.dat`` kept (None for none). Raises PolicyError."""
        if doc is None:
            return None
        p = cls().updated(doc, keys, topic)
        return None if p.empty else p


def _show(value: Any) -> str:
    import json

    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
