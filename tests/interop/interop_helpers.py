"""Helpers for the interop tests: run a client driver subprocess, make test bodies.

pynsq (Tornado) and gnsq (gevent, which monkey-patches the standard library) run in their
own processes through the driver scripts next to this file, so neither touches the pytest
process; each driver run has a hard timeout and is killed by PID.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from e2e.proc import run_driver

HERE = Path(__file__).parent


def drive(driver: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run ``tests/interop/<driver>`` with ``spec`` on stdin; its JSON result."""
    res = run_driver(HERE / driver, json.dumps(spec), timeout)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    assert res.returncode == 0 and lines, (
        f"{driver} failed (exit {res.returncode})\n"
        f"--- stdout:\n{res.stdout[-4000:]}\n--- stderr:\n{res.stderr[-6000:]}"
    )
    out = json.loads(lines[-1])
    out["_stderr"] = res.stderr
    return out


def make_bodies(prefix: str, n: int, seed: int) -> list[bytes]:
    """``n`` distinct bodies: a readable unique prefix plus 0–63 random bytes (NUL, newline,
    0xff and friends included), so byte-exactness is checked, not just text."""
    rng = random.Random(seed)
    return [
        f"{prefix}-{i:05d}|".encode() + bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
        for i in range(n)
    ]
