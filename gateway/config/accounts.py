"""Who may call and what it costs: ``[auth]`` with its ``[[auth.keys]]`` and
``[[auth.tenants]]`` (limits, budgets, MCP and passthrough grants), and ``[[prices]]``
(docs/spec.md §4, §20, §23, §26)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from gateway.config.identities import JwtGrantConfig, JwtIssuerConfig


@dataclass(frozen=True, slots=True)
class AuthKeyConfig:
    tenant: str
    #: sha256 hex digest of the key (``gateway hash-key KEY``); the key itself is never stored
    sha256: str
    #: allowed model globs
    models: tuple[str, ...] = ("*",)
    #: requests per minute (None: unlimited)
    rpm: int | None = None
    #: tokens per minute, input + output, debited from the usage the upstream reports
    tpm: int | None = None
    #: may open the live view (``/_gateway/``) when auth is on
    admin: bool = False
    #: spend limit in USD per ``budget_period`` (docs/spec.md §20; None: no budget)
    budget_usd: float | None = None
    budget_period: Literal["day", "week", "month", "total"] = "month"
    #: the ``[[mcp_servers]]`` this key may use (globs over their names; docs/spec.md §23):
    #: none unless listed
    mcp_servers: tuple[str, ...] = ()
    #: the tools it may call there, as globs over ``{server}__{tool}``
    mcp_tools: tuple[str, ...] = ("*",)
    #: the paths the gateway does not model that this key may reach, globs over the whole
    #: path (docs/spec.md §26); None: none, or every path for an admin key
    passthrough: tuple[str, ...] | None = None
    #: the ``[[agents]]`` this key may call (globs over their names; docs/spec.md §30): none
    #: unless listed
    agents: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """A budget shared by every key of one tenant (docs/spec.md §20)."""

    name: str
    budget_usd: float | None = None
    budget_period: Literal["day", "week", "month", "total"] = "month"
    #: narrow what its keys may use on MCP servers (docs/spec.md §23; None: as the key says)
    mcp_servers: tuple[str, ...] | None = None
    mcp_tools: tuple[str, ...] | None = None
    #: narrow the paths its keys may reach unmodelled (docs/spec.md §26; None: as the key says)
    passthrough: tuple[str, ...] | None = None
    #: narrow the agents its keys may call (docs/spec.md §30; None: as the key says)
    agents: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class AuthConfig:
    mode: Literal["off", "keys"] = "off"
    #: limits shared by replicas; None: the [cache] url when cache.backend = "redis", else
    #: in-process counting
    redis_url: str | None = None
    #: per Redis command of the limiter; a dead Redis costs at most this (then a breaker)
    timeout_ms: float = 50.0
    keys: tuple[AuthKeyConfig, ...] = ()
    tenants: tuple[TenantConfig, ...] = ()
    #: sign-in identities: issuers whose bearer JWTs are accepted (docs/spec.md §29)
    jwt: tuple[JwtIssuerConfig, ...] = ()

    def policies(self) -> tuple[AuthKeyConfig, ...]:
        """Every key policy: the ``[[auth.keys]]``, then each ``[[auth.jwt.grants]]`` entry as
        the key its subjects hold (:func:`grant_key`) — what the grants of MCP servers and
        unmodelled paths are read from, by the policy's digest."""
        return self.keys + tuple(grant_key(j, g) for j in self.jwt for g in j.grants)


def grant_key(issuer: JwtIssuerConfig, grant: JwtGrantConfig) -> AuthKeyConfig:
    """A grant as a key policy (docs/spec.md §29): no secret hashes to its digest, which only
    names the policy (a subject's own limits and budget are named apart, per subject)."""
    name = f"jwt grant\0{issuer.issuer}\0{grant.tenant}".encode()
    return AuthKeyConfig(
        tenant=grant.tenant,
        sha256=hashlib.sha256(name).hexdigest(),
        models=grant.models,
        rpm=grant.rpm,
        tpm=grant.tpm,
        budget_usd=grant.subject_budget_usd,
        budget_period=grant.subject_budget_period,
        mcp_servers=grant.mcp_servers,
        mcp_tools=grant.mcp_tools,
        passthrough=grant.passthrough,
        agents=grant.agents,
    )


@dataclass(frozen=True, slots=True)
class PriceConfig:
    """USD per 1M tokens for the models matching ``models`` (docs/spec.md §20)."""

    models: tuple[str, ...]
    input: float
    output: float
    #: prompt tokens served from the provider's prompt cache [input]
    cached_input: float | None = None
    #: Anthropic ``cache_creation_input_tokens`` [input]
    cache_write: float | None = None
    #: a batch's usage is priced at the list price times this (OpenAI and Anthropic bill
    #: batches at half price; docs/spec.md §24)
    batch_discount: float = 0.5


__all__ = ["AuthConfig", "AuthKeyConfig", "PriceConfig", "TenantConfig", "grant_key"]
