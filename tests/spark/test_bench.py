"""bench/bench_spark.py stays runnable: a smoke run of the archive pipeline and the sink."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_spark.py"


@pytest.mark.timeout(400)
def test_bench_spark_smoke() -> None:
    r = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--count", "5000", "--json"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=380,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "RESULT: OK" in r.stdout, out[-4000:]
    assert "[source, archive] 5000 rows" in r.stdout, out[-4000:]
    assert "[sink] 5000 rows" in r.stdout, out[-4000:]


@pytest.mark.timeout(400)
def test_bench_spark_prefilled_spool_into_noop() -> None:
    """--prefill puts the rows in the spool (nothing published); --pipeline noop writes nothing."""
    r = subprocess.run(
        [sys.executable, str(BENCH), "--count", "3000", "--prefill", "--prefill-chunk-rows", "700",
         "--pipeline", "noop", "--skip-sink", "--json"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=380,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "RESULT: OK" in r.stdout, out[-4000:]
    assert "# prefilled the spool with 3000 x 100 B" in r.stdout, out[-4000:]
    assert "[source, noop, prefilled spool] 3000 rows" in r.stdout, out[-4000:]
    assert "pre-published" not in r.stdout and "[sink]" not in r.stdout, out[-4000:]
