"""nsqadmin options: the flag table and config-file keys of NSQ 1.3.0's nsqadmin, and the
start-up checks of Go's ``nsqadmin.New`` (same order, same messages).

Parsing follows the Go daemon (``apps/nsqadmin``): Go ``flag`` syntax, then an optional
``--config`` TOML file (keys are the flag names with ``_``, except
``nsqlookupd_http_addresses``, ``nsqd_http_addresses`` and ``admin_users``) for flags not
given on the command line; machinery in :mod:`nsqpy.goflags`. Durations are float seconds.

nsqpy's own flags are marked ``[nsqpy]`` in ``-help``: ``--stats-sample-interval`` and
``--stats-retention`` drive the built-in time series (:mod:`nsqpy.nsqadmin.series`);
``--htpasswd-file`` and ``--session-timeout`` turn on the login (:mod:`nsqpy.nsqadmin.login`);
``--tls-cert``/``--tls-key`` serve HTTPS; ``--admin-token-file`` names the token sent to
nsqd and nsqlookupd (:mod:`nsqpy.adminauth`).
"""

from __future__ import annotations

import ipaddress
import posixpath
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from nsqpy.goflags import (
    BOOL,
    DURATION,
    LOG_LEVEL,
    STRING,
    STRING_LIST,
    Flag,
    FlagSet,
    HelpRequested,
    OptionsError,
    parse_log_level,
)
from nsqpy.goflags import flag as _f
from nsqpy.goflags import flag_nocfg as _nocfg

__all__ = [
    "FLAGS",
    "HelpRequested",
    "Options",
    "OptionsError",
    "client_ssl_context",
    "config_value",
    "normalize_base_path",
    "parse_args",
    "parse_cidr",
    "usage",
    "validate",
]


@dataclass(slots=True)
class Options:
    """Every nsqadmin setting; see :data:`FLAGS`."""

    version: bool = False
    config: str = ""
    log_level: str = "info"
    log_prefix: str = "[nsqadmin] "
    verbose: bool = False  # deprecated, no effect
    http_address: str = "0.0.0.0:4171"
    #: URL prefix of every route (normalized like Go: leading ``/``, cleaned, no trailing ``/``)
    base_path: str = "/"
    #: serve ``/static`` (and the index page) from this directory instead of the package
    dev_static_dir: str = ""
    graphite_url: str = ""
    proxy_graphite: bool = False
    statsd_prefix: str = "nsq.%s"
    statsd_counter_format: str = "stats.counters.%s.count"
    statsd_gauge_format: str = "stats.gauges.%s"
    #: seconds
    statsd_interval: float = 60.0
    nsqlookupd_http_addresses: list[str] = field(default_factory=list)
    nsqd_http_addresses: list[str] = field(default_factory=list)
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    http_client_tls_insecure_skip_verify: bool = False
    http_client_tls_root_ca_file: str = ""
    http_client_tls_cert: str = ""
    http_client_tls_key: str = ""
    allow_config_from_cidr: str = "127.0.0.1/8"
    notification_http_endpoint: str = ""
    acl_http_header: str = "X-Forwarded-User"
    admin_users: list[str] = field(default_factory=list)
    #: [nsqpy] seconds between two samples of the cluster's /stats (0 disables the sampler)
    stats_sample_interval: float = 5.0
    #: [nsqpy] seconds of samples kept in memory
    stats_retention: float = 3600.0
    #: [nsqpy] Apache htpasswd file of bcrypt entries: turns on the login (pages and /api/*)
    htpasswd_file: str = ""
    #: [nsqpy] seconds a login session lasts
    session_timeout: float = 12 * 3600.0
    #: [nsqpy] serve HTTPS with this certificate and key (PEM)
    tls_cert: str = ""
    tls_key: str = ""
    #: [nsqpy] file of admin tokens; the first is sent to nsqd and nsqlookupd as a Bearer token
    admin_token_file: str = ""
    #: Field names set by a command-line flag or the config file (not by default).
    explicit: set[str] = field(default_factory=set, repr=False, compare=False)


#: Every nsqadmin flag, in the order Go declares them, then nsqpy's own.
FLAGS: Final[tuple[Flag, ...]] = (
    _nocfg("config", STRING, "path to a TOML config file (keys are the flag names with '_')"),
    _nocfg("version", BOOL, "print the version and exit"),
    _f("log-level", LOG_LEVEL, "log verbosity: debug, info, warn, error or fatal"),
    _f("log-prefix", STRING, "text put at the start of every log line"),
    _nocfg("verbose", BOOL, "[deprecated] does nothing; use --log-level"),
    _f("http-address", STRING, "<addr>:<port> to listen on for HTTP clients"),
    _f("base-path", STRING, "URL base path (to serve nsqadmin under a prefix, behind a proxy)"),
    _f("dev-static-dir", STRING, "(development use only) serve the static files from this directory"),
    _f("graphite-url", STRING, "graphite HTTP address"),
    _f("proxy-graphite", BOOL, "proxy HTTP requests to graphite"),
    _f(
        "statsd-counter-format", STRING, "the counter stats key formatting applied by statsd (empty for none)"
    ),
    _f("statsd-gauge-format", STRING, "the gauge stats key formatting applied by statsd (empty for none)"),
    _f(
        "statsd-prefix",
        STRING,
        "prefix of the keys sent to statsd (%s for host replacement, must match nsqd)",
    ),
    _f("statsd-interval", DURATION, "interval nsqd pushes to statsd at (must match nsqd)"),
    _f(
        "notification-http-endpoint",
        STRING,
        "HTTP endpoint (fully qualified) that admin actions are POSTed to as JSON",
    ),
    _f("http-client-connect-timeout", DURATION, "timeout for HTTP connect"),
    _f("http-client-request-timeout", DURATION, "timeout for HTTP request"),
    _f(
        "http-client-tls-insecure-skip-verify",
        BOOL,
        "configure the HTTP client to skip verification of TLS certificates",
    ),
    _f("http-client-tls-root-ca-file", STRING, "path to CA file for the HTTP client"),
    _f("http-client-tls-cert", STRING, "path to certificate file for the HTTP client"),
    _f("http-client-tls-key", STRING, "path to key file for the HTTP client"),
    _f("allow-config-from-cidr", STRING, "a CIDR from which to allow HTTP requests to the /config endpoint"),
    _f("acl-http-header", STRING, "HTTP header to check for authenticated admin users"),
    _f(
        "lookupd-http-address",
        STRING_LIST,
        "lookupd HTTP address (may be given multiple times)",
        attr="nsqlookupd_http_addresses",
        cfg="nsqlookupd_http_addresses",
    ),
    _f(
        "nsqd-http-address",
        STRING_LIST,
        "nsqd HTTP address (may be given multiple times)",
        attr="nsqd_http_addresses",
        cfg="nsqd_http_addresses",
    ),
    _f(
        "admin-user",
        STRING_LIST,
        "admin user (may be given multiple times; if set, only these users may perform "
        "privileged actions; acl-http-header names the authenticated user)",
        attr="admin_users",
        cfg="admin_users",
    ),
    # nsqpy additions
    _f(
        "stats-sample-interval",
        DURATION,
        "[nsqpy] how often to sample the cluster's /stats for the built-in rate and depth "
        "charts (0 disables the sampler and /api/series)",
    ),
    _f("stats-retention", DURATION, "[nsqpy] how much sampled history to keep in memory"),
    _f(
        "htpasswd-file",
        STRING,
        "[nsqpy] Apache htpasswd file of bcrypt entries (htpasswd -B): every page and /api/* then "
        "needs a login or HTTP Basic credentials; --admin-user names the admins among its users "
        "(re-read on SIGHUP)",
    ),
    _f("session-timeout", DURATION, "[nsqpy] how long a login lasts (with --htpasswd-file)"),
    _f("tls-cert", STRING, "[nsqpy] path to a certificate file: serve HTTPS on --http-address"),
    _f("tls-key", STRING, "[nsqpy] path to the private key file of --tls-cert"),
    _f(
        "admin-token-file",
        STRING,
        "[nsqpy] file of admin tokens (one a line, mode 600): the first is sent as "
        "'Authorization: Bearer' to every nsqd and nsqlookupd (re-read on SIGHUP)",
    ),
)

_FLAGSET: Final = FlagSet("nsqadmin", FLAGS, Options)


def parse_args(argv: Sequence[str]) -> Options:
    """Parse nsqadmin's command line (without the program name) and its ``--config`` file:
    Go ``flag`` syntax; a flag on the command line beats the config file, which beats the
    default."""
    return _FLAGSET.parse(argv)


def usage() -> str:
    """The ``-help`` text: every flag, sorted like Go's, with its default."""
    return _FLAGSET.usage()


def config_value(opts: Options, name: str) -> object:
    """Option ``name`` (a config key) as Go JSON-encodes it (durations in nanoseconds, the
    log level as Go's int). KeyError for unknown names."""
    return _FLAGSET.config_value(opts, name)


# --- Go's nsqadmin.New checks -------------------------------------------------------------------


def normalize_base_path(p: str) -> str:
    """Go's ``normalizeBasePath``: ``""`` → ``/``; a leading ``/`` added; ``path.Clean``."""
    if not p:
        return "/"
    if not p.startswith("/"):
        p = "/" + p
    return posixpath.normpath(p).replace("//", "/") or "/"


def parse_cidr(cidr: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """Go's ``net.ParseCIDR`` (the network, host bits cleared); ValueError with Go's text."""
    if "/" not in cidr:
        raise ValueError(f"invalid CIDR address: {cidr}")
    try:
        return ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise ValueError(f"invalid CIDR address: {cidr}") from None


def _resolve_tcp_addr(address: str) -> None:
    """Go's ``net.ResolveTCPAddr("tcp", address)``; ValueError with Go's text."""
    if address.startswith("["):
        end = address.find("]")
        if end == -1:
            raise ValueError(f"address {address}: missing ']' in address")
        host, rest = address[1:end], address[end + 1 :]
        if not rest.startswith(":"):
            raise ValueError(f"address {address}: missing port in address")
        port = rest[1:]
    else:
        if ":" not in address:
            raise ValueError(f"address {address}: missing port in address")
        host, _, port = address.rpartition(":")
        if ":" in host:
            raise ValueError(f"address {address}: too many colons in address")
    if port and not port.isdigit():
        try:
            socket.getservbyname(port, "tcp")
        except OSError:
            raise ValueError(f"lookup tcp/{port}: unknown port") from None
    elif port and int(port) > 65535:
        raise ValueError(f"address {address}: invalid port")
    if host:
        try:
            socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise ValueError(f"lookup {host}: no such host") from None


def client_ssl_context(opts: Options) -> ssl.SSLContext:
    """The TLS configuration of the HTTP client (toward nsqd, nsqlookupd and graphite), as
    Go's ``nsqadmin.New`` builds it; OptionsError with Go's messages."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if opts.http_client_tls_insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if opts.http_client_tls_cert and opts.http_client_tls_key:
        try:
            ctx.load_cert_chain(opts.http_client_tls_cert, opts.http_client_tls_key)
        except (OSError, ssl.SSLError) as e:
            raise OptionsError(
                f"failed to LoadX509KeyPair {opts.http_client_tls_cert}, "
                f"{opts.http_client_tls_key} - {getattr(e, 'strerror', None) or e}"
            ) from None
    path = opts.http_client_tls_root_ca_file
    if path:
        try:
            with open(path, "rb") as fh:
                pem = fh.read()
        except OSError as e:
            raise OptionsError(
                f"failed to read TLS root CA file {path} - open {path}: {(e.strerror or str(e)).lower()}"
            ) from None
        # Go replaces the system roots with this pool
        try:
            ctx.load_verify_locations(cadata=pem.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError):
            raise OptionsError(f"failed to AppendCertsFromPEM {path}") from None
    else:
        ctx.load_default_certs()
    return ctx


def validate(opts: Options) -> None:
    """The checks of Go's ``nsqadmin.New``, in its order and with its messages (plus the log
    level and our sampler's durations). Normalizes ``base_path`` as Go does."""
    try:
        opts.log_level = parse_log_level(opts.log_level)
    except ValueError as exc:
        raise OptionsError(str(exc)) from None
    if not opts.nsqd_http_addresses and not opts.nsqlookupd_http_addresses:
        raise OptionsError("--nsqd-http-address or --lookupd-http-address required")
    if opts.nsqd_http_addresses and opts.nsqlookupd_http_addresses:
        raise OptionsError("use --nsqd-http-address or --lookupd-http-address not both")
    if opts.http_client_tls_cert and not opts.http_client_tls_key:
        raise OptionsError("--http-client-tls-key must be specified with --http-client-tls-cert")
    if opts.http_client_tls_key and not opts.http_client_tls_cert:
        raise OptionsError("--http-client-tls-cert must be specified with --http-client-tls-key")
    client_ssl_context(opts)
    for flag_name, addresses in (
        ("--lookupd-http-address", opts.nsqlookupd_http_addresses),
        ("--nsqd-http-address", opts.nsqd_http_addresses),
    ):
        for address in addresses:
            try:
                _resolve_tcp_addr(address)
            except ValueError as e:
                raise OptionsError(f"failed to resolve {flag_name} ({address}) - {e}") from None
    if opts.proxy_graphite:
        try:
            parts = urlsplit(opts.graphite_url)
            _ = parts.port
        except ValueError as e:
            raise OptionsError(
                f'failed to parse --graphite-url ({opts.graphite_url}) - parse "{opts.graphite_url}": {e}'
            ) from None
    if opts.allow_config_from_cidr:
        try:
            parse_cidr(opts.allow_config_from_cidr)
        except ValueError as e:
            raise OptionsError(
                f"failed to parse --allow-config-from-cidr ({opts.allow_config_from_cidr}) - {e}"
            ) from None
    if opts.stats_sample_interval < 0:
        raise OptionsError("--stats-sample-interval must be >= 0")
    if opts.stats_sample_interval > 0 and opts.stats_retention < opts.stats_sample_interval:
        raise OptionsError("--stats-retention must be >= --stats-sample-interval")
    if opts.tls_cert and not opts.tls_key:
        raise OptionsError("--tls-key must be specified with --tls-cert")
    if opts.tls_key and not opts.tls_cert:
        raise OptionsError("--tls-cert must be specified with --tls-key")
    if opts.session_timeout <= 0:
        raise OptionsError("--session-timeout must be > 0")
    opts.base_path = normalize_base_path(opts.base_path)
