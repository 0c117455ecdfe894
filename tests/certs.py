"""Test certificates: a CA, and server and client certificates it signs (PEM files)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Pair:
    cert: Path
    key: Path


@dataclass
class Certs:
    ca: Path
    server: Pair
    client: Pair
    stranger: Pair  # signed by another CA


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _issue(subject, issuer, issuer_key, key, *, ca=False, usage=None, sans=()):
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(directory: Path, name: str, cert, key) -> Pair:
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Pair(cert_path, key_path)


def make_certs(directory: Path) -> Certs:
    """A CA; a server certificate for localhost/127.0.0.1; a client certificate; and a
    client certificate from an unrelated CA."""
    sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("stator test CA", "stator test CA", ca_key, ca_key, ca=True)
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_key = ec.generate_private_key(ec.SECP256R1())
    # No key-usage limit: etcd's gateway dials its own gRPC port with the server certificate.
    server = _issue("localhost", "stator test CA", ca_key, server_key, sans=sans)
    client_key = ec.generate_private_key(ec.SECP256R1())
    # Fleet members are both: a worker's certificate serves and connects.
    client = _issue("client", "stator test CA", ca_key, client_key, sans=sans)
    other_key = ec.generate_private_key(ec.SECP256R1())
    other_ca = _issue("other CA", "other CA", other_key, other_key, ca=True)
    del other_ca
    stranger_key = ec.generate_private_key(ec.SECP256R1())
    stranger = _issue("stranger", "other CA", other_key, stranger_key, sans=sans)
    return Certs(
        ca=directory / "ca.crt",
        server=_write(directory, "server", server, server_key),
        client=_write(directory, "client", client, client_key),
        stranger=_write(directory, "stranger", stranger, stranger_key),
    )
