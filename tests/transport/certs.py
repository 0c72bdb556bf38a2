"""Test PKI made at test time with ``cryptography``: a CA, a server certificate for
127.0.0.1/localhost/::1, a CA-signed client certificate and a self-signed one.

Reusable from any test (``tests/`` is on ``sys.path``)::

    from transport.certs import make_pki
    pki = make_pki(tmp_path)          # PEM files under tmp_path
    server_tls_context(pki.server_cert, pki.server_key, "require-verify", pki.ca_cert)
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class PKI:
    """Paths of PEM files; keys are unencrypted PKCS#8."""

    ca_cert: str
    ca_key: str
    server_cert: str
    server_key: str
    client_cert: str  # signed by the CA, CN=client.nsqpy
    client_key: str
    self_signed_cert: str  # signed by itself, CN=rogue.nsqpy
    self_signed_key: str


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nsqpy tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[str, str]:
    cert_path = path.with_suffix(".crt")
    key_path = path.with_suffix(".key")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(cert_path), str(key_path)


def _issue(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
    client: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
        )
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                        x509.IPAddress(ipaddress.ip_address("::1")),
                    ]
                ),
                critical=False,
            )
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(directory: Path) -> PKI:
    """Write a fresh CA, server and client certificates (EC P-256) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("nsqpy test CA")
    ca = _issue(ca_name, ca_key, ca_name, ca_key, ca=True)

    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _issue(_name("localhost"), server_key, ca_name, ca_key, server=True)

    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _issue(_name("client.nsqpy"), client_key, ca_name, ca_key, client=True)

    rogue_key = ec.generate_private_key(ec.SECP256R1())
    rogue_name = _name("rogue.nsqpy")
    rogue = _issue(rogue_name, rogue_key, rogue_name, rogue_key, client=True)

    ca_paths = _write(directory / "ca", ca, ca_key)
    server_paths = _write(directory / "server", server, server_key)
    client_paths = _write(directory / "client", client, client_key)
    rogue_paths = _write(directory / "self-signed", rogue, rogue_key)
    return PKI(*ca_paths, *server_paths, *client_paths, *rogue_paths)
