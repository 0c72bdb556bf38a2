"""Output commit: a micro-batch's Parquet files under names that are the batch's own.

A batch is written to a hidden temporary directory, its earlier files (a re-run) are
deleted, and the new ones are renamed to ``part-<run>-<batch>-<n>.<ext>``: a batch that
runs again replaces its files, so a file output holds each batch exactly once. ``<run>`` is
the checkpoint's own id (``nsq_spark.json``), so several jobs (copies of one job scaled out
over a channel, each with its own checkpoint) write into one directory without a shared
metadata log and without two of them ever naming a file alike. Works on any Hadoop file
system (the JVM's ``FileSystem`` through py4j).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession

from nsqpy.goflags import OptionsError, format_duration

from .options import AggregateOptions, JobOptions

__all__ = ["BatchFiles", "checkpoint_identity", "claim_checkpoint", "remove_stale_temp_files"]

#: A JVM object through py4j (which has no types).
Java = Any

_TASK_SUFFIX: Final = re.compile(r"c\d+")


class BatchFiles:
    """Writes one micro-batch's Parquet files under a directory so that a re-run of the same
    batch replaces them: the batch is written to ``DIR/_tmp-<run>-<batch>`` (``_`` paths are hidden from
    Spark and pyarrow readers), its earlier files are deleted, and the new ones are renamed to
    ``part-<run>-<batch>-<n>.<ext>`` in place."""

    def __init__(self, spark: SparkSession, run_id: str) -> None:
        self.spark = spark
        self.run_id = run_id
        jvm = spark.sparkContext._jvm
        assert jvm is not None, "the SparkContext is stopped"
        self._jvm: Java = jvm
        # resolved once: py4j resolves a dotted JVM name one failed class lookup per
        # package level (each scanning the whole class path), milliseconds per use
        self._Path = self._jvm.org.apache.hadoop.fs.Path
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()

    def path(self, path: str) -> Java:
        """A Hadoop ``Path``."""
        return self._Path(path)

    def fs(self, path: Java) -> Java:
        """The Hadoop ``FileSystem`` of a ``Path``."""
        return path.getFileSystem(self._conf)

    def prefix(self, batch_id: int) -> str:
        return f"part-{self.run_id}-{batch_id:010d}-"

    def write(
        self,
        df: DataFrame,
        directory: str,
        batch_id: int,
        partition_by: Sequence[str] = (),
        options: dict[str, str] | None = None,
    ) -> int:
        """Write ``df`` as this batch's files under ``directory`` (Parquet writer ``options``);
        returns the file count."""
        base = self.path(directory)
        fs = self.fs(base)
        # a hidden directory of this batch's own (no parent shared with other jobs writing
        # into the same directory, which one of them could remove under another)
        tmp = self.path(f"{directory.rstrip('/')}/_tmp-{self.run_id}-{batch_id}")
        fs.delete(tmp, True)
        writer = df.write.mode("overwrite").options(**(options or {}))
        writer.partitionBy(*partition_by).parquet(tmp.toString())
        stars = "/".join("*" for _ in partition_by)
        pattern = f"{directory.rstrip('/')}/{stars + '/' if stars else ''}{self.prefix(batch_id)}*"
        for old in fs.globStatus(self.path(pattern)) or []:
            fs.delete(old.getPath(), False)
        tmp_str = fs.makeQualified(tmp).toString().rstrip("/")
        moved = 0
        for src in self._files_under(fs, tmp):
            name = src.getName()
            if name.startswith(("_", ".")):
                continue
            rel_dir = src.getParent().toString()[len(tmp_str) :].lstrip("/")
            dest_dir = self.path(f"{directory.rstrip('/')}/{rel_dir}" if rel_dir else directory)
            fs.mkdirs(dest_dir)
            ext = ".".join(p for p in name.split(".")[1:] if not _TASK_SUFFIX.fullmatch(p)) or "parquet"
            dest = self.path(f"{dest_dir.toString()}/{self.prefix(batch_id)}{moved:05d}.{ext}")
            if not fs.rename(src, dest):
                raise OSError(f"cannot move {src.toString()} to {dest.toString()}")
            moved += 1
        fs.delete(tmp, True)
        return moved

    @staticmethod
    def _files_under(fs: Java, path: Java) -> list[Java]:
        """Paths of the files below ``path``. (Not ``listFiles``: its located statuses load
        each file's permissions, which the local file system does by running ``ls -ld``.)"""
        files: list[Java] = []
        todo = [path]
        while todo:
            for status in fs.listStatus(todo.pop()):
                (todo if status.isDirectory() else files).append(status.getPath())
        return files

    def read_text(self, path: str) -> str | None:
        p = self.path(path)
        fs = self.fs(p)
        if not fs.exists(p):
            return None
        stream = fs.open(p)
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write_text(self, path: str, text: str) -> None:
        """Create ``path`` with ``text`` atomically (a temp file renamed into place: a driver
        killed meanwhile leaves no partial file)."""
        p = self.path(path)
        fs = self.fs(p)
        fs.mkdirs(p.getParent())
        tmp = self.path(f"{p.getParent().toString()}/_{p.getName()}.{uuid.uuid4().hex[:8]}.tmp")
        out = fs.create(tmp, True)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()
        if not fs.rename(tmp, p):
            fs.delete(tmp, False)
            raise OSError(f"cannot create {path}")


def checkpoint_identity(opts: JobOptions) -> dict[str, Any]:
    """What a checkpoint directory is for; a different job, topic, channel or aggregation
    cannot resume from it."""
    ident: dict[str, Any] = {"job": opts.job, "topic": opts.topic, "channel": opts.channel}
    if isinstance(opts, AggregateOptions):
        ident.update(
            group_by=list(opts.group_by), window=format_duration(opts.window), time_field=opts.time_field
        )
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


#: Spark's checkpoint logs that a write may leave a temporary file in when the driver dies
#: during it (``.<batch>.<uuid>.tmp`` and its ``.crc``).
_CHECKPOINT_LOGS: Final = ("offsets", "commits")


def remove_stale_temp_files(files: BatchFiles, checkpoint_dir: str) -> int:
    """Delete the temporary files a killed driver left in the checkpoint's offset and commit
    logs (Spark renames each log entry into place; a temp file is never one). Spark 4 refuses
    to start a query whose offset log holds any file before batch 0 is logged
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY). Only while no query runs on the checkpoint.
    Returns how many files went."""
    removed = 0
    for log_dir in _CHECKPOINT_LOGS:
        path = files.path(f"{checkpoint_dir.rstrip('/')}/{log_dir}")
        fs = files.fs(path)
        if not fs.exists(path):
            continue
        for status in fs.listStatus(path):
            name = status.getPath().getName()
            if name.startswith(".") and (name.endswith(".tmp") or name.endswith(".tmp.crc")):
                removed += bool(fs.delete(status.getPath(), False))
    return removed
