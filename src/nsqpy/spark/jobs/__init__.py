"""``nsq_spark``: the classic NSQ consumers as Spark Structured Streaming jobs.

``nsq_spark archive|aggregate|republish [flags]`` reads a topic through the ``nsq`` source
and

* ``archive`` writes it to Parquet under ``DIR/topic=<t>/date=<YYYY-MM-DD>/hour=<HH>/``
  (nsq_to_file on Spark);
* ``aggregate`` counts JSON events per group-by key and event-time tumbling window and writes
  the closed windows to Parquet and/or republishes them as JSON lines;
* ``republish`` copies the topic to another topic, optionally filtered and projected by
  nsq_to_nsq's JSON flags (nsq_to_nsq on Spark).

The parts: :mod:`.options` (each job's flags and options), :mod:`.transforms` (the
DataFrame transformations), :mod:`.output` (the per-batch output commit) and :mod:`.runner`
(the query, its batches and how it stops). This module is the command line.
"""

from __future__ import annotations

import logging
import sys

from nsqpy import daemon
from nsqpy.goflags import HelpRequested, OptionsError

from .options import PROGRAM, is_job, parse_args, usage, validate

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """The ``nsq_spark`` console script; returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    try:
        opts = parse_args(args)
    except HelpRequested as h:
        print(h.usage, file=sys.stderr, end="")
        return 0
    except OptionsError as e:
        job = args[0] if args and is_job(args[0]) else None
        print(f"{e}\n{usage(job)}", file=sys.stderr, end="")
        return 2
    if opts.version:
        print(daemon.version_string(PROGRAM))
        return 0
    try:
        validate(opts)
    except OptionsError as e:
        print(f"{PROGRAM}: {e}", file=sys.stderr)
        return 1
    daemon.setup_logging(f"[{PROGRAM}] ", opts.log_level)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        from .runner import run, short_error
    except ImportError as exc:
        if not (exc.name or "").startswith(("pyspark", "pyarrow", "py4j")):
            raise
        # --help and --version above work without them
        print(f"{PROGRAM}: the jobs need pyspark: pip install 'nsqpy[spark]' ({exc})", file=sys.stderr)
        return 1

    try:
        return run(opts)
    except Exception as exc:  # noqa: BLE001 - session start, source options…: one line, exit 1
        print(f"{PROGRAM}: {short_error(exc)}", file=sys.stderr)
        return 1
