"""A private mosquitto for tests: moved to labctl.testing.mosquitto (shipped, for labs' own tests too).
`configured_mosquitto` runs one on a configuration written by `labctl lab broker-config`; `make_certs` makes
a CA, a server certificate for 127.0.0.1 and client certificates at test time."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from labctl.testing.mosquitto import Mosquitto

__all__ = ["Mosquitto", "configured_mosquitto", "make_certs"]


def configured_mosquitto(workdir: Path, conf: Path) -> Mosquitto:
    """A Mosquitto (free port, restartable) whose configuration is `conf`, a file the test writes with
    `broker.port` as its listener (the port is chosen first)."""
    workdir.mkdir(parents=True, exist_ok=True)
    broker = Mosquitto(workdir)
    broker.conf = conf
    return broker


def make_certs(out: Path, clients: tuple[str, ...] = (), ca_name: str = "labctl test CA") -> dict[str, Path]:
    """A CA (`ca`), a server certificate and key for 127.0.0.1/localhost (`server`, `server.key`) and one
    client certificate per name (`<name>`, `<name>.key`: `{identity}` paths of the inventory), PEM files in
    `out`. Keys are EC P-256: quick to make."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name(ca_name))
        .issuer_name(name(ca_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {"ca": out / "ca.pem"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    def issue(label: str, cn: str, server: bool) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        cert = builder.sign(ca_key, hashes.SHA256())
        paths[label] = out / f"{label}.pem"
        paths[f"{label}.key"] = out / f"{label}.key"
        paths[label].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        paths[f"{label}.key"].write_bytes(key_pem(key))
        paths[f"{label}.key"].chmod(0o600)

    issue("server", "127.0.0.1", server=True)
    for client in clients:
        issue(client, client, server=False)
    return paths
