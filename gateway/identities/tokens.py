"""A bearer JWT instead of a key: verified with PyJWT against its issuer's pinned keys, mapped to
a tenant and its grant, and remembered by its bytes for the rest of its life (docs/spec.md §29).

Per token, once: the issuer is the one whose ``iss`` the token carries (``[[auth.jwt]]``); its
``alg`` must be one the issuer lists *and* one its key is pinned to
(:mod:`gateway.identities.keysets`), so ``alg: none`` and an HS* token signed with an RSA key's
bytes are refused before any signature is computed (RFC 8725 §2.1, §3.1); then
:func:`jwt.decode` checks the signature, ``exp``/``nbf``/``iat`` (within ``leeway_s``), ``iss``
and ``aud``, with ``exp``, ``iss``, ``aud`` and ``sub`` required. The tenant is the
``tenant_claim``'s value when the token carries it (it must be granted: else 403), else the
first grant whose ``groups`` the token's groups claim names (none: 403). A subject in one of the
``admin_groups`` is an admin.

Verifying costs CPU (an RSA or EC signature), so :class:`SignIns` remembers each verified
token by the sha256 of its exact bytes (never the token itself) until it expires, at most
:data:`TOKEN_CACHE_MAX` of them: a client that sends its token again pays a hash and a lookup. A
remembered token is dropped as soon as its key leaves the JWK Set. Tokens are never logged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import jwt

from gateway.config import AuthKeyConfig, JwtIssuerConfig
from gateway.config.accounts import grant_key
from gateway.errors import Forbidden, Unauthorized
from gateway.identities.keysets import KeySet, KeySets, SigningKey
from gateway.memo import remember

#: a longer bearer credential is refused before it is parsed
MAX_TOKEN_BYTES = 16 * 1024
#: verified tokens remembered per snapshot (then emptied and refilled with those in use)
TOKEN_CACHE_MAX = 4096
#: subjects whose limits entry is kept ready
SUBJECT_CACHE_MAX = 10_000
_REQUIRED = ("exp", "iss", "aud", "sub")


class TokenRefused(Unauthorized):
    """401 ``invalid_token`` with ``WWW-Authenticate: Bearer error="invalid_token"``
    (RFC 6750 §3.1)."""

    headers = ((b"www-authenticate", b'Bearer error="invalid_token"'),)

    def __init__(self, why: str) -> None:
        super().__init__(f"the bearer token is not accepted: {why}", code="invalid_token")


def looks_like_jwt(credential: bytes) -> bool:
    """A JWS compact serialisation: three base64url parts (RFC 7515 §7.1), a JSON header."""
    return credential.count(b".") == 2 and credential.startswith(b"eyJ")


@dataclass(frozen=True, slots=True)
class Subject:
    """A verified token's caller."""

    #: the grant's policy with the subject's own digest: its limits and budget are its own
    policy: AuthKeyConfig
    #: the grant's policy digest: what its MCP and passthrough grants are found by
    grant_digest: bytes
    #: ``exp`` (epoch seconds) plus the leeway: when the remembered token stops
    expires: float


class Issuer:
    """One ``[[auth.jwt]]``: its pinned keys and its grants."""

    def __init__(self, cfg: JwtIssuerConfig, keys: KeySet) -> None:
        self.cfg = cfg
        self.keys = keys
        self._algorithms = frozenset(cfg.algorithms)
        self._audiences = list(cfg.audiences)
        self._admins = frozenset(cfg.admin_groups)
        self._policies = {g.tenant: (g, grant_key(cfg, g)) for g in cfg.grants}

    def verify(self, token: str, header: dict[str, Any]) -> tuple[Subject, SigningKey]:
        alg = header.get("alg")
        if alg not in self._algorithms:
            raise TokenRefused(f"algorithm {alg!r} is not accepted for this issuer")
        kid = header.get("kid")
        key = self.keys.find(kid if isinstance(kid, str) else None)
        if key is None:
            self.keys.want_refresh()  # in the background, within its cooldown
            raise TokenRefused("it is signed by a key this gateway does not know")
        if alg not in key.algorithms:
            raise TokenRefused(f"algorithm {alg!r} does not fit the key it names")
        cfg = self.cfg
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                audience=self._audiences,
                issuer=cfg.issuer,
                leeway=cfg.leeway_s,
                options={"require": list(_REQUIRED)},
            )
        except jwt.ExpiredSignatureError:
            raise TokenRefused("it has expired") from None
        except jwt.ImmatureSignatureError:
            raise TokenRefused("it is not valid yet") from None
        except jwt.InvalidAudienceError:
            raise TokenRefused("it is not meant for this gateway (aud)") from None
        except jwt.InvalidIssuerError:
            raise TokenRefused("its issuer is not accepted") from None
        except jwt.MissingRequiredClaimError as exc:
            raise TokenRefused(f"it has no {exc.claim!r} claim") from None
        except jwt.InvalidSignatureError:
            raise TokenRefused("its signature does not verify") from None
        except jwt.PyJWTError:
            raise TokenRefused("it is not a valid JWT") from None
        return self._subject(claims), key

    def _subject(self, claims: dict[str, Any]) -> Subject:
        sub = claims["sub"]
        if not isinstance(sub, str) or not sub:
            raise TokenRefused("its 'sub' claim is not a non-empty string")
        groups = _strings(claims.get(self.cfg.groups_claim))
        policy = self._grant(claims, groups)
        name = f"jwt subject\0{self.cfg.issuer}\0{sub}".encode()
        own = dataclasses.replace(
            policy,
            sha256=hashlib.sha256(name).hexdigest(),
            admin=not self._admins.isdisjoint(groups),
        )
        expires = float(claims["exp"]) + self.cfg.leeway_s
        return Subject(own, bytes.fromhex(policy.sha256), expires)

    def _grant(self, claims: dict[str, Any], groups: Sequence[str]) -> AuthKeyConfig:
        claim = self.cfg.tenant_claim
        if claim is not None and claim in claims:
            tenant = claims[claim]
            found = self._policies.get(tenant) if isinstance(tenant, str) else None
            if found is None:
                raise Forbidden(
                    f"the token's {claim!r} claim names a tenant this gateway does not grant "
                    "to its issuer ([[auth.jwt.grants]])",
                    code="tenant_not_granted",
                )
            return found[1]
        for grant, policy in self._policies.values():
            if not set(grant.groups).isdisjoint(groups):
                return policy
        raise Forbidden(
            "the token's claims map to no tenant: its issuer grants none of its groups "
            "([[auth.jwt.grants]] tenant and groups)",
            code="tenant_not_granted",
        )


def _strings(value: Any) -> tuple[str, ...]:
    """A groups claim: an array of strings, or one string; anything else is no group."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, str))
    return ()


E = TypeVar("E")


class SignIns(Generic[E]):
    """The ``[[auth.jwt]]`` issuers of one config, and the tokens they verified (see the
    module). ``entry`` makes the caller fact the auth hop keeps for a subject."""

    def __init__(
        self,
        issuers: Sequence[JwtIssuerConfig],
        key_sets: KeySets,
        entry: Callable[[Subject], E],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._issuers = {
            cfg.issuer: Issuer(cfg, key_sets.get(cfg.jwks_url, cfg.jwks_refresh_s))
            for cfg in issuers
        }
        self._entry = entry
        self._clock = clock
        #: sha256 of a token -> (its caller, until when, its key set, the key it verified with)
        self._tokens: dict[bytes, tuple[E, float, KeySet, SigningKey]] = {}
        self._subjects: dict[tuple[str, str, bool], E] = {}

    def identify(self, token: bytes, digest: bytes) -> E:
        """The caller a bearer JWT names (``digest``: the sha256 of its bytes); raises 401
        :class:`TokenRefused` or 403 ``tenant_not_granted``."""
        known = self._tokens.get(digest)
        now = self._clock()
        if known is not None:
            entry, until, keys, key = known
            if now < until and keys.keys.get(key.kid) is key:
                return entry
            del self._tokens[digest]
        subject, key, keys = self._verify(token)
        if subject.expires <= now:
            raise TokenRefused("it has expired")
        entry = self._caller(subject)
        remember(self._tokens, digest, (entry, subject.expires, keys, key), TOKEN_CACHE_MAX)
        return entry

    def _verify(self, token: bytes) -> tuple[Subject, SigningKey, KeySet]:
        if len(token) > MAX_TOKEN_BYTES:
            raise TokenRefused(f"it is longer than {MAX_TOKEN_BYTES} bytes")
        try:
            text = token.decode("ascii")
            header = jwt.get_unverified_header(text)
            # only to choose the issuer: every claim is checked again, signed, by its issuer
            unverified = jwt.decode(text, options={"verify_signature": False})
        except (UnicodeDecodeError, jwt.PyJWTError):
            raise TokenRefused("it is not a valid JWT") from None
        iss = unverified.get("iss")
        issuer = self._issuers.get(iss) if isinstance(iss, str) else None
        if issuer is None:
            raise TokenRefused("its issuer is not accepted")
        subject, key = issuer.verify(text, header)
        return subject, key, issuer.keys

    def _caller(self, subject: Subject) -> E:
        policy = subject.policy
        name = (policy.sha256, policy.tenant, policy.admin)
        entry = self._subjects.get(name)
        if entry is None:
            entry = remember(self._subjects, name, self._entry(subject), SUBJECT_CACHE_MAX)
        return entry

    def key_sets(self) -> list[KeySet]:
        return [i.keys for i in self._issuers.values()]


__all__ = [
    "MAX_TOKEN_BYTES",
    "TOKEN_CACHE_MAX",
    "SignIns",
    "Subject",
    "TokenRefused",
    "looks_like_jwt",
]
