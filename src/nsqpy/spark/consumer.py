"""The ``nsq`` source's driver side: one connection thread per nsqd and the runtime that
owns them, the spool and the flow control (see :mod:`.source` for the whole picture).

Only the streaming source's runner (a Python process Spark starts on the driver) imports
this module, on the reader's first offset call: the planners and the executors' read
workers, which only parse options or read chunk files, do without its imports.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows

from nsqpy.protocol import commands
from nsqpy.protocol.client import Answer, HandshakeError
from nsqpy.protocol.discovery import lookup_headers, lookup_url, producers
from nsqpy.protocol.errors import ProtocolError
from nsqpy.transport import TransportError

from .burst import FIN_LINE, Burst, BurstReader, fin_command, req_command
from .nsqconn import BlockingConnection, http_get_json, stats_url
from .source import KEEP_WINDOWS, SourceOptions, admit
from .spool import ARROW_SCHEMA, Chunk, OpenChunk, Spool

__all__ = ["Consumer", "Runtime"]

log = logging.getLogger("nsqpy.spark.source")

#: A burst is cut (appended to the open chunk, then FIN'd) when it holds this share of the
#: connection's RDY count: the whole window. (Cutting at half of it, so that nsqd would keep
#: sending the other half meanwhile, made more and smaller appends: 10-20 % more CPU per
#: message and no faster, an append taking well under a millisecond.)…
CUT_RDY_FRACTION = 1.0
#: …or CUT_MAX_ROWS messages, or nothing arrived for CUT_IDLE_S, or it is CUT_MAX_AGE_S old.
CUT_MAX_ROWS = 10_000
CUT_IDLE_S = 0.02
CUT_MAX_AGE_S = 0.2
#: A connection's open chunk (the bursts it appended, see :mod:`.spool`) is sealed, and
#: becomes visible to Spark, at SEAL_MAX_ROWS rows (at most maxRecordsPerBatch), when it is
#: SEAL_MAX_AGE_S old, when nothing arrived for CUT_IDLE_S, or when the connection ends.
SEAL_MAX_ROWS = 25_000
SEAL_MAX_AGE_S = 0.2
#: How long latestOffset waits for a first chunk before answering "no new data".
LATEST_WAIT_S = 0.1
#: A batch being filled (batchFillWaitMs) is closed when no chunk came for this long.
FILL_QUIET_S = 0.1
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
#: A burst is spooled only while its oldest message is younger than this share of the
#: message timeout: the FIN then reaches nsqd long before the message could time out there
#: (and be delivered to another consumer of the channel); an older burst is REQ'd instead.
FRESH_FRACTION = 0.5
#: The id in nsqd's E_FIN_FAILED text ("FIN <id> failed <why>", as Go's).
_FIN_FAILED_RE = re.compile(r"FIN (\S+) failed")


class _ConstColumn:
    """A string column repeating one value; sliced (zero-copy) to each chunk's length."""

    def __init__(self, value: str) -> None:
        self.value = value
        self.arr = pa.array([value] * 1024, pa.string())

    def get(self, n: int) -> pa.Array:
        if n > len(self.arr):
            self.arr = pa.array([self.value] * max(n, 2 * len(self.arr)), pa.string())
        return self.arr.slice(0, n)


class Consumer(threading.Thread):
    """One nsqd connection: subscribe, receive bursts, persist them as chunks, FIN."""

    def __init__(self, rt: Runtime, tcp_address: str, http_address: str | None) -> None:
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
        #: when the first message of the burst being spooled arrived
        self._burst_first_at = 0.0
        #: the message timeout nsqd applies to this connection (IDENTIFY's answer)
        self.msg_timeout_s = rt.opts.msg_timeout_ms / 1000
        self._frames = BurstReader()
        self._topic_col = _ConstColumn(rt.opts.topic)
        self._channel_col = _ConstColumn(rt.opts.channel)
        self._addr_col = _ConstColumn(tcp_address)
        self.persisted = 0
        #: the chunk this connection's bursts are appended to (None until the next burst)
        self._open: OpenChunk | None = None
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
            except Exception as exc:  # noqa: BLE001 - the thread logs it and reconnects, as go-nsq
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
                if self._cls_answer is None:
                    # not closed cleanly: what this connection spooled may come again
                    rt.spool.connection_ended(self.tcp_address)
                # what was appended may have been FIN'd: it must become a chunk
                self._seal()
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
        self.msg_timeout_s = int(conn.settings.get("msg_timeout") or opts.msg_timeout_ms) / 1000
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
                if data is None or n >= self._cut_rows() or now - self._first_at >= CUT_MAX_AGE_S:
                    self._persist()
            if self._open is not None and (
                data is None or time.monotonic() - self._open.opened_at >= SEAL_MAX_AGE_S
            ):
                self._seal()
            if not n and rt.available_now and not self.drained and self.rdy > 0:
                with rt.cond:
                    quiet = time.monotonic() - self.quiet_since
                if quiet * 1000 >= rt.opts.available_now_quiet_ms:
                    self._seal()
                    rt.mark_drained(self, "quiet")

    def _cut_rows(self) -> int:
        """A burst this long is persisted at once: the RDY window (CUT_RDY_FRACTION), at
        most CUT_MAX_ROWS and one batch's worth. Otherwise a burst is cut after CUT_IDLE_S
        without data or at CUT_MAX_AGE_S."""
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
                    log.warning(
                        "nsq source: nsqd %s: unexpected response %r",
                        self.tcp_address,
                        (event.data or b"")[:100],
                    )
                continue
            err = event.error
            if err.fatal:
                raise err
            failed = _FIN_FAILED_RE.match(err.description) if err.code == "E_FIN_FAILED" else None
            if failed is not None:
                # the message timed out at nsqd before this FIN: nsqd delivers it again,
                # and it is already spooled; remember its id until then
                self.rt.spool.pin(self.tcp_address, failed.group(1))
            log.warning("nsq source: nsqd %s: %s", self.tcp_address, err)

    def _drop_burst(self) -> None:
        self._burst = Burst()

    def _persist(self) -> None:
        """Append the burst to the open chunk (durably; a burst that fills the chunk is
        split, its rest opening the next one), FIN'ing each part's messages with one write
        once it is on disk. Messages spooled before (nsqd delivered them again: see
        :meth:`.spool.Spool.redeliveries`) are FIN'd without being spooled again."""
        burst, self._burst = self._burst, Burst()
        self._burst_first_at = self._first_at
        ids, tss, atts, bodies = burst.columns()
        fins = burst.fins()
        # only messages delivered before (attempts > 1) can be redeliveries
        again = self.rt.spool.redeliveries(self.tcp_address, ids, atts) if burst.again else []
        if again:
            log.info(
                "nsq source: nsqd %s delivered %d message(s) already spooled again: FIN'd, not emitted twice",
                self.tcp_address,
                len(again),
            )
            assert self.conn is not None
            dup = pa.array(again, pa.int64())
            dup_ids = ids.take(dup)
            self.conn.send(fin_command(dup_ids))
            self.rt.spool.refinished(self.tcp_address, dup_ids)
            self._delivered(len(again))  # counts for availableNow
            keep = pc.invert(pc.is_in(pa.array(range(len(ids)), pa.int64()), value_set=dup))
            ids, tss, atts, bodies = (c.filter(keep) for c in (ids, tss, atts, bodies))
            fins = fin_command(ids)
        pos, n = 0, len(ids)
        while pos < n:
            room = self._seal_rows() - (self._open.rows if self._open is not None else 0)
            fin = fins if pos == 0 and room >= n else fins[pos * FIN_LINE : (pos + room) * FIN_LINE]
            p_ids, p_tss, p_atts, p_bodies = (c.slice(pos, room) for c in (ids, tss, atts, bodies))
            self._write_chunk(p_ids, p_tss, p_atts, p_bodies, fin)
            pos += room

    def _fresh(self) -> bool:
        """Whether the burst being spooled may still be FIN'd (see FRESH_FRACTION)."""
        age = time.monotonic() - self._burst_first_at
        return age < self.msg_timeout_s * FRESH_FRACTION

    def _seal_rows(self) -> int:
        """A chunk's rows when it is sealed for being full: maxRecordsPerBatch split into
        equal chunks of at most SEAL_MAX_ROWS, so that full chunks fill batches exactly."""
        per_batch = self.rt.opts.max_records_per_batch
        return per_batch // -(-per_batch // SEAL_MAX_ROWS)

    def _seal(self) -> None:
        """Seal the open chunk (if any): it becomes a chunk Spark can plan a batch over."""
        oc, self._open = self._open, None
        if oc is None:
            return
        if self.rt.spool.seal(oc) is not None:
            self.rt.chunk_sealed()

    def _write_chunk(
        self, ids: pa.Array, tss: pa.Array, atts: pa.Array, bodies: pa.Array, fin: bytes
    ) -> None:
        """Append these rows to the open chunk; then send ``fin`` (their FIN command)."""
        n = len(ids)
        if not n:
            return
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
        spool = self.rt.spool
        if self._open is None:
            self._open = spool.open_chunk(self.tcp_address)
        assert self.conn is not None
        if not spool.append(self._open, batch, self._fresh):
            log.warning(
                "nsq source: nsqd %s: %d message(s) took longer than half their timeout "
                "(%.0f s) to spool: requeued, not spooled",
                self.tcp_address,
                n,
                self.msg_timeout_s,
            )
            self.conn.send(req_command(ids))
            return
        self.conn.send(fin)
        self.persisted += n
        if self._open.rows >= self._seal_rows():
            self._seal()
        self._delivered(n)

    def _delivered(self, n: int) -> None:
        """``n`` more messages are spooled or were redeliveries. When they are the last of
        what availableNow waits for from this nsqd, the open chunk is sealed first: the
        target is then fixed at the last chunk."""
        if self.remaining is not None and not self.drained and self.remaining <= n:
            self._seal()
        self.rt.chunk_written(self, n)

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


class Runtime:
    """Everything the long-lived reader owns once started: spool, threads, state."""

    def __init__(self, opts: SourceOptions, start: int, available_now: bool) -> None:
        self.opts = opts
        self.available_now = available_now
        self.cond = threading.Condition()
        self.stop_event = threading.Event()
        self.stopping = False
        #: one TLS context for every connection (None without the ``tls`` option)
        self.tls_context = opts.conn.tls_context()
        self.spool = Spool(opts.spool_path, keep=KEEP_WINDOWS * opts.max_in_flight)
        self.spool.skip_to(start)
        # batches up to `start` are done (Spark plans the next batch only after the
        # previous one completed): their chunks may still be here if the query stopped
        # before it could commit them
        self.spool.delete_upto(start)
        self.planned_upto = start
        #: the highest offset Spark committed, and the thread that deletes up to it
        self.commit_to = start
        self._janitor: threading.Thread | None = None
        #: when the last chunk was written (monotonic)
        self.last_chunk_at = 0.0
        self.paused = False
        self.target: int | None = None
        self.consumers: dict[str, Consumer] = {}
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
        c = Consumer(self, tcp, http)
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
                log.warning(
                    "nsq source: nsqlookupd now knows %d producer(s) of topic %r: %s",
                    len(found),
                    self.opts.topic,
                    ", ".join(sorted(found)),
                )
            return
        if self.no_producer_warned:
            return
        self.no_producer_warned = True
        lookupds = self.opts.lookupd_http_addresses
        then = (
            "nothing to read"
            if self.available_now
            else f"asking again every {self.opts.lookupd_poll_interval_ms / 1000:g}s"
        )
        log.warning(
            "nsq source: nsqlookupd %s know%s no producer of topic %r (%s): %s",
            ", ".join(lookupds),
            "s" if len(lookupds) == 1 else "",
            self.opts.topic,
            "; ".join(answers),
            then,
        )

    def _discovery_loop(self) -> None:
        interval = self.opts.lookupd_poll_interval_ms / 1000
        while not self.stop_event.wait(interval * (1 + 0.25 * random.random())):
            try:
                found = self.lookup()
            except Exception as exc:  # noqa: BLE001 - logged; keep polling whatever happened
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

    def rdy_for(self, c: Consumer) -> int:
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

    def chunk_sealed(self) -> None:
        """A connection sealed a chunk: the spool's backlog grew, a batch may be waiting."""
        with self.cond:
            self._update_backpressure()
            self.cond.notify_all()

    def chunk_written(self, c: Consumer, n: int) -> None:
        """``n`` messages from ``c`` are spooled (in its open chunk) or were redeliveries."""
        with self.cond:
            c.quiet_since = self.last_chunk_at = time.monotonic()  # a slow write is not quiet
            self._update_backpressure()
            if c.remaining is not None and not c.drained:
                c.remaining -= n
                if c.remaining <= 0:
                    c.drained = True
                    self._check_drained()
            self.cond.notify_all()

    def mark_drained(self, c: Consumer, why: str) -> None:
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

    def _filling(self, chunks: list[Chunk], limit: ReadLimit, until: float) -> bool:
        """Whether a batch over ``chunks`` should wait for more: it holds less than the read
        limit, chunks keep coming (the last less than FILL_QUIET_S ago) and the fill time
        (batchFillWaitMs) is not over. Spark's sources start with a full batch; without this
        the first one would be the first chunk, and each batch pays a fixed cost."""
        if not isinstance(limit, ReadMaxRows) or self.paused:
            return False
        if self.available_now and self.target is not None:
            return False  # everything there is to read is in the spool
        now = time.monotonic()
        if now >= until or now - self.last_chunk_at >= FILL_QUIET_S:
            return False
        return sum(c.rows for c in chunks) < limit.max_rows

    def latest(self, start: int, limit: ReadLimit) -> int:
        now = time.monotonic()
        deadline = now + LATEST_WAIT_S
        fill_until = now + self.opts.batch_fill_wait_ms / 1000
        with self.cond:
            self.planned_upto = max(self.planned_upto, start)
            self._update_backpressure()
            while True:
                self.raise_if_failed()
                if self.stopping:
                    return start
                upto = self.target if self.available_now else None
                chunks = self.spool.chunks(start, upto)
                if chunks and self._filling(chunks, limit, fill_until):
                    self.cond.wait(FILL_QUIET_S)
                    continue
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
        """Spark committed the batches up to ``end``: their chunks go, in the background
        (the record of ids and the directory are synced first: a few milliseconds that
        the next micro-batch need not wait for). A chunk a crash leaves behind is deleted
        by the next run, which starts past it."""
        with self.cond:
            if end <= self.commit_to:
                return
            self.commit_to = end
            if self._janitor is None:
                self._janitor = threading.Thread(
                    target=self._delete_committed, name="nsq-source-commit", daemon=True
                )
                self._janitor.start()
            self.cond.notify_all()

    def _delete_committed(self) -> None:
        done = 0
        while True:
            with self.cond:
                while self.commit_to <= done and not self.stopping:
                    self.cond.wait()
                target = self.commit_to
            if target <= done:
                return  # stopping, and nothing left to delete
            try:
                self.spool.delete_upto(target)
            except Exception as exc:  # noqa: BLE001 - the query fails with it
                self.fail(RuntimeError(f"nsq source: deleting committed spool chunks failed: {exc}"))
                return
            done = target
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
        if self._janitor is not None:  # what was committed goes before the query ends
            self._janitor.join(max(deadline - time.monotonic(), 1.0))
