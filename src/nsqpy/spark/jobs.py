"""``nsq_spark``: the classic NSQ consumers as Spark Structured Streaming jobs.

``nsq_spark archive|aggregate|republish [flags]`` reads a topic through the ``nsq`` source
and

* ``archive`` writes it to Parquet under ``DIR/topic=<t>/date=<YYYY-MM-DD>/hour=<HH>/``
  (nsq_to_file on Spark);
* ``aggregate`` counts JSON events per group-by key and event-time tumbling window and writes
  the closed windows to Parquet and/or republishes them as JSON lines;
* ``republish`` copies the topic to another topic, optionally filtered and projected by
  nsq_to_nsq's JSON flags (nsq_to_nsq on Spark).

Flags are Go style (:mod:`nsqpy.goflags`) and follow NSQ's tools (``--topic``,
``--lookupd-http-address``…). :func:`parse_args`/:func:`validate` are pure; the
transformations (:func:`archive_frame`, :func:`aggregate_frames`, :func:`republish_frame`)
work on batch and streaming DataFrames of the source schema and use Spark SQL functions only
(no Python UDFs). File outputs are committed per micro-batch under deterministic names, so a
re-run batch replaces its own files (exactly-once files); NSQ outputs are at-least-once.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

from nsqpy import daemon
from nsqpy.goflags import (
    BOOL,
    DURATION,
    INT,
    STRING,
    STRING_LIST,
    Flag,
    FlagSet,
    HelpRequested,
    Kind,
    OptionsError,
    format_duration,
)
from nsqpy.goflags import flag_nocfg as _f
from nsqpy.protocol.names import is_valid_channel_name, is_valid_topic_name
from nsqpy.spark.connopts import from_go_options
from nsqpy.tools.jsonfilter import HTML_ESCAPES, go_json_string, require_number, whitelist_keys

__all__ = [
    "AGGREGATE_RESERVED",
    "JOBS",
    "JobOptions",
    "aggregate_frames",
    "archive_frame",
    "main",
    "parse_args",
    "republish_frame",
    "usage",
    "validate",
]

log = logging.getLogger("nsq_spark")

PROGRAM: Final = "nsq_spark"
JOBS: Final = ("archive", "aggregate", "republish")

#: Output column names of ``aggregate`` that a group-by field may not take.
AGGREGATE_RESERVED: Final = frozenset({"window_start", "window_end", "count"})

SOURCE_COLUMNS: Final = ("id", "timestamp", "attempts", "body", "topic", "channel", "nsqd_address")

#: Epoch numbers below this (in absolute value) are seconds, from it on milliseconds
#: (1e11 s is the year 5138; 1e11 ms is 1973-03-03).
EPOCH_MILLIS_FROM: Final = 1e11
#: Epoch milliseconds from this on are rejected (the year 5138).
EPOCH_MILLIS_UNTIL: Final = 1e14

# --------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------

#: A repeatable flag whose values are kept whole (``--spark-conf k=a,b`` keeps the comma).
STRING_REPEAT: Final = Kind("strrepeat", "value", lambda s, cur: [*cur, s], repeatable=True)


@dataclass(slots=True)
class JobOptions:
    """Every ``nsq_spark`` setting; durations are float seconds (0: unset where noted)."""

    job: str = ""
    version: bool = False
    # source
    topic: str = ""
    channel: str = "nsq_spark"
    lookupd_http_addresses: list[str] = field(default_factory=list)
    nsqd_tcp_addresses: list[str] = field(default_factory=list)
    # nsqd's max RDY. Unlike Go's tools (200), the source persists (fsync) every burst
    # before its FIN: the window is the most a chunk can hold, so it bounds throughput
    max_in_flight: int = 2500
    max_records_per_batch: int = 0  # 0: the source's default
    msg_timeout: float = 0.0  # 0: nsqd's default
    # state and running
    checkpoint_dir: str = ""  # "": nsq_spark-checkpoint/<job>/<topic>/<channel> in the cwd
    spool_dir: str = ""  # "": <checkpoint-dir>/spool
    reject_dir: str = ""  # "": <checkpoint-dir>/rejects
    master: str = "local[*]"
    spark_conf: list[str] = field(default_factory=list)
    available_now: bool = False
    trigger_interval: float = 0.0  # 0: the next micro-batch as soon as one ends
    # archive, aggregate
    output_dir: str = ""
    # aggregate
    group_by: list[str] = field(default_factory=list)
    window: float = 60.0
    watermark: float = 0.0  # unless given: the window
    time_field: str = ""  # "": the message timestamp
    #: go-nsq options as ``name,value`` (``--consumer-opt``), mapped onto the source's
    consumer_opts: list[str] = field(default_factory=list)
    # aggregate, republish
    destination_topic: str = ""
    destination_nsqd_tcp_addresses: list[str] = field(default_factory=list)
    #: go-nsq options as ``name,value`` (``--producer-opt``), mapped onto the sink's
    producer_opts: list[str] = field(default_factory=list)
    # republish
    require_json_field: str = ""
    require_json_value: str = ""
    whitelist_json_fields: list[str] = field(default_factory=list)
    #: Field names set by a flag.
    explicit: set[str] = field(default_factory=set, repr=False, compare=False)


_COMMON: Final[tuple[Flag, ...]] = (
    _f("version", BOOL, "print the version and exit"),
    _f("topic", STRING, "nsq topic to read (required)"),
    _f("channel", STRING, "nsq channel to read"),
    Flag("lookupd-http-address", "lookupd_http_addresses", STRING_LIST,
         "lookupd HTTP address (may be given multiple times)", None),
    Flag("nsqd-tcp-address", "nsqd_tcp_addresses", STRING_LIST,
         "nsqd TCP address (may be given multiple times)", None),
    _f("max-in-flight", INT, "max number of messages to allow in flight (spread over the nsqd connections)"),
    _f("max-records-per-batch", INT, "max messages per micro-batch (0: the source's default)"),
    _f("msg-timeout", DURATION, "message timeout asked of nsqd (0: nsqd's default)"),
    _f("checkpoint-dir", STRING,
       "Spark checkpoint directory (default ./nsq_spark-checkpoint/<job>/<topic>/<channel>); "
       "keep it across runs"),
    _f("spool-dir", STRING,
       "local directory for the source's message spool (default <checkpoint-dir>/spool); "
       "keep it with the checkpoint"),
    _f("master", STRING, "Spark master URL"),
    Flag("spark-conf", "spark_conf", STRING_REPEAT,
         "Spark setting as key=value (may be given multiple times)", None),
    _f("available-now", BOOL, "bounded run: process what the topic holds now, then exit"),
    _f("trigger-interval", DURATION,
       "time between micro-batch starts in streaming mode (0: back to back)"),
    Flag("consumer-opt", "consumer_opts", STRING_REPEAT,
         "option to passthrough to the nsq source as name,value, with go-nsq's option names "
         "(tls_v1, tls_root_ca_file, tls_cert, tls_key, tls_insecure_skip_verify, "
         "tls_min_version, snappy, deflate, deflate_level, auth_secret, sample_rate, "
         "heartbeat_interval, output_buffer_size, output_buffer_timeout, user_agent, "
         "dial_timeout, max_in_flight, msg_timeout, lookupd_poll_interval; "
         "may be given multiple times)", None),
)

_REJECTS: Final = _f(
    "reject-dir", STRING,
    "where malformed messages go as Parquet (source columns + error; "
    "default <checkpoint-dir>/rejects)",
)
_DEST_ADDR: Final = Flag(
    "destination-nsqd-tcp-address", "destination_nsqd_tcp_addresses", STRING_LIST,
    "destination nsqd TCP address (may be given multiple times)", None,
)
_PRODUCER_OPT: Final = Flag(
    "producer-opt", "producer_opts", STRING_REPEAT,
    "option to passthrough to the nsq sink as name,value, with go-nsq's option names "
    "(as --consumer-opt, less the consumer-only ones; may be given multiple times)", None,
)

_JOB_FLAGS: Final[dict[str, tuple[Flag, ...]]] = {
    "archive": (
        _f("output-dir", STRING, "Parquet output directory (required)"),
    ),
    "aggregate": (
        Flag("group-by", "group_by", STRING_LIST,
             "top-level JSON fields to count by (comma separated or repeated)", None),
        _f("window", DURATION, "tumbling event-time window"),
        _f("watermark", DURATION, "how late an event may be (default: --window)"),
        _f("time-field", STRING,
           "JSON field holding the event time: an RFC 3339 string or epoch seconds or "
           "milliseconds (default: the message timestamp)"),
        _f("output-dir", STRING, "Parquet output directory for closed windows"),
        _f("destination-topic", STRING, "topic to publish closed windows to, one JSON line each"),
        _DEST_ADDR,
        _PRODUCER_OPT,
        _REJECTS,
    ),
    "republish": (
        _f("destination-topic", STRING, "destination nsq topic (default: --topic)"),
        _DEST_ADDR,
        _f("require-json-field", STRING, "for JSON messages: only pass messages that contain this field"),
        _f("require-json-value", STRING,
           "for JSON messages: only pass messages in which the required field has this value"),
        Flag("whitelist-json-field", "whitelist_json_fields", STRING_LIST,
             "for JSON messages: pass this field (may be given multiple times)", None),
        _PRODUCER_OPT,
        _REJECTS,
    ),
}

_FLAGSETS: Final[dict[str, FlagSet[JobOptions]]] = {
    job: FlagSet(f"{PROGRAM} {job}", _COMMON + extra, JobOptions) for job, extra in _JOB_FLAGS.items()
}

_JOB_HELP: Final = {
    "archive": "write the topic to Parquet, partitioned by topic, date and hour (nsq_to_file)",
    "aggregate": "count JSON events per key and event-time window (Parquet and/or a topic)",
    "republish": "copy the topic to a topic, optionally JSON-filtered (nsq_to_nsq)",
}


def usage(job: str | None = None) -> str:
    """The ``--help`` text of one job, or of the program."""
    if job is not None:
        return _FLAGSETS[job].usage()
    lines = [f"Usage: {PROGRAM} <job> [flags]", "", "Jobs:"]
    lines += [f"  {j:<10} {_JOB_HELP[j]}" for j in JOBS]
    lines += ["", f"'{PROGRAM} <job> --help' lists a job's flags; '{PROGRAM} --version' prints the version."]
    return "\n".join(lines) + "\n"


def _leftover(flagset: FlagSet[JobOptions], argv: Sequence[str]) -> list[str]:
    """The words after the flags (Go's ``flag.Args()``), which FlagSet.parse stops at."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if len(word) < 2 or word[0] != "-":
            return list(argv[i:])
        if word == "--":
            return list(argv[i + 1 :])
        name = word.lstrip("-")
        i += 1
        if "=" in name:
            continue
        spec = flagset.by_name.get(name)
        if spec is not None and not spec.kind.boolean:
            i += 1
    return []


def parse_args(argv: Sequence[str]) -> JobOptions:
    """``[job] [flags]`` → options (no validation). Raises HelpRequested or OptionsError.

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
        return JobOptions(version=True)
    if first not in _FLAGSETS:
        if first.startswith("-"):
            raise OptionsError(f"a job must come first: {PROGRAM} <job> [flags] ({', '.join(JOBS)})")
        raise OptionsError(f"unknown job {first!r} (jobs: {', '.join(JOBS)})")
    flagset = _FLAGSETS[first]
    opts = flagset.parse(args[1:])
    opts.job = first
    rest = _leftover(flagset, args[1:])
    if rest:
        raise OptionsError(f"unexpected argument: {rest[0]}")
    for attr in ("lookupd_http_addresses", "nsqd_tcp_addresses", "destination_nsqd_tcp_addresses",
                 "whitelist_json_fields", "group_by"):
        setattr(opts, attr, [s.strip() for s in getattr(opts, attr) if s.strip()])
    if "watermark" not in opts.explicit:
        opts.watermark = opts.window
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
        from_go_options(opts.producer_opts, consumer=False)
    except ValueError as exc:
        raise OptionsError(str(exc)) from None

    job = opts.job
    if job == "archive":
        if not opts.output_dir:
            raise OptionsError("--output-dir required")
    elif job == "aggregate":
        if opts.window <= 0:
            raise OptionsError("--window must be > 0")
        if opts.watermark < 0:
            raise OptionsError("--watermark must be >= 0")
        seen: set[str] = set()
        for name in opts.group_by:
            if name in AGGREGATE_RESERVED:
                raise OptionsError(f"--group-by field {name!r} clashes with an output column")
            if name in seen:
                raise OptionsError(f"--group-by field {name!r} given twice")
            seen.add(name)
        if opts.destination_topic and not opts.destination_nsqd_tcp_addresses:
            raise OptionsError("--destination-nsqd-tcp-address required")
        if opts.destination_nsqd_tcp_addresses and not opts.destination_topic:
            raise OptionsError("--destination-topic required")
        if opts.destination_topic and not is_valid_topic_name(opts.destination_topic):
            raise OptionsError("--destination-topic is invalid")
        if not opts.output_dir and not opts.destination_topic:
            raise OptionsError("--output-dir or --destination-topic required")
    elif job == "republish":
        if not opts.destination_topic:
            opts.destination_topic = opts.topic
        if not is_valid_topic_name(opts.destination_topic):
            raise OptionsError("--destination-topic is invalid")
        if not opts.destination_nsqd_tcp_addresses:
            raise OptionsError("--destination-nsqd-tcp-address required")
        if opts.destination_topic == opts.topic and (
            set(opts.destination_nsqd_tcp_addresses) & set(opts.nsqd_tcp_addresses)
        ):
            raise OptionsError(
                "--destination-topic and --destination-nsqd-tcp-address are the source: "
                "the job would republish into the topic it reads"
            )
    else:  # pragma: no cover - parse_args only makes known jobs
        raise OptionsError(f"unknown job {job!r}")

    if not opts.checkpoint_dir:
        opts.checkpoint_dir = os.path.join(
            "nsq_spark-checkpoint", job, _path_part(opts.topic), _path_part(opts.channel)
        )
    opts.checkpoint_dir = _local_abs(opts.checkpoint_dir)
    if not opts.spool_dir:
        if _is_uri(opts.checkpoint_dir):
            raise OptionsError("--spool-dir required (a local directory) when --checkpoint-dir is a URI")
        opts.spool_dir = os.path.join(opts.checkpoint_dir, "spool")
    if _is_uri(opts.spool_dir) and not opts.spool_dir.startswith("file:"):
        raise OptionsError("--spool-dir must be a local directory")
    opts.spool_dir = os.path.abspath(opts.spool_dir.removeprefix("file://").removeprefix("file:"))
    if job != "archive" and not opts.reject_dir:
        opts.reject_dir = opts.checkpoint_dir.rstrip("/") + "/rejects"
    if opts.reject_dir:
        opts.reject_dir = _local_abs(opts.reject_dir)
    if opts.output_dir:
        opts.output_dir = _local_abs(opts.output_dir)


def uses_json(opts: JobOptions) -> bool:
    """Whether republish parses bodies (Go: --require-json-field or --whitelist-json-field)."""
    return bool(opts.require_json_field or opts.whitelist_json_fields)


# --------------------------------------------------------------------------------------------
# Transformations (batch or streaming DataFrames in the source schema)
# --------------------------------------------------------------------------------------------

ERR_INVALID_JSON: Final = "invalid JSON"
ERR_NOT_OBJECT: Final = "json is not an object"  # Go's filterMessage error
#: Observed metric (``events``: valid events entering the aggregation) of the aggregate query.
EVENTS_METRIC: Final = "nsq_spark_events"


def _F() -> Any:
    from pyspark.sql import functions

    return functions


def _json_object(body: Any) -> Any:
    """``map<string,variant>`` of a JSON object body; NULL for invalid JSON or a non-object.

    Like Go's ``json.Decoder`` (simplejson), only the first JSON value counts.
    """
    F = _F()
    return F.from_json(body.cast("string"), "map<string,variant>")


def _json_error(body: Any) -> Any:
    """Why ``_json_object`` is NULL: invalid JSON or a JSON value that is not an object."""
    F = _F()
    return F.when(F.get_json_object(body.cast("string"), "$").isNull(), F.lit(ERR_INVALID_JSON)).otherwise(
        F.lit(ERR_NOT_OBJECT)
    )


def _barrier(df: Any) -> Any:
    """``df`` unchanged, behind an optimizer barrier (a one-element ``inline_outer``): filters
    on the parsed JSON stay above it instead of being pushed below the projection, which
    would parse every body again once per reference (FilterExec has no subexpression
    elimination)."""
    F = _F()
    return df.select(F.inline_outer(F.array(F.struct(*[F.col(c) for c in df.columns]))))


def _col(name: str) -> Any:
    """A column by its exact name (dots, spaces and backticks are not syntax)."""
    return _F().col("`" + name.replace("`", "``") + "`")


def _variant_type(v: Any) -> Any:
    return _F().schema_of_variant(v)


def _is_number(vtype: Any) -> Any:
    return vtype.isin("TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE") | vtype.startswith("DECIMAL")


def _as_string(v: Any) -> Any:
    """A JSON value as a string: strings as they are, other values as JSON text, null → NULL."""
    return _F().try_variant_get(v, "$", "string")


def _event_time(v: Any) -> Any:
    """Event time of a JSON value: an RFC 3339 / ISO 8601 string (no offset: UTC), or an epoch
    number: seconds below 1e11, milliseconds from 1e11 to 1e14. Anything else → NULL."""
    F = _F()
    vtype = _variant_type(v)
    num = F.try_variant_get(v, "$", "double")
    text = F.upper(F.try_variant_get(v, "$", "string"))
    return (
        F.when(vtype == "STRING", F.try_to_timestamp(text))
        .when(
            _is_number(vtype) & (F.abs(num) < EPOCH_MILLIS_FROM),
            F.timestamp_micros(F.round(num * 1_000_000).cast("bigint")),
        )
        .when(
            _is_number(vtype) & (F.abs(num) < EPOCH_MILLIS_UNTIL),
            F.timestamp_micros(F.round(num * 1_000).cast("bigint")),
        )
    )


#: Parquet writer settings of the archive: no dictionary for the columns whose values are all
#: different (the writer would build one per row group only to fall back to plain), no
#: min/max statistics for the message bodies (nothing prunes on them).
ARCHIVE_PARQUET: Final[dict[str, str]] = {
    "parquet.enable.dictionary#id": "false",
    "parquet.enable.dictionary#timestamp": "false",
    "parquet.enable.dictionary#body": "false",
    "parquet.column.statistics.enabled#body": "false",
}


def archive_frame(df: Any) -> Any:
    """The source columns plus ``date`` (YYYY-MM-DD) and ``hour`` (HH) of the message
    timestamp in the session time zone (the jobs set UTC)."""
    F = _F()
    # date → string and a padded hour() are several times cheaper per row than date_format
    return df.select(
        *SOURCE_COLUMNS,
        F.to_date("timestamp").cast("string").alias("date"),
        F.lpad(F.hour("timestamp").cast("string"), 2, "0").alias("hour"),
    )


def _interval(seconds: float) -> str:
    return f"{round(seconds * 1_000_000)} microseconds"


def aggregate_frames(
    df: Any,
    group_by: Sequence[str],
    window: float,
    watermark: float,
    time_field: str = "",
    observe: bool = False,
) -> tuple[Any, Any]:
    """(counts, rejects) of a source DataFrame.

    counts: ``window_start, window_end, <group_by...> (strings), count`` per event-time
    tumbling window of ``window`` seconds, with a watermark of ``watermark`` seconds (a no-op
    on batch frames); ``observe`` counts the valid events as metric EVENTS_METRIC.
    rejects: the source columns and ``error`` for bodies that are not JSON objects or lack a
    usable ``time_field``.
    """
    F = _F()
    m = F.col("__m")
    if time_field:
        etime = _event_time(m[time_field])
        time_error = F.lit(f"missing or invalid time field {json.dumps(time_field)}")
    else:
        etime = F.col("timestamp")
        time_error = F.lit(None).cast("string")
    keys = [f"__g{i}" for i in range(len(group_by))]
    # parse once; what the branches filter on goes behind a barrier, without the big map
    parsed = df.select(*SOURCE_COLUMNS, _json_object(F.col("body")).alias("__m")).select(
        *SOURCE_COLUMNS,
        etime.alias("__t"),
        m.isNull().alias("__bad"),
        *[_as_string(m[name]).alias(key) for key, name in zip(keys, group_by, strict=True)],
    )
    error = F.when(F.col("__bad"), _json_error(F.col("body"))).when(F.col("__t").isNull(), time_error)

    skip = (F.col("__bad") | F.col("__t").isNull()).alias("__x")
    events = _barrier(parsed.select(F.col("__t"), skip, *keys))
    events = events.where(~F.col("__x")).drop("__x")
    if observe:
        events = events.observe(EVENTS_METRIC, F.count(F.lit(1)).alias("events"))
    counts = (
        events.withWatermark("__t", _interval(watermark))
        .groupBy(F.window("__t", _interval(window)).alias("__w"), *keys)
        .count()
        .select(
            F.col("__w.start").alias("window_start"),
            F.col("__w.end").alias("window_end"),
            *[F.col(key).alias(name) for key, name in zip(keys, group_by, strict=True)],
            F.col("count"),
        )
    )
    rejects = _barrier(parsed.select(*SOURCE_COLUMNS, error.alias("error")))
    rejects = rejects.where(F.col("error").isNotNull())
    return counts, rejects


def aggregate_json_lines(counts: Any) -> Any:
    """One JSON object per count row (keys as the columns; timestamps RFC 3339 UTC), as
    ``body`` BINARY for the nsq sink."""
    F = _F()
    line = F.to_json(F.struct(*[_col(c) for c in counts.columns]), {"ignoreNullFields": "false"})
    return counts.select(line.cast("binary").alias("body"))


def _go_json_escape(text: Any) -> Any:
    """Go's encoding/json HTML-safe escapes on JSON text (these characters only occur in
    strings, so replacing them everywhere is safe)."""
    F = _F()
    for ch, esc in HTML_ESCAPES:
        text = F.replace(text, F.lit(ch), F.lit(esc))
    return text


OUTCOME_PASS: Final = "pass"
OUTCOME_FILTERED: Final = "filtered"
OUTCOME_REJECT: Final = "reject"


def republish_frame(
    df: Any,
    require_json_field: str = "",
    require_json_value: str = "",
    whitelist_json_fields: Sequence[str] = (),
) -> Any:
    """The source columns plus ``out_body`` (what to publish), ``outcome`` (pass, filtered,
    reject) and ``error`` (why rejected), with nsq_to_nsq's JSON semantics:

    * no JSON flags: every body passes unchanged;
    * bodies that are not JSON objects are rejected (Go drops invalid JSON and requeues
      non-objects when whitelisting);
    * ``require_json_field``: the field must exist; with ``require_json_value`` a string
      value must equal it, a number must equal it as float64 when it parses as one (Go's
      ``strconv.ParseFloat``); other values never match. Messages that fail are filtered;
    * ``whitelist_json_fields``: the body becomes a compact JSON object of the listed
      top-level fields that exist, keys sorted (Go's ``json.Marshal`` of a map), otherwise
      the original bytes are kept.
    """
    F = _F()
    if not (require_json_field or whitelist_json_fields):
        return df.select(
            *SOURCE_COLUMNS,
            F.col("body").alias("out_body"),
            F.lit(OUTCOME_PASS).alias("outcome"),
            F.lit(None).cast("string").alias("error"),
        )
    m = F.col("__m")
    passes = F.lit(True)
    if require_json_field:
        value = m[require_json_field]
        passes = F.map_contains_key(m, F.lit(require_json_field))
        if require_json_value:
            vtype = _variant_type(value)
            as_text = F.try_variant_get(value, "$", "string")
            match = (vtype == "STRING") & (as_text == F.lit(require_json_value))
            number = require_number(require_json_value)
            if number is not None and not math.isnan(number):
                match = match | (
                    _is_number(vtype) & (F.try_variant_get(value, "$", "double") == F.lit(number))
                )
            passes = passes & F.coalesce(match, F.lit(False))
    if whitelist_json_fields:
        keys = whitelist_keys(whitelist_json_fields)
        parts = [
            F.when(
                F.map_contains_key(m, F.lit(k)),
                F.concat(F.lit(go_json_string(k) + ":"), _go_json_escape(F.to_json(m[k]))),
            )
            for k in keys
        ]
        out_body = F.concat(F.lit("{"), F.concat_ws(",", *parts), F.lit("}")).cast("binary")
    else:
        out_body = F.col("body")
    parsed = df.select(*SOURCE_COLUMNS, _json_object(F.col("body")).alias("__m"))
    return parsed.select(
        *SOURCE_COLUMNS,
        F.when(m.isNotNull() & passes, out_body).alias("out_body"),
        F.when(m.isNull(), F.lit(OUTCOME_REJECT))
        .when(passes, F.lit(OUTCOME_PASS))
        .otherwise(F.lit(OUTCOME_FILTERED))
        .alias("outcome"),
        F.when(m.isNull(), _json_error(F.col("body"))).alias("error"),
    )


# --------------------------------------------------------------------------------------------
# Files: per-batch commit under deterministic names (Hadoop FileSystem, any scheme)
# --------------------------------------------------------------------------------------------


_TASK_SUFFIX: Final = re.compile(r"c\d+")


class BatchFiles:
    """Writes one micro-batch's Parquet files under a directory so that a re-run of the same
    batch replaces them: the batch is written to ``DIR/_tmp/...`` (``_`` paths are hidden from
    Spark and pyarrow readers), its earlier files are deleted, and the new ones are renamed to
    ``part-<run>-<batch>-<n>.<ext>`` in place."""

    def __init__(self, spark: Any, run_id: str) -> None:
        self.spark = spark
        self.run_id = run_id
        self._jvm = spark.sparkContext._jvm
        # resolved once: py4j resolves a dotted JVM name one failed class lookup per
        # package level (each scanning the whole class path), milliseconds per use
        self._Path = self._jvm.org.apache.hadoop.fs.Path
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()

    def _path(self, path: str) -> Any:
        return self._Path(path)

    def _fs(self, path: Any) -> Any:
        return path.getFileSystem(self._conf)

    def prefix(self, batch_id: int) -> str:
        return f"part-{self.run_id}-{batch_id:010d}-"

    def write(
        self,
        df: Any,
        directory: str,
        batch_id: int,
        partition_by: Sequence[str] = (),
        options: dict[str, str] | None = None,
    ) -> int:
        """Write ``df`` as this batch's files under ``directory`` (Parquet writer ``options``);
        returns the file count."""
        base = self._path(directory)
        fs = self._fs(base)
        tmp = self._path(f"{directory.rstrip('/')}/_tmp/{self.run_id}-{batch_id}")
        fs.delete(tmp, True)
        writer = df.write.mode("overwrite").options(**(options or {}))
        writer.partitionBy(*partition_by).parquet(tmp.toString())
        stars = "/".join("*" for _ in partition_by)
        pattern = f"{directory.rstrip('/')}/{stars + '/' if stars else ''}{self.prefix(batch_id)}*"
        for old in fs.globStatus(self._path(pattern)) or []:
            fs.delete(old.getPath(), False)
        tmp_str = fs.makeQualified(tmp).toString().rstrip("/")
        moved = 0
        for src in self._files_under(fs, tmp):
            name = src.getName()
            if name.startswith(("_", ".")):
                continue
            rel_dir = src.getParent().toString()[len(tmp_str) :].lstrip("/")
            dest_dir = self._path(f"{directory.rstrip('/')}/{rel_dir}" if rel_dir else directory)
            fs.mkdirs(dest_dir)
            ext = ".".join(p for p in name.split(".")[1:] if not _TASK_SUFFIX.fullmatch(p)) or "parquet"
            dest = self._path(f"{dest_dir.toString()}/{self.prefix(batch_id)}{moved:05d}.{ext}")
            if not fs.rename(src, dest):
                raise OSError(f"cannot move {src.toString()} to {dest.toString()}")
            moved += 1
        fs.delete(tmp, True)
        if not fs.listStatus(tmp.getParent()):
            fs.delete(tmp.getParent(), False)
        return moved

    @staticmethod
    def _files_under(fs: Any, path: Any) -> list[Any]:
        """Paths of the files below ``path``. (Not ``listFiles``: its located statuses load
        each file's permissions, which the local file system does by running ``ls -ld``.)"""
        files: list[Any] = []
        todo = [path]
        while todo:
            for status in fs.listStatus(todo.pop()):
                (todo if status.isDirectory() else files).append(status.getPath())
        return files

    def read_text(self, path: str) -> str | None:
        p = self._path(path)
        fs = self._fs(p)
        if not fs.exists(p):
            return None
        stream = fs.open(p)
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write_text(self, path: str, text: str) -> None:
        p = self._path(path)
        fs = self._fs(p)
        fs.mkdirs(p.getParent())
        out = fs.create(p, True)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()


def checkpoint_identity(opts: JobOptions) -> dict[str, Any]:
    """What a checkpoint directory is for; a different job, topic, channel or aggregation
    cannot resume from it."""
    ident: dict[str, Any] = {"job": opts.job, "topic": opts.topic, "channel": opts.channel}
    if opts.job == "aggregate":
        ident.update(group_by=list(opts.group_by), window=format_duration(opts.window),
                     time_field=opts.time_field)
    return ident


def claim_checkpoint(files: BatchFiles, opts: JobOptions) -> str:
    """Check or create ``<checkpoint-dir>/nsq_spark.json``; returns its run id (the file-name
    prefix that keeps batch ids of different checkpoints apart)."""
    path = f"{opts.checkpoint_dir.rstrip('/')}/nsq_spark.json"
    ident = checkpoint_identity(opts)
    text = files.read_text(path)
    if text is not None:
        saved = json.loads(text)
        mine = {k: saved.get(k) for k in ident}
        if mine != ident:
            raise OptionsError(
                f"--checkpoint-dir {opts.checkpoint_dir} belongs to another job: {json.dumps(mine)}"
                f" (this one is {json.dumps(ident)}); use another --checkpoint-dir"
            )
        return str(saved["run_id"])
    run_id = uuid.uuid4().hex[:8]
    files.write_text(path, json.dumps({**ident, "run_id": run_id}) + "\n")
    return run_id


# --------------------------------------------------------------------------------------------
# Running a job
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Totals:
    """Counts over the run, for the per-batch log and the summary line."""

    rows_in: int = 0
    rows_out: int = 0
    filtered: int = 0
    rejects: int = 0
    batches: int = 0
    late: int = 0
    #: aggregate: batch id → (valid events, late events) from the query progress
    progress: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: the running query (aggregate reads its progress)
    query: Any = None

    def absorb_progress(self) -> None:
        """Record the aggregate query's recent progress: valid events (observed metric) and
        events dropped as late, per batch id (``recentProgress`` holds the last 100)."""
        if self.query is None:
            return
        for progress in self.query.recentProgress or []:
            row = (progress.observedMetrics or {}).get(EVENTS_METRIC)
            events = int(row["events"]) if row is not None else 0
            late = sum(int(op.numRowsDroppedByWatermark or 0) for op in progress.stateOperators or [])
            self.progress[int(progress.batchId)] = (events, late)

    def finish_progress(self) -> None:
        """Add the events seen in the aggregate query's progress to ``rows_in``/``late``."""
        self.absorb_progress()
        self.rows_in += sum(v[0] for v in self.progress.values())
        self.late = sum(v[1] for v in self.progress.values())

    def summary(self, job: str) -> str:
        parts = [f"rows in {self.rows_in}", f"rows out {self.rows_out}"]
        if job == "republish":
            parts.append(f"filtered {self.filtered}")
        if job == "aggregate":
            parts.append(f"late {self.late}")
        parts += [f"rejects {self.rejects}", f"batches {self.batches}"]
        return f"{PROGRAM} {job}: " + ", ".join(parts)


def source_options(opts: JobOptions) -> dict[str, str]:
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


def sink_options(opts: JobOptions) -> dict[str, str]:
    """Options of ``df.write.format("nsq")`` for the destination: ``--destination-topic``,
    ``--destination-nsqd-tcp-address`` and the ``--producer-opt`` items."""
    out = from_go_options(opts.producer_opts, consumer=False)
    out.update(topic=opts.destination_topic,
               nsqdTcpAddresses=",".join(opts.destination_nsqd_tcp_addresses))
    return out


def _publish(df: Any, options: dict[str, str]) -> None:
    df.write.format("nsq").mode("append").options(**options).save()


def _counts_by(df: Any, column: str) -> dict[Any, int]:
    return {r[0]: r[1] for r in df.groupBy(column).count().collect()}


#: How a foreachBatch function reports that ``query.stop()`` interrupted it: Spark's
#: StreamExecution takes a Python error whose text matches ``py4j.protocol.Py4JJavaError: An
#: error occurred while calling(.*)java.lang.InterruptedException`` as a clean stop.
INTERRUPTED_BY_STOP: Final = (
    "py4j.protocol.Py4JJavaError: An error occurred while calling z:java.lang.Thread.sleep.\n"
    ": java.lang.InterruptedException: the query was stopped"
)


class StoppedByInterrupt(Exception):
    """A micro-batch that did not run because the query was being stopped."""


class BatchGate:
    """Stops a query between micro-batches rather than in the middle of one.

    ``query.stop()`` during a foreachBatch cancels the batch's Spark jobs: error logs, py4j
    tracebacks, and (Spark 4) a StackOverflowError in the regular expression Spark uses to
    recognise the interruption in a long traceback. So :meth:`close` lets the batch being
    processed finish (its output committed, its rows counted) and a batch that starts after
    it does no work: it waits, inside the JVM, for ``query.stop()``'s interrupt and raises
    the resulting InterruptedException through py4j, which Spark takes as a clean stop
    (SPARK-39218): that batch is not committed and runs again when the job next starts.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self.closed = False
        #: batches that came to the closed gate (and were not run)
        self.turned_away = 0
        #: the running query's JVM object (set once it has started)
        self.jquery: Any = None

    def wrap(self, spark: Any, process: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        """``process`` (a foreachBatch function) behind the gate."""

        def gated(batch: Any, batch_id: int) -> None:
            with self._cond:
                run = self._busy = not self.closed
                self.turned_away += not run
            if not run:
                log.info("batch %d not run: the query is stopping", batch_id)
                self._await_stop(spark)  # raises
            try:
                process(batch, batch_id)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

        return gated

    def _await_stop(self, spark: Any) -> NoReturn:
        from py4j.protocol import Py4JJavaError

        Thread = spark.sparkContext._jvm.java.lang.Thread
        try:
            # py4j runs these calls on the query's thread (pinned threads): the sleep ends
            # with an InterruptedException once query.stop() has interrupted that thread
            while self.jquery is None or self.jquery.isActive():
                Thread.sleep(100)
            Thread.currentThread().interrupt()  # stopping, but the interrupt was consumed
            Thread.sleep(1)
        except Py4JJavaError as exc:
            if "java.lang.InterruptedException" not in str(exc):
                raise
            # short: Spark matches its pattern over the whole traceback text, and long texts
            # overflow the stack of the query's thread
            raise StoppedByInterrupt(INTERRUPTED_BY_STOP) from None
        # never return normally: Spark would commit the batch without its output
        raise RuntimeError(f"{PROGRAM}: a batch was not run: the query is stopping")

    def close(self) -> None:
        """Let no further batch run."""
        with self._cond:
            self.closed = True

    def wait_idle(self, timeout: float) -> bool:
        """Whether no batch is being processed, waiting up to ``timeout`` s for that."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._busy, timeout)

    @staticmethod
    def filter(record: logging.LogRecord) -> bool:
        """A logging filter for py4j's callback server: drops its report of the expected
        interruption (``_await_stop``)."""
        return not (record.exc_info and isinstance(record.exc_info[1], StoppedByInterrupt))


def build_query(
    spark: Any, opts: JobOptions, source: Any, totals: Totals, files: BatchFiles,
    gate: BatchGate | None = None,
) -> Any:
    """The streaming writer (not started) of ``opts.job`` over the ``source`` DataFrame;
    with a ``gate``, its batches run behind it."""
    F = _F()
    job = opts.job
    lock = threading.Lock()

    def log_batch(batch_id: int, rows_in: int | None, rows_out: int, filtered: int, rejects: int) -> None:
        with lock:
            totals.batches += 1
            totals.rows_in += rows_in or 0
            totals.rows_out += rows_out
            totals.filtered += filtered
            totals.rejects += rejects
        if rows_in or rows_out or rejects:
            msg = f"batch {batch_id}: " + (f"{rows_in} in, " if rows_in is not None else "")
            msg += f"{rows_out} out"
            if job == "republish":
                msg += f", {filtered} filtered"
            msg += f", {rejects} rejected"
            if rejects:
                msg += f" (to {opts.reject_dir})"
            log.info("%s", msg)

    process: Callable[[Any, int], None]
    if job == "archive":
        frame = archive_frame(source)

        def process(batch: Any, batch_id: int) -> None:
            # one pass over the batch: the rows are counted while they are written
            from pyspark.sql import Observation

            seen = Observation(f"archive-{batch_id}")
            counted = batch.observe(seen, F.count(F.lit(1)).alias("rows"))
            files.write(counted, opts.output_dir, batch_id, ("topic", "date", "hour"), ARCHIVE_PARQUET)
            n = int(seen.get["rows"])
            log_batch(batch_id, n, n, 0, 0)

    elif job == "republish":
        frame = republish_frame(
            source, opts.require_json_field, opts.require_json_value, opts.whitelist_json_fields
        )
        json_mode = uses_json(opts)

        def process(batch: Any, batch_id: int) -> None:
            batch.persist()
            try:
                counts = _counts_by(batch, "outcome") if json_mode else {OUTCOME_PASS: batch.count()}
                rejects = counts.get(OUTCOME_REJECT, 0)
                if rejects:
                    bad = batch.where(F.col("outcome") == OUTCOME_REJECT).select(*SOURCE_COLUMNS, "error")
                    files.write(bad.coalesce(1), opts.reject_dir, batch_id)
                passed = counts.get(OUTCOME_PASS, 0)
                if passed:
                    out = batch.where(F.col("outcome") == OUTCOME_PASS).select(
                        F.col("out_body").alias("body")
                    )
                    _publish(out, sink_options(opts))
                log_batch(batch_id, sum(counts.values()), passed, counts.get(OUTCOME_FILTERED, 0), rejects)
            finally:
                batch.unpersist()

    else:  # aggregate
        counts, rejects = aggregate_frames(
            source, opts.group_by, opts.window, opts.watermark, opts.time_field, observe=True
        )
        # one stream of (result, reject) rows: both outputs in one query over one checkpoint
        result = F.struct(*[_col(c) for c in counts.columns])
        reject = F.struct(*[_col(c) for c in rejects.columns])
        result_type = counts.select(result).schema[0].dataType
        reject_type = rejects.select(reject).schema[0].dataType
        frame = counts.select(result.alias("result"), F.lit(None).cast(reject_type).alias("reject"))
        frame = frame.unionByName(
            rejects.select(F.lit(None).cast(result_type).alias("result"), reject.alias("reject"))
        )

        def process(batch: Any, batch_id: int) -> None:
            batch.persist()
            try:
                kinds = _counts_by(batch.select(F.col("result").isNull().alias("is_reject")), "is_reject")
                n_results, n_rejects = kinds.get(False, 0), kinds.get(True, 0)
                if n_rejects:
                    bad = batch.where(F.col("result").isNull()).select("reject.*")
                    files.write(bad.coalesce(1), opts.reject_dir, batch_id)
                if n_results:
                    results = batch.where(F.col("result").isNotNull()).select("result.*").coalesce(1)
                    if opts.output_dir:
                        files.write(results, opts.output_dir, batch_id)
                    if opts.destination_topic:
                        _publish(aggregate_json_lines(results), sink_options(opts))
                log_batch(batch_id, None, n_results, 0, n_rejects)
                with lock:
                    totals.rows_in += n_rejects
                    totals.absorb_progress()
            finally:
                batch.unpersist()

    writer = (
        frame.writeStream.queryName(f"nsq_spark_{job}_{opts.topic}".replace("#", "_").replace(".", "_"))
        .outputMode("append")
        .option("checkpointLocation", opts.checkpoint_dir)
        .foreachBatch(gate.wrap(spark, process) if gate is not None else process)
    )
    if opts.available_now:
        writer = writer.trigger(availableNow=True)
    elif opts.trigger_interval > 0:
        writer = writer.trigger(processingTime=f"{round(opts.trigger_interval * 1000)} milliseconds")
    return writer


#: Spark configuration the jobs' session starts with (``--spark-conf`` overrides it).
SESSION_CONF: Final[dict[str, str]] = {
    # AQE does not apply to streaming plans (Spark warns)
    "spark.sql.adaptive.enabled": "false",
}


class _Stop:
    """SIGTERM/SIGINT: ask the running query to stop (exit 0) once its running batch has
    finished; a second signal stops it at once."""

    def __init__(self) -> None:
        self.requested = False
        #: signals received; a second one stops the query without waiting for its batch
        self.count = 0

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.requested = True
        self.count += 1


def run(opts: JobOptions, stop: _Stop | None = None) -> int:
    """Run a validated job to the end (``--available-now``) or until SIGTERM/SIGINT. Prints
    the summary line (stdout) when the query ended well, else only the cause (stderr), as
    the last line of the run: after the JVM has exited, so nothing of Spark's follows it.
    Returns the exit code."""
    stop = stop or _Stop()
    stop.install()
    from nsqpy.spark.session import make_session, stop_jvm

    conf = dict(SESSION_CONF)  # the user's --spark-conf wins
    conf.update(tuple(kv.split("=", 1)) for kv in opts.spark_conf)  # type: ignore[misc]
    totals = Totals()
    failure: str | None = None
    try:
        # the JVM runs in a session of its own: a signal to this process's group (timeout,
        # kill -- -PGID, Ctrl-C) reaches this process only, which stops the query cleanly
        try:
            spark = make_session(opts.master, f"{PROGRAM} {opts.job} {opts.topic}", conf)
        except KeyboardInterrupt:  # SIGINT while the SparkContext's own handler was in place
            spark, stop.requested = None, True
        if spark is not None:
            try:
                stop.install()  # again: the SparkContext installs its own SIGINT handler
                failure = _run_stream(spark, opts, stop, totals)
            finally:
                try:
                    spark.stop()
                except Exception as exc:  # the JVM is gone (what failed the query, if any)
                    log.warning("stopping Spark: %s", _short_error(exc))
    finally:
        stop_jvm()
    if failure is not None:
        print(f"{PROGRAM}: {failure}", file=sys.stderr, flush=True)
        return 1
    print(totals.summary(opts.job), flush=True)
    return 0


def _run_query(spark: Any, opts: JobOptions, stop: _Stop, totals: Totals | None = None) -> int:
    """Run the job on an existing session: print the summary line, or the cause on stderr;
    returns the exit code."""
    totals = totals if totals is not None else Totals()
    failure = _run_stream(spark, opts, stop, totals)
    if failure is not None:
        print(f"{PROGRAM}: {failure}", file=sys.stderr, flush=True)
        return 1
    print(totals.summary(opts.job), flush=True)
    return 0


def _run_stream(spark: Any, opts: JobOptions, stop: _Stop, totals: Totals) -> str | None:
    """Run the query until it ends or ``stop`` is requested; fills ``totals``. Returns why
    the job failed (one line), None when it did not."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # archive partitions are UTC dates
    files = BatchFiles(spark, "")
    try:
        files.run_id = claim_checkpoint(files, opts)
    except OptionsError as exc:
        return str(exc)
    log.info("checkpoint %s, spool %s", opts.checkpoint_dir, opts.spool_dir)
    if stop.requested:
        return None
    source = spark.readStream.format("nsq").options(**source_options(opts)).load()
    gate = BatchGate()
    py4j_callbacks = logging.getLogger("py4j.clientserver")
    py4j_callbacks.addFilter(gate.filter)
    try:
        query = totals.query = build_query(spark, opts, source, totals, files, gate).start()
        gate.jquery = query._jsq
        return _await_query(query, opts, stop, totals, gate)
    finally:
        py4j_callbacks.removeFilter(gate.filter)


def _await_query(query: Any, opts: JobOptions, stop: _Stop, totals: Totals, gate: BatchGate) -> str | None:
    while True:
        if stop.requested:
            log.info("signal received: stopping the query after its running batch")
            gate.close()
            _await_stoppable(query, stop, gate)
            query.stop()
            break
        try:
            if query.awaitTermination(0.5):
                break
        except Exception as exc:  # StreamingQueryException and py4j errors
            if not stop.requested:
                return f"query failed: {_short_error(exc)}"
            break
    if opts.job == "aggregate":
        totals.finish_progress()
    return None


def _await_stoppable(query: Any, stop: _Stop, gate: BatchGate) -> None:
    """Wait (the gate closed) until the query can be stopped without interrupting Spark's
    own work (writing a batch's offsets or commit to the checkpoint: Hadoop logs the
    interruption with a stack trace, and the batch runs again). That is: its next batch
    waits at the gate, or no trigger is active and either the last one found no data or
    none has started for a while (a trigger interval). A second signal ends the wait."""
    idle_since: float | None = None
    while stop.count < 2 and query.isActive and not gate.turned_away:
        if not gate.wait_idle(0.05):
            continue
        status = query.status
        if status["isTriggerActive"]:
            idle_since = None
        elif not status["isDataAvailable"]:
            return
        else:  # between two triggers: stop unless the next one is starting (no interval)
            now = time.monotonic()
            idle_since = now if idle_since is None else idle_since
            if now - idle_since >= STOP_IDLE_S:
                return
        time.sleep(0.02)


#: How long no trigger must be active, after one that ran a batch, for the query to be
#: stopped between triggers (with no trigger interval, the next starts within milliseconds).
STOP_IDLE_S: Final = 0.2


#: ``SomeError: message`` at the start of a line, also after py4j's ``: `` (the Java exception
#: under "An error occurred while calling …") and Java's ``Caused by: ``.
_CAUSE_RE: Final = re.compile(
    r"^(?:: |Caused by: )?([A-Za-z_][\w.$]*(?:Error|Exception)): (.+)$", re.M
)
_WRAPPERS: Final = ("PythonException", "Py4JException", "StreamingQueryException", "Py4JJavaError")


def _short_error(exc: BaseException) -> str:
    """One line for a failure: the innermost ``SomeError: message`` carried in the (Spark,
    py4j, Python worker) exception text, else its first line."""
    text = str(exc).strip()
    causes = [m for m in _CAUSE_RE.finditer(text) if not m[1].endswith(_WRAPPERS)]
    if causes:
        return f"{causes[-1][1].rsplit('.', 1)[-1]}: {causes[-1][2].strip()}"[:2000]
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:2000]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        opts = parse_args(args)
    except HelpRequested as h:
        print(h.usage, file=sys.stderr, end="")
        return 0
    except OptionsError as e:
        job = args[0] if args and args[0] in _FLAGSETS else None
        print(f"{e}\n{usage(job)}", file=sys.stderr, end="")
        return 2
    if opts.version:
        print(daemon.version_string(PROGRAM))
        return 0
    try:
        validate(opts)
    except OptionsError as e:
        print(f"{PROGRAM}: {e}", file=sys.stderr)
        return 1
    daemon.setup_logging(f"[{PROGRAM}] ", "info")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        return run(opts)
    except Exception as exc:  # session start, source options…: one clear line, exit 1
        print(f"{PROGRAM}: {_short_error(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
