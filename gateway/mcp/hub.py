"""What the MCP endpoints share (built once per runtime) and what one MCP request carries.

:class:`Hub`: the upstream servers, the grants, the session records, and the steps both
endpoints take — identify the caller, check the Origin, find the session, decide a tool, put
the trace context into ``params._meta``. :class:`McpRequest`: one HTTP request to ``/mcp`` or
``/mcp/{server}`` (docs/spec.md §23).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from gateway.errors import Forbidden, NotFound
from gateway.headers import header_value
from gateway.hops.auth import KeyEntry
from gateway.mcp.access import EVERYBODY, Access, Grant, origin_allowed
from gateway.mcp.exchange import rpc_error
from gateway.mcp.servers import McpUpstream
from gateway.mcp.sessions import Session, Sessions, build_sessions
from gateway.runtime import Runtime
from gateway.types import RawHeaders, Receive
from gateway.writer import ResponseWriter

_TRACE_HEADERS = ("traceparent", "tracestate")
#: an MCP protocol revision as the Mcp-Protocol-Version header names it (a date)
_REVISION = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
#: the answer to a GET when no server offers a notification stream (MCP Streamable HTTP: a
#: server that offers none answers 405), alike on /mcp and /mcp/{server}
NO_STREAM_HEADERS = [(b"allow", b"POST, DELETE"), (b"content-type", b"application/json")]
#: JSON-RPC: the body is no JSON / no request object
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND = -32700, -32600, -32601


class Rejected(Exception):
    """A message refused with a JSON-RPC error (HTTP ``status``), never forwarded."""

    def __init__(self, status: int, body: bytes, label: str) -> None:
        super().__init__(label)
        self.status, self.body, self.label = status, body, label


class McpRequest:
    """One HTTP request to an MCP endpoint."""

    __slots__ = ("ctx", "grant", "headers", "out", "receive")

    def __init__(self, ctx: Any, out: ResponseWriter, receive: Receive, grant: Grant) -> None:
        self.ctx = ctx
        self.out = out
        self.receive = receive
        self.grant = grant
        self.headers: RawHeaders = ctx.scope["headers"]

    def header(self, name: bytes) -> str | None:
        value = header_value(self.headers, name)
        return value.decode("latin-1") if value is not None else None

    def note_revision(self) -> None:
        """``mcp.protocol.version``: the revision the client's ``Mcp-Protocol-Version`` names."""
        value = self.header(b"mcp-protocol-version")
        if value is not None and _REVISION.fullmatch(value):
            self.ctx.mcp["protocol"] = value

    async def no_stream(self) -> None:
        """Answer a GET that no server has a notification stream for: 405, recorded as what
        it is (``no_stream``), not as a failure (docs/spec.md §23)."""
        self.ctx.mcp["status"] = "no_stream"
        self.ctx.answer.expected = True
        text = "no notification stream is offered here: the answers come on each POST"
        await self.out.whole(405, NO_STREAM_HEADERS, rpc_error(None, -32000, text))

    def client_ended_stream(self) -> None:
        """The client closed its GET stream: how a notification stream ends (either side may
        end it, MCP Streamable HTTP), so the request is no 499 and no cancellation."""
        if self.ctx.disconnected and self.out.started:
            self.ctx.disconnected = False
            self.ctx.mcp["status"] = "ok"
            self.ctx.mcp["ended_by"] = "client"


def parse(body: bytes) -> dict[str, Any]:
    """One JSON-RPC message (a batch is refused: MCP 2025-06-18 removed them), of one of
    MCP's three kinds (:func:`kind`)."""
    try:
        msg = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = "the body is not JSON"
        raise Rejected(400, rpc_error(None, PARSE_ERROR, text), "rejected") from None
    if isinstance(msg, list):
        text = "JSON-RPC batches are not supported (MCP 2025-06-18 removed them)"
        raise Rejected(400, rpc_error(None, INVALID_REQUEST, text), "rejected")
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
        text = "not a JSON-RPC 2.0 message"
        raise Rejected(400, rpc_error(None, INVALID_REQUEST, text), "rejected")
    problem = _malformed(msg)
    if problem is not None:
        raise Rejected(400, rpc_error(None, INVALID_REQUEST, problem), "rejected")
    return msg


def _is_id(value: Any) -> bool:
    """An MCP request id: a string or an integer (never null, a fraction or a boolean)."""
    return type(value) is str or type(value) is int


def kind(msg: dict[str, Any]) -> str:
    """``request``, ``notification`` or ``response``: MCP names every notification
    ``notifications/…``; a message without a method answers a request of the server."""
    method = msg.get("method")
    if method is None:
        return "response"
    return "notification" if str(method).startswith("notifications/") else "request"


def _malformed(msg: dict[str, Any]) -> str | None:
    """What makes a message none of MCP's kinds (MCP basic protocol, "Messages"): requests
    MUST carry a string or integer id, never null; notifications MUST NOT carry one;
    responses MUST carry the id they answer (an error may say null: the request's id was
    unreadable) and a result or an error, not both. None: it is well formed."""
    if "method" in msg:
        method = msg["method"]
        if not isinstance(method, str) or not method:
            return "the method must be a non-empty string"
        if kind(msg) == "notification":
            return "an MCP notification must not carry an id" if "id" in msg else None
        if not _is_id(msg.get("id")):
            return "an MCP request must carry a string or integer id (never null)"
        return None
    if ("result" in msg) == ("error" in msg):
        return "neither a request, a notification nor a response (result or error)"
    rid = msg.get("id")
    if not (_is_id(rid) or ("error" in msg and "id" in msg and rid is None)):
        return "an MCP response must carry the string or integer id it answers"
    return None


class Hub:
    """The MCP side of one runtime."""

    def __init__(
        self,
        rt: Runtime,
        environ: Mapping[str, str] | None = None,
        sessions: Sessions | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.rt = rt
        self.upstreams = {c.name: McpUpstream(c, env) for c in rt.config.mcp_servers}
        self.access = Access(rt.config)
        #: the client sessions: the app's (they outlive a config reload), else this hub's own
        self._own_sessions = sessions is None
        self.sessions: Sessions = build_sessions(rt.config, env) if sessions is None else sessions
        self.tracing = rt.tracing
        #: origins /mcp accepts: those every server lists
        lists = [set(c.allowed_origins) for c in rt.config.mcp_servers]
        self.aggregate_origins = frozenset(set.intersection(*lists) if lists else ())
        self._opening: dict[tuple[str, str], asyncio.Lock] = {}

    @contextlib.asynccontextmanager
    async def opening(self, session_id: str, server: str) -> AsyncIterator[None]:
        """One upstream handshake at a time per (client session, server) in this process."""
        key = (session_id, server)
        lock = self._opening.get(key)
        if lock is None:
            lock = self._opening[key] = asyncio.Lock()
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and self._opening.get(key) is lock:
                del self._opening[key]

    def begin(self, call_ctx: Any, origins: frozenset[str] | tuple[str, ...]) -> Grant:
        """Origin (403), then the caller's key (401) and what it may use."""
        ctx = call_ctx
        origin = header_value(ctx.scope["headers"], b"origin")
        if not origin_allowed(origin.decode("latin-1") if origin else None, origins):
            raise Forbidden(
                "this Origin may not call the gateway's MCP endpoints (DNS-rebinding "
                "protection); list it in the server's allowed_origins",
                code="origin_not_allowed",
            )
        auth = self.rt.auth
        grant = EVERYBODY
        if auth.mode != "off":
            entry: KeyEntry = auth.identify(ctx.credential)
            ctx.tenant, ctx.admin, ctx.limit_key = entry.tenant, entry.admin, entry
            grant = self.access.grant_of(entry).owned_by(entry.limit_id)
        ctx.timeline.auth_done = time.perf_counter()
        return grant

    def allowed(self, grant: Grant, up: McpUpstream, tool: Any) -> bool:
        return (
            isinstance(tool, str)
            and self.access.served(up.config, tool)
            and grant.tool(up.name, tool)
        )

    async def count(self, call: McpRequest) -> None:
        """A tool call counts against the key's ``rpm`` (429 past it)."""
        await self.rt.auth.check(call.ctx)

    async def session(self, call: McpRequest, endpoint: str) -> Session | None:
        """The client's session (None: it sent none); 404 when unknown, ended, another key's
        or another endpoint's — the client then starts a new one (MCP transport spec)."""
        sid = call.header(b"mcp-session-id")
        if sid is None:
            return None
        session = await self.sessions.get(sid)
        if session is None or session.owner != call.grant.owner or session.endpoint != endpoint:
            raise NotFound(
                "no such MCP session: initialize a new one", code="mcp_session_not_found"
            )
        call.ctx.mcp["session"] = sid
        return session

    def adopt(self, call: McpRequest, msg: dict[str, Any]) -> None:
        """A message's ``params._meta.traceparent`` (W3C, validated) becomes the request's
        parent, as the OpenTelemetry MCP conventions say an MCP server uses it; the HTTP
        request's own parent stays as a span link (docs/spec.md §23)."""
        params = msg.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        if isinstance(meta, dict) and "traceparent" in meta:
            self.tracing.adopt(call.ctx, meta.get("traceparent"), meta.get("tracestate"))

    def inject(self, call: McpRequest, msg: dict[str, Any], span_id: int) -> bytes:
        """The request with the gateway's trace context in ``params._meta`` (the MCP
        conventions of OpenTelemetry), so the tool server's spans join the trace."""
        trace = call.ctx.trace
        if trace is not None and self.tracing.enabled and "method" in msg:
            params = msg.get("params")
            if params is None:
                params = msg["params"] = {}
            if isinstance(params, dict):
                meta = params.get("_meta")
                if not isinstance(meta, dict):
                    meta = params["_meta"] = {}
                meta["traceparent"] = trace.traceparent(span_id)
                if trace.trace_state:
                    meta["tracestate"] = trace.trace_state
        return orjson.dumps(msg)

    def trace_headers(self, call: McpRequest, span_id: int) -> list[tuple[str, str]]:
        trace = call.ctx.trace
        if trace is None or not self.tracing.enabled:  # not tracing: the client's own, as is
            return [h for h in call.ctx.upstream_headers if h[0] in _TRACE_HEADERS]
        return [("traceparent", trace.traceparent(span_id))]

    async def aclose(self) -> None:
        for up in self.upstreams.values():
            await up.aclose()
        if self._own_sessions:
            await self.sessions.aclose()


__all__ = ["NO_STREAM_HEADERS", "Hub", "McpRequest", "Rejected", "kind", "parse"]
