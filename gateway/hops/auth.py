"""The auth hop: who is calling, what they may call, and whether they have budget (SPEC §12).

``auth.mode = "off"``: nobody is refused and there is no tenant; the hop still runs and is timed
so every trace has the same chain (SPEC §6).

``auth.mode = "keys"``: the client's key (``Authorization: Bearer``, ``api-key`` or ``x-api-key``,
read by the edge, never forwarded or logged) is hashed with sha256 and looked up among the
configured digests; the entry found is compared again with :func:`hmac.compare_digest`. The
lookup is by digest, so its timing depends only on the sha256 of what the caller sent — which
tells an attacker nothing about any configured key — and the gateway never holds a key itself.
Then, per key entry:

- no key → 401 ``missing_api_key``; an unknown key → 401 ``invalid_api_key``;
- the model (known once the router parsed the body) outside the key's ``models`` globs → 403
  ``model_not_allowed`` (checked by the router through ``ctx.permits``);
- ``rpm`` / ``tpm`` (:mod:`gateway.hops.limits`) over → 429 ``rate_limit_exceeded`` with
  ``Retry-After`` and OpenAI's ``x-ratelimit-*`` headers, which also go out on every answer to a
  limited key. Tokens are debited when the request ends, from the usage the upstream reported
  (a cache hit costs no upstream tokens and is not debited).

The tenant names the cache scope (SPEC §10), the ``gateway.tenant`` span attribute, the access
log's ``tenant`` and the live view's records.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import hmac
import math
import os
import time
from collections.abc import Mapping

from gateway.config import AuthConfig, AuthKeyConfig, Config
from gateway.context import RequestContext
from gateway.errors import RateLimited, Unauthorized
from gateway.hops.limits import Limits, MemoryLimits, RedisLimits, Verdict, reset_text
from gateway.memo import remember

_PERMIT_CACHE_MAX = 1024


class KeyEntry:
    """One ``[[auth.keys]]`` entry as the hop uses it."""

    __slots__ = (
        "_allowed",
        "admin",
        "digest",
        "globs",
        "limit_id",
        "rpm",
        "rpm_text",
        "tenant",
        "tpm",
        "tpm_text",
    )

    def __init__(self, cfg: AuthKeyConfig) -> None:
        self.digest = bytes.fromhex(cfg.sha256)
        self.tenant = cfg.tenant
        self.globs = cfg.models
        self.rpm = cfg.rpm or None
        self.tpm = cfg.tpm or None
        #: the x-ratelimit-limit-* values, formatted once
        self.rpm_text = str(self.rpm).encode()
        self.tpm_text = str(self.tpm).encode()
        self.admin = cfg.admin
        #: the limiter's name for this key: a prefix of its digest (never the key)
        self.limit_id = cfg.sha256[:32].lower()
        self._allowed: dict[str, bool] = {}

    def permits(self, model: str) -> bool:
        allowed = self._allowed.get(model)
        if allowed is None:
            allowed = any(fnmatch.fnmatchcase(model, g) for g in self.globs)
            remember(self._allowed, model, allowed, _PERMIT_CACHE_MAX)  # client strings: bounded
        return allowed

    @property
    def limited(self) -> bool:
        return self.rpm is not None or self.tpm is not None


class Auth:
    def __init__(self, cfg: AuthConfig | None = None, limits: Limits | None = None) -> None:
        cfg = cfg or AuthConfig()
        self.mode = cfg.mode
        self._keys: dict[bytes, KeyEntry] = {}
        for k in cfg.keys:
            entry = KeyEntry(k)
            self._keys[entry.digest] = entry
        self.limits: Limits = limits if limits is not None else MemoryLimits()
        #: background debits (Redis) still running; kept so they are not garbage-collected
        self._pending: set[asyncio.Task[None]] = set()

    @property
    def fallback(self) -> bool:
        """Whether limits are counted per process because their Redis is unreachable."""
        return self.limits.fallback

    @property
    def debits(self) -> bool:
        """Whether any key has a token limit (the request end then debits its usage)."""
        return any(k.tpm is not None for k in self._keys.values())

    async def check(self, ctx: RequestContext) -> None:
        """Identify the caller (401), check its request budget (429): ``ctx.tenant``."""
        if self.mode == "off":
            ctx.timeline.auth_done = time.perf_counter()
            return
        entry = self.identify(ctx.credential)
        ctx.tenant = entry.tenant
        ctx.admin = entry.admin
        ctx.permits = entry.permits
        ctx.limit_key = entry
        if entry.limited:
            limits = self.limits
            if isinstance(limits, MemoryLimits):  # per process: no coroutine to await
                verdict = limits.check_now(entry.limit_id, entry.rpm, entry.tpm)
            else:
                verdict = await limits.check(entry.limit_id, entry.rpm, entry.tpm)
            headers = _limit_headers(entry, verdict)
            if not verdict.allowed:
                ctx.timeline.auth_done = time.perf_counter()
                raise _refusal(entry, verdict, headers)
            ctx.response_headers.extend(headers)
        ctx.timeline.auth_done = time.perf_counter()

    def identify(self, credential: bytes | None) -> KeyEntry:
        if not credential:
            raise Unauthorized(
                "no API key: send it as Authorization: Bearer <key> (or api-key / x-api-key)",
                code="missing_api_key",
            )
        digest = hashlib.sha256(credential).digest()
        entry = self._keys.get(digest)
        # a second, constant-time comparison of the digests (the dict lookup found a candidate)
        if entry is None or not hmac.compare_digest(entry.digest, digest):
            raise Unauthorized("the API key is not valid for this gateway", code="invalid_api_key")
        return entry

    def finished(self, ctx: RequestContext, _edges: object = None) -> None:
        """A telemetry sink: debit the tokens the upstream reported against the key's tpm."""
        entry = ctx.limit_key
        if not isinstance(entry, KeyEntry) or entry.tpm is None or ctx.cache.result == "hit":
            return
        answer = ctx.answer
        tokens = (answer.input_tokens or 0) + (answer.output_tokens or 0)
        if tokens <= 0:
            return
        limits = self.limits
        if isinstance(limits, MemoryLimits):
            limits.debit_now(entry.limit_id, tokens, entry.tpm)
            return
        task = asyncio.get_running_loop().create_task(
            limits.debit(entry.limit_id, tokens, entry.tpm)
        )
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def aclose(self) -> None:
        if self._pending:
            await asyncio.wait(self._pending, timeout=1.0)
        await self.limits.aclose()


def _limit_headers(entry: KeyEntry, v: Verdict) -> list[tuple[bytes, bytes]]:
    headers: list[tuple[bytes, bytes]] = []
    if entry.rpm is not None:
        headers += (
            (b"x-ratelimit-limit-requests", entry.rpm_text),
            (b"x-ratelimit-remaining-requests", b"%d" % (v.remaining_requests or 0)),
            (b"x-ratelimit-reset-requests", reset_text(v.reset_requests_s).encode()),
        )
    if entry.tpm is not None:
        headers += (
            (b"x-ratelimit-limit-tokens", entry.tpm_text),
            (b"x-ratelimit-remaining-tokens", b"%d" % (v.remaining_tokens or 0)),
            (b"x-ratelimit-reset-tokens", reset_text(v.reset_tokens_s).encode()),
        )
    return headers


def _refusal(entry: KeyEntry, v: Verdict, headers: list[tuple[bytes, bytes]]) -> RateLimited:
    retry = max(1, math.ceil(v.retry_after_s))
    if v.refused_by == "tokens":
        what = f"tokens per minute (tpm {entry.tpm})"
    else:
        what = f"requests per minute (rpm {entry.rpm})"
    return RateLimited(
        f"rate limit reached for tenant {entry.tenant!r} on {what}; retry in {retry} s",
        code="rate_limit_exceeded",
        headers=[(b"retry-after", str(retry).encode()), *headers],
    )


def build_auth(config: Config, environ: Mapping[str, str] | None = None) -> Auth:
    """The hop for a config: limits in Redis when one is named (``auth.redis_url``, else the
    ``[cache]`` Redis), else per process."""
    cfg = config.auth
    if cfg.mode == "off" or not any(k.rpm or k.tpm for k in cfg.keys):
        return Auth(cfg)
    env = os.environ if environ is None else environ
    url, password, cluster = cfg.redis_url, None, False
    if url is None and config.cache.backend == "redis":
        url, cluster = config.cache.url, config.cache.cluster
        if config.cache.password_env:
            password = env.get(config.cache.password_env)
    if url is None:
        return Auth(cfg)
    return Auth(cfg, RedisLimits(url, cfg.timeout_ms, password=password, cluster=cluster))


__all__ = ["Auth", "KeyEntry", "build_auth"]
