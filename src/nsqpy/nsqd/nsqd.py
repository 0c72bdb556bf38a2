"""NSQD: the daemon object. Owns topics, listeners, clients and the periodic queue scan.

Use it in-process::

    async with NSQD(Options(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0")) as nsqd:
        print(nsqd.tcp_address, nsqd.http_address)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import itertools
import json
import logging
import os
import socket
import ssl
import time
from typing import TYPE_CHECKING, Any

from .. import NSQ_VERSION, _speedups
from ..adminauth import AdminAuth
from ..daemon import LISTEN_BACKLOG, bound_port
from ..daemon import listen_socket as _listen_socket
from ..protocol.address import format_address
from ..protocol.frames import MESSAGE_HEADER_SIZE
from ..protocol.names import is_ephemeral, is_valid_topic_name
from .auth import AuthClient
from .backend import BackendQueue, NullBackend
from .fileio import write_file_atomic
from .guid import GUIDFactory
from .lookup import LookupPeers, register, unregister
from .metadata import DataPathLock, encode_metadata, metadata_path, read_metadata
from .options import Options
from .policy import CHANNEL_KEYS, TOPIC_KEYS, Policy, PolicyError
from .stats import install_gc_tracker
from .syncer import Syncer

if TYPE_CHECKING:
    from .client_v2 import ClientV2, HeartbeatWheel
    from .protocol_v2 import ProtocolV2
    from .topic import Topic

# Topics (with their channels and disk queues) and the TCP protocol are imported with the
# first topic and the first connection: a daemon nobody uses yet stays small (idle RSS).

#: A stored message's bytes beyond its body: timestamp, attempts and id.
MESSAGE_OVERHEAD = MESSAGE_HEADER_SIZE - 4

#: Seconds between attempts to write nsqd.dat after a failure (a full disk).
METADATA_RETRY = 1.0

log = logging.getLogger("nsqd")


def https_context(opts: Options) -> ssl.SSLContext:
    """The HTTPS listener's context (stdlib ssl, for nsqpy.httpserver). With any
    --tls-client-auth-policy a client certificate is required and verified against
    --tls-root-ca-file: the stdlib cannot accept an unverified one as Go's ``require`` does
    (the TCP upgrade does, through pyOpenSSL)."""
    from ..transport import server_tls_context

    policy = "require-verify" if opts.tls_client_auth_policy else ""
    ctx = server_tls_context(
        opts.tls_cert, opts.tls_key, policy, opts.tls_root_ca_file, opts.tls_min_version.lower()
    )
    assert isinstance(ctx, ssl.SSLContext)
    return ctx


def _import_http() -> Any:
    """``nsqpy.nsqd.http``, imported on the loop: ~10 ms once, now that the HTTP server is
    :mod:`nsqpy.httpserver` (an import in a worker thread, as aiohttp's 0.2 s needed, left
    the thread and its malloc arena in the daemon's memory: 0.4 MiB, issue 31)."""
    return importlib.import_module("nsqpy.nsqd.http")


class LazyHTTP:
    """An HTTP(S) listener whose server starts with its first connection.

    The socket listens from the start (so its address is known and connections queue in
    its backlog); the HTTP server and the API's modules (~1 MiB of an idle daemon's memory)
    are imported only when a client connects.
    """

    def __init__(self, nsqd: NSQD, sock: socket.socket, ssl_context: ssl.SSLContext | None = None) -> None:
        self.nsqd = nsqd
        self.sock = sock
        self.ssl_context = ssl_context
        self.runner: Any = None
        self._task: asyncio.Task[None] | None = None
        self._armed = False

    def arm(self) -> None:
        self.nsqd.loop.add_reader(self.sock.fileno(), self._wake)
        self._armed = True

    def _disarm(self) -> None:
        if self._armed:
            self._armed = False
            self.nsqd.loop.remove_reader(self.sock.fileno())

    def _wake(self) -> None:
        self._disarm()
        if self._task is None:
            self._task = self.nsqd.loop.create_task(self.start())

    async def start(self) -> None:
        """Start the server now (idempotent)."""
        self._disarm()
        if self.runner is not None:
            return
        try:
            http = _import_http()
            self.runner = await http.start_http(self.nsqd, self.sock, self.ssl_context)
        except Exception as e:
            log.error("HTTP: failed to start the server on %s - %s", self.sock.getsockname(), e)
            raise

    async def close(self) -> None:
        self._disarm()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        if self.runner is not None:
            await self.runner.cleanup()
        else:
            self.sock.close()


class ShutdownError(RuntimeError):
    """A clean shutdown could not write everything to disk (each error was logged)."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__(f"shutdown failed to write {len(errors)} queue(s) to disk - " + "; ".join(errors))
        self.errors = errors


class NSQD:
    """The nsqd daemon, runnable in-process (``async with``) or from the ``nsqd`` script."""

    def __init__(self, options: Options | None = None, **overrides: Any) -> None:
        opts = options if options is not None else Options()
        if overrides:
            opts = dataclasses.replace(opts, **overrides)
        self.options = opts
        self.topics: dict[str, Topic] = {}
        self.clients: dict[int, ClientV2] = {}
        self.guid = GUIDFactory(opts.node_id)
        self.start_time_ns = time.time_ns()
        self.start_time = self.start_time_ns // 1_000_000_000
        self.exiting = False
        self.data_path = opts.data_path or os.getcwd()
        self._lock = DataPathLock(self.data_path)
        self._loading = False
        self._metadata_pending = False
        self._metadata_task: asyncio.Task[None] | None = None
        #: changes to nsqd.dat asked for / written so far, and who waits for theirs
        self._metadata_gen = 0
        self._metadata_waiters: list[tuple[int, asyncio.Future[None]]] = []
        #: Go's SetHealth: the last disk write error, None while writes succeed
        self._health_error: str | None = None
        #: what a clean shutdown could not write to disk (the daemon then exits non-zero)
        self.shutdown_errors: list[str] = []
        self.syncer: Syncer | None = None
        self.lookup_peers = LookupPeers(self)
        self._client_ids = itertools.count(1)
        #: every client's heartbeat ticks (made with the first client)
        self.heartbeats: HeartbeatWheel | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tcp_server: asyncio.AbstractServer | None = None
        self._http_listener: LazyHTTP | None = None
        self._https_listener: LazyHTTP | None = None
        self._https_sock: socket.socket | None = None
        #: the TCP TLS upgrade's server context (None without --tls-cert/--tls-key)
        self.tls_context: Any = None
        #: asks --auth-http-address for AUTH (None: AUTH disabled)
        self.auth_client: AuthClient | None = (
            AuthClient(
                opts.auth_http_addresses,
                method=opts.auth_http_request_method,
                connect_timeout=opts.http_client_connect_timeout,
                request_timeout=opts.http_client_request_timeout,
                root_ca_file=opts.tls_root_ca_file,
            )
            if opts.auth_http_addresses
            else None
        )
        #: bearer tokens for peek and its actions (--admin-token-file); with AUTH and no
        #: tokens, peek is refused (bodies are sensitive)
        self.admin_auth = AdminAuth(opts.admin_token_file, bool(opts.auth_http_addresses), log)
        self._scan_task: asyncio.Task[None] | None = None
        #: the statsd push loop (--statsd-address), see nsqpy.nsqd.statsd
        self._statsd: Any = None
        self._tcp_sock: socket.socket | None = None
        self._http_sock: socket.socket | None = None
        #: (host, port) actually bound, or the unix path; None when disabled.
        self.tcp_address: tuple[str, int] | str | None = None
        self.http_address: tuple[str, int] | str | None = None
        self.https_address: tuple[str, int] | str | None = None

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "NSQD is not started"
        return self._loop

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        opts = self.options
        log.info("NSQ: per-message hot paths %s", _speedups.describe())
        # GC pauses count from the start, whenever /stats is first asked for
        install_gc_tracker()
        if opts.tls_cert or opts.tls_key:
            from ..transport import TransportError, server_tls_context

            try:
                self.tls_context = server_tls_context(
                    opts.tls_cert,
                    opts.tls_key,
                    opts.tls_client_auth_policy,
                    opts.tls_root_ca_file,
                    opts.tls_min_version.lower(),
                )
            except (OSError, ValueError, ssl.SSLError, TransportError) as e:
                raise RuntimeError(f"failed to build TLS config - {e}") from None
        try:
            self._lock.acquire()
        except (OSError, RuntimeError) as e:
            raise RuntimeError(f"failed to lock data-path: {e}") from None
        try:
            self.syncer = Syncer(
                self._loop, opts.sync_timeout, self._sync_result, gather=opts.sync_every == 1
            )
            self.syncer.start()
            self.load_metadata()
            # as Go's nsqd: prove the data path is writable before accepting a message
            try:
                self.persist_metadata()
            except OSError as e:
                raise RuntimeError(f"failed to persist metadata - {e}") from None
            await self._listen()
            self.lookup_peers.set_addresses(opts.nsqlookupd_tcp_addresses)
            if opts.statsd_address:
                from .statsd import StatsdLoop

                self._statsd = StatsdLoop(self)
                self._statsd.start()
        except BaseException:
            await self._close_backends()
            self._lock.release()
            raise

    async def _listen(self) -> None:
        opts = self.options
        loop = self.loop
        self._tcp_sock = _listen_socket(opts.tcp_address)
        self._tcp_server = await loop.create_server(
            self._new_connection, sock=self._tcp_sock, backlog=LISTEN_BACKLOG
        )
        self.tcp_address = self._bound(self._tcp_sock)
        log.info("TCP: listening on %s", self._fmt(self.tcp_address))
        if self.tls_context is not None and opts.https_address:
            self._https_sock = _listen_socket(opts.https_address)
            self._https_listener = LazyHTTP(self, self._https_sock, https_context(opts))
            self._https_listener.arm()
            self.https_address = self._bound(self._https_sock)
            log.info("HTTPS: listening on %s", self._fmt(self.https_address))
        if opts.http_address:
            self._http_sock = _listen_socket(opts.http_address)
            self._http_listener = LazyHTTP(self, self._http_sock)
            self._http_listener.arm()
            self.http_address = self._bound(self._http_sock)
            log.info("HTTP: listening on %s", self._fmt(self.http_address))
        self._scan_task = loop.create_task(self._queue_scan_loop())

    def _new_connection(self) -> ProtocolV2:
        from .protocol_v2 import ProtocolV2

        return ProtocolV2(self)

    @staticmethod
    def _bound(sock: socket.socket) -> tuple[str, int] | str:
        name = sock.getsockname()
        if isinstance(name, tuple):
            return name[0], name[1]
        return str(name)

    @staticmethod
    def _fmt(addr: tuple[str, int] | str | None) -> str:
        if addr is None:
            return ""
        if isinstance(addr, str):
            return addr
        return format_address(*addr)

    @property
    def tcp_port(self) -> int:
        return bound_port(self.tcp_address)

    @property
    def http_port(self) -> int:
        return bound_port(self.http_address)

    @property
    def https_port(self) -> int:
        """The HTTPS listener's port (0 when there is none, as Go's RealHTTPSAddr)."""
        return self.https_address[1] if isinstance(self.https_address, tuple) else 0

    @property
    def broadcast_tcp_port(self) -> int:
        """The TCP port registered with nsqlookupd (--broadcast-tcp-port, else the bound one)."""
        return self.options.broadcast_tcp_port or self.tcp_port

    @property
    def broadcast_http_port(self) -> int:
        return self.options.broadcast_http_port or self.http_port

    @property
    def tcp_addr_str(self) -> str:
        return self._fmt(self.tcp_address)

    @property
    def http_addr_str(self) -> str:
        return self._fmt(self.http_address)

    @property
    def https_addr_str(self) -> str:
        return self._fmt(self.https_address)

    async def stop(self) -> None:
        """Clean shutdown: stop accepting, close clients, write every message in memory,
        in flight and deferred to disk, fsync, write the metadata, release the data path."""
        if self.exiting:
            return
        self.exiting = True
        log.info("NSQ: closing TCP listener")
        if self._tcp_server is not None:
            self._tcp_server.close()
        for client in list(self.clients.values()):
            client.close()
        await self.lookup_peers.close()
        if self._scan_task is not None:
            self._scan_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scan_task
        if self._statsd is not None:
            await self._statsd.stop()
        if self._http_listener is not None:
            await self._http_listener.close()
        if self._https_listener is not None:
            await self._https_listener.close()
        if self.auth_client is not None:
            await self.auth_client.close()
        if self._tcp_server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._tcp_server.wait_closed(), 2)
        for addr in (self.tcp_address, self.http_address, self.https_address):
            if isinstance(addr, str):
                with contextlib.suppress(OSError):
                    os.unlink(addr)
        for topic in list(self.topics.values()):
            self.shutdown_errors += topic.flush()
        await self._close_backends()
        try:
            self.persist_metadata()
        except OSError as e:
            log.error("failed to persist metadata - %s", e)
            self.shutdown_errors.append(f"failed to persist metadata - {e}")
        self._lock.release()
        if self.shutdown_errors:
            log.error(
                "NSQ: shutdown could not write everything to disk (%d error(s))", len(self.shutdown_errors)
            )
        log.info("NSQ: bye")

    async def _close_backends(self) -> None:
        """Sync and close every DiskQueue (in a worker thread) and stop the syncer."""
        if self._metadata_task is not None:
            self._metadata_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._metadata_task
        backends = []
        for topic in self.topics.values():
            backends.append(topic.backend)
            backends += [ch.backend for ch in topic.channels.values()]

        def close_all() -> list[str]:
            errors = []
            for b in backends:
                try:
                    b.close()
                except Exception as e:  # noqa: BLE001 - report each, close the rest
                    log.error("DISKQUEUE(%s): failed to sync on close - %s", b.name, e)
                    errors.append(f"DISKQUEUE({b.name}): failed to sync on close - {e}")
            return errors

        if self.syncer is not None:
            await self.syncer.close()
        errors = await asyncio.get_running_loop().run_in_executor(None, close_all)
        if self.exiting:
            self.shutdown_errors += errors

    async def __aenter__(self) -> NSQD:
        await self.start()
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        await self.stop()
        if self.shutdown_errors and exc_type is None:
            raise ShutdownError(self.shutdown_errors)

    # --- clients ------------------------------------------------------------------------------

    def next_client_id(self) -> int:
        return next(self._client_ids)

    def add_client(self, client: ClientV2) -> None:
        self.clients[client.id] = client
        if self.exiting:
            client.close()

    def remove_client(self, client: ClientV2) -> None:
        self.clients.pop(client.id, None)

    # --- topics -------------------------------------------------------------------------------

    def now_ns(self) -> int:
        return time.time_ns()

    def get_topic(self, name: str) -> Topic:
        """The topic, created if it does not exist (the caller validated the name)."""
        topic = self.topics.get(name)
        if topic is None:
            if not is_valid_topic_name(name):
                raise ValueError(f"invalid topic name {name!r}")
            from .topic import Topic

            topic = self.topics[name] = Topic(name, self)
            log.info("TOPIC(%s): created", name)
            if not self._loading:
                self.lookup_peers.notify(register(name))
                if self.options.nsqlookupd_tcp_addresses and self._loop is not None:
                    # as Go's GetTopic: the channels lookupd knows exist before the first
                    # message flows (it waits in the topic meanwhile)
                    topic.starting = True
                    self._loop.create_task(self._precreate_channels(topic))
            self.on_metadata_changed()
        return topic

    async def _precreate_channels(self, topic: Topic) -> None:
        """Create the topic's channels known to nsqlookupd (``/channels?topic=``), then let
        its messages flow; a lookupd that fails is logged and skipped, as Go does."""
        try:
            addrs = self.lookup_peers.http_addresses()
            if not addrs:
                log.error(
                    "no available nsqlookupd to query for channels to pre-create for topic %s",
                    topic.name,
                )
            names: list[str] = []
            errors = []
            for addr in addrs:
                try:
                    names += await self._lookupd_channels(addr, topic.name)
                except (TimeoutError, OSError, ValueError) as e:
                    errors.append(f"{addr}: {e or type(e).__name__}")
            if errors:
                log.warning(
                    "failed to query nsqlookupd for channels to pre-create for topic %s - %s",
                    topic.name,
                    "; ".join(errors),
                )
            if topic.exiting or self.topics.get(topic.name) is not topic:
                return
            for name in dict.fromkeys(names):
                if is_valid_topic_name(name) and not is_ephemeral(name):
                    topic.get_channel(name)
        finally:
            topic.started()

    async def _lookupd_channels(self, addr: str, topic: str) -> list[str]:
        from ..httpget import http_get  # (not aiohttp's client: issue 31)

        opts = self.options
        query = "".join(c if c.isalnum() or c in "._-" else f"%{ord(c):02X}" for c in topic)
        status, body = await http_get(
            addr,
            f"/channels?topic={query}",
            opts.http_client_connect_timeout,
            opts.http_client_request_timeout,
            f"nsqd/{NSQ_VERSION}",
        )
        if status != 200:
            raise ValueError(f"got response {status}")
        doc = json.loads(body)
        chans = doc.get("channels") if isinstance(doc, dict) else None
        if not isinstance(chans, list):
            raise ValueError("no channels in the response")
        return [c for c in chans if isinstance(c, str)]

    def get_existing_topic(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def delete_topic(self, name: str) -> bool:
        topic = self.topics.pop(name, None)
        if topic is None:
            return False
        log.info("TOPIC(%s): deleting", name)
        topic.close()
        self.lookup_peers.notify(unregister(name))
        self.on_metadata_changed()
        return True

    # --- disk backends ------------------------------------------------------------------------

    def make_backend(self, name: str) -> BackendQueue:
        """The backend of a topic (``name``) or channel (``topic:channel``): a DiskQueue that
        tells the Syncer of its writes, or a NullBackend for ephemeral ones."""
        if is_ephemeral(name.rpartition(":")[2]) or is_ephemeral(name.partition(":")[0]):
            return NullBackend(name)
        from .diskqueue import DiskQueue

        opts = self.options
        return DiskQueue(
            name,
            self.data_path,
            max_bytes_per_file=opts.max_bytes_per_file,
            min_msg_size=MESSAGE_OVERHEAD,
            max_msg_size=opts.max_msg_size + MESSAGE_OVERHEAD,
            sync_every=opts.sync_every,
            sync_timeout=opts.sync_timeout,
            log=log,
            events=self.syncer,
        )

    @property
    def crash_safe(self) -> bool:
        """The crash-safe mode (``--mem-queue-size=0 --sync-every=1``): every message is on
        disk until it is finished, and a kill -9 loses nothing acknowledged (see
        :mod:`nsqpy.nsqd.journal`)."""
        opts = self.options
        return opts.mem_queue_size == 0 and opts.sync_every == 1

    @property
    def loading(self) -> bool:
        """True while nsqd.dat is being loaded at start-up."""
        return self._loading

    # --- metadata (nsqd.dat) -------------------------------------------------------------------

    def load_metadata(self) -> None:
        """Recreate the topics, channels and pause flags recorded in nsqd.dat."""
        self._loading = True
        try:
            for t in read_metadata(self.data_path):
                name = t.get("name", "")
                if not is_valid_topic_name(name):
                    log.warning("skipping creation of invalid topic %s", name)
                    continue
                topic = self.get_topic(name)
                if t.get("paused"):
                    topic.paused = True
                self._load_policy(topic, t, TOPIC_KEYS, name)
                for c in t.get("channels") or []:
                    cname = c.get("name", "")
                    if not is_valid_topic_name(cname):
                        log.warning("skipping creation of invalid channel %s", cname)
                        continue
                    ch = topic.get_channel(cname)
                    if c.get("paused"):
                        ch.paused = True
                    self._load_policy(ch, c, CHANNEL_KEYS, name)
        finally:
            self._loading = False
        for topic in self.topics.values():
            topic.flow()

    @staticmethod
    def _load_policy(queue: Any, doc: dict[str, Any], keys: tuple[str, ...], topic: str) -> None:
        try:
            policy = Policy.from_metadata(doc.get("config"), keys, topic)
        except PolicyError as e:
            log.error("ignoring the settings of %s in nsqd.dat - %s", getattr(queue, "name", "?"), e)
            return
        if policy is not None:
            queue.set_policy(policy)

    def metadata(self) -> list[dict[str, Any]]:
        """nsqd.dat's topics: Go's keys, and a queue's settings under ``config`` (an nsqpy
        addition the Go nsqd ignores)."""
        topics = []
        for topic in self.topics.values():
            if topic.ephemeral:
                continue
            chans = []
            for ch in topic.channels.values():
                if ch.ephemeral:
                    continue
                c: dict[str, Any] = {"name": ch.name, "paused": ch.paused}
                if ch.policy is not None:
                    c["config"] = ch.policy.to_metadata(CHANNEL_KEYS)
                chans.append(c)
            t: dict[str, Any] = {"name": topic.name, "paused": topic.paused, "channels": chans}
            if topic.policy is not None:
                t["config"] = topic.policy.to_metadata(TOPIC_KEYS)
            topics.append(t)
        return topics

    def persist_metadata(self) -> None:
        """Write nsqd.dat atomically (blocking)."""
        write_file_atomic(metadata_path(self.data_path), encode_metadata(self.metadata()))

    def registrations(self) -> list[bytes]:
        """REGISTER commands for everything this node has (sent on each lookupd connect)."""
        cmds = []
        for topic in self.topics.values():
            if not topic.channels:
                cmds.append(register(topic.name))
            else:
                cmds += [register(topic.name, ch.name) for ch in topic.channels.values()]
        return cmds

    def on_channel_created(self, topic: Topic, channel: Any) -> None:
        if not self._loading:
            self.lookup_peers.notify(register(topic.name, channel.name))
        self.on_metadata_changed()

    def on_channel_deleted(self, topic: Topic, channel: Any) -> None:
        if not topic.exiting:
            self.lookup_peers.notify(unregister(topic.name, channel.name))
        self.on_metadata_changed()

    def on_options_changed(self, name: str) -> None:
        """PUT /config/:opt applied a new value."""
        if name == "nsqlookupd_tcp_addresses" and self._loop is not None:
            self.lookup_peers.set_addresses(self.options.nsqlookupd_tcp_addresses)

    def on_metadata_changed(self) -> None:
        """Topics, channels or pause flags changed: persist nsqd.dat soon (coalesced)."""
        if self._loading or self.exiting or self._loop is None:
            return
        self._metadata_pending = True
        self._metadata_gen += 1
        if self._metadata_task is None or self._metadata_task.done():
            self._metadata_task = self._loop.create_task(self._persist_metadata_soon())

    async def save_metadata(self) -> None:
        """Persist nsqd.dat now (coalesced with other changes) and return once the file on
        disk has it. Raises the OSError of a failed write (the writer keeps trying)."""
        if self._loop is None or self.exiting:
            return
        self.on_metadata_changed()
        fut: asyncio.Future[None] = self._loop.create_future()
        self._metadata_waiters.append((self._metadata_gen, fut))
        await fut

    async def sync_all(self) -> None:
        """Return once a sync round started from now has fsynced every queue written to
        (data first, then read positions). Raises the round's error."""
        syncer = self.syncer
        if syncer is None or self._loop is None:
            return
        fut: asyncio.Future[BaseException | None] = self._loop.create_future()

        def synced(err: BaseException | None) -> None:
            if not fut.done():
                fut.set_result(err)

        syncer.wait(synced)
        err = await fut
        if err is not None:
            raise err

    def _metadata_written(self, gen: int, err: OSError | None) -> None:
        still = []
        for want, fut in self._metadata_waiters:
            if fut.done():
                continue
            if err is not None:
                fut.set_exception(err)
            elif want <= gen:
                fut.set_result(None)
            else:
                still.append((want, fut))
        self._metadata_waiters = still

    async def _persist_metadata_soon(self) -> None:
        loop = self.loop
        while self._metadata_pending:
            self._metadata_pending = False
            gen = self._metadata_gen
            data = encode_metadata(self.metadata())
            try:
                await loop.run_in_executor(None, write_file_atomic, metadata_path(self.data_path), data)
                self._metadata_written(gen, None)
                if self._health_error is not None:
                    self.set_health(None)
            except OSError as e:
                self._metadata_written(gen, e)
                # a topic or channel missing from nsqd.dat would not be recreated after a
                # restart (its queue files orphaned): keep trying until it is written
                log.error("failed to persist metadata - %s", e)
                self.set_health(f"failed to persist metadata - {e}")
                self._metadata_pending = True
                await asyncio.sleep(METADATA_RETRY)

    # --- periodic scan ------------------------------------------------------------------------

    async def _queue_scan_loop(self) -> None:
        interval = self.options.queue_scan_interval
        loop = self.loop
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            for topic in list(self.topics.values()):
                for channel in list(topic.channels.values()):
                    if channel.in_flight or channel.deferred or channel.clients:
                        channel.scan(now)

    # --- info ---------------------------------------------------------------------------------

    def set_health(self, error: str | None) -> None:
        """Go's SetHealth: a disk error makes /ping answer 500 ``NOK - <error>`` until a
        write succeeds again."""
        if error is None and self._health_error is not None:
            log.info("NSQ: healthy again (disk writes succeed)")
        self._health_error = error

    def _sync_result(self, error: BaseException | str | None) -> None:
        self.set_health(None if error is None else str(error))

    def is_healthy(self) -> bool:
        return self._health_error is None

    def health(self) -> str:
        err = self._health_error
        return "OK" if err is None else "NOK - " + err
