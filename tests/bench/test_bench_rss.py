"""bench/bench_rss.py still works: our nsqd through every stage (a short idle), JSON out.

It makes no claim about the numbers (a benchmark, not a test, does that)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NSQD = Path(sys.executable).with_name("nsqd")


@pytest.mark.timeout(120)
def test_bench_rss_smoke() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bench_rss.py"),
            f"--daemon=ours={NSQD}",
            "--rounds=2",
            "--idle=0.2",
            "--settle=0.05",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["stages"] == ["start", "ping", "stats", "metrics", "clients", "idle", "peak"]
    assert doc["rounds"] == 2
    ours = doc["rss_mib"]["ours"]
    for stage in doc["stages"]:
        assert 1 < ours[stage]["min"] <= ours[stage]["median"] <= ours[stage]["max"]
    # the peak is the high-water mark of the whole run
    assert ours["peak"]["median"] >= ours["idle"]["median"]
    assert "VmRSS MiB" in proc.stdout and "\nours " in proc.stdout
