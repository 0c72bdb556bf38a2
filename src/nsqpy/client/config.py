"""Client configuration: one frozen object whose fields are go-nsq's ``Config`` option names.

Durations are float seconds. :meth:`ConnectionConfig.from_go_options` accepts the option
names and textual values that go-nsq's ``Config.Set`` accepts (what ``--consumer-opt
name,value`` and ``--producer-opt`` pass), e.g. ``{"max_in_flight": "200",
"read_timeout": "30s", "tls_v1": "true", "tls_root_ca_file": "ca.pem", "snappy": "true",
"auth_secret": "..."}``.

The connection features, as in go-nsq: ``tls_v1`` asks nsqd for TLS (verified against
``tls_root_ca_file``, else the system's CAs, unless ``tls_insecure_skip_verify``; a client
certificate from ``tls_cert``/``tls_key``), or pass a ready ``ssl.SSLContext`` as
``tls_context`` instead of the file options; ``snappy`` or ``deflate`` (``deflate_level``)
compress the stream; ``auth_secret`` is sent with ``AUTH`` when nsqd requires it and as
``Authorization: Bearer`` to nsqlookupd. nsqd may decline TLS or compression (no
certificate, ``--snappy=false``): the connection then carries on without it, as go-nsq's
does. The secret is never shown in ``repr``.
"""

from __future__ import annotations

import dataclasses
import socket
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from nsqpy import __version__
from nsqpy.goflags import parse_bool, parse_duration
from nsqpy.transport import client_tls_context, snappy_available
from nsqpy.transport.tls import TLS_MIN_VERSIONS

from .errors import UnsupportedFeatureError

BackoffStrategyName = Literal["exponential", "full_jitter"]

_MS = 0.001
_MIN = 60.0

#: go-nsq's ``min``/``max`` tags: the valid range of each numeric option (inclusive).
_RANGES: dict[str, tuple[float, float | None]] = {
    "read_timeout": (100 * _MS, 5 * _MIN),
    "write_timeout": (100 * _MS, 5 * _MIN),
    "lookupd_poll_interval": (10 * _MS, 5 * _MIN),
    "lookupd_poll_jitter": (0.0, 1.0),
    "max_requeue_delay": (0.0, 60 * _MIN),
    "default_requeue_delay": (0.0, 60 * _MIN),
    "max_backoff_duration": (0.0, 60 * _MIN),
    "backoff_multiplier": (0.0, 60 * _MIN),
    "max_attempts": (0, 65535),
    "low_rdy_idle_timeout": (1.0, 5 * _MIN),
    "low_rdy_timeout": (1.0, 5 * _MIN),
    "rdy_redistribute_interval": (1 * _MS, 5.0),
    "sample_rate": (0, 99),
    "deflate_level": (1, 9),
    "max_in_flight": (0, None),
    "msg_timeout": (0.0, None),
    "max_msg_size": (0, None),
    "dial_timeout": (0.0, None),
}

#: Options that are durations (parsed with Go's ``time.ParseDuration``).
_DURATIONS = frozenset(
    {
        "dial_timeout",
        "read_timeout",
        "write_timeout",
        "lookupd_poll_interval",
        "lookupd_poll_timeout",
        "max_requeue_delay",
        "default_requeue_delay",
        "max_backoff_duration",
        "backoff_multiplier",
        "low_rdy_idle_timeout",
        "low_rdy_timeout",
        "rdy_redistribute_interval",
        "heartbeat_interval",
        "output_buffer_timeout",
        "msg_timeout",
    }
)


#: The TLS options a ``tls_context`` replaces.
_TLS_FILE_OPTIONS = ("tls_root_ca_file", "tls_cert", "tls_key", "tls_min_version", "tls_insecure_skip_verify")

#: Fields that are Python objects, not go-nsq options.
_NOT_GO_OPTIONS = frozenset({"extra_identify", "tls_context"})


def _default_hostname() -> str:
    return socket.gethostname()


def _default_client_id() -> str:
    return socket.gethostname().split(".")[0]


@dataclass(frozen=True, kw_only=True)
class ConnectionConfig:
    """Every go-nsq option, with go-nsq's defaults (durations in seconds).

    Connection-level fields go into IDENTIFY; consumer-level ones (``max_in_flight``,
    ``max_attempts``, backoff, lookupd polling, RDY redistribution) are the defaults a
    :class:`~nsqpy.client.Consumer` uses unless its own keyword arguments override them.
    """

    dial_timeout: float = 1.0
    read_timeout: float = 60.0
    write_timeout: float = 1.0
    local_addr: str | None = None

    lookupd_poll_interval: float = 60.0
    lookupd_poll_jitter: float = 0.3
    lookupd_poll_timeout: float = 60.0

    max_requeue_delay: float = 15 * _MIN
    default_requeue_delay: float = 90.0
    backoff_strategy: BackoffStrategyName = "exponential"
    max_backoff_duration: float = 2 * _MIN
    backoff_multiplier: float = 1.0
    max_attempts: int = 5
    low_rdy_idle_timeout: float = 10.0
    low_rdy_timeout: float = 30.0
    rdy_redistribute_interval: float = 5.0

    client_id: str = field(default_factory=_default_client_id)
    hostname: str = field(default_factory=_default_hostname)
    user_agent: str = f"nsqpy/{__version__}"
    topology_region: str = ""
    topology_zone: str = ""

    heartbeat_interval: float = 30.0
    sample_rate: int = 0

    tls_v1: bool = False
    tls_root_ca_file: str = ""
    tls_insecure_skip_verify: bool = False
    tls_cert: str = ""
    tls_key: str = ""
    tls_min_version: str = ""
    #: A client context to use instead of the ``tls_*`` file options (implies ``tls_v1``).
    #: nsqd's name is checked against the host of the address connected to.
    tls_context: ssl.SSLContext | None = field(default=None, compare=False)

    deflate: bool = False
    deflate_level: int = 6
    snappy: bool = False

    output_buffer_size: int = 16384
    output_buffer_timeout: float = 0.25

    max_in_flight: int = 1
    msg_timeout: float = 0.0
    max_msg_size: int = 0
    auth_secret: str = field(default="", repr=False)
    skip_lookupd_authorization: bool = True

    #: Extra IDENTIFY fields (forward-compatible feature negotiation).
    extra_identify: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, (lo, hi) in _RANGES.items():
            v = getattr(self, name)
            if v < lo or (hi is not None and v > hi):
                raise ValueError(f"invalid {name} ! {v} out of range [{lo}, {hi}]")
        if self.backoff_strategy not in ("exponential", "full_jitter"):
            raise ValueError(f"invalid backoff_strategy {self.backoff_strategy!r}")
        if self.heartbeat_interval > 0 and self.heartbeat_interval >= self.read_timeout:
            raise ValueError(
                f"heartbeat_interval {self.heartbeat_interval} must be less than "
                f"read_timeout {self.read_timeout}"
            )
        if self.deflate and self.snappy:
            raise ValueError("cannot enable both deflate and snappy compression")
        if self.tls_min_version and self.tls_min_version not in TLS_MIN_VERSIONS:
            raise ValueError(
                f"invalid tls_min_version {self.tls_min_version!r} (one of {', '.join(TLS_MIN_VERSIONS)})"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key must be given together")
        if self.tls_context is not None:
            if not isinstance(self.tls_context, ssl.SSLContext):
                raise TypeError(f"tls_context must be an ssl.SSLContext, not {type(self.tls_context)}")
            files = [name for name in _TLS_FILE_OPTIONS if getattr(self, name)]
            if files:
                raise ValueError(f"tls_context replaces {', '.join(files)}: give one or the other")
            object.__setattr__(self, "tls_v1", True)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_ssl_context", None)  # a cache (and not picklable): rebuilt when needed
        return state

    def replace(self, **changes: Any) -> ConnectionConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def check_supported(self) -> None:
        """Refuse now what every connection would fail on later: snappy without its
        compression library, TLS files that cannot be loaded (UnsupportedFeatureError, a
        ValueError)."""
        if self.snappy and not snappy_available():
            raise UnsupportedFeatureError("snappy needs the cramjam package")
        if self.tls_v1:
            self.ssl_context()

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS client context: ``tls_context``, else one built (once) from the
        ``tls_*`` options. Raises UnsupportedFeatureError when a file cannot be loaded."""
        if self.tls_context is not None:
            return self.tls_context
        ctx: ssl.SSLContext | None = self.__dict__.get("_ssl_context")
        if ctx is None:
            try:
                ctx = client_tls_context(
                    root_ca_file=self.tls_root_ca_file,
                    cert_file=self.tls_cert,
                    key_file=self.tls_key,
                    insecure_skip_verify=self.tls_insecure_skip_verify,
                    min_version=self.tls_min_version,
                )
            except (OSError, ssl.SSLError) as e:
                files = ", ".join(
                    f"{name}={getattr(self, name)!r}"
                    for name in ("tls_root_ca_file", "tls_cert", "tls_key")
                    if getattr(self, name)
                )
                raise UnsupportedFeatureError(
                    f"cannot load the TLS files ({files or 'the system CAs'}): {e}"
                ) from e
            object.__setattr__(self, "_ssl_context", ctx)  # a cache, not a field
        return ctx

    def identify(self) -> dict[str, Any]:
        """The IDENTIFY body this configuration sends."""

        def ms(v: float) -> int:
            return -1 if v < 0 else int(v * 1000)

        body: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "user_agent": self.user_agent,
            "feature_negotiation": True,
            "heartbeat_interval": ms(self.heartbeat_interval),
            "sample_rate": self.sample_rate,
            "tls_v1": self.tls_v1,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
            "snappy": self.snappy,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": ms(self.output_buffer_timeout),
            "msg_timeout": ms(self.msg_timeout),
        }
        if self.topology_region:
            body["topology_region"] = self.topology_region
        if self.topology_zone:
            body["topology_zone"] = self.topology_zone
        body.update(self.extra_identify)
        return body

    @classmethod
    def from_go_options(
        cls,
        options: Mapping[str, str] | Iterable[str],
        base: ConnectionConfig | None = None,
    ) -> ConnectionConfig:
        """Parse go-nsq option names and values: a mapping, or ``"name,value"`` strings.

        Names may use ``-`` for ``_`` (as go-nsq's ``Config.Set``); durations take Go
        syntax (``"250ms"``, ``"1m30s"``), bools ``strconv.ParseBool`` syntax.
        """
        if isinstance(options, Mapping):
            pairs = list(options.items())
        else:
            pairs = []
            for item in options:
                name, sep, value = item.partition(",")
                if not sep:
                    raise ValueError(f"option {item!r} is not of the form name,value")
                pairs.append((name, value))
        fields = {f.name: f for f in dataclasses.fields(cls)}
        changes: dict[str, Any] = {}
        for raw_name, value in pairs:
            name = raw_name.strip().replace("-", "_")
            if name == "lookupd_authorization":
                name = "skip_lookupd_authorization"
            if name not in fields or name in _NOT_GO_OPTIONS:
                raise ValueError(f"invalid option {raw_name}")
            changes[name] = _coerce(name, fields[name].type, value)
        return dataclasses.replace(base or cls(), **changes)


def _coerce(name: str, annotation: object, value: str) -> Any:
    try:
        if name in _DURATIONS:
            return parse_duration(value)
        text = str(annotation)
        if text == "bool":
            return parse_bool(value)
        if text == "int":
            return int(value, 10)
        if text == "float":
            return float(value)
        return value
    except ValueError as e:
        raise ValueError(f"failed to set option {name}: {e}") from e
