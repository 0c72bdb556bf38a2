"""``nsq_spark`` jobs: flag parsing (no Spark), the transformations on DataFrames built with
createDataFrame (the shared session), per-batch file commits, and end to end with the real
console script against a real nsqd (few runs: each pays a JVM start)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from nsqpy.goflags import HelpRequested, OptionsError
from nsqpy.spark import SOURCE_COLUMNS, jobs
from nsqpy.spark.jobs import output, runner, transforms
from nsqpy.spark.jobs.options import (
    JobOptions,
    parse_args,
    sink_options,
    source_options,
    uses_json,
    validate,
)

UTC = dt.UTC
SCHEMA = (
    "id STRING, timestamp TIMESTAMP, attempts INT, body BINARY, topic STRING, "
    "channel STRING, nsqd_address STRING"
)
BASE = dt.datetime(2024, 1, 2, 3, 0, 0, tzinfo=UTC)
BATCH_LINE = re.compile(r"INFO: batch \d+: (\d+) in, ")


def parsed(*argv: str) -> JobOptions:
    opts = parse_args(list(argv))
    validate(opts)
    return opts


# --------------------------------------------------------------------------------------------
# Flags (pure)
# --------------------------------------------------------------------------------------------

SRC = ("--topic=t", "--nsqd-tcp-address=127.0.0.1:4150")


def test_source_schema_matches_the_format() -> None:
    from nsqpy.spark import SOURCE_SCHEMA
    from nsqpy.spark.spool import ARROW_SCHEMA

    assert SCHEMA == SOURCE_SCHEMA
    assert tuple(f.split()[0] for f in SOURCE_SCHEMA.split(", ")) == SOURCE_COLUMNS
    assert tuple(ARROW_SCHEMA.names) == SOURCE_COLUMNS


def test_go_style_flags_and_defaults(tmp_path: Path) -> None:
    opts = parsed(
        "aggregate",
        "-topic",
        "events",
        "--lookupd-http-address=h1:4161",
        "-lookupd-http-address",
        "h2:4161,h3:4161",
        "--group-by=user,page",
        "--group-by",
        "country",
        "--window=5m",
        "--output-dir",
        str(tmp_path / "out"),
        "-available-now",
        "--spark-conf=spark.a=1,2",
        "--spark-conf",
        "spark.b=x",
    )
    assert opts.job == "aggregate"
    assert opts.lookupd_http_addresses == ["h1:4161", "h2:4161", "h3:4161"]
    assert opts.group_by == ["user", "page", "country"]
    assert opts.window == 300.0 and opts.watermark == 300.0  # watermark defaults to the window
    assert opts.available_now and opts.channel == "nsq_spark" and opts.max_in_flight == 2500
    assert opts.spark_conf == ["spark.a=1,2", "spark.b=x"]
    cwd = os.getcwd()
    ck = os.path.join(cwd, "nsq_spark-checkpoint", "aggregate", "events", "nsq_spark")
    assert opts.checkpoint_dir == ck
    assert opts.spool_dir == os.path.join(opts.checkpoint_dir, "spool")
    assert opts.reject_dir == opts.checkpoint_dir + "/rejects"
    assert opts.output_dir == str(tmp_path / "out")

    w = parsed("aggregate", *SRC, "--window=1m", "--watermark=0s", "--output-dir=o")
    assert (w.window, w.watermark) == (60.0, 0.0)


def test_republish_defaults_like_nsq_to_nsq() -> None:
    opts = parsed(
        "republish",
        *SRC,
        "--destination-nsqd-tcp-address=10.0.0.1:4150",
        "--whitelist-json-field=a",
        "--whitelist-json-field=b",
        "--checkpoint-dir=/x/ck",
    )
    assert opts.destination_topic == "t"
    assert opts.whitelist_json_fields == ["a", "b"]
    assert (opts.checkpoint_dir, opts.spool_dir, opts.reject_dir) == ("/x/ck", "/x/ck/spool", "/x/ck/rejects")
    assert uses_json(opts)
    assert not uses_json(
        parsed(
            "republish",
            *SRC,
            "--destination-nsqd-tcp-address=a:1",
            "--destination-topic=u",
            "--require-json-value=x",
        )
    )


def test_source_options() -> None:
    opts = parsed(
        "archive",
        "--topic=t",
        "--channel=c#ephemeral",
        "--nsqd-tcp-address=a:1,b:2",
        "--output-dir=/o",
        "--max-records-per-batch=500",
        "--msg-timeout=2m",
        "--spool-dir=/s",
        "--checkpoint-dir=/ck",
    )
    assert source_options(opts) == {
        "topic": "t",
        "channel": "c#ephemeral",
        "spoolPath": "/s",
        "maxInFlight": "2500",
        "nsqdTcpAddresses": "a:1,b:2",
        "maxRecordsPerBatch": "500",
        "msgTimeoutMs": "120000",
    }
    default = parsed(
        "archive", "--topic=t", "--channel=c#ephemeral", "--lookupd-http-address=l:1", "--output-dir=/o"
    )
    assert default.checkpoint_dir.endswith("/nsq_spark-checkpoint/archive/t/c_ephemeral")
    assert source_options(default)["nsqlookupdHttpAddresses"] == "l:1"


def test_consumer_and_producer_opts_map_go_nsq_names(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked until the TLS context is built\n")
    opts = parsed(
        "republish",
        *SRC,
        "--destination-nsqd-tcp-address=d:1",
        "--destination-topic=u",
        "--consumer-opt=tls_v1,true",
        "--consumer-opt=auth_secret,s,e=cret",
        "--consumer-opt=snappy",
        "--consumer-opt=max_in_flight,100",
        "--consumer-opt=msg_timeout,30s",
        "--msg-timeout=1m",
        "--producer-opt",
        "deflate,true",
        "--producer-opt=user_agent,me/1",
    )
    src = source_options(opts)
    assert {k: src[k] for k in ("tls", "authSecret", "snappy", "maxInFlight", "msgTimeoutMs")} == {
        "tls": "true",
        "authSecret": "s,e=cret",
        "snappy": "true",
        "maxInFlight": "100",  # --max-in-flight not given: the go-nsq option applies
        "msgTimeoutMs": "60000",  # --msg-timeout given: it wins
    }
    assert sink_options(opts) == {
        "topic": "u",
        "nsqdTcpAddresses": "d:1",
        "deflate": "true",
        "userAgent": "me/1",
    }
    flag_wins = parsed(
        "archive", *SRC, "--output-dir=o", "--max-in-flight=7", "--consumer-opt=max_in_flight,100"
    )
    assert source_options(flag_wins)["maxInFlight"] == "7"
    for argv, message in [
        (
            ["--consumer-opt=max_attempts,3"],
            "--consumer-opt 'max_attempts': not an option nsq_spark supports",
        ),
        (["--consumer-opt=tls_v1,yes"], "--consumer-opt tls_v1: invalid value 'yes'"),
        (
            ["--consumer-opt=snappy", "--consumer-opt=deflate"],
            "--consumer-opt: snappy and deflate cannot both be true",
        ),
        (
            ["--consumer-opt=tls_v1", f"--consumer-opt=tls_root_ca_file,{tmp_path / 'none.pem'}"],
            "--consumer-opt: tls_root_ca_file: no such file",
        ),
        (["--consumer-opt=tls_v1", f"--consumer-opt=tls_root_ca_file,{ca}"], "the TLS options do not load"),
    ]:
        with pytest.raises(OptionsError, match=message):
            parsed("archive", *SRC, "--output-dir=o", *argv)
    with pytest.raises(OptionsError, match="--producer-opt 'sample_rate': applies to consumers only"):
        parsed(
            "republish",
            *SRC,
            "--destination-nsqd-tcp-address=d:1",
            "--destination-topic=u",
            "--producer-opt=sample_rate,5",
        )
    with pytest.raises(OptionsError, match="flag provided but not defined: -producer-opt"):
        parse_args(["archive", *SRC, "--producer-opt=snappy"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "a job is required"),
        (["--topic=t"], "a job must come first"),
        (["archiv"], "unknown job 'archiv'"),
        (["archive", "--nope"], "flag provided but not defined: -nope"),
        (["archive", "--window=1m"], "flag provided but not defined: -window"),
        (["archive", "--max-in-flight=x"], 'invalid value "x" for flag -max-in-flight: parse error'),
        (["aggregate", "--window=5"], 'invalid value "5" for flag -window: parse error'),
        (["archive", "--topic"], "flag needs an argument: -topic"),
        (["archive", "--topic=t", "extra"], "unexpected argument: extra"),
        (["archive", "--available-now", "true", "--topic=t"], "unexpected argument: true"),
    ],
)
def test_parse_errors(argv: list[str], message: str) -> None:
    with pytest.raises(OptionsError) as exc:
        parse_args(argv)
    assert message in str(exc.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["archive", "--output-dir=o"], "--topic and --channel are required"),
        (["archive", "--topic=a b", "--nsqd-tcp-address=x:1", "--output-dir=o"], "--topic is invalid"),
        (["archive", *SRC, "--channel=", "--output-dir=o"], "--topic and --channel are required"),
        (["archive", *SRC, "--channel=c!", "--output-dir=o"], "--channel is invalid"),
        (["archive", "--topic=t", "--output-dir=o"], "--nsqd-tcp-address or --lookupd-http-address required"),
        (
            ["archive", *SRC, "--lookupd-http-address=l:1", "--output-dir=o"],
            "use --nsqd-tcp-address or --lookupd-http-address not both",
        ),
        (["archive", *SRC], "--output-dir required"),
        (["archive", *SRC, "--output-dir=o", "--max-in-flight=0"], "--max-in-flight must be > 0"),
        (
            ["archive", *SRC, "--output-dir=o", "--available-now", "--trigger-interval=5s"],
            "use --available-now or --trigger-interval not both",
        ),
        (["archive", *SRC, "--output-dir=o", "--spark-conf=novalue"], "--spark-conf wants key=value"),
        (["archive", *SRC, "--output-dir=o", "--checkpoint-dir=hdfs://nn/ck"], "--spool-dir required"),
        (
            ["archive", *SRC, "--output-dir=o", "--spool-dir=s3a://b/s"],
            "--spool-dir must be a local directory",
        ),
        (["aggregate", *SRC], "--output-dir or --destination-topic required"),
        (["aggregate", *SRC, "--output-dir=o", "--window=0s"], "--window must be > 0"),
        (["aggregate", *SRC, "--output-dir=o", "--watermark=-1s"], "--watermark must be >= 0"),
        (["aggregate", *SRC, "--output-dir=o", "--group-by=a,count"], "clashes with an output column"),
        (["aggregate", *SRC, "--output-dir=o", "--group-by=a", "--group-by=a"], "given twice"),
        (["aggregate", *SRC, "--destination-topic=d"], "--destination-nsqd-tcp-address required"),
        (["aggregate", *SRC, "--destination-nsqd-tcp-address=d:1"], "--destination-topic required"),
        (
            ["aggregate", *SRC, "--destination-topic=d!", "--destination-nsqd-tcp-address=d:1"],
            "--destination-topic is invalid",
        ),
        (["republish", *SRC], "--destination-nsqd-tcp-address required"),
        (
            ["republish", *SRC, "--destination-topic=x y", "--destination-nsqd-tcp-address=d:1"],
            "--destination-topic is invalid",
        ),
        (
            ["republish", *SRC, "--destination-nsqd-tcp-address=127.0.0.1:4150"],
            "would republish into the topic it reads",
        ),
    ],
)
def test_validation_errors(argv: list[str], message: str) -> None:
    opts = parse_args(argv)
    with pytest.raises(OptionsError) as exc:
        validate(opts)
    assert message in str(exc.value)


def test_log_level_flag() -> None:
    base = ("archive", "--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--output-dir=o")
    assert parsed(*base).log_level == "info"
    assert parsed(*base, "--log-level=debug").log_level == "debug"
    with pytest.raises(OptionsError):
        parse_args([*base, "--log-level=loud"])


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(HelpRequested) as h:
        parse_args(["--help"])
    assert "archive" in h.value.usage and "aggregate" in h.value.usage and "republish" in h.value.usage
    with pytest.raises(HelpRequested) as h:
        parse_args(["republish", "-h"])
    assert "-whitelist-json-field value" in h.value.usage and "-group-by" not in h.value.usage
    assert parse_args(["--version"]).version and parse_args(["archive", "--version"]).version

    assert jobs.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("nsq_spark v1.3.0 (nsqpy ")
    assert jobs.main(["aggregate", "--help"]) == 0
    assert "-time-field string" in capsys.readouterr().err
    assert jobs.main(["archive", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flag provided but not defined: -bogus\nUsage of nsq_spark archive:")
    assert jobs.main(["archive", "--topic=t", "--output-dir=o"]) == 1
    assert capsys.readouterr().err == "nsq_spark: --nsqd-tcp-address or --lookupd-http-address required\n"


def _flags_in(usage: str) -> set[str]:
    return {line.split()[0].lstrip("-") for line in usage.splitlines() if line.startswith("  -")}


def test_each_jobs_help_lists_its_own_flags_only() -> None:
    common = {
        "version",
        "log-level",
        "topic",
        "channel",
        "lookupd-http-address",
        "nsqd-tcp-address",
        "max-in-flight",
        "max-records-per-batch",
        "msg-timeout",
        "checkpoint-dir",
        "spool-dir",
        "master",
        "spark-conf",
        "available-now",
        "trigger-interval",
        "consumer-opt",
    }
    publishing = {"destination-topic", "destination-nsqd-tcp-address", "producer-opt", "reject-dir"}
    own = {
        "archive": {"output-dir"},
        "aggregate": {"group-by", "window", "watermark", "time-field", "output-dir", *publishing},
        "republish": {"require-json-field", "require-json-value", "whitelist-json-field", *publishing},
    }
    for job, flags in own.items():
        with pytest.raises(HelpRequested) as h:
            parse_args([job, "--help"])
        assert _flags_in(h.value.usage) == common | flags, job
        opts = parse_args([job, "--topic=t"])
        assert opts.job == job and type(opts).__name__ == job.capitalize() + "Options"
    # "--" ends the flags; what follows is an argument, which no job takes
    with pytest.raises(OptionsError, match="unexpected argument: --topic=u"):
        parse_args(["archive", "--topic=t", "--", "--topic=u"])
    assert parse_args(["archive", "--topic=t", "--"]).topic == "t"


def test_query_failure_is_one_line() -> None:
    text = (
        "[STREAM_FAILED] Query [id = 0e] terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR]"
        " Return Message: Traceback (most recent call last):\n"
        "pyspark.errors.exceptions.captured.PythonException: An exception was thrown from the worker:\n"
        'Traceback (most recent call last):\n  File "sink.py", line 187, in _retry\n'
        "ConnectionError: nsq sink: publishing to ['127.0.0.1:1'] failed: [Errno 111] Connection refused\n"
        "\t... 34 more"
    )
    assert runner.short_error(RuntimeError(text)) == (
        "ConnectionError: nsq sink: publishing to ['127.0.0.1:1'] failed: [Errno 111] Connection refused"
    )
    assert runner.short_error(RuntimeError("plain failure\nmore")) == "plain failure"


def test_query_failure_names_the_java_cause() -> None:
    # a JVM error under a foreachBatch: py4j puts the Java exception after ": "
    text = (
        "[STREAM_FAILED] Query [id = 98] terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR]"
        " An error occurred in the user provided function in foreach batch sink. Reason: An exception"
        " was raised by the Python Proxy. Return Message: Traceback (most recent call last):\n"
        '  File "readwriter.py", line 2099, in parquet\n    self._jwrite.parquet(path)\n'
        "py4j.protocol.Py4JJavaError: An error occurred while calling o67.parquet.\n"
        ": org.apache.hadoop.fs.ParentNotDirectoryException: Parent path is not a directory: file:/o/f\n"
        "\tat org.apache.hadoop.fs.RawLocalFileSystem.mkOneDirWithMode(RawLocalFileSystem.java:812)\n"
        "Caused by: py4j.Py4JException: An exception was raised by the Python Proxy.\n"
        " SQLSTATE: 39000 SQLSTATE: XXKST\n=== Streaming Query ===\n"
    )
    assert runner.short_error(RuntimeError(text)) == (
        "ParentNotDirectoryException: Parent path is not a directory: file:/o/f"
    )


# --------------------------------------------------------------------------------------------
# Transformations on createDataFrame inputs
# --------------------------------------------------------------------------------------------


def frame(spark, bodies: list[bytes], start: dt.datetime = BASE, step: float = 1.0):
    rows = [
        (f"{i:016x}", start + dt.timedelta(seconds=step * i), 1, b, "t", "c", "127.0.0.1:4150")
        for i, b in enumerate(bodies)
    ]
    return spark.createDataFrame(rows, SCHEMA)


def utc(*args: int) -> dt.datetime:
    """A UTC time as PySpark returns TIMESTAMP values: naive, in the local time zone."""
    return dt.datetime(*args, tzinfo=UTC).astimezone().replace(tzinfo=None)


@pytest.fixture(scope="module")
def utc_spark(spark):
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return spark


def j(obj: object) -> bytes:
    return json.dumps(obj).encode()


def test_aggregate_counts_per_window_and_key(utc_spark) -> None:
    bodies = [
        j({"user": "a", "page": "x", "ts": "2024-01-02T03:00:10Z"}),
        j({"user": "a", "page": "x", "ts": "2024-01-02T03:00:50+00:00"}),
        j({"user": "a", "ts": "2024-01-02t03:00:59.999z"}),  # page missing: null
        j({"user": "b", "page": "x", "ts": 1704164470}),  # epoch seconds: 03:01:10
        j({"user": "b", "page": "x", "ts": 1704164475000}),  # epoch millis: 03:01:15
        j({"user": "b", "page": "x", "ts": 1704164479.5}),  # fractional seconds
        j({"user": 1, "page": None, "ts": "2024-01-02T04:00:00+01:00"}),  # 03:00 UTC; 1 → "1"
        b"not json",
        b"[1, 2]",
        j({"user": "a"}),
        j({"user": "a", "ts": "yesterday"}),
        j({"user": "a", "ts": True}),
        j({"user": "a", "ts": "1704164470"}),  # a numeric string is not RFC 3339
    ]
    counts, rejects = transforms.aggregate_frames(
        frame(utc_spark, bodies), ["user", "page"], window=60.0, watermark=60.0, time_field="ts"
    )
    assert counts.columns == ["window_start", "window_end", "user", "page", "count"]
    got = sorted((tuple(r) for r in counts.collect()), key=str)
    assert got == sorted(
        [
            (utc(2024, 1, 2, 3, 0), utc(2024, 1, 2, 3, 1), "a", "x", 2),
            (utc(2024, 1, 2, 3, 0), utc(2024, 1, 2, 3, 1), "a", None, 1),
            (utc(2024, 1, 2, 3, 0), utc(2024, 1, 2, 3, 1), "1", None, 1),
            (utc(2024, 1, 2, 3, 1), utc(2024, 1, 2, 3, 2), "b", "x", 3),
        ],
        key=str,
    )
    assert rejects.columns == [*SOURCE_COLUMNS, "error"]
    rej = {r["body"]: r["error"] for r in rejects.collect()}
    bad_time = 'missing or invalid time field "ts"'
    assert rej == {
        b"not json": "invalid JSON",
        b"[1, 2]": "json is not an object",
        j({"user": "a"}): bad_time,
        j({"user": "a", "ts": "yesterday"}): bad_time,
        j({"user": "a", "ts": True}): bad_time,
        j({"user": "a", "ts": "1704164470"}): bad_time,
    }


def test_aggregate_by_message_timestamp_without_group_by(utc_spark) -> None:
    # 150 messages, one every 2 s from 03:00:00: 30 per minute over 5 minutes
    bodies = [b"{}" if i % 10 else b'{"deep": {"a": [1]}}' for i in range(150)]
    counts, rejects = transforms.aggregate_frames(frame(utc_spark, bodies, step=2.0), [], 60.0, 60.0)
    got = sorted((r["window_start"].minute, r["count"]) for r in counts.collect())
    assert got == [(0, 30), (1, 30), (2, 30), (3, 30), (4, 30)]
    assert rejects.count() == 0
    # group-by values: strings as is, other JSON values as their JSON text
    counts, _ = transforms.aggregate_frames(
        frame(utc_spark, [j({"k": {"b": 1, "a": [True, None]}}), j({"k": 1.5}), j({"k": False})]),
        ["k"],
        3600.0,
        0.0,
    )
    assert {r["k"] for r in counts.collect()} == {"1.5", '{"a":[true,null],"b":1}', "false"}


def test_aggregate_json_lines(utc_spark) -> None:
    counts, _ = transforms.aggregate_frames(
        frame(utc_spark, [j({"u": "a"}), j({"u": "a"}), j({"v": 1})]), ["u"], 60.0, 60.0
    )
    lines = [r["body"] for r in transforms.aggregate_json_lines(counts).collect()]
    assert sorted(lines) == [
        b'{"window_start":"2024-01-02T03:00:00.000Z","window_end":"2024-01-02T03:01:00.000Z",'
        b'"u":"a","count":2}',
        b'{"window_start":"2024-01-02T03:00:00.000Z","window_end":"2024-01-02T03:01:00.000Z",'
        b'"u":null,"count":1}',
    ]
    assert sorted((json.loads(b) for b in lines), key=lambda o: str(o["u"])) == [
        {
            "window_start": "2024-01-02T03:00:00.000Z",
            "window_end": "2024-01-02T03:01:00.000Z",
            "u": None,
            "count": 1,
        },
        {
            "window_start": "2024-01-02T03:00:00.000Z",
            "window_end": "2024-01-02T03:01:00.000Z",
            "u": "a",
            "count": 2,
        },
    ]


def test_aggregate_group_by_names_are_not_syntax(utc_spark, tmp_path: Path) -> None:
    counts, _ = transforms.aggregate_frames(
        frame(utc_spark, [j({"a.b": 1, "x y": "v", "q`": None})] * 2), ["a.b", "x y", "q`"], 60.0, 60.0
    )
    assert counts.columns == ["window_start", "window_end", "a.b", "x y", "q`", "count"]
    line = transforms.aggregate_json_lines(counts).collect()[0]["body"]
    assert json.loads(line) == {
        "window_start": "2024-01-02T03:00:00.000Z",
        "window_end": "2024-01-02T03:01:00.000Z",
        "a.b": "1",
        "x y": "v",
        "q`": None,
        "count": 2,
    }
    output.BatchFiles(utc_spark, "r").write(counts, str(tmp_path / "o"), 0)
    import pyarrow.dataset as ds

    back = ds.dataset(str(tmp_path / "o"), format="parquet").to_table()
    assert back.column_names == counts.columns and back.column("count").to_pylist() == [2]


def republish(spark, bodies: list[bytes], **flags):
    out = transforms.republish_frame(frame(spark, bodies), **flags).orderBy("id").collect()
    return [(r["outcome"], r["out_body"], r["error"]) for r in out]


def test_republish_passthrough_is_byte_exact(utc_spark) -> None:
    bodies = [b"\xff\x00\x01binary", b"not json", b'{ "a" :  1 }', "é<&>".encode()]
    assert republish(utc_spark, bodies) == [("pass", b, None) for b in bodies]
    # --require-json-value alone does nothing in Go either (the JSON path needs a field)
    assert republish(utc_spark, bodies, require_json_value="1") == [("pass", b, None) for b in bodies]


def test_republish_require_json_field(utc_spark) -> None:
    bodies = [b'{ "a" : null, "z": 1 }', b'{"b": 1}', b"[1]", b"nope", b'{"a": {"x": 1}}']
    assert republish(utc_spark, bodies, require_json_field="a") == [
        ("pass", bodies[0], None),  # the field exists (null counts); bytes unchanged
        ("filtered", None, None),
        ("reject", None, "json is not an object"),
        ("reject", None, "invalid JSON"),
        ("pass", bodies[4], None),
    ]


def test_republish_require_json_value_compares_like_go(utc_spark) -> None:
    bodies = [
        j({"a": "1"}),
        j({"a": 1}),
        b'{"a": 1.0}',
        b'{"a": 1e0}',
        j({"a": "1.0"}),
        j({"a": True}),
        j({"a": [1]}),
        j({"b": "1"}),
        j({"a": None}),
        b'{"a": 1.5}',
    ]
    got = [o for o, _, _ in republish(utc_spark, bodies, require_json_field="a", require_json_value="1")]
    assert got == [
        "pass",
        "pass",
        "pass",
        "pass",
        "filtered",
        "filtered",
        "filtered",
        "filtered",
        "filtered",
        "filtered",
    ]
    # a value that is not a number only matches strings
    bodies = [j({"a": "x"}), j({"a": "X"}), j({"a": ["x"]})]
    got = [o for o, _, _ in republish(utc_spark, bodies, require_json_field="a", require_json_value="x")]
    assert got == ["pass", "filtered", "filtered"]
    # "1.0" as the wanted value: the string "1.0" or any number equal to 1
    bodies = [j({"a": "1.0"}), j({"a": 1}), j({"a": "1"})]
    got = [o for o, _, _ in republish(utc_spark, bodies, require_json_field="a", require_json_value="1.0")]
    assert got == ["pass", "pass", "filtered"]


def test_republish_whitelist_is_gos_json_marshal(utc_spark) -> None:
    bodies = [
        '{"z": {"y": 1, "x": [1, "<&>"]}, "a": "é", "c": 3, "b": null}'.encode(),
        j({"c": 1}),
        b'"just a string"',
    ]
    got = republish(utc_spark, bodies, whitelist_json_fields=["z", "b", "a", "z", "missing"])
    assert got == [
        ("pass", '{"a":"é","b":null,"z":{"x":[1,"\\u003c\\u0026\\u003e"],"y":1}}'.encode(), None),
        ("pass", b"{}", None),
        ("reject", None, "json is not an object"),
    ]
    got = republish(
        utc_spark, [j({"k": "v", "n": 2}), j({"n": 2})], require_json_field="k", whitelist_json_fields=["n"]
    )
    assert got == [("pass", b'{"n":2}', None), ("filtered", None, None)]


def test_archive_frame_partitions_by_utc_date_and_hour(utc_spark) -> None:
    df = frame(utc_spark, [b"a", b"b"], start=dt.datetime(2024, 1, 2, 23, 59, 59, tzinfo=UTC))
    rows = transforms.archive_frame(df).collect()
    assert [(r["date"], r["hour"]) for r in rows] == [("2024-01-02", "23"), ("2024-01-03", "00")]
    # same strings as date_format(yyyy-MM-dd / HH) across the day and around leap days
    when = [dt.datetime(2024, 2, 29, h, 30, tzinfo=UTC) for h in (0, 9, 10, 23)]
    when += [dt.datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), dt.datetime(2100, 3, 1, tzinfo=UTC)]
    for t in when:
        (r,) = transforms.archive_frame(frame(utc_spark, [b"x"], start=t)).collect()
        assert (r["date"], r["hour"]) == (f"{t:%Y-%m-%d}", f"{t:%H}"), t
    assert transforms.archive_frame(df).columns == [*SOURCE_COLUMNS, "date", "hour"]


def test_batch_files_replace_their_own_batch(utc_spark, tmp_path: Path) -> None:
    files = output.BatchFiles(utc_spark, "run1")
    out = str(tmp_path / "out")
    df = transforms.archive_frame(frame(utc_spark, [b"a", b"b", b"c"], step=3600.0))
    assert files.write(df, out, 7, ("topic", "date", "hour")) >= 3
    files.write(df.limit(1), out, 7, ("topic", "date", "hour"))  # the batch re-runs: replaced
    files.write(df.where("body = X'63'"), out, 8, ("topic", "date", "hour"))
    names = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*.parquet"))
    assert all(Path(n).name.startswith(("part-run1-0000000007-", "part-run1-0000000008-")) for n in names)
    assert {n.split("/part-")[0] for n in names} == {
        "topic=t/date=2024-01-02/hour=03",
        "topic=t/date=2024-01-02/hour=05",
    }
    back = utc_spark.read.parquet(out)
    assert sorted(r["body"] for r in back.collect()) == [b"a", b"c"]
    assert not (tmp_path / "out" / "_tmp").exists()


def test_checkpoint_belongs_to_one_job(utc_spark, tmp_path: Path) -> None:
    files = output.BatchFiles(utc_spark, "")
    ck = str(tmp_path / "ck")
    a = parsed("aggregate", *SRC, "--output-dir=o", f"--checkpoint-dir={ck}", "--group-by=u")
    run_id = output.claim_checkpoint(files, a)
    assert len(run_id) == 8 and output.claim_checkpoint(files, a) == run_id
    b = parsed("aggregate", *SRC, "--output-dir=o", f"--checkpoint-dir={ck}", "--group-by=v")
    with pytest.raises(OptionsError, match="belongs to another job"):
        output.claim_checkpoint(files, b)


@pytest.mark.timeout(180)
def test_batch_gate_stops_the_query_between_batches(spark, tmp_path: Path, caplog) -> None:
    """A stop lets the running batch finish; a batch that starts after it does not run, is not
    committed, and the query stops without an error (nor py4j's report of one)."""
    import logging
    import threading

    from spark.conftest import wait_for

    gate = runner.BatchGate()
    callbacks = logging.getLogger("py4j.clientserver")
    callbacks.addFilter(gate.filter)
    started, release = threading.Event(), threading.Event()
    done: list[int] = []

    def process(batch, batch_id: int) -> None:
        if batch_id == 1:  # a long batch, in progress when the stop comes
            started.set()
            release.wait(60)
        batch.count()
        done.append(batch_id)

    ck = tmp_path / "ck"
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", "50")
        .load()
        .writeStream.option("checkpointLocation", str(ck))
        .trigger(processingTime="100 milliseconds")
        .foreachBatch(gate.wrap(spark, process))
        .start()
    )
    gate.jquery = query._jsq
    try:
        caplog.set_level(logging.INFO, "py4j.clientserver")
        wait_for(lambda: started.is_set() or not query.isActive, timeout=60, what="batch 1 to start")
        gate.close()
        assert not gate.wait_idle(0.2)  # batch 1 still runs
        release.set()
        assert gate.wait_idle(60)
        assert done == [0, 1]
        wait_for(
            lambda: gate.turned_away or not query.isActive,
            timeout=60,
            what="the next batch to come to the closed gate",
        )
        query.stop()
        assert query.exception() is None
    finally:
        release.set()
        query.stop()
        callbacks.removeFilter(gate.filter)
    assert done == [0, 1]
    assert gate.turned_away == 1
    assert sorted(int(n) for n in os.listdir(ck / "commits") if n.isdigit()) == [0, 1]
    assert max(int(n) for n in os.listdir(ck / "offsets") if n.isdigit()) == 2  # planned, not run
    errors = [r for r in caplog.records if r.name.startswith("py4j") and r.levelno >= logging.WARNING]
    assert not errors, [r.getMessage() for r in errors]


# --------------------------------------------------------------------------------------------
# End to end: the console script against a real nsqd
# --------------------------------------------------------------------------------------------


def nsq_spark(*args: str, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    from e2e.proc import script

    return subprocess.run(
        [script("nsq_spark"), *args, "--master=local[2]"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def describe(r: subprocess.CompletedProcess[str]) -> str:
    return f"exit {r.returncode}\n--- stdout:\n{r.stdout[-3000:]}\n--- stderr:\n{r.stderr[-6000:]}"


@pytest.mark.timeout(300)
def test_e2e_archive(nsqd_server, unique_topic: str, tmp_path: Path) -> None:
    import pyarrow.dataset as ds

    from spark.conftest import publish, stats

    bodies = [f"message {i}".encode() for i in range(40)] + [b"\x00\xffbinary"]
    publish(nsqd_server, unique_topic, bodies)
    out = tmp_path / "archive"
    r = nsq_spark(
        "archive",
        f"--topic={unique_topic}",
        f"--nsqd-tcp-address={nsqd_server.tcp_address}",
        f"--output-dir={out}",
        f"--checkpoint-dir={tmp_path / 'ck'}",
        "--available-now",
    )
    assert r.returncode == 0, describe(r)
    assert f"nsq_spark archive: rows in {len(bodies)}, rows out {len(bodies)}, rejects 0" in r.stdout
    # a quiet console: the summary on stdout; on stderr nsq_spark's own lines and nothing of
    # the fork server's or Spark's start-up (the JVM's own incubator notice aside)
    (summary,) = r.stdout.splitlines()
    assert re.fullmatch(
        rf"nsq_spark archive: rows in {len(bodies)}, rows out {len(bodies)}, rejects 0, batches \d+", summary
    )
    noise = [
        ln
        for ln in r.stderr.splitlines()
        if not ln.startswith("[nsq_spark] ") and "Using incubator modules" not in ln
    ]
    assert noise == [], describe(r)
    assert "RuntimeWarning" not in r.stderr and "log4j" not in r.stderr
    today = dt.datetime.now(UTC)
    dirs = {p.parent.relative_to(out).as_posix() for p in out.rglob("*.parquet")}
    assert (
        dirs
        <= {
            f"topic={unique_topic}/date={d:%Y-%m-%d}/hour={d:%H}"
            for d in (today - dt.timedelta(hours=1), today)
        }
        and dirs
    ), dirs
    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table()
    assert sorted(table.column("body").to_pylist()) == sorted(bodies)
    assert set(table.column("topic").to_pylist()) == {unique_topic}
    assert set(table.column_names) >= {"id", "timestamp", "attempts", "body", "channel", "nsqd_address"}
    ch = stats(nsqd_server, unique_topic, "nsq_spark")
    assert ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0
    # the writer settings of the archive: plain (no dictionary) ids and bodies, dictionary
    # for the repeated strings, no min/max statistics on bodies
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(next(out.rglob("*.parquet"))).metadata.row_group(0)
    cols = {meta.column(i).path_in_schema: meta.column(i) for i in range(meta.num_columns)}
    assert not cols["id"].has_dictionary_page and not cols["body"].has_dictionary_page
    assert cols["channel"].has_dictionary_page
    assert cols["body"].statistics is None or not cols["body"].statistics.has_min_max
    assert cols["id"].statistics.has_min_max


@pytest.mark.timeout(300)
def test_e2e_aggregate(nsqd_server, unique_topic: str, tmp_path: Path) -> None:
    from spark.conftest import consume, publish

    def ev(user: str, second: int) -> bytes:
        return j({"user": user, "ts": (BASE + dt.timedelta(seconds=second)).isoformat()})

    # window 1m, watermark 0s: 03:00 and 03:01 close when the 03:02 event is seen; 03:02 stays open
    bodies = [
        ev("a", 1),
        ev("a", 30),
        ev("b", 59),
        ev("a", 61),
        ev("b", 62),
        ev("b", 119),
        ev("c", 125),
        b"{broken",
        j({"user": "d"}),
    ]
    publish(nsqd_server, unique_topic, bodies)
    out, rejects, dest = tmp_path / "agg", tmp_path / "rejects", f"{unique_topic}_out"
    r = nsq_spark(
        "aggregate",
        f"--topic={unique_topic}",
        f"--nsqd-tcp-address={nsqd_server.tcp_address}",
        "--group-by=user",
        "--window=1m",
        "--watermark=0s",
        "--time-field=ts",
        f"--output-dir={out}",
        f"--destination-topic={dest}",
        f"--destination-nsqd-tcp-address={nsqd_server.tcp_address}",
        f"--checkpoint-dir={tmp_path / 'ck'}",
        f"--reject-dir={rejects}",
        "--available-now",
    )
    assert r.returncode == 0, describe(r)
    assert "nsq_spark aggregate: rows in 9, rows out 4, late 0, rejects 2" in r.stdout, describe(r)
    import pyarrow.dataset as ds

    table = ds.dataset(str(out), format="parquet").to_table()
    got = sorted(
        zip(
            table.column("window_start").to_pylist(),
            table.column("user").to_pylist(),
            table.column("count").to_pylist(),
            strict=True,
        )
    )
    assert [(w.astimezone(UTC).strftime("%H:%M"), u, c) for w, u, c in got] == [
        ("03:00", "a", 2),
        ("03:00", "b", 1),
        ("03:01", "a", 1),
        ("03:01", "b", 2),
    ]
    lines = [json.loads(b) for b in consume(nsqd_server, dest, "check", 4)]
    assert sorted((o["window_start"], o["user"], o["count"]) for o in lines) == [
        ("2024-01-02T03:00:00.000Z", "a", 2),
        ("2024-01-02T03:00:00.000Z", "b", 1),
        ("2024-01-02T03:01:00.000Z", "a", 1),
        ("2024-01-02T03:01:00.000Z", "b", 2),
    ]
    bad = ds.dataset(str(rejects), format="parquet").to_table()
    got_rejects = zip(bad.column("body").to_pylist(), bad.column("error").to_pylist(), strict=True)
    assert sorted(got_rejects) == sorted(
        [(b"{broken", "invalid JSON"), (j({"user": "d"}), 'missing or invalid time field "ts"')]
    )


@pytest.mark.timeout(300)
def test_e2e_republish_streaming_until_sigterm(nsqd_server, unique_topic: str, tmp_path: Path) -> None:
    from spark.conftest import consume, publish, stats, wait_for

    dest = f"{unique_topic}_copy"
    proc = subprocess.Popen(
        [
            jobs_script(),
            "republish",
            f"--topic={unique_topic}",
            f"--nsqd-tcp-address={nsqd_server.tcp_address}",
            f"--destination-topic={dest}",
            f"--destination-nsqd-tcp-address={nsqd_server.tcp_address}",
            "--require-json-field=keep",
            "--whitelist-json-field=n",
            f"--checkpoint-dir={tmp_path / 'ck'}",
            "--trigger-interval=200ms",
            "--master=local[2]",
        ],
        stdin=subprocess.DEVNULL,
        stdout=open(tmp_path / "out.txt", "w"),
        stderr=open(tmp_path / "err.txt", "w"),
    )
    try:
        bodies = [j({"keep": True, "n": i, "drop": "x"}) for i in range(20)]
        bodies += [j({"n": 100})] * 3 + [b"oops"]
        publish(nsqd_server, unique_topic, bodies)

        def rows_in() -> int:  # from the per-batch log lines: "batch N: X in, ..."
            lines = (tmp_path / "err.txt").read_text().splitlines()
            return sum(int(m[1]) for m in map(BATCH_LINE.search, lines) if m)

        wait_for(
            lambda: rows_in() >= len(bodies) or proc.poll() is not None,
            timeout=180,
            what="the job to process every message",
        )
        assert proc.poll() is None, (tmp_path / "err.txt").read_text()[-6000:]
        published = stats(nsqd_server, dest)
        assert published is not None and published["message_count"] == 20
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert code == 0, f"exit {code}\n{out}\n{err[-6000:]}"
    assert "nsq_spark republish: rows in 24, rows out 20, filtered 3, rejects 1" in out, out + err[-4000:]
    got = consume(nsqd_server, dest, "check", 20)
    assert sorted(got) == sorted(j({"n": i}).replace(b" ", b"") for i in range(20))


def jobs_script() -> str:
    from e2e.proc import script

    return script("nsq_spark")
