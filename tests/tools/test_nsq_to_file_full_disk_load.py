"""``nsq_to_file`` (the console script) writing a steady stream to an output disk that fills
up mid-stream (a small tmpfs the test mounts), with small rotated files, plain and gzip.

The promise: it never FINishes a message it could not write. While the disk is full, the
number of messages nsqd counts as FINished never exceeds the distinct lines in the files
(a FIN follows the sync of its line, and a synced line is never cut back); the rest is
requeued and comes back. Once the space returns, every published message ends up in the
files exactly once, and the channel is empty.
"""

from __future__ import annotations

import hashlib
import signal
import threading
import time
import zlib
from pathlib import Path

import pytest
from e2e.proc import NsqdProcess, nsqd_fixture
from support import fill_disk, mounted_tmpfs
from tools_helpers import ToolProcess, channels, wait_until

pytestmark = pytest.mark.timeout(120)

TOTAL = 4000
FAST_RETRY = (
    "--consumer-opt=default_requeue_delay,50ms",
    "--consumer-opt=backoff_multiplier,50ms",
    "--consumer-opt=max_backoff_duration,200ms",
)


@pytest.fixture(scope="module")
def nsqd_proc(tmp_path_factory):
    yield from nsqd_fixture(tmp_path_factory.mktemp("nsq_to_file_load"))


def body(i: int) -> bytes:
    # 213 bytes, 128 of them hex digits of a hash: even gzipped, the rest of the 4000 lines
    # (~80 bytes each) cannot all fit in the 32 KiB left free, so the writes do fail
    return b"m%05d-" % i + hashlib.sha512(b"%d" % i).hexdigest().encode() + bytes(range(97, 123)) * 3


def content(out: Path, gz: bool) -> list[bytes]:
    """Every line of every file under ``out`` (gzip members decoded; a member or line still
    being written at this moment is left out)."""
    got: list[bytes] = []
    for f in sorted(out.rglob("*")):
        try:
            data = f.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            continue  # rotated and moved meanwhile
        if gz:
            text = b""
            while data:
                d = zlib.decompressobj(31)
                try:
                    part = d.decompress(data)
                except zlib.error:
                    break
                if not d.eof:
                    break
                text += part
                data = d.unused_data
            data = text
        got += data.split(b"\n")[:-1]
    return got


def channel(nsqd: NsqdProcess, topic: str) -> dict:
    return channels(nsqd, topic).get("nsq_to_file") or {}


def finished(c: dict) -> int:
    return sum(cl["finish_count"] for cl in c.get("clients") or [])


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_full_output_disk_under_load_fins_only_what_was_written(nsqd_proc, tmp_path, gz):
    topic = f"load_{'gz' if gz else 'plain'}"
    bodies = [body(i) for i in range(TOTAL)]
    with mounted_tmpfs(tmp_path / "disk", "2m") as disk:
        out = disk / "out"
        args = [
            f"--nsqd-tcp-address={nsqd_proc.tcp_address}", f"--topic={topic}", f"--output-dir={out}",
            "--datetime-format=%Y", "--rotate-size=65536", "--sync-interval=200ms", "--max-in-flight=100",
            *FAST_RETRY, *(["--gzip"] if gz else []),
        ]  # fmt: skip
        with ToolProcess("nsq_to_file", args, tmp_path / "logs") as p:
            wait_until(lambda: channel(nsqd_proc, topic).get("client_count"), what="the subscription")
            errors: list[BaseException] = []

            def publish() -> None:
                try:
                    for k in range(0, TOTAL, 50):
                        status, resp = nsqd_proc.http_post(
                            f"/mpub?topic={topic}", b"\n".join(bodies[k : k + 50])
                        )
                        assert status == 200, resp
                except BaseException as e:
                    errors.append(e)

            publisher = threading.Thread(target=publish)
            publisher.start()
            try:
                wait_until(
                    lambda: finished(channel(nsqd_proc, topic)) >= 300, what="the first messages FINished"
                )
                filler = fill_disk(disk, leave=32 * 1024)
                assert filler.exists()
                # while the disk stays full (until five rounds of writes failed, 100 messages requeued):
                # FINished <= distinct lines on disk, every time we look
                deadline = time.monotonic() + 40
                while (
                    (requeued := channel(nsqd_proc, topic).get("requeue_count", 0)) < 100
                    or p.stderr().count("messages not written, requeued") < 5
                ):  # fmt: skip
                    assert time.monotonic() < deadline, f"only {requeued} requeued\n{p.describe()}"
                    fin = finished(channel(nsqd_proc, topic))
                    lines = set(content(out, gz))
                    assert fin <= len(lines), f"{fin} FINished but only {len(lines)} lines written"
                    assert lines <= set(bodies)
                    time.sleep(0.05)
                assert "no space left on device" in p.stderr(), p.describe()
                stuck = finished(channel(nsqd_proc, topic))
                assert stuck < TOTAL
                filler.unlink()
            finally:
                publisher.join(60)
            assert not errors, errors
            wait_until(
                lambda: (
                    (c := channel(nsqd_proc, topic))
                    and c["message_count"] == TOTAL
                    and (c["depth"], c["in_flight_count"], c["deferred_count"]) == (0, 0, 0)
                ),
                60,
                what="everything FINished",
            )
            p.signal(signal.SIGTERM)
            assert p.wait(20) == 0, p.describe()
            assert "Traceback" not in p.stderr(), p.describe()
        got = content(out, gz)
    assert len(got) == len(set(got)), f"{len(got) - len(set(got))} duplicate lines"
    assert sorted(got) == bodies
