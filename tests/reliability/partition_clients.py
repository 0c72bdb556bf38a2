"""The producer and the consumer of test_partitions.py, each run as its own process inside
its own network namespace (``ip netns exec <ns> python partition_clients.py ...``).

- ``producer``: publishes numbered messages (PUB, every 10th an MPUB of 5) to topic ``part``
  on every nsqd (round robin, a failed publish is retried on another) until ``--stop`` exists;
  writes the number of each acknowledged message to ``--out``, one per line, as soon as its
  OK arrives (so the file is what the producer was promised, nothing more).
- ``consumer``: consumes ``part``/``c`` from the nsqd it discovers through both nsqlookupd;
  writes each received message's number to ``--out`` before FINning it, and the nsqd it is
  connected to into ``--status`` (JSON, replaced atomically) twice a second.

Both detect a dead link within seconds (heartbeats every second, a 3 s read timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path

from nsqpy.client import Consumer, Producer
from nsqpy.client.config import ConnectionConfig

TOPIC = "part"
CHANNEL = "c"


def config() -> ConnectionConfig:
    return ConnectionConfig(heartbeat_interval=1.0, read_timeout=3.0, dial_timeout=1.0, write_timeout=2.0)


async def produce(a: argparse.Namespace) -> None:
    stop = Path(a.stop)
    n = 0
    with open(a.out, "a", buffering=1) as out:
        async with Producer(a.nsqd.split(","), config=config(), timeout=4.0, max_reconnect_interval=1.0) as p:
            while not stop.exists():
                try:
                    if n % 10 == 9:
                        ids = list(range(n, n + 5))
                        n += 5
                        await p.publish_many(TOPIC, [b"%d" % i for i in ids])
                        out.write("".join(f"{i}\n" for i in ids))
                    else:
                        i, n = n, n + 1
                        await p.publish(TOPIC, b"%d" % i)
                        out.write(f"{i}\n")
                except Exception as e:
                    print(f"publish failed: {e!r}", file=sys.stderr, flush=True)
                await asyncio.sleep(1 / a.rate)


async def consume(a: argparse.Namespace) -> None:
    stop = Path(a.stop)
    status = Path(a.status)
    c = Consumer(
        TOPIC,
        CHANNEL,
        lookupd_http_addresses=a.lookupd.split(","),
        config=config(),
        max_in_flight=50,
        max_attempts=0,  # never give up on a message: every redelivery must reach --out
        lookupd_poll_interval=1.0,
        lookupd_poll_jitter=0.0,
        reconnect_interval=0.5,
    )
    with open(a.out, "a", buffering=1) as out:
        await c.start()

        async def report() -> None:
            while True:
                tmp = status.with_suffix(".tmp")
                tmp.write_text(json.dumps({"connections": sorted(c.connections)}))
                os.replace(tmp, status)
                await asyncio.sleep(0.5)

        reporter = asyncio.create_task(report())
        try:
            it = c.__aiter__()
            while not stop.exists():
                try:
                    msg = await asyncio.wait_for(it.__anext__(), 0.5)
                except TimeoutError:
                    continue
                out.write(msg.body.decode() + "\n")
                msg.finish()
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
            await c.close(drain_timeout=5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["producer", "consumer"])
    ap.add_argument("--nsqd", default="")
    ap.add_argument("--lookupd", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--status", default="")
    ap.add_argument("--stop", required=True)
    ap.add_argument("--rate", type=float, default=100.0)
    a = ap.parse_args()
    asyncio.run(produce(a) if a.role == "producer" else consume(a))


if __name__ == "__main__":
    main()
