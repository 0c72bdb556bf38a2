"""TLS as a sans-I/O layer: records in, plaintext out, over in-memory BIOs.

Two backends sit behind :class:`TLSLayer`: the stdlib ``ssl`` module (``SSLContext.wrap_bio``)
for everything, and pyOpenSSL only for a server whose client-auth policy is ``require``
(Go's ``tls.RequireAnyClientCert``: a client certificate is mandatory but not verified),
which the stdlib cannot express. :func:`server_tls_context` picks the right one from
nsqd's flags; clients pass an ordinary :class:`ssl.SSLContext`.
"""

from __future__ import annotations

import ssl
import warnings
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from nsqpy.transport.layer import TransportError

if TYPE_CHECKING:
    from OpenSSL import SSL

#: What a :class:`TLSLayer` accepts: a stdlib context, or the pyOpenSSL context that
#: :func:`server_tls_context` builds for the ``require`` policy.
TLSContext: TypeAlias = "ssl.SSLContext | SSL.Context"

#: nsqd's ``--tls-client-auth-policy`` values.
CLIENT_AUTH_POLICIES = ("", "require", "require-verify")

#: ``--tls-min-version`` names (Go's) and the stdlib's versions.
TLS_MIN_VERSIONS: dict[str, ssl.TLSVersion] = {
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
    "tls1.3": ssl.TLSVersion.TLSv1_3,
}

#: OpenSSL's protocol names and the ones nsqd reports in ``/stats`` (``tls_version``).
GO_VERSION_NAMES: dict[str, str] = {
    "SSLv3": "SSL30",
    "TLSv1": "TLS1.0",
    "TLSv1.1": "TLS1.1",
    "TLSv1.2": "TLS1.2",
    "TLSv1.3": "TLS1.3",
}

#: OpenSSL's cipher suite names and Go's (the IANA names, as ``tls.CipherSuiteName``).
GO_CIPHER_NAMES: dict[str, str] = {
    "RC4-SHA": "TLS_RSA_WITH_RC4_128_SHA",
    "DES-CBC3-SHA": "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "AES128-SHA": "TLS_RSA_WITH_AES_128_CBC_SHA",
    "AES256-SHA": "TLS_RSA_WITH_AES_256_CBC_SHA",
    "AES128-SHA256": "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "AES128-GCM-SHA256": "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "AES256-GCM-SHA384": "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "ECDHE-ECDSA-RC4-SHA": "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "ECDHE-ECDSA-AES128-SHA": "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "ECDHE-ECDSA-AES256-SHA": "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "ECDHE-RSA-RC4-SHA": "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "ECDHE-RSA-DES-CBC3-SHA": "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "ECDHE-RSA-AES128-SHA": "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "ECDHE-RSA-AES256-SHA": "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "ECDHE-ECDSA-AES128-SHA256": "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "ECDHE-RSA-AES128-SHA256": "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "ECDHE-ECDSA-AES128-GCM-SHA256": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "ECDHE-RSA-AES256-GCM-SHA384": "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "ECDHE-ECDSA-AES256-GCM-SHA384": "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "ECDHE-RSA-CHACHA20-POLY1305": "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "ECDHE-ECDSA-CHACHA20-POLY1305": "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    # TLS 1.3 suites have the same name in OpenSSL and Go
    "TLS_AES_128_GCM_SHA256": "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384": "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256": "TLS_CHACHA20_POLY1305_SHA256",
}

#: Plaintext asked for per read; a TLS record carries at most 16 KiB.
READ_SIZE = 65536


class TLSBackend(Protocol):
    """One TLS connection over memory buffers; errors are raised as :class:`TransportError`."""

    def feed(self, data: bytes) -> None:
        """Queue records received from the network."""
        ...

    def handshake(self) -> bool:
        """Advance the handshake; True once it is complete."""
        ...

    def read(self) -> tuple[bytes, bool]:
        """All plaintext available now, and whether the peer sent close_notify."""
        ...

    def write(self, data: bytes) -> None:
        """Encrypt application bytes (the records come out of :meth:`drain`)."""
        ...

    def drain(self) -> bytes:
        """Every record waiting to go to the network."""
        ...

    def shutdown(self) -> None:
        """Queue a close_notify alert."""
        ...

    def version(self) -> str: ...

    def cipher(self) -> str: ...

    def alpn(self) -> str: ...

    def peer_der(self) -> bytes | None: ...

    def peer_dict(self) -> dict[str, Any] | None: ...


class TLSLayer:
    """TLS over in-memory buffers, server or client side.

    ``decode`` feeds received records, drives the handshake and returns the decrypted
    application bytes; the handshake's own records come out of ``output()`` (a client's
    ClientHello is there right after construction). Application bytes encoded before the
    handshake completes are held and encrypted as soon as it does. After a peer's
    close_notify, ``closed`` is True and ``decode`` returns b"". After a TransportError,
    ``output()`` may still hold an alert worth sending before closing the socket.
    """

    __slots__ = ("_backend", "_early", "closed", "handshake_done", "server_side")

    def __init__(
        self,
        context: TLSContext,
        *,
        server_side: bool = False,
        server_hostname: str | None = None,
    ) -> None:
        self.server_side = server_side
        self.handshake_done = False
        self.closed = False
        self._early: list[bytes] = []
        if isinstance(context, ssl.SSLContext):
            self._backend: TLSBackend = StdlibBackend(context, server_side, server_hostname)
        else:
            from nsqpy.transport._pyopenssl import OpenSSLBackend

            self._backend = OpenSSLBackend(context, server_side, server_hostname)
        if not server_side:
            self._handshake()  # puts the ClientHello into output()

    def decode(self, data: bytes) -> bytes:
        if self.closed:
            return b""
        backend = self._backend
        if data:
            backend.feed(data)
        if not self.handshake_done and not self._handshake():
            return b""
        plain, closed = backend.read()
        if closed:
            self.closed = True
        return plain

    def encode(self, data: bytes) -> bytes:
        if data:
            if self.handshake_done:
                self._backend.write(data)
            else:
                self._early.append(bytes(data))
        return self._backend.drain()

    def output(self) -> bytes:
        return self._backend.drain()

    def close(self) -> None:
        """Send close_notify (it comes out of ``output()``)."""
        if self.handshake_done:
            self._backend.shutdown()

    def version(self) -> str:
        """The protocol version by Go's name (``TLS1.2``, ``TLS1.3``); "" before the handshake."""
        if not self.handshake_done:
            return ""
        name = self._backend.version()
        return GO_VERSION_NAMES.get(name, name)

    def cipher(self) -> str:
        """The cipher suite by Go's (IANA) name, else OpenSSL's; "" before the handshake."""
        if not self.handshake_done:
            return ""
        name = self._backend.cipher()
        return GO_CIPHER_NAMES.get(name, name)

    def negotiated_protocol(self) -> str:
        """The ALPN protocol both sides agreed on, "" if none."""
        return self._backend.alpn() if self.handshake_done else ""

    def peer_certificate(self) -> dict[str, Any] | None:
        """The peer's certificate in :meth:`ssl.SSLSocket.getpeercert` form, or None.

        The stdlib backend only decodes a certificate it verified; see
        :meth:`peer_certificate_der` for the raw certificate in every case.
        """
        return self._backend.peer_dict() if self.handshake_done else None

    def peer_certificate_der(self) -> bytes | None:
        """The peer's certificate, DER-encoded, or None if it sent none."""
        return self._backend.peer_der() if self.handshake_done else None

    def peer_common_name(self) -> str:
        """The subject common name of the peer's certificate ("" if none), for NSQ's auth."""
        cert = self.peer_certificate()
        if not cert:
            return ""
        common_name = ""
        for rdn in cert.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    common_name = value  # like Go's pkix.Name, the last one wins
        return common_name

    def _handshake(self) -> bool:
        if not self._backend.handshake():
            return False
        self.handshake_done = True
        if self._early:
            self._backend.write(b"".join(self._early))
            self._early.clear()
        return True


class StdlibBackend:
    """The stdlib ``ssl`` backend: an :class:`ssl.SSLObject` between two memory BIOs."""

    __slots__ = ("_incoming", "_obj", "_outgoing")

    def __init__(self, context: ssl.SSLContext, server_side: bool, server_hostname: str | None) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._obj = context.wrap_bio(
            self._incoming, self._outgoing, server_side=server_side, server_hostname=server_hostname
        )

    def feed(self, data: bytes) -> None:
        self._incoming.write(data)

    def handshake(self) -> bool:
        try:
            self._obj.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLError as e:
            raise TransportError(f"TLS handshake failed - {ssl_error_reason(e)}") from None
        return True

    def read(self) -> tuple[bytes, bool]:
        parts = []
        read = self._obj.read
        closed = False
        while True:
            try:
                chunk = read(READ_SIZE)
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                closed = True
                break
            except ssl.SSLError as e:
                raise TransportError(f"TLS error - {ssl_error_reason(e)}") from None
            if not chunk:  # close_notify received
                closed = True
                break
            parts.append(chunk)
        if len(parts) == 1:
            return parts[0], closed
        return b"".join(parts), closed

    def write(self, data: bytes) -> None:
        try:
            self._obj.write(data)
        except ssl.SSLError as e:
            raise TransportError(f"TLS error - {ssl_error_reason(e)}") from None

    def drain(self) -> bytes:
        return self._outgoing.read()

    def shutdown(self) -> None:
        try:
            self._obj.unwrap()
        except ssl.SSLError:
            pass  # SSLWantReadError: close_notify is queued, the peer's has not come yet

    def version(self) -> str:
        return self._obj.version() or ""

    def cipher(self) -> str:
        cipher = self._obj.cipher()
        return cipher[0] if cipher else ""

    def alpn(self) -> str:
        return self._obj.selected_alpn_protocol() or ""

    def peer_der(self) -> bytes | None:
        return self._obj.getpeercert(binary_form=True)

    def peer_dict(self) -> dict[str, Any] | None:
        return self._obj.getpeercert() or None


def ssl_error_reason(e: ssl.SSLError) -> str:
    """A short reason for a log line: ``certificate verify failed: self-signed certificate``."""
    reason = e.reason
    if not reason:
        return str(e.args[1] if len(e.args) > 1 else e)
    text = reason.lower().replace("_", " ")
    verify_message = getattr(e, "verify_message", None)
    return f"{text}: {verify_message}" if verify_message else text


def server_tls_context(
    cert_file: str,
    key_file: str,
    client_auth: str = "",
    root_ca_file: str = "",
    min_version: str = "tls1.0",
) -> TLSContext:
    """The server context for nsqd's ``--tls-*`` flags, as Go's ``buildTLSConfig``.

    ``client_auth``: "" (no client certificate asked), ``require`` (one is mandatory but any
    is accepted: a pyOpenSSL context, since the stdlib cannot skip verification) or
    ``require-verify`` (verified against ``root_ca_file``, or the system CAs if it is "").
    ``min_version`` is Go's name (``tls1.0``..``tls1.3``). Note that OpenSSL's default
    security level may still refuse TLS 1.0/1.1 even when the minimum allows them.
    Raises ValueError for an unknown policy or version, OSError/ssl.SSLError (or pyOpenSSL's
    Error) for bad files, RuntimeError for ``require`` without pyOpenSSL installed.
    """
    if client_auth not in CLIENT_AUTH_POLICIES:
        raise ValueError(f"unknown TLS client auth policy {client_auth!r}")
    if min_version not in TLS_MIN_VERSIONS:
        raise ValueError(f"unknown TLS version {min_version!r}")
    if client_auth == "require":
        try:
            from nsqpy.transport._pyopenssl import require_any_client_cert_context
        except ImportError as e:
            raise RuntimeError("TLS client auth policy 'require' needs the pyOpenSSL package") from e
        return require_any_client_cert_context(cert_file, key_file, root_ca_file, min_version)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _set_version(context, "minimum_version", min_version)
    context.load_cert_chain(cert_file, key_file)
    if client_auth == "require-verify":
        context.verify_mode = ssl.CERT_REQUIRED
        if root_ca_file:
            context.load_verify_locations(cafile=root_ca_file)
        else:
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    return context


def client_tls_context(
    *,
    root_ca_file: str = "",
    cert_file: str = "",
    key_file: str = "",
    insecure_skip_verify: bool = False,
    min_version: str = "",
    max_version: str = "",
) -> ssl.SSLContext:
    """A client context from go-nsq's TLS options (``tls_root_ca_file``, ``tls_cert``,
    ``tls_key``, ``tls_insecure_skip_verify``, ``tls_min_version``).

    The server is verified against ``root_ca_file`` (else the system CAs) and the name
    given as ``server_hostname`` to :class:`TLSLayer`, unless ``insecure_skip_verify``.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif root_ca_file:
        context.load_verify_locations(cafile=root_ca_file)
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if cert_file:
        context.load_cert_chain(cert_file, key_file or None)
    if min_version:
        _set_version(context, "minimum_version", min_version)
    if max_version:
        _set_version(context, "maximum_version", max_version)
    return context


def _set_version(context: ssl.SSLContext, attr: str, name: str) -> None:
    """Set a version bound by Go's name; TLS 1.0/1.1 are deprecated in Python, not refused."""
    if name not in TLS_MIN_VERSIONS:
        raise ValueError(f"unknown TLS version {name!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        setattr(context, attr, TLS_MIN_VERSIONS[name])
