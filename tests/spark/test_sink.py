"""The ``nsq`` sink (batch and streaming writes) against a real nsqd."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from nsqpy.protocol.commands import CommandParser, decode_mpub
from nsqpy.spark.sink import SinkOptions, mpub_commands

from .conftest import consume, stats

pytestmark = pytest.mark.timeout(180)


def _create_channel(nsqd: Any, topic: str, channel: str = "verify") -> None:
    status, body = nsqd.http_post(f"/topic/create?topic={topic}")
    assert status == 200, body
    status, body = nsqd.http_post(f"/channel/create?topic={topic}&channel={channel}")
    assert status == 200, body


# --- pure parts -------------------------------------------------------------------------------


def test_mpub_commands_split_within_max_body_size() -> None:
    bodies = [bytes([65 + i % 26]) * (1 + (i * 37) % 3000) for i in range(300)]
    max_body = 8 * 1024
    col = pa.array(bodies, pa.binary()).slice(0)
    cmds = list(mpub_commands("t", col, max_body))
    assert len(cmds) > 5
    out: list[bytes] = []
    for cmd, count in cmds:
        parser = CommandParser()
        parser.feed(cmd)
        parsed = parser.next()
        assert parsed is not None and parser.buffered == 0
        name, params, body = parsed
        assert (name, params) == (b"MPUB", [b"MPUB", b"t"]) and body is not None
        assert len(body) <= max_body
        msgs = decode_mpub(body, max_msg_size=max_body, max_body_size=max_body)
        assert len(msgs) == count
        out += msgs
    assert out == bodies
    # a sliced array (non-zero offset) and messages as big as the limit allows
    big = pa.array([b"a", b"x" * (max_body - 8), b"y" * (max_body - 8), b"z"], pa.binary()).slice(1, 2)
    out = []
    for cmd, count in mpub_commands("t", big, max_body):
        assert count == 1 and len(cmd) == len(b"MPUB t\n") + 4 + max_body
        out += decode_mpub(cmd[len(b"MPUB t\n") + 4 :], max_body, max_body)
    assert out == big.to_pylist()
    # everything in one MPUB when it fits
    small = pa.array([b"m%d" % i for i in range(1000)], pa.binary())
    [(cmd, count)] = list(mpub_commands("t", small, 1 << 20))
    assert count == 1000 and decode_mpub(cmd[11:], 1 << 20, 1 << 20) == small.to_pylist()


def test_sink_options_errors() -> None:
    with pytest.raises(ValueError, match="'topic'"):
        SinkOptions.parse({"nsqdTcpAddresses": "127.0.0.1:4150"})
    with pytest.raises(ValueError, match="'nsqdTcpAddresses'"):
        SinkOptions.parse({"topic": "t"})
    with pytest.raises(ValueError, match="'nsqdTcpAddresses'"):
        SinkOptions.parse({"topic": "t", "nsqdTcpAddresses": "nohost"})
    o = SinkOptions.parse({"topic": "t", "nsqdtcpaddresses": "127.0.0.1:1, 127.0.0.1:2"})
    assert o.addresses == ("127.0.0.1:1", "127.0.0.1:2")
    assert (o.max_msg_size, o.max_body_size) == (1024 * 1024, 5 * 1024 * 1024)


# --- with Spark and nsqd ----------------------------------------------------------------------


def test_batch_write_publishes_every_row_once(spark: Any, nsqd_server: Any, unique_topic: str) -> None:
    n = 5000
    bodies = [b"row-%05d\x00\xff" % i for i in range(n)]
    _create_channel(nsqd_server, unique_topic)
    df = spark.createDataFrame([(b, i) for i, b in enumerate(bodies)], "body BINARY, i INT").repartition(3)
    (
        df.write.format("nsq")
        .option("topic", unique_topic)
        .option("nsqdTcpAddresses", nsqd_server.tcp_address)
        .mode("append")
        .save()
    )
    t = stats(nsqd_server, unique_topic)
    assert t is not None and t["message_count"] == n
    got = consume(nsqd_server, unique_topic, "verify", n)
    assert sorted(got) == sorted(bodies)


def test_batch_write_string_body_and_small_max_body_size(
    spark: Any, nsqd_server: Any, unique_topic: str
) -> None:
    n = 400
    bodies = ["héllo-%04d-" % i + "z" * (i % 50) for i in range(n)]
    _create_channel(nsqd_server, unique_topic)
    (
        spark.createDataFrame([(b,) for b in bodies], "body STRING")
        .coalesce(1)
        .write.format("nsq")
        .option("topic", unique_topic)
        .option("nsqdTcpAddresses", nsqd_server.tcp_address)
        .option("maxBodySize", "2048")  # forces many small MPUBs
        .mode("append")
        .save()
    )
    got = consume(nsqd_server, unique_topic, "verify", n)
    assert sorted(got) == sorted(b.encode() for b in bodies)


def test_write_too_big_message_fails_clearly(spark: Any, nsqd_server: Any, unique_topic: str) -> None:
    rows = [(b"small",), (b"x" * (1024 * 1024 + 1),)]
    df = spark.createDataFrame(rows, "body BINARY").coalesce(1)
    with pytest.raises(Exception, match="max-msg-size"):
        (
            df.write.format("nsq")
            .option("topic", unique_topic)
            .option("nsqdTcpAddresses", nsqd_server.tcp_address)
            .mode("append")
            .save()
        )
    t = stats(nsqd_server, unique_topic)
    assert t is None or t["message_count"] == 0, "part of a rejected batch was published"


def test_write_without_body_column_fails(spark: Any, nsqd_server: Any, unique_topic: str) -> None:
    df = spark.createDataFrame([(1,)], "value INT")
    with pytest.raises(Exception, match="no 'body' column"):
        (
            df.write.format("nsq")
            .option("topic", unique_topic)
            .option("nsqdTcpAddresses", nsqd_server.tcp_address)
            .mode("append")
            .save()
        )


def test_streaming_write(spark: Any, nsqd_server: Any, unique_topic: str, tmp_path: Path) -> None:
    n = 1200
    bodies = [b"stream-%05d" % i for i in range(n)]
    src = tmp_path / "in"
    spark.createDataFrame([(b,) for b in bodies], "body BINARY").repartition(4).write.parquet(str(src))
    _create_channel(nsqd_server, unique_topic)
    q = (
        spark.readStream.schema("body BINARY")
        .option("maxFilesPerTrigger", 2)
        .parquet(str(src))
        .writeStream.format("nsq")
        .option("topic", unique_topic)
        .option("nsqdTcpAddresses", nsqd_server.tcp_address)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(90)
    assert q.exception() is None
    assert len([p for p in q.recentProgress if p["numInputRows"]]) >= 2
    got = consume(nsqd_server, unique_topic, "verify", n)
    assert sorted(got) == sorted(bodies)
