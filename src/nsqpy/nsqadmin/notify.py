"""Admin-action notifications, as NSQ 1.3.0's ``nsqadmin/notify.go``.

Each action (``create_topic``, ``create_channel``, ``delete_topic``, ``delete_channel``,
``empty_topic``, ``empty_channel``, ``pause_topic``, ``unpause_topic``, ``pause_channel``,
``unpause_channel``, ``tombstone_topic_producer``; nsqpy's ``config_topic``,
``config_channel``, ``requeue_message``, ``remove_message`` (with the node) and
``redrive_topic`` (with the channel redriven, if any)) is POSTed as JSON to
``--notification-http-endpoint``::

    {"action": "...", "topic": "...", "channel": "..." (omitted if empty),
     "node": "..." (omitted if empty), "timestamp": <unix seconds>,
     "user": "<HTTP Basic auth user>" (omitted if empty; with nsqpy's --htpasswd-file the
     signed-in user), "remote_ip": "<ip:port>",
     "user_agent": "...", "url": "<scheme>://<host><path>[?query]", "via": "<hostname>"}

One worker posts them in order (never blocking the request that caused them), with the
``--http-client-*`` timeouts; a failure is logged and the notification dropped, as in Go.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import socket
import time
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from ..httpapi import go_json
from .login import IDENTITY

if TYPE_CHECKING:
    from .nsqadmin import NSQAdmin

__all__ = ["Notifier", "admin_action", "basic_auth_user"]

log = logging.getLogger("nsqadmin")


def basic_auth_user(request: web.Request) -> str:
    """The user name of an ``Authorization: Basic`` header, or ""."""
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme != "Basic" or not value:
        return ""
    try:
        decoded = base64.b64decode(value, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return ""
    user, sep, _ = decoded.partition(":")
    return user if sep else ""


def _remote_addr(request: web.Request) -> str:
    """Go's ``req.RemoteAddr``: ``ip:port``."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = str(peer[0]), int(peer[1])
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return request.remote or ""


def admin_action(action: str, topic: str, channel: str, node: str, request: web.Request) -> dict[str, Any]:
    """Go's ``AdminAction`` for ``request`` (keys in Go's order, ``omitempty`` honoured)."""
    scheme = "http"
    if request.secure or request.headers.get("X-Scheme") == "https":
        scheme = "https"
    raw = request.rel_url.raw_path
    query = request.rel_url.raw_query_string
    url = f"{scheme}://{request.host}{raw}" + (f"?{query}" if query else "")
    doc: dict[str, Any] = {"action": action, "topic": topic}
    if channel:
        doc["channel"] = channel
    if node:
        doc["node"] = node
    doc["timestamp"] = int(time.time())
    identity = request.get(IDENTITY)
    user = identity.user if identity is not None else basic_auth_user(request)
    if user:
        doc["user"] = user
    doc["remote_ip"] = _remote_addr(request)
    doc["user_agent"] = request.headers.get("User-Agent", "")
    doc["url"] = url
    doc["via"] = socket.gethostname()
    return doc


class Notifier:
    """Queues admin actions and POSTs them, in order, from one task."""

    def __init__(self, admin: NSQAdmin) -> None:
        self.admin = admin
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def notify(self, action: str, topic: str, channel: str, node: str, request: web.Request) -> None:
        """Queue one notification (nothing when no endpoint is configured)."""
        if not self.admin.options.notification_http_endpoint:
            return
        self.queue.put_nowait(admin_action(action, topic, channel, node, request))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="nsqadmin-notifications")

    async def stop(self, timeout: float = 5.0) -> None:
        """Post what is queued (for up to ``timeout`` seconds), then stop."""
        if self._task is None:
            return
        self.queue.put_nowait(None)
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None

    async def _run(self) -> None:
        opts = self.admin.options
        timeout = aiohttp.ClientTimeout(
            total=opts.http_client_request_timeout or None,
            sock_connect=opts.http_client_connect_timeout or None,
        )
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                action = await self.queue.get()
                if action is None:
                    return
                endpoint = self.admin.options.notification_http_endpoint
                log.info("POSTing notification to %s", endpoint)
                try:
                    async with session.post(
                        endpoint,
                        data=go_json(action),
                        headers={"Content-Type": "application/json"},
                    ) as resp:
                        await resp.read()
                except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
                    log.error("failed to POST notification - %s", e or type(e).__name__)
