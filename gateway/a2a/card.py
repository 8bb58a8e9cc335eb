"""An agent's card: which of its interfaces the gateway may call, and the card as the gateway
serves it (docs/spec.md §30).

**Where calls go.** The card names the URL of each interface (A2A §8.3: ``supportedInterfaces``;
0.3 cards: ``url`` with ``preferredTransport`` and ``additionalInterfaces``). The gateway uses an
interface only when its URL is on the origin of the configured ``url`` (scheme, host and port
alike, no user info, query or fragment, its path canonical, docs/spec.md §25): the URL it sends
to is that configured origin followed by the interface's path. A card naming another host — a
compromised agent, a card served by something else — moves no request there; such an
interface is left out (and logged). Only JSON-RPC and HTTP+JSON interfaces are relayed.

**What clients see.** Every relayed interface points at the gateway (``{gateway}/a2a/{name}``,
the same URL for both bindings: JSON-RPC is its ``POST``, HTTP+JSON its sub-paths), with the
interface's protocol version and tenant; the security schemes say the gateway's bearer key
(with ``auth.mode = "keys"``; none with auth off) — the agent's own credentials are the
gateway's business; the signatures are dropped (the card is no longer the one signed), and so
are push notifications and the extended card (refused here). Everything else — name, skills,
modes, provider — is the agent's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult

from gateway.config.backends import split_url
from gateway.target import is_canonical

log = logging.getLogger("gateway")

BINDINGS = ("JSONRPC", "HTTP+JSON")
#: the card's path under an agent's base URL (A2A §8.2) — and under the gateway's /a2a/{name}
WELL_KNOWN = "/.well-known/agent-card.json"
#: the gateway's own security scheme, by the name clients see
SCHEME = "gateway"


@dataclass(frozen=True, slots=True)
class Interface:
    binding: str
    #: "1.0" or "0.3" (what the SDKs call a legacy version: >= 0.3, < 1.0)
    version: str
    tenant: str
    #: where the gateway sends it: the configured origin and the card's path
    url: str


def _port(parts: SplitResult) -> int | None:
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.port if parts.port is not None else default


def same_origin(url: Any, base: SplitResult, origin: str) -> str | None:
    """``url`` rebuilt on ``origin`` when it is on the base URL's origin and its path is
    canonical; None otherwise.

    >>> base = split_url("http://agent:8000/x")
    >>> same_origin("http://AGENT:8000/rpc", base, "http://agent:8000")
    'http://agent:8000/rpc'
    >>> [same_origin(u, base, "http://agent:8000") for u in (
    ...     "http://evil:8000/rpc", "http://agent:9/rpc", "https://agent:8000/rpc",
    ...     "http://u@agent:8000/rpc", "http://agent:8000/a/../b", "http://agent:8000/r?x=1")]
    [None, None, None, None, None, None]
    """
    if not isinstance(url, str):
        return None
    parts = split_url(url)
    if parts is None or parts.scheme != base.scheme or parts.username or parts.password:
        return None
    if base.scheme == "mock":
        host_ok = parts.netloc == base.netloc
    else:
        host_ok = (parts.hostname or "") == (base.hostname or "") and _port(parts) == _port(base)
    if not host_ok or parts.query or parts.fragment or "#" in url or "?" in url:
        return None
    path = parts.path.rstrip("/")
    if path and not is_canonical(path.encode("utf-8", "surrogateescape")):
        return None
    return origin + path


def _version(raw: Any) -> str | None:
    """1.x → "1.0", 0.3.x → "0.3"; other versions are not relayed."""
    text = str(raw or "")
    if text == "1" or text.startswith("1."):
        return "1.0"
    if text.startswith("0.3"):
        return "0.3"
    return None


def _listed(card: dict[str, Any]) -> list[tuple[Any, Any, Any, Any]]:
    """(binding, version, tenant, url) of every interface the card names, preferred first."""
    out = []
    for iface in card.get("supportedInterfaces") or ():
        if isinstance(iface, dict):
            out.append(
                (
                    iface.get("protocolBinding"),
                    iface.get("protocolVersion"),
                    iface.get("tenant") or "",
                    iface.get("url"),
                )
            )
    if "url" in card:  # a 0.3 card (or one written for both)
        version = card.get("protocolVersion") or "0.3"
        out.append((card.get("preferredTransport") or "JSONRPC", version, "", card["url"]))
        for extra in card.get("additionalInterfaces") or ():
            if isinstance(extra, dict):
                out.append((extra.get("transport"), version, "", extra.get("url")))
    return out


def interfaces(card: dict[str, Any], base_url: str, agent: str) -> list[Interface]:
    """The card's interfaces the gateway relays (see the module docstring)."""
    base = split_url(base_url)
    assert base is not None  # checked with the config
    origin = f"{base.scheme}://{base.netloc}"
    found: list[Interface] = []
    for binding, raw_version, tenant, url in _listed(card):
        version = _version(raw_version)
        if binding not in BINDINGS or version is None or not isinstance(tenant, str):
            continue
        target = same_origin(url, base, origin)
        if target is None:
            log.warning(
                "agent %s: its card names an interface off its configured origin or not in "
                "canonical form (%r); it is not used",
                agent,
                str(url)[:200],
            )
            continue
        iface = Interface(str(binding), version, tenant, target)
        if iface not in found:
            found.append(iface)
    return found


def served(
    card: dict[str, Any], found: list[Interface], public: str, auth_on: bool
) -> dict[str, Any]:
    """The card as the gateway serves it at ``public`` (``{gateway}/a2a/{name}``); ``card`` is
    a copy the caller may change."""
    modern = "supportedInterfaces" in card  # else a 0.3 card: its security in 0.3's words
    card["supportedInterfaces"] = [
        {"url": public, "protocolBinding": i.binding, "protocolVersion": i.version}
        | ({"tenant": i.tenant} if i.tenant else {})
        for i in found
    ]
    if "url" in card:  # the 0.3 fields, for 0.3 clients
        legacy = [i for i in found if i.version == "0.3"] or found
        card["url"] = public
        if legacy:
            card["preferredTransport"] = legacy[0].binding
        card["additionalInterfaces"] = [
            {"transport": b, "url": public} for b in dict.fromkeys(i.binding for i in legacy)
        ]
    for key in ("signatures", "security", "securityRequirements", "securitySchemes"):
        card.pop(key, None)
    card.pop("supportsAuthenticatedExtendedCard", None)
    for skill in card.get("skills") or ():
        if isinstance(skill, dict):  # they name the agent's own schemes
            skill.pop("security", None)
            skill.pop("securityRequirements", None)
    caps = card.get("capabilities")
    caps = card["capabilities"] = caps if isinstance(caps, dict) else {}
    caps["pushNotifications"] = False
    caps.pop("extendedAgentCard", None)
    if auth_on:
        description = "the gateway's API key (Authorization: Bearer)"
        scheme: dict[str, Any]
        if modern:
            scheme = {"httpAuthSecurityScheme": {"scheme": "Bearer", "description": description}}
            card["securitySchemes"] = {SCHEME: scheme}
            card["securityRequirements"] = [{"schemes": {SCHEME: {"list": []}}}]
        else:
            scheme = {"type": "http", "scheme": "bearer", "description": description}
            card["securitySchemes"] = {SCHEME: scheme}
            card["security"] = [{SCHEME: []}]
    return card


__all__ = ["BINDINGS", "SCHEME", "WELL_KNOWN", "Interface", "interfaces", "same_origin", "served"]
