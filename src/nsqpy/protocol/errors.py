"""Protocol errors: the ``E_*`` codes NSQ sends in error frames.

A :class:`ProtocolError` carries the code, the human description and whether it is fatal
(the server closes the connection after sending it). Only ``E_FIN_FAILED``,
``E_REQ_FAILED`` and ``E_TOUCH_FAILED`` are non-fatal in NSQ 1.3.
"""

from __future__ import annotations

#: Codes whose error frame does not end the connection.
NON_FATAL_CODES = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})

#: Every error code an nsqd 1.3 sends, with a one-line meaning.
ERROR_CODES: dict[str, str] = {
    "E_INVALID": "invalid command, parameter or state",
    "E_BAD_PROTOCOL": "unknown protocol magic",
    "E_BAD_BODY": "malformed or oversized body",
    "E_BAD_TOPIC": "invalid topic name",
    "E_BAD_CHANNEL": "invalid channel name",
    "E_BAD_MESSAGE": "malformed or oversized message",
    "E_PUB_FAILED": "PUB could not be queued",
    "E_MPUB_FAILED": "MPUB could not be queued",
    "E_DPUB_FAILED": "DPUB could not be queued",
    "E_FIN_FAILED": "FIN of a message not in flight for this client",
    "E_REQ_FAILED": "REQ of a message not in flight for this client",
    "E_TOUCH_FAILED": "TOUCH of a message not in flight for this client",
    "E_IDENTIFY_FAILED": "IDENTIFY feature negotiation failed",
    "E_TOO_MANY_CHANNEL_CONSUMERS": "--max-channel-consumers reached",
    "E_AUTH_FIRST": "AUTH required before this command",
    "E_AUTH_DISABLED": "AUTH sent but the server has no auth",
    "E_AUTH_FAILED": "AUTH could not be verified",
    "E_AUTH_ERROR": "AUTH error",
    "E_UNAUTHORIZED": "not authorized for this topic/channel",
}


class NSQError(Exception):
    """Base of every nsqpy error."""


class ProtocolError(NSQError):
    """An ``E_*`` error: what the server sends in an error frame, and what clients raise."""

    __slots__ = ("code", "description", "fatal")

    def __init__(self, code: str, description: str = "", fatal: bool | None = None) -> None:
        self.code = code
        self.description = description
        self.fatal = code not in NON_FATAL_CODES if fatal is None else fatal
        super().__init__(self.text())

    def text(self) -> str:
        """The error frame's payload: ``"<CODE> <description>"``."""
        return f"{self.code} {self.description}" if self.description else self.code

    def __bytes__(self) -> bytes:
        return self.text().encode()

    @classmethod
    def from_frame(cls, data: bytes) -> ProtocolError:
        """Parse an error frame payload back into an error."""
        text = data.decode("utf-8", "replace")
        code, _, desc = text.partition(" ")
        return cls(code, desc)
