"""The issuers' signing keys: each JWK Set fetched in the background, never on the request path
(docs/spec.md §29).

A :class:`KeySet` is one ``jwks_url``: fetched when the gateway starts, again every
``jwks_refresh_s``, and — when a token names a ``kid`` it does not hold — at most once per
:data:`COOLDOWN_S`: the request that named it is refused (401) at once and only wakes the fetch,
so a flood of made-up ``kid`` values costs one fetch per 10 s, never one per request. A fetch
that fails (the server down, a timeout, an answer that is no JWK Set) keeps every key known:
tokens signed by them keep working. :class:`KeySets` holds them per URL for the whole process:
a config reload keeps each set (and its task) whose URL is still named.

Each key is pinned to what it may verify (RFC 8725 §3.1): its ``alg`` when the JWK names one,
else its type's family — RSA: RS*/PS*; EC: the one ES* of its curve; OKP: EdDSA. Symmetric
(``oct``) keys are refused: a published JWK Set holds no secret, and an HS* token verified with
an RSA key's bytes is the algorithm-confusion attack.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson
from jwt import PyJWK
from jwt.exceptions import PyJWKError

log = logging.getLogger("gateway")

#: an unknown ``kid`` refetches the JWK Set at most once per this many seconds
COOLDOWN_S = 10.0
#: a JWK Set larger than this is refused (a real one holds a few keys: a few KiB)
MAX_JWKS_BYTES = 512 * 1024
#: one fetch, connect to last byte
FETCH_TIMEOUT_S = 5.0
#: after a failed fetch the next comes after 1, 2, 4 … s, at most this (or the refresh period)
MAX_BACKOFF_S = 60.0

_RSA = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_EC_CURVES = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}

#: fetch a URL's body (bounded): the one way a key set reaches the network
Fetch = Callable[[str], Awaitable[bytes]]


@dataclass(frozen=True, slots=True)
class SigningKey:
    kid: str | None
    #: the public key object PyJWT verifies with
    key: Any
    #: the ``alg`` values this key may verify (its pin)
    algorithms: frozenset[str]


def _family(jwk: Mapping[str, Any]) -> tuple[frozenset[str], str]:
    """The algorithms a JWK's type allows, and the one PyJWT builds its key object with."""
    kty = jwk.get("kty")
    if kty == "RSA":
        return _RSA, "RS256"
    if kty == "EC":
        alg = _EC_CURVES.get(str(jwk.get("crv")))
        if alg is None:
            raise ValueError(f"EC curve {jwk.get('crv')!r} is not accepted")
        return frozenset({alg}), alg
    if kty == "OKP":
        return frozenset({"EdDSA"}), "EdDSA"
    raise ValueError(f"key type {kty!r} is not accepted (RSA, EC or OKP only)")


def signing_key(jwk: Any) -> SigningKey | None:
    """One JWK as a pinned signing key; None for a key meant for encryption. Raises ValueError
    (with why) for a key that cannot be used."""
    if not isinstance(jwk, dict):
        raise ValueError("a key is not a JSON object")
    if jwk.get("use", "sig") != "sig":
        return None
    family, build_as = _family(jwk)
    alg = jwk.get("alg")
    if alg is not None:
        if alg not in family:
            raise ValueError(f"alg {alg!r} does not fit key type {jwk.get('kty')!r}")
        family, build_as = frozenset({alg}), alg
    kid = jwk.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise ValueError("kid is not a string")
    try:
        key = PyJWK(jwk, algorithm=build_as).key
    except PyJWKError as exc:
        raise ValueError(str(exc)) from None
    return SigningKey(kid, key, family)


def parse_jwks(body: bytes) -> tuple[dict[str | None, SigningKey], list[str]]:
    """The usable keys of a JWK Set (by ``kid``; a key without one under None), and why each
    other key was left out. Raises ValueError when the body is no JWK Set at all."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ValueError("the answer is not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
        raise ValueError('the answer is not a JWK Set (no "keys" array)')
    keys: dict[str | None, SigningKey] = {}
    problems: list[str] = []
    for i, jwk in enumerate(data["keys"]):
        try:
            key = signing_key(jwk)
        except ValueError as exc:
            problems.append(f"key {i}: {exc}")
            continue
        if key is None:
            continue
        if key.kid in keys:
            problems.append(f"key {i}: kid {key.kid!r} is listed twice (the first is used)")
            continue
        keys[key.kid] = key
    return keys, problems


class KeySet:
    """One JWK Set URL and the keys last fetched from it (see the module)."""

    def __init__(
        self,
        url: str,
        refresh_s: float,
        fetch: Fetch,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.refresh_s = refresh_s
        self._fetch = fetch
        self._clock = clock
        self.keys: dict[str | None, SigningKey] = {}
        #: fetches done (ok or not), for readiness and tests
        self.fetches = 0
        self._last_fetch = -COOLDOWN_S
        self._fetched_at: float | None = None
        self._error: str | None = None
        self._wanted = asyncio.Event()
        #: set once the first fetch is over (whatever its outcome)
        self.tried = asyncio.Event()

    def find(self, kid: str | None) -> SigningKey | None:
        """The key a token's ``kid`` names; without a ``kid``, the only key there is."""
        keys = self.keys
        if kid is None and len(keys) == 1:
            return next(iter(keys.values()))
        return keys.get(kid)

    def want_refresh(self) -> None:
        """A token named an unknown ``kid``: fetch again, no sooner than the cooldown allows."""
        self._wanted.set()

    async def run(self) -> None:
        """Fetch now, then every ``refresh_s`` or when wanted (the cooldown apart); for ever."""
        failures = 0
        while True:
            self._wanted.clear()
            failures = 0 if await self.fetch_once() else failures + 1
            delay = self.refresh_s
            if failures:
                delay = min(delay, MAX_BACKOFF_S, 2.0 ** (failures - 1))
            woken = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    woken = await self._wanted.wait()
            wait = self._last_fetch + COOLDOWN_S - self._clock()
            if woken and wait > 0:  # an unknown kid: once per cooldown
                await asyncio.sleep(wait)

    async def fetch_once(self) -> bool:
        """One fetch; the keys replaced only by a good answer."""
        self._last_fetch = self._clock()
        self.fetches += 1
        try:
            keys, problems = parse_jwks(await self._fetch(self.url))
        except (ValueError, OSError, aiohttp.ClientError, TimeoutError) as exc:
            reason = str(exc) or type(exc).__name__
            if self._error is None:
                log.warning(
                    f"gateway: jwks {self.url}: fetch failed ({reason}); the "
                    f"{len(self.keys)} key(s) known are kept and it is fetched again"
                )
            self._error = reason
            self.tried.set()
            return False
        for problem in problems:
            log.warning(f"gateway: jwks {self.url}: {problem}")
        if self._error is not None:
            log.warning(f"gateway: jwks {self.url}: fetched again ({len(keys)} key(s))")
        self._error = None
        self.keys = keys
        self._fetched_at = time.time()
        self.tried.set()
        return True

    def state(self) -> dict[str, Any]:
        """For ``/readyz``: how many keys, when fetched, the last error (never a reason to be
        unready: the keys known keep working)."""
        at = self._fetched_at
        return {
            "keys": len(self.keys),
            "fetched_at": None if at is None else datetime.fromtimestamp(at, UTC).isoformat(),
            "error": self._error,
        }


class KeySets:
    """Every key set of the process, by URL, each with its background task (see the module)."""

    def __init__(self, fetch: Fetch | None = None) -> None:
        self._fetch = fetch
        self._session: aiohttp.ClientSession | None = None
        self.sets: dict[str, KeySet] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._running = False

    def get(self, url: str, refresh_s: float) -> KeySet:
        """The set of ``url`` (made, and started when the process runs, on first use)."""
        ks = self.sets.get(url)
        if ks is None:
            ks = self.sets[url] = KeySet(url, refresh_s, self._fetch or self._get)
            if self._running:
                self._start(ks)
        ks.refresh_s = min(ks.refresh_s, refresh_s)
        return ks

    async def ready(self) -> None:
        """Wait (at most :data:`FETCH_TIMEOUT_S`) until every set has had its first fetch: a
        gateway that starts, or a reload that names a new issuer, serves its tokens from the
        first request when the issuer answers, and starts anyway when it does not."""
        waits = [ks.tried.wait() for ks in self.sets.values() if not ks.tried.is_set()]
        if waits:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FETCH_TIMEOUT_S):
                    await asyncio.gather(*waits)

    def keep(self, urls: set[str]) -> None:
        """Stop the sets no config names any more (after a reload)."""
        for url in [u for u in self.sets if u not in urls]:
            del self.sets[url]
            task = self._tasks.pop(url, None)
            if task is not None:
                task.cancel()

    def start(self) -> None:
        self._running = True
        for ks in self.sets.values():
            self._start(ks)

    def _start(self, ks: KeySet) -> None:
        self._tasks[ks.url] = asyncio.get_running_loop().create_task(
            ks.run(), name=f"jwks {ks.url}"
        )

    async def _get(self, url: str) -> bytes:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
            )
        async with self._session.get(url, allow_redirects=False) as resp:
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}")
            body = bytearray()
            async for piece in resp.content.iter_chunked(64 * 1024):
                body += piece
                if len(body) > MAX_JWKS_BYTES:
                    raise ValueError(f"the answer is larger than {MAX_JWKS_BYTES} bytes")
            return bytes(body)

    async def aclose(self) -> None:
        self._running = False
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None


__all__ = [
    "COOLDOWN_S",
    "MAX_JWKS_BYTES",
    "KeySet",
    "KeySets",
    "SigningKey",
    "parse_jwks",
    "signing_key",
]
