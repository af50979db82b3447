"""A self-signed serving certificate for the webhook server in tests, written the
way the kubelet updates a Secret volume (whole files, renamed into place)."""

from __future__ import annotations

import datetime as dt
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def write_cert(directory: Path, common_name: str) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (directory / "tls.key.new").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    (directory / "tls.crt.new").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    # replaced as the kubelet swaps a Secret volume's files: whole, never half-written
    (directory / "tls.key.new").rename(directory / "tls.key")
    (directory / "tls.crt.new").rename(directory / "tls.crt")



async def post_review(port: int, directory: Path, path: str, body: Mapping[str, Any]
                      ) -> tuple[int, Any]:
    """POST ``body`` to the webhook on ``localhost:port``, verifying its certificate
    (written by :func:`write_cert` into ``directory``)."""
    context = ssl.create_default_context(cafile=str(directory / "tls.crt"))
    async with aiohttp.ClientSession() as session, session.post(
            f"https://localhost:{port}{path}", json=body, ssl=context) as resp:
        return resp.status, await resp.json(content_type=None)
