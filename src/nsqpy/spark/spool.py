"""The chunk spool of the ``nsq`` stream source: durable Arrow IPC files, one per burst, and
the record of the message ids that nsqd may deliver again.

Each chunk is written to a temp file, fsync'd, renamed to
``chunk-<seq, 20 digits>-<rows>.arrow`` and the directory fsync'd; only then may its
messages be FIN'd. Sequence numbers are dense and increase in the order chunks become
visible (the rename happens under the spool's lock), so "every chunk with seq <= N" is a
stable set once N has been handed to Spark. Numbering never restarts below an offset Spark
may have checkpointed: the reader skips past the start offset Spark hands it, and a
``committed`` marker file (written when a commit leaves no chunk file above it) carries
the highest deleted sequence number over a restart as well.

Exactly once: a message that was spooled but whose FIN nsqd did not process (the driver
died between the two, the connection dropped, or the message timed out at nsqd while it
was being spooled) comes back with ``attempts`` > 1. The spool remembers, per nsqd, the
ids that can come back (:meth:`Spool.redeliveries`): the last :attr:`Spool.keep` ids
spooled from each nsqd (every id whose FIN may be unprocessed is among them: nsqd holds at
most a connection's RDY count in flight), and *pinned* ids: those of an ended connection
or an earlier run, and those whose FIN nsqd refused (E_FIN_FAILED: it timed out first). A
redelivery of a remembered id is FIN'd and not spooled again; a pinned id is forgotten
once it came back, or after :data:`PIN_TTL_S`. The record is durable: the ids of the chunk
files present, plus the ``redelivery-ids.arrow`` file, rewritten before a commit deletes
chunk files and whenever an id is pinned because its FIN failed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from typing import NamedTuple

import pyarrow as pa

CHUNK_RE = re.compile(r"^chunk-(\d{20})-(\d+)\.arrow$")
TMP_PREFIX = ".tmp-"
MARKER = "committed"
#: The record of the ids nsqd may deliver again (see the module's docstring).
LEDGER = "redelivery-ids.arrow"
LEDGER_SCHEMA = pa.schema(
    [
        pa.field("nsqd_address", pa.string()),
        pa.field("id", pa.string()),
        # epoch seconds it was pinned; null: one of the last ids spooled (pinned on load)
        pa.field("pinned_at", pa.float64()),
    ]
)
#: How long a pinned id is remembered when nsqd does not deliver it again (its FIN had
#: been processed after all).
PIN_TTL_S = 7 * 24 * 3600.0
#: At most this many pinned ids per nsqd (the oldest are forgotten first).
MAX_PINNED = 1_000_000
#: The least number of recent ids remembered per nsqd.
MIN_KEEP = 10_000

log = logging.getLogger("nsqpy.spark.source")

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
    connection threads and trimmed by commits, and the record of the ids nsqd may deliver
    again. ``keep``: how many recent ids to remember per nsqd (at least the most a
    connection can have in flight). Thread-safe."""

    def __init__(self, path: str, keep: int = MIN_KEEP) -> None:
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
        self.keep = max(keep, MIN_KEEP)
        #: per nsqd: the id arrays of the chunks spooled lately, oldest first, and their rows
        self.recent: dict[str, deque[pa.Array]] = {}
        self.recent_rows: dict[str, int] = {}
        #: per nsqd: id -> when it was pinned (epoch seconds)
        self.pinned: dict[str, dict[str, float]] = {}
        #: ids recognised as redeliveries (FIN'd, not spooled again), over this spool's life
        self.redelivered = 0
        self._load_ledger()

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

    def write(
        self, batch: pa.RecordBatch, address: str | None = None, valid: Callable[[], bool] | None = None
    ) -> int | None:
        """Persist one chunk durably and return its sequence number. ``address``: the nsqd
        its messages came from (default: the batch's ``nsqd_address``). ``valid`` is asked
        once the file is on disk, before it becomes a chunk: if False, the file goes and
        None is returned (the messages must not be FIN'd)."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, ARROW_SCHEMA) as writer:
            writer.write_batch(batch)
        tmp = os.path.join(self.path, f"{TMP_PREFIX}{uuid.uuid4().hex}.arrow")
        if address is None:
            address = str(batch.column(6)[0].as_py()) if batch.num_rows else ""
        try:
            _write_durably(tmp, sink.getvalue())
            if valid is not None and not valid():
                os.unlink(tmp)
                return None
            with self.lock:
                seq = self.next_seq
                os.rename(tmp, os.path.join(self.path, chunk_name(seq, batch.num_rows)))
                fsync_dir(self.path)
                self.next_seq = seq + 1
                if not self.index:
                    self.lowest = seq
                self.index[seq] = batch.num_rows
                self.total_rows += batch.num_rows
                self._remember(address, batch.column(0))
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
        """Delete every chunk with sequence number <= ``seq``; returns how many. The record
        of recent ids is saved first: it must not depend on the files that go."""
        with self.lock:
            doomed = [s for s in self.index if s <= seq]
            if doomed:
                self._save_ledger()
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

    # --- the ids nsqd may deliver again ---------------------------------------------------

    def _remember(self, address: str, ids: pa.Array) -> None:
        """Add a chunk's ids to the nsqd's recent ones (under the lock)."""
        q = self.recent.setdefault(address, deque())
        q.append(ids)
        rows = self.recent_rows.get(address, 0) + len(ids)
        while q and rows - len(q[0]) >= self.keep:
            rows -= len(q.popleft())
        self.recent_rows[address] = rows

    def _recent_ids(self, address: str) -> pa.Array | None:
        q = self.recent.get(address)
        if not q:
            return None
        return q[0] if len(q) == 1 else pa.concat_arrays(list(q))

    def redeliveries(self, address: str, ids: pa.Array, attempts: pa.Array) -> list[int]:
        """The rows of a burst from ``address`` that are messages already spooled: ids
        remembered, or repeated within the burst. Only rows with ``attempts`` > 1 can be
        (a first delivery is new), so the usual burst costs one vectorised comparison.
        Pinned ids found are forgotten (their FIN follows)."""
        import pyarrow.compute as pc  # the driver's runner only: executors read chunks

        again = pc.greater(attempts, 1)
        if not pc.any(again).as_py():
            return []
        rows = pc.indices_nonzero(again).to_pylist()
        candidates = pc.take(ids, pa.array(rows, pa.int64()))
        with self.lock:
            recent = self._recent_ids(address)
            in_recent = (
                pc.is_in(candidates, value_set=recent).to_pylist()
                if recent is not None
                else [False] * len(rows)
            )
            pins = self.pinned.get(address, {})
            burst: dict[str, int] | None = None
            out: list[int] = []
            for row, mid, known in zip(rows, candidates.to_pylist(), in_recent, strict=True):
                if known or pins.pop(mid, None) is not None:
                    out.append(row)
                    continue
                if burst is None:  # first position of each id in the burst
                    burst = {}
                    for i, x in enumerate(ids.to_pylist()):
                        burst.setdefault(x, i)
                if burst[mid] < row:
                    out.append(row)
            self.redelivered += len(out)
            return out

    def refinished(self, address: str, ids: pa.Array) -> None:
        """Redeliveries of ``ids`` were FIN'd again: remember them as recent ids (that FIN
        may not be processed either)."""
        with self.lock:
            self._remember(address, ids)

    def pin(self, address: str, msg_id: str, durable: bool = True) -> None:
        """Remember ``msg_id`` until nsqd delivers it again (its FIN failed: it timed out
        first). Saved at once unless ``durable`` is False."""
        with self.lock:
            self._pin(address, [msg_id], time.time())
            if durable:
                self._save_ledger()

    def _pin(self, address: str, ids: list[str], now: float) -> None:
        pins = self.pinned.setdefault(address, {})
        for i in ids:
            pins[i] = now
        if len(pins) > MAX_PINNED:
            drop = len(pins) - MAX_PINNED
            log.warning("nsq source: forgetting the %d oldest ids pinned for nsqd %s", drop, address)
            for i in sorted(pins, key=pins.__getitem__)[:drop]:
                del pins[i]

    def connection_ended(self, address: str) -> None:
        """A connection to ``address`` ended: every id it may not have FIN'd is among the
        recent ones; pin them (nsqd puts them back at the end of its queue, from where they
        may come back after more than ``keep`` new messages)."""
        with self.lock:
            recent = self._recent_ids(address)
            if recent is not None:
                self._pin(address, recent.to_pylist(), time.time())
                self.recent.pop(address, None)
                self.recent_rows.pop(address, None)

    def pinned_count(self) -> int:
        with self.lock:
            return sum(len(p) for p in self.pinned.values())

    def _load_ledger(self) -> None:
        """Pin every id the last run may not have FIN'd: the ledger's and the newest chunks'."""
        now = time.time()
        path = os.path.join(self.path, LEDGER)
        try:
            with pa.memory_map(path, "r") as source:
                table = pa.ipc.open_file(source).read_all()
        except FileNotFoundError:
            table = None
        except (OSError, pa.ArrowInvalid) as exc:
            raise ValueError(f"spool {self.path}: unreadable {LEDGER!r}: {exc}") from exc
        if table is not None:
            cutoff = now - PIN_TTL_S
            for addr, mid, at in zip(
                table.column("nsqd_address").to_pylist(),
                table.column("id").to_pylist(),
                table.column("pinned_at").to_pylist(),
                strict=True,
            ):
                if at is None or at >= cutoff:
                    self.pinned.setdefault(addr, {})[mid] = now if at is None else at
        # the newest chunks' ids, up to `keep` per nsqd (older ones were FIN'd long since)
        have: dict[str, int] = {}
        for seq in sorted(self.index, reverse=True):
            for batch in read_chunk(self._chunk_path(seq)):
                if not batch.num_rows:
                    continue
                addr = str(batch.column(6)[0].as_py())
                if have.get(addr, 0) >= self.keep:
                    continue
                have[addr] = have.get(addr, 0) + batch.num_rows
                pins = self.pinned.setdefault(addr, {})
                for mid in batch.column(0).to_pylist():
                    pins.setdefault(mid, now)

    def _save_ledger(self) -> None:
        """Write the pinned ids (not expired) and the recent ones durably (under the lock)."""
        cutoff = time.time() - PIN_TTL_S
        addrs: list[str] = []
        ids: list[str] = []
        ats: list[float | None] = []
        for addr, pins in self.pinned.items():
            for mid, at in pins.items():
                if at >= cutoff:
                    addrs.append(addr)
                    ids.append(mid)
                    ats.append(at)
        parts = [
            pa.table(
                [pa.array(addrs, pa.string()), pa.array(ids, pa.string()), pa.array(ats, pa.float64())],
                schema=LEDGER_SCHEMA,
            )
        ]
        for addr in self.recent:
            recent = self._recent_ids(addr)
            if recent is None:
                continue
            n = len(recent)
            parts.append(
                pa.table(
                    [pa.array([addr] * n, pa.string()), recent, pa.nulls(n, pa.float64())],
                    schema=LEDGER_SCHEMA,
                )
            )
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, LEDGER_SCHEMA) as writer:
            writer.write_table(pa.concat_tables(parts))
        tmp = os.path.join(self.path, f"{TMP_PREFIX}{LEDGER}")
        _write_durably(tmp, sink.getvalue())
        os.replace(tmp, os.path.join(self.path, LEDGER))
        fsync_dir(self.path)
