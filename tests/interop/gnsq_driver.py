"""Drive the real gnsq 1.0.2 (gevent) against an nsqd.

Run in its own process by tests/interop/test_gnsq.py: gevent monkey-patches the standard
library, which must never happen inside the pytest process. Reads a JSON spec on stdin,
prints one JSON result line on stdout. Bodies travel as hex. Waits are polled conditions
with a deadline.

Scenarios (``spec["scenario"]``):
  producer_consumer  gnsq.Producer publish / multipublish / publish(defer=) and a
                     gnsq.Consumer (max_in_flight > 1) that FINs by returning and REQs by
                     raising (NSQRequeueMessage, or any other exception)
  lowlevel           gnsq.NsqdTCPClient: identify, PUB/MPUB/DPUB with responses, SUB, RDY,
                     FIN/REQ (with a delay)/TOUCH, heartbeats, error frames mapped to gnsq's
                     exceptions, CLS
  http               gnsq.NsqdHTTPClient publish/multipublish/topic and channel admin/stats,
                     then consume with NsqdTCPClient
  upgraded           NsqdTCPClient with TLS / snappy / deflate / AUTH (spec["conn"]):
                     publish, then read everything back
"""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import gevent  # noqa: E402
import gnsq  # noqa: E402
from gnsq import errors as gerrors  # noqa: E402
from gnsq import protocol as nsq  # noqa: E402

T0 = time.monotonic()


def now():
    return time.monotonic() - T0


def wait_until(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("timed out waiting for " + what)
        gevent.sleep(0.01)


def split(addr):
    host, _, port = addr.rpartition(":")
    return host, int(port)


def delivery(message):
    return {
        "body": message.body.hex(),
        "attempts": message.attempts,
        "id": message.id.decode(),
        "t": now(),
    }


def err_text(err):
    """gnsq builds its exceptions from the frame's bytes."""
    arg = err.args[0] if err.args else b""
    return arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)


def err_info(err, conn):
    return {
        "class": type(err).__name__,
        "text": err_text(err),
        "fatal": err.fatal,
        "connected": conn.is_connected,
    }


# --------------------------------------------------------------------------------------------


def producer_consumer(spec, out):
    topic = spec["topic"]
    requeue_signal = set(spec.get("requeue_signal", []))
    requeue_exc = set(spec.get("requeue_exception", []))
    deliveries = out["deliveries"] = []
    finished = out["finished"] = {}
    errors = out["errors"] = []
    out["pub_sent_at"] = {}

    def handler(consumer, message):
        h = message.body.hex()
        deliveries.append(delivery(message))
        if message.attempts == 1 and h in requeue_signal:
            raise gerrors.NSQRequeueMessage(backoff=False)
        if message.attempts == 1 and h in requeue_exc:
            raise RuntimeError("handler failure (expected by the test)")
        finished[h] = finished.get(h, 0) + 1

    def on_error(name):
        return lambda sender, error: errors.append(f"{name}: {error!r}")

    consumer = gnsq.Consumer(
        topic,
        spec.get("channel", "interop"),
        nsqd_tcp_addresses=[spec["nsqd"]],
        message_handler=handler,
        max_in_flight=spec.get("max_in_flight", 32),
        max_backoff_duration=spec.get("max_backoff_duration", 0.05),
        **spec.get("consumer_conn", {}),
    )
    consumer.on_error.connect(on_error("consumer"), weak=False)
    producer = gnsq.Producer([spec["nsqd"]], **spec.get("producer_conn", {}))
    producer.on_error.connect(on_error("producer"), weak=False)
    producer.start()
    consumer.start(block=False)
    try:
        results = []  # gevent AsyncResults: publish without waiting, then collect
        for h in spec.get("pub", []):
            results.append(producer.publish(topic, bytes.fromhex(h), raise_error=False))
        for batch in spec.get("mpub", []):
            bodies = [bytes.fromhex(h) for h in batch]
            results.append(producer.multipublish(topic, bodies, raise_error=False))
        for delay_ms, h in spec.get("dpub", []):
            out["pub_sent_at"][h] = now()
            body = bytes.fromhex(h)
            results.append(producer.publish(topic, body, defer=delay_ms, raise_error=False))
        out["pub_responses"] = [r.get(timeout=20).decode() for r in results]

        expected = set(spec.get("pub", [])) | {h for b in spec.get("mpub", []) for h in b}
        expected |= {h for _, h in spec.get("dpub", [])}
        wait_until(lambda: expected <= finished.keys(), 25, "all messages finished")
        out["connections"] = len(consumer._connections)
    finally:
        consumer.close()
        producer.close()


# --------------------------------------------------------------------------------------------


def read_until(conn, pred, timeout, log):
    """Read frames until ``pred(frame, data)`` is true; log every frame's kind."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no matching frame; last frames " + repr(log[-5:]))
        with gevent.Timeout(left, TimeoutError("read timed out; last frames " + repr(log[-5:]))):
            frame, data = conn.read_response()
        if frame == nsq.FRAME_TYPE_MESSAGE:
            log.append(("message", data.body.hex(), data.attempts))
        elif frame == nsq.FRAME_TYPE_ERROR:
            log.append(("error", type(data).__name__, err_text(data)))
        else:
            log.append(("response", data.decode("latin-1")))
        if pred(frame, data):
            return frame, data


def is_reply(f, d):
    """A response or error frame that is not a heartbeat (read_response already NOPed it)."""
    if f == nsq.FRAME_TYPE_RESPONSE:
        return d != b"_heartbeat_"
    return f == nsq.FRAME_TYPE_ERROR


def is_message(f, d):
    return f == nsq.FRAME_TYPE_MESSAGE


def is_error(f, d):
    return f == nsq.FRAME_TYPE_ERROR


def text(d):
    return d.decode() if isinstance(d, bytes) else repr(d)


def lowlevel(spec, out):
    topic = spec["topic"]
    host, port = split(spec["nsqd"])
    log = out["frames"] = []

    # producer connection: IDENTIFY with deflate requested, PUB/MPUB/DPUB one by one
    prod = gnsq.NsqdTCPClient(host, port, deflate=True, deflate_level=5, heartbeat_interval=1)
    prod.connect()
    out["identify_producer"] = prod.identify()
    responses = []
    for h in spec["pub"]:
        prod.publish(topic, bytes.fromhex(h))
        responses.append(read_until(prod, is_reply, 5, log))
    prod.multipublish(topic, [bytes.fromhex(h) for h in spec["mpub"]])
    responses.append(read_until(prod, is_reply, 5, log))
    out["pub_sent_at"] = {}
    for delay_ms, h in spec["dpub"]:
        out["pub_sent_at"][h] = now()
        prod.publish(topic, bytes.fromhex(h), defer=delay_ms)
        responses.append(read_until(prod, is_reply, 5, log))
    out["pub_responses"] = [[f, text(d)] for f, d in responses]

    # consumer connection: snappy, heartbeats every second
    cons = gnsq.NsqdTCPClient(host, port, snappy=True, heartbeat_interval=1)
    cons.connect()
    out["identify_consumer"] = cons.identify()
    cons.subscribe(topic, "lowlevel")
    cons.check_ok()
    cons.ready(spec.get("rdy", 100))

    expected = set(spec["pub"]) | set(spec["mpub"]) | {h for _, h in spec["dpub"]}
    requeue = set(spec.get("requeue", []))
    requeue_ms = spec.get("requeue_delay_ms", 0)
    touch = set(spec.get("touch", []))
    finished = out["finished"] = {}
    deliveries = out["deliveries"] = []
    deadline = time.monotonic() + 20
    while not expected <= finished.keys():
        _frame, msg = read_until(cons, is_message, deadline - time.monotonic(), log)
        h = msg.body.hex()
        deliveries.append(delivery(msg))
        if h in requeue and msg.attempts == 1:
            cons.requeue(msg.id, requeue_ms)
            continue
        if h in touch:
            cons.touch(msg.id)  # no reply expected; an error frame would show up in the log
        cons.finish(msg.id)
        finished[h] = finished.get(h, 0) + 1

    # a FIN for an id that is not in flight: E_FIN_FAILED → NSQFinishFailed, not fatal
    cons.send(nsq.finish(b"0000000000000000"))
    _frame, err = read_until(cons, is_error, 5, log)
    out["fin_failed"] = err_info(err, cons)

    # stay connected past a few heartbeats on both connections, then one more message
    # (read in turns, one heartbeat of each at a time: a connection that answers none for two
    # intervals is closed by nsqd, as by Go's, so neither may wait for two of the other's)
    hbs = {"consumer": 0, "producer": 0}

    def one_hb(who):
        def seen(f, d):
            if f == nsq.FRAME_TYPE_RESPONSE and d == b"_heartbeat_":
                hbs[who] += 1
                return True
            return False

        return seen

    for _ in range(2):
        read_until(cons, one_hb("consumer"), 6, log)  # read_response answers it with NOP
        read_until(prod, one_hb("producer"), 6, log)
    out["consumer_heartbeats"] = hbs["consumer"]
    out["producer_heartbeats"] = hbs["producer"]
    prod.publish(topic, b"after-heartbeats")
    out["late_pub"] = text(read_until(prod, is_reply, 5, log)[1])
    _frame, msg = read_until(cons, is_message, 5, log)
    out["late_message"] = msg.body.decode()
    cons.finish(msg.id)

    # CLS → CLOSE_WAIT
    cons.close()
    out["cls_response"] = text(read_until(cons, is_reply, 5, log)[1])

    # a fatal error: an empty PUB body is E_BAD_MESSAGE (NSQBadMessage, fatal)
    prod.send(nsq._command(nsq.PUB, b"", topic))
    try:
        _frame, err = read_until(prod, is_error, 5, log)
        out["bad_message"] = err_info(err, prod)
    finally:
        prod.close_stream()
        cons.close_stream()


# --------------------------------------------------------------------------------------------


def http(spec, out):
    topic = spec["topic"]
    host, port = split(spec["nsqd_http"])
    client = gnsq.NsqdHTTPClient(host, port)
    res = out["http"] = {}
    res["ping"] = client.ping().decode()
    res["create_topic"] = repr(client.create_topic(topic))
    res["create_channel"] = repr(client.create_channel(topic, "http"))
    res["publish"] = client.publish(topic, bytes.fromhex(spec["pub"][0])).decode()
    for h in spec["pub"][1:]:
        client.publish(topic, bytes.fromhex(h))
    text_bodies = [bytes.fromhex(h) for h in spec["mpub_text"]]
    res["mpub_text"] = client.multipublish(topic, text_bodies).decode()
    bin_bodies = [bytes.fromhex(h) for h in spec["mpub_binary"]]
    res["mpub_binary"] = client.multipublish(topic, bin_bodies, binary=True).decode()
    res["stats"] = client.stats(topic=topic)
    try:
        client.pause_channel(topic, "nonexistent")
        res["pause_missing_channel"] = "no error"
    except gerrors.NSQHttpError as e:
        res["pause_missing_channel"] = str(e)
    res["info"] = client.info()

    expected = set(spec["pub"]) | set(spec["mpub_text"]) | set(spec["mpub_binary"])
    host_t, port_t = split(spec["nsqd"])
    cons = gnsq.NsqdTCPClient(host_t, port_t)
    cons.connect()
    cons.identify()
    cons.subscribe(topic, "http")
    cons.check_ok()
    cons.ready(100)
    finished = out["finished"] = {}
    log = out["frames"] = []
    deadline = time.monotonic() + 15
    while not expected <= finished.keys():
        _frame, msg = read_until(cons, is_message, deadline - time.monotonic(), log)
        cons.finish(msg.id)
        finished[msg.body.hex()] = finished.get(msg.body.hex(), 0) + 1
    cons.close_stream()

    # topic admin after the data checks
    res["empty_topic"] = repr(client.empty_topic(topic))
    res["pause_topic"] = repr(client.pause_topic(topic))
    res["unpause_topic"] = repr(client.unpause_topic(topic))
    res["delete_channel"] = repr(client.delete_channel(topic, "http"))
    res["delete_topic"] = repr(client.delete_topic(topic))
    try:
        client.delete_topic(topic)
        res["delete_missing_topic"] = "no error"
    except gerrors.NSQHttpError as e:
        res["delete_missing_topic"] = str(e)


def upgraded(spec, out):
    """Two NsqdTCPClient connections with ``spec["conn"]`` (TLS, compression, auth_secret):
    identify (and AUTH), PUB/MPUB, SUB, RDY, every message read back and FINed."""
    topic = spec["topic"]
    host, port = split(spec["nsqd"])
    log = out["frames"] = []
    prod = gnsq.NsqdTCPClient(host, port, **spec["conn"])
    prod.connect()
    out["identify"] = prod.identify()
    if spec["conn"].get("auth_secret"):
        out["auth"] = prod.auth()
    bodies = [bytes.fromhex(h) for h in spec["bodies"]]
    prod.publish(topic, bodies[0])
    out["pub"] = text(read_until(prod, is_reply, 5, log)[1])
    prod.multipublish(topic, bodies[1:])
    out["mpub"] = text(read_until(prod, is_reply, 5, log)[1])
    cons = gnsq.NsqdTCPClient(host, port, **spec["conn"])
    cons.connect()
    cons.identify()
    if spec["conn"].get("auth_secret"):
        cons.auth()
    cons.subscribe(topic, "upgraded")
    cons.check_ok()
    cons.ready(100)
    finished = out["finished"] = []
    while len(finished) < len(bodies):
        _frame, msg = read_until(cons, is_message, 10, log)
        cons.finish(msg.id)
        finished.append(msg.body.hex())
    cons.close_stream()
    prod.close_stream()


SCENARIOS = {
    "producer_consumer": producer_consumer,
    "lowlevel": lowlevel,
    "http": http,
    "upgraded": upgraded,
}


def main():
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    spec = json.load(sys.stdin)
    out = {"status": "ok", "error": ""}
    try:
        with gevent.Timeout(spec.get("deadline", 40), TimeoutError("driver deadline")):
            SCENARIOS[spec["scenario"]](spec, out)
    except BaseException as e:  # report what we have; the test decides
        out["status"] = "error"
        out["error"] = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    sys.stdout.write(json.dumps(out, default=repr) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
