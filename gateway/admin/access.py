"""Who may use the admin API (docs/spec.md §28): the admin key — the value of the environment
variable ``[admin] key_env`` names, sent as ``Authorization: Bearer`` — or a bearer JWT whose
grant makes its subject an admin (``admin_groups``, docs/spec.md §29), as verified by the
sign-in identities (an API key shaped like a JWT is still an API key). ``x-api-key`` and
``api-key`` are not read here.

The admin key is held as its sha256 and compared with :func:`hmac.compare_digest` against the
sha256 of what the caller sent: the time taken does not depend on how much of the key was right.
A key of ``[[auth.keys]]`` (even one with ``admin = true``, which opens the live view) or of the
key store is no admin here: 403 ``admin_required``; anything else 401.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping

from gateway.config import Config
from gateway.errors import Forbidden, Unauthorized
from gateway.identities import looks_like_jwt
from gateway.runtime import Runtime


class AdminAccess:
    __slots__ = ("_digest",)

    def __init__(self, config: Config, environ: Mapping[str, str]) -> None:
        name = config.admin.key_env
        secret = environ.get(name) if name else None
        #: the admin key's sha256 (None: no admin key set; JWT admins only)
        self._digest = hashlib.sha256(secret.encode()).digest() if secret else None

    def who(self, rt: Runtime, credential: bytes | None) -> str:
        """The admin's name for the audit lines; raises 401 / 403. ``credential``: what
        ``Authorization: Bearer`` carried (:func:`bearer_of`)."""
        if not credential:
            raise Unauthorized(
                "the admin API needs the admin key as Authorization: Bearer <key>",
                code="missing_api_key",
            )
        digest = hashlib.sha256(credential).digest()
        expected = self._digest if self._digest is not None else bytes(32)
        if hmac.compare_digest(digest, expected) and self._digest is not None:
            return "admin-key"
        refused: Unauthorized | None = None
        if looks_like_jwt(credential) and rt.auth.sign_ins is not None:
            # only a token the sign-in identities verify counts as one (never an API key
            # that happens to look like a JWT)
            try:
                entry = rt.auth.sign_ins.identify(credential, digest)
            except Unauthorized as exc:
                refused = exc
            else:
                if entry.admin:
                    return f"jwt:{entry.tenant}/{entry.limit_id[:12]}"
                raise Forbidden("this token's grant is not an admin's", code="admin_required")
        try:
            rt.auth.identify(credential)
        except Unauthorized:
            raise refused or Unauthorized("not the admin key", code="invalid_api_key") from None
        raise Forbidden(
            "an API key is no admin key: use the key of [admin] key_env", code="admin_required"
        )


def bearer_of(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The credential of the request's ``Authorization: Bearer`` header (the only place the
    admin API reads one: not ``x-api-key`` / ``api-key``); None without one."""
    for name, value in headers:
        if name.lower() == b"authorization":
            if value[:7].lower() != b"bearer ":
                return None
            return value[7:].strip() or None
    return None


__all__ = ["AdminAccess", "bearer_of"]
