"""The pyOpenSSL TLS backend, for what the stdlib cannot do: a server that requires a client
certificate without verifying it (nsqd's ``--tls-client-auth-policy=require``, Go's
``tls.RequireAnyClientCert``). Imported only when that policy is configured.
"""

from __future__ import annotations

import datetime
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID
from OpenSSL import SSL

from nsqpy.transport.layer import TransportError
from nsqpy.transport.tls import READ_SIZE

_MIN_VERSIONS = {
    "tls1.0": SSL.TLS1_VERSION,
    "tls1.1": SSL.TLS1_1_VERSION,
    "tls1.2": SSL.TLS1_2_VERSION,
    "tls1.3": SSL.TLS1_3_VERSION,
}

#: Attribute names as the stdlib's ``getpeercert()`` spells them (OpenSSL's long names).
_NAME_KEYS = {
    NameOID.COMMON_NAME: "commonName",
    NameOID.COUNTRY_NAME: "countryName",
    NameOID.LOCALITY_NAME: "localityName",
    NameOID.STATE_OR_PROVINCE_NAME: "stateOrProvinceName",
    NameOID.STREET_ADDRESS: "streetAddress",
    NameOID.ORGANIZATION_NAME: "organizationName",
    NameOID.ORGANIZATIONAL_UNIT_NAME: "organizationalUnitName",
    NameOID.SERIAL_NUMBER: "serialNumber",
    NameOID.EMAIL_ADDRESS: "emailAddress",
    NameOID.DOMAIN_COMPONENT: "domainComponent",
    NameOID.USER_ID: "userId",
}


def _accept_any_certificate(conn: SSL.Connection, cert: Any, errnum: int, depth: int, ok: int) -> bool:
    return True


def require_any_client_cert_context(
    cert_file: str, key_file: str, root_ca_file: str, min_version: str
) -> SSL.Context:
    """A server context that demands a client certificate and accepts any (even self-signed)."""
    context = SSL.Context(SSL.TLS_SERVER_METHOD)
    context.set_min_proto_version(_MIN_VERSIONS[min_version])
    context.set_options(SSL.OP_NO_COMPRESSION)
    context.use_certificate_chain_file(cert_file)
    context.use_privatekey_file(key_file)
    context.check_privatekey()
    if root_ca_file:
        # as Go's ClientCAs with RequireAnyClientCert: only names the CAs in the request
        context.load_client_ca(root_ca_file.encode())
    context.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, _accept_any_certificate)
    # resumed sessions of a verifying server need a session id context
    context.set_session_id(b"nsqpy")
    return context


def _reason(e: SSL.Error) -> str:
    """``peer did not return a certificate`` out of pyOpenSSL's [(lib, func, reason)] list."""
    errors = e.args[0] if e.args else None
    if isinstance(errors, list) and errors and isinstance(errors[0], tuple):
        return "; ".join(str(err[-1]) for err in errors)
    return str(e)


class OpenSSLBackend:
    """An ``SSL.Connection`` without a socket (pyOpenSSL's memory BIOs)."""

    __slots__ = ("_conn",)

    def __init__(self, context: SSL.Context, server_side: bool, server_hostname: str | None) -> None:
        conn = SSL.Connection(context, None)
        if server_side:
            conn.set_accept_state()
        else:
            conn.set_connect_state()
            if server_hostname:
                conn.set_tlsext_host_name(server_hostname.encode("idna"))
        self._conn = conn

    def feed(self, data: bytes) -> None:
        self._conn.bio_write(data)

    def handshake(self) -> bool:
        try:
            self._conn.do_handshake()
        except SSL.WantReadError:
            return False
        except SSL.Error as e:
            raise TransportError(f"TLS handshake failed - {_reason(e)}") from None
        return True

    def read(self) -> tuple[bytes, bool]:
        parts = []
        recv = self._conn.recv
        closed = False
        while True:
            try:
                parts.append(recv(READ_SIZE))
            except SSL.WantReadError:
                break
            except SSL.ZeroReturnError:
                closed = True
                break
            except SSL.Error as e:
                raise TransportError(f"TLS error - {_reason(e)}") from None
        return b"".join(parts), closed

    def write(self, data: bytes) -> None:
        try:
            self._conn.sendall(data)
        except SSL.Error as e:
            raise TransportError(f"TLS error - {_reason(e)}") from None

    def drain(self) -> bytes:
        parts = []
        bio_read = self._conn.bio_read
        while True:
            try:
                parts.append(bio_read(READ_SIZE))
            except SSL.WantReadError:
                break
        return b"".join(parts)

    def shutdown(self) -> None:
        try:
            self._conn.shutdown()
        except SSL.Error:
            pass

    def version(self) -> str:
        return self._conn.get_protocol_version_name()

    def cipher(self) -> str:
        return self._conn.get_cipher_name() or ""

    def alpn(self) -> str:
        return self._conn.get_alpn_proto_negotiated().decode("ascii", "replace")

    def peer_der(self) -> bytes | None:
        cert = self._conn.get_peer_certificate(as_cryptography=True)
        return cert.public_bytes(Encoding.DER) if cert is not None else None

    def peer_dict(self) -> dict[str, Any] | None:
        cert = self._conn.get_peer_certificate(as_cryptography=True)
        return certificate_dict(cert) if cert is not None else None


def certificate_dict(cert: x509.Certificate) -> dict[str, Any]:
    """A certificate in the shape of the stdlib's ``getpeercert()`` (the commonly used keys)."""
    info: dict[str, Any] = {
        "subject": _name(cert.subject),
        "issuer": _name(cert.issuer),
        "version": cert.version.value + 1,
        "serialNumber": _serial(cert.serial_number),
        "notBefore": _asn1_time(cert.not_valid_before_utc),
        "notAfter": _asn1_time(cert.not_valid_after_utc),
    }
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return info
    alt_names: list[tuple[str, str]] = []
    for entry in san:
        if isinstance(entry, x509.DNSName):
            alt_names.append(("DNS", entry.value))
        elif isinstance(entry, x509.IPAddress):
            alt_names.append(("IP Address", _ip_text(entry.value)))
        elif isinstance(entry, x509.RFC822Name):
            alt_names.append(("email", entry.value))
        elif isinstance(entry, x509.UniformResourceIdentifier):
            alt_names.append(("URI", entry.value))
    info["subjectAltName"] = tuple(alt_names)
    return info


def _name(name: x509.Name) -> tuple[tuple[tuple[str, str], ...], ...]:
    return tuple(
        tuple((_NAME_KEYS.get(attr.oid, attr.oid.dotted_string), _text(attr.value)) for attr in rdn)
        for rdn in name.rdns
    )


def _ip_text(ip: Any) -> str:
    """IPv4 as usual; IPv6 uncompressed in upper case (``0:0:0:0:0:0:0:1``), as OpenSSL."""
    if ip.version == 4:
        return str(ip)
    return ":".join(f"{int(group, 16):X}" for group in ip.exploded.split(":"))


def _text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def _serial(number: int) -> str:
    digits = format(number, "X")
    return digits if len(digits) % 2 == 0 else "0" + digits


def _asn1_time(when: datetime.datetime) -> str:
    """OpenSSL's ``ASN1_TIME_print`` form, as the stdlib shows it: ``Jan  5 09:34:43 2018 GMT``."""
    return f"{when:%b} {when.day:2d} {when:%H:%M:%S %Y} GMT"
