"""Running a job: the streaming query over the ``nsq`` source, its per-batch work, and how
it stops.

:func:`run` starts a session (:mod:`nsqpy.spark.session`), claims the checkpoint
(:mod:`.output`), builds the job's query (:func:`build_query`: the job's transformation from
:mod:`.transforms` and a foreachBatch that commits its output) and runs it to the end
(``--available-now``) or until SIGTERM/SIGINT, which stop it between two micro-batches
(:class:`BatchGate`). File outputs are exactly once per batch (:class:`.output.BatchFiles`);
NSQ outputs at least once.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter

from nsqpy.goflags import OptionsError
from nsqpy.spark import SOURCE_COLUMNS

from .options import (
    PROGRAM,
    AggregateOptions,
    ArchiveOptions,
    JobOptions,
    RepublishOptions,
    sink_options,
    source_options,
    uses_json,
)
from .output import BatchFiles, claim_checkpoint, remove_stale_temp_files
from .transforms import (
    ARCHIVE_PARQUET,
    EVENTS_METRIC,
    OUTCOME_FILTERED,
    OUTCOME_PASS,
    OUTCOME_REJECT,
    aggregate_frames,
    aggregate_json_lines,
    archive_frame,
    col,
    republish_frame,
)

__all__ = ["SESSION_CONF", "BatchGate", "Stop", "Totals", "build_query", "run", "run_query", "short_error"]

log = logging.getLogger("nsq_spark")


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
    query: StreamingQuery | None = None

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


def _publish(df: DataFrame, options: dict[str, str]) -> None:
    df.write.format("nsq").mode("append").options(**options).save()


def _counts_by(df: DataFrame, column: str) -> dict[object, int]:
    return {r[0]: int(r[1]) for r in df.groupBy(column).count().collect()}


#: A foreachBatch function: (the micro-batch, its id).
BatchFunction = Callable[[DataFrame, int], None]


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
        #: the running query's JVM object (set once it has started; py4j has no types)
        self.jquery: Any = None

    def wrap(self, spark: SparkSession, process: BatchFunction) -> BatchFunction:
        """``process`` (a foreachBatch function) behind the gate."""

        def gated(batch: DataFrame, batch_id: int) -> None:
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

    def _await_stop(self, spark: SparkSession) -> NoReturn:
        from py4j.protocol import Py4JJavaError

        jvm: Any = spark.sparkContext._jvm
        Thread = jvm.java.lang.Thread
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


class _BatchLog:
    """Adds each batch's counts to the run's :class:`Totals` and logs a line for it."""

    def __init__(self, opts: JobOptions, totals: Totals) -> None:
        self.opts = opts
        self.totals = totals
        self.lock = threading.Lock()

    def __call__(
        self, batch_id: int, rows_in: int | None, rows_out: int, filtered: int, rejects: int
    ) -> None:
        totals = self.totals
        with self.lock:
            totals.batches += 1
            totals.rows_in += rows_in or 0
            totals.rows_out += rows_out
            totals.filtered += filtered
            totals.rejects += rejects
        if rows_in or rows_out or rejects:
            msg = f"batch {batch_id}: " + (f"{rows_in} in, " if rows_in is not None else "")
            msg += f"{rows_out} out"
            if self.opts.job == "republish":
                msg += f", {filtered} filtered"
            msg += f", {rejects} rejected"
            if rejects:
                msg += f" (to {getattr(self.opts, 'reject_dir', '')})"
            log.info("%s", msg)


def _archive(
    opts: ArchiveOptions, source: DataFrame, files: BatchFiles, log_batch: _BatchLog
) -> tuple[DataFrame, BatchFunction]:
    """The archive's stream and batch function: Parquet partitioned by topic, date, hour."""
    from pyspark.sql import Observation

    def process(batch: DataFrame, batch_id: int) -> None:
        # one pass over the batch: the rows are counted while they are written
        seen = Observation(f"archive-{batch_id}")
        counted = batch.observe(seen, F.count(F.lit(1)).alias("rows"))
        files.write(counted, opts.output_dir, batch_id, ("topic", "date", "hour"), ARCHIVE_PARQUET)
        n = int(seen.get["rows"])
        log_batch(batch_id, n, n, 0, 0)

    return archive_frame(source), process


def _republish(
    opts: RepublishOptions, source: DataFrame, files: BatchFiles, log_batch: _BatchLog
) -> tuple[DataFrame, BatchFunction]:
    """The republish stream and batch function: rejects to Parquet, the rest to the topic."""
    frame = republish_frame(
        source, opts.require_json_field, opts.require_json_value, opts.whitelist_json_fields
    )
    json_mode = uses_json(opts)
    sink = sink_options(opts)

    def process(batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        try:
            counts = _counts_by(batch, "outcome") if json_mode else {OUTCOME_PASS: batch.count()}
            rejects = counts.get(OUTCOME_REJECT, 0)
            if rejects:
                bad = batch.where(F.col("outcome") == OUTCOME_REJECT).select(*SOURCE_COLUMNS, "error")
                files.write(bad.coalesce(1), opts.reject_dir, batch_id)
            passed = counts.get(OUTCOME_PASS, 0)
            if passed:
                out = batch.where(F.col("outcome") == OUTCOME_PASS).select(F.col("out_body").alias("body"))
                _publish(out, sink)
            log_batch(batch_id, sum(counts.values()), passed, counts.get(OUTCOME_FILTERED, 0), rejects)
        finally:
            batch.unpersist()

    return frame, process


def _aggregate(
    opts: AggregateOptions, source: DataFrame, files: BatchFiles, log_batch: _BatchLog
) -> tuple[DataFrame, BatchFunction]:
    """The aggregate stream and batch function: closed windows to Parquet and/or a topic,
    rejects to Parquet."""
    counts, rejects = aggregate_frames(
        source, opts.group_by, opts.window, opts.watermark, opts.time_field, observe=True
    )
    # one stream of (result, reject) rows: both outputs in one query over one checkpoint
    result = F.struct(*[col(c) for c in counts.columns])
    reject = F.struct(*[col(c) for c in rejects.columns])
    result_type = counts.select(result).schema[0].dataType
    reject_type = rejects.select(reject).schema[0].dataType
    frame = counts.select(result.alias("result"), F.lit(None).cast(reject_type).alias("reject"))
    frame = frame.unionByName(
        rejects.select(F.lit(None).cast(result_type).alias("result"), reject.alias("reject"))
    )
    totals = log_batch.totals

    def process(batch: DataFrame, batch_id: int) -> None:
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
            with log_batch.lock:
                totals.rows_in += n_rejects
                totals.absorb_progress()
        finally:
            batch.unpersist()

    return frame, process


def build_query(
    spark: SparkSession,
    opts: JobOptions,
    source: DataFrame,
    totals: Totals,
    files: BatchFiles,
    gate: BatchGate | None = None,
) -> DataStreamWriter:
    """The streaming writer (not started) of ``opts``'s job over the ``source`` DataFrame;
    with a ``gate``, its batches run behind it."""
    log_batch = _BatchLog(opts, totals)
    if isinstance(opts, ArchiveOptions):
        frame, process = _archive(opts, source, files, log_batch)
    elif isinstance(opts, RepublishOptions):
        frame, process = _republish(opts, source, files, log_batch)
    else:
        frame, process = _aggregate(opts, source, files, log_batch)
    writer = (
        frame.writeStream.queryName(f"nsq_spark_{opts.job}_{opts.topic}".replace("#", "_").replace(".", "_"))
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


class Stop:
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


def run(opts: JobOptions, stop: Stop | None = None) -> int:
    """Run a validated job to the end (``--available-now``) or until SIGTERM/SIGINT. Prints
    the summary line (stdout) when the query ended well, else only the cause (stderr), as
    the last line of the run: after the JVM has exited, so nothing of Spark's follows it.
    Returns the exit code."""
    stop = stop or Stop()
    stop.install()
    from nsqpy.spark.session import make_session, stop_jvm

    conf = dict(SESSION_CONF)  # the user's --spark-conf wins
    conf.update(kv.partition("=")[::2] for kv in opts.spark_conf)
    totals = Totals()
    failure: str | None = None
    try:
        # the JVM runs in a session of its own: a signal to this process's group (timeout,
        # kill -- -PGID, Ctrl-C) reaches this process only, which stops the query cleanly
        try:
            spark = make_session(
                opts.master,
                f"{PROGRAM} {opts.job} {opts.topic}",
                conf,
                log_level="info" if opts.log_level == "debug" else "warn",
            )
        except KeyboardInterrupt:  # SIGINT while the SparkContext's own handler was in place
            spark, stop.requested = None, True
        if spark is not None:
            try:
                stop.install()  # again: the SparkContext installs its own SIGINT handler
                failure = _run_stream(spark, opts, stop, totals)
            finally:
                try:
                    spark.stop()
                except Exception as exc:  # noqa: BLE001 - the JVM is gone (what failed the query, if any)
                    log.warning("stopping Spark: %s", short_error(exc))
    finally:
        stop_jvm()
    if failure is not None:
        print(f"{PROGRAM}: {failure}", file=sys.stderr, flush=True)
        return 1
    print(totals.summary(opts.job), flush=True)
    return 0


def run_query(
    spark: SparkSession,
    opts: JobOptions,
    stop: Stop,
    totals: Totals | None = None,
    source: DataFrame | None = None,
) -> int:
    """Run the job on an existing session: print the summary line, or the cause on stderr;
    returns the exit code. ``source``: a streaming DataFrame in the source schema to run the
    job over instead of the ``nsq`` source (the benchmark feeds Spark's own sources to the
    same write)."""
    totals = totals if totals is not None else Totals()
    failure = _run_stream(spark, opts, stop, totals, source)
    if failure is not None:
        print(f"{PROGRAM}: {failure}", file=sys.stderr, flush=True)
        return 1
    print(totals.summary(opts.job), flush=True)
    return 0


def _run_stream(
    spark: SparkSession, opts: JobOptions, stop: Stop, totals: Totals, source: DataFrame | None = None
) -> str | None:
    """Run the query until it ends or ``stop`` is requested; fills ``totals``. Returns why
    the job failed (one line), None when it did not."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # archive partitions are UTC dates
    files = BatchFiles(spark, "")
    try:
        files.run_id = claim_checkpoint(files, opts)
    except OptionsError as exc:
        return str(exc)
    if remove_stale_temp_files(files, opts.checkpoint_dir):
        log.info("removed the temporary files a stopped run left in the checkpoint's logs")
    log.info("checkpoint %s, spool %s", opts.checkpoint_dir, opts.spool_dir)
    if stop.requested:
        return None
    if source is None:
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


def _await_query(
    query: StreamingQuery, opts: JobOptions, stop: Stop, totals: Totals, gate: BatchGate
) -> str | None:
    while True:
        if stop.requested:
            log.info("signal received: stopping the query after its running batch")
            gate.close()
            _await_stoppable(query, stop, gate)
            query.stop()
            break
        try:
            if query.awaitTermination(0.5):  # type: ignore[arg-type]  # seconds, any number
                break
        except Exception as exc:  # noqa: BLE001 - StreamingQueryException and py4j errors
            if not stop.requested:
                return f"query failed: {short_error(exc)}"
            break
    if opts.job == "aggregate":
        totals.finish_progress()
    return None


def _await_stoppable(query: StreamingQuery, stop: Stop, gate: BatchGate) -> None:
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
_CAUSE_RE: Final = re.compile(r"^(?:: |Caused by: )?([A-Za-z_][\w.$]*(?:Error|Exception)): (.+)$", re.M)
_WRAPPERS: Final = ("PythonException", "Py4JException", "StreamingQueryException", "Py4JJavaError")


def short_error(exc: BaseException) -> str:
    """One line for a failure: the innermost ``SomeError: message`` carried in the (Spark,
    py4j, Python worker) exception text, else its first line."""
    text = str(exc).strip()
    causes = [m for m in _CAUSE_RE.finditer(text) if not m[1].endswith(_WRAPPERS)]
    if causes:
        return f"{causes[-1][1].rsplit('.', 1)[-1]}: {causes[-1][2].strip()}"[:2000]
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:2000]
