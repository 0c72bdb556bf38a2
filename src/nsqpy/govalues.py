"""Go's value syntaxes, as the NSQ daemons parse and print them: ``strconv`` numbers and
bools, ``time.Duration``, ``%q`` and ``%v`` formatting, log level names.
"""

from __future__ import annotations

import math
from typing import Any, Final

NS_PER_S: Final = 1_000_000_000


def go_quote(s: str) -> str:
    """Go's ``%q`` for the strings that show up in error messages."""
    out = ['"']
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _time_quote(s: str) -> str:
    """The ``time`` package's quoting: non-ASCII and control bytes as ``\\xNN``."""
    out = ['"']
    for ch in s:
        if ord(ch) >= 0x80 or ord(ch) < 0x20:
            out.extend(f"\\x{b:02x}" for b in ch.encode())
        else:
            if ch in '"\\':
                out.append("\\")
            out.append(ch)
    out.append('"')
    return "".join(out)


class NumError(ValueError):
    """A ``strconv`` error: syntax or range."""

    def __init__(self, func: str, num: str, out_of_range: bool) -> None:
        self.out_of_range = out_of_range
        reason = "value out of range" if out_of_range else "invalid syntax"
        super().__init__(f"strconv.{func}: parsing {go_quote(num)}: {reason}")

    @property
    def flag_reason(self) -> str:
        """What the ``flag`` package prints for this error."""
        return "value out of range" if self.out_of_range else "parse error"


_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_bool(s: str) -> bool:
    """``strconv.ParseBool``."""
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise NumError("ParseBool", s, False)


def _underscore_ok(s: str) -> bool:
    """``strconv``'s rule: underscores only between digits or after a base prefix."""
    saw = "^"
    i = 0
    if s[:1] in ("+", "-"):
        s = s[1:]
    hexa = False
    if len(s) >= 2 and s[0] == "0" and s[1].lower() in "box":
        i = 2
        saw = "0"
        hexa = s[1].lower() == "x"
    for ch in s[i:]:
        if (ch.isdigit() and ch.isascii()) or (hexa and ch.lower() in "abcdef"):
            saw = "0"
            continue
        if ch == "_":
            if saw != "0":
                return False
            saw = "_"
            continue
        if saw == "_":
            return False
        saw = "!"
    return saw != "_"


def parse_int(s: str, *, base0: bool) -> int:
    """``strconv.ParseInt(s, 0 or 10, 64)``: base 0 takes 0x/0o/0b/0 prefixes and underscores."""
    if not s:
        raise NumError("ParseInt", s, False)
    body = s
    neg = False
    if body[0] in "+-":
        neg = body[0] == "-"
        body = body[1:]
    if not body:
        raise NumError("ParseInt", s, False)
    digits = body
    base = 10
    if base0 and digits[0] == "0":
        prefix = digits[1:2].lower()
        if len(digits) >= 3 and prefix in ("b", "o", "x"):
            base = {"b": 2, "o": 8, "x": 16}[prefix]
            digits = digits[2:]
        else:
            base = 8
            digits = digits[1:]
    value = 0
    underscores = False
    for ch in digits:
        if ch == "_" and base0:
            underscores = True
            continue
        if "0" <= ch <= "9":
            d = ord(ch) - 48
        elif "a" <= ch.lower() <= "z":
            d = ord(ch.lower()) - 87
        else:
            raise NumError("ParseInt", s, False)
        if d >= base:
            raise NumError("ParseInt", s, False)
        value = value * base + d
        if value >= 1 << 64:
            raise NumError("ParseInt", s, True)
    if underscores and not _underscore_ok(body):
        raise NumError("ParseInt", s, False)
    if value >= 1 << 63 and not (neg and value == 1 << 63):
        raise NumError("ParseInt", s, True)
    return -value if neg else value


def parse_float(s: str) -> float:
    """``strconv.ParseFloat(s, 64)`` (decimal syntax, inf and nan)."""
    if not s or not s.isascii() or s != s.strip():
        raise NumError("ParseFloat", s, False)
    try:
        value = float(s)
    except ValueError:
        raise NumError("ParseFloat", s, False) from None
    if math.isinf(value) and "inf" not in s.lower():
        raise NumError("ParseFloat", s, True)
    return value


_DURATION_UNITS: Final[dict[str, int]] = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek mu
    "ms": 1_000_000,
    "s": NS_PER_S,
    "m": 60 * NS_PER_S,
    "h": 3600 * NS_PER_S,
}
_MAX_NS: Final = 1 << 63


def parse_duration_ns(s: str) -> int:
    """Go's ``time.ParseDuration``: ``"1h2m3.5s"``, ``"250ms"``, ``"-1.5us"``, ``"0"`` → ns.

    Raises ValueError with Go's message, e.g. ``time: missing unit in duration "5"``.
    """
    orig = s
    invalid = f"time: invalid duration {_time_quote(orig)}"
    neg = False
    if s and s[0] in "+-":
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(invalid)
    total = 0
    i, n = 0, len(s)
    while i < n:
        if not (s[i] == "." or "0" <= s[i] <= "9"):
            raise ValueError(invalid)
        start = i
        whole = 0
        while i < n and "0" <= s[i] <= "9":
            if whole > _MAX_NS // 10:
                raise ValueError(invalid)
            whole = whole * 10 + ord(s[i]) - 48
            if whole > _MAX_NS:
                raise ValueError(invalid)
            i += 1
        pre = i != start
        frac, scale, post = 0, 1.0, False
        if i < n and s[i] == ".":
            i += 1
            fstart = i
            overflow = False
            while i < n and "0" <= s[i] <= "9":
                if not overflow:
                    if frac > (_MAX_NS - 1) // 10:
                        overflow = True
                    else:
                        nxt = frac * 10 + ord(s[i]) - 48
                        if nxt > _MAX_NS:
                            overflow = True
                        else:
                            frac = nxt
                            scale *= 10
                i += 1
            post = i != fstart
        if not pre and not post:
            raise ValueError(invalid)
        ustart = i
        while i < n and not (s[i] == "." or "0" <= s[i] <= "9"):
            i += 1
        if i == ustart:
            raise ValueError(f"time: missing unit in duration {_time_quote(orig)}")
        unit_name = s[ustart:i]
        unit = _DURATION_UNITS.get(unit_name)
        if unit is None:
            raise ValueError(f"time: unknown unit {_time_quote(unit_name)} in duration {_time_quote(orig)}")
        if whole > _MAX_NS // unit:
            raise ValueError(invalid)
        value = whole * unit
        if frac > 0:
            # float64 arithmetic on purpose: it is what Go does for fractional units
            value += int(float(frac) * (float(unit) / scale))
            if value > _MAX_NS:
                raise ValueError(invalid)
        total += value
        if total > _MAX_NS:
            raise ValueError(invalid)
    if neg:
        return -total
    if total > _MAX_NS - 1:
        raise ValueError(invalid)
    return total


def parse_duration(s: str) -> float:
    """Go's ``time.ParseDuration`` in float seconds."""
    return parse_duration_ns(s) / NS_PER_S


def to_ns(seconds: float) -> int:
    """Float seconds → integer nanoseconds (a Go ``time.Duration``)."""
    return round(seconds * NS_PER_S)


def format_duration(seconds: float) -> str:
    """Go's ``time.Duration.String``: ``60.0`` → ``"1m0s"``, ``0.25`` → ``"250ms"``."""
    return format_duration_ns(to_ns(seconds))


def format_duration_ns(ns: int) -> str:
    """Go's ``time.Duration.String`` of integer nanoseconds (``1500`` → ``"1.5µs"``)."""
    if ns == 0:
        return "0s"
    neg = ns < 0
    u = -ns if neg else ns

    def split(v: int, prec: int) -> tuple[int, str]:
        digits = f"{v % 10**prec:0{prec}d}".rstrip("0")
        return v // 10**prec, "." + digits if digits else ""

    if u < NS_PER_S:
        if u < 1_000:
            out = f"{u}ns"
        elif u < 1_000_000:
            whole, frac = split(u, 3)
            out = f"{whole}{frac}\u00b5s"
        else:
            whole, frac = split(u, 6)
            out = f"{whole}{frac}ms"
    else:
        secs, frac = split(u, 9)
        out = f"{secs % 60}{frac}s"
        minutes = secs // 60
        if minutes:
            out = f"{minutes % 60}m{out}"
            if minutes // 60:
                out = f"{minutes // 60}h{out}"
    return "-" + out if neg else out


def go_float_v(f: float) -> str:
    """Go's ``%v`` for a float64 (shortest digits, exponent below 1e-4 or from 1e21)."""
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    from decimal import Decimal  # (only for --config values and flag output: not at start-up)

    d = Decimal(repr(f)).normalize()
    sign, digits, exp = d.as_tuple()
    assert isinstance(exp, int)
    point = len(digits) + exp - 1  # decimal exponent of the leading digit
    if f != 0 and (point < -4 or point >= 21):
        mant = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
        return f"{'-' if sign else ''}{mant}e{'-' if point < 0 else '+'}{abs(point):02d}"
    return f"{d:f}"


def go_v(v: Any) -> str:
    """Go's ``%v`` for a value decoded from TOML."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return go_float_v(v)
    if isinstance(v, list):
        return "[" + " ".join(go_v(x) for x in v) + "]"
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{go_v(v[k])}" for k in sorted(v)) + "]"
    return str(v)


def go_type(v: Any) -> str:
    """The Go type a TOML value decodes to, for coercion error messages."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int64"
    if isinstance(v, float):
        return "float64"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "[]interface {}"
    if isinstance(v, dict):
        return "map[string]interface {}"
    from datetime import date, datetime
    from datetime import time as clock_time

    if isinstance(v, datetime | date | clock_time):
        return "time.Time"
    return type(v).__name__


def go_sprint_s(v: Any) -> str:
    """Go's ``fmt.Sprintf("%s", v)`` for a non-string TOML value (go-options coerceString)."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool | int | float):
        return f"%!s({go_type(v)}={go_v(v)})"
    if isinstance(v, list):
        return "[" + " ".join(go_sprint_s(x) for x in v) + "]"
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{go_sprint_s(v[k])}" for k in sorted(v)) + "]"
    return str(v)


#: Log level names (as ``--log-level`` accepts them) and Go's ``lg.LogLevel`` ints.
LOG_LEVELS: Final[dict[str, int]] = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}


def parse_log_level(s: str) -> str:
    """``lg.LogLevel.Set``: a case-insensitive level name, returned lower-case."""
    name = s.lower()
    if name not in LOG_LEVELS:
        raise ValueError(f"invalid log level '{s}' (debug, info, warn, error, fatal)")
    return name
