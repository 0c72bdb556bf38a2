"""Cluster reads and actions over nsqlookupd and nsqd HTTP APIs, as NSQ 1.3.0's
``internal/clusterinfo/data.go`` (a library: nsqadmin's HTTP API and sampler use it, and so
can tools).

Every call returns ``(value, err)`` like Go: ``err`` is None, an :class:`ErrList` (a *partial*
failure: some nodes did not answer, ``value`` holds what the others said) or another
exception (nothing usable; Go's ``failed to query any nsqd: …``). Nodes are queried
concurrently; actions (POSTs) go to the nodes one after the other, as in Go.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import quote_plus

from .httpclient import Client, HTTPClientError
from .types import ChannelStats, Producer, ProducerTopic, TopicStats, semver, sort_by_hostname

__all__ = ["ClusterError", "ClusterInfo", "ErrList", "is_partial"]

log = logging.getLogger("nsqadmin")

T = TypeVar("T")


class ClusterError(Exception):
    """A cluster query that produced nothing usable (Go's plain ``error``)."""


class ErrList(ClusterError):
    """Go's ``clusterinfo.ErrList``, the ``PartialErr``: the errors of the nodes that failed,
    joined by newlines."""

    def __init__(self, errors: Iterable[BaseException]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


def is_partial(err: BaseException | None) -> bool:
    return isinstance(err, ErrList)


def _errs_of(err: BaseException) -> list[BaseException]:
    return err.errors if isinstance(err, ErrList) else [err]


def _q(s: str) -> str:
    """Go's ``url.QueryEscape``."""
    return quote_plus(s, safe="")


#: what an nsqd's refusal of nsqpy's message endpoints means, said after its code
_MESSAGE_HINTS = {
    "NOT_FOUND": "this nsqd has no message API: a Go nsqd, or an older nsqpy",
    "UNAUTHORIZED": "this nsqd wants an admin token: check nsqadmin's --admin-token-file",
    "FORBIDDEN": (
        "this nsqd refuses nsqadmin: a token it does not list (check nsqadmin's --admin-token-file), "
        "or no token where it shows no message bodies without one"
    ),
}


def _message_error(e: HTTPClientError) -> str:
    """A node's error for the messages panel: nsqd's code (``MESSAGE_NOT_FOUND``), with what
    it means where that is not plain, or the request's failure."""
    if not e.message:
        return str(e)
    hint = _MESSAGE_HINTS.get(e.message)
    return f"{e.message} ({hint})" if hint else e.message


def _uniq_sorted(items: list[str]) -> list[str] | None:
    """``stringy.Uniq`` then ``sort.Strings``: nil (None) when empty."""
    out = sorted(set(items))
    return out or None


class ClusterInfo:
    """Go's ``clusterinfo.ClusterInfo`` on an async :class:`Client`."""

    def __init__(self, client: Client, log_level: int = logging.INFO) -> None:
        self.client = client
        self.log_level = log_level

    def logf(self, msg: str, *args: Any) -> None:
        log.log(self.log_level, msg, *args)

    async def _gather(self, calls: list[Awaitable[T]]) -> list[T | BaseException]:
        """Run the calls concurrently; a node's request error is its result (a bug is not)."""
        results = await asyncio.gather(*calls, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, HTTPClientError):
                raise r
        return list(results)

    async def _get(self, kind: str, endpoint: str) -> Any:
        self.logf("CI: querying %s %s", kind, endpoint)
        return await self.client.get_v1(endpoint)

    # --- nsqlookupd -------------------------------------------------------------------------

    async def _lookupd_names(
        self, path: str, key: str, lookupd_http_addrs: list[str]
    ) -> tuple[list[str] | None, BaseException | None]:
        """The union of the string lists under ``key`` in every lookupd's answer to
        ``path``, sorted; None (and the error) when no lookupd answered."""
        results = await self._gather(
            [self._get("nsqlookupd", f"http://{a}{path}") for a in lookupd_http_addrs]
        )
        names: list[str] = []
        errs: list[BaseException] = []
        for r in results:
            if isinstance(r, BaseException):
                errs.append(r)
            elif isinstance(r, dict):
                names += [n for n in r.get(key) or () if isinstance(n, str)]
        if len(errs) == len(lookupd_http_addrs):
            return None, ClusterError(f"failed to query any nsqlookupd: {ErrList(errs)}")
        return _uniq_sorted(names), ErrList(errs) if errs else None

    async def get_lookupd_topics(
        self, lookupd_http_addrs: list[str]
    ) -> tuple[list[str] | None, BaseException | None]:
        """The union of every lookupd's ``/topics``, sorted (None when there is none)."""
        return await self._lookupd_names("/topics", "topics", lookupd_http_addrs)

    async def get_lookupd_topic_channels(
        self, topic: str, lookupd_http_addrs: list[str]
    ) -> tuple[list[str] | None, BaseException | None]:
        """The union of every lookupd's ``/channels?topic=``, sorted."""
        return await self._lookupd_names(f"/channels?topic={_q(topic)}", "channels", lookupd_http_addrs)

    async def get_lookupd_producers(
        self, lookupd_http_addrs: list[str]
    ) -> tuple[list[Producer] | None, BaseException | None]:
        """Every nsqd known to the lookupds (``/nodes``), merged by TCP address; older
        versions than the newest are ``out_of_date``; sorted by hostname."""
        results = await self._gather(
            [self._get("nsqlookupd", f"http://{a}/nodes") for a in lookupd_http_addrs]
        )
        producers: list[Producer] = []
        by_addr: dict[str, Producer] = {}
        max_version = semver("0.0.0")
        errs: list[BaseException] = []
        for addr, r in zip(lookupd_http_addrs, results, strict=True):
            if isinstance(r, BaseException):
                errs.append(r)
                continue
            for raw in (r.get("producers") if isinstance(r, dict) else None) or ():
                if not isinstance(raw, dict):
                    continue
                producer = Producer.from_lookupd_json(raw)
                key = producer.tcp_address()
                p = by_addr.get(key)
                if p is None:
                    by_addr[key] = producer
                    producers.append(producer)
                    if max_version < producer.version_key:
                        max_version = producer.version_key
                    if producer.topics:
                        producer.topics.sort(key=lambda t: t.topic)
                    p = producer
                p.remote_addresses = [*(p.remote_addresses or ()), f"{addr}/{producer.address()}"]
        if len(errs) == len(lookupd_http_addrs):
            return None, ClusterError(f"failed to query any nsqlookupd: {ErrList(errs)}")
        for producer in by_addr.values():
            if producer.version_key < max_version:
                producer.out_of_date = True
        sort_by_hostname(producers)
        return producers or None, ErrList(errs) if errs else None

    async def get_lookupd_topic_producers(
        self, topic: str, lookupd_http_addrs: list[str]
    ) -> tuple[list[Producer] | None, BaseException | None]:
        """The nsqd that produce ``topic`` (``/lookup``), merged by HTTP address."""
        results = await self._gather(
            [self._get("nsqlookupd", f"http://{a}/lookup?topic={_q(topic)}") for a in lookupd_http_addrs]
        )
        producers: list[Producer] = []
        errs: list[BaseException] = []
        for r in results:
            if isinstance(r, BaseException):
                errs.append(r)
                continue
            for raw in (r.get("producers") if isinstance(r, dict) else None) or ():
                if not isinstance(raw, dict):
                    continue
                p = Producer.from_lookupd_json(raw)
                if all(p.http_address() != pp.http_address() for pp in producers):
                    producers.append(p)
        if len(errs) == len(lookupd_http_addrs):
            return None, ClusterError(f"failed to query any nsqlookupd: {ErrList(errs)}")
        return producers or None, ErrList(errs) if errs else None

    # --- nsqd -----------------------------------------------------------------------------------

    async def get_nsqd_topics(
        self, nsqd_http_addrs: list[str]
    ) -> tuple[list[str] | None, BaseException | None]:
        results = await self._gather(
            [self._get("nsqd", f"http://{a}/stats?format=json") for a in nsqd_http_addrs]
        )
        topics: list[str] = []
        errs: list[BaseException] = []
        for r in results:
            if isinstance(r, BaseException):
                errs.append(r)
                continue
            for t in (r.get("topics") if isinstance(r, dict) else None) or ():
                name = t.get("topic_name", "") if isinstance(t, dict) else ""
                if name not in topics:
                    topics.append(name)
        if len(errs) == len(nsqd_http_addrs):
            return None, ClusterError(f"failed to query any nsqd: {ErrList(errs)}")
        topics.sort()
        return topics or None, ErrList(errs) if errs else None

    async def _nsqd_producer(self, addr: str, topic: str | None) -> Producer | None:
        """``/stats`` (and ``/info``) of one nsqd as a Producer; None when ``topic`` is
        given and this nsqd does not have it."""
        if topic is None:
            info = await self._get("nsqd", f"http://{addr}/info")
            stats = await self._get("nsqd", f"http://{addr}/stats?format=json&include_clients=false")
        else:
            stats = await self._get(
                "nsqd",
                f"http://{addr}/stats?format=json&topic={_q(topic)}&include_clients=false",
            )
        names = [
            t.get("topic_name", "") if isinstance(t, dict) else ""
            for t in (stats.get("topics") if isinstance(stats, dict) else None) or ()
        ]
        if topic is not None:
            if topic not in names:
                return None
            info = await self._get("nsqd", f"http://{addr}/info")
        info = info if isinstance(info, dict) else {}
        broadcast = str(info.get("broadcast_address") or "")
        http_port = int(info.get("http_port") or 0)
        hostname = str(info.get("hostname") or "")
        if topic is not None:
            # backwards compatibility (Go): fill the address from ``addr`` when missing
            host, _, port = addr.rpartition(":")
            host = host.strip("[]")
            if not broadcast:
                broadcast = host
                http_port = int(port) if port.isdigit() else 0
            if not hostname:
                hostname = host
        return Producer(
            hostname=hostname,
            broadcast_address=broadcast,
            tcp_port=int(info.get("tcp_port") or 0),
            http_port=http_port,
            version=str(info.get("version") or ""),
            topics=[ProducerTopic(n) for n in names] or None,
        )

    async def get_nsqd_producers(
        self, nsqd_http_addrs: list[str]
    ) -> tuple[list[Producer] | None, BaseException | None]:
        results = await self._gather([self._nsqd_producer(a, None) for a in nsqd_http_addrs])
        producers = [r for r in results if isinstance(r, Producer)]
        errs = [r for r in results if isinstance(r, BaseException)]
        if len(errs) == len(nsqd_http_addrs):
            return None, ClusterError(f"failed to query any nsqd: {ErrList(errs)}")
        return producers or None, ErrList(errs) if errs else None

    async def get_nsqd_topic_producers(
        self, topic: str, nsqd_http_addrs: list[str]
    ) -> tuple[list[Producer] | None, BaseException | None]:
        results = await self._gather([self._nsqd_producer(a, topic) for a in nsqd_http_addrs])
        producers = [r for r in results if isinstance(r, Producer)]
        errs = [r for r in results if isinstance(r, BaseException)]
        if len(errs) == len(nsqd_http_addrs):
            return None, ClusterError(f"failed to query any nsqd: {ErrList(errs)}")
        return producers or None, ErrList(errs) if errs else None

    async def get_nsqd_stats(
        self,
        producers: list[Producer] | None,
        selected_topic: str = "",
        selected_channel: str = "",
        include_clients: bool = True,
    ) -> tuple[list[TopicStats] | None, dict[str, ChannelStats] | None, BaseException | None]:
        """Every producer's ``/stats``: the per-node topic rows (sorted by hostname) and the
        channels summed across nodes, keyed by channel name (or ``topic:channel`` when no
        topic is selected). As in Go, no producer at all is a (non-partial) error."""
        producers = producers or []

        async def fetch(p: Producer) -> Any:
            addr = p.http_address()
            endpoint = f"http://{addr}/stats?format=json"
            if selected_topic:
                endpoint += "&topic=" + _q(selected_topic)
                if selected_channel:
                    endpoint += "&channel=" + _q(selected_channel)
            if not include_clients:
                endpoint += "&include_clients=false"
            return await self._get("nsqd", endpoint)

        results = await self._gather([fetch(p) for p in producers])
        topic_stats: list[TopicStats] = []
        channel_stats: dict[str, ChannelStats] = {}
        errs: list[BaseException] = []
        for p, r in zip(producers, results, strict=True):
            if isinstance(r, BaseException):
                errs.append(r)
                continue
            addr = p.http_address()
            for raw in (r.get("topics") if isinstance(r, dict) else None) or ():
                if not isinstance(raw, dict):
                    continue
                topic = TopicStats.from_json(raw)
                topic.node = addr
                topic.hostname = p.hostname
                topic.memory_depth = topic.depth - topic.backend_depth
                if selected_topic and topic.topic_name != selected_topic:
                    continue
                topic_stats.append(topic)
                for channel in topic.channels or ():
                    channel.node = addr
                    channel.hostname = p.hostname
                    channel.topic_name = topic.topic_name
                    channel.memory_depth = channel.depth - channel.backend_depth
                    key = channel.channel_name
                    if not selected_topic:
                        key = f"{topic.topic_name}:{channel.channel_name}"
                    cs = channel_stats.get(key)
                    if cs is None:
                        cs = ChannelStats(addr, topic.topic_name, channel.channel_name)
                        channel_stats[key] = cs
                    for client in channel.clients or ():
                        client.node = addr
                    cs.add(channel)
        if len(errs) == len(producers):
            return None, None, ClusterError(f"failed to query any nsqd: {ErrList(errs)}")
        sort_by_hostname(topic_stats)
        return topic_stats or None, channel_stats, ErrList(errs) if errs else None

    # --- either source ------------------------------------------------------------------------

    async def get_producers(
        self, lookupd_http_addrs: list[str], nsqd_http_addrs: list[str]
    ) -> tuple[list[Producer] | None, BaseException | None]:
        if lookupd_http_addrs:
            return await self.get_lookupd_producers(lookupd_http_addrs)
        return await self.get_nsqd_producers(nsqd_http_addrs)

    async def get_topic_producers(
        self, topic: str, lookupd_http_addrs: list[str], nsqd_http_addrs: list[str]
    ) -> tuple[list[Producer] | None, BaseException | None]:
        if lookupd_http_addrs:
            return await self.get_lookupd_topic_producers(topic, lookupd_http_addrs)
        return await self.get_nsqd_topic_producers(topic, nsqd_http_addrs)

    # --- actions --------------------------------------------------------------------------------

    async def _post_all(self, kind: str, addrs: list[str], uri: str, qs: str) -> ErrList | None:
        """Go's ``nsqlookupdPOST``/``producersPOST``: one after the other; every failure is
        collected (an ErrList, so a partial error even when all of them failed)."""
        errs: list[BaseException] = []
        for addr in addrs:
            endpoint = f"http://{addr}/{uri}?{qs}"
            self.logf("CI: querying %s %s", kind, endpoint)
            try:
                await self.client.post_v1(endpoint)
            except HTTPClientError as e:
                errs.append(e)
        return ErrList(errs) if errs else None

    async def _lookupd_post(self, addrs: list[str], uri: str, qs: str) -> ErrList | None:
        return await self._post_all("nsqlookupd", addrs, uri, qs)

    async def _producers_post(self, producers: list[Producer] | None, uri: str, qs: str) -> ErrList | None:
        return await self._post_all("nsqd", [p.http_address() for p in producers or ()], uri, qs)

    @staticmethod
    def _collect(errs: list[BaseException], err: BaseException | None) -> None:
        """Go's ``pe, ok := err.(PartialErr); if !ok { return err }``."""
        if err is None:
            return
        if not is_partial(err):
            raise err
        errs.extend(_errs_of(err))

    async def _run(self, steps: Any) -> BaseException | None:
        errs: list[BaseException] = []
        try:
            await steps(errs)
        except (ClusterError, HTTPClientError) as e:
            return e
        return ErrList(errs) if errs else None

    async def tombstone_node_for_topic(
        self, topic: str, node: str, lookupd_http_addrs: list[str]
    ) -> BaseException | None:
        """Tombstone ``node`` for ``topic`` on every lookupd, then delete the topic on it."""

        async def steps(errs: list[BaseException]) -> None:
            qs = f"topic={_q(topic)}&node={_q(node)}"
            self._collect(errs, await self._lookupd_post(lookupd_http_addrs, "topic/tombstone", qs))
            producers, err = await self.get_nsqd_producers([node])
            self._collect(errs, err)
            self._collect(errs, await self._producers_post(producers, "topic/delete", f"topic={_q(topic)}"))

        return await self._run(steps)

    async def create_topic_channel(
        self, topic: str, channel: str, lookupd_http_addrs: list[str]
    ) -> BaseException | None:
        """Create the topic (and channel) on every lookupd, and the channel on every nsqd
        that produces the topic."""

        async def steps(errs: list[BaseException]) -> None:
            qs = f"topic={_q(topic)}"
            self._collect(errs, await self._lookupd_post(lookupd_http_addrs, "topic/create", qs))
            if channel:
                qs = f"topic={_q(topic)}&channel={_q(channel)}"
                self._collect(errs, await self._lookupd_post(lookupd_http_addrs, "channel/create", qs))
                producers, err = await self.get_lookupd_topic_producers(topic, lookupd_http_addrs)
                self._collect(errs, err)
                self._collect(errs, await self._producers_post(producers, "channel/create", qs))

        return await self._run(steps)

    async def delete_topic(
        self, topic: str, lookupd_http_addrs: list[str], nsqd_http_addrs: list[str]
    ) -> BaseException | None:
        async def steps(errs: list[BaseException]) -> None:
            # the producers first: once lookupd forgets the topic they are gone from /lookup
            producers, err = await self.get_topic_producers(topic, lookupd_http_addrs, nsqd_http_addrs)
            self._collect(errs, err)
            qs = f"topic={_q(topic)}"
            self._collect(errs, await self._lookupd_post(lookupd_http_addrs, "topic/delete", qs))
            self._collect(errs, await self._producers_post(producers, "topic/delete", qs))

        return await self._run(steps)

    async def delete_channel(
        self, topic: str, channel: str, lookupd_http_addrs: list[str], nsqd_http_addrs: list[str]
    ) -> BaseException | None:
        async def steps(errs: list[BaseException]) -> None:
            producers, err = await self.get_topic_producers(topic, lookupd_http_addrs, nsqd_http_addrs)
            self._collect(errs, err)
            qs = f"topic={_q(topic)}&channel={_q(channel)}"
            self._collect(errs, await self._lookupd_post(lookupd_http_addrs, "channel/delete", qs))
            self._collect(errs, await self._producers_post(producers, "channel/delete", qs))

        return await self._run(steps)

    async def _action(
        self,
        topic: str,
        lookupd_http_addrs: list[str],
        nsqd_http_addrs: list[str],
        uri: str,
        qs: str,
    ) -> BaseException | None:
        """Go's ``actionHelper``: POST ``uri`` to every nsqd that produces ``topic``."""

        async def steps(errs: list[BaseException]) -> None:
            producers, err = await self.get_topic_producers(topic, lookupd_http_addrs, nsqd_http_addrs)
            self._collect(errs, err)
            self._collect(errs, await self._producers_post(producers, uri, qs))

        return await self._run(steps)

    async def _per_node(
        self,
        topic: str,
        lookupd_http_addrs: list[str],
        nsqd_http_addrs: list[str],
        key: str,
        call: Callable[[str], Awaitable[Any]],
        *,
        concurrent: bool = False,
        node: str = "",
        errors: Callable[[HTTPClientError], str] | None = None,
    ) -> tuple[list[dict[str, Any]], BaseException | None]:
        """``call(node)`` on every nsqd that has ``topic`` (only ``node`` when given): one
        entry per node, ``{"node", "hostname", key: <its answer>}`` or ``{"node",
        "hostname", "error"}`` (the nsqd's message, or ``errors(e)``), and a lookup's
        partial error. Reads go to the nodes concurrently, actions one after the other."""
        producers, err = await self.get_topic_producers(topic, lookupd_http_addrs, nsqd_http_addrs)
        if err is not None and not is_partial(err):
            return [], err
        targets = [p for p in producers or () if not node or p.http_address() == node]

        async def one(p: Producer) -> dict[str, Any]:
            addr = p.http_address()
            entry: dict[str, Any] = {"node": addr, "hostname": p.hostname}
            try:
                entry[key] = await call(addr)
            except HTTPClientError as e:
                entry["error"] = errors(e) if errors is not None else e.message or str(e)
            return entry

        if concurrent:
            return list(await asyncio.gather(*(one(p) for p in targets))), err
        return [await one(p) for p in targets], err

    async def queue_config(
        self,
        topic: str,
        channel: str,
        lookupd_http_addrs: list[str],
        nsqd_http_addrs: list[str],
        settings: dict[str, Any] | None = None,
    ) -> tuple[list[dict[str, Any]], BaseException | None]:
        """A topic's or channel's settings (nsqd's ``/topic/config``, ``/channel/config``:
        an nsqpy addition) on every nsqd that has the topic, set first when ``settings`` is
        given: one entry per node, ``{"node", "hostname", "config"}`` or ``{"node",
        "hostname", "error"}``, and a lookup's partial error."""
        if channel:
            uri, qs = "channel/config", f"topic={_q(topic)}&channel={_q(channel)}"
        else:
            uri, qs = "topic/config", f"topic={_q(topic)}"

        async def call(node: str) -> Any:
            endpoint = f"http://{node}/{uri}?{qs}"
            if settings is None:
                return await self.client.get_v1(endpoint)
            self.logf("CI: querying nsqd %s", endpoint)
            return await self.client.post_v1_json(endpoint, settings)

        return await self._per_node(topic, lookupd_http_addrs, nsqd_http_addrs, "config", call)

    # --- nsqpy: messages (nsqd's peek, requeue, remove and redrive) ------------------------------

    async def peek(
        self,
        topic: str,
        channel: str,
        n: int,
        lookupd_http_addrs: list[str],
        nsqd_http_addrs: list[str],
    ) -> tuple[list[dict[str, Any]], BaseException | None]:
        """Up to ``n`` of the messages a topic's backlog or a channel holds (queued,
        deferred, in flight) on every nsqd that has the topic, nothing consumed:
        ``{"node", "hostname", "peek": <nsqd's /topic/peek or /channel/peek answer>}`` or
        the node's error."""
        if channel:
            endpoint = f"channel/peek?topic={_q(topic)}&channel={_q(channel)}&n={n}"
        else:
            endpoint = f"topic/peek?topic={_q(topic)}&n={n}"

        async def call(node: str) -> Any:
            return await self._get("nsqd", f"http://{node}/{endpoint}")

        return await self._per_node(
            topic, lookupd_http_addrs, nsqd_http_addrs, "peek", call, concurrent=True, errors=_message_error
        )

    async def message_action(
        self,
        action: str,
        topic: str,
        channel: str,
        node: str,
        msg_id: str,
        lookupd_http_addrs: list[str],
        nsqd_http_addrs: list[str],
    ) -> tuple[list[dict[str, Any]], BaseException | None]:
        """``requeue`` (a deferred message made due now) or ``remove`` one message of a
        channel on ``node``, one of the topic's nsqd: ``[{"node", "hostname", "done":
        true}]`` or its error; no entry when ``node`` does not have the topic."""
        qs = f"topic={_q(topic)}&channel={_q(channel)}&id={_q(msg_id)}"

        async def call(addr: str) -> bool:
            endpoint = f"http://{addr}/channel/{action}?{qs}"
            self.logf("CI: querying nsqd %s", endpoint)
            await self.client.post_v1(endpoint)
            return True

        return await self._per_node(
            topic, lookupd_http_addrs, nsqd_http_addrs, "done", call, node=node, errors=_message_error
        )

    async def redrive(
        self,
        topic: str,
        destination: str,
        n: int | None,
        channel: str,
        lookupd_http_addrs: list[str],
        nsqd_http_addrs: list[str],
    ) -> tuple[list[dict[str, Any]], BaseException | None]:
        """Move the messages of ``topic``'s backlog (or of its ``channel``'s queue) to
        ``destination`` on every nsqd that has the topic, as new messages: at most ``n`` in
        all (the nodes in turn; None: everything), ``{"node", "hostname", "moved": k}`` or
        the node's error (a node not asked once ``n`` moved: ``"moved": 0``)."""
        left = n

        async def call(node: str) -> int:
            nonlocal left
            if left is not None and left <= 0:
                return 0
            qs = f"topic={_q(topic)}&destination={_q(destination)}"
            if left is not None:
                qs += f"&n={left}"
            if channel:
                qs += f"&channel={_q(channel)}"
            endpoint = f"http://{node}/topic/redrive?{qs}"
            self.logf("CI: querying nsqd %s", endpoint)
            answer = await self.client.post_v1_json(endpoint, None)
            moved = answer.get("moved") if isinstance(answer, dict) else None
            if not isinstance(moved, int) or isinstance(moved, bool):
                raise HTTPClientError(f"unexpected answer {answer!r}")
            if left is not None:
                left -= moved
            return moved

        return await self._per_node(
            topic, lookupd_http_addrs, nsqd_http_addrs, "moved", call, errors=_message_error
        )

    async def topic_action(
        self, action: str, topic: str, lookupd_http_addrs: list[str], nsqd_http_addrs: list[str]
    ) -> BaseException | None:
        """``pause``, ``unpause`` or ``empty`` a topic on every nsqd that has it."""
        return await self._action(
            topic, lookupd_http_addrs, nsqd_http_addrs, f"topic/{action}", f"topic={_q(topic)}"
        )

    async def channel_action(
        self,
        action: str,
        topic: str,
        channel: str,
        lookupd_http_addrs: list[str],
        nsqd_http_addrs: list[str],
    ) -> BaseException | None:
        """``pause``, ``unpause`` or ``empty`` a channel on every nsqd that has its topic."""
        return await self._action(
            topic,
            lookupd_http_addrs,
            nsqd_http_addrs,
            f"channel/{action}",
            f"topic={_q(topic)}&channel={_q(channel)}",
        )
