"""The ``nsq`` sink: ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``.

Each task publishes the ``body`` column of its Arrow batches with MPUB to one nsqd (the
partition id modulo the number of ``nsqdTcpAddresses``), each MPUB kept within nsqd's
``--max-body-size`` and each message checked against ``--max-msg-size`` before anything of
its batch is sent. A few MPUBs are pipelined; the task returns (and so can commit) only
when nsqd has answered OK to every one of them: at least once. If the connection fails,
the unacknowledged MPUBs are sent again, on the next address: a retry may duplicate.

Options (case-insensitive): ``topic`` and ``nsqdTcpAddresses`` (required), ``maxMsgSize``
and ``maxBodySize`` (nsqd's limits, default 1 MiB and 5 MiB), and the connection options
of :mod:`.connopts` (``tls``, ``tlsRootCaFile``, ``tlsCert``, ``tlsKey``,
``tlsInsecureSkipVerify``, ``tlsMinVersion``, ``snappy``, ``deflate``, ``deflateLevel``,
``authSecret``, ``heartbeatIntervalMs``, ``outputBufferSize``, ``outputBufferTimeoutMs``,
``userAgent``, ``dialTimeoutMs``). An nsqd that refuses the connection (AUTH, TLS
verification) or the publication (E_UNAUTHORIZED, E_BAD_TOPIC…) fails the task at once.
"""

from __future__ import annotations

import array
import bisect
import itertools
import logging
import struct
import sys
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from nsqpy.protocol.address import parse_address_list
from nsqpy.protocol.client import HandshakeError
from nsqpy.protocol.errors import ProtocolError
from nsqpy.protocol.names import is_valid_topic_name
from nsqpy.transport import TransportError

from .connopts import ConnectionOptions
from .nsqconn import BlockingConnection

log = logging.getLogger("nsqpy.spark.sink")

DEFAULT_MAX_MSG_SIZE = 1024 * 1024
DEFAULT_MAX_BODY_SIZE = 5 * 1024 * 1024
#: MPUBs sent before waiting for the oldest one's answer.
PIPELINE = 4
RESPONSE_TIMEOUT_S = 30.0
#: How long the handshake (IDENTIFY, TLS, AUTH) may take.
HANDSHAKE_TIMEOUT_S = 10.0

_INT32 = struct.Struct(">i")
_INT32_NATIVE = struct.Struct("=i")  # Arrow offsets are in the machine's byte order


@dataclass(frozen=True)
class SinkOptions:
    topic: str
    addresses: tuple[str, ...]
    max_msg_size: int = DEFAULT_MAX_MSG_SIZE
    max_body_size: int = DEFAULT_MAX_BODY_SIZE
    #: TLS, compression, AUTH and the IDENTIFY settings
    conn: ConnectionOptions = field(default_factory=ConnectionOptions)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        opts = {str(k).lower(): v for k, v in options.items()}
        topic = (opts.get("topic") or "").strip()
        if not topic:
            raise ValueError("nsq sink: option 'topic' is required")
        if not is_valid_topic_name(topic):
            raise ValueError(f"nsq sink: option 'topic': invalid topic name {topic!r}")
        addresses = parse_address_list(opts.get("nsqdtcpaddresses"), "nsqdTcpAddresses")
        if not addresses:
            raise ValueError("nsq sink: option 'nsqdTcpAddresses' is required (comma-separated host:port)")

        def size(name: str, default: int) -> int:
            raw = opts.get(name.lower())
            if raw is None or str(raw).strip() == "":
                return default
            try:
                value = int(str(raw))
            except ValueError:
                raise ValueError(f"nsq sink: option {name!r} must be an integer, got {raw!r}") from None
            if value < 1:
                raise ValueError(f"nsq sink: option {name!r} must be >= 1, got {value}")
            return value

        max_msg = size("maxMsgSize", DEFAULT_MAX_MSG_SIZE)
        max_body = size("maxBodySize", DEFAULT_MAX_BODY_SIZE)
        if max_body < 9:
            raise ValueError("nsq sink: option 'maxBodySize' must be >= 9")
        # a message must also fit alone in an MPUB: [int32 count][int32 size][body]
        conn = ConnectionOptions.parse(opts, "nsq sink", consumer=False)
        return cls(topic, tuple(addresses), min(max_msg, max_body - 8), max_body, conn)


def check_schema(schema: StructType) -> None:
    """The written DataFrame needs a ``body`` column of type BINARY or STRING."""
    for f in schema.fields:
        if f.name == "body":
            if not isinstance(f.dataType, (BinaryType, StringType)):
                raise ValueError(
                    f"nsq sink: column 'body' must be BINARY or STRING, not {f.dataType.simpleString()}"
                )
            return
    raise ValueError(
        "nsq sink: the DataFrame has no 'body' column (BINARY or STRING) to publish; "
        f"columns: {schema.fieldNames()}"
    )


@dataclass
class NsqCommitMessage(WriterCommitMessage):
    partition_id: int
    messages: int
    mpubs: int
    address: str


def _bodies(batch: pa.RecordBatch, max_msg_size: int) -> pa.Array:
    """The batch's ``body`` column as BINARY, checked: no null, empty or too-big body."""
    col = batch.column(batch.schema.get_field_index("body"))
    if not pa.types.is_binary(col.type):
        col = col.cast(pa.binary())  # STRING: its UTF-8 bytes; LARGE_*: 32-bit offsets
    if col.null_count:
        raise ValueError(f"nsq sink: {col.null_count} row(s) have a null body; NSQ messages need a body")
    lengths = pc.binary_length(col)
    longest = pc.max(lengths).as_py()
    if longest is not None and longest > max_msg_size:
        i = pc.index(lengths, longest).as_py()
        raise ValueError(
            f"nsq sink: a message body of {longest} bytes (row {i} of a batch) exceeds nsqd's "
            f"--max-msg-size of {max_msg_size} bytes (option 'maxMsgSize'); nothing of this "
            "batch was published"
        )
    if pc.min(lengths).as_py() == 0:
        raise ValueError("nsq sink: a message body is empty; nsqd rejects empty messages")
    return col


def _framed(col: pa.Array) -> pa.Buffer:
    """``[int32 BE size][body]`` of every body of a BINARY array, concatenated by Arrow
    compute (no Python work per message)."""
    n = len(col)
    lengths = pc.binary_length(col)
    sizes = array.array("i")
    sizes.frombytes(memoryview(lengths.buffers()[1])[lengths.offset * 4 : (lengths.offset + n) * 4])
    if sys.byteorder == "little":
        sizes.byteswap()
    prefixes = pa.FixedSizeBinaryArray.from_buffers(pa.binary(4), n, [None, pa.py_buffer(sizes)])
    joined = pc.binary_join_element_wise(prefixes.cast(pa.binary()), col, pa.scalar(b"", pa.binary()))
    offsets = joined.buffers()[1]
    first = _INT32_NATIVE.unpack_from(offsets, joined.offset * 4)[0]
    last = _INT32_NATIVE.unpack_from(offsets, (joined.offset + n) * 4)[0]
    return joined.buffers()[2].slice(first, last - first)


def mpub_commands(topic: str, col: pa.Array, max_body_size: int) -> Iterator[tuple[bytes, int]]:
    """``(MPUB command, message count)`` for the bodies in ``col`` (BINARY, checked by
    :func:`_bodies`), each command's body ``[int32 count]([int32 size][bytes])*`` within
    ``max_body_size`` bytes."""
    line = f"MPUB {topic}\n".encode()
    n = len(col)
    data = _framed(col)
    if 4 + data.size <= max_body_size:
        yield b"".join((line, _INT32.pack(4 + data.size), _INT32.pack(n), memoryview(data))), n
        return
    # too big for one MPUB: split on message boundaries (message i starts at starts[i])
    sizes = itertools.accumulate(pc.binary_length(col).to_pylist(), initial=0)
    starts = [o + 4 * i for i, o in enumerate(sizes)]
    i = 0
    while i < n:
        j = max(bisect.bisect_right(starts, starts[i] + max_body_size - 4) - 1, i + 1)
        part = data.slice(starts[i], starts[j] - starts[i])
        yield b"".join((line, _INT32.pack(4 + part.size), _INT32.pack(j - i), memoryview(part))), j - i
        i = j


class _Publisher:
    """MPUBs over one connection with a small pipeline; reconnects to the next address and
    re-sends what was not acknowledged when the connection fails."""

    def __init__(self, opts: SinkOptions, first: int) -> None:
        self.opts = opts
        self.index = first % len(opts.addresses)
        self.conn: BlockingConnection | None = None
        self.unacked: deque[bytes] = deque()
        self.mpubs = 0
        self.failures = 0
        self.tls_context = opts.conn.tls_context()

    @property
    def address(self) -> str:
        return self.opts.addresses[self.index]

    def _connect(self) -> BlockingConnection:
        if self.conn is None:
            co = self.opts.conn
            conn = BlockingConnection(
                self.address,
                co.identify(),
                tls_context=self.tls_context,
                auth_secret=co.auth_secret or None,
                deflate_level=co.deflate_level,
                connect_timeout=co.dial_timeout_ms / 1000,
            )
            try:
                conn.handshake(HANDSHAKE_TIMEOUT_S)
            except (ProtocolError, HandshakeError, TransportError) as exc:
                # refused (AUTH, TLS verification…): no retry helps
                conn.close()
                raise RuntimeError(f"nsq sink: nsqd {self.address} refused the connection: {exc}") from None
            except BaseException:
                conn.close()
                raise
            self.conn = conn
            for cmd in self.unacked:
                conn.request(cmd)
        return self.conn

    def _retry(self, exc: Exception) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        self.failures += 1
        if self.failures > 3 * len(self.opts.addresses):
            raise ConnectionError(
                f"nsq sink: publishing to {list(self.opts.addresses)} failed: {exc}"
            ) from exc
        log.warning("nsq sink: nsqd %s failed (%s); retrying", self.address, exc)
        self.index = (self.index + 1) % len(self.opts.addresses)
        time.sleep(min(0.1 * self.failures, 2.0))

    def publish(self, cmd: bytes) -> None:
        self.unacked.append(cmd)
        self.mpubs += 1
        while True:
            try:
                if self.conn is None:
                    self._connect()  # (re)sends every unacknowledged command, this one too
                else:
                    self.conn.request(cmd)
                while len(self.unacked) > PIPELINE:
                    self._await_one()
                return
            except (OSError, ConnectionError) as exc:
                self._retry(exc)

    def flush(self) -> None:
        while self.unacked:
            try:
                self._connect()
                self._await_one()
            except (OSError, ConnectionError) as exc:
                self._retry(exc)

    def _await_one(self) -> None:
        assert self.conn is not None
        try:
            answer = self.conn.answer(RESPONSE_TIMEOUT_S)
        except ProtocolError as exc:  # a fatal error frame with no MPUB waiting
            raise ConnectionError(str(exc)) from None
        err = answer.error
        if err is not None:
            if err.code == "E_MPUB_FAILED":
                raise ConnectionError(str(err))
            raise RuntimeError(f"nsq sink: nsqd {self.address} rejected MPUB: {err}")
        data = answer.data or b""
        if data != b"OK":
            raise RuntimeError(f"nsq sink: unexpected answer {data[:100]!r} from nsqd {self.address}")
        self.unacked.popleft()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def publish_batches(
    opts: SinkOptions, batches: Iterator[pa.RecordBatch], partition_id: int
) -> NsqCommitMessage:
    pub = _Publisher(opts, partition_id)
    messages = 0
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            col = _bodies(batch, opts.max_msg_size)
            for cmd, count in mpub_commands(opts.topic, col, opts.max_body_size):
                pub.publish(cmd)
                messages += count
        pub.flush()
    finally:
        pub.close()
    return NsqCommitMessage(partition_id, messages, pub.mpubs, pub.address)


def _partition_id() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


class NsqBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.opts = SinkOptions.parse(options)
        check_schema(schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> NsqCommitMessage:
        return publish_batches(self.opts, iterator, _partition_id())


class NsqStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.opts = SinkOptions.parse(options)
        check_schema(schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> NsqCommitMessage:
        return publish_batches(self.opts, iterator, _partition_id())

    def commit(self, messages: list[Any], batchId: int) -> None:
        """Nothing to do: every message was acknowledged by nsqd before its task ended."""

    def abort(self, messages: list[Any], batchId: int) -> None:
        """Nothing to undo: published messages cannot be taken back (at least once)."""
