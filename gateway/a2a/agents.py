"""One upstream A2A agent: its pooled transport, its credentials and its card (docs/spec.md §30).

The gateway's own HTTP/1.1 client (:mod:`gateway.transports`) carries A2A too, so a call's
upstream window is taken at the socket like a model call's; each read waits at most the agent's
``timeout_s``. ``url = "mock://"`` is the built-in echo agent (:mod:`gateway.mock.agent`), in
process.

The card is read from ``{url}/.well-known/agent-card.json`` when first needed and again after
:data:`CARD_TTL_S` (one read at a time per process); an agent that cannot be read then keeps
its last card. Credentials come from the config only (``api_key_env`` as ``Authorization:
Bearer``): of what the client sent, only A2A's own headers go on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, cast

import orjson

from gateway.a2a.card import WELL_KNOWN, Interface, interfaces
from gateway.config import AgentConfig, BackendConfig
from gateway.errors import GatewayError, UpstreamError
from gateway.mock.agent import BuiltinAgent
from gateway.routes import Backend, bearer_from_env
from gateway.transports import Transport, UpstreamResponse, for_backend
from gateway.types import RawHeaders

log = logging.getLogger("gateway")

#: a card is read again after this long
CARD_TTL_S = 300.0
#: a bigger card is refused
MAX_CARD_BYTES = 1024 * 1024
#: the client's headers that go to the agent (A2A §3.2.6 service parameters, SSE negotiation)
FORWARDED = frozenset({b"accept", b"a2a-version", b"a2a-extensions", b"last-event-id"})


class Card:
    """A card as read, and the interfaces the gateway relays."""

    __slots__ = ("body", "interfaces", "read_at")

    def __init__(self, body: bytes, found: list[Interface], read_at: float) -> None:
        self.body = body
        self.interfaces = found
        self.read_at = read_at

    def parsed(self) -> dict[str, Any]:
        """A fresh copy of the card (the caller may change it)."""
        return cast(dict[str, Any], orjson.loads(self.body))

    def url(self, binding: str, version: str) -> tuple[str, str] | None:
        """(URL, tenant) of the interface for ``binding``: the one of ``version`` if listed,
        else the binding's first one (the agent then answers what it makes of the call)."""
        same = [i for i in self.interfaces if i.binding == binding]
        for i in same:
            if i.version == version:
                return i.url, i.tenant
        return (same[0].url, same[0].tenant) if same else None


class Agent:
    __slots__ = ("_card", "_reading", "backend", "config", "credentials", "name", "transport")

    def __init__(self, cfg: AgentConfig, env: Mapping[str, str]) -> None:
        self.config = cfg
        self.name = cfg.name
        backend = BackendConfig(
            f"a2a:{cfg.name}", cfg.url, provider="a2a", connect_timeout_s=min(5.0, cfg.timeout_s),
            read_timeout_s=cfg.timeout_s, stream_idle_timeout_s=cfg.timeout_s, max_connections=100,
        )  # fmt: skip
        if cfg.url.startswith("mock:"):
            self.transport = cast(Transport, BuiltinAgent(cfg.url))
        else:
            self.transport = for_backend(backend)
        #: names the attempts (spans, metrics, the access log) as the agent
        self.backend = Backend(backend, self.transport, {})
        self.backend.name = cfg.name
        self.credentials = tuple(bearer_from_env(env, cfg.api_key_env, f"agent {cfg.name}"))
        self._card: Card | None = None
        self._reading = asyncio.Lock()

    def headers(self, client: RawHeaders) -> list[tuple[str, str]]:
        """The client's A2A headers, then this agent's credentials."""
        out = [
            (k.decode("latin-1").lower(), v.decode("latin-1"))
            for k, v in client
            if k.lower() in FORWARDED
        ]
        out.extend(self.credentials)
        return out

    async def card(self) -> Card:
        """The agent's card: cached, read again after :data:`CARD_TTL_S`; the last one stays
        while the agent cannot be read (502 ``a2a_card_unavailable`` when none was read)."""
        card = self._card
        if card is not None and time.monotonic() - card.read_at < CARD_TTL_S:
            return card
        async with self._reading:
            card = self._card
            if card is not None and time.monotonic() - card.read_at < CARD_TTL_S:
                return card
            try:
                card = self._card = await self._read_card()
            except GatewayError as exc:
                if card is None:
                    raise UpstreamError(
                        f"the card of agent {self.name!r} could not be read: {exc.message}",
                        code="a2a_card_unavailable",
                    ) from exc
                log.warning(
                    "agent %s: card not read again (%s); the last one stays", self.name, exc
                )
                card.read_at = time.monotonic()  # not asked again at once
        return card

    async def _read_card(self) -> Card:
        url = self.config.url.rstrip("/") + WELL_KNOWN
        headers = [("accept", "application/json"), *self.credentials]
        resp = await asyncio.wait_for(
            self.transport.request("GET", url, headers, None), self.config.timeout_s
        )
        body = await read_capped(resp, MAX_CARD_BYTES, f"the card of agent {self.name!r}")
        if resp.status != 200:
            raise UpstreamError(f"it answered {resp.status}", code="a2a_card_unavailable")
        try:
            card = orjson.loads(body)
        except orjson.JSONDecodeError:
            card = None
        if not isinstance(card, dict):
            raise UpstreamError("it is not a JSON object", code="a2a_card_unavailable")
        found = interfaces(card, self.config.url, self.name)
        if not found:
            raise UpstreamError(
                "it names no JSON-RPC or HTTP+JSON interface on the configured origin",
                code="a2a_card_unavailable",
            )
        return Card(body, found, time.monotonic())

    async def aclose(self) -> None:
        await self.transport.aclose()


async def read_capped(resp: UpstreamResponse, cap: int, what: str) -> bytes:
    """A whole answer, at most ``cap`` bytes (502 ``a2a_message_too_large`` beyond)."""
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in resp.aiter_raw():
            size += len(chunk)
            if size > cap:
                raise UpstreamError(f"{what} passed {cap} bytes", code="a2a_message_too_large")
            parts.append(chunk)
    finally:
        await resp.aclose()
    return b"".join(parts)


__all__ = ["CARD_TTL_S", "FORWARDED", "Agent", "Card", "read_capped"]
