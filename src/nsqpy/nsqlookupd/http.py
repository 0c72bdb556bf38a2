"""nsqlookupd's HTTP API, as NSQ 1.3.0's ``nsqlookupd/http.go`` (on :mod:`nsqpy.httpapi`).

``GET /ping`` (plain ``OK``), ``/info``, ``/lookup?topic=``, ``/topics``, ``/channels?topic=``,
``/nodes``, ``/debug``; ``POST /topic/create``, ``/topic/delete``, ``/channel/create``,
``/channel/delete``, ``/topic/tombstone``; and the ``/debug/pprof`` equivalents (the index is
``/debug/pprof`` without a slash, as nsqlookupd routes it). ``GET /metrics`` (Prometheus) is
an nsqpy addition (:mod:`nsqpy.metrics`). Errors are
``{"message":"<CODE>"}``: ``INVALID_REQUEST``, ``MISSING_ARG_TOPIC``, ``MISSING_ARG_CHANNEL``,
``MISSING_ARG_NODE``, ``INVALID_ARG_TOPIC``, ``INVALID_ARG_CHANNEL``, ``TOPIC_NOT_FOUND``,
``CHANNEL_NOT_FOUND``, plus the router's ``NOT_FOUND`` and ``METHOD_NOT_ALLOWED``.
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING, Any

from .. import NSQ_VERSION
from ..httpapi import (
    ADMIN,
    OPEN,
    PLAIN,
    HTTPError,
    Params,
    Request,
    Response,
    Router,
    get_param,
    req_params,
    serve,
    topic_channel_args,
)
from ..pprof import Pprof
from ..protocol.names import is_valid_topic_name

if TYPE_CHECKING:
    from .nsqlookupd import NSQLookupd

log = logging.getLogger("nsqlookupd")


def _topic(values: dict[str, list[str]]) -> str:
    topic = get_param(values, "topic")
    if topic is None:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    return topic


class HTTPServer:
    """Routes and handlers of nsqlookupd's HTTP API, bound to one :class:`NSQLookupd`."""

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd
        self.db = lookupd.db
        self.router = Router(log)
        self.router.admin_auth = lookupd.admin_auth
        r = self.router.route
        # who may call each route (an nsqpy addition: --admin-token-file; NSQ: everyone)
        r("GET", "/ping", self.ping, PLAIN, access=OPEN)
        r("GET", "/info", self.info, access=OPEN)
        r("GET", "/debug", self.debug, access=ADMIN)
        r("GET", "/lookup", self.lookup, access=OPEN)
        r("GET", "/topics", self.topics, access=OPEN)
        r("GET", "/channels", self.channels, access=OPEN)
        r("GET", "/nodes", self.nodes, access=OPEN)
        r("POST", "/topic/create", self.topic_create, access=ADMIN)
        r("POST", "/topic/delete", self.topic_delete, access=ADMIN)
        r("POST", "/channel/create", self.channel_create, access=ADMIN)
        r("POST", "/channel/delete", self.channel_delete, access=ADMIN)
        r("POST", "/topic/tombstone", self.topic_tombstone, access=ADMIN)
        r("GET", "/metrics", self.metrics, access=OPEN)
        #: the Prometheus registry, made at the first GET /metrics
        self._metrics: Any = None
        Pprof("nsqlookupd").install(self.router, "/debug/pprof", access=ADMIN)

    async def dispatch(self, request: Request) -> Response:
        response: Response = await self.router.dispatch(request)
        return response

    # --- queries ------------------------------------------------------------------------

    async def ping(self, request: Request, params: Params) -> Any:
        return "OK"

    async def info(self, request: Request, params: Params) -> Any:
        return {"version": NSQ_VERSION}

    async def topics(self, request: Request, params: Params) -> Any:
        return {"topics": self.db.topics()}

    async def channels(self, request: Request, params: Params) -> Any:
        topic = _topic(req_params(request))
        return {"channels": self.db.channels(topic)}

    async def lookup(self, request: Request, params: Params) -> Any:
        topic = _topic(req_params(request))
        opts = self.lookupd.options
        found = self.db.lookup(
            topic, opts.inactive_producer_timeout, opts.tombstone_lifetime, self.lookupd.now_ns()
        )
        if found is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        channels, producers = found
        return {"channels": channels, "producers": [p.to_json() for p in producers]}

    async def nodes(self, request: Request, params: Params) -> Any:
        opts = self.lookupd.options
        nodes = self.db.nodes(opts.inactive_producer_timeout, opts.tombstone_lifetime, self.lookupd.now_ns())
        return {"producers": nodes}

    async def debug(self, request: Request, params: Params) -> Any:
        return self.db.debug()

    async def metrics(self, request: Request, params: Params) -> Any:
        """Prometheus metrics (an nsqpy addition; see :mod:`nsqpy.metrics`)."""
        from ..metrics import lookupd_registry, render

        if self._metrics is None:
            self._metrics = lookupd_registry(self.lookupd)
        body, content_type = render(self._metrics, request.headers.get("Accept", ""))
        return Response(200, body, {"Content-Type": content_type})

    # --- changes ------------------------------------------------------------------------

    async def topic_create(self, request: Request, params: Params) -> Any:
        topic = _topic(req_params(request))
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        log.info("DB: adding topic(%s)", topic)
        self.db.create_topic(topic)
        return None

    async def topic_delete(self, request: Request, params: Params) -> Any:
        topic = _topic(req_params(request))
        for r in self.db.delete_topic(topic):
            if r.category == "channel":
                log.info("DB: removing channel(%s) from topic(%s)", r.subkey, topic)
            else:
                log.info("DB: removing topic(%s)", topic)
        return None

    async def channel_create(self, request: Request, params: Params) -> Any:
        topic, channel = topic_channel_args(req_params(request))
        log.info("DB: adding channel(%s) in topic(%s)", channel, topic)
        log.info("DB: adding topic(%s)", topic)
        self.db.create_channel(topic, channel)
        return None

    async def channel_delete(self, request: Request, params: Params) -> Any:
        topic, channel = topic_channel_args(req_params(request))
        if not self.db.delete_channel(topic, channel):
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        log.info("DB: removing channel(%s) from topic(%s)", channel, topic)
        return None

    async def topic_tombstone(self, request: Request, params: Params) -> Any:
        values = req_params(request)
        topic = _topic(values)
        node = get_param(values, "node")
        if node is None:
            raise HTTPError(400, "MISSING_ARG_NODE")
        log.info("DB: setting tombstone for producer@%s of topic(%s)", node, topic)
        self.db.tombstone_topic_producer(topic, node, self.lookupd.now_ns())
        return None


async def start_http(lookupd: NSQLookupd, sock: socket.socket) -> Any:
    """Serve nsqlookupd's HTTP API on an already-bound listening socket."""
    return await serve(HTTPServer(lookupd).dispatch, sock)
