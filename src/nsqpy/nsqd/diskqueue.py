"""DiskQueue: NSQ's file-backed FIFO, byte-compatible with go-diskqueue v1.1.0 (nsqd 1.3.0).

On disk, in ``data_path``:

- ``<name>.diskqueue.%06d.dat`` segments of ``[int32 BE length][data]`` records, append only.
  A put rolls to the next segment *before* writing when ``write_pos > 0`` and the record
  would take the segment past ``max_bytes_per_file`` (so a segment may end exactly at the
  limit, and a record larger than the limit gets a segment to itself).
- ``<name>.diskqueue.meta.dat``: ``"%d\\n%d,%d\\n%d,%d\\n"`` = depth, read file,pos, write
  file,pos; replaced atomically (temp file, fsync, rename, fsync of the directory).
- ``<segment>.bad``: a segment the reader found corrupt, renamed aside.

Readers of a finished segment (one before the write segment) take its end from the file's
real size, as go-diskqueue v1.1 does, so either implementation reads the other's directory.

The class is synchronous and single-threaded (the daemon's event loop), except for
:class:`SyncJob`: :meth:`DiskQueue.prepare_sync` is cheap and runs on the loop, and the
job's :meth:`SyncJob.run` (fsync + metadata) may run in a worker thread meanwhile. Writes go
straight to the OS (``pwrite``, one call per :meth:`DiskQueue.put` or per segment for
:meth:`DiskQueue.put_many`), so there is no Python-side buffer a crash could lose and nothing
the job shares with the loop but the file descriptors it owns.

Beyond go-diskqueue: opening after a crash recovers records written past a stale
metadata write position (in the write segment and in later segments) and truncates a torn
trailing record, instead of skipping to a new file; depth stays exact after corruption or
lost segments (it is recounted from the files), and the reader never renames a fully read
segment to ``.bad`` at a roll boundary (go-diskqueue issue #42).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import struct
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate, chain
from typing import TYPE_CHECKING, NoReturn, Protocol

from .._speedups import compiled
from .fileio import (
    fsync_dir,
    path_error,
    remove_quietly,
    temp_name,
    write_file_atomic,
    write_synced,
)

if TYPE_CHECKING:
    from .journal import Floor, Journal

#: bits of a record's position (:func:`position`) that hold its offset (1 TiB segments)
POS_SHIFT = 40
_OFFSET_MASK = (1 << POS_SHIFT) - 1


def position(file_num: int, offset: int) -> int:
    """A record's position in a queue, its segment number and offset in one int (ordered as
    the records are)."""
    return file_num << POS_SHIFT | offset


def split_position(pos: int) -> tuple[int, int]:
    return pos >> POS_SHIFT, pos & _OFFSET_MASK


__all__ = [
    "DiskQueue",
    "DiskQueueClosedError",
    "DiskQueueError",
    "DiskQueueWriteError",
    "InvalidMessageSizeError",
    "SyncJob",
]

_HDR = struct.Struct(">i")
_pack_len = _HDR.pack
_unpack_len = _HDR.unpack_from
_pwrite = os.pwrite
_pwritev = os.pwritev
#: records averaging this many bytes are written with pwritev from where they are, not
#: joined into one buffer first (a copy of each)
WRITEV_RECORD = 1 << 14
#: buffers per pwritev call (Linux's IOV_MAX is 1024)
_IOV_MAX = 1020

if compiled:
    from .._speedups._hot import frame_records as _c_frame_records
    from .._speedups._hot import split_records as _c_split_records


def frame_records_py(records: list[bytes], start: int, stop: int) -> bytes:
    """``records[start:stop]`` as one segment write: ``[int32 length][record]`` each."""
    part = records[start:stop]
    return b"".join(chain.from_iterable(zip(map(_pack_len, map(len, part)), part, strict=True)))


def split_records_py(
    buf: bytes, off: int, pos: int, limit: int, want: int, mn: int, mx: int, out: list[bytes]
) -> tuple[int, int, int, int, int | None]:
    """Append to ``out`` up to ``want`` records of ``buf`` from ``off`` (file position
    ``pos``), not past the file position ``limit``: (records, off, pos after them, bytes a
    partial record needs in the buffer or 0, an invalid size met or None)."""
    append = out.append
    unpack = _unpack_len
    blen = len(buf)
    got = 0
    while got < want and pos < limit:
        if off + 4 > blen:
            return got, off, pos, 4, None
        n = unpack(buf, off)[0]
        if n < mn or n > mx:
            return got, off, pos, 0, n
        end = off + 4 + n
        if end > blen:
            return got, off, pos, 4 + n, None
        append(buf[off + 4 : end])
        off = end
        pos += 4 + n
        got += 1
    return got, off, pos, 0, None


frame_records = _c_frame_records if compiled else frame_records_py
split_records = _c_split_records if compiled else split_records_py

#: Bytes read from a segment at a time (the most a queue's read buffer holds, beyond one
#: record); the buffer is dropped whenever it is fully consumed. A record larger than this
#: is read on its own, straight into a bytes object of its size.
READ_CHUNK = 1 << 16
#: file numbers probed one by one between a read and a write segment; a longer range is
#: looked up in one directory listing
_PROBE_LIMIT = 64

_META_FMT = "%d\n%d,%d\n%d,%d\n"
_META_RE = re.compile(rb"(-?\d+)\n(-?\d+),(-?\d+)\n(-?\d+),(-?\d+)(?:\n|$)")


class Tails(dict[int, bytes]):
    """Where :meth:`DiskQueue.read` puts the tails of large records: a record longer than
    READ_CHUNK comes back as its first ``split`` bytes in the list read, and the rest here,
    by its index in that list; each piece is read from the file straight into a bytes object
    of its own (the record is never copied to be cut). Record ``i`` is ``records[i] +
    tails.get(i, b"")``."""

    __slots__ = ("split",)

    def __init__(self, split: int) -> None:
        super().__init__()
        self.split = split


class QueueEvents(Protocol):
    """Told of a queue's writes, reads and write failures (nsqd's Syncer: group commit and
    the daemon's health)."""

    def wrote(self, queue: DiskQueue) -> None: ...

    def read(self, queue: DiskQueue) -> None: ...

    def write_failed(self, queue: DiskQueue, error: str) -> None: ...

    def deleted(self, queue: DiskQueue) -> None: ...

    def dirty(self, queue: DiskQueue) -> None: ...


class DiskQueueError(Exception):
    """Base class of DiskQueue errors."""


class DiskQueueClosedError(DiskQueueError):
    """The queue was closed or deleted (go-diskqueue says ``exiting``)."""


class InvalidMessageSizeError(DiskQueueError, ValueError):
    """A record is shorter than min_msg_size or longer than max_msg_size; nothing was written."""


class DiskQueueWriteError(DiskQueueError):
    """Writing to a segment failed (the text is Go's, e.g. ``write <file>: no space left on
    device``). ``written`` records of the call were stored before it."""

    def __init__(self, message: str, written: int) -> None:
        super().__init__(message)
        self.written = written


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class SyncJob:
    """One fsync round for one queue, prepared on the loop, run anywhere (once).

    It owns its file descriptors (duplicates of the write segment's, the segments retired by
    roll-overs since the previous round and the queue's journal, each with its path for error
    messages) and a snapshot of the metadata text, so the loop may keep writing, reading,
    rolling and deleting while it blocks. It runs in two steps, so that a round over several
    queues makes every queue's data durable before any metadata moves a read position past
    it (a topic's backlog copied to its channels): :meth:`run_data`, then :meth:`run_meta`.
    """

    __slots__ = (
        "_dir_first",
        "_durable",
        "_epoch",
        "_failed",
        "_fds",
        "_meta",
        "_queue",
        "_release",
        "_seq",
        "again",
    )

    def __init__(
        self,
        queue: DiskQueue,
        fds: list[tuple[int, str]],
        meta: str | None,
        seq: int,
        epoch: int,
        dir_first: bool,
        release: range = range(0),
        again: bool = False,
        durable: bool = True,
    ) -> None:
        self._queue = queue
        self._fds = fds
        self._meta = meta
        self._seq = seq
        self._epoch = epoch
        self._dir_first = dir_first
        #: segments below the floor, deleted once the metadata naming it is written
        self._release = release
        self._failed = False
        #: the metadata is left for a later round to make durable: the queue stays dirty
        self.again = again
        self._durable = durable

    def run(self) -> None:
        """Both steps; raises an OSError worded as Go's
        (:class:`~nsqpy.nsqd.fileio.PathError`) on failure."""
        self.run_data()
        self.run_meta()

    def run_data(self) -> None:
        """fsync the data (and the directory, when a segment was created)."""
        q = self._queue
        fds, self._fds = self._fds, []
        err: OSError | None = None
        try:
            for fd, path in fds:
                try:
                    os.fsync(fd)
                except OSError as e:
                    if err is None:
                        err = path_error("sync", path, e)
        finally:
            for fd, _ in fds:
                _close_quietly(fd)
        try:
            if err is not None:
                raise err
            if self._dir_first:
                # new segment files must be durable before a publish is acknowledged
                fsync_dir(q.data_path)
        except OSError as e:
            self._fail(e)
            raise

    def run_meta(self) -> None:
        """Write the metadata atomically (after :meth:`run_data` succeeded), then delete the
        segments the floor has passed."""
        q = self._queue
        meta, self._meta = self._meta, None
        if self._failed or meta is None:
            return
        try:
            q._persist_metadata(meta, self._seq, self._epoch, self._durable)
        except OSError as e:
            self._fail(e)
            raise
        for n in self._release:
            path = q.file_name(n)
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                q._log.error("DISKQUEUE(%s) failed to Remove(%s) - %s", q.name, path, e)

    def _fail(self, e: OSError) -> None:
        self._failed = True
        q = self._queue
        q._sync_failed(self._release)
        q._log.error("DISKQUEUE(%s) failed to sync - %s", q.name, e)


class DiskQueue:
    """A filesystem-backed FIFO of byte records in go-diskqueue v1.1.0's format."""

    __slots__ = (
        "_closed",
        "_created",
        "_epoch",
        "_events",
        "_kept_from",
        "_last_meta",
        "_last_sync",
        "_lock",
        "_log",
        "_meta_durable",
        "_meta_path",
        "_meta_seq",
        "_meta_time",
        "_need_sync",
        "_ops",
        "_peek_mark",
        "_prefix",
        "_rbuf",
        "_rbuf_pos",
        "_retired",
        "_rfd",
        "_rsize",
        "_segment_re",
        "_seq",
        "_sizes",
        "_wdirty",
        "_wfd",
        "acks",
        "data_path",
        "depth",
        "journal",
        "max_bytes_per_file",
        "max_msg_size",
        "min_msg_size",
        "name",
        "read_file_num",
        "read_pos",
        "sync_every",
        "sync_timeout",
        "write_file_num",
        "write_pos",
    )

    #: what is put here survives a restart (the null backend's is False)
    durable = True

    def __init__(
        self,
        name: str,
        data_path: str,
        *,
        max_bytes_per_file: int,
        min_msg_size: int,
        max_msg_size: int,
        sync_every: int,
        sync_timeout: float,
        log: logging.Logger | None = None,
        events: QueueEvents | None = None,
    ) -> None:
        self.name = name
        self.data_path = data_path or "."
        self.max_bytes_per_file = max_bytes_per_file
        self.min_msg_size = min_msg_size
        self.max_msg_size = max_msg_size
        self.sync_every = max(1, sync_every)
        self.sync_timeout = sync_timeout
        self._log = log or logging.getLogger("nsqd.diskqueue")
        #: told of every write, read and write failure (the daemon's group commit)
        self._events = events

        #: Records written and not yet read.
        self.depth = 0
        self.read_file_num = 0
        self.read_pos = 0
        self.write_file_num = 0
        self.write_pos = 0

        self._prefix = os.path.join(self.data_path, name + ".diskqueue.")
        self._meta_path = self._prefix + "meta.dat"
        self._segment_re = re.compile(re.escape(name) + r"\.diskqueue\.(\d+)\.dat")

        # writer
        self._wfd: int | None = None
        self._wdirty = False  # written since the last prepare_sync
        self._created = False  # a segment was opened/created since the last prepare_sync
        self._retired: list[tuple[int, str]] = []  # rolled-over segments awaiting their fsync
        # reader: _rbuf holds the segment's bytes from file offset _rbuf_pos on
        self._rfd: int | None = None
        self._rbuf = b""
        self._rbuf_pos = 0
        self._rsize = -1  # end of the (finished) read segment, -1 if not known yet
        # sync policy
        self._ops = 0
        self._need_sync = False
        self._last_sync = time.monotonic()
        self._last_meta: str | None = None
        #: the last metadata written was fsynced (else a later round makes it so)
        self._meta_durable = True
        # shared with SyncJob threads (under _lock)
        self._lock = threading.Lock()
        self._epoch = 0  # bumped by empty()/delete(): older jobs must not write metadata
        self._seq = 0
        self._meta_seq = 0
        self._closed = False
        self._peek_mark = (0, 0, 0)
        #: the crash-safe mode's floor (:class:`~nsqpy.nsqd.journal.Window`): records read
        #: are let go of only as it moves, None for a queue that consumes as it reads
        self.acks: Floor | None = None
        #: a journal synced with the queue's data (:class:`~nsqpy.nsqd.journal.Journal`)
        self.journal: Journal | None = None
        #: time.monotonic() of the last metadata snapshot handed to a sync job
        self._meta_time = 0.0
        #: sizes of finished segments (for :attr:`bytes`), by number
        self._sizes: dict[int, int] = {}

        self._open()
        #: the lowest segment still on disk that the floor may need
        self._kept_from = self.read_file_num

    # ------------------------------------------------------------------ names

    def file_name(self, file_num: int) -> str:
        return "%s%06d.dat" % (self._prefix, file_num)

    def metadata_text(self) -> str:
        """Go's metadata: depth, read file,pos, write file,pos. With a floor (the crash-safe
        mode) the read position is the floor's and the depth counts from there."""
        rfn, rpos, depth = self.read_file_num, self.read_pos, self.depth
        acks = self.acks
        if acks is not None:
            floor = acks.floor()
            if floor is not None:
                rfn, rpos = split_position(floor)
                depth += acks.span
        return _META_FMT % (depth, rfn, rpos, self.write_file_num, self.write_pos)

    @property
    def held_bytes(self) -> int:
        """Bytes of the message bodies held (the records from the read position on, less
        each one's length and header): what a ``max_bytes`` bound counts."""
        rfn, wfn = self.read_file_num, self.write_file_num
        if rfn == wfn:
            total = self.write_pos - self.read_pos
        else:
            total = self._segment_size(rfn) - self.read_pos + self.write_pos
            for n in range(rfn + 1, wfn):
                total += self._segment_size(n)
        return max(total - (4 + self.min_msg_size) * self.depth, 0)

    def _segment_size(self, file_num: int) -> int:
        size = self._sizes.get(file_num)
        if size is None:
            try:
                size = os.stat(self.file_name(file_num)).st_size
            except OSError:
                size = 0
            self._sizes[file_num] = size
        return size

    def floor_file(self) -> int:
        """The segment of the oldest record the queue still needs."""
        acks = self.acks
        floor = acks.floor() if acks is not None else None
        return self.read_file_num if floor is None else floor >> POS_SHIFT

    # ------------------------------------------------------------------ writing

    def put(self, data: bytes) -> None:
        """Append one record. Raises InvalidMessageSizeError, DiskQueueWriteError."""
        n = len(data)
        if n < self.min_msg_size or n > self.max_msg_size or self._closed:
            self._reject(n)
        total = n + 4
        pos = self.write_pos
        if pos and pos + total > self.max_bytes_per_file:
            self._roll()
            pos = 0
        fd = self._wfd
        if fd is None:
            fd = self._open_write_file()
        if n >= WRITEV_RECORD:
            self._pwritev(fd, [_pack_len(n), data], total, pos, 0)
        else:
            self._pwrite(fd, _pack_len(n) + data, pos, 0)
        self.write_pos = pos + total
        self.depth += 1
        self._ops += 1
        self._wdirty = True
        if self._events is not None:
            self._events.wrote(self)

    def _reject(self, n: int) -> NoReturn:
        if self._closed:
            raise DiskQueueClosedError("exiting")
        raise InvalidMessageSizeError(
            "invalid message write size (%d) minMsgSize=%d maxMsgSize=%d"
            % (n, self.min_msg_size, self.max_msg_size)
        )

    def put_many(
        self,
        records: Sequence[bytes],
        positions: list[int] | None = None,
        heads: Sequence[bytes] | None = None,
    ) -> None:
        """Append records in order with one write per segment touched; with ``positions``,
        each written record's position (:func:`position`) is appended
        to it. With ``heads``, record ``i`` is ``heads[i] + records[i]``, written from the
        two pieces (large records are not copied to be written).

        Sizes are checked first: if any is out of range nothing is written. On an I/O error
        the records before the failing segment's batch stay written
        (``DiskQueueWriteError.written``).
        """
        if self._closed:
            self._reject(0)
        if not records:
            return
        mn = self.min_msg_size
        mx = self.max_msg_size
        if heads is None:
            sizes = list(map(len, records))
        else:
            sizes = [len(h) + len(r) for h, r in zip(heads, records, strict=True)]
        if min(sizes) < mn or max(sizes) > mx:
            bad = next(n for n in sizes if n < mn or n > mx)
            raise InvalidMessageSizeError(
                "invalid message write size (%d) minMsgSize=%d maxMsgSize=%d" % (bad, mn, mx)
            )
        if not isinstance(records, list):
            records = list(records)
        limit = self.max_bytes_per_file
        # ends[k]: bytes records[:k] take in a segment; records[i:j] fit from write_pos
        # while write_pos + ends[j] - ends[i] <= limit
        ends = list(accumulate(map((4).__add__, sizes), initial=0))
        total = len(records)
        i = done = 0
        while i < total:
            pos = self.write_pos
            j = bisect_right(ends, limit - pos + ends[i], i) - 1
            if j <= i:
                if pos > 0:  # the next record would take the segment past the limit
                    self._roll()
                    continue
                j = i + 1  # an empty segment takes a record of any size
            nbytes = ends[j] - ends[i]
            if heads is not None or nbytes >= WRITEV_RECORD * (j - i):
                self._write_pieces(records, heads, sizes, i, j, nbytes, pos, done)
            else:
                self._write_batch(frame_records(records, i, j), j - i, pos, done)
            if positions is not None:
                at = (self.write_file_num << POS_SHIFT) + pos - ends[i]
                positions.extend([at + ends[k] for k in range(i, j)])
            done += j - i
            i = j
        if self._events is not None:
            self._events.wrote(self)

    def next_positions(self, sizes: Iterable[int]) -> list[int]:
        """The positions records of these sizes would be written at, in order, by the next
        :meth:`put_many` (the same roll rule): what a journal says of them can be written
        before they are."""
        out = []
        limit = self.max_bytes_per_file
        file_num = self.write_file_num
        pos = self.write_pos
        for n in sizes:
            if pos > 0 and pos + 4 + n > limit:
                file_num += 1
                pos = 0
            out.append(position(file_num, pos))
            pos += 4 + n
        return out

    def _write_batch(self, buf: bytes, count: int, start: int, done: int) -> None:
        fd = self._wfd
        if fd is None:
            fd = self._open_write_file(done)
        self._pwrite(fd, buf, start, done)
        self.write_pos = start + len(buf)
        self.depth += count
        self._ops += count
        self._wdirty = True

    def _write_pieces(
        self,
        records: Sequence[bytes],
        heads: Sequence[bytes] | None,
        sizes: list[int],
        i: int,
        j: int,
        nbytes: int,
        start: int,
        done: int,
    ) -> None:
        """:meth:`_write_batch` of ``records[i:j]`` (after their ``heads``) without framing
        them into one buffer: pwritev of the length prefixes and the records as they are."""
        fd = self._wfd
        if fd is None:
            fd = self._open_write_file(done)
        pack = _pack_len
        per = 3 if heads is not None else 2
        step = _IOV_MAX // per
        pos = start
        for a in range(i, j, step):
            b = min(a + step, j)
            if heads is None:
                parts = list(chain.from_iterable(zip(map(pack, sizes[a:b]), records[a:b], strict=True)))
            else:
                parts = list(
                    chain.from_iterable(zip(map(pack, sizes[a:b]), heads[a:b], records[a:b], strict=True))
                )
            size = sum(sizes[a:b]) + 4 * (b - a)
            try:
                self._pwritev(fd, parts, size, pos, done)
            except DiskQueueWriteError:
                if pos > start:  # the batch's earlier calls too: nothing past write_pos
                    try:
                        os.ftruncate(fd, start)
                    except OSError:
                        pass
                raise
            pos += size
        assert pos == start + nbytes
        self.write_pos = pos
        self.depth += j - i
        self._ops += j - i
        self._wdirty = True

    def _pwritev(self, fd: int, parts: list[bytes], size: int, pos: int, done: int) -> None:
        try:
            written = _pwritev(fd, parts, pos)
        except OSError as e:
            self._write_failed(fd, pos, e, done)
        if written != size:
            # rare (a full disk): the rest as one buffer
            self._pwrite_rest(fd, b"".join(parts), pos, written, done)

    def _pwrite(self, fd: int, buf: bytes, pos: int, done: int) -> None:
        try:
            written = _pwrite(fd, buf, pos)
        except OSError as e:
            self._write_failed(fd, pos, e, done)
        if written != len(buf):
            self._pwrite_rest(fd, buf, pos, written, done)

    def _pwrite_rest(self, fd: int, buf: bytes, pos: int, written: int, done: int) -> None:
        view = memoryview(buf)
        try:
            while written < len(buf):
                n = _pwrite(fd, view[written:], pos + written)
                if n <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written += n
        except OSError as e:
            self._write_failed(fd, pos, e, done)

    def _write_failed(self, fd: int, pos: int, e: OSError, done: int) -> NoReturn:
        # drop any partial record so the segment never holds bytes past write_pos
        try:
            os.ftruncate(fd, pos)
        except OSError:
            pass
        err = path_error("write", self.file_name(self.write_file_num), e)
        self._log.error("DISKQUEUE(%s) failed to write - %s", self.name, err)
        self._write_error(str(err), done)
        raise DiskQueueWriteError(str(err), done) from e

    def _write_error(self, error: str, done: int) -> None:
        ev = self._events
        if ev is not None:
            if done:
                ev.wrote(self)  # the records before the failure are written
            ev.write_failed(self, error)

    def _open_write_file(self, done: int = 0) -> int:
        path = self.file_name(self.write_file_num)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        except OSError as e:
            err = path_error("open", path, e)
            self._log.error("DISKQUEUE(%s) failed to open - %s", self.name, err)
            self._write_error(str(err), done)
            raise DiskQueueWriteError(str(err), done) from e
        self._log.info("DISKQUEUE(%s): writeOne() opened %s", self.name, path)
        self._wfd = fd
        self._created = True
        return fd

    def _roll(self) -> None:
        """Start the next segment; the old one is fsynced by the next sync round."""
        old = self.write_file_num
        fd = self._wfd
        if fd is not None:
            if self._wdirty:
                self._retired.append((fd, self.file_name(old)))
            else:
                os.close(fd)
            self._wfd = None
            self._wdirty = False
        if self.read_file_num == old:
            if self.read_pos >= self.write_pos:
                # the reader has consumed the whole segment: move it on now, rather than
                # leave metadata pointing at the end of a finished file
                self._close_read_file()
                self.read_file_num = old + 1
                self.read_pos = 0
                if self.acks is None:
                    self._remove_segment(old)
            else:
                self._rsize = self.write_pos
        if self.read_file_num <= old:
            self._sizes[old] = self.write_pos
        self.write_file_num = old + 1
        self.write_pos = 0
        # go-diskqueue syncs every time it starts writing a new file
        self._need_sync = True

    # ------------------------------------------------------------------ reading

    @property
    def read_position(self) -> tuple[int, int]:
        """Where the next read starts: (segment number, offset)."""
        return (self.read_file_num, self.read_pos)

    def read(
        self,
        max_count: int,
        positions: list[int] | None = None,
        max_bytes: int = 0,
        tails: Tails | None = None,
    ) -> list[bytes]:
        """Consume up to ``max_count`` records in order (fewer if the queue runs dry, or once
        they span ``max_bytes`` bytes of the files: at least one is read); with
        ``positions``, each one's position is appended to it. With ``tails``, a record
        longer than READ_CHUNK comes back in two pieces (see :class:`Tails`)."""
        out = self._read(max_count, False, positions, max_bytes, tails)
        if out and self._events is not None:
            self._events.read(self)
        return out

    def read_into(
        self,
        max_count: int,
        sink: Callable[[list[bytes]], None],
        positions: list[int] | None = None,
        max_bytes: int = 0,
        tails: Tails | None = None,
    ) -> int:
        """Hand up to ``max_count`` records (all from one segment, spanning at most
        ``max_bytes`` bytes of it unless one record alone is larger) to ``sink`` and consume
        them only once it returns: if ``sink`` raises, they stay at the head of the queue, to
        be read again, and the exception propagates. Returns how many were consumed. With
        ``positions``, the records' positions are appended to it before ``sink`` runs, and
        with ``tails`` the large records' tails (as :meth:`read`)."""
        records = self._read(max_count, True, positions, max_bytes, tails)
        if not records:
            return 0
        first = self._peek_mark  # where the first record starts
        after = (self.read_file_num, self.read_pos)
        try:
            sink(records)
        except BaseException:
            if not self._closed and (self.read_file_num, self.read_pos) == after:
                # put them back: the segment is still there (a peek never leaves it once it
                # has records); the read buffer no longer covers the position, so drop it
                self.read_pos, self.depth, self._ops = first
                self._rbuf = b""
                self._rbuf_pos = self.read_pos
            raise
        self._read_done()
        if self._events is not None:
            self._events.read(self)
        return len(records)

    def scan(self, max_count: int, positions: list[int], start: int | None = None) -> list[bytes]:
        """Up to ``max_count`` records from the read position (or from the position
        ``start``), each one's position appended to ``positions``, without consuming them:
        the queue's state is untouched (its own files are read with a descriptor of their
        own). Stops early at a record it cannot read (the reader will meet it and deal
        with it)."""
        if self._closed:
            raise DiskQueueClosedError("exiting")
        out: list[bytes] = []
        if start is None:
            fn, pos = self.read_file_num, self.read_pos
        else:
            fn, pos = split_position(start)
        wfn = self.write_file_num
        mn, mx = self.min_msg_size, self.max_msg_size
        while len(out) < max_count and fn <= wfn:
            limit = self.write_pos if fn == wfn else self._segment_size(fn)
            if pos >= limit:
                if fn == wfn:
                    break
                fn, pos = fn + 1, 0
                continue
            try:
                fd = os.open(self.file_name(fn), os.O_RDONLY)
            except OSError:
                if fn == wfn:
                    break
                fn, pos = fn + 1, 0  # a segment the reader will find missing
                continue
            try:
                buf = b""
                buf_pos = pos
                while len(out) < max_count and pos < limit:
                    off = pos - buf_pos
                    got_before = len(out)
                    _, off, end, need, bad = split_records(
                        buf, off, pos, limit, max_count - len(out), mn, mx, out
                    )
                    at = (fn << POS_SHIFT) + pos
                    for r in out[got_before:]:
                        positions.append(at)
                        at += 4 + len(r)
                    pos = end
                    if bad is not None:
                        return out
                    if need:
                        if pos + need > limit:
                            return out
                        size = min(max(READ_CHUNK, need), limit - pos)
                        data = os.pread(fd, size, pos)
                        if len(data) < need:
                            return out
                        buf, buf_pos = data, pos
            except OSError:
                return out
            finally:
                _close_quietly(fd)
            if fn == wfn:
                break
            fn, pos = fn + 1, 0
        return out

    def _read(
        self,
        max_count: int,
        peek: bool,
        positions: list[int] | None = None,
        max_bytes: int = 0,
        tails: Tails | None = None,
    ) -> list[bytes]:
        """Records from the read position, consumed. ``peek`` (for :meth:`read_into`): stop
        at the end of the segment or before an error once some records were found, so that
        they can be put back. ``max_bytes`` (0: no bound): stop once the records taken span
        that many bytes of the files (at least one record is taken)."""
        if self._closed:
            raise DiskQueueClosedError("exiting")
        out: list[bytes] = []
        if max_count <= 0:
            return out
        mn = self.min_msg_size
        mx = self.max_msg_size
        budget = max_bytes if max_bytes > 0 else -1
        while len(out) < max_count and budget:
            finished = self.read_file_num < self.write_file_num
            if not finished and self.read_pos >= self.write_pos:
                break
            if self._rfd is None and not self._open_read_file():
                continue
            if finished:
                limit = self._rsize
                if limit < 0:
                    limit = self._rsize = os.fstat(self._rfd).st_size  # type: ignore[arg-type]
                if self.read_pos >= limit:
                    if peek and out:
                        break
                    self._next_read_file()
                    continue
            else:
                limit = self.write_pos
            if peek and not out:
                self._peek_mark = (self.read_pos, self.depth, self._ops)

            buf = self._rbuf
            blen = len(buf)
            pos = self.read_pos
            off = pos - self._rbuf_pos
            want = max_count - len(out)
            start = pos
            # a byte budget is a nearer limit: records starting before it are taken whole
            stop = limit if budget < 0 else min(limit, pos + budget)
            got, off, pos, need, bad_size = split_records(buf, off, pos, stop, want, mn, mx, out)
            bad = None if bad_size is None else "invalid message read size (%d)" % bad_size
            if got:
                if positions is not None:
                    at = (self.read_file_num << POS_SHIFT) + start
                    for r in out[len(out) - got :]:
                        positions.append(at)
                        at += 4 + len(r)
                self.read_pos = pos
                self.depth -= got
                self._ops += got
                if budget > 0:
                    budget = max(budget - (pos - start), 0)
            if bad is not None:
                if peek and out:
                    break  # the next read meets the error with nothing pending
                self._handle_read_error(bad)
                continue
            if need:
                if pos + need > limit:
                    if peek and out:
                        break
                    self._handle_read_error(
                        "short read: %d bytes left for a %d byte record" % (limit - pos, need)
                    )
                    continue
                if need > READ_CHUNK:
                    # a record larger than a chunk: read on its own into a bytes object of
                    # its exact size (no concatenation, no copy out of a buffer), or two
                    try:
                        if tails is None:
                            rec = os.pread(self._rfd, need - 4, pos + 4)  # type: ignore[arg-type]
                            tail = b""
                        else:
                            cut = tails.split
                            rec = os.pread(self._rfd, cut, pos + 4)  # type: ignore[arg-type]
                            tail = os.pread(self._rfd, need - 4 - cut, pos + 4 + cut)  # type: ignore[arg-type]
                    except OSError as e:
                        if peek and out:
                            break
                        self._handle_read_error(
                            str(path_error("read", self.file_name(self.read_file_num), e))
                        )
                        continue
                    if len(rec) + len(tail) < need - 4:
                        if peek and out:
                            break
                        self._handle_read_error("short read (unexpected EOF)")
                        continue
                    if tails is not None:
                        tails[len(out)] = tail
                    out.append(rec)
                    if positions is not None:
                        positions.append((self.read_file_num << POS_SHIFT) + pos)
                    self._rbuf = b""
                    self._rbuf_pos = self.read_pos = pos + need
                    self.depth -= 1
                    self._ops += 1
                    if budget > 0:
                        budget = max(budget - need, 0)
                else:
                    have = blen - off
                    file_end = self._rbuf_pos + blen
                    size = min(max(READ_CHUNK, need - have), limit - file_end)
                    try:
                        data = os.pread(self._rfd, size, file_end)  # type: ignore[arg-type]
                    except OSError as e:
                        if peek and out:
                            break
                        self._handle_read_error(
                            str(path_error("read", self.file_name(self.read_file_num), e))
                        )
                        continue
                    if have + len(data) < need:
                        if peek and out:
                            break
                        self._handle_read_error("short read (unexpected EOF)")
                        continue
                    self._rbuf = buf[off:] + data if have else data
                    self._rbuf_pos = pos
                    continue
                pos = self.read_pos
            if finished and pos >= limit:
                if peek:
                    break
                self._next_read_file()
        if not peek:
            self._read_done()
        return out

    def _read_done(self) -> None:
        if self._rbuf and self.read_pos >= self._rbuf_pos + len(self._rbuf):
            self._rbuf = b""  # idle queues keep no buffer
            self._rbuf_pos = self.read_pos
        if self.depth and self.read_pos == self.write_pos:
            self._check_tail()

    def _open_read_file(self) -> bool:
        path = self.file_name(self.read_file_num)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            self._handle_read_error(str(path_error("open", path, e)))
            return False
        self._log.info("DISKQUEUE(%s): readOne() opened %s", self.name, path)
        self._rfd = fd
        self._rbuf = b""
        self._rbuf_pos = self.read_pos
        self._rsize = -1
        return True

    def _close_read_file(self) -> None:
        if self._rfd is not None:
            _close_quietly(self._rfd)
            self._rfd = None
        self._rbuf = b""
        self._rbuf_pos = 0
        self._rsize = -1

    def _next_read_file(self) -> None:
        """The finished read segment is consumed: delete it and move to the next one."""
        old = self.read_file_num
        self._close_read_file()
        self._sizes.pop(old, None)
        self.read_file_num = old + 1
        self.read_pos = 0
        # go-diskqueue syncs every time it starts reading from a new file
        self._need_sync = True
        if self.acks is None:
            self._remove_segment(old)
        # else: deleted once the floor has passed it (a sync job's release)

    def _remove_segment(self, file_num: int) -> None:
        path = self.file_name(file_num)
        try:
            os.remove(path)
        except OSError as e:
            self._log.error("DISKQUEUE(%s) failed to Remove(%s) - %s", self.name, path, e)

    def _handle_read_error(self, reason: str) -> None:
        """Rename the unreadable read segment to ``.bad`` and move on to the next one."""
        rfn = self.read_file_num
        path = self.file_name(rfn)
        self._log.error("DISKQUEUE(%s) reading at %d of %s - %s", self.name, self.read_pos, path, reason)
        self._close_read_file()
        if rfn == self.write_file_num:
            # the write segment itself is unreadable: abandon it for writes too
            if self._wfd is not None:
                if self._wdirty:
                    self._retired.append((self._wfd, self.file_name(self.write_file_num)))
                else:
                    _close_quietly(self._wfd)
                self._wfd = None
                self._wdirty = False
            self.write_file_num += 1
            self.write_pos = 0
        if os.path.exists(path):
            bad = path + ".bad"
            self._log.warning("DISKQUEUE(%s) jump to next file and saving bad file as %s", self.name, bad)
            try:
                os.rename(path, bad)
            except OSError as e:
                self._log.error(
                    "DISKQUEUE(%s) failed to rename bad diskqueue file %s to %s - %s",
                    self.name,
                    path,
                    bad,
                    e,
                )
        self.read_file_num = self._next_segment(rfn + 1, self.write_file_num)
        self.read_pos = 0
        self._need_sync = True
        # the records lost with the bad segment are unknown: count what is left
        depth = self._count_remaining()
        if depth != self.depth:
            self._log.warning(
                "DISKQUEUE(%s) depth %d -> %d after skipping %s", self.name, self.depth, depth, path
            )
            self.depth = depth
        self._check_tail()

    def _check_tail(self) -> None:
        if self.depth != 0 and self.read_file_num == self.write_file_num and self.read_pos == self.write_pos:
            self._log.error(
                "DISKQUEUE(%s) %s depth at tail (%d), resetting 0...",
                self.name,
                "negative" if self.depth < 0 else "positive",
                self.depth,
            )
            self.depth = 0
            self._need_sync = True

    # ------------------------------------------------------------------ sync

    def mark_dirty(self) -> None:
        """Something beyond reads and writes changed (the floor, the journal): persist it
        with the next sync round."""
        if self._events is not None:
            self._events.dirty(self)

    def needs_sync(self, now: float | None = None) -> bool:
        """True after sync_every reads+writes, a roll-over or a read error, or when there was
        activity and sync_timeout has passed since the last sync (``now``: time.monotonic())."""
        if self._closed:
            return False
        if self._need_sync:
            return True
        ops = self._ops
        if ops == 0:
            return False
        if ops >= self.sync_every:
            return True
        if now is None:
            now = time.monotonic()
        return now - self._last_sync >= self.sync_timeout

    def prepare_sync(self, force_meta: bool = True) -> SyncJob:
        """Snapshot what must be made durable (cheap, on the loop thread).

        Without ``force_meta`` (the daemon's group commit) the metadata is written at most
        *durably* (fsynced, with its directory) once per sync_timeout; in between it is only
        written (a temp file renamed over it: what a kill -9 leaves is whole and current).
        The data's fsync is what makes a write durable for this nsqd (opening after a power
        loss finds the records past a stale write position, and a read position a little
        behind only means records delivered again), but the Go nsqd trusts the metadata's
        write position and would write over what lies past it. The job's ``again`` then says
        the queue still has metadata to make durable."""
        now = time.monotonic()
        self._ops = 0
        self._need_sync = False
        self._last_sync = now
        if self._closed:
            return SyncJob(self, [], None, 0, self._epoch, False)
        fds, self._retired = self._retired, []
        if self._wfd is not None and self._wdirty:
            fds.append((os.dup(self._wfd), self.file_name(self.write_file_num)))
            self._wdirty = False
        j = self.journal
        if j is not None:
            if j.buf:
                try:
                    j.flush()
                except OSError as e:
                    self._log.error("DISKQUEUE(%s) failed to write its journal - %s", self.name, e)
            jfd = j.sync_fd()
            if jfd is not None:
                fds.append(jfd)
        meta: str | None = self.metadata_text()
        durable = force_meta or now - self._meta_time >= self.sync_timeout
        if meta == self._last_meta and (self._meta_durable or not durable):
            meta = None
        else:
            self._last_meta = meta
            self._meta_durable = durable
            if durable:
                self._meta_time = now
        again = not self._meta_durable
        release = range(0)
        if meta is not None and durable and self.acks is not None:
            floor_file = self.floor_file()
            with self._lock:
                if floor_file > self._kept_from:
                    release = range(self._kept_from, floor_file)
                    self._kept_from = floor_file
        self._seq += 1
        dir_first = self._created
        self._created = False
        return SyncJob(self, fds, meta, self._seq, self._epoch, dir_first, release, again, durable)

    def sync(self) -> None:
        """fsync and persist the metadata now, blocking."""
        self.prepare_sync().run()

    def _sync_failed(self, release: range = range(0)) -> None:
        # called from a SyncJob thread: plain stores, read by the loop later
        self._need_sync = True
        self._last_meta = None
        if release:
            with self._lock:
                self._kept_from = min(self._kept_from, release.start)

    def _persist_metadata(self, text: str, seq: int, epoch: int, durable: bool = True) -> None:
        if not durable:
            self._write_metadata_in_place(text.encode(), seq, epoch)
            return
        tmp = temp_name(self._meta_path)
        write_synced(tmp, text.encode())
        with self._lock:
            if epoch != self._epoch or seq <= self._meta_seq:
                # emptied/deleted meanwhile, or a newer round already won
                remove_quietly(tmp)
                return
            try:
                os.replace(tmp, self._meta_path)
            except OSError as e:
                remove_quietly(tmp)
                raise path_error("rename", tmp, e) from None
            self._meta_seq = seq
        fsync_dir(self.data_path)

    def _write_metadata_in_place(self, data: bytes, seq: int, epoch: int) -> None:
        """Overwrite the metadata with one write, no fsync (cheap enough for every round: a
        kill -9 leaves it whole). A shorter text is cut to size after: bytes left past the
        last newline meanwhile are ignored by the Go reader and ours."""
        with self._lock:
            if epoch != self._epoch or seq <= self._meta_seq:
                return
            try:
                fd = os.open(self._meta_path, os.O_WRONLY | os.O_CREAT, 0o600)
            except OSError as e:
                raise path_error("open", self._meta_path, e) from None
            try:
                if _pwrite(fd, data, 0) != len(data):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                if os.fstat(fd).st_size > len(data):
                    os.ftruncate(fd, len(data))
            except OSError as e:
                raise path_error("write", self._meta_path, e) from None
            finally:
                os.close(fd)
            self._meta_seq = seq

    # ------------------------------------------------------------------ lifecycle

    def empty(self) -> None:
        """Drop every record: metadata naming an empty next segment first (a crash while
        the old segments go does not bring them back: they are below the read position),
        then the segments; depth 0."""
        if self._closed:
            raise DiskQueueClosedError("exiting")
        self._log.info("DISKQUEUE(%s): emptying", self.name)
        self._close_files()
        new = self.write_file_num + 1
        with self._lock:
            self._epoch += 1
            try:
                write_file_atomic(self._meta_path, (_META_FMT % (0, new, 0, new, 0)).encode())
            except OSError as e:
                self._log.error("DISKQUEUE(%s) failed to write metadata - %s", self.name, e)
                try:
                    os.remove(self._meta_path)
                except FileNotFoundError:
                    pass
                except OSError as e2:
                    self._log.error("DISKQUEUE(%s) failed to remove metadata file - %s", self.name, e2)
        self._remove_below(new)
        self._sizes.clear()
        self.write_file_num = new
        self.write_pos = 0
        self.read_file_num = new
        self.read_pos = 0
        self._kept_from = self.read_file_num
        self.depth = 0
        self._ops = 0
        self._need_sync = False
        self._last_meta = None

    def delete(self) -> None:
        """Close without syncing and remove every segment and the metadata of this queue."""
        if not self._closed:
            self._log.info("DISKQUEUE(%s): deleting", self.name)
        self._closed = True
        if self._events is not None:
            self._events.deleted(self)
        self._close_files()
        with self._lock:
            self._epoch += 1
            for fn in self._own_files():
                if fn.endswith(".bad"):
                    continue  # corrupt segments are kept for inspection, as NSQ does
                try:
                    os.remove(os.path.join(self.data_path, fn))
                except OSError as e:
                    if e.errno != errno.ENOENT:
                        self._log.error("DISKQUEUE(%s) failed to remove %s - %s", self.name, fn, e)
        self.depth = 0

    def close(self) -> None:
        """Sync (data and metadata) and close; reopening resumes exactly here."""
        if self._closed:
            return
        self._log.info("DISKQUEUE(%s): closing", self.name)
        try:
            self.sync()
        finally:
            self._closed = True
            self._close_files()

    def _close_files(self) -> None:
        self._close_read_file()
        if self._wfd is not None:
            _close_quietly(self._wfd)
            self._wfd = None
        self._wdirty = False
        for fd, _ in self._retired:
            _close_quietly(fd)
        self._retired = []

    def _own_files(self) -> list[str]:
        """Names in data_path that belong to this queue (segments, .bad, metadata, temps)."""
        head = self.name + ".diskqueue."
        meta = head + "meta.dat"
        out: list[str] = []
        try:
            names = os.listdir(self.data_path)
        except FileNotFoundError:
            return out
        for fn in names:
            if not fn.startswith(head):
                continue
            if (
                fn == meta
                or (fn.startswith(meta + ".") and fn.endswith(".tmp"))
                or self._segment_re.fullmatch(fn.removesuffix(".bad"))
            ):
                out.append(fn)
        return out

    def __repr__(self) -> str:
        return "DiskQueue(%r, depth=%d, read=%d:%d, write=%d:%d)" % (
            self.name,
            self.depth,
            self.read_file_num,
            self.read_pos,
            self.write_file_num,
            self.write_pos,
        )

    # ------------------------------------------------------------------ open and recovery

    def _open(self) -> None:
        meta = self._read_metadata()
        if meta is None:
            self._recover_from_files()
            return
        depth, rfn, rpos, wfn, wpos = meta
        if min(meta[1:]) < 0 or rfn > wfn or (rfn == wfn and rpos > wpos):
            self._log.error(
                "DISKQUEUE(%s) inconsistent metadata %r, recovering from the segment files",
                self.name,
                meta,
            )
            self._recover_from_files()
            return
        self._recover_from_metadata(depth, rfn, rpos, wfn, wpos)

    def _read_metadata(self) -> tuple[int, int, int, int, int] | None:
        try:
            with open(self._meta_path, "rb") as f:
                raw = f.read(4096)
        except FileNotFoundError:
            return None
        m = _META_RE.match(raw)
        if m is None:
            self._log.error("DISKQUEUE(%s) failed to retrieveMetaData - unparseable %r", self.name, raw[:100])
            return None
        d, rfn, rpos, wfn, wpos = (int(x) for x in m.groups())
        return d, rfn, rpos, wfn, wpos

    def _recover_from_metadata(self, depth: int, rfn: int, rpos: int, wfn: int, wpos: int) -> None:
        recount = False
        recovered = 0
        changed = False

        # the reader may have consumed (and deleted) segments after the metadata was written
        nxt = self._next_segment(rfn, wfn)
        if nxt != rfn:
            self._log.warning(
                "DISKQUEUE(%s) read file %s is missing, skipping %d file(s) to %s",
                self.name,
                self.file_name(rfn),
                nxt - rfn,
                self.file_name(nxt),
            )
            rfn = nxt
            rpos = 0
            recount = True
        if rfn < wfn and rpos > 0:
            rsize = os.stat(self.file_name(rfn)).st_size
            if rpos > rsize:
                self._log.error(
                    "DISKQUEUE(%s) metadata readPos %d is past the end of %s (%d bytes)",
                    self.name,
                    rpos,
                    self.file_name(rfn),
                    rsize,
                )
                rpos = rsize
                recount = True

        # records written past the metadata's write position (a crash before the next sync)
        path = self.file_name(wfn)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            size = -1
        if size < 0:
            if wpos > 0:
                self._log.error(
                    "DISKQUEUE(%s) write file %s is missing (metadata writePos %d)",
                    self.name,
                    path,
                    wpos,
                )
                wpos = 0
                if rfn == wfn:
                    rpos = 0
                recount = True
        elif size < wpos:
            # the file lost bytes the metadata counted: keep what is whole
            self._log.error(
                "DISKQUEUE(%s) %s is %d bytes, shorter than metadata writePos %d",
                self.name,
                path,
                size,
                wpos,
            )
            if rfn == wfn and rpos >= size:
                rpos = wpos = size  # nothing unread survives; append after what is there
            else:
                start = rpos if rfn == wfn else 0
                scanned = self._scan(path, start)
                assert scanned is not None  # the file exists: its size was just read
                _, end, _ = scanned
                if end < size:
                    self._truncate(path, end, size)
                wpos = end
            recount = True
        elif size > wpos:
            scanned = self._scan(path, wpos)
            assert scanned is not None
            count, end, _ = scanned
            if end < size:
                self._truncate(path, end, size)
            if count or end != wpos:
                self._log.warning(
                    "DISKQUEUE(%s) recovered %d records in %s past metadata writePos %d",
                    self.name,
                    count,
                    path,
                    wpos,
                )
            recovered += count
            wpos = end
            changed = True

        # segments started after the metadata was written
        n = wfn + 1
        while True:
            path = self.file_name(n)
            r = self._scan(path, 0)
            if r is None:
                break
            count, end, size = r
            if end < size:
                self._truncate(path, end, size)
            self._log.warning(
                "DISKQUEUE(%s) recovered %d records in %s, newer than the metadata",
                self.name,
                count,
                path,
            )
            recovered += count
            wfn = n
            wpos = end
            changed = True
            n += 1

        if rfn > 0 and os.path.exists(self.file_name(rfn - 1)):
            # consumed segments a crash kept from being deleted: nothing reads them again
            self._log.warning(
                "DISKQUEUE(%s) removing consumed segments before %s", self.name, self.file_name(rfn)
            )
            self._kept_from = self.read_file_num = rfn
            self._remove_below(rfn)
        self.read_file_num = rfn
        self.read_pos = rpos
        self.write_file_num = wfn
        self.write_pos = wpos
        self.depth = depth + recovered
        if recount or self.depth < 0:
            self.depth = self._count_remaining()
            changed = True
            self._log.warning("DISKQUEUE(%s) metadata depth %d recounted as %d", self.name, depth, self.depth)
        if changed:
            self._need_sync = True
        self._check_tail()

    def _recover_from_files(self) -> None:
        nums = sorted(
            int(m.group(1)) for m in map(self._segment_re.fullmatch, self._own_files()) if m is not None
        )
        if not nums:
            return
        depth = 0
        end = 0
        for n in nums:
            path = self.file_name(n)
            r = self._scan(path, 0)
            if r is None:
                continue
            count, end, size = r
            if end < size:
                self._truncate(path, end, size)
            depth += count
        self.read_file_num = nums[0]
        self.read_pos = 0
        self.write_file_num = nums[-1]
        self.write_pos = end
        self.depth = depth
        self._need_sync = True
        self._log.warning(
            "DISKQUEUE(%s) no usable metadata: recovered %d records from segments %d..%d",
            self.name,
            depth,
            nums[0],
            nums[-1],
        )

    def _scan(self, path: str, start: int, limit: int = -1) -> tuple[int, int, int] | None:
        """Walk whole valid records from ``start``: (count, end of the last one, file size).

        Stops at the first length out of [min, max] or record past the end of the file (or
        past ``limit``). None if the file does not exist.
        """
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            end_at = size if limit < 0 else min(size, limit)
            mn = self.min_msg_size
            mx = self.max_msg_size
            count = 0
            pos = start
            buf = b""
            bpos = start
            while pos + 4 <= end_at:
                off = pos - bpos
                if off < 0 or off + 4 > len(buf):
                    buf = os.pread(fd, READ_CHUNK, pos)
                    bpos = pos
                    off = 0
                    if len(buf) < 4:
                        break
                n = _unpack_len(buf, off)[0]
                if n < mn or n > mx or pos + 4 + n > end_at:
                    break
                pos += 4 + n
                count += 1
            return count, pos, size
        finally:
            os.close(fd)

    def _count_remaining(self) -> int:
        """Readable records from the read position to the write position, from the files."""
        total = 0
        wfn = self.write_file_num
        for n in self._segment_candidates(self.read_file_num, wfn):
            start = self.read_pos if n == self.read_file_num else 0
            r = self._scan(self.file_name(n), start, self.write_pos if n == wfn else -1)
            if r is not None:
                total += r[0]
        return total

    def _segment_candidates(self, lo: int, hi: int) -> Iterable[int]:
        """Segment numbers from ``lo`` to ``hi`` that may exist, ascending: every one for a
        short range, else those a directory listing shows. Metadata may put the read and
        write segments millions apart (bit rot, a hand edit, deleted files); a probe per
        number would take that long, and once per missing segment, quadratic time."""
        if hi - lo <= _PROBE_LIMIT:
            return range(lo, hi + 1)
        nums = {int(m.group(1)) for m in map(self._segment_re.fullmatch, self._own_files()) if m}
        return sorted(n for n in nums if lo <= n <= hi)

    def _next_segment(self, rfn: int, wfn: int) -> int:
        """The first segment from ``rfn`` on whose file exists, or ``wfn`` (the write
        segment, which need not exist yet) if none before it does."""
        for n in self._segment_candidates(rfn, wfn - 1):
            if os.path.exists(self.file_name(n)):
                return n
        return max(rfn, wfn)

    def _remove_below(self, file_num: int) -> None:
        """Delete the segments before ``file_num`` (everything there is consumed), from the
        one just below down to the first that is not there."""
        n = file_num - 1
        while n >= 0:
            path = self.file_name(n)
            try:
                os.remove(path)
            except FileNotFoundError:
                if n < min(self._kept_from, self.read_file_num):
                    return
            except OSError as e:
                self._log.error("DISKQUEUE(%s) failed to remove data file - %s", self.name, e)
            n -= 1

    def _truncate(self, path: str, end: int, size: int) -> None:
        self._log.warning(
            "DISKQUEUE(%s) truncating %s from %d to %d bytes (torn or corrupt tail)",
            self.name,
            path,
            size,
            end,
        )
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, end)
            os.fsync(fd)
        finally:
            os.close(fd)
