"""``nsq_spark`` as a service: how it stops and how it ends. The real console script against
real daemons; one run (one JVM start) per scenario.

* a SIGTERM to its whole process group (``timeout``, ``kill -- -PGID``, a supervisor) stops
  the query cleanly: exit 0, the summary line, no py4j noise, no JVM left behind;
* a query that fails prints no summary, its cause as the last line of stderr, exit 1;
* a topic that nsqlookupd does not know is reported (a bounded run then reads nothing).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from .conftest import publish, stats, wait_for

BATCH_LINE = re.compile(r"INFO: batch \d+: (\d+) in, ")

#: stderr of a clean run has none of these
NOISE = ("Traceback", "Py4J", "py4j", "Errno 111", "Connection refused", " ERROR ", "Exception in thread")


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process from /proc, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return fields[0], int(fields[1]), int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    """{pid: start time} of every process below ``root``."""
    parents: dict[int, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            parents.setdefault(st[1], []).append((int(name), st[2]))
    out: dict[int, int] = {}
    todo = [root]
    while todo:
        for pid, start in parents.get(todo.pop(), []):
            out[pid] = start
            todo.append(pid)
    return out


def _running(pid: int, start: int) -> bool:
    """Whether that process (same start time: not a reused pid) still runs (not a zombie)."""
    st = _stat(pid)
    return st is not None and st[2] == start and st[0] != "Z"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def jobs_script() -> str:
    from e2e.proc import script

    return script("nsq_spark")


def _describe(code: int | None, out: str, err: str) -> str:
    return f"exit {code}\n--- stdout:\n{out[-3000:]}\n--- stderr:\n{err[-8000:]}"


@pytest.mark.timeout(300)
def test_sigterm_to_the_process_group_stops_the_query_cleanly(
    lookupd_cluster, unique_topic: str, tmp_path: Path
) -> None:
    lookupd, nsqds = lookupd_cluster
    bodies = [f"message {i}".encode() for i in range(30)]
    publish(nsqds[0], unique_topic, bodies)
    wait_for(
        lambda: lookupd.http_get(f"/lookup?topic={unique_topic}")[0] == 200,
        what="nsqlookupd to know the topic",
    )
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        # a process group of its own, as a shell job or a service has: the test signals it whole
        proc = subprocess.Popen(
            [
                jobs_script(),
                "archive",
                f"--topic={unique_topic}",
                f"--lookupd-http-address={lookupd.http_address}",
                f"--output-dir={tmp_path / 'archive'}",
                f"--checkpoint-dir={tmp_path / 'ck'}",
                "--trigger-interval=200ms",
                "--master=local[2]",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    below: dict[int, int] = {}
    try:

        def rows_in() -> int:
            lines = err_path.read_text().splitlines()
            return sum(int(m[1]) for m in map(BATCH_LINE.search, lines) if m)

        wait_for(
            lambda: rows_in() >= len(bodies) or proc.poll() is not None,
            timeout=180,
            what="the job to archive every message",
        )
        assert proc.poll() is None, _describe(proc.poll(), out_path.read_text(), err_path.read_text())
        below = _descendants(proc.pid)
        jvms = [pid for pid in below if _comm(pid) == "java"]
        assert jvms, f"no JVM below nsq_spark: {[(p, _comm(p)) for p in below]}"
        os.killpg(proc.pid, signal.SIGTERM)  # the JVM is in that group only if nsqpy let it be
        code = proc.wait(90)
        out, err = out_path.read_text(), err_path.read_text()
        assert code == 0, _describe(code, out, err)
        assert f"nsq_spark archive: rows in {len(bodies)}, rows out {len(bodies)}, rejects 0" in out, (
            _describe(code, out, err)
        )
        noise = [line for line in err.splitlines() if any(n in line for n in NOISE)]
        assert not noise, _describe(code, out, err)
        # nsq_spark waited for its JVM: it is gone, and what it started goes with it
        for pid in jvms:
            assert not _running(pid, below[pid]), f"the JVM {pid} outlived nsq_spark"
        wait_for(
            lambda: not [p for p, s in below.items() if _running(p, s)],
            timeout=15,
            what=f"the processes nsq_spark started to exit: {below}",
        )
        ch = stats(nsqds[0], unique_topic, "nsq_spark")
        assert ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        for pid, start in below.items():
            if _running(pid, start):  # by pid, only the processes this test started
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(300)
def test_a_failed_query_ends_with_its_cause_and_no_summary(
    nsqd_server, unique_topic: str, tmp_path: Path
) -> None:
    publish(nsqd_server, unique_topic, [b"one", b"two"])
    (tmp_path / "a-file").write_text("not a directory")
    out_dir = tmp_path / "a-file" / "archive"  # cannot be created: its parent is a file
    r = subprocess.run(
        [
            jobs_script(),
            "archive",
            f"--topic={unique_topic}",
            f"--nsqd-tcp-address={nsqd_server.tcp_address}",
            f"--output-dir={out_dir}",
            f"--checkpoint-dir={tmp_path / 'ck'}",
            "--available-now",
            "--master=local[2]",
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 1, _describe(r.returncode, r.stdout, r.stderr)
    assert "nsq_spark archive:" not in r.stdout and "rows in" not in r.stdout, _describe(
        r.returncode, r.stdout, r.stderr
    )
    last = r.stderr.rstrip("\n").splitlines()[-1]
    cause = rf"ParentNotDirectoryException: .*{re.escape(str(tmp_path / 'a-file'))}"
    assert re.fullmatch(f"nsq_spark: query failed: {cause}", last), _describe(
        r.returncode, r.stdout, r.stderr
    )


@pytest.mark.timeout(300)
def test_available_now_on_a_topic_nsqlookupd_does_not_know_says_so(
    lookupd_cluster, unique_topic: str, tmp_path: Path
) -> None:
    lookupd, _ = lookupd_cluster
    assert lookupd.http_get(f"/lookup?topic={unique_topic}")[0] == 404
    r = subprocess.run(
        [
            jobs_script(),
            "archive",
            f"--topic={unique_topic}",
            f"--lookupd-http-address={lookupd.http_address}",
            f"--output-dir={tmp_path / 'archive'}",
            f"--checkpoint-dir={tmp_path / 'ck'}",
            "--available-now",
            "--master=local[2]",
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    # like Go's tools, an unknown topic is not an error (it may not have been created yet):
    # the bounded run reads nothing, says why, and succeeds
    assert r.returncode == 0, _describe(r.returncode, r.stdout, r.stderr)
    assert (
        f"nsq source: nsqlookupd {lookupd.http_address} knows no producer of topic '{unique_topic}' "
        f"({lookupd.http_address}: TOPIC_NOT_FOUND): nothing to read"
    ) in r.stderr.splitlines(), _describe(r.returncode, r.stdout, r.stderr)
    assert "nsq_spark archive: rows in 0, rows out 0" in r.stdout, _describe(r.returncode, r.stdout, r.stderr)
