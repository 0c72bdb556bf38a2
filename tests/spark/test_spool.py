"""The spool's record of the ids nsqd may deliver again (pure: files and Arrow only)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from nsqpy.spark import spool as spool_mod
from nsqpy.spark.spool import ARROW_SCHEMA, LEDGER, Spool, list_chunks, read_chunk


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


def _rows(path: str) -> list[str]:
    return [i for c in list_chunks(path) for b in read_chunk(c.path) for i in b.column(0).to_pylist()]


def test_bursts_appended_to_an_open_chunk_become_one_chunk_when_sealed(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    sp = Spool(path)
    oc = sp.open_chunk("h:1")
    assert sp.append(oc, _batch([1, 2])) and sp.append(oc, _batch([3]))
    # not visible to Spark before it is sealed, but counted for backpressure and redeliveries
    assert list_chunks(path) == [] and sp.rows_after(0) == 3
    assert _again(sp, [2], [2]) == [0]
    # a block that is no longer valid once on disk is cut off again
    assert not sp.append(oc, _batch([4]), valid=lambda: False)
    assert _again(sp, [4], [2]) == []
    assert sp.seal(oc) == 1 and sp.rows_after(0) == 3
    assert [(c.seq, c.rows) for c in list_chunks(path)] == [(1, 3)]
    assert _rows(path) == ["%016x" % i for i in (1, 2, 3)]
    assert [p.name for p in (tmp_path / "s").iterdir()] == [spool_mod.chunk_name(1, 3)]
    # an open chunk nothing was appended to leaves nothing behind
    assert sp.seal(sp.open_chunk("h:1")) is None
    assert [p.name for p in (tmp_path / "s").iterdir()] == [spool_mod.chunk_name(1, 3)]


def test_a_restart_seals_the_open_chunks_a_crash_left(tmp_path: Path) -> None:
    """What was appended may have been FIN'd: the intact blocks become a chunk (a torn or
    corrupt block and what follows it are cut off: those messages were never FIN'd), and
    their ids are remembered as ids nsqd may deliver again."""
    path = str(tmp_path / "s")
    sp = Spool(path)
    sp.write(_batch([1]))
    torn = sp.open_chunk("h:1")
    sp.append(torn, _batch([2, 3]))
    sp.append(torn, _batch([4]))
    header, payload = spool_mod.encode_block(_batch([5, 6]))
    os.write(torn.fd, header + payload.to_pybytes()[:-10])  # killed in the middle of a write
    corrupt = sp.open_chunk("h:1")
    sp.append(corrupt, _batch([7]))
    sp.append(corrupt, _batch([8]))
    empty = sp.open_chunk("h:1")
    for oc in (torn, corrupt, empty):
        oc.close()  # kill -9: nothing sealed
    with open(corrupt.path, "r+b") as f:  # the second block damaged on disk
        f.seek(-5, os.SEEK_END)
        f.write(b"xxxxx")
    sp = Spool(path)
    assert sorted(_rows(path)) == ["%016x" % i for i in (1, 2, 3, 4, 7)]
    assert [c.seq for c in list_chunks(path)] == [1, 2, 3] and sp.last_seq == 3
    assert not [p for p in (tmp_path / "s").iterdir() if p.name.startswith(spool_mod.OPEN_PREFIX)]
    assert _again(sp, [2, 4, 5, 7, 8], [2, 2, 2, 2, 2]) == [0, 1, 3]
    # the sealed files read whole
    assert sum(c.rows for c in list_chunks(path)) == 5


def test_a_damaged_chunk_file_fails_its_read(tmp_path: Path) -> None:
    sp = Spool(str(tmp_path / "s"))
    sp.write(_batch([1, 2]))
    (chunk,) = list_chunks(str(tmp_path / "s"))
    with open(chunk.path, "ab") as f:
        f.write(b"trailing garbage")
    with pytest.raises(ValueError, match="damaged"):
        list(read_chunk(chunk.path))


def test_chunk_files_of_the_first_spool_format_are_adopted_and_read(tmp_path: Path) -> None:
    """Spools written before open chunks (one Arrow IPC file per chunk, ``.arrow``)."""
    path = tmp_path / "s"
    path.mkdir()
    with (
        pa.OSFile(str(path / "chunk-00000000000000000007-2.arrow"), "wb") as f,
        pa.ipc.new_file(f, ARROW_SCHEMA) as w,
    ):
        w.write_batch(_batch([1, 2]))
    sp = Spool(str(path))
    assert sp.last_seq == 7 and _rows(str(path)) == ["%016x" % 1, "%016x" % 2]
    assert sp.write(_batch([3])) == 8
    assert sp.delete_upto(8) == 2 and list_chunks(str(path)) == []
