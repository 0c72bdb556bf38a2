"""A throwaway PKI for `run.py --tls`: a CA and a server certificate it signed, valid for
127.0.0.1, ::1 and localhost, written as PEM files (EC P-256, unencrypted PKCS#8 keys).

Made with the `cryptography` package (a dev dependency), imported only when --tls is used.
Mirrors tests/transport/certs.py, which the bench does not import (tests/ is not a package
the bench may depend on).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServerPKI:
    """Paths of the PEM files."""

    ca_cert: str
    server_cert: str
    server_key: str


def make_server_pki(directory: Path) -> ServerPKI:
    """Write ca.crt, server.crt and server.key (valid from an hour ago for two days)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def name(common_name: str) -> x509.Name:
        return x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nsqpy bench"),
                x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            ]
        )

    now = datetime.datetime.now(datetime.UTC)

    def builder(subject: x509.Name, issuer: x509.Name, key, ca: bool) -> x509.CertificateBuilder:
        return (
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

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("nsqpy bench CA")
    ca = (
        builder(ca_name, ca_name, ca_key, ca=True)
        .add_extension(
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
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = (
        builder(name("localhost"), ca_name, server_key, ca=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    directory.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    ca_path, cert_path, key_path = (directory / n for n in ("ca.crt", "server.crt", "server.key"))
    ca_path.write_bytes(ca.public_bytes(pem))
    cert_path.write_bytes(server.public_bytes(pem))
    key_path.write_bytes(
        server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return ServerPKI(str(ca_path), str(cert_path), str(key_path))
