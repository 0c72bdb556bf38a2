"""nsqd options: the flag table, the TOML config file keys and validation.

One :class:`Options` object holds every setting of the daemon. :func:`parse_args` fills it the
way the Go nsqd does (Go ``flag`` syntax, then an optional ``--config`` TOML file whose values
the command line overrides, with Go's value coercions; the machinery is
:mod:`nsqpy.goflags`). Durations are float seconds here; :func:`config_value` turns them back
into the JSON shapes that ``GET /config/:opt`` returns in Go (durations as integer
nanoseconds, enums as Go ints).
"""

from __future__ import annotations

import json
import socket
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

try:  # CPython's own MD5: hashlib's would load OpenSSL's hash module (~0.7 MiB) for one digest
    from _md5 import md5 as _md5  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - a Python built without it
    from hashlib import md5 as _md5

from nsqpy.goflags import (
    BOOL,
    DURATION,
    FLOAT_LIST,
    INT,
    LOG_LEVEL,
    LOG_LEVELS,
    STRING,
    STRING_LIST,
    UNSET,
    Flag,
    FlagSet,
    HelpRequested,
    Kind,
    OptionsError,
    format_duration,
    go_float_v,
    go_quote,
    parse_bool,
    parse_duration,
    parse_duration_ns,
    parse_log_level,
)
from nsqpy.goflags import flag as _f
from nsqpy.goflags import flag_nocfg as _nocfg

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


class InvalidOptionError(OptionsError):
    """``PUT /config/:opt`` on an option that cannot be changed (HTTP 400 ``INVALID_OPTION``)."""


class InvalidValueError(OptionsError):
    """``PUT /config/:opt`` with a body that is not a valid value (HTTP 400 ``INVALID_VALUE``)."""


# --------------------------------------------------------------------------------------------
# Enumerations and their Go encodings
# --------------------------------------------------------------------------------------------

#: ``--tls-required`` values and Go's ``TLSNotRequired``/``TLSRequiredExceptHTTP``/``TLSRequired``.
TLS_REQUIRED_VALUES: Final[dict[str, int]] = {"false": 0, "tcp-https": 1, "true": 2}

#: ``--tls-min-version`` names and their protocol numbers (Go's ``tls.VersionTLS1x``).
TLS_MIN_VERSIONS: Final[dict[str, int]] = {
    "tls1.0": 0x0301,
    "tls1.1": 0x0302,
    "tls1.2": 0x0303,
    "tls1.3": 0x0304,
}


def _tls_required(s: str) -> str:
    s = s.lower()
    if s == "tcp-https":
        return s
    return "true" if parse_bool(s) else "false"


def _tls_min_version(s: str, current: str) -> str:
    s = s.lower()
    if s == "":
        return current
    if s not in TLS_MIN_VERSIONS:
        raise ValueError(f"unknown tlsVersionOption {go_quote(s)}")
    return s


#: ``--tls-required``: a bool-like flag that also takes ``tcp-https``.
TLS_REQUIRED: Final = Kind(
    "tls_required",
    "",
    lambda s, cur: _tls_required(s),
    via_flag=True,
    boolean=True,
    to_json=lambda v: TLS_REQUIRED_VALUES[v],
)
#: ``--tls-min-version``: an empty value keeps the current one (and an empty config key is
#: as if absent).
TLS_MIN_VERSION: Final = Kind(
    "tls_min_version",
    "value",
    _tls_min_version,
    lambda text, d: UNSET if text.lower() == "" else _tls_min_version(text, d),
    via_flag=True,
    default_text=str,
    to_json=lambda v: TLS_MIN_VERSIONS[v.lower()],
)


def default_node_id(hostname: str | None = None) -> int:
    """Go's default ``--node-id``: CRC-32 (IEEE) of the MD5 digest of the hostname, mod 1024."""
    host = socket.gethostname() if hostname is None else hostname
    return zlib.crc32(_md5(host.encode(), usedforsecurity=False).digest()) % 1024


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
    admin_token_file: str = ""
    http_publish_auth: bool = False
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

#: Every nsqd flag, in the order Go declares them.
FLAGS: Final[tuple[Flag, ...]] = (
    _nocfg("version", BOOL, "print the version and exit"),
    _nocfg("config", STRING, "path to a TOML config file (keys are the flag names with '_')"),
    _f("log-level", LOG_LEVEL, "log verbosity: debug, info, warn, error or fatal"),
    _f("log-prefix", STRING, "text put at the start of every log line"),
    _nocfg("verbose", BOOL, "[deprecated] does nothing; use --log-level"),
    _f(
        "node-id",
        INT,
        "node number in message IDs, in [0,1024); defaults to a hostname hash",
        attr="node_id",
        cfg="id",
    ),
    _nocfg("worker-id", BOOL, "[deprecated] use --node-id"),
    _f("https-address", STRING, "<addr>:<port> for the HTTPS listener (needs a TLS cert and key)"),
    _f("http-address", STRING, "<addr>:<port> or unix socket path for HTTP; empty disables it"),
    _f("tcp-address", STRING, "<addr>:<port> or unix socket path for TCP clients"),
    _f(
        "auth-http-address",
        STRING_LIST,
        "<addr>:<port> or URL of an auth server (may be given multiple times)",
        attr="auth_http_addresses",
        cfg="auth_http_addresses",
    ),
    _f("auth-http-request-method", STRING, "HTTP method for auth requests: get or post"),
    _f(
        "http-publish-auth",
        BOOL,
        "with --auth-http-address, /pub and /mpub need 'Authorization: Bearer <secret>' with "
        "publish permission from the auth server, as a TCP AUTH (an nsqpy addition)",
    ),
    _f(
        "admin-token-file",
        STRING,
        "file of bearer tokens (one per line, mode 600) that the HTTP API's changes, peek and "
        "/debug require (an nsqpy addition; re-read on SIGHUP)",
    ),
    _f("broadcast-address", STRING, "address registered with nsqlookupd"),
    _f("broadcast-tcp-port", INT, "TCP port registered with nsqlookupd (0: the listening port)"),
    _f("broadcast-http-port", INT, "HTTP port registered with nsqlookupd (0: the listening port)"),
    _f(
        "lookupd-tcp-address",
        STRING_LIST,
        "nsqlookupd TCP address (may be given multiple times)",
        attr="nsqlookupd_tcp_addresses",
        cfg="nsqlookupd_tcp_addresses",
    ),
    _f("http-client-connect-timeout", DURATION, "connect timeout for outgoing HTTP requests"),
    _f("http-client-request-timeout", DURATION, "total timeout for outgoing HTTP requests"),
    _f("topology-region", STRING, "region of this node, for topology-aware consumption"),
    _f("topology-zone", STRING, "zone of this node, for topology-aware consumption"),
    _f("data-path", STRING, "directory for disk-backed queues and metadata; empty means the cwd"),
    _f("mem-queue-size", INT, "messages kept in memory per topic/channel before disk"),
    _f("max-bytes-per-file", INT, "bytes per diskqueue file before rolling to the next"),
    _f("sync-every", INT, "diskqueue writes+reads between fsyncs"),
    _f("sync-timeout", DURATION, "longest time between diskqueue fsyncs"),
    _f("queue-scan-worker-pool-max", INT, "most workers checking in-flight and deferred timeouts"),
    _f(
        "queue-scan-selection-count",
        INT,
        "channels checked for in-flight and deferred timeouts per 100ms scan",
    ),
    _f("msg-timeout", DURATION, "default time before an unacknowledged message is requeued"),
    _f("max-msg-timeout", DURATION, "largest msg_timeout a client may ask for"),
    _f("max-msg-size", INT, "largest message body in bytes"),
    _f("max-req-timeout", DURATION, "largest REQ delay or DPUB defer"),
    _f("max-body-size", INT, "largest command body in bytes (MPUB, IDENTIFY, AUTH)"),
    _f("max-heartbeat-interval", DURATION, "largest heartbeat interval a client may ask for"),
    _f("max-rdy-count", INT, "largest RDY count a client may send"),
    _f("max-output-buffer-size", INT, "largest output buffer (bytes) a client may ask for"),
    _f("max-output-buffer-timeout", DURATION, "largest output flush timeout a client may ask for"),
    _f("min-output-buffer-timeout", DURATION, "smallest output flush timeout a client may ask for"),
    _f("output-buffer-timeout", DURATION, "default time between flushes to a client"),
    _f("max-channel-consumers", INT, "most consumer connections per channel (0: unlimited)"),
    _f("statsd-address", STRING, "UDP <addr>:<port> of a statsd daemon to push stats to"),
    _f("statsd-interval", DURATION, "time between statsd pushes"),
    _f("statsd-mem-stats", BOOL, "also push memory and GC stats to statsd"),
    _f("statsd-prefix", STRING, "statsd key prefix (%s becomes the host key)"),
    _f("statsd-udp-packet-size", INT, "largest statsd UDP packet in bytes"),
    _f("statsd-exclude-ephemeral", BOOL, "do not push stats of #ephemeral topics/channels"),
    _f(
        "e2e-processing-latency-percentile",
        FLOAT_LIST,
        "end-to-end latency percentile to track, in (0,1] (repeatable or comma separated)",
        attr="e2e_processing_latency_percentiles",
        cfg="e2e_processing_latency_percentiles",
    ),
    _f("e2e-processing-latency-window-time", DURATION, "window over which latency percentiles are computed"),
    _f("tls-cert", STRING, "path to the TLS certificate file"),
    _f("tls-key", STRING, "path to the TLS private key file"),
    _f(
        "tls-client-auth-policy",
        STRING,
        "client certificate policy: require or require-verify (implies --tls-required)",
    ),
    _f("tls-root-ca-file", STRING, "path to a CA file for verifying client certificates"),
    _f("tls-required", TLS_REQUIRED, "require TLS from clients: true, false or tcp-https"),
    _f("tls-min-version", TLS_MIN_VERSION, "oldest TLS version accepted: tls1.0, tls1.1, tls1.2 or tls1.3"),
    _f("deflate", BOOL, "let clients negotiate deflate compression"),
    _f("max-deflate-level", INT, "highest deflate level a client may ask for, in [1,9]"),
    _f("snappy", BOOL, "let clients negotiate snappy compression"),
    _f(
        "enable-experiment",
        STRING_LIST,
        "turn on an experimental feature: topology-aware-consumption (repeatable)",
    ),
)

_FLAGSET: Final = FlagSet("nsqd", FLAGS, Options)


def parse_args(argv: Sequence[str]) -> Options:
    """Parse nsqd's command line (without the program name) and its ``--config`` file.

    Go ``flag`` syntax: ``-f v``, ``--f v``, ``-f=v``, ``--f=v``; bool flags only take
    ``-f`` or ``-f=value``; parsing stops at the first non-flag word or ``--``. A flag given
    on the command line beats the config file, which beats the default.
    """
    opts = _FLAGSET.parse(argv)
    if opts.tls_client_auth_policy and opts.tls_required == "false":
        opts.tls_required = "true"
    return opts


def usage() -> str:
    """The ``-help`` text: every flag, sorted like Go's, with its default."""
    return _FLAGSET.usage()


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
        raise OptionsError(f"invalid --tls-required {go_quote(opts.tls_required)} (true, false, tcp-https)")
    if opts.tls_client_auth_policy and opts.tls_required == "false":
        opts.tls_required = "true"
    if bool(opts.tls_cert) != bool(opts.tls_key):
        raise OptionsError("failed to build TLS config - --tls-cert and --tls-key go together")
    if opts.tls_required != "false" and not opts.tls_cert:
        raise OptionsError("cannot require TLS client connections without TLS key and cert")
    if opts.auth_http_request_method not in ("get", "post"):
        raise OptionsError("--auth-http-request-method must be post or get")
    if opts.http_publish_auth and not opts.auth_http_addresses:
        raise OptionsError("--http-publish-auth needs --auth-http-address")
    for p in opts.e2e_processing_latency_percentiles:
        if p <= 0 or p > 1:
            raise OptionsError(f"invalid E2E processing latency percentile: {go_float_v(p)}")
    try:
        parse_log_level(opts.log_level)
        if opts.tls_min_version.lower() not in TLS_MIN_VERSIONS:
            raise ValueError(f"unknown tlsVersionOption {go_quote(opts.tls_min_version)}")
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
    return _FLAGSET.config_value(opts, name)


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
            opts.log_level = parse_log_level(raw.decode())
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidValueError(str(exc)) from None
    else:
        raise InvalidOptionError(f"option cannot be changed at runtime: {name}")
