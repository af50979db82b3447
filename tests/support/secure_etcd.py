"""Real etcd with TLS, mutual TLS and auth; certificates made here with ``cryptography``
(a pytest plugin, loaded by tests/conftest.py for every directory).

- ``pki``: a CA, a server certificate for 127.0.0.1/localhost, a client
  certificate, and a second ("wrong") CA with its own client certificate;
- ``tls_etcd`` (server TLS), ``mtls_etcd`` (``--client-cert-auth``) and
  ``auth_etcd`` (server TLS + etcd auth with a root user, ``ROOT_PASSWORD``):
  one etcd process each for the session, on free loopback ports;
- :class:`Tenants`: what the security tests' ``tenants`` fixture gives.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from joblease import EtcdConfig
from joblease.embedded import EtcdCluster
from joblease.etcd_store import EtcdStore
from joblease.tenancy import TenantCredentials, enable_auth
from tests.support.etcd import etcd_binary

ROOT_PASSWORD = "r00t-" + uuid.uuid4().hex


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    wrong_ca: Path
    wrong_client_cert: Path
    wrong_client_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _ca(cn: str, path: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _leaf(ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], cn: str, cert_path: Path,
          key_path: Path, *, server: bool) -> None:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    cert_path.write_bytes(builder.sign(ca_key, hashes.SHA256())
                          .public_bytes(serialization.Encoding.PEM))
    _write_key(key, key_path)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return write_pki(tmp_path_factory.mktemp("pki"))


def write_pki(d: Path) -> Pki:
    """A CA, server and client certificates (and a wrong CA's) written into ``d``."""
    ca = _ca("joblease test CA", d / "ca.pem")
    _leaf(ca, "etcd-server", d / "server.pem", d / "server-key.pem", server=True)
    _leaf(ca, "joblease-client", d / "client.pem", d / "client-key.pem", server=False)
    wrong = _ca("some other CA", d / "wrong-ca.pem")
    _leaf(wrong, "joblease-client", d / "wrong-client.pem", d / "wrong-client-key.pem",
          server=False)
    return Pki(d, d / "ca.pem", d / "server.pem", d / "server-key.pem", d / "client.pem",
               d / "client-key.pem", d / "wrong-ca.pem", d / "wrong-client.pem",
               d / "wrong-client-key.pem")


def _health_context(pki: Pki, *, client_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if client_cert:
        ctx.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return ctx


def _tls_cluster(pki: Pki, *, mutual: bool) -> EtcdCluster:
    args = ["--unsafe-no-fsync", "--cert-file", str(pki.server_cert),
            "--key-file", str(pki.server_key)]
    if mutual:
        args += ["--client-cert-auth", "--trusted-ca-file", str(pki.ca)]
    return EtcdCluster(1, binary=etcd_binary() or None, extra_args=args, client_scheme="https",
                       health_ssl_context=_health_context(pki, client_cert=mutual))


@pytest.fixture(scope="session")
def tls_etcd(pki: Pki) -> Iterator[EtcdCluster]:
    cluster = _tls_cluster(pki, mutual=False).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def mtls_etcd(pki: Pki) -> Iterator[EtcdCluster]:
    cluster = _tls_cluster(pki, mutual=True).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def auth_etcd(pki: Pki) -> Iterator[EtcdCluster]:
    """Server TLS and etcd auth on (user ``root`` / ``ROOT_PASSWORD``)."""
    import asyncio

    cluster = _tls_cluster(pki, mutual=False).start()

    async def enable() -> None:
        async with EtcdStore(EtcdConfig(endpoints=cluster.endpoints, ca_file=str(pki.ca))) as s:
            await enable_auth(s, ROOT_PASSWORD)

    asyncio.run(enable())
    yield cluster
    cluster.stop()


@dataclass
class Tenants:
    root: str
    base: EtcdConfig  # endpoints + TLS + root, no credentials
    admin: EtcdStore  # connected as root
    ns_a: str
    ns_b: str
    a: TenantCredentials
    b: TenantCredentials

    @property
    def root_config(self) -> EtcdConfig:
        return self.base.with_(username="root", password=ROOT_PASSWORD)

    def config(self, creds: TenantCredentials) -> EtcdConfig:
        return creds.etcd_config(self.base)
