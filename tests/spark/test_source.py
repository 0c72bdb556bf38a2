"""The ``nsq`` stream source against real nsqd/nsqlookupd processes and the shared session."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from nsqpy.spark import SOURCE_COLUMNS
from nsqpy.spark.source import SourceOptions, admit, plan_partitions
from nsqpy.spark.spool import ARROW_SCHEMA, Chunk, Spool, list_chunks, read_chunk

from .conftest import publish, stats, wait_for

pytestmark = pytest.mark.timeout(180)


def _reader(spark: Any, topic: str, spool: Path, **opts: Any) -> Any:
    r = spark.readStream.format("nsq").option("topic", topic).option("spoolPath", str(spool))
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def _drain_to_memory(spark: Any, df: Any, name: str, checkpoint: Path, timeout: float = 90) -> Any:
    q = (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(timeout), "the availableNow query did not terminate"
    assert q.exception() is None, q.exception()
    return q


def _to_parquet(df: Any, out: Path, checkpoint: Path, **trigger: Any) -> Any:
    """Start writing the stream as Parquet under ``out`` (Spark's default trigger if none)."""
    w = df.writeStream.format("parquet").option("path", str(out))
    w = w.option("checkpointLocation", str(checkpoint))
    return (w.trigger(**trigger) if trigger else w).start()


def _drain_to_parquet(spark: Any, df: Any, out: Path, checkpoint: Path) -> list[bytes]:
    """Run the stream availableNow into Parquet under ``out``; all the bodies there."""
    q = _to_parquet(df, out, checkpoint, availableNow=True)
    assert q.awaitTermination(90)
    assert q.exception() is None
    return [bytes(r.body) for r in spark.read.parquet(str(out)).select("body").collect()]


def _spooled_rows(spool: Path) -> int:
    return sum(c.rows for c in list_chunks(str(spool)))


# --- pure parts (no Spark job) ----------------------------------------------------------------


def test_options_parse_defaults_and_errors(tmp_path: Path) -> None:
    o = SourceOptions.parse({"topic": "t", "nsqdTcpAddresses": "127.0.0.1:4150", "spoolPath": str(tmp_path)})
    assert (o.channel, o.max_records_per_batch, o.max_in_flight, o.msg_timeout_ms) == (
        "nsq_spark",
        100_000,
        2500,
        60_000,
    )
    assert (o.max_spool_rows, o.num_partitions, o.nsqd_tcp_addresses) == (1_000_000, 2, ("127.0.0.1:4150",))
    base = {"topic": "t", "nsqdTcpAddresses": "127.0.0.1:4150", "spoolPath": str(tmp_path)}
    bad = [
        ({**base, "topic": ""}, "'topic'"),
        ({**base, "topic": "bad topic!"}, "'topic'"),
        ({**base, "channel": "bad/channel"}, "'channel'"),
        ({k: v for k, v in base.items() if k != "spoolPath"}, "'spoolPath'"),
        ({"topic": "t", "spoolPath": str(tmp_path)}, "nsqlookupdHttpAddresses"),
        ({**base, "nsqdTcpAddresses": "localhost"}, "'nsqdTcpAddresses'"),
        ({**base, "nsqlookupdHttpAddresses": "h:notaport"}, "'nsqlookupdHttpAddresses'"),
        ({**base, "maxRecordsPerBatch": "ten"}, "'maxRecordsPerBatch'"),
        ({**base, "maxInFlight": "0"}, "'maxInFlight'"),
        ({**base, "msgTimeoutMs": "10"}, "'msgTimeoutMs'"),
        ({**base, "maxSpoolRows": "-1"}, "'maxSpoolRows'"),
        ({**base, "numPartitions": "0"}, "'numPartitions'"),
        ({**base, "nsqdHttpAddresses": "127.0.0.1:1,127.0.0.1:2"}, "'nsqdHttpAddresses'"),
    ]
    for opts, needle in bad:
        with pytest.raises(ValueError, match=needle):
            SourceOptions.parse(opts)


def test_admission_and_partition_planning() -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    chunks = [Chunk(s, r, f"/s/{s}") for s, r in [(4, 300), (5, 300), (6, 300), (7, 50)]]
    assert admit(3, chunks, ReadMaxRows(650)) == 5
    assert admit(3, chunks, ReadMaxRows(10)) == 4  # at least one chunk
    assert admit(3, chunks, ReadAllAvailable()) == 7
    parts = plan_partitions(chunks, 2)
    assert [p.value for p in parts] == [("/s/4", "/s/5"), ("/s/6", "/s/7")]
    assert len(plan_partitions(chunks[:1], 4)) == 1
    assert plan_partitions([], 2) == []


def _batch(rows: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array(["%016d" % i for i in range(rows)], pa.string()),
            pa.array([0] * rows, pa.timestamp("us", tz="UTC")),
            pa.array([1] * rows, pa.int32()),
            pa.array([b"b"] * rows, pa.binary()),
            pa.array(["t"] * rows),
            pa.array(["c"] * rows),
            pa.array(["h:1"] * rows),
        ],
        schema=ARROW_SCHEMA,
    )


def test_spool_numbering_survives_commits_and_restarts(tmp_path: Path) -> None:
    path = tmp_path / "spool"
    sp = Spool(str(path))
    assert [sp.write(_batch(n)) for n in (3, 4, 5)] == [1, 2, 3]
    assert [(c.seq, c.rows) for c in list_chunks(str(path))] == [(1, 3), (2, 4), (3, 5)]
    assert sp.rows_after(1) == 9 and [c.seq for c in sp.chunks(1, 2)] == [2]
    assert [b.num_rows for b in read_chunk(sp.chunks(0)[0].path)] == [3]
    (path / ".tmp-leftover.arrow").write_bytes(b"partial")  # a crash before the rename
    # a restart adopts the chunk files and continues the numbering
    sp = Spool(str(path))
    assert not (path / ".tmp-leftover.arrow").exists()
    assert sp.last_seq == 3 and sp.write(_batch(1)) == 4
    assert sp.delete_upto(2) == 2 and [c.seq for c in list_chunks(str(path))] == [3, 4]
    assert sp.delete_upto(4) == 2 and list_chunks(str(path)) == []
    # nothing left on disk, yet numbering does not restart at 1
    sp = Spool(str(path))
    assert sp.write(_batch(1)) == 5
    sp.skip_to(41)  # an offset Spark already knows
    assert sp.write(_batch(1)) == 42


def test_spool_rows_after_matches_the_chunks_present(tmp_path: Path) -> None:
    """rows_after (the backpressure figure) is kept incrementally; it must equal a count
    over the chunks present through writes, commits, skips and restarts."""
    path = str(tmp_path / "spool")
    sp = Spool(path)

    def check() -> None:
        for seq in range(0, sp.last_seq + 3):
            want = sum(c.rows for c in list_chunks(path) if c.seq > seq)
            assert sp.rows_after(seq) == want, (seq, sp.rows_after(seq), want)

    check()
    for n in (3, 4, 5, 6):
        sp.write(_batch(n))
    check()
    sp.delete_upto(2)
    check()
    sp = Spool(path)  # adopts chunks 3 and 4
    check()
    sp.delete_upto(4)
    sp.skip_to(1_000_000)  # an empty spool jumping far ahead stays cheap and exact
    assert sp.rows_after(999_999) == 0 and sp.rows_after(0) == 0
    assert sp.write(_batch(7)) == 1_000_001
    assert sp.rows_after(1_000_000) == 7 and sp.rows_after(1_000_001) == 0


# --- with Spark and nsqd ----------------------------------------------------------------------


def test_read_available_now_every_message_once(
    spark: Any, nsqd_server: Any, unique_topic: str, tmp_path: Path
) -> None:
    n = 3000
    bodies = [b"body-%05d-" % i + bytes([i % 256]) for i in range(n)]
    before = time.time()
    publish(nsqd_server, unique_topic, bodies)
    after = time.time()
    df = _reader(
        spark,
        unique_topic,
        tmp_path / "spool",
        nsqdTcpAddresses=nsqd_server.tcp_address,
        nsqdHttpAddresses=nsqd_server.http_address,
        maxRecordsPerBatch=1000,
        channel="archive",
    )
    assert tuple(df.columns) == SOURCE_COLUMNS
    assert [f.dataType.simpleString() for f in df.schema.fields] == [
        "string",
        "timestamp",
        "int",
        "binary",
        "string",
        "string",
        "string",
    ]
    q = _drain_to_memory(spark, df, "src_once", tmp_path / "ckpt")
    rows = spark.sql("select * from src_once").collect()
    got = [bytes(r.body) for r in rows]
    assert len(got) == n
    assert set(got) == set(bodies)
    assert {r.topic for r in rows} == {unique_topic}
    assert {r.channel for r in rows} == {"archive"}
    assert {r.nsqd_address for r in rows} == {nsqd_server.tcp_address}
    assert {r.attempts for r in rows} == {1}
    assert len({r.id for r in rows}) == n and all(len(r.id) == 16 for r in rows)
    stamps = [r.timestamp.timestamp() for r in rows]
    assert before - 1 <= min(stamps) and max(stamps) <= after + 1
    batches = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sum(batches) == n and len(batches) >= 3 and max(batches) <= 1000, batches
    # everything was FIN'd: nothing waits or is in flight in the channel
    ch = stats(nsqd_server, unique_topic, "archive")
    assert ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0, ch
    assert ch["client_count"] == 0, "the source did not close its connection"


def test_discovery_through_lookupd(
    spark: Any, lookupd_cluster: Any, unique_topic: str, tmp_path: Path
) -> None:
    lookupd, nsqds = lookupd_cluster
    per = 400
    expected: dict[bytes, str] = {}
    for i, d in enumerate(nsqds):
        bodies = [b"n%d-%04d" % (i, j) for j in range(per)]
        publish(d, unique_topic, bodies)
        expected.update({b: d.tcp_address for b in bodies})

    def producers() -> int:
        status, body = lookupd.http_get(f"/lookup?topic={unique_topic}")
        return len(json.loads(body)["producers"]) if status == 200 else 0

    wait_for(lambda: producers() == 2, what="both nsqd registered with nsqlookupd")
    df = _reader(spark, unique_topic, tmp_path / "spool", nsqlookupdHttpAddresses=lookupd.http_address)
    _drain_to_memory(spark, df, "src_lookupd", tmp_path / "ckpt")
    rows = spark.sql("select body, nsqd_address from src_lookupd").collect()
    assert len(rows) == 2 * per
    assert {bytes(r.body): r.nsqd_address for r in rows} == expected


def test_restart_with_same_checkpoint_resumes_without_loss(
    spark: Any, nsqd_server: Any, unique_topic: str, tmp_path: Path
) -> None:
    spool, ckpt, out = tmp_path / "spool", tmp_path / "ckpt", tmp_path / "out"
    first = [b"first-%04d" % i for i in range(1500)]
    second = [b"second-%04d" % i for i in range(1500)]
    publish(nsqd_server, unique_topic, first)
    opts = dict(nsqdTcpAddresses=nsqd_server.tcp_address, maxRecordsPerBatch=300)
    # a continuous query (default trigger), stopped while it is running
    q = _to_parquet(_reader(spark, unique_topic, spool, **opts), out, ckpt)
    try:
        wait_for(
            lambda: sum(p["numInputRows"] for p in q.recentProgress) >= 600,
            timeout=90,
            what="a few batches of the first query",
        )
    finally:
        q.stop()
    assert q.exception() is None
    publish(nsqd_server, unique_topic, second)
    # restart: same checkpoint, same spool; availableNow picks up everything (no HTTP
    # address given: the drain ends after availableNowQuietMs without deliveries)
    df = _reader(spark, unique_topic, spool, availableNowQuietMs=1000, **{**opts, "maxRecordsPerBatch": 1000})
    got = _drain_to_parquet(spark, df, out, ckpt)
    assert sorted(got) == sorted(first + second)  # no loss, and no duplicate on a clean stop


def test_backpressure_stops_delivery_at_max_spool_rows(
    spark: Any, nsqd_server: Any, unique_topic: str, tmp_path: Path
) -> None:
    n = 2000
    bodies = [b"bp-%05d" % i for i in range(n)]
    publish(nsqd_server, unique_topic, bodies)
    spool, ckpt, out = tmp_path / "spool", tmp_path / "ckpt", tmp_path / "out"
    opts = dict(
        nsqdTcpAddresses=nsqd_server.tcp_address,
        nsqdHttpAddresses=nsqd_server.http_address,
        maxSpoolRows=200,
        maxInFlight=50,
        maxRecordsPerBatch=100,
    )
    # one batch at start, then none for an hour: nothing is planned, the spool fills up
    q = _to_parquet(_reader(spark, unique_topic, spool, **opts), out, ckpt, processingTime="1 hour")
    try:

        def paused() -> bool:
            ch = stats(nsqd_server, unique_topic, "nsq_spark")
            if not ch or not ch["clients"]:
                return False
            return ch["clients"][0]["ready_count"] == 0 and _spooled_rows(spool) > 200

        wait_for(paused, timeout=60, what="RDY 0 once the spool holds more than maxSpoolRows")
        time.sleep(0.5)  # a quiet period: prove that delivery really stopped
        held = _spooled_rows(spool)
        ch = stats(nsqd_server, unique_topic, "nsq_spark")
        assert ch is not None and ch["clients"][0]["ready_count"] == 0
        assert ch["depth"] > 0 and ch["in_flight_count"] == 0
        # over the limit by at most the burst that crossed it (one read may bring the whole
        # RDY window: 50) and the messages in flight when RDY went to 0 (50: the FIN of that
        # burst freed the window before RDY 0 arrived), plus the first trigger's batch (<= 100
        # rows, filled up to maxRecordsPerBatch, planned but never committed)
        assert 200 < held <= 200 + 50 + 50 + 100, held
        assert _spooled_rows(spool) == held
    finally:
        q.stop()
    # the rest comes through when the query runs again (and the spooled chunks are adopted)
    df = _reader(spark, unique_topic, spool, **{**opts, "maxRecordsPerBatch": 5000, "maxInFlight": 1000})
    got = _drain_to_parquet(spark, df, out, ckpt)
    assert sorted(got) == sorted(bodies)


@pytest.mark.parametrize(
    "opts, needle",
    [
        ({"spoolPath": "SPOOL", "nsqdTcpAddresses": "127.0.0.1:4150"}, "'topic' is required"),
        ({"topic": "t", "nsqdTcpAddresses": "127.0.0.1:4150"}, "'spoolPath' is required"),
        ({"topic": "t", "spoolPath": "SPOOL"}, "nsqlookupdHttpAddresses"),
        (
            {"topic": "t", "spoolPath": "SPOOL", "nsqdTcpAddresses": "127.0.0.1:4150", "maxInFlight": "x"},
            "'maxInFlight'",
        ),
    ],
    ids=["no-topic", "no-spool", "no-address", "bad-int"],
)
def test_bad_options_fail_the_query_with_a_clear_error(
    spark: Any, tmp_path: Path, opts: dict[str, str], needle: str
) -> None:
    r = spark.readStream.format("nsq")
    for k, v in opts.items():
        r = r.option(k, v.replace("SPOOL", str(tmp_path / "spool")))
    with pytest.raises(Exception, match=needle):
        q = r.load().writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c")).start()
        try:
            q.awaitTermination(60)
            raise AssertionError("the query ran with bad options") from q.exception()
        finally:
            q.stop()
    assert not os.path.exists(tmp_path / "spool") or not os.listdir(tmp_path / "spool")


def test_subscription_refused_by_nsqd_fails_the_query(
    spark: Any, nsqd_server: Any, unique_topic: str, tmp_path: Path
) -> None:
    # nsqd's --max-msg-timeout is 15 minutes: IDENTIFY with more is refused (E_BAD_BODY)
    df = _reader(
        spark,
        unique_topic,
        tmp_path / "spool",
        nsqdTcpAddresses=nsqd_server.tcp_address,
        msgTimeoutMs=3_600_000,
    )
    q = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c")).start()
    try:
        with pytest.raises(Exception, match="refused the subscription: E_BAD_BODY"):
            q.awaitTermination(60)
    finally:
        q.stop()


def test_available_now_that_reaches_no_nsqd_fails(spark: Any, unique_topic: str, tmp_path: Path) -> None:
    """A bounded run against an nsqd that does not answer fails the query (Go's tools exit 1)
    instead of finishing "drained" with nothing read."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    df = _reader(spark, unique_topic, tmp_path / "spool", nsqdTcpAddresses=dead, availableNowQuietMs=200)
    q = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "c"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        with pytest.raises(Exception, match="could not connect to any nsqd"):
            q.awaitTermination(60)
            raise AssertionError("the query ended without an error") from q.exception()
    finally:
        q.stop()


@pytest.mark.parametrize("available_now", [False, True])
def test_a_topic_nsqlookupd_does_not_know_is_reported_once(
    lookupd_cluster: Any,
    unique_topic: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    available_now: bool,
) -> None:
    """nsqlookupd answers /lookup with 404 TOPIC_NOT_FOUND: one WARNING naming the topic and
    the lookupd (a bounded run then reads nothing; a streaming one keeps asking); another
    when the topic gets a producer."""
    import logging

    from nsqpy.spark.consumer import Runtime

    lookupd, nsqds = lookupd_cluster
    topic = f"{unique_topic}_{int(available_now)}"
    opts = SourceOptions.parse(
        {
            "topic": topic,
            "nsqlookupdHttpAddresses": lookupd.http_address,
            "spoolPath": str(tmp_path / "spool"),
        }
    )
    rt = Runtime(opts, 0, available_now)
    caplog.set_level(logging.WARNING, "nsqpy.spark.source")
    assert rt.lookup() == {} and rt.lookup() == {}
    then = "nothing to read" if available_now else "asking again every 30s"
    assert [r.getMessage() for r in caplog.records] == [
        f"nsq source: nsqlookupd {lookupd.http_address} knows no producer of topic {topic!r} "
        f"({lookupd.http_address}: TOPIC_NOT_FOUND): {then}"
    ]
    caplog.clear()
    publish(nsqds[0], topic, [b"x"])
    wait_for(lambda: lookupd.http_get(f"/lookup?topic={topic}")[0] == 200, what="the topic registered")
    assert rt.lookup() == {nsqds[0].tcp_address: nsqds[0].http_address}
    assert [r.getMessage() for r in caplog.records] == [
        f"nsq source: nsqlookupd now knows 1 producer(s) of topic {topic!r}: {nsqds[0].tcp_address}"
    ]


# --- exactly once: redeliveries of what was spooled (the source's threads, no Spark) --------


def _runtime(topic: str, nsqd: Any, spool: Path, **extra: str) -> Any:
    from nsqpy.spark.consumer import Runtime

    opts = SourceOptions.parse(
        {
            "topic": topic,
            "nsqdTcpAddresses": nsqd.tcp_address,
            "spoolPath": str(spool),
            "maxInFlight": "100",
            **extra,
        }
    )
    rt = Runtime(opts, 0, available_now=False)
    rt.start()
    return rt


def test_committed_chunks_go_in_the_background_and_before_the_query_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """commit() returns at once; the chunks up to the offset go soon after (the record of ids
    saved first), the later ones stay, and stop() waits for a deletion still pending."""
    from nsqpy.spark.consumer import Runtime

    spool = tmp_path / "spool"
    opts = SourceOptions.parse({"topic": "t", "nsqdTcpAddresses": "127.0.0.1:1", "spoolPath": str(spool)})
    rt = Runtime(opts, 0, available_now=False)  # not started: no connection
    for _ in range(6):
        rt.spool.write(_batch(10))
    rt.committed(2)
    wait_for(lambda: [c.seq for c in list_chunks(str(spool))] == [3, 4, 5, 6], what="chunks 1-2 deleted")
    assert (spool / "redelivery-ids.arrow").exists()
    # a deletion the next commit asks for while the disk is slow is still done by stop()
    slow = threading.Event()
    real = Spool.delete_upto

    def delete_slowly(self: Spool, seq: int) -> int:
        slow.wait(5)
        return real(self, seq)

    monkeypatch.setattr(Spool, "delete_upto", delete_slowly)
    rt.committed(5)
    assert [c.seq for c in list_chunks(str(spool))] == [3, 4, 5, 6]
    threading.Timer(0.3, slow.set).start()
    rt.stop()
    assert [c.seq for c in list_chunks(str(spool))] == [6]


def test_a_commit_that_cannot_delete_fails_the_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nsqpy.spark.consumer import Runtime

    opts = SourceOptions.parse({"topic": "t", "nsqdTcpAddresses": "127.0.0.1:1", "spoolPath": str(tmp_path)})
    rt = Runtime(opts, 0, available_now=False)
    rt.spool.write(_batch(10))

    def no_space(self: Spool, seq: int) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Spool, "delete_upto", no_space)
    rt.committed(1)
    with pytest.raises(RuntimeError, match=r"deleting committed spool chunks failed: .*No space left"):
        wait_for(lambda: rt.raise_if_failed() or False, what="the failure reported", timeout=10)
    rt.stop()


def _die(rt: Any) -> None:
    """The runtime's connections drop as if the driver died: no CLS, no goodbye."""
    with rt.cond:
        rt.stopping = True
        rt.stop_event.set()
    for c in list(rt.consumers.values()):
        if c.conn is not None:
            c.conn.sock.close()
    for c in list(rt.consumers.values()):
        c.join(5)


def test_spooled_messages_nsqd_delivers_again_are_fin_d_not_spooled_again(
    nsqd_server: Any, unique_topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver dies after spooling bursts but before nsqd processed their FINs: nsqd
    delivers them again (attempts 2) to the next run, which FINs them without spooling them
    again. Recognised from the chunk files still in the spool and, for chunks a commit
    deleted, from the spool's record of recent ids."""
    from nsqpy.spark import consumer

    n = 600  # within one RDY window: nsqd keeps them in flight, unFIN'd
    monkeypatch.setattr(consumer.Burst, "fins", lambda self: b"")  # the FINs never leave
    spool = tmp_path / "spool"
    rt = _runtime(unique_topic, nsqd_server, spool, maxInFlight="1000")
    try:
        publish(nsqd_server, unique_topic, [b"m%05d" % i for i in range(n // 2)])
        wait_for(lambda: rt.spool.rows_after(0) == n // 2, what="the first half spooled")
        done = rt.spool.last_seq
        rt.committed(done)  # a batch committed: its chunk files go (in the background)
        wait_for(lambda: not list_chunks(str(spool), 0, done), what="the committed chunks deleted")
        publish(nsqd_server, unique_topic, [b"m%05d" % i for i in range(n // 2, n)])
        wait_for(lambda: rt.spool.rows_after(0) == n // 2, what="the second half spooled")
    finally:
        _die(rt)
    last = rt.spool.last_seq
    assert list_chunks(str(spool)) and len(list_chunks(str(spool))) < last  # both kinds
    monkeypatch.undo()
    rt = _runtime(unique_topic, nsqd_server, spool, maxInFlight="1000")
    try:
        wait_for(lambda: rt.spool.redelivered >= n, what="every redelivery recognised")

        def drained() -> bool:
            ch = stats(nsqd_server, unique_topic, "nsq_spark")
            return ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0

        wait_for(drained, what="the redeliveries FIN'd")
        assert rt.spool.last_seq == last, "a redelivered message was spooled again"
        assert rt.spool.redelivered == n
    finally:
        rt.stop()


def test_a_message_that_timed_out_while_spooled_is_not_spooled_twice(
    nsqd_server: Any, unique_topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spooling takes longer than the message timeout: nsqd answers the FIN with
    E_FIN_FAILED and delivers the message again; the source remembers the id (durably)
    and FINs the redelivery without spooling it again."""
    from nsqpy.spark import consumer
    from nsqpy.spark import spool as spool_mod

    publish(nsqd_server, unique_topic, [b"slow-%d" % i for i in range(5)])
    real_append = spool_mod.Spool.append
    slow = {"left": 1}

    def append(self: Any, oc: Any, batch: Any, valid: Any = None) -> Any:
        if slow["left"]:
            slow["left"] -= 1
            time.sleep(1.6)  # beyond the 1 s timeout; the freshness check is off below
        return real_append(self, oc, batch, valid)

    monkeypatch.setattr(spool_mod.Spool, "append", append)
    monkeypatch.setattr(consumer, "FRESH_FRACTION", 10.0)
    rt = _runtime(unique_topic, nsqd_server, tmp_path / "spool", msgTimeoutMs="1000")
    try:
        wait_for(lambda: rt.spool.redelivered >= 5, timeout=30, what="the redeliveries recognised")

        def drained() -> bool:
            ch = stats(nsqd_server, unique_topic, "nsq_spark")
            return ch is not None and ch["depth"] == 0 and ch["in_flight_count"] == 0

        wait_for(drained, what="the redeliveries FIN'd")
        assert rt.spool.rows_after(0) == 5 and rt.spool.redelivered == 5
    finally:
        rt.stop()
    assert (tmp_path / "spool" / spool_mod.LEDGER).exists()


def test_a_burst_older_than_half_its_timeout_is_requeued_not_spooled(
    nsqd_server: Any, unique_topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The freshness check: a burst that waited too long is REQ'd (nsqd delivers it again
    at once, to any consumer) instead of being spooled after its FIN could still count."""
    from nsqpy.spark import consumer

    publish(nsqd_server, unique_topic, [b"late-%d" % i for i in range(5)])
    fresh = {"calls": 0}
    real = consumer.Consumer._fresh

    def first_stale(self: Any) -> bool:
        fresh["calls"] += 1
        return fresh["calls"] > 1 and real(self)

    monkeypatch.setattr(consumer.Consumer, "_fresh", first_stale)
    rt = _runtime(unique_topic, nsqd_server, tmp_path / "spool")
    try:
        wait_for(lambda: rt.spool.rows_after(0) >= 5, what="the messages spooled on their return")
        chunks = list_chunks(str(tmp_path / "spool"))
        rows = [r for c in chunks for b in read_chunk(c.path) for r in b.to_pylist()]
        assert sorted(r["body"] for r in rows) == [b"late-%d" % i for i in range(5)]
        assert {r["attempts"] for r in rows} == {2} and fresh["calls"] >= 2
    finally:
        rt.stop()


def test_a_daemon_forked_read_worker_freezes_its_heap_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyspark's daemon collects garbage after every task: in its forks the first read
    freezes the imports' objects (once per process); elsewhere nothing is frozen."""
    from nsqpy.spark import source

    calls: list[int] = []
    monkeypatch.setattr(source.gc, "freeze", lambda: calls.append(os.getpid()))
    monkeypatch.setattr(source, "_frozen_pid", 0)
    monkeypatch.setattr(source.sys, "argv", ["/usr/bin/python", "-m", "pytest"])
    source._freeze_worker_heap()
    assert calls == []
    daemon = os.path.join("/venv/lib/python3.11/site-packages", "pyspark", "daemon.py")
    monkeypatch.setattr(source.sys, "argv", [daemon, "pyspark.worker"])
    source._freeze_worker_heap()
    source._freeze_worker_heap()
    assert calls == [os.getpid()]
    monkeypatch.setattr(source, "_frozen_pid", os.getpid() + 1)  # as after a fork
    source._freeze_worker_heap()
    assert calls == [os.getpid(), os.getpid()]


def test_full_chunks_fill_batches_exactly(nsqd_server: Any, unique_topic: str, tmp_path: Path) -> None:
    """A chunk sealed for being full holds maxRecordsPerBatch split into equal parts of at
    most 25,000 rows (a burst that fills it is split), so whole chunks fill a batch."""
    from nsqpy.spark.consumer import Consumer

    for per_batch, want in ((100_000, 25_000), (30_000, 15_000), (25_001, 12_500), (700, 700)):
        opts = SourceOptions.parse(
            {"topic": "t", "nsqdTcpAddresses": "127.0.0.1:1", "spoolPath": str(tmp_path / "x")}
            | {"maxRecordsPerBatch": str(per_batch)}
        )
        rt = type("Rt", (), {"opts": opts})()
        assert Consumer._seal_rows(type("C", (), {"rt": rt})()) == want  # type: ignore[arg-type]
    publish(nsqd_server, unique_topic, [b"m-%d" % i for i in range(5000)])
    rt = _runtime(unique_topic, nsqd_server, tmp_path / "spool", maxInFlight="2500", maxRecordsPerBatch="700")
    try:
        wait_for(lambda: sum(c.rows for c in rt.spool.chunks(0)) == 5000, what="5000 rows sealed")
    finally:
        rt.stop()
    rows = [c.rows for c in list_chunks(str(tmp_path / "spool"))]
    assert max(rows) == 700 and rows.count(700) >= 5, rows
