"""Throwaway X.509 keys and certificates (the cryptography package): a certificate authority and
the certificates it issues, for TLS and message-signing tests. Never for production."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

VALID_FOR = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Identity:
    """A private key and its certificate, written as PEM files."""

    key: Path
    certificate: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: rsa.RSAPrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    path.chmod(0o600)


def issue(folder: Path, name: str, issuer: Identity | None = None, hosts: tuple[str, ...] = ()) -> Identity:
    """A new key and certificate `<name>.key`/`<name>.pem` in `folder`: self-signed (a CA
    when `issuer` is None) or signed by `issuer`, valid for `hosts` (IP addresses or names)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = datetime.datetime.now(datetime.timezone.utc)
    signing_key: Any
    if issuer is None:
        signing_key, issuer_name = key, _name(name)
    else:
        signing_key = serialization.load_pem_private_key(issuer.key.read_bytes(), password=None)
        issuer_name = x509.load_pem_x509_certificate(issuer.certificate.read_bytes()).subject
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALID_FOR)
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if hosts:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    certificate = builder.sign(signing_key, hashes.SHA256())
    identity = Identity(folder / f"{name}.key", folder / f"{name}.pem")
    _write_key(key, identity.key)
    identity.certificate.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return identity
