"""``nsqd.dat`` (topics, channels, paused flags) and the data-path lock, in NSQ 1.x's format.

``{"topics":[{"channels":[{"name":"c","paused":false}],"name":"t","paused":false}],"version":"1.3.0"}``,
written to ``nsqd.dat.<rand>.tmp``, fsynced and renamed over ``nsqd.dat``. ``#ephemeral``
topics and channels are never written.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from typing import Any

from .. import NSQ_VERSION
from .fileio import go_strerror

METADATA_FILE = "nsqd.dat"


def metadata_path(data_path: str) -> str:
    return os.path.join(data_path or ".", METADATA_FILE)


def encode_metadata(topics: list[dict[str, Any]]) -> bytes:
    return json.dumps({"topics": topics, "version": NSQ_VERSION}, separators=(",", ":")).encode()


def read_metadata(data_path: str) -> list[dict[str, Any]]:
    """The topics recorded in ``nsqd.dat`` (empty when there is none)."""
    path = metadata_path(data_path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return []
    if not raw.strip():
        return []
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"failed to parse metadata in {path} - {e}") from None
    except RecursionError:  # nested deeper than the interpreter's recursion limit
        raise ValueError(f"failed to parse metadata in {path} - exceeded max depth") from None
    topics = doc.get("topics") if isinstance(doc, dict) else None
    if topics is None:
        return []
    if not isinstance(topics, list):
        raise ValueError(f"failed to parse metadata in {path} - topics is not a list")
    return topics


class DataPathLock:
    """``flock(LOCK_EX|LOCK_NB)`` on the data directory itself, as the Go nsqd does, so
    neither daemon can share a directory with another running instance."""

    def __init__(self, data_path: str) -> None:
        self.path = data_path or "."
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise RuntimeError(f"open {self.path}: {go_strerror(e.errno, str(e))}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            raise RuntimeError(
                f"cannot flock directory {self.path} - {go_strerror(e.errno, str(e))} "
                "(possibly in use by another instance of nsqd)"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
