"""nsqd restarted over and over while it works: killed with SIGKILL under load in the
crash-safe mode (``--mem-queue-size=0 --sync-every=1``), and stopped with SIGTERM with
default settings. The promise: every message nsqd acknowledged (``OK`` to PUB, MPUB and
DPUB) is delivered on every channel until a consumer's FIN, and after the kills never before
it is due.

The console script runs as a subprocess on a data path that survives the restarts;
publishers and consumers are raw protocol-V2 clients in the test's event loop. Each kill
lands at a random point (after a random number of acknowledgements in that life), so it
hits publishes, consumer FINs, segment rolls and metadata writes at varying moments.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections import Counter

import pytest
from e2e.proc import NsqdProcess
from support import RawClient

from nsqpy.protocol import commands
from nsqpy.protocol.frames import FRAME_TYPE_MESSAGE, decode_message

pytestmark = pytest.mark.timeout(240)

STRICT = ("--mem-queue-size=0", "--sync-every=1")
KILL_CYCLES = int(os.environ.get("NSQPY_KILL_CYCLES", "50"))
TERM_CYCLES = 8


async def until_acknowledged(load: Load | CrashStorm, acks: int, publishers: list[asyncio.Task]) -> None:
    """Return once ``acks`` messages were acknowledged in this life (``load.acks_this_life``;
    the publishers set ``load.changed``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while load.acks_this_life < acks:
        assert loop.time() < deadline, f"only {load.acks_this_life} of {acks} acknowledged in 20 s"
        assert not all(t.done() for t in publishers), "every publisher stopped"
        load.changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(load.changed.wait(), 1)


class Load:
    """Publishers and consumers against one nsqd life; results accumulate across lives."""

    def __init__(
        self,
        rng: random.Random,
        channels: tuple[str, ...],
        dpub: bool,
        consumed: tuple[str, ...] | None = None,
    ) -> None:
        self.rng = rng
        self.channels = channels
        #: the channels with consumers while nsqd runs (the others are read at the end only)
        self.consumed = channels if consumed is None else consumed
        #: per life, the largest RDY a consumer gave (what can be in flight at a crash)
        self.rdy_of_life: list[int] = []
        self.dpub = dpub
        self.acked: set[bytes] = set()
        self.delivered: dict[str, set[bytes]] = {ch: set() for ch in channels}
        self.seq = 0
        #: body -> the life (cycle) that acknowledged it, for the failure message
        self.life_of: dict[bytes, int] = {}
        self.life_no = -1
        self.acks_this_life = 0
        self.changed = asyncio.Event()

    def _body(self, kind: str) -> bytes:
        self.seq += 1
        return b"%s-%08d" % (kind.encode(), self.seq)

    async def publisher(self, port: int, stop: asyncio.Event) -> None:
        """PUB, MPUB (and DPUB) one at a time; a body counts once its OK arrived."""
        with contextlib.suppress(ConnectionError, OSError, TimeoutError, AssertionError):
            c = await RawClient.connect(port)
            try:
                while not stop.is_set():
                    r = self.rng.random()
                    if r < 0.5:
                        batch = [self._body("p")]
                        c.send(commands.pub("t", batch[0]))
                    elif r < 0.85 or not self.dpub:
                        batch = [self._body("m") for _ in range(self.rng.randint(2, 20))]
                        c.send(commands.mpub("t", batch))
                    else:
                        batch = [self._body("d")]
                        c.send(commands.dpub("t", self.rng.choice([0, 50, 500]), batch[0]))
                    frame = await c.read_frame(timeout=10)
                    if frame != (0, b"OK"):
                        return
                    self.acked.update(batch)
                    self.life_of.update((b, self.life_no) for b in batch)
                    self.acks_this_life += len(batch)
                    self.changed.set()
            finally:
                await c.close()

    async def consumer(self, port: int, channel: str, stop: asyncio.Event, hold: float = 0.0) -> None:
        """FIN what arrives (after recording it); with ``hold``, that share stays unanswered
        (in flight when the daemon goes down)."""
        with contextlib.suppress(ConnectionError, OSError, TimeoutError, AssertionError):
            c = await RawClient.connect(port)
            try:
                rdy = self.rng.choice([1, 20, 200])
                self.rdy_of_life[-1] = max(self.rdy_of_life[-1], rdy)
                await c.sub("t", channel, rdy=rdy)
                while not stop.is_set():
                    try:
                        ftype, data = await c.read_frame(timeout=0.2)
                    except TimeoutError:
                        continue
                    if ftype != FRAME_TYPE_MESSAGE:
                        continue
                    m = decode_message(data)
                    self.delivered[channel].add(m.body)
                    if self.rng.random() >= hold:
                        c.send(commands.fin(m.id))
            finally:
                await c.close()

    async def life(self, port: int, acks: int, hold: float) -> tuple[asyncio.Event, list[asyncio.Task]]:
        """Start the load; return once ``acks`` messages were acknowledged in this life."""
        stop = asyncio.Event()
        self.acks_this_life = 0
        self.life_no += 1
        self.rdy_of_life.append(0)
        tasks = [asyncio.create_task(self.publisher(port, stop)) for _ in range(3)]
        tasks += [asyncio.create_task(self.consumer(port, ch, stop, hold)) for ch in self.consumed]
        await until_acknowledged(self, acks, tasks[:3])
        return stop, tasks


def create_channels(p: NsqdProcess, channels: tuple[str, ...]) -> None:
    """Channels exist before the first publish: each gets every message from the start."""
    assert p.http_post("/topic/create?topic=t")[0] == 200
    for ch in channels:
        assert p.http_post(f"/channel/create?topic=t&channel={ch}")[0] == 200


async def drain(load: Load, port: int, quiet: float = 1.5) -> None:
    """Consume every channel until nothing arrives for ``quiet`` seconds (deferred messages
    are at most 500 ms away)."""
    for ch in load.channels:
        c = await RawClient.connect(port)
        await c.sub("t", ch, rdy=2500)
        while True:
            try:
                m = await c.read_message(timeout=quiet)
            except TimeoutError:
                break
            load.delivered[ch].add(m.body)
            c.send(commands.fin(m.id))
        await c.close()


def report_losses(load: Load, channels: tuple[str, ...]) -> None:
    """Every acknowledged message reached each of ``channels``."""
    for ch in channels:
        lost = load.acked - load.delivered[ch]
        lives = Counter(load.life_of[b] for b in lost)
        assert not lost, (
            f"channel {ch}: {len(lost)} of {len(load.acked)} acknowledged messages lost "
            f"(acknowledged in lives {dict(sorted(lives.items()))}), e.g. {sorted(lost)[:5]}"
        )


def check_logs(p: NsqdProcess) -> None:
    err = p.stderr()
    assert "Traceback" not in err, p.describe(20000)


class Consumer:
    """A consumer of the crash-safe storm: it FINs (fast, or slowly: one at a time with a
    pause), REQs a share with a delay, and holds a share unanswered (in flight at the kill).
    A FIN or REQ counts once nsqd has acted on it: each batch is followed by a ``FIN`` of an
    id nobody has, whose ``E_FIN_FAILED`` comes back after everything sent before it."""

    MARKER = commands.fin(b"0" * 16)

    def __init__(self, storm: CrashStorm, channel: str, rdy: int, slow: bool, mix: bool) -> None:
        self.storm = storm
        self.channel = channel
        self.rdy = rdy
        self.slow = slow
        self.mix = mix  # REQ some (with delays) and hold some

    async def run(self, port: int, stop: asyncio.Event) -> None:
        st = self.storm
        rng = st.rng
        with contextlib.suppress(
            ConnectionError, OSError, TimeoutError, AssertionError, asyncio.IncompleteReadError
        ):
            c = await RawClient.connect(port)
            sent: list[tuple[str, bytes, float]] = []  # acted on once the marker answers
            marker_out: list[tuple[str, bytes, float]] | None = None
            try:
                await c.sub("t", self.channel, rdy=self.rdy)
                while not stop.is_set():
                    try:
                        ftype, data = await c.read_frame(timeout=0.1)
                    except TimeoutError:
                        ftype, data = -1, b""
                    if ftype == FRAME_TYPE_MESSAGE:
                        m = decode_message(data)
                        st.delivered(self.channel, m)
                        r = rng.random() if self.mix else 1.0
                        if r < 0.1:
                            continue  # held: in flight when nsqd is killed
                        if self.slow:
                            await asyncio.sleep(0.01)
                        if r < 0.25:
                            delay = rng.choice([0, 50, 300])
                            c.send(commands.req(m.id, delay))
                            sent.append(("req", m.body, time.time() + delay / 1000))
                        else:
                            c.send(commands.fin(m.id))
                            sent.append(("fin", m.body, 0.0))
                            # nsqd may act on it and the kill come before the marker's answer
                            st.fin_sent[self.channel].add(m.body)
                    elif ftype == 1 and data.startswith(b"E_FIN_FAILED") and marker_out is not None:
                        st.acted_on(self.channel, marker_out)
                        marker_out = None
                    if sent and marker_out is None:
                        c.send(self.MARKER)
                        marker_out, sent = sent, []
            finally:
                await c.close()


class CrashStorm:
    """What was acknowledged, delivered and finished, per channel, across nsqd's lives."""

    def __init__(self, rng: random.Random, channels: tuple[str, ...]) -> None:
        self.rng = rng
        self.channels = channels
        self.acked: set[bytes] = set()
        self.finished: dict[str, set[bytes]] = {ch: set() for ch in channels}
        #: FINs sent, whether nsqd acted on them or a kill came first
        self.fin_sent: dict[str, set[bytes]] = {ch: set() for ch in channels}
        self.deliveries = 0
        self.redelivered_finished = 0
        #: a message must not arrive before this (DPUB, REQ with a delay), per channel
        self.not_before: dict[str, dict[bytes, float]] = {ch: {} for ch in channels}
        self.attempts: dict[str, dict[bytes, int]] = {ch: {} for ch in channels}
        self.seq = 0
        self.acks_this_life = 0
        self.changed = asyncio.Event()
        self.errors: list[str] = []

    def delivered(self, channel: str, m) -> None:
        self.deliveries += 1
        now = time.time()
        due = self.not_before[channel].pop(m.body, 0.0)
        if now < due - 0.005:
            self.errors.append(f"{channel}: {m.body!r} delivered {due - now:.3f}s before it was due")
        last = self.attempts[channel].get(m.body, 0)
        if m.attempts <= last:
            self.errors.append(f"{channel}: {m.body!r} delivered with attempts {m.attempts} after {last}")
        self.attempts[channel][m.body] = m.attempts
        if m.body in self.finished[channel]:
            self.redelivered_finished += 1  # a FIN a kill made nsqd forget: allowed

    def acted_on(self, channel: str, batch: list[tuple[str, bytes, float]]) -> None:
        for what, body, due in batch:
            if what == "fin":
                self.finished[channel].add(body)
            elif due:
                self.not_before[channel][body] = due

    async def publisher(self, port: int, stop: asyncio.Event) -> None:
        rng = self.rng
        with contextlib.suppress(
            ConnectionError, OSError, TimeoutError, AssertionError, asyncio.IncompleteReadError
        ):
            c = await RawClient.connect(port)
            try:
                while not stop.is_set():
                    r = rng.random()
                    self.seq += 1
                    delay = 0
                    if r < 0.4:
                        batch = [b"p-%08d" % self.seq]
                        c.send(commands.pub("t", batch[0]))
                    elif r < 0.8:
                        batch = [b"m-%08d-%02d" % (self.seq, i) for i in range(rng.randint(2, 20))]
                        c.send(commands.mpub("t", batch))
                    else:
                        delay = rng.choice([0, 50, 500])
                        batch = [b"d-%08d" % self.seq]
                        c.send(commands.dpub("t", delay, batch[0]))
                    sent_at = time.time()
                    if await c.read_frame(timeout=10) != (0, b"OK"):
                        return
                    self.acked.update(batch)
                    if delay:
                        for ch in self.channels:
                            self.not_before[ch][batch[0]] = sent_at + delay / 1000
                    self.acks_this_life += len(batch)
                    self.changed.set()
            finally:
                await c.close()

    async def life(self, port: int, acks: int, consumers: list[Consumer]) -> tuple[asyncio.Event, list]:
        stop = asyncio.Event()
        self.acks_this_life = 0
        tasks = [asyncio.create_task(self.publisher(port, stop)) for _ in range(3)]
        tasks += [asyncio.create_task(c.run(port, stop)) for c in consumers]
        await until_acknowledged(self, acks, tasks[:3])
        return stop, tasks


async def test_kill9_storm_in_crash_safe_mode_loses_nothing(tmp_path):
    """50 kills at random moments under PUB, MPUB and DPUB, a fast consumer that REQs with
    delays and holds messages in flight, a slow one, and a channel read only at the end:
    every acknowledged message is delivered on every channel until a FIN nsqd acted on,
    never before it is due, its attempts counted across the kills."""
    rng = random.Random(20)
    storm = CrashStorm(rng, ("archive", "fast", "slow"))
    data = tmp_path / "data"
    for cycle in range(KILL_CYCLES):
        p = NsqdProcess(data, *STRICT, log_dir=tmp_path / f"logs-{cycle:02d}").start()
        try:
            if cycle == 0:
                create_channels(p, storm.channels)
            consumers = [
                Consumer(storm, "fast", rng.choice([20, 200]), slow=False, mix=True),
                Consumer(storm, "slow", 1, slow=True, mix=True),
            ]
            stop, tasks = await storm.life(p.tcp_port, rng.randint(20, 300), consumers)
            await asyncio.sleep(rng.random() * 0.05)  # the consumers at work a little longer
            p.kill()  # SIGKILL by PID, mid-load
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 20)
        finally:
            p.kill()
        check_logs(p)
    p = NsqdProcess(data, *STRICT, log_dir=tmp_path / "logs-final").start()
    try:
        stop = asyncio.Event()
        drains = [Consumer(storm, ch, 500, slow=False, mix=False) for ch in storm.channels]
        tasks = [asyncio.create_task(c.run(p.tcp_port, stop)) for c in drains]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        owed = lambda: any(storm.acked - storm.finished[ch] - storm.fin_sent[ch] for ch in storm.channels)  # noqa: E731
        while owed() and loop.time() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # anything more would come now (REQ delays are <= 0.5 s)
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        code = p.stop()
    assert code == 0, p.describe()
    check_logs(p)
    assert len(storm.acked) > KILL_CYCLES * 20
    for ch in storm.channels:
        lost = storm.acked - storm.finished[ch] - storm.fin_sent[ch]
        assert not lost, (
            f"channel {ch}: {len(lost)} of {len(storm.acked)} acknowledged messages lost, "
            f"e.g. {sorted(lost)[:5]}"
        )
    assert not storm.errors, storm.errors[:10]
    print(
        f"kill -9 storm: {KILL_CYCLES} kills, {len(storm.acked)} acknowledged, "
        f"{storm.deliveries} deliveries, 0 lost on {len(storm.channels)} channels; "
        f"{storm.redelivered_finished} FIN'd message(s) delivered again"
    )


async def test_sigterm_restarts_with_default_settings_lose_nothing(tmp_path):
    """Memory queues, in-flight messages (a share is never FIN'd before the stop) and
    deferred ones all go to disk on SIGTERM and come back."""
    rng = random.Random(21)
    load = Load(rng, ("a", "b"), dpub=True)
    data = tmp_path / "data"
    for cycle in range(TERM_CYCLES):
        p = NsqdProcess(data, "--msg-timeout=2s", log_dir=tmp_path / f"logs-{cycle}").start()
        try:
            if cycle == 0:
                create_channels(p, load.channels)
            stop, tasks = await load.life(p.tcp_port, acks=rng.randint(200, 2000), hold=0.3)
            p.send_signal(signal.SIGTERM)
            code = await asyncio.get_running_loop().run_in_executor(None, p.wait, 30)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 20)
        finally:
            p.kill()
        assert code == 0, p.describe()
        check_logs(p)
    p = NsqdProcess(data, "--msg-timeout=2s", log_dir=tmp_path / "logs-final").start()
    try:
        await drain(load, p.tcp_port, quiet=3.0)
    finally:
        code = p.stop()
    assert code == 0, p.describe()
    report_losses(load, load.channels)
