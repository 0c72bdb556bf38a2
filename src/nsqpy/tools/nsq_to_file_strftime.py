"""``<DATETIME>`` as NSQ 1.3's ``nsq_to_file`` writes it: its ``strftime`` turns each known
``%x`` directive into the matching piece of a Go layout and hands the result to Go's
``time.Time.Format``, which then reads *every* layout token in the string, literal text
included (``%Y1`` gives ``2024`` followed by the month, ``%bx`` stays ``Janx``).

:func:`go_strftime` reproduces both steps: the directive table of ``apps/nsq_to_file/
strftime.go`` and Go's layout tokenizer and formatter (``time/format.go``). Unknown
directives (``%j``) are kept as literal text, as in Go.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

__all__ = ["Layout", "go_strftime", "strftime_to_go_layout"]

#: nsq_to_file's ``%x`` → Go layout table.
_CONVERSION: Final = {
    "B": "January",
    "b": "Jan",
    "m": "01",
    "A": "Monday",
    "a": "Mon",
    "d": "02",
    "H": "15",
    "I": "03",
    "M": "04",
    "S": "05",
    "Y": "2006",
    "y": "06",
    "p": "PM",
    "Z": "MST",
    "z": "-0700",
    "%": "%",
}

_MONTHS: Final = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_DAYS: Final = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def strftime_to_go_layout(fmt: str) -> str:
    """``strftimeToGoFormat``: each known ``%x`` becomes its Go layout piece."""
    out: list[str] = []
    i, n = 0, len(fmt)
    while i < n:
        if fmt[i] == "%" and i <= n - 2:
            piece = _CONVERSION.get(fmt[i + 1])
            if piece is not None:
                out.append(piece)
                i += 2
                continue
        out.append(fmt[i])
        i += 1
    return "".join(out)


class _T:
    """The broken-down local time a layout is formatted from."""

    __slots__ = (
        "day",
        "hour",
        "minute",
        "month",
        "nanos",
        "offset",
        "second",
        "wday",
        "yday",
        "year",
        "zone",
    )

    def __init__(self, ns: int) -> None:
        tm = time.localtime(ns // 1_000_000_000)
        self.year, self.month, self.day = tm.tm_year, tm.tm_mon, tm.tm_mday
        self.hour, self.minute, self.second = tm.tm_hour, tm.tm_min, tm.tm_sec
        self.nanos = ns % 1_000_000_000
        self.wday = tm.tm_wday  # Monday = 0
        self.yday = tm.tm_yday
        self.zone = tm.tm_zone or ""
        self.offset = tm.tm_gmtoff or 0


Chunk = Callable[[_T], str]


def _pad(v: int, width: int) -> str:
    """Go's ``appendInt(b, v, width)``: zero-padded to ``width`` (no padding for 0)."""
    s = str(abs(v)).rjust(width, "0")
    return "-" + s if v < 0 else s


def _hour12(t: _T) -> int:
    h = t.hour % 12
    return 12 if h == 0 else h


def _under_yday(t: _T) -> str:
    return ("  " if t.yday < 10 else " " if t.yday < 100 else "") + str(t.yday)


def _tz(iso: bool, colon: bool, minutes: bool, seconds: bool) -> Chunk:
    """The numeric zone layouts (``-0700``, ``Z07:00``…); ISO forms print ``Z`` for UTC."""

    def fmt(t: _T) -> str:
        offset = t.offset
        if offset == 0 and iso:
            return "Z"
        sign = "-" if offset < 0 else "+"
        a = abs(offset)
        zone = a // 60
        out = sign + _pad(zone // 60, 2)
        if colon:
            out += ":"
        if minutes:
            out += _pad(zone % 60, 2)
        if seconds:
            if colon:
                out += ":"
            out += _pad(a % 60, 2)
        return out

    return fmt


def _zone_name(t: _T) -> str:
    if t.zone:
        return t.zone
    zone = t.offset // 60
    sign = "-" if zone < 0 else "+"
    zone = abs(zone)
    return sign + _pad(zone // 60, 2) + _pad(zone % 60, 2)


def _frac(sep: str, digits: int, trim: bool) -> Chunk:
    def fmt(t: _T) -> str:
        if trim and (digits == 0 or t.nanos == 0):
            return ""
        s = _pad(t.nanos, 9)[: min(digits, 9)]
        if trim:
            s = s.rstrip("0")
            if not s:
                return ""
        return sep + s

    return fmt


_STD: Final[dict[str, Chunk]] = {
    "January": lambda t: _MONTHS[t.month - 1],
    "Jan": lambda t: _MONTHS[t.month - 1][:3],
    "1": lambda t: str(t.month),
    "01": lambda t: _pad(t.month, 2),
    "Monday": lambda t: _DAYS[t.wday],
    "Mon": lambda t: _DAYS[t.wday][:3],
    "2": lambda t: str(t.day),
    "_2": lambda t: (" " if t.day < 10 else "") + str(t.day),
    "02": lambda t: _pad(t.day, 2),
    "__2": _under_yday,
    "002": lambda t: _pad(t.yday, 3),
    "15": lambda t: _pad(t.hour, 2),
    "3": lambda t: str(_hour12(t)),
    "03": lambda t: _pad(_hour12(t), 2),
    "4": lambda t: str(t.minute),
    "04": lambda t: _pad(t.minute, 2),
    "5": lambda t: str(t.second),
    "05": lambda t: _pad(t.second, 2),
    "2006": lambda t: _pad(t.year, 4),
    "06": lambda t: _pad(t.year % 100, 2),
    "PM": lambda t: "PM" if t.hour >= 12 else "AM",
    "pm": lambda t: "pm" if t.hour >= 12 else "am",
    "MST": _zone_name,
    "Z0700": _tz(True, False, True, False),
    "Z070000": _tz(True, False, True, True),
    "Z07": _tz(True, False, False, False),
    "Z07:00": _tz(True, True, True, False),
    "Z07:00:00": _tz(True, True, True, True),
    "-0700": _tz(False, False, True, False),
    "-070000": _tz(False, False, True, True),
    "-07": _tz(False, False, False, False),
    "-07:00": _tz(False, True, True, False),
    "-07:00:00": _tz(False, True, True, True),
}


def _is_lower(s: str, i: int) -> bool:
    return i < len(s) and "a" <= s[i] <= "z"


def _next_std(layout: str, i: int) -> tuple[int, str, int] | None:
    """Go's ``nextStdChunk`` from position ``i``: (start, token, end) of the next layout
    token, or None when the rest is literal text. A fractional-second token is returned as
    ``.000``/``,999``… (its text)."""
    n = len(layout)
    while i < n:
        c = layout[i]
        if c == "J" and layout.startswith("Jan", i):
            if layout.startswith("January", i):
                return i, "January", i + 7
            if not _is_lower(layout, i + 3):
                return i, "Jan", i + 3
        elif c == "M":
            if layout.startswith("Mon", i):
                if layout.startswith("Monday", i):
                    return i, "Monday", i + 6
                if not _is_lower(layout, i + 3):
                    return i, "Mon", i + 3
            if layout.startswith("MST", i):
                return i, "MST", i + 3
        elif c == "0":
            if i + 1 < n and "1" <= layout[i + 1] <= "6":
                return i, layout[i : i + 2], i + 2
            if layout.startswith("002", i):
                return i, "002", i + 3
        elif c == "1":
            if i + 1 < n and layout[i + 1] == "5":
                return i, "15", i + 2
            return i, "1", i + 1
        elif c == "2":
            if layout.startswith("2006", i):
                return i, "2006", i + 4
            return i, "2", i + 1
        elif c == "_":
            if i + 1 < n and layout[i + 1] == "2":
                if layout.startswith("2006", i + 1):  # a literal "_", then the year
                    return i + 1, "2006", i + 5
                return i, "_2", i + 2
            if layout.startswith("__2", i):
                return i, "__2", i + 3
        elif c in "345":
            return i, c, i + 1
        elif c == "P":
            if i + 1 < n and layout[i + 1] == "M":
                return i, "PM", i + 2
        elif c == "p":
            if i + 1 < n and layout[i + 1] == "m":
                return i, "pm", i + 2
        elif c == "-":
            for tok in ("-070000", "-07:00:00", "-0700", "-07:00", "-07"):
                if layout.startswith(tok, i):
                    return i, tok, i + len(tok)
        elif c == "Z":
            for tok in ("Z070000", "Z07:00:00", "Z0700", "Z07:00", "Z07"):
                if layout.startswith(tok, i):
                    return i, tok, i + len(tok)
        elif c in ".," and i + 1 < n and layout[i + 1] in "09":
            ch = layout[i + 1]
            j = i + 1
            while j < n and layout[j] == ch:
                j += 1
            if not (j < n and layout[j].isdigit() and layout[j].isascii()):
                return i, layout[i:j], j
        i += 1
    return None


class Layout:
    """A Go layout parsed once (literal text and token formatters), formatted per call."""

    __slots__ = ("parts",)

    def __init__(self, layout: str) -> None:
        parts: list[str | Chunk] = []
        i = 0
        while True:
            found = _next_std(layout, i)
            if found is None:
                if i < len(layout):
                    parts.append(layout[i:])
                break
            start, tok, end = found
            if start > i:
                parts.append(layout[i:start])
            if tok[0] in ".,":
                parts.append(_frac(tok[0], len(tok) - 1, tok[1] == "9"))
            else:
                parts.append(_STD[tok])
            i = end
        self.parts = parts

    def format(self, ns: int | None = None) -> str:
        """Go's ``time.Unix(0, ns).Format(layout)`` in local time (now by default)."""
        t = _T(time.time_ns() if ns is None else ns)
        return "".join(p if isinstance(p, str) else p(t) for p in self.parts)


def go_strftime(fmt: str, ns: int | None = None) -> str:
    """nsq_to_file's ``strftime(format, t)`` for ``ns`` (Unix nanoseconds; now by default)."""
    return Layout(strftime_to_go_layout(fmt)).format(ns)
