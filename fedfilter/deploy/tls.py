"""Throw-away TLS material for a SuperLink on 127.0.0.1, and SuperNode authentication keys.

``make_tls`` writes a fresh CA certificate and a server certificate for IP:127.0.0.1 and
DNS:localhost (the CA key is never written); ``make_node_key`` writes one ECDSA P-384 key pair in
OpenSSH format, as ``flwr supernode register`` and ``flower-supernode`` load it.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from fedfilter.deploy.processes import LOOPBACK


@dataclass(frozen=True)
class TlsFiles:
    """The files ``make_tls`` writes: the CA's certificate and the server's certificate and key.

    Parameters
    ----------
    ca_cert : Path
        The CA certificate (``ca.crt``), what clients verify the SuperLink against.
    server_cert : Path
        The SuperLink's certificate.
    server_key : Path
        The SuperLink's private key (mode 0600).

    Examples
    --------
    >>> TlsFiles(Path("ca.crt"), Path("server.pem"), Path("server.key")).ca_cert.name
    'ca.crt'
    """

    ca_cert: Path
    server_cert: Path
    server_key: Path


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def make_tls(directory: Path, *, days: int = 7) -> TlsFiles:
    """A fresh CA (``ca.crt``) and a server certificate for IP:127.0.0.1 and DNS:localhost.

    The CA's private key is never written: nothing else can be signed with it later.

    Parameters
    ----------
    directory : Path
        Where the files go (created if missing).
    days : int, optional
        How long the certificates are valid.

    Returns
    -------
    TlsFiles
        The files written.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     files = make_tls(Path(d))
    ...     pem = files.ca_cert.read_text()
    ...     pem.startswith("-----BEGIN CERTIFICATE-----"), oct(files.server_key.stat().st_mode & 0o777)
    (True, '0o600')
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedfilter local CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(LOOPBACK)), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    files = TlsFiles(directory / "ca.crt", directory / "server.pem", directory / "server.key")
    files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(
        files.server_key,
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    return files


def make_node_key(private_path: Path) -> tuple[Path, Path]:
    """An ECDSA P-384 key pair in OpenSSH format (as ``ssh-keygen -t ecdsa -b 384 -N ""``).

    Parameters
    ----------
    private_path : Path
        The private key's file (mode 0600); the public key goes next to it as ``<private>.pub``.

    Returns
    -------
    tuple of Path
        (private key, public key).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     private, public = make_node_key(Path(d) / "node-1")
    ...     public.name, public.read_text().startswith("ecdsa-sha2-nistp384 ")
    ('node-1.pub', True)
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private_path = Path(private_path)
    key = ec.generate_private_key(ec.SECP384R1())
    _write_private(
        private_path,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
    )
    public_path = private_path.with_name(private_path.name + ".pub")
    public_path.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n"
    )
    return private_path, public_path
