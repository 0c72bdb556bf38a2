"""What topics and channels keep beyond their memory queue (Go's ``BackendQueue``): a
:class:`~nsqpy.nsqd.diskqueue.DiskQueue`, or for ``#ephemeral`` ones a :class:`NullBackend`
(Go's ``dummyBackendQueue``) that holds nothing, so overflow is dropped as NSQ does.

:class:`Queued` is the part topics and channels share: a memory queue in front of a backend,
and NSQ's ``Depth()``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .diskqueue import Tails
    from .message import Message


class SyncJob(Protocol):
    def run(self) -> None: ...

    def run_data(self) -> None: ...

    def run_meta(self) -> None: ...


class BackendQueue(Protocol):
    """The backend interface topics and channels use."""

    name: str
    #: records held
    depth: int
    #: False for the null backend: what is put there is gone
    durable: bool

    @property
    def held_bytes(self) -> int:
        """Bytes of the message bodies held."""
        ...

    @property
    def read_position(self) -> tuple[int, int]:
        """Where the next read starts (file number, offset)."""
        ...

    def put_many(
        self,
        records: Sequence[bytes],
        positions: list[int] | None = None,
        heads: Sequence[bytes] | None = None,
    ) -> None: ...

    def read(
        self,
        max_count: int,
        positions: list[int] | None = None,
        max_bytes: int = 0,
        tails: Tails | None = None,
    ) -> list[bytes]: ...

    def read_into(
        self,
        max_count: int,
        sink: Callable[[list[bytes]], None],
        positions: list[int] | None = None,
        max_bytes: int = 0,
        tails: Tails | None = None,
    ) -> int: ...

    def empty(self) -> None: ...

    def delete(self) -> None: ...

    def close(self) -> None: ...

    def needs_sync(self) -> bool: ...

    def prepare_sync(self, force_meta: bool = True) -> SyncJob: ...


class _NoSync:
    again = False

    def run(self) -> None:
        return None

    def run_data(self) -> None:
        return None

    def run_meta(self) -> None:
        return None


_NO_SYNC = _NoSync()


class NullBackend:
    """Holds nothing: puts are dropped, reads find nothing (Go's dummyBackendQueue)."""

    __slots__ = ("name",)

    depth = 0
    held_bytes = 0
    durable = False

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def read_position(self) -> tuple[int, int]:
        return (0, 0)

    def put_many(
        self,
        records: Sequence[bytes],
        positions: list[int] | None = None,
        heads: Sequence[bytes] | None = None,
    ) -> None:
        return None

    def read(
        self,
        max_count: int,
        positions: list[int] | None = None,
        max_bytes: int = 0,
        tails: Tails | None = None,
    ) -> list[bytes]:
        return []

    def read_into(
        self,
        max_count: int,
        sink: Callable[[list[bytes]], None],
        positions: list[int] | None = None,
        max_bytes: int = 0,
        tails: Tails | None = None,
    ) -> int:
        return 0

    def empty(self) -> None:
        return None

    def delete(self) -> None:
        return None

    def close(self) -> None:
        return None

    def needs_sync(self) -> bool:
        return False

    def prepare_sync(self, force_meta: bool = True) -> SyncJob:
        return _NO_SYNC

    def __repr__(self) -> str:
        return f"NullBackend({self.name!r})"


class Queued:
    """A memory queue in front of a backend: the depth accounting topics and channels share."""

    __slots__ = ()

    queue: deque[Message]
    backend: BackendQueue

    @property
    def depth(self) -> int:
        """Messages held (memory + backend), as NSQ's Depth()."""
        return len(self.queue) + self.backend.depth

    @property
    def backend_depth(self) -> int:
        return self.backend.depth
