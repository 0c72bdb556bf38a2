"""Drive the real pynsq against an nsqd whose queues have policies (tests/interop/
test_policies.py): ``nsq.Writer`` publishes, an ``nsq.Reader`` consumes the topic
(REQ'ing the poison bodies every time) and another consumes the dead-letter topic.

Reads a JSON spec on stdin, prints one JSON line. Bodies travel as hex.

Spec keys: ``nsqd`` (host:port), ``topic``, ``channel``, ``dead_letter_topic``, ``pub``
([hex], one Writer.pub each, in order), ``poison`` ([hex]: the handler returns False),
``expect`` (how many dead letters to wait for), ``deadline`` (s).
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback

import nsq
import tornado.ioloop

T0 = time.monotonic()


def main() -> None:
    spec = json.load(sys.stdin)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    poison = set(spec.get("poison", []))
    out: dict = {"status": "ok", "error": "", "deliveries": [], "dead_letters": [], "pub_results": []}
    loop = tornado.ioloop.IOLoop.current()

    def handler(message: nsq.Message) -> bool:
        body = message.body.hex()
        out["deliveries"].append({"body": body, "attempts": message.attempts, "t": time.monotonic() - T0})
        return body not in poison

    def dead(message: nsq.Message) -> bool:
        out["dead_letters"].append(
            {"body": message.body.hex(), "attempts": message.attempts, "t": time.monotonic() - T0}
        )
        return True

    writer = nsq.Writer([spec["nsqd"]])
    nsq.Reader(
        topic=spec["topic"],
        channel=spec["channel"],
        nsqd_tcp_addresses=[spec["nsqd"]],
        message_handler=handler,
        max_in_flight=10,
        requeue_delay=0,
        max_tries=0,  # pynsq's own give-up is off: nsqd's max_attempts decides
        max_backoff_duration=0.01,
    )
    nsq.Reader(
        topic=spec["dead_letter_topic"],
        channel="inspect",
        nsqd_tcp_addresses=[spec["nsqd"]],
        message_handler=dead,
        max_in_flight=10,
    )
    bodies = [bytes.fromhex(b) for b in spec.get("pub", [])]

    def published(conn: object, data: object) -> None:
        ok = not isinstance(data, Exception)
        out["pub_results"].append({"ok": ok, "data": str(data)})

    def publish() -> None:
        if not writer.conns:
            loop.call_later(0.05, publish)
            return
        for b in bodies:
            writer.pub(spec["topic"], b, callback=published)

    def check() -> None:
        if len(out["dead_letters"]) >= spec.get("expect", 0) and len(out["pub_results"]) >= len(bodies):
            loop.call_later(0.3, loop.stop)  # anything more would come now
            return
        if time.monotonic() - T0 > spec.get("deadline", 20):
            out["status"] = "timeout"
            loop.stop()
            return
        loop.call_later(0.05, check)

    loop.call_later(0.2, publish)
    loop.call_later(0.3, check)
    try:
        loop.start()
    except Exception:  # reported to the test
        out["status"] = "error"
        out["error"] = traceback.format_exc()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
