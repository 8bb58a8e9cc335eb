"""Which keys may reach the paths the gateway does not model (docs/spec.md §26).

With ``auth.mode = "keys"`` a ``/v1`` path that is no model call, no stateful call (§24) and no
stored response (§22) is forwarded only for a key whose ``passthrough`` globs match it — and,
when its tenant sets ``passthrough`` too, the tenant's as well. A key that sets none gets none,
unless it is an admin key (``admin = true``), which gets every path (``["*"]``): the keys §20
already let use these paths whatever their budget. The globs match the whole path, ``*``
across ``/`` too (``"/v1/audio/*"``, ``"/v1/fine_tuning/*"``). With auth off every path passes.
"""

from __future__ import annotations

import fnmatch
from typing import Final

from gateway.config import AuthConfig

#: a key's glob lists: its own, and its tenant's when set (each must match)
Grant = tuple[tuple[str, ...], ...]
#: what an admin key that sets no ``passthrough`` may reach
ADMIN_DEFAULT: Final = ("*",)


class Passthrough:
    """The passthrough grants of a config, per key (by its sha256 digest)."""

    __slots__ = ("_grants",)

    def __init__(self, auth: AuthConfig) -> None:
        tenants = {t.name: t for t in auth.tenants}
        self._grants: dict[bytes, Grant] = {}
        for k in auth.policies():  # the keys, and the sign-in grants (docs/spec.md §29)
            own = k.passthrough
            if own is None:
                own = ADMIN_DEFAULT if k.admin else ()
            globs = [own]
            t = tenants.get(k.tenant)
            if t is not None and t.passthrough is not None:
                globs.append(t.passthrough)
            self._grants[bytes.fromhex(k.sha256)] = tuple(globs)

    def allows(self, digest: bytes, path: str) -> bool:
        """Whether the key of ``digest`` may reach ``path`` unmodelled.

        >>> from gateway.config import AuthKeyConfig
        >>> key = AuthKeyConfig(tenant="t", sha256="ab" * 32, passthrough=("/v1/audio/*",))
        >>> p = Passthrough(AuthConfig(mode="keys", keys=(key,)))
        >>> p.allows(bytes.fromhex("ab" * 32), "/v1/audio/speech")
        True
        >>> p.allows(bytes.fromhex("ab" * 32), "/v1/threads"), p.allows(b"x", "/v1/audio/x")
        (False, False)
        """
        return _matches(self._grants.get(digest), path)

    def allows_key(self, key: object, path: str) -> bool:
        """Whether the identified caller ``key`` may reach ``path``: a key of the key store
        by its own grant (docs/spec.md §28), any other by its digest."""
        own = getattr(key, "own", None)
        if own is not None:
            return _matches(tuple(own.passthrough), path)
        digest = getattr(key, "digest", b"")
        return self.allows(digest, path)


def _matches(grant: Grant | None, path: str) -> bool:
    return grant is not None and all(
        any(fnmatch.fnmatchcase(path, g) for g in globs) for globs in grant
    )


_BUILT: dict[int, tuple[AuthConfig, Passthrough]] = {}


def passthrough_for(auth: AuthConfig) -> Passthrough:
    """The grants of ``auth``, built once per config (the config is kept with them, so its
    id stays its own)."""
    built = _BUILT.get(id(auth))
    if built is None or built[0] is not auth:
        if len(_BUILT) > 16:  # configs of ended runtimes (tests start many)
            _BUILT.clear()
        built = _BUILT[id(auth)] = (auth, Passthrough(auth))
    return built[1]


__all__ = ["ADMIN_DEFAULT", "Passthrough", "passthrough_for"]
