"""Group commit for the daemon's DiskQueues: fsync off the event loop, many writes per fsync.

Every DiskQueue of the daemon tells its Syncer of its writes, reads and write failures (the
:class:`~nsqpy.nsqd.diskqueue.QueueEvents` hooks). A write that crosses the queue's
--sync-every makes a sync *urgent* and bumps :attr:`Syncer.urgent_requests`: a publisher
compares that counter before and after its publish to know whether it must wait for the
fsync before its ``OK`` (:meth:`Syncer.wait`), so nothing has to carry the answer back up
through the topic and channels.

One round at a time runs in the syncer's thread: it snapshots every dirty queue (cheap, on
the loop), fsyncs them and their metadata (blocking, in the thread), then releases every
waiter registered before the snapshot, so one fsync answers every publish that arrived
before it. Dirty queues are also synced every --sync-timeout. A failed round (or a failed
write) hands its error to the waiters and to ``on_result`` (the daemon's health, cleared
again by the next successful write or round), and its queues stay dirty, to be retried by
the next round (at the latest after --sync-timeout).

With ``gather`` (--sync-every=1, where every publish waits for an fsync) a round that would
start with fewer waiters than the publishers active in the last two rounds waits for the
others (at most :data:`GATHER_TIMEOUT`): publishers answered by one round publish again at
once, and one fsync for all of them beats two for half of them each (the rounds of a group
commit otherwise settle into two cohorts taking turns).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("nsqd")

Waiter = Callable[[BaseException | None], None]

#: Longest a round waits for the publishers of the last rounds to publish again.
GATHER_TIMEOUT = 0.002


class SyncJob(Protocol):
    #: the queue still has something to persist (metadata left for a later round)
    again: bool

    def run_data(self) -> None: ...

    def run_meta(self) -> None: ...


class Syncable(Protocol):
    def needs_sync(self) -> bool: ...

    def prepare_sync(self, force_meta: bool = True) -> SyncJob: ...


def _run_jobs(jobs: list[SyncJob]) -> None:
    """Every job's data first, then every job's metadata: no queue's read position moves
    past what another queue of the round (a channel taking a topic's backlog) has yet to
    fsync."""
    first: BaseException | None = None
    for step in ("run_data", "run_meta"):
        for job in jobs:
            try:
                getattr(job, step)()
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
        gather: bool = False,
    ) -> None:
        self._loop = loop
        self._on_result = on_result
        self._sync_timeout = sync_timeout
        self._gather = gather
        self._dirty: dict[int, Syncable] = {}
        self._waiters: list[Waiter] = []
        #: who each waiter publishes for (a connection), to count the active publishers
        self._keys: list[object] = []
        self._urgent = False
        #: a round is in the thread
        self._busy = False
        #: keys of the last round's waiters, and how many to wait for before the next round
        self._last_keys: set[object] = set()
        self._expect = 0
        self._gather_timer: asyncio.TimerHandle | None = None
        #: a round's start is scheduled (call_soon)
        self._scheduled = False
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._idle: asyncio.Future[None] | None = None
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
        """Records were read: the queue's read position must be persisted too, with the
        next round (nobody waits for it: a read position a little behind after a crash
        means records delivered again)."""
        self._dirty[id(queue)] = queue

    def dirty(self, queue: Syncable) -> None:
        """The queue has state to persist (its journal, its floor): at the next round."""
        self._dirty[id(queue)] = queue

    def write_failed(self, queue: Syncable, error: str) -> None:
        self._result(error)

    def _result(self, error: BaseException | str | None) -> None:
        self._unhealthy = error is not None
        if self._on_result is not None:
            self._on_result(error)

    def deleted(self, queue: Syncable) -> None:
        """A queue was deleted: drop it from the next round."""
        self._dirty.pop(id(queue), None)

    def wait(self, waiter: Waiter, key: object = None) -> None:
        """Call ``waiter(error)`` after the next round that starts from now has finished.
        ``key`` names the publisher (its connection; by default the waiter's object)."""
        self._waiters.append(waiter)
        self._keys.append(key if key is not None else getattr(waiter, "__self__", waiter))
        timer = self._gather_timer
        if timer is not None and len(self._waiters) >= self._expect:
            timer.cancel()
            self._gather_timer = None
        self._kick()

    # --- rounds --------------------------------------------------------------------------

    def _kick(self) -> None:
        """Start a round soon if one is due. Never at once: the round's snapshot comes after
        every command the loop is handling now (a client's next PUB in the same read must
        not be answered by a round that did not sync it)."""
        if self._busy or self._scheduled or self._gather_timer is not None:
            return
        if not (self._urgent or self._waiters):
            return
        if self._gather and len(self._waiters) < self._expect:
            self._gather_timer = self._loop.call_later(GATHER_TIMEOUT, self._gathered)
            return
        self._scheduled = True
        self._loop.call_soon(self._start)

    def _gathered(self) -> None:
        self._gather_timer = None
        if not self._busy and not self._scheduled:
            self._scheduled = True
            self._start()

    def _start(self) -> None:
        """Snapshot the dirty queues and hand their jobs to the thread."""
        self._scheduled = False
        if self._busy:
            return
        self._urgent = False
        queues = self._dirty
        self._dirty = {}
        jobs = [q.prepare_sync(force_meta=False) for q in queues.values()]
        waiters, self._waiters = self._waiters, []
        keys, self._keys = self._keys, []
        if not jobs:
            self._finish(queues, jobs, waiters, keys, None)
            return
        self._busy = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="nsqd-sync", daemon=True)
            self._thread.start()
        self._jobs.put((queues, jobs, waiters, keys))

    def _work(self) -> None:
        """The syncer's thread: run each round's jobs, hand the result back to the loop."""
        while True:
            item = self._jobs.get()
            if item is None:
                return
            queues, jobs, waiters, keys = item
            err: BaseException | None = None
            try:
                _run_jobs(jobs)
            except Exception as e:  # noqa: BLE001 - the waiters and the health are told
                err = e
            try:
                self._loop.call_soon_threadsafe(self._finish, queues, jobs, waiters, keys, err)
            except RuntimeError:  # the loop is closed: nobody is left to tell
                return

    def _finish(
        self,
        queues: dict[int, Syncable],
        jobs: list[SyncJob],
        waiters: list[Waiter],
        keys: list[object],
        err: BaseException | None,
    ) -> None:
        self._busy = False
        if jobs:
            if err is not None:
                log.error("DISKQUEUE: fsync failed - %s", err)
                for key, q in queues.items():
                    self._dirty.setdefault(key, q)
            else:
                for (key, q), job in zip(queues.items(), jobs, strict=True):
                    if job.again:
                        self._dirty.setdefault(key, q)
            self._result(err)
        self.rounds += 1
        if self._gather:
            # the publishers of the last two rounds (cohorts taking turns) all come back
            now = set(keys)
            self._expect = len(now | self._last_keys)
            self._last_keys = now
        for w in waiters:
            try:
                w(err)
            except Exception:
                log.exception("sync waiter failed")
        self._kick()
        if self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

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
        self._expect = 0
        self.wait(release, key=done)
        await done

    async def close(self) -> None:
        """Stop the periodic rounds, let a running round finish, stop the thread."""
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
        if self._gather_timer is not None:
            self._gather_timer.cancel()
            self._gathered()
        while self._busy or self._scheduled:
            self._idle = self._loop.create_future()
            await self._idle
        if self._thread is not None:
            self._jobs.put(None)
            await self._loop.run_in_executor(None, self._thread.join)
            self._thread = None
