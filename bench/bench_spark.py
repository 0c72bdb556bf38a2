#!/usr/bin/env python3
"""Throughput of the ``nsq`` Spark source next to Spark's own sources, and of the sink, on
``local[2]``.

Starts an nsqd (console script, free loopback ports, temp data dir, large
--mem-queue-size), then, for ``--source``:

* ``nsq`` (default): pre-publishes --count messages of --size bytes and drains them with
  ``nsq_spark archive --available-now``'s own query (its runner, in this process's
  session: date/hour partitions, per-batch file commit); ``--pipeline parquet`` uses
  Spark's plain file sink instead, ``--pipeline noop`` Spark's noop sink (the source
  alone). ``--prefill`` writes the messages as chunk files straight into the source's
  spool instead of publishing them (the run then measures Spark's own share).
  ``--pipeline runtime`` runs the source's I/O threads alone, without Spark (no session):
  nsqd → burst decoding → durable chunks → FIN, until the topic is drained;
* ``rate``: Spark's ``rate-micro-batch`` source (--max-records-per-batch rows per batch),
  projected to the ``nsq`` source's schema (same ids, bodies of --size bytes), into the same
  archive query;
* ``files``: Spark's Parquet file source over --count rows in the source's schema (written
  beforehand with pyarrow, one file per --max-records-per-batch rows, one file per batch),
  into the same archive query;
* ``all``: each of the three in a process (a JVM) of its own, each cold then warm (``--warm``),
  and the ratios nsq / rate and nsq / files of the overall and steady rates, cold and warm.

For every query: rows/s overall (query start to the end of its last batch) and steady (the
batches after the first, from the query progress), the start-up (query start to first
trigger), the first batch's rows and time, and the CPU seconds per 1M rows of each process
group, sampled from /proc every 0.1 s: the JVM, nsqd, the streaming source's runner
(``python_streaming_source_runner``), the Python read workers (``pyspark.daemon`` and its
forks), the planners (the other Python processes Spark starts: data source lookup, creation,
read planning) and this driver process (foreachBatch, py4j); the JVM's JIT compile time, the
load average and the host's steal time (a shared machine inflates wall times). ``--warm``
runs the same query again in the same session (a second topic or directory) and reports it
too.

Then the sink: ``df.write.format("nsq")`` of --count rows of --size bytes (``spark.range``
bodies, after an untimed 10k-row warm-up write), rows/s; nsqd's /stats must show them all.

``--tls`` (a throwaway CA; nsqd gets its certificate, every connection verifies it),
``--snappy``, ``--deflate`` (``--deflate-level``) make the source's, the sink's and the
pre-publisher's connections upgrade, through the data source options (``nsq_spark
--consumer-opt`` for the archive pipeline).

Exits non-zero if a row is missing or duplicated. ``--smoke`` runs a small count.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
# bench/ is this script's sys.path[0]: its modules must not shadow the standard library's
# (bench/profile.py would be imported for pyspark's `import cProfile` → `import profile`)
_spec = importlib.util.spec_from_file_location("bench_run", BENCH / "run.py")
assert _spec is not None and _spec.loader is not None
_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_run)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]  # run.py adds it too
sys.modules.pop("profile", None)
Daemon, default_nsqd_bin, steal_ticks = _run.Daemon, _run.default_nsqd_bin, _run.steal_ticks

SOURCES = ("nsq", "rate", "files")


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
    import pyarrow as pa

    from nsqpy.spark.sink import SinkOptions, publish_batches

    opts = SinkOptions.parse({"topic": topic, "nsqdTcpAddresses": nsqd.tcp, **conn})

    def batches() -> Any:
        step = 10_000
        for start in range(0, count, step):
            chunk = bodies(range(start, min(start + step, count)), size)
            yield pa.record_batch([pa.array(chunk, pa.binary())], names=["body"])

    t0 = time.perf_counter()
    publish_batches(opts, batches(), 0)
    return time.perf_counter() - t0


def source_rows(seqs: range, size: int, topic: str, address: str, now_us: int) -> Any:
    """Rows ``seqs`` in the ``nsq`` source's schema (ids and bodies as the published ones)."""
    import pyarrow as pa

    from nsqpy.spark.spool import ARROW_SCHEMA

    n = len(seqs)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(["%016x" % i for i in seqs], pa.string()),
            pa.array([now_us + i for i in seqs], pa.timestamp("us", tz="UTC")),
            pa.array([1] * n, pa.int32()),
            pa.array(bodies(seqs, size), pa.binary()),
            pa.array([topic] * n, pa.string()),
            pa.array(["nsq_spark"] * n, pa.string()),
            pa.array([address] * n, pa.string()),
        ],
        schema=ARROW_SCHEMA,
    )


def prefill(spool: Path, topic: str, count: int, size: int, chunk_rows: int) -> float:
    """Write ``count`` messages as the source's chunk files (``chunk_rows`` each, as the live
    source cuts them) into ``spool``, which the reader adopts on start; returns seconds."""
    from nsqpy.spark.spool import Spool

    t0 = time.perf_counter()
    out = Spool(str(spool))
    now_us = int(time.time() * 1_000_000)
    for start in range(0, count, chunk_rows):
        out.write(source_rows(range(start, min(start + chunk_rows, count)), size, topic, "prefill", now_us))
    return time.perf_counter() - t0


# --- CPU per process group ---------------------------------------------------------------------

#: Process groups, by what their command line names (first match wins).
GROUPS = (
    ("source runner", ("python_streaming_source_runner",)),
    # the daemon's forks name what they run: data source lookup, creation, read planning
    ("planners", ("pyspark.sql.worker", "pyspark.sql.streaming")),
    ("read workers", ("pyspark.daemon", "pyspark.worker")),
    ("jvm", ("java",)),
    ("driver python", ("bin/nsq_spark",)),  # a --copies application's driver
)
#: The fork server (nsqpy.spark.forkserver) and its children, by their names (comm).
FORK_SERVER = "nsqpy.spark.forkserver"
FORKED = {
    "python_streamin": "source runner",
    "worker": "read workers",
    "create_data_sou": "planners",
    "plan_data_sourc": "planners",
    "lookup_data_sou": "planners",
}
#: The groups that are the ``nsq`` source's own processes (the issue's target).
SOURCE_GROUPS = ("source runner", "read workers", "planners", "fork server")
_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class CpuSampler:
    """CPU seconds (user + system, own threads only) of this process, its descendants and
    nsqd, per group, sampled every ``interval`` s while running: a process that exits is
    counted up to its last sample (a planner's last tenth of a second can be missed)."""

    def __init__(self, nsqd_pid: int | None, interval: float = 0.1) -> None:
        self.nsqd_pid = nsqd_pid
        self.interval = interval
        self.me = os.getpid()
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.group: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _classify(self, pid: int) -> str:
        if pid == self.me:
            return "driver python"
        if pid == self.nsqd_pid:
            return "nsqd"
        cmd = _cmdline(pid)
        if FORK_SERVER in cmd:
            # the fork server's children keep its command line; their name says what they run
            return FORKED.get(_comm(pid), "fork server")
        for name, needles in GROUPS:
            if any(n in cmd for n in needles):
                return name
        return "other"

    def sample(self) -> None:
        parents: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            f = _stat_fields(name)
            if f is None:
                continue
            parents[int(name)] = int(f[1])
            cpu[int(name)] = (int(f[11]) + int(f[12])) / _TCK
        mine = {self.me} | ({self.nsqd_pid} if self.nsqd_pid else set())
        todo = [self.me]
        children: dict[int, list[int]] = {}
        for pid, ppid in parents.items():
            children.setdefault(ppid, []).append(pid)
        while todo:
            for c in children.get(todo.pop(), ()):
                mine.add(c)
                todo.append(c)
        for pid in mine:
            if pid not in cpu:
                continue
            if pid not in self.group:
                # a process born after the start counts from 0
                self.first[pid] = cpu[pid] if self._thread is None else 0.0
            # again at every sample: a new process shows its parent's command line until it
            # execs (the JVM's children looked like the JVM); a process that is gone keeps
            # what it was
            group = self._classify(pid)
            if group != "other" or pid not in self.group:
                self.group[pid] = group
            self.last[pid] = cpu[pid]

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> CpuSampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self.sample()

    def processes(self) -> list[tuple[str, float, str]]:
        """(group, CPU seconds, command line) of every process seen, busiest first."""
        rows = [
            (g, round(self.last[p] - self.first[p], 2), _cmdline(p)[:160] or f"pid {p}")
            for p, g in self.group.items()
        ]
        return sorted(rows, key=lambda r: -r[1])

    def by_group(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, g in self.group.items():
            out[g] = out.get(g, 0.0) + self.last[pid] - self.first[pid]
        return out


def per_million(cpu: dict[str, float], rows: int) -> dict[str, float]:
    """CPU seconds per 1M rows, per group, plus ``total`` and ``source`` (SOURCE_GROUPS)."""
    scale = 1_000_000 / max(rows, 1)
    out = {g: round(v * scale, 2) for g, v in sorted(cpu.items())}
    out["source"] = round(sum(cpu.get(g, 0.0) for g in SOURCE_GROUPS) * scale, 2)
    out["total"] = round(sum(cpu.values()) * scale, 2)
    return out


class Load:
    """The load average and the host's steal share over a measurement."""

    def __enter__(self) -> Load:
        self.steal0 = steal_ticks()
        return self

    def __exit__(self, *exc: object) -> None:
        steal1 = steal_ticks()
        self.steal = None
        if self.steal0 is not None and steal1 is not None and steal1[1] > self.steal0[1]:
            self.steal = round(100 * (steal1[0] - self.steal0[0]) / (steal1[1] - self.steal0[1]), 1)
        self.loadavg = [round(x, 2) for x in os.getloadavg()]


# --- the runs -------------------------------------------------------------------------------------


def run_runtime(nsqd: Daemon, topic: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The source's I/O threads without Spark (what a streaming query's runner does before
    Spark reads a chunk): availableNow over the pre-published topic, until every message is
    in the spool and FIN'd."""
    from nsqpy.spark.consumer import Runtime
    from nsqpy.spark.source import SourceOptions

    opts = SourceOptions.parse(
        {
            "topic": topic,
            "nsqdTcpAddresses": nsqd.tcp,
            "nsqdHttpAddresses": nsqd.http,
            "spoolPath": str(work / "runtime-spool"),
            "maxRecordsPerBatch": str(args.max_records_per_batch),
            "maxSpoolRows": str(2 * args.count + 1_000_000),
            **conn_options(args, nsqd),
        }
    )
    with Load() as load, CpuSampler(nsqd.proc.pid if nsqd.proc else None) as cpu:
        own0 = time.process_time()
        t0 = time.perf_counter()
        rt = Runtime(opts, 0, available_now=True)
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
    return {
        "pipeline": "runtime",
        "rows": rows,
        "parquet_rows": rows,
        "distinct_ids": rows,
        "chunks": chunks,
        "seconds": round(wall, 2),
        "rows_per_s": round(rows / wall),
        "cpu_s": round(sum(cpu.by_group().values()), 1),
        # the source's threads alone (this process: decoding, spooling, FIN)
        "source_cpu_s": round(own, 2),
        "cpu_per_1m": per_million(cpu.by_group(), rows),
        "steal_pct": load.steal,
        "loadavg": load.loadavg,
    }


def _archive_opts(topic: str, out: Path, work: Path, args: argparse.Namespace, nsqd: Daemon) -> Any:
    from nsqpy.spark.jobs.options import parse_args, validate

    opts = parse_args(
        [
            "archive",
            f"--topic={topic}",
            f"--nsqd-tcp-address={nsqd.tcp}",
            f"--output-dir={out}",
            f"--checkpoint-dir={work / 'checkpoint'}",
            f"--spool-dir={work / 'spool'}",
            f"--max-records-per-batch={args.max_records_per_batch}",
            "--available-now",
            *consumer_opts(args, nsqd),
        ]
    )
    validate(opts)
    return opts


def _rate_frame(spark: Any, topic: str, args: argparse.Namespace) -> Any:
    """Spark's rate-micro-batch source as rows of the ``nsq`` source's schema: the same ids
    (16 hex digits) and bodies (a 12-digit number padded to --size bytes)."""
    from pyspark.sql import functions as F

    rate = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", str(args.max_records_per_batch))
        .option("numPartitions", str(args.num_partitions))
        .load()
    )
    return rate.select(
        F.lpad(F.hex("value"), 16, "0").alias("id"),
        F.col("timestamp"),
        F.lit(1).alias("attempts"),
        F.rpad(F.lpad(F.col("value").cast("string"), 12, "0"), args.size, "x").cast("binary").alias("body"),
        F.lit(topic).alias("topic"),
        F.lit("nsq_spark").alias("channel"),
        F.lit("rate").alias("nsqd_address"),
    )


def write_files(directory: Path, topic: str, count: int, size: int, rows_per_file: int) -> float:
    """``count`` rows of the source's schema as Parquet files of ``rows_per_file`` rows
    (pyarrow: no Spark, so the JVM stays cold); returns seconds."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    directory.mkdir(parents=True)
    now_us = int(time.time() * 1_000_000)
    for k, start in enumerate(range(0, count, rows_per_file)):
        rows = source_rows(range(start, min(start + rows_per_file, count)), size, topic, "files", now_us)
        pq.write_table(pa.Table.from_batches([rows]), directory / f"part-{k:05d}.parquet")
    return time.perf_counter() - t0


def _files_frame(spark: Any, directory: Path) -> Any:
    from nsqpy.spark import SOURCE_SCHEMA

    return spark.readStream.schema(SOURCE_SCHEMA).option("maxFilesPerTrigger", "1").parquet(str(directory))


def run_source(
    spark: Any,
    nsqd: Daemon,
    topic: str,
    work: Path,
    args: argparse.Namespace,
    source: str = "nsq",
    files_dir: Path | None = None,
) -> dict[str, Any]:
    """One query over ``source`` until --count rows: with ``--pipeline archive`` (and always
    for rate and files) through ``nsq_spark archive``'s own query (date/hour partitions,
    per-batch file commit), with ``--pipeline parquet`` through Spark's file sink; ``--pipeline
    noop`` writes nothing."""
    jit = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getCompilationMXBean()
    jit0 = jit.getTotalCompilationTime()
    work.mkdir(parents=True, exist_ok=True)
    with Load() as load, CpuSampler(nsqd.proc.pid if nsqd.proc else None) as cpu:
        t0_wall = time.time()
        if source == "nsq" and args.pipeline != "archive":
            out, query = _run_spark_sink(spark, nsqd, topic, work, args)
        else:
            out, query = _run_archive(spark, nsqd, topic, work, args, source, files_dir)
    jit1 = jit.getTotalCompilationTime()
    progress = query.recentProgress
    batches = [p for p in progress if p["numInputRows"]]
    # query start -> first trigger: loading the source (Python planner), Spark starting the
    # source's Python runner (a new process per query, warm or cold), the first offset calls
    startup = _iso_seconds(progress[0]["timestamp"]) - t0_wall if progress else None
    rows = sum(p["numInputRows"] for p in batches)
    # the rates count the batches up to the one that reached --count: an endless source
    # (rate) runs a batch or more past it before the stop lands, and those batches, warm
    # and after the fixed costs, would flatter its overall rate
    timed: list[dict[str, Any]] = []
    for p in batches:
        timed.append(p)
        if sum(b["numInputRows"] for b in timed) >= args.count:
            break
    timed_rows = sum(p["numInputRows"] for p in timed)
    ends = [_iso_seconds(p["timestamp"]) + p["durationMs"]["triggerExecution"] / 1000 for p in timed]
    wall = (max(ends) - t0_wall) if ends else 0.0
    later = timed[1:]
    steady_rows = sum(p["numInputRows"] for p in later)
    steady_s = sum(p["durationMs"]["triggerExecution"] for p in later) / 1000
    # where the steady batches' time went, per phase of a trigger (ms, summed)
    steady_ms: dict[str, int] = {}
    for p in later:
        for phase, ms in p["durationMs"].items():
            steady_ms[phase] = steady_ms.get(phase, 0) + int(ms)
    if out is None:  # noop: the source's own row count (no duplicates check possible)
        total = distinct = rows
    else:
        written = spark.read.parquet(str(out))
        total = written.count()
        distinct = written.select("id").distinct().count()
    groups = cpu.by_group()
    if args.processes:
        for g, secs, cmd in cpu.processes():
            print(f"#   {g:<14} {secs:7.2f} CPU-s  {cmd}", flush=True)
    return {
        "source": source,
        "pipeline": args.pipeline if source == "nsq" else "archive",
        "rows": rows,
        "parquet_rows": total,
        "distinct_ids": distinct,
        "batches": len(batches),
        "seconds": round(wall, 2),
        "timed_rows": timed_rows,
        "rows_per_s": round(timed_rows / wall) if wall else None,
        "steady_rows_per_s": round(steady_rows / steady_s) if steady_s else None,
        "startup_s": round(startup, 2) if startup is not None else None,
        "first_batch_rows": batches[0]["numInputRows"] if batches else None,
        "first_batch_s": round(batches[0]["durationMs"]["triggerExecution"] / 1000, 2) if batches else None,
        "first_batch_ms": batches[0]["durationMs"] if batches else None,
        "steady_ms": steady_ms,
        "batch_rows": [p["numInputRows"] for p in batches],
        "batch_s": [round(p["durationMs"]["triggerExecution"] / 1000, 2) for p in batches],
        # all processes' CPU over the query, and per 1M rows per group
        "cpu_s": round(sum(groups.values()), 1),
        "cpu_per_1m": per_million(groups, rows),
        # the JVM's JIT compiler threads' time over the query (a cold JVM compiles a lot)
        "jit_s": round((jit1 - jit0) / 1000, 1),
        # the share of the machine's CPU time the hypervisor gave to others (vmstat's st)
        "steal_pct": load.steal,
        "loadavg": load.loadavg,
        "max_records_per_batch": args.max_records_per_batch,
    }


def _run_archive(
    spark: Any,
    nsqd: Daemon,
    topic: str,
    work: Path,
    args: argparse.Namespace,
    source: str,
    files_dir: Path | None,
) -> tuple[Path, Any]:
    from nsqpy.spark.jobs import runner

    out = work / "archive"
    opts = _archive_opts(topic, out, work, args, nsqd)
    totals = runner.Totals()
    stop = runner.Stop()
    frame = None
    if source == "rate":
        frame = _rate_frame(spark, topic, args)
        opts.available_now = False  # an endless source: stopped once --count rows are in

        def watch() -> None:
            while not stop.requested and totals.rows_in < args.count:
                time.sleep(0.01)
            stop.requested = True

        threading.Thread(target=watch, daemon=True).start()
    elif source == "files":
        assert files_dir is not None
        frame = _files_frame(spark, files_dir)
    rc = runner.run_query(spark, opts, stop, totals, frame)
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
    q = w.option("checkpointLocation", str(work / "checkpoint")).trigger(availableNow=True).start()
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
    (
        df.write.format("nsq")
        .option("topic", topic)
        .option("nsqdTcpAddresses", nsqd.tcp)
        .options(**conn)
        .mode("append")
        .save()
    )
    wall = time.perf_counter() - t0
    published = int(topic_stats(nsqd, topic).get("message_count", 0))
    return {
        "rows": args.count,
        "published": published,
        "seconds": round(wall, 2),
        "rows_per_s": round(args.count / wall),
    }


def run_copies(nsqd: Daemon, topic: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """--copies N: N copies of ``nsq_spark archive --available-now`` (console script: each its
    own Spark application, checkpoint and spool, ``local[2]`` unless --master) on one channel,
    writing into one output directory; rows/s from the first start to the last exit."""
    import pyarrow.dataset as ds

    out = work / "archive"
    script = Path(sys.executable).with_name("nsq_spark")
    procs = []
    with Load() as load, CpuSampler(nsqd.proc.pid if nsqd.proc else None) as cpu:
        t0 = time.perf_counter()
        for k in range(args.copies):
            log = open(work / f"copy-{k}.log", "w")
            procs.append(
                subprocess.Popen(
                    [
                        str(script),
                        "archive",
                        f"--topic={topic}",
                        f"--nsqd-tcp-address={nsqd.tcp}",
                        f"--output-dir={out}",
                        f"--checkpoint-dir={work / f'ck{k}'}",
                        f"--max-records-per-batch={args.max_records_per_batch}",
                        "--available-now",
                        f"--master={args.master}",
                        *consumer_opts(args, nsqd),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        codes = [p.wait() for p in procs]
        wall = time.perf_counter() - t0
    if any(codes):
        raise RuntimeError(f"copies exited {codes}: see {work}/copy-*.log")
    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(columns=["id"])
    shares = []
    for k in range(args.copies):
        text = (work / f"copy-{k}.log").read_text()
        m = [line for line in text.splitlines() if "nsq_spark archive: rows in" in line]
        shares.append(int(m[-1].split("rows in ")[1].split(",")[0]) if m else 0)
    return {
        "copies": args.copies,
        "rows": table.num_rows,
        "parquet_rows": table.num_rows,
        "distinct_ids": len(set(table.column("id").to_pylist())),
        "shares": shares,
        "seconds": round(wall, 2),
        "rows_per_s": round(table.num_rows / wall),
        "cpu_per_1m": per_million(cpu.by_group(), table.num_rows),
        "loadavg": load.loadavg,
        "steal_pct": load.steal,
    }


def describe(label: str, src: dict[str, Any]) -> str:
    cpu = src["cpu_per_1m"]
    groups = ", ".join(f"{g} {v}" for g, v in cpu.items() if g not in ("total", "source"))
    return (
        f"[{label}] {src['timed_rows']} rows in {src['seconds']}s ({src['batches']} batches"
        + (f", {src['rows']} rows read in all" if src["rows"] != src["timed_rows"] else "")
        + "): "
        f"{src['rows_per_s']} rows/s overall, {src['steady_rows_per_s']} rows/s steady "
        f"(startup {src['startup_s']}s, first batch {src['first_batch_rows']} rows in "
        f"{src['first_batch_s']}s; CPU-s per 1M rows: {groups}; the source's own {cpu['source']}, "
        f"all {cpu['total']}; JIT compiling {src['jit_s']}s; load {src['loadavg']}, "
        f"host steal {src['steal_pct']}%)"
    )


def check(src: dict[str, Any], count: int, failures: list[str], label: str) -> None:
    if src["rows"] < count or src["parquet_rows"] != src["rows"]:
        failures.append(
            f"{label}: {src['parquet_rows']} rows written of {src['rows']} read, expected {count}"
        )
    if src["distinct_ids"] != src["parquet_rows"]:
        failures.append(f"{label}: {src['parquet_rows'] - src['distinct_ids']} duplicate rows")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=1_000_000, help="messages (default 1000000)")
    ap.add_argument("--size", type=int, default=100, help="message size in bytes (default 100)")
    ap.add_argument("--smoke", action="store_true", help="a small run (--count 20000) for CI")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument(
        "--source",
        choices=(*SOURCES, "all"),
        default="nsq",
        help="nsq (default), Spark's rate or files source into the same archive query, "
        "or all three (each cold and warm in a JVM of its own) with their ratios",
    )
    ap.add_argument(
        "--pipeline",
        choices=("archive", "parquet", "noop", "runtime"),
        default="archive",
        help="for --source nsq: archive: nsq_spark archive's query (default); parquet: "
        "Spark's file sink; noop: Spark's noop sink; runtime: the source's I/O threads "
        "alone, no Spark",
    )
    ap.add_argument(
        "--prefill",
        action="store_true",
        help="put the messages in the spool as chunk files instead of publishing them",
    )
    ap.add_argument(
        "--prefill-chunk-rows",
        type=int,
        default=1250,
        help="rows per prefilled chunk (default 1250: what the source cuts at a 2500 window)",
    )
    ap.add_argument(
        "--max-records-per-batch",
        type=int,
        default=100_000,
        help="rows per micro-batch: the nsq source's maxRecordsPerBatch, the rate "
        "source's rowsPerBatch, the files' rows per file (default 100000)",
    )
    ap.add_argument(
        "--num-partitions",
        type=int,
        default=2,
        help="source numPartitions (--pipeline parquet, rate) / sink tasks",
    )
    ap.add_argument("--nsqd-bin", default=default_nsqd_bin())
    ap.add_argument(
        "--warmup",
        action="store_true",
        help="run an untimed 10k-row query of the same source first (a warm session)",
    )
    ap.add_argument(
        "--warm",
        action="store_true",
        help="after the (cold) query, run the same again in the same session and report both",
    )
    ap.add_argument("--skip-sink", action="store_true")
    ap.add_argument("--skip-source", action="store_true")
    ap.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration for the session (repeatable)",
    )
    ap.add_argument(
        "--tls",
        action="store_true",
        help="TLS on every connection (a throwaway CA; nsqd gets its certificate)",
    )
    ap.add_argument("--snappy", action="store_true", help="snappy compression on every connection")
    ap.add_argument("--deflate", action="store_true", help="deflate compression on every connection")
    ap.add_argument("--deflate-level", type=int, default=6, help="deflate level in [1,9] (6)")
    ap.add_argument(
        "--copies",
        type=int,
        default=0,
        help="scale-out: run N copies of `nsq_spark archive --available-now` (each its own "
        "application, checkpoint and spool) on one channel into one output; rows/s from "
        "the first start to the last exit, JVM starts included",
    )
    ap.add_argument(
        "--processes",
        action="store_true",
        help="list every process of a query with its group and CPU seconds",
    )
    ap.add_argument("--json", action="store_true", help="print the results as one JSON line too")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.smoke:
        args.count = min(args.count, 20_000)
    if args.size < 13:
        ap.error("--size must be >= 13 (bodies carry a 12-digit sequence number)")
    if args.snappy and args.deflate:
        ap.error("use --snappy or --deflate not both")
    if args.pipeline == "runtime" and args.prefill:
        ap.error("--pipeline runtime reads from nsqd: not with --prefill")
    if args.source != "nsq" and (args.prefill or args.pipeline != "archive"):
        ap.error("--prefill and --pipeline are for --source nsq")
    if args.source == "rate" and args.count % args.max_records_per_batch:
        ap.error("--source rate: --count must be a multiple of --max-records-per-batch")
    if args.copies and (args.source != "nsq" or args.prefill or args.warm or args.pipeline != "archive"):
        ap.error("--copies runs the nsq archive job: not with --source, --prefill, --warm, --pipeline")
    if args.copies:
        args.skip_sink = True
    if args.source == "all":
        return compare(args, argv if argv is not None else sys.argv[1:])

    work = Path(tempfile.mkdtemp(prefix="bench_spark-"))
    nsqd = Daemon(
        argparse.Namespace(
            nsqd_bin=args.nsqd_bin,
            data_path=None,
            mem_queue_size=3 * args.count + 30_000,
            nsqd_arg=[],
            startup_timeout=20.0,
            stop_timeout=10.0,
            tls=args.tls,
            deflate=args.deflate,
            deflate_level=args.deflate_level,
        ),
        work,
    )
    nsqd.start()
    results: dict[str, Any] = {
        "count": args.count,
        "size": args.size,
        "master": args.master,
        "tls": args.tls,
        "snappy": args.snappy,
        "deflate": args.deflate,
    }
    failures: list[str] = []
    try:
        runs = ["cold", "warm"] if args.warm else ["cold"]
        source = args.source
        conn = conn_options(args, nsqd)
        if not args.skip_source:
            # everything the queries read is ready before the session starts (the JVM stays cold)
            t0 = time.perf_counter()
            for run in runs:
                topic = f"bench_{run}"
                if source == "nsq" and args.prefill:
                    prefill(work / run / "spool", topic, args.count, args.size, args.prefill_chunk_rows)
                elif source == "nsq":
                    secs = prepublish(nsqd, topic, args.count, args.size, conn)
                    results["prepublish_rows_per_s"] = round(args.count / secs)
                elif source == "files":
                    rows_per_file = args.max_records_per_batch
                    write_files(work / run / "input", topic, args.count, args.size, rows_per_file)
            if args.warmup and source in ("nsq", "files"):
                if source == "nsq":
                    prepublish(nsqd, "bench_warmup", 10_000, args.size, conn)
                else:
                    write_files(work / "warmup" / "input", "bench_warmup", 10_000, args.size, 10_000)
            what = {
                "nsq": "prefilled the spool with" if args.prefill else "pre-published",
                "files": "wrote Parquet files of",
                "rate": "nothing to prepare for",
            }[source]
            print(
                f"# {what} {len(runs)} x {args.count} x {args.size} B in {time.perf_counter() - t0:.1f}s",
                flush=True,
            )
        if args.copies:
            res = run_copies(nsqd, "bench_cold", work, args)
            results["copies"] = res
            print(
                f"[source nsq, {args.copies} archive copies on one channel] {res['rows']} rows in "
                f"{res['seconds']}s (JVM starts included): {res['rows_per_s']} rows/s; shares "
                f"{res['shares']}; CPU-s per 1M rows {res['cpu_per_1m']}; load {res['loadavg']}, "
                f"host steal {res['steal_pct']}%",
                flush=True,
            )
            if res["rows"] != args.count or res["distinct_ids"] != res["rows"]:
                failures.append(
                    f"copies: {res['rows']} rows, {res['distinct_ids']} distinct, expected {args.count}"
                )
            return _finish(args, results, failures, nsqd, work)
        runtime = not args.skip_source and source == "nsq" and args.pipeline == "runtime"
        if runtime:
            src = run_runtime(nsqd, "bench_cold", work, args)
            results["source"] = src
            print(
                f"[source, runtime (no Spark)] {src['rows']} rows in {src['seconds']}s "
                f"({src['chunks']} chunks): {src['rows_per_s']} rows/s "
                f"({src['source_cpu_s']} CPU-s in the source's threads, {src['cpu_s']} with nsqd; "
                f"load {src['loadavg']}, host steal {src['steal_pct']}%)",
                flush=True,
            )
            if src["rows"] != args.count:
                failures.append(f"source: {src['rows']} rows spooled, expected {args.count}")
            if args.skip_sink:
                return _finish(args, results, failures, nsqd, work)
        from nsqpy.spark.jobs.runner import SESSION_CONF
        from nsqpy.spark.session import make_session

        conf = dict(SESSION_CONF)
        conf["spark.sql.streaming.numRecentProgressUpdates"] = "10000"
        for item in args.conf:
            key, sep, value = item.partition("=")
            if not sep:
                ap.error(f"--conf wants KEY=VALUE, got {item!r}")
            conf[key] = value
        t0 = time.perf_counter()
        spark = make_session(args.master, app_name="bench_spark", conf=conf)
        results["session_s"] = round(time.perf_counter() - t0, 2)
        print(f"# SparkSession {args.master} in {results['session_s']}s", flush=True)
        if not args.skip_source and not runtime and args.warmup:
            warm_args = argparse.Namespace(**{**vars(args), "count": 10_000, "max_records_per_batch": 10_000})
            run_source(
                spark, nsqd, "bench_warmup", work / "warmup", warm_args, source, work / "warmup" / "input"
            )
            print("# warm-up query done (10000 rows, not timed)", flush=True)
        if not args.skip_source and not runtime:
            for run in runs:
                src = run_source(spark, nsqd, f"bench_{run}", work / run, args, source, work / run / "input")
                results["source" if run == "cold" else "source_warm"] = src
                kind = source + ("" if source != "nsq" else ", " + args.pipeline)
                kind += ", prefilled spool" if args.prefill else ""
                print(describe(f"source {kind}, {run}", src), flush=True)
                check(src, args.count, failures, f"source ({run})")
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


def _without(argv: list[str], flag: str) -> list[str]:
    """``argv`` less ``flag`` and its value (``--flag v`` or ``--flag=v``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            out.append(a)
    return out


def compare(args: argparse.Namespace, argv: list[str]) -> int:
    """Each source in a process of its own (a cold JVM), cold then warm; their ratios."""
    base = [a for a in _without(_without(argv, "--source"), "--json") if a not in ("--warm", "--skip-sink")]
    results: dict[str, Any] = {}
    failures: list[str] = []
    for source in SOURCES:
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            *base,
            f"--source={source}",
            "--warm",
            "--skip-sink",
            "--json",
        ]
        print(f"# {' '.join(cmd[1:])}", flush=True)
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        lines = r.stdout.splitlines()
        for line in lines:
            if line.startswith("[") or line.startswith("RESULT"):
                print(f"  {line}", flush=True)
        doc = next((json.loads(x) for x in reversed(lines) if x.startswith("{")), None)
        if r.returncode != 0 or doc is None:
            failures.append(f"--source {source} exited {r.returncode}")
            continue
        results[source] = doc
        failures += [f"{source}: {f}" for f in doc.get("failures", [])]
    table = []
    if "nsq" in results:
        nsq = results["nsq"]
        for other in ("rate", "files"):
            if other not in results:
                continue
            o = results[other]
            row: dict[str, Any] = {"vs": other}
            for run, key in (("cold", "source"), ("warm", "source_warm")):
                for metric in ("rows_per_s", "steady_rows_per_s"):
                    a, b = nsq[key].get(metric), o[key].get(metric)
                    row[f"{metric}_{run}"] = round(a / b, 2) if a and b else None
            table.append(row)
    print(
        "\n| source | overall rows/s cold / warm | steady rows/s cold / warm | first batch rows (s) cold "
        "| CPU-s per 1M rows cold: JVM, nsqd, runner, read workers, planners, driver; the source's own |"
    )
    print("|---|---|---|---|---|")
    for source, doc in results.items():
        c, w = doc["source"], doc["source_warm"]
        g = c["cpu_per_1m"]
        cpu = " / ".join(
            str(g.get(k, 0.0))
            for k in ("jvm", "nsqd", "source runner", "read workers", "planners", "driver python")
        )
        print(
            f"| {source} | {c['rows_per_s']} / {w['rows_per_s']} | {c['steady_rows_per_s']} / "
            f"{w['steady_rows_per_s']} | {c['first_batch_rows']} ({c['first_batch_s']}) | {cpu}; "
            f"{g['source']} |"
        )
    for row in table:
        print(
            f"nsq / {row['vs']}: overall {row['rows_per_s_cold']} cold, {row['rows_per_s_warm']} warm; "
            f"steady {row['steady_rows_per_s_cold']} cold, {row['steady_rows_per_s_warm']} warm"
        )
    print(f"load average {[round(x, 2) for x in os.getloadavg()]}")
    if args.json:
        print(json.dumps({"sources": results, "ratios": table, "failures": failures}))
    print("RESULT: " + ("OK" if not failures else "FAILED: " + "; ".join(failures)))
    return 1 if failures else 0


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
