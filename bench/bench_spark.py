#!/usr/bin/env python3
"""Throughput of the ``nsq`` Spark source and sink on ``local[2]``.

Starts an nsqd (console script, free loopback ports, temp data dir, large
--mem-queue-size), pre-publishes --count messages of --size bytes, then:

1. source: ``nsq_spark archive --available-now`` (its own query, in this process's
   session: date/hour partitions, per-batch file commit) drains the topic to Parquet;
   ``--pipeline parquet`` uses Spark's plain file sink instead, ``--pipeline noop`` Spark's
   noop sink (the source alone). ``--prefill`` writes the messages as chunk files straight
   into the source's spool instead of publishing them (the topic stays empty), so that the
   run measures Spark's own share: planning, reading the chunks, writing. Reports rows/s overall
   (query start to termination), steady (batches after the first one, from the query
   progress), the start-up (query start to first trigger), the first batch's time, the CPU
   seconds of all processes (JVM, Python workers, source runner, nsqd), the JVM's JIT
   compile time, and the host's steal time (a shared machine inflates wall times). On a
   cold session the first batch carries Spark's one-off warm-up (JIT compilation, Python
   worker start-up); ``--warmup`` runs an untimed query first so that overall measures a
   warm session. ``--pipeline runtime`` runs the source's I/O threads alone, without Spark
   (no session started): nsqd → burst decoding → durable chunks → FIN, until the topic is
   drained; rows/s and the CPU seconds of this process and nsqd;
2. sink: ``df.write.format("nsq")`` of --count rows of --size bytes (``spark.range``
   bodies, so nothing but the sink is measured; after an untimed 10k-row warm-up write),
   rows/s; nsqd's /stats must show them all.

``--tls`` (a throwaway CA; nsqd gets its certificate, every connection verifies it),
``--snappy``, ``--deflate`` (``--deflate-level``) make the source's, the sink's and the
pre-publisher's connections upgrade, through the data source options (``nsq_spark
--consumer-opt`` for the archive pipeline).

Exits non-zero if a row is missing or duplicated. ``--smoke`` runs a small count.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Daemon, default_nsqd_bin, steal_ticks, tree_cpu_seconds  # noqa: E402


def topic_stats(nsqd: Daemon, topic: str) -> dict[str, Any]:
    url = f"http://{nsqd.http}/stats?format=json&topic={topic}&include_clients=false"
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.loads(r.read())
    for t in doc.get("topics") or []:
        if t["topic_name"] == topic:
            return dict(t)
    return {}


def bodies(seqs: range, size: int) -> list[bytes]:
    """Distinct ``size``-byte bodies: the sequence number, padded."""
    pad = b"x" * size
    return [(b"%012d" % i + pad)[:size] for i in seqs]


def conn_options(args: argparse.Namespace, nsqd: Daemon) -> dict[str, str]:
    """The ``nsq`` source/sink connection options for --tls, --snappy, --deflate."""
    out: dict[str, str] = {}
    if args.tls:
        out.update(tls="true", tlsRootCaFile=nsqd.tls_ca)
    if args.snappy:
        out["snappy"] = "true"
    if args.deflate:
        out.update(deflate="true", deflateLevel=str(args.deflate_level))
    return out


def consumer_opts(args: argparse.Namespace, nsqd: Daemon) -> list[str]:
    """The same as ``nsq_spark --consumer-opt`` flags (go-nsq's names)."""
    out: list[str] = []
    if args.tls:
        out += ["--consumer-opt=tls_v1,true", f"--consumer-opt=tls_root_ca_file,{nsqd.tls_ca}"]
    if args.snappy:
        out.append("--consumer-opt=snappy,true")
    if args.deflate:
        out += ["--consumer-opt=deflate,true", f"--consumer-opt=deflate_level,{args.deflate_level}"]
    return out


def prepublish(nsqd: Daemon, topic: str, count: int, size: int, conn: dict[str, str]) -> float:
    """MPUB ``count`` distinct ``size``-byte bodies; returns the seconds it took."""
    from nsqpy.spark.sink import SinkOptions, publish_batches

    import pyarrow as pa

    opts = SinkOptions.parse({"topic": topic, "nsqdTcpAddresses": nsqd.tcp, **conn})

    def batches() -> Any:
        step = 10_000
        for start in range(0, count, step):
            chunk = bodies(range(start, min(start + step, count)), size)
            yield pa.record_batch([pa.array(chunk, pa.binary())], names=["body"])

    t0 = time.perf_counter()
    publish_batches(opts, batches(), 0)
    return time.perf_counter() - t0


def prefill(spool: Path, topic: str, count: int, size: int, chunk_rows: int) -> float:
    """Write ``count`` messages as the source's chunk files (``chunk_rows`` each, as the live
    source cuts them) into ``spool``, which the reader adopts on start; returns seconds."""
    import pyarrow as pa

    from nsqpy.spark.spool import ARROW_SCHEMA, Spool

    t0 = time.perf_counter()
    out = Spool(str(spool))
    now_us = int(time.time() * 1_000_000)
    for start in range(0, count, chunk_rows):
        seqs = range(start, min(start + chunk_rows, count))
        n = len(seqs)
        out.write(pa.RecordBatch.from_arrays(
            [
                pa.array(["%016x" % i for i in seqs], pa.string()),
                pa.array([now_us + i for i in seqs], pa.timestamp("us", tz="UTC")),
                pa.array([1] * n, pa.int32()),
                pa.array(bodies(seqs, size), pa.binary()),
                pa.array([topic] * n, pa.string()),
                pa.array(["nsq_spark"] * n, pa.string()),
                pa.array(["prefill"] * n, pa.string()),
            ],
            schema=ARROW_SCHEMA,
        ))
    return time.perf_counter() - t0


def run_runtime(nsqd: Daemon, topic: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The source's I/O threads without Spark (what a streaming query's runner does before
    Spark reads a chunk): availableNow over the pre-published topic, until every message is
    in the spool and FIN'd."""
    from nsqpy.spark.source import SourceOptions, _Runtime

    opts = SourceOptions.parse({
        "topic": topic, "nsqdTcpAddresses": nsqd.tcp, "nsqdHttpAddresses": nsqd.http,
        "spoolPath": str(work / "runtime-spool"), "maxRecordsPerBatch": str(args.max_records_per_batch),
        "maxSpoolRows": str(2 * args.count + 1_000_000), **conn_options(args, nsqd),
    })
    cpu0 = tree_cpu_seconds()
    own0 = time.process_time()
    steal0 = steal_ticks()
    t0 = time.perf_counter()
    rt = _Runtime(opts, 0, available_now=True)
    try:
        rt.start()
        with rt.cond:
            while rt.target is None:
                rt.raise_if_failed()
                rt.cond.wait(0.05)
        wall = time.perf_counter() - t0
        own = time.process_time() - own0
        rows = rt.spool.rows_after(0)
        chunks = rt.spool.last_seq
    finally:
        rt.stop()
    cpu1 = tree_cpu_seconds()
    steal1 = steal_ticks()
    steal = None
    if steal0 is not None and steal1 is not None and steal1[1] > steal0[1]:
        steal = round(100 * (steal1[0] - steal0[0]) / (steal1[1] - steal0[1]), 1)
    return {
        "pipeline": "runtime", "rows": rows, "parquet_rows": rows, "distinct_ids": rows,
        "chunks": chunks, "seconds": round(wall, 2), "rows_per_s": round(rows / wall),
        "cpu_s": round(cpu1 - cpu0, 1) if cpu0 is not None and cpu1 is not None else None,
        # the source's threads alone (this process: decoding, spooling, FIN)
        "source_cpu_s": round(own, 2),
        "steal_pct": steal,
    }


def run_source(spark: Any, nsqd: Daemon, topic: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Read the topic with the ``nsq`` source until drained (availableNow) and write Parquet:
    with ``--pipeline archive`` through ``nsq_spark archive``'s own query (date/hour
    partitions, per-batch file commit), with ``--pipeline parquet`` through Spark's file sink;
    ``--pipeline noop`` writes nothing."""
    jit = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getCompilationMXBean()
    jit0 = jit.getTotalCompilationTime()
    cpu0 = tree_cpu_seconds()
    steal0 = steal_ticks()
    t0 = time.perf_counter()
    t0_wall = time.time()
    if args.pipeline == "archive":
        out, query = _run_archive(spark, nsqd, topic, work, args)
    else:
        out, query = _run_spark_sink(spark, nsqd, topic, work, args)
    wall = time.perf_counter() - t0
    cpu1 = tree_cpu_seconds()
    steal1 = steal_ticks()
    steal = None
    if steal0 is not None and steal1 is not None and steal1[1] > steal0[1]:
        steal = round(100 * (steal1[0] - steal0[0]) / (steal1[1] - steal0[1]), 1)
    jit1 = jit.getTotalCompilationTime()
    progress = query.recentProgress
    batches = [p for p in progress if p["numInputRows"]]
    # query start -> first trigger: loading the source (Python planner), Spark starting the
    # source's Python runner (a new process per query, warm or cold), the first offset calls
    startup = _iso_seconds(progress[0]["timestamp"]) - t0_wall if progress else None
    rows = sum(p["numInputRows"] for p in batches)
    later = batches[1:]
    steady_rows = sum(p["numInputRows"] for p in later)
    steady_s = sum(p["durationMs"]["triggerExecution"] for p in later) / 1000
    if out is None:  # noop: the source's own row count (no duplicates check possible)
        total = distinct = rows
    else:
        written = spark.read.parquet(str(out))
        total = written.count()
        distinct = written.select("id").distinct().count()
    return {
        "pipeline": args.pipeline,
        "rows": rows,
        "parquet_rows": total,
        "distinct_ids": distinct,
        "batches": len(batches),
        "seconds": round(wall, 2),
        "rows_per_s": round(rows / wall),
        # all processes' CPU over the query (JVM, Python workers, source runner, nsqd)
        "cpu_s": round(cpu1 - cpu0, 1) if cpu0 is not None and cpu1 is not None else None,
        # the JVM's JIT compiler threads' time over the query (a cold JVM compiles a lot)
        "jit_s": round((jit1 - jit0) / 1000, 1),
        # the share of the machine's CPU time the hypervisor gave to others (vmstat's st)
        "steal_pct": steal,
        "steady_rows_per_s": round(steady_rows / steady_s) if steady_s else None,
        "startup_s": round(startup, 2) if startup is not None else None,
        "first_batch_s": round(batches[0]["durationMs"]["triggerExecution"] / 1000, 2) if batches else None,
        "first_batch_ms": batches[0]["durationMs"] if batches else None,
        "batch_rows": [p["numInputRows"] for p in batches],
        "batch_s": [round(p["durationMs"]["triggerExecution"] / 1000, 2) for p in batches],
        "max_records_per_batch": args.max_records_per_batch,
    }


def _run_archive(
    spark: Any, nsqd: Daemon, topic: str, work: Path, args: argparse.Namespace
) -> tuple[Path, Any]:
    from nsqpy.spark import jobs

    out = work / "archive"
    opts = jobs.parse_args([
        "archive", f"--topic={topic}", f"--nsqd-tcp-address={nsqd.tcp}", f"--output-dir={out}",
        f"--checkpoint-dir={work / 'checkpoint'}", f"--spool-dir={work / 'spool'}",
        f"--max-records-per-batch={args.max_records_per_batch}", "--available-now",
        *consumer_opts(args, nsqd),
    ])
    jobs.validate(opts)
    totals = jobs.Totals()
    rc = jobs._run_query(spark, opts, jobs._Stop(), totals)
    if rc != 0:
        raise RuntimeError(f"nsq_spark archive query exited {rc}")
    return out, totals.query


def _run_spark_sink(
    spark: Any, nsqd: Daemon, topic: str, work: Path, args: argparse.Namespace
) -> tuple[Path | None, Any]:
    out = work / "parquet" if args.pipeline == "parquet" else None
    df = (
        spark.readStream.format("nsq")
        .option("topic", topic)
        .option("nsqdTcpAddresses", nsqd.tcp)
        .option("nsqdHttpAddresses", nsqd.http)
        .option("spoolPath", str(work / "spool"))
        .option("maxRecordsPerBatch", str(args.max_records_per_batch))
        .option("numPartitions", str(args.num_partitions))
        .options(**conn_options(args, nsqd))
        .load()
    )
    w = df.writeStream.format("parquet").option("path", str(out)) if out else df.writeStream.format("noop")
    q = (
        w.option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(f"source query failed: {q.exception()}")
    return out, q


def _iso_seconds(ts: str) -> float:
    """Epoch seconds of a query progress timestamp (``2026-01-01T00:00:00.000Z``)."""
    from datetime import datetime

    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def run_sink(spark: Any, nsqd: Daemon, topic: str, args: argparse.Namespace) -> dict[str, Any]:
    body = f"CAST(rpad(CAST(id AS STRING), {args.size}, 'x') AS BINARY) AS body"
    # warm-up (JVM code paths, Python workers) on another topic, not timed
    conn = conn_options(args, nsqd)
    warm = spark.range(0, 10_000, 1, args.num_partitions).selectExpr(body)
    w = warm.write.format("nsq").mode("append").option("nsqdTcpAddresses", nsqd.tcp).options(**conn)
    w.option("topic", f"{topic}_warmup").save()
    df = spark.range(0, args.count, 1, args.num_partitions).selectExpr(body)
    t0 = time.perf_counter()
    (df.write.format("nsq").option("topic", topic).option("nsqdTcpAddresses", nsqd.tcp)
     .options(**conn).mode("append").save())
    wall = time.perf_counter() - t0
    published = int(topic_stats(nsqd, topic).get("message_count", 0))
    return {"rows": args.count, "published": published, "seconds": round(wall, 2),
            "rows_per_s": round(args.count / wall)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=1_000_000, help="messages (default 1000000)")
    ap.add_argument("--size", type=int, default=100, help="message size in bytes (default 100)")
    ap.add_argument("--smoke", action="store_true", help="a small run (--count 20000) for CI")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--pipeline", choices=("archive", "parquet", "noop", "runtime"), default="archive",
                    help="archive: nsq_spark archive's query (default); parquet: Spark's file sink; "
                    "noop: Spark's noop sink; runtime: the source's I/O threads alone, no Spark")
    ap.add_argument("--prefill", action="store_true",
                    help="put the messages in the spool as chunk files instead of publishing them")
    ap.add_argument("--prefill-chunk-rows", type=int, default=1250,
                    help="rows per prefilled chunk (default 1250: what the source cuts at a 2500 window)")
    ap.add_argument("--max-records-per-batch", type=int, default=100_000,
                    help="source maxRecordsPerBatch / archive --max-records-per-batch (default 100000)")
    ap.add_argument("--num-partitions", type=int, default=2,
                    help="source numPartitions (--pipeline parquet) / sink tasks")
    ap.add_argument("--nsqd-bin", default=default_nsqd_bin())
    ap.add_argument("--warmup", action="store_true",
                    help="run an untimed 10k-row source query first (JVM and Python workers warm)")
    ap.add_argument("--skip-sink", action="store_true")
    ap.add_argument("--skip-source", action="store_true")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="extra Spark configuration for the session (repeatable)")
    ap.add_argument("--tls", action="store_true",
                    help="TLS on every connection (a throwaway CA; nsqd gets its certificate)")
    ap.add_argument("--snappy", action="store_true", help="snappy compression on every connection")
    ap.add_argument("--deflate", action="store_true", help="deflate compression on every connection")
    ap.add_argument("--deflate-level", type=int, default=6, help="deflate level in [1,9] (6)")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON line too")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args(argv)
    if args.smoke:
        args.count = min(args.count, 20_000)
    if args.size < 13:
        ap.error("--size must be >= 13 (bodies carry a 12-digit sequence number)")
    if args.snappy and args.deflate:
        ap.error("use --snappy or --deflate not both")
    if args.pipeline == "runtime" and args.prefill:
        ap.error("--pipeline runtime reads from nsqd: not with --prefill")

    work = Path(tempfile.mkdtemp(prefix="bench_spark-"))
    nsqd = Daemon(argparse.Namespace(
        nsqd_bin=args.nsqd_bin, data_path=None, mem_queue_size=2 * args.count + 10_000, nsqd_arg=[],
        startup_timeout=20.0, stop_timeout=10.0, tls=args.tls, deflate=args.deflate,
        deflate_level=args.deflate_level,
    ), work)
    nsqd.start()
    results: dict[str, Any] = {"count": args.count, "size": args.size, "master": args.master,
                               "tls": args.tls, "snappy": args.snappy, "deflate": args.deflate}
    failures: list[str] = []
    try:
        from nsqpy.spark.session import make_session

        if not args.skip_source and args.prefill:
            secs = prefill(work / "spool", "bench_source", args.count, args.size, args.prefill_chunk_rows)
            print(f"# prefilled the spool with {args.count} x {args.size} B in {secs:.1f}s", flush=True)
        elif not args.skip_source:
            secs = prepublish(nsqd, "bench_source", args.count, args.size, conn_options(args, nsqd))
            results["prepublish_rows_per_s"] = round(args.count / secs)
            print(f"# pre-published {args.count} x {args.size} B in {secs:.1f}s", flush=True)
        runtime = not args.skip_source and args.pipeline == "runtime"
        if runtime:
            src = run_runtime(nsqd, "bench_source", work, args)
            results["source"] = src
            print(
                f"[source, runtime (no Spark)] {src['rows']} rows in {src['seconds']}s "
                f"({src['chunks']} chunks): {src['rows_per_s']} rows/s "
                f"({src['source_cpu_s']} CPU-s in the source's threads, {src['cpu_s']} with nsqd; "
                f"host steal {src['steal_pct']}%)",
                flush=True,
            )
            if src["rows"] != args.count:
                failures.append(f"source: {src['rows']} rows spooled, expected {args.count}")
            if args.skip_sink:
                return _finish(args, results, failures, nsqd, work)
        from nsqpy.spark.jobs import SESSION_CONF

        conf = dict(SESSION_CONF)
        conf["spark.sql.streaming.numRecentProgressUpdates"] = "10000"
        for item in args.conf:
            key, sep, value = item.partition("=")
            if not sep:
                ap.error(f"--conf wants KEY=VALUE, got {item!r}")
            conf[key] = value
        t0 = time.perf_counter()
        spark = make_session(args.master, app_name="bench_spark", conf=conf)
        print(f"# SparkSession {args.master} in {time.perf_counter() - t0:.1f}s", flush=True)
        if not args.skip_source and not runtime and args.warmup:
            prepublish(nsqd, "bench_warmup", 10_000, args.size, conn_options(args, nsqd))
            run_source(spark, nsqd, "bench_warmup", work / "warmup", args)
            print("# warm-up query done (10000 rows, not timed)", flush=True)
        if not args.skip_source and not runtime:
            src = run_source(spark, nsqd, "bench_source", work, args)
            results["source"] = src
            kind = args.pipeline + (", prefilled spool" if args.prefill else "")
            print(
                f"[source, {kind}] {src['rows']} rows in {src['seconds']}s "
                f"({src['batches']} batches): "
                f"{src['rows_per_s']} rows/s overall, {src['steady_rows_per_s']} rows/s steady "
                f"(startup {src['startup_s']}s, first batch {src['first_batch_s']}s; "
                f"{src['cpu_s']} CPU-s in all processes, JIT compiling {src['jit_s']}s, "
                f"host steal {src['steal_pct']}%)",
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
    except BaseException:
        _cleanup(args, nsqd, work)
        raise
    return _finish(args, results, failures, nsqd, work)


def _cleanup(args: argparse.Namespace, nsqd: Daemon, work: Path) -> None:
    nsqd.stop()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"# work directory kept: {work}")


def _finish(
    args: argparse.Namespace, results: dict[str, Any], failures: list[str], nsqd: Daemon, work: Path
) -> int:
    _cleanup(args, nsqd, work)
    results["failures"] = failures
    if args.json:
        print(json.dumps(results))
    print("RESULT: " + ("OK" if not failures else "FAILED: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
