"""Group commit for the daemon's DiskQueues: fsync off the event loop, many writes per fsync.

Every DiskQueue of the daemon tells its Syncer of its writes, reads and write failures (the
:class:`~nsqpy.nsqd.diskqueue.QueueEvents` hooks). A write that crosses the queue's
--sync-every makes a sync *urgent* and bumps :attr:`Syncer.urgent_requests`: a publisher
compares that counter before and after its publish to know whether it must wait for the
fsync before its ``OK`` (:meth:`Syncer.wait`), so nothing has to carry the answer back up
through the topic and channels.

One round at a time runs in a worker thread: it snapshots every dirty queue (cheap, on the
loop), fsyncs them and their metadata (blocking, in the thread), then releases every waiter
registered before the snapshot, so one fsync answers every publish that arrived before it.
Dirty queues are also synced every --sync-timeout. A failed round (or a failed write) hands
its error to the waiters and to ``on_result`` (the daemon's health, cleared again by the
next successful write or round), and its queues stay dirty, to be retried by the next round
(at the latest after --sync-timeout).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("nsqd")

Waiter = Callable[[BaseException | None], None]


class SyncJob(Protocol):
    def run(self) -> None: ...


class Syncable(Protocol):
    def needs_sync(self) -> bool: ...

    def prepare_sync(self) -> SyncJob: ...


def _run_jobs(jobs: list[SyncJob]) -> None:
    first: BaseException | None = None
    for job in jobs:
        try:
            job.run()
        except BaseException as e:  # noqa: BLE001 - report the first, still sync the rest
            if first is None:
                first = e
    if first is not None:
        raise first


class Syncer:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sync_timeout: float,
        on_result: Callable[[BaseException | str | None], None] | None = None,
    ) -> None:
        self._loop = loop
        self._on_result = on_result
        self._sync_timeout = sync_timeout
        self._dirty: dict[int, Syncable] = {}
        self._waiters: list[Waiter] = []
        self._urgent = False
        self._running: asyncio.Task[None] | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nsqd-sync")
        self._timer: asyncio.Task[None] | None = None
        #: rounds completed (for stats and tests)
        self.rounds = 0
        #: syncs made urgent by writes so far (publishers compare it around a publish)
        self.urgent_requests = 0
        self._unhealthy = False

    def start(self) -> None:
        self._timer = self._loop.create_task(self._periodic())

    # --- QueueEvents ---------------------------------------------------------------------

    def wrote(self, queue: Syncable) -> None:
        """Records were written to ``queue``: sync it soon, now if its --sync-every is
        reached (then :attr:`urgent_requests` grows)."""
        self._dirty[id(queue)] = queue
        if self._unhealthy:
            self._result(None)
        if queue.needs_sync():
            self.urgent_requests += 1
            self._urgent = True
            self._kick()

    def read(self, queue: Syncable) -> None:
        """Records were read: the queue's read position must be persisted too."""
        self._dirty[id(queue)] = queue
        if queue.needs_sync():
            self._urgent = True
            self._kick()

    def write_failed(self, queue: Syncable, error: str) -> None:
        self._result(error)

    def _result(self, error: BaseException | str | None) -> None:
        self._unhealthy = error is not None
        if self._on_result is not None:
            self._on_result(error)

    def deleted(self, queue: Syncable) -> None:
        """A queue was deleted: drop it from the next round."""
        self._dirty.pop(id(queue), None)

    def wait(self, waiter: Waiter) -> None:
        """Call ``waiter(error)`` after the next round that starts from now has finished."""
        self._waiters.append(waiter)
        self._kick()

    def _kick(self) -> None:
        if self._running is None or self._running.done():
            self._running = self._loop.create_task(self._rounds())

    async def _rounds(self) -> None:
        while self._urgent or self._waiters:
            self._urgent = False
            queues = self._dirty
            self._dirty = {}
            jobs = [q.prepare_sync() for q in queues.values()]
            waiters, self._waiters = self._waiters, []
            err: BaseException | None = None
            if jobs:
                try:
                    await self._loop.run_in_executor(self._executor, _run_jobs, jobs)
                except Exception as e:  # noqa: BLE001
                    log.error("DISKQUEUE: fsync failed - %s", e)
                    err = e
                    for key, q in queues.items():
                        self._dirty.setdefault(key, q)
                self._result(err)
            self.rounds += 1
            for w in waiters:
                try:
                    w(err)
                except Exception:
                    log.exception("sync waiter failed")

    async def _periodic(self) -> None:
        while True:
            await asyncio.sleep(self._sync_timeout)
            if self._dirty:
                self._urgent = True
                self._kick()

    async def flush(self) -> None:
        """Sync everything dirty now and wait for it (used at shutdown)."""
        done = self._loop.create_future()

        def release(err: BaseException | None) -> None:
            if not done.done():
                done.set_result(err)

        self._urgent = True
        self.wait(release)
        await done

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
        if self._running is not None and not self._running.done():
            with contextlib.suppress(Exception):
                await self._running
        self._executor.shutdown(wait=True)
