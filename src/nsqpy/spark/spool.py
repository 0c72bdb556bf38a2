"""The chunk spool of the ``nsq`` stream source: durable Arrow IPC files, one per burst.

Each chunk is written to a temp file, fsync'd, renamed to
``chunk-<seq, 20 digits>-<rows>.arrow`` and the directory fsync'd; only then may its
messages be FIN'd. Sequence numbers are dense and increase in the order chunks become
visible (the rename happens under the spool's lock), so "every chunk with seq <= N" is a
stable set once N has been handed to Spark. Numbering never restarts below an offset Spark
may have checkpointed: the reader skips past the start offset Spark hands it, and a
``committed`` marker file (written when a commit leaves no chunk file above it) carries
the highest deleted sequence number over a restart as well.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import uuid
from collections.abc import Iterator
from typing import NamedTuple

import pyarrow as pa

CHUNK_RE = re.compile(r"^chunk-(\d{20})-(\d+)\.arrow$")
TMP_PREFIX = ".tmp-"
MARKER = "committed"

#: Arrow schema of a chunk file: exactly what Spark expects for SOURCE_SCHEMA.
ARROW_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("attempts", pa.int32()),
        pa.field("body", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("channel", pa.string()),
        pa.field("nsqd_address", pa.string()),
    ]
)


class Chunk(NamedTuple):
    seq: int
    rows: int
    path: str


def chunk_name(seq: int, rows: int) -> str:
    return f"chunk-{seq:020d}-{rows}.arrow"


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: str, data: bytes | pa.Buffer) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def list_chunks(path: str, after: int = 0, upto: int | None = None) -> list[Chunk]:
    """Chunk files in ``path`` with ``after < seq <= upto``, in sequence order."""
    out = []
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return []
    for name in names:
        m = CHUNK_RE.match(name)
        if m is None:
            continue
        seq = int(m.group(1))
        if seq > after and (upto is None or seq <= upto):
            out.append(Chunk(seq, int(m.group(2)), os.path.join(path, name)))
    out.sort()
    return out


def read_chunk(path: str) -> Iterator[pa.RecordBatch]:
    """The record batches of one chunk file (memory-mapped)."""
    with pa.memory_map(path, "r") as source:
        reader = pa.ipc.open_file(source)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)


class Spool:
    """The driver's view of ``spoolPath``: an index of the chunk files, appended by the
    connection threads and trimmed by commits. Thread-safe."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        os.makedirs(self.path, exist_ok=True)
        self.lock = threading.Lock()
        #: seq -> rows, for every chunk file present
        self.index: dict[int, int] = {}
        self.committed = self._read_marker()
        for name in os.listdir(self.path):
            if name.startswith(TMP_PREFIX):
                # a chunk that was never renamed: its messages were never FIN'd
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.path, name))
        for c in list_chunks(self.path):
            self.index[c.seq] = c.rows
        self.next_seq = max([self.committed, *self.index]) + 1
        #: rows of every chunk present, and no chunk below `lowest` (rows_after is asked
        #: for on every chunk written: it must not walk the whole index)
        self.total_rows = sum(self.index.values())
        self.lowest = min(self.index, default=self.next_seq)

    def _read_marker(self) -> int:
        try:
            with open(os.path.join(self.path, MARKER)) as f:
                return int(f.read().strip() or 0)
        except FileNotFoundError:
            return 0
        except ValueError as exc:
            raise ValueError(f"spool {self.path}: unreadable {MARKER!r} marker file") from exc

    def _write_marker(self, seq: int) -> None:
        tmp = os.path.join(self.path, f"{TMP_PREFIX}{MARKER}")
        _write_durably(tmp, str(seq).encode())
        os.replace(tmp, os.path.join(self.path, MARKER))
        fsync_dir(self.path)
        self.committed = seq

    def skip_to(self, seq: int) -> None:
        """Never hand out a sequence number <= ``seq`` (an offset Spark already knows)."""
        with self.lock:
            if seq >= self.next_seq:
                self.next_seq = seq + 1
                if not self.index:
                    self.lowest = self.next_seq

    def write(self, batch: pa.RecordBatch) -> int:
        """Persist one chunk durably and return its sequence number."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, ARROW_SCHEMA) as writer:
            writer.write_batch(batch)
        tmp = os.path.join(self.path, f"{TMP_PREFIX}{uuid.uuid4().hex}.arrow")
        try:
            _write_durably(tmp, sink.getvalue())
            with self.lock:
                seq = self.next_seq
                os.rename(tmp, os.path.join(self.path, chunk_name(seq, batch.num_rows)))
                fsync_dir(self.path)
                self.next_seq = seq + 1
                if not self.index:
                    self.lowest = seq
                self.index[seq] = batch.num_rows
                self.total_rows += batch.num_rows
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return seq

    @property
    def last_seq(self) -> int:
        """The highest sequence number handed out so far (0 if none)."""
        with self.lock:
            return self.next_seq - 1

    def chunks(self, after: int, upto: int | None = None) -> list[Chunk]:
        with self.lock:
            seqs = sorted(s for s in self.index if s > after and (upto is None or s <= upto))
            return [Chunk(s, self.index[s], self._chunk_path(s)) for s in seqs]

    def rows_after(self, seq: int) -> int:
        with self.lock:
            # chunks are deleted from the bottom: those at or below seq are the few
            # planned but not yet committed ones
            below = range(self.lowest, min(seq, self.next_seq - 1) + 1)
            return self.total_rows - sum(self.index.get(s, 0) for s in below)

    def _chunk_path(self, seq: int) -> str:
        return os.path.join(self.path, chunk_name(seq, self.index[seq]))

    def delete_upto(self, seq: int) -> int:
        """Delete every chunk with sequence number <= ``seq``; returns how many."""
        with self.lock:
            doomed = [s for s in self.index if s <= seq]
            if seq > self.committed and not any(s > seq for s in self.index):
                # the marker is needed only when no chunk file above `seq` would remain
                # to carry the numbering over a restart
                self._write_marker(seq)
            for s in doomed:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._chunk_path(s))
                self.total_rows -= self.index.pop(s)
            self.lowest = max(self.lowest, seq + 1)
            return len(doomed)
