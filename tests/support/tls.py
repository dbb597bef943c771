"""A certificate authority made by a test, and server certificates it issues (``cryptography``).

The real-node tier serves the simulator as ``https://api.openai.com`` with a certificate from
such a CA; sandbox pods trust it through the chart's ``sandbox.caBundle`` (as users behind a
TLS-inspecting proxy trust their proxy's CA).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = datetime.timedelta(days=2)


@dataclass(frozen=True)
class ServerCertificate:
    certfile: Path
    keyfile: Path


class TestCA:
    """A CA whose certificate (``pem``) a test hands to the clients that must trust it."""

    __test__ = False  # not a pytest class

    def __init__(self, name: str = "sandbox-controller test CA") -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                    key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )  # fmt: skip

    @property
    def pem(self) -> str:
        return self.certificate.public_bytes(serialization.Encoding.PEM).decode()

    def write(self, path: Path) -> Path:
        path.write_text(self.pem)
        return path

    def issue(self, directory: Path, names: Sequence[str], addresses: Sequence[str] = ()) -> ServerCertificate:
        """A server certificate for ``names`` (DNS) and ``addresses`` (IP), key and chain in
        ``directory`` (the key readable by the owner only)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        alternative: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
        alternative += [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, [*names, *addresses][0])]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.SubjectAlternativeName(alternative), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        directory.mkdir(parents=True, exist_ok=True)
        stem = [*names, *addresses][0].replace("*", "wildcard")
        keyfile = directory / f"{stem}.key"
        keyfile.touch(mode=0o600)
        keyfile.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        certfile = directory / f"{stem}.crt"
        certfile.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        return ServerCertificate(certfile, keyfile)
