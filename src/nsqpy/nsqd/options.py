"""nsqd options: the flag table, Go-style flag parsing, the TOML config file and validation.

One :class:`Options` object holds every setting of the daemon. :func:`parse_args` fills it the
way the Go nsqd does: Go ``flag`` package syntax, then an optional ``--config`` TOML file whose
values the command line overrides (``options.Resolve``), with Go's value coercions. Durations
are float seconds here; :func:`config_value` turns them back into the JSON shapes that
``GET /config/:opt`` returns in Go (durations as integer nanoseconds, enums as Go ints).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import socket
import tomllib
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from datetime import time as clock_time
from decimal import Decimal
from typing import Any, Final

from nsqpy.protocol.errors import NSQError

__all__ = [
    "FLAGS",
    "LOG_LEVELS",
    "TLS_MIN_VERSIONS",
    "TLS_REQUIRED_VALUES",
    "UNBUILT_FEATURES",
    "Flag",
    "HelpRequested",
    "InvalidOptionError",
    "InvalidValueError",
    "Options",
    "OptionsError",
    "config_value",
    "default_node_id",
    "format_duration",
    "parse_args",
    "parse_duration",
    "parse_duration_ns",
    "set_config_value",
    "unbuilt_requested",
    "usage",
    "validate",
]


class OptionsError(NSQError, ValueError):
    """A bad flag, config file or option value; the message is what Go nsqd would print."""


class InvalidOptionError(OptionsError):
    """``PUT /config/:opt`` on an option that cannot be changed (HTTP 400 ``INVALID_OPTION``)."""


class InvalidValueError(OptionsError):
    """``PUT /config/:opt`` with a body that is not a valid value (HTTP 400 ``INVALID_VALUE``)."""


class HelpRequested(NSQError):
    """``-h``/``-help``/``--help`` was given: print :attr:`usage` and exit 0."""

    def __init__(self, usage_text: str) -> None:
        self.usage = usage_text
        super().__init__(usage_text)


# --------------------------------------------------------------------------------------------
# Enumerations and their Go encodings
# --------------------------------------------------------------------------------------------

#: Log level names (as ``--log-level`` accepts them) and Go's ``lg.LogLevel`` ints.
LOG_LEVELS: Final[dict[str, int]] = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}

#: ``--tls-required`` values and Go's ``TLSNotRequired``/``TLSRequiredExceptHTTP``/``TLSRequired``.
TLS_REQUIRED_VALUES: Final[dict[str, int]] = {"false": 0, "tcp-https": 1, "true": 2}

#: ``--tls-min-version`` names and their protocol numbers (Go's ``tls.VersionTLS1x``).
TLS_MIN_VERSIONS: Final[dict[str, int]] = {
    "tls1.0": 0x0301,
    "tls1.1": 0x0302,
    "tls1.2": 0x0303,
    "tls1.3": 0x0304,
}

_NS_PER_S: Final = 1_000_000_000


def default_node_id(hostname: str | None = None) -> int:
    """Go's default ``--node-id``: CRC-32 (IEEE) of the MD5 digest of the hostname, mod 1024."""
    host = socket.gethostname() if hostname is None else hostname
    return zlib.crc32(hashlib.md5(host.encode(), usedforsecurity=False).digest()) % 1024


# --------------------------------------------------------------------------------------------
# The options object
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Options:
    """Every nsqd setting. Durations are float seconds; see :data:`FLAGS` for the flags."""

    # basic
    version: bool = False
    config: str = ""
    log_level: str = "info"
    log_prefix: str = "[nsqd] "
    verbose: bool = False  # deprecated, no effect
    node_id: int = field(default_factory=default_node_id)
    worker_id: bool = False  # deprecated; a bool flag in Go 1.x, no effect
    https_address: str = "0.0.0.0:4152"
    http_address: str = "0.0.0.0:4151"
    tcp_address: str = "0.0.0.0:4150"
    auth_http_addresses: list[str] = field(default_factory=list)
    auth_http_request_method: str = "get"
    broadcast_address: str = field(default_factory=socket.gethostname)
    broadcast_tcp_port: int = 0
    broadcast_http_port: int = 0
    nsqlookupd_tcp_addresses: list[str] = field(default_factory=list)
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    topology_region: str = ""
    topology_zone: str = ""
    # diskqueue
    data_path: str = ""
    mem_queue_size: int = 10000
    max_bytes_per_file: int = 104857600
    sync_every: int = 2500
    sync_timeout: float = 2.0
    queue_scan_worker_pool_max: int = 4
    queue_scan_selection_count: int = 20
    # messages and commands
    msg_timeout: float = 60.0
    max_msg_timeout: float = 900.0
    max_msg_size: int = 1048576
    max_req_timeout: float = 3600.0
    max_body_size: int = 5242880
    # client-overridable limits
    max_heartbeat_interval: float = 60.0
    max_rdy_count: int = 2500
    max_output_buffer_size: int = 65536
    max_output_buffer_timeout: float = 30.0
    min_output_buffer_timeout: float = 0.025
    output_buffer_timeout: float = 0.25
    max_channel_consumers: int = 0
    # statsd
    statsd_address: str = ""
    statsd_interval: float = 60.0
    statsd_mem_stats: bool = True
    statsd_prefix: str = "nsq.%s"
    statsd_udp_packet_size: int = 508
    statsd_exclude_ephemeral: bool = False
    # end-to-end latency
    e2e_processing_latency_percentiles: list[float] = field(default_factory=list)
    e2e_processing_latency_window_time: float = 600.0
    # TLS
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_auth_policy: str = ""
    tls_root_ca_file: str = ""
    tls_required: str = "false"
    tls_min_version: str = "tls1.0"
    # compression
    deflate: bool = True
    max_deflate_level: int = 6
    snappy: bool = True
    # experiments (unreleased upstream)
    enable_experiment: list[str] = field(default_factory=list)
    # internal, no flag
    queue_scan_interval: float = 0.1
    queue_scan_refresh_interval: float = 5.0
    queue_scan_dirty_percent: float = 0.25
    client_timeout: float = 60.0
    #: Field names set by a command-line flag or the config file (not by default).
    explicit: set[str] = field(default_factory=set, repr=False, compare=False)


# --------------------------------------------------------------------------------------------
# The flag table
# --------------------------------------------------------------------------------------------

_BOOL = "bool"
_INT = "int"
_STR = "string"
_DURATION = "duration"
_STRLIST = "strlist"
_FLOATLIST = "floatlist"
_LOG_LEVEL = "log_level"
_TLS_REQUIRED = "tls_required"
_TLS_MIN_VERSION = "tls_min_version"

#: Kinds that behave like Go bool flags: ``-flag`` alone means true, never a separate word.
_BOOL_KINDS: Final = frozenset({_BOOL, _TLS_REQUIRED})


@dataclass(frozen=True, slots=True)
class Flag:
    """One nsqd command-line flag."""

    name: str  #: flag name without dashes, e.g. ``"max-rdy-count"``
    attr: str  #: :class:`Options` field
    kind: str  #: value syntax: bool, int, string, duration, strlist, floatlist, or an enum
    help: str
    #: Config-file and ``/config/:opt`` key; None for flags outside Go's ``nsqd.Options``
    #: (``--version``, ``--config``, ``--verbose``, ``--worker-id``).
    cfg: str | None


def _f(name: str, kind: str, help_text: str, attr: str = "", cfg: str = "") -> Flag:
    attr = attr or name.replace("-", "_")
    return Flag(name, attr, kind, help_text, cfg or name.replace("-", "_"))


def _nocfg(name: str, kind: str, help_text: str) -> Flag:
    return Flag(name, name.replace("-", "_"), kind, help_text, None)


#: Every nsqd flag, in the order Go declares them.
FLAGS: Final[tuple[Flag, ...]] = (
    _nocfg("version", _BOOL, "print the version and exit"),
    _nocfg("config", _STR, "path to a TOML config file (keys are the flag names with '_')"),
    _f("log-level", _LOG_LEVEL, "log verbosity: debug, info, warn, error or fatal"),
    _f("log-prefix", _STR, "text put at the start of every log line"),
    _nocfg("verbose", _BOOL, "[deprecated] does nothing; use --log-level"),
    _f("node-id", _INT, "node number in message IDs, in [0,1024); defaults to a hostname hash",
       attr="node_id", cfg="id"),
    _nocfg("worker-id", _BOOL, "[deprecated] use --node-id"),
    _f("https-address", _STR, "<addr>:<port> for the HTTPS listener (needs a TLS cert and key)"),
    _f("http-address", _STR, "<addr>:<port> or unix socket path for HTTP; empty disables it"),
    _f("tcp-address", _STR, "<addr>:<port> or unix socket path for TCP clients"),
    _f("auth-http-address", _STRLIST,
       "<addr>:<port> or URL of an auth server (may be given multiple times)",
       attr="auth_http_addresses", cfg="auth_http_addresses"),
    _f("auth-http-request-method", _STR, "HTTP method for auth requests: get or post"),
    _f("broadcast-address", _STR, "address registered with nsqlookupd"),
    _f("broadcast-tcp-port", _INT, "TCP port registered with nsqlookupd (0: the listening port)"),
    _f("broadcast-http-port", _INT,
       "HTTP port registered with nsqlookupd (0: the listening port)"),
    _f("lookupd-tcp-address", _STRLIST, "nsqlookupd TCP address (may be given multiple times)",
       attr="nsqlookupd_tcp_addresses", cfg="nsqlookupd_tcp_addresses"),
    _f("http-client-connect-timeout", _DURATION, "connect timeout for outgoing HTTP requests"),
    _f("http-client-request-timeout", _DURATION, "total timeout for outgoing HTTP requests"),
    _f("topology-region", _STR, "region of this node, for topology-aware consumption"),
    _f("topology-zone", _STR, "zone of this node, for topology-aware consumption"),
    _f("data-path", _STR, "directory for disk-backed queues and metadata; empty means the cwd"),
    _f("mem-queue-size", _INT, "messages kept in memory per topic/channel before disk"),
    _f("max-bytes-per-file", _INT, "bytes per diskqueue file before rolling to the next"),
    _f("sync-every", _INT, "diskqueue writes+reads between fsyncs"),
    _f("sync-timeout", _DURATION, "longest time between diskqueue fsyncs"),
    _f("queue-scan-worker-pool-max", _INT,
       "most workers checking in-flight and deferred timeouts"),
    _f("queue-scan-selection-count", _INT,
       "channels checked for in-flight and deferred timeouts per 100ms scan"),
    _f("msg-timeout", _DURATION, "default time before an unacknowledged message is requeued"),
    _f("max-msg-timeout", _DURATION, "largest msg_timeout a client may ask for"),
    _f("max-msg-size", _INT, "largest message body in bytes"),
    _f("max-req-timeout", _DURATION, "largest REQ delay or DPUB defer"),
    _f("max-body-size", _INT, "largest command body in bytes (MPUB, IDENTIFY, AUTH)"),
    _f("max-heartbeat-interval", _DURATION, "largest heartbeat interval a client may ask for"),
    _f("max-rdy-count", _INT, "largest RDY count a client may send"),
    _f("max-output-buffer-size", _INT, "largest output buffer (bytes) a client may ask for"),
    _f("max-output-buffer-timeout", _DURATION,
       "largest output flush timeout a client may ask for"),
    _f("min-output-buffer-timeout", _DURATION,
       "smallest output flush timeout a client may ask for"),
    _f("output-buffer-timeout", _DURATION, "default time between flushes to a client"),
    _f("max-channel-consumers", _INT, "most consumer connections per channel (0: unlimited)"),
    _f("statsd-address", _STR, "UDP <addr>:<port> of a statsd daemon to push stats to"),
    _f("statsd-interval", _DURATION, "time between statsd pushes"),
    _f("statsd-mem-stats", _BOOL, "also push memory and GC stats to statsd"),
    _f("statsd-prefix", _STR, "statsd key prefix (%s becomes the host key)"),
    _f("statsd-udp-packet-size", _INT, "largest statsd UDP packet in bytes"),
    _f("statsd-exclude-ephemeral", _BOOL, "do not push stats of #ephemeral topics/channels"),
    _f("e2e-processing-latency-percentile", _FLOATLIST,
       "end-to-end latency percentile to track, in (0,1] (repeatable or comma separated)",
       attr="e2e_processing_latency_percentiles", cfg="e2e_processing_latency_percentiles"),
    _f("e2e-processing-latency-window-time", _DURATION,
       "window over which latency percentiles are computed"),
    _f("tls-cert", _STR, "path to the TLS certificate file"),
    _f("tls-key", _STR, "path to the TLS private key file"),
    _f("tls-client-auth-policy", _STR,
       "client certificate policy: require or require-verify (implies --tls-required)"),
    _f("tls-root-ca-file", _STR, "path to a CA file for verifying client certificates"),
    _f("tls-required", _TLS_REQUIRED, "require TLS from clients: true, false or tcp-https"),
    _f("tls-min-version", _TLS_MIN_VERSION,
       "oldest TLS version accepted: tls1.0, tls1.1, tls1.2 or tls1.3"),
    _f("deflate", _BOOL, "let clients negotiate deflate compression"),
    _f("max-deflate-level", _INT, "highest deflate level a client may ask for, in [1,9]"),
    _f("snappy", _BOOL, "let clients negotiate snappy compression"),
    _f("enable-experiment", _STRLIST,
       "turn on an experimental feature: topology-aware-consumption (repeatable)"),
)

_BY_NAME: Final[dict[str, Flag]] = {f.name: f for f in FLAGS}
_BY_CFG: Final[dict[str, Flag]] = {f.cfg: f for f in FLAGS if f.cfg is not None}


# --------------------------------------------------------------------------------------------
# Go value syntaxes (strconv, time)
# --------------------------------------------------------------------------------------------


def _go_quote(s: str) -> str:
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


class _NumError(ValueError):
    """A ``strconv`` error: syntax or range."""

    def __init__(self, func: str, num: str, out_of_range: bool) -> None:
        self.out_of_range = out_of_range
        reason = "value out of range" if out_of_range else "invalid syntax"
        super().__init__(f"strconv.{func}: parsing {_go_quote(num)}: {reason}")

    @property
    def flag_reason(self) -> str:
        """What the ``flag`` package prints for this error."""
        return "value out of range" if self.out_of_range else "parse error"


_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def _parse_bool(s: str) -> bool:
    """``strconv.ParseBool``."""
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise _NumError("ParseBool", s, False)


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
        if ch.isdigit() and ch.isascii() or hexa and ch.lower() in "abcdef":
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


def _parse_int(s: str, *, base0: bool) -> int:
    """``strconv.ParseInt(s, 0 or 10, 64)``: base 0 takes 0x/0o/0b/0 prefixes and underscores."""
    if not s:
        raise _NumError("ParseInt", s, False)
    body = s
    neg = False
    if body[0] in "+-":
        neg = body[0] == "-"
        body = body[1:]
    if not body:
        raise _NumError("ParseInt", s, False)
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
            raise _NumError("ParseInt", s, False)
        if d >= base:
            raise _NumError("ParseInt", s, False)
        value = value * base + d
        if value >= 1 << 64:
            raise _NumError("ParseInt", s, True)
    if underscores and not _underscore_ok(body):
        raise _NumError("ParseInt", s, False)
    if value >= 1 << 63 and not (neg and value == 1 << 63):
        raise _NumError("ParseInt", s, True)
    return -value if neg else value


def _parse_float(s: str) -> float:
    """``strconv.ParseFloat(s, 64)`` (decimal syntax, inf and nan)."""
    if not s or not s.isascii() or s != s.strip():
        raise _NumError("ParseFloat", s, False)
    try:
        value = float(s)
    except ValueError:
        raise _NumError("ParseFloat", s, False) from None
    if math.isinf(value) and "inf" not in s.lower():
        raise _NumError("ParseFloat", s, True)
    return value


_DURATION_UNITS: Final[dict[str, int]] = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek mu
    "ms": 1_000_000,
    "s": _NS_PER_S,
    "m": 60 * _NS_PER_S,
    "h": 3600 * _NS_PER_S,
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
            raise ValueError(
                f"time: unknown unit {_time_quote(unit_name)} in duration {_time_quote(orig)}"
            )
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
    return parse_duration_ns(s) / _NS_PER_S


def _to_ns(seconds: float) -> int:
    return round(seconds * _NS_PER_S)


def format_duration(seconds: float) -> str:
    """Go's ``time.Duration.String``: ``60.0`` → ``"1m0s"``, ``0.25`` → ``"250ms"``."""
    ns = _to_ns(seconds)
    if ns == 0:
        return "0s"
    neg = ns < 0
    u = -ns if neg else ns

    def split(v: int, prec: int) -> tuple[int, str]:
        digits = f"{v % 10**prec:0{prec}d}".rstrip("0")
        return v // 10**prec, "." + digits if digits else ""

    if u < _NS_PER_S:
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


def _go_float_v(f: float) -> str:
    """Go's ``%v`` for a float64 (shortest digits, exponent below 1e-4 or from 1e21)."""
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    d = Decimal(repr(f)).normalize()
    sign, digits, exp = d.as_tuple()
    assert isinstance(exp, int)
    point = len(digits) + exp - 1  # decimal exponent of the leading digit
    if f != 0 and (point < -4 or point >= 21):
        mant = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
        return f"{'-' if sign else ''}{mant}e{'-' if point < 0 else '+'}{abs(point):02d}"
    return f"{d:f}"


def _go_v(v: Any) -> str:
    """Go's ``%v`` for a value decoded from TOML."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return _go_float_v(v)
    if isinstance(v, list):
        return "[" + " ".join(_go_v(x) for x in v) + "]"
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{_go_v(v[k])}" for k in sorted(v)) + "]"
    return str(v)


def _go_type(v: Any) -> str:
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
    if isinstance(v, datetime | date | clock_time):
        return "time.Time"
    return type(v).__name__


def _go_sprint_s(v: Any) -> str:
    """Go's ``fmt.Sprintf("%s", v)`` for a non-string TOML value (go-options coerceString)."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool | int | float):
        return f"%!s({_go_type(v)}={_go_v(v)})"
    if isinstance(v, list):
        return "[" + " ".join(_go_sprint_s(x) for x in v) + "]"
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{_go_sprint_s(v[k])}" for k in sorted(v)) + "]"
    return str(v)


# --------------------------------------------------------------------------------------------
# Enum setters shared by flags, the config file and validation
# --------------------------------------------------------------------------------------------


def _log_level(s: str) -> str:
    name = s.lower()
    if name not in LOG_LEVELS:
        raise ValueError(f"invalid log level '{s}' (debug, info, warn, error, fatal)")
    return name


def _tls_required(s: str) -> str:
    s = s.lower()
    if s == "tcp-https":
        return s
    return "true" if _parse_bool(s) else "false"


def _tls_min_version(s: str, current: str) -> str:
    s = s.lower()
    if s == "":
        return current
    if s not in TLS_MIN_VERSIONS:
        raise ValueError(f"unknown tlsVersionOption {_go_quote(s)}")
    return s


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


class _FlagValueError(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(slots=True)
class _CommandLine:
    """Values seen on the command line, before config-file resolution."""

    values: dict[str, Any] = field(default_factory=dict)
    lists: dict[str, list[Any]] = field(default_factory=dict)


def _set_flag(spec: Flag, value: str, line: _CommandLine, opts: Options) -> None:
    """Go ``flag.Value.Set`` for one occurrence of a flag."""
    kind = spec.kind
    try:
        if kind == _BOOL:
            line.values[spec.attr] = _parse_bool(value)
        elif kind == _INT:
            line.values[spec.attr] = _parse_int(value, base0=True)
        elif kind == _STR:
            line.values[spec.attr] = value
        elif kind == _DURATION:
            try:
                line.values[spec.attr] = parse_duration_ns(value) / _NS_PER_S
            except ValueError:
                raise _FlagValueError("parse error") from None
        elif kind == _STRLIST:
            line.lists.setdefault(spec.attr, []).append(value)
        elif kind == _FLOATLIST:
            parsed = [_parse_float(part) for part in value.split(",")]
            line.lists.setdefault(spec.attr, []).extend(parsed)
        elif kind == _LOG_LEVEL:
            line.values[spec.attr] = _log_level(value)
        elif kind == _TLS_REQUIRED:
            line.values[spec.attr] = _tls_required(value)
        elif kind == _TLS_MIN_VERSION:
            current = line.values.get(spec.attr, opts.tls_min_version)
            line.values[spec.attr] = _tls_min_version(value, current)
        else:  # pragma: no cover - table error
            raise AssertionError(kind)
    except _NumError as exc:
        # flag's own value types hide strconv's detail; Var types (FloatArray,
        # tls-required) pass their Set error through.
        own = kind in (_BOOL, _INT)
        raise _FlagValueError(exc.flag_reason if own else str(exc)) from None
    except ValueError as exc:
        raise _FlagValueError(str(exc)) from None


def _finish_lists(line: _CommandLine) -> None:
    """What ``options.Resolve`` makes of repeatable flags: it re-reads ``Value.String()``."""
    for attr, items in line.lists.items():
        if attr == "e2e_processing_latency_percentiles":
            # FloatArray keeps itself sorted high to low and prints with %f (6 decimals)
            line.values[attr] = [float(f"{v:f}") for v in sorted(items, reverse=True)]
        else:
            # StringArray prints comma-joined, and Resolve splits on commas again
            line.values[attr] = ",".join(items).split(",")


def parse_args(argv: Sequence[str]) -> Options:
    """Parse nsqd's command line (without the program name) and its ``--config`` file.

    Go ``flag`` syntax: ``-f v``, ``--f v``, ``-f=v``, ``--f=v``; bool flags only take
    ``-f`` or ``-f=value``; parsing stops at the first non-flag word or ``--``. A flag given
    on the command line beats the config file, which beats the default.
    """
    opts = Options()
    line = _CommandLine()
    seen: set[str] = set()
    args = list(argv)
    i = 0
    while i < len(args):
        word = args[i]
        if len(word) < 2 or word[0] != "-":
            break
        dashes = 1
        if word[1] == "-":
            dashes = 2
            if len(word) == 2:
                break
        name = word[dashes:]
        if not name or name[0] in "-=":
            raise OptionsError(f"bad flag syntax: {word}")
        i += 1
        has_value = False
        value = ""
        eq = name.find("=", 1)
        if eq != -1:
            name, value, has_value = name[:eq], name[eq + 1 :], True
        spec = _BY_NAME.get(name)
        if spec is None:
            if name in ("h", "help"):
                raise HelpRequested(usage())
            raise OptionsError(f"flag provided but not defined: -{name}")
        if spec.kind in _BOOL_KINDS:
            try:
                _set_flag(spec, value if has_value else "true", line, opts)
            except _FlagValueError as exc:
                raise OptionsError(
                    f"invalid boolean value {_go_quote(value)} for -{name}: {exc.reason}"
                ) from None
        else:
            if not has_value:
                if i >= len(args):
                    raise OptionsError(f"flag needs an argument: -{name}")
                value = args[i]
                i += 1
            try:
                _set_flag(spec, value, line, opts)
            except _FlagValueError as exc:
                raise OptionsError(
                    f"invalid value {_go_quote(value)} for flag -{name}: {exc.reason}"
                ) from None
        seen.add(spec.attr)
    _finish_lists(line)

    from_config: dict[str, Any] = {}
    config_path = line.values.get("config", "")
    if config_path:
        from_config = _load_config(config_path, exclude=seen, defaults=opts)

    for attr, val in (*from_config.items(), *line.values.items()):
        setattr(opts, attr, val)
    if opts.tls_client_auth_policy and opts.tls_required == "false":
        opts.tls_required = "true"
    opts.explicit = seen | set(from_config)
    return opts


# --------------------------------------------------------------------------------------------
# Config file
# --------------------------------------------------------------------------------------------


class _CoerceError(Exception):
    pass


def _coerce_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        return _parse_bool(v)
    if isinstance(v, int):
        # go-options maps integers to `v == 0`, i.e. 0 is true; kept for compatibility
        return v == 0
    raise _CoerceError(f"invalid bool value type {_go_type(v)}")


def _coerce_int(v: Any) -> int:
    if isinstance(v, bool):
        raise _CoerceError("invalid int64 value type bool")
    if isinstance(v, int):
        if not -(1 << 63) <= v < 1 << 63:
            raise _NumError("ParseInt", str(v), True)
        return v
    if isinstance(v, str):
        return _parse_int(v, base0=False)
    raise _CoerceError(f"invalid int64 value type {_go_type(v)}")


def _coerce_duration(v: Any) -> float:
    if isinstance(v, bool):
        raise _CoerceError("invalid time.Duration value type bool")
    if isinstance(v, int):
        return v / 1000  # go-options reads integers as milliseconds
    if isinstance(v, str):
        if re.fullmatch(r"[0-9]+", v):
            # go-options' legacy bare-integer path needs a per-field unit that nsqd
            # 1.x no longer declares, so it always fails like this
            raise _CoerceError('time: invalid duration ""')
        return parse_duration_ns(v) / _NS_PER_S
    raise _CoerceError(f"invalid time.Duration value type {_go_type(v)}")


def _coerce_str_list(v: Any) -> list[str]:
    if isinstance(v, str):
        return v.split(",")
    if isinstance(v, list):
        if not all(isinstance(x, str) for x in v):
            raise _CoerceError("list items must be strings")
        return list(v)
    return []


def _coerce_float_list(v: Any) -> list[float]:
    if isinstance(v, str):
        return [_parse_float(part.strip()) for part in v.split(",")]
    if isinstance(v, list):
        out: list[float] = []
        for x in v:
            if isinstance(x, bool) or not isinstance(x, int | float):
                raise _CoerceError("list items must be numbers")
            out.append(float(x))
        return out
    return []


_COERCERS: Final[dict[str, Callable[[Any], Any]]] = {
    _BOOL: _coerce_bool,
    _INT: _coerce_int,
    _STR: _go_sprint_s,
    _DURATION: _coerce_duration,
    _STRLIST: _coerce_str_list,
    _FLOATLIST: _coerce_float_list,
}


def _load_config(path: str, *, exclude: set[str], defaults: Options) -> dict[str, Any]:
    """Read the TOML file and coerce each known key not already given as a flag.

    Unknown keys are ignored, as Go nsqd does.
    """
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except OSError as exc:
        raise OptionsError(f"failed to load config file {path} - {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise OptionsError(f"failed to load config file {path} - {exc}") from None

    out: dict[str, Any] = {}
    for key, v in raw.items():
        spec = _BY_CFG.get(key)
        if spec is None or spec.attr in exclude:
            continue
        kind = spec.kind
        if kind in (_LOG_LEVEL, _TLS_REQUIRED, _TLS_MIN_VERSION):
            # apps/nsqd validates these keys through the flag setters first
            text = _go_v(v)
            try:
                if kind == _LOG_LEVEL:
                    out[spec.attr] = _log_level(text)
                elif kind == _TLS_REQUIRED:
                    out[spec.attr] = _tls_required(text)
                elif text.lower() != "":
                    out[spec.attr] = _tls_min_version(text, defaults.tls_min_version)
            except ValueError:
                raise OptionsError(f"failed parsing {key} {text}") from None
            continue
        try:
            out[spec.attr] = _COERCERS[kind](v)
        except (_CoerceError, ValueError) as exc:
            raise OptionsError(
                f"option resolution failed to coerce {_go_v(v)} for {key} - {exc}"
            ) from None
    return out


# --------------------------------------------------------------------------------------------
# Usage
# --------------------------------------------------------------------------------------------


def _default_text(spec: Flag, value: Any) -> str:
    kind = spec.kind
    if kind == _BOOL:
        return "true" if value else ""
    if kind == _INT:
        return str(value) if value else ""
    if kind == _STR:
        return _go_quote(value) if value else ""
    if kind == _DURATION:
        return format_duration(value) if value else ""
    if kind in (_LOG_LEVEL, _TLS_MIN_VERSION):
        return str(value)
    return ""


def usage() -> str:
    """The ``-help`` text: every flag, sorted like Go's, with its default."""
    defaults = Options()
    lines = ["Usage of nsqd:"]
    for spec in sorted(FLAGS, key=lambda f: f.name):
        kind = spec.kind
        type_name = {
            _BOOL: "", _TLS_REQUIRED: "", _INT: "int", _STR: "string", _DURATION: "duration",
        }.get(kind, "value")
        lines.append(f"  -{spec.name}" + (f" {type_name}" if type_name else ""))
        default = _default_text(spec, getattr(defaults, spec.attr))
        lines.append(f"    \t{spec.help}" + (f" (default {default})" if default else ""))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def validate(opts: Options) -> None:
    """Startup checks of Go's ``nsqd.New`` (same messages), plus a few sanity checks.

    Like Go, a set ``tls_client_auth_policy`` turns ``tls_required`` on.
    """
    if not 1 <= opts.max_deflate_level <= 9:
        raise OptionsError("--max-deflate-level must be [1,9]")
    if not 0 <= opts.node_id < 1024:
        raise OptionsError("--node-id must be [0,1024)")
    if opts.tls_required not in TLS_REQUIRED_VALUES:
        raise OptionsError(
            f"invalid --tls-required {_go_quote(opts.tls_required)} (true, false, tcp-https)"
        )
    if opts.tls_client_auth_policy and opts.tls_required == "false":
        opts.tls_required = "true"
    if bool(opts.tls_cert) != bool(opts.tls_key):
        raise OptionsError("failed to build TLS config - --tls-cert and --tls-key go together")
    if opts.tls_required != "false" and not opts.tls_cert:
        raise OptionsError("cannot require TLS client connections without TLS key and cert")
    if opts.auth_http_request_method not in ("get", "post"):
        raise OptionsError("--auth-http-request-method must be post or get")
    for p in opts.e2e_processing_latency_percentiles:
        if p <= 0 or p > 1:
            raise OptionsError(f"invalid E2E processing latency percentile: {_go_float_v(p)}")
    try:
        _log_level(opts.log_level)
        if opts.tls_min_version.lower() not in TLS_MIN_VERSIONS:
            raise ValueError(f"unknown tlsVersionOption {_go_quote(opts.tls_min_version)}")
    except ValueError as exc:
        raise OptionsError(str(exc)) from None
    # Values Go accepts but then panics or spins on.
    if opts.mem_queue_size < 0:
        raise OptionsError("--mem-queue-size must be >= 0")
    if opts.max_bytes_per_file <= 0:
        raise OptionsError("--max-bytes-per-file must be > 0")
    if opts.sync_timeout <= 0:
        raise OptionsError("--sync-timeout must be > 0")
    if opts.statsd_address and opts.statsd_interval <= 0:
        raise OptionsError("--statsd-interval must be > 0")
    if opts.queue_scan_interval <= 0 or opts.queue_scan_refresh_interval <= 0:
        raise OptionsError("queue scan intervals must be > 0")


# --------------------------------------------------------------------------------------------
# Features not built yet
# --------------------------------------------------------------------------------------------

#: Option field → what it would turn on. Delete an entry when its feature lands.
UNBUILT_FEATURES: dict[str, str] = {
    "tls_cert": "TLS (certificate)",
    "tls_key": "TLS (private key)",
    "tls_root_ca_file": "TLS client certificate verification",
    "tls_client_auth_policy": "TLS client certificate policy",
    "tls_required": "requiring TLS from clients",
    "auth_http_addresses": "AUTH against an auth server",
    "statsd_address": "pushing stats to statsd",
    "nsqlookupd_tcp_addresses": "registering with nsqlookupd",
    "e2e_processing_latency_percentiles": "end-to-end latency percentiles",
    "enable_experiment": "experimental features",
}

_ATTR_TO_FLAG: Final[dict[str, str]] = {f.attr: f.name for f in FLAGS}


def unbuilt_requested(opts: Options) -> list[str]:
    """Flag names (``"--tls-cert"``…) whose value asks for a feature in UNBUILT_FEATURES."""
    out = []
    for attr in UNBUILT_FEATURES:
        value = getattr(opts, attr)
        wanted = value != "false" if attr == "tls_required" else bool(value)
        if wanted:
            out.append("--" + _ATTR_TO_FLAG[attr])
    return out


# --------------------------------------------------------------------------------------------
# GET/PUT /config/:opt
# --------------------------------------------------------------------------------------------


def config_value(opts: Options, name: str) -> object:
    """The value of cfg-named option ``name`` as Go's ``GET /config/:opt`` JSON-encodes it.

    Durations are integer nanoseconds; log_level, tls_required and tls_min_version are Go
    ints. Raises KeyError for names Go does not know (HTTP 400 ``INVALID_OPTION``).
    """
    spec = _BY_CFG.get(name)
    if spec is None:
        raise KeyError(name)
    value = getattr(opts, spec.attr)
    kind = spec.kind
    if kind == _DURATION:
        return _to_ns(value)
    if kind == _LOG_LEVEL:
        return LOG_LEVELS[value.lower()]
    if kind == _TLS_REQUIRED:
        return TLS_REQUIRED_VALUES[value]
    if kind == _TLS_MIN_VERSION:
        return TLS_MIN_VERSIONS[value.lower()]
    if isinstance(value, list):
        return list(value)
    return value


def _is_host_port(addr: str) -> bool:
    if addr.startswith("["):
        end = addr.find("]")
        if end < 0 or addr[end + 1 : end + 2] != ":":
            return False
        host, port = addr[1:end], addr[end + 2 :]
    else:
        host, sep, port = addr.rpartition(":")
        if not sep or ":" in host:
            return False
    if not host or any(ch.isspace() for ch in host):
        return False
    return port.isascii() and port.isdigit() and 0 < int(port) < 65536


def set_config_value(opts: Options, name: str, raw: bytes) -> None:
    """``PUT /config/:opt``: change ``nsqlookupd_tcp_addresses`` or ``log_level`` in place.

    ``nsqlookupd_tcp_addresses`` takes a JSON array of ``host:port`` strings; ``log_level``
    takes the bare level name. Raises InvalidOptionError or InvalidValueError.
    """
    if name == "nsqlookupd_tcp_addresses":
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise InvalidValueError("body is not JSON") from None
        if data is None:
            data = []
        if not isinstance(data, list) or not all(isinstance(a, str) for a in data):
            raise InvalidValueError("want a JSON array of strings")
        for addr in data:
            if not _is_host_port(addr):
                raise InvalidValueError(f"not a host:port address: {addr!r}")
        opts.nsqlookupd_tcp_addresses = data
    elif name == "log_level":
        try:
            opts.log_level = _log_level(raw.decode())
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidValueError(str(exc)) from None
    else:
        raise InvalidOptionError(f"option cannot be changed at runtime: {name}")
