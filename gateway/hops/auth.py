"""The auth hop: who is calling, what they may call, and whether they have budget
(docs/spec.md §12, §20).

``auth.mode = "off"``: nobody is refused and there is no tenant; the hop still runs and is timed
so every trace has the same chain (docs/spec.md §6).

``auth.mode = "keys"``: the client's key (``Authorization: Bearer``, ``api-key`` or ``x-api-key``,
read by the edge, never forwarded or logged) is hashed with sha256 and looked up among the
configured digests; the entry found is compared again with :func:`hmac.compare_digest`. The
lookup is by digest, so its timing depends only on the sha256 of what the caller sent — which
tells an attacker nothing about any configured key — and the gateway never holds a key itself.
Then, per key entry:

- no key → 401 ``missing_api_key``; an unknown key → 401 ``invalid_api_key``;
- the model (known once the router parsed the body) outside the key's ``models`` globs → 403
  ``model_not_allowed`` (checked by the router through ``ctx.permits``);
- ``rpm`` / ``tpm`` (:mod:`gateway.budgets.limits`) over → 429 ``rate_limit_exceeded`` with
  ``Retry-After`` and OpenAI's ``x-ratelimit-*`` headers, which also go out on every answer to a
  limited key;
- a budget (the key's ``budget_usd``, its tenant's ``[[auth.tenants]]``) that this request's
  worst case would pass → 429 ``insufficient_quota`` / ``budget_exceeded`` with what was spent,
  the budget and its reset; answers to a key with a budget carry
  ``x-gateway-budget-remaining-usd`` (the tighter of key and tenant, before this request).

A model call's tokens and cost are known only from its body, so for a key with ``tpm`` or a
budget its limits are checked by :meth:`Auth.admit` once the router parsed the body: budgets,
tokens and requests in one step (one Redis script), reserving the request's worst case
(:func:`gateway.budgets.spend.estimate`). The end of the request (:meth:`Auth.finished`)
replaces the reservation with the usage the upstream reported and its cost; a cache hit costs
nothing; an answer that completed without reporting usage (an upstream that ignored the
``stream_options.include_usage`` the gateway asked for) keeps its reservation as its cost; a
stream the client cut is charged what was relayed
(:func:`gateway.budgets.spend.charge_relayed`). A key with a budget may not call a model without
a price (403 ``model_not_priced``: it could spend unmetered), and may not use the passthrough
paths (``/v1/*`` that are no model call: nothing meters them) unless it is an admin key — 403
``budget_passthrough``; reading or cancelling a stored response (docs/spec.md §22) spends
nothing and stays open, and files, uploads, batches and Anthropic message batches are metered
per batch (:mod:`gateway.budgets.metering`, gateway/stateful/batch_checks.py, docs/spec.md §24).

The tenant names the cache scope (docs/spec.md §10), the ``gateway.tenant`` span attribute, the
access log's ``tenant``, the cost metric and the live view's records.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import hmac
import logging
import math
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from gateway.budgets.limits import (
    Allowance,
    Budget,
    Limits,
    Spent,
    Verdict,
    new_rid,
    reset_text,
    spend_key,
)
from gateway.budgets.memory_limits import MemoryLimits
from gateway.budgets.redis_limits import RedisLimits
from gateway.budgets.spend import PERIOD_TEXT, Prices, cost, estimate, nano, unreported, usd_text
from gateway.config import AuthConfig, AuthKeyConfig, Config, TenantConfig
from gateway.context import Call, RequestContext
from gateway.errors import Forbidden, RateLimited, Unauthorized
from gateway.hops.ownership import response_path_id
from gateway.identities import KeySets, SignIns, Subject, looks_like_jwt
from gateway.keys import store_enabled
from gateway.keys.records import OwnGrants
from gateway.memo import remember
from gateway.protocols import BY_PATH
from gateway.store.connect import shared_redis

log = logging.getLogger("gateway.auth")

_PERMIT_CACHE_MAX = 1024
REMAINING_HEADER = b"x-gateway-budget-remaining-usd"
#: stored-response paths (docs/spec.md §22) a key with a budget may use: they spend nothing
_STORED_RESPONSE_OPS = frozenset({("GET", ""), ("DELETE", ""), ("POST", "cancel")})
_STORED_RESPONSE_OPS |= {("GET", "input_items")}


class StoredKeys(Protocol):
    """The key store's keys as the hop finds them (gateway/hops/stored_keys.py)."""

    def find(self, digest: bytes) -> KeyEntry | None:
        """The entry of a live secret's digest; None: unknown (raises 401 for a blocked or
        expired key)."""
        ...

    def entry(self, record: dict[str, Any]) -> KeyEntry:
        """The entry of a key record (built once per change of the index)."""
        ...

    def tenant(self, name: str) -> Budget | None:
        """A tenant's budget (the config's, else the key store's)."""
        ...

    def budgets(self) -> list[tuple[str, str | None, Budget]]:
        """(tenant, key name or None for the tenant's, budget) of every budget it holds."""
        ...


def _tag(tenant: str) -> str:
    """The tenant as a Redis hash tag (every key of a tenant, and its budget, in one slot)."""
    return tenant.replace("{", "(").replace("}", ")")


def tenant_budget(t: TenantConfig) -> Budget | None:
    if t.budget_usd is None:
        return None
    return Budget(
        spend_key(_tag(t.name), "tenant"), f"tenant {t.name!r}", t.budget_usd, t.budget_period
    )


class KeyEntry:
    """One ``[[auth.keys]]`` entry as the hop uses it."""

    __slots__ = (
        "_allowed",
        "admin",
        "allowance",
        "budgeted",
        "budgets_only",
        "digest",
        "globs",
        "limit_id",
        "metered",
        "own",
        "rpm",
        "rpm_text",
        "tenant",
        "tpm",
        "tpm_text",
    )

    def __init__(
        self, cfg: AuthKeyConfig, of_tenant: Budget | None = None, limit_id: str | None = None
    ) -> None:
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
        #: (a key of the store: named by its id, so a rotation keeps its counts and spend)
        self.limit_id = limit_id or cfg.sha256[:32].lower()
        own = None
        if cfg.budget_usd is not None:
            label = f"key {cfg.tenant}/{self.limit_id[:12]}"
            owner = "key:" + self.limit_id
            own = Budget(
                spend_key(_tag(cfg.tenant), owner), label, cfg.budget_usd, cfg.budget_period
            )
        self.allowance = Allowance(
            self.limit_id, _tag(cfg.tenant), self.rpm, self.tpm, own, of_tenant
        )
        #: its budgets without its rpm and tpm: what a batch is checked and debited against
        #: (docs/spec.md §24: a batch is no request per minute, and its tokens no tpm)
        self.budgets_only = Allowance(self.limit_id, _tag(cfg.tenant), None, None, own, of_tenant)
        #: a budget of its own or of its tenant
        self.budgeted = own is not None or of_tenant is not None
        #: its model calls reserve before going upstream (tokens, cost): checked by admit()
        self.metered = self.budgeted or self.tpm is not None
        self._allowed: dict[str, bool] = {}
        #: a key of the key store: its MCP, passthrough and agent grants (docs/spec.md §28);
        #: None: the config's, found by its digest
        self.own: OwnGrants | None = None

    def permits(self, model: str) -> bool:
        allowed = self._allowed.get(model)
        if allowed is None:
            allowed = any(fnmatch.fnmatchcase(model, g) for g in self.globs)
            remember(self._allowed, model, allowed, _PERMIT_CACHE_MAX)  # client strings: bounded
        return allowed

    @property
    def limited(self) -> bool:
        return self.rpm is not None or self.metered


class Auth:
    def __init__(
        self,
        cfg: AuthConfig | None = None,
        limits: Limits | None = None,
        prices: Prices | None = None,
        key_sets: KeySets | None = None,
    ) -> None:
        cfg = cfg or AuthConfig()
        self.mode = cfg.mode
        #: ``[[prices]]``: named on every request's answer, which is priced at its end
        self.prices = prices if prices is not None else Prices()
        #: what each answer is priced by: None without ``[[prices]]`` (no model has a price,
        #: so nothing costs), and the end of a request skips the lookups
        self._pricing = self.prices if self.prices else None
        #: tenant -> its budget (``[[auth.tenants]]`` with ``budget_usd``)
        self.tenant_budgets: dict[str, Budget] = {}
        for t in cfg.tenants:
            budget = tenant_budget(t)
            if budget is not None:
                self.tenant_budgets[t.name] = budget
        self._keys: dict[bytes, KeyEntry] = {}
        for k in cfg.keys:
            entry = KeyEntry(k, self.tenant_budgets.get(k.tenant))
            self._keys[entry.digest] = entry
        self.limits: Limits = limits if limits is not None else MemoryLimits()
        #: bearer JWTs of the ``[[auth.jwt]]`` issuers (docs/spec.md §29; None: none listed)
        self.sign_ins: SignIns[KeyEntry] | None = None
        if cfg.jwt:
            self.sign_ins = SignIns(cfg.jwt, key_sets or KeySets(), self._subject_entry)
        self._subjects_metered = any(
            g.tpm or g.subject_budget_usd or g.tenant in self.tenant_budgets
            for j in cfg.jwt
            for g in j.grants
        )
        #: background settlements (Redis) still running; kept so they are not garbage-collected
        self._pending: set[asyncio.Task[None]] = set()
        self._unchecked = False
        #: the keys of the key store (docs/spec.md §28): a digest's entry, found in memory
        self.stored: StoredKeys | None = None

    @property
    def fallback(self) -> bool:
        """Whether limits are counted per process because their Redis is unreachable."""
        return self.limits.fallback

    @property
    def debits(self) -> bool:
        """Whether any key reserves (tpm, budgets): the request's end then settles its usage."""
        stored = self.stored is not None  # a key made at runtime may get a budget
        return stored or self._subjects_metered or any(k.metered for k in self._keys.values())

    async def check(self, ctx: RequestContext, passthrough: bool = False) -> None:
        """Identify the caller (401) and check its limits (429): ``ctx.tenant``.

        A model call of a key with ``tpm`` or a budget is checked by :meth:`admit` instead,
        once its body is known. ``passthrough``: a path that is no model call (403 for a key
        with a budget, unless admin)."""
        ctx.answer.pricing = self._pricing
        if self.mode == "off":
            ctx.timeline.auth_done = time.perf_counter()
            return
        entry = self.identify(ctx.credential)
        ctx.tenant = entry.tenant
        ctx.admin = entry.admin
        ctx.permits = entry.permits
        ctx.limit_key = entry
        try:
            if passthrough and entry.budgeted and not entry.admin and not _stored_response(ctx):
                raise Forbidden(
                    "this API key has a budget, and only model calls are metered: other /v1 "
                    "paths need an admin key (docs/spec.md §20)",
                    code="budget_passthrough",
                )
            model_call = not passthrough and ctx.method == "POST" and ctx.path in BY_PATH
            if entry.metered and model_call:
                ctx.answer.admission_due = True  # admit() once the body is parsed
            elif entry.limited:
                limits = self.limits
                verdict = limits.admit_now(entry.allowance, 0, 0)  # per process: no coroutine
                if verdict is None:
                    verdict = await limits.admit(entry.allowance, 0, 0)
                _admitted(ctx, entry, verdict, 0, 0)
        finally:
            ctx.timeline.auth_done = time.perf_counter()

    async def admit(self, ctx: RequestContext, call: Call, upstream: bool) -> None:
        """A model call's limits once its body is parsed: budgets, tpm and rpm in one step,
        reserving its worst case (docs/spec.md §20). ``upstream``: it may go upstream (a cache
        hit reserves nothing)."""
        entry = self._entry(ctx)
        if entry is None or not entry.metered:
            return
        ctx.answer.admission_due = False  # admitted (below) or refused: no longer due
        tokens = reserve = 0
        if upstream:
            api = BY_PATH[call.path]
            limit = call.route.config.max_tokens_cap
            most_in, most_out = estimate(
                len(call.body), call.payload, api.operation, api.max_tokens_fields, limit
            )
            if entry.tpm is not None:  # more than the whole tpm waits for a full bucket
                tokens = min(most_in + most_out, entry.tpm)
            if entry.budgeted and (most_in or most_out):
                price = self.prices.for_request(ctx)
                if price is None:
                    raise Forbidden(
                        f"this API key has a budget and model {ctx.model!r} has no price: "
                        "add a [[prices]] entry for it (docs/spec.md §20)",
                        code="model_not_priced",
                    )
                reserve = price.reserve_nano(most_in, most_out)
        limits = self.limits
        rid = new_rid() if tokens or reserve else ""
        verdict = limits.admit_now(entry.allowance, tokens, reserve, rid)  # no coroutine
        if verdict is None:
            verdict = await limits.admit(entry.allowance, tokens, reserve, rid)
        _admitted(ctx, entry, verdict, tokens, reserve)
        answer = ctx.answer
        answer.reserved_tokens = tokens
        answer.reserved_nano = reserve
        answer.reservation = rid

    async def admit_batch(self, ctx: RequestContext, worst_nano: int) -> None:
        """A batch's worst case against the caller's budgets (docs/spec.md §24): 429
        ``budget_exceeded`` when it does not fit what is left; nothing stays reserved."""
        entry = self._entry(ctx)
        if entry is None or not entry.budgeted:
            return
        rid = new_rid()
        verdict = await self.limits.admit(entry.budgets_only, 0, worst_nano, rid)
        if not verdict.allowed:
            raise _over_budget(verdict, [], worst_nano)
        await self.limits.settle(entry.budgets_only, Spent(0, 0, worst_nano, 0, rid=rid))

    async def debit_batch(self, ctx: RequestContext, rid: str, cost_nano: int) -> None:
        """A batch's cost, read from its results, debited from the caller's budgets under
        ``rid`` (derived from the batch: applied at most once, docs/spec.md §24)."""
        entry = self._entry(ctx)
        if entry is not None and entry.budgeted and cost_nano > 0:
            await self.limits.settle(entry.budgets_only, Spent(0, 0, 0, cost_nano, rid=rid))

    def _entry(self, ctx: RequestContext) -> KeyEntry | None:
        """The entry of the key the request was identified by (None: auth off)."""
        key = ctx.limit_key
        if key is None or isinstance(key, KeyEntry):
            return key
        return self._keys[key.digest]

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
            if self.stored is not None and (found := self.stored.find(digest)) is not None:
                return found  # a key of the key store (docs/spec.md §28)
            if self.sign_ins is not None and looks_like_jwt(credential):
                return self.sign_ins.identify(credential, digest)  # docs/spec.md §29
            raise Unauthorized("the API key is not valid for this gateway", code="invalid_api_key")
        return entry

    def _subject_entry(self, subject: Subject) -> KeyEntry:
        """A signed-in subject as a key entry: its grant's models and limits, its own rpm, tpm
        and budget (named by its own digest), its tenant's budget; found by its grant's digest
        for the grants of MCP servers and unmodelled paths (docs/spec.md §29)."""
        entry = KeyEntry(subject.policy, self.tenant_budgets.get(subject.policy.tenant))
        entry.digest = subject.grant_digest
        return entry

    def finished(self, ctx: RequestContext, _edges: object = None) -> None:
        """A telemetry sink: replace the request's reservation with what it really used."""
        entry = self._entry(ctx)
        if entry is None or not entry.metered:
            return
        if ctx.answer.admission_due and ctx.call is not None and not self._unchecked:
            self._unchecked = True  # the request path never called admit(): say so, once
            log.error(
                "auth: a model call of a key with tpm or a budget went through without "
                "Auth.admit (the pipeline must call it once the body is parsed): those limits "
                "are debited but not enforced"
            )
        if ctx.answer.pricing is None:  # a context made for one part of a session (realtime)
            ctx.answer.pricing = self.prices
        spent = used(ctx, entry.budgeted)
        if not (spent.tokens or spent.cost or spent.reserved_tokens or spent.reserved_cost):
            return
        limits = self.limits
        if limits.settle_now(entry.allowance, spent):  # per process: no coroutine
            return
        task = asyncio.get_running_loop().create_task(limits.settle(entry.allowance, spent))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def budget_ratios(self) -> dict[tuple[str, ...], float]:
        """``gateway_budget_used_ratio{tenant}``: spent / budget this period, as last seen."""
        return {
            (name,): self.limits.view(b)[1] / b.limit for name, b in self.tenant_budgets.items()
        }

    async def spend(self) -> dict[str, Any]:
        """``GET /_gateway/api/spend``: every budget, per tenant and per key (named by tenant and
        a digest prefix, never the key), with its period, spent, reserved and reset."""
        owners: list[tuple[str, str | None, Budget]] = [
            (name, None, b) for name, b in self.tenant_budgets.items()
        ]
        if self.stored is not None:
            owners += self.stored.budgets()
        for entry in self._keys.values():
            own = entry.allowance.key_budget
            if own is not None:
                owners.append((entry.tenant, entry.limit_id[:12], own))
        rows, shared = await self.limits.report([b for _, _, b in owners])
        tenants, keys = [], []
        for (tenant, key, b), (start, spent, reserved, reset) in zip(owners, rows, strict=True):
            row = _spend_row(b, start, spent, reserved, reset)
            if key is None:
                tenants.append({"tenant": tenant, **row})
            else:
                keys.append({"tenant": tenant, "key": key, **row})
        return {"shared": shared, "fallback": self.fallback, "tenants": tenants, "keys": keys}

    async def drain(self) -> None:
        """Wait (a while) for the settlements still running."""
        if self._pending:
            await asyncio.wait(self._pending, timeout=1.0)

    async def aclose(self) -> None:
        await self.drain()
        await self.limits.aclose()


def used(ctx: RequestContext, priced: bool) -> Spent:
    """What a finished request reserved and really used (docs/spec.md §20): nothing for a
    cache hit; its usage and cost; its reservation when it completed without telling usage."""
    answer = ctx.answer
    spent = Spent(answer.reserved_tokens, 0, answer.reserved_nano, 0, answer.reservation)
    if ctx.cache.result == "hit":
        return spent
    usage = answer.tokens
    if usage.reported:
        spent.tokens = usage.total
    elif unreported(ctx):  # complete, but the upstream did not say: the worst case it was given
        spent.tokens = spent.reserved_tokens
    else:  # nothing used (a failed call; a batch's results are debited by their read)
        return spent
    if priced:
        # the one figure the span, the access log and the metric show: the reservation of an
        # answer that completed unreported, else what its usage costs
        usd = cost(ctx)
        spent.cost = nano(usd) if usd else 0
    return spent


def _admitted(ctx: RequestContext, entry: KeyEntry, v: Verdict, tokens: int, reserve: int) -> None:
    """The limits' headers on the answer, or the refusal (429) with them."""
    headers = _limit_headers(entry, v)
    if not v.allowed:
        raise _refusal(entry, v, headers, tokens, reserve)
    ctx.response_headers.extend(headers)


def _stored_response(ctx: RequestContext) -> bool:
    """A stored response read, deleted or cancelled (docs/spec.md §22): nothing is spent."""
    rid = response_path_id(ctx.path)
    if rid is None:
        return False
    rest = ctx.path.split(rid, 1)[1].strip("/")
    return (ctx.method, rest) in _STORED_RESPONSE_OPS


def _iso(at: int) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spend_row(b: Budget, start: int, spent: int, reserved: int, reset: int) -> dict[str, Any]:
    return {
        "period": b.period,
        "period_start": _iso(start) if reset else None,
        "resets_at": _iso(reset) if reset else None,
        "budget_usd": b.usd,
        "spent_usd": spent / 1e9,
        "reserved_usd": reserved / 1e9,
        "remaining_usd": max(b.limit - spent - reserved, 0) / 1e9,
    }


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
    if v.budget_left is not None:
        headers.append((REMAINING_HEADER, b"%.6f" % (max(v.budget_left, 0) / 1e9)))
    return headers


def _refusal(
    entry: KeyEntry, v: Verdict, headers: list[tuple[bytes, bytes]], tokens: int, reserve: int
) -> RateLimited:
    retry = max(1, math.ceil(v.retry_after_s))
    if v.refused_by == "budget":
        return _over_budget(v, headers, reserve)
    if v.refused_by == "tokens":
        what = f"tokens per minute (tpm {entry.tpm})"
        if tokens:
            what += f"; this request may use up to {tokens} tokens"
    else:
        what = f"requests per minute (rpm {entry.rpm})"
    return RateLimited(
        f"rate limit reached for tenant {entry.tenant!r} on {what}; retry in {retry} s",
        code="rate_limit_exceeded",
        headers=[(b"retry-after", str(retry).encode()), *headers],
    )


class BudgetExceeded(RateLimited):
    """429 ``insufficient_quota`` (docs/spec.md §20): the request's worst case would pass a
    budget."""

    type = "insufficient_quota"


def _over_budget(v: Verdict, headers: list[tuple[bytes, bytes]], reserve: int) -> BudgetExceeded:
    b = v.budget
    assert b is not None
    message = f"{b.label} spent {usd_text(v.spent)} of {usd_text(b.limit)} {PERIOD_TEXT[b.code]}"
    message += f"; resets {_iso(v.reset_at)}" if v.reset_at else "; it does not reset"
    if reserve:
        message += f" (this request may cost up to {usd_text(reserve)}"
        if v.spent + reserve <= b.limit:
            message += ", and requests in flight hold the rest"
        message += ")"
    extra = [(REMAINING_HEADER, b"%.6f" % (max(v.budget_left or 0, 0) / 1e9))]
    if v.retry_after_s > 0:
        extra.append((b"retry-after", str(math.ceil(v.retry_after_s)).encode()))
    headers = [h for h in headers if h[0] != REMAINING_HEADER]
    refused = BudgetExceeded(message, code="budget_exceeded", headers=[*extra, *headers])
    refused.should_retry = b.code != 0  # "total" never resets
    return refused


def build_auth(
    config: Config,
    environ: Mapping[str, str] | None = None,
    limits: Limits | None = None,
    key_sets: KeySets | None = None,
) -> Auth:
    """The hop for a config: ``limits`` when given (the process's, kept across reloads), else
    :func:`build_limits`; the JWK Sets of ``[[auth.jwt]]`` from ``key_sets``."""
    cfg = config.auth
    prices = Prices(config.prices)
    if cfg.mode == "off":
        return Auth(cfg, prices=prices)
    if limits is None:
        limits = build_limits(config, environ)
    return Auth(cfg, limits, prices, key_sets)


def limited(config: Config) -> bool:
    """Whether any key or grant has rpm, tpm or a budget, or any tenant a budget (or keys
    made at runtime may: the key store, docs/spec.md §28)."""
    policies = config.auth.policies()
    return (
        store_enabled(config)
        or any(t.budget_usd for t in config.auth.tenants)
        or any(k.budget_usd or k.rpm or k.tpm for k in policies)
    )


def build_limits(config: Config, environ: Mapping[str, str] | None = None) -> Limits | None:
    """Limits in Redis when some are set and a Redis is named (``auth.redis_url``, else the
    ``[cache]`` Redis), else per process (None). Each limiter command waits at most
    ``auth.timeout_ms``, whichever Redis it is."""
    cfg = config.auth
    if cfg.mode == "off" or not limited(config):
        return None
    redis = shared_redis(config, environ)
    if redis is None:
        return None
    return RedisLimits(redis.url, cfg.timeout_ms, password=redis.password, cluster=redis.cluster)


__all__ = ["Auth", "BudgetExceeded", "KeyEntry", "build_auth", "build_limits", "limited", "used"]
