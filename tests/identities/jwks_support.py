"""An identity provider for the sign-in tests (docs/spec.md §29): signing keys generated in the
test (``cryptography``), their JWK Set served by a real HTTP server on loopback, and tokens
minted with PyJWT — plus the forged ones (``alg: none``, an HS256 token keyed with an RSA public
key's bytes) written by hand, as an attacker would."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from tests.support import ThreadedServer

ISSUER = "https://idp.test"
AUDIENCE = "llm-gateway"


@dataclass
class SigningKey:
    kid: str
    alg: str
    private: Any

    @property
    def jwk(self) -> dict[str, Any]:
        public = self.private.public_key()
        maker = RSAAlgorithm if self.alg.startswith(("RS", "PS")) else ECAlgorithm
        jwk: dict[str, Any] = maker.to_jwk(public, as_dict=True)
        return {**jwk, "kid": self.kid, "use": "sig"}

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def token(self, exp_in: float = 300.0, **claims: Any) -> str:
        """A token of this key: ``iss``, ``aud``, ``sub``, ``exp`` defaulted, ``claims`` over
        them (a claim set to None is left out)."""
        now = int(time.time())
        payload: dict[str, Any] = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": "alice",
            "iat": now,
            "exp": now + int(exp_in),
        }
        payload.update(claims)
        payload = {k: v for k, v in payload.items() if v is not None}
        return jwt.encode(payload, self.private, algorithm=self.alg, headers={"kid": self.kid})


def rsa_key(kid: str, alg: str = "RS256") -> SigningKey:
    return SigningKey(kid, alg, rsa.generate_private_key(public_exponent=65537, key_size=2048))


def ec_key(kid: str) -> SigningKey:
    return SigningKey(kid, "ES256", ec.generate_private_key(ec.SECP256R1()))


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _part(obj: dict[str, Any]) -> str:
    return _b64(json.dumps(obj, separators=(",", ":")).encode())


def claims(**over: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {"iss": ISSUER, "aud": AUDIENCE, "sub": "mallory", "iat": now, "exp": now + 300}
    return {**base, **over}


def unsigned_token(kid: str, **over: Any) -> str:
    """``alg: none`` (RFC 7519 §6): no signature at all."""
    return f"{_part({'alg': 'none', 'typ': 'JWT', 'kid': kid})}.{_part(claims(**over))}."


def hs_confusion_token(key: SigningKey, **over: Any) -> str:
    """HS256 with the RSA key's published PEM as the HMAC secret: what a verifier that lets
    the token choose its algorithm would accept (RFC 8725 §2.1)."""
    signing_input = (
        f"{_part({'alg': 'HS256', 'typ': 'JWT', 'kid': key.kid})}.{_part(claims(**over))}"
    )
    mac = hmac.new(key.public_pem(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(mac)}"


@dataclass
class JwksServer:
    """The issuer's JWK Set at ``{url}/jwks`` (the keys of the moment), each fetch counted."""

    keys: list[SigningKey] = field(default_factory=list)
    fetches: int = 0
    server: ThreadedServer | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.fetches += 1
        body = json.dumps({"keys": [k.jwk for k in self.keys]}).encode()
        status = 200 if scope["path"] == "/jwks" else 404
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url + "/jwks"

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


@pytest.fixture
def jwks() -> Iterator[JwksServer]:
    idp = JwksServer()
    idp.server = ThreadedServer(idp, lifespan="off").start()
    try:
        yield idp
    finally:
        idp.stop()


__all__ = [
    "AUDIENCE",
    "ISSUER",
    "JwksServer",
    "SigningKey",
    "claims",
    "ec_key",
    "hs_confusion_token",
    "jwks",
    "rsa_key",
    "unsigned_token",
]
