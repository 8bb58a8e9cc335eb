"""One exchange with an upstream MCP server, and its answer relayed to the client
(docs/spec.md §23).

A POST's answer is JSON or an SSE stream. A stream is relayed event by event as each event
completes (never buffered: a tool's progress notifications reach the client as they happen),
and ends once the request's answer went out: the client does not wait for the server to close
it. The event that answers the request is parsed for its outcome; and every message that may
carry a list of tools -- a ``result`` with ``tools``, whatever its id and whatever was asked --
is parsed and the tools the caller may not use are dropped from it (:func:`keep_tools`; one that
cannot be read is not relayed): a server that answers under another id, or sends a tool list
nobody asked for, reveals no denied tool. The whole exchange is bounded by the server's
``timeout_s``: a stream cut by it ends with a JSON-RPC error event for the request, so the
client's call fails cleanly rather than waiting forever; before anything was sent it is a 504.
Every answer message is capped at ``max_message_bytes``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway.attempts import open_attempt, send_once
from gateway.context import Attempt, RequestContext
from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.headers import header_value
from gateway.mcp.servers import McpUpstream
from gateway.streaming.bodies import upstream_finished
from gateway.streaming.sse import SSEParser, event_data
from gateway.transports import UpstreamResponse
from gateway.types import RawHeaders
from gateway.writer import ResponseWriter

#: whether the caller may use a tool of this server (by the name the server gives it)
Keep = Callable[[Any], bool]
#: the upstream's headers that reach the client (its session id is replaced by the gateway's)
_KEEP = (b"content-type", b"cache-control", b"allow")
SSE = b"text/event-stream"
#: JSON-RPC codes the gateway answers with (the MCP SDKs' REQUEST_TIMEOUT is -32001)
TIMED_OUT = -32001
DENIED = -32602


def rpc_error(rid: Any, code: int, message: str, data: dict[str, Any] | None = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "error": error})


def start_attempt(ctx: RequestContext, up: McpUpstream, span_id: int, method: str) -> Attempt:
    """An upstream exchange, opened as a model call's attempt is (:func:`open_attempt`; one
    request may make several: they are numbered in order); ``method``: what it carries when it
    is not the client's own request (a handshake ``/mcp`` makes on its own)."""
    attempt = open_attempt(ctx, up.backend, len(ctx.attempts) + 1, span_id)
    facts = ctx.mcp
    if facts is not None and method != facts.get("method"):
        facts.setdefault("methods", {})[span_id] = method
    return attempt


async def send(
    ctx: RequestContext,
    up: McpUpstream,
    attempt: Attempt,
    method: str,
    headers: list[tuple[str, str]],
    body: bytes | None,
    stream: bool = False,
) -> UpstreamResponse:
    transport = up.streams if stream else up.transport
    return await send_once(ctx, attempt, transport, (method, up.url, headers, body))


async def read_json(
    ctx: RequestContext, up: McpUpstream, attempt: Attempt, resp: UpstreamResponse
) -> bytes:
    """A whole (JSON) answer, at most ``max_message_bytes``."""
    cap = up.config.max_message_bytes
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in resp.aiter_raw():
            size += len(chunk)
            if size > cap:
                raise UpstreamError(
                    f"the MCP server {up.name!r} answered more than {cap} bytes",
                    code="mcp_message_too_large",
                )
            parts.append(chunk)
    finally:
        upstream_finished(ctx, attempt, resp)
        await resp.aclose()
    return b"".join(parts)


async def read_answer(
    ctx: RequestContext, up: McpUpstream, attempt: Attempt, resp: UpstreamResponse, rid: Any
) -> dict[str, Any] | None:
    """The answer to request ``rid`` in a POST's answer (None: it has none): a JSON body read
    whole, or an SSE stream read only until the event that answers (the request is over then,
    whether or not the server closes the stream). Each message is capped at
    ``max_message_bytes``."""
    if not (header_value(resp.headers, b"content-type") or b"").startswith(SSE):
        return answer_message(await read_json(ctx, up, attempt, resp), rid)
    cap = up.config.max_message_bytes
    parser = SSEParser()
    try:
        async for chunk in resp.aiter_raw():
            msg = _answer_in(parser.feed(chunk), rid)
            if msg is not None:
                return msg
            if len(parser.pending) > cap:
                raise UpstreamError(
                    f"an event of the MCP server {up.name!r} passed {cap} bytes",
                    code="mcp_message_too_large",
                )
        return _answer_in(parser.finish(), rid)
    finally:
        upstream_finished(ctx, attempt, resp)
        await resp.aclose()


def _answer_in(events: list[bytes], rid: Any) -> dict[str, Any] | None:
    for event in events:
        data = event_data(event)
        msg = answer_message(data, rid) if data is not None else None
        if msg is not None:
            return msg
    return None


def answer_message(raw: bytes, rid: Any) -> dict[str, Any] | None:
    """The JSON-RPC answer to request ``rid`` in ``raw`` (a JSON body or an SSE data field)."""
    if rid is None or b'"id"' not in raw:
        return None
    try:
        msg = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if isinstance(msg, dict) and msg.get("id") == rid and ("result" in msg or "error" in msg):
        return msg
    return None


def may_carry_tools(raw: bytes) -> bool:
    """Whether a JSON text may hold a member named ``tools``: spelled out, or written with a
    ``\\u`` escape (the only other way JSON can spell those letters, RFC 8259 §7)."""
    return b'"tools"' in raw or b"\\u" in raw


def keep_tools(obj: Any, keep: Keep) -> bool:
    """Drop, in place, the tools ``keep`` refuses from every result in ``obj`` (a message, or
    a batch of them) that carries ``tools``; a ``tools`` that is no list becomes an empty one.
    True when any result carried tools."""
    found = False
    for msg in obj if isinstance(obj, list) else (obj,):
        result = msg.get("result") if isinstance(msg, dict) else None
        if not isinstance(result, dict) or "tools" not in result:
            continue
        found = True
        tools = result["tools"]
        listed = tools if isinstance(tools, list) else []
        result["tools"] = [t for t in listed if isinstance(t, dict) and keep(t.get("name"))]
    return found


def screened(raw: bytes, keep: Keep | None) -> bytes | None:
    """``raw`` (a JSON body or an SSE data field) with the caller's denied tools dropped from
    any result carrying tools; None when it may carry tools and cannot be read (it is then not
    relayed: fail closed). A message that carried tools is written again from what was parsed,
    so the client reads exactly what was checked (a duplicate key cannot slip past)."""
    if keep is None or not may_carry_tools(raw):
        return raw
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return orjson.dumps(obj) if keep_tools(obj, keep) else raw


def with_data(event: bytes, data: bytes) -> bytes:
    """The SSE event with its data replaced by ``data`` (one line); its other fields (``id``,
    ``event``, ``retry``, comments) kept, so resumption by ``Last-Event-ID`` still works."""
    lines = [
        line
        for line in event.splitlines()
        if line and line != b"data" and not line.startswith(b"data:")
    ]
    return b"\n".join([*lines, b"data: " + data]) + b"\n\n"


def outcome(msg: dict[str, Any]) -> tuple[str, str | None]:
    """The status label and error type of an answer: ok, error (JSON-RPC), tool_error."""
    error = msg.get("error")
    if isinstance(error, dict):
        return "error", str(error.get("code"))
    result = msg.get("result")
    if isinstance(result, dict) and result.get("isError") is True:
        return "tool_error", "tool_error"
    return "ok", None


def client_headers(resp: UpstreamResponse, session_id: str | None) -> RawHeaders:
    out = [(k, v) for k, v in resp.headers if k in _KEEP]
    if session_id:
        out.append((b"mcp-session-id", session_id.encode()))
    if (header_value(resp.headers, b"content-type") or b"").startswith(SSE):
        out.append((b"x-accel-buffering", b"no"))
    return out


class AnswerRelay:
    """Relays one upstream answer to the client, noting its outcome on ``ctx.mcp`` and
    dropping from every result that carries tools the ones ``keep`` refuses."""

    __slots__ = ("answered", "attempt", "ctx", "keep", "out", "rid", "up")

    def __init__(
        self,
        ctx: RequestContext,
        up: McpUpstream,
        attempt: Attempt | None,
        out: ResponseWriter,
        rid: Any,
        keep: Keep | None,
    ) -> None:
        self.ctx, self.up, self.attempt, self.out = ctx, up, attempt, out
        self.rid = rid
        self.keep = keep
        #: the answer to the request went out
        self.answered = False

    def _note(self, msg: dict[str, Any]) -> None:
        facts = self.ctx.mcp
        if facts is not None:
            facts["status"], error = outcome(msg)
            if error is not None:
                facts["error"] = error

    async def answer(self, resp: UpstreamResponse, session_id: str | None) -> None:
        assert self.attempt is not None  # set once the request went upstream
        headers = client_headers(resp, session_id)
        if resp.status >= 400 and self.ctx.mcp is not None:
            self.ctx.mcp["status"] = "upstream_error"
            self.ctx.mcp["error"] = str(resp.status)
        if (header_value(resp.headers, b"content-type") or b"").startswith(SSE):
            await self._stream(resp, headers)
            return
        body = await read_json(self.ctx, self.up, self.attempt, resp)
        kept = screened(body, self.keep)
        if kept is None:
            raise UpstreamError(
                f"the MCP server {self.up.name!r} answered a tool list that is no JSON",
                code="mcp_bad_answer",
            )
        msg = answer_message(kept, self.rid)
        if msg is not None:
            self._note(msg)
        await self.out.whole(resp.status, headers, kept)

    async def _stream(self, resp: UpstreamResponse, headers: RawHeaders) -> None:
        out, cap = self.out, self.up.config.max_message_bytes
        attempt = self.attempt
        assert attempt is not None
        parser = SSEParser()
        await out.start(resp.status, headers)
        try:
            async for chunk in resp.aiter_raw():
                for event in parser.feed(chunk):
                    relayed = self._event(event)
                    if relayed:
                        await out.body(relayed, more=True)
                    if self.answered:  # the request is answered: its stream is over (the
                        break  # server closes it too), the client need not wait for that
                if self.answered:
                    break
                if len(parser.pending) > cap:
                    raise UpstreamError(
                        f"an event of the MCP server {self.up.name!r} passed {cap} bytes",
                        code="mcp_message_too_large",
                    )
        except UpstreamError as exc:
            await self.cut(-32603, exc.message)
            if self.ctx.mcp is not None:
                self.ctx.mcp["status"], self.ctx.mcp["error"] = "upstream_error", exc.code
            return
        finally:
            upstream_finished(self.ctx, attempt, resp)
            await resp.aclose()
        await out.body(b"")

    def _event(self, event: bytes) -> bytes:
        data = event_data(event)
        if data is None:
            return event
        kept = screened(data, self.keep)
        if kept is None:
            return b""  # it may carry tools and cannot be read: not relayed
        if kept is not data:
            event = with_data(event, kept)
        msg = answer_message(kept, self.rid)
        if msg is not None:
            if self.ctx.timeline.first_content is None:
                self.ctx.timeline.first_content = time.perf_counter()
            self.answered = True
            self._note(msg)
        return event

    async def cut(self, code: int, message: str) -> None:
        """A stream that cannot finish ends with an error answer to the request."""
        if self.out.finished:
            return
        event = b""
        if self.rid is not None:
            event = b"event: message\ndata: " + rpc_error(self.rid, code, message) + b"\n\n"
        await self.out.body(event)


async def bounded(up: McpUpstream, work: Any, relay: AnswerRelay | None = None) -> Any:
    """``work`` within the server's ``timeout_s``. Past it before any answer: 504; in the
    middle of a stream: the stream ends with a JSON-RPC error answer (``-32001``)."""
    try:
        async with asyncio.timeout(up.config.timeout_s):
            return await work
    except TimeoutError as exc:
        facts = relay.ctx.mcp if relay is not None else None
        if facts is not None:
            facts["status"], facts["error"] = "timeout", "mcp_timeout"
        if relay is not None and relay.out.started:
            message = f"the MCP server {up.name!r} did not finish within {up.config.timeout_s:g} s"
            await relay.cut(TIMED_OUT, message)
            return None
        raise UpstreamTimeout(
            f"the MCP server {up.name!r} did not answer within {up.config.timeout_s:g} s",
            code="mcp_timeout",
        ) from exc


__all__ = [
    "DENIED",
    "SSE",
    "TIMED_OUT",
    "AnswerRelay",
    "Keep",
    "answer_message",
    "bounded",
    "keep_tools",
    "may_carry_tools",
    "read_answer",
    "read_json",
    "rpc_error",
    "screened",
    "send",
    "start_attempt",
]
