"""Sign-in identities (docs/spec.md §29): ``[[auth.jwt]]`` issuers' bearer JWTs accepted instead
of a key — their signing keys fetched in the background (:mod:`.keysets`), each token verified
once with PyJWT and mapped to a tenant and its grant (:mod:`.tokens`)."""

from gateway.identities.keysets import COOLDOWN_S, KeySet, KeySets, SigningKey, parse_jwks
from gateway.identities.tokens import SignIns, Subject, TokenRefused, looks_like_jwt

__all__ = [
    "COOLDOWN_S",
    "KeySet",
    "KeySets",
    "SignIns",
    "SigningKey",
    "Subject",
    "TokenRefused",
    "looks_like_jwt",
    "parse_jwks",
]
