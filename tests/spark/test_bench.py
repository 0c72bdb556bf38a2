"""bench/bench_spark.py stays runnable: a smoke run of the archive pipeline and the sink."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_spark.py"


def run_bench(*args: str, timeout: int) -> tuple[subprocess.CompletedProcess[str], str]:
    """bench_spark.py with ``args``; fails unless it ends with ``RESULT: OK``. The run and
    its output (stdout + stderr)."""
    r = subprocess.run(
        [sys.executable, str(BENCH), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "RESULT: OK" in r.stdout, out[-4000:]
    return r, out


@pytest.mark.timeout(400)
def test_bench_spark_smoke() -> None:
    r, out = run_bench("--smoke", "--count", "5000", "--json", timeout=380)
    assert "[source nsq, archive, cold] 5000 rows" in r.stdout, out[-4000:]
    assert "[sink] 5000 rows" in r.stdout, out[-4000:]


@pytest.mark.timeout(400)
def test_bench_spark_prefilled_spool_into_noop() -> None:
    """--prefill puts the rows in the spool (nothing published); --pipeline noop writes nothing."""
    r, out = run_bench(
        "--count",
        "3000",
        "--prefill",
        "--prefill-chunk-rows",
        "700",
        "--pipeline",
        "noop",
        "--skip-sink",
        "--json",
        timeout=380,
    )
    assert "# prefilled the spool with 1 x 3000 x 100 B" in r.stdout, out[-4000:]
    assert "[source nsq, noop, prefilled spool, cold] 3000 rows" in r.stdout, out[-4000:]
    assert "pre-published" not in r.stdout and "[sink]" not in r.stdout, out[-4000:]


@pytest.mark.timeout(600)
def test_bench_spark_compares_the_nsq_source_with_sparks_own() -> None:
    """--source all: nsq, rate and files, each cold then warm in a JVM of its own, and the
    ratios nsq / rate and nsq / files; CPU per 1M rows per process group."""
    r, out = run_bench(
        "--source", "all", "--count", "10000", "--max-records-per-batch", "5000", "--json", timeout=580
    )
    for label in ("source nsq, archive", "source rate", "source files"):
        for run in ("cold", "warm"):
            assert f"[{label}, {run}]" in r.stdout, out[-4000:]
    assert "nsq / rate: overall " in r.stdout and "nsq / files: overall " in r.stdout, out[-4000:]
    doc = json.loads(next(x for x in reversed(r.stdout.splitlines()) if x.startswith("{")))
    nsq = doc["sources"]["nsq"]["source"]
    assert nsq["rows"] == 10000 and nsq["cpu_per_1m"]["jvm"] > 0, nsq
    assert {"source runner", "read workers", "planners"} <= set(nsq["cpu_per_1m"]), nsq["cpu_per_1m"]
    assert [row["vs"] for row in doc["ratios"]] == ["rate", "files"]


@pytest.mark.timeout(400)
def test_bench_spark_copies_share_the_channel() -> None:
    """--copies 2: two nsq_spark archive applications on one channel, one output, each row once."""
    r, out = run_bench("--copies", "2", "--count", "6000", "--json", timeout=380)
    assert "[source nsq, 2 archive copies on one channel] 6000 rows" in r.stdout, out[-4000:]
