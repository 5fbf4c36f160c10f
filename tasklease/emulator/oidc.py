"""OIDC ID tokens like the ones Cloud Tasks and Cloud Scheduler attach, signed by a local key.

The public keys are served in Google's certificate format (``{key id: PEM certificate}``,
as at https://www.googleapis.com/oauth2/v1/certs), so a worker verifies the emulator's tokens
through the same google-auth code path as Google's, with only the certificate URL changed.
"""

from __future__ import annotations

import hashlib
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt, jwt

from tasklease.plumbing.private_files import check_private

ISSUER = "https://accounts.google.com"
TOKEN_LIFETIME_SECONDS = 3600


class TokenIssuer:
    """Mints RS256 ID tokens with a key kept in ``key_path`` (created if absent), so tokens
    stay verifiable across an emulator restart."""

    def __init__(self, key_path: Path | None = None) -> None:
        if key_path is not None and os.path.lexists(key_path):
            check_private(key_path)  # A planted key would sign tokens someone else holds.
            private_pem = key_path.read_bytes()
            key = serialization.load_pem_private_key(private_pem, password=None)
            assert isinstance(key, rsa.RSAPrivateKey)
        else:
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            private_pem = key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            if key_path is not None:
                key_path.parent.mkdir(parents=True, exist_ok=True)
                # Created 0600, never readable by others even for a moment: whoever reads
                # this key can mint tokens the dev worker accepts.
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                descriptor = os.open(key_path, flags, 0o600)
                with os.fdopen(descriptor, "wb") as file:
                    file.write(private_pem)
        public_der = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.key_id = hashlib.sha256(public_der).hexdigest()[:40]
        self._signer = crypt.RSASigner.from_string(private_pem, self.key_id)  # type: ignore[no-untyped-call]
        self._certificate = _self_signed_certificate(key)

    def mint(self, service_account: str, audience: str, now: float | None = None) -> str:
        """An ID token for ``service_account`` with ``audience``, valid for an hour."""
        issued = int(now if now is not None else time.time())
        payload = {
            "iss": ISSUER,
            "aud": audience,
            "azp": service_account,
            "sub": str(int(hashlib.sha256(service_account.encode()).hexdigest()[:15], 16)),
            "email": service_account,
            "email_verified": True,
            "iat": issued,
            "exp": issued + TOKEN_LIFETIME_SECONDS,
        }
        token: bytes = jwt.encode(self._signer, payload)  # type: ignore[no-untyped-call]
        return token.decode()

    def certs(self) -> dict[str, str]:
        """The public keys, in Google's ``/oauth2/v1/certs`` format."""
        return {self.key_id: self._certificate}


def _self_signed_certificate(key: rsa.RSAPrivateKey) -> str:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tasklease-emulator")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=3650))
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM).decode()
