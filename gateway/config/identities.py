"""Sign-in identities: ``[[auth.jwt]]`` issuers whose bearer JWTs are accepted instead of a key,
and their ``[[auth.jwt.grants]]`` — which tenant a subject belongs to and what it may use
(docs/spec.md §29)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.config.key_paths import KeyPathErrors

#: the signature algorithms an issuer may list: asymmetric only. A JWKS is published, so a
#: symmetric (HS*) key in it would be a published secret, and an HS algorithm next to RSA keys
#: is the algorithm-confusion attack (RFC 8725 §2.1, §3.1); ``none`` is never accepted.
ASYMMETRIC = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)


@dataclass(frozen=True, slots=True)
class JwtGrantConfig:
    """One tenant an issuer's subjects may belong to, and what each such subject may use: the
    policy of a key, held by every subject of the tenant, with a budget of each subject's own."""

    tenant: str
    #: a subject whose groups claim lists one of these belongs to ``tenant`` (when its token
    #: names no tenant through ``tenant_claim``)
    groups: tuple[str, ...] = ()
    #: allowed model globs
    models: tuple[str, ...] = ("*",)
    #: per subject: requests and tokens per minute (None: unlimited)
    rpm: int | None = None
    tpm: int | None = None
    #: each subject's own spend limit in USD per ``subject_budget_period`` (docs/spec.md §20);
    #: the tenant's ``[[auth.tenants]]`` budget, when set, holds too
    subject_budget_usd: float | None = None
    subject_budget_period: Literal["day", "week", "month", "total"] = "month"
    #: MCP servers and tools (docs/spec.md §23), paths not modelled (§26), agents (§30): as a
    #: key's
    mcp_servers: tuple[str, ...] = ()
    mcp_tools: tuple[str, ...] = ("*",)
    passthrough: tuple[str, ...] | None = None
    #: the ``[[agents]]`` its subjects may call (docs/spec.md §30): none unless listed
    agents: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class JwtIssuerConfig:
    """One ``[[auth.jwt]]`` issuer (docs/spec.md §29)."""

    #: the ``iss`` its tokens carry, compared exactly
    issuer: str
    #: the ``aud`` values accepted (a token must name one of them)
    audiences: tuple[str, ...]
    #: where its signing keys are published (a JWK Set, RFC 7517 §5)
    jwks_url: str
    #: the ``alg`` values accepted, asymmetric only (:data:`ASYMMETRIC`)
    algorithms: tuple[str, ...] = ("RS256",)
    #: a claim naming the subject's tenant (a string); unset: the tenant comes from the groups
    tenant_claim: str | None = None
    #: the claim listing the subject's groups (an array of strings, or one string)
    groups_claim: str = "groups"
    #: a subject whose groups claim lists one of these is an admin (the live view, the admin API)
    admin_groups: tuple[str, ...] = ()
    #: clock skew allowed on ``exp``, ``nbf`` and ``iat``
    leeway_s: float = 30.0
    #: how often the JWKS is fetched again in the background
    jwks_refresh_s: float = 300.0
    grants: tuple[JwtGrantConfig, ...] = ()


def check_jwt(issuers: tuple[JwtIssuerConfig, ...], err: KeyPathErrors) -> None:
    """What the types cannot say of ``[[auth.jwt]]`` (docs/spec.md §29)."""
    seen: set[str] = set()
    for i, j in enumerate(issuers):
        p = f"auth.jwt[{i}]"
        if not j.issuer:
            err(f"{p}.issuer", "must not be empty")
        elif j.issuer in seen:
            err(f"{p}.issuer", f"duplicate issuer {j.issuer!r}")
        seen.add(j.issuer)
        if not j.audiences or not all(j.audiences):
            err(f"{p}.audiences", "must list at least one non-empty audience")
        if not j.jwks_url.startswith(("https://", "http://")):
            err(f"{p}.jwks_url", f"must be an http(s) URL, got {j.jwks_url!r}")
        if not j.algorithms:
            err(f"{p}.algorithms", "must list at least one algorithm")
        for alg in j.algorithms:
            if alg not in ASYMMETRIC:
                err(
                    f"{p}.algorithms",
                    f"{alg!r} is not accepted: only {', '.join(sorted(ASYMMETRIC))} "
                    "(no 'none', no HS*: RFC 8725 §3.1)",
                )
        if j.tenant_claim is not None and not j.tenant_claim:
            err(f"{p}.tenant_claim", "must name a claim")
        err.positive(j, p, "leeway_s", allow_zero=True)
        err.positive(j, p, "jwks_refresh_s")
        if not j.grants:
            err(f"{p}.grants", "at least one [[auth.jwt.grants]] entry is needed: a subject "
                "is served only in a tenant granted here")  # fmt: skip
        _check_grants(j.grants, f"{p}.grants", err)


def _check_grants(grants: tuple[JwtGrantConfig, ...], p: str, err: KeyPathErrors) -> None:
    tenants: set[str] = set()
    for i, g in enumerate(grants):
        q = f"{p}[{i}]"
        if not g.tenant:
            err(f"{q}.tenant", "must not be empty")
        elif g.tenant in tenants:
            err(f"{q}.tenant", f"tenant {g.tenant!r} is granted twice by this issuer")
        tenants.add(g.tenant)
        if not all(g.groups):
            err(f"{q}.groups", "group names must not be empty")
        if not g.models or not all(g.models):
            err(f"{q}.models", "must list at least one non-empty model glob")
        for name in ("rpm", "tpm"):
            value = getattr(g, name)
            if value is not None and value < 1:
                err(f"{q}.{name}", "must be >= 1")
        if g.subject_budget_usd is not None and not g.subject_budget_usd > 0:
            err(f"{q}.subject_budget_usd", "must be > 0")
        for glob in g.passthrough or ():
            if not glob.startswith(("/", "*")):
                err(
                    f"{q}.passthrough", f"each entry is a path glob starting with '/', got {glob!r}"
                )


__all__ = ["ASYMMETRIC", "JwtGrantConfig", "JwtIssuerConfig", "check_jwt"]
