"""File-system helpers of the data directory: Go-worded I/O errors, atomic writes, fsync.

NSQ reports disk failures with Go's ``*os.PathError`` text (``write <file>: no space left
on device``), which clients see in ``E_PUB_FAILED`` and operators in ``/ping``;
:class:`PathError` prints an OSError the same way.
"""

from __future__ import annotations

import errno
import os


def go_strerror(err: int | None, fallback: str = "") -> str:
    """Go's text of an errno (the C library's, lower-cased first letter, as Go's table is)."""
    if err is None:
        return fallback or "unknown error"
    text = os.strerror(err)
    return text[:1].lower() + text[1:]


class PathError(OSError):
    """An OSError that prints as Go's ``*os.PathError``: ``<op> <path>: <reason>``."""

    def __init__(self, op: str, path: str, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror, path)
        self.op = op

    def __str__(self) -> str:
        return f"{self.op} {self.filename}: {go_strerror(self.errno, str(self.strerror))}"


def path_error(op: str, path: str, cause: OSError) -> PathError:
    """``cause`` as a PathError (kept as is if it already is one)."""
    return cause if isinstance(cause, PathError) else PathError(op, path, cause)


def fsync_dir(path: str) -> None:
    """fsync a directory (new or renamed entries durable); a file system that cannot fsync a
    directory is not an error."""
    path = path or "."
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as e:
        raise path_error("open", path, e) from None
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise path_error("sync", path, e) from None
    finally:
        os.close(fd)


def write_synced(path: str, data: bytes) -> None:
    """Create (or truncate) ``path`` with ``data`` and fsync it; a short write (a nearly full
    disk) is retried until it fails. Raises :class:`PathError` and then leaves no file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as e:
        raise path_error("open", path, e) from None
    op = "write"
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            op = "sync"
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        remove_quietly(path)
        raise path_error(op, path, e) from None


def remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def temp_name(path: str, suffix: str | None = None) -> str:
    """A temp file beside ``path`` (``<path>.<random>.tmp``), renamed over it once synced."""
    if suffix is None:
        import random  # here: an idle daemon does without the module

        return f"{path}.{random.getrandbits(63)}.tmp"
    return f"{path}.{suffix}.tmp"


def write_file_atomic(path: str, data: bytes, tmp_suffix: str | None = None) -> None:
    """Write ``data`` to a temp file, fsync it, rename it over ``path``, fsync the directory.

    Raises :class:`PathError`; a failed write leaves ``path`` as it was and no temp file.
    """
    tmp = temp_name(path, tmp_suffix)
    write_synced(tmp, data)
    try:
        os.replace(tmp, path)
    except OSError as e:
        remove_quietly(tmp)
        raise path_error("rename", tmp, e) from None
    fsync_dir(os.path.dirname(path))
