"""The center's TLS identity: a self-signed ECDSA P-256 certificate made once and reused.

Owns: `<state>/tls/cert.pem` and `key.pem` (0600), their creation with `cryptography`
(SAN DNS localhost, IP 127.0.0.1 and ::1, 365 days), the server `ssl.SSLContext`, and the
pin (SHA-256 over the leaf DER, canonical form from `mcphost.admin.pinning`).
Must never: rotate an existing certificate silently (a new cert changes the pin every host
was configured with), or write the key with loose permissions.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mcphost.admin.pinning import format_pin, leaf_digest
from mcphost.fsutil import write_atomic


@dataclass(frozen=True, slots=True)
class TlsIdentity:
    cert_path: Path
    key_path: Path
    der: bytes

    @property
    def fingerprint(self) -> str:
        return format_pin(leaf_digest(self.der))

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_path, self.key_path)
        return ctx


def ensure_identity(state: Path) -> TlsIdentity:
    directory = state / "tls"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    if not (cert_path.exists() and key_path.exists()):
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mcphost-devcenter")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=365))
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
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        write_atomic(
            key_path,
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )
        write_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    return TlsIdentity(cert_path, key_path, cert.public_bytes(serialization.Encoding.DER))
