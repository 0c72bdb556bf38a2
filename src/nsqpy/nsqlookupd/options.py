"""nsqlookupd options: the flag table and config-file keys of NSQ 1.3.0's nsqlookupd.

Parsing follows the Go daemon (``apps/nsqlookupd``): Go ``flag`` syntax, then an optional
``--config`` TOML file (keys are the flag names with ``_``) for flags not given on the command
line, with go-options' coercions; machinery in :mod:`nsqpy.goflags`. Durations are float
seconds.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from nsqpy.goflags import (
    BOOL,
    DURATION,
    LOG_LEVEL,
    STRING,
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
    "config_value",
    "parse_args",
    "usage",
    "validate",
]


@dataclass(slots=True)
class Options:
    """Every nsqlookupd setting; see :data:`FLAGS`."""

    version: bool = False
    config: str = ""
    log_level: str = "info"
    log_prefix: str = "[nsqlookupd] "
    verbose: bool = False  # deprecated, no effect
    tcp_address: str = "0.0.0.0:4160"
    http_address: str = "0.0.0.0:4161"
    broadcast_address: str = field(default_factory=socket.gethostname)
    #: seconds a producer stays in ``/lookup`` after its last PING
    inactive_producer_timeout: float = 300.0
    #: seconds a tombstoned producer stays hidden from ``/lookup``
    tombstone_lifetime: float = 45.0
    #: bearer tokens the admin routes require (an nsqpy addition), none when empty
    admin_token_file: str = ""
    #: Field names set by a command-line flag or the config file (not by default).
    explicit: set[str] = field(default_factory=set, repr=False, compare=False)


#: Every nsqlookupd flag, in the order Go declares them.
FLAGS: Final[tuple[Flag, ...]] = (
    _nocfg("config", STRING, "path to a TOML config file (keys are the flag names with '_')"),
    _nocfg("version", BOOL, "print the version and exit"),
    _f("log-level", LOG_LEVEL, "log verbosity: debug, info, warn, error or fatal"),
    _f("log-prefix", STRING, "text put at the start of every log line"),
    _nocfg("verbose", BOOL, "[deprecated] does nothing; use --log-level"),
    _f("tcp-address", STRING, "<addr>:<port> or unix socket path for nsqd registrations (TCP)"),
    _f("http-address", STRING, "<addr>:<port> or unix socket path for the HTTP API"),
    _f("broadcast-address", STRING, "address of this nsqlookupd (defaults to the hostname)"),
    _f("inactive-producer-timeout", DURATION, "how long a producer stays listed after its last ping"),
    _f("tombstone-lifetime", DURATION, "how long a tombstoned producer stays hidden while still registered"),
    _f(
        "admin-token-file",
        STRING,
        "file of bearer tokens (one per line, mode 600) that the HTTP API's changes and /debug "
        "require (an nsqpy addition; re-read on SIGHUP)",
    ),
)

_FLAGSET: Final = FlagSet("nsqlookupd", FLAGS, Options)


def parse_args(argv: Sequence[str]) -> Options:
    """Parse nsqlookupd's command line (without the program name) and its ``--config``
    file: Go ``flag`` syntax; a flag on the command line beats the config file, which
    beats the default."""
    return _FLAGSET.parse(argv)


def usage() -> str:
    """The ``-help`` text: every flag, sorted like Go's, with its default."""
    return _FLAGSET.usage()


def config_value(opts: Options, name: str) -> object:
    """Option ``name`` (a config key) as Go JSON-encodes it (durations in nanoseconds, the
    log level as Go's int). KeyError for unknown names."""
    return _FLAGSET.config_value(opts, name)


def validate(opts: Options) -> None:
    """Checks for an Options built in code (the command line validates as it parses)."""
    try:
        opts.log_level = parse_log_level(opts.log_level)
    except ValueError as exc:
        raise OptionsError(str(exc)) from None
