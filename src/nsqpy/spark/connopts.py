"""The connection options of the ``nsq`` source and sink: TLS, compression, AUTH and the
IDENTIFY settings, under Spark option names (camelCase, durations in milliseconds, as the
other ``nsq`` options), each one a go-nsq ``Config`` option:

====================== =========================== =======================================
Spark option           go-nsq option               value
====================== =========================== =======================================
tls                    tls_v1                      bool: upgrade the connection to TLS
tlsRootCaFile          tls_root_ca_file            PEM CA bundle to verify nsqd with
                                                   (default: the system's CAs)
tlsCert, tlsKey        tls_cert, tls_key           client certificate and key (PEM)
tlsInsecureSkipVerify  tls_insecure_skip_verify    bool: do not verify nsqd's certificate
tlsMinVersion          tls_min_version             tls1.0 .. tls1.3
snappy                 snappy                      bool: snappy compression
deflate                deflate                     bool: deflate compression
deflateLevel           deflate_level               1..9 (default 6)
authSecret             auth_secret                 sent with AUTH when nsqd requires it
                                                   (and as a Bearer token to nsqlookupd)
heartbeatIntervalMs    heartbeat_interval          ms, -1 disables heartbeats
outputBufferSize       output_buffer_size          bytes nsqd buffers before a write, -1 off
outputBufferTimeoutMs  output_buffer_timeout       ms nsqd waits before flushing, -1 off
userAgent              user_agent                  IDENTIFY's user_agent
dialTimeoutMs          dial_timeout                ms to wait for the TCP connection
sampleRate             sample_rate                 source only: 1..99 % of the messages
                                                   (0: all)
====================== =========================== =======================================

The source also maps go-nsq's ``max_in_flight``, ``msg_timeout`` and
``lookupd_poll_interval`` (its ``maxInFlight``, ``msgTimeoutMs``,
``lookupdPollIntervalMs``): :data:`GO_OPTIONS` is the whole table ``nsq_spark
--consumer-opt/--producer-opt`` translate with :func:`from_go_options`.

The TLS options need ``tls`` true; ``snappy`` and ``deflate`` exclude each other. The auth
secret is kept out of ``repr`` and never logged; Spark redacts option values whose key
matches ``spark.redaction.regex`` (``secret`` by default) in plans and UIs.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nsqpy import __version__
from nsqpy.goflags import NumError, parse_bool, parse_duration
from nsqpy.transport import client_tls_context
from nsqpy.transport.tls import TLS_MIN_VERSIONS

USER_AGENT = f"nsqpy-spark/{__version__}"

__all__ = [
    "GO_OPTIONS",
    "USER_AGENT",
    "ConnectionOptions",
    "from_go_options",
]

_BOOL, _INT, _MS, _STR = "bool", "int", "ms", "str"

#: go-nsq option → (Spark option, kind, sides: "c" consumer/source, "p" producer/sink)
GO_OPTIONS: dict[str, tuple[str, str, str]] = {
    "tls_v1": ("tls", _BOOL, "cp"),
    "tls_root_ca_file": ("tlsRootCaFile", _STR, "cp"),
    "tls_cert": ("tlsCert", _STR, "cp"),
    "tls_key": ("tlsKey", _STR, "cp"),
    "tls_insecure_skip_verify": ("tlsInsecureSkipVerify", _BOOL, "cp"),
    "tls_min_version": ("tlsMinVersion", _STR, "cp"),
    "snappy": ("snappy", _BOOL, "cp"),
    "deflate": ("deflate", _BOOL, "cp"),
    "deflate_level": ("deflateLevel", _INT, "cp"),
    "auth_secret": ("authSecret", _STR, "cp"),
    "heartbeat_interval": ("heartbeatIntervalMs", _MS, "cp"),
    "output_buffer_size": ("outputBufferSize", _INT, "cp"),
    "output_buffer_timeout": ("outputBufferTimeoutMs", _MS, "cp"),
    "user_agent": ("userAgent", _STR, "cp"),
    "dial_timeout": ("dialTimeoutMs", _MS, "cp"),
    "sample_rate": ("sampleRate", _INT, "c"),
    "max_in_flight": ("maxInFlight", _INT, "c"),
    "msg_timeout": ("msgTimeoutMs", _MS, "c"),
    "lookupd_poll_interval": ("lookupdPollIntervalMs", _MS, "c"),
}

_TLS_FILES = ("tlsRootCaFile", "tlsCert", "tlsKey")


def from_go_options(items: Iterable[str], consumer: bool) -> dict[str, str]:
    """``name,value`` items (go-nsq's ``ConfigFlag``: a bare name is ``true``) → Spark
    options. Raises ValueError naming the item for an unknown option, one that does not
    apply to this side, or a value of the wrong type. Durations are Go's (``30s``)."""
    flag = "--consumer-opt" if consumer else "--producer-opt"
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition(",")
        name = name.strip()
        if not sep:
            value = "true"
        spec = GO_OPTIONS.get(name)
        if spec is None:
            known = ", ".join(n for n, s in GO_OPTIONS.items() if ("c" if consumer else "p") in s[2])
            raise ValueError(f"{flag} {name!r}: not an option nsq_spark supports ({known})")
        option, kind, sides = spec
        if ("c" if consumer else "p") not in sides:
            raise ValueError(f"{flag} {name!r}: applies to consumers only")
        try:
            if kind == _BOOL:
                value = "true" if parse_bool(value.strip()) else "false"
            elif kind == _INT:
                value = str(int(value.strip()))
            elif kind == _MS:
                value = str(round(parse_duration(value.strip()) * 1000))
        except (NumError, ValueError) as exc:
            shown = "<secret>" if name == "auth_secret" else repr(value)
            raise ValueError(f"{flag} {name}: invalid value {shown} ({exc})") from None
        out[option] = value
    try:  # the values' ranges and the TLS files, reported with go-nsq's names
        ConnectionOptions.parse({k.lower(): v for k, v in out.items()}, flag, consumer)
    except ValueError as exc:
        text = str(exc)
        for go_name, (option, _, _) in GO_OPTIONS.items():
            text = text.replace(f"{option!r}", go_name)
        raise ValueError(text.replace(": options ", ": ").replace("option ", "")) from None
    return out


@dataclass(frozen=True)
class ConnectionOptions:
    """The connection options, validated (see the module docstring); ``None``: not set,
    the side's default applies (nsqd's for the IDENTIFY settings)."""

    tls: bool = False
    tls_root_ca_file: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_insecure_skip_verify: bool = False
    tls_min_version: str = ""
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    auth_secret: str = field(default="", repr=False)
    heartbeat_interval_ms: int | None = None
    output_buffer_size: int | None = None
    output_buffer_timeout_ms: int | None = None
    user_agent: str = USER_AGENT
    dial_timeout_ms: int = 5000
    sample_rate: int = 0

    @classmethod
    def parse(cls, opts: Mapping[str, Any], who: str, consumer: bool) -> ConnectionOptions:
        """From the data source's options (keys lower-cased); ``who`` prefixes the errors
        (``nsq source``). A TLS context is built once here, so a bad file is reported at
        query start."""

        def raw(name: str) -> str | None:
            v = opts.get(name.lower())
            return None if v is None or str(v).strip() == "" else str(v).strip()

        def boolean(name: str) -> bool:
            v = raw(name)
            if v is None:
                return False
            if v.lower() in ("true", "1", "yes"):
                return True
            if v.lower() in ("false", "0", "no"):
                return False
            raise ValueError(f"{who}: option {name!r} must be true or false, got {v!r}")

        def integer(name: str, minimum: int, maximum: int | None = None) -> int | None:
            v = raw(name)
            if v is None:
                return None
            try:
                n = int(v)
            except ValueError:
                raise ValueError(f"{who}: option {name!r} must be an integer, got {v!r}") from None
            if n < minimum or (maximum is not None and n > maximum):
                bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
                raise ValueError(f"{who}: option {name!r} must be {bound}, got {n}")
            return n

        if not consumer and raw("sampleRate") is not None:
            raise ValueError(f"{who}: option 'sampleRate' applies to reading only")
        tls = boolean("tls")
        for name in (*_TLS_FILES, "tlsMinVersion", "tlsInsecureSkipVerify"):
            if raw(name) is not None and not tls:
                raise ValueError(f"{who}: option {name!r} needs option 'tls' set to true")
        min_version = (raw("tlsMinVersion") or "").lower()
        if min_version and min_version not in TLS_MIN_VERSIONS:
            raise ValueError(
                f"{who}: option 'tlsMinVersion' must be one of {', '.join(TLS_MIN_VERSIONS)}, "
                f"got {min_version!r}"
            )
        for name in _TLS_FILES:
            path = raw(name)
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"{who}: option {name!r}: no such file {path!r}")
        if raw("tlsKey") is not None and raw("tlsCert") is None:
            raise ValueError(f"{who}: option 'tlsKey' needs option 'tlsCert'")
        snappy, deflate = boolean("snappy"), boolean("deflate")
        if snappy and deflate:
            raise ValueError(f"{who}: options 'snappy' and 'deflate' cannot both be true")
        out = cls(
            tls=tls,
            tls_root_ca_file=raw("tlsRootCaFile") or "",
            tls_cert=raw("tlsCert") or "",
            tls_key=raw("tlsKey") or "",
            tls_insecure_skip_verify=boolean("tlsInsecureSkipVerify"),
            tls_min_version=min_version,
            snappy=snappy,
            deflate=deflate,
            deflate_level=integer("deflateLevel", 1, 9) or 6,
            auth_secret=str(opts.get("authsecret") or ""),
            heartbeat_interval_ms=integer("heartbeatIntervalMs", -1),
            output_buffer_size=integer("outputBufferSize", -1),
            output_buffer_timeout_ms=integer("outputBufferTimeoutMs", -1),
            user_agent=raw("userAgent") or USER_AGENT,
            dial_timeout_ms=integer("dialTimeoutMs", 1) or 5000,
            sample_rate=(integer("sampleRate", 0, 99) or 0) if consumer else 0,
        )
        if tls:
            try:
                out.tls_context()
            except (OSError, ssl.SSLError, ValueError) as exc:
                raise ValueError(f"{who}: the TLS options do not load: {exc}") from None
        return out

    def tls_context(self) -> ssl.SSLContext | None:
        """A client context from the TLS options (None without ``tls``)."""
        if not self.tls:
            return None
        return client_tls_context(
            root_ca_file=self.tls_root_ca_file,
            cert_file=self.tls_cert,
            key_file=self.tls_key,
            insecure_skip_verify=self.tls_insecure_skip_verify,
            min_version=self.tls_min_version,
        )

    def identify(self, **defaults: Any) -> dict[str, Any]:
        """The IDENTIFY fields: the upgrades asked, the settings given (else ``defaults``:
        ``heartbeat_interval``, ``output_buffer_timeout``, ``msg_timeout``…)."""
        import socket

        hostname = socket.gethostname()
        fields: dict[str, Any] = {
            "client_id": hostname.split(".")[0],
            "hostname": hostname,
            "user_agent": self.user_agent,
            **defaults,
        }
        if self.tls:
            fields["tls_v1"] = True
        if self.snappy:
            fields["snappy"] = True
        if self.deflate:
            fields["deflate"] = True
            fields["deflate_level"] = self.deflate_level
        if self.heartbeat_interval_ms is not None:
            fields["heartbeat_interval"] = self.heartbeat_interval_ms
        if self.output_buffer_size is not None:
            fields["output_buffer_size"] = self.output_buffer_size
        if self.output_buffer_timeout_ms is not None:
            fields["output_buffer_timeout"] = self.output_buffer_timeout_ms
        if self.sample_rate:
            fields["sample_rate"] = self.sample_rate
        return fields
