"""The README's client and tool examples, run as written against real nsqlookupd and nsqd
processes. Each example is the fenced block after a ``<!-- readme-example: NAME -->`` line;
the only change made to it is the addresses (the README's 127.0.0.1:4150 / :4161 become the
test daemons' ports, which the OS picks) and ``.venv/bin/`` (this Python's bin directory)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from e2e.proc import BIN_DIR, NsqdProcess, NsqlookupdProcess
from tools_helpers import ToolProcess, channels, message_count, wait_until

pytestmark = pytest.mark.timeout(90)

README = Path(__file__).resolve().parents[2] / "README.md"
EXAMPLE_RE = re.compile(
    r"<!-- readme-example: (?P<name>[\w-]+) -->\n```(?P<lang>\w+)\n(?P<code>.*?)```", re.S)


def examples() -> dict[str, str]:
    return {m["name"]: m["code"] for m in EXAMPLE_RE.finditer(README.read_text())}


def test_readme_has_the_examples():
    ex = examples()
    assert set(ex) >= {"producer", "consumer", "sync", "tools"}
    # short, and aimed at the node of `bash scripts/run.sh`
    for name in ("producer", "consumer", "sync"):
        assert len([ln for ln in ex[name].splitlines() if ln.strip()]) <= 8, name
    assert "127.0.0.1:4150" in ex["producer"] and "127.0.0.1:4161" in ex["consumer"]


@pytest.fixture
def cluster(tmp_path):
    lookupd = NsqlookupdProcess(tmp_path / "lookupd").start()
    nsqd = None
    try:
        nsqd = NsqdProcess(tmp_path / "nsqd", f"--lookupd-tcp-address={lookupd.tcp_address}",
                           "--broadcast-address=127.0.0.1").start()
        yield lookupd, nsqd
    finally:
        if nsqd is not None:
            assert nsqd.stop() == 0, nsqd.describe()
        assert lookupd.stop() == 0, lookupd.describe()


def test_readme_examples_run(cluster, tmp_path):
    lookupd, nsqd = cluster
    ex = examples()

    def localize(code: str) -> str:
        return (code.replace("127.0.0.1:4150", nsqd.tcp_address)
                .replace("127.0.0.1:4161", lookupd.http_address)
                .replace(".venv/bin/", f"{BIN_DIR}/"))

    def run_python(name: str) -> None:
        res = subprocess.run([sys.executable, "-c", localize(ex[name])], capture_output=True, text=True,
                             timeout=30)
        assert res.returncode == 0, f"{name}:\n{res.stdout}\n{res.stderr}"

    run_python("producer")
    assert message_count(nsqd, "test") == 1

    def registered() -> bool:
        status, body = lookupd.http_get("/lookup?topic=test")
        return status == 200 and bool(json.loads(body)["producers"])

    wait_until(registered, what="topic test in nsqlookupd")

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with ToolProcess("consumer", [], tmp_path, argv=[sys.executable, "-c", localize(ex["consumer"])],
                     env=env) as consumer:
        wait_until(lambda: consumer.stdout() == b"hello\n", what="the consumer to print hello")
        run_python("sync")
        wait_until(lambda: consumer.stdout() == b"hello\nhello from blocking code\n",
                   what="the consumer to print the sync message")
        wait_until(lambda: channels(nsqd, "test")["readme"]["in_flight_count"] == 0, what="FIN")
        consumer.signal(signal.SIGTERM)
        consumer.wait()

    tail_line, to_nsq_line = [ln for ln in ex["tools"].splitlines() if ln.strip()]
    with ToolProcess("nsq_tail", [], tmp_path, argv=["bash", "-c", "exec " + localize(tail_line)]) as tail:
        wait_until(lambda: any(c.endswith("#ephemeral") for c in channels(nsqd, "test")),
                   what="nsq_tail's channel")
        res = subprocess.run(["bash", "-c", localize(to_nsq_line)], capture_output=True, text=True,
                             timeout=30)
        assert res.returncode == 0, res.stderr
        assert tail.wait(30) == 0, tail.describe()
        assert tail.stdout() == b"one\ntwo\nthree\n"
