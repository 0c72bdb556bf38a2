"""The ``nsq`` source and sink, and ``nsq_spark``, against an nsqd that requires TLS and AUTH
(certificates made at test time, the test auth server on a thread of its own): TLS+snappy
and TLS+deflate both ways, a wrong secret, the secret kept out of plans and output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from nsqpy.spark.jobs import options, runner
from nsqpy.spark.sink import SinkOptions, publish_batches

from .conftest import SECRET, secure_options, stats, wait_for
from .test_jobs import describe, nsq_spark

pytestmark = pytest.mark.timeout(240)


def _publish(nsqd: Any, topic: str, bodies: list[bytes], **conn: str) -> None:
    opts = SinkOptions.parse({"topic": topic, "nsqdTcpAddresses": nsqd.tcp_address, **conn})
    publish_batches(opts, iter([pa.record_batch([pa.array(bodies, pa.binary())], names=["body"])]), 0)


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_sink_and_source_through_tls_compression_and_auth(
    spark: Any,
    secure_nsqd: Any,
    pki: Any,
    unique_topic: str,
    tmp_path: Path,
    compression: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    conn = secure_options(pki, **{compression: "true", "userAgent": f"spark-test/{compression}"})
    n = 2000
    bodies = [b"%s-%05d-\x00\xff" % (compression.encode(), i) for i in range(n)]
    # the sink: a batch write through TLS + compression + AUTH
    (
        spark.createDataFrame([(b,) for b in bodies], "body BINARY")
        .repartition(2)
        .write.format("nsq")
        .mode("append")
        .option("topic", unique_topic)
        .option("nsqdTcpAddresses", secure_nsqd.tcp_address)
        .options(**conn)
        .save()
    )
    t = stats(secure_nsqd, unique_topic)
    assert t is not None and t["message_count"] == n
    # the source: a running query, its connection seen from nsqd while it reads
    df = (
        spark.readStream.format("nsq")
        .option("topic", unique_topic)
        .option("nsqdTcpAddresses", secure_nsqd.tcp_address)
        .option("spoolPath", str(tmp_path / "spool"))
        .option("heartbeatIntervalMs", "1000")
        .options(**conn)
        .load()
    )
    name = f"secure_{compression}"
    w = df.writeStream.format("memory").queryName(name)
    q = w.option("checkpointLocation", str(tmp_path / "ck")).start()
    try:
        wait_for(
            lambda: spark.sql(f"select count(*) from {name}").collect()[0][0] >= n,
            timeout=90,
            what="every row through the source",
        )
        ch = stats(secure_nsqd, unique_topic, "nsq_spark")
        assert ch is not None and len(ch["clients"]) == 1, ch
        client = ch["clients"][0]
        assert client["tls"] and client["tls_version"].startswith("TLS1."), client
        assert (client["snappy"], client["deflate"]) == (compression == "snappy", compression == "deflate")
        assert (client["authed"], client["auth_identity"]) == (True, "spark"), client
        assert client["user_agent"] == f"spark-test/{compression}"
        # neither the plans nor the query's progress show the secret
        capsys.readouterr()
        df.explain(extended=True)
        q.explain(extended=True)
        shown = capsys.readouterr().out + str(q.lastProgress) + str(q.status)
        assert "nsq" in shown.lower() and SECRET not in shown
    finally:
        q.stop()
    assert q.exception() is None
    got = [bytes(r.body) for r in spark.sql(f"select body from {name}").collect()]
    assert sorted(got) == sorted(bodies)
    ch = stats(secure_nsqd, unique_topic, "nsq_spark")
    assert ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0
    wait_for(
        lambda: stats(secure_nsqd, unique_topic, "nsq_spark")["client_count"] == 0,
        what="the source closed its connection",
    )


def test_a_wrong_secret_fails_the_query_and_the_write_with_a_one_line_cause(
    spark: Any, secure_nsqd: Any, pki: Any, unique_topic: str, tmp_path: Path
) -> None:
    wrong = "not-the-secret-6a3f"
    conn = secure_options(pki, wrong)
    addr = secure_nsqd.tcp_address
    df = (
        spark.readStream.format("nsq")
        .option("topic", unique_topic)
        .option("nsqdTcpAddresses", addr)
        .option("spoolPath", str(tmp_path / "spool"))
        .options(**conn)
        .load()
    )
    q = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")).start()
    try:
        with pytest.raises(Exception) as info:
            q.awaitTermination(90)
            raise AssertionError("the query ran with a wrong secret")
    finally:
        q.stop()
    assert runner.short_error(info.value) == (
        f"RuntimeError: nsq source: nsqd {addr} refused the subscription: E_AUTH_FAILED AUTH failed"
    )
    assert wrong not in str(info.value)

    with pytest.raises(Exception) as info:
        (
            spark.createDataFrame([(b"x",)], "body BINARY")
            .write.format("nsq")
            .mode("append")
            .option("topic", unique_topic)
            .option("nsqdTcpAddresses", addr)
            .options(**conn)
            .save()
        )
    assert runner.short_error(info.value) == (
        f"RuntimeError: nsq sink: nsqd {addr} refused the connection: E_AUTH_FAILED AUTH failed"
    )
    assert wrong not in str(info.value)


def test_republish_with_consumer_and_producer_opts(
    spark: Any,
    secure_nsqd: Any,
    pki: Any,
    unique_topic: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """nsq_spark republish's own query on the shared session: go-nsq's names on both sides."""
    bodies = [b"r-%04d" % i for i in range(300)]
    _publish(secure_nsqd, unique_topic, bodies, **secure_options(pki))
    dest = f"{unique_topic}_out"
    go = ["tls_v1,true", f"tls_root_ca_file,{pki.ca_cert}", f"auth_secret,{SECRET}"]
    opts = options.parse_args(
        [
            "republish",
            f"--topic={unique_topic}",
            f"--nsqd-tcp-address={secure_nsqd.tcp_address}",
            f"--destination-topic={dest}",
            f"--destination-nsqd-tcp-address={secure_nsqd.tcp_address}",
            f"--checkpoint-dir={tmp_path / 'ck'}",
            "--available-now",
            *[f"--consumer-opt={o}" for o in [*go, "snappy"]],
            *[f"--producer-opt={o}" for o in [*go, "deflate,true", "deflate_level,2"]],
        ]
    )
    options.validate(opts)
    assert options.sink_options(opts)["deflateLevel"] == "2"
    assert options.source_options(opts)["snappy"] == "true"
    assert runner.run_query(spark, opts, runner.Stop()) == 0
    out = capsys.readouterr()
    assert f"nsq_spark republish: rows in {len(bodies)}, rows out {len(bodies)}" in out.out, out
    assert SECRET not in out.out + out.err
    t = stats(secure_nsqd, dest)
    assert t is not None and t["message_count"] == len(bodies)


@pytest.mark.timeout(300)
def test_e2e_archive_with_consumer_opts_through_tls_and_auth(
    secure_nsqd: Any, pki: Any, unique_topic: str, tmp_path: Path
) -> None:
    import pyarrow.dataset as ds

    bodies = [f"secret message {i}".encode() for i in range(50)]
    _publish(secure_nsqd, unique_topic, bodies, **secure_options(pki, snappy="true"))
    out = tmp_path / "archive"
    r = nsq_spark(
        "archive",
        f"--topic={unique_topic}",
        f"--nsqd-tcp-address={secure_nsqd.tcp_address}",
        f"--output-dir={out}",
        f"--checkpoint-dir={tmp_path / 'ck'}",
        "--available-now",
        "--consumer-opt=tls_v1,true",
        f"--consumer-opt=tls_root_ca_file,{pki.ca_cert}",
        f"--consumer-opt=auth_secret,{SECRET}",
        "--consumer-opt=deflate",
        "--consumer-opt=deflate_level,3",
        "--consumer-opt=heartbeat_interval,2s",
    )
    assert r.returncode == 0, describe(r)
    assert f"nsq_spark archive: rows in {len(bodies)}, rows out {len(bodies)}, rejects 0" in r.stdout
    assert SECRET not in r.stdout + r.stderr
    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table()
    assert sorted(table.column("body").to_pylist()) == sorted(bodies)
    ch = stats(secure_nsqd, unique_topic, "nsq_spark")
    assert ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0
