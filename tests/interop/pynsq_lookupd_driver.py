"""Drive the real pynsq ``nsq.Reader`` (Tornado) with nothing but nsqlookupd HTTP addresses.

Run in its own process by tests/e2e/test_cluster.py (as pynsq_driver.py is by the interop
tests), so pynsq's IOLoop never touches the pytest process. Reads a JSON spec on stdin,
prints one JSON result line on stdout. Bodies travel as hex. Every wait polls a condition
with a deadline.

Spec keys:
  lookupd_http      ["host:port", ...]   the only addresses pynsq is given
  topic, channel
  expected          [hex]                bodies to wait for (all must be FINished)
  stats_urls        [url]                nsqd /stats?format=json URLs, fetched while the
                                         reader is still connected
  max_in_flight, deadline
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


class Recorder:
    def __init__(self) -> None:
        self.deliveries: list[dict] = []  # one per message: body, attempts, nsqd conn id
        self.finished: dict[str, int] = {}
        self.ready: list[str] = []  # conn ids, in the order they became ready
        self.errors: list[str] = []
        self.closing = False
        self.stats: dict[str, dict] = {}


class RecordingReader(nsq.Reader):
    rec: Recorder

    def _on_connection_ready(self, conn, **kwargs):
        self.rec.ready.append(conn.id)
        return super()._on_connection_ready(conn, **kwargs)

    def _on_message(self, conn, message, **kwargs):
        self.rec.deliveries.append(
            {"body": message.body.hex(), "attempts": message.attempts, "conn": conn.id}
        )
        return super()._on_message(conn, message, **kwargs)

    def _on_connection_error(self, conn, error, **kwargs):
        if not self.rec.closing:
            self.rec.errors.append(f"{conn.id}: {error!r}")
        return super()._on_connection_error(conn, error, **kwargs)


async def wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def run(spec: dict, rec: Recorder) -> None:
    expected = set(spec["expected"])

    def handler(message):
        h = message.body.hex()
        rec.finished[h] = rec.finished.get(h, 0) + 1
        return True

    RecordingReader.rec = rec
    reader = RecordingReader(
        topic=spec["topic"],
        channel=spec["channel"],
        message_handler=handler,
        lookupd_http_addresses=spec["lookupd_http"],
        max_in_flight=spec.get("max_in_flight", 30),
    )
    try:
        await wait_until(lambda: expected <= rec.finished.keys(), 30, "all messages finished")
        for url in spec.get("stats_urls", []):
            # a blocking GET in the driver (a short stats read after the run)
            with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: ASYNC210
                rec.stats[url] = json.loads(resp.read())
    finally:
        rec.closing = True
        reader.close()


def main() -> int:
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    spec = json.load(sys.stdin)
    rec = Recorder()
    status, error = "ok", ""

    async def guarded():
        await asyncio.wait_for(run(spec, rec), spec.get("deadline", 40))

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
        "ready": rec.ready,
        "errors": rec.errors,
        "stats": rec.stats,
    }
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
