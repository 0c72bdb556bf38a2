"""The ``nsq`` Structured Streaming source: NSQ channel → durable Arrow chunks → micro-batches.

Spark keeps one :class:`NsqStreamReader` per query in a long-lived Python runner on the
driver. On its first ``initialOffset``/``latestOffset`` call it starts one I/O thread per
nsqd (found through nsqlookupd or given as addresses). Each thread owns a blocking
connection (:class:`.nsqconn.BlockingConnection`: the protocol's handshake with TLS,
compression and AUTH, then SUB, RDY, heartbeats answered with NOP) and turns every delivery
burst into a *chunk*: an Arrow IPC file in ``spoolPath`` written durably (see
:mod:`.spool`); only then are the burst's messages FIN'd, with one write.

Options (case-insensitive): ``topic`` (required), ``channel`` (``nsq_spark``),
``nsqlookupdHttpAddresses`` or ``nsqdTcpAddresses`` (comma-separated ``host:port``),
``nsqdHttpAddresses`` (optional, paired with ``nsqdTcpAddresses``, for availableNow's
``/stats``), ``spoolPath`` (required), ``maxRecordsPerBatch`` (100000), ``maxInFlight``
(2500), ``msgTimeoutMs`` (60000), ``maxSpoolRows`` (1000000), ``numPartitions`` (2),
``lookupdPollIntervalMs`` (30000), ``availableNowQuietMs`` (1500), and the connection
options of :mod:`.connopts`: ``tls``, ``tlsRootCaFile``, ``tlsCert``, ``tlsKey``,
``tlsInsecureSkipVerify``, ``tlsMinVersion``, ``snappy``, ``deflate``, ``deflateLevel``,
``authSecret`` (also sent to nsqlookupd as a Bearer token, as go-nsq does),
``heartbeatIntervalMs`` (15000), ``outputBufferSize``, ``outputBufferTimeoutMs`` (50),
``userAgent``, ``dialTimeoutMs``, ``sampleRate``. An nsqd that refuses the connection
(AUTH, TLS verification, IDENTIFY or SUB) fails the query with that cause.

Offsets are ``{"chunk": N}``: N is the sequence number of the *last chunk included* (0 =
none). A batch ``(start, end]`` is every chunk with ``start < seq <= end``; its partitions
carry file paths only and executors read the files. ``commit(end)`` deletes chunks
``<= end``. Guarantee: at least once. A crash between persist and FIN re-delivers at most
one chunk per connection; a batch that is re-run reads the same files, so it is identical.

Backpressure: RDY 0 on every connection while the spool holds more than ``maxSpoolRows``
rows that no batch has been planned over yet; RDY is restored as batches are planned.
(Counting planned-but-uncommitted rows too could deadlock: Spark commits batch N only when
it plans batch N+1, which needs new data.)

``trigger(availableNow=True)``: see :meth:`_Runtime._check_drained`.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from nsqpy.protocol import commands
from nsqpy.protocol.address import parse_address_list
from nsqpy.protocol.client import Answer, HandshakeError
from nsqpy.protocol.discovery import lookup_headers, lookup_url, producers
from nsqpy.protocol.errors import ProtocolError
from nsqpy.protocol.names import is_valid_channel_name, is_valid_topic_name
from nsqpy.transport import TransportError

from .burst import Burst, BurstReader, fin_command
from .connopts import ConnectionOptions
from .nsqconn import BlockingConnection, http_get_json, stats_url
from .spool import ARROW_SCHEMA, Chunk, Spool, list_chunks, read_chunk

log = logging.getLogger("nsqpy.spark.source")

#: A chunk is cut when the burst reaches this share of the connection's RDY count…
CUT_RDY_FRACTION = 0.5
#: …or CUT_MAX_ROWS messages, or nothing arrived for CUT_IDLE_S, or it is CUT_MAX_AGE_S old.
CUT_MAX_ROWS = 10_000
CUT_IDLE_S = 0.02
CUT_MAX_AGE_S = 0.2
#: How long latestOffset waits for a first chunk before answering "no new data".
LATEST_WAIT_S = 0.1
HEARTBEAT_INTERVAL_MS = 15_000
#: Errors answering IDENTIFY or SUB that no retry can fix: they fail the query.
REFUSALS = frozenset(
    {
        "E_BAD_BODY",
        "E_BAD_TOPIC",
        "E_BAD_CHANNEL",
        "E_IDENTIFY_FAILED",
        "E_AUTH_FIRST",
        "E_AUTH_FAILED",
        "E_UNAUTHORIZED",
    }
)
OUTPUT_BUFFER_TIMEOUT_MS = 50
#: How long the handshake (IDENTIFY, TLS, AUTH) and SUB may take.
HANDSHAKE_TIMEOUT_S = 10.0
#: How long a closing connection waits for the answer to CLS.
CLOSE_WAIT_S = 1.0
#: The token of the CLS request.
_CLS = "CLS"


# --- options ----------------------------------------------------------------------------------


def _int_option(
    opts: Mapping[str, str], name: str, default: int, minimum: int, maximum: int | None = None
) -> int:
    raw = opts.get(name.lower())
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"nsq source: option {name!r} must be an integer, got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise ValueError(f"nsq source: option {name!r} must be {bound}, got {value}")
    return value


@dataclass(frozen=True)
class SourceOptions:
    """The read options, validated. Errors name the offending option."""

    topic: str
    channel: str
    spool_path: str
    lookupd_http_addresses: tuple[str, ...] = ()
    nsqd_tcp_addresses: tuple[str, ...] = ()
    #: optional, paired by position with nsqd_tcp_addresses (for availableNow's /stats)
    nsqd_http_addresses: tuple[str, ...] = ()
    max_records_per_batch: int = 100_000
    max_in_flight: int = 2500
    msg_timeout_ms: int = 60_000
    max_spool_rows: int = 1_000_000
    num_partitions: int = 2
    lookupd_poll_interval_ms: int = 30_000
    available_now_quiet_ms: int = 1500
    #: TLS, compression, AUTH and the IDENTIFY settings
    conn: ConnectionOptions = field(default_factory=ConnectionOptions)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = {str(k).lower(): v for k, v in options.items()}
        topic = (opts.get("topic") or "").strip()
        if not topic:
            raise ValueError("nsq source: option 'topic' is required")
        if not is_valid_topic_name(topic):
            raise ValueError(f"nsq source: option 'topic': invalid topic name {topic!r}")
        channel = (opts.get("channel") or "nsq_spark").strip()
        if not is_valid_channel_name(channel):
            raise ValueError(f"nsq source: option 'channel': invalid channel name {channel!r}")
        spool = (opts.get("spoolpath") or "").strip()
        if not spool:
            raise ValueError("nsq source: option 'spoolPath' is required (a directory for chunk files)")
        lookupds = parse_address_list(opts.get("nsqlookupdhttpaddresses"), "nsqlookupdHttpAddresses")
        nsqds = parse_address_list(opts.get("nsqdtcpaddresses"), "nsqdTcpAddresses")
        nsqd_http = parse_address_list(opts.get("nsqdhttpaddresses"), "nsqdHttpAddresses")
        if not lookupds and not nsqds:
            raise ValueError(
                "nsq source: set option 'nsqlookupdHttpAddresses' or 'nsqdTcpAddresses' "
                "(comma-separated host:port)"
            )
        if nsqd_http and len(nsqd_http) != len(nsqds):
            raise ValueError(
                "nsq source: option 'nsqdHttpAddresses' must list one HTTP address per "
                f"'nsqdTcpAddresses' entry ({len(nsqd_http)} given for {len(nsqds)})"
            )
        return cls(
            topic=topic,
            channel=channel,
            spool_path=os.path.abspath(spool),
            lookupd_http_addresses=tuple(lookupds),
            nsqd_tcp_addresses=tuple(nsqds),
            nsqd_http_addresses=tuple(nsqd_http),
            max_records_per_batch=_int_option(opts, "maxRecordsPerBatch", 100_000, 1),
            max_in_flight=_int_option(opts, "maxInFlight", 2500, 1),
            msg_timeout_ms=_int_option(opts, "msgTimeoutMs", 60_000, 1000),
            max_spool_rows=_int_option(opts, "maxSpoolRows", 1_000_000, 1),
            num_partitions=_int_option(opts, "numPartitions", 2, 1),
            lookupd_poll_interval_ms=_int_option(opts, "lookupdPollIntervalMs", 30_000, 100),
            available_now_quiet_ms=_int_option(opts, "availableNowQuietMs", 1500, 10),
            conn=ConnectionOptions.parse(opts, "nsq source", consumer=True),
        )


def _offset(value: Mapping[str, Any] | None) -> int:
    if not value:
        return 0
    try:
        return int(value["chunk"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"nsq source: unrecognised offset {value!r} (expected {{'chunk': N}})") from None


# --- partitions and reading -------------------------------------------------------------------


class NsqInputPartition(InputPartition):
    """Chunk files (absolute paths, in sequence order) one task reads."""

    def __init__(self, paths: list[str]) -> None:
        super().__init__(tuple(paths))


def plan_partitions(chunks: list[Chunk], num_partitions: int) -> list[NsqInputPartition]:
    """Split chunks into at most ``num_partitions`` contiguous groups of about equal rows."""
    if not chunks:
        return []
    k = min(num_partitions, len(chunks))
    total = sum(c.rows for c in chunks) or len(chunks)
    groups: list[list[str]] = [[]]
    acc = 0
    for i, c in enumerate(chunks):
        left_chunks = len(chunks) - i
        left_groups = k - len(groups)
        if groups[-1] and (acc >= total * len(groups) / k or left_chunks <= left_groups):
            groups.append([])
        groups[-1].append(c.path)
        acc += c.rows
    return [NsqInputPartition(g) for g in groups]


def read_partition(paths: tuple[str, ...], target_rows: int = 16_384) -> Iterator[pa.RecordBatch]:
    """The chunk files' rows as record batches of about ``target_rows`` rows."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    for path in paths:
        try:
            batches = list(read_chunk(path))
        except FileNotFoundError:
            raise FileNotFoundError(
                f"nsq source: spool chunk {path} is missing (was spoolPath cleaned, or is it "
                "not visible from this executor? It must be a shared filesystem on a cluster)"
            ) from None
        for b in batches:
            if b.num_rows == 0:
                continue
            pending.append(b)
            rows += b.num_rows
            if rows >= target_rows:
                yield pa.concat_batches(pending) if len(pending) > 1 else pending[0]
                pending, rows = [], 0
    if pending:
        yield pa.concat_batches(pending) if len(pending) > 1 else pending[0]


# --- the connection threads -------------------------------------------------------------------


class _ConstColumn:
    """A string column repeating one value; sliced (zero-copy) to each chunk's length."""

    def __init__(self, value: str) -> None:
        self.value = value
        self.arr = pa.array([value] * 1024, pa.string())

    def get(self, n: int) -> pa.Array:
        if n > len(self.arr):
            self.arr = pa.array([self.value] * max(n, 2 * len(self.arr)), pa.string())
        return self.arr.slice(0, n)


class _Consumer(threading.Thread):
    """One nsqd connection: subscribe, receive bursts, persist them as chunks, FIN."""

    def __init__(self, rt: _Runtime, tcp_address: str, http_address: str | None) -> None:
        super().__init__(name=f"nsq-source-{tcp_address}", daemon=True)
        self.rt = rt
        self.tcp_address = tcp_address
        self.http_address = http_address
        self.conn: BlockingConnection | None = None
        self.max_rdy = 2500
        self.rdy = 0
        #: the last RDY count > 0 (what may still be in flight after RDY 0)
        self.window = 1
        self.connected = False
        self.sessions = 0
        # availableNow bookkeeping (guarded by rt.cond)
        self.drained = False
        self.remaining: int | None = None
        self.quiet_since = time.monotonic()
        # the burst being received
        self._burst = Burst()
        self._first_at = 0.0
        self._frames = BurstReader()
        self._topic_col = _ConstColumn(rt.opts.topic)
        self._channel_col = _ConstColumn(rt.opts.channel)
        self._addr_col = _ConstColumn(tcp_address)
        self.persisted = 0
        self.last_error = ""
        #: the answer to CLS, once it came
        self._cls_answer: Answer | None = None

    # --- lifecycle ---

    def run(self) -> None:
        rt = self.rt
        backoff = 0.25
        while not rt.stopping:
            try:
                self._session()
                backoff = 0.25
            except ProtocolError as exc:
                if rt.stopping:
                    break
                if self.connected or exc.code not in REFUSALS:
                    log.warning("nsq source: nsqd %s: %s", self.tcp_address, exc)
                else:
                    # nsqd refused our IDENTIFY/AUTH/SUB: retrying cannot help; fail the query
                    msg = f"nsq source: nsqd {self.tcp_address} refused the subscription: {exc}"
                    rt.fail(RuntimeError(msg))
                    break
            except (HandshakeError, TransportError) as exc:
                # the TLS handshake failed (verification…), or nsqd asks for what this
                # source is not configured to do (AUTH without authSecret): fail the query
                if rt.stopping:
                    break
                rt.fail(RuntimeError(f"nsq source: nsqd {self.tcp_address}: {exc}"))
                break
            except Exception as exc:
                if rt.stopping:
                    break
                log.warning("nsq source: connection to nsqd %s failed: %s", self.tcp_address, exc)
                self.last_error = f"{type(exc).__name__}: {exc}"
            finally:
                self._drop_burst()
                self.connected = False
                self.rdy = 0
                if self.conn is not None:
                    self.conn.close()
                    self.conn = None
            if rt.stopping:
                break
            if rt.available_now:
                # what cannot be reached now is left for the next run
                rt.mark_drained(self, "connection lost")
            rt.stop_event.wait(backoff + random.random() * backoff)
            backoff = min(backoff * 2, 30.0)

    def _session(self) -> None:
        rt = self.rt
        opts = rt.opts
        co = opts.conn
        conn = self.conn = BlockingConnection(
            self.tcp_address,
            co.identify(
                heartbeat_interval=HEARTBEAT_INTERVAL_MS,
                msg_timeout=opts.msg_timeout_ms,
                output_buffer_timeout=OUTPUT_BUFFER_TIMEOUT_MS,
            ),
            tls_context=rt.tls_context,
            auth_secret=co.auth_secret or None,
            deflate_level=co.deflate_level,
            connect_timeout=co.dial_timeout_ms / 1000,
        )
        conn.handshake(HANDSHAKE_TIMEOUT_S)
        self.max_rdy = int(conn.settings.get("max_rdy_count") or 2500)
        conn.request(commands.sub(opts.topic, opts.channel), "SUB")
        answer = conn.answer(HANDSHAKE_TIMEOUT_S)
        if answer.error is not None:
            raise answer.error
        if answer.data != b"OK":
            raise ProtocolError("E_INVALID", f"unexpected SUB response {answer.data!r}")
        self.sessions += 1
        # from here on the burst reader walks the frames (the protocol's reader, with any
        # partial frame it holds, is its pending buffer)
        self._frames = BurstReader(conn.frame_reader())
        self._cls_answer = None
        if rt.available_now and self.sessions == 1:
            self._snapshot_pending()
        self.connected = True
        self.rdy = 0
        with rt.cond:
            self.quiet_since = time.monotonic()
        recv = conn.recv
        while True:
            if rt.stopping:
                self._close_cleanly()
                return
            want = rt.rdy_for(self)
            if want != self.rdy:
                conn.send(commands.rdy(want))
                self.rdy = want
                if want:
                    self.window = want
                with rt.cond:
                    self.quiet_since = time.monotonic()
            # application bytes: the socket's own without TLS or compression; b"" while a
            # layer waits for the rest of a record; None after the timeout
            data = recv(CUT_IDLE_S if len(self._burst) else 0.1)
            if data:
                self._parse(data)
            n = len(self._burst)
            if n:
                now = time.monotonic()
                if (
                    data is None
                    or n >= self._cut_rows()
                    or now - self._first_at >= CUT_MAX_AGE_S
                ):
                    self._persist()
            elif rt.available_now and not self.drained and self.rdy > 0:
                with rt.cond:
                    quiet = time.monotonic() - self.quiet_since
                if quiet * 1000 >= rt.opts.available_now_quiet_ms:
                    rt.mark_drained(self, "quiet")

    def _cut_rows(self) -> int:
        """A burst this long becomes a chunk at once: half the RDY window (so nsqd keeps
        sending the other half while this one is persisted), at most one batch's worth.
        Otherwise a chunk is cut after CUT_IDLE_S without data or at CUT_MAX_AGE_S."""
        cap = min(CUT_MAX_ROWS, self.rt.opts.max_records_per_batch)
        return max(1, min(int(self.window * CUT_RDY_FRACTION), cap))

    def _close_cleanly(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """CLS, then wait up to ``timeout`` s for its answer (``CLOSE_WAIT``), reading what
        comes before it as usual (heartbeats answered; messages still arriving are not
        FIN'd: nsqd re-delivers them). Whether the answer came."""
        conn = self.conn
        if conn is None:
            return False
        try:
            conn.request(commands.CLS, _CLS)
            deadline = time.monotonic() + timeout
            while self._cls_answer is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                data = conn.recv(left)
                if data:
                    self._parse(data)
        except (OSError, ProtocolError):
            return False
        return True

    # --- receiving ---

    def _parse(self, data: bytes) -> None:
        burst = self._burst
        had = len(burst)
        try:
            others = self._frames.feed(data, burst)
        except ValueError as exc:
            raise ConnectionError(f"nsqd {self.tcp_address}: {exc}") from None
        if others:
            self._others(others)
        if len(burst) > had:
            now = time.monotonic()
            if not had:
                self._first_at = now
            with self.rt.cond:
                self.quiet_since = now

    def _others(self, frames: list[tuple[int, bytes]]) -> None:
        """Responses, errors and heartbeats among the messages, through the protocol."""
        assert self.conn is not None
        for event in self.conn.frames_received(frames):
            if isinstance(event, Answer):
                if event.token == _CLS:
                    self._cls_answer = event
                else:
                    log.warning("nsq source: nsqd %s: unexpected response %r", self.tcp_address,
                                (event.data or b"")[:100])
                continue
            err = event.error
            if err.fatal:
                raise err
            # E_FIN_FAILED: the message timed out before its FIN; nsqd re-delivers it
            log.warning("nsq source: nsqd %s: %s", self.tcp_address, err)

    def _drop_burst(self) -> None:
        self._burst = Burst()

    def _persist(self) -> None:
        """Write the burst as chunks of at most one batch's worth of rows (durably), FIN'ing
        each chunk's messages with one write once it is on disk."""
        cap = min(CUT_MAX_ROWS, self.rt.opts.max_records_per_batch)
        burst, self._burst = self._burst, Burst()
        columns = burst.columns()
        for i in range(0, len(burst), cap):
            self._write_chunk(*(c.slice(i, cap) for c in columns))

    def _write_chunk(self, ids: pa.Array, tss: pa.Array, atts: pa.Array, bodies: pa.Array) -> None:
        n = len(ids)
        batch = pa.RecordBatch.from_arrays(
            [
                ids,
                tss,
                atts,
                bodies,
                self._topic_col.get(n),
                self._channel_col.get(n),
                self._addr_col.get(n),
            ],
            schema=ARROW_SCHEMA,
        )
        seq = self.rt.spool.write(batch)
        assert self.conn is not None
        self.conn.send(fin_command(ids))
        self.persisted += n
        self.rt.chunk_written(self, seq, n)

    # --- availableNow ---

    def _snapshot_pending(self) -> None:
        """Before the first RDY: how many messages wait for our channel on this nsqd
        (topic depth + channel depth; not in-flight to others, not deferred)."""
        if self.http_address is None:
            return
        opts = self.rt.opts
        try:
            status, doc = http_get_json(stats_url(self.http_address, opts.topic, opts.channel))
        except OSError as exc:
            log.warning("nsq source: /stats of nsqd %s failed: %s", self.http_address, exc)
            return
        if status != 200 or not isinstance(doc, dict):
            return
        topics = doc.get("topics") or []
        pending = 0
        for t in topics:
            if t.get("topic_name") != opts.topic:
                continue
            pending += int(t.get("depth") or 0)
            for c in t.get("channels") or []:
                if c.get("channel_name") == opts.channel:
                    pending += int(c.get("depth") or 0)
        with self.rt.cond:
            self.remaining = pending
        if pending == 0:
            self.rt.mark_drained(self, "nothing pending")


# --- the driver-side runtime ------------------------------------------------------------------


class _Runtime:
    """Everything the long-lived reader owns once started: spool, threads, state."""

    def __init__(self, opts: SourceOptions, start: int, available_now: bool) -> None:
        self.opts = opts
        self.available_now = available_now
        self.cond = threading.Condition()
        self.stop_event = threading.Event()
        self.stopping = False
        #: one TLS context for every connection (None without the ``tls`` option)
        self.tls_context = opts.conn.tls_context()
        self.spool = Spool(opts.spool_path)
        self.spool.skip_to(start)
        # batches up to `start` are done (Spark plans the next batch only after the
        # previous one completed): their chunks may still be here if the query stopped
        # before it could commit them
        self.spool.delete_upto(start)
        self.planned_upto = start
        self.paused = False
        self.target: int | None = None
        self.consumers: dict[str, _Consumer] = {}
        self.error: BaseException | None = None
        self._discovery: threading.Thread | None = None
        #: nsqlookupd knew no producer of the topic at the last lookup (and it was said)
        self.no_producer_warned = False
        self._update_backpressure()

    def start(self) -> None:
        opts = self.opts
        addrs: dict[str, str | None] = {}
        for i, a in enumerate(opts.nsqd_tcp_addresses):
            addrs[a] = opts.nsqd_http_addresses[i] if opts.nsqd_http_addresses else None
        if opts.lookupd_http_addresses:
            found = self.lookup(raise_if_unreachable=self.available_now)
            if found is not None:
                addrs.update({k: v for k, v in found.items() if k not in addrs or addrs[k] is None})
            if not self.available_now:
                self._discovery = threading.Thread(
                    target=self._discovery_loop, name="nsq-source-lookupd", daemon=True
                )
                self._discovery.start()
        with self.cond:
            for tcp, http in addrs.items():
                self._add_consumer(tcp, http)
            self._check_drained()

    def _add_consumer(self, tcp: str, http: str | None) -> None:
        c = _Consumer(self, tcp, http)
        self.consumers[tcp] = c
        c.start()

    def lookup(self, raise_if_unreachable: bool = False) -> dict[str, str | None] | None:
        """``{tcp address: http address or None}`` of the topic's producers from every
        lookupd (:mod:`nsqpy.protocol.discovery`: go-nsq's URL, headers and reading);
        None if no lookupd answered. Warns when the lookupds that answered know no
        producer of the topic (once, until one appears)."""
        out: dict[str, str | None] = {}
        answered: list[str] = []  # "lookupd: what it answered"
        errors = []
        headers = lookup_headers(self.opts.conn.auth_secret or None)
        for lookupd in self.opts.lookupd_http_addresses:
            try:
                status, doc = http_get_json(lookup_url(lookupd, self.opts.topic), headers=headers)
            except OSError as exc:
                errors.append(f"{lookupd}: {exc}")
                continue
            if status == 404:
                why = doc.get("message") if isinstance(doc, dict) else None
                answered.append(f"{lookupd}: {why or 'HTTP 404'}")
                continue
            if status != 200 or not isinstance(doc, dict):
                errors.append(f"{lookupd}: HTTP {status}")
                continue
            found = producers(doc)
            for p in found:
                out[p.tcp] = out.get(p.tcp) or p.http or None
            answered.append(f"{lookupd}: {len(found)} producer(s)" if found else f"{lookupd}: no producers")
        if not answered:
            msg = "nsq source: no nsqlookupd answered /lookup: " + "; ".join(errors)
            if raise_if_unreachable:
                raise ConnectionError(msg)
            log.warning(msg)
            return None
        self._note_producers(out, answered + errors)
        return out

    def _note_producers(self, found: dict[str, str | None], answers: list[str]) -> None:
        """Say (a WARNING, which reaches the job's stderr) that nsqlookupd knows no producer
        of the topic: a bounded run then reads nothing, a streaming one keeps polling. Once,
        until producers appear. (Go's tools log an error at every poll.)"""
        if found:
            if self.no_producer_warned:
                self.no_producer_warned = False
                log.warning("nsq source: nsqlookupd now knows %d producer(s) of topic %r: %s",
                            len(found), self.opts.topic, ", ".join(sorted(found)))
            return
        if self.no_producer_warned:
            return
        self.no_producer_warned = True
        lookupds = self.opts.lookupd_http_addresses
        then = (
            "nothing to read" if self.available_now
            else f"asking again every {self.opts.lookupd_poll_interval_ms / 1000:g}s"
        )
        log.warning(
            "nsq source: nsqlookupd %s know%s no producer of topic %r (%s): %s",
            ", ".join(lookupds), "s" if len(lookupds) == 1 else "", self.opts.topic,
            "; ".join(answers), then,
        )

    def _discovery_loop(self) -> None:
        interval = self.opts.lookupd_poll_interval_ms / 1000
        while not self.stop_event.wait(interval * (1 + 0.25 * random.random())):
            try:
                found = self.lookup()
            except Exception as exc:  # keep polling whatever happened
                log.warning("nsq source: lookup failed: %s", exc)
                continue
            if not found:
                continue
            with self.cond:
                if self.stopping:
                    return
                new = [(t, h) for t, h in found.items() if t not in self.consumers]
                for tcp, http in new:
                    log.info("nsq source: new nsqd %s for topic %s", tcp, self.opts.topic)
                    self._add_consumer(tcp, http)

    # --- flow control ---

    def fail(self, error: BaseException) -> None:
        """Remember an error that ends the query (raised by the next offset call)."""
        with self.cond:
            if self.error is None:
                self.error = error
            self.cond.notify_all()

    def rdy_for(self, c: _Consumer) -> int:
        """The RDY count a connection should have now: maxInFlight spread over the
        connections (at least 1 each, at most nsqd's max_rdy_count), 0 when paused."""
        if self.stopping or self.paused or (self.available_now and (c.drained or self.target is not None)):
            return 0
        n = max(1, len(self.consumers))
        return max(1, min(self.opts.max_in_flight // n, c.max_rdy))

    def _update_backpressure(self) -> None:
        backlog = self.spool.rows_after(self.planned_upto)
        paused = backlog > self.opts.max_spool_rows
        if paused != self.paused:
            self.paused = paused
            log.info("nsq source: %s (%d unplanned rows)", "paused" if paused else "resumed", backlog)

    def chunk_written(self, c: _Consumer, seq: int, n: int) -> None:
        with self.cond:
            c.quiet_since = time.monotonic()  # a slow write is not a quiet period
            self._update_backpressure()
            if c.remaining is not None and not c.drained:
                c.remaining -= n
                if c.remaining <= 0:
                    c.drained = True
                    self._check_drained()
            self.cond.notify_all()

    def mark_drained(self, c: _Consumer, why: str) -> None:
        with self.cond:
            if not c.drained:
                log.info("nsq source: nsqd %s drained (%s)", c.tcp_address, why)
                c.drained = True
                self._check_drained()
            self.cond.notify_all()

    def _check_drained(self) -> None:
        """availableNow: the target is fixed once every connection is drained — it has
        persisted as many messages as its nsqd's /stats showed pending when it subscribed
        (before its first RDY), or it has had RDY > 0 and received nothing for
        ``availableNowQuietMs`` (also the rule when the HTTP address is unknown), or it
        could not connect. The target is then the last chunk written; RDY goes to 0."""
        if not self.available_now or self.target is not None:
            return
        consumers = list(self.consumers.values())
        if all(c.drained for c in consumers):
            if consumers and all(c.sessions == 0 for c in consumers):
                # a bounded run that reached no nsqd did not drain anything: fail (as
                # Go's tools exit 1 when they cannot connect) rather than report success
                why = "; ".join(f"{c.tcp_address}: {c.last_error or 'no connection'}" for c in consumers)
                self.fail(ConnectionError(f"nsq source: could not connect to any nsqd ({why})"))
                return
            self.target = self.spool.last_seq
            log.info("nsq source: availableNow target is chunk %d", self.target)
            self.cond.notify_all()

    # --- the reader's calls ---

    def enable_available_now(self) -> None:
        with self.cond:
            if not self.available_now:
                self.available_now = True
                now = time.monotonic()
                for c in self.consumers.values():
                    c.quiet_since = now
                self._check_drained()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def latest(self, start: int, limit: ReadLimit) -> int:
        deadline = time.monotonic() + LATEST_WAIT_S
        with self.cond:
            self.planned_upto = max(self.planned_upto, start)
            self._update_backpressure()
            while True:
                self.raise_if_failed()
                if self.stopping:
                    return start
                upto = self.target if self.available_now else None
                chunks = self.spool.chunks(start, upto)
                if chunks:
                    end = admit(start, chunks, limit)
                    if end > start:
                        self.planned_upto = max(self.planned_upto, end)
                        self._update_backpressure()
                    return end
                if self.available_now:
                    if self.target is not None:
                        return start
                    self.cond.wait(0.1)
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return start
                self.cond.wait(left)

    def planned(self, end: int) -> None:
        with self.cond:
            if end > self.planned_upto:
                self.planned_upto = end
                self._update_backpressure()

    def committed(self, end: int) -> None:
        self.spool.delete_upto(end)
        with self.cond:
            self._update_backpressure()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.stop_event.set()
            self.cond.notify_all()
            threads = list(self.consumers.values())
        deadline = time.monotonic() + 5.0
        for t in threads:
            t.join(max(deadline - time.monotonic(), 0.1))
        if self._discovery is not None:
            self._discovery.join(1.0)


def admit(start: int, chunks: list[Chunk], limit: ReadLimit) -> int:
    """The end offset for ``chunks`` (in order, all after the start) under ``limit``:
    at least one chunk, whole chunks only."""
    if isinstance(limit, ReadMaxRows):
        budget = limit.max_rows
        end = chunks[0].seq
        used = chunks[0].rows
        for c in chunks[1:]:
            if used + c.rows > budget:
                break
            used += c.rows
            end = c.seq
        return end
    if isinstance(limit, ReadMaxFiles):
        return chunks[min(max(limit.max_files, 1), len(chunks)) - 1].seq
    if isinstance(limit, ReadMinRows):
        if sum(c.rows for c in chunks) < limit.min_rows:
            return start
    return chunks[-1].seq


# --- the reader Spark sees --------------------------------------------------------------------


class NsqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's handle on the source. Opens nothing until the first offset call: the same
    class is instantiated (and pickled to executors) for planning and reading."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.opts = SourceOptions.parse(options)
        self._available_now = False
        self._rt: _Runtime | None = None

    def __getstate__(self) -> dict[str, Any]:
        # pickled for the executors' reads, which open no connection: no secret goes along
        opts = replace(self.opts, conn=replace(self.opts.conn, auth_secret=""))
        return {"opts": opts, "_available_now": self._available_now, "_rt": None}

    def _runtime(self, start: int) -> _Runtime:
        if self._rt is None:
            rt = _Runtime(self.opts, start, self._available_now)
            self._rt = rt
            try:
                rt.start()
            except BaseException:
                rt.stop()
                self._rt = None
                raise
        return self._rt

    def initialOffset(self) -> dict[str, int]:
        self._runtime(0)
        return {"chunk": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_records_per_batch)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        s = _offset(start)
        return {"chunk": self._runtime(s).latest(s, limit or ReadAllAvailable())}

    def reportLatestOffset(self) -> dict[str, int] | None:
        if self._rt is None:
            return None
        return {"chunk": self._rt.spool.last_seq}

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True
        if self._rt is not None:  # not expected: Spark prepares before asking for offsets
            self._rt.enable_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[NsqInputPartition]:
        s, e = _offset(start), _offset(end)
        if e <= s:
            return []
        chunks = list_chunks(self.opts.spool_path, s, e)
        if len(chunks) != e - s:
            have = {c.seq for c in chunks}
            missing = [q for q in range(s + 1, e + 1) if q not in have]
            raise RuntimeError(
                f"nsq source: spool {self.opts.spool_path} lacks chunk(s) {missing[:10]} of "
                f"batch ({s}, {e}]: was spoolPath cleaned, or shared by two queries?"
            )
        if self._rt is not None:
            self._rt.planned(e)
        return plan_partitions(chunks, self.opts.num_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition.value)

    def commit(self, end: dict[str, Any]) -> None:
        e = _offset(end)
        if self._rt is not None:
            self._rt.committed(e)
        else:
            Spool(self.opts.spool_path).delete_upto(e)

    def stop(self) -> None:
        if self._rt is not None:
            self._rt.stop()
            self._rt = None
