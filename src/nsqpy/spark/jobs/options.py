"""``nsq_spark``'s command line: one options class and one flag set per job.

Flags are Go style (:mod:`nsqpy.goflags`) and follow NSQ's tools (``--topic``,
``--lookupd-http-address``…). Every job has the source's and the runner's flags
(:class:`CommonOptions`); each adds its own, and ``nsq_spark <job> --help`` lists that job's
flags only. :func:`parse_args` and :func:`validate` are pure (no Spark).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Final

from nsqpy.goflags import (
    BOOL,
    DURATION,
    INT,
    LOG_LEVEL,
    STRING,
    STRING_LIST,
    Flag,
    FlagSet,
    HelpRequested,
    Kind,
    OptionsError,
)
from nsqpy.goflags import flag_nocfg as _f
from nsqpy.protocol.names import is_valid_channel_name, is_valid_topic_name
from nsqpy.spark.connopts import from_go_options

__all__ = [
    "AGGREGATE_RESERVED",
    "JOBS",
    "PROGRAM",
    "AggregateOptions",
    "ArchiveOptions",
    "CommonOptions",
    "JobOptions",
    "RepublishOptions",
    "parse_args",
    "sink_options",
    "source_options",
    "usage",
    "uses_json",
    "validate",
]

PROGRAM: Final = "nsq_spark"
JOBS: Final = ("archive", "aggregate", "republish")

#: Output column names of ``aggregate`` that a group-by field may not take.
AGGREGATE_RESERVED: Final = frozenset({"window_start", "window_end", "count"})

#: A repeatable flag whose values are kept whole (``--spark-conf k=a,b`` keeps the comma).
STRING_REPEAT: Final = Kind("strrepeat", "value", lambda s, cur: [*cur, s], repeatable=True)


# --------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class CommonOptions:
    """What every job has: the source, the state directories and the runner. Durations are
    float seconds (0: unset where noted)."""

    job: ClassVar[str] = ""
    version: bool = False
    topic: str = ""
    channel: str = "nsq_spark"
    lookupd_http_addresses: list[str] = field(default_factory=list)
    nsqd_tcp_addresses: list[str] = field(default_factory=list)
    # nsqd's max RDY. Unlike Go's tools (200), the source persists (fsync) every burst
    # before its FIN: the window is the most a chunk can hold, so it bounds throughput
    max_in_flight: int = 2500
    max_records_per_batch: int = 0  # 0: the source's default
    msg_timeout: float = 0.0  # 0: nsqd's default
    checkpoint_dir: str = ""  # "": nsq_spark-checkpoint/<job>/<topic>/<channel> in the cwd
    spool_dir: str = ""  # "": <checkpoint-dir>/spool
    master: str = "local[*]"
    spark_conf: list[str] = field(default_factory=list)
    available_now: bool = False
    trigger_interval: float = 0.0  # 0: the next micro-batch as soon as one ends
    #: go-nsq options as ``name,value`` (``--consumer-opt``), mapped onto the source's
    consumer_opts: list[str] = field(default_factory=list)
    #: NSQ's levels: nsq_spark's own log, and Spark's (WARN unless debug or info)
    log_level: str = "info"
    #: Field names set by a flag.
    explicit: set[str] = field(default_factory=set, repr=False, compare=False)

    #: list flags whose items are trimmed (and empty ones dropped) after parsing
    LISTS: ClassVar[tuple[str, ...]] = ("lookupd_http_addresses", "nsqd_tcp_addresses")

    def finish_parse(self) -> None:
        """Derived values that do not need validation (after the flags are set)."""
        for attr in self.LISTS:
            setattr(self, attr, [s.strip() for s in getattr(self, attr) if s.strip()])

    def validate_job(self) -> None:
        """The job's own checks (after the common ones)."""


@dataclass(slots=True)
class ArchiveOptions(CommonOptions):
    """``archive``: the topic to Parquet, partitioned by topic, date and hour."""

    job: ClassVar[str] = "archive"
    output_dir: str = ""

    def validate_job(self) -> None:
        if not self.output_dir:
            raise OptionsError("--output-dir required")


@dataclass(slots=True)
class _Publishing(CommonOptions):
    """The destination of the jobs that publish, and their reject directory."""

    destination_topic: str = ""
    destination_nsqd_tcp_addresses: list[str] = field(default_factory=list)
    #: go-nsq options as ``name,value`` (``--producer-opt``), mapped onto the sink's
    producer_opts: list[str] = field(default_factory=list)
    reject_dir: str = ""  # "": <checkpoint-dir>/rejects

    LISTS: ClassVar[tuple[str, ...]] = (*CommonOptions.LISTS, "destination_nsqd_tcp_addresses")


@dataclass(slots=True)
class AggregateOptions(_Publishing):
    """``aggregate``: counts per key and event-time window, to Parquet and/or a topic."""

    job: ClassVar[str] = "aggregate"
    output_dir: str = ""
    group_by: list[str] = field(default_factory=list)
    window: float = 60.0
    watermark: float = 0.0  # unless given: the window
    time_field: str = ""  # "": the message timestamp

    LISTS: ClassVar[tuple[str, ...]] = (*_Publishing.LISTS, "group_by")

    def finish_parse(self) -> None:
        CommonOptions.finish_parse(self)
        if "watermark" not in self.explicit:
            self.watermark = self.window

    def validate_job(self) -> None:
        if self.window <= 0:
            raise OptionsError("--window must be > 0")
        if self.watermark < 0:
            raise OptionsError("--watermark must be >= 0")
        seen: set[str] = set()
        for name in self.group_by:
            if name in AGGREGATE_RESERVED:
                raise OptionsError(f"--group-by field {name!r} clashes with an output column")
            if name in seen:
                raise OptionsError(f"--group-by field {name!r} given twice")
            seen.add(name)
        if self.destination_topic and not self.destination_nsqd_tcp_addresses:
            raise OptionsError("--destination-nsqd-tcp-address required")
        if self.destination_nsqd_tcp_addresses and not self.destination_topic:
            raise OptionsError("--destination-topic required")
        if self.destination_topic and not is_valid_topic_name(self.destination_topic):
            raise OptionsError("--destination-topic is invalid")
        if not self.output_dir and not self.destination_topic:
            raise OptionsError("--output-dir or --destination-topic required")


@dataclass(slots=True)
class RepublishOptions(_Publishing):
    """``republish``: the topic to another topic, optionally JSON-filtered (nsq_to_nsq)."""

    job: ClassVar[str] = "republish"
    require_json_field: str = ""
    require_json_value: str = ""
    whitelist_json_fields: list[str] = field(default_factory=list)

    LISTS: ClassVar[tuple[str, ...]] = (*_Publishing.LISTS, "whitelist_json_fields")

    def validate_job(self) -> None:
        if not self.destination_topic:
            self.destination_topic = self.topic
        if not is_valid_topic_name(self.destination_topic):
            raise OptionsError("--destination-topic is invalid")
        if not self.destination_nsqd_tcp_addresses:
            raise OptionsError("--destination-nsqd-tcp-address required")
        if self.destination_topic == self.topic and (
            set(self.destination_nsqd_tcp_addresses) & set(self.nsqd_tcp_addresses)
        ):
            raise OptionsError(
                "--destination-topic and --destination-nsqd-tcp-address are the source: "
                "the job would republish into the topic it reads"
            )


JobOptions = ArchiveOptions | AggregateOptions | RepublishOptions


# --------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------

_COMMON: Final[tuple[Flag, ...]] = (
    _f("version", BOOL, "print the version and exit"),
    _f(
        "log-level",
        LOG_LEVEL,
        "log level: debug, info, warn, error or fatal (Spark's own log at WARN unless debug: INFO)",
    ),
    _f("topic", STRING, "nsq topic to read (required)"),
    _f("channel", STRING, "nsq channel to read"),
    Flag(
        "lookupd-http-address",
        "lookupd_http_addresses",
        STRING_LIST,
        "lookupd HTTP address (may be given multiple times)",
        None,
    ),
    Flag(
        "nsqd-tcp-address",
        "nsqd_tcp_addresses",
        STRING_LIST,
        "nsqd TCP address (may be given multiple times)",
        None,
    ),
    _f("max-in-flight", INT, "max number of messages to allow in flight (spread over the nsqd connections)"),
    _f("max-records-per-batch", INT, "max messages per micro-batch (0: the source's default)"),
    _f("msg-timeout", DURATION, "message timeout asked of nsqd (0: nsqd's default)"),
    _f(
        "checkpoint-dir",
        STRING,
        "Spark checkpoint directory (default ./nsq_spark-checkpoint/<job>/<topic>/<channel>); "
        "keep it across runs; on a cluster, on storage every executor and the driver reach",
    ),
    _f(
        "spool-dir",
        STRING,
        "directory for the source's message spool (default <checkpoint-dir>/spool); keep it "
        "with the checkpoint; on a cluster, a path every executor sees (a shared mount)",
    ),
    _f("master", STRING, "Spark master URL (local[*], spark://host:7077, …)"),
    Flag(
        "spark-conf",
        "spark_conf",
        STRING_REPEAT,
        "Spark setting as key=value (may be given multiple times)",
        None,
    ),
    _f("available-now", BOOL, "bounded run: process what the topic holds now, then exit"),
    _f("trigger-interval", DURATION, "time between micro-batch starts in streaming mode (0: back to back)"),
    Flag(
        "consumer-opt",
        "consumer_opts",
        STRING_REPEAT,
        "option to passthrough to the nsq source as name,value, with go-nsq's option names "
        "(tls_v1, tls_root_ca_file, tls_cert, tls_key, tls_insecure_skip_verify, "
        "tls_min_version, snappy, deflate, deflate_level, auth_secret, sample_rate, "
        "heartbeat_interval, output_buffer_size, output_buffer_timeout, user_agent, "
        "dial_timeout, max_in_flight, msg_timeout, lookupd_poll_interval; "
        "may be given multiple times)",
        None,
    ),
)

_REJECTS: Final = _f(
    "reject-dir",
    STRING,
    "where malformed messages go as Parquet (source columns + error; default <checkpoint-dir>/rejects)",
)
_DEST_ADDR: Final = Flag(
    "destination-nsqd-tcp-address",
    "destination_nsqd_tcp_addresses",
    STRING_LIST,
    "destination nsqd TCP address (may be given multiple times)",
    None,
)
_PRODUCER_OPT: Final = Flag(
    "producer-opt",
    "producer_opts",
    STRING_REPEAT,
    "option to passthrough to the nsq sink as name,value, with go-nsq's option names "
    "(as --consumer-opt, less the consumer-only ones; may be given multiple times)",
    None,
)

_ARCHIVE_FLAGS: Final = (_f("output-dir", STRING, "Parquet output directory (required)"),)
_AGGREGATE_FLAGS: Final = (
    Flag(
        "group-by",
        "group_by",
        STRING_LIST,
        "top-level JSON fields to count by (comma separated or repeated)",
        None,
    ),
    _f("window", DURATION, "tumbling event-time window"),
    _f("watermark", DURATION, "how late an event may be (default: --window)"),
    _f(
        "time-field",
        STRING,
        "JSON field holding the event time: an RFC 3339 string or epoch seconds or "
        "milliseconds (default: the message timestamp)",
    ),
    _f("output-dir", STRING, "Parquet output directory for closed windows"),
    _f("destination-topic", STRING, "topic to publish closed windows to, one JSON line each"),
    _DEST_ADDR,
    _PRODUCER_OPT,
    _REJECTS,
)
_REPUBLISH_FLAGS: Final = (
    _f("destination-topic", STRING, "destination nsq topic (default: --topic)"),
    _DEST_ADDR,
    _f("require-json-field", STRING, "for JSON messages: only pass messages that contain this field"),
    _f(
        "require-json-value",
        STRING,
        "for JSON messages: only pass messages in which the required field has this value",
    ),
    Flag(
        "whitelist-json-field",
        "whitelist_json_fields",
        STRING_LIST,
        "for JSON messages: pass this field (may be given multiple times)",
        None,
    ),
    _PRODUCER_OPT,
    _REJECTS,
)

_AnyFlagSet = FlagSet[ArchiveOptions] | FlagSet[AggregateOptions] | FlagSet[RepublishOptions]
_FLAGSETS: Final[dict[str, _AnyFlagSet]] = {
    "archive": FlagSet(f"{PROGRAM} archive", _COMMON + _ARCHIVE_FLAGS, ArchiveOptions),
    "aggregate": FlagSet(f"{PROGRAM} aggregate", _COMMON + _AGGREGATE_FLAGS, AggregateOptions),
    "republish": FlagSet(f"{PROGRAM} republish", _COMMON + _REPUBLISH_FLAGS, RepublishOptions),
}

_JOB_HELP: Final = {
    "archive": "write the topic to Parquet, partitioned by topic, date and hour (nsq_to_file)",
    "aggregate": "count JSON events per key and event-time window (Parquet and/or a topic)",
    "republish": "copy the topic to a topic, optionally JSON-filtered (nsq_to_nsq)",
}


def usage(job: str | None = None) -> str:
    """The ``--help`` text of one job (its flags only), or of the program."""
    if job is not None:
        return _FLAGSETS[job].usage()
    lines = [f"Usage: {PROGRAM} <job> [flags]", "", "Jobs:"]
    lines += [f"  {j:<10} {_JOB_HELP[j]}" for j in JOBS]
    lines += ["", f"'{PROGRAM} <job> --help' lists a job's flags; '{PROGRAM} --version' prints the version."]
    return "\n".join(lines) + "\n"


def is_job(word: str) -> bool:
    return word in _FLAGSETS


def parse_args(argv: Sequence[str]) -> JobOptions:
    """``[job] [flags]`` → the job's options (no validation). Raises HelpRequested or
    OptionsError.

    ``--version`` alone (or after a job) gives ``version=True``; ``--help``/``-h`` alone
    raises HelpRequested with the program's usage, after a job with the job's flags.
    """
    args = list(argv)
    if not args:
        raise OptionsError(f"a job is required: {', '.join(JOBS)}")
    first = args[0]
    if first in ("-h", "-help", "--help", "-h=true", "--help=true"):
        raise HelpRequested(usage())
    if first in ("-version", "--version", "-version=true", "--version=true"):
        return ArchiveOptions(version=True)
    flagset = _FLAGSETS.get(first)
    if flagset is None:
        if first.startswith("-"):
            raise OptionsError(f"a job must come first: {PROGRAM} <job> [flags] ({', '.join(JOBS)})")
        raise OptionsError(f"unknown job {first!r} (jobs: {', '.join(JOBS)})")
    opts, rest = flagset.parse_known(args[1:])
    if rest:
        raise OptionsError(f"unexpected argument: {rest[0]}")
    opts.finish_parse()
    return opts


def _is_uri(path: str) -> bool:
    return "://" in path or path.startswith("file:")


def _local_abs(path: str) -> str:
    return path if _is_uri(path) else os.path.abspath(path)


def _path_part(name: str) -> str:
    return name.replace("#", "_")


def validate(opts: JobOptions) -> None:
    """Check a parsed command line and fill the derived defaults (directories, destination).

    Messages follow nsq_to_nsq's where they exist. Raises OptionsError.
    """
    if not opts.topic or not opts.channel:
        raise OptionsError("--topic and --channel are required")
    if not is_valid_topic_name(opts.topic):
        raise OptionsError("--topic is invalid")
    if not is_valid_channel_name(opts.channel):
        raise OptionsError("--channel is invalid")
    if not opts.nsqd_tcp_addresses and not opts.lookupd_http_addresses:
        raise OptionsError("--nsqd-tcp-address or --lookupd-http-address required")
    if opts.nsqd_tcp_addresses and opts.lookupd_http_addresses:
        raise OptionsError("use --nsqd-tcp-address or --lookupd-http-address not both")
    if opts.max_in_flight < 1:
        raise OptionsError("--max-in-flight must be > 0")
    if opts.max_records_per_batch < 0:
        raise OptionsError("--max-records-per-batch must be >= 0")
    if opts.msg_timeout < 0 or opts.trigger_interval < 0:
        raise OptionsError("--msg-timeout and --trigger-interval must be >= 0")
    for kv in opts.spark_conf:
        if "=" not in kv or not kv.split("=", 1)[0].strip():
            raise OptionsError(f"--spark-conf wants key=value, got {kv!r}")
    if opts.available_now and "trigger_interval" in opts.explicit:
        raise OptionsError("use --available-now or --trigger-interval not both")
    try:
        from_go_options(opts.consumer_opts, consumer=True)
        if isinstance(opts, _Publishing):
            from_go_options(opts.producer_opts, consumer=False)
    except ValueError as exc:
        raise OptionsError(str(exc)) from None
    opts.validate_job()

    if not opts.checkpoint_dir:
        opts.checkpoint_dir = os.path.join(
            "nsq_spark-checkpoint", opts.job, _path_part(opts.topic), _path_part(opts.channel)
        )
    opts.checkpoint_dir = _local_abs(opts.checkpoint_dir)
    if not opts.spool_dir:
        if _is_uri(opts.checkpoint_dir):
            raise OptionsError("--spool-dir required (a local directory) when --checkpoint-dir is a URI")
        opts.spool_dir = os.path.join(opts.checkpoint_dir, "spool")
    if _is_uri(opts.spool_dir) and not opts.spool_dir.startswith("file:"):
        raise OptionsError("--spool-dir must be a local directory")
    opts.spool_dir = os.path.abspath(opts.spool_dir.removeprefix("file://").removeprefix("file:"))
    if isinstance(opts, _Publishing):
        if not opts.reject_dir:
            opts.reject_dir = opts.checkpoint_dir.rstrip("/") + "/rejects"
        opts.reject_dir = _local_abs(opts.reject_dir)
    if isinstance(opts, ArchiveOptions | AggregateOptions) and opts.output_dir:
        opts.output_dir = _local_abs(opts.output_dir)


def uses_json(opts: RepublishOptions) -> bool:
    """Whether republish parses bodies (Go: --require-json-field or --whitelist-json-field)."""
    return bool(opts.require_json_field or opts.whitelist_json_fields)


def source_options(opts: CommonOptions) -> dict[str, str]:
    """Options of ``spark.readStream.format("nsq")`` for this command line: the
    ``--consumer-opt`` items mapped to the source's names (:mod:`nsqpy.spark.connopts`);
    ``--max-in-flight`` and ``--msg-timeout`` win over their go-nsq twins when given."""
    out = from_go_options(opts.consumer_opts, consumer=True)
    out.update(topic=opts.topic, channel=opts.channel, spoolPath=opts.spool_dir)
    if "max_in_flight" in opts.explicit or "maxInFlight" not in out:
        out["maxInFlight"] = str(opts.max_in_flight)
    if opts.lookupd_http_addresses:
        out["nsqlookupdHttpAddresses"] = ",".join(opts.lookupd_http_addresses)
    if opts.nsqd_tcp_addresses:
        out["nsqdTcpAddresses"] = ",".join(opts.nsqd_tcp_addresses)
    if opts.max_records_per_batch:
        out["maxRecordsPerBatch"] = str(opts.max_records_per_batch)
    if opts.msg_timeout:
        out["msgTimeoutMs"] = str(round(opts.msg_timeout * 1000))
    return out


def sink_options(opts: AggregateOptions | RepublishOptions) -> dict[str, str]:
    """Options of ``df.write.format("nsq")`` for the destination: ``--destination-topic``,
    ``--destination-nsqd-tcp-address`` and the ``--producer-opt`` items."""
    out = from_go_options(opts.producer_opts, consumer=False)
    out.update(topic=opts.destination_topic, nsqdTcpAddresses=",".join(opts.destination_nsqd_tcp_addresses))
    return out
