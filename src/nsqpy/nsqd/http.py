"""nsqd's HTTP API, as NSQ 1.3.0's ``nsqd/http.go`` (on :mod:`nsqpy.httpserver`).

Same paths, methods, parameters, status codes and bodies as the Go daemon:

- successful ``V1`` responses carry ``X-NSQ-Content-Type: nsq; version=1.0``; a string
  result is sent as text, ``None`` as an empty body, anything else as JSON;
- errors are ``{"message":"<CODE>"}`` with the status (``/ping`` and the ``/debug``
  helpers answer in plain text instead, as Go's ``PlainText`` decorator does);
- routing follows ``julienschmidt/httprouter`` as nsqd configures it: 404 ``NOT_FOUND``,
  405 ``METHOD_NOT_ALLOWED`` with ``Allow``, automatic ``OPTIONS``, and 301/307 redirects
  for a wrong trailing slash or letter case;
- ``/pub`` and ``/mpub`` are not logged (as in Go); every other request is logged at INFO.

The router, response styles and request helpers are shared with the other daemons
(:mod:`nsqpy.httpapi`).

``/debug/pprof/*`` are Go-runtime endpoints; Python equivalents answer here in plain text:
``/debug/pprof/`` (index), ``cmdline``, ``goroutine`` (thread stacks and asyncio tasks),
``heap`` (tracemalloc top allocation sites when tracing, else GC/memory counters) and
``profile?seconds=N`` (cProfile of the event loop for N seconds, pstats text).
``symbol``, ``block`` and ``threadcreate`` have no Python meaning and answer 404
``NOT_FOUND``. ``PUT /debug/setblockrate`` validates ``rate`` like Go and is a no-op;
``POST /debug/freememory`` runs a full ``gc.collect()`` plus glibc ``malloc_trim(0)``.

``GET /metrics`` (Prometheus) is an nsqpy addition, see :mod:`nsqpy.metrics`.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re
import socket
import ssl
import sys
from typing import TYPE_CHECKING, Any

from .. import NSQ_VERSION
from ..goflags import go_quote
from ..httpapi import (
    ADMIN,
    BODIES,
    JSON_TYPE,
    OPEN,
    PLAIN,
    PUBLISH,
    V1_HEADER,
    HTTPError,
    Params,
    Request,
    Response,
    Router,
    get_param,
    parse_query,
    read_max,
    req_params,
    serve,
    topic_channel_args,
)
from ..pprof import Pprof
from ..protocol.commands import decode_mpub
from ..protocol.errors import ProtocolError
from ..protocol.names import is_valid_topic_name
from . import peek
from .auth import AuthError, AuthState
from .channel import Channel
from .diskqueue import DiskQueueError
from .options import InvalidOptionError, OptionsError, config_value, set_config_value
from .policy import CHANNEL_KEYS, TOPIC_KEYS, Policy, PolicyError, PolicyRejectedError
from .stats import (
    BOOL_PARAMS,
    install_gc_tracker,
    mem_stats,
    stats_document,
    stats_text,
)
from .topic import Topic, TopicExitingError

if TYPE_CHECKING:
    from .nsqd import NSQD

log = logging.getLogger("nsqd")

_INT = re.compile(r"[+-]?[0-9]+")
#: auth answers kept for --http-publish-auth (all forgotten past it)
PUBLISH_AUTH_CACHE = 10_000


def _ns(seconds: float) -> int:
    return round(seconds * 1_000_000_000)


def _int64_wrap(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _split_text_mpub(data: bytes, limit: int, max_msg_size: int) -> list[bytes]:
    """``/mpub`` text mode: newline-separated bodies, empty lines dropped, Go's checks."""
    parts = data.split(b"\n")
    last = len(parts) - 1
    total = 0
    out = []
    for i, block in enumerate(parts):
        total += len(block) + (i < last)
        if total == limit:
            raise HTTPError(413, "BODY_TOO_BIG")
        if not block:
            continue
        if len(block) > max_msg_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        out.append(block)
    return out


def topic_name(values: dict[str, list[str]]) -> str:
    """The ``topic`` parameter, checked as Go's handlers do: 400 ``MISSING_ARG_TOPIC``, 400
    ``INVALID_TOPIC``."""
    name = get_param(values, "topic")
    if name is None:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    if not is_valid_topic_name(name):
        raise HTTPError(400, "INVALID_TOPIC")
    return name


# --- the server -------------------------------------------------------------------------------


class HTTPServer:
    """Routes and handlers of nsqd's HTTP API, bound to one :class:`NSQD`."""

    def __init__(self, nsqd: NSQD, tls: bool = False) -> None:
        self.nsqd = nsqd
        #: the HTTPS listener's server (never answers TLS_REQUIRED)
        self.tls = tls
        self.router = Router(log)
        #: the Prometheus registry, made at the first GET /metrics
        self._metrics: Any = None
        #: --http-publish-auth: the auth server's answers by (secret, remote ip, tls, common name)
        self._publish_auths: dict[tuple[str, str, bool, str], AuthState] = {}
        self.pprof = Pprof(
            "nsqd", mem_stats, "/debug/freememory        POST: gc.collect() and malloc_trim(0)\n"
        )
        self.router.admin_auth = nsqd.admin_auth
        r = self.router.route
        # who may call each route (an nsqpy addition: --admin-token-file; NSQ: everyone)
        r("GET", "/ping", self.ping, PLAIN, access=OPEN)
        r("GET", "/info", self.info, access=OPEN)
        r("POST", "/pub", self.pub, logged=False, access=PUBLISH)
        r("POST", "/mpub", self.mpub, logged=False, access=PUBLISH)
        r("GET", "/stats", self.stats, access=OPEN)
        r("GET", "/metrics", self.metrics, access=OPEN)
        r("POST", "/topic/create", self.topic_create, access=ADMIN)
        r("POST", "/topic/delete", self.topic_delete, access=ADMIN)
        r("POST", "/topic/empty", self.topic_empty, access=ADMIN)
        r("POST", "/topic/pause", self.topic_pause, access=ADMIN)
        r("POST", "/topic/unpause", self.topic_pause, access=ADMIN)
        r("POST", "/channel/create", self.channel_create, access=ADMIN)
        r("POST", "/channel/delete", self.channel_delete, access=ADMIN)
        r("POST", "/channel/empty", self.channel_empty, access=ADMIN)
        r("POST", "/channel/pause", self.channel_pause, access=ADMIN)
        r("POST", "/channel/unpause", self.channel_pause, access=ADMIN)
        # queue policies (an nsqpy addition)
        r("GET", "/topic/config", self.topic_config, access=OPEN)
        r("POST", "/topic/config", self.topic_config, access=ADMIN)
        r("GET", "/channel/config", self.channel_config, access=OPEN)
        r("POST", "/channel/config", self.channel_config, access=ADMIN)
        # peek and acting on one message (an nsqpy addition: see nsqpy.nsqd.peek)
        r("GET", "/topic/peek", self.topic_peek, access=BODIES)
        r("GET", "/channel/peek", self.channel_peek, access=BODIES)
        r("POST", "/channel/requeue", self.channel_requeue, access=BODIES)
        r("POST", "/channel/remove", self.channel_remove, access=BODIES)
        r("POST", "/topic/redrive", self.topic_redrive, access=BODIES)
        r("GET", "/config/:opt", self.config, access=OPEN)
        r("PUT", "/config/:opt", self.config, access=ADMIN)
        self.pprof.install(self.router, "/debug/pprof/", access=ADMIN)
        r("PUT", "/debug/setblockrate", self.set_block_rate, PLAIN, access=ADMIN)
        r("POST", "/debug/freememory", self.free_memory, PLAIN, access=ADMIN)

    async def dispatch(self, request: Request) -> Response:
        nsqd = self.nsqd
        if not self.tls and nsqd.options.tls_required == "true":
            # plain HTTP while TLS is required (``tcp-https`` exempts HTTP); Go's exact bytes
            https_port = nsqd.https_port
            return Response(
                403,
                f'{{"message": "TLS_REQUIRED", "https_port": {https_port}}}'.encode(),
                {V1_HEADER[0]: V1_HEADER[1], "Content-Type": JSON_TYPE},
            )
        response: Response = await self.router.dispatch(request)
        return response

    # --- basics -------------------------------------------------------------------------------

    async def ping(self, request: Request, params: Params) -> Any:
        health = self.nsqd.health()
        if not self.nsqd.is_healthy():
            raise HTTPError(500, health)
        return health

    async def info(self, request: Request, params: Params) -> Any:
        nsqd = self.nsqd
        opts = nsqd.options
        try:
            hostname = socket.gethostname()
        except OSError as e:  # pragma: no cover
            raise HTTPError(500, str(e)) from None
        return {
            "version": NSQ_VERSION,
            "broadcast_address": opts.broadcast_address,
            "hostname": hostname,
            "http_port": nsqd.http_port,
            "tcp_port": nsqd.tcp_port,
            "start_time": nsqd.start_time,
            "max_heartbeat_interval": _ns(opts.max_heartbeat_interval),
            "max_output_buffer_size": opts.max_output_buffer_size,
            "max_output_buffer_timeout": _ns(opts.max_output_buffer_timeout),
            "max_deflate_level": opts.max_deflate_level,
        }

    # --- publishing ---------------------------------------------------------------------------

    def _topic_from_query(self, request: Request) -> tuple[dict[str, list[str]], Topic]:
        """Go's ``getTopicFromQuery``: validates ``topic`` and gets (creates) the topic."""
        values = req_params(request)
        return values, self.nsqd.get_topic(topic_name(values))

    async def _put(self, topic: Topic, bodies: list[bytes], defer: float, conn: object = None) -> None:
        """Publish through the same path as TCP PUB/MPUB (including waiting for the fsync
        when --sync-every is reached); any failure is Go's 503 EXITING (the cause, e.g. a
        full disk, is logged and shown by /ping)."""
        if self.nsqd.exiting or topic.exiting:
            raise HTTPError(503, "EXITING")
        if not bodies:
            return
        syncer = self.nsqd.syncer
        assert syncer is not None
        urgent = syncer.urgent_requests
        try:
            topic.put_bodies(bodies, defer)
        except PolicyRejectedError as e:  # a bound set to reject (nothing was stored)
            raise HTTPError(503, str(e)) from None
        except (TopicExitingError, DiskQueueError, OSError) as e:
            log.error("TOPIC(%s): failed to put message(s) - %s", topic.name, e)
            raise HTTPError(503, "EXITING") from None
        if topic.starting:  # answered once the channels nsqlookupd knows exist, as Go's
            started: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def on_started() -> None:
                if not started.done():
                    started.set_result(None)

            topic.when_started(on_started)
            await started
        if syncer.urgent_requests != urgent:  # --sync-every reached: answer after the fsync
            done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

            def synced(err: BaseException | None) -> None:
                if not done.done():
                    done.set_result(err)

            syncer.wait(synced, key=conn)  # the connection publishes again, as a TCP client
            err = await done
            if err is not None:
                log.error("TOPIC(%s): failed to sync message(s) - %s", topic.name, err)
                raise HTTPError(503, "EXITING")

    async def _publish_auth(self, request: Request) -> None:
        """--http-publish-auth: the request's ``Authorization: Bearer <secret>`` must give
        publish permission on its topic, asked of the auth server as a TCP AUTH is (and
        cached for the answer's TTL): 401 without one, 403 when it does not."""
        values = req_params(request)
        name = get_param(values, "topic")
        if name is None or not is_valid_topic_name(name):
            return  # the handler answers MISSING_ARG_TOPIC / INVALID_TOPIC
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer ") or not header[7:].strip():
            raise HTTPError(401, "UNAUTHORIZED", {"WWW-Authenticate": "Bearer"}, auth=True)
        secret = header[7:].strip()
        tls = request.secure
        remote_ip = (request.remote or "").rsplit("%", 1)[0]
        common_name = ""
        transport = request.transport
        cert = transport.get_extra_info("peercert") if tls and transport is not None else None
        for rdn in (cert or {}).get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    common_name = value
        key = (secret, remote_ip, tls, common_name)
        state = self._publish_auths.get(key)
        if state is None or state.is_expired():
            client = self.nsqd.auth_client
            assert client is not None
            try:
                state = await client.query_any(remote_ip, tls, common_name, secret)
            except AuthError as e:
                log.warning("HTTP %s: auth failed for %s - %s", request.path, remote_ip, e)
                raise HTTPError(403, "FORBIDDEN", auth=True) from None
            if len(self._publish_auths) >= PUBLISH_AUTH_CACHE:
                self._publish_auths.clear()
            self._publish_auths[key] = state
        if not state.is_allowed(name, ""):
            raise HTTPError(403, "FORBIDDEN", auth=True)

    async def pub(self, request: Request, params: Params) -> Any:
        if self.nsqd.options.http_publish_auth:
            await self._publish_auth(request)
        opts = self.nsqd.options
        max_size = opts.max_msg_size
        length = request.content_length
        if length is not None and length > max_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        body = await read_max(request, max_size + 1)
        if len(body) > max_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        values, topic = self._topic_from_query(request)
        defer = 0.0
        ds = values.get("defer")
        if ds is not None:
            raw = ds[0]
            if not _INT.fullmatch(raw):
                raise HTTPError(400, "INVALID_DEFER")
            di = int(raw)
            if not -(1 << 63) <= di < 1 << 63:
                raise HTTPError(400, "INVALID_DEFER")
            ns = _int64_wrap(di * 1_000_000)  # time.Duration(di) * time.Millisecond
            if ns < 0 or ns > _ns(opts.max_req_timeout):
                raise HTTPError(400, "INVALID_DEFER")
            defer = ns / 1_000_000_000
        await self._put(topic, [body], defer, request.transport)
        return "OK"

    async def mpub(self, request: Request, params: Params) -> Any:
        if self.nsqd.options.http_publish_auth:
            await self._publish_auth(request)
        opts = self.nsqd.options
        max_body = opts.max_body_size
        length = request.content_length
        if length is not None and length > max_body:
            raise HTTPError(413, "BODY_TOO_BIG")
        values, topic = self._topic_from_query(request)
        binary = False
        mode = get_param(values, "binary")
        if mode is not None:
            b = BOOL_PARAMS.get(mode)
            if b is None:
                log.warning("deprecated value '%s' used for /mpub binary param", mode)
                b = True
            binary = b
        body = await read_max(request, max_body + 1)
        if binary:
            # Go reads a chunked binary body message by message; we cap it at max-body-size
            if len(body) > max_body:
                raise HTTPError(413, "BODY_TOO_BIG")
            try:
                bodies = decode_mpub(body, opts.max_msg_size, max_body)
            except ProtocolError as e:
                raise HTTPError(413, e.code[2:]) from None
        else:
            bodies = _split_text_mpub(body, max_body + 1, opts.max_msg_size)
        await self._put(topic, bodies, 0.0, request.transport)
        return "OK"

    # --- topics and channels -----------------------------------------------------------------

    async def topic_create(self, request: Request, params: Params) -> Any:
        self._topic_from_query(request)
        return None

    async def topic_delete(self, request: Request, params: Params) -> Any:
        name = get_param(req_params(request), "topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not self.nsqd.delete_topic(name):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return None

    async def topic_empty(self, request: Request, params: Params) -> Any:
        name = topic_name(req_params(request))
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        topic.empty()
        return None

    async def topic_pause(self, request: Request, params: Params) -> Any:
        name = get_param(req_params(request), "topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        if "unpause" in request.path:
            topic.unpause()
        else:
            topic.pause()
        return None  # Topic.(un)pause persists the metadata

    def _existing_topic(self, request: Request) -> tuple[Topic, str]:
        """Go's ``getExistingTopicFromQuery``: (topic, channel name)."""
        topic_name, channel_name = topic_channel_args(req_params(request))
        topic = self.nsqd.get_existing_topic(topic_name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return topic, channel_name

    async def channel_create(self, request: Request, params: Params) -> Any:
        topic, name = self._existing_topic(request)
        topic.get_channel(name)
        return None

    async def channel_delete(self, request: Request, params: Params) -> Any:
        topic, name = self._existing_topic(request)
        if not topic.delete_channel(name):
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return None

    async def channel_empty(self, request: Request, params: Params) -> Any:
        topic, name = self._existing_topic(request)
        channel = topic.channels.get(name)
        if channel is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        channel.empty()
        return None

    async def channel_pause(self, request: Request, params: Params) -> Any:
        topic, name = self._existing_topic(request)
        channel = topic.channels.get(name)
        if channel is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        if "unpause" in request.path:
            channel.unpause()
        else:
            channel.pause()
        return None

    # --- queue policies (an nsqpy addition: see nsqpy.nsqd.policy) -----------------------------

    async def topic_config(self, request: Request, params: Params) -> Any:
        """GET: the topic's effective settings; POST: set the keys the JSON body names."""
        name = get_param(req_params(request), "topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise HTTPError(400, f"unknown topic {go_quote(name)}")
        return await self._config(request, topic, TOPIC_KEYS, name)

    async def channel_config(self, request: Request, params: Params) -> Any:
        topic_name, name = topic_channel_args(req_params(request))
        topic = self.nsqd.get_existing_topic(topic_name)
        if topic is None:
            raise HTTPError(400, f"unknown topic {go_quote(topic_name)}")
        channel = topic.channels.get(name)
        if channel is None:
            raise HTTPError(400, f"unknown channel {go_quote(topic_name + ':' + name)}")
        return await self._config(request, channel, CHANNEL_KEYS, topic_name)

    async def _config(
        self, request: Request, queue: Topic | Channel, keys: tuple[str, ...], topic: str
    ) -> Any:
        current = queue.policy or Policy()
        if request.method != "POST":
            return current.to_json(keys)
        limit = 65536
        body = await read_max(request, limit + 1)
        if len(body) > limit:
            raise HTTPError(400, f"the body is over {limit} bytes")
        try:
            doc = json.loads(body or b"null")
        except (ValueError, RecursionError) as e:
            raise HTTPError(400, f"the body is not JSON - {e}") from None
        try:
            new = current.updated(doc, keys, topic)
        except PolicyError as e:
            raise HTTPError(400, str(e)) from None
        queue.set_policy(None if new.empty else new)
        try:
            await self.nsqd.save_metadata()  # the OK means it survives a crash
        except OSError as e:
            raise HTTPError(500, f"failed to persist metadata - {e}") from None
        return new.to_json(keys)

    # --- peek and acting on one message (an nsqpy addition: see nsqpy.nsqd.peek) -----------------

    def _existing_channel(self, request: Request) -> Channel:
        topic, name = self._existing_topic(request)
        channel = topic.channels.get(name)
        if channel is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return channel

    @staticmethod
    def _count(values: dict[str, list[str]], default: int | None, most: int | None) -> int | None:
        raw = get_param(values, "n")
        if raw is None or raw == "":
            return default
        if not (raw.isascii() and raw.isdigit()) or int(raw) < 1 or (most is not None and int(raw) > most):
            raise HTTPError(400, "INVALID_N")
        return int(raw)

    @staticmethod
    def _message_id(values: dict[str, list[str]]) -> bytes:
        raw = get_param(values, "id")
        if raw is None:
            raise HTTPError(400, "MISSING_ARG_ID")
        if len(raw) != 16 or not raw.isascii():
            raise HTTPError(400, "INVALID_MESSAGE_ID")
        return raw.encode("ascii")

    async def topic_peek(self, request: Request, params: Params) -> Any:
        values = req_params(request)
        name = topic_name(values)
        n = self._count(values, peek.DEFAULT_PEEK, peek.MAX_PEEK)
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        assert n is not None
        try:
            return peek.peek_topic(topic, n)
        except DiskQueueError as e:
            raise HTTPError(503, "EXITING") from e

    async def channel_peek(self, request: Request, params: Params) -> Any:
        n = self._count(req_params(request), peek.DEFAULT_PEEK, peek.MAX_PEEK)
        channel = self._existing_channel(request)
        assert n is not None
        try:
            return peek.peek_channel(channel, n)
        except DiskQueueError as e:
            raise HTTPError(503, "EXITING") from e

    async def channel_requeue(self, request: Request, params: Params) -> Any:
        await self._act(request, peek.requeue)
        return None

    async def channel_remove(self, request: Request, params: Params) -> Any:
        await self._act(request, peek.remove)
        return None

    async def _act(self, request: Request, action: Any) -> None:
        msg_id = self._message_id(req_params(request))
        channel = self._existing_channel(request)
        try:
            action(channel, msg_id)
        except peek.NotHeldError as e:
            raise HTTPError(404, str(e)) from None
        except peek.ConflictError as e:
            raise HTTPError(409, str(e)) from None
        except (DiskQueueError, OSError) as e:
            log.error("CHANNEL(%s): %s failed - %s", channel.backend_name, request.path, e)
            raise HTTPError(500, f"INTERNAL_ERROR - {e}") from None

    async def topic_redrive(self, request: Request, params: Params) -> Any:
        values = req_params(request)
        name = topic_name(values)
        dest_name = get_param(values, "destination")
        if dest_name is None:
            raise HTTPError(400, "MISSING_ARG_DESTINATION")
        if not is_valid_topic_name(dest_name):
            raise HTTPError(400, "INVALID_DESTINATION")
        n = self._count(values, None, None)
        channel_name = get_param(values, "channel")
        if channel_name is None and dest_name == name:
            raise HTTPError(400, "DESTINATION_IS_TOPIC")
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        channel = None
        if channel_name is not None:
            channel = topic.channels.get(channel_name)
            if channel is None:
                raise HTTPError(404, "CHANNEL_NOT_FOUND")
        if self.nsqd.exiting or topic.exiting:
            raise HTTPError(503, "EXITING")
        dest = self.nsqd.get_topic(dest_name)
        try:
            moved = await peek.redrive(self.nsqd, topic, channel, dest, n)
        except PolicyRejectedError as e:
            raise HTTPError(503, str(e)) from None
        except (TopicExitingError, DiskQueueError, OSError) as e:
            log.error("TOPIC(%s): redrive to %s failed - %s", name, dest_name, e)
            raise HTTPError(503, "EXITING") from None
        return {"moved": moved}

    # --- stats and config ----------------------------------------------------------------------

    async def stats(self, request: Request, params: Params) -> Any:
        values = req_params(request)
        topic = get_param(values, "topic") or ""
        channel = get_param(values, "channel") or ""
        include_clients = BOOL_PARAMS.get(get_param(values, "include_clients") or "", True)
        include_mem = BOOL_PARAMS.get(get_param(values, "include_mem") or "", True)
        if get_param(values, "format") == "json":
            return stats_document(self.nsqd, topic, channel, include_clients, include_mem)
        return stats_text(self.nsqd, topic, channel, include_clients, include_mem)

    async def metrics(self, request: Request, params: Params) -> Any:
        """Prometheus metrics (an nsqpy addition; see :mod:`nsqpy.metrics`)."""
        from ..metrics import nsqd_registry, render

        if self._metrics is None:
            self._metrics = nsqd_registry(self.nsqd)
        body, content_type = render(self._metrics, request.headers.get("Accept", ""))
        return Response(200, body, {"Content-Type": content_type})

    async def config(self, request: Request, params: Params) -> Any:
        opt = params["opt"]
        opts = self.nsqd.options
        if request.method == "PUT":
            limit = opts.max_msg_size + 1
            body = await read_max(request, limit)
            if len(body) == limit or not body:
                raise HTTPError(413, "INVALID_VALUE")
            try:
                set_config_value(opts, opt, body)
            except InvalidOptionError:
                raise HTTPError(400, "INVALID_OPTION") from None
            except OptionsError:
                raise HTTPError(400, "INVALID_VALUE") from None
            self._options_changed(opt)
        try:
            return config_value(opts, opt)
        except KeyError:
            raise HTTPError(400, "INVALID_OPTION") from None

    def _options_changed(self, opt: str) -> None:
        if opt == "log_level":
            from ..daemon import LEVELS

            log.setLevel(LEVELS.get(self.nsqd.options.log_level.lower(), logging.INFO))
        # Go's triggerOptsNotification (lookupd peers reconnect): the daemon may attach one
        hook = getattr(self.nsqd, "on_options_changed", None)
        if hook is not None:
            hook(opt)

    # --- debug (the pprof equivalents are nsqpy.pprof.Pprof) -------------------------------------

    async def set_block_rate(self, request: Request, params: Params) -> Any:
        values, _ = parse_query(request.raw_query_string)
        raw = get_param(values, "rate")
        if raw is None and request.content_type == "application/x-www-form-urlencoded":
            # Go's FormValue: the body's form (at most 10 MB, as ParseForm reads)
            form, _ = parse_query((await read_max(request, 10 << 20)).decode("utf-8", "replace"))
            raw = get_param(form, "rate")
        raw = raw or ""
        if not _INT.fullmatch(raw):
            raise HTTPError(
                400, f"invalid block rate : strconv.Atoi: parsing {go_quote(raw)}: invalid syntax"
            )
        return ""  # Python has no block profiler: accepted, no effect

    async def free_memory(self, request: Request, params: Params) -> Any:
        gc.collect()
        _malloc_trim()
        return ""


def _malloc_trim() -> None:
    """Hand freed heap back to the OS (glibc only), like Go's ``debug.FreeOSMemory``."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass


async def start_http(nsqd: NSQD, sock: socket.socket, ssl_context: ssl.SSLContext | None = None) -> Any:
    """Serve nsqd's HTTP API (HTTPS with ``ssl_context``) on an already-bound socket."""
    server = HTTPServer(nsqd, tls=ssl_context is not None)
    install_gc_tracker()
    return await serve(server.dispatch, sock, ssl_context)
