"""``nsq_to_file`` as a real console script against real ``nsqd``/``nsqlookupd`` processes.

The expected file names, lines and gzip members are derived from Go's rules
(``apps/nsq_to_file/file_logger.go``): the first message of a new file is synced at once,
later ones when the consumer is starved, --max-in-flight are waiting, on a tick, on SIGHUP
or at exit; a sync ends the gzip member; closing ends the current member (empty or not).
"""

from __future__ import annotations

import random
import re
import signal
import socket
import subprocess
import time
import zlib
from pathlib import Path

import pytest
from e2e.proc import NsqdProcess, lookupd_and_nsqd, nsqd_fixture
from support import fill_disk, mounted_tmpfs
from tools_helpers import ToolProcess, channels, free_port, publish_http, run_tool, wait_until

pytestmark = pytest.mark.timeout(90)

HOST = socket.gethostname()
SHORT = HOST.split(".")[0]
YEAR = time.strftime("%Y")


@pytest.fixture(scope="module")
def nsqd_proc(tmp_path_factory):
    yield from nsqd_fixture(tmp_path_factory.mktemp("nsq_to_file"))


def start(nsqd: NsqdProcess, tmp_path: Path, *args: str) -> ToolProcess:
    return ToolProcess("nsq_to_file", [f"--nsqd-tcp-address={nsqd.tcp_address}", *args], tmp_path / "logs")


def stop_ok(p: ToolProcess, sig: int = signal.SIGTERM) -> str:
    """Stop with ``sig``: exit 0, no traceback, the one-line summary; returns stderr."""
    p.signal(sig)
    assert p.wait(20) == 0, p.describe()
    err = p.stderr()
    assert "Traceback" not in err, err
    assert re.search(
        r"INFO: exiting: \d+ topics, \d+ messages written, \d+ requeued, \d+ files "
        r"written, \d+ rotations, \d+ errors",
        err,
    ), err
    return err


def chan(nsqd: NsqdProcess, topic: str, name: str = "nsq_to_file") -> dict:
    return channels(nsqd, topic).get(name) or {}


def finished(c: dict) -> int:
    return sum(cl["finish_count"] for cl in c.get("clients") or [])


def files(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` (relative path → bytes)."""
    if not d.exists():
        return {}
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}


def gzip_members(data: bytes) -> list[tuple[bytes, bytes]]:
    """(header, decompressed content) of each gzip member, in order."""
    out = []
    while data:
        d = zlib.decompressobj(31)
        content = d.decompress(data)
        assert d.eof, "truncated gzip member"
        out.append((data[:10], content))
        data = d.unused_data
    return out


def lines(*bodies: bytes) -> bytes:
    return b"".join(b + b"\n" for b in bodies)


# --- names, sync and FIN ------------------------------------------------------------------


def test_plain_file_default_name_fin_after_sync_and_sighup(nsqd_proc, tmp_path):
    topic = "plain"
    out = tmp_path / "out"
    publish_http(nsqd_proc, topic, b"one", b"two words", b"\xffbin")
    hours = {time.strftime("%Y-%m-%d_%H")}
    with start(nsqd_proc, tmp_path, f"--topic={topic}", f"--output-dir={out}", "--sync-interval=1h") as p:
        # no gzip, rotation or work dir: <REV> is dropped from the default name
        three = lines(b"one", b"two words", b"\xffbin")
        got = wait_until(
            lambda: (f := files(out)) and list(f.values()) == [three] and f, what="the three lines"
        )
        hours.add(time.strftime("%Y-%m-%d_%H"))
        (name,) = got
        assert name in {f"{topic}.{SHORT}.{h}.log" for h in hours}
        # Go's rule: the first message of a new file is synced (and FINished) at once; the
        # others wait for a sync (not starved, no tick within the hour)
        c = wait_until(
            lambda: (c := chan(nsqd_proc, topic)) and c["in_flight_count"] == 2 and c,
            what="two messages in flight",
        )
        assert finished(c) == 1
        assert c["clients"][0]["user_agent"].startswith("nsq_to_file/1.3.0 ")
        # SIGHUP: sync (FIN) and close; the next message opens the same name, appended to
        p.signal(signal.SIGHUP)
        wait_until(
            lambda: (c := chan(nsqd_proc, topic))["in_flight_count"] == 0 and finished(c) == 3,
            what="FIN after SIGHUP",
        )
        publish_http(nsqd_proc, topic, b"four")
        wait_until(
            lambda: files(out) == {name: lines(b"one", b"two words", b"\xffbin", b"four")},
            what="the fourth line appended",
        )
        err = stop_ok(p)
    assert f"INFO: [{topic}/nsq_to_file] opening {out}/{name}" in err
    assert f"INFO: [{topic}/nsq_to_file] syncing 1 records to disk" in err
    assert f"INFO: [{topic}/nsq_to_file] syncing 2 records to disk" in err
    assert "exiting: 1 topics, 4 messages written, 0 requeued" in err
    assert chan(nsqd_proc, topic)["in_flight_count"] == 0
    assert files(out) == {name: lines(b"one", b"two words", b"\xffbin", b"four")}


def go_gzip_rotation(bodies: list[bytes], rotate_size: int) -> tuple[list[list[bytes]], int]:
    """Go's files for ``bodies`` with --gzip --rotate-size and no other sync (not starved,
    no tick), then SIGTERM: each file as its list of members (the lines of each); and how
    many messages stay unsynced until the exit."""
    out: list[list[bytes]] = []
    member: list[bytes] | None = None
    size = 0
    for b in bodies:
        if member is None or size > rotate_size:
            if member is not None:
                out[-1].append(lines(*member))  # Close: the member being written
            out.append([lines(b)])  # the new file's first message, synced at once
            member, size = [], len(b) + 1
            continue
        member.append(b)
        size += len(b) + 1
    assert member is not None
    unsynced = len(member)
    if member:
        out[-1].append(lines(*member))  # SIGTERM: sync
    out[-1].append(b"")  # Close: the (empty) member started by that sync
    return [[m for m in f] for f in out], unsynced


def test_gzip_members_rotate_size_and_level(nsqd_proc, tmp_path):
    topic = "gzrot"
    out = tmp_path / "out"
    bodies = [b"m%02d-" % i + b"x" * (i % 7) for i in range(30)]
    publish_http(nsqd_proc, topic, *bodies)
    expected, unsynced = go_gzip_rotation(bodies, 40)
    assert len(expected) > 3
    with start(
        nsqd_proc,
        tmp_path,
        f"--topic={topic}",
        f"--output-dir={out}",
        "--gzip",
        "--gzip-level=1",
        "--rotate-size=40",
        "--datetime-format=%Y",
        "--sync-interval=1h",
    ) as p:
        wait_until(
            lambda: (
                (c := chan(nsqd_proc, topic))
                and c["depth"] == 0
                and c["in_flight_count"] == unsynced
                and finished(c) == len(bodies) - unsynced
            ),
            what="every message written, all but the last member's FINished",
        )
        err = stop_ok(p)
    got = files(out)
    names = [f"{topic}.{SHORT}-{rev:06d}.{YEAR}.log.gz" for rev in range(len(expected))]
    assert sorted(got) == names
    for name, members in zip(names, expected, strict=True):
        parsed = gzip_members(got[name])
        # Go's gzip header at level 1 (XFL 4, OS 255, no name, no mtime) on every member
        assert {h for h, _ in parsed} == {b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\xff"}
        assert [c for _, c in parsed] == members, name
    assert "currently 42 bytes (> 40), rotating..." in err or "bytes (> 40), rotating..." in err
    assert chan(nsqd_proc, topic)["in_flight_count"] == 0


def test_work_dir_move_and_revisions(nsqd_proc, tmp_path):
    topic = "moved"
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    rev = [f"{topic}.{SHORT}-{i:06d}.{YEAR}.log" for i in range(3)]
    (out / rev[0]).write_bytes(b"old\n")  # taken: nsq_to_file starts at rev 1
    with start(
        nsqd_proc,
        tmp_path,
        f"--topic={topic}",
        f"--output-dir={out}",
        f"--work-dir={work}",
        "--datetime-format=%Y",
        "--sync-interval=1h",
    ) as p:
        publish_http(nsqd_proc, topic, b"a", b"b")
        wait_until(lambda: files(work) == {rev[1]: b"a\nb\n"}, what="the file in the work dir")
        assert files(out) == {rev[0]: b"old\n"}
        (out / rev[1]).write_bytes(b"squatter\n")  # taken while writing: the move bumps to rev 2
        err = stop_ok(p)
    assert files(work) == {}
    assert files(out) == {rev[0]: b"old\n", rev[1]: b"squatter\n", rev[2]: b"a\nb\n"}
    assert f"WARN: [{topic}/nsq_to_file] output file already exists: {out}/{rev[0]}" in err
    assert f"moving finished file {work}/{rev[1]} to {out}/{rev[1]}" in err
    assert f"destination file already exists: {out}/{rev[1]}" in err
    assert f"renamed finished file {work}/{rev[1]} to {out}/{rev[2]} to avoid overwrite" in err


def test_filename_tokens_host_identifier_and_datetime_quirks(nsqd_proc, tmp_path):
    topic = "tokens"
    out = tmp_path / "out"
    publish_http(nsqd_proc, topic, b"x")
    with start(
        nsqd_proc,
        tmp_path,
        f"--topic={topic}",
        f"--output-dir={out}",
        "--filename-format=<TOPIC>/<HOST>_<PID>.<DATETIME>.txt",
        "--host-identifier=id-<SHORT_HOST>-<HOSTNAME>",
        "--datetime-format=%Y-%j",
        "--max-in-flight=1",
    ) as p:
        # %j is not in nsq_to_file's table: it stays literal
        name = f"{topic}/id-{SHORT}-{HOST}_{p.proc.pid}.{YEAR}-%j.txt"
        wait_until(lambda: files(out) == {name: b"x\n"}, what=name)
        stop_ok(p, signal.SIGINT)
    assert files(out) == {name: b"x\n"}


def test_rotate_interval_with_skip_empty_files(nsqd_proc, tmp_path):
    topic = "interval"
    out = tmp_path / "out"
    rev = [f"{topic}.{SHORT}-{i:06d}.{YEAR}.log" for i in range(3)]
    with start(
        nsqd_proc,
        tmp_path,
        f"--topic={topic}",
        f"--output-dir={out}",
        "--rotate-interval=1s",
        "--sync-interval=100ms",
        "--skip-empty-files",
        "--datetime-format=%Y",
    ) as p:
        wait_until(lambda: chan(nsqd_proc, topic).get("client_count"), what="the subscription")
        publish_http(nsqd_proc, topic, b"A1", b"A2")
        wait_until(lambda: files(out) == {rev[0]: b"A1\nA2\n"}, what="A in rev 0")
        # the tick after 1s closes the file and, with --skip-empty-files, opens none
        wait_until(lambda: "since last open, rotating..." in p.stderr(), what="the interval rotation")
        publish_http(nsqd_proc, topic, b"B")
        wait_until(lambda: files(out) == {rev[0]: b"A1\nA2\n", rev[1]: b"B\n"}, what="B in rev 1")
        stop_ok(p)
    assert files(out) == {rev[0]: b"A1\nA2\n", rev[1]: b"B\n"}


def test_ticks_open_empty_files_without_skip_empty_files(nsqd_proc, tmp_path):
    topic = "empties"
    out = tmp_path / "out"
    with start(
        nsqd_proc,
        tmp_path,
        f"--topic={topic}",
        f"--output-dir={out}",
        "--gzip",
        "--rotate-interval=300ms",
        "--sync-interval=100ms",
        "--datetime-format=%Y",
    ) as p:
        wait_until(lambda: len(files(out)) >= 3, what="three files from ticks alone")
        stop_ok(p)
    got = files(out)
    assert sorted(got) == [f"{topic}.{SHORT}-{i:06d}.{YEAR}.log.gz" for i in range(len(got))]
    for data in got.values():  # each holds one empty gzip member, as Go's Close writes it
        assert [c for _, c in gzip_members(data)] == [b""]


def test_datetime_change_rotates_and_fins_at_once(nsqd_proc, tmp_path):
    topic = "dt"
    out = tmp_path / "out"
    fmt = "%Y%m%d%H%M%S"
    with start(
        nsqd_proc,
        tmp_path,
        f"--topic={topic}",
        f"--output-dir={out}",
        f"--datetime-format={fmt}",
        "--sync-interval=1h",
    ) as p:
        wait_until(lambda: chan(nsqd_proc, topic).get("client_count"), what="the subscription")
        publish_http(nsqd_proc, topic, b"A")
        (first,) = wait_until(lambda: files(out), what="A's file")
        stamp = first.split(".")[-2]
        wait_until(lambda: time.strftime(fmt) != stamp, what="the next second", interval=0.01)
        publish_http(nsqd_proc, topic, b"B")
        got = wait_until(lambda: len(f := files(out)) == 2 and f, what="B's file")
        # each message opened a file (a rotation), so each was synced and FINished at once
        wait_until(lambda: finished(chan(nsqd_proc, topic)) == 2, what="both FINished")
        err = stop_ok(p)
    assert got[first] == b"A\n"
    (second,) = set(got) - {first}
    assert got[second] == b"B\n"
    assert re.fullmatch(rf"{topic}\.{re.escape(SHORT)}\.\d{{14}}\.log", second) and second > first
    assert f"new filename {second}, rotating..." in err


def test_starved_consumer_and_max_in_flight_sync(nsqd_proc, tmp_path):
    topic = "starved"
    out = tmp_path / "out"
    bodies = [b"s%02d" % i for i in range(25)]
    publish_http(nsqd_proc, topic, *bodies)
    with start(
        nsqd_proc,
        tmp_path,
        f"--topic={topic}",
        f"--output-dir={out}",
        "--channel=arch",
        "--max-in-flight=10",
        "--consumer-opt=client_id,archiver",
        "--sync-interval=1h",
    ) as p:
        # no tick: syncs come from the starved consumer (>= 85% of RDY 10 in flight)
        c = wait_until(
            lambda: (
                (c := chan(nsqd_proc, topic, "arch"))
                and c["depth"] == 0
                and c["in_flight_count"] < 9
                and finished(c) + c["in_flight_count"] == 25
                and c
            ),
            what="everything delivered, all but a few FINished",
        )
        assert finished(c) >= 17
        # the last ones are written (a plain file shows them at once), waiting for a sync
        wait_until(lambda: list(files(out).values()) == [lines(*bodies)], what="all 25 lines")
        assert c["clients"][0]["client_id"] == "archiver"
        assert c["clients"][0]["ready_count"] == 10
        stop_ok(p)
    assert list(files(out).values()) == [lines(*bodies)]
    c = chan(nsqd_proc, topic, "arch")
    assert c["in_flight_count"] == 0 and c["depth"] == 0 and c["requeue_count"] == 0


def test_several_topics_and_topic_pattern_filter(nsqd_proc, tmp_path):
    out = tmp_path / "out"
    publish_http(nsqd_proc, "multi_a", b"a")
    publish_http(nsqd_proc, "multi_b", b"b")
    publish_http(nsqd_proc, "other_c", b"c")
    with start(
        nsqd_proc,
        tmp_path,
        "--topic=multi_a",
        "--topic=multi_b",
        "--topic=other_c",
        "--topic-pattern=^multi",
        f"--output-dir={out}",
        "--datetime-format=%Y",
    ) as p:
        wait_until(lambda: len(files(out)) == 2, what="two files")
        stop_ok(p, signal.SIGINT)
    assert files(out) == {f"multi_a.{SHORT}.{YEAR}.log": b"a\n", f"multi_b.{SHORT}.{YEAR}.log": b"b\n"}
    assert "nsq_to_file" not in channels(nsqd_proc, "other_c")


def test_topic_pattern_discovers_topics_through_lookupd(tmp_path):
    out = tmp_path / "out"
    with lookupd_and_nsqd(tmp_path) as (lookupd, nsqd):
        publish_http(nsqd, "keep_early", b"e1")
        publish_http(nsqd, "skip_me", b"s1")
        with ToolProcess(
            "nsq_to_file",
            [
                f"--lookupd-http-address={lookupd.http_address}",
                "--topic-pattern=^keep_",
                "--topic-refresh=200ms",
                f"--output-dir={out}",
                "--datetime-format=%Y",
                "--log-level=debug",
                "--log-prefix=[archive] ",
            ],
            tmp_path / "logs",
        ) as p:
            wait_until(
                lambda: files(out) == {f"keep_early.{SHORT}.{YEAR}.log": b"e1\n"},
                what="the topic that existed at start",
            )
            publish_http(nsqd, "keep_late", b"l1", b"l2")  # created after nsq_to_file started
            wait_until(
                lambda: files(out).get(f"keep_late.{SHORT}.{YEAR}.log") == b"l1\nl2\n",
                what="the topic created later",
                timeout=20,
            )
            err = stop_ok(p)
        assert set(files(out)) == {f"keep_early.{SHORT}.{YEAR}.log", f"keep_late.{SHORT}.{YEAR}.log"}
        assert "DEBUG: skipping topic skip_me (doesn't match pattern ^keep_)" in err
        assert all(line.startswith("[archive] ") for line in err.splitlines() if line)
        assert "nsq_to_file" not in channels(nsqd, "skip_me")


# --- failures: nothing FINished that was not written, nothing lost ----------------------------


FAST_RETRY = (
    "--consumer-opt=default_requeue_delay,50ms",
    "--consumer-opt=backoff_multiplier,50ms",
    "--consumer-opt=max_backoff_duration,200ms",
)


def test_full_disk_requeues_and_loses_nothing(nsqd_proc, tmp_path):
    topic = "fulldisk"
    bodies = [b"%03d-" % i + b"y" * 500 for i in range(40)]
    with mounted_tmpfs(tmp_path / "disk", "1m") as disk:
        out = disk / "out"
        out.mkdir()
        filler = fill_disk(disk)
        publish_http(nsqd_proc, topic, *bodies)
        with start(
            nsqd_proc,
            tmp_path,
            f"--topic={topic}",
            f"--output-dir={out}",
            "--datetime-format=%Y",
            "--sync-interval=200ms",
            *FAST_RETRY,
        ) as p:
            c = wait_until(
                lambda: (c := chan(nsqd_proc, topic)) and c["requeue_count"] >= 3 and c,
                what="messages requeued",
            )
            assert finished(c) == 0  # nothing FINished: nothing could be written
            assert "no space left on device" in p.stderr()
            assert "messages not written, requeued" in p.stderr()
            assert set(files(out).values()) <= {b""}  # no partial line left behind
            filler.unlink()
            wait_until(
                lambda: finished(chan(nsqd_proc, topic)) == len(bodies),
                what="everything FINished",
                timeout=30,
            )
            err = stop_ok(p)
        got = files(out)
    assert len(got) == 1
    assert sorted(got.popitem()[1].splitlines()) == bodies  # each exactly once
    assert "ERROR: [fulldisk/nsq_to_file] writing message to disk: write " in err


def test_full_disk_with_gzip_keeps_synced_members(nsqd_proc, tmp_path):
    topic = "fullgz"
    first = [b"first-%02d" % i for i in range(5)]
    rng = random.Random(7)  # incompressible: the gzip stream must need new pages of the disk
    later = [b"later-%03d-" % i + bytes(rng.randrange(32, 256) for _ in range(2000)) for i in range(40)]
    with mounted_tmpfs(tmp_path / "disk", "1m") as disk:
        out = disk / "out"
        with start(
            nsqd_proc,
            tmp_path,
            f"--topic={topic}",
            f"--output-dir={out}",
            "--gzip",
            "--datetime-format=%Y",
            "--sync-interval=100ms",
            *FAST_RETRY,
        ) as p:
            wait_until(lambda: chan(nsqd_proc, topic).get("client_count"), what="the subscription")
            publish_http(nsqd_proc, topic, *first)
            wait_until(lambda: finished(chan(nsqd_proc, topic)) == 5, what="the first messages synced")
            filler = fill_disk(disk)
            publish_http(nsqd_proc, topic, *later)
            wait_until(lambda: chan(nsqd_proc, topic)["requeue_count"] >= 2, what="messages requeued")
            assert finished(chan(nsqd_proc, topic)) < 5 + len(later)
            (data,) = files(out).values()
            # the file was cut back to its last synced member: still valid gzip, no partial member
            assert b"".join(c for _, c in gzip_members(data)).startswith(lines(*first))
            filler.unlink()
            wait_until(
                lambda: finished(chan(nsqd_proc, topic)) == 5 + len(later),
                what="everything FINished",
                timeout=30,
            )
            stop_ok(p)
        (data,) = files(out).values()
    content = b"".join(c for _, c in gzip_members(data)).split(b"\n")
    assert content.pop() == b""
    assert content[:5] == first
    assert sorted(content[5:]) == later


def test_read_only_directory_requeues_until_writable(nsqd_proc, tmp_path):
    topic = "rodir"
    with mounted_tmpfs(tmp_path / "ro", "1m", read_only=True) as ro:
        with start(
            nsqd_proc,
            tmp_path,
            f"--topic={topic}",
            f"--output-dir={ro}",
            "--datetime-format=%Y",
            "--sync-interval=100ms",
            *FAST_RETRY,
        ) as p:
            publish_http(nsqd_proc, topic, b"r1", b"r2")
            wait_until(lambda: chan(nsqd_proc, topic).get("requeue_count", 0) >= 2, what="requeued")
            assert finished(chan(nsqd_proc, topic)) == 0
            assert "read-only file system" in p.stderr()
            r = subprocess.run(["mount", "-o", "remount,rw", str(ro)], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            wait_until(
                lambda: (
                    files(ro) == {f"{topic}.{SHORT}.{YEAR}.log": b"r1\nr2\n"}
                    or files(ro) == {f"{topic}.{SHORT}.{YEAR}.log": b"r2\nr1\n"}
                ),
                what="both lines",
            )
            wait_until(lambda: finished(chan(nsqd_proc, topic)) == 2, what="both FINished")
            stop_ok(p)
        c = chan(nsqd_proc, topic)
        assert (c["depth"], c["in_flight_count"], c["deferred_count"]) == (0, 0, 0)


# --- command line -----------------------------------------------------------------------------


def test_unreachable_nsqd_fails_clearly():
    res = run_tool(
        "nsq_to_file",
        f"--nsqd-tcp-address=127.0.0.1:{free_port()}",
        "--topic=t",
        "--consumer-opt=dial_timeout,200ms",
    )
    err = res.stderr.decode()
    assert res.returncode == 1, err
    assert "ERROR: couldn't create logger for new topic t: failed to connect to nsqd 127.0.0.1:" in err
    assert "no topic to log" in err


@pytest.mark.parametrize(
    "args, code, expected",
    [
        (["--topic=t", "--bogus"], 2, "flag provided but not defined: -bogus"),
        (["--topic=t", "--max-in-flight=x"], 2, 'invalid value "x" for flag -max-in-flight: parse error'),
        (["--topic=t", "--rotate-interval=soon"], 2, 'invalid value "soon" for flag -rotate-interval'),
        (["--topic=t", "--consumer-opt=nope,1"], 2, 'invalid value "nope,1" for flag -consumer-opt'),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "extra", "args"],
            1,
            "unknown arguments: [extra args]",
        ),
        (["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--log-level=loud"], 1, "--log-level is invalid"),
        (["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--channel="], 1, "--channel is required"),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--http-client-connect-timeout=0"],
            1,
            "--http-client-connect-timeout should be positive",
        ),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--http-client-request-timeout=-1s"],
            1,
            "--http-client-request-timeout should be positive",
        ),
        (["--topic=t"], 1, "--nsqd-tcp-address or --lookupd-http-address required."),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--lookupd-http-address=127.0.0.1:4161"],
            1,
            "use --nsqd-tcp-address or --lookupd-http-address not both",
        ),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--gzip-level=10"],
            1,
            "invalid --gzip-level value (10), should be 1-9",
        ),
        (["--nsqd-tcp-address=127.0.0.1:4150"], 1, "--topic or --topic-pattern required"),
        (
            ["--topic-pattern=x", "--nsqd-tcp-address=127.0.0.1:4150"],
            1,
            "--lookupd-http-address must be specified when no --topic specified",
        ),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--gzip", "--filename-format=x.log"],
            1,
            "missing <REV> in --filename-format when gzip, rotation, or work dir enabled",
        ),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--work-dir=/tmp/w", "--filename-format=x"],
            1,
            "missing <REV> in --filename-format",
        ),
        (["--topic-pattern=(", "--lookupd-http-address=127.0.0.1:4161"], 1, "invalid --topic-pattern"),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--sync-interval=0"],
            1,
            "--sync-interval should be positive",
        ),
        (
            ["--topic=bad topic", "--nsqd-tcp-address=127.0.0.1:4150"],
            1,
            "couldn't create logger for new topic bad topic: ",
        ),
        (
            ["--topic=t", "--channel=bad channel", "--nsqd-tcp-address=127.0.0.1:4150"],
            1,
            "invalid channel name",
        ),
        (["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--max-in-flight=-1"], 1, "max_in_flight"),
    ],
)
def test_bad_command_lines(args, code, expected):
    res = run_tool("nsq_to_file", *args)
    err = res.stderr.decode()
    assert res.returncode == code, err
    assert expected in err
    assert res.stdout == b""
    if code == 2:
        assert "Usage of nsq_to_file:" in err


def test_help_and_version():
    res = run_tool("nsq_to_file", "-h")
    assert res.returncode == 0
    err = res.stderr.decode()
    flags = re.findall(r"^  -(\S+)", err, re.M)
    assert flags == sorted(flags)  # Go prints them sorted
    assert set(flags) == {
        "channel",
        "consumer-opt",
        "datetime-format",
        "filename-format",
        "gzip",
        "gzip-level",
        "host-identifier",
        "http-client-connect-timeout",
        "http-client-request-timeout",
        "log-level",
        "log-prefix",
        "lookupd-http-address",
        "max-in-flight",
        "nsqd-tcp-address",
        "output-dir",
        "rotate-interval",
        "rotate-size",
        "skip-empty-files",
        "sync-interval",
        "topic",
        "topic-pattern",
        "topic-refresh",
        "version",
        "work-dir",
    }
    for text in (
        "  -rotate-size rotate-size\n    \trotate the file when it grows bigger than rotate-size bytes\n",
        "  -topic-refresh duration\n    \thow frequently the topic list should be refreshed (default 1m0s)\n",
        "  -sync-interval duration\n    \tsync file to disk every duration (default 30s)\n",
        '  -log-prefix string\n    \tlog message prefix (default "[nsq_to_file] ")\n',
        "  -filename-format string\n    \toutput filename format (<TOPIC>, <HOST>, <PID>, <DATETIME>, <REV> "
        "are replaced. <REV> is increased when file already exists) "
        '(default "<TOPIC>.<HOST><REV>.<DATETIME>.log")\n',
        "  -datetime-format string\n    \tstrftime compatible format for <DATETIME> in filename format "
        '(default "%Y-%m-%d_%H")\n',
        "  -gzip\n    \tgzip output files.\n",
        "  -max-in-flight int\n    \tmax number of messages to allow in flight (default 200)\n",
        '  -output-dir string\n    \tdirectory to write output files to (default "/tmp")\n',
    ):
        assert text in err
    res = run_tool("nsq_to_file", "--version")
    assert (res.returncode, res.stdout) == (0, b"nsq_to_file v1.3.0\n")
