"""The A2A endpoints of one runtime (docs/spec.md §30)::

    GET  /a2a                                     the agents the caller's key may call
    GET  /a2a/{agent}/.well-known/agent-card.json the agent's card, pointing at the gateway
    POST /a2a/{agent}                             the JSON-RPC binding
    *    /a2a/{agent}/{operation}                 the HTTP+JSON binding

Each HTTP request is a request like any other — the request scope (edge, errors in the OpenAI
shape, 499, the root span, the access-log line, the live view) — with its A2A facts on
``ctx.a2a``: key (401) → agent allowed (403) → the call (:mod:`gateway.a2a.calls`) → metrics
``gateway_a2a_requests_total``, ``gateway_a2a_request_duration_seconds``.

Nothing of this runs on the model-call path: the app dispatches ``/a2a*`` here by path.
"""

from __future__ import annotations

import os
import re
import time
from functools import partial
from typing import Any

import orjson

from gateway.a2a import calls
from gateway.a2a.access import AgentAccess, AgentGrant
from gateway.a2a.agents import Agent
from gateway.a2a.binding import Binder
from gateway.a2a.card import WELL_KNOWN, served
from gateway.a2a.protocol import METHODS, A2aRefused
from gateway.a2a.relay import AgentCall
from gateway.config import Config
from gateway.errors import (
    ClientGone,
    Forbidden,
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
)
from gateway.hops.auth import KeyEntry
from gateway.runtime import Endpoint, Runtime
from gateway.types import Receive, Scope, Send

PREFIX = "/a2a/"
_JSON = (b"content-type", b"application/json")
#: the gateway's own origin as the client reached it: a host name or address, and a port
_HOST = re.compile(r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
_TRACE = (b"traceparent", b"tracestate")


class A2aGateway:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.agents = {c.name: Agent(c, os.environ) for c in rt.config.agents}
        self.access = AgentAccess(rt.config)
        metrics = rt.telemetry.metrics
        self._metrics = metrics.a2a if metrics is not None else None

    async def __call__(
        self, kind: str, agent_name: str | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        agent = self.agents.get(agent_name) if agent_name is not None else None
        async with self.rt.request(scope, send) as req:
            ctx = req.ctx
            facts = ctx.a2a = {"agent": agent_name or "*", "method": kind, "status": None}
            try:
                grant = self._begin(ctx)
                if kind == "list":
                    await self._list(ctx, req.out, grant)
                    return
                if agent is None:  # /a2a/{unknown}/…: a 404 like any unknown path
                    raise NotFound(f"no agent at {ctx.path}", code="a2a_agent_not_found")
                if not grant.agent(agent.name):
                    raise Forbidden(
                        f"this API key may not call the agent {agent.name!r}",
                        code="agent_not_allowed",
                    )
                await self._serve(kind, agent, req.out, receive, ctx)
            except A2aRefused as exc:  # an A2A error of the gateway's own, never forwarded
                facts["status"], facts["error"] = exc.label, exc.code
                await req.out.whole(exc.status, [_JSON], exc.body)
            except GatewayError as exc:
                facts.setdefault("error", exc.code or exc.type)
                if facts.get("status") is None:
                    facts["status"] = _label(exc)
                raise
            except ClientGone:
                facts["status"] = "cancelled"
                raise
            finally:
                if ctx.disconnected and facts.get("status") in (None, "ok"):
                    facts["status"] = "cancelled"
                if facts.get("status") is None:
                    facts["status"] = "ok"
        self._count(facts, ctx.timeline.received, ctx.timeline.done)

    def _begin(self, ctx: Any) -> AgentGrant:
        """The caller's key (401) and what it may call."""
        auth = self.rt.auth
        grant = self.access.grant(None)
        if auth.mode != "off":
            entry: KeyEntry = auth.identify(ctx.credential)
            ctx.tenant, ctx.admin, ctx.limit_key = entry.tenant, entry.admin, entry
            grant = self.access.grant_of(entry)
        ctx.timeline.auth_done = time.perf_counter()
        return grant

    async def _serve(self, kind: str, agent: Agent, out: Any, receive: Receive, ctx: Any) -> None:
        method = ctx.method
        if kind == "card":
            if method != "GET":
                raise MethodNotAllowed(f"{method} is not served on {ctx.path}", allow="GET")
            card = await agent.card()
            public = _public(ctx) + PREFIX + agent.name
            body = served(card.parsed(), card.interfaces, public, self.rt.auth.mode != "off")
            await out.whole(200, [_JSON, (b"cache-control", b"no-store")], orjson.dumps(body))
            return
        tenant = ctx.tenant if self.rt.auth.mode != "off" else None
        binder = Binder(self.rt.ownership, agent.backend, agent.config.task_ttl_s, tenant)
        call = AgentCall(ctx, out, receive, agent, binder)
        span_id = call.facts["span_id"] = self.rt.tracing.new_span_id()
        headers = agent.headers(ctx.scope["headers"]) + self._trace(ctx, span_id)
        if kind == "rpc":
            if method != "POST":
                raise MethodNotAllowed(f"{method} is not served on {ctx.path}", allow="POST")
            await calls.jsonrpc(call, self.rt.auth, headers)
        else:
            path = ctx.path[len(PREFIX) + len(agent.name) + 1 :]
            await calls.http_json(call, self.rt.auth, path, headers)

    def _trace(self, ctx: Any, span_id: int) -> list[tuple[str, str]]:
        """The CLIENT span as the agent's parent (W3C Trace Context); not tracing: the
        client's own trace context, as it sent it."""
        trace = ctx.trace
        if trace is not None and self.rt.tracing.enabled:
            out = [("traceparent", trace.traceparent(span_id))]
            if trace.trace_state:
                out.append(("tracestate", trace.trace_state))
            return out
        raw = ctx.scope["headers"]
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw if k.lower() in _TRACE]

    async def _list(self, ctx: Any, out: Any, grant: AgentGrant) -> None:
        if ctx.method != "GET":
            raise MethodNotAllowed(f"{ctx.method} is not served on {ctx.path}", allow="GET")
        base = _public(ctx)
        data = [
            {
                "name": name,
                "url": f"{base}{PREFIX}{name}",
                "card": f"{base}{PREFIX}{name}{WELL_KNOWN}",
            }
            for name in self.agents
            if grant.agent(name)
        ]
        await out.whole(200, [_JSON], orjson.dumps({"object": "list", "data": data}))

    def _count(self, facts: dict[str, Any], received: float, done: float | None) -> None:
        m = self._metrics
        if m is None:
            return
        agent = str(facts.get("agent") or "*")
        method = facts.get("method")
        label = method if method in METHODS or method in ("card", "list") else "other"
        m.requests.inc((agent, label, str(facts.get("status") or "ok")))
        end = done if done is not None else time.perf_counter()
        m.duration.observe((agent, label), end - received)

    async def aclose(self) -> None:
        for agent in self.agents.values():
            await agent.aclose()


def _label(exc: GatewayError) -> str:
    if exc.status == 504:
        return "timeout"
    if exc.status == 403:
        return "denied"
    if exc.status == 404:
        return "not_found"
    return "rejected" if exc.status < 500 else "upstream_error"


def _public(ctx: Any) -> str:
    """The gateway's origin as the client reached it: ``Host`` (or, from a trusted proxy,
    ``X-Forwarded-Host`` and ``-Proto``), as the edge forwards them (docs/spec.md §30)."""
    found = dict(
        h for h in ctx.upstream_headers if h[0] in ("x-forwarded-proto", "x-forwarded-host")
    )
    scheme = found.get("x-forwarded-proto", "http")
    host = found.get("x-forwarded-host", "")
    if scheme not in ("http", "https") or not _HOST.fullmatch(host):
        raise InvalidRequest("the Host header cannot name this gateway", code="invalid_host")
    return f"{scheme}://{host}"


class A2aEndpoints:
    """The app's ``/a2a`` endpoints (none without ``[[agents]]``): one :class:`A2aGateway` per
    runtime snapshot, made by its first A2A request and closed when the snapshot is retired
    (docs/spec.md §29), the last ones with the app."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._gw: dict[int, A2aGateway] = {}

    def endpoints(self, config: Config | None = None) -> dict[str, Endpoint]:
        """Path -> endpoint; ``PREFIX`` itself names the HTTP+JSON binding of the paths
        under it (the app's dispatch falls back to it there)."""
        agents = (config or self.config).agents
        if not agents:
            return {}
        table: dict[str, Endpoint] = {"/a2a": partial(self._call, "list", None)}
        for agent in agents:
            table[f"{PREFIX}{agent.name}"] = partial(self._call, "rpc", agent.name)
            table[f"{PREFIX}{agent.name}{WELL_KNOWN}"] = partial(self._call, "card", agent.name)
        table[PREFIX] = self.rest
        return table

    async def rest(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        """``/a2a/{agent}/…``: the HTTP+JSON binding (an unknown agent: 404)."""
        name = scope["path"][len(PREFIX) :].split("/", 1)[0]
        await self._call("rest", name, rt, scope, receive, send)

    async def _call(
        self, kind: str, agent: str | None, rt: Runtime, scope: Scope, receive: Receive, send: Send
    ) -> None:
        gw = self._gw.get(id(rt))
        if gw is None:
            gw = self._gw[id(rt)] = A2aGateway(rt)
            rt.closers.append(partial(self._forget, id(rt)))
        await gw(kind, agent, scope, receive, send)

    async def _forget(self, key: int) -> None:
        gw = self._gw.pop(key, None)
        if gw is not None:
            await gw.aclose()

    async def aclose(self) -> None:
        for key in list(self._gw):
            await self._forget(key)


__all__ = ["A2aEndpoints", "A2aGateway"]
