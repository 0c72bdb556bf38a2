"""The ``nsq`` Structured Streaming source: NSQ channel → durable Arrow chunks → micro-batches.

Spark keeps one :class:`NsqStreamReader` per query in a long-lived Python runner on the
driver. On its first ``initialOffset``/``latestOffset`` call it starts (:mod:`.consumer`)
one I/O thread per nsqd (found through nsqlookupd or given as addresses). Each thread owns a blocking
connection (:class:`.nsqconn.BlockingConnection`: the protocol's handshake with TLS,
compression and AUTH, then SUB, RDY, heartbeats answered with NOP) and appends every
delivery burst durably to its open *chunk* file in ``spoolPath`` (see :mod:`.spool`); only
then are the burst's messages FIN'd, with one write. A chunk is sealed (visible to Spark)
when it is full, old or idle.

Options (case-insensitive): ``topic`` (required), ``channel`` (``nsq_spark``),
``nsqlookupdHttpAddresses`` or ``nsqdTcpAddresses`` (comma-separated ``host:port``),
``nsqdHttpAddresses`` (optional, paired with ``nsqdTcpAddresses``, for availableNow's
``/stats``), ``spoolPath`` (required), ``maxRecordsPerBatch`` (100000), ``maxInFlight``
(2500), ``msgTimeoutMs`` (60000), ``maxSpoolRows`` (1000000), ``numPartitions`` (2),
``lookupdPollIntervalMs`` (30000), ``availableNowQuietMs`` (1500), ``batchFillWaitMs``
(1000: how long a micro-batch may wait to fill up to ``maxRecordsPerBatch`` while messages
keep arriving, so that the first batch is not one chunk), and the connection
options of :mod:`.connopts`: ``tls``, ``tlsRootCaFile``, ``tlsCert``, ``tlsKey``,
``tlsInsecureSkipVerify``, ``tlsMinVersion``, ``snappy``, ``deflate``, ``deflateLevel``,
``authSecret`` (also sent to nsqlookupd as a Bearer token, as go-nsq does),
``heartbeatIntervalMs`` (15000), ``outputBufferSize``, ``outputBufferTimeoutMs`` (50),
``userAgent``, ``dialTimeoutMs``, ``sampleRate``. An nsqd that refuses the connection
(AUTH, TLS verification, IDENTIFY or SUB) fails the query with that cause.

Offsets are ``{"chunk": N}``: N is the sequence number of the *last chunk included* (0 =
none). A batch ``(start, end]`` is every chunk with ``start < seq <= end``; its partitions
carry file paths only and executors read the files. ``commit(end)`` has the chunks
``<= end`` deleted (by a thread of the runner: the next batch does not wait for it). A
batch that is re-run reads the same files, so it is identical.

Guarantee: each message is emitted in exactly one chunk, whatever moment the driver dies
at. A message spooled but not FIN'd (the driver died between the two, a connection
dropped, the message timed out at nsqd while its burst was being spooled) comes back with
``attempts`` > 1; the spool remembers the ids that can come back (:mod:`.spool`), and such
a redelivery is FIN'd without being spooled again. A burst whose oldest message has waited
half its message timeout is not spooled but REQ'd: its FIN could come too late. With a
file sink that commits per batch (``nsq_spark archive``), the output holds every message
once. Limits: the spool (chunks and ``redelivery-ids.arrow``) must survive with the
checkpoint; an nsqd that loses its own state (kill -9 of nsqd: messages read from its disk
queue since its last sync are delivered again with their old attempts count) may deliver
a message again as new.

Backpressure: RDY 0 on every connection while the spool holds more than ``maxSpoolRows``
rows that no batch has been planned over yet; RDY is restored as batches are planned.
(Counting planned-but-uncommitted rows too could deadlock: Spark commits batch N only when
it plans batch N+1, which needs new data.)

``trigger(availableNow=True)``: see :meth:`_Runtime._check_drained`.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

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

from nsqpy.protocol.address import parse_address_list
from nsqpy.protocol.names import is_valid_channel_name, is_valid_topic_name

from .connopts import ConnectionOptions
from .spool import Chunk, Spool, list_chunks, read_chunk

if TYPE_CHECKING:
    from .consumer import Runtime

#: Recent ids remembered per nsqd, in connections' max RDY (what may be in flight).
KEEP_WINDOWS = 4


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
    batch_fill_wait_ms: int = 1000
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
            batch_fill_wait_ms=_int_option(opts, "batchFillWaitMs", 1000, 0),
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


#: The process whose heap :func:`_freeze_worker_heap` froze (0: none yet).
_frozen_pid = 0


def _freeze_worker_heap() -> None:
    """In a fork of Spark's Python worker daemon (``pyspark/daemon.py``, which runs
    ``gc.collect()`` after every task): move every object alive now (the imports: pyspark,
    pyarrow, this package) out of the collector's sight, once per process. Each collection
    then walks only the objects the tasks made since, instead of ~40,000 objects whose pages
    it also un-shares from the daemon (copy-on-write): measured ~16 ms of CPU per task on the
    2-core bench machine, a third of the read workers' CPU. What is frozen stays alive, as
    imported modules do anyway (CPython's ``gc.freeze`` for forked servers)."""
    global _frozen_pid
    pid = os.getpid()
    if _frozen_pid != pid and sys.argv and sys.argv[0].endswith(os.path.join("pyspark", "daemon.py")):
        _frozen_pid = pid
        gc.freeze()


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
    if isinstance(limit, ReadMinRows) and sum(c.rows for c in chunks) < limit.min_rows:
        return start
    return chunks[-1].seq


# --- the reader Spark sees --------------------------------------------------------------------


class NsqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's handle on the source. Opens nothing until the first offset call: the same
    class is instantiated (and pickled to executors) for planning and reading."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.opts = SourceOptions.parse(options)
        self._available_now = False
        self._rt: Runtime | None = None

    def __getstate__(self) -> dict[str, Any]:
        # pickled for the executors' reads, which open no connection: no secret goes along
        opts = replace(self.opts, conn=replace(self.opts.conn, auth_secret=""))
        return {"opts": opts, "_available_now": self._available_now, "_rt": None}

    def _runtime(self, start: int) -> Runtime:
        if self._rt is None:
            from .consumer import Runtime  # the driver's runner only (see .consumer)

            rt = Runtime(self.opts, start, self._available_now)
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
        _freeze_worker_heap()
        return read_partition(partition.value)

    def commit(self, end: dict[str, Any]) -> None:
        e = _offset(end)
        if self._rt is not None:
            self._rt.committed(e)
        else:
            Spool(self.opts.spool_path, keep=KEEP_WINDOWS * self.opts.max_in_flight).delete_upto(e)

    def stop(self) -> None:
        if self._rt is not None:
            self._rt.stop()
            self._rt = None
