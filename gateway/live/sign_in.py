"""The live view's browser sessions (docs/spec.md §18): signed, expiring tokens in a cookie.

A browser cannot put a header on an ``EventSource``, so after ``POST {path}api/session`` with an
admin key in ``Authorization: Bearer`` the view sets a cookie. It holds a session token, never
the key nor a digest of it::

    <entry>.<expires>.<nonce>.<mac>

``entry`` is the index of the admin key's ``[[auth.keys]]`` entry, ``expires`` Unix seconds,
``nonce`` 96 random bits (what a sign-out revokes) and ``mac`` base64url HMAC-SHA256, under a
secret, of the other three and of the entry as configured — so a token dies when its entry
changes (a rotated key, ``admin`` taken away) as it dies at ``expires``. Nothing is stored per
session: any process holding the secret checks a token alone, which is what makes a session
valid across the workers of one ``gateway serve`` (separate processes). The serving parent
calls :func:`ensure_secret` before it spawns them, so they inherit one :data:`SECRET_ENV`; a
process that finds none (tests, the app embedded elsewhere) makes its own, once. Setting
:data:`SECRET_ENV` yourself keeps sessions across restarts and replicas; otherwise every
``gateway serve`` starts with a fresh secret and signs everyone out.

Signing out (``DELETE {path}api/session``) deletes the cookie and revokes the token's nonce in
a small in-memory set of the process that answered, until the token would have expired anyway.
The limitation: other workers (and replicas) do not learn of it, so a copy of the token taken
before the sign-out stays valid there until it expires (:data:`SESSION_TTL_S` at most). The
browser no longer holds it; to end every session at once, restart with a new secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence

from gateway.config import AuthKeyConfig

#: the environment variable that carries the signing secret to the workers
SECRET_ENV = "GATEWAY_UI_SESSION_SECRET"
#: how long a session lasts (the cookie's Max-Age too)
SESSION_TTL_S = 8 * 3600
_CONTEXT = b"llm-gateway live view session v1"
_NONCE_BYTES = 12
#: longer cookie values are no token of ours (and are not parsed)
_MAX_TOKEN = 200
#: this process's secret when the environment has none (made once, on first use)
_process_secret: list[bytes] = []


def ensure_secret(environ: MutableMapping[str, str]) -> str:
    """The session secret in ``environ`` (:data:`SECRET_ENV`), set to a random one if absent.

    ``gateway serve`` calls it before spawning workers so that all of them share it.

    >>> env: dict[str, str] = {}
    >>> ensure_secret(env) == env[SECRET_ENV] == ensure_secret(env)
    True
    """
    value = environ.get(SECRET_ENV)
    if not value:
        value = environ[SECRET_ENV] = secrets.token_urlsafe(32)
    return value


def secret_from(environ: Mapping[str, str]) -> bytes:
    """The secret to sign with: :data:`SECRET_ENV`, else one made for this process."""
    value = environ.get(SECRET_ENV)
    if value:
        return value.encode()
    if not _process_secret:
        _process_secret.append(secrets.token_bytes(32))
    return _process_secret[0]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class SignInTokens:
    """Issues and checks the tokens of one view (one per process; stateless but for the
    revocations of sign-outs answered here)."""

    def __init__(
        self,
        keys: Sequence[AuthKeyConfig],
        secret: bytes,
        ttl_s: int = SESSION_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._secret = secret
        self.ttl_s = ttl_s
        self._clock = clock
        #: the entries as configured (their digest goes into the MAC, never into the token)
        self._entries = [(k.sha256.lower(), k.admin) for k in keys]
        self._index = {bytes.fromhex(digest): i for i, (digest, _) in enumerate(self._entries)}
        #: nonce -> expiry of the tokens signed out in this process
        self._revoked: dict[str, int] = {}

    def _mac(self, entry: int, expires: int, nonce: str) -> str:
        message = b"|".join(
            (
                _CONTEXT,
                b"%d" % entry,
                b"%d" % expires,
                nonce.encode(),
                self._entries[entry][0].encode(),
            )
        )
        return _b64(hmac.new(self._secret, message, hashlib.sha256).digest())

    def knows(self, digest: bytes) -> bool:
        """Whether ``digest`` is a configured key's (a session is signed for those only)."""
        return digest in self._index

    def use_keys(self, keys: Sequence[AuthKeyConfig]) -> None:
        """The keys of a reloaded config: a token stays valid only while the entry it was
        signed for is the same key, still admin (its digest is in the MAC); sign-outs kept."""
        self._entries = [(k.sha256.lower(), k.admin) for k in keys]
        self._index = {bytes.fromhex(digest): i for i, (digest, _) in enumerate(self._entries)}

    def issue(self, digest: bytes) -> str:
        """A token for the admin key entry whose sha256 is ``digest`` (the key was checked)."""
        entry = self._index[digest]
        expires = int(self._clock()) + self.ttl_s
        nonce = _b64(secrets.token_bytes(_NONCE_BYTES))
        return f"{entry}.{expires}.{nonce}.{self._mac(entry, expires, nonce)}"

    def check(self, token: str) -> int | None:
        """The entry index of a valid token (signed here, unexpired, not signed out, its entry
        still admin); None otherwise."""
        parsed = self._verified(token)
        if parsed is None:
            return None
        entry, expires, nonce = parsed
        if expires <= self._clock() or nonce in self._revoked:
            return None
        return entry if self._entries[entry][1] else None

    def revoke(self, token: str) -> bool:
        """Sign a token out (in this process); False when it was no valid token."""
        parsed = self._verified(token)
        if parsed is None:
            return False
        now = self._clock()
        self._revoked = {n: exp for n, exp in self._revoked.items() if exp > now}
        self._revoked[parsed[2]] = parsed[1]
        return True

    @property
    def revocations(self) -> int:
        """Sign-outs remembered here (each only until its token would have expired)."""
        return len(self._revoked)

    def _verified(self, token: str) -> tuple[int, int, str] | None:
        if len(token) > _MAX_TOKEN or not token.isascii():
            return None
        parts = token.split(".")
        if len(parts) != 4 or not (parts[0].isdigit() and parts[1].isdigit()):
            return None
        entry, expires, nonce = int(parts[0]), int(parts[1]), parts[2]
        if entry >= len(self._entries):
            return None
        if not hmac.compare_digest(self._mac(entry, expires, nonce), parts[3]):
            return None
        return entry, expires, nonce


__all__ = ["SECRET_ENV", "SESSION_TTL_S", "SignInTokens", "ensure_secret", "secret_from"]
