#!/usr/bin/env python3
"""Throughput of the ``nsq`` Spark source and sink on ``local[2]``.

Starts an nsqd (console script, free loopback ports, temp data dir, large
--mem-queue-size), pre-publishes --count messages of --size bytes, then:

1. source: ``spark.readStream.format("nsq")`` with ``trigger(availableNow=True)`` writing
   Parquet (what the archive job does, minus the date partitioning). Reports rows/s
   overall (query start to termination), steady (batches after the first one, from
   the query progress events), the start-up (query start to first trigger) and the first
   batch's time. On a cold session the first batch carries Spark's one-off warm-up (JVM
   planning/codegen, Python worker daemon), about 9-11 s on 2 cores; ``--warmup`` runs an
   untimed query first so that overall measures a warm session;
2. sink: ``df.write.format("nsq")`` of --count rows of --size bytes (``spark.range``
   bodies, so nothing but the sink is measured; after an untimed 10k-row warm-up write),
   rows/s; nsqd's /stats must show them all.

Exits non-zero if a row is missing or duplicated. ``--smoke`` runs a small count.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Nsqd:
    """nsqd as a child process on free ports; stopped with SIGTERM (SIGKILL after 10 s)."""

    def __init__(self, binary: str, workdir: Path, mem_queue_size: int) -> None:
        self.tcp = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        data = workdir / "nsqd"
        data.mkdir()
        self.log = open(workdir / "nsqd.log", "wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--tcp-address={self.tcp}",
                f"--http-address={self.http}",
                f"--data-path={data}",
                f"--mem-queue-size={mem_queue_size}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        for addr in (self.tcp, self.http):
            host, port = addr.rsplit(":", 1)
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"nsqd exited with {self.proc.returncode} during startup")
                try:
                    with socket.create_connection((host, int(port)), timeout=0.5):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"nsqd did not listen on {addr}") from None
                    time.sleep(0.05)

    def topic_stats(self, topic: str) -> dict[str, Any]:
        url = f"http://{self.http}/stats?format=json&topic={topic}&include_clients=false"
        with urllib.request.urlopen(url, timeout=10) as r:
            doc = json.loads(r.read())
        for t in doc.get("topics") or []:
            if t["topic_name"] == topic:
                return dict(t)
        return {}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def prepublish(nsqd: Nsqd, topic: str, count: int, size: int) -> float:
    """MPUB ``count`` distinct ``size``-byte bodies; returns the seconds it took."""
    from nsqpy.spark.sink import SinkOptions, publish_batches

    import pyarrow as pa

    opts = SinkOptions.parse({"topic": topic, "nsqdTcpAddresses": nsqd.tcp})
    pad = b"x" * size

    def batches() -> Any:
        step = 10_000
        for start in range(0, count, step):
            bodies = [(b"%012d" % i + pad)[:size] for i in range(start, min(start + step, count))]
            yield pa.record_batch([pa.array(bodies, pa.binary())], names=["body"])

    t0 = time.perf_counter()
    publish_batches(opts, batches(), 0)
    return time.perf_counter() - t0


def run_source(spark: Any, nsqd: Nsqd, topic: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    out = work / "parquet"
    df = (
        spark.readStream.format("nsq")
        .option("topic", topic)
        .option("nsqdTcpAddresses", nsqd.tcp)
        .option("nsqdHttpAddresses", nsqd.http)
        .option("spoolPath", str(work / "spool"))
        .option("maxRecordsPerBatch", str(args.max_records_per_batch))
        .option("numPartitions", str(args.num_partitions))
        .load()
    )
    t0 = time.perf_counter()
    t0_wall = time.time()
    q = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    wall = time.perf_counter() - t0
    if q.exception() is not None:
        raise RuntimeError(f"source query failed: {q.exception()}")
    progress = q.recentProgress
    batches = [p for p in progress if p["numInputRows"]]
    # query start -> first trigger: Spark starting the source's Python runner (a new
    # process per query, warm or cold) and the reader's first offset calls
    startup = _iso_seconds(progress[0]["timestamp"]) - t0_wall if progress else None
    rows = sum(p["numInputRows"] for p in batches)
    later = batches[1:]
    steady_rows = sum(p["numInputRows"] for p in later)
    steady_s = sum(p["durationMs"]["triggerExecution"] for p in later) / 1000
    written = spark.read.parquet(str(out))
    total = written.count()
    distinct = written.select("id").distinct().count()
    return {
        "rows": rows,
        "parquet_rows": total,
        "distinct_ids": distinct,
        "batches": len(batches),
        "seconds": round(wall, 2),
        "rows_per_s": round(rows / wall),
        "steady_rows_per_s": round(steady_rows / steady_s) if steady_s else None,
        "startup_s": round(startup, 2) if startup is not None else None,
        "first_batch_s": round(batches[0]["durationMs"]["triggerExecution"] / 1000, 2) if batches else None,
        "first_batch_ms": batches[0]["durationMs"] if batches else None,
        "batch_rows": [p["numInputRows"] for p in batches],
        "batch_s": [round(p["durationMs"]["triggerExecution"] / 1000, 2) for p in batches],
        "max_records_per_batch": args.max_records_per_batch,
    }


def _iso_seconds(ts: str) -> float:
    """Epoch seconds of a query progress timestamp (``2026-01-01T00:00:00.000Z``)."""
    from datetime import datetime

    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def run_sink(spark: Any, nsqd: Nsqd, topic: str, args: argparse.Namespace) -> dict[str, Any]:
    body = f"CAST(rpad(CAST(id AS STRING), {args.size}, 'x') AS BINARY) AS body"
    # warm-up (JVM code paths, Python workers) on another topic, not timed
    warm = spark.range(0, 10_000, 1, args.num_partitions).selectExpr(body)
    w = warm.write.format("nsq").mode("append").option("nsqdTcpAddresses", nsqd.tcp)
    w.option("topic", f"{topic}_warmup").save()
    df = spark.range(0, args.count, 1, args.num_partitions).selectExpr(body)
    t0 = time.perf_counter()
    df.write.format("nsq").option("topic", topic).option("nsqdTcpAddresses", nsqd.tcp).mode("append").save()
    wall = time.perf_counter() - t0
    published = int(nsqd.topic_stats(topic).get("message_count", 0))
    return {"rows": args.count, "published": published, "seconds": round(wall, 2),
            "rows_per_s": round(args.count / wall)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=1_000_000, help="messages (default 1000000)")
    ap.add_argument("--size", type=int, default=100, help="message size in bytes (default 100)")
    ap.add_argument("--smoke", action="store_true", help="a small run (--count 20000) for CI")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--max-records-per-batch", type=int, default=100_000,
                    help="source maxRecordsPerBatch (default 100000; the option's own default is 10000)")
    ap.add_argument("--num-partitions", type=int, default=2, help="source numPartitions / sink tasks")
    ap.add_argument("--nsqd-bin", default=str(Path(sys.executable).with_name("nsqd")))
    ap.add_argument("--warmup", action="store_true",
                    help="run an untimed 10k-row source query first (JVM and Python workers warm)")
    ap.add_argument("--skip-sink", action="store_true")
    ap.add_argument("--skip-source", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON line too")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args(argv)
    if args.smoke:
        args.count = min(args.count, 20_000)
    if args.size < 13:
        ap.error("--size must be >= 13 (bodies carry a 12-digit sequence number)")

    work = Path(tempfile.mkdtemp(prefix="bench_spark-"))
    nsqd = Nsqd(args.nsqd_bin, work, mem_queue_size=2 * args.count + 10_000)
    results: dict[str, Any] = {"count": args.count, "size": args.size, "master": args.master}
    failures: list[str] = []
    try:
        from nsqpy.spark.session import make_session

        if not args.skip_source:
            secs = prepublish(nsqd, "bench_source", args.count, args.size)
            results["prepublish_rows_per_s"] = round(args.count / secs)
            print(f"# pre-published {args.count} x {args.size} B in {secs:.1f}s", flush=True)
        t0 = time.perf_counter()
        spark = make_session(
            args.master, app_name="bench_spark",
            conf={"spark.sql.streaming.numRecentProgressUpdates": "10000"},
        )
        print(f"# SparkSession {args.master} in {time.perf_counter() - t0:.1f}s", flush=True)
        if not args.skip_source and args.warmup:
            prepublish(nsqd, "bench_warmup", 10_000, args.size)
            run_source(spark, nsqd, "bench_warmup", work / "warmup", args)
            print("# warm-up query done (10000 rows, not timed)", flush=True)
        if not args.skip_source:
            src = run_source(spark, nsqd, "bench_source", work, args)
            results["source"] = src
            print(
                f"[source] {src['rows']} rows in {src['seconds']}s ({src['batches']} batches): "
                f"{src['rows_per_s']} rows/s overall, {src['steady_rows_per_s']} rows/s steady "
                f"(startup {src['startup_s']}s, first batch {src['first_batch_s']}s)",
                flush=True,
            )
            if src["rows"] != args.count or src["parquet_rows"] != args.count:
                failures.append(f"source: {src['parquet_rows']} rows written, expected {args.count}")
            if src["distinct_ids"] != src["parquet_rows"]:
                failures.append(f"source: {src['parquet_rows'] - src['distinct_ids']} duplicate rows")
        if not args.skip_sink:
            sink = run_sink(spark, nsqd, "bench_sink", args)
            results["sink"] = sink
            print(f"[sink] {sink['rows']} rows in {sink['seconds']}s: {sink['rows_per_s']} rows/s")
            if sink["published"] != args.count:
                failures.append(f"sink: nsqd counted {sink['published']} messages, expected {args.count}")
        spark.stop()
    finally:
        nsqd.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"# work directory kept: {work}")
    results["failures"] = failures
    if args.json:
        print(json.dumps(results))
    print("RESULT: " + ("OK" if not failures else "FAILED: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
