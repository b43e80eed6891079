"""Certificates for tests and the TLS benchmark: a CA, a server certificate for localhost and a
client certificate it signed, written as PEM files (the `cryptography` package).

For a real cluster make them with openssl (README, section Security).
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import pathlib

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclasses.dataclass(frozen=True)
class Certificates:
    """PEM files: the CA, the server's certificate and key (localhost, 127.0.0.1, ::1), and a
    client's certificate and key, both signed by the CA."""

    ca_file: str
    server_cert_file: str
    server_key_file: str
    client_cert_file: str
    client_key_file: str


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(
    subject: str,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    ca: bool = False,
    hosts: list[str] = (),
    usage=None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    issuer_name, signing_key = (issuer[0].subject, issuer[1]) if issuer else (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if hosts:
        names = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    return builder.sign(signing_key, hashes.SHA256()), key


def _write(directory: pathlib.Path, name: str, cert: x509.Certificate, key) -> tuple[str, str]:
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return str(cert_path), str(key_path)


def make_certificates(directory: str, name: str = "dataservice") -> Certificates:
    """A fresh CA and the certificates it signed, under `directory` (files named after `name`)."""
    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ca = _issue(f"{name} test CA", None, ca=True)
    server = _issue(
        "localhost",
        ca,
        hosts=["localhost", "127.0.0.1", "::1"],
        usage=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    client = _issue(f"{name} client", ca, usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
    ca_file, _ = _write(out, f"{name}-ca", *ca)
    server_cert, server_key = _write(out, f"{name}-server", *server)
    client_cert, client_key = _write(out, f"{name}-client", *client)
    return Certificates(ca_file, server_cert, server_key, client_cert, client_key)
