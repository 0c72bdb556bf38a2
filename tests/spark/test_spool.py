"""The spool's record of the ids nsqd may deliver again (pure: files and Arrow only)."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa

from nsqpy.spark import spool as spool_mod
from nsqpy.spark.spool import ARROW_SCHEMA, LEDGER, Spool, list_chunks


def _batch(ids: list[int], addr: str = "h:1") -> pa.RecordBatch:
    n = len(ids)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(["%016x" % i for i in ids], pa.string()),
            pa.array([0] * n, pa.timestamp("us", tz="UTC")),
            pa.array([1] * n, pa.int32()),
            pa.array([b"b"] * n, pa.binary()),
            pa.array(["t"] * n),
            pa.array(["c"] * n),
            pa.array([addr] * n),
        ],
        schema=ARROW_SCHEMA,
    )


def _again(sp: Spool, ids: list[int], attempts: list[int], addr: str = "h:1") -> list[int]:
    return sp.redeliveries(addr, pa.array(["%016x" % i for i in ids]), pa.array(attempts, pa.int32()))


def test_first_deliveries_are_never_redeliveries(tmp_path: Path) -> None:
    sp = Spool(str(tmp_path / "s"))
    sp.write(_batch([1, 2, 3]))
    # attempts 1: new whatever the id (the common case costs one comparison)
    assert _again(sp, [1, 2, 3], [1, 1, 1]) == []
    # attempts > 1 of spooled ids, per nsqd (ids of two nsqd may be alike)
    assert _again(sp, [4, 2, 3, 5], [2, 2, 1, 3]) == [1]
    assert _again(sp, [2], [2], addr="other:1") == []
    # the same id twice within one burst: the later one is the copy
    assert _again(sp, [7, 8, 7], [1, 1, 2]) == [2]
    assert sp.redelivered == 2


def test_recent_ids_are_bounded_and_pinned_when_a_connection_ends(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(spool_mod, "MIN_KEEP", 10)
    sp = Spool(str(tmp_path / "s"), keep=10)
    for start in range(0, 40, 5):
        sp.write(_batch(list(range(start, start + 5))))
    assert _again(sp, [0, 29, 30, 39], [2, 2, 2, 2]) == [2, 3]  # the last 10 ids only (30..39)
    sp.connection_ended("h:1")  # their FIN may not have been processed: pinned
    for start in range(100, 200, 5):
        sp.write(_batch(list(range(start, start + 5))))
    assert _again(sp, [31, 35], [3, 2]) == [0, 1]
    assert _again(sp, [31], [4]) == []  # a pinned id is forgotten once it came back


def test_the_record_survives_a_restart_and_commits(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(spool_mod, "MIN_KEEP", 10)
    path = str(tmp_path / "s")
    sp = Spool(path, keep=10)
    for start in range(0, 30, 5):
        sp.write(_batch(list(range(start, start + 5))))
    sp.pin("h:1", "%016x" % 3)  # E_FIN_FAILED: saved at once
    assert (tmp_path / "s" / LEDGER).exists()
    assert sp.delete_upto(6) == 6 and list_chunks(path) == []  # everything committed
    # a new run (after kill -9: nothing else was written) remembers the last ids and the pin
    sp = Spool(path, keep=10)
    assert _again(sp, [3, 9, 20, 29], [2, 2, 2, 2]) == [0, 2, 3]
    # chunk files still present count too, even without a ledger
    path2 = str(tmp_path / "s2")
    sp = Spool(path2, keep=10)
    sp.write(_batch([1, 2]))
    sp = Spool(path2, keep=10)
    assert _again(sp, [1, 2, 3], [2, 2, 2]) == [0, 1]
    # pins expire
    sp.pin("h:1", "%016x" % 50)
    monkeypatch.setattr(time, "time", lambda: 10**12)
    sp.write(_batch([60]))
    sp.delete_upto(sp.last_seq)
    sp = Spool(path2, keep=10)
    assert _again(sp, [50], [2]) == []


def test_a_chunk_that_is_no_longer_valid_is_not_written(tmp_path: Path) -> None:
    sp = Spool(str(tmp_path / "s"))
    assert sp.write(_batch([1]), valid=lambda: False) is None
    assert list_chunks(str(tmp_path / "s")) == [] and sp.last_seq == 0
    assert [p.name for p in (tmp_path / "s").iterdir()] == []
    assert _again(sp, [1], [2]) == []
