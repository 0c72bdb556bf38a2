"""The jobs' transformations: DataFrames in the ``nsq`` source schema in, the job's rows out.

They work on batch and streaming DataFrames alike and use Spark SQL functions only (no
Python UDFs): :func:`archive_frame`, :func:`aggregate_frames` (+ :func:`aggregate_json_lines`)
and :func:`republish_frame`, with nsq_to_nsq's JSON semantics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from nsqpy.spark import SOURCE_COLUMNS
from nsqpy.tools.jsonfilter import HTML_ESCAPES, go_json_string, require_number, whitelist_keys

__all__ = [
    "ARCHIVE_PARQUET",
    "EVENTS_METRIC",
    "OUTCOME_FILTERED",
    "OUTCOME_PASS",
    "OUTCOME_REJECT",
    "aggregate_frames",
    "aggregate_json_lines",
    "archive_frame",
    "col",
    "republish_frame",
]

#: Epoch numbers below this (in absolute value) are seconds, from it on milliseconds
#: (1e11 s is the year 5138; 1e11 ms is 1973-03-03).
EPOCH_MILLIS_FROM: Final = 1e11
#: Epoch milliseconds from this on are rejected (the year 5138).
EPOCH_MILLIS_UNTIL: Final = 1e14

ERR_INVALID_JSON: Final = "invalid JSON"
ERR_NOT_OBJECT: Final = "json is not an object"  # Go's filterMessage error
#: Observed metric (``events``: valid events entering the aggregation) of the aggregate query.
EVENTS_METRIC: Final = "nsq_spark_events"


def _json_object(body: Column) -> Column:
    """``map<string,variant>`` of a JSON object body; NULL for invalid JSON or a non-object.

    Like Go's ``json.Decoder`` (simplejson), only the first JSON value counts.
    """
    return F.from_json(body.cast("string"), "map<string,variant>")


def _json_error(body: Column) -> Column:
    """Why ``_json_object`` is NULL: invalid JSON or a JSON value that is not an object."""
    return F.when(F.get_json_object(body.cast("string"), "$").isNull(), F.lit(ERR_INVALID_JSON)).otherwise(
        F.lit(ERR_NOT_OBJECT)
    )


def _barrier(df: DataFrame) -> DataFrame:
    """``df`` unchanged, behind an optimizer barrier (a one-element ``inline_outer``): filters
    on the parsed JSON stay above it instead of being pushed below the projection, which
    would parse every body again once per reference (FilterExec has no subexpression
    elimination)."""
    return df.select(F.inline_outer(F.array(F.struct(*[F.col(c) for c in df.columns]))))


def col(name: str) -> Column:
    """A column by its exact name (dots, spaces and backticks are not syntax)."""
    return F.col("`" + name.replace("`", "``") + "`")


def _variant_type(v: Column) -> Column:
    return F.schema_of_variant(v)


def _is_number(vtype: Column) -> Column:
    return vtype.isin("TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE") | vtype.startswith("DECIMAL")


def _as_string(v: Column) -> Column:
    """A JSON value as a string: strings as they are, other values as JSON text, null → NULL."""
    return F.try_variant_get(v, "$", "string")


def _event_time(v: Column) -> Column:
    """Event time of a JSON value: an RFC 3339 / ISO 8601 string (no offset: UTC), or an epoch
    number: seconds below 1e11, milliseconds from 1e11 to 1e14. Anything else → NULL."""
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


def archive_frame(df: DataFrame) -> DataFrame:
    """The source columns plus ``date`` (YYYY-MM-DD) and ``hour`` (HH) of the message
    timestamp in the session time zone (the jobs set UTC)."""
    # date → string and a padded hour() are several times cheaper per row than date_format
    return df.select(
        *SOURCE_COLUMNS,
        F.to_date("timestamp").cast("string").alias("date"),
        F.lpad(F.hour("timestamp").cast("string"), 2, "0").alias("hour"),
    )


def _interval(seconds: float) -> str:
    return f"{round(seconds * 1_000_000)} microseconds"


def aggregate_frames(
    df: DataFrame,
    group_by: Sequence[str],
    window: float,
    watermark: float,
    time_field: str = "",
    observe: bool = False,
) -> tuple[DataFrame, DataFrame]:
    """(counts, rejects) of a source DataFrame.

    counts: ``window_start, window_end, <group_by...> (strings), count`` per event-time
    tumbling window of ``window`` seconds, with a watermark of ``watermark`` seconds (a no-op
    on batch frames); ``observe`` counts the valid events as metric EVENTS_METRIC.
    rejects: the source columns and ``error`` for bodies that are not JSON objects or lack a
    usable ``time_field``.
    """
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


def aggregate_json_lines(counts: DataFrame) -> DataFrame:
    """One JSON object per count row (keys as the columns; timestamps RFC 3339 UTC), as
    ``body`` BINARY for the nsq sink."""
    line = F.to_json(F.struct(*[col(c) for c in counts.columns]), {"ignoreNullFields": "false"})
    return counts.select(line.cast("binary").alias("body"))


def _go_json_escape(text: Column) -> Column:
    """Go's encoding/json HTML-safe escapes on JSON text (these characters only occur in
    strings, so replacing them everywhere is safe)."""
    for ch, esc in HTML_ESCAPES:
        text = F.replace(text, F.lit(ch), F.lit(esc))
    return text


OUTCOME_PASS: Final = "pass"
OUTCOME_FILTERED: Final = "filtered"
OUTCOME_REJECT: Final = "reject"


def republish_frame(
    df: DataFrame,
    require_json_field: str = "",
    require_json_value: str = "",
    whitelist_json_fields: Sequence[str] = (),
) -> DataFrame:
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
