"""Drive the real pynsq (``nsq.Writer`` and ``nsq.Reader``, Tornado) against an nsqd.

Run in its own process by tests/interop/test_pynsq.py, so pynsq's IOLoop and signal
handling never touch the pytest process. Reads a JSON spec on stdin, prints one JSON result
line on stdout. Bodies travel as hex. Everything is driven by events and polled conditions
with a deadline (no fixed sleeps decide the outcome).

Spec keys (all optional except ``nsqd``, ``topic``):
  nsqd              "host:port" of nsqd's TCP listener
  topic, channel
  writer_conn, reader_conn   AsyncConn kwargs (IDENTIFY options) for Writer / Reader
  max_in_flight, max_backoff_duration
  pub               [hex]             published one by one with Writer.pub
  mpub              [[hex]]           each list published with one Writer.mpub
  dpub              [[delay_ms, hex]] published with Writer.dpub
  requeue_first     [hex]             handler returns False on attempt 1 (REQ), True later
  touch             [hex]             handled async: TOUCH every touch_every s for
                                      touch_for s, then FIN
  hold              [hex]             async and never answered on attempt 1 (left to time out)
  late              [hex]             one mpub once the reader has been connected for
                                      min_connected s and has seen min_heartbeats heartbeats
  stats_url         if set, GET it (nsqd's /stats?format=json) while still connected
  deadline          seconds for the whole run
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import traceback
import urllib.request

import nsq
import tornado.ioloop

T0 = time.monotonic()


def now() -> float:
    return time.monotonic() - T0


class Recorder:
    def __init__(self) -> None:
        self.deliveries: list[dict] = []  # one per message frame received
        self.finished: dict[str, int] = {}  # hex -> times FINed by the handler
        self.touches: dict[str, int] = {}
        self.reader_heartbeats = 0
        self.writer_heartbeats = 0
        self.reader_ready = 0
        self.writer_ready = 0
        self.reader_connected_at: float | None = None
        self.identify = {"reader": [], "writer": []}
        self.errors: list[str] = []
        self.closing = False  # our own close() makes pynsq report "failed to unpack size"
        self.pub_sent_at: dict[str, float] = {}
        self.pub_results: list[dict] = []
        self.stats: dict | None = None


class RecordingReader(nsq.Reader):
    rec: Recorder

    def _on_connection_ready(self, conn, **kwargs):
        self.rec.reader_ready += 1
        if self.rec.reader_connected_at is None:
            self.rec.reader_connected_at = now()
        return super()._on_connection_ready(conn, **kwargs)

    def _on_connection_identify_response(self, conn, data, **kwargs):
        self.rec.identify["reader"].append(data)
        return super()._on_connection_identify_response(conn, data, **kwargs)

    def _on_connection_error(self, conn, error, **kwargs):
        if not self.rec.closing:
            self.rec.errors.append(f"reader: {error!r}")
        return super()._on_connection_error(conn, error, **kwargs)

    def heartbeat(self, conn):
        self.rec.reader_heartbeats += 1


class RecordingWriter(nsq.Writer):
    rec: Recorder

    def _on_connection_ready(self, conn, **kwargs):
        self.rec.writer_ready += 1
        return super()._on_connection_ready(conn, **kwargs)

    def _on_connection_identify_response(self, conn, data, **kwargs):
        self.rec.identify["writer"].append(data)
        return super()._on_connection_identify_response(conn, data, **kwargs)

    def _on_connection_error(self, conn, error, **kwargs):
        if not self.rec.closing:
            self.rec.errors.append(f"writer: {error!r}")
        return super()._on_connection_error(conn, error, **kwargs)

    def heartbeat(self, conn):
        self.rec.writer_heartbeats += 1


async def wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def run(spec: dict, rec: Recorder) -> None:
    io_loop = tornado.ioloop.IOLoop.current()
    topic = spec["topic"]
    channel = spec.get("channel", "interop")
    requeue_first = set(spec.get("requeue_first", []))
    touch = set(spec.get("touch", []))
    hold = set(spec.get("hold", []))
    touch_for = spec.get("touch_for", 2.5)
    touch_every = spec.get("touch_every", 0.3)

    def handler(message):
        h = message.body.hex()
        rec.deliveries.append(
            {"body": h, "attempts": message.attempts, "id": message.id.decode(), "t": now()}
        )
        if h in hold and message.attempts == 1:
            message.enable_async()
            return None
        if h in touch and message.attempts == 1:
            message.enable_async()
            started = time.monotonic()

            def tick():
                if time.monotonic() - started >= touch_for:
                    message.finish()
                    rec.finished[h] = rec.finished.get(h, 0) + 1
                    return
                message.touch()
                rec.touches[h] = rec.touches.get(h, 0) + 1
                io_loop.call_later(touch_every, tick)

            io_loop.call_later(touch_every, tick)
            return None
        if h in requeue_first and message.attempts == 1:
            return False
        rec.finished[h] = rec.finished.get(h, 0) + 1
        return True

    RecordingReader.rec = rec
    RecordingWriter.rec = rec
    reader = RecordingReader(
        topic=topic,
        channel=channel,
        message_handler=handler,
        nsqd_tcp_addresses=[spec["nsqd"]],
        max_in_flight=spec.get("max_in_flight", 50),
        max_backoff_duration=spec.get("max_backoff_duration", 0.1),
        **spec.get("reader_conn", {}),
    )
    writer = RecordingWriter([spec["nsqd"]], **spec.get("writer_conn", {}))
    try:
        await wait_until(lambda: reader.conns and writer.conns, 10, "reader and writer connections")

        outstanding = [0]

        def make_cb(kind: str, bodies: list[str]):
            outstanding[0] += 1

            def cb(conn, data):
                outstanding[0] -= 1
                ok = data == b"OK"
                rec.pub_results.append({"kind": kind, "ok": ok, "n": len(bodies), "data": repr(data)})

            return cb

        for h in spec.get("pub", []):
            writer.pub(topic, bytes.fromhex(h), callback=make_cb("pub", [h]))
        for batch in spec.get("mpub", []):
            writer.mpub(topic, [bytes.fromhex(h) for h in batch], callback=make_cb("mpub", batch))
        for delay_ms, h in spec.get("dpub", []):
            rec.pub_sent_at[h] = now()
            writer.dpub(topic, delay_ms, bytes.fromhex(h), callback=make_cb("dpub", [h]))
        await wait_until(lambda: outstanding[0] == 0, 20, "publish responses")

        expected = set(spec.get("pub", [])) | {h for b in spec.get("mpub", []) for h in b}
        expected |= {h for _, h in spec.get("dpub", [])}
        await wait_until(lambda: expected <= rec.finished.keys(), 25, "all messages finished")

        late = spec.get("late", [])
        if late:
            min_connected = spec.get("min_connected", 3.5)
            min_hb = spec.get("min_heartbeats", 2)
            await wait_until(
                lambda: (
                    now() - rec.reader_connected_at >= min_connected
                    and rec.reader_heartbeats >= min_hb
                    and rec.writer_heartbeats >= min_hb
                ),
                min_connected + 10,
                "connection age and heartbeats",
            )
            rec.late_published_at = now()
            bodies = [bytes.fromhex(h) for h in late]
            writer.mpub(topic, bodies, callback=make_cb("late-mpub", late))
            await wait_until(lambda: outstanding[0] == 0, 10, "late publish response")
            await wait_until(lambda: set(late) <= rec.finished.keys(), 10, "late messages finished")
        if spec.get("stats_url"):
            # FINs travel on the reader's socket, /stats on another: poll until nsqd has
            # counted them all (or give up and let the test show the last answer)
            deadline = time.monotonic() + 5
            while True:
                # a blocking GET in the driver (one short stats read while pynsq idles)
                with urllib.request.urlopen(spec["stats_url"], timeout=5) as resp:  # noqa: ASYNC210
                    rec.stats = json.loads(resp.read())
                fins = sum(
                    cl["finish_count"]
                    for t in rec.stats["topics"]
                    for ch in t["channels"]
                    for cl in ch["clients"] or ()
                )
                if fins >= len(expected) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.02)
    finally:
        rec.closing = True
        reader.close()
        for conn in list(writer.conns.values()):
            conn.close()


def main() -> int:
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    spec = json.load(sys.stdin)
    rec = Recorder()
    rec.late_published_at = None
    status = "ok"
    error = ""

    async def guarded():
        await asyncio.wait_for(run(spec, rec), spec.get("deadline", 45))

    try:
        asyncio.run(guarded())
    except BaseException as e:  # report what we have, the test decides
        status = "error"
        error = "".join(traceback.format_exception(e))
    out = {
        "status": status,
        "error": error,
        "deliveries": rec.deliveries,
        "finished": rec.finished,
        "touches": rec.touches,
        "reader_heartbeats": rec.reader_heartbeats,
        "writer_heartbeats": rec.writer_heartbeats,
        "reader_ready": rec.reader_ready,
        "writer_ready": rec.writer_ready,
        "reader_connected_at": rec.reader_connected_at,
        "late_published_at": rec.late_published_at,
        "identify": rec.identify,
        "errors": rec.errors,
        "pub_sent_at": rec.pub_sent_at,
        "pub_results": rec.pub_results,
        "stats": rec.stats,
    }
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
