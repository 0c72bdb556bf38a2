"""The archive job end to end at volume, and across a kill -9 of the whole Spark driver.

Real processes only: nsqd/nsqlookupd console scripts (the conftest fixtures) and the
``nsq_spark`` console script, which starts its own JVM and Python workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
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
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _describe(r: subprocess.CompletedProcess[str]) -> str:
    return f"exit {r.returncode}\n--- stdout:\n{r.stdout[-3000:]}\n--- stderr:\n{r.stderr[-6000:]}"


def _archived(out: Path) -> list[tuple[bytes, str]]:
    import pyarrow.dataset as ds

    if not _visible_parquet(out):  # the job made the directory but committed no batch yet
        return []
    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(
        columns=["body", "nsqd_address"]
    )
    return list(zip(table.column("body").to_pylist(), table.column("nsqd_address").to_pylist(), strict=True))


def _visible_parquet(out: Path) -> bool:
    """A committed Parquet file (not one still under the job's ``_tmp``)."""
    return any(
        not any(part.startswith(("_", ".")) for part in p.relative_to(out).parts)
        for p in out.rglob("*.parquet")
    )


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
    r = _run(
        "archive",
        f"--topic={unique_topic}",
        f"--nsqd-tcp-address={nsqd_server.tcp_address}",
        f"--output-dir={out}",
        f"--checkpoint-dir={tmp_path / 'ck'}",
        "--max-in-flight=2500",
        "--available-now",
    )
    assert r.returncode == 0, _describe(r)
    got = [b for b, _ in _archived(out)]
    assert len(got) == n and set(got) == set(bodies)
    ch = stats(nsqd_server, unique_topic, "nsq_spark")
    assert ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0


def _kill_tree(pid: int) -> list[int]:
    """kill -9 of ``pid`` and every process below it, frozen first (SIGSTOP, repeated until
    no new child appears) so that none is spawned or orphaned while they are killed."""
    frozen: list[int] = []
    while True:
        fresh = [p for p in _descendants(pid) if p not in frozen]
        if not fresh:
            break
        for p in fresh:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)
        frozen += fresh
    for p in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    return frozen


#: How many times the streaming archive's driver is killed, and when: each kill waits until
#: that run has logged this many finished micro-batches (0: none, the kill comes during the
#: start-up, the subscription or the first spooling), then a random delay (seconds) that
#: lands it in the start-up, the spooling, or the next batch's planning, write or commit. Kills
#: are counted in batches rather than seconds so that a slow (shared) machine still has the
#: driver die mid-stream, not only before its first batch.
KILLS = 20
KILL_AFTER_BATCHES = (0,) * 8 + (1,) * 6 + (2,) * 6
KILL_DELAY_S = {0: (0.5, 9.0), 1: (0.0, 1.5), 2: (0.0, 1.5)}
BATCH_DONE = re.compile(rb"INFO: batch \d+: ")


@pytest.mark.timeout(900)
def test_archive_kill_9_at_20_moments_then_every_message_exactly_once(
    lookupd_cluster, unique_topic: str, tmp_path: Path
) -> None:
    """A streaming archive while messages keep arriving on two nsqd: its whole driver (the
    nsq_spark process, its JVM, the source's runner and the Python workers) dies by kill -9
    at 20 random moments, each time restarted at once with the same command, checkpoint and
    spool; then a bounded run drains the rest. The Parquet output must hold every published
    message exactly once: 0 lost, 0 duplicated."""
    lookupd, nsqds = lookupd_cluster
    seed = random.randrange(2**32)
    rnd = random.Random(seed)
    common = [
        "archive",
        f"--topic={unique_topic}",
        f"--lookupd-http-address={lookupd.http_address}",
        f"--output-dir={tmp_path / 'archive'}",
        f"--checkpoint-dir={tmp_path / 'ck'}",
        f"--spool-dir={tmp_path / 'spool'}",
        "--max-in-flight=200",
        "--max-records-per-batch=1000",
    ]
    published: list[bytes] = []
    seq = iter(range(10**9))

    def batch(k: int) -> list[bytes]:
        return [b"%09d " % next(seq) + b"y" * 90 for _ in range(k)]

    for p in nsqds:  # a backlog on both nsqd, and the topic registered with lookupd
        bodies = batch(2000)
        publish(p, unique_topic, bodies)
        published += bodies

    def producers() -> int:
        status, body = lookupd.http_get(f"/lookup?topic={unique_topic}")
        return len(json.loads(body)["producers"]) if status == 200 else 0

    wait_for(lambda: producers() == 2, what="both nsqd in /lookup")

    stop = threading.Event()

    def keep_publishing() -> None:  # messages are still arriving whenever the driver dies
        i = 0
        while not stop.wait(0.25):  # ~200 messages/s: the last run drains what the kills left
            bodies = batch(50)
            publish(nsqds[i % 2], unique_topic, bodies)
            published.extend(bodies)
            i += 1

    publisher = threading.Thread(target=keep_publishing, daemon=True)
    publisher.start()
    t0 = time.monotonic()
    moments: list[float] = []
    schedule = list(KILL_AFTER_BATCHES)
    rnd.shuffle(schedule)
    assert len(schedule) == KILLS
    try:
        for k, after in enumerate(schedule):
            run_log = tmp_path / f"run-{k}.log"
            with open(run_log, "w") as log:
                proc = subprocess.Popen(
                    [script("nsq_spark"), *common, "--master=local[2]"],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                try:
                    if after:

                        def batches_done(
                            log: Path = run_log, n: int = after, p: subprocess.Popen[bytes] = proc
                        ) -> bool:
                            return len(BATCH_DONE.findall(log.read_bytes())) >= n or p.poll() is not None

                        wait_for(batches_done, timeout=180, what=f"run {k}: {after} micro-batch(es) done")
                    delay = rnd.uniform(*KILL_DELAY_S[after])
                    deadline = time.monotonic() + delay
                    while time.monotonic() < deadline and proc.poll() is None:
                        time.sleep(0.02)
                    assert proc.poll() is None, run_log.read_text()[-6000:]
                    _kill_tree(proc.pid)
                    moments.append((after, round(delay, 1)))
                finally:
                    if proc.poll() is None:
                        _kill_tree(proc.pid)
                    proc.wait(30)
    finally:
        stop.set()
        publisher.join(30)
    killed_s = time.monotonic() - t0
    before = len(_archived(tmp_path / "archive")) if (tmp_path / "archive").exists() else 0

    r = _run(*common, "--available-now")
    assert r.returncode == 0, _describe(r)
    rows = _archived(tmp_path / "archive")
    got = Counter(b for b, _ in rows)
    recognised = sum(
        int(m.group(1)) for f in [*tmp_path.glob("run-*.log")] for m in _AGAIN_RE.finditer(f.read_text())
    ) + sum(int(m.group(1)) for m in _AGAIN_RE.finditer(r.stderr + r.stdout))
    print(
        f"seed {seed}: killed at (batches done, s after) {moments} ({killed_s:.0f} s in all); published "
        f"{len(published)}, archived {len(rows)} ({before} before the last run); "
        f"redeliveries recognised {recognised}"
    )
    missing = set(published) - set(got)
    assert not missing, f"{len(missing)} of {len(published)} messages lost, e.g. {sorted(missing)[:3]}"
    assert set(got) == set(published), "rows that were never published"
    duplicated = {b: c for b, c in got.items() if c > 1}
    assert not duplicated, (
        f"{len(duplicated)} messages archived more than once, e.g. {list(duplicated.items())[:3]}"
    )
    assert len(rows) == len(published)
    for p in nsqds:
        ch = stats(p, unique_topic, "nsq_spark")
        assert ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0


_AGAIN_RE = re.compile(r"delivered (\d+) message\(s\) already spooled again")


@pytest.mark.timeout(600)
def test_two_copies_of_the_archive_share_a_channel_and_an_output(
    nsqd_server, unique_topic: str, tmp_path: Path
) -> None:
    """Scale-out as NSQ does it: two copies of the same archive job (each its own Spark
    application, checkpoint and spool) consume one channel and write into one output
    directory; together they hold every message exactly once."""
    out = tmp_path / "archive"
    procs, logs = [], []
    for k in range(2):
        logs.append(tmp_path / f"copy-{k}.log")
        procs.append(
            subprocess.Popen(
                [
                    script("nsq_spark"),
                    "archive",
                    f"--topic={unique_topic}",
                    f"--nsqd-tcp-address={nsqd_server.tcp_address}",
                    f"--output-dir={out}",
                    f"--checkpoint-dir={tmp_path / f'ck{k}'}",
                    "--max-records-per-batch=5000",
                    "--master=local[1]",
                ],
                stdin=subprocess.DEVNULL,
                stdout=open(logs[-1], "w"),
                stderr=subprocess.STDOUT,
            )
        )
    published: list[bytes] = []
    try:

        def subscribed() -> bool:
            for p in procs:
                assert p.poll() is None, "\n".join(f.read_text()[-3000:] for f in logs)
            ch = stats(nsqd_server, unique_topic, "nsq_spark")
            return ch is not None and ch["client_count"] == 2

        wait_for(subscribed, timeout=240, what="both copies on the channel")
        for k in range(10):
            bodies = [b"%02d-%05d " % (k, i) + b"z" * 80 for i in range(2000)]
            publish(nsqd_server, unique_topic, bodies)
            published += bodies

        def archived() -> int:
            text = "".join(f.read_text() for f in logs)
            return sum(int(m[1]) for m in re.finditer(r"INFO: batch \d+: (\d+) in, ", text))

        wait_for(lambda: archived() >= len(published), timeout=240, what="every message archived")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = [p.wait(90) for p in procs]
    assert codes == [0, 0], "\n".join(f.read_text()[-3000:] for f in logs)
    shares = [int(re.search(r"rows in (\d+)", f.read_text())[1]) for f in logs]
    rows = _archived(out)
    got = Counter(b for b, _ in rows)
    print(f"copies archived {shares} of {len(published)}")
    assert set(got) == set(published) and len(rows) == len(published), (len(rows), len(published))
    assert all(shares) and sum(shares) == len(published), shares
    ch = stats(nsqd_server, unique_topic, "nsq_spark")
    assert ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0
