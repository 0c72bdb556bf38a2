"""Helpers to wire a client Stack and a server Stack back to back in memory."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence

from nsqpy.transport import Stack, TLSLayer
from nsqpy.transport.tls import TLSContext


def pump(client: Stack, server: Stack, rounds: int = 20) -> None:
    """Carry each side's own output to the other until both are quiet (a TLS handshake)."""
    for _ in range(rounds):
        to_server = client.output()
        if to_server:
            server.receive(to_server)
        to_client = server.output()
        if to_client:
            client.receive(to_client)
        if not to_server and not to_client:
            return
    raise AssertionError("the handshake did not settle")


def tls_pair(
    server_ctx: TLSContext, client_ctx: TLSContext, hostname: str = "127.0.0.1"
) -> tuple[Stack, Stack]:
    """(client, server) stacks with a completed TLS handshake."""
    client, server = Stack(), Stack()
    server.push(TLSLayer(server_ctx, server_side=True))
    client.push(TLSLayer(client_ctx, server_hostname=hostname))
    pump(client, server)
    assert client.tls is not None and server.tls is not None
    assert client.tls.handshake_done and server.tls.handshake_done
    return client, server


def split(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """``data`` cut at the given offsets (any order, duplicates and out-of-range ignored)."""
    points = sorted({c for c in cuts if 0 < c < len(data)})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def random_pieces(data: bytes, rng: random.Random, max_piece: int = 5000) -> list[bytes]:
    """``data`` in random pieces of 1..max_piece bytes."""
    pieces = []
    pos = 0
    while pos < len(data):
        n = rng.randint(1, max_piece)
        pieces.append(data[pos : pos + n])
        pos += n
    return pieces


def receive_all(stack: Stack, pieces: Sequence[bytes], peer: Stack | None = None) -> bytes:
    """Feed ``pieces`` one by one; the stack's own output goes to ``peer`` (if given)."""
    out = []
    for piece in pieces:
        out.append(stack.receive(piece))
        own = stack.output()
        if own and peer is not None:
            peer.receive(own)
    return b"".join(out)
