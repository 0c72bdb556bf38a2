"""One topic's output files, as NSQ 1.3's ``apps/nsq_to_file/file_logger.go`` writes them.

:class:`FileLogger` follows Go's ``router`` loop, in batches: a batch is every message that
arrived since the writer last ran (one read from nsqd, or all that came in during an fsync).

Go's rules, kept:

* **Names.** ``computeFilenameFormat`` (``<REV>`` required with gzip, rotation or a work dir,
  else removed; then ``<TOPIC>``, ``<HOST>``, ``<PID>``; ``.gz`` appended), ``<DATETIME>``
  at each check, ``<REV>`` as ``-%06d``: 0 for a new name, +1 for the same name, skipped
  while the file exists in the output dir, exists in the work dir (``O_EXCL`` with gzip or
  ``--rotate-interval``, else ``O_APPEND``) or is already bigger than ``--rotate-size``.
* **Rotation** before a message when no file is open, the name changed, the file is older
  than ``--rotate-interval`` or has grown past ``--rotate-size`` (bytes given to the writer,
  so uncompressed ones with ``--gzip``); on every ``--sync-interval`` tick too (with
  ``--skip-empty-files`` the tick only closes the file, and the next message opens one).
  Closing = gzip trailer, fsync, close, then the move from the work dir to the output dir by
  ``link``+``unlink`` (never overwriting: the revision is bumped instead).
* **Sync and FIN.** Written messages are FINished only after a sync: after the first message
  of a new file, when ``--max-in-flight`` messages are waiting, when the consumer is
  starved (a connection has ≥ 85 % of its RDY in flight), on each tick, on SIGHUP and when
  stopping. With ``--gzip`` a sync ends the gzip member and the next write starts a new
  one, so the members' boundaries are Go's (closing a file ends its current member, even an
  empty one, as Go's ``gzip.Writer.Close`` does).

Where Go calls ``os.Exit(1)`` on an I/O error (full disk, unwritable or missing directory),
this logger logs the error, cuts the file back to its last synced size (no partial line, no
half gzip member is left), REQueues every message that was not synced (with go-nsq's delay
and backoff, as a failed handler does) and carries on: the next message retries. Nothing that
was not written and synced is FINished, and nothing is lost.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import posixpath
import socket
import struct
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from nsqpy.govalues import format_duration_ns

from .nsq_to_file_strftime import Layout, strftime_to_go_layout

__all__ = [
    "FileLogger",
    "FileOptions",
    "GzipMember",
    "compute_filename_format",
    "go_clean",
    "go_join",
]

log = logging.getLogger("nsq_to_file")

T = TypeVar("T")


class Msg(Protocol):
    """What the logger needs of a message (``nsqpy.client.Message``)."""

    body: bytes

    def finish(self) -> None: ...

    def requeue(self, delay: float | None = None, *, backoff: bool = True) -> None: ...


class Starvable(Protocol):
    def is_starved(self) -> bool: ...


@dataclass(slots=True)
class FileOptions:
    """The file flags of nsq_to_file (Go's ``Options`` fields the FileLogger reads)."""

    channel: str = "nsq_to_file"
    output_dir: str = "/tmp"
    work_dir: str = "/tmp"
    datetime_format: str = "%Y-%m-%d_%H"
    filename_format: str = "<TOPIC>.<HOST><REV>.<DATETIME>.log"
    host_identifier: str = ""
    gzip: bool = False
    gzip_level: int = 6
    skip_empty_files: bool = False
    rotate_size: int = 0
    rotate_interval: float = 0.0
    max_in_flight: int = 200


# --- Go's path helpers ----------------------------------------------------------------------


def go_clean(p: str) -> str:
    """Go's ``path.Clean`` (``normpath``, but a leading ``//`` becomes ``/``)."""
    if not p:
        return "."
    out = posixpath.normpath(p)
    if out.startswith("//"):
        out = "/" + out.lstrip("/")
    return out


def go_join(*elems: str) -> str:
    """Go's ``path.Join``/``filepath.Join`` on Unix: empty elements ignored, then Clean."""
    parts = [e for e in elems if e]
    return go_clean("/".join(parts)) if parts else ""


def _trim_prefix(s: str, prefix: str) -> str:
    return s[len(prefix) :] if s.startswith(prefix) else s


def _make_dir_from_path(path: str) -> None:
    """Go's ``makeDirFromPath``: ``MkdirAll(dir, 0770)`` of the path's directory part (every
    directory created gets 0770, as in Go, not only the last one)."""
    d = path[: path.rfind("/") + 1]
    if not d:
        return
    missing: list[str] = []
    cur = d.rstrip("/") or "/"
    while cur and not os.path.isdir(cur):  # "" is the current directory (a relative path)
        missing.append(cur)
        parent = posixpath.dirname(cur)
        if parent == cur:
            break
        cur = parent
    for m in reversed(missing):
        try:
            os.mkdir(m, 0o770)
        except FileExistsError:
            if not os.path.isdir(m):
                raise


def compute_filename_format(
    opts: FileOptions, topic: str, hostname: str | None = None, pid: int | None = None
) -> str:
    """Go's ``computeFilenameFormat``; ValueError when ``<REV>`` is required but missing."""
    host = socket.gethostname() if hostname is None else hostname
    short = host.split(".")[0]
    identifier = short
    if opts.host_identifier:
        identifier = opts.host_identifier.replace("<SHORT_HOST>", short).replace("<HOSTNAME>", host)
    cff = opts.filename_format
    if opts.gzip or opts.rotate_size > 0 or opts.rotate_interval > 0 or opts.work_dir != opts.output_dir:
        if "<REV>" not in cff:
            raise ValueError("missing <REV> in --filename-format when gzip, rotation, or work dir enabled")
    else:
        cff = cff.replace("<REV>", "")
    cff = cff.replace("<TOPIC>", topic)
    cff = cff.replace("<HOST>", identifier)
    cff = cff.replace("<PID>", str(os.getpid() if pid is None else pid))
    if opts.gzip and not cff.endswith(".gz"):
        cff += ".gz"
    return cff


# --- gzip, member by member -----------------------------------------------------------------


class GzipMember:
    """One gzip member as Go's ``gzip.Writer`` frames it: the 10-byte header (no name, mtime
    0, XFL 2 at level 9 and 4 at level 1, OS 255) before the first data or at close, raw
    deflate, then CRC-32 and size. ``close`` of a member that got no data still writes a
    whole (empty) member, as Go does."""

    __slots__ = ("_crc", "_header", "_size", "_z")

    def __init__(self, level: int) -> None:
        self._z = zlib.compressobj(level, zlib.DEFLATED, -15)
        self._crc = 0
        self._size = 0
        xfl = b"\x02" if level == 9 else b"\x04" if level == 1 else b"\x00"
        self._header: bytes | None = b"\x1f\x8b\x08\x00\x00\x00\x00\x00" + xfl + b"\xff"

    def compress(self, data: bytes) -> bytes:
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)
        out = self._z.compress(data)
        if self._header is not None:
            out = self._header + out
            self._header = None
        return out

    def close(self) -> bytes:
        out = self._header or b""
        self._header = None
        return out + self._z.flush() + struct.pack("<II", self._crc, self._size & 0xFFFFFFFF)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:  # pragma: no cover - a regular file never does this
            raise OSError(errno.EIO, "short write")
        view = view[n:]


def _errstr(e: OSError) -> str:
    """An OSError in Go's words: ``write /path: no space left on device``."""
    text = (e.strerror or str(e)).lower()
    if e.filename is not None:
        return f"{e.filename}: {text}"
    return text


class _Failed(Exception):
    """An I/O step failed; ``message`` is the log line's text (already in Go's words)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# --- the logger -----------------------------------------------------------------------------


class FileLogger:
    """The files of one topic. Feed messages with :meth:`put`; run :meth:`run` as a task;
    :meth:`tick` (the ``--sync-interval`` ticker), :meth:`hup` (SIGHUP), :meth:`begin_stop`
    and :meth:`finish` (the consumer is closed: sync, close, return)."""

    def __init__(
        self,
        opts: FileOptions,
        topic: str,
        filename_format: str,
        consumer: Starvable,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
        blocking: Callable[[Callable[[], Any]], Any] | None = None,
    ) -> None:
        self.opts = opts
        self.topic = topic
        self.tag = f"[{topic}/{opts.channel}]"
        self.format = filename_format
        self.layout = Layout(strftime_to_go_layout(opts.datetime_format))
        self.consumer = consumer
        self.clock = clock
        self.wall_ns = wall_ns
        self._blocking = blocking
        self.cap = opts.max_in_flight
        # the open file
        self.fd: int | None = None
        self.path = ""
        self.gz: GzipMember | None = None
        self.filename = ""  # the name template of the open file (<REV> still in it)
        self.open_time = 0.0
        self.filesize = 0  # Go's counter: the file's size at open + bytes given to the writer
        self.rev = 0
        self.offset = 0  # bytes in the file
        self.synced_offset = 0  # the file's size at its last sync: what a rollback keeps
        self.synced_filesize = 0
        # messages
        self.incoming: list[Msg] = []
        self.pending: list[Msg] = []  # written to the open file since its last sync
        self.durable: list[Msg] = []  # in a closed (fsynced) file, FINished at the next sync
        # signals to the writer
        self._waiter: asyncio.Future[None] | None = None
        self._tick = False
        self._hup = False
        self.stopping = False
        self._done = False
        # what happened (the exit summary)
        self.messages_written = 0
        self.messages_requeued = 0
        self.files_written = 0
        self.rotations = 0
        self.errors = 0
        self.unfinished_files: list[str] = []

    # --- feeding ----------------------------------------------------------------------

    def put(self, msg: Msg) -> None:
        """A message from the consumer (cheap: the writer takes them as one batch)."""
        self.incoming.append(msg)
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    def tick(self) -> None:
        self._tick = True
        self._wake()

    def hup(self) -> None:
        self._hup = True
        self._wake()

    def begin_stop(self) -> None:
        """Stopping: sync what is written at once (the consumer is being closed)."""
        self.stopping = True
        self._wake()

    def finish(self) -> None:
        """The consumer is closed: write what is left, sync, close the file, end :meth:`run`."""
        self._done = True
        self._wake()

    # --- the writer -------------------------------------------------------------------

    async def run(self) -> None:
        """Go's ``router``: one iteration per batch of messages or event."""
        loop = asyncio.get_running_loop()
        while True:
            if not (
                self.incoming
                or self._tick
                or self._hup
                or self._done
                or (self.stopping and (self.pending or self.durable))
            ):
                self._waiter = loop.create_future()
                await self._waiter
                continue
            batch, self.incoming = self.incoming, []
            sync = close_file = False
            if self._hup:
                self._hup = False
                sync = close_file = True
            if self._tick:
                self._tick = False
                if not self.stopping and self._needs_rotation(self._current_filename(), self.clock()):
                    self.rotations += 1
                    if self.opts.skip_empty_files:
                        close_file = True
                    else:
                        await self._update_file()
                sync = True
            if batch:
                await self._write_batch(batch)
            if sync or self.stopping or self.consumer.is_starved():
                await self._sync()
            if close_file:
                await self._close()
            if self._done and not self.incoming:
                await self._sync()
                await self._close()
                self._fin_durable()
                return

    async def _write_batch(self, batch: Sequence[Msg]) -> None:
        i, n = 0, len(batch)
        name = self._current_filename()
        now = self.clock()
        while i < n:
            if self._needs_rotation(name, now):
                self.rotations += 1
                if not await self._update_file(name, now):
                    self._requeue(batch[i:])
                    return
                # Go: the message is written to the new file, then everything is synced
                if not self._write(batch, i, i + 1):
                    return
                i += 1
                if not await self._sync():
                    self._requeue(batch[i:])
                    return
                continue
            j = self._run_end(batch, i)
            if not self._write(batch, i, j):
                return
            i = j
            if 0 < self.cap <= len(self.pending) + len(self.durable) and not await self._sync():
                self._requeue(batch[i:])
                return

    def _run_end(self, batch: Sequence[Msg], i: int) -> int:
        """How far from ``i`` Go writes with no rotation or sync in between: up to the
        message before which the file has grown past --rotate-size, or up to the one that
        makes --max-in-flight messages wait for a sync."""
        n = len(batch)
        if self.cap > 0:
            n = min(n, i + max(1, self.cap - len(self.pending) - len(self.durable)))
        limit = self.opts.rotate_size
        if limit <= 0:
            return n
        size = self.filesize
        j = i
        while j < n:
            size += len(batch[j].body) + 1
            j += 1
            if size > limit:
                break
        return j

    def _write(self, batch: Sequence[Msg], i: int, j: int) -> bool:
        """Write messages ``i:j`` of ``batch`` (body and ``\\n`` each) to the open file."""
        assert self.fd is not None
        msgs = batch[i:j]
        parts = [m.body for m in msgs]
        parts.append(b"")
        data = b"\n".join(parts)
        try:
            if self.gz is not None:
                out = self.gz.compress(data)
                if out:
                    _write_all(self.fd, out)
                    self.offset += len(out)
            else:
                _write_all(self.fd, data)
                self.offset += len(data)
        except OSError as e:
            self._fail(f"writing message to disk: {_errstr(_named(e, 'write', self.path))}")
            self._requeue(msgs)
            self._requeue(batch[j:])
            return False
        self.filesize += len(data)
        self.pending.extend(msgs)
        self.messages_written += len(msgs)
        return True

    # --- names and rotation -----------------------------------------------------------

    def _current_filename(self) -> str:
        return self.format.replace("<DATETIME>", self.layout.format(self.wall_ns()))

    def _needs_rotation(self, name: str, now: float) -> bool:
        if self.fd is None:
            return True
        if name != self.filename:
            log.info("%s new filename %s, rotating...", self.tag, name)
            return True
        interval = self.opts.rotate_interval
        if interval > 0 and now - self.open_time > interval:
            log.info(
                "%s %s since last open, rotating...",
                self.tag,
                format_duration_ns(int((now - self.open_time) * 1e9)),
            )
            return True
        if 0 < self.opts.rotate_size < self.filesize:
            log.info(
                "%s %s currently %d bytes (> %d), rotating...",
                self.tag,
                self.path,
                self.filesize,
                self.opts.rotate_size,
            )
            return True
        return False

    async def _update_file(self, name: str | None = None, now: float | None = None) -> bool:
        """Go's ``updateFile``: close the file, then open the next one. False (logged)
        when the file cannot be closed or opened; the state is then as if it had not
        been tried (the next attempt picks the same name)."""
        if not await self._close():
            return False
        name = self._current_filename() if name is None else name
        now = self.clock() if now is None else now
        rev = 0 if name != self.filename else self.rev + 1
        try:
            fd, path, rev, size = await self._in_thread(lambda: self._open(name, rev))
        except _Failed as f:
            self._fail(f.message)
            return False
        self.fd, self.path, self.rev = fd, path, rev
        self.filename = name
        self.open_time = now
        self.filesize = self.offset = self.synced_offset = self.synced_filesize = size
        self.gz = GzipMember(self.opts.gzip_level) if self.opts.gzip else None
        return True

    def _open(self, name: str, rev: int) -> tuple[int, str, int, int]:
        """The open loop of ``updateFile`` (blocking; in a worker thread)."""
        o = self.opts
        full = go_join(o.work_dir, name)
        try:
            _make_dir_from_path(full)
        except OSError as e:
            raise _Failed(f"unable to create dir: {_errstr(_named(e, 'mkdir', full))}") from None
        # without <REV> the name is the same every time: one try (Go would loop forever)
        tries = 1 if "<REV>" not in full else 1 << 30
        for _ in range(tries):
            abs_name = full.replace("<REV>", f"-{rev:06d}")
            if o.work_dir != o.output_dir:
                out_name = go_join(o.output_dir, _trim_prefix(abs_name, o.work_dir))
                try:
                    _make_dir_from_path(out_name)
                except OSError as e:
                    raise _Failed(f"unable to create dir: {_errstr(_named(e, 'mkdir', out_name))}") from None
                try:
                    os.stat(out_name)
                except FileNotFoundError:
                    pass
                except OSError as e:
                    raise _Failed(f"unable to stat output file {out_name}: {_errstr(e)}") from None
                else:
                    log.warning("%s output file already exists: %s", self.tag, out_name)
                    rev += 1
                    continue
            flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
            flags |= os.O_EXCL if o.gzip or o.rotate_interval > 0 else os.O_APPEND
            try:
                fd = os.open(abs_name, flags, 0o666)
            except FileExistsError:
                log.warning("%s working file already exists: %s", self.tag, abs_name)
                rev += 1
                continue
            except OSError as e:
                raise _Failed(f"unable to open {abs_name}: {_errstr(_named(e, 'open', abs_name))}") from None
            log.info("%s opening %s", self.tag, abs_name)
            try:
                size = os.fstat(fd).st_size
            except OSError as e:  # pragma: no cover - fstat of an open file
                os.close(fd)
                raise _Failed(f"unable to stat file {abs_name}: {_errstr(e)}") from None
            if 0 < o.rotate_size < size:
                log.info(
                    "%s %s currently %d bytes (> %d), rotating...", self.tag, abs_name, size, o.rotate_size
                )
                os.close(fd)
                rev += 1
                continue
            return fd, abs_name, rev, size
        raise _Failed(f"unable to open {full}: every revision exists")

    # --- sync, close, move --------------------------------------------------------------

    async def _sync(self) -> bool:
        """Go's ``Sync`` (when messages are waiting): end the gzip member, fsync, FIN."""
        count = len(self.pending) + len(self.durable)
        if count == 0:
            return True
        if self.fd is not None:
            log.info("%s syncing %d records to disk", self.tag, count)
            fd = self.fd
            try:
                if self.gz is not None:
                    tail = self.gz.close()
                    self.gz = GzipMember(self.opts.gzip_level)
                    _write_all(fd, tail)
                    self.offset += len(tail)
                await self._in_thread(lambda: os.fsync(fd))
            except OSError as e:
                self._fail(f"failed syncing messages: {_errstr(_named(e, 'sync', self.path))}")
                self._fin_durable()
                return False
            self.synced_offset = self.offset
            self.synced_filesize = self.filesize
        pending, self.pending = self.pending, []
        for m in pending:
            m.finish()
        self._fin_durable()
        return True

    def _fin_durable(self) -> None:
        durable, self.durable = self.durable, []
        for m in durable:
            m.finish()

    async def _close(self) -> bool:
        """Go's ``Close``: end the gzip member, fsync, close, move to the output dir. The
        messages of the file become FINishable. False (logged) when the file could not be
        completed: its unsynced part was cut off and those messages requeued."""
        fd = self.fd
        if fd is None:
            return True
        ok = True
        try:
            if self.gz is not None:
                tail = self.gz.close()
                _write_all(fd, tail)
                self.offset += len(tail)
            await self._in_thread(lambda: os.fsync(fd))
        except OSError as e:
            # the rollback leaves the file as it was at its last sync (durable), so it is
            # still closed and moved below
            ok = self._fail(f"failed to close output file: {_errstr(_named(e, 'sync', self.path))}")
            if self.fd is None:  # not even the rollback worked: the file stays where it is
                self.gz = None
                return False
            try:
                await self._in_thread(lambda: os.fsync(fd))
            except OSError:
                pass
        self.fd = None
        self.gz = None
        self.durable.extend(self.pending)
        self.pending = []
        src = self.path
        await self._in_thread(lambda: self._close_and_move(fd, src))
        return ok

    def _close_and_move(self, fd: int, src: str) -> None:
        """Close the descriptor, then move the file out of the work dir (blocking)."""
        o = self.opts
        try:
            os.close(fd)
        except OSError as e:
            log.error("%s failed to close output file: %s", self.tag, _errstr(e))
        if o.work_dir == o.output_dir:
            self.files_written += 1
            return
        dst = go_join(o.output_dir, _trim_prefix(src, o.work_dir))
        log.info("%s moving finished file %s to %s", self.tag, src, dst)
        try:
            _exclusive_rename(src, dst)
            self.files_written += 1
            return
        except FileExistsError:
            pass
        except OSError as e:
            self._move_failed(src, dst, e)
            return
        # the destination exists: bump the revision until a free name is found
        tmpl = self.filename[self.filename.rfind("/") + 1 :]
        dst_dir = dst[: dst.rfind("/") + 1]
        dst_tmpl = go_join(dst_dir, tmpl)
        if "<REV>" not in dst_tmpl:
            self._move_failed(src, dst, FileExistsError(errno.EEXIST, "file exists"))
            return
        i = self.rev + 1
        while True:
            log.warning("%s destination file already exists: %s", self.tag, dst)
            dst = dst_tmpl.replace("<REV>", f"-{i:06d}")
            try:
                _exclusive_rename(src, dst)
            except FileExistsError:
                i += 1
                continue
            except OSError as e:
                self._move_failed(src, dst, e)
                return
            log.info("%s renamed finished file %s to %s to avoid overwrite", self.tag, src, dst)
            self.files_written += 1
            return

    def _move_failed(self, src: str, dst: str, e: OSError) -> None:
        # the file is complete and synced: its messages are safe, it stays in the work dir
        self.errors += 1
        self.unfinished_files.append(src)
        log.error(
            "%s unable to move file from %s to %s: %s (it stays there)",
            self.tag,
            src,
            dst,
            _errstr(_named(e, "link", src)),
        )

    # --- failures ---------------------------------------------------------------------

    def _fail(self, what: str) -> bool:
        """Log an I/O failure, cut the open file back to its last sync and requeue the
        messages that were written since. Returns False."""
        self.errors += 1
        log.error("%s %s", self.tag, what)
        fd = self.fd
        if fd is not None:
            try:
                os.ftruncate(fd, self.synced_offset)
                os.lseek(fd, self.synced_offset, os.SEEK_SET)
            except OSError as e:
                log.error(
                    "%s unable to cut %s back to its last synced size %d: %s; the file is "
                    "left as it is and no longer written",
                    self.tag,
                    self.path,
                    self.synced_offset,
                    _errstr(e),
                )
                self.unfinished_files.append(self.path)
                try:
                    os.close(fd)
                except OSError:
                    pass
                self.fd = None
            self.offset = self.synced_offset
            self.filesize = self.synced_filesize
            if self.gz is not None:
                self.gz = GzipMember(self.opts.gzip_level)
        pending, self.pending = self.pending, []
        self.messages_written -= len(pending)
        self._requeue(pending)
        return False

    def _requeue(self, msgs: Sequence[Msg]) -> None:
        """REQ with go-nsq's delay and backoff, as for a failed handler."""
        if not msgs:
            return
        self.messages_requeued += len(msgs)
        log.warning("%s %d messages not written, requeued", self.tag, len(msgs))
        for m in msgs:
            m.requeue()

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        if self._blocking is not None:
            return await self._blocking(fn)  # type: ignore[no-any-return]
        return await asyncio.get_running_loop().run_in_executor(None, fn)


def _exclusive_rename(src: str, dst: str) -> None:
    """Go's ``exclusiveRename``: link then unlink, so an existing file is never replaced."""
    os.link(src, dst)
    os.unlink(src)


def _named(e: OSError, op: str, path: str) -> OSError:
    """Give ``e`` Go's ``op path`` prefix (``write /x/y: no space left on device``)."""
    if e.filename is None:
        e.filename = path
    e.filename = f"{op} {e.filename}"
    return e
