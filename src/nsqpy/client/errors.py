"""Client errors: one class per ``E_*`` code (with ``fatal``), plus connection-level errors.

Every error an nsqd sends in an error frame becomes an instance of the :class:`ErrorFrame`
subclass registered for its code (:func:`make_error`); unknown codes give a plain
:class:`ErrorFrame`. All of them are :class:`~nsqpy.protocol.errors.ProtocolError`, so code
shared with the daemon can catch one type.
"""

from __future__ import annotations

from nsqpy.protocol.client import HandshakeError
from nsqpy.protocol.errors import ERROR_CODES, NON_FATAL_CODES, NSQError, ProtocolError

__all__ = [
    "ERROR_CODES",
    "NON_FATAL_CODES",
    "AuthDisabledError",
    "AuthError",
    "AuthFailedError",
    "AuthFirstError",
    "AuthRequiredError",
    "AuthServerError",
    "BadBodyError",
    "BadChannelError",
    "BadMessageError",
    "BadProtocolError",
    "BadTopicError",
    "ConnectionClosedError",
    "DPubFailedError",
    "ErrorFrame",
    "FinFailedError",
    "GiveUp",
    "HandshakeError",
    "IdentifyFailedError",
    "InvalidError",
    "MPubFailedError",
    "NSQError",
    "NSQHTTPError",
    "NoConnectionsError",
    "ProtocolError",
    "PubFailedError",
    "PublishError",
    "ReqFailedError",
    "RequeueMessage",
    "TLSError",
    "TooManyChannelConsumersError",
    "TouchFailedError",
    "UnauthorizedError",
    "UnsupportedFeatureError",
    "error_from_frame",
    "make_error",
]


class ErrorFrame(ProtocolError):
    """An error frame received from nsqd: ``code``, ``description``, ``fatal``."""

    #: The ``E_*`` code this class stands for (``""`` on the base class).
    CODE = ""

    def __init__(self, code: str | None = None, description: str = "", fatal: bool | None = None) -> None:
        super().__init__(code or self.CODE, description, fatal)


class PublishError(ErrorFrame):
    """A PUB/MPUB/DPUB was refused (``E_PUB_FAILED``, ``E_MPUB_FAILED``, ``E_DPUB_FAILED``,
    ``E_BAD_MESSAGE``)."""


class AuthError(ErrorFrame):
    """Authentication or authorization failed (``E_AUTH_*``, ``E_UNAUTHORIZED``)."""


class InvalidError(ErrorFrame):
    CODE = "E_INVALID"


class BadProtocolError(ErrorFrame):
    CODE = "E_BAD_PROTOCOL"


class BadBodyError(ErrorFrame):
    CODE = "E_BAD_BODY"


class BadTopicError(ErrorFrame):
    CODE = "E_BAD_TOPIC"


class BadChannelError(ErrorFrame):
    CODE = "E_BAD_CHANNEL"


class BadMessageError(PublishError):
    CODE = "E_BAD_MESSAGE"


class PubFailedError(PublishError):
    CODE = "E_PUB_FAILED"


class MPubFailedError(PublishError):
    CODE = "E_MPUB_FAILED"


class DPubFailedError(PublishError):
    CODE = "E_DPUB_FAILED"


class FinFailedError(ErrorFrame):
    CODE = "E_FIN_FAILED"


class ReqFailedError(ErrorFrame):
    CODE = "E_REQ_FAILED"


class TouchFailedError(ErrorFrame):
    CODE = "E_TOUCH_FAILED"


class IdentifyFailedError(ErrorFrame):
    CODE = "E_IDENTIFY_FAILED"


class TooManyChannelConsumersError(ErrorFrame):
    CODE = "E_TOO_MANY_CHANNEL_CONSUMERS"


class AuthFirstError(AuthError):
    CODE = "E_AUTH_FIRST"


class AuthDisabledError(AuthError):
    CODE = "E_AUTH_DISABLED"


class AuthFailedError(AuthError):
    CODE = "E_AUTH_FAILED"


class AuthServerError(AuthError):
    CODE = "E_AUTH_ERROR"


class UnauthorizedError(AuthError):
    CODE = "E_UNAUTHORIZED"


class AuthRequiredError(AuthError):
    """nsqd requires AUTH but no ``auth_secret`` is configured (raised by the client
    itself, not received in an error frame: ``code`` is empty)."""

    def text(self) -> str:
        return self.description


_BY_CODE: dict[str, type[ErrorFrame]] = {
    cls.CODE: cls
    for cls in (
        InvalidError,
        BadProtocolError,
        BadBodyError,
        BadTopicError,
        BadChannelError,
        BadMessageError,
        PubFailedError,
        MPubFailedError,
        DPubFailedError,
        FinFailedError,
        ReqFailedError,
        TouchFailedError,
        IdentifyFailedError,
        TooManyChannelConsumersError,
        AuthFirstError,
        AuthDisabledError,
        AuthFailedError,
        AuthServerError,
        UnauthorizedError,
    )
}
assert set(_BY_CODE) == set(ERROR_CODES)


def make_error(code: str, description: str = "") -> ErrorFrame:
    """The typed error for ``code`` (a plain :class:`ErrorFrame` for an unknown code)."""
    cls = _BY_CODE.get(code, ErrorFrame)
    return cls(code, description)


def error_from_frame(data: bytes) -> ErrorFrame:
    """Parse an error frame's payload ``"<CODE> <description>"``."""
    code, _, desc = data.decode("utf-8", "replace").partition(" ")
    return make_error(code, desc)


class ConnectionClosedError(NSQError, ConnectionError):
    """The connection closed (or could not be opened) before the command got its answer."""


class TLSError(NSQError):
    """The TLS upgrade failed: the server's certificate could not be verified (wrong CA,
    wrong name, expired…), no common protocol version, a client certificate refused. The
    message says which nsqd and why, e.g. ``127.0.0.1:4150: TLS handshake failed -
    certificate verify failed: unable to get local issuer certificate``."""


class NoConnectionsError(NSQError):
    """No nsqd connection became available within the call's timeout."""


class UnsupportedFeatureError(NSQError, ValueError):
    """A requested feature cannot be used here (e.g. snappy without its compression
    library, TLS files that cannot be loaded)."""


class GiveUp(NSQError):
    """Raised by a handler to FIN a message it will never be able to process (no REQ)."""


class RequeueMessage(NSQError):
    """Raised by a handler to REQ the message with an explicit ``delay`` and ``backoff`` flag."""

    def __init__(self, delay: float | None = None, *, backoff: bool = True) -> None:
        super().__init__(f"requeue (delay={delay}, backoff={backoff})")
        self.delay = delay
        self.backoff = backoff


class NSQHTTPError(NSQError):
    """An nsqd/nsqlookupd HTTP API call failed: ``status`` and NSQ's ``message`` (e.g.
    ``TOPIC_NOT_FOUND``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
