"""The archive job end to end at volume, and across a kill -9 of the whole Spark driver.

Real processes only: nsqd/nsqlookupd console scripts (the conftest fixtures) and the
``nsq_spark`` console script, which starts its own JVM and Python workers.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from e2e.proc import script

from .conftest import publish, stats, wait_for


def _run(*args: str, timeout: float = 400.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [script("nsq_spark"), *args, "--master=local[2]"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
    )


def _describe(r: subprocess.CompletedProcess[str]) -> str:
    return f"exit {r.returncode}\n--- stdout:\n{r.stdout[-3000:]}\n--- stderr:\n{r.stderr[-6000:]}"


def _archived(out: Path) -> list[tuple[bytes, str]]:
    import pyarrow.dataset as ds

    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(
        columns=["body", "nsqd_address"]
    )
    return list(zip(table.column("body").to_pylist(), table.column("nsqd_address").to_pylist(), strict=True))


def _visible_parquet(out: Path) -> bool:
    """A committed Parquet file (not one still under the job's ``_tmp``)."""
    return any(not any(part.startswith(("_", ".")) for part in p.relative_to(out).parts)
               for p in out.rglob("*.parquet"))


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (read from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


@pytest.mark.timeout(600)
def test_archive_100k_available_now(nsqd_server, unique_topic: str, tmp_path: Path) -> None:
    """100k messages published, one bounded archive run: every body in the Parquet, once."""
    n = 100_000
    bodies = [b"%08d " % i + b"x" * 91 for i in range(n)]  # 100 bytes, all distinct
    publish(nsqd_server, unique_topic, bodies)
    out = tmp_path / "archive"
    r = _run("archive", f"--topic={unique_topic}", f"--nsqd-tcp-address={nsqd_server.tcp_address}",
             f"--output-dir={out}", f"--checkpoint-dir={tmp_path / 'ck'}", "--max-in-flight=2500",
             "--available-now")
    assert r.returncode == 0, _describe(r)
    got = [b for b, _ in _archived(out)]
    assert len(got) == n and set(got) == set(bodies)
    ch = stats(nsqd_server, unique_topic, "nsq_spark")
    assert ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0


@pytest.mark.timeout(900)
def test_archive_kill_9_then_restart_loses_nothing(
    lookupd_cluster, unique_topic: str, tmp_path: Path
) -> None:
    """kill -9 of the driver (JVM, Python runner and workers included) at a random moment while
    messages flow; the same command with the same checkpoint and spool then drains the rest.
    Every body must be archived; duplicates at most one chunk per nsqd connection."""
    lookupd, nsqds = lookupd_cluster
    max_in_flight = 200  # spread over the 2 connections: a chunk holds at most a connection's RDY
    common = [
        "archive", f"--topic={unique_topic}", f"--lookupd-http-address={lookupd.http_address}",
        f"--output-dir={tmp_path / 'archive'}", f"--checkpoint-dir={tmp_path / 'ck'}",
        f"--spool-dir={tmp_path / 'spool'}", f"--max-in-flight={max_in_flight}",
        "--max-records-per-batch=2000",
    ]
    published: list[bytes] = []
    seq = iter(range(10**9))

    def batch(k: int) -> list[bytes]:
        return [b"%09d " % next(seq) + b"y" * 90 for _ in range(k)]

    for p in nsqds:  # a backlog on both nsqd, and the topic registered with lookupd
        bodies = batch(5000)
        publish(p, unique_topic, bodies)
        published += bodies
    def producers() -> int:
        status, body = lookupd.http_get(f"/lookup?topic={unique_topic}")
        return len(json.loads(body)["producers"]) if status == 200 else 0

    wait_for(lambda: producers() == 2, what="both nsqd in /lookup")

    stop = threading.Event()

    def keep_publishing() -> None:  # messages are still arriving when the driver dies
        i = 0
        while not stop.is_set():
            bodies = batch(100)
            publish(nsqds[i % 2], unique_topic, bodies)
            published.extend(bodies)
            i += 1
            time.sleep(0.05)

    log = open(tmp_path / "first-run.log", "w")
    proc = subprocess.Popen([script("nsq_spark"), *common, "--master=local[2]"],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    publisher = threading.Thread(target=keep_publishing, daemon=True)
    publisher.start()
    try:
        wait_for(lambda: _visible_parquet(tmp_path / "archive") or proc.poll() is not None,
                 timeout=240, what="the first archived batch")
        assert proc.poll() is None, (tmp_path / "first-run.log").read_text()[-6000:]
        time.sleep(random.uniform(0.0, 3.0))  # the random moment
        victims = _descendants(proc.pid)
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(30)
    finally:
        stop.set()
        publisher.join(30)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        log.close()
    assert len(victims) >= 3, f"expected the driver, its JVM and a Python runner: {victims}"
    before = len(_archived(tmp_path / "archive"))

    r = _run(*common, "--available-now")
    assert r.returncode == 0, _describe(r)
    rows = _archived(tmp_path / "archive")
    got = Counter(b for b, _ in rows)
    missing = set(published) - set(got)
    assert not missing, f"{len(missing)} of {len(published)} messages lost, e.g. {sorted(missing)[:3]}"
    assert set(got) == set(published)
    duplicates = sum(c - 1 for c in got.values())
    # one chunk per connection at most; a chunk never exceeds the connection's RDY
    print(f"published {len(published)}, archived {len(rows)} ({before} before the kill), "
          f"duplicates {duplicates}")
    assert duplicates <= max_in_flight, f"{duplicates} duplicates > one chunk per connection"
    per_conn = Counter(addr for b, addr in rows if got[b] > 1)
    assert len(per_conn) <= 2, per_conn
    for p in nsqds:
        ch = stats(p, unique_topic, "nsq_spark")
        assert ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0
