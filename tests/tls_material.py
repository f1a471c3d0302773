"""A private CA made for one test: the receiver's certificate for loopback, and a client pair for mTLS."""

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
class Pair:
    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes]:
        return self.key.read_bytes(), self.cert.read_bytes()


@dataclass(frozen=True)
class PrivateCa:
    ca: Path  # the CA's certificate: what a client must trust
    server: Pair  # for 127.0.0.1 and localhost
    client: Pair  # for mTLS


def _name(common: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "run-otel tests"), x509.NameAttribute(NameOID.COMMON_NAME, common)]
    )


def _write(folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pair:
    pair = Pair(folder / f"{stem}.crt", folder / f"{stem}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return pair


def _signed(subject: str, issuer: x509.Name, issuer_key, usage, san: list | None = None):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(issuer_key, hashes.SHA256()), key


def private_ca(folder: Path, name: str = "ca") -> PrivateCa:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{name} private CA"))
        .issuer_name(_name(f"{name} private CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False),  # signatures, cert and CRL signing
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca = _write(folder, f"{name}-ca", ca_cert, ca_key)
    san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    server = _write(folder, f"{name}-server", *_signed("receiver", ca_cert.subject, ca_key, ExtendedKeyUsageOID.SERVER_AUTH, san))
    client = _write(folder, f"{name}-client", *_signed("run-otel", ca_cert.subject, ca_key, ExtendedKeyUsageOID.CLIENT_AUTH))
    return PrivateCa(ca.cert, server, client)
