"""The ``nsq_spark`` jobs on a real Spark standalone cluster: a master and two workers, each
its own JVM on 127.0.0.1 (the conftest's ``spark_cluster``), the job's driver started by the
``nsq_spark`` console script with ``--master spark://…``. The spool and the checkpoint are on
storage the executors share (on one machine, a local directory is). Bounded and streaming
runs, the streaming ones stopped by SIGTERM; outputs checked for every message once."""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from e2e.proc import script

from .conftest import SparkCluster, consume, publish, stats, wait_for

pytestmark = pytest.mark.timeout(420)

UTC = dt.UTC
BATCH_LINE = re.compile(r"INFO: batch \d+: (\d+) in, ")
#: one core and at most 1 GiB on each worker for each job
CLUSTER_CONF = ("--spark-conf=spark.executor.memory=768m", "--spark-conf=spark.executor.cores=1")


def _archived(out: Path) -> Counter[bytes]:
    import pyarrow.dataset as ds

    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(columns=["body"])
    return Counter(table.column("body").to_pylist())


def _start(cluster: SparkCluster, tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [script("nsq_spark"), *args, f"--master={cluster.url}", *CLUSTER_CONF],
        stdin=subprocess.DEVNULL,
        stdout=open(tmp_path / "out.txt", "w"),
        stderr=open(tmp_path / "err.txt", "w"),
    )


def _rows_in(tmp_path: Path) -> int:
    """Rows the job has processed, from its per-batch log lines ("batch N: X in, ...")."""
    lines = (tmp_path / "err.txt").read_text().splitlines()
    return sum(int(m[1]) for m in map(BATCH_LINE.search, lines) if m)


def _stop(proc: subprocess.Popen[bytes], tmp_path: Path) -> tuple[str, str]:
    try:
        assert proc.poll() is None, (tmp_path / "err.txt").read_text()[-6000:]
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert code == 0, f"exit {code}\n{out}\n{err[-6000:]}"
    return out, err


def _ran_on_both_workers(cluster: SparkCluster, app: str) -> None:
    dirs = cluster.executor_dirs(app)
    assert {d.parent for d in dirs} == set(cluster.worker_dirs), (app, dirs, cluster.state())


def test_archive_available_now_on_the_cluster(
    spark_cluster: SparkCluster, nsqd_server: Any, unique_topic: str, tmp_path: Path
) -> None:
    n = 20_000
    bodies = [b"%06d " % i + b"c" * 50 for i in range(n)]
    publish(nsqd_server, unique_topic, bodies)
    out = tmp_path / "archive"
    r = subprocess.run(
        [
            script("nsq_spark"),
            "archive",
            f"--topic={unique_topic}",
            f"--nsqd-tcp-address={nsqd_server.tcp_address}",
            f"--output-dir={out}",
            f"--checkpoint-dir={tmp_path / 'ck'}",
            "--max-records-per-batch=5000",
            "--available-now",
            f"--master={spark_cluster.url}",
            *CLUSTER_CONF,
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr[-6000:]}"
    assert f"nsq_spark archive: rows in {n}, rows out {n}, rejects 0" in r.stdout, r.stdout
    got = _archived(out)
    assert set(got) == set(bodies) and set(got.values()) == {1}
    _ran_on_both_workers(spark_cluster, f"nsq_spark archive {unique_topic}")


def test_archive_streaming_on_the_cluster_until_sigterm(
    spark_cluster: SparkCluster, nsqd_server: Any, unique_topic: str, tmp_path: Path
) -> None:
    out = tmp_path / "archive"
    proc = _start(
        spark_cluster,
        tmp_path,
        "archive",
        f"--topic={unique_topic}",
        f"--nsqd-tcp-address={nsqd_server.tcp_address}",
        f"--output-dir={out}",
        f"--checkpoint-dir={tmp_path / 'ck'}",
        "--trigger-interval=500ms",
    )
    published: list[bytes] = []
    for k in range(5):  # while the query runs
        bodies = [b"s%d-%05d" % (k, i) for i in range(1000)]
        publish(nsqd_server, unique_topic, bodies)
        published += bodies
        time.sleep(0.5)
    wait_for(
        lambda: _rows_in(tmp_path) >= len(published) or proc.poll() is not None,
        timeout=240,
        what="every message archived",
    )
    outp, _ = _stop(proc, tmp_path)
    assert f"rows in {len(published)}, rows out {len(published)}" in outp, outp
    got = _archived(out)
    assert set(got) == set(published) and set(got.values()) == {1}
    ch = stats(nsqd_server, unique_topic, "nsq_spark")
    assert ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0


def test_aggregate_streaming_on_the_cluster(
    spark_cluster: SparkCluster, nsqd_server: Any, unique_topic: str, tmp_path: Path
) -> None:
    base = dt.datetime(2024, 1, 2, 3, 0, 0, tzinfo=UTC)

    def ev(user: str, second: int) -> bytes:
        return json.dumps({"user": user, "ts": (base + dt.timedelta(seconds=second)).isoformat()}).encode()

    dest = f"{unique_topic}_out"
    out = tmp_path / "agg"
    proc = _start(
        spark_cluster,
        tmp_path,
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
        "--trigger-interval=500ms",
    )
    # 03:00 and 03:01 close once the 03:02 event has moved the watermark past them
    publish(nsqd_server, unique_topic, [ev("a", 1), ev("a", 30), ev("b", 59), ev("a", 61)])
    publish(nsqd_server, unique_topic, [ev("b", 62), ev("b", 119), ev("c", 125)])
    lines = [json.loads(b) for b in consume(nsqd_server, dest, "check", 4, timeout=240)]
    _stop(proc, tmp_path)
    assert sorted((o["window_start"], o["user"], o["count"]) for o in lines) == [
        ("2024-01-02T03:00:00.000Z", "a", 2),
        ("2024-01-02T03:00:00.000Z", "b", 1),
        ("2024-01-02T03:01:00.000Z", "a", 1),
        ("2024-01-02T03:01:00.000Z", "b", 2),
    ]
    import pyarrow.dataset as ds

    table = ds.dataset(str(out), format="parquet").to_table()
    assert sorted(zip(table.column("user").to_pylist(), table.column("count").to_pylist(), strict=True)) == [
        ("a", 1),
        ("a", 2),
        ("b", 1),
        ("b", 2),
    ]


def test_republish_streaming_on_the_cluster(
    spark_cluster: SparkCluster, nsqd_server: Any, unique_topic: str, tmp_path: Path
) -> None:
    dest = f"{unique_topic}_copy"
    proc = _start(
        spark_cluster,
        tmp_path,
        "republish",
        f"--topic={unique_topic}",
        f"--nsqd-tcp-address={nsqd_server.tcp_address}",
        f"--destination-topic={dest}",
        f"--destination-nsqd-tcp-address={nsqd_server.tcp_address}",
        f"--checkpoint-dir={tmp_path / 'ck'}",
        "--trigger-interval=500ms",
    )
    bodies = [b"copy-%05d" % i for i in range(3000)]
    for i in range(0, len(bodies), 1000):
        publish(nsqd_server, unique_topic, bodies[i : i + 1000])
        time.sleep(0.5)
    wait_for(
        lambda: _rows_in(tmp_path) >= len(bodies) or proc.poll() is not None,
        timeout=240,
        what="every message republished",
    )
    outp, _ = _stop(proc, tmp_path)
    assert f"nsq_spark republish: rows in {len(bodies)}, rows out {len(bodies)}" in outp, outp
    got = consume(nsqd_server, dest, "check", len(bodies), timeout=60)
    assert sorted(got) == bodies
    _ran_on_both_workers(spark_cluster, f"nsq_spark republish {unique_topic}")
